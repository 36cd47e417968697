"""The DB reads the verdicts need: one statement per scheduler loop.

Rows are found by task (dag_id, task_id, run_id, map_index: the unique key every TI row keeps
across clears and retries), not by row id: a clear or a retry gives the row a new id, and only the
token then says whether a pod is still the task's current launch.

The launches in flight are asked differently (``InFlightReads``): every loop re-checks every one of
them, so the statement must cost the launches that did not change (nearly all of them) as little
as possible. It sends nothing per launch. A launch is current when its token is one of the tokens
of the *live set*, the rows in the states a launch in flight has (queued, running), found through
airflow-core's own index on ``state``: tokens are minted per QUEUED transition and never reused, so
a token in a live row is that task's current launch. Each loop asks for a digest of the live set
(its size and the sum of its tokens' hashes) and gets the tokens themselves only when the digest
moved; the launches whose token is not in the set (superseded, or current in another state: a
clear of a running task leaves it RESTARTING under its token) are asked by task key, in the same
statement from the loop after they were first seen outside.

On Airflow 3.4, where every attempt is a row of its own, only the live attempt is read, and a task
inside a dynamic region is keyed by its region too; which columns those are on the installed
Airflow is ``provider_compat``'s answer (``task_columns``, ``live_attempt``).

Always a connection of the fences' own pool (``db``; never the scoped session): the executor's
hooks may run inside the scheduler's own transaction, whose row locks must not be committed or
released early. On PostgreSQL the statements are constant, with array parameters handed to the
driver as is, and each is bounded (``db.bound()``; the connection's other bounds are ``db``'s). No
statement casts text that came from a pod: a region is parsed here (``_region_id``), and text
that is not a UUID names no row, as a dag_id that names no DAG does.
"""

from __future__ import annotations

import functools
import logging
import sys
import uuid
from dataclasses import dataclass
from typing import Any, Iterable

from fenced_k8s_executor import db, provider_compat, sqlstate
from fenced_k8s_executor.launch import LaunchIdentity, TaskKey, TaskRow, task_key

log = logging.getLogger("fenced_k8s_executor")

#: An idle loop's statement: the live set's digest alone.
DIGEST_ONLY = frozenset("d")
#: Its name when prepared on a connection (at most once each: the pool record's info says so).
PREPARED_DIGEST = "fenced_k8s_executor_digest"

#: Sent before every loop statement in the same query string, after ``db.bound()``, so in the one
#: implicit transaction PostgreSQL gives a multi-statement string (the settings end with it, behind
#: a pooler too): the statement is bounded, and the live set is found through airflow-core's indexes
#: on ``state`` (``ti_state``; 3.4's ``ti_current_state``), whatever the statistics say. Right
#: after a mass update, before autovacuum analyses the table, the planner took a sequential scan
#: of the whole table (every loop, until the analyse: 5x an idle loop's cost at 1,000 launches); a
#: plain index scan (not a bitmap one) also marks the dead entries it meets, so only the first loop
#: after such an update walks them.
PLANNER = "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; "
#: Statements the reads sent, and the PREPAREs (one per connection) apart: read by the benchmark.
ROUND_TRIPS = 0
PREPARES = 0

#: The row columns the reads return, by the names the fences know them by (``_columns`` maps them
#: to the model: ``map_index`` is ``region_index`` on 3.4, ``region`` its ``region_id`` or NULL).
_COLUMNS = ("id", "state", "try_number", "queued_by_job_id", "external_executor_id", "dag_id", "task_id", "run_id",
            "map_index", "hostname", "region")
_KEY = ("dag_id", "task_id", "run_id", "map_index", "region")
#: The states of the rows whose tokens make the live set: a launch's pod is in flight while its
#: row is queued (the pod not started yet) or running.
LIVE_STATES = ("queued", "running")


def read_rows(tasks: Iterable[TaskKey | None]) -> dict[TaskKey, TaskRow]:
    """Current rows of the given tasks, keyed by task; tasks absent from the result have no row.

    Raises on DB errors: callers treat an error as "no evidence", never as "gone".
    """
    return InFlightReads(hold=False).read(tasks).rows


