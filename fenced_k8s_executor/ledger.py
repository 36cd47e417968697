"""The DB reads the verdicts need: one batched query per batch of tasks.

Rows are found by task (dag_id, task_id, run_id, map_index: the unique key every TI row keeps
across clears and retries), not by row id: a clear or a retry gives the row a new id, and only
the token then says whether a pod is still the task's current launch.

Always an independent connection (never the scoped session): the executor's hooks may run inside
the scheduler's own transaction, whose row locks must not be committed or released early.
"""

from __future__ import annotations

from typing import Iterable

from fenced_k8s_executor.launch import TaskKey, TaskRow

#: Round trips made by this process (read by the benchmark; cheap to keep).
ROUND_TRIPS = 0


def read_rows(tasks: Iterable[TaskKey | None]) -> dict[TaskKey, TaskRow]:
    """Current rows of the given tasks, keyed by task; tasks absent from the result have no row.

    The predicate is ``(dag_id, run_id) IN (...) AND task_id IN (...)``, filtered to the exact
    tasks here: a launch batch spans few runs, so the planner uses the (dag_id, run_id) index and
    the statement stays small, where a 4-column tuple IN grew with every task in literal
    rendering and planning. Runs on a plain connection (no ORM unit of work).

    Raises on DB errors: callers treat an error as "no evidence", never as "gone".
    """
    global ROUND_TRIPS
    from sqlalchemy import select, tuple_

    from airflow import settings
    from airflow.models.taskinstance import TaskInstance

    wanted = {tuple(task) for task in tasks if task is not None}
    if not wanted:
        return {}
    runs = sorted({(dag_id, run_id) for dag_id, _, run_id, _ in wanted})
    task_ids = sorted({task_id for _, task_id, _, _ in wanted})
    query = select(
        TaskInstance.id,
        TaskInstance.state,
        TaskInstance.try_number,
        TaskInstance.queued_by_job_id,
        TaskInstance.external_executor_id,
        TaskInstance.dag_id,
        TaskInstance.task_id,
        TaskInstance.run_id,
        TaskInstance.map_index,
    ).where(tuple_(TaskInstance.dag_id, TaskInstance.run_id).in_(runs), TaskInstance.task_id.in_(task_ids))
    with settings.engine.connect() as conn:
        ROUND_TRIPS += 1
        rows = conn.execute(query).all()
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
            map_index=int(row[8]),
        )
        found[task_row.task] = task_row
    return found
