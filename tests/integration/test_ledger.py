"""ledger.read_rows on real PostgreSQL: the constant array statement it sends there finds exactly
the rows the portable SQLAlchemy read finds (by task, across a clear's new row id)."""

from __future__ import annotations

import uuid

import pytest

from fenced_k8s_executor import ledger


def _portable(tasks: list) -> dict:
    from airflow import settings

    wanted = {tuple(t) for t in tasks}
    return ledger._rows_of(ledger._read_portable(settings.engine, wanted), wanted)


def test_postgresql_read_finds_what_the_portable_read_finds(metadata_db, airflow):
    from airflow import settings

    assert settings.engine.dialect.name == "postgresql"
    dag_id = f"ledger_{uuid.uuid4().hex[:8]}"
    airflow.add_dag(dag_id, ["a", "b", "c"])
    try:
        run1, run2 = airflow.create_run(dag_id), airflow.create_run(dag_id)
        before = airflow.row(dag_id, "a", run1)
        # The task keeps its key, gets a new id; Airflow 3.4 keeps the old attempt as a row of its own.
        cleared = airflow.next_try(before)
        assert cleared.id != before.id
        tasks = [(dag_id, t, r, -1) for t in ("a", "b") for r in (run1, run2)]
        tasks += [(dag_id, "c", run1, -1), (dag_id, "missing", run1, -1), (dag_id, "a", "no-such-run", -1),
                  ("no_such_dag", "a", run1, -1), (dag_id, "a", run2, 3)]

        rows = ledger.read_rows(tasks)

        assert rows == _portable(tasks)
        raw = ledger._read_postgresql(settings.engine, sorted({tuple(t) for t in tasks}))
        assert len(raw) == len({(r[5], r[6], r[7], r[8]) for r in raw}) == 5  # the live attempt only
        assert set(rows) == {(dag_id, t, r, -1) for t in ("a", "b") for r in (run1, run2)} | {(dag_id, "c", run1, -1)}
        assert rows[(dag_id, "a", run1, -1)].ti_id == cleared.id
        assert rows[(dag_id, "b", run2, -1)].ti_id == airflow.row(dag_id, "b", run2).id
        assert ledger.read_rows([None]) == {}
    finally:
        airflow.retire(dag_id)


def test_postgresql_read_runs_without_a_transaction_and_returns_the_connection_as_it_found_it(metadata_db):
    """Autocommit spares psycopg2's BEGIN and ROLLBACK round trips; the pooled connection must
    go back to Airflow's sessions exactly as it was (transactional, default isolation level)."""
    from sqlalchemy import event

    from airflow import settings

    used = []

    def on_statement(conn, cursor, statement, parameters, context, executemany):
        used.append((cursor.connection, cursor.connection.autocommit))

    event.listen(settings.engine, "before_cursor_execute", on_statement)
    try:
        assert ledger.read_rows([("no_such_dag", "a", "no-such-run", -1)]) == {}
    finally:
        event.remove(settings.engine, "before_cursor_execute", on_statement)

    (dbapi_connection, autocommit), = used
    assert autocommit is True
    assert dbapi_connection.autocommit is False
    assert dbapi_connection.get_transaction_status() == 0  # psycopg2 TRANSACTION_STATUS_IDLE
    # The default level, as found: an explicit one makes psycopg2 send a SET on every later
    # autocommit switch of this connection (the pool's pre-ping included).
    assert dbapi_connection.isolation_level is None


def test_postgresql_read_misses_no_row_when_the_engine_streams_results(metadata_db, airflow):
    """A deployment may turn on server-side cursors (``stream_results``) in its engine options;
    SQLAlchemy then reads a row ahead, and a raw fetch after it would read that task as gone."""
    from airflow import settings

    dag_id = f"ledger_{uuid.uuid4().hex[:8]}"
    airflow.add_dag(dag_id, ["a", "b", "c"])
    try:
        run = airflow.create_run(dag_id)
        tasks = sorted((dag_id, t, run, -1) for t in ("a", "b", "c"))
        streaming = settings.engine.execution_options(stream_results=True)

        rows = ledger._read_postgresql(streaming, tasks)

        assert sorted(row[6] for row in rows) == ["a", "b", "c"]
    finally:
        airflow.retire(dag_id)


@pytest.mark.tasks("t1", "t2", "t3")
def test_the_loop_read_with_peers_returns_only_what_may_be_stale_and_who_is_running(world):
    """``read_with_peers`` on real PostgreSQL, against the portable reading of the same rows: our
    tasks whole; a peer's launch only when its creator is not running and its task's row does not
    name its token (its row, or None when the task is gone); the running creators. Liveness is
    airflow-core's own Job rows: a live one, one stopped (``success``), one replaced by a newer
    running job on its host."""
    from datetime import timedelta

    from airflow.utils import timezone

    from fenced_k8s_executor import ledger
    from fenced_k8s_lab.core import Scheduler

    queuer = world.scheduler("fenced", start=False)
    world.queue(queuer, trigger=False)  # the critical section pre-assigns the tokens
    t1, t2, t3 = (world.row(t) for t in ("t1", "t2", "t3"))
    live, replaced, newer = (Scheduler.new_job(hostname=h) for h in ("host-live", "host-r", "host-r"))
    stopped = Scheduler(Scheduler.new_job(hostname="host-stopped"), [])
    stopped.stop()
    task = lambda row: (row.dag_id, row.task_id, row.run_id, row.map_index)  # noqa: E731
    gone = (world.dag_id, "no_such_task", world.run_id, -1)
    other = "0" * 8 + "-0000-4000-8000-" + "0" * 12
    peers = [(task(t1), t1.token, live.id),  # current, creator running
             (task(t2), other, live.id),  # stale, but its creator runs: its own business
             (task(t2), other, stopped.job.id),  # stale, creator stopped
             (task(t3), t3.token, stopped.job.id),  # current
             (gone, other, replaced.id),  # task gone, creator replaced on its host
             (task(t1), other, None),  # no creator id: always looked at
             (task(t3), other, newer.id)]  # stale, creator running (the newest on its host)
    since = timezone.utcnow() - timedelta(seconds=60)
    from airflow import settings

    reading = ledger.read_with_peers([task(t1)], peers, since)
    portable = ledger._read_portable_with_peers(settings.engine, {task(t1)}, set(peers), since)

    assert reading == portable
    assert reading.running == {live.id, newer.id}
    assert set(reading.rows) == {task(t1)} and reading.rows[task(t1)].token == t1.token
    assert set(reading.superseded) == {(task(t2), other), (gone, other), (task(t1), other)}
    assert reading.superseded[(gone, other)] is None
    assert reading.superseded[(task(t2), other)].ti_id == t2.id
    nobody = ledger.read_with_peers([], peers, timezone.utcnow() + timedelta(seconds=5))
    assert nobody.running == set()  # every heartbeat older than asked: nobody is running
    assert (task(t3), other) in nobody.superseded and (task(t3), t3.token) not in nobody.superseded
    for job in (live, replaced, newer):
        Scheduler(job, []).stop()
