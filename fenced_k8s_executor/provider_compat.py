"""What differs between the supported cncf-kubernetes provider releases, in one place.

The fences never ask which provider release is installed: whatever differs between the releases
they support (10.23.0 to 10.25.x) is answered here, by looking at the provider's own classes once
at import, and tested in ``tests/unit/test_compat.py``. Read off the wheels:

- 10.23.0 first ships the pre-creation stale check the creation fence overrides
  (``_should_create_pod_for_job`` / ``_discard_stale_pod_creation_task``); 10.21-10.22 create
  pods without any hook between dequeue and create. ``compat`` refuses those.
- 10.24.0 adds ``supports_task_instance_uuid`` and ``team_name`` to ``KubernetesJobWatcher``'s
  constructor (10.23.0 takes neither), and the ``task_instance_id`` annotation
  (``TASK_INSTANCE_ID_ANNOTATION``) that UUID-keyed executors (Airflow 3.4 core) put on pods.
  The fences use neither the annotation nor UUID keys (``compat`` refuses a core that turns
  UUID keys on): they carry the task instance id in their own annotation.
- 10.25.0 adds an executor key to ``running`` before ``execute_async`` (10.23-10.24: after).
  The fences record a batch's launches after the provider's ``_process_workloads`` loop, when
  either order has added them.

And what differs between the supported airflow-core releases under the provider (3.4 against
3.2/3.3), answered by looking at core's classes and the ``TaskInstance`` model:

- executor keys: with ``BaseExecutor.get_task_key`` (3.4) provider 10.24+ keys ``running``, the
  event buffer and its own maps by ``TaskInstanceUuid``, else by ``TaskInstanceKey``
  (``executor_key``); 3.4 queues workloads in ``executor_queues`` (``queued_workloads``);
- rows: 3.4 keeps one row per attempt (``working_set`` marks the live one; ``live_attempt``),
  stores the map index as ``region_index`` (``map_index`` is only an ORM synonym) next to
  ``region_id`` (``task_columns``); a task's key gains its region when it has one
  (``region_of``);
- pods: 3.4's provider reads the ``task_instance_id`` annotation (or the stock worker's
  arguments) to find a pod's attempt; the fences put it on every pod they stamp, since their
  worker entrypoint's arguments do not parse as the stock ones (``TASK_INSTANCE_ID_ANNOTATION``).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, NamedTuple

from airflow.providers.cncf.kubernetes.executors import kubernetes_executor_types
from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_utils import KubernetesJobWatcher

#: Keyword arguments of ``KubernetesJobWatcher`` that only some supported releases take (10.24+),
#: each read from the ``AirflowKubernetesScheduler`` attribute of the same name (default if absent).
OPTIONAL_WATCHER_ARGS = {
    "supports_task_instance_uuid": False,
    "team_name": None,
}
#: What every supported release's watcher takes (the provider's ``_make_kube_watcher`` passes them).
REQUIRED_WATCHER_ARGS = ("watcher_queue", "namespace", "resource_version", "scheduler_job_id", "kube_config")


def _parameters(cls: type) -> set[str]:
    return set(inspect.signature(cls.__init__).parameters)


def missing_watcher_args(watcher_cls: type = KubernetesJobWatcher) -> list[str]:
    """The arguments every supported release's watcher takes that ``watcher_cls`` does not."""
    params = _parameters(watcher_cls)
    return [name for name in REQUIRED_WATCHER_ARGS if name not in params]


def watcher_kwargs(kube_scheduler: Any, namespace: str, resource_version: str | None,
                   watcher_cls: type = KubernetesJobWatcher) -> dict[str, Any]:
    """The constructor arguments of a pod watcher for ``namespace``, as the installed provider's own
    ``_make_kube_watcher`` builds them: the optional ones only where its watcher takes them."""
    params = _parameters(watcher_cls)
    kwargs: dict[str, Any] = {
        "watcher_queue": kube_scheduler.watcher_queue,
        "namespace": namespace,
        "resource_version": resource_version,
        "scheduler_job_id": kube_scheduler.scheduler_job_id,
        "kube_config": kube_scheduler.kube_config,
    }
    for arg, default in OPTIONAL_WATCHER_ARGS.items():
        if arg in params:
            kwargs[arg] = getattr(kube_scheduler, arg, default)
    return kwargs


