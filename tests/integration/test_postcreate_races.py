"""Races after creation (a2, b1-b4, c, d), stock vs fenced on the same steps.

The test plays the scheduler (rows) and the kubelet (pod status); the executors, their watcher
processes, the Kubernetes API (emulator over HTTP) and the DB are real. Each test asserts that
the stock executor shows the failure, so a scenario that stops reproducing its race fails.
"""

from __future__ import annotations

import threading
import time

import pytest

from fenced_k8s_executor.lab import seed
from fenced_k8s_executor.names import TOKEN_ANNOTATION

KINDS = ["stock", "fenced"]
JOB, PEER = 21, 22


def failed_events(executor, key) -> list:
    return [info for k, (state, info) in executor.event_buffer.items() if k == key and state == "failed"]


def pod_names(world, ti) -> set[str]:
    return {p.metadata.name for p in world.pods(ti)}


@pytest.mark.parametrize("kind", KINDS)
def test_a2_check_then_create_gap(world, make_executor, kind):
    """The TI is re-queued (new token, same id and try) while the create request is in flight."""
    executor = make_executor(kind, JOB)
    (ti,) = world.tis("a2", job_id=JOB)
    world.emulator.add_fault(method="POST", path=r"/pods$", delay=1.5, times=1)
    world.queue(executor, ti)
    requeued = {}
    timer = threading.Timer(0.5, lambda: requeued.setdefault("ti", seed.requeue_same_id(world.engine, ti, JOB)))
    timer.start()
    executor.sync()  # pre-check passes, create lands after the row moved on
    timer.join()
    world.settle(executor, 1.5)  # the next loop re-checks what was created
    live = [p for p in world.pods(ti) if not p.metadata.deletion_timestamp]
    stale = [p for p in live if (p.metadata.annotations or {}).get(TOKEN_ANNOTATION) != requeued["ti"].token]
    if kind == "stock":
        assert len(live) == 1, "stock executor no longer leaves the stale pod of race a2"
    else:
        assert stale == []
        assert len(world.deletes_by(f"scheduler-{JOB}")) == 1


def _two_launches(world, executor, name):
    """Launch 1 gets a pod; the TI is re-queued with the same id and try (launch 2), which gets
    its pod and starts running. Returns (ti, ti2, stale pod name, live pod name)."""
    (ti,) = world.tis(name, job_id=JOB)
    world.queue(executor, ti)
    executor.sync()
    (stale,) = pod_names(world, ti)
    ti2 = seed.requeue_same_id(world.engine, ti, JOB)
    world.queue(executor, ti2)
    executor.sync()
    live = pod_names(world, ti) - {stale}
    seed.set_state(world.engine, ti2, "running")
    return ti, ti2, stale, (next(iter(live)) if live else None)


@pytest.mark.parametrize("kind", KINDS)
def test_b1_duplicate_loser_does_not_fail_the_live_try(world, make_executor, kind):
    """The loser pod of a same-id re-queue fails (its /run got 409); its FAILED event carries the
    live try's key."""
    executor = make_executor(kind, JOB)
    ti, ti2, stale, live = _two_launches(world, executor, "b1")
    key = world.ref(ti2, JOB).key
    if world.kube.list_namespaced_pod(world.namespace, field_selector=f"metadata.name={stale}").items:
        world.set_pod_phase(stale, "Failed", container_reason="Error")
    world.settle(executor, 2.0)
    if kind == "stock":
        assert failed_events(executor, key), "stock executor no longer burns the live try (b1)"
    else:
        assert not failed_events(executor, key)
        assert key in executor.running
        assert live in pod_names(world, ti)


@pytest.mark.parametrize("kind", KINDS)
def test_b2_replayed_old_failed_pod_is_not_applied(world, make_executor, kind):
    """A Failed pod of a superseded launch is kept (delete_worker_pods_on_failure=False) and
    replayed as ADDED when a watcher starts from resourceVersion 0 (restart or 410)."""
    (ti,) = world.tis("b2", job_id=JOB)
    old_token = ti.token
    ti2 = seed.requeue_same_id(world.engine, ti, JOB)
    world.stale_pod(ti, old_token, job_id=JOB, phase="Failed", container_reason="Error")
    seed.set_state(world.engine, ti2, "running")
    executor = make_executor(kind, JOB)  # the watcher lists from "0": the old pod replays
    executor.running.add(world.ref(ti2, JOB).key)  # the live launch, adopted or launched here
    key = world.ref(ti2, JOB).key
    world.settle(executor, 2.5)
    if kind == "stock":
        assert failed_events(executor, key), "stock executor no longer applies the replayed Failed pod (b2)"
    else:
        assert not failed_events(executor, key)
        assert key in executor.running
        assert world.pods(ti) == []  # the stale pod was deleted


