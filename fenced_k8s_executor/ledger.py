"""The DB reads the verdicts need: one batched query per batch of tasks.

Rows are found by task (dag_id, task_id, run_id, map_index, and on Airflow 3.4 the region: the
key every TI row keeps across clears and retries), not by row id: a clear or a retry gives the row
a new id, and only the token then says whether a pod is still the task's current launch. On 3.4,
where every attempt is a row of its own, only the live attempt is read. Which columns those are
on the installed Airflow is ``provider_compat``'s answer (``task_columns``, ``live_attempt``).

Always an independent connection (never the scoped session): the executor's hooks may run inside
the scheduler's own transaction, whose row locks must not be committed or released early.

On PostgreSQL the read is one constant statement with array parameters, handed to the driver as
is: the scheduler pays it on every loop with launches in flight, and building and compiling a
SQLAlchemy ``IN`` of N tuples cost more than the query itself; it matches the exact tasks, where
a runs x task ids predicate returned 34,000 rows for 500 tasks spread over 127 runs (a sweep page
or the launches in flight of a busy scheduler). Other databases get that predicate through
SQLAlchemy.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable

from fenced_k8s_executor import provider_compat
from fenced_k8s_executor.launch import TaskKey, TaskRow, task_key

#: Round trips made by this process (read by the benchmark; cheap to keep).
ROUND_TRIPS = 0

_COLUMNS = ("id", "state", "try_number", "queued_by_job_id", "external_executor_id", "dag_id", "task_id", "run_id")
#: The statements' array parameters of a list of tasks, in TaskKey order.
_KEY_PARAMS = ("dag_ids", "task_ids", "run_ids", "map_indexes", "region_ids")


def _key_params(tasks: list, prefix: str = "") -> dict[str, list]:
    """The tasks as the statements' parallel arrays (a task without a region: the sentinel one)."""
    columns: list[list] = [[], [], [], [], []]
    for task in tasks:
        for column, value in zip(columns, task[:4]):
            column.append(value)
        columns[4].append(provider_compat.region_param(task[4] if len(task) > 4 else ""))
    return {prefix + name: column for name, column in zip(_KEY_PARAMS, columns)}


def _select_sql(alias: str) -> str:
    """The row columns the statements return, ``_rows_of``'s order: ``_COLUMNS``, the stored map
    index, the region (NULL before Airflow 3.4)."""
    from airflow.models.taskinstance import TaskInstance

    c, key = TaskInstance.__table__.c, provider_compat.task_columns()
    # The id as text: the driver would build a uuid.UUID per row only for str() to undo it.
    columns = [f"{alias}.{c[name].name}" + ("::text" if name == "id" else "") for name in _COLUMNS]
    columns.append(f"{alias}.{key.index.name}")
    columns.append(f"{alias}.{key.region.name}::text" if key.region is not None else "NULL")
    return ", ".join(columns)


def _join_sql(alias: str, wanted: str) -> str:
    """``alias`` (task_instance) is the live attempt of ``wanted``'s task (an unnest of ``_KEY_PARAMS``)."""
    key = provider_compat.task_columns()
    on = (f"{alias}.{key.dag_id.name} = {wanted}.dag_id AND {alias}.{key.task_id.name} = {wanted}.task_id"
          f" AND {alias}.{key.run_id.name} = {wanted}.run_id AND {alias}.{key.index.name} = {wanted}.map_index")
    if key.region is not None:
        on += f" AND {alias}.{key.region.name} = {wanted}.region_id::uuid"
    return on + provider_compat.live_attempt(alias)


#: An unnest of a list of tasks (``_key_params`` with ``prefix``), its columns named as ``_join_sql`` reads them.
_UNNEST = ("unnest(%({p}dag_ids)s::varchar[], %({p}task_ids)s::varchar[], %({p}run_ids)s::varchar[],"
           " %({p}map_indexes)s::integer[], %({p}region_ids)s::varchar[]")
_UNNEST_NAMES = "dag_id, task_id, run_id, map_index, region_id"


def read_rows(tasks: Iterable[TaskKey | None]) -> dict[TaskKey, TaskRow]:
    """Current rows of the given tasks, keyed by task; tasks absent from the result have no row.

    PostgreSQL: the exact tasks, joined on the unique (dag_id, task_id, run_id, map_index) index
    (3.4: with the region, the live attempt), one probe per task. Elsewhere: ``(dag_id, run_id) IN (...) AND task_id IN (...)``, filtered
    to the exact tasks here. Runs on a plain connection (no ORM unit of work), in autocommit on
    PostgreSQL (one statement, its own snapshot).

    Raises on DB errors: callers treat an error as "no evidence", never as "gone".
    """
    global ROUND_TRIPS
    from airflow import settings

    wanted = {tuple(task) for task in tasks if task is not None}
    if not wanted:
        return {}
    engine = settings.engine
    ROUND_TRIPS += 1
    if engine.dialect.name == "postgresql":
        rows = _read_postgresql(engine, sorted(wanted))
    else:
        rows = _read_portable(engine, wanted)
    return _rows_of(rows, wanted)


