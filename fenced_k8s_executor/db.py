"""The fences' own connections to the metadata DB: Airflow's engine settings, a small pool of their
own, and a bound on every statement they send.

A pool of their own because the fences' single statements run in autocommit (no BEGIN and COMMIT
round trips), and an autocommit connection must never reach Airflow's sessions: their
transaction-scoped advisory locks and row locks would end with each statement. Everything else
is Airflow's: the URL of ``airflow.settings.engine``, the engine arguments
``settings.prepare_engine_args`` computes (``sql_alchemy_engine_args``, ``sql_alchemy_pool_recycle``,
``sql_alchemy_pool_pre_ping``), the connect arguments (``sql_alchemy_connect_args``: SSL and the
rest), ``settings.create_metadata_engine`` (which ``airflow_local_settings`` may override, for
token authentication say) and Airflow's own event handlers (a forked child never uses its
parent's connections). Connections go back to the pool transactional, whoever returns them.

The bounds, on PostgreSQL through libpq (psycopg2 and psycopg 3), each with the ceiling it sets. A
keyword the URL or ``sql_alchemy_connect_args`` already sets is left as the operator set it, but
for ``connect_timeout``, which is capped at the fences' (``Bounds``).

- The wall clock (``watchdog``): every statement, commit, rollback and pre-ping the fences send,
  and the exchange that follows a connect (the driver's and SQLAlchemy's first queries), is
  watched; one that outlives ``Bounds.operation`` has its socket shut down, fails at once with a
  lost-connection error, and its connection is discarded, never reused. The only bound that holds
  behind a TCP-terminating pooler (pgbouncer, RDS Proxy) whose server side went silent: there the
  client's TCP bounds reach the pooler, which answers, and ``statement_timeout`` is the silent
  server's. The connect itself: libpq's ``connect_timeout`` (per address), which holds behind a
  pooler waiting for a server connection too.
- TCP: keepalives and ``tcp_user_timeout`` on every connection. A NAT gateway or load balancer that
  forgets an idle flow drops its packets without a word; Linux's defaults then retransmit for about
  15 minutes. These find a dead flow while it is idle (the next checkout's ping then fails at once).
- The server: ``SET LOCAL statement_timeout`` (``bound()``, below ``Bounds.operation``, so a live
  server cancels first and the connection stays usable) inside each statement's own transaction
  (at the head of a single statement's query string, or the first statement of a
  ``bounded_connection`` / ``bounded_session``); never a session-level SET, which a pooler in
  transaction mode would leave on a server connection other clients get.
- The pool: Airflow's ``pool_pre_ping`` at every checkout, ``pool_recycle`` by age. The loop's
  connection (``HeldConnection``) stays checked out between loops, so it goes back to the pool
  after an idle spell and at the recycle age, and the next checkout applies both.

The bounds follow ``[scheduler] scheduler_health_check_threshold`` (``bounds_for``): one fence use
(a pooled connection's ping, a reconnect, a statement) takes at most half of it, so that a DB
gone silent under the fences never makes peers take this scheduler for dead. Below the floors
(a threshold under 14 s) the floors hold and a warning says so at the pool's build.

For the deployment identity, the guards and any other fence that reads or writes a row:
``bounded_session()`` (an ORM session) or ``bounded_connection()`` (Core), each one transaction
on this pool, committed on exit, rolled back on an error, every statement bounded.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from fenced_k8s_executor import metrics, watchdog

log = logging.getLogger("fenced_k8s_executor")

#: The shipped bounds, for Airflow's default ``scheduler_health_check_threshold`` of 30 s: seconds
#: of wall clock one statement, commit, rollback or ping may take (the watchdog's), seconds a
#: connect may take (libpq's ``connect_timeout``, per address: where the kernel's SYN retries
#: would take about two minutes).
OPERATION_BOUND, CONNECT_TIMEOUT = 5.0, 4
#: The share of ``scheduler_health_check_threshold`` one fence use may take (``Bounds.per_use``):
#: the rest of the loop and its heartbeat keep the other half.
THRESHOLD_SHARE = 0.5
#: What the bounds never go below, however low the threshold: a statement bound a loaded but
#: healthy server meets, and libpq's least ``connect_timeout`` (it takes 2 for 1).
OPERATION_FLOOR, CONNECT_FLOOR = 2.5, 2
#: The server's ``statement_timeout`` as a share of the operation's bound (4 s shipped): the most a
#: statement queued behind a lock (a migration's ACCESS EXCLUSIVE, say) or a bad plan costs a
#: loop, cancelled by a live server (SQLSTATE 57014, the connection kept) before the watchdog cuts
#: it. The loop's statement takes about a millisecond at 3,000 launches in flight
#: (docs/performance.md).
STATEMENT_SHARE = 0.8
#: Milliseconds sent data may stay unacknowledged before the kernel drops the connection (libpq's
#: ``tcp_user_timeout``, libpq 12+): with keepalives, a flow that died while idle is dropped about
#: 40 s after its last traffic.
TCP_USER_TIMEOUT_MS = 10_000
#: Seconds of silence before the kernel probes an idle connection, then the seconds between probes
#: and their count. Probes every 30 s keep the flow in any NAT or load balancer's table (the
#: shortest idle timeouts in common use are 4-6 minutes), and a flow that died anyway is found
#: while idle: with ``tcp_user_timeout`` the kernel drops it once a probe has gone unanswered that
#: long, about 40 s after its last traffic, so the next checkout's ping fails at once.
KEEPALIVES_IDLE, KEEPALIVES_INTERVAL, KEEPALIVES_COUNT = 30, 10, 3
#: Seconds the loop's connection may sit unused before it goes back to the pool, whose pre-ping
#: then checks it before the next statement: a server restart, a failover or a pooler's idle
#: timeout closes it while nothing uses it, and the ping (one round trip per idle spell, not per
#: loop) replaces it instead of failing a loop.
IDLE_SPELL = 10.0
#: Connections the pool keeps: the loop's and the sweep's lock (one-off reads borrow either
#: between uses). Busier moments (several executors in one process, an api-server's run gate
#: under a burst) open more, up to Airflow's ``max_overflow``, closed when given back.
POOL_SIZE = 2
#: libpq keywords only the PostgreSQL drivers built on libpq take.
LIBPQ_DRIVERS = ("psycopg2", "psycopg")

#: Airflow's engine arguments the fences' pool sets for itself: bulk-insert tuning (the fences
#: insert nothing in bulk, and psycopg2's keywords break a psycopg 3 engine) and the pool's shape.
_NOT_INHERITED = ("executemany_mode", "executemany_batch_page_size", "executemany_values_page_size",
                  "insertmanyvalues_page_size", "poolclass", "pool_size", "pool_timeout", "pool_use_lifo")
_BORN = "fenced_k8s_executor.born"  # a DBAPI connection's connect time, in its pool record's info


@dataclass(frozen=True)
class Bounds:
    """The fences' bounds for one ``scheduler_health_check_threshold`` (``bounds_for``)."""

    threshold: float  # seconds: [scheduler] scheduler_health_check_threshold
    operation: float  # seconds of wall clock one statement, commit, rollback or ping may take
    connect: int  # seconds a connect may take, per address (libpq's connect_timeout)
    statement_ms: int  # the server's statement_timeout

    @property
    def per_use(self) -> float:
        """The most one fence use takes when the DB goes silent under it: the checkout's ping on
        a pooled connection, the reconnect that replaces it, and the first statement on that."""
        return 2 * self.operation + self.connect

    @property
    def holds(self) -> bool:
        """Whether a use stays within its share of the threshold."""
        return self.per_use <= THRESHOLD_SHARE * self.threshold