@pytest.mark.parametrize("kind", KINDS)
def test_b3_stale_succeeded_pod_does_not_wipe_the_token(world, make_executor, kind):
    """A Succeeded pod of a superseded launch removes the live key from running and emits
    (QUEUED, None): the scheduler then erases the live launch's token."""
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.utils.session import create_session

    executor = make_executor(kind, JOB)
    ti, ti2, stale, live = _two_launches(world, executor, "b3")
    seed.set_state(world.engine, ti2, "queued")  # the live pod has not reported /run yet
    with create_session() as session:  # the scheduler consumes the QUEUED events of both launches
        SchedulerJobRunner.process_executor_events(executor=executor, job_id=JOB, scheduler_dag_bag=None,
                                                   session=session)
    key = world.ref(ti2, JOB).key
    if world.kube.list_namespaced_pod(world.namespace, field_selector=f"metadata.name={stale}").items:
        world.set_pod_phase(stale, "Succeeded")
    world.settle(executor, 2.0)
    with create_session() as session:
        SchedulerJobRunner.process_executor_events(executor=executor, job_id=JOB, scheduler_dag_bag=None,
                                                   session=session)
    token = seed.row(world.engine, ti.id)["external_executor_id"]
    if kind == "stock":
        assert token != ti2.token, "stock executor no longer wipes the live token (b3)"
    else:
        assert token == ti2.token
        assert key in executor.running


@pytest.mark.parametrize("kind", KINDS)
def test_b4_stale_eviction_does_not_requeue_the_live_launch(world, make_executor, kind):
    """A stale pod evicted before its task started looks like a pre-execution failure of the key:
    the stock executor re-queues the CURRENT job and makes an extra pod for it."""
    executor = make_executor(kind, JOB)
    ti, ti2, stale, live = _two_launches(world, executor, "b4")
    seed.set_state(world.engine, ti2, "queued")  # live pod not started yet
    before = pod_names(world, ti)
    if world.kube.list_namespaced_pod(world.namespace, field_selector=f"metadata.name={stale}").items:
        world.set_pod_phase(stale, "Failed", container_reason="ContainerStatusUnknown")
    world.settle(executor, 2.5)
    extra = {n for n in pod_names(world, ti) - before}
    if kind == "stock":
        assert extra, "stock executor no longer re-queues the live job on a stale eviction (b4)"
    else:
        assert not extra
        assert world.ref(ti2, JOB).key in executor.running


@pytest.mark.parametrize("kind", KINDS)
def test_c_adoption_takes_the_live_pod_not_the_stale_one(world, make_executor, kind):
    """Scheduler JOB died owning a stale pod (older launch) and the live pod of one TI; the peer
    adopts by coordinates."""
    (ti,) = world.tis("c", job_id=JOB)
    old_token = ti.token
    ti2 = seed.requeue_same_id(world.engine, ti, JOB)
    # Lists come back in name order (as from etcd): the stale pod is met first.
    stale = world.stale_pod(ti, old_token, job_id=JOB, phase="Running", name="c-1-old-launch")
    live = world.stale_pod(ti2, ti2.token, job_id=JOB, phase="Running", name="c-2-new-launch")
    peer = make_executor(kind, PEER)
    leftover = peer.try_adopt_task_instances([world.ref(ti2, JOB)])
    owners = {p.metadata.name: p.metadata.labels.get("airflow-worker") for p in world.pods(ti)
              if not p.metadata.deletion_timestamp}  # bound pods terminate gracefully
    if kind == "stock":
        assert owners.get(stale) == str(PEER), "stock executor no longer adopts the stale pod (c)"
        assert owners.get(live) == str(JOB)  # the live pod is left to nobody
    else:
        assert owners == {live: str(PEER)}  # stale deleted, live adopted
        assert leftover == []
        assert world.ref(ti2, JOB).key in peer.running


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("superseded_by", ["requeue", "clear"])
def test_d_sweep_removes_stale_pods_no_watcher_reports(world, make_executor, kind, superseded_by):
    """A Pending pod of a superseded launch whose scheduler died: no watcher will ever report it."""
    (ti,) = world.tis(f"d-{superseded_by}", job_id=99)
    if superseded_by == "requeue":
        seed.requeue_same_id(world.engine, ti, PEER)
    else:
        seed.clear_to_next_try(world.engine, ti, queued_by_job_id=PEER)  # the TI id is gone
    stale = world.stale_pod(ti, ti.token, job_id=99)
    executor = make_executor(kind, PEER, sweep_interval="0.5")
    world.sync_until(executor, lambda: stale not in pod_names(world, ti), timeout=6)
    if kind == "stock":
        assert stale in pod_names(world, ti), "stock executor no longer leaves the stale pod (d)"
    else:
        assert stale not in pod_names(world, ti)
        (delete,) = world.deletes_by(f"scheduler-{PEER}")
        assert delete["name"] == stale


