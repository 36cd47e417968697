"""The DB reads the verdicts need: one batched primary-key query per batch of TI ids.

Always an independent (non-scoped) session: the executor's hooks may run inside the
scheduler's own transaction, whose row locks must not be committed or released early.
"""

from __future__ import annotations

from typing import Iterable

from fenced_k8s_executor.launch import TaskRow

#: Round trips made by this process (read by the benchmark; cheap to keep).
ROUND_TRIPS = 0


def _ti_id_values(ti_ids: Iterable[str]) -> list:
    from airflow.models.taskinstance import TaskInstance

    try:
        kind = TaskInstance.id.type.python_type
    except NotImplementedError:  # pragma: no cover - string ids on old schemas
        kind = str
    values = []
    for ti_id in ti_ids:
        try:
            values.append(kind(str(ti_id)))
        except ValueError:
            continue  # not an id this schema can hold: it cannot name a row
    return values


def read_rows(ti_ids: Iterable[str]) -> dict[str, TaskRow]:
    """Current rows for the given TI ids, keyed by ``str(id)``; ids absent from the result are gone.

    Raises on DB errors: callers treat an error as "no evidence", never as "gone".
    """
    global ROUND_TRIPS
    from sqlalchemy import select

    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    values = _ti_id_values(set(ti_ids))
    if not values:
        return {}
    query = select(
        TaskInstance.id,
        TaskInstance.state,
        TaskInstance.try_number,
        TaskInstance.queued_by_job_id,
        TaskInstance.external_executor_id,
    ).where(TaskInstance.id.in_(values))
    with create_session(scoped=False) as session:
        ROUND_TRIPS += 1
        rows = session.execute(query).all()
    return {
        str(row[0]): TaskRow(
            ti_id=str(row[0]),
            state=None if row[1] is None else str(getattr(row[1], "value", row[1])),
            try_number=int(row[2]),
            queued_by_job_id=row[3],
            external_executor_id=row[4],
        )
        for row in rows
    }
