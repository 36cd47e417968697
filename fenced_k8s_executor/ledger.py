"""The DB reads the verdicts need: one statement per scheduler loop.

Rows are found by task (dag_id, task_id, run_id, map_index: the unique key every TI row keeps
across clears and retries), not by row id, whenever a fence needs the row itself: a clear or a
retry gives the row a new id, and only the token then says whether a pod is still the task's
current launch.

The launches in flight are asked differently (``InFlightReads``): every loop re-checks every one
of them, so the statement must cost the launches that did not change (nearly all of them) as
little as possible. It sends one ``uuid[]`` of their TI ids and one array of their tokens, probes
the primary key, and returns only what changed: a row that names another token (or none), and
the ids that vanished (a clear, a retry or a reset gave the task a new id). From the next loop on,
a launch whose id vanished is asked by its task key, in the same statement.

Always an independent connection (never the scoped session): the executor's hooks may run inside
the scheduler's own transaction, whose row locks must not be committed or released early. On
PostgreSQL the statements are constant, with array parameters handed to the driver as is.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterable

from fenced_k8s_executor.launch import LaunchIdentity, TaskKey, TaskRow

#: Round trips made by this process (read by the benchmark; cheap to keep).
ROUND_TRIPS = 0

_COLUMNS = ("id", "state", "try_number", "queued_by_job_id", "external_executor_id", "dag_id", "task_id", "run_id",
            "map_index", "hostname")
_KEY = ("dag_id", "task_id", "run_id", "map_index")


def read_rows(tasks: Iterable[TaskKey | None]) -> dict[TaskKey, TaskRow]:
    """Current rows of the given tasks, keyed by task; tasks absent from the result have no row.

    Raises on DB errors: callers treat an error as "no evidence", never as "gone".
    """
    return InFlightReads().read(tasks, ()).rows


@dataclass(frozen=True)
class Reading:
    """One read of a loop: the rows of the tasks asked for, and the launches in flight whose task's
    row does not name their token."""

    rows: dict[TaskKey, TaskRow]  # every task asked for (absent: no row)
    changed: dict[str, TaskRow | None]  # token of a launch in flight -> its task's row (None: no row)


def _array(values: Iterable[str]) -> str:
    """A PostgreSQL array literal of values that need no quoting (UUIDs): one string, built in
    microseconds, where a list would be adapted element by element on every loop."""
    return "{" + ",".join(values) + "}"


@dataclass(frozen=True)
class Probe:
    """The launches in flight as the loop's statement asks about them, built once per change of the
    set (not per loop): one launch per token, and its TI ids and tokens as PostgreSQL array literals."""

    launches: dict[str, LaunchIdentity]
    ids: str
    tokens: str


def probe(launches: Iterable[LaunchIdentity]) -> Probe:
    """Launches without a token or task are left out (legacy, or malformed: never put to the database)."""
    flying = {launch.token: launch for launch in launches if launch.token and launch.task is not None}
    return Probe(flying, _array(launch.ti_id for launch in flying.values()), _array(flying))


NOTHING = probe(())


class InFlightReads:
    """The loop's reads, remembering across loops which launches' TI ids vanished (asked by task key).

    Only the launches of the last read are remembered, so memory follows the launches in flight.
    """

    def __init__(self) -> None:
        self._by_key: set[str] = set()

    def read(self, tasks: Iterable[TaskKey | None], launches: Probe | Iterable[LaunchIdentity] = NOTHING) -> Reading:
        """Rows of ``tasks``, and each launch of ``launches`` whose task's current row does not name
        its token (its row, or None when the task has no row). Raises on DB errors."""
        global ROUND_TRIPS
        from airflow import settings

        wanted = {tuple(task) for task in tasks if task is not None}
        asked = launches if isinstance(launches, Probe) else probe(launches)
        flying = asked.launches
        if self._by_key:
            self._by_key &= flying.keys()
        if not wanted and not flying:
            return Reading({}, {})
        engine = settings.engine
        ROUND_TRIPS += 1
        if engine.dialect.name != "postgresql":
            return _read_portable_loop(engine, wanted, flying)
        by_key = [flying[token] for token in self._by_key]
        rows, changed, vanished = _read_postgresql_loop(engine, wanted, asked, by_key)
        vanished -= self._by_key  # asked by id too (the literal is built once), answered by key
        # A row found by the launch's TI id must be its task's: a pod whose id and annotations
        # disagree is judged by its own task's row, never by the row its id happens to name.
        vanished |= {token for token, row in changed.items() if row is not None and row.task != flying[token].task}
        for token in vanished:
            changed.pop(token, None)
        if vanished:  # their ids are gone: ask by task key, now and from the next loop on
            self._by_key |= vanished
            ROUND_TRIPS += 1
            _, found, _ = _read_postgresql_loop(engine, set(), NOTHING, [flying[token] for token in vanished])
            changed.update(found)
        return Reading(rows, changed)


def _read_portable_loop(engine: Any, wanted: set, flying: dict[str, LaunchIdentity]) -> Reading:
    """Elsewhere than PostgreSQL: every row read by task and compared here."""
    tasks = wanted | {launch.task for launch in flying.values()}
    rows = _rows_of(_read_portable(engine, tasks), tasks)
    changed = {token: rows.get(launch.task) for token, launch in flying.items()
               if launch.task not in rows or rows[launch.task].external_executor_id != token}
    return Reading({task: row for task, row in rows.items() if task in wanted}, changed)


def _read_postgresql_loop(engine: Any, wanted: set, by_id: Probe, by_key: list) -> tuple[dict, dict, set]:
    """(rows of ``wanted``, changed launches, tokens of launches whose TI id vanished)."""
    ours = list(zip(*wanted)) if wanted else [(), (), (), ()]
    keyed = list(zip(*(launch.task for launch in by_key))) if by_key else [(), (), (), ()]
    params: dict[str, Any] = {"ids": by_id.ids, "tokens": by_id.tokens,
                              "key_tokens": _array(launch.token for launch in by_key)}
    for prefix, columns in (("", ours), ("key_", keyed)):
        for name, column in zip(("dag_ids", "task_ids", "run_ids", "map_indexes"), columns):
            params[prefix + name] = list(column)
    rows, changed, vanished = [], {}, set()
    for kind, token, *row in _execute(engine, _loop_statement(engine), params):
        if kind == "o":
            rows.append(row)
        elif kind == "m":
            vanished.add(token)
        elif kind == "k" or token not in changed:  # "s" (by id) or "k" (by key, which wins): the row or NULLs
            changed[token] = None if row[0] is None else _row(row)
    return _rows_of(rows, wanted), changed, vanished


def _execute(engine: Any, statement: str, params: dict) -> list:
    # One statement needs no transaction: in autocommit psycopg2 sends no BEGIN and no ROLLBACK
    # (2 round trips with the pool's pre-ping, not 4). The DBAPI flag is flipped directly, as
    # SQLAlchemy's own pre-ping does: its isolation_level="AUTOCOMMIT" option would leave the
    # pooled connection with an explicit READ COMMITTED level, after which psycopg2 sends
    # "SET default_transaction_isolation" on every later autocommit switch, Airflow's included.
    with engine.connect() as conn:
        dbapi = conn.connection.dbapi_connection
        dbapi.autocommit = True
        try:
            # A client-side cursor whatever the engine's options: with stream_results SQLAlchemy
            # reads a row ahead, which the raw fetch below would miss (a task read as gone).
            result = conn.exec_driver_sql(statement, params, execution_options={"stream_results": False})
            try:
                return result.cursor.fetchall()  # the driver's tuples: a Row per row cost more than the query
            finally:
                result.close()
        finally:
            if not dbapi.closed:
                dbapi.autocommit = False


def _columns() -> dict[str, Any]:
    """The model's columns the reads use, by the names the fences know them by."""
    from airflow.models.taskinstance import TaskInstance

    return {name: TaskInstance.__table__.c[name] for name in _COLUMNS}


