"""The DB reads the verdicts need: one batched query per batch of tasks.

Rows are found by task (dag_id, task_id, run_id, map_index: the unique key every TI row keeps
across clears and retries), not by row id: a clear or a retry gives the row a new id, and only
the token then says whether a pod is still the task's current launch.

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

from fenced_k8s_executor.launch import TaskKey, TaskRow

#: Round trips made by this process (read by the benchmark; cheap to keep).
ROUND_TRIPS = 0

_COLUMNS = ("id", "state", "try_number", "queued_by_job_id", "external_executor_id", "dag_id", "task_id", "run_id",
            "map_index")


def read_rows(tasks: Iterable[TaskKey | None]) -> dict[TaskKey, TaskRow]:
    """Current rows of the given tasks, keyed by task; tasks absent from the result have no row.

    PostgreSQL: the exact tasks, joined on the unique (dag_id, task_id, run_id, map_index) index,
    one probe per task. Elsewhere: ``(dag_id, run_id) IN (...) AND task_id IN (...)``, filtered
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
    """One read of a loop: the rows, and which of the asked-about schedulers are running."""

    rows: dict[TaskKey, TaskRow]
    running: frozenset[int]


def read_with_peers(tasks: Iterable[TaskKey | None], peers: Iterable[tuple[TaskKey | None, int | None]],
                    alive_since: datetime) -> Reading:
    """``read_rows(tasks)``, plus the rows of other schedulers' launches in flight whose creating
    scheduler is not running, in the same statement.

    ``peers``: (task, creating SchedulerJob id or None) of each such launch. A creator is
    *running* when its job is ``running``, heartbeat after ``alive_since``, and no newer
    ``running`` scheduler job has the same hostname (a restarted container keeps its pod's
    hostname: the older process is gone even if its row was never closed). A running creator
    re-checks its own launches, so their rows are not read; a launch with no creator id is
    read. Only ``running`` matters for correctness: a peer taken for stopped just has its
    launches checked twice, and the caller judges a peer's launch only when its creator is not
    in ``running``, whatever the rows say.

    PostgreSQL: one constant statement (rows and job liveness in one snapshot); elsewhere two.
    Raises on DB errors, as ``read_rows`` does.
    """
    global ROUND_TRIPS
    from airflow import settings

    own = {tuple(task) for task in tasks if task is not None}
    asked = {(tuple(task), creator) for task, creator in peers if task is not None}
    if not asked:
        return Reading(read_rows(own), frozenset())
    engine = settings.engine
    ROUND_TRIPS += 1
    wanted = own | {task for task, _ in asked}
    if engine.dialect.name == "postgresql":
        rows, running = _read_postgresql_with_peers(engine, own, asked, alive_since)
        return Reading(_rows_of(rows, wanted), running)
    running = _running_schedulers(engine, {c for _, c in asked if c is not None}, alive_since)
    return Reading(_rows_of(_read_portable(engine, wanted), wanted), running)


def _read_postgresql(engine: Any, tasks: list) -> list:
    dag_ids, task_ids, run_ids, map_indexes = (list(column) for column in zip(*tasks))
    params = {"dag_ids": dag_ids, "task_ids": task_ids, "run_ids": run_ids, "map_indexes": map_indexes}
    return _execute(engine, _postgresql_statement(engine), params)


