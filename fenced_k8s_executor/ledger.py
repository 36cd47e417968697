"""The DB reads the verdicts need: one batched query per batch of tasks.

Rows are found by task (dag_id, task_id, run_id, map_index: the unique key every TI row keeps
across clears and retries), not by row id: a clear or a retry gives the row a new id, and only
the token then says whether a pod is still the task's current launch.

Always an independent (non-scoped) session: the executor's hooks may run inside the
scheduler's own transaction, whose row locks must not be committed or released early.
"""

from __future__ import annotations

from typing import Iterable

from fenced_k8s_executor.launch import TaskKey, TaskRow

#: Round trips made by this process (read by the benchmark; cheap to keep).
ROUND_TRIPS = 0


def read_rows(tasks: Iterable[TaskKey | None]) -> dict[TaskKey, TaskRow]:
    """Current rows of the given tasks, keyed by task; tasks absent from the result have no row.

    Raises on DB errors: callers treat an error as "no evidence", never as "gone".
    """
    global ROUND_TRIPS
    from sqlalchemy import select, tuple_

    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    wanted = {tuple(task) for task in tasks if task is not None}
    if not wanted:
        return {}
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
    ).where(
        tuple_(TaskInstance.dag_id, TaskInstance.task_id, TaskInstance.run_id, TaskInstance.map_index).in_(
            sorted(wanted)
        )
    )
    with create_session(scoped=False) as session:
        ROUND_TRIPS += 1
        rows = session.execute(query).all()
    found = {}
    for row in rows:
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
