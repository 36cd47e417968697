"""Issue 11: a launch's standing is judged across TaskInstance id changes.

The same launch (same token on the task's row) keeps reaching the scheduler exactly as with the
stock executor after a clear of a running TI (RESTARTING), a retry or a success reported by the
worker; a row without a token is no evidence; only a row naming another token (or no row for the
task at all) makes a launch stale. Every test runs the same steps on the stock and the fenced
executor and asserts the stock outcome on both, unless the stock outcome is the race itself.
"""

from __future__ import annotations

import logging
import re
import threading

import pytest

from fenced_k8s_executor.names import TOKEN_ANNOTATION

KINDS = ["stock", "fenced"]
DONE_LABEL = "airflow_executor_done"


def _keeps_attempts() -> bool:
    """Airflow 3.4 keeps every attempt as a row: a cleared running TI keeps its id (RESTARTING)
    until its pod ends, and a retry's successor row starts without a token."""
    from fenced_k8s_executor import provider_compat

    return provider_compat.task_columns().live is not None


def _running_pod(world, sched, task_id="t1"):
    """Queue the task, create its pod, let the pod run and the worker report /run; the scheduler
    consumes the QUEUED/RUNNING events. Returns (row, pod name)."""
    world.queue(sched)
    sched.executor.sync()
    row = world.row(task_id)
    pod = world.pod_of(row)
    world.set_pod_phase(pod, "Running")
    world.airflow.start(row)
    world.settle(sched.executor, 0.8)
    sched.process_events()
    return world.row(task_id), pod


def _released(world, executor, key, timeout=8.0) -> bool:
    return world.sync_until(executor, lambda: key not in executor.running, timeout=timeout)


def _slots_back(executor) -> bool:
    return (executor.slots_available == executor.parallelism and not executor.running
            and not executor.pod_launch_attempts)


def _until_the_watch_saw_it_finish(world, sched, name: str, timeout: float = 10.0) -> None:
    """The fenced scheduler's watch of pods in flight holds no trace of ``name`` (created Pending,
    then Failed at once): absent for half a second running, after at least a second. A loop that
    ran while the watch still showed it Pending would delete it, rightly, as a superseded launch's
    Pending pod."""
    import time

    pods = getattr(sched.executor, "in_flight_pods", None)
    if pods is None:
        return
    start = absent_since = time.monotonic()
    while time.monotonic() - start < timeout:
        now = time.monotonic()
        if pods.view.has(world.namespace, name):
            absent_since = now
        elif now - start >= 1.0 and now - absent_since >= 0.5:
            return
        time.sleep(0.02)
    raise AssertionError(f"the watch of pods in flight still shows {name} as unfinished")


# ---------------------------------------------------------------------------------------------
# 1. Clearing a RUNNING task


@pytest.mark.parametrize("kind", KINDS)
def test_clear_running_task_pod_end_sends_restarting_ti_back_to_scheduling(world, kind):
    """clear_task_instances: RESTARTING, external_executor_id kept (a new id before Airflow 3.4;
    3.4 keeps the id until the pod ends). The old pod's terminal event is what moves the
    RESTARTING TI on (process_executor_events)."""
    sched = world.scheduler(kind)
    row, pod = _running_pod(world, sched)
    cleared = world.airflow.clear(row)
    assert (cleared.state, cleared.try_number) == ("restarting", row.try_number)
    assert (cleared.id == row.id) == _keeps_attempts() and cleared.token == row.token
    world.set_pod_phase(pod, "Succeeded")
    assert _released(world, sched.executor, row.key), "the pod's end never reached the executor"
    sched.process_events()
    after = world.row("t1")
    assert after.state != "restarting", f"TI stuck in RESTARTING ({kind})"
    assert after.state in (None, "scheduled", "up_for_retry")
    assert _slots_back(sched.executor)
    assert world.deletes_by(sched) == []


# ---------------------------------------------------------------------------------------------
# 2. No leaked parallelism slot


