"""The fences' DB connections against what networks and servers do to connections (issue 45, item
3): a NAT hop that forgets an idle flow, a server that closes an idle connection, a table locked
behind a migration. Each costs a fence statement its bound (``fenced_k8s_executor.db``), never a
scheduler loop of a quarter of an hour, and nothing is deleted on the way; the next read runs on a
fresh connection. On psycopg2 and on psycopg 3 (what SQLAlchemy 2.1 picks for the chart's plain
``postgresql://`` URL).

A read that must not block runs in a thread under a watchdog (``WATCHDOG``): on code without the
bounds the thread is still blocked when the watchdog gives up, and the test fails saying so.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from contextlib import contextmanager

import pytest

from fenced_k8s_executor import db, ledger, sqlstate
from fenced_k8s_executor.launch import LaunchIdentity

#: Seconds a read may take before the test calls it blocked: several times the largest bound (a
#: dead flow costs a statement ``db.TCP_USER_TIMEOUT_MS``), and far below what Linux's
#: retransmissions take (about 15 minutes).
WATCHDOG = 60.0
DRIVERS = ["psycopg2", "psycopg"]
NO_TASK = ("no_such_dag", "a", "no-such-run", -1)


def _within(seconds: float, **calls) -> dict[str, tuple[bool, object]]:
    """Run each call in a thread of its own, all at once: by name, (finished within ``seconds``,
    its result or the exception it raised)."""
    outcomes: dict = {}

    def run(name: str, call) -> None:
        try:
            outcomes[name] = call()
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcomes[name] = error

    threads = {name: threading.Thread(target=run, args=(name, call), name=f"bounded-{name}", daemon=True)
               for name, call in calls.items()}
    for thread in threads.values():
        thread.start()
    deadline = time.monotonic() + seconds
    for thread in threads.values():
        thread.join(max(0.0, deadline - time.monotonic()))
    return {name: (not thread.is_alive(), outcomes.get(name)) for name, thread in threads.items()}


def _engine(url: str):
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    return create_engine(url, poolclass=NullPool)


@pytest.fixture(params=DRIVERS)
def driver(request):
    return request.param


@pytest.fixture
def airflow_engine(metadata_db, driver, monkeypatch):
    """Airflow's engine on the driver under test (the fences build theirs from it)."""
    from airflow import settings

    if settings.engine.dialect.driver == driver:
        yield settings.engine
    else:
        engine = _engine(settings.engine.url.set(drivername=f"postgresql+{driver}"))
        monkeypatch.setattr(settings, "engine", engine)
        yield engine
        engine.dispose()
    db.dispose()


@pytest.fixture
def hop(metadata_db, pg_server, driver):
    """A NAT hop between the fences and PostgreSQL (``fenced_k8s_lab.hop``): Airflow's engine, from
    which the fences build theirs, reaches the metadata DB through it. Airflow's own sessions keep
    their direct connections, as a scheduler's would where only the fences' flow was forgotten.

    Requested before ``world``, so that its schedulers are stopped while the hop is up, and
    Airflow's engine is restored before the hop goes: once the hop's address is gone, a stray
    connect to it would leave by the default route."""
    from airflow import settings

    from fenced_k8s_lab.hop import NatHop, skip_reason

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with NatHop({"postgres": ("127.0.0.1", pg_server.port)}) as nat:
        engine = _engine(nat.url("postgres", metadata_db.url.database, driver))
        original, settings.engine = settings.engine, engine
        nat.engine = engine  # ``world`` puts it back after opening Airflow's ORM on the driver
        try:
            yield nat
        finally:
            nat.sever()  # a read the watchdog gave up on fails now, not in 15 minutes
            settings.engine = original
            db.dispose()
            engine.dispose()


@pytest.fixture
def world(metadata_db, airflow, emulator_session, tmp_path, monkeypatch, request, world_opener):
    """The integration world on the emulator only: the bounds are the database's matter. Airflow's
    ORM on the test's driver; opening it reconfigures Airflow's engine, so the hop's goes back in
    after (else the fences would build theirs on a direct connection, and no flow of theirs would
    cross the hop)."""
    from airflow import settings

    open_world, tasks_of = world_opener
    emulator_session.reset()
    task_ids, dag_kwargs = tasks_of(request)
    driver = request.getfixturevalue("driver") if "driver" in request.fixturenames else None
    with open_world(emulator_session, metadata_db, airflow, tmp_path, monkeypatch, task_ids, dag_kwargs,
                    driver=driver) as w:
        if "hop" in request.fixturenames:
            settings.engine = request.getfixturevalue("hop").engine
            db.dispose()
        yield w
    emulator_session.clear_faults()