def bounds_for(threshold: float) -> Bounds:
    """The shipped bounds, scaled down together when one use would take more than its share of
    ``threshold``, never below the floors."""
    shipped = Bounds(threshold, OPERATION_BOUND, CONNECT_TIMEOUT, 0)
    scale = min(1.0, THRESHOLD_SHARE * threshold / shipped.per_use)
    operation = max(OPERATION_FLOOR, OPERATION_BOUND * scale)
    return Bounds(threshold, operation, max(CONNECT_FLOOR, int(CONNECT_TIMEOUT * scale)),
                  int(operation * STATEMENT_SHARE * 1000))


@dataclass(frozen=True)
class _Built:
    airflow: Any  # the airflow.settings.engine it was built from
    engine: Any
    recycle: float  # seconds (-1: never)
    bounds: Bounds


_built: _Built | None = None
_building = threading.Lock()


def engine() -> Any:
    """The fences' engine, built on first use from ``airflow.settings.engine`` (again whenever that
    engine is replaced: ``settings.reconfigure_orm``, or a test's)."""
    return _current().engine


def bounds() -> Bounds:
    """The bounds of the fences' engine (built on first use)."""
    return _current().bounds


def set_timeout() -> str:
    """The server's bound on the statements of the transaction it begins (``bounds()``)."""
    return f"SET LOCAL statement_timeout = {bounds().statement_ms}"


