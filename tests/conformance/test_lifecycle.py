"""Pod lifecycle as a kubelet reports it, on three grounds: the emulator with the process kubelet,
the real kube-apiserver (envtest) with the process kubelet, and the real node (kubelet,
containerd, runc). The real node is right: each check here is a place where the process kubelet
once differed from it (phases, container states on image errors, graceful deletion of Pending and
Running pods, the watch events the provider's watcher sees), fixed in the model.

Pods run `localhost/fenced/busybox:1` (preloaded on the node); the process kubelet runs the same
`sh -c ...` as a local process and knows that one image only, so a missing image behaves as on
the node. Its start delay is spent as an image pull (bound, ContainerCreating), as on the node.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

BUSYBOX = "localhost/fenced/busybox:1"  # ../shared/node/up.sh imports it
MISSING = "localhost/fenced/no-such-image:1"
GROUNDS = ["emulator", "envtest", "node"]
WAIT = 60.0


@pytest.fixture(scope="module", params=GROUNDS)
def ground(request, tmp_path_factory):
    """(CoreV1Api, kubeconfig path, name); the process kubelet runs per test namespace."""
    tmp = tmp_path_factory.mktemp(f"lifecycle-{request.param}")
    if request.param == "emulator":
        from fenced_k8s_lab.kubeapi import Emulator

        emu = Emulator()
        emu.start()
        request.addfinalizer(emu.stop)
        path = emu.write_kubeconfig(str(tmp / "config"), token="conformance")
    elif request.param == "envtest":
        path = request.getfixturevalue("envtest_session").write_kubeconfig(str(tmp / "config"), token="conformance")
    else:
        path = request.getfixturevalue("real_node").kubeconfig
    api = config.new_client_from_config(config_file=str(path))
    request.addfinalizer(api.close)
    return client.CoreV1Api(api), str(path), request.param


@pytest.fixture
def lab(ground, tmp_path):
    """A fresh namespace, a watch on it, and (off the node) a process kubelet serving it."""
    v1, path, name = ground
    ns = "life-" + uuid.uuid4().hex[:8]
    v1.create_namespace({"metadata": {"name": ns}})
    kubelet = None
    if name != "node":
        from fenced_k8s_lab.kubelet import ProcessKubelet

        kubelet = ProcessKubelet(path, ns, workdir=tmp_path / "kubelet", delay_stage="pulling",
                                 images={BUSYBOX}).start()
    events = Events(v1, ns)
    yield Lab(v1, ns, events, kubelet)
    events.stop()
    if kubelet is not None:
        kubelet.stop()
    try:
        v1.delete_namespace(ns, grace_period_seconds=0)
    except ApiException:
        pass


class Events:
    def __init__(self, v1, ns):
        self.q: "queue.Queue[tuple[str, dict]]" = queue.Queue()
        self.w = watch.Watch()
        self.t = threading.Thread(target=self._run, args=(v1, ns), daemon=True)
        self.t.start()

    def _run(self, v1, ns):
        try:
            for ev in self.w.stream(v1.list_namespaced_pod, ns, timeout_seconds=int(WAIT * 3)):
                self.q.put((ev["type"], ev["raw_object"]))
        except Exception:
            pass

    def stop(self):
        self.w.stop()


class Lab:
    def __init__(self, v1, ns, events, kubelet=None):
        self.v1, self.ns, self.events, self.kubelet = v1, ns, events, kubelet
        self.seen: dict[str, list[tuple[str, dict]]] = {}

    def output(self, name) -> str:
        """What pod ``name``'s container printed so far: the process kubelet's log file (the
        envtest apiserver cannot reach a process kubelet for pods/log), or the node's pods/log."""
        if self.kubelet is None:
            try:
                return self.v1.read_namespaced_pod_log(name, self.ns)
            except ApiException:
                return ""
        for record in self.kubelet.records().values():
            if record["name"] == name and record.get("log_file"):
                try:
                    with open(record["log_file"], errors="replace") as f:
                        return f.read()
                except OSError:
                    return ""
        return ""

    def until_output(self, name, text, timeout=WAIT) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output(name):
            if time.monotonic() > deadline:
                raise AssertionError(f"{name}: {text!r} not printed in {timeout}s; saw {self.history(name)}")
            time.sleep(0.1)

    def pod(self, name, cmd, image=BUSYBOX, policy="IfNotPresent", grace=None):
        spec = {"restartPolicy": "Never", "automountServiceAccountToken": False,
                "containers": [{"name": "base", "image": image, "imagePullPolicy": policy, "command": cmd}]}
        if grace is not None:
            spec["terminationGracePeriodSeconds"] = grace
        deadline = time.monotonic() + 15
        while True:  # a fresh namespace's default service account appears a moment later
            try:
                return self.v1.create_namespaced_pod(self.ns, {"metadata": {"name": name}, "spec": spec})
            except ApiException as exc:
                if exc.status != 403 or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def until(self, name, predicate, timeout=WAIT) -> dict:
        """The first watch event of pod ``name`` (type, object) satisfying predicate(type, obj)."""
        for typ, obj in self.seen.get(name, []):
            if predicate(typ, obj):
                return obj
        deadline = time.monotonic() + timeout
        while True:
            try:
                typ, obj = self.events.q.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{name}: no matching event in {timeout}s; saw {self.history(name)}")
            self.seen.setdefault(obj["metadata"]["name"], []).append((typ, obj))
            if obj["metadata"]["name"] == name and predicate(typ, obj):
                return obj

    def history(self, name) -> list[tuple[str, str, str]]:
        return [(t, o.get("status", {}).get("phase"), _state(o)) for t, o in self.seen.get(name, [])]

    def delete(self, name, **kwargs):
        self.v1.delete_namespaced_pod(name, self.ns, **kwargs)


