"""Pod and Namespace semantics: defaulting, validation, and what an update may change. Pure.

Mirrors the parts of kube's pod strategy an executor can observe: server-owned metadata,
status reset on create, status ignored by the main resource and spec ignored by /status,
immutable pod spec (except images, tolerations, activeDeadlineSeconds), and when a delete
is graceful.
"""

from __future__ import annotations

import copy
import datetime as _dt
import random
import re
import uuid

from .errors import ApiError
from .selectors import validate_annotations, validate_labels

__all__ = [
    "now",
    "generate_name",
    "new_metadata",
    "prepare_pod",
    "default_pod_spec",
    "pod_update",
    "pod_status_update",
    "delete_grace",
    "prepare_namespace",
    "partial",
]

_ALNUM = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SERVER_META = ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                "deletionGracePeriodSeconds", "selfLink", "managedFields", "generation")


def now(offset_seconds: float = 0) -> str:
    t = _dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(seconds=offset_seconds)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def generate_name(prefix: str, rng: random.Random | None = None) -> str:
    rng = rng or random
    return prefix[:58] + "".join(rng.choice(_ALNUM) for _ in range(5))


def _metadata(body: dict) -> dict:
    """body.metadata with JSON types checked (a Go decoder rejects these with 400)."""
    meta = body.get("metadata")
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise ApiError.bad_request("json: cannot unmarshal metadata into Go struct field of type v1.ObjectMeta")
    for key in ("name", "generateName", "namespace", "resourceVersion", "uid"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise ApiError.bad_request(f"json: cannot unmarshal metadata.{key} into Go struct field of type string")
    for key in ("labels", "annotations"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            raise ApiError.bad_request(f"json: cannot unmarshal metadata.{key} into Go value of type map[string]string")
    return meta


def _check_kind(body: dict, kind: str) -> None:
    if body.get("kind") not in (None, "", kind) or body.get("apiVersion") not in (None, "", "v1"):
        raise ApiError.bad_request(
            f"the API version in the data ({body.get('apiVersion')}) does not match the expected API version (v1)"
            if body.get("kind") in (None, "", kind)
            else f"{body.get('kind')} in version \"{body.get('apiVersion')}\" cannot be handled as a {kind}"
        )


def _meta_problems(meta: dict, namespaced: bool) -> list[str]:
    problems = []
    name = meta.get("name", "")
    if not isinstance(name, str) or not name:
        problems.append("metadata.name: Required value: name or generateName is required")
    elif len(name) > 253 or not _SUBDOMAIN.match(name) or (not namespaced and not _LABEL.match(name)):
        problems.append(f"metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of "
                        "lower case alphanumeric characters, '-' or '.'")
    problems += validate_labels(meta.get("labels"))
    ann = meta.get("annotations")
    if ann is not None and (not isinstance(ann, dict) or not all(isinstance(v, str) for v in ann.values())):
        problems.append("metadata.annotations: Invalid value: must be a map of string to string")
    else:
        problems += validate_annotations(ann)
    fin = meta.get("finalizers")
    if fin is not None and (not isinstance(fin, list) or not all(isinstance(f, str) and f for f in fin)):
        problems.append("metadata.finalizers: Invalid value: must be a list of non-empty strings")
    return problems


def new_metadata(body: dict, namespace: str | None, taken) -> dict:
    """Client metadata minus server-owned fields, plus name (from generateName), uid, timestamp."""
    meta = {k: v for k, v in _metadata(body).items() if k not in _SERVER_META}
    if namespace is not None:
        if meta.get("namespace") not in (None, "", namespace):
            raise ApiError.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request")
        meta["namespace"] = namespace
    else:
        meta.pop("namespace", None)
    if not meta.get("name") and meta.get("generateName"):
        for _ in range(8):
            name = generate_name(str(meta["generateName"]))
            if not taken(name):
                break
        meta["name"] = name
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = now()
    return meta


def _image_pull_policy(image: str) -> str:
    tail = image.rsplit("/", 1)[-1]
    return "Always" if ("@" not in tail and (":" not in tail or tail.endswith(":latest"))) else "IfNotPresent"


def default_pod_spec(spec: dict) -> dict:
    spec = copy.deepcopy(spec)
    for key, value in (("restartPolicy", "Always"), ("terminationGracePeriodSeconds", 30),
                       ("dnsPolicy", "ClusterFirst"), ("schedulerName", "default-scheduler"),
                       ("securityContext", {}), ("enableServiceLinks", True), ("priority", 0),
                       ("preemptionPolicy", "PreemptLowerPriority")):
        spec.setdefault(key, value)
    if "serviceAccountName" not in spec and "serviceAccount" in spec:
        spec["serviceAccountName"] = spec["serviceAccount"]
    for group in ("initContainers", "containers"):
        for c in spec.get(group) or []:
            if isinstance(c, dict):
                c.setdefault("resources", {})
                c.setdefault("terminationMessagePath", "/dev/termination-log")
                c.setdefault("terminationMessagePolicy", "File")
                if isinstance(c.get("image"), str):
                    c.setdefault("imagePullPolicy", _image_pull_policy(c["image"]))
    return spec


def _spec_problems(spec: object) -> list[str]:
    if not isinstance(spec, dict):
        return ["spec: Required value"]
    problems = []
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return ["spec.containers: Required value"]
    names = set()
    for i, c in enumerate(containers + (spec.get("initContainers") or [])):
        if not isinstance(c, dict):
            problems.append(f"spec.containers[{i}]: Invalid value: must be an object")
            continue
        name = c.get("name")
        if not name:
            problems.append(f"spec.containers[{i}].name: Required value")
        elif not isinstance(name, str) or not _LABEL.match(name) or len(name) > 63:
            problems.append(f"spec.containers[{i}].name: Invalid value: \"{name}\"")
        elif name in names:
            problems.append(f"spec.containers[{i}].name: Duplicate value: \"{name}\"")
        names.add(name)
        if not c.get("image"):
            problems.append(f"spec.containers[{i}].image: Required value")
    if spec.get("restartPolicy") not in ("Always", "OnFailure", "Never"):
        problems.append(f"spec.restartPolicy: Unsupported value: \"{spec.get('restartPolicy')}\"")
    return problems


def _qos(spec: dict) -> str:
    res = [c.get("resources") or {} for c in spec.get("containers", []) if isinstance(c, dict)]
    if not any(r.get("requests") or r.get("limits") for r in res):
        return "BestEffort"
    for r in res:
        lim, req = r.get("limits") or {}, r.get("requests") or {}
        if not all(k in lim and req.get(k, lim[k]) == lim[k] for k in ("cpu", "memory")):
            return "Burstable"
    return "Guaranteed"


def prepare_pod(body: object, namespace: str, taken) -> dict:
    """A new Pod from a create request body (raises ApiError 400/422)."""
    if not isinstance(body, dict):
        raise ApiError.bad_request("the body of the request was in an unknown format")
    _check_kind(body, "Pod")
    meta = new_metadata(body, namespace, taken)
    spec = default_pod_spec(body.get("spec") or {}) if isinstance(body.get("spec") or {}, dict) else body["spec"]
    problems = _meta_problems(meta, True) + _spec_problems(spec)
    if problems:
        raise ApiError.invalid("Pod", meta.get("name", ""), problems)
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec,
            "status": {"phase": "Pending", "qosClass": _qos(spec)}}


_MUTABLE_SPEC = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds")


def _spec_without_mutables(spec: dict) -> dict:
    spec = {k: v for k, v in spec.items() if k not in _MUTABLE_SPEC}
    for group in ("containers", "initContainers"):
        if isinstance(spec.get(group), list):
            spec[group] = [{k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c
                           for c in spec[group]]
    return spec


def _keep_server_meta(old: dict, new: dict) -> dict:
    meta = dict(_metadata(new))
    for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
              "name", "namespace", "generateName", "selfLink", "generation"):
        if k in old["metadata"]:
            meta[k] = old["metadata"][k]
        else:
            meta.pop(k, None)
    return meta


def pod_update(old: dict, new: object) -> dict:
    """The Pod stored by an update/patch of the main resource: status and server metadata kept."""
    if not isinstance(new, dict):
        raise ApiError.bad_request("the body of the request was in an unknown format")
    _check_kind(new, "Pod")
    meta = _keep_server_meta(old, new)
    spec = new.get("spec")
    spec = default_pod_spec(spec) if isinstance(spec, dict) else spec
    name = old["metadata"]["name"]
    problems = _meta_problems(meta, True) + _spec_problems(spec)
    if problems:
        raise ApiError.invalid("Pod", name, problems)
    if _spec_without_mutables(spec) != _spec_without_mutables(old["spec"]):
        raise ApiError.invalid("Pod", name, [
            "spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
            "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions "
            "to existing tolerations) or `spec.terminationGracePeriodSeconds`"])
    if old["metadata"].get("deletionTimestamp"):
        added = set(meta.get("finalizers") or []) - set(old["metadata"].get("finalizers") or [])
        if added:
            raise ApiError.invalid("Pod", name, [
                "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted"])
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec, "status": old.get("status", {})}


