"""Airflow 3.4: what its own checks leave, stock 3.4 vs fenced 3.4 on the same steps.

3.4 keys executors by attempt UUID, keeps archived attempts as rows and answers their /run with
410, and the scheduler drops archived attempts' events. What stays: a stuck-in-queued re-queue
keeps the attempt's UUID and try, so two launches of one live attempt look the same to every one
of those checks; a pod whose attempt was archived is still created, starts and is turned away only
at /run; orphan reset still archives the attempt. Each test records stock 3.4's failure as a fact
(if it stops showing, the test fails) and requires the fenced executor not to show it.

Every step goes through airflow-core's own code (``fenced_k8s_lab.core``); the test plays the
kubelet. Skipped before 3.4: the same races on 3.2/3.3 are in test_precreate_races,
test_inflight_reconcile and test_ha_adoption.
"""

from __future__ import annotations

import pytest

from fenced_k8s_executor import provider_compat
from fenced_k8s_executor.names import TOKEN_ANNOTATION

KINDS = ["stock", "fenced"]
TASKS = ("t1", "t2")

pytestmark = pytest.mark.skipif(provider_compat.task_columns().live is None,
                                reason="Airflow 3.4 only (one row per attempt, UUID executor keys)")


def _attempt_ids(world, *pods) -> set:
    """The attempt each pod names to 3.4's provider (its task_instance_id annotation)."""
    return {(p.metadata.annotations or {}).get(provider_compat.TASK_INSTANCE_ID_ANNOTATION) for p in pods}


def _run(world, ti_id: str, pod: str = "worker-pod") -> tuple[int, str]:
    """The worker's first call, as pod ``pod`` of attempt ``ti_id`` makes it when it starts (its
    hostname is the pod's name)."""
    from airflow.utils import timezone

    body = {"state": "running", "hostname": pod, "unixname": "airflow", "pid": 4242,
            "start_date": timezone.utcnow().isoformat()}
    resp = world.airflow.api.patch(f"task-instances/{ti_id}/run", json=body)
    return resp.status_code, resp.text


def _attempts(world, task_id: str) -> list[tuple]:
    """Every attempt row of the task, live and archived: (id, try_number, working_set, archived_reason)."""
    with world.engine.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql(
            "SELECT id::text, try_number, working_set, archived_reason FROM task_instance"
            " WHERE dag_id = %s AND task_id = %s AND run_id = %s ORDER BY try_number, id",
            (world.dag_id, task_id, world.run_id)).fetchall()]


@pytest.mark.parametrize("kind", KINDS)
def test_two_pods_for_one_live_attempt(world, kind):
    """Launch 1's job waits in the task queue; stuck in queued, the attempt is queued again under
    the SAME UUID and try (launch 2). 3.4's provider checks state, try and owner before creating:
    both jobs pass. Both pods name the live attempt, so its events, adoption and /run cannot tell
    them apart: the second pod's /run is the route's 409 invalid_state, not a 410."""
    sched = world.scheduler(kind)
    world.queue(sched)
    first = world.row("t1")
    world.requeue_stuck(sched)
    live = world.row("t1")
    assert (live.id, live.try_number) == (first.id, first.try_number)  # same attempt (fenced: a new token)
    sched.executor.sync()
    world.settle(sched.executor, 1.0)
    pods = world.live_pods(live)
    if kind == "stock":
        assert len(pods) == 2, "stock 3.4 no longer makes two pods for one live attempt"
        assert _attempt_ids(world, *pods) == {live.id}  # the same live attempt, twice
        assert _run(world, live.id, pods[0].metadata.name)[0] == 200
        status, text = _run(world, live.id, pods[1].metadata.name)  # the other pod starts: the attempt RUNS
        assert status == 409 and "invalid_state" in text, text
        return
    assert len(pods) == 1
    assert pods[0].metadata.annotations[TOKEN_ANNOTATION] == live.token
    assert _attempt_ids(world, *pods) == {live.id}
    assert sched.executor.running == {live.key}


