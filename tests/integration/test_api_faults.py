"""API faults (issue 14, items 4 and 5), stock vs fenced on the same steps.

Item 4: the watcher process survives 410 Gone (history compacted while it was away) and any
other watch error, relists, resumes, and every terminal pod event reaches ``_change_state``
exactly once -- pods deleted during the gap included. The stock watcher dies on every 410 and
is restarted from "0" by the health check: deletions in the gap are lost.

Item 5: faults on every verb the executor uses (create, get, list, patch, delete, watch) never
leave the scheduler's heartbeat (``executor.heartbeat()``), never hang it, and the work is done
on a later loop once the API answers again. Where the stock executor crashes (or spins), the
stock branch asserts it, so a scenario that stops reproducing fails.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest

from airflow.providers.cncf.kubernetes.executors.kubernetes_executor import KubernetesExecutor

from fenced_k8s_executor.pods import is_api_error

KINDS = ["stock", "fenced"]
FAILED = "failed"
#: kube_client_request_args in the world fixture read-time out after 3 s
FAULTS = {
    "500": {"status": 500},
    "429": {"status": 429},
    "timeout": {"delay": 4.0},
    "drop": {"drop": True},
}


# ---------------------------------------------------------------------------- helpers


class Deliveries:
    """State changes the provider's ``_change_state`` completed, by pod name: ``calls`` every
    completed call (what the fences let through; calls that raised are not deliveries),
    ``applied`` those that took their key out of ``running`` (the event the scheduler gets)."""

    def __init__(self) -> None:
        self.calls: dict[str, list] = defaultdict(list)
        self.applied: dict[str, list] = defaultdict(list)

    def __getitem__(self, pod: str) -> list:
        return self.calls[pod]


@pytest.fixture
def delivered(monkeypatch):
    seen = Deliveries()
    original = KubernetesExecutor._change_state

    def recording(self, results, **kwargs):
        held = results.key in self.running
        original(self, results, **kwargs)
        seen.calls[results.pod_name].append(results.state)
        if held and results.key not in self.running:
            seen.applied[results.pod_name].append(results.state)

    monkeypatch.setattr(KubernetesExecutor, "_change_state", recording)
    return seen


@pytest.fixture
def api_errors(count_metric):
    """The ``api_error`` metrics counted in this process, as (call, status)."""
    return count_metric("api_error", "call", "status")


def writable(world, fault: str) -> None:
    """Skip a write fault the backend cannot make: the real apiserver's admission webhook denies
    or delays a write, it cannot drop the client's connection (the emulator's alone)."""
    if FAULTS[fault].get("drop") and not world.backend.supports_faults:
        pytest.skip("a dropped connection needs the emulator; the real apiserver's webhook can only deny or delay")


def terminal(states: list) -> list:
    return [s for s in states if s in (None, FAILED)]


def watcher_of(world, executor):
    return executor.kube_scheduler.kube_watchers[world.namespace]


def heartbeat_within(executor, seconds: float) -> tuple[bool, BaseException | None]:
    """Run one scheduler heartbeat in a thread: (returned in time, what it raised)."""
    outcome: dict = {}

    def beat():
        try:
            executor.heartbeat()
        except BaseException as error:  # noqa: BLE001 - reported to the test
            outcome["error"] = error

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), outcome.get("error"), thread


def launch(world, sched, count: int) -> dict[str, str]:
    """Queue the run's tasks and create their pods: task id -> pod name."""
    world.queue(sched)
    assert world.sync_until(sched.executor, lambda: len(world.live_pods()) >= count, timeout=20)
    return {p.metadata.annotations["task_id"]: p.metadata.name for p in world.live_pods()}


def running(world, sched, names: dict[str, str]) -> None:
    for name in names.values():
        world.set_pod_phase(name, "Running")
    world.settle(sched.executor, 1.5)  # the watcher has seen every pod Running


def watch_gap(world, sched, seconds: float = 2.0) -> None:
    """End the watcher's stream and hold its reconnect for ``seconds``: changes made now are
    not delivered on the old stream; compacting after them makes the reconnect a 410."""
    world.emulator.add_fault(method="GET", path=r"/pods$", delay=seconds, times=1, who=sched.user)
    world.emulator.close_watches()


