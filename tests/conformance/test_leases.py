"""coordination.k8s.io/v1 Leases through the real client's CoordinationV1Api, exactly as the executor
calls it, on the emulator and on the real kube-apiserver alike: server metadata and
resourceVersion, merge patch (a null annotation deletes the key), 404 / 409 / 422 / 400, list by
label, watch, delete, discovery, audit entries, write faults and RBAC denials on lease paths.

Cost: 42 tests on the emulator, 41 on the real apiserver, each in its own namespace; measured on 2
cores: 3 s and 9 s (the apiserver's start included) at load 2, 7 s and 21 s at load 15."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pytest
from kubernetes import client, config

MERGE = "application/merge-patch+json"
GROUP = "coordination.k8s.io"
RENEW = "2026-12-06T03:00:00.123456Z"


@pytest.fixture(scope="session")
def coord(api_client) -> client.CoordinationV1Api:
    return client.CoordinationV1Api(api_client)


def body(name: str, labels=None, annotations=None, **spec) -> dict:
    """A Lease as a plain dict (the client sends dicts as they are)."""
    spec = {"holderIdentity": "scheduler-a", "leaseDurationSeconds": 30, "renewTime": RENEW, **spec}
    meta: dict = {"name": name}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": f"{GROUP}/v1", "kind": "Lease", "metadata": meta, "spec": spec}


def error(exc) -> tuple[int, str, dict]:
    status = json.loads(exc.body)
    return exc.status, status.get("reason"), status.get("details") or {}


# ---------------------------------------------------------------- create / read


def test_create_sets_server_metadata_and_keeps_the_spec(coord, ns):
    created = coord.create_namespaced_lease(ns, body("w-1", labels={"app": "x"}, annotations={"a": "1"}))
    meta = created.metadata
    assert meta.uid and isinstance(meta.resource_version, str) and meta.creation_timestamp is not None
    assert meta.generation is None  # leases have none (pods neither, on the emulator)
    assert (meta.name, meta.namespace, meta.labels, meta.annotations) == ("w-1", ns, {"app": "x"}, {"a": "1"})
    spec = created.spec
    assert (spec.holder_identity, spec.lease_duration_seconds) == ("scheduler-a", 30)
    assert spec.renew_time == dt.datetime(2026, 12, 6, 3, 0, 0, 123456, tzinfo=dt.timezone.utc)
    read = coord.read_namespaced_lease("w-1", ns)
    assert (read.metadata.uid, read.metadata.resource_version) == (meta.uid, meta.resource_version)


def test_create_from_a_model_object(coord, ns):
    renew = dt.datetime(2026, 12, 6, 3, 0, 0, 123456, tzinfo=dt.timezone.utc)
    lease = client.V1Lease(metadata=client.V1ObjectMeta(name="w-model", labels={"k": "v"}),
                           spec=client.V1LeaseSpec(holder_identity="h", lease_duration_seconds=5, renew_time=renew))
    created = coord.create_namespaced_lease(ns, lease)
    assert (created.spec.renew_time, created.metadata.labels) == (renew, {"k": "v"})
    raw = coord.read_namespaced_lease("w-model", ns, _preload_content=False)
    assert json.loads(raw.data)["spec"]["renewTime"] == RENEW  # stored in UTC, six digits, "Z"


def test_create_taken_name_is_409_already_exists(coord, ns):
    coord.create_namespaced_lease(ns, body("taken"))
    with pytest.raises(client.ApiException) as err:
        coord.create_namespaced_lease(ns, body("taken", holderIdentity="other"))
    assert error(err.value) == (409, "AlreadyExists", {"name": "taken", "group": GROUP, "kind": "leases"})
    assert coord.read_namespaced_lease("taken", ns).spec.holder_identity == "scheduler-a"


def test_generate_name(coord, ns):
    lease = coord.create_namespaced_lease(ns, {"metadata": {"generateName": "w-"}, "spec": {}})
    assert lease.metadata.name.startswith("w-") and len(lease.metadata.name) == 7


@pytest.mark.parametrize("call", ["read", "patch", "delete"])
def test_missing_lease_is_404(coord, ns, call):
    with pytest.raises(client.ApiException) as err:
        if call == "read":
            coord.read_namespaced_lease("nope", ns)
        elif call == "patch":
            coord.patch_namespaced_lease("nope", ns, {"spec": {"holderIdentity": "x"}}, _content_type=MERGE)
        else:
            coord.delete_namespaced_lease("nope", ns)
    assert error(err.value) == (404, "NotFound", {"name": "nope", "group": GROUP, "kind": "leases"})


def test_namespace_rule_is_the_pods_rule(target, coord, v1, h):
    """Where a pod may not be created, neither may a Lease: a namespace that does not exist is 404 on
    a real apiserver (the emulator's implicit namespaces allow both)."""
    ns = "conf-missing-" + uuid.uuid4().hex[:8]
    outcomes = []
    for create, delete in ((lambda: h.create_pod(v1, ns, h.pod_body(name="p")),
                            lambda: v1.delete_namespaced_pod("p", ns)),
                           (lambda: coord.create_namespaced_lease(ns, body("w")),
                            lambda: coord.delete_namespaced_lease("w", ns))):
        try:
            create()
            outcomes.append("created")
            delete()
        except client.ApiException as exc:
            outcomes.append(error(exc))
    assert outcomes[0] == outcomes[1]
    if target is not None and target.name == "real":
        assert outcomes[1] == (404, "NotFound", {"name": ns, "kind": "namespaces"})


# ---------------------------------------------------------------- merge patch and resourceVersion


def test_merge_patch_sets_fields_and_a_null_annotation_deletes_the_key(coord, ns):
    before = coord.create_namespaced_lease(ns, body("w", labels={"l": "1"}, annotations={"a": "1", "b": "2"}))
    patch = {"metadata": {"labels": {"m": "2"}, "annotations": {"a": None, "c": "3", "absent": None}},
             "spec": {"holderIdentity": "scheduler-b", "renewTime": "2026-12-06T03:00:05.000001Z",
                      "leaseDurationSeconds": 60}}
    after = coord.patch_namespaced_lease("w", ns, patch, _content_type=MERGE)
    assert after.metadata.labels == {"l": "1", "m": "2"}
    assert after.metadata.annotations == {"b": "2", "c": "3"}
    assert (after.spec.holder_identity, after.spec.lease_duration_seconds) == ("scheduler-b", 60)
    assert after.spec.renew_time == dt.datetime(2026, 12, 6, 3, 0, 5, 1, tzinfo=dt.timezone.utc)
    assert after.metadata.uid == before.metadata.uid
    assert int(after.metadata.resource_version) > int(before.metadata.resource_version)
    gone = coord.patch_namespaced_lease("w", ns, {"metadata": {"annotations": None}}, _content_type=MERGE)
    assert gone.metadata.annotations is None and gone.metadata.labels == {"l": "1", "m": "2"}


def test_a_patch_that_changes_nothing_keeps_the_resource_version(coord, ns):
    created = coord.create_namespaced_lease(ns, body("w", annotations={"a": "1"}))
    same = {"metadata": {"annotations": {"a": "1", "absent": None}},
            "spec": {"holderIdentity": "scheduler-a", "renewTime": "2026-12-06T05:00:00.123456+02:00"}}
    again = coord.patch_namespaced_lease("w", ns, same, _content_type=MERGE)
    assert again.metadata.resource_version == created.metadata.resource_version  # +02:00 is the same instant
    changed = coord.patch_namespaced_lease("w", ns, {"spec": {"leaseDurationSeconds": 31}}, _content_type=MERGE)
    assert changed.metadata.resource_version != created.metadata.resource_version


def test_patch_with_a_stale_resource_version_is_409(coord, ns):
    created = coord.create_namespaced_lease(ns, body("w"))
    coord.patch_namespaced_lease("w", ns, {"spec": {"holderIdentity": "b"}}, _content_type=MERGE)
    stale = {"metadata": {"resourceVersion": created.metadata.resource_version}, "spec": {"holderIdentity": "c"}}
    with pytest.raises(client.ApiException) as err:
        coord.patch_namespaced_lease("w", ns, stale, _content_type=MERGE)
    assert error(err.value) == (409, "Conflict", {"name": "w", "group": GROUP, "kind": "leases"})
    assert coord.read_namespaced_lease("w", ns).spec.holder_identity == "b"


def test_replace_needs_the_current_resource_version(coord, ns):
    lease = coord.create_namespaced_lease(ns, body("w"))
    lease.spec.holder_identity = "scheduler-b"
    replaced = coord.replace_namespaced_lease("w", ns, lease)  # carries the rv it read
    assert replaced.spec.holder_identity == "scheduler-b"
    assert replaced.metadata.resource_version != lease.metadata.resource_version
    lease.spec.holder_identity = "scheduler-c"  # still the old rv
    with pytest.raises(client.ApiException) as err:
        coord.replace_namespaced_lease("w", ns, lease)
    assert error(err.value) == (409, "Conflict", {"name": "w", "group": GROUP, "kind": "leases"})
    lease.metadata.resource_version = None  # no unconditional update of a Lease: 422, unlike pods
    with pytest.raises(client.ApiException) as err:
        coord.replace_namespaced_lease("w", ns, lease)
    assert err.value.status == 422 and "resourceVersion" in json.loads(err.value.body)["message"]
    assert coord.read_namespaced_lease("w", ns).spec.holder_identity == "scheduler-b"


def test_replace_of_a_missing_lease_creates_it(coord, ns):
    """kube's Lease strategy allows create-on-update: PUT answers 201, whatever resourceVersion it carries."""
    resp = coord.replace_namespaced_lease("w", ns, body("w"), _preload_content=False)
    assert resp.status == 201
    stale = {**body("w2"), "metadata": {"name": "w2", "resourceVersion": "12345"}}
    assert coord.replace_namespaced_lease("w2", ns, stale).metadata.uid


def test_replace_name_must_match_the_url(coord, ns):
    with pytest.raises(client.ApiException) as err:
        coord.replace_namespaced_lease("w", ns, body("other"))
    assert err.value.status == 400


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("case", ["annotation-key", "annotations-too-big", "duration-zero", "duration-negative",
                                  "transitions-negative", "name"])
def test_invalid_lease_is_422_on_create_and_patch(coord, ns, case):
    bad = {"annotation-key": {"metadata": {"annotations": {"bad key!": "v"}}},
           "annotations-too-big": {"metadata": {"annotations": {"big": "x" * (256 * 1024)}}},
           "duration-zero": {"spec": {"leaseDurationSeconds": 0}},
           "duration-negative": {"spec": {"leaseDurationSeconds": -5}},
           "transitions-negative": {"spec": {"leaseTransitions": -1}},
           "name": {"metadata": {"name": "Not_A_Subdomain"}}}[case]
    doc = body("w")
    doc["metadata"].update(bad.get("metadata", {}))
    doc["spec"].update(bad.get("spec", {}))
    with pytest.raises(client.ApiException) as err:
        coord.create_namespaced_lease(ns, doc)
    status, reason, details = error(err.value)
    assert (status, reason, details.get("group"), details.get("kind")) == (422, "Invalid", GROUP, "Lease")
    if case == "name":
        return
    before = coord.create_namespaced_lease(ns, body("w", annotations={"keep": "1"}))
    with pytest.raises(client.ApiException) as err:
        coord.patch_namespaced_lease("w", ns, bad, _content_type=MERGE)
    assert error(err.value)[:2] == (422, "Invalid")
    after = coord.read_namespaced_lease("w", ns)
    assert after.metadata.resource_version == before.metadata.resource_version


def test_annotations_just_under_the_limit_and_any_case_keys_are_valid(coord, ns):
    annotations = {"Example.com/Mixed-Case": "1", "big": "x" * (256 * 1024 - len("big") - 100)}
    lease = coord.create_namespaced_lease(ns, body("w", annotations=annotations))
    assert set(lease.metadata.annotations) == set(annotations)


@pytest.mark.parametrize("renew", ["2026-12-06T03:00:00Z", "2026-12-06T03:00:00.123Z", "2026-12-06T03:00:00.1234567Z",
                                   "2026-12-06T03:00:00.123456", "2026-12-06 03:00:00.123456Z", "yesterday"])
def test_renew_time_must_be_a_micro_time(coord, ns, renew):
    """MicroTime is Go's "2006-01-02T15:04:05.000000Z07:00": six fraction digits and a zone, nothing
    else. A body that does not decode is 400 on create, 422 on a patch (the patched object is decoded)."""
    with pytest.raises(client.ApiException) as err:
        coord.create_namespaced_lease(ns, body("w", renewTime=renew))
    assert error(err.value)[:2] == (400, "BadRequest")
    coord.create_namespaced_lease(ns, body("w"))
    with pytest.raises(client.ApiException) as err:
        coord.patch_namespaced_lease("w", ns, {"spec": {"renewTime": renew}}, _content_type=MERGE)
    assert error(err.value)[:2] == (422, "Invalid")


@pytest.mark.parametrize("renew", [dt.datetime(2026, 12, 6, 3, 0, 0, tzinfo=dt.timezone.utc),
                                   dt.datetime(2026, 12, 6, 3, 0, 0, 123456)], ids=["whole-second", "naive"])
def test_client_datetimes_that_do_not_serialize_as_micro_time_are_400(coord, ns, renew):
    """The generated client sends datetime.isoformat(): a whole second has no fraction, a naive
    datetime no zone, and both are refused. Send renewTime as a string: t.strftime('%Y-%m-%dT%H:%M:%S.%fZ')."""
    lease = client.V1Lease(metadata=client.V1ObjectMeta(name="w"), spec=client.V1LeaseSpec(renew_time=renew))
    with pytest.raises(client.ApiException) as err:
        coord.create_namespaced_lease(ns, lease)
    assert err.value.status == 400


@pytest.mark.parametrize("spec", [{"leaseDurationSeconds": "30"}, {"leaseDurationSeconds": 1.5},
                                  {"holderIdentity": 7}])
def test_mistyped_spec_is_400_on_create(coord, ns, spec):
    with pytest.raises(client.ApiException) as err:
        coord.create_namespaced_lease(ns, body("w", **spec))
    assert err.value.status == 400


def test_gated_and_unknown_spec_fields_are_dropped(coord, ns):
    lease = coord.create_namespaced_lease(ns, body("w", preferredHolder="x", strategy="OldestEmulationVersion",
                                                   bogus=1), _preload_content=False)
    assert set(json.loads(lease.data)["spec"]) == {"holderIdentity", "leaseDurationSeconds", "renewTime"}


# ---------------------------------------------------------------- list, watch, delete


def test_list_by_label_selector(coord, ns):
    for name, deployment in (("a", "one"), ("b", "one"), ("c", "two")):
        coord.create_namespaced_lease(ns, body(name, labels={"fenced.test/deployment": deployment}))
    listed = coord.list_namespaced_lease(ns, label_selector="fenced.test/deployment=one")
    assert sorted(x.metadata.name for x in listed.items) == ["a", "b"]
    assert listed.metadata.resource_version
    assert [x.metadata.name for x in coord.list_namespaced_lease(ns, field_selector="metadata.name=c").items] == ["c"]
    with pytest.raises(client.ApiException) as err:
        coord.list_namespaced_lease(ns, field_selector="spec.holderIdentity=x")
    assert err.value.status == 400


def test_watch_sees_added_modified_deleted(coord, ns, collectors):
    w = collectors(coord.list_namespaced_lease, ns)
    coord.create_namespaced_lease(ns, body("w"))
    assert w.until(lambda e: e["type"] == "ADDED")["object"].metadata.name == "w"
    coord.patch_namespaced_lease("w", ns, {"spec": {"holderIdentity": "b"}}, _content_type=MERGE)
    assert w.until(lambda e: e["type"] == "MODIFIED")["object"].spec.holder_identity == "b"
    coord.delete_namespaced_lease("w", ns)
    assert w.until(lambda e: e["type"] == "DELETED")["object"].metadata.name == "w"


def test_delete_answers_a_status_and_honours_a_uid_precondition(coord, ns):
    lease = coord.create_namespaced_lease(ns, body("w"))
    with pytest.raises(client.ApiException) as err:
        coord.delete_namespaced_lease("w", ns, body=client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid="00000000-0000-0000-0000-000000000000")))
    assert error(err.value)[:2] == (409, "Conflict")
    status = coord.delete_namespaced_lease("w", ns, body=client.V1DeleteOptions(
        preconditions=client.V1Preconditions(uid=lease.metadata.uid)))
    assert (status.status, status.details.uid, status.details.kind) == ("Success", lease.metadata.uid, "leases")
    assert coord.list_namespaced_lease(ns).items == []