@pytest.mark.parametrize("kind", KINDS)
def test_ordinary_retry_releases_the_slot(world, kind):
    """The worker reports up_for_retry (new id via prepare_db_for_next_try, token kept; Airflow 3.4's
    successor row starts without one), then the pod fails: the key leaves ``running`` and the open
    slots return, as with the stock executor."""
    sched = world.scheduler(kind)
    row, pod = _running_pod(world, sched)
    world.airflow.finish(row, "up_for_retry")
    retried = world.row("t1")
    assert retried.id != row.id and retried.state == "up_for_retry"
    assert retried.token == (None if _keeps_attempts() else row.token)
    world.set_pod_phase(pod, "Failed", container_reason="Error")
    assert _released(world, sched.executor, row.key), f"slot leaked on an ordinary retry ({kind})"
    assert _slots_back(sched.executor)
    sched.process_events()
    assert world.row("t1").state == "up_for_retry"


@pytest.mark.parametrize("kind", KINDS)
def test_clear_of_a_queued_ti_releases_the_slot(world, kind):
    """A user clears the TI while its pod is pending (new id, no token: no evidence either way);
    the pod fails its /run: the event reaches the scheduler and the slot returns, as stock."""
    sched = world.scheduler(kind)
    world.queue(sched)
    sched.executor.sync()
    row = world.row("t1")
    pod = world.pod_of(row)
    cleared = world.airflow.clear(row)
    assert cleared.state is None and cleared.token is None
    world.set_pod_phase(pod, "Failed", container_reason="Error")
    assert _released(world, sched.executor, row.key), f"slot leaked on a clear of a queued TI ({kind})"
    assert _slots_back(sched.executor)
    sched.process_events()
    assert world.row("t1").state is None


@pytest.mark.parametrize("kind", KINDS)
def test_requeue_by_the_peer_releases_the_slot(world, needs_write_faults, kind):
    """The scheduler stalls with its create in flight; the peer fails it and takes the TI over (no
    pod to adopt yet: the stock peer resets and re-queues it, the fenced peer launches it itself)
    and queues it again. The stalled scheduler's pod lands and fails: its slot returns."""
    world.monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__KUBE_CLIENT_REQUEST_ARGS", '{"_request_timeout": [5, 15]}')
    sched = world.scheduler(kind)
    peer = world.scheduler(kind)
    world.emulator.add_fault(method="POST", path=r"/pods$", delay=4, times=1, who=sched.user)
    world.queue(sched)
    row = world.row("t1")

    def peer_takes_over():
        world.kill(sched)
        peer.adopt_or_reset_orphans()
        world.queue(peer, trigger=False)

    timer = threading.Timer(0.2, peer_takes_over)
    timer.start()
    sched.executor.sync()  # the create is in flight while the peer takes the TI over
    timer.join()
    assert [f["fired"] for f in world.backend.faults()] == [1], "the create was not held in flight"
    requeued = world.row("t1")
    assert requeued.queued_by_job_id == peer.job_id
    world.settle(sched.executor, 0.6)
    pods = world.live_pods(row)
    if pods:  # the pod of the superseded launch fails its /run (404)
        world.set_pod_phase(pods[0].metadata.name, "Failed", container_reason="Error")
    assert _released(world, sched.executor, row.key), f"slot leaked on a peer re-queue ({kind})"
    assert _slots_back(sched.executor)
    sched.process_events()
    assert world.row("t1").queued_by_job_id == peer.job_id


