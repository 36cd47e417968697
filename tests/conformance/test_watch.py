"""Watch semantics through kubernetes.watch.Watch: initial state, resume, 410, timeouts,
bookmarks, and selector transitions."""

from __future__ import annotations

import json
import time

import pytest

from fenced_k8s_lab.kubeapi import Emulator


def test_watch_from_empty_or_zero_rv_lists_existing_as_added(v1, ns, make_pod, collectors):
    names = {make_pod(labels={"w": "init"}).metadata.name for _ in range(3)}
    for rv in ("", "0"):
        kwargs = {"resource_version": rv} if rv else {}
        watcher = collectors(v1.list_namespaced_pod, ns, label_selector="w=init", **kwargs)
        got = {watcher.next()["object"].metadata.name for _ in range(3)}
        assert got == names
        assert all(e["type"] == "ADDED" for e in watcher.seen)


def test_watch_resumes_from_resource_version(v1, ns, make_pod, collectors):
    make_pod(name="before")
    rv = v1.list_namespaced_pod(ns).metadata.resource_version
    make_pod(name="after")
    v1.patch_namespaced_pod("after", ns, {"metadata": {"labels": {"changed": "1"}}})
    v1.delete_namespaced_pod("before", ns)
    watcher = collectors(v1.list_namespaced_pod, ns, resource_version=rv)
    seen = [(e["type"], e["object"].metadata.name) for e in (watcher.next() for _ in range(4))]
    # even an immediate delete (unbound pod) is an update setting deletionTimestamp, then the delete
    assert seen == [("ADDED", "after"), ("MODIFIED", "after"), ("MODIFIED", "before"), ("DELETED", "before")]


def test_watch_sees_live_events_in_order(v1, ns, make_pod, collectors):
    rv = v1.list_namespaced_pod(ns).metadata.resource_version
    watcher = collectors(v1.list_namespaced_pod, ns, resource_version=rv)
    pod = make_pod(name="live")
    v1.patch_namespaced_pod_status("live", ns, {"status": {"phase": "Running"}})
    v1.delete_namespaced_pod("live", ns)
    added, modified, deleting, deleted = watcher.next(), watcher.next(), watcher.next(), watcher.next()
    assert [e["type"] for e in (added, modified, deleting, deleted)] == ["ADDED", "MODIFIED", "MODIFIED", "DELETED"]
    assert modified["object"].status.phase == "Running"
    assert deleting["object"].metadata.deletion_timestamp is not None
    assert deleting["object"].metadata.deletion_grace_period_seconds == 0
    assert deleted["object"].metadata.uid == pod.metadata.uid


def test_graceful_deletion_events_of_a_bound_pod(v1, ns, make_pod, collectors, h):
    """What the executor's watcher sees when a bound pod is deleted and its kubelet finishes it."""
    from kubernetes import client

    pod = make_pod(node=h.FAKE_NODE, grace=30)
    name = pod.metadata.name
    watcher = collectors(v1.list_namespaced_pod, ns, resource_version=pod.metadata.resource_version)
    v1.delete_namespaced_pod(name, ns)
    v1.delete_namespaced_pod(name, ns, body=client.V1DeleteOptions(
        grace_period_seconds=0, preconditions=client.V1Preconditions(uid=pod.metadata.uid)))
    events = [watcher.next() for _ in range(3)]
    assert [e["type"] for e in events] == ["MODIFIED", "MODIFIED", "DELETED"]
    assert [e["object"].metadata.deletion_grace_period_seconds for e in events] == [30, 0, 0]


def test_watch_timeout_seconds_ends_the_stream(v1, ns):
    from kubernetes import watch

    started = time.monotonic()
    events = list(watch.Watch().stream(v1.list_namespaced_pod, ns, timeout_seconds=1,
                                       resource_version=v1.list_namespaced_pod(ns).metadata.resource_version))
    assert events == []
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("flag", ["1", "true", "True", "t"])
def test_watch_flag_is_go_parse_bool(api_client, ns, h, flag):
    resp = h.raw(api_client, "GET", f"/api/v1/namespaces/{ns}/pods",
                 query={"watch": flag, "timeoutSeconds": "1", "resourceVersion": "0"})
    assert resp.status == 200
    resp.read()


def test_label_selector_transition_delivers_deleted_then_added(v1, ns, make_pod, collectors):
    pod = make_pod(labels={"team": "a"})
    name = pod.metadata.name
    watcher = collectors(v1.list_namespaced_pod, ns, label_selector="team=a",
                         resource_version=pod.metadata.resource_version)
    v1.patch_namespaced_pod(name, ns, {"metadata": {"labels": {"team": "b"}}})
    left = watcher.next()
    # the watcher gets the last state it was allowed to see (still team=a) at the new resourceVersion
    assert left["type"] == "DELETED" and left["object"].metadata.labels == {"team": "a"}
    assert left["object"].metadata.resource_version == v1.read_namespaced_pod(name, ns).metadata.resource_version
    v1.patch_namespaced_pod(name, ns, {"metadata": {"labels": {"team": "a"}}})
    assert watcher.next()["type"] == "ADDED"


