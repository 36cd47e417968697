"""What a finished pod costs the API server and the database (issue 53).

- The provider's watcher reports a pod's end for every event that shows its terminal phase, and a
  finished pod's deletion brings two more (its deletion timestamp, then DELETED): the stock
  executor sends three deletes per finished pod, two answered 404 (apache/airflow#72803). The
  fenced watcher reports the end once (``watching._repeated_end``): one delete, answered 200.
- The provider reads each finished pod's task state with a query of its own; the fenced loop's
  one statement has read that row already (``EventFence._get_task_instance_state``).

About 5 s per test and backend."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

TASKS = ("a", "b", "c")


def _finish(world, sched, phase: str = "Succeeded") -> list:
    """Queue every task, run its pod, end it in ``phase``; sync until the pods are gone and the
    deletion's own events have reached the executor."""
    world.queue(sched)
    sched.executor.sync()
    rows = [world.row(task) for task in TASKS]
    for row in rows:
        pod = world.pod_of(row)
        world.set_pod_phase(pod, "Running")
        world.set_pod_phase(pod, phase)
    assert world.sync_until(sched.executor, lambda: not world.pods(), timeout=20)
    world.settle(sched.executor, 2.0)
    assert not any(row.key in sched.executor.running for row in rows)
    return rows


@pytest.mark.tasks(*TASKS)
def test_a_finished_pod_is_deleted_once_and_never_answered_404(world, monkeypatch):
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__DELETE_WORKER_PODS", "True")  # the shipped default (worlds: off)
    sched = world.scheduler("fenced")
    _finish(world, sched)
    assert [e.get("code") for e in world.deletes_by(sched)] == [200] * len(TASKS)


@pytest.mark.tasks(*TASKS)
def test_a_finished_pod_costs_no_state_query_of_its_own(world, monkeypatch):
    """The provider's ``SELECT task_instance.state ...`` per finished pod is not sent; the state it
    would have read reaches the event buffer all the same."""
    from airflow import settings

    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__DELETE_WORKER_PODS", "True")
    sched = world.scheduler("fenced")
    lookups: list[str] = []

    def count(conn, cursor, statement, *args):
        if " ".join(statement.split()).startswith("SELECT task_instance.state FROM task_instance WHERE"):
            lookups.append(statement)

    sa.event.listen(settings.engine, "before_cursor_execute", count)
    try:
        rows = _finish(world, sched)
    finally:
        sa.event.remove(settings.engine, "before_cursor_execute", count)
    assert lookups == []
    for row in rows:  # what the provider's query would have answered: the row's state (queued: no worker ran)
        assert sched.executor.event_buffer[row.key][0] == world.row(row.task_id).state


@pytest.mark.tasks(*TASKS)
def test_adopting_orphans_costs_no_statement_per_attribute_and_task(world):
    """airflow-core selects a dead scheduler's task instances with a few columns only; the provider
    and core then read ``queued_by_job_id``, ``try_number``, ``last_heartbeat_at`` and ``dag_run``
    of each, one lazy load per attribute per task instance (stock: four statements per TI). The
    fenced adopter loads them for all in one statement (``orphans.preload``); only ``executor``,
    read by core before it asks the executor, is still loaded per TI."""
    import re
    from collections import Counter

    from airflow import settings

    dead = world.scheduler("fenced")
    world.queue(dead)
    dead.executor.sync()
    world.kill(dead)
    peer = world.scheduler("fenced")
    seen: list[str] = []

    def count(conn, cursor, statement, *args):
        seen.append(" ".join(statement.split()))

    sa.event.listen(settings.engine, "before_cursor_execute", count)
    try:
        assert peer.adopt_or_reset_orphans() == 0
    finally:
        sa.event.remove(settings.engine, "before_cursor_execute", count)
    one_by_one = Counter(m[1] for s in seen
                         if (m := re.match(r"SELECT task_instance\.(\w+) FROM task_instance WHERE task_instance\.id = ", s)))
    assert set(one_by_one) <= {"executor"}, one_by_one
    assert not [s for s in seen if s.startswith("SELECT dag_run.") and "= dag_run.run_id" in s]  # dag_run lazy loads
    for task in TASKS:  # adopted all the same
        row = world.row(task)
        assert row.queued_by_job_id == peer.job_id and row.key in peer.executor.running
        assert world.pod_of(row) and world.live_pods(row)[0].metadata.labels["airflow-worker"] == str(peer.job_id)


def test_a_finished_pods_delete_never_hits_a_newer_pod_under_its_name(world, monkeypatch):
    """The one delete of a finished pod carries that pod object's uid (the watcher saw it): if
    another object holds the name by the time the executor deletes (the pod was deleted and a pod
    of the same name created meanwhile), that object is left alone (409), and the result is not
    retried for ever."""
    import time

    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__DELETE_WORKER_PODS", "True")
    sched = world.scheduler("fenced")
    world.queue(sched)
    sched.executor.sync()
    name = world.pod_of(world.row("t1"))
    body = world.kube.read_namespaced_pod(name, world.namespace)
    world.set_pod_phase(name, "Succeeded")
    watcher_queue = sched.executor.kube_scheduler.watcher_queue
    deadline = time.monotonic() + 10
    while watcher_queue.qsize() == 0 and time.monotonic() < deadline:  # the end is reported, not yet handled
        time.sleep(0.1)
    assert watcher_queue.qsize() > 0
    world.kube.delete_namespaced_pod(name, world.namespace)
    newer = world.kube.create_namespaced_pod(world.namespace, {
        "metadata": {"name": name, "labels": body.metadata.labels, "annotations": body.metadata.annotations},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "base", "image": "x"}]}})
    world.settle(sched.executor, 2.0)
    assert world.kube.read_namespaced_pod(name, world.namespace).metadata.uid == newer.metadata.uid
    assert [e.get("code") for e in world.deletes_by(sched)] == [409]  # once: the precondition held