@pytest.mark.parametrize("kind", KINDS)
def test_stale_event_keeps_the_newer_launch_slot(world, kind):
    """A NEWER launch of the same key is in flight on this scheduler: the superseded pod's end
    must not release it. (The stock executor does: that is race b1/b4.)"""
    sched = world.scheduler(kind)
    world.queue(sched, trigger=False)
    row1 = world.row("t1")
    world.requeue_stuck(sched)
    sched.executor.sync()
    row2 = world.row("t1")
    live = world.pod_of(row2)
    stale = world.stale_pod(row1, row1.token, sched=sched, phase="Running")
    world.settle(sched.executor, 0.6)
    world.set_pod_phase(stale, "Failed", container_reason="Error")
    world.settle(sched.executor, 2.0)
    executor = sched.executor
    if kind == "stock":
        assert row2.key not in executor.running, "stock executor no longer releases the newer launch"
    else:
        assert row2.key in executor.running and row2.key in executor.pod_launch_attempts
        assert executor.slots_available == executor.parallelism - 1
        assert live in {p.metadata.name for p in world.live_pods(row2)}


# ---------------------------------------------------------------------------------------------
# 4. A late QUEUED event never fences the live launch


@pytest.mark.parametrize("kind", KINDS)
def test_late_queued_event_does_not_fence_the_live_launch(world, kind):
    """Scheduler A queued launch 1 (its QUEUED event waits in A's buffer); stuck in queued, the TI
    is queued again by the peer (launch 2), whose pod starts. A processes its events late: the
    scheduler writes A's event info over the row by (dag, task, run, map_index)."""
    a = world.scheduler(kind)
    peer = world.scheduler(kind, sweep_interval="0.3")
    world.queue(a)  # execute_async reported (QUEUED, info) for launch 1
    a.stuck_in_queued()
    peer.enqueue()
    peer.trigger()
    peer.executor.sync()
    row2 = world.row("t1")
    assert row2.queued_by_job_id == peer.job_id
    live = world.pod_of(row2)
    world.set_pod_phase(live, "Running")
    a.process_events()  # late
    after = world.row("t1")
    if kind == "fenced":
        assert after.token == row2.token, "a late QUEUED event overwrote the newest launch token"
    world.settle(peer.executor, 2.0)
    assert live in {p.metadata.name for p in world.live_pods(row2)}
    assert world.deletes_by(peer) == [] and world.deletes_by(a) == []
    assert row2.key in peer.executor.running


# ---------------------------------------------------------------------------------------------
# 5. Finishing pods are not cut off; fenced-out finished pods follow delete_worker_pods


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("outcome", ["up_for_retry", "success"])
def test_finishing_pod_is_not_cut_off(world, kind, outcome):
    """The worker reported its outcome through the execution API and is still in finalize():
    neither the sweep nor an event fence may kill its pod."""
    sched = world.scheduler(kind, sweep_interval="0.3")
    row, pod = _running_pod(world, sched)
    world.airflow.finish(row, outcome)
    world.set_pod_phase(pod, "Running")  # a status update while it finishes
    world.settle(sched.executor, 2.0)
    assert pod in {p.metadata.name for p in world.live_pods(row)}, "a finishing pod was deleted"
    assert world.deletes_by(sched) == []
    world.set_pod_phase(pod, "Succeeded" if outcome == "success" else "Failed")
    assert _released(world, sched.executor, row.key)
    sched.process_events()
    assert world.row("t1").state == outcome


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("delete_worker_pods,on_failure", [(False, False), (True, False), (True, True)],
                         ids=["keep", "delete_but_keep_failed", "delete_all"])
def test_stale_finished_pod_follows_delete_worker_pods(world, monkeypatch, kind, delete_worker_pods, on_failure):
    """A Failed pod of a superseded launch is treated as stock treats a Failed pod: kept and
    labelled done (delete_worker_pods=False), kept (on_failure=False), or deleted."""
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__DELETE_WORKER_PODS", str(delete_worker_pods))
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__DELETE_WORKER_PODS_ON_FAILURE", str(on_failure))
    sched = world.scheduler(kind)
    world.queue(sched, trigger=False)
    row1 = world.row("t1")
    world.requeue_stuck(sched)
    sched.executor.sync()
    row2 = world.row("t1")
    # The stale launch's pod finished before any loop looked at it (a Running one would be deleted
    # as superseded: the pod the task's row names as its host is the current launch's).
    world.airflow.start(row2)
    stale = world.stale_pod(row1, row1.token, sched=sched, phase="Failed", container_reason="Error")
    _until_the_watch_saw_it_finish(world, sched, stale)
    world.settle(sched.executor, 2.0)
    pods = {p.metadata.name: p for p in world.live_pods(row2)}
    if delete_worker_pods and on_failure:
        assert stale not in pods
    else:
        assert stale in pods, "a finished pod of a stale launch was deleted against delete_worker_pods"
        if not delete_worker_pods:
            assert pods[stale].metadata.labels.get(DONE_LABEL) == "True"