def test_field_selector_transition(v1, ns, make_pod, collectors):
    pod = make_pod()
    watcher = collectors(v1.list_namespaced_pod, ns, field_selector="status.phase!=Succeeded",
                         resource_version=pod.metadata.resource_version)
    v1.patch_namespaced_pod_status(pod.metadata.name, ns, {"status": {"phase": "Running"}})
    assert watcher.next()["type"] == "MODIFIED"
    v1.patch_namespaced_pod_status(pod.metadata.name, ns, {"status": {"phase": "Succeeded"}})
    assert watcher.next()["type"] == "DELETED"


def test_metadata_only_watch(api_client, ns, make_pod, h):
    pod = make_pod()
    resp = h.raw(api_client, "GET", f"/api/v1/namespaces/{ns}/pods",
                 query={"watch": "true", "timeoutSeconds": "1", "resourceVersion": "0"},
                 headers={"Accept": h.PARTIAL})
    events = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
    added = [e for e in events if e["type"] == "ADDED"]
    assert [e["object"]["metadata"]["name"] for e in added] == [pod.metadata.name]
    assert added[0]["object"]["kind"] == "PartialObjectMetadata" and "spec" not in added[0]["object"]


# ------------------------------------------------------------ emulator-only controls


def test_compacted_rv_gives_410_error_event(v1, ns, make_pod, emu, api_client, h):
    old = make_pod().metadata.resource_version
    make_pod()
    emu.compact()
    resp = h.raw(api_client, "GET", f"/api/v1/namespaces/{ns}/pods",
                 query={"watch": "1", "resourceVersion": old, "timeoutSeconds": "5"})
    lines = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0]["type"] == "ERROR"
    assert lines[0]["object"]["code"] == 410 and lines[0]["object"]["reason"] == "Expired"


def test_compacted_rv_raises_410_through_watch_stream(v1, ns, make_pod, emu, h):
    from kubernetes import watch

    old = make_pod().metadata.resource_version
    make_pod()
    emu.compact()
    with pytest.raises(h.ApiException) as err:
        for _ in watch.Watch().stream(v1.list_namespaced_pod, ns, resource_version=old, timeout_seconds=5):
            pass
    assert err.value.status == 410
    # relist + watch from the fresh rv works again
    fresh = v1.list_namespaced_pod(ns).metadata.resource_version
    assert list(watch.Watch().stream(v1.list_namespaced_pod, ns, resource_version=fresh, timeout_seconds=1)) == []


def test_bookmark_on_demand(v1, ns, make_pod, emu, collectors):
    pod = make_pod()
    watcher = collectors(v1.list_namespaced_pod, ns, resource_version=pod.metadata.resource_version,
                         allow_watch_bookmarks=True)
    _wait_for_watchers(emu, 1)
    emu.bookmark()
    event = watcher.next()
    assert event["type"] == "BOOKMARK"
    assert event["raw_object"]["metadata"]["resourceVersion"]


def test_periodic_bookmarks_and_resume_from_bookmark(emu, h):
    from kubernetes import client, config, watch

    with Emulator(bookmark_interval=0.3) as emu, __import__("tempfile").TemporaryDirectory() as tmp:  # own instance
        v1 = client.CoreV1Api(config.new_client_from_config(emu.write_kubeconfig(tmp + "/kc")))
        v1.create_namespaced_pod("default", h.pod_body(name="p"))
        w = watch.Watch()
        kinds = []
        for event in w.stream(v1.list_namespaced_pod, "default", resource_version="0",
                              allow_watch_bookmarks=True, timeout_seconds=10):
            kinds.append(event["type"])
            if event["type"] == "BOOKMARK":
                w.stop()
        assert kinds[0] == "ADDED" and kinds[-1] == "BOOKMARK"
        assert w.resource_version  # the client remembers the bookmark's rv for its next resume


def test_close_watches_ends_streams(v1, ns, emu, collectors):
    rv = v1.list_namespaced_pod(ns).metadata.resource_version
    watcher = collectors(v1.list_namespaced_pod, ns, resource_version=rv, timeout_seconds=60,
                         _request_timeout=60)
    _wait_for_watchers(emu, 1)
    before = emu.summary()["watchers"]
    emu.close_watches()
    assert emu.summary()["watchers"] < before or before == 0
    # Watch.stream without timeout retries; with timeout_seconds it stops once the server ends the stream
    assert watcher.done.wait(15)


def _wait_for_watchers(emu, n: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while emu.summary()["watchers"] < n:
        assert time.monotonic() < deadline, "watch never registered"
        time.sleep(0.02)