@pytest.fixture
def check_errors(count_metric):
    """The ``fence_check.error`` metrics counted in this process, by path."""
    return count_metric("fence_check.error", "path")


def _client_port(reads: ledger.InFlightReads) -> int:
    """The local port of the connection the loop's reader holds."""
    fd = reads._held.connection.dbapi_connection.fileno()
    with socket.socket(fileno=socket.dup(fd)) as sock:
        return sock.getsockname()[1]


def _backend_pid(reads: ledger.InFlightReads) -> int:
    with reads._held.connection.dbapi_connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _launch(task=NO_TASK, token: str | None = None) -> LaunchIdentity:
    dag_id, task_id, run_id, map_index = task
    return LaunchIdentity(ti_id=str(uuid.uuid4()), token=token or str(uuid.uuid4()), try_number=1, dag_id=dag_id,
                          task_id=task_id, run_id=run_id, map_index=map_index)


def test_a_black_holed_idle_flow_costs_one_loop_its_bound_and_the_next_loop_reads_afresh(
        hop, world, check_errors, monkeypatch):
    """The review's probe, through the whole loop: a launch is in flight and the scheduler loop
    reads its row every loop; between two loops the NAT hop forgets the fences' idle flow (its
    idle spell shorter than ``db.IDLE_SPELL``, so the loop sends its statement straight into the
    dead flow). That loop ends within the bound, reports a failed check and deletes nothing; the
    next loops read on a fresh flow, and they still fence: the launch superseded by a clear loses
    its pod. Before the bounds the loop's read stayed blocked (the watchdog's 60 s; Linux's
    retransmissions, about 15 minutes)."""
    monkeypatch.setattr(db, "IDLE_SPELL", 3600.0)  # the flow dies between two busy loops
    sched = world.scheduler("fenced")
    world.queue(sched)
    sched.executor.sync()  # the pod is created; the loop reads its launch's row from now on
    first = world.row("t1")
    pod = world.pod_of(first)
    sched.executor.sync()  # a loop's read: the flow is used, then idle
    forgotten = hop.forget()
    assert forgotten, "the fences had no flow through the hop"

    finished, _ = _within(WATCHDOG, sync=sched.executor.sync)["sync"]
    if not finished:
        hop.sever()  # the blocked loop fails now, and the scheduler can be stopped

    assert finished, f"the scheduler loop was still blocked after {WATCHDOG:.0f} s on a flow the hop had forgotten"
    assert check_errors and set(check_errors) <= {"reconcile", "pre_create"}  # reported, and nothing else
    assert world.deletes_by(sched) == [] and pod in {p.metadata.name for p in world.live_pods(first)}

    world.airflow.clear(first)  # the launch is superseded: only a loop that reads can tell
    world.queue(sched)
    assert world.sync_until(sched.executor, lambda: pod not in {p.metadata.name for p in world.live_pods(first)})
    assert hop.flows() - forgotten, "the loop read on no new flow"
    assert [d["name"] for d in world.deletes_by(sched, succeeded=True)] == [pod]


def test_after_an_idle_spell_the_pools_ping_meets_the_dead_flow_and_the_read_succeeds_afresh(
        hop, airflow_engine, monkeypatch):
    """The same dead flow found by the checkout that follows an idle spell: the held connection
    went back to the pool, whose pre-ping (Airflow's ``sql_alchemy_pool_pre_ping``) meets the dead
    flow within the bound and replaces the connection, and the loop's read succeeds on a new flow.
    With a 2 s ``tcp_user_timeout`` (the mechanism; the named test above runs the shipped bound)."""
    monkeypatch.setattr(db, "TCP_USER_TIMEOUT_MS", 2_000)
    db.dispose()  # built again with it
    reads = ledger.InFlightReads()
    try:
        assert reads.read([NO_TASK], [_launch()]).rows == {}
        old = _client_port(reads)
        assert hop.forget() >= {old}
        monkeypatch.setattr(db, "IDLE_SPELL", 0.0)  # the next read comes after an idle spell

        finished, outcome = _within(WATCHDOG, read=lambda: reads.read([NO_TASK], [_launch()]))["read"]

        assert finished, f"the read was still blocked after {WATCHDOG:.0f} s on a flow the hop had forgotten"
        assert isinstance(outcome, ledger.Reading) and outcome.rows == {}, outcome
        assert _client_port(reads) != old and _client_port(reads) in hop.flows()
    finally:
        reads.close()