@functools.lru_cache(maxsize=4)
def _loop_statement(engine: Any) -> str:
    """The loop's one statement: four kinds of rows in one snapshot, told apart by the first column.

    ``o``: rows of the tasks asked for whole; ``s``: a launch (asked by TI id) whose row names
    another token or none; ``m``: a launch whose TI id no longer exists; ``k``: a launch asked by
    task key whose task's row names another token, or NULLs when the task has no row. A launch
    whose row names its token returns nothing: the steady state costs its index probe alone.
    """
    from airflow.models.taskinstance import TaskInstance

    prepare = engine.dialect.identifier_preparer
    table = prepare.format_table(TaskInstance.__table__)
    c = {name: prepare.format_column(column) for name, column in _columns().items()}
    # The id as text: the driver would build a uuid.UUID per row only for str() to undo it.
    columns = ", ".join(f"ti.{c[name]}" + ("::text" if name == "id" else "") for name in _COLUMNS)
    nulls = ", ".join(["NULL"] * len(_COLUMNS))
    on = " AND ".join(f"ti.{c[name]} = {{w}}.{name}" for name in _KEY)
    differs = f"ti.{c['external_executor_id']} IS DISTINCT FROM {{w}}.token"
    return (
        "WITH ours AS (SELECT * FROM unnest(%(dag_ids)s::varchar[], %(task_ids)s::varchar[], %(run_ids)s::varchar[],"
        " %(map_indexes)s::integer[]) AS w(dag_id, task_id, run_id, map_index)),"
        " by_id AS (SELECT * FROM unnest(%(ids)s::uuid[], %(tokens)s::varchar[]) AS p(id, token)),"
        " by_key AS (SELECT * FROM unnest(%(key_dag_ids)s::varchar[], %(key_task_ids)s::varchar[],"
        " %(key_run_ids)s::varchar[], %(key_map_indexes)s::integer[], %(key_tokens)s::varchar[])"
        " AS k(dag_id, task_id, run_id, map_index, token))"
        f" SELECT 'o', NULL, {columns} FROM {table} AS ti JOIN ours ON {on.format(w='ours')}"
        f" UNION ALL SELECT CASE WHEN ti.{c['id']} IS NULL THEN 'm' ELSE 's' END, by_id.token,"
        f" {columns} FROM by_id LEFT JOIN {table} AS ti ON ti.{c['id']} = by_id.id"
        f" WHERE ti.{c['id']} IS NULL OR {differs.format(w='by_id')}"
        f" UNION ALL SELECT 'k', by_key.token, {columns} FROM by_key LEFT JOIN {table} AS ti ON {on.format(w='by_key')}"
        f" WHERE ti.{c['id']} IS NULL OR {differs.format(w='by_key')}")


