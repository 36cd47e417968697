"""Metadata DB outages on the fence paths: a failed read is no evidence.

While the fenced executor cannot read the task rows, nothing is created, deleted, swallowed or
lost, and the heartbeat never raises; once the DB answers again, each path does what it would
have done. The outage is real: the test database refuses new connections and its open ones are
terminated (the next pool checkout's pre-ping fails).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager

from sqlalchemy.exc import OperationalError

from fenced_k8s_executor.names import TOKEN_ANNOTATION


@contextmanager
def db_outage(world, pg_server):
    dbname = world.engine.url.database
    pg_server.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
    pg_server.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{dbname}'")
    try:
        yield
    finally:
        pg_server.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')


def heartbeats(executor, seconds: float) -> None:
    """sync() as the scheduler loop calls it; any exception fails the test."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        executor.sync()
        time.sleep(0.2)


def test_db_outage_before_creation_defers_the_pod_and_loses_no_task(world, pg_server):
    sched = world.scheduler("fenced")
    world.queue(sched)  # the job waits in the task queue; the pre-create check needs the row
    row = world.row("t1")
    with db_outage(world, pg_server):
        heartbeats(sched.executor, 1.5)
        assert world.pods(row) == []
        assert row.key in sched.executor.running
    assert world.sync_until(sched.executor, lambda: len(world.pods(row)) == 1, timeout=10)
    world.settle(sched.executor, 1.0)
    (pod,) = world.pods(row)
    assert pod.metadata.annotations[TOKEN_ANNOTATION] == row.token


def test_db_outage_defers_a_finished_pods_event_and_loses_none(world, pg_server, caplog):
    sched = world.scheduler("fenced")
    world.queue(sched)
    sched.executor.sync()
    row = world.row("t1")
    pod = world.pod_of(row)
    with db_outage(world, pg_server):
        world.set_pod_phase(pod, "Succeeded")
        with caplog.at_level(logging.WARNING, logger="fenced_k8s_executor"):
            assert world.sync_until(sched.executor, lambda: "state-change prefetch failed" in caplog.text, timeout=8)
        heartbeats(sched.executor, 1.0)  # the event is judged, fails to read, and is re-queued
        assert row.key in sched.executor.running
        assert row.key not in sched.executor.event_buffer
    assert world.sync_until(sched.executor, lambda: row.key not in sched.executor.running, timeout=10)
    # Succeeded is state None: the provider reports the row's state (QUEUED: no worker ran here)
    assert sched.executor.event_buffer[row.key] == (world.row("t1").state, None)
    assert world.deletes_by(sched) == []


def test_db_outage_stops_the_sweep_from_deleting(world, pg_server):
    """A whole-DB outage stops the sweep at its advisory lock, before any read."""
    sched = world.scheduler("fenced", sweep_interval="0.3")
    row1, stale = world.cleared_launch_pod(sched)
    with db_outage(world, pg_server):
        heartbeats(sched.executor, 2.0)  # several sweep rounds, each failing at its lock
        assert stale in {p.metadata.name for p in world.pods(row1)}
        assert world.deletes_by(sched) == []
    assert world.sync_until(sched.executor, lambda: stale not in {p.metadata.name for p in world.pods(row1)},
                            timeout=10)
    # the sweep or the loop's reconcile, or both, and nothing else
    assert {d["name"] for d in world.deletes_by(sched, succeeded=True)} == {stale}


def test_a_failed_sweep_read_is_no_evidence(world):
    """The lock held and the page listed, but the rows could not be read: nothing is deleted;
    the next sweep that reads them deletes the stale pod."""
    row1, stale = world.cleared_launch_pod(world.scheduler("fenced", start=False))
    reads = []

    def failing_read(tasks):
        reads.append(list(tasks))
        raise OperationalError("SELECT", {}, Exception("server closed the connection unexpectedly"))

    report = world.sweeper(read_rows=failing_read).run_once()
    assert reads and report.errors and report.deleted == 0
    assert stale in {p.metadata.name for p in world.pods(row1)}
    report = world.sweeper().run_once()
    assert report.deleted == 1
    assert stale not in {p.metadata.name for p in world.live_pods(row1)}
