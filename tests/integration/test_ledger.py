"""The ledger's reads on real PostgreSQL: the constant statement it sends there finds exactly what
the portable SQLAlchemy read finds (rows by task, across a clear's new row id; launches in flight
whose task's row no longer names them), and returns nothing for launches that did not change."""

from __future__ import annotations

import dataclasses
import re
import uuid

import pytest

from fenced_k8s_executor import ledger


@pytest.fixture(params=["psycopg2", "psycopg"])
def driver(request, monkeypatch):
    """The reads on each PostgreSQL driver: psycopg2 (the lab's URLs) and psycopg 3, which
    SQLAlchemy 2.1 picks for a plain ``postgresql://`` URL such as the official chart writes (and
    which binds parameters on the server, where a query string of two commands is refused)."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from airflow import settings

    if settings.engine.dialect.driver == request.param:  # the world's own (conftest.world_driver)
        yield settings.engine
        return
    engine = create_engine(settings.engine.url.set(drivername=f"postgresql+{request.param}"), poolclass=NullPool)
    monkeypatch.setattr(settings, "engine", engine)
    try:
        yield engine
    finally:
        engine.dispose()


def _portable(tasks: list) -> dict:
    from airflow import settings

    wanted = {tuple(t) for t in tasks}
    return ledger._rows_of(ledger._read_portable(wanted), wanted)


def test_postgresql_read_finds_what_the_portable_read_finds(metadata_db, airflow, driver):
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
        raw = ledger._read_postgresql_loop(settings.engine, {tuple(t) for t in tasks}, [], None, False)[0]
        assert len(raw) == 5  # one row per task: the live attempt only
        assert set(rows) == {(dag_id, t, r, -1) for t in ("a", "b") for r in (run1, run2)} | {(dag_id, "c", run1, -1)}
        assert rows[(dag_id, "a", run1, -1)].ti_id == cleared.id
        assert rows[(dag_id, "b", run2, -1)].ti_id == airflow.row(dag_id, "b", run2).id
        assert ledger.read_rows([None]) == {}
    finally:
        airflow.retire(dag_id)


def test_reads_borrow_nothing_from_airflows_pool_and_return_their_connections_transactional(metadata_db):
    """The fences' reads run on a pool of their own (``db``): Airflow's pool hands them nothing, so
    an autocommit connection can never reach Airflow's sessions. Their own connections go back
    transactional and idle, at the default level (the sweep's lock and the deployment's
    transactions borrow them next; an explicit level makes psycopg2 send a SET on every later
    autocommit switch); the loop's reader keeps its one in autocommit, no transaction open between
    reads."""
    from sqlalchemy import event

    from airflow import settings

    from fenced_k8s_executor import db, ledger

    borrowed, returned = [], []  # Airflow's checkouts; the fences' connections as they went back

    def on_checkout(dbapi, record, proxy):
        borrowed.append(dbapi)

    def on_checkin(dbapi, record):
        if dbapi is not None:
            returned.append((dbapi.autocommit, dbapi.get_transaction_status(), dbapi.isolation_level))

    event.listen(settings.engine.pool, "checkout", on_checkout)
    event.listen(db.engine().pool, "checkin", on_checkin)
    try:
        assert ledger.read_rows([("no_such_dag", "a", "no-such-run", -1)]) == {}
        reads = ledger.InFlightReads()
        assert reads.read([("no_such_dag", "a", "no-such-run", -1)]).rows == {}
        held = reads._held.connection.dbapi_connection
        assert held.autocommit is True  # kept in autocommit while held
        assert held.get_transaction_status() == 0  # no transaction left open between reads
        reads.close()
    finally:
        event.remove(settings.engine.pool, "checkout", on_checkout)
        event.remove(db.engine().pool, "checkin", on_checkin)
    assert borrowed == []
    # psycopg2's TRANSACTION_STATUS_IDLE, the default level: the one-off read's, then the reader's
    assert returned == [(False, 0, None), (False, 0, None)]


def test_reader_dropped_without_end_leaves_no_autocommit_connection_in_either_pool(metadata_db):
    """An executor dropped without ``end()`` (a test's, or one a crash left behind) must not hand
    its reader's autocommit connection to a transaction: a transaction-scoped advisory lock taken
    on it (the sweep's) would end with its statement, and so would the row locks of the
    scheduler's critical section. Nor may one-off reads. Found in the matrix: a sweep took the lock
    its peer held."""
    import gc

    from sqlalchemy import text

    from airflow import settings

    from fenced_k8s_executor import db, ledger

    pool = settings.engine.pool
    reads = ledger.InFlightReads()
    reads.read([("no_such_dag", "a", "no-such-run", -1)])
    held = reads._held.connection.dbapi_connection
    del reads
    for _ in range(3):  # one-off reads (the sweep's, the pre-create check's)
        ledger.read_rows([("no_such_dag", "a", "no-such-run", -1)])
    gc.collect()

    sessions = [settings.Session.session_factory() for _ in range(pool.size() + 1)]
    try:
        for session in sessions:  # every connection of Airflow's pool
            session.execute(text("SELECT 1"))
            dbapi = session.connection().connection.dbapi_connection
            assert dbapi is not held and dbapi.autocommit is False
    finally:
        for session in sessions:
            session.close()
    with db.bounded_connection() as first:  # the fences' own: the reader's among them (the pool is LIFO)
        assert first.connection.dbapi_connection.autocommit is False
        assert first.execute(text("SELECT pg_try_advisory_xact_lock(4242)")).scalar() is True
        with db.bounded_connection() as second:
            assert first.execute(text("SELECT 1")).scalar() == 1
            # the first transaction's lock outlives its statements
            assert second.execute(text("SELECT pg_try_advisory_xact_lock(4242)")).scalar() is False


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

        rows, _, _ = ledger._read_postgresql_loop(streaming, set(tasks), [], None, False)

        assert sorted(task for _, task, _, _ in rows) == ["a", "b", "c"]
    finally:
        airflow.retire(dag_id)


def _prepared(reads) -> bool:
    """Whether the idle loop's statement is prepared on the connection the reader holds (the pool
    record's info says so)."""
    return bool(reads._held.connection.info.get(ledger.PREPARED_DIGEST))


def _launch(row, token=None, task=None):
    from fenced_k8s_executor.launch import LaunchIdentity

    dag_id, task_id, run_id, map_index = task or (row.dag_id, row.task_id, row.run_id, row.map_index)
    return LaunchIdentity(ti_id=row.id, token=token or row.token, try_number=row.try_number, dag_id=dag_id,
                          task_id=task_id, run_id=run_id, map_index=map_index)


@pytest.mark.tasks("t1", "t2", "t3")
def test_the_loop_read_returns_only_the_launches_whose_row_changed(world, driver):
    """``InFlightReads.read`` on real PostgreSQL, against the portable reading of the same rows: the
    tasks asked for whole; of the launches in flight only those whose task's row no longer names
    them (its row, or None when the task is gone), whatever their row id. In a loop where nothing
    moved, the statement returns the live set's digest alone; a change makes it fetch the tokens."""
    from airflow import settings

    from fenced_k8s_executor import ledger

    sched = world.scheduler("fenced", start=False)
    world.queue(sched, trigger=False)  # the critical section pre-assigns the tokens
    t1, t2, t3 = (world.row(t) for t in ("t1", "t2", "t3"))
    other, elsewhere = "0" * 8 + "-0000-4000-8000-" + "0" * 12, "0" * 8 + "-0000-4000-8000-" + "0" * 11 + "1"
    cleared = world.airflow.clear(t3)  # new id, token wiped: the launch of t3 is no longer named
    assert cleared.id != t3.id and cleared.token is None
    task = lambda row: (row.dag_id, row.task_id, row.run_id, row.map_index)  # noqa: E731
    gone = _launch(t1, token=elsewhere, task=(world.dag_id, "no_such_task", world.run_id, -1))
    gone = dataclasses.replace(gone, ti_id=str(uuid.uuid4()))
    # A pod whose TI id names another task than its annotations: judged by its own task's row.
    mixed = _launch(t1, token=str(uuid.uuid4()), task=task(t2))
    launches = [_launch(t1), _launch(t2, token=other), _launch(t3), gone, mixed]
    reads = ledger.InFlightReads()
    trips = ledger.ROUND_TRIPS

    reading = reads.read([task(t1)], launches)
    portable = ledger._read_portable_loop({task(t1)}, {x.token: x for x in launches})

    assert reading == portable
    assert set(reading.rows) == {task(t1)} and reading.rows[task(t1)].token == t1.token
    assert set(reading.changed) == {other, t3.token, elsewhere, mixed.token}  # t1's launch is current
    assert reading.changed[other].ti_id == t2.id
    assert reading.changed[t3.token].ti_id == cleared.id  # found by its key, whatever its id
    assert reading.changed[elsewhere] is None  # the task is gone
    assert reading.changed[mixed.token].ti_id == t2.id  # its own task's row, not t1's
    assert t1.token in reads._live and t2.token in reads._live and t3.token not in reads._live
    assert ledger.ROUND_TRIPS - trips == 1  # the first read asked every launch outside the (unknown) set by key

    trips = ledger.ROUND_TRIPS
    again = reads.read([], launches)  # nothing moved: the digest alone, and the outsiders by key
    assert again.changed == reading.changed and ledger.ROUND_TRIPS - trips == 1
    assert reads.read([], [_launch(t1)]).changed == {}

    world.airflow.clear(t1)  # the live set moves: t1's launch left it; found within this read
    moved = reads.read([], [_launch(t1)])
    assert set(moved.changed) == {t1.token} and t1.token not in reads._live


@pytest.mark.tasks("t1", "t2")
def test_idle_loop_statement_is_prepared_once_and_sent_plain_where_a_pooler_drops_it(world, driver):
    """An idle loop sends the digest alone, prepared once on the reader's own connection (planning
    it cost more than running it). A pooler in transaction mode hands the next statement another
    server connection, where the prepared statement does not exist: the read still answers, and
    from then on the statement goes unprepared."""
    from fenced_k8s_executor import db, ledger

    sched = world.scheduler("fenced", start=False)
    world.queue(sched, trigger=False)
    t1, t2 = world.row("t1"), world.row("t2")
    launches = [_launch(t1), _launch(t2)]
    # A new connection: an earlier test's fenced scheduler may have given back to the fences' pool
    # one where the statement is prepared already (then nothing is prepared again, rightly).
    db.dispose()
    reads = ledger.InFlightReads()
    prepares = ledger.PREPARES
    assert reads.read([], launches).changed == {}  # the live set unknown: both asked by key, and the digest
    assert reads.read([], launches).changed == {} and _prepared(reads)  # idle: the digest alone, prepared
    assert reads.read([], launches).changed == {} and ledger.PREPARES - prepares == 1  # once per connection
    held = reads._held.connection.dbapi_connection
    with held.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE name = %s", (ledger.PREPARED_DIGEST,))
        assert cursor.fetchone()[0] == 1

    world.airflow.clear(t1)  # the live set moves: found through the prepared statement
    assert set(reads.read([], launches).changed) == {t1.token}

    with held.cursor() as cursor:  # what a pooler's next server connection looks like
        cursor.execute(f"DEALLOCATE {ledger.PREPARED_DIGEST}")
    world.airflow.clear(t2)
    assert set(reads.read([], [_launch(t2)]).changed) == {t2.token}  # answered, unprepared
    assert not reads._prepare
    reads.close()


def _index_scan(plan: str) -> bool:
    return "Seq Scan on task_instance" not in plan and re.search(r"Index (Only )?Scan using \w+ on task_instance", plan) is not None


@pytest.mark.tasks("t1", "t2")
def test_the_loop_statement_finds_the_live_set_through_an_index_whatever_the_planner_estimates(world, driver):
    """Right after a mass update, before autovacuum analyses ``task_instance``, the planner believed
    most rows were live and scanned the whole table every loop (the bench's dead scheduler's 1,000
    pods: 5x stock's loop). Here the session's costs make any index scan look dearer than reading
    the table, as stale statistics did: the statement the reader sends, plain or prepared, still
    takes one of airflow-core's indexes (``ti_state``; 3.4's ``ti_current_state``), and still answers."""
    from airflow import settings

    from fenced_k8s_executor import ledger

    sched = world.scheduler("fenced", start=False)
    world.queue(sched, trigger=False)
    t1, t2 = world.row("t1"), world.row("t2")
    launches = [_launch(t1), _launch(t2)]
    reads = ledger.InFlightReads()
    assert reads.read([], launches).changed == {}
    held = reads._held.connection
    with held.dbapi_connection.cursor() as cursor:
        cursor.execute("SET random_page_cost = 1000000")  # session-wide: what stale statistics do to the estimate
        cursor.execute("EXPLAIN " + ledger._loop_statement(settings.engine, ledger.DIGEST_ONLY), {"count": -1, "sum": "-1"})
        assert "Seq Scan on task_instance" in "\n".join(row[0] for row in cursor.fetchall())  # the premise

    plan = "\n".join(row[0] for row in ledger._execute(
        held, "EXPLAIN " + ledger._loop_statement(settings.engine, ledger.DIGEST_ONLY), {"count": -1, "sum": "-1"}))
    assert _index_scan(plan)

    assert reads.read([], launches).changed == {} and _prepared(reads)  # the idle loop's prepared statement
    with ledger._cursor(held.dbapi_connection) as cursor:
        plan = "\n".join(row[0] for row in ledger._rows(
            cursor, f"{ledger.plan()}EXPLAIN EXECUTE {ledger.PREPARED_DIGEST}(-1, '-1')", {}))
    assert _index_scan(plan)
    world.airflow.clear(t1)
    assert set(reads.read([], launches).changed) == {t1.token}
    with held.dbapi_connection.cursor() as cursor:
        cursor.execute("RESET random_page_cost")  # the connection goes back to the fences' pool
    reads.close()


def _task(row) -> tuple:
    return (row.dag_id, row.task_id, row.run_id, row.map_index)


@pytest.mark.tasks("t1", "t2")
def test_the_by_key_probes_take_the_task_index_with_the_region_a_uuid_value(world, driver):
    """The probes by task key (the rows asked for whole, the launches outside the live set) take
    one of airflow-core's indexes, with costs that make any index look dear (as in the test
    above). On Airflow 3.4 the statement compares ``region_id`` with ``uuid`` values parsed in
    Python (``_region_id``), never with pod text cast in SQL: an index condition as before (on a
    table of realistic size, both spellings take ``task_instance_try_key`` on all five key
    columns, ``EXPLAIN ANALYZE``: the same buffers); on this small table the planner filters."""
    from airflow import settings

    from fenced_k8s_executor import db, provider_compat

    sched = world.scheduler("fenced", start=False)
    world.queue(sched, trigger=False)
    t1, t2 = world.row("t1"), world.row("t2")
    params = {"key_tokens": [str(uuid.uuid4())], "count": -1, "sum": "-1",
              **ledger._key_params([_task(t1)]), **ledger._key_params([_task(t2)], "key_")}
    statement = "EXPLAIN " + ledger._loop_statement(settings.engine, frozenset("ok"))
    with db.autocommit() as conn:
        with conn.dbapi_connection.cursor() as cursor:
            cursor.execute("SET random_page_cost = 1000000")
        try:
            plan = "\n".join(row[0] for row in ledger._execute(conn, statement, params))
        finally:
            with conn.dbapi_connection.cursor() as cursor:
                cursor.execute("RESET random_page_cost")
    assert _index_scan(plan), plan
    region = provider_compat.task_columns().region
    if region is not None:  # 3.4: uuid against uuid, nothing cast
        assert re.search(rf"\({region.name} = w\.region_id\)", plan) and "::uuid" not in plan, plan


@pytest.mark.tasks("t1")
def test_a_region_that_is_no_uuid_costs_its_pod_alone(world, driver):
    """No statement casts text that came from a pod (issue 45): the loop's one statement used to
    cast a pod's region annotation with ``::uuid`` on Airflow 3.4, so one pod whose region was not
    a UUID failed the statement every loop, for every launch of every scheduler. Each region is
    parsed in Python now: text that is not a UUID names no row, for that pod alone (``from_pod_
    metadata`` refuses such a pod before it gets here), and the other launches are answered.
    Before 3.4 no row has a region, and the statement compares none."""
    from fenced_k8s_executor import provider_compat
    from fenced_k8s_executor.launch import LaunchIdentity

    sched = world.scheduler("fenced", start=False)
    world.queue(sched, trigger=False)
    t1 = world.row("t1")
    hostile = ["not-a-uuid", "00000000-0000-0000-0000-00000000000g", "'; SELECT 1; --", "x" * 5000, "-1"]
    pods = [LaunchIdentity(ti_id=str(uuid.uuid4()), token=str(uuid.uuid4()), try_number=1, dag_id=t1.dag_id,
                           task_id=t1.task_id, run_id=t1.run_id, map_index=-1, region=region) for region in hostile]
    reads = ledger.InFlightReads()
    try:
        for _ in range(2):  # the live set unknown, then known: the hostile launches asked by key both times
            reading = reads.read([p.task for p in pods] + [_task(t1)], [_launch(t1)] + pods)
            assert reading.rows == {_task(t1): reading.rows[_task(t1)]} and reading.rows[_task(t1)].token == t1.token
            assert set(reading.changed) == {p.token for p in pods}  # t1's launch is current
            for row in reading.changed.values():  # 3.4: no row; before: judged by the other four
                assert row is None if provider_compat.task_columns().region is not None else row.ti_id == t1.id
        assert ledger.read_rows([p.task for p in pods]) == {}
    finally:
        reads.close()
