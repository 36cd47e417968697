"""Writes: merge / strategic-merge / JSON patches, /status, no-op patches, optimistic concurrency."""

from __future__ import annotations

import pytest


def test_merge_patch_adds_and_removes_labels(v1, ns, make_pod, h):
    pod = make_pod(labels={"keep": "1", "drop": "1"})
    out = h.raw(v1.api_client, "PATCH", f"/api/v1/namespaces/{ns}/pods/{pod.metadata.name}",
                body={"metadata": {"labels": {"drop": None, "new": "2"}}},
                headers={"Content-Type": "application/merge-patch+json"})
    assert out.status == 200
    assert v1.read_namespaced_pod(pod.metadata.name, ns).metadata.labels == {"keep": "1", "new": "2"}


def test_strategic_merge_patch_merges_containers_by_name(v1, ns, make_pod):
    containers = [{"name": "base", "image": "registry.invalid/a:1"}, {"name": "side", "image": "registry.invalid/b:1"}]
    pod = make_pod(containers=containers)
    # the python client sends a dict body as application/strategic-merge-patch+json
    out = v1.patch_namespaced_pod(pod.metadata.name, ns,
                                  {"spec": {"containers": [{"name": "side", "image": "registry.invalid/b:2"}]}})
    images = {c.name: c.image for c in out.spec.containers}
    assert images == {"base": "registry.invalid/a:1", "side": "registry.invalid/b:2"}


def test_strategic_merge_patch_unions_finalizers(v1, ns, make_pod):
    pod = make_pod(finalizers=["conformance.fenced.test/one"])
    out = v1.patch_namespaced_pod(pod.metadata.name, ns, {"metadata": {"finalizers": ["conformance.fenced.test/two"]}})
    assert sorted(out.metadata.finalizers) == ["conformance.fenced.test/one", "conformance.fenced.test/two"]
    v1.patch_namespaced_pod(pod.metadata.name, ns, [{"op": "remove", "path": "/metadata/finalizers"}])


def test_json_patch_ops_and_failed_test_is_422(v1, ns, make_pod, h):
    pod = make_pod(annotations={"x": "1"})
    ops = [{"op": "test", "path": "/metadata/annotations/x", "value": "1"},
           {"op": "add", "path": "/metadata/annotations/fenced.test~1token", "value": "t"},
           {"op": "replace", "path": "/metadata/annotations/x", "value": "2"}]
    out = v1.patch_namespaced_pod(pod.metadata.name, ns, ops)  # list body -> application/json-patch+json
    assert out.metadata.annotations == {"x": "2", "fenced.test/token": "t"}
    with pytest.raises(h.ApiException) as err:
        v1.patch_namespaced_pod(pod.metadata.name, ns, [{"op": "test", "path": "/metadata/annotations/x",
                                                         "value": "1"}])
    assert err.value.status == 422


def test_noop_patch_keeps_resource_version(v1, ns, make_pod, collectors):
    pod = make_pod(labels={"a": "1"})
    same = v1.patch_namespaced_pod(pod.metadata.name, ns, {"metadata": {"labels": {"a": "1"}}})
    assert same.metadata.resource_version == pod.metadata.resource_version
    # ... and emits no watch event: a later real change is the first event after that rv
    watcher = collectors(v1.list_namespaced_pod, ns, resource_version=pod.metadata.resource_version)
    changed = v1.patch_namespaced_pod(pod.metadata.name, ns, {"metadata": {"labels": {"a": "2"}}})
    event = watcher.next()
    assert event["type"] == "MODIFIED"
    assert event["object"].metadata.resource_version == changed.metadata.resource_version


def test_status_subresource(v1, ns, make_pod):
    pod = make_pod()
    name = pod.metadata.name
    # pods/status takes status and metadata (labels, annotations), never the spec
    out = v1.patch_namespaced_pod_status(name, ns, {"status": {"phase": "Running"},
                                                     "metadata": {"labels": {"via-status": "1"}},
                                                     "spec": {"activeDeadlineSeconds": 5}})
    assert out.status.phase == "Running"
    assert out.metadata.labels == {"via-status": "1"}
    assert out.spec.active_deadline_seconds is None
    # the main resource ignores status changes
    out = v1.patch_namespaced_pod(name, ns, {"status": {"phase": "Failed"}, "metadata": {"labels": {"m": "1"}}})
    assert out.status.phase == "Running" and out.metadata.labels == {"via-status": "1", "m": "1"}
    assert v1.read_namespaced_pod_status(name, ns).status.phase == "Running"


def test_status_patch_keeps_owner_references(v1, ns, h):
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": "11111111-2222-3333-4444-555555555555"}
    body = h.pod_body(name="owned")
    body["metadata"]["ownerReferences"] = [owner]
    h.create_pod(v1, ns, body)
    out = v1.patch_namespaced_pod_status("owned", ns, {"metadata": {"ownerReferences": None}})
    assert [r.name for r in out.metadata.owner_references or []] == ["owner"]


def test_status_patch_merges_conditions_by_type(v1, ns, make_pod):
    pod = make_pod()
    name = pod.metadata.name
    v1.patch_namespaced_pod_status(name, ns, {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    out = v1.patch_namespaced_pod_status(
        name, ns, {"status": {"conditions": [{"type": "ContainersReady", "status": "False"}]}})
    assert {c.type for c in out.status.conditions} >= {"Ready", "ContainersReady"}


def test_replace_with_stale_resource_version_is_409(v1, ns, make_pod, h):
    pod = make_pod()
    v1.patch_namespaced_pod(pod.metadata.name, ns, {"metadata": {"labels": {"bump": "1"}}})
    pod.metadata.labels = {"stale": "1"}
    with pytest.raises(h.ApiException) as err:
        v1.replace_namespaced_pod(pod.metadata.name, ns, pod)
    assert err.value.status == 409 and h.status_of(err.value)["reason"] == "Conflict"
    fresh = v1.read_namespaced_pod(pod.metadata.name, ns)
    fresh.metadata.labels = {"fresh": "1"}
    assert v1.replace_namespaced_pod(pod.metadata.name, ns, fresh).metadata.labels == {"fresh": "1"}


def test_patch_with_stale_resource_version_is_409(v1, ns, make_pod, h):
    pod = make_pod()
    v1.patch_namespaced_pod(pod.metadata.name, ns, {"metadata": {"labels": {"bump": "1"}}})
    with pytest.raises(h.ApiException) as err:
        v1.patch_namespaced_pod(pod.metadata.name, ns, {"metadata": {
            "resourceVersion": pod.metadata.resource_version, "labels": {"late": "1"}}})
    assert err.value.status == 409


def test_pod_spec_is_immutable_except_images(v1, ns, make_pod, h):
    pod = make_pod()
    with pytest.raises(h.ApiException) as err:
        v1.patch_namespaced_pod(pod.metadata.name, ns, {"spec": {"restartPolicy": "Always"}})
    assert err.value.status == 422


def test_invalid_patch_document_is_400(v1, ns, make_pod, h):
    pod = make_pod()
    resp = h.raw(v1.api_client, "PATCH", f"/api/v1/namespaces/{ns}/pods/{pod.metadata.name}",
                 body=[{"op": "frobnicate", "path": "/metadata"}],
                 headers={"Content-Type": "application/json-patch+json"})
    assert resp.status in (400, 422)
    resp = h.raw(v1.api_client, "PATCH", f"/api/v1/namespaces/{ns}/pods/{pod.metadata.name}",
                 body={"not": "a list"},  # the charset stops the client rewriting the content type
                 headers={"Content-Type": "application/json-patch+json; charset=utf-8"})
    assert resp.status == 400
