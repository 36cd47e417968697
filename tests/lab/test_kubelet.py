"""The process kubelet with trivial `python -c` pods (a few seconds), against the emulator and a
real kube-apiserver (the `kube_backend` fixture; the real one has no kubelet of its own, so pods
are bound through pods/binding, reported through pods/status and finished by the process kubelet's
grace-0 delete with a uid precondition). Fault and compaction tests run on the emulator only."""

from __future__ import annotations

import time

import pytest

from fenced_k8s_lab.kubelet import START_DELAY_ANNOTATION, LongTailDelay, read_records

pytestmark = pytest.mark.integration


@pytest.fixture
def emulator(kube):
    """tests/lab/conftest.py's fixtures take `emulator`: here it is the backend under test, reset."""
    return kube


def _pod_log(api, backend, kubelet, name) -> str:
    """pods/log on the emulator (it serves the kubelet's output file); the file itself on a real
    apiserver, which would proxy pods/log to a kubelet on a Node object that does not exist."""
    if backend.name == "emulator":
        log = api.read_namespaced_pod_log(name, "default")
        return log.decode() if isinstance(log, bytes) else log
    rec = next(r for r in read_records(kubelet.records_path).values() if r["name"] == name and r["log_file"])
    return open(rec["log_file"]).read()


def _pod(name, code, grace=30, annotations=None):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "lab"}, "annotations": annotations or {}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": grace, "containers": [{
                "name": "base", "image": "lab", "command": ["python", "-c"], "args": [code],
                "env": [{"name": "GREETING", "value": "hi"},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}}]}]}}


def _wait(fn, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _phase(api, name):
    from kubernetes.client.exceptions import ApiException

    try:
        return api.read_namespaced_pod(name, "default").status.phase
    except ApiException as e:
        return e.status


def test_pod_lifecycle_status_env_and_logs(kubelet, kube_api, emulator):
    code = "import os; print(os.environ['GREETING'], os.environ['POD_NAME'], os.environ['APP'], os.environ['HOSTNAME'])"
    kube_api.create_namespaced_pod("default", _pod("ok", code))
    kube_api.create_namespaced_pod("default", _pod("bad", "import sys; sys.exit(3)"))
    _wait(lambda: _phase(kube_api, "ok") == "Succeeded" and _phase(kube_api, "bad") == "Failed")

    ok = kube_api.read_namespaced_pod("ok", "default")
    assert ok.spec.node_name == "lab-node" and ok.status.pod_ip == "127.0.0.1"
    term = ok.status.container_statuses[0].state.terminated
    assert (term.exit_code, term.reason) == (0, "Completed")
    bad = kube_api.read_namespaced_pod("bad", "default").status.container_statuses[0].state.terminated
    assert (bad.exit_code, bad.reason) == (3, "Error")
    _wait(lambda: "hi ok lab ok" in _pod_log(kube_api, emulator, kubelet, "ok"))
    calls = {(a["verb"], a["name"], a["subresource"], a["code"]) for a in emulator.audit()
             if a["who"] == "kubelet-lab-node"}
    assert {("create", "ok", "binding", 201), ("patch", "ok", "status", 200)} <= calls

    recs = {r["name"]: r for r in read_records(kubelet.records_path).values()}
    assert recs["ok"]["exit_code"] == 0 and recs["ok"]["labels"] == {"app": "lab"}
    assert recs["bad"]["reason"] == "Error" and recs["bad"]["started_at"] >= recs["bad"]["bound_at"]


def test_deletion_sigterm_then_sigkill_after_grace(kubelet, kube_api, emulator):
    polite = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\ntime.sleep(60)"
    stubborn = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)"
    kube_api.create_namespaced_pod("default", _pod("polite", polite, grace=10))
    kube_api.create_namespaced_pod("default", _pod("stubborn", stubborn, grace=2))
    _wait(lambda: _phase(kube_api, "polite") == "Running" and _phase(kube_api, "stubborn") == "Running")
    time.sleep(0.5)  # let the children install their SIGTERM handlers
    for name in ("polite", "stubborn"):
        kube_api.delete_namespaced_pod(name, "default")
    _wait(lambda: _phase(kube_api, "polite") == 404 and _phase(kube_api, "stubborn") == 404)

    recs = {r["name"]: r for r in read_records(kubelet.records_path).values()}
    assert recs["polite"]["exit_code"] == 0
    assert recs["stubborn"]["exit_code"] == 137  # SIGKILL after the 2 s grace period
    assert recs["stubborn"]["finished_at"] - recs["stubborn"]["deletion_seen_at"] >= 1.9
    finals = [a for a in emulator.audit() if a["who"] == "kubelet-lab-node" and a["verb"] == "delete"]
    assert {a["name"] for a in finals} == {"polite", "stubborn"}