@pytest.mark.tasks("t1")
def test_the_loops_connection_is_pinged_after_an_idle_spell_and_recycled_at_its_age(
        world, pg_server, airflow_engine, monkeypatch):
    """A server that closes an idle connection (a restart, a failover, a pooler's idle timeout):
    after an idle spell the pool's pre-ping finds it closed and the read goes on on a new one;
    within a busy spell the closed connection fails one read, and the next connects anew.
    ``sql_alchemy_pool_recycle``: once the held connection is older, the next read replaces it,
    and the idle loop's statement is prepared again on the new one."""
    sched = world.scheduler("fenced", start=False)
    world.queue(sched, trigger=False)  # the critical section pre-assigns t1's token: a launch in the live set
    row = world.row("t1")
    launches = ledger.probe([_launch((row.dag_id, row.task_id, row.run_id, row.map_index), token=row.token)])
    reads = ledger.InFlightReads()
    try:
        assert reads.read([], launches).changed == {}
        first = _backend_pid(reads)
        pg_server.execute(f"SELECT pg_terminate_backend({first})")
        monkeypatch.setattr(db, "IDLE_SPELL", 0.0)  # idle: pinged at the next checkout
        assert reads.read([], launches).changed == {}
        second = _backend_pid(reads)
        assert second != first

        monkeypatch.setattr(db, "IDLE_SPELL", 3600.0)  # busy: used as held
        assert reads.read([], launches).changed == {} and _backend_pid(reads) == second
        pg_server.execute(f"SELECT pg_terminate_backend({second})")
        with pytest.raises(Exception) as closed:
            reads.read([], launches)
        assert sqlstate.of(closed.value) in (None, "57P01")  # the server's admin shutdown, or the dropped connection
        assert reads.read([], launches).changed == {}
        third = _backend_pid(reads)
        assert third not in (first, second)
        assert reads.read([], launches).changed == {} and _backend_pid(reads) == third  # kept while busy

        monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_RECYCLE", "0")  # every connection is too old
        db.dispose()
        prepares, pids = ledger.PREPARES, []
        for _ in range(3):  # idle loops: the digest alone, prepared on each connection
            assert reads.read([], launches).changed == {}
            pids.append(_backend_pid(reads))
        assert len(set(pids)) == 3 and third not in pids
        assert ledger.PREPARES - prepares == 3
    finally:
        reads.close()
        db.dispose()


@contextmanager
def _table_locked(pg_server, database: str):
    """``task_instance`` locked ACCESS EXCLUSIVE by another session (a migration's ``ALTER TABLE``):
    every read of it queues behind the lock until it is released."""
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=pg_server.port, user="postgres", dbname=database)
    try:
        with conn.cursor() as cursor:
            cursor.execute("LOCK TABLE task_instance IN ACCESS EXCLUSIVE MODE")
        yield
    finally:
        conn.rollback()
        conn.close()


def test_a_fence_statement_queued_behind_a_lock_fails_within_its_bound(metadata_db, pg_server, airflow_engine):
    """``statement_timeout`` in each statement's own transaction: the loop's read, a one-off read
    (the sweep's, adoption's, the CLI's, the slot release's) and the api-server's run gate each
    give up within ``db.bounds().statement_ms`` while the table is locked (SQLSTATE 57014, query
    canceled: a failed check, nothing decided), and read again once it is free. The sweep's
    advisory lock takes its transaction from ``db.bounded_connection``, bounded the same way."""
    from sqlalchemy import text

    from fenced_k8s_executor import run_gate

    reads = ledger.InFlightReads()
    try:
        with _table_locked(pg_server, metadata_db.url.database):
            outcomes = _within(WATCHDOG, loop=lambda: reads.read([NO_TASK], [_launch()]),
                               one_off=lambda: ledger.read_rows([NO_TASK]),
                               run_gate=lambda: run_gate.read_row_token(uuid.uuid4()))
        for name, (finished, outcome) in outcomes.items():
            assert finished, f"the {name} read was still queued behind the lock after {WATCHDOG:.0f} s"
            assert isinstance(outcome, Exception) and sqlstate.of(outcome) == "57014", (name, outcome)
        assert reads.read([NO_TASK], [_launch()]).rows == {}
        assert ledger.read_rows([NO_TASK]) == {}
        assert run_gate.read_row_token(uuid.uuid4()) is run_gate._MISSING
        with db.bounded_connection() as conn:
            setting = "SELECT setting FROM pg_settings WHERE name = 'statement_timeout'"  # in ms
            assert conn.execute(text(setting)).scalar() == str(db.bounds().statement_ms)
    finally:
        reads.close()