# ---------------------------------------------------------------- executor keys and queues

#: The annotation (and label) 3.4's provider reads a pod's attempt from (10.24+ names it; the same
#: string on every release, so pods stamped under 10.23 or Airflow 3.3 carry it across an upgrade).
TASK_INSTANCE_ID_ANNOTATION = getattr(kubernetes_executor_types, "TASK_INSTANCE_ID_ANNOTATION", "task_instance_id")
TASK_INSTANCE_ID_LABEL = getattr(kubernetes_executor_types, "TASK_INSTANCE_ID_LABEL", "ti_id")


def uuid_keys(executor: Any) -> bool:
    """Whether the provider keys this executor by ``TaskInstanceUuid`` (its own switch)."""
    return bool(getattr(executor, "supports_task_instance_uuid", False))


def executor_key(executor: Any, ti: Any) -> Any:
    """The key the provider uses for ``ti`` in ``running``, the event buffer and its own maps,
    exactly as its ``_process_workloads`` computes it."""
    return executor.get_task_key(ti) if uuid_keys(executor) else ti.key


def queued_workloads(executor: Any) -> dict:
    """The executor's queued ``ExecuteTask`` workloads by key: ``executor_queues`` (3.4; its
    ``queued_tasks`` is a deprecated alias that warns), else ``queued_tasks``."""
    queues = getattr(executor, "executor_queues", None)
    if queues is not None:
        from airflow.executors.workloads import WorkloadType

        return queues[WorkloadType.EXECUTE_TASK]
    return executor.queued_tasks


# ---------------------------------------------------------------- task rows

#: The region of a task outside any dynamic region (3.4's ``SENTINEL_REGION_ID``), and of every
#: task before 3.4: spelled "" in a task key, which then keeps its four pre-3.4 parts.
SENTINEL_REGION = "00000000-0000-0000-0000-000000000000"


class TaskColumns(NamedTuple):
    """``task_instance`` columns the ledger reads, from the model (SQLAlchemy ``Column`` objects)."""

    dag_id: Any
    task_id: Any
    run_id: Any
    index: Any  # region_index (3.4) or map_index
    region: Any | None  # region_id (3.4), else None
    live: Any | None  # working_set (3.4), else None


@functools.cache
def task_columns() -> TaskColumns:
    """The task-key columns of ``TaskInstance.__table__``, read off the installed model: a core
    statement on the table names the stored columns, never the ORM synonym ``map_index``."""
    from airflow.models.taskinstance import TaskInstance

    c = TaskInstance.__table__.c
    index = c["region_index"] if "region_index" in c else c["map_index"]
    return TaskColumns(c["dag_id"], c["task_id"], c["run_id"], index, c.get("region_id"), c.get("working_set"))


def live_attempt(alias: str | None = None) -> str:
    """SQL predicate (`` AND ...`` or "") keeping only the live attempt of each task: 3.4 keeps
    archived attempts as rows of their own, which a core statement on the table sees too."""
    live = task_columns().live
    if live is None:
        return ""
    return f" AND {alias + '.' if alias else ''}{live.name} IS TRUE"


def live_attempt_clause() -> Any | None:
    """The same predicate as a SQLAlchemy clause (None before 3.4)."""
    live = task_columns().live
    return None if live is None else live.is_(True)


def region_of(value: Any) -> str:
    """A task's region as its key spells it: "" outside a dynamic region (or before 3.4), else the UUID."""
    if value is None:
        return ""
    text = str(value).strip().lower()
    return "" if not text or text == SENTINEL_REGION else text


def region_param(region: str) -> str:
    """The stored ``region_id`` of a key's region (""  is the sentinel region)."""
    return region or SENTINEL_REGION


def stored_index(ti: Any) -> int:
    """A workload's or TI's stored map index: 3.4's ``region_index`` where set, else ``map_index``."""
    index = getattr(ti, "region_index", None)
    if index is None:
        index = ti.map_index
    return int(index if index is not None else -1)