def pod_status_update(old: dict, new: object) -> dict:
    """The Pod stored by an update/patch of /status: status and metadata changes are taken, the
    spec and ownerReferences are kept (kube-apiserver's podStatusStrategy; labels, annotations and
    finalizers do change through pods/status)."""
    if not isinstance(new, dict):
        raise ApiError.bad_request("the body of the request was in an unknown format")
    _check_kind(new, "Pod")
    name = old["metadata"]["name"]
    status = new.get("status") or {}
    if not isinstance(status, dict):
        raise ApiError.invalid("Pod", name, ["status: Invalid value: must be an object"])
    phase = status.get("phase")
    if phase is not None and phase not in ("Pending", "Running", "Succeeded", "Failed", "Unknown"):
        raise ApiError.invalid("Pod", name, [f"status.phase: Unsupported value: \"{phase}\""])
    old_qos = (old.get("status") or {}).get("qosClass")
    if status.get("qosClass") not in (None, old_qos):
        raise ApiError.invalid("Pod", name, [f"status.qosClass: Invalid value: \"{status['qosClass']}\": "
                                             f"field is immutable"])
    if old_qos is not None:
        status = {**status, "qosClass": old_qos}
    meta = _keep_server_meta(old, new)
    if "ownerReferences" in old["metadata"]:
        meta["ownerReferences"] = old["metadata"]["ownerReferences"]
    else:
        meta.pop("ownerReferences", None)
    problems = _meta_problems(meta, True)
    if problems:
        raise ApiError.invalid("Pod", name, problems)
    if old["metadata"].get("deletionTimestamp"):
        added = set(meta.get("finalizers") or []) - set(old["metadata"].get("finalizers") or [])
        if added:
            raise ApiError.invalid("Pod", name, [
                "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted"])
    return {**old, "metadata": meta, "status": status}


def delete_grace(pod: dict, requested: int | None) -> int:
    """kube's CheckGracefulDelete for pods: unbound or finished pods go at once."""
    spec, phase = pod.get("spec") or {}, (pod.get("status") or {}).get("phase")
    if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
        return 0
    grace = requested if requested is not None else spec.get("terminationGracePeriodSeconds", 30)
    return max(0, int(grace if grace is not None else 30))


def prepare_namespace(body: object, taken) -> dict:
    if not isinstance(body, dict):
        raise ApiError.bad_request("the body of the request was in an unknown format")
    _check_kind(body, "Namespace")
    meta = new_metadata(body, None, taken)
    problems = _meta_problems(meta, False)
    if problems:
        raise ApiError.invalid("Namespace", meta.get("name", ""), problems)
    meta["labels"] = {**(meta.get("labels") or {}), "kubernetes.io/metadata.name": meta["name"]}
    return {"kind": "Namespace", "apiVersion": "v1", "metadata": meta,
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}


def partial(obj: dict) -> dict:
    """The PartialObjectMetadata view of an object."""
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