@dataclass(frozen=True)
class Reading:
    """One read of a loop: our tasks' rows, the peers' launches whose row no longer names them, and
    which of the asked-about schedulers are running."""

    rows: dict[TaskKey, TaskRow]  # every task asked for as ours (absent: no row)
    superseded: dict[tuple[TaskKey, str], TaskRow | None]  # (task, token) of a peer's launch -> its row (None: gone)
    running: frozenset[int]


def read_with_peers(tasks: Iterable[TaskKey | None], peers: Iterable[tuple[TaskKey | None, str, int | None]],
                    alive_since: datetime) -> Reading:
    """``read_rows(tasks)`` and, in the same statement, the peers' launches in flight that may be
    stale: those whose creator is not running and whose task's row does not name their token.

    ``peers``: (task, token, creating SchedulerJob id or None) of each launch. A creator is
    *running* when its job is ``running``, heartbeat after ``alive_since``, and no newer
    ``running`` scheduler job has the same hostname (a restarted container keeps its pod's
    hostname: the older process is gone even if its row was never closed). A running creator
    re-checks its own launches; a launch with no creator id is always looked at. A launch whose
    row names its token is current and is not returned: in steady state the peers cost the
    database its index probes and this process nothing per launch. What is returned is the row
    itself, for the verdicts to judge; only a launch absent from ``superseded`` is taken for
    current, and only ``running`` says whose launches the caller may skip.

    PostgreSQL: one constant statement (rows and job liveness in one snapshot); elsewhere three
    (the rows read whole and compared here). Raises on DB errors, as ``read_rows`` does.
    """
    global ROUND_TRIPS
    from airflow import settings

    own = {tuple(task) for task in tasks if task is not None}
    asked = {(tuple(task), token, creator) for task, token, creator in peers if task is not None and token}
    if not asked:
        return Reading(read_rows(own), {}, frozenset())
    engine = settings.engine
    ROUND_TRIPS += 1
    if engine.dialect.name == "postgresql":
        return _read_postgresql_with_peers(engine, own, asked, alive_since)
    return _read_portable_with_peers(engine, own, asked, alive_since)


def _read_portable_with_peers(engine: Any, own: set, asked: set, alive_since: datetime) -> Reading:
    running = _running_schedulers(engine, {creator for _, _, creator in asked if creator is not None}, alive_since)
    wanted = own | {task for task, _, _ in asked}
    rows = _rows_of(_read_portable(engine, wanted), wanted)
    superseded = {(task, token): rows.get(task) for task, token, creator in asked
                  if creator not in running and (task not in rows or rows[task].external_executor_id != token)}
    return Reading({task: row for task, row in rows.items() if task in own}, superseded, running)


def _read_postgresql(engine: Any, tasks: list) -> list:
    return _execute(engine, _postgresql_statement(engine), _key_params(tasks))


def _read_postgresql_with_peers(engine: Any, own: set, asked: set, alive_since: datetime) -> Reading:
    own_list, peer_list = list(own), list(asked)
    params: dict[str, Any] = {"since": alive_since,
                              "peer_jobs": sorted({c for _, _, c in peer_list if c is not None}),
                              "tokens": [token for _, token, _ in peer_list],
                              "creators": [creator for _, _, creator in peer_list]}
    params.update(_key_params(own_list))
    params.update(_key_params([t for t, _, _ in peer_list], "peer_"))
    rows, superseded, running = [], {}, set()
    for kind, *row in _execute(engine, _peers_statement(engine), params):
        if kind == "o":
            rows.append(row[6:])
        elif kind == "p":  # (dag_id, task_id, run_id, map_index, token, region) of the launch, then its row or NULLs
            task = task_key(row[0], row[1], row[2], int(row[3]), provider_compat.region_of(row[5]))
            token, found = row[4], row[6:]
            superseded[(task, token)] = None if found[0] is None else _rows_of([found], {task})[task]
        else:
            running.add(int(row[0]))
    return Reading(_rows_of(rows, own), superseded, frozenset(running))


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


@functools.lru_cache(maxsize=4)
def _postgresql_statement(engine: Any) -> str:
    """The constant statement, with the table named as the metadata (and its schema) name it."""
    from airflow.models.taskinstance import TaskInstance

    table = engine.dialect.identifier_preparer.format_table(TaskInstance.__table__)
    return (f"SELECT {_select_sql('ti')} FROM {table} AS ti"
            f" JOIN {_UNNEST.format(p='')}) AS wanted({_UNNEST_NAMES}) ON {_join_sql('ti', 'wanted')}")


