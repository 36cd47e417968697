"""Handlers for core/v1 pods (and their status, binding, log subresources) and namespaces
(leases: lease_resources.py).

Each handler reads a request, asks the pure modules (objects, patches, selectors) what the
new state is, and commits it to the store. Errors are raised as ApiError.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json

from aiohttp import web

from . import leases, objects
from .controls import AUDIT_KEY
from .errors import ApiError
from .patches import PatchDecodeError, PatchError, json_patch, merge_patch, strategic_merge_patch
from .selectors import (LEASE_FIELDS, NAMESPACE_FIELDS, POD_FIELDS, SelectorError, parse_field_selector,
                        parse_label_selector)
from .store import Expired, Watcher
from .watch import serve_watch

__all__ = ["Resources", "parse_bool"]

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}
_JSON = "application/json"
_PATCH_TYPES = {
    "application/json-patch+json": json_patch,
    "application/merge-patch+json": merge_patch,
    "application/strategic-merge-patch+json": strategic_merge_patch,
}
# resource -> (kind, list kind, field selectors, apiVersion, API group)
_KINDS = {"pods": ("Pod", "PodList", POD_FIELDS, "v1", ""),
          "namespaces": ("Namespace", "NamespaceList", NAMESPACE_FIELDS, "v1", ""),
          "leases": ("Lease", "LeaseList", LEASE_FIELDS, leases.API_VERSION, leases.GROUP)}


def parse_bool(value: str | None, name: str) -> bool:
    """Go's strconv.ParseBool, which is what kube uses for query booleans."""
    if value is None or value == "":
        return False
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ApiError.bad_request(f'strconv.ParseBool: parsing "{value}": invalid syntax for {name}')


def _int(request: web.Request, name: str) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ApiError.bad_request(f'strconv.ParseInt: parsing "{raw}": invalid syntax for {name}')


def _json(obj: dict, status: int = 200) -> web.Response:
    return web.Response(status=status, body=json.dumps(obj, separators=(",", ":")).encode(), content_type=_JSON)


def negotiate(accept: str | None, *, is_list: bool, watch: bool = False) -> bool:
    """True if the client wants metadata only (PartialObjectMetadata[List]); 406 if nothing fits."""
    if not accept:
        return False
    for media in accept.split(","):
        parts = [p.strip() for p in media.split(";")]
        mtype, params = parts[0].lower(), dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        if mtype not in (_JSON, "*/*", "application/*", ""):
            continue
        as_ = params.get("as")
        if as_ is None:
            return False
        if params.get("g") != "meta.k8s.io" or params.get("v") not in ("v1", "v1beta1"):
            continue
        if as_ == "PartialObjectMetadataList" and (is_list or watch):
            return True
        if as_ == "PartialObjectMetadata" and (not is_list or watch):
            return True
    raise ApiError(406, "only the following media types are accepted: application/json, "
                        "application/json;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1")


async def _body(request: web.Request, allowed: tuple[str, ...] = (_JSON,)) -> tuple[str, object]:
    ctype = (request.headers.get("Content-Type") or _JSON).split(";")[0].strip().lower()
    if ctype not in allowed:
        raise ApiError(415, f'the body of the request was in an unknown format - accepted media types include: '
                            f'{", ".join(allowed)}')
    raw = await request.read()
    if not raw.strip():
        raise ApiError.bad_request("the body of the request was in an unknown format - empty body")
    try:
        return ctype, json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError.bad_request(f"error decoding the request body as JSON: {exc}")


async def _patched(request: web.Request, old: dict) -> object:
    """``old`` with the request's patch applied, of any patch type kube takes: 400 for a patch that
    does not decode, 422 for one that does not apply."""
    ctype, doc = await _body(request, tuple(_PATCH_TYPES))
    try:
        return _PATCH_TYPES[ctype](copy.deepcopy(old), doc)
    except PatchDecodeError as exc:
        raise ApiError.bad_request(str(exc))
    except PatchError as exc:
        raise ApiError(422, str(exc), "Invalid")


def _same(a: dict, b: dict) -> bool:
    strip = lambda o: {**o, "metadata": {k: v for k, v in o["metadata"].items() if k != "resourceVersion"}}  # noqa: E731
    return strip(a) == strip(b)


