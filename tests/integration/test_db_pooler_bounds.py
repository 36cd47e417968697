"""The fences' DB bounds behind a TCP-terminating pooler (issue 52, item 5): a real pgbouncer (the
Debian package) in front of the session's PostgreSQL, whose server side goes silent
(``fenced_k8s_lab.pgbouncer``). The client's keepalives and ``tcp_user_timeout`` reach pgbouncer,
which is alive, and ``statement_timeout`` is the stopped server's: only the fences' watchdog
(``fenced_k8s_executor.watchdog``) ends the wait. Every fence path that talks to the DB, on
psycopg2 and psycopg 3, fails within its bound with a transient error (nothing decided, nothing
deleted: the callers treat it as any DB error), its connection cut and discarded, and the next
read succeeds on a fresh one. Stock's own check beside them (the provider's
``_should_create_pod_for_execute_task`` through Airflow's ORM session) is still blocked when every
fence call has returned: stock has no bound on this path; it returns once the server answers.

The bounds are derived from a 14 s ``scheduler_health_check_threshold`` here (``db.bounds_for``:
2.5 s a statement, 2 s a connect): each test costs about one bound per driver. A call that must
not block runs in a thread under ``WATCHDOG``: on code without the watchdog the thread is still
blocked when the test gives up on it, and the test fails saying so.
"""

from __future__ import annotations

import threading
import time
import uuid
from contextlib import ExitStack, contextmanager
from types import SimpleNamespace

import pytest

from fenced_k8s_executor import db, deployment, ledger, run_gate, sqlstate, witness
from fenced_k8s_executor.config import FencedConfig
from fenced_k8s_executor.launch import LaunchIdentity

#: Seconds a call may take before the test calls it blocked: many times the bounds, and short of
#: forever, which is what a silent server behind a pooler costs without them.
WATCHDOG = 60.0
#: The threshold the bounds are derived from here: the least one at which they hold (half of it
#: for one use), and the cheapest to test.
THRESHOLD = "14"
DRIVERS = ["psycopg2", "psycopg"]
NO_TASK = ("no_such_dag", "a", "no-such-run", -1)


class Calls:
    """Calls running each in a thread of its own, all at once."""

    def __init__(self, **calls):
        self.outcomes: dict = {}
        self.threads = {name: threading.Thread(target=self._run, args=(name, call), daemon=True, name=f"call-{name}")
                        for name, call in calls.items()}
        for thread in self.threads.values():
            thread.start()

    def _run(self, name, call) -> None:
        try:
            self.outcomes[name] = call()
        except BaseException as error:  # noqa: BLE001 - handed to the test
            self.outcomes[name] = error

    def join(self, seconds: float, *names: str) -> dict[str, tuple[bool, object]]:
        """By name (all when none given): (finished within ``seconds``, its result or error)."""
        deadline = time.monotonic() + seconds
        names = names or tuple(self.threads)
        for name in names:
            self.threads[name].join(max(0.0, deadline - time.monotonic()))
        return {name: (not self.threads[name].is_alive(), self.outcomes.get(name)) for name in names}


@pytest.fixture(params=DRIVERS)
def driver(request):
    return request.param


@pytest.fixture
def bouncer(pg_server):
    from fenced_k8s_lab.pgbouncer import Pgbouncer, skip_reason

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with Pgbouncer(pg_server) as pgbouncer:
        yield pgbouncer


@pytest.fixture
def behind_pooler(metadata_db, bouncer, driver, monkeypatch):
    """Airflow's ORM (its engine and sessions, from which the fences build their pool) on
    ``driver`` through pgbouncer, with the bounds of ``THRESHOLD``."""
    from airflow import settings
    from airflow.configuration import conf

    url = conf.get("database", "sql_alchemy_conn")
    monkeypatch.setenv("AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD", THRESHOLD)
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", bouncer.url(metadata_db.url.database, driver))
    settings.configure_vars()
    settings.reconfigure_orm()
    db.dispose()
    try:
        yield bouncer
    finally:
        db.dispose()
        monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", url)
        settings.configure_vars()
        settings.reconfigure_orm()