#: A running scheduler job whose process is still the newest on its host.
_RUNNING_JOB = ("{j}.job_type = 'SchedulerJob' AND {j}.state = 'running' AND {j}.latest_heartbeat > %(since)s"
                " AND NOT EXISTS (SELECT 1 FROM {job} AS newer WHERE newer.job_type = 'SchedulerJob'"
                " AND newer.state = 'running' AND newer.hostname = {j}.hostname AND newer.id > {j}.id)")


@functools.lru_cache(maxsize=4)
def _peers_statement(engine: Any) -> str:
    """The loop's statement with peers, three kinds of rows in one snapshot, told apart by the
    first column: ``o`` our tasks' rows; ``p`` a peer's launch whose creator is not running and
    whose task's row does not name its token (the launch's key and token, then the row, or NULLs
    when the task has no row); ``r`` a running creator's job id."""
    from airflow.jobs.job import Job
    from airflow.models.taskinstance import TaskInstance

    prepare = engine.dialect.identifier_preparer
    table, job = prepare.format_table(TaskInstance.__table__), prepare.format_table(Job.__table__)
    c = TaskInstance.__table__.c
    columns = _select_sql("ti")
    nulls = lambda n: ", ".join(["NULL"] * n)  # noqa: E731
    return (
        f"WITH ours AS (SELECT * FROM {_UNNEST.format(p='')}) AS w({_UNNEST_NAMES})),"
        f" peers AS (SELECT * FROM {_UNNEST.format(p='peer_')}, %(tokens)s::varchar[], %(creators)s::integer[])"
        f" AS p({_UNNEST_NAMES}, token, creator)),"
        f" running AS (SELECT j.id FROM {job} AS j WHERE j.id = ANY(%(peer_jobs)s::integer[])"
        f" AND {_RUNNING_JOB.format(j='j', job=job)})"
        f" SELECT 'o', {nulls(6)}, {columns} FROM {table} AS ti JOIN ours ON {_join_sql('ti', 'ours')}"
        " UNION ALL SELECT 'p', peers.dag_id, peers.task_id, peers.run_id, peers.map_index::text, peers.token,"
        f" peers.region_id, {columns}"
        f" FROM peers LEFT JOIN {table} AS ti ON {_join_sql('ti', 'peers')}"
        f" WHERE (peers.creator IS NULL OR peers.creator NOT IN (SELECT id FROM running))"
        f" AND (ti.{c['id'].name} IS NULL OR ti.{c['external_executor_id'].name} IS DISTINCT FROM peers.token)"
        f" UNION ALL SELECT 'r', running.id::text, {nulls(7 + len(_COLUMNS))} FROM running")


def _running_schedulers(engine: Any, creators: set, alive_since: datetime) -> frozenset:
    """Which of ``creators`` are running (as ``_RUNNING_JOB`` says), on databases other than PostgreSQL."""
    from sqlalchemy import and_, exists, select
    from sqlalchemy.orm import aliased

    from airflow.jobs.job import Job

    if not creators:
        return frozenset()
    newer = aliased(Job)
    query = select(Job.id).where(
        Job.id.in_(sorted(creators)), Job.job_type == "SchedulerJob", Job.state == "running",
        Job.latest_heartbeat > alive_since,
        ~exists().where(and_(newer.job_type == "SchedulerJob", newer.state == "running",
                             newer.hostname == Job.hostname, newer.id > Job.id)))
    with engine.connect() as conn:
        return frozenset(int(i) for i in conn.execute(query).scalars())


def _read_portable(engine: Any, wanted: set) -> list:
    """A launch batch spans few runs, so the planner uses the (dag_id, run_id) index and the
    statement stays small, where a 4-column tuple IN grew with every task."""
    from sqlalchemy import literal, select, tuple_

    from airflow.models.taskinstance import TaskInstance

    key = provider_compat.task_columns()
    runs = sorted({(task[0], task[2]) for task in wanted})
    task_ids = sorted({task[1] for task in wanted})
    region = key.region if key.region is not None else literal(None)
    query = select(*(TaskInstance.__table__.c[name] for name in _COLUMNS), key.index, region).where(
        tuple_(key.dag_id, key.run_id).in_(runs), key.task_id.in_(task_ids))
    live = provider_compat.live_attempt_clause()
    if live is not None:
        query = query.where(live)
    with engine.connect() as conn:
        return conn.execute(query).all()


def _rows_of(rows: list, wanted: set) -> dict[TaskKey, TaskRow]:
    found = {}
    for row in rows:
        region = provider_compat.region_of(row[9])
        task = task_key(row[5], row[6], row[7], int(row[8]), region)
        if task not in wanted:
            continue
        task_row = TaskRow(
            ti_id=str(row[0]),
            state=None if row[1] is None else str(getattr(row[1], "value", row[1])),
            try_number=int(row[2]),
            queued_by_job_id=row[3],
            external_executor_id=row[4],
            dag_id=row[5],
            task_id=row[6],
            run_id=row[7],
            map_index=task[3],
            region=region,
        )
        found[task] = task_row
    return found