@dataclass(frozen=True)
class Reading:
    """One read of a loop: the rows of the tasks asked for, and the launches in flight whose task's
    row does not name their token."""

    rows: dict[TaskKey, TaskRow]  # every task asked for (absent: no row)
    changed: dict[str, TaskRow | None]  # token of a launch in flight -> its task's row (None: no row)


@dataclass(frozen=True)
class Probe:
    """The launches in flight as the loop's statement asks about them, one per token: built once per
    change of the set, not per loop."""

    launches: dict[str, LaunchIdentity]


def probe(launches: Iterable[LaunchIdentity]) -> Probe:
    """Launches without a token or task are left out (legacy, or malformed: never put to the database)."""
    return Probe({launch.token: launch for launch in launches if launch.token and launch.task is not None})


NOTHING = probe(())


class InFlightReads:
    """The loop's reads, remembering the live set between loops: its digest, its tokens, and which
    launches in flight were outside it (asked by task key)."""

    def __init__(self, hold: bool = True) -> None:
        # The loop's reader keeps one connection between its reads (``db.HeldConnection``); a
        # one-off read borrows one from the fences' pool.
        self._held = db.HeldConnection() if hold else None
        self._digest: tuple[int, int] | None = None
        self._live: frozenset[str] = frozenset()
        self._asked: tuple[Any, Any, list] = (None, None, [])  # (the launches, the live set, outside)
        self._prepare = hold  # prepare the idle loop's statement (off once a pooler refused it)

    def close(self) -> None:
        """Give the held connection back to the pool (at the executor's end)."""
        if self._held is not None:
            self._held.close()

    def _connection(self) -> Any:
        """The connection for one read: the held one, or one borrowed for it; either is dropped
        on an error (the next read connects anew)."""
        return self._held.use() if self._held is not None else db.autocommit()

    def _outside(self, flying: dict[str, LaunchIdentity]) -> list[LaunchIdentity]:
        """The launches whose token the live set lacks: the same list while neither changed (an
        idle loop with thousands of launches in flight does nothing per launch here)."""
        if self._asked[0] is not flying or self._asked[1] is not self._live:  # kept, so never a reused id
            self._asked = (flying, self._live, [launch for token, launch in flying.items() if token not in self._live])
        return self._asked[2]

    def read(self, tasks: Iterable[TaskKey | None], launches: Probe | Iterable[LaunchIdentity] = NOTHING) -> Reading:
        """Rows of ``tasks``, and each launch of ``launches`` whose task's current row does not name
        its token (its row, or None when the task has no row). Raises on DB errors, after at
        most the bounds of ``db``."""
        global ROUND_TRIPS

        wanted = {tuple(task) for task in tasks if task is not None}
        flying = (launches if isinstance(launches, Probe) else probe(launches)).launches
        if not wanted and not flying:
            return Reading({}, {})
        engine = db.engine()
        ROUND_TRIPS += 1
        if engine.dialect.name != "postgresql":
            return _read_portable_loop(wanted, flying)
        outside = self._outside(flying)
        digest = self._digest if flying else None
        with self._connection() as conn:
            rows, changed, live = _read_postgresql_loop(engine, wanted, outside, digest, bool(flying), conn,
                                                        self._run_digest if self._prepare else None)
            if live is not None:  # the live set moved: launches it no longer holds are asked by key now
                self._digest, self._live = live
                asked = {launch.token for launch in outside}
                late = [launch for token, launch in flying.items()
                        if token not in self._live and token not in asked]
                if late:
                    ROUND_TRIPS += 1
                    changed.update(_read_postgresql_loop(engine, set(), late, None, False, conn)[1])
        return Reading(rows, changed)

    def _run_digest(self, conn: Any, statement: str, params: dict) -> list:
        """The idle loop's statement, prepared once per connection (``conn.info`` says so, and a
        new or recycled connection starts without): planning it cost more than running it
        (``EXPLAIN ANALYZE`` at 1,000 launches: 1.6-2.1 ms planning, 1.4 ms executing). A pooler
        that does not keep a session's prepared statements (pgbouncer in transaction mode)
        refuses it: from then on it is sent unprepared, as every other statement is."""
        global PREPARES
        try:
            with _cursor(conn.dbapi_connection) as cursor:
                if not conn.info.get(PREPARED_DIGEST):
                    PREPARES += 1
                    cursor.execute(f"{db.bound()}PREPARE {PREPARED_DIGEST}(bigint, text) AS "
                                   + statement.replace("%(count)s", "$1").replace("%(sum)s", "$2"))
                    conn.info[PREPARED_DIGEST] = True
                return _rows(cursor, f"{plan()}EXECUTE {PREPARED_DIGEST}(%(count)s, %(sum)s)", params)
        except Exception as error:
            # 26000: no such prepared statement; 42P05: already prepared (a pooler's server connection)
            code = sqlstate.of(error)
            if code not in ("26000", "42P05"):
                raise
            self._prepare = False
            log.warning("fenced_k8s_executor the metadata DB's connection does not keep prepared statements "
                        "(a pooler in transaction mode?): the loop's statement is planned every loop (%s)", code)
        return _execute(conn, statement, params)


