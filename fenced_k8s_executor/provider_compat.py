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
"""

from __future__ import annotations

import inspect
from typing import Any

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