def test_fence_connections_carry_the_tcp_bounds_and_airflows_keep_theirs(metadata_db, airflow_engine):
    """libpq's keepalives and ``tcp_user_timeout`` on every connection the fences open (the loop's,
    a one-off's, a transaction's), as the kernel sees them on the socket; Airflow's own engine is
    left as configured."""
    reads = ledger.InFlightReads()
    try:
        reads.read([NO_TASK], [_launch()])
        with db.autocommit() as one_off, db.bounded_connection() as transaction:
            sockets = {"loop": reads._held.connection.dbapi_connection, "one-off": one_off.dbapi_connection,
                       "transaction": transaction.connection.dbapi_connection}
            for name, dbapi in sockets.items():
                assert _tcp_options(dbapi) == (1, db.KEEPALIVES_IDLE, db.KEEPALIVES_INTERVAL, db.KEEPALIVES_COUNT,
                                               db.TCP_USER_TIMEOUT_MS), name
        with airflow_engine.connect() as conn:
            assert _tcp_options(conn.connection.dbapi_connection)[4] == 0  # no user timeout: Airflow's, untouched
    finally:
        reads.close()


def _tcp_options(dbapi) -> tuple[int, ...]:
    with socket.socket(fileno=socket.dup(dbapi.fileno())) as sock:
        return (sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))


def test_a_bound_the_operator_set_in_the_url_is_kept(metadata_db, monkeypatch):
    """A libpq keyword the operator put in ``sql_alchemy_conn`` (a NAT with a shorter idle
    timeout wants an earlier first probe, say) is theirs: the fences add only what is missing."""
    from airflow import settings

    engine = _engine(settings.engine.url.update_query_dict({"keepalives_idle": "7"}))
    monkeypatch.setattr(settings, "engine", engine)
    try:
        with db.autocommit() as conn:
            assert _tcp_options(conn.dbapi_connection)[1:] == (7, db.KEEPALIVES_INTERVAL, db.KEEPALIVES_COUNT,
                                                                db.TCP_USER_TIMEOUT_MS)
    finally:
        db.dispose()
        engine.dispose()


def test_a_black_hole_in_the_middle_of_a_statement_is_cut_within_its_bound(
        hop, airflow_engine, metadata_db, pg_server, cuts, monkeypatch):
    """(issue 52, item 5) The loop's statement reaches the server and queues behind a lock; then
    the hop forgets the flow, so the answer falls into a black hole. Nothing the client sent is
    unacknowledged, so ``tcp_user_timeout`` never fires, and the server's ``statement_timeout``
    answers into the hole: before the watchdog the read waited for the keepalives (idle 30 s, then
    a probe unanswered for ``tcp_user_timeout``: about 40 s, more than the default 30 s
    ``scheduler_health_check_threshold``). The watchdog cuts it at ``db.bounds().operation``
    (bounds of a 14 s threshold here): a transient error, and the next read goes on a new flow."""
    monkeypatch.setenv("AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD", "14")
    db.dispose()  # built again with it
    reads = ledger.InFlightReads()
    try:
        assert reads.read([NO_TASK], [_launch()]).rows == {}
        old = _client_port(reads)
        with _table_locked(pg_server, metadata_db.url.database):
            done: list = []
            reader = threading.Thread(target=lambda: done.append(_outcome(reads)), daemon=True)
            reader.start()
            _until_queued(pg_server, metadata_db.url.database)
            assert hop.forget() >= {old}  # mid-statement: the server has it, its answer will be dropped
        reader.join(WATCHDOG)
        if reader.is_alive():
            hop.sever()

        assert not reader.is_alive(), f"the read was still blocked after {WATCHDOG:.0f} s in a black hole"
        assert isinstance(done[0], Exception) and sqlstate.transient(done[0]), done
        assert cuts == ["statement"], f"ended by {done[0]!r}, not by the fences' bound"
        assert reads.read([NO_TASK], [_launch()]).rows == {}
        assert _client_port(reads) != old and _client_port(reads) in hop.flows()
    finally:
        reads.close()


def _outcome(reads: ledger.InFlightReads):
    try:
        return reads.read([NO_TASK], [_launch()])
    except Exception as error:  # noqa: BLE001 - handed to the test
        return error


def _until_queued(pg_server, database: str) -> None:
    """Until a backend of ``database`` waits for a lock."""
    import psycopg2

    deadline = time.monotonic() + WATCHDOG
    conn = psycopg2.connect(host="127.0.0.1", port=pg_server.port, user="postgres", dbname=database)
    try:
        conn.autocommit = True
        with conn.cursor() as cursor:
            while True:
                cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'relation'")
                if cursor.fetchone()[0]:
                    return
                assert time.monotonic() < deadline, "the read never queued behind the lock"
                time.sleep(0.02)
    finally:
        conn.close()