def audit_count(world, sched, verb: str) -> int:
    """Pod calls of ``verb`` (the witness's Lease calls are not the provider's or the fences' pod calls)."""
    return sum(1 for e in world.audit() if e.get("who") == sched.user and e.get("verb") == verb
               and e.get("resource", "pods") == "pods")


# ---------------------------------------------------------------------------- item 4: watch


@pytest.mark.tasks("a", "b", "c", "d")
@pytest.mark.parametrize("kind", KINDS)
def test_watcher_survives_410_and_loses_no_event(world, needs_emulator, delivered, kind):
    """While the watcher reconnects, pod a succeeds, b is deleted, c fails, d keeps running, and
    the history is compacted: the reconnect gets 410 Gone."""
    sched = world.scheduler(kind)
    names = launch(world, sched, 4)
    running(world, sched, names)
    pid = watcher_of(world, sched.executor).pid

    watch_gap(world, sched)
    world.set_pod_phase(names["a"], "Succeeded")
    world.kube.delete_namespaced_pod(names["b"], world.namespace, grace_period_seconds=0)
    world.set_pod_phase(names["c"], "Failed")
    world.emulator.compact()
    world.settle(sched.executor, 5.0)

    watcher = watcher_of(world, sched.executor)
    outcome = {task: terminal(delivered[name]) for task, name in names.items()}
    if kind == "stock":
        assert watcher.pid != pid, "stock watcher no longer dies on 410"
        assert outcome["b"] == [], "stock watcher no longer loses the DELETED event of the gap"
        return
    assert watcher.pid == pid and watcher.is_alive()
    assert outcome == {"a": [None], "b": [FAILED], "c": [FAILED], "d": []}


@pytest.mark.tasks("p0", "p1", "p2", "p3", "p4", "p5")
@pytest.mark.parametrize("kind", KINDS)
def test_watcher_survives_repeated_compaction(world, needs_emulator, delivered, kind):
    """Six compactions, one finished pod in each gap (the issue's run compacted every 7 s)."""
    sched = world.scheduler(kind)
    names = launch(world, sched, 6)
    running(world, sched, names)
    pids = {watcher_of(world, sched.executor).pid}
    lists_before = audit_count(world, sched, "list")
    for task in sorted(names):
        watch_gap(world, sched, 1.0)
        world.set_pod_phase(names[task], "Succeeded")
        world.emulator.compact()
        world.settle(sched.executor, 2.5)
        pids.add(watcher_of(world, sched.executor).pid)

    restarts = len(pids) - 1
    relists = audit_count(world, sched, "list") - lists_before
    print(f"{kind}: watcher restarts={restarts} relists={relists}")
    outcome = {task: terminal(delivered[name]) for task, name in names.items()}
    if kind == "stock":
        assert restarts >= 3, "stock watcher no longer dies on 410"
        return
    assert restarts == 0 and watcher_of(world, sched.executor).is_alive()
    assert outcome == {task: [None] for task in names}


@pytest.mark.tasks("a", "b")
@pytest.mark.parametrize("kind", KINDS)
def test_watch_errors_do_not_kill_the_watcher(world, needs_emulator, delivered, api_errors, kind):
    """Three 500s answer the watcher's reconnects; meanwhile a pod fails and one is deleted."""
    sched = world.scheduler(kind)
    names = launch(world, sched, 2)
    running(world, sched, names)
    pid = watcher_of(world, sched.executor).pid

    world.emulator.add_fault(method="GET", path=r"/pods$", status=500, times=3, who=sched.user)
    world.emulator.close_watches()
    world.set_pod_phase(names["a"], "Failed")
    world.kube.delete_namespaced_pod(names["b"], world.namespace, grace_period_seconds=0)
    world.settle(sched.executor, 6.0)

    watcher = watcher_of(world, sched.executor)
    outcome = {task: terminal(delivered[name]) for task, name in names.items()}
    if kind == "stock":
        assert watcher.pid != pid, "stock watcher no longer dies on a watch 500"
        assert outcome["b"] == [], "stock watcher no longer loses the DELETED event of the gap"
        return
    assert watcher.pid == pid and watcher.is_alive()
    assert outcome == {"a": [FAILED], "b": [FAILED]}