def test_deleted_before_start_is_never_started(kubelet, kube_api):
    kube_api.create_namespaced_pod("default", _pod("late", "print(1)", annotations={START_DELAY_ANNOTATION: "30"}))
    _wait(lambda: any(r["name"] == "late" for r in kubelet.records().values()))
    kube_api.delete_namespaced_pod("late", "default")
    _wait(lambda: _phase(kube_api, "late") == 404)
    rec = _wait(lambda: next((r for r in read_records(kubelet.records_path).values()
                              if r["name"] == "late" and r["deleted_at"]), None))
    assert rec["deleted_before_start"] and rec["started_at"] is None and rec["pid"] is None


def test_capacity_keeps_excess_pods_pending(kubelet_factory, kube_api):
    k = kubelet_factory(max_running=1)
    kube_api.create_namespaced_pod("default", _pod("first", "import time; time.sleep(2)"))
    kube_api.create_namespaced_pod("default", _pod("second", "print(2)"))
    _wait(lambda: _phase(kube_api, "first") == "Running" or _phase(kube_api, "second") == "Running")
    running = [n for n in ("first", "second") if _phase(kube_api, n) == "Running"]
    pending = [n for n in ("first", "second") if _phase(kube_api, n) == "Pending"]
    assert len(running) == 1 and len(pending) == 1
    assert kube_api.read_namespaced_pod(pending[0], "default").spec.node_name is None
    _wait(lambda: _phase(kube_api, "first") == "Succeeded" and _phase(kube_api, "second") == "Succeeded")


def test_survives_watch_expiry_and_emulator_reset(needs_faults, kubelet_factory, kube_api, emulator):
    kubelet = kubelet_factory(watch_timeout=2)
    emulator.compact()
    emulator.close_watches()
    kube_api.create_namespaced_pod("default", _pod("after-410", "print(1)"))
    _wait(lambda: _phase(kube_api, "after-410") == "Succeeded")
    kube_api.create_namespaced_pod("default", _pod("long", "import time; time.sleep(60)"))
    _wait(lambda: _phase(kube_api, "long") == "Running")
    emulator.reset()  # the pod vanishes: its process must be stopped
    _wait(lambda: not kubelet.running_pids(), timeout=40)
    kube_api.create_namespaced_pod("default", _pod("after-reset", "print(1)"))
    _wait(lambda: _phase(kube_api, "after-reset") == "Succeeded", timeout=30)


def test_long_tail_delay_is_seeded_and_capped():
    parsed = LongTailDelay.parse("pareto:scale=1,alpha=1.2,cap=20", seed=3)
    built = LongTailDelay("pareto", 1, alpha=1.2, cap=20, seed=3)
    s1, s2 = [parsed({}) for _ in range(200)], [built({}) for _ in range(200)]
    assert s1 == s2 and max(s1) <= 20 and min(s1) >= 1
    logn = [LongTailDelay("lognormal", scale=2, sigma=1.5, cap=30, seed=7)({}) for _ in range(3)]
    assert len(set(logn)) == 1 and 0 < logn[0] <= 30  # same seed, same first draw


def test_retries_api_errors(needs_faults, kubelet, kube_api, emulator):
    emulator.add_fault(method="PATCH", path=r"/status$", status=500, times=2)
    emulator.add_fault(method="POST", path=r"/binding$", status=503, times=1)
    kube_api.create_namespaced_pod("default", _pod("flaky", "print(1)"))
    _wait(lambda: _phase(kube_api, "flaky") == "Succeeded")
    codes = [a["code"] for a in emulator.audit() if a["who"] == "kubelet-lab-node" and a["verb"] != "watch"
             and a["verb"] != "list"]
    assert codes.count(500) == 2 and codes.count(503) == 1