def bound() -> str:
    """Sent at the head of a single statement's query string in autocommit: PostgreSQL runs a string
    of several statements in one implicit transaction, so the setting ends with the statement."""
    return set_timeout() + "; "


def dispose() -> None:
    """Close the pool's idle connections (checked-out ones close when given back)."""
    global _built
    with _building:
        built, _built = _built, None
    if built is not None and built.engine is not built.airflow:
        built.engine.dispose()


def _current() -> _Built:
    global _built
    from airflow import settings

    built = _built
    if built is not None and built.airflow is settings.engine:
        return built
    with _building:
        if _built is None or _built.airflow is not settings.engine:
            old, _built = _built, _build(settings.engine)
            if old is not None and old.engine is not old.airflow:
                old.engine.dispose()
        return _built


def _build(airflow_engine: Any) -> _Built:
    from sqlalchemy import event
    from sqlalchemy.pool import QueuePool

    from airflow import settings
    from airflow.configuration import conf
    from airflow.utils.orm_event_handlers import setup_event_handlers

    limits = bounds_for(conf.getfloat("scheduler", "scheduler_health_check_threshold", fallback=30.0))
    if airflow_engine.dialect.name == "sqlite":  # no network, and a pool of its own would open another in-memory DB
        return _Built(airflow_engine, airflow_engine, -1, limits)
    if not limits.holds:
        log.warning("fenced_k8s_executor [scheduler] scheduler_health_check_threshold is %g s: a fence DB use on "
                    "a silent DB may take up to %g s (its floor), more than half of it; set the threshold to %g s or "
                    "more", limits.threshold, limits.per_use, limits.per_use / THRESHOLD_SHARE)
    url = airflow_engine.url
    args = settings.prepare_engine_args()  # Airflow's pool settings and the operator's engine arguments
    for key in _NOT_INHERITED:
        args.pop(key, None)
    # Left out when Airflow's own pool is disabled: the fences keep theirs, with Airflow's values.
    args.setdefault("pool_recycle", conf.getint("database", "sql_alchemy_pool_recycle", fallback=1800))
    args.setdefault("pool_pre_ping", conf.getboolean("database", "sql_alchemy_pool_pre_ping", fallback=True))
    args.setdefault("max_overflow", conf.getint("database", "sql_alchemy_max_overflow", fallback=10))
    # A checkout waits for a free connection (``max_overflow`` reached) as long as an operation may
    # take; the most recently used connection first: the others idle, and are pinged or recycled.
    args.update(poolclass=QueuePool, pool_size=POOL_SIZE, pool_timeout=limits.operation, pool_use_lifo=True)
    connect_args = dict(settings._get_connect_args("sync"))  # a copy: Airflow's engine keeps its own
    for key, value in tcp_bounds(airflow_engine.dialect, limits.connect).items():
        if key == "connect_timeout":  # the operator's when shorter (0: none); connect_args override the URL
            value = min([value, *(_seconds(given) for given in (url.query.get(key), connect_args.get(key))
                                  if _seconds(given))])
        elif key in url.query or key in connect_args:
            continue
        connect_args[key] = value
    ours = settings.create_metadata_engine(url.render_as_string(hide_password=False), engine_args=args,
                                           connect_args=connect_args)
    setup_event_handlers(ours)
    event.listen(ours.pool, "connect", _born)
    if ours.dialect.name == "postgresql":
        event.listen(ours.pool, "checkin", _checkin)
    if ours.dialect.driver in LIBPQ_DRIVERS:
        _watch(ours, limits.operation)
    _dispose_in_forked_children()
    return _Built(airflow_engine, ours, float(args["pool_recycle"]), limits)


def _seconds(value: Any) -> int:
    try:
        return max(0, int(str(value[-1] if isinstance(value, (list, tuple)) else value)))
    except (TypeError, ValueError):
        return 0


def _watch(ours: Any, seconds: float) -> None:
    """Every DBAPI operation SQLAlchemy runs on ``ours`` under the watchdog (its dialect is the
    engine's own instance: Airflow's engine is untouched), and the exchange after a connect (the
    driver's and SQLAlchemy's first queries) until the pool's connect events are done."""
    from sqlalchemy import event

    dialect = ours.dialect
    for name in ("do_execute", "do_execute_no_params", "do_executemany"):
        setattr(dialect, name, _watched(getattr(dialect, name), seconds, "statement", lambda cursor: cursor.connection))
    for name, what in (("do_commit", "commit"), ("do_rollback", "rollback")):
        setattr(dialect, name, _watched(getattr(dialect, name), seconds, what, _dbapi))
    dialect.do_ping = _watched_ping(dialect.do_ping, seconds)
    dialect.connect = _watched_connect(dialect.connect, seconds)
    event.listen(ours.pool, "checkout", _refuse_cut)