def _launch() -> LaunchIdentity:
    dag_id, task_id, run_id, map_index = NO_TASK
    return LaunchIdentity(ti_id=str(uuid.uuid4()), token=str(uuid.uuid4()), try_number=1, dag_id=dag_id,
                          task_id=task_id, run_id=run_id, map_index=map_index)


def _stock_check():
    """The provider's own pre-creation check, as a stock scheduler runs it: one SELECT through
    Airflow's ORM session (``provide_session``)."""
    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor import KubernetesExecutor

    executor = KubernetesExecutor()
    executor.scheduler_job_id = "1"
    workload = SimpleNamespace(ti=SimpleNamespace(id=uuid.uuid4(), try_number=1))
    return lambda: executor._should_create_pod_for_execute_task(SimpleNamespace(key="stock"), workload)


def _fence_calls(reads: ledger.InFlightReads) -> dict:
    """Every fence path that reads the DB, by the mechanism it uses: the loop's held connection,
    a one-off read on a borrowed one (the sweep's, adoption's, the CLI's), a Core transaction (the
    run gate; the sweep's lock takes one too) and ORM sessions (the witness's job rows, the
    deployment's Variable)."""
    return {"loop": lambda: reads.read([NO_TASK], [_launch()]),
            "one_off": lambda: ledger.read_rows([NO_TASK]),
            "run_gate": lambda: run_gate.read_row_token(uuid.uuid4()),
            "witness": lambda: witness.read_jobs([1]),
            "deployment": lambda: deployment.resolve(FencedConfig(), create=False)}


def _query(pg_server, database: str, sql: str) -> list[tuple]:
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=pg_server.port, user="postgres", dbname=database)
    try:
        conn.autocommit = True
        with conn.cursor() as cursor:
            cursor.execute(sql)
            return cursor.fetchall() if cursor.description else []
    finally:
        conn.close()


@contextmanager
def _tables_locked(pg_server, database: str, *tables: str):
    """``tables`` locked ACCESS EXCLUSIVE by another session (a migration's ``ALTER TABLE``); the
    block gets a function that releases them."""
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=pg_server.port, user="postgres", dbname=database)
    try:
        with conn.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE")
        yield conn.rollback
    finally:
        conn.rollback()
        conn.close()


def _waiting(pg_server, database: str) -> set[int]:
    """The backends queued behind a lock on a table of ``database``."""
    return {pid for (pid,) in _query(pg_server, database, "SELECT pid FROM pg_locks WHERE NOT granted AND "
                                                          "locktype = 'relation'")}


def _until(condition, what: str):
    deadline = time.monotonic() + WATCHDOG
    while not (found := condition()):
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.02)
    return found


def _transient(outcome) -> bool:
    return isinstance(outcome, Exception) and sqlstate.transient(outcome)