# ---------------------------------------------------------------------------- item 5: list


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("kind", KINDS)
def test_list_faults_never_raise_from_heartbeat(world, needs_emulator, api_errors, kind, fault):
    """Pod LISTs fail while completed-pod adoption is due every loop (the issue's crash); a
    dead scheduler's Succeeded pod is adopted once the API answers again."""
    world.monkeypatch.setenv("AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL", "0")
    sched = world.scheduler(kind)
    dead = world.scheduler("stock", start=False)
    row = world.row("t1")
    orphan = world.stale_pod(row, "0" * 32, sched=dead, phase="Succeeded", name="t1-orphan")

    world.emulator.add_fault(method="GET", path=r"/pods$", who=sched.user, **FAULTS[fault])
    if kind == "stock":
        with pytest.raises(Exception) as raised:
            for _ in range(3):
                sched.executor.heartbeat()
        assert is_api_error(raised.value), raised.value
        return
    for _ in range(3):
        sched.executor.heartbeat()  # never raises
    assert ("adopt_completed_pods", FAULTS[fault].get("status") and str(FAULTS[fault]["status"])) in api_errors \
        or any(call == "adopt_completed_pods" for call, _ in api_errors)
    assert world.kube.read_namespaced_pod(orphan, world.namespace).metadata.labels["airflow-worker"] == str(dead.job_id)

    world.emulator.clear_faults()
    assert world.sync_until(sched.executor, lambda: world.kube.read_namespaced_pod(
        orphan, world.namespace).metadata.labels["airflow-worker"] == str(sched.job_id), timeout=10)


# ---------------------------------------------------------------------------- item 5: get


@pytest.mark.parametrize("kind", KINDS)
def test_get_faults_defer_the_event(world, needs_emulator, delivered, api_errors, kind):
    """A pod this scheduler does not know yet (made before a restart) fails while pod GETs fail:
    the heartbeat returns, and the event is applied once, after the API answers."""
    sched = world.scheduler(kind)
    world.queue(sched, trigger=False)
    row = world.row("t1")
    pod = world.stale_pod(row, row.token or "0" * 32, sched=sched, phase="Running")
    world.settle(sched.executor, 1.0)
    world.emulator.add_fault(method="GET", path=r"/pods/[^/]+$", status=500, who=sched.user)
    world.set_pod_phase(pod, "Failed")
    time.sleep(1.0)  # the watcher has it

    returned, error, thread = heartbeat_within(sched.executor, 10)
    assert returned and error is None, error
    world.emulator.clear_faults()
    thread.join(30)
    world.settle(sched.executor, 2.0)
    assert terminal(delivered[pod]) == [FAILED]
    if kind == "fenced":
        assert any(call == "change_state" for call, _ in api_errors)


# ---------------------------------------------------------------------------- item 5: patch, delete


