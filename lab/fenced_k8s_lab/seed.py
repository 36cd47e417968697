"""Bulk metadata for the benchmark: DAGs, runs and queued task instances written in bulk SQL,
to fill a realistic DB quickly (thousands of rows in seconds).

Not for tests or scenarios: anything that moves a task instance (queueing, re-queueing,
clearing, retrying, running) goes through airflow-core's own code in ``lab.core``. The
transition helpers that imitated the scheduler here (same-id re-queue, clear to the next try,
state changes) are gone for that reason.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Iterable

import sqlalchemy as sa

BUNDLE = "dags-folder"


@dataclass(frozen=True)
class SeededTI:
    id: str
    dag_id: str
    task_id: str
    run_id: str
    try_number: int
    map_index: int
    dag_version_id: str
    token: str | None


def index_column(engine: sa.Engine) -> str:
    """The stored map-index column of task_instance: Airflow 3.4 renamed it region_index (its new
    region_id and working_set columns have server defaults: a seeded row is a live, unregioned task)."""
    return "region_index" if "region_index" in _columns(engine, "task_instance") else "map_index"


def seed_dag(engine: sa.Engine, dag_id: str) -> str:
    """Bundle, DAG and one DAG version; returns the dag_version id."""
    version_id = str(uuid.uuid4())
    # partition_mapper_info (NOT NULL) exists from Airflow 3.3's schema on; 3.2's dag table has none.
    partitioned = "partition_mapper_info" in _columns(engine, "dag")
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO dag_bundle(name) VALUES (:b) ON CONFLICT DO NOTHING"), {"b": BUNDLE})
        conn.execute(
            sa.text(
                "INSERT INTO dag(dag_id, is_paused, is_stale, bundle_name, timetable_type,"
                + (" partition_mapper_info," if partitioned else "")
                + " max_active_tasks, max_consecutive_failed_dag_runs, has_task_concurrency_limits, owners,"
                " relative_fileloc) VALUES (:d, false, false, :b, '',"
                + (" '{}'," if partitioned else "")
                + " 16, 0, false, 'lab', :f) ON CONFLICT DO NOTHING"
            ),
            {"d": dag_id, "b": BUNDLE, "f": f"{dag_id}.py"},
        )
        conn.execute(
            sa.text(
                "INSERT INTO dag_version(id, version_number, dag_id, bundle_name, created_at, last_updated)"
                " VALUES (:v, 1, :d, :b, now(), now())"
            ),
            {"v": version_id, "d": dag_id, "b": BUNDLE},
        )
    return version_id


def _columns(engine: sa.Engine, table: str) -> set[str]:
    return {column["name"] for column in sa.inspect(engine).get_columns(table)}


def seed_run(engine: sa.Engine, dag_id: str, run_id: str, dag_version_id: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO dag_run(dag_id, run_id, run_type, run_after, state, logical_date, start_date,"
                " created_dag_version_id) VALUES (:d, :r, 'manual', now(), 'running', now(), now(), :v)"
            ),
            {"d": dag_id, "r": run_id, "v": dag_version_id},
        )


def insert_tis(
    engine: sa.Engine,
    dag_id: str,
    run_id: str,
    dag_version_id: str,
    task_ids: Iterable[str],
    *,
    state: str = "queued",
    queued_by_job_id: int | None = None,
    with_token: bool = True,
    try_number: int = 1,
) -> list[SeededTI]:
    """Insert task instances as the scheduler leaves them after queueing (token pre-assigned)."""
    made = []
    for task_id in task_ids:
        made.append(
            SeededTI(
                id=str(uuid.uuid4()),
                dag_id=dag_id,
                task_id=task_id,
                run_id=run_id,
                try_number=try_number,
                map_index=-1,
                dag_version_id=dag_version_id,
                token=str(uuid.uuid4()) if with_token else None,
            )
        )
    if made:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO task_instance(id, task_id, dag_id, run_id, {index_column(engine)}, try_number, max_tries,"
                    " pool, pool_slots, state, queue, priority_weight, dag_version_id, external_executor_id,"
                    " queued_by_job_id, queued_dttm) VALUES (:id, :task_id, :dag_id, :run_id, -1, :try_number, 2,"
                    " 'default_pool', 1, :state, 'default', 1, :v, :token, :job, now())"
                ),
                [
                    {
                        "id": ti.id,
                        "task_id": ti.task_id,
                        "dag_id": ti.dag_id,
                        "run_id": ti.run_id,
                        "try_number": ti.try_number,
                        "state": state,
                        "v": ti.dag_version_id,
                        "token": ti.token,
                        "job": queued_by_job_id,
                    }
                    for ti in made
                ],
            )
    return made


def row(engine: sa.Engine, ti_id: str) -> dict | None:
    with engine.connect() as conn:
        found = conn.execute(
            sa.text(
                "SELECT id, state, try_number, external_executor_id, queued_by_job_id FROM task_instance WHERE id=:id"
            ),
            {"id": ti_id},
        ).mappings().first()
    return dict(found) if found else None
