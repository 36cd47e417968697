"""ResilientJobWatcher without a cluster: what a relist reports for each kind of gap, and how
errors are turned into resume / relist instead of a dead process."""

from __future__ import annotations

import queue
from types import SimpleNamespace

import pytest
from kubernetes.client import ApiClient
from kubernetes.client import models as k8s
from kubernetes.client.rest import ApiException

from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_types import ADOPTED

from fenced_k8s_executor import watching
from fenced_k8s_executor.watching import ResilientJobWatcher

NS = "ns"
FAILED = "failed"


def pod(name: str, phase: str, rv: str, *, labels: dict | None = None, deleting: bool = False) -> k8s.V1Pod:
    annotations = {"dag_id": "d", "task_id": name, "run_id": "r", "try_number": "1"}
    meta = k8s.V1ObjectMeta(name=name, namespace=NS, resource_version=rv, annotations=annotations,
                            labels={"airflow-worker": "7", **(labels or {})})
    if deleting:
        from datetime import datetime, timezone

        meta.deletion_timestamp = datetime.now(timezone.utc)
    return k8s.V1Pod(metadata=meta, status=k8s.V1PodStatus(phase=phase))


class FakeClient:
    def __init__(self, listed: list, list_rv: str, current: dict[str, k8s.V1Pod | None]):
        self.api_client = ApiClient()
        self.listed = listed
        self.list_rv = list_rv
        self.current = current
        self.list_calls = 0
        self.fail_lists = 0

    def list_namespaced_pod(self, namespace, **kwargs):
        self.list_calls += 1
        if self.fail_lists:
            self.fail_lists -= 1
            raise ApiException(status=500, reason="Internal Server Error")
        return k8s.V1PodList(items=self.listed, metadata=k8s.V1ListMeta(resource_version=self.list_rv))

    def read_namespaced_pod(self, name, namespace, **kwargs):
        found = self.current.get(name)
        if found is None:
            raise ApiException(status=404, reason="Not Found")
        return found


def make_watcher(resource_version: str = "0") -> ResilientJobWatcher:
    kube_config = SimpleNamespace(kube_client_request_args={}, worker_pod_pending_fatal_container_state_reasons=[])
    watcher = ResilientJobWatcher(namespace=NS, watcher_queue=queue.Queue(), resource_version=resource_version,
                                  scheduler_job_id="7", kube_config=kube_config)
    return watcher


def see(watcher: ResilientJobWatcher, p: k8s.V1Pod, kind: str = "MODIFIED") -> None:
    watcher.process_status(p.metadata.name, NS, p.status.phase, p.metadata.annotations, p.metadata.resource_version,
                           {"type": kind, "object": p, "raw_object": {}})


def drain(q: queue.Queue) -> dict[str, list]:
    out: dict[str, list] = {}
    while not q.empty():
        item = q.get_nowait()
        out.setdefault(item.pod_name, []).append(item.state)
    return out


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch):
    monkeypatch.setattr(watching.time, "sleep", lambda s: None)


def test_relist_reports_the_gap_like_the_events_it_hid():
    watcher = make_watcher("5")
    for p in (pod("finished", "Running", "1"), pod("deleted", "Running", "2"), pod("done-before", "Succeeded", "3"),
              pod("left", "Running", "4"), pod("same", "Running", "5")):
        see(watcher, p)
    drain(watcher.watcher_queue)  # the live-stream reports, already handled
    client = FakeClient(
        listed=[pod("finished", "Succeeded", "10"), pod("same", "Running", "5"), pod("new", "Failed", "11")],
        list_rv="12",
        current={"left": pod("left", "Running", "13", labels={"airflow-worker": "8"})},
    )
    rv = watcher._relist(client, "7", watcher.kube_config)
    assert rv == "12" and watcher._last_rv == "12"
    kinds = {e["object"].metadata.name: e["type"] for e in watcher._replay}
    assert kinds == {"finished": "MODIFIED", "new": "ADDED", "deleted": "DELETED", "left": "DELETED"}
    for event in watcher._replay:  # what _run does with each event
        obj = event["object"]
        watcher.process_status(obj.metadata.name, NS, obj.status.phase, obj.metadata.annotations,
                               obj.metadata.resource_version, event)
    reported = drain(watcher.watcher_queue)
    assert reported == {"finished": [None], "new": [FAILED], "deleted": [FAILED], "left": [ADOPTED]}
    assert set(watcher._seen) == {(NS, "finished"), (NS, "same"), (NS, "new")}


def test_pod_events_replay_first_and_skip_what_was_already_handed_over(monkeypatch):
    watcher = make_watcher("5")
    see(watcher, pod("a", "Running", "6"))
    watcher._replay = [{"type": "ADDED", "object": pod("b", "Pending", "7"), "raw_object": {}}]
    stream = [
        {"type": "MODIFIED", "object": pod("a", "Running", "6"), "raw_object": {}},  # resumed watch repeats it
        {"type": "MODIFIED", "object": pod("a", "Succeeded", "8"), "raw_object": {}},
    ]
    monkeypatch.setattr(watching.KubernetesJobWatcher, "_pod_events", lambda self, client, query_kwargs: iter(stream))
    names = [(e["object"].metadata.name, e["object"].metadata.resource_version)
             for e in watcher._pod_events(None, {})]
    assert names == [("b", "7"), ("a", "8")]
    assert watcher._last_rv == "8" and watcher._replay == []


def test_errors_resume_or_relist_instead_of_raising(monkeypatch):
    watcher = make_watcher("5")
    watcher._last_rv = "9"
    calls = []

    def stock_run(self, client, rv, job, config):
        calls.append(rv)
        if len(calls) == 1:
            raise ApiException(status=500, reason="boom")
        if len(calls) == 2:
            raise ApiException(status=410, reason="Expired")
        return None

    monkeypatch.setattr(watching.KubernetesJobWatcher, "_run", stock_run)
    client = FakeClient(listed=[], list_rv="20", current={})
    client.fail_lists = 1
    assert watcher._run(client, "5", "7", watcher.kube_config) == "9"  # 500: resume from 9
    assert watcher._run(client, "5", "7", watcher.kube_config) == "9"  # 410: relist next
    assert watcher._needs_relist
    assert watcher._run(client, "5", "7", watcher.kube_config) == "9"  # the relist itself fails: again
    assert watcher._needs_relist and client.list_calls == 1
    assert watcher._run(client, "5", "7", watcher.kube_config) == "20"
    assert calls == ["9", "9", "20"] and not watcher._needs_relist


def test_a_fresh_watcher_starts_with_a_list():
    assert make_watcher("0")._needs_relist
    assert not make_watcher("42")._needs_relist