def _dbapi(connection: Any) -> Any:
    """The DBAPI connection of a pooled one (the pool hands its reset a proxy), or itself."""
    return getattr(connection, "dbapi_connection", connection)


def _watched(operation: Any, seconds: float, what: str, connection_of: Any) -> Any:
    @functools.wraps(operation)
    def watched(target: Any, *args: Any, **kwargs: Any) -> Any:
        watch = watchdog.arm(_dbapi(connection_of(target)), seconds, what)
        try:
            return operation(target, *args, **kwargs)
        finally:
            watchdog.disarm(watch)  # a cut connection is refused at checkout, invalidated at checkin
    return watched


def _watched_ping(ping: Any, seconds: float) -> Any:
    @functools.wraps(ping)
    def watched(dbapi_connection: Any) -> bool:
        watch = watchdog.arm(_dbapi(dbapi_connection), seconds, "ping")
        try:
            alive = ping(dbapi_connection)
        finally:
            cut = watchdog.disarm(watch)
        return alive and not cut  # False: the pool replaces the connection
    return watched


def _count_cut(what: str) -> None:
    metrics.incr("db.cut", {"operation": what})


watchdog.on_cut = _count_cut
_connecting = threading.local()  # the watch over a new connection's first exchange, in its thread


def _watched_connect(connect: Any, seconds: float) -> Any:
    @functools.wraps(connect)
    def watched(*args: Any, **kwargs: Any) -> Any:
        watchdog.disarm(_connecting.__dict__.pop("watch", None))  # a connect whose events failed
        connection = connect(*args, **kwargs)
        _connecting.watch = watchdog.arm(connection, seconds, "connect")
        return connection
    return watched


def _refuse_cut(dbapi: Any, record: Any, proxy: Any) -> None:
    """A connection the watchdog cut is never handed out: the pool replaces it."""
    if watchdog.cut(dbapi):
        from sqlalchemy import exc

        raise exc.DisconnectionError("the fences' watchdog cut this connection")


@functools.cache
def _dispose_in_forked_children() -> None:
    """As Airflow does for its own engine: a forked child opens connections of its own, and leaves
    its parent's alone."""
    def forget() -> None:
        built = _built
        if built is not None and built.engine is not built.airflow:
            built.engine.dispose(close=False)

    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=forget)


def tcp_bounds(dialect: Any, connect_timeout: int = CONNECT_TIMEOUT) -> dict[str, int]:
    """The libpq keywords that bound a connection's connect and TCP flow (none for other drivers)."""
    if dialect.name != "postgresql" or dialect.driver not in LIBPQ_DRIVERS:
        return {}
    bounds = {"connect_timeout": connect_timeout, "keepalives": 1, "keepalives_idle": KEEPALIVES_IDLE,
              "keepalives_interval": KEEPALIVES_INTERVAL, "keepalives_count": KEEPALIVES_COUNT}
    if _libpq_version(dialect.dbapi) >= 120000:  # an older libpq refuses the keyword
        bounds["tcp_user_timeout"] = TCP_USER_TIMEOUT_MS
    return bounds


def _libpq_version(dbapi: Any) -> int:
    pq = getattr(dbapi, "pq", None)  # psycopg 3
    if pq is not None:
        return int(pq.version())
    return int(dbapi.extensions.libpq_version())  # psycopg2


def _born(dbapi: Any, record: Any) -> None:
    """The last of the pool's connect events: the new connection's first exchange is done."""
    watchdog.disarm(_connecting.__dict__.pop("watch", None))  # if it was cut, checkout refuses it
    record.info[_BORN] = time.time()


def _checkin(dbapi: Any, record: Any) -> None:
    """A connection the watchdog cut is closed now. Every other goes back to the pool out of
    autocommit, whoever returns it (a reader dropped without ``close``, say): the next checkout
    may be a transaction's, the sweep's lock."""
    if dbapi is not None and watchdog.cut(dbapi):
        record.invalidate()
        return
    if dbapi is None or dbapi.closed or not dbapi.autocommit:
        return
    try:
        dbapi.autocommit = False
    except Exception as error:  # noqa: BLE001 - a transaction begun by hand (psycopg 3 refuses then)
        record.invalidate(error)