def test_delete_collection_by_label(coord, ns):
    for name, keep in (("a", "no"), ("b", "no"), ("c", "yes")):
        coord.create_namespaced_lease(ns, body(name, labels={"keep": keep}))
    coord.delete_collection_namespaced_lease(ns, label_selector="keep=no")
    assert [x.metadata.name for x in coord.list_namespaced_lease(ns).items] == ["c"]


def test_discovery(api_client, h):
    def get(path):
        return json.loads(h.raw(api_client, "GET", path).data)

    groups = {g["name"]: g for g in get("/apis")["groups"]}
    assert groups[GROUP]["preferredVersion"] == {"groupVersion": f"{GROUP}/v1", "version": "v1"}
    group = get(f"/apis/{GROUP}")
    assert (group["kind"], group["name"], group["versions"]) == (
        "APIGroup", GROUP, [{"groupVersion": f"{GROUP}/v1", "version": "v1"}])
    resources = get(f"/apis/{GROUP}/v1")
    (leases,) = [r for r in resources["resources"] if r["name"] == "leases"]
    assert (resources["groupVersion"], leases["kind"], leases["namespaced"]) == (f"{GROUP}/v1", "Lease", True)
    assert set(leases["verbs"]) == {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
    assert h.raw(api_client, "GET", f"/apis/{GROUP}/v1beta1").status == 404


# ---------------------------------------------------------------- audit, faults, RBAC


def test_audit_records_lease_requests(target, coord, ns):
    if target is None:
        pytest.skip("an external cluster's audit log is not readable")
    start = len(target.audit())
    coord.create_namespaced_lease(ns, body("w"))
    coord.read_namespaced_lease("w", ns)
    coord.patch_namespaced_lease("w", ns, {"spec": {"holderIdentity": "b"}}, _content_type=MERGE)
    coord.list_namespaced_lease(ns)
    coord.delete_namespaced_lease("w", ns)
    with pytest.raises(client.ApiException):
        coord.read_namespaced_lease("w", ns)
    entries = [e for e in target.audit(since=start) if e["namespace"] == ns]
    assert [(e["who"], e["verb"], e["resource"], e["name"], e["code"]) for e in entries] == [
        ("conformance", "create", "leases", "w", 201), ("conformance", "get", "leases", "w", 200),
        ("conformance", "patch", "leases", "w", 200), ("conformance", "list", "leases", None, 200),
        ("conformance", "delete", "leases", "w", 200), ("conformance", "get", "leases", "w", 404)]
    assert entries[1]["path"] == f"/apis/{GROUP}/v1/namespaces/{ns}/leases/w"


def test_write_faults_on_lease_paths(coord, v1, ns, faults):
    coord.create_namespaced_lease(ns, body("w"))
    ours = [faults.add_fault(method="PATCH", path=rf"^/apis/{GROUP}/v1/namespaces/{ns}/leases/w$", status=503,
                             times=1),
            faults.add_fault(method="POST", path=rf"/namespaces/{ns}/leases$", status=403, times=1)]
    with pytest.raises(client.ApiException) as err:
        coord.patch_namespaced_lease("w", ns, {"spec": {"holderIdentity": "b"}}, _content_type=MERGE)
    assert err.value.status == 503 and "injected fault" in json.loads(err.value.body)["message"]
    with pytest.raises(client.ApiException) as err:
        coord.create_namespaced_lease(ns, body("x"))
    assert error(err.value)[:2] == (403, "Forbidden")
    assert [x.metadata.name for x in coord.list_namespaced_lease(ns).items] == ["w"]  # neither was carried out
    assert coord.read_namespaced_lease("w", ns).spec.holder_identity == "scheduler-a"
    coord.patch_namespaced_lease("w", ns, {"spec": {"holderIdentity": "b"}}, _content_type=MERGE)  # spent
    assert [f["fired"] for f in faults.faults() if f["id"] in ours] == [1, 1]  # the target is the session's


RBAC_USER = "rbac-1"
READ_ONLY = [{"apiGroups": [GROUP], "resources": ["leases"], "verbs": ["get", "list", "watch"]}]


@pytest.fixture
def forbidden_writer(target, ns, tmp_path):
    """A CoordinationV1Api for a caller who may read leases in `ns` but not create or patch them:
    on the real apiserver a user outside system:masters bound to a read-only Role (RBAC's own 403),
    on the emulator (no RBAC) a 403 fault on lease writes for that caller alone."""
    if target is None:
        pytest.skip("needs a target whose users we provision")
    target.set_tokens({RBAC_USER: RBAC_USER})
    if target.name == "real":
        target.grant(RBAC_USER, ns, READ_ONLY)
    else:
        for method in ("POST", "PATCH"):
            target.add_fault(method=method, path=rf"/apis/{GROUP}/v1/namespaces/[^/]+/leases(/|$)", status=403,
                             who=RBAC_USER, message=f'leases.{GROUP} is forbidden: User "{RBAC_USER}" cannot')
    api = config.new_client_from_config(config_file=target.write_kubeconfig(str(tmp_path / "kc"), token=RBAC_USER))
    yield client.CoordinationV1Api(api)
    api.close()
    if target.name != "real":
        target.clear_faults()


def test_a_caller_without_lease_write_rights_gets_403_and_others_do_not(coord, ns, forbidden_writer):
    coord.create_namespaced_lease(ns, body("w"))
    assert forbidden_writer.read_namespaced_lease("w", ns).spec.holder_identity == "scheduler-a"
    assert [x.metadata.name for x in forbidden_writer.list_namespaced_lease(ns).items] == ["w"]
    for write in (lambda: forbidden_writer.patch_namespaced_lease("w", ns, {"spec": {"holderIdentity": "x"}},
                                                                  _content_type=MERGE),
                  lambda: forbidden_writer.create_namespaced_lease(ns, body("mine"))):
        with pytest.raises(client.ApiException) as err:
            write()
        assert error(err.value)[:2] == (403, "Forbidden")
    coord.patch_namespaced_lease("w", ns, {"spec": {"holderIdentity": "b"}}, _content_type=MERGE)  # others may
    assert [x.metadata.name for x in coord.list_namespaced_lease(ns).items] == ["w"]


def test_emulator_without_implicit_namespaces_refuses_leases_as_pods(emu):
    from fenced_k8s_lab.kubeapi import Emulator

    with Emulator(implicit_namespaces=False) as strict:
        cfg = client.Configuration()
        cfg.host = strict.url
        api = client.ApiClient(cfg)
        with pytest.raises(client.ApiException) as err:
            client.CoordinationV1Api(api).create_namespaced_lease("absent", body("w"))
        assert error(err.value) == (404, "NotFound", {"name": "absent", "kind": "namespaces"})
        strict.ensure_namespace("present")
        assert client.CoordinationV1Api(api).create_namespaced_lease("present", body("w")).metadata.uid
        assert [x["metadata"]["name"] for x in strict.leases("present")] == ["w"]
        api.close()