def _read_postgresql_with_peers(engine: Any, own: set, asked: set, alive_since: datetime) -> tuple[list, frozenset]:
    entries = [(task, None) for task in own] + list(asked)  # a task both ours and a peer's: read once by _rows_of
    dag_ids, task_ids, run_ids, map_indexes = (list(column) for column in zip(*(task for task, _ in entries)))
    params = {"dag_ids": dag_ids, "task_ids": task_ids, "run_ids": run_ids, "map_indexes": map_indexes,
              "creators": [creator for _, creator in entries],
              "peer_jobs": sorted({creator for _, creator in asked if creator is not None}),
              "since": alive_since}
    rows, running = [], set()
    for row in _execute(engine, _peers_statement(engine), params):
        if row[5] is None:  # the liveness part: a running creator's job id
            running.add(int(row[0]))
        else:
            rows.append(row)
    return rows, frozenset(running)


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
    # The id as text: the driver would build a uuid.UUID per row only for str() to undo it.
    columns = ", ".join(f"ti.{TaskInstance.__table__.c[name].name}" + ("::text" if name == "id" else "")
                        for name in _COLUMNS)
    return (f"SELECT {columns} FROM {table} AS ti"
            " JOIN unnest(%(dag_ids)s::varchar[], %(task_ids)s::varchar[], %(run_ids)s::varchar[],"
            " %(map_indexes)s::integer[]) AS wanted(dag_id, task_id, run_id, map_index)"
            " ON ti.dag_id = wanted.dag_id AND ti.task_id = wanted.task_id AND ti.run_id = wanted.run_id"
            " AND ti.map_index = wanted.map_index")


#: A running scheduler job whose process is still the newest on its host.
_RUNNING_JOB = ("{j}.job_type = 'SchedulerJob' AND {j}.state = 'running' AND {j}.latest_heartbeat > %(since)s"
                " AND NOT EXISTS (SELECT 1 FROM {job} AS newer WHERE newer.job_type = 'SchedulerJob'"
                " AND newer.state = 'running' AND newer.hostname = {j}.hostname AND newer.id > {j}.id)")


@functools.lru_cache(maxsize=4)
def _peers_statement(engine: Any) -> str:
    """The loop's statement with peers: the rows of our tasks, the rows of peers' tasks whose
    creator is not running, and (as rows whose task columns are NULL) the ids of the creators
    that are, all in one snapshot."""
    from airflow.jobs.job import Job
    from airflow.models.taskinstance import TaskInstance

    prepare = engine.dialect.identifier_preparer
    table, job = prepare.format_table(TaskInstance.__table__), prepare.format_table(Job.__table__)
    columns = ", ".join(f"ti.{TaskInstance.__table__.c[name].name}" + ("::text" if name == "id" else "")
                        for name in _COLUMNS)
    nulls = ", ".join(["NULL"] * (len(_COLUMNS) - 1))
    running = _RUNNING_JOB.format(j="j", job=job)
    return (f"WITH wanted AS (SELECT * FROM unnest(%(dag_ids)s::varchar[], %(task_ids)s::varchar[],"
            " %(run_ids)s::varchar[], %(map_indexes)s::integer[], %(creators)s::integer[])"
            " AS w(dag_id, task_id, run_id, map_index, creator)),"
            f" running AS (SELECT j.id FROM {job} AS j WHERE j.id = ANY(%(peer_jobs)s::integer[]) AND {running})"
            f" SELECT {columns} FROM {table} AS ti JOIN wanted"
            " ON ti.dag_id = wanted.dag_id AND ti.task_id = wanted.task_id AND ti.run_id = wanted.run_id"
            " AND ti.map_index = wanted.map_index"
            " WHERE wanted.creator IS NULL OR wanted.creator NOT IN (SELECT id FROM running)"
            f" UNION ALL SELECT running.id::text, {nulls} FROM running")


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
    from sqlalchemy import select, tuple_

    from airflow.models.taskinstance import TaskInstance

    runs = sorted({(dag_id, run_id) for dag_id, _, run_id, _ in wanted})
    task_ids = sorted({task_id for _, task_id, _, _ in wanted})
    query = select(*(TaskInstance.__table__.c[name] for name in _COLUMNS)).where(
        tuple_(TaskInstance.dag_id, TaskInstance.run_id).in_(runs), TaskInstance.task_id.in_(task_ids))
    with engine.connect() as conn:
        return conn.execute(query).all()


def _rows_of(rows: list, wanted: set) -> dict[TaskKey, TaskRow]:
    found = {}
    for row in rows:
        task = (row[5], row[6], row[7], int(row[8]))
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
        )
        found[task] = task_row
    return found