@pytest.mark.parametrize("kind", KINDS)
def test_ambiguous_create_makes_one_pod(world, needs_emulator, kind):
    """The API server stores the pod but the client times out; the provider re-queues the job and
    creates again. Nothing in 3.4 names a launch's pod before it exists: two pods of one attempt."""
    sched = world.scheduler(kind)
    executor = sched.executor
    world.emulator.add_fault(method="POST", path=r"/pods$", persist_then_timeout=True, hang_seconds=8, times=1)
    world.queue(sched)
    row = world.row("t1")
    executor.sync()
    world.sync_until(executor, lambda: executor.task_queue.qsize() == 0 and not getattr(executor, "_carry", None),
                     timeout=15)
    world.settle(executor, 1.0)
    pods = world.live_pods(row)
    if kind == "stock":
        assert len(pods) == 2, "stock 3.4 no longer makes two pods on an ambiguous create"
        assert _attempt_ids(world, *pods) == {row.id}
        return
    assert len(pods) == 1 and _attempt_ids(world, *pods) == {row.id}
    assert row.key in executor.running
    assert not any(state == "failed" for state, _ in executor.event_buffer.values())


@pytest.mark.parametrize("kind", KINDS)
def test_superseded_launchs_pod_never_starts(world, kind):
    """The attempt's pod is Pending when a user clears the task: 3.4 archives the attempt and the
    scheduler queues its successor. Stock 3.4 leaves the Pending pod: it will start, take its
    node's capacity and be turned away only at /run (410, the archived attempt). Fenced: deleted
    within one loop, before it can start."""
    sched = world.scheduler(kind)
    world.queue(sched)
    sched.executor.sync()  # the pod is created and stays Pending
    first = world.row("t1")
    (stale,) = [p.metadata.name for p in world.live_pods(first)]
    cleared = world.airflow.clear(first)
    assert cleared.id != first.id
    assert [a for a in _attempts(world, "t1") if a[0] == first.id][0][2] is None  # archived, kept as a row
    world.queue(sched)  # the successor is queued: a new launch
    sched.executor.sync()  # one loop
    names = {p.metadata.name for p in world.live_pods(first)}
    if kind == "stock":
        assert stale in names, "stock 3.4 no longer leaves the archived attempt's Pending pod"
        status, _ = _run(world, first.id)  # the pod starts: only now is it turned away
        assert status == 410
        return
    assert stale not in names
    assert {d["name"] for d in world.deletes_by(sched, succeeded=True)} == {stale}
    assert world.pod_of(world.row("t1")) in names


@pytest.mark.tasks(*TASKS)
@pytest.mark.parametrize("kind", KINDS)
def test_adoption_burns_no_try(world, kind):
    """A scheduler queued the tasks and died before creating their pods. The peer's
    adopt_or_reset_orphaned_tasks finds no pod: stock 3.4 resets them through
    prepare_db_for_next_try, which archives each never-started attempt and queues a new try.
    Fenced: launched by the peer under the same attempt, try and token."""
    dead = world.scheduler(kind)
    world.queue(dead, trigger=True)
    before = {t: world.row(t) for t in TASKS}
    world.kill(dead)
    peer = world.scheduler(kind)
    reset = peer.adopt_or_reset_orphans()
    after = {t: world.row(t) for t in TASKS}
    if kind == "stock":
        assert reset == len(TASKS), "stock 3.4 no longer resets the dead scheduler's unlaunched tasks"
        for t in TASKS:
            assert after[t].id != before[t].id
            archived = [a for a in _attempts(world, t) if a[0] == before[t].id]
            assert archived and archived[0][2] is None  # the never-started attempt: archived
        return
    assert reset == 0
    for t in TASKS:
        assert (after[t].id, after[t].try_number, after[t].token, after[t].queued_by_job_id) == (
            before[t].id, before[t].try_number, before[t].token, peer.job_id)
        assert [a[0] for a in _attempts(world, t)] == [before[t].id]  # nothing archived
    peer.trigger()
    world.sync_until(peer.executor, lambda: all(world.live_pods(after[t]) for t in TASKS), timeout=10)
    for t in TASKS:
        (pod,) = world.live_pods(after[t])
        assert pod.metadata.annotations[TOKEN_ANNOTATION] == before[t].token
        assert _attempt_ids(world, pod) == {before[t].id}
        assert after[t].key in peer.executor.running