@pytest.mark.parametrize("verb,fault", [("PATCH", "drop"), ("PATCH", "500"), ("DELETE", "500"), ("DELETE", "drop")])
@pytest.mark.parametrize("kind", KINDS)
def test_patch_and_delete_faults_never_hang_the_heartbeat(world, needs_write_faults, delivered, kind, verb, fault):
    """The finished pod's clean-up (PATCH executor-done, or DELETE with delete_worker_pods)
    fails: the heartbeat returns, and the clean-up and the event happen on a later loop."""
    writable(world, fault)
    if verb == "DELETE":
        world.monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__DELETE_WORKER_PODS", "True")
    sched = world.scheduler(kind)
    names = launch(world, sched, 1)
    pod = names["t1"]
    world.set_pod_phase(pod, "Running")
    world.settle(sched.executor, 1.0)
    world.emulator.add_fault(method=verb, path=r"/pods/[^/]+$", who=sched.user, **FAULTS[fault])
    world.set_pod_phase(pod, "Succeeded")
    time.sleep(1.0)  # the watcher has it

    returned, error, thread = heartbeat_within(sched.executor, 15)
    fired = sum(f["fired"] for f in world.backend.faults())
    world.emulator.clear_faults()
    thread.join(60)
    assert fired, f"the {verb} fault never met the clean-up"
    spins = verb == "DELETE" or fault == "drop"  # the provider re-queues on the queue it drains
    if kind == "stock" and spins:
        assert not returned or error is not None, "stock heartbeat no longer spins on a failing clean-up"
        return
    assert returned and error is None, error
    world.settle(sched.executor, 2.0)
    assert delivered.applied[pod] == [None]
    if verb == "DELETE":
        assert world.live_pods() == []
    else:
        done = world.kube.read_namespaced_pod(pod, world.namespace).metadata.labels.get("airflow_executor_done")
        # The provider swallows a PATCH error status and never retries the label (a connection
        # error is raised, so the deferred state change retries it).
        assert done == (None if fault == "500" else "True")


# ---------------------------------------------------------------------------- item 5: create


@pytest.mark.tasks("a", "b")
@pytest.mark.parametrize("fault", ["500", "429", "drop"])
@pytest.mark.parametrize("kind", KINDS)
def test_create_faults_retry_next_loop(world, needs_write_faults, kind, fault):
    """Pod creates fail for a while: the heartbeat returns, nothing is failed, and each task
    gets exactly one pod once the API answers."""
    writable(world, fault)
    sched = world.scheduler(kind)
    fault_id = world.emulator.add_fault(method="POST", path=r"/pods$", who=sched.user, **FAULTS[fault])
    world.queue(sched, trigger=False)
    for _ in range(3):
        sched.executor.heartbeat()
    assert world.pods() == []
    world.emulator.clear_faults(fault_id)
    assert world.sync_until(sched.executor, lambda: len(world.pods()) == 2, timeout=20)
    world.settle(sched.executor, 1.0)
    assert sorted(p.metadata.annotations["task_id"] for p in world.pods()) == ["a", "b"]
    assert all(state != FAILED for state, _ in sched.executor.event_buffer.values())


@pytest.mark.parametrize("fault", ["500", "drop"])
@pytest.mark.parametrize("kind", KINDS)
def test_create_faults_do_not_fail_the_task_with_default_publish_retries(world, needs_write_faults, api_errors,
                                                                         kind, fault):
    """With the provider's default ``task_publish_max_retries = 0`` one 500 (or dropped
    connection) on create fails the task and burns a try; the fenced executor re-queues it."""
    writable(world, fault)
    world.monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__TASK_PUBLISH_MAX_RETRIES", "0")
    sched = world.scheduler(kind)
    fault_id = world.emulator.add_fault(method="POST", path=r"/pods$", times=1, who=sched.user, **FAULTS[fault])
    world.queue(sched)
    row = world.row("t1")
    sched.executor.heartbeat()
    failed = [key for key, (state, _) in sched.executor.event_buffer.items() if state == FAILED]
    if kind == "stock":
        assert failed == [row.key], "stock executor no longer fails the task on one create error"
        return
    assert failed == [] and any(call == "create" for call, _ in api_errors)
    world.emulator.clear_faults(fault_id)
    assert world.sync_until(sched.executor, lambda: len(world.pods()) == 1, timeout=10)
    assert not any(state == FAILED for state, _ in sched.executor.event_buffer.values())


# ---------------------------------------------------------------------------- item 5: revoke, adoption


@pytest.mark.parametrize("kind", KINDS)
def test_revoke_survives_list_faults(world, needs_emulator, api_errors, kind):
    """Stuck in queued revokes the TI while pod LISTs fail: the scheduler's handler returns and
    the TI goes back to SCHEDULED (same id and try); no pod is deleted for the error."""
    sched = world.scheduler(kind)
    names = launch(world, sched, 1)
    world.emulator.add_fault(method="GET", path=r"/pods$", status=500, who=sched.user)
    if kind == "stock":
        with pytest.raises(Exception) as raised:
            sched.stuck_in_queued()
        assert is_api_error(raised.value), raised.value
        return
    sched.stuck_in_queued()
    assert world.row("t1").state == "scheduled"
    assert names["t1"] in {p.metadata.name for p in world.live_pods()}
    assert world.deletes_by(sched) == []
    assert any(call.startswith("revoke") for call, _ in api_errors)