class Resources:
    def __init__(self, state):
        self.state = state
        self.store = state.store

    # ------------------------------------------------------------ helpers
    def _get(self, resource: str, ns: str, name: str) -> dict:
        obj = self.store.get(resource, ns, name)
        if obj is None:
            raise ApiError.not_found(resource, name, _KINDS[resource][4])
        return obj

    def _commit(self, resource: str, old: dict, new: dict) -> dict:
        """Write new unless it equals old (no-op: no rv bump, no event); finish finalized deletes."""
        if _same(old, new):
            return old
        meta = new["metadata"]
        if meta.get("finalizers") == [] or meta.get("finalizers") is None:
            meta.pop("finalizers", None)
        stored = self.store.write(resource, new, old)
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and not meta.get("deletionGracePeriodSeconds"):
            return self.store.remove(resource, meta.get("namespace", ""), meta["name"])
        return stored

    def _audit_object(self, request: web.Request, stored: dict) -> None:
        if AUDIT_KEY in request:
            m = stored["metadata"]
            request[AUDIT_KEY].update(name=m["name"], object={"name": m["name"], "labels": m.get("labels", {}),
                                                             "annotations": m.get("annotations", {})})

    def _ensure_namespace(self, ns: str) -> None:
        nsobj = self.store.get("namespaces", "", ns)
        if nsobj is None and not self.state.implicit_namespaces:
            raise ApiError.not_found("namespaces", ns)
        if nsobj is not None and nsobj["metadata"].get("deletionTimestamp"):
            raise ApiError(403, f"unable to create new content in namespace {ns} because it is being terminated",
                           "Forbidden")

    # ------------------------------------------------------------ list / watch
    async def list_or_watch(self, request: web.Request, resource: str, ns: str | None) -> web.StreamResponse:
        kind, list_kind, fields, api_version, _ = _KINDS[resource]
        q = request.query
        watch = parse_bool(q.get("watch"), "watch")
        try:
            labels = parse_label_selector(q.get("labelSelector"))
            fsel = parse_field_selector(q.get("fieldSelector"), fields)
        except SelectorError as exc:
            raise ApiError.bad_request(str(exc))
        partial = negotiate(request.headers.get("Accept"), is_list=True, watch=watch)
        view = objects.partial if partial else (lambda o: o)
        if watch:
            timeout = _int(request, "timeoutSeconds")
            bookmarks = parse_bool(q.get("allowWatchBookmarks"), "allowWatchBookmarks")
            w = Watcher(resource, ns, labels, fsel)
            return await serve_watch(request, self.state, w, q.get("resourceVersion"), timeout, bookmarks, view,
                                     "PartialObjectMetadata" if partial else kind, api_version)
        limit = _int(request, "limit") or 0
        if limit < 0:
            raise ApiError.bad_request("limit must be non-negative")
        token = q.get("continue")
        if token:
            try:
                data = json.loads(base64.urlsafe_b64decode(token.encode()))
                sid, offset = int(data["s"]), int(data["o"])
            except Exception:
                raise ApiError.bad_request("continue key is not valid: incorrect encoded start resourceVersion")
            try:
                rv, snapshot = self.store.snapshot_get(sid)
            except Expired as exc:
                raise ApiError(410, str(exc), "Expired")
        else:
            rv, snapshot, sid, offset = self.store.rv, self.store.list(resource, ns), None, 0
        matching = [(i, o) for i, o in enumerate(snapshot) if i >= offset
                    and labels.matches(o["metadata"].get("labels")) and fsel.matches(o)]
        meta = {"resourceVersion": str(rv)}
        items = [o for _, o in matching]
        if limit and len(matching) > limit:
            items = items[:limit]
            if sid is None:
                sid = self.store.snapshot(rv, snapshot)
            next_offset = matching[limit - 1][0] + 1
            meta["continue"] = base64.urlsafe_b64encode(
                json.dumps({"s": sid, "o": next_offset, "rv": rv}).encode()).decode()
            if labels.empty and fsel.empty:
                meta["remainingItemCount"] = len(matching) - limit
        if partial:
            return _json({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
                          "items": [objects.partial(o) for o in items]})
        return _json({"kind": list_kind, "apiVersion": api_version, "metadata": meta,
                      "items": [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in items]})

    # ------------------------------------------------------------ pods
    async def get(self, request: web.Request, resource: str, ns: str, name: str) -> web.Response:
        obj = self._get(resource, ns, name)
        return _json(objects.partial(obj) if negotiate(request.headers.get("Accept"), is_list=False) else obj)

    async def create_pod(self, request: web.Request, ns: str) -> web.Response:
        _, body = await _body(request)
        self._ensure_namespace(ns)
        pod = objects.prepare_pod(body, ns, lambda n: self.store.get("pods", ns, n) is not None)
        name = pod["metadata"]["name"]
        if self.store.get("pods", ns, name) is not None:
            raise ApiError.already_exists("pods", name)
        stored = self.store.write("pods", pod, None)
        self._audit_object(request, stored)
        return _json(stored, 201)

    async def replace_pod(self, request: web.Request, ns: str, name: str, status: bool) -> web.Response:
        old = self._get("pods", ns, name)
        _, body = await _body(request)
        if not isinstance(body, dict):
            raise ApiError.bad_request("the body of the request was in an unknown format")
        meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        if meta.get("name") not in (None, name):
            raise ApiError.bad_request(f"the name of the object ({meta.get('name')}) does not match the name on "
                                       f"the URL ({name})")
        rv = meta.get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise ApiError.conflict("pods", name, "the object has been modified; please apply your changes to the "
                                                  "latest version and try again")
        new = objects.pod_status_update(old, body) if status else objects.pod_update(old, body)
        return _json(self._commit("pods", old, new))

    async def patch_pod(self, request: web.Request, ns: str, name: str, status: bool) -> web.Response:
        old = self._get("pods", ns, name)
        patched = await _patched(request, old)
        if not isinstance(patched, dict):
            raise ApiError.bad_request("the patched object is not a JSON object")
        meta = patched.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise ApiError.conflict("pods", name, "the object has been modified; please apply your changes to the "
                                                  "latest version and try again")
        new = objects.pod_status_update(old, patched) if status else objects.pod_update(old, patched)
        return _json(self._commit("pods", old, new))

    async def delete_pod(self, request: web.Request, ns: str, name: str) -> web.Response:
        pod = self._get("pods", ns, name)
        opts = await self._delete_options(request)
        self._check_preconditions("pods", pod, opts.get("preconditions"))
        grace = objects.delete_grace(pod, opts.get("gracePeriodSeconds"))
        meta = pod["metadata"]
        current = meta.get("deletionGracePeriodSeconds")
        if meta.get("deletionTimestamp") and current is not None and grace >= current:
            return _json(pod)  # kube only ever shortens a pending graceful deletion
        new = {**pod, "metadata": {**meta, "deletionTimestamp": objects.now(grace),
                                   "deletionGracePeriodSeconds": grace}}
        stored = self.store.write("pods", new, pod)  # MODIFIED, even when the delete is immediate
        if grace == 0 and not meta.get("finalizers"):
            return _json(self.store.remove("pods", ns, name))  # then DELETED
        return _json(stored)

    async def _delete_options(self, request: web.Request) -> dict:
        # As kube-apiserver: DeleteOptions come from the body when there is one; the query
        # parameters (?gracePeriodSeconds=) are read only when the body is empty.
        opts: dict = {}
        if (await request.read()).strip():
            _, opts = await _body(request)
            if not isinstance(opts, dict):
                raise ApiError.bad_request("the body of the request was in an unknown format")
        else:
            q_grace = _int(request, "gracePeriodSeconds")
            if q_grace is not None:
                opts["gracePeriodSeconds"] = q_grace
        g = opts.get("gracePeriodSeconds")
        if g is not None and (not isinstance(g, int) or isinstance(g, bool)):
            raise ApiError.bad_request("gracePeriodSeconds must be an integer")
        return opts

    @staticmethod
    def _check_preconditions(resource: str, obj: dict, pre: object, group: str = "") -> None:
        if not pre:
            return
        if not isinstance(pre, dict):
            raise ApiError.bad_request("preconditions must be an object")
        meta = obj["metadata"]
        for key, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
            want = pre.get(key)
            if want is None or want == meta.get(key):
                continue
            if not group:
                raise ApiError(409, f"Precondition failed: {label} in precondition: {want}, {label} in object meta: "
                                    f"{meta.get(key)}", "Conflict", {"name": meta["name"], "kind": resource})
            kind = obj["kind"]
            why = "deleted and then recreated" if key == "uid" else "modified"
            raise ApiError(409, f'Operation cannot be fulfilled on {kind}.{group} "{meta["name"]}": the {label} in the '
                                f"precondition ({want}) does not match the {label} in record ({meta.get(key)}). The "
                                f"object might have been {why}", "Conflict",
                           {"name": meta["name"], "group": group, "kind": kind})

    async def bind_pod(self, request: web.Request, ns: str, name: str) -> web.Response:
        pod = self._get("pods", ns, name)
        _, body = await _body(request)
        target = body.get("target") if isinstance(body, dict) else None
        if not isinstance(target, dict) or not target.get("name"):
            raise ApiError.invalid("Binding", name, ["target.name: Required value"])
        if pod["metadata"].get("deletionTimestamp"):
            raise ApiError.conflict("pods/binding", name, f"pod {name} is being deleted, cannot be assigned to a host")
        if pod["spec"].get("nodeName"):
            raise ApiError.conflict("pods/binding", name,
                                    f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"')
        status = dict(pod.get("status") or {})
        conds = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        status["conditions"] = conds + [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                                         "lastTransitionTime": objects.now()}]
        self.store.write("pods", {**pod, "spec": {**pod["spec"], "nodeName": target["name"]}, "status": status}, pod)
        return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201)

    async def pod_log(self, request: web.Request, ns: str, name: str) -> web.StreamResponse:
        pod = self._get("pods", ns, name)
        names = [c.get("name") for c in pod["spec"].get("containers", [])]
        container = request.query.get("container")
        if container is None and len(names) > 1:
            raise ApiError.bad_request(f"a container name must be specified for pod {name}, choose one of: "
                                       f"[{' '.join(names)}]")
        if container is not None and container not in names:
            raise ApiError.bad_request(f"container {container} is not valid for pod {name}")
        container = container or names[0]
        tail, limit = _int(request, "tailLines"), _int(request, "limitBytes")
        follow = parse_bool(request.query.get("follow"), "follow")
        data = self.state.read_log(ns, name, container)
        if data is None:
            if not pod["spec"].get("nodeName"):
                return web.Response(status=204)  # no host assigned: kube-apiserver answers empty
            if (pod.get("status") or {}).get("phase", "Pending") == "Pending":
                raise ApiError.bad_request(f'container "{container}" in pod "{name}" is waiting to start: '
                                           f"ContainerCreating")
            data = b""
        if tail is not None:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-tail:]) if tail > 0 else b""
        if limit is not None and limit > 0:
            data = data[:limit]
        if not follow:
            return web.Response(body=data, content_type="text/plain")
        return await self._follow(request, ns, name, container, data)

    async def _follow(self, request, ns, name, container, first: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        sent = len(self.state.read_log(ns, name, container) or b"")
        try:
            await resp.write(first)
            while True:
                await asyncio.sleep(0.2)
                pod = self.store.get("pods", ns, name)
                data = self.state.read_log(ns, name, container) or b""
                if len(data) > sent:
                    await resp.write(data[sent:])
                    sent = len(data)
                done = pod is None or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
                if done or request.transport is None or request.transport.is_closing():
                    break
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        return resp

    # ------------------------------------------------------------ namespaces
    async def create_namespace(self, request: web.Request) -> web.Response:
        _, body = await _body(request)
        nsobj = objects.prepare_namespace(body, lambda n: self.store.get("namespaces", "", n) is not None)
        name = nsobj["metadata"]["name"]
        if self.store.get("namespaces", "", name) is not None:
            raise ApiError.already_exists("namespaces", name)
        return _json(self.store.write("namespaces", nsobj, None), 201)

    async def delete_namespace(self, request: web.Request, name: str) -> web.Response:
        nsobj = self._get("namespaces", "", name)
        opts = await self._delete_options(request)
        self._check_preconditions("namespaces", nsobj, opts.get("preconditions"))
        for resource in ("pods", "leases"):
            for obj in self.store.list(resource, name):
                self.store.remove(resource, name, obj["metadata"]["name"])
        final = self.store.remove("namespaces", "", name)
        final = {**final, "metadata": {**final["metadata"], "deletionTimestamp": objects.now()},
                 "status": {"phase": "Terminating"}}
        return _json(final)
