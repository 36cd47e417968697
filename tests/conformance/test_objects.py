"""Object basics an executor relies on: server-set metadata, names, error Status bodies."""

from __future__ import annotations

import json

import pytest


def test_create_sets_server_metadata(make_pod):
    pod = make_pod(labels={"app": "x"}, annotations={"note": "y"})
    meta = pod.metadata
    assert meta.uid and meta.resource_version and meta.creation_timestamp is not None
    assert isinstance(meta.resource_version, str)
    assert meta.labels == {"app": "x"} and meta.annotations["note"] == "y"
    assert pod.status.phase == "Pending"
    assert meta.deletion_timestamp is None


def test_uids_are_unique_and_rv_changes_on_write(v1, ns, make_pod):
    a, b = make_pod(), make_pod()
    assert a.metadata.uid != b.metadata.uid
    patched = v1.patch_namespaced_pod(a.metadata.name, ns, {"metadata": {"labels": {"k": "v"}}})
    assert patched.metadata.resource_version != a.metadata.resource_version
    assert patched.metadata.uid == a.metadata.uid


def test_generate_name(make_pod):
    pod = make_pod(generate_name="gen-prefix-")
    name = pod.metadata.name
    assert name.startswith("gen-prefix-") and len(name) == len("gen-prefix-") + 5
    assert pod.metadata.generate_name == "gen-prefix-"


def test_create_taken_name_is_409_already_exists(v1, ns, make_pod, h):
    pod = make_pod()
    with pytest.raises(h.ApiException) as err:
        h.create_pod(v1, ns, h.pod_body(name=pod.metadata.name))
    assert err.value.status == 409
    body = h.status_of(err.value)
    assert body["kind"] == "Status" and body["reason"] == "AlreadyExists"
    assert body["details"]["name"] == pod.metadata.name


def test_get_missing_is_404_not_found(v1, ns, h):
    with pytest.raises(h.ApiException) as err:
        v1.read_namespaced_pod("does-not-exist", ns)
    assert err.value.status == 404
    assert h.status_of(err.value)["reason"] == "NotFound"


@pytest.mark.parametrize("mutate", ["no_containers", "no_name", "bad_label"])
def test_invalid_pod_is_422(v1, ns, h, mutate):
    body = h.pod_body(name="invalid-pod")
    if mutate == "no_containers":
        body["spec"]["containers"] = []
    elif mutate == "no_name":
        del body["metadata"]["name"]
    else:
        body["metadata"]["labels"] = {"bad key!": "v"}
    with pytest.raises(h.ApiException) as err:
        h.create_pod(v1, ns, body)
    assert err.value.status == 422
    assert h.status_of(err.value)["reason"] == "Invalid"


def test_malformed_body_is_400(api_client, ns, h):
    resp = h.raw(api_client, "POST", f"/api/v1/namespaces/{ns}/pods", body="this is not a pod")
    assert resp.status == 400


def test_unsupported_content_type_is_415(api_client, ns, make_pod, h):
    pod = make_pod()
    resp = h.raw(api_client, "PATCH", f"/api/v1/namespaces/{ns}/pods/{pod.metadata.name}",
                 body='{"metadata":{}}', headers={"Content-Type": "text/plain"})
    assert resp.status == 415


def test_namespace_lifecycle(v1, h):
    name = "conf-ns-" + __import__("uuid").uuid4().hex[:8]
    created = v1.create_namespace({"metadata": {"name": name}})
    try:
        assert created.metadata.uid and created.status.phase == "Active"
        assert v1.read_namespace(name).metadata.uid == created.metadata.uid
        with pytest.raises(h.ApiException) as err:
            v1.create_namespace({"metadata": {"name": name}})
        assert err.value.status == 409
    finally:
        v1.delete_namespace(name)
    try:
        assert v1.read_namespace(name).status.phase == "Terminating"  # real clusters finish asynchronously
    except h.ApiException as exc:
        assert exc.status == 404


def test_discovery_and_version(api_client, h):
    version = json.loads(h.raw(api_client, "GET", "/version").data)
    assert version["major"] and version["gitVersion"]
    resources = json.loads(h.raw(api_client, "GET", "/api/v1").data)
    names = {r["name"] for r in resources["resources"]}
    assert {"pods", "pods/status", "pods/binding", "pods/log", "namespaces"} <= names