def _read_portable_loop(wanted: set, flying: dict[str, LaunchIdentity]) -> Reading:
    """Elsewhere than PostgreSQL: every row read by task and compared here."""
    tasks = wanted | {launch.task for launch in flying.values()}
    rows = _rows_of(_read_portable(tasks), tasks)
    changed = {token: rows.get(launch.task) for token, launch in flying.items()
               if launch.task not in rows or rows[launch.task].external_executor_id != token}
    return Reading({task: row for task, row in rows.items() if task in wanted}, changed)


def _read_postgresql_loop(engine: Any, wanted: set, by_key: list, digest: tuple[int, int] | None,
                          live: bool, conn: Any = None, run_digest: Any = None) -> tuple[dict, dict, tuple | None]:
    """(rows of ``wanted``, changed launches of ``by_key``, the live set's (digest, tokens) when
    ``live`` is asked and its digest is not ``digest``; None when it did not move), read on
    ``conn`` (in autocommit) or on a connection borrowed for it. ``run_digest`` runs the statement
    when it is the digest alone (an idle loop): the reader's prepared one."""
    if conn is None:
        with db.autocommit() as borrowed:
            return _read_postgresql_loop(engine, wanted, by_key, digest, live, borrowed, run_digest)
    parts = frozenset(part for part, present in (("o", wanted), ("k", by_key), ("d", live)) if present)
    count, total = digest or (-1, -1)
    params: dict[str, Any] = {"key_tokens": [launch.token for launch in by_key], "count": count, "sum": str(total)}
    for prefix, tasks in (("", wanted), ("key_", [launch.task for launch in by_key])):
        params.update(_key_params(tasks, prefix))
    rows, changed, moved = [], {}, None
    if not parts:
        result = []
    elif parts == DIGEST_ONLY and run_digest is not None:
        result = run_digest(conn, _loop_statement(engine, parts), params)
    else:
        result = _execute(conn, _loop_statement(engine, parts), params)
    for kind, token, *row in result:
        if kind == "o":
            rows.append(row)
        elif kind == "d":  # (count, sum, the tokens when the digest moved)
            if row[4] is not None:
                moved = ((int(row[0]), int(row[1])), frozenset(row[4].split(",")) if row[4] else frozenset())
        else:  # "k": the task's row naming another token, or NULLs when the task has no row
            changed[token] = None if row[0] is None else _row(row)
    return _rows_of(rows, wanted), changed, moved