def test_fence_statements_behind_pgbouncer_whose_server_goes_silent_mid_statement_fail_within_their_bound(
        behind_pooler, metadata_db, pg_server, driver, cuts):
    """(a) Each fence path's statement reaches its server through pgbouncer and queues behind a
    table lock; the backends serving them are stopped there (the server goes silent in the middle
    of the statement: its ``statement_timeout`` cannot fire), then the lock is released. Every
    fence call comes back with a transient error, cut by the watchdog; stock's check, sent the
    same way, is still blocked then, and returns only once the server answers again."""
    from fenced_k8s_lab.pgbouncer import stopped

    database = metadata_db.url.database
    reads = ledger.InFlightReads()
    stock = _stock_check()
    try:
        _all_read_again(reads)  # every path has read once through pgbouncer (the loop's connection is held)
        assert stock() is False
        with _tables_locked(pg_server, database, "task_instance", "job", "variable") as release, ExitStack() as stops:
            calls = Calls(**_fence_calls(reads), stock=stock)
            queued: set[int] = set()

            def stop_queued() -> bool:  # each backend stopped as soon as it queues: long before its statement_timeout
                for pid in _waiting(pg_server, database) - queued:
                    stops.enter_context(stopped(pid))
                    queued.add(pid)
                assert not calls.outcomes, f"answered before its backend was stopped: {calls.outcomes}"
                return len(queued) == len(calls.threads)

            _until(stop_queued, "were all the statements queued behind the lock")
            assert _waiting(pg_server, database) == queued  # stopped while queued: mid-statement
            release()
            fences = calls.join(WATCHDOG, *(name for name in calls.threads if name != "stock"))
            stock_blocked = calls.threads["stock"].is_alive()
        (stock_finished, stock_outcome), = calls.join(WATCHDOG, "stock").values()

        for name, (finished, outcome) in fences.items():
            assert finished, f"the {name} call was still blocked after {WATCHDOG:.0f} s behind a silent server"
            assert _transient(outcome), (name, outcome)
        assert len(cuts) == len(fences) and set(cuts) <= {"statement"}, cuts
        assert stock_blocked, "stock's check returned while its server was silent"
        assert stock_finished and stock_outcome is False  # the server answered: no such TI, no pod
        _all_read_again(reads)
    finally:
        reads.close()


def _all_read_again(reads: ledger.InFlightReads) -> None:
    """Every path reads again, on fresh connections: no cut connection was handed out again (it
    would fail the read)."""
    from fenced_k8s_executor.deployment import NotStored

    assert reads.read([NO_TASK], [_launch()]).rows == {}
    assert ledger.read_rows([NO_TASK]) == {}
    assert run_gate.read_row_token(uuid.uuid4()) is run_gate._MISSING
    assert witness.read_jobs([1]) is not None
    try:
        deployment.resolve(FencedConfig(), create=False)
    except NotStored:
        pass


@pytest.mark.parametrize("pooler", ["fresh", "warm"])
def test_a_connect_behind_pgbouncer_with_no_reachable_server_fails_within_its_bound(
        behind_pooler, metadata_db, pg_server, driver, pooler, cuts):
    """(b) The fences connect anew (an empty pool) through pgbouncer while the PostgreSQL server
    answers nothing (its postmaster and pgbouncer's server backends stopped).

    ``fresh``: pgbouncer has no server connection yet, and holds the login until it gets one:
    libpq's ``connect_timeout`` ends it (on both drivers; already so before the watchdog).
    ``warm``: pgbouncer has served this database before, so it completes the login itself, and the
    connection's first exchange (the driver's and SQLAlchemy's first queries) goes to the silent
    server: the watchdog ends it (before it, that connect never returned). Stock's check, on
    Airflow's pooled connection, is still blocked then."""
    from fenced_k8s_lab.pgbouncer import postmaster_pid, stopped

    database = metadata_db.url.database
    stock = _stock_check()
    if pooler == "warm":
        assert stock() is False  # Airflow's connection, and pgbouncer's server connection, made
        assert witness.read_jobs([1]) is not None
    db.dispose()  # the fences connect anew
    silent = {postmaster_pid(pg_server), *behind_pooler.server_pids(database)}
    reads = ledger.InFlightReads()
    try:
        with stopped(*silent):
            calls = Calls(loop=lambda: reads.read([NO_TASK], [_launch()]),
                          witness=lambda: witness.read_jobs([1]),
                          **({"stock": stock} if pooler == "warm" else {}))
            fences = calls.join(WATCHDOG, "loop", "witness")
            stock_blocked = pooler == "fresh" or calls.threads["stock"].is_alive()

        for name, (finished, outcome) in fences.items():
            assert finished, f"the {name} call's connect was still blocked after {WATCHDOG:.0f} s"
            assert _transient(outcome), (name, outcome)
        assert stock_blocked, "stock's check returned while its server was silent"
        if pooler == "warm":
            assert cuts and set(cuts) <= {"connect", "ping", "statement"}, cuts
            assert calls.join(WATCHDOG, "stock")["stock"] == (True, False)
        _all_read_again(reads)
    finally:
        reads.close()
