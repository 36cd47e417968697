"""The orphaned task instances a scheduler adopts, loaded in one statement instead of one per
attribute per task instance.

airflow-core's ``adopt_or_reset_orphaned_tasks`` selects the orphans with a few columns only
(``load_only``) and hands them to ``try_adopt_task_instances``; then the provider reads each one's
``queued_by_job_id`` and ``try_number`` (its key), and airflow-core, once adoption returns, its
``last_heartbeat_at`` and ``dag_run``. SQLAlchemy loads each of those attributes of each instance
with a statement of its own: four per orphan, 2,000 at a restart that hands over 500 pods, most of
a restarted scheduler's time to its first loop (the stock executor pays them too). ``preload``
loads them for every orphan in one statement, in the orphans' own session: within airflow-core's
transaction, which it neither commits nor releases (the lazy loads it replaces ran there too).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

log = logging.getLogger("fenced_k8s_executor")

#: What the provider and airflow-core read of each orphan after ``load_only`` (``dag_run`` apart).
COLUMNS = ("queued_by_job_id", "try_number", "last_heartbeat_at")
#: Ids per statement (SQLite's old limit on bound parameters is 999).
CHUNK = 900


def preload(tis: Sequence[Any]) -> None:
    """Load ``COLUMNS`` and ``dag_run`` of every TI of ``tis`` that lacks them, in its session. A DB
    error is raised, as the lazy load it replaces would have raised it (airflow-core rolls the
    adoption back and retries it); anything else leaves the lazy loads to do the work."""
    from sqlalchemy import inspect, select
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.orm import load_only

    from airflow.models.taskinstance import TaskInstance

    try:
        states = [inspect(ti) for ti in tis if isinstance(ti, TaskInstance)]
        states = [s for s in states if s.session is not None and s.identity is not None]
        missing = set().union(*(s.unloaded for s in states)) if states else set()
        columns = [getattr(TaskInstance, name) for name in COLUMNS if name in missing and hasattr(TaskInstance, name)]
        if not columns and "dag_run" not in missing:
            return
        wanted = {column.key for column in columns} | ({"dag_run"} & missing)
        session = states[0].session
        ids = [s.identity[0] for s in states if s.unloaded & wanted]
        for start in range(0, len(ids), CHUNK):
            # The model's own joined load of ``dag_run`` fills that relationship in the same statement.
            query = select(TaskInstance).where(TaskInstance.id.in_(ids[start:start + CHUNK]))
            query = query.options(load_only(TaskInstance.id, *columns))  # not the pickled executor_config
            session.execute(query).unique().all()
    except SQLAlchemyError:
        raise
    except Exception as error:  # noqa: BLE001 - an optimisation: the lazy loads still work
        log.warning("fenced_k8s_executor could not preload the orphaned task instances: %r", error)