def _execute(conn: Any, statement: str, params: dict) -> list:
    """Run one statement, bounded and with the planner settings (``plan()``), on ``conn``, a pooled
    connection in autocommit (``db.autocommit``, ``db.HeldConnection``).

    One statement needs no transaction: in autocommit psycopg2 sends no BEGIN and no ROLLBACK (the
    settings before it share the query string's implicit transaction). The driver's own cursor
    (client-side, whatever the engine's stream_results says) and its tuples: SQLAlchemy's
    statement and row handling cost as much as the idle loop's query.
    """
    with _cursor(conn.dbapi_connection) as cursor:
        return _rows(cursor, plan() + statement, params)


def plan() -> str:
    """What precedes every loop statement in its query string: the bound and ``PLANNER``."""
    return db.bound() + PLANNER


def _cursor(dbapi: Any) -> Any:
    """A cursor that binds parameters in the client, as psycopg2's do: the query string goes whole
    in PostgreSQL's simple protocol, which takes ``plan()`` and the statement together. psycopg 3, the
    driver SQLAlchemy 2.1 picks for a plain ``postgresql://`` URL (what the official chart writes),
    binds on the server, where PostgreSQL refuses two commands in one statement."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(dbapi, psycopg.Connection):
        return psycopg.ClientCursor(dbapi)
    return dbapi.cursor()


def _rows(cursor: Any, statement: str, params: dict) -> list:
    """The rows of a query string's last statement (psycopg 3 stands on its first result)."""
    cursor.execute(statement, params)
    if type(cursor).__module__.partition(".")[0] == "psycopg":
        while cursor.nextset():
            pass
    return cursor.fetchall()


def _key_params(tasks: Iterable[TaskKey], prefix: str = "") -> dict[str, list]:
    """The tasks as the statement's parallel arrays (a task without a region: the sentinel region)."""
    columns: list[list] = [[], [], [], [], []]
    for task in tasks:
        for column, value in zip(columns, task[:4]):
            column.append(value)
        columns[4].append(_region_id(task[4] if len(task) > 4 else ""))
    return {prefix + name: column
            for name, column in zip(("dag_ids", "task_ids", "run_ids", "map_indexes", "region_ids"), columns)}


def _region_id(region: str) -> str | None:
    """A key's region as the statement takes it: the canonical spelling of its UUID, parsed here
    (the statement compares ``uuid`` values and casts no text from a pod), or None, which equals
    no row, when the text is not a UUID."""
    try:
        return str(uuid.UUID(provider_compat.region_param(region)))
    except (TypeError, ValueError, AttributeError):
        return None


def _columns() -> dict[str, Any]:
    """The model's columns the reads use, by the names the fences know them by (None: the installed
    Airflow has no such column, read as NULL)."""
    from airflow.models.taskinstance import TaskInstance

    c, key = TaskInstance.__table__.c, provider_compat.task_columns()
    stored = {"map_index": key.index, "region": key.region}
    return {name: stored[name] if name in stored else c[name] for name in _COLUMNS}