@pytest.mark.parametrize("kind", KINDS)
def test_adoption_survives_list_faults(world, needs_emulator, api_errors, kind):
    """A peer adopts a dead scheduler's running TI while pod LISTs fail: the orphan check
    returns without resetting the TI, and the pod is relabelled once the API answers."""
    dead = world.scheduler("fenced")
    names = launch(world, dead, 1)
    world.set_pod_phase(names["t1"], "Running")
    world.airflow.start(world.row("t1"))
    peer = world.scheduler(kind)
    world.kill(dead)
    world.emulator.add_fault(method="GET", path=r"/pods$", status=500, who=peer.user)
    before = world.row("t1")
    if kind == "stock":
        with pytest.raises(Exception) as raised:
            peer.adopt_or_reset_orphans()
        assert is_api_error(raised.value), raised.value
        return
    peer.adopt_or_reset_orphans()
    after = world.row("t1")
    assert (after.id, after.try_number, after.state, after.queued_by_job_id) == (
        before.id, before.try_number, "running", peer.job_id)
    world.emulator.clear_faults()
    assert world.sync_until(peer.executor, lambda: world.kube.read_namespaced_pod(
        names["t1"], world.namespace).metadata.labels["airflow-worker"] == str(peer.job_id), timeout=10)
    assert before.key in peer.executor.running


# ---------------------------------------------------------------------------- item 5: the heartbeat


@pytest.mark.tasks("a", "b", "c", "d")
@pytest.mark.parametrize("kind", KINDS)
def test_heartbeat_never_raises_under_api_error_bursts(world, needs_emulator, delivered, api_errors, kind):
    """Bursts of 500s on every verb while tasks run and finish, completed-pod adoption due every
    loop: the heartbeat never raises, and every pod's terminal event is applied exactly once."""
    world.monkeypatch.setenv("AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL", "0")
    sched = world.scheduler(kind)
    names = launch(world, sched, 4)
    running(world, sched, names)
    raised: list = []
    phases = iter([("a", "Succeeded"), ("b", "Failed"), ("c", "Succeeded"), ("d", "Succeeded")])
    started = time.monotonic()
    deadline = started + 12
    loop = 0
    while time.monotonic() < deadline:
        if loop % 4 == 0:
            for verb in ("GET", "POST", "PATCH", "DELETE"):
                world.emulator.add_fault(method=verb, path=r"/pods", status=500, times=3, who=sched.user)
            step = next(phases, None)
            if step:
                world.set_pod_phase(names[step[0]], step[1])
        try:
            sched.executor.heartbeat()
        except Exception as error:  # noqa: BLE001
            raised.append(error)
            print(f"{kind}: heartbeat raised after {time.monotonic() - started:.1f}s, loop {loop}: {error!r:.80}")
            if kind == "stock":
                break
        loop += 1
        time.sleep(0.25)
    print(f"{kind}: {loop} heartbeats, {len(raised)} raised, api_error counted {len(api_errors)}: "
          f"{sorted(set(api_errors))}")
    if kind == "stock":
        assert raised, "stock heartbeat no longer raises under 500 bursts"
        return
    assert raised == []
    world.emulator.clear_faults()
    world.settle(sched.executor, 3.0)
    outcome = {task: terminal(delivered[name]) for task, name in names.items()}
    assert outcome == {"a": [None], "b": [FAILED], "c": [None], "d": [None]}


# ---------------------------------------------------------------------------- item 5: the sweep thread


