"""Deletion, preconditions, graceful deletion, finalizers, binding and logs."""

from __future__ import annotations

import pytest
from kubernetes import client


def _gone(v1, ns, name, h) -> bool:
    try:
        v1.read_namespaced_pod(name, ns)
    except h.ApiException as exc:
        return exc.status == 404
    return False


def test_delete_with_wrong_uid_precondition_is_409(v1, ns, make_pod, h):
    pod = make_pod()
    opts = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="00000000-0000-0000-0000-000000000000"))
    with pytest.raises(h.ApiException) as err:
        v1.delete_namespaced_pod(pod.metadata.name, ns, body=opts)
    assert err.value.status == 409 and h.status_of(err.value)["reason"] == "Conflict"
    assert not _gone(v1, ns, pod.metadata.name, h)
    ok = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=pod.metadata.uid))
    v1.delete_namespaced_pod(pod.metadata.name, ns, body=ok)
    assert _gone(v1, ns, pod.metadata.name, h)


def test_delete_with_stale_resource_version_precondition_is_409(v1, ns, make_pod, h):
    pod = make_pod()
    v1.patch_namespaced_pod(pod.metadata.name, ns, {"metadata": {"labels": {"bump": "1"}}})
    stale = client.V1DeleteOptions(
        preconditions=client.V1Preconditions(resource_version=pod.metadata.resource_version))
    with pytest.raises(h.ApiException) as err:
        v1.delete_namespaced_pod(pod.metadata.name, ns, body=stale)
    assert err.value.status == 409


def test_delete_same_name_new_pod_is_protected_by_uid(v1, ns, make_pod, h):
    """The fence: a delete aimed at an old incarnation must not hit a re-created pod of that name."""
    old = make_pod(name="reborn")
    v1.delete_namespaced_pod("reborn", ns)
    make_pod(name="reborn")
    opts = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=old.metadata.uid))
    with pytest.raises(h.ApiException) as err:
        v1.delete_namespaced_pod("reborn", ns, body=opts)
    assert err.value.status == 409


def test_unbound_pod_deletes_immediately(v1, ns, make_pod, h):
    pod = make_pod()
    v1.delete_namespaced_pod(pod.metadata.name, ns)
    assert _gone(v1, ns, pod.metadata.name, h)
    with pytest.raises(h.ApiException) as err:
        v1.delete_namespaced_pod(pod.metadata.name, ns)
    assert err.value.status == 404


def test_graceful_deletion_of_bound_pod(v1, ns, make_pod, h):
    pod = make_pod(node=h.FAKE_NODE, grace=30)
    name = pod.metadata.name
    v1.delete_namespaced_pod(name, ns)
    terminating = v1.read_namespaced_pod(name, ns)
    assert terminating.metadata.deletion_timestamp is not None
    assert terminating.metadata.deletion_grace_period_seconds == 30
    # what a kubelet does once the containers are gone
    final = client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=pod.metadata.uid))
    v1.delete_namespaced_pod(name, ns, body=final)
    assert _gone(v1, ns, name, h)


def test_delete_options_body_wins_over_query(v1, ns, make_pod, h):
    """With a DeleteOptions body, kube-apiserver ignores ?gracePeriodSeconds=: a final delete must
    carry gracePeriodSeconds=0 in the body next to its preconditions."""
    pod = make_pod(node=h.FAKE_NODE, grace=30)
    name = pod.metadata.name
    v1.delete_namespaced_pod(name, ns)
    only_uid = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=pod.metadata.uid))
    out = v1.delete_namespaced_pod(name, ns, grace_period_seconds=0, body=only_uid)
    assert out.metadata.deletion_grace_period_seconds == 30  # still terminating: the query was ignored
    assert v1.read_namespaced_pod(name, ns).metadata.deletion_timestamp is not None
    v1.delete_namespaced_pod(name, ns, grace_period_seconds=0)  # no body: the query counts
    assert _gone(v1, ns, name, h)


def test_graceful_deletion_can_be_shortened_not_lengthened(v1, ns, make_pod, h):
    pod = make_pod(node=h.FAKE_NODE, grace=30)
    name = pod.metadata.name
    v1.delete_namespaced_pod(name, ns, grace_period_seconds=20)
    v1.delete_namespaced_pod(name, ns, grace_period_seconds=25)
    assert v1.read_namespaced_pod(name, ns).metadata.deletion_grace_period_seconds == 20
    v1.delete_namespaced_pod(name, ns, grace_period_seconds=10)
    assert v1.read_namespaced_pod(name, ns).metadata.deletion_grace_period_seconds == 10
    v1.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    assert _gone(v1, ns, name, h)


def test_finalizers_hold_the_object_until_removed(v1, ns, make_pod, h):
    pod = make_pod(finalizers=["conformance.fenced.test/hold"])
    name = pod.metadata.name
    v1.delete_namespaced_pod(name, ns)
    held = v1.read_namespaced_pod(name, ns)
    assert held.metadata.deletion_timestamp is not None
    assert held.metadata.finalizers == ["conformance.fenced.test/hold"]
    v1.patch_namespaced_pod(name, ns, [{"op": "remove", "path": "/metadata/finalizers"}])
    assert _gone(v1, ns, name, h)


def test_binding_sets_node_and_rebinding_is_409(v1, ns, make_pod, h):
    pod = make_pod()
    name = pod.metadata.name
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": h.FAKE_NODE}}
    # _preload_content=False: the generated client cannot deserialize the Status it gets back
    resp = v1.create_namespaced_pod_binding(name, ns, body, _preload_content=False)
    assert resp.status == 201
    assert v1.read_namespaced_pod(name, ns).spec.node_name == h.FAKE_NODE
    with pytest.raises(h.ApiException) as err:
        v1.create_namespaced_pod_binding(name, ns, body, _preload_content=False)
    assert err.value.status == 409


def test_log_of_unbound_pod_is_empty_204(v1, ns, make_pod, h):
    """No host assigned: kube-apiserver has no kubelet to ask and answers 204 with no body."""
    pod = make_pod()
    resp = v1.read_namespaced_pod_log(pod.metadata.name, ns, _preload_content=False)
    assert resp.status == 204 and resp.data == b""
    with pytest.raises(h.ApiException) as err:  # the container name is still checked
        h.read_log(v1, pod.metadata.name, ns, container="no-such-container")
    assert err.value.status == 400


def test_log_of_missing_pod_is_404(v1, ns, h):
    with pytest.raises(h.ApiException) as err:
        v1.read_namespaced_pod_log("no-such-pod", ns)
    assert err.value.status == 404


def test_log_injection_and_tail_lines(v1, ns, make_pod, emu, h):
    pod = make_pod(node="lab-node")
    name = pod.metadata.name
    emu.append_log(ns, name, "one\ntwo\n")
    emu.append_log(ns, name, "three\n")
    assert h.read_log(v1, name, ns) == "one\ntwo\nthree\n"
    assert h.read_log(v1, name, ns, tail_lines=2) == "two\nthree\n"
    assert h.read_log(v1, name, ns, container="base", tail_lines=1) == "three\n"


def test_log_from_file(v1, ns, make_pod, emu, tmp_path, h):
    pod = make_pod(node="lab-node")
    out = tmp_path / "out.log"
    out.write_text("a\nb\n")
    emu.set_log_file(ns, pod.metadata.name, str(out))
    assert h.read_log(v1, pod.metadata.name, ns, tail_lines=1) == "b\n"
    out.write_text("a\nb\nc\n")
    assert h.read_log(v1, pod.metadata.name, ns, tail_lines=1) == "c\n"