@functools.lru_cache(maxsize=16)
def _loop_statement(engine: Any, parts: frozenset) -> str:
    """The loop's one statement: up to three kinds of rows in one snapshot, told apart by the first
    column, with only the ``parts`` the loop needs (an idle loop plans the digest alone):

    ``o``: rows of the tasks asked for whole; ``k``: a launch asked by task key whose task's row
    names another token, or NULLs when the task has no row (a launch whose row names its token
    returns nothing); ``d``: the live set's size and token-hash sum, and its tokens (comma-joined)
    only when those differ from the ones sent (the subquery runs only then).

    Each by-key probe is a LATERAL subquery behind LIMIT 1, which the planner cannot turn into a
    hash join over the whole task_instance table (which it chose for a thousand keys).
    """
    from airflow.models.taskinstance import TaskInstance

    prepare = engine.dialect.identifier_preparer
    table = prepare.format_table(TaskInstance.__table__)
    c = {name: None if column is None else prepare.format_column(column) for name, column in _columns().items()}
    stored = lambda name: "NULL" if c[name] is None else f"t.{c[name]}"  # noqa: E731
    inner = ", ".join(f"{stored(name)}{'::text' if name == 'region' else ''} AS {name}" for name in _COLUMNS)
    # The id as text: the driver would build a uuid.UUID per row only for str() to undo it.
    columns = ", ".join(f"ti.{name}" + ("::text" if name == "id" else "") for name in _COLUMNS)
    by_key = " AND ".join(f"t.{c[name]} = {{w}}.{name}" + ("_id" if name == "region" else "")
                          for name in _KEY if c[name] is not None)
    by_key += provider_compat.live_attempt("t")
    token = f"t.{c['external_executor_id']}"
    states = ", ".join(f"'{state}'" for state in LIVE_STATES)
    live = f"FROM {table} AS t WHERE t.{c['state']} IN ({states}) AND {token} IS NOT NULL"
    live += provider_compat.live_attempt("t")
    # A 32-bit hash summed exactly in a bigint: two different sets of the same size collide with a
    # chance of about 2^-32 per change, which can only delay a delete to the next change.
    digest = f"count(*) AS n, coalesce(sum(hashtext({token})::bigint), 0) AS s"

    def probe(alias: str) -> str:
        return f"LATERAL (SELECT {inner} FROM {table} AS t WHERE {by_key.format(w=alias)} LIMIT 1) AS ti"

    keys = ("unnest(%({p}dag_ids)s::varchar[], %({p}task_ids)s::varchar[], %({p}run_ids)s::varchar[],"
            " %({p}map_indexes)s::integer[], %({p}region_ids)s::uuid[]{extra})"
            " AS {w}(dag_id, task_id, run_id, map_index, region_id{columns})")
    branches = {
        "o": f"SELECT 'o', NULL, {columns} FROM {keys.format(p='', extra='', w='w', columns='')}"
             f" CROSS JOIN {probe('w')}",
        "k": f"SELECT 'k', k.token, {columns}"
             f" FROM {keys.format(p='key_', extra=', %(key_tokens)s::varchar[]', w='k', columns=', token')}"
             f" LEFT JOIN {probe('k')} ON true"
             f" WHERE ti.id IS NULL OR ti.external_executor_id IS DISTINCT FROM k.token",
        "d": f"SELECT 'd', NULL, d.n::text, d.s::text, NULL::integer, NULL::integer,"
             f" CASE WHEN d.n <> %(count)s OR d.s <> %(sum)s::bigint THEN"
             f" (SELECT coalesce(string_agg({token}, ','), '') {live}) END,"
             f" NULL, NULL, NULL, NULL::integer, NULL, NULL FROM (SELECT {digest} {live}) AS d",
    }
    return " UNION ALL ".join(branches[part] for part in ("o", "k", "d") if part in parts)


def _read_portable(wanted: set) -> list:
    """A launch batch spans few runs, so the planner uses the (dag_id, run_id) index and the
    statement stays small, where a 4-column tuple IN grew with every task."""
    from sqlalchemy import literal, select, tuple_

    if not wanted:
        return []
    key = provider_compat.task_columns()
    runs = sorted({(task[0], task[2]) for task in wanted})
    task_ids = sorted({task[1] for task in wanted})
    query = select(*(literal(None) if column is None else column for column in _columns().values())).where(
        tuple_(key.dag_id, key.run_id).in_(runs), key.task_id.in_(task_ids))
    live = provider_compat.live_attempt_clause()
    if live is not None:
        query = query.where(live)
    with db.bounded_connection() as conn:
        return conn.execute(query).all()


def _row(row: Any) -> TaskRow:
    state = row[1]
    return TaskRow(ti_id=str(row[0]), state=None if state is None else str(getattr(state, "value", state)),
                   try_number=int(row[2]), queued_by_job_id=row[3], external_executor_id=row[4], dag_id=row[5],
                   task_id=row[6], run_id=row[7], map_index=int(row[8]), hostname=row[9],
                   region=provider_compat.region_of(row[10]))


def _rows_of(rows: list, wanted: set) -> dict[TaskKey, TaskRow]:
    found = {}
    for row in rows:
        task = task_key(row[5], row[6], row[7], int(row[8]), provider_compat.region_of(row[10]))
        if task in wanted:
            found[task] = _row(row)
    return found
