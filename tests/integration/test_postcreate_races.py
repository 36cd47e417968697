"""Races after creation (a2, b1-b4, c, d), stock vs fenced on the same steps.

The rows move only through airflow-core (``lab.core``); the test plays the kubelet (pod status)
and, where a race needs a pod no watcher reported, creates the pod the executor made for an
earlier launch. Each test asserts that the stock executor shows the failure, so a scenario
that stops reproducing its race fails.
"""

from __future__ import annotations

import time

import pytest

from fenced_k8s_executor.names import TOKEN_ANNOTATION

KINDS = ["stock", "fenced"]


def failed_events(executor, key) -> list:
    return [info for k, (state, info) in executor.event_buffer.items() if k == key and state == "failed"]


def pod_names(world, row) -> set[str]:
    return {p.metadata.name for p in world.pods(row)}


@pytest.mark.parametrize("kind", KINDS)
def test_a2_check_then_create_gap(world, needs_write_faults, kind):
    """The TI is cleared and re-queued by the peer scheduler while the create request is in flight."""
    sched = world.scheduler(kind)
    peer = world.scheduler("fenced", start=False)
    world.emulator.add_fault(method="POST", path=r"/pods$", delay=1.5, times=1)
    world.queue(sched)
    first = world.row("t1")
    requeued = {}

    def clear_and_requeue():
        world.airflow.clear(first)  # a user clears the queued TI (new id, no token)
        world.queue(peer, trigger=False)  # the peer's next loop queues it: a new launch
        requeued["row"] = world.row("t1")

    moving = world.while_held(clear_and_requeue)
    sched.executor.sync()  # pre-check passes, create lands after the row moved on
    moving.join()
    assert [f["fired"] for f in world.backend.faults()] == [1], "the create was not held in flight"
    world.settle(sched.executor, 1.5)  # the next loop re-checks what was created
    live = world.live_pods(first)
    stale = [p for p in live if (p.metadata.annotations or {}).get(TOKEN_ANNOTATION) != requeued["row"].token]
    if kind == "stock":
        assert len(live) == 1, "stock executor no longer leaves the stale pod of race a2"
    else:
        assert stale == []
        assert len(world.deletes_by(sched)) == 1


def _two_launches(world, sched, task_id="t1", *, start=True):
    """Launch 1 is queued; stuck in queued, the TI is queued again with the same id and try
    (launch 2), whose pod is created and (``start``) reports /run. Launch 1's pod, made before
    the revoke and never reported to it, appears too. Returns (row1, row2, stale pod, live pod)."""
    world.queue(sched, trigger=False)
    row1 = world.row(task_id)
    world.requeue_stuck(sched)
    row2 = world.row(task_id)
    sched.executor.sync()
    live = world.pod_of(row2)
    stale = world.stale_pod(row1, row1.token, sched=sched, phase="Running")
    if start:
        world.airflow.start(row2)
    return row1, world.row(task_id), stale, live


@pytest.mark.parametrize("kind", KINDS)
def test_b1_duplicate_loser_does_not_fail_the_live_try(world, kind):
    """The loser pod of a same-id re-queue fails (its /run got 409); its FAILED event carries the
    live try's key."""
    sched = world.scheduler(kind)
    row1, row2, stale, live = _two_launches(world, sched)
    key = row2.key
    world.settle(sched.executor, 0.6)
    world.set_pod_phase(stale, "Failed", container_reason="Error")
    world.settle(sched.executor, 2.0)
    if kind == "stock":
        assert failed_events(sched.executor, key), "stock executor no longer burns the live try (b1)"
    else:
        assert not failed_events(sched.executor, key)
        assert key in sched.executor.running
        assert live in pod_names(world, row2)


@pytest.mark.parametrize("kind", KINDS)
def test_b2_replayed_old_failed_pod_is_not_applied(world, kind):
    """A Failed pod of a superseded launch is kept (delete_worker_pods_on_failure=False) and
    replayed when a watcher starts from resourceVersion 0 (restart or 410)."""
    sched = world.scheduler(kind)
    world.queue(sched, trigger=False)
    row1 = world.row("t1")
    world.requeue_stuck(sched)
    sched.executor.sync()
    row2 = world.row("t1")
    world.airflow.start(row2)
    stale = world.stale_pod(row1, row1.token, sched=sched, phase="Failed", container_reason="Error")
    if world.backend.supports_faults:  # the watcher relists from "0": the old pod replays
        world.emulator.compact()
        world.emulator.close_watches()
    key = row2.key
    world.settle(sched.executor, 2.5)
    if kind == "stock":
        assert failed_events(sched.executor, key), "stock executor no longer applies the replayed Failed pod (b2)"
    else:
        assert not failed_events(sched.executor, key)
        assert key in sched.executor.running
        # a finished pod of a stale launch follows delete_worker_pods (False here): kept, labelled
        # done like stock does, so no watcher replays it again
        kept = {p.metadata.name: p for p in world.live_pods(row2)}
        assert stale not in kept or kept[stale].metadata.labels.get("airflow_executor_done") == "True"