def test_a_fence_call_that_never_answers_does_not_hold_the_scheduler_loop(world, needs_emulator, monkeypatch):
    """The fences' own calls in the loop carry a timeout when the request args set none: the
    reconcile's delete of a cleared launch's Pending pod that never answers gives up (no evidence
    it happened: the pod stays in the picture), the loop goes on, and the next loop deletes the pod.
    (The reconcile knows the pod's uid from its watch: it reads nothing first.)"""
    from fenced_k8s_executor import pods

    monkeypatch.setattr(pods, "REQUEST_TIMEOUT", (1.0, 1.0))  # the shipped 30 s / 120 s, shortened
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__KUBE_CLIENT_REQUEST_ARGS", "{}")  # the shipped default
    sched = world.scheduler("fenced")
    world.queue(sched)
    sched.executor.sync()  # the pod is created and stays Pending
    first = world.row("t1")
    (stale,) = [p.metadata.name for p in world.live_pods(first)]
    world.airflow.clear(first)
    world.queue(sched)  # a new launch supersedes it
    world.emulator.add_fault(method="DELETE", path=rf"/pods/{stale}$", delay=25, who=sched.user)
    done: list = []
    thread = threading.Thread(target=lambda: done.append(sched.executor.sync()), daemon=True)
    thread.start()
    thread.join(timeout=15)  # the client's own retries included: 4 reads of 1 s
    assert done, "the scheduler loop still waits on a call that never answers"
    assert stale in {p.metadata.name for p in world.live_pods(first)}  # no evidence: left for later
    world.emulator.clear_faults()
    sched.executor.sync()
    assert stale not in {p.metadata.name for p in world.live_pods(first)}


def test_a_sweep_list_that_never_answers_gives_up_and_lets_go_of_the_lock(world, needs_emulator, monkeypatch):
    """The sweep's own calls carry a timeout when the request args set none: a list that never
    answers ends the sweep with an error, and its advisory lock with it, where it held both until
    the connection dropped (with no timeout, for good)."""
    from fenced_k8s_executor import pods

    monkeypatch.setattr(pods, "REQUEST_TIMEOUT", (1.0, 1.0))  # the shipped 30 s / 120 s, shortened
    sweeper = world.sweeper()
    assert world.sweeper(request_args={"_request_timeout": 7}).request_args["_request_timeout"] == 7
    world.emulator.add_fault(method="GET", path=r"/pods$", persist_then_timeout=True, hang_seconds=25)
    done: list = []
    thread = threading.Thread(target=lambda: done.append(sweeper.run_once()), daemon=True)
    thread.start()
    thread.join(timeout=15)  # the client's own retries included: 4 reads of 1 s
    assert done, "the sweep still waits on a list that never answers"
    assert done[0].errors and done[0].pages == 0
    world.emulator.clear_faults()
    report = world.sweeper().run_once()
    assert report.skipped is None and not report.errors and report.pages == 1  # the lock was let go


def test_sweep_survives_list_and_delete_faults(world, needs_write_faults, api_errors):
    """The fenced sweep (fenced only: stock has none) lists while LISTs fail, then finds a stale
    pod while DELETEs fail: errors are counted, nothing raises, the pod goes on a later sweep.
    (The LIST half needs a read fault: the emulator's alone; the real apiserver runs the DELETE half.)"""
    sched = world.scheduler("fenced", sweep_interval="3600")
    world.queue(sched, trigger=False)
    row1 = world.row("t1")
    world.requeue_stuck(sched, trigger=False)  # launch 1 superseded by launch 2
    stale = world.stale_pod(row1, row1.token, sched=sched, phase="Running")
    sweeper = sched.executor.sweeper

    if world.backend.supports_faults:
        world.emulator.add_fault(method="GET", path=r"/pods$", status=500, who=sched.user)
        report = sweeper.run_once()
        assert report.errors and ("sweep", "500") in api_errors
        world.emulator.clear_faults()

    world.emulator.add_fault(method="DELETE", path=r"/pods/[^/]+$", status=503, who=sched.user)
    report = sweeper.run_once()
    assert report.stale == 1 and report.deleted == 0 and ("delete", "503") in api_errors
    assert stale in {p.metadata.name for p in world.live_pods()}
    world.emulator.clear_faults()

    assert sweeper.run_once().deleted == 1
    assert stale not in {p.metadata.name for p in world.live_pods()}