# ---------------------------------------------------------------------------------------------
# 7. audit costs what enforce costs and reports what enforce fences


_DECISION = re.compile(r"decision=(\S+) path=(\S+) reason=(\S+) enforced=(\S+)(.*)")
_FENCING = {"event.swallowed", "pod.stale", "pod.deleted", "launch.dropped", "adoption.refused"}


def _steps(world, sched, run_id):
    """A normal retry of r1 and a stale launch of r2 (same id and try, superseded)."""
    world.queue(sched, run_id)
    sched.executor.sync()
    retry_row = world.row("r1", run_id)
    pod = world.pod_of(retry_row)
    world.set_pod_phase(pod, "Running")
    world.airflow.start(retry_row)
    world.airflow.finish(retry_row, "up_for_retry")
    world.set_pod_phase(pod, "Failed", container_reason="Error")
    stale_row = world.row("r2", run_id)
    world.settle(sched.executor, 1.0)
    sched.stuck_in_queued()
    sched.enqueue()
    sched.trigger()
    sched.executor.sync()
    stale = world.stale_pod(stale_row, stale_row.token, sched=sched, phase="Running")
    world.settle(sched.executor, 0.6)
    world.set_pod_phase(stale, "Failed", container_reason="Error")
    world.settle(sched.executor, 2.0)
    return retry_row, stale_row


def _pod_reads(world, sched) -> int:
    return len([e for e in world.audit() if e.get("who") == sched.user and e.get("verb") == "get"
                and e.get("name") and not e.get("subresource") and e.get("resource", "pods") == "pods"])


@pytest.mark.tasks("r1", "r2")
def test_audit_costs_and_reports_what_enforce_fences(world, caplog):
    from fenced_k8s_executor.metrics import short

    reports, reads, deletes = {}, {}, {}
    for mode in ("audit", "enforce"):
        run_id = world.new_run()
        sched = world.scheduler("fenced", mode=mode, sweep_interval="0.3")
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="fenced_k8s_executor"):
            retry_row, stale_row = _steps(world, sched, run_id)
        lines = [m for m in (_DECISION.search(r.getMessage()) for r in caplog.records) if m]
        fenced = {re.search(r"launch=(\S+)", m.group(5)).group(1) for m in lines
                  if m.group(1) in _FENCING and "launch=" in m.group(5)}
        assert all(m.group(4) == str(mode == "enforce") for m in lines)
        assert short(retry_row.token) not in fenced, f"{mode}: a normal retry reported as stale"
        reports[mode] = fenced == {short(stale_row.token)}
        reads[mode] = _pod_reads(world, sched)
        deletes[mode] = len(world.deletes_by(sched))
        sched.stop()
    assert reports == {"audit": True, "enforce": True}, "audit and enforce disagree on what is stale"
    # Judging costs the same in both modes: no pod reads per event. Enforce may read a pod only
    # to guard its own delete (uid precondition): acting is what audit does not do.
    assert reads["audit"] == 0, f"audit reads pods per event: {reads}"
    assert reads["enforce"] <= deletes["enforce"], f"enforce reads pods beyond its deletes: {reads} {deletes}"
    assert deletes["enforce"] > deletes["audit"]  # enforce deleted the stale pod, audit only reported it