@pytest.mark.parametrize("kind", KINDS)
def test_b3_stale_succeeded_pod_does_not_wipe_the_token(world, kind):
    """A Succeeded pod of a superseded launch removes the live key from running and emits
    (QUEUED, None): the scheduler then erases the live launch's token."""
    sched = world.scheduler(kind)
    row1, row2, stale, live = _two_launches(world, sched, start=False)  # the live pod has not reported /run yet
    sched.process_events()  # the scheduler consumes the QUEUED events of both launches
    world.settle(sched.executor, 0.6)
    world.set_pod_phase(stale, "Succeeded")
    world.settle(sched.executor, 2.0)
    sched.process_events()
    token = world.row("t1").external_executor_id
    if kind == "stock":  # stock rows carry no token: the symptom is the live launch dropped from running
        assert row2.key not in sched.executor.running, "stock executor no longer drops the live launch (b3)"
        assert token is None
    else:
        assert token == row2.token
        assert row2.key in sched.executor.running


@pytest.mark.parametrize("kind", KINDS)
def test_b4_stale_eviction_does_not_requeue_the_live_launch(world, kind):
    """A stale pod evicted before its task started looks like a pre-execution failure of the key:
    the stock executor re-queues the CURRENT job and makes an extra pod for it."""
    sched = world.scheduler(kind)
    row1, row2, stale, live = _two_launches(world, sched, start=False)  # live pod not started yet
    world.settle(sched.executor, 0.6)
    before = pod_names(world, row2)
    world.set_pod_phase(stale, "Failed", container_reason="ContainerStatusUnknown")
    world.settle(sched.executor, 2.5)
    extra = pod_names(world, row2) - before
    if kind == "stock":
        assert extra, "stock executor no longer re-queues the live job on a stale eviction (b4)"
    else:
        assert not extra
        assert row2.key in sched.executor.running


@pytest.mark.parametrize("kind", KINDS)
def test_c_adoption_takes_the_live_pod_not_the_stale_one(world, kind):
    """The scheduler died owning a stale pod (older launch, same id and try) and the live pod of
    one TI; the peer's orphan check adopts by coordinates."""
    dead = world.scheduler("fenced")
    world.queue(dead, trigger=False)
    row1 = world.row("t1")
    world.requeue_stuck(dead, trigger=False)
    row2 = world.row("t1")
    # Lists come back in name order (as from etcd): the stale pod is met first.
    stale = world.stale_pod(row1, row1.token, sched=dead, phase="Running", name="c-1-old-launch")
    live = world.stale_pod(row2, row2.token, sched=dead, phase="Running", name="c-2-new-launch")
    world.kill(dead)
    peer = world.scheduler(kind)
    peer.adopt_or_reset_orphans()
    owners = {p.metadata.name: p.metadata.labels.get("airflow-worker") for p in world.live_pods(row2)}
    if kind == "stock":
        assert owners.get(stale) == str(peer.job_id), "stock executor no longer adopts the stale pod (c)"
        assert owners.get(live) == str(dead.job_id)  # the live pod is left to nobody
    else:
        assert owners == {live: str(peer.job_id)}  # stale deleted, live adopted
        assert row2.key in peer.executor.running
        after = world.row("t1")
        assert (after.id, after.queued_by_job_id, after.token) == (row2.id, peer.job_id, row2.token)  # adopted


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("superseded_by", ["requeue", "clear"])
def test_d_sweep_removes_stale_pods_no_watcher_reports(world, kind, superseded_by):
    """A Pending pod of a superseded launch whose scheduler died: no watcher will ever report it."""
    dead = world.scheduler("fenced", start=superseded_by == "requeue")
    world.queue(dead, trigger=False)
    row1 = world.row("t1")
    peer = world.scheduler(kind, sweep_interval="0.5")
    if superseded_by == "requeue":  # same id and try, queued again by the peer
        dead.stuck_in_queued()
        peer.enqueue()
    else:  # cleared (new id), then queued by the peer
        world.airflow.clear(row1)
        world.queue(peer, trigger=False)
    stale = world.stale_pod(row1, row1.token, sched=dead)
    world.sync_until(peer.executor, lambda: stale not in pod_names(world, row1), timeout=6)
    if kind == "stock":
        assert stale in pod_names(world, row1), "stock executor no longer leaves the stale pod (d)"
    else:
        assert stale not in pod_names(world, row1)
        # the sweep, or the loop's reconcile of a stopped peer's Pending pods, or both: each may
        # reach it first, and nothing else of the peer's is deleted
        assert {d["name"] for d in world.deletes_by(peer, succeeded=True)} == {stale}


