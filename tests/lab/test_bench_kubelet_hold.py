"""The process kubelet's hold mode, which the scale bench runs thousands of pods on: no process per
pod, pods held Pending or Running, finished on ``release()``, ended at once when deleted. Against
the emulator and a real kube-apiserver (the ``kube`` backend). The task calls a held pod makes
(``/run``, ``/state``) go to a real api-server in the bench's smoke run
(tests/lab/test_bench_scale.py)."""

from __future__ import annotations

import time

import pytest

from fenced_k8s_lab.kubelet import read_records

pytestmark = pytest.mark.integration


@pytest.fixture
def emulator(kube):
    """tests/lab/conftest.py's fixtures take `emulator`: here it is the backend under test, reset."""
    return kube


def _pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "base", "image": "lab", "command": ["/bin/sh", "-c", "exit 7"]}]}}


def _wait(fn, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (value := fn()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)
    return value


def _pods(api) -> dict:
    return {p.metadata.name: p for p in api.list_namespaced_pod("default").items}


def test_held_running_pods_run_nothing_until_released(kubelet_factory, kube_api):
    kubelet = kubelet_factory(hold="running")
    for name in ("a", "b", "c"):
        kube_api.create_namespaced_pod("default", _pod(name))
    pods = _wait(lambda: (p := _pods(kube_api)) and all(x.status.phase == "Running" for x in p.values()) and p)
    assert {p.spec.node_name for p in pods.values()} == {"lab-node"}
    assert kubelet.running_pids() == {}  # no process: the command would have exited 7
    kube_api.delete_namespaced_pod("c", "default")  # a held pod deleted: ends at once, no grace period
    _wait(lambda: "c" not in _pods(kube_api))
    assert kubelet.release() == 2
    done = _wait(lambda: (p := _pods(kube_api)) and all(x.status.phase == "Succeeded" for x in p.values()) and p)
    assert set(done) == {"a", "b"}
    assert {p.status.container_statuses[0].state.terminated.exit_code for p in done.values()} == {0}
    records = {r["name"]: r for r in read_records(kubelet.records_path).values()}
    assert records["c"]["exit_code"] == 143 and records["c"]["deleted_at"]
    assert records["a"]["ti_run"] is None  # no workload in these pods: no task to start


def test_held_pending_pods_stay_unbound_until_released(kubelet_factory, kube_api):
    kubelet = kubelet_factory(hold="pending")
    kube_api.create_namespaced_pod("default", _pod("p"))
    _wait(lambda: read_records(kubelet.records_path))  # the kubelet has seen it
    time.sleep(1)
    pod = kube_api.read_namespaced_pod("p", "default")
    assert (pod.status.phase, pod.spec.node_name) == ("Pending", None)
    assert kubelet.release() == 1
    _wait(lambda: kube_api.read_namespaced_pod("p", "default").status.phase == "Succeeded")
    assert kube_api.read_namespaced_pod("p", "default").spec.node_name == "lab-node"