def _read_portable(engine: Any, wanted: set) -> list:
    """A launch batch spans few runs, so the planner uses the (dag_id, run_id) index and the
    statement stays small, where a 4-column tuple IN grew with every task."""
    from sqlalchemy import select, tuple_

    from airflow.models.taskinstance import TaskInstance

    if not wanted:
        return []
    runs = sorted({(dag_id, run_id) for dag_id, _, run_id, _ in wanted})
    task_ids = sorted({task_id for _, task_id, _, _ in wanted})
    query = select(*_columns().values()).where(
        tuple_(TaskInstance.dag_id, TaskInstance.run_id).in_(runs), TaskInstance.task_id.in_(task_ids))
    with engine.connect() as conn:
        return conn.execute(query).all()


def _row(row: Any) -> TaskRow:
    state = row[1]
    return TaskRow(ti_id=str(row[0]), state=None if state is None else str(getattr(state, "value", state)),
                   try_number=int(row[2]), queued_by_job_id=row[3], external_executor_id=row[4], dag_id=row[5],
                   task_id=row[6], run_id=row[7], map_index=int(row[8]), hostname=row[9])


def _rows_of(rows: list, wanted: set) -> dict[TaskKey, TaskRow]:
    found = {}
    for row in rows:
        task = (row[5], row[6], row[7], int(row[8]))
        if task in wanted:
            found[task] = _row(row)
    return found
