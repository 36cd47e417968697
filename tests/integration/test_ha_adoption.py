"""Issue 14: HA that burns no try. A dead scheduler's QUEUED tasks whose pods were never created
are launched by the adopter under the same token, instead of being reset by airflow-core's
``adopt_or_reset_orphaned_tasks`` (which archives the never-started try and burns a retry).

All state changes go through airflow-core: the scheduler's critical section queues (and
pre-assigns the tokens), the dead scheduler stops heartbeating, and the peer runs the real
``adopt_or_reset_orphaned_tasks``.
"""

from __future__ import annotations

import pytest

from fenced_k8s_executor.names import TOKEN_ANNOTATION

KINDS = ["stock", "fenced"]
TASKS = ("t1", "t2", "t3")


def _launch_pods(world, peer, rows):
    world.sync_until(peer.executor, lambda: all(world.live_pods(r) for r in rows), timeout=10)
    return {r.task_id: world.live_pods(r) for r in rows}


@pytest.mark.tasks(*TASKS)
@pytest.mark.parametrize("kind", KINDS)
def test_dead_schedulers_queued_unlaunched_tasks_burn_no_try(world, kind):
    dead = world.scheduler(kind)
    world.queue(dead, trigger=True)  # QUEUED (tokens pre-assigned); creation jobs in its task queue
    before = {t: world.row(t) for t in TASKS}
    world.kill(dead)  # it dies before its next sync: no pod was ever created
    peer = world.scheduler(kind)
    reset = peer.adopt_or_reset_orphans()
    after = {t: world.row(t) for t in TASKS}
    if kind == "stock":
        assert reset == len(TASKS), "stock no longer resets the dead scheduler's unlaunched tasks"
        assert all(after[t].id != before[t].id and after[t].state is None for t in TASKS)  # tries archived
        return
    assert reset == 0
    for t in TASKS:  # adopted: same row, same try, same token, now queued by the peer
        assert (after[t].id, after[t].try_number, after[t].token, after[t].state) == (
            before[t].id, before[t].try_number, before[t].token, "queued")
        assert after[t].queued_by_job_id == peer.job_id
    peer.trigger()
    pods = _launch_pods(world, peer, list(after.values()))
    for t in TASKS:
        (pod,) = pods[t]
        assert pod.metadata.annotations[TOKEN_ANNOTATION] == before[t].token
        assert pod.metadata.labels["airflow-worker"] == str(peer.job_id)


@pytest.mark.tasks(*TASKS)
def test_dead_scheduler_waking_mid_adoption_makes_one_pod_per_launch(world):
    dead = world.scheduler("fenced")
    world.queue(dead, trigger=True)
    world.kill(dead)
    peer = world.scheduler("fenced")
    assert peer.adopt_or_reset_orphans() == 0
    peer.trigger()
    # Both now hold a creation job for every launch. The woken scheduler goes first for t1 (its
    # create then races the peer's), its pre-creation check drops the others.
    rows = [world.row(t) for t in TASKS]
    dead.executor.sync()
    peer.executor.sync()
    dead.executor.sync()
    world.settle(peer.executor, 1.0)
    for row in rows:
        pods = world.live_pods(row)
        assert len(pods) == 1, [p.metadata.name for p in pods]
        assert pods[0].metadata.annotations[TOKEN_ANNOTATION] == row.token
    assert all(world.row(t).state == "queued" and world.row(t).id == r.id for t, r in zip(TASKS, rows))


@pytest.mark.tasks(*TASKS)
def test_dead_scheduler_and_adopter_create_concurrently_one_pod_per_launch(world):
    """The woken scheduler passed its pre-creation check before the adoption committed: both
    creates reach the API; the launch's deterministic pod name lets exactly one exist, and the
    adopter (the row names it) watches it."""
    dead = world.scheduler("fenced")
    world.queue(dead, trigger=True)
    rows = [world.row(t) for t in TASKS]
    # The dead scheduler's check runs now (it still owns the rows) and its creates land later.
    real_run_next = dead.executor.kube_scheduler.run_next
    held = []
    dead.executor.kube_scheduler.run_next = held.append
    dead.executor.sync()
    dead.executor.kube_scheduler.run_next = real_run_next
    assert len(held) == len(TASKS)
    world.kill(dead)
    peer = world.scheduler("fenced")
    assert peer.adopt_or_reset_orphans() == 0
    peer.trigger()
    for job in held:  # the woken scheduler's creates land first
        dead.executor.kube_scheduler.run_next(job)
    world.settle(peer.executor, 1.5)
    for row in rows:
        pods = world.live_pods(row)
        assert len(pods) == 1, [p.metadata.name for p in pods]
        assert pods[0].metadata.labels["airflow-worker"] == str(peer.job_id)  # the adopter watches it
        assert row.key in peer.executor.running


@pytest.mark.tasks(*TASKS)
def test_legacy_queued_tasks_of_a_dead_stock_scheduler_are_reset_as_stock(world):
    dead = world.scheduler("stock")
    world.queue(dead, trigger=True)
    before = {t: world.row(t) for t in TASKS}
    assert all(before[t].token is None for t in TASKS)  # the stock executor pre-assigns nothing
    world.kill(dead)
    peer = world.scheduler("fenced")
    assert peer.adopt_or_reset_orphans() == len(TASKS)
    after = {t: world.row(t) for t in TASKS}
    assert all(after[t].id != before[t].id and after[t].state is None for t in TASKS)