def test_sweep_and_fences_never_touch_legacy_or_current_pods(world):
    """Legacy pods (no token) and current launches survive a sweep and a state-change pass."""
    legacy_run = world.new_run()
    stock = world.scheduler("stock", start=False)  # a stock scheduler queued this one: no token
    world.queue(stock, legacy_run, trigger=False)
    gone = world.row("t1", legacy_run)
    assert gone.token is None
    world.airflow.clear(gone)
    sched = world.scheduler("fenced", sweep_interval="0.3")
    world.queue(sched)
    sched.executor.sync()
    current = world.pod_of(world.row("t1"))
    world.set_pod_phase(current, "Running")
    legacy = "legacy-pod"
    world.kube.create_namespaced_pod(world.namespace, {
        "metadata": {"name": legacy, "labels": {"kubernetes_executor": "True", "airflow-worker": str(sched.job_id)},
                     "annotations": {"dag_id": gone.dag_id, "task_id": gone.task_id, "try_number": "1",
                                     "run_id": gone.run_id}},
        "spec": {"containers": [{"name": "base", "image": "x"}]}})
    world.settle(sched.executor, 2.0)
    assert {current, legacy} <= {p.metadata.name for p in world.pods()}
    assert world.deletes_by(sched) == []
    assert sched.executor.sweeper.last_report is not None and sched.executor.sweeper.last_report.stale == 0


@pytest.mark.tasks("f1", "f2", "f3")
@pytest.mark.parametrize("fault", ["api_errors", "watch_gap", "db_outage"])
def test_no_false_positive_deletions_under_faults(world, pg_server, fault):
    """Current launches keep their pods and their bookkeeping whatever fails around them."""
    if fault != "db_outage" and not world.backend.supports_faults:
        pytest.skip("needs emulator-only controls (GET faults, compaction, close_watches); the real "
                    "apiserver's webhook makes write faults only")
    run_id = world.run_id
    sched = world.scheduler("fenced", sweep_interval="0.3")
    world.queue(sched, run_id)
    sched.executor.sync()
    rows = [world.row(t, run_id) for t in ("f1", "f2", "f3")]
    names = {world.pod_of(r) for r in rows}
    assert len(names) == 3
    dbname = world.engine.url.database
    if fault == "api_errors":
        for method in ("GET", "DELETE", "PATCH"):
            world.emulator.add_fault(method=method, path=r"/pods", status=500, times=50, who=sched.user)
    elif fault == "watch_gap":
        world.emulator.compact()
        world.emulator.close_watches()
    else:
        pg_server.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
        pg_server.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{dbname}'")
    try:
        for name in names:  # the pods run while things fail
            world.set_pod_phase(name, "Running")
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                sched.executor.sync()
            except Exception:
                pass
            time.sleep(0.2)
    finally:
        world.backend.clear_faults()
        if fault == "db_outage":
            pg_server.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
    world.settle(sched.executor, 1.5)
    assert names <= {p.metadata.name for p in world.pods()}
    assert world.deletes_by(sched) == []
    assert {r.key for r in rows} <= sched.executor.running


def test_schedulers_take_turns_sweeping(world):
    """While one scheduler holds the sweep lock, another's sweep skips its round."""
    from fenced_k8s_executor.sweep import advisory_lock

    row1, stale = world.cleared_launch_pod(world.scheduler("fenced", start=False))
    sweeper = world.sweeper()
    with advisory_lock() as held:  # the peer's sweep in progress
        assert held
        report = sweeper.run_once()
        assert report.skipped and report.deleted == 0
        assert stale in pod_names(world, row1)
    report = sweeper.run_once()
    assert report.skipped is None and report.deleted == 1 and report.db_queries == 1
    assert stale not in pod_names(world, row1)