def test_sweep_and_fences_never_touch_legacy_or_current_pods(world, make_executor):
    """Legacy pods (no token) and current launches survive a sweep and a state-change pass."""
    (current,) = world.tis("current", job_id=JOB)
    (gone,) = world.tis("legacy", job_id=JOB, with_token=False)
    seed.clear_to_next_try(world.engine, gone)
    world.stale_pod(current, current.token, job_id=JOB, phase="Running", name="current-pod")
    legacy = "legacy-pod"
    world.kube.create_namespaced_pod(world.namespace, {
        "metadata": {"name": legacy, "labels": {"kubernetes_executor": "True", "airflow-worker": str(JOB)},
                     "annotations": {"dag_id": gone.dag_id, "task_id": gone.task_id, "try_number": "1",
                                     "run_id": gone.run_id}},
        "spec": {"containers": [{"name": "base", "image": "x"}]}})
    executor = make_executor("fenced", JOB, sweep_interval="0.3")
    executor.running.add(world.ref(current, JOB).key)
    world.settle(executor, 2.0)
    assert {"current-pod", legacy} <= {p.metadata.name for p in world.pods()}
    assert world.deletes_by(f"scheduler-{JOB}") == []
    assert executor.sweeper.last_report is not None and executor.sweeper.last_report.stale == 0


@pytest.mark.parametrize("fault", ["api_errors", "watch_gap", "db_outage"])
def test_no_false_positive_deletions_under_faults(world, make_executor, pg_server, fault):
    """Current launches keep their pods and their bookkeeping whatever fails around them."""
    executor = make_executor("fenced", JOB, sweep_interval="0.3")
    tis = world.tis("f1", "f2", "f3", job_id=JOB)
    for ti in tis:
        world.queue(executor, ti)
    executor.sync()
    names = {p.metadata.name for p in world.pods()}
    assert len(names) == 3
    dbname = world.engine.url.database
    if fault == "api_errors":
        for method in ("GET", "DELETE", "PATCH"):
            world.emulator.add_fault(method=method, path=r"/pods", status=500, times=50, who=f"scheduler-{JOB}")
    elif fault == "watch_gap":
        world.emulator.compact()
        world.emulator.close_watches()
    else:
        pg_server.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
        pg_server.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{dbname}'")
    try:
        for ti in tis:  # the pods run and one finishes while things fail
            world.set_pod_phase(next(n for n in names if n.startswith(f"{world.dag_id}-{ti.task_id}".replace("_", "-"))),
                                "Running")
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                executor.sync()
            except Exception:
                pass
            time.sleep(0.2)
    finally:
        world.emulator.clear_faults()
        if fault == "db_outage":
            pg_server.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
    world.settle(executor, 1.5)
    assert names <= {p.metadata.name for p in world.pods()}
    assert world.deletes_by(f"scheduler-{JOB}") == []
    assert {world.ref(ti, JOB).key for ti in tis} <= executor.running


def test_schedulers_take_turns_sweeping(world):
    """While one scheduler holds the sweep lock, another's sweep skips its round."""
    from fenced_k8s_executor.sweep import Sweeper, advisory_lock

    (ti,) = world.tis("turns", job_id=99)
    seed.clear_to_next_try(world.engine, ti, queued_by_job_id=PEER)
    stale = world.stale_pod(ti, ti.token, job_id=99)
    sweeper = Sweeper(kube_client=world.kube, namespaces=[world.namespace], interval=1, page_size=50,
                      enforcing=True)
    with advisory_lock() as held:  # the peer's sweep in progress
        assert held
        report = sweeper.run_once()
        assert report.skipped and report.deleted == 0
        assert stale in pod_names(world, ti)
    report = sweeper.run_once()
    assert report.skipped is None and report.deleted == 1 and report.db_queries == 1
    assert stale not in pod_names(world, ti)