def _state(obj) -> str:
    """'waiting:Reason' / 'running' / 'terminated:Reason:code' of the first container, or ''."""
    statuses = obj.get("status", {}).get("containerStatuses") or []
    if not statuses:
        return ""
    state = statuses[0].get("state") or {}
    if "waiting" in state:
        return f"waiting:{state['waiting'].get('reason')}"
    if "terminated" in state:
        t = state["terminated"]
        return f"terminated:{t.get('reason')}:{t.get('exitCode')}"
    return "running" if "running" in state else ""


def _phase(obj) -> str:
    return obj.get("status", {}).get("phase")


def test_exit_codes_end_in_terminal_phases_with_the_kubelets_reasons(lab):
    lab.pod("ok", ["sh", "-c", "exit 0"])
    lab.pod("bad", ["sh", "-c", "exit 3"])
    ok = lab.until("ok", lambda t, o: _phase(o) == "Succeeded")
    bad = lab.until("bad", lambda t, o: _phase(o) == "Failed")
    assert _state(ok) == "terminated:Completed:0"
    assert _state(bad) == "terminated:Error:3"


def test_a_command_that_cannot_start_fails_with_StartError_128(lab):
    lab.pod("nocmd", ["/no/such/binary"])
    obj = lab.until("nocmd", lambda t, o: _phase(o) == "Failed")
    assert _state(obj) == "terminated:StartError:128"


def test_a_pod_pulling_its_image_is_bound_and_waits_in_ContainerCreating(lab):
    """Pending, bound to the node, its container waiting: what the provider's watcher sees while
    an image pulls (the process kubelet used to report nothing until it ran the pod)."""
    lab.pod("slow", ["sh", "-c", "sleep 1"])
    obj = lab.until("slow", lambda t, o: _state(o) == "waiting:ContainerCreating")
    assert _phase(obj) == "Pending" and obj["spec"].get("nodeName")


def test_a_missing_image_with_pull_policy_never_stays_pending_in_ErrImageNeverPull(lab):
    """Not in the provider's default worker_pod_pending_fatal_container_state_reasons: such a
    worker pod stays Pending until task_queued_timeout (the process kubelet used to run it)."""
    lab.pod("never", ["sh", "-c", "exit 0"], image=MISSING, policy="Never")
    obj = lab.until("never", lambda t, o: _state(o) == "waiting:ErrImageNeverPull")
    assert _phase(obj) == "Pending"
    time.sleep(3)
    assert lab.v1.read_namespaced_pod("never", lab.ns).status.phase == "Pending"


def test_a_missing_image_that_may_be_pulled_reports_ErrImagePull_then_ImagePullBackOff(lab):
    """ErrImagePull is fatal for the provider's watcher by default (the task fails)."""
    lab.pod("pull", ["sh", "-c", "exit 0"], image=MISSING, policy="IfNotPresent")
    lab.until("pull", lambda t, o: _state(o) == "waiting:ErrImagePull")
    obj = lab.until("pull", lambda t, o: _state(o) == "waiting:ImagePullBackOff", timeout=WAIT)
    assert _phase(obj) == "Pending"


def test_deleting_a_bound_pending_pod_reports_failed_before_it_is_gone(lab):
    """A Pending pod on a node (here: its image missing) dies as Failed, its container
    ContainerStatusUnknown 137, then DELETED: a fenced stale pod's last event before it goes
    is a Failed one (the process kubelet used to delete it without a word)."""
    lab.pod("stuck", ["sh", "-c", "exit 0"], image=MISSING, policy="Never")
    lab.until("stuck", lambda t, o: _state(o) == "waiting:ErrImageNeverPull")
    lab.delete("stuck")
    failed = lab.until("stuck", lambda t, o: _phase(o) == "Failed")
    assert failed["metadata"].get("deletionTimestamp")
    assert _state(failed) == "terminated:ContainerStatusUnknown:137"
    gone = lab.until("stuck", lambda t, o: t == "DELETED")
    assert _phase(gone) == "Failed"


def test_deleting_a_running_pod_ends_it_gracefully_then_removes_it(lab):
    """deletionTimestamp first (still Running), then a terminal phase with the container's
    exit, then DELETED; a container that exits 0 on SIGTERM ends Succeeded. Deleted once the
    shell says its trap is set: Running is reported when the process starts, and under load a
    SIGTERM that came before the trap ended the shell with 143 (Failed)."""
    lab.pod("trap", ["sh", "-c", "trap 'exit 0' TERM; echo trap set; while true; do sleep 0.2; done"], grace=10)
    lab.until("trap", lambda t, o: _phase(o) == "Running" and _state(o) == "running")
    lab.until_output("trap", "trap set")
    lab.delete("trap")
    marked = lab.until("trap", lambda t, o: bool(o["metadata"].get("deletionTimestamp")))
    assert _phase(marked) == "Running"
    done = lab.until("trap", lambda t, o: _phase(o) in ("Succeeded", "Failed"))
    assert _phase(done) == "Succeeded" and _state(done) == "terminated:Completed:0"
    lab.until("trap", lambda t, o: t == "DELETED")


def test_deleting_a_finished_pod_removes_it(lab):
    lab.pod("done", ["sh", "-c", "exit 0"])
    lab.until("done", lambda t, o: _phase(o) == "Succeeded")
    lab.delete("done")
    gone = lab.until("done", lambda t, o: t == "DELETED")
    assert _phase(gone) == "Succeeded"