def _bound(conn: Any) -> None:
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(set_timeout())


@contextmanager
def bounded_connection() -> Iterator[Any]:
    """A SQLAlchemy ``Connection`` of the fences' pool in one transaction whose statements are
    bounded by ``statement_timeout``: committed on exit, rolled back on an error. On PostgreSQL the
    setting is the transaction's first statement (``SET LOCAL``)."""
    with engine().begin() as conn:
        _bound(conn)
        yield conn


@contextmanager
def bounded_session() -> Iterator[Any]:
    """An ORM ``Session`` on the fences' pool (Airflow's session defaults: no autoflush, no expiry
    on commit), in one transaction bounded as ``bounded_connection``'s: committed on exit, rolled
    back on an error. Pass it to Airflow's ``session=`` parameters (``Variable.set``, say)."""
    from sqlalchemy.orm import Session

    with Session(engine(), autoflush=False, expire_on_commit=False) as session, session.begin():
        _bound(session.connection())
        yield session


@contextmanager
def autocommit() -> Iterator[Any]:
    """One pooled connection (SQLAlchemy's ``PoolProxiedConnection``: ``dbapi_connection``,
    ``info``) in autocommit, for single statements whose query string starts with ``bound()``,
    watched as one operation (``watchdog``). Invalidated on any error, and when the watchdog cut
    it: a connection that failed a statement is not trusted again.

    The DBAPI flag is set directly, as SQLAlchemy's own pre-ping does: its
    ``isolation_level="AUTOCOMMIT"`` would leave the connection with an explicit READ COMMITTED
    level, after which psycopg2 sends ``SET default_transaction_isolation`` at every later switch."""
    built = _current()
    conn = built.engine.raw_connection()
    watch = None
    try:
        conn.dbapi_connection.autocommit = True
        watch = _arm(built, conn)
        yield conn
    except BaseException as error:
        watchdog.disarm(watch)
        _discard(conn, error)
        raise
    if watchdog.disarm(watch):
        _discard(conn, None)
    else:
        conn.close()


def _arm(built: _Built, conn: Any) -> Any:
    """The watch over a raw connection's statements (the driver's own cursors: no dialect hook
    sees them), on the libpq drivers."""
    if built.engine.dialect.driver not in LIBPQ_DRIVERS:
        return None
    return watchdog.arm(conn.dbapi_connection, built.bounds.operation, "statement")


def _discard(conn: Any, error: BaseException | None) -> None:
    """Close a connection that failed and give its place back to the pool (the next checkout
    connects anew)."""
    try:
        conn.invalidate(error)
        conn.close()
    except Exception:  # noqa: BLE001 - a broken connection is gone either way
        pass


class HeldConnection:
    """The loop's connection, kept checked out between loops in autocommit (a checkout per loop
    would add the pool's pre-ping round trip to every loop). It goes back to the pool after an
    idle spell (``IDLE_SPELL``) and once older than ``sql_alchemy_pool_recycle``, so that the next
    checkout pings or replaces it, and is invalidated on any error. Used by one thread."""

    def __init__(self) -> None:
        self._conn: Any = None
        self._built: _Built | None = None
        self._used = 0.0  # time.monotonic() of the last statement

    @property
    def connection(self) -> Any:
        """The connection held now (None between a release and the next use)."""
        return self._conn

    @contextmanager
    def use(self) -> Iterator[Any]:
        """The held connection for one read, watched as one operation (``watchdog``)."""
        conn = self._checkout()
        watch = _arm(self._built, conn)
        try:
            yield conn
        except BaseException as error:
            watchdog.disarm(watch)
            self._conn = None
            _discard(conn, error)
            raise
        if watchdog.disarm(watch):
            self._conn = None
            _discard(conn, None)
        self._used = time.monotonic()

    def close(self) -> None:
        """Give the connection back to the pool."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - a broken connection is gone either way
                pass

    def _checkout(self) -> Any:
        built = _current()
        if self._conn is not None and (built is not self._built or self._stale(built)):
            self.close()
        if self._conn is None:
            conn = built.engine.raw_connection()  # the pool's pre-ping and recycle apply here
            try:
                conn.dbapi_connection.autocommit = True
            except BaseException:
                conn.close()
                raise
            self._conn, self._built = conn, built
        return self._conn

    def _stale(self, built: _Built) -> bool:
        idle = time.monotonic() - self._used > IDLE_SPELL
        born = self._conn.info.get(_BORN)
        aged = built.recycle >= 0 and born is not None and time.time() - born > built.recycle
        return idle or aged
