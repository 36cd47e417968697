"""Version checks in one place: fail at import, naming installed and supported versions, when a
provider hook the fences override is missing (private hooks move between provider releases)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

SUPPORTED_PROVIDER = ">=10.25.0,<10.26"
SUPPORTED_AIRFLOW = ">=3.3.0,<3.4"

#: KubernetesExecutor methods we override or call; each must exist with these names.
REQUIRED_EXECUTOR_HOOKS = (
    "start",
    "sync",
    "end",
    "execute_async",
    "_process_workloads",
    "_should_create_pod_for_job",
    "_discard_stale_pod_creation_task",
    "_create_pods_sequentially",
    "_create_pods_concurrently",
    "_handle_pod_publish_error",
    "_change_state",
    "adopt_launched_task",
    "revoke_task",
    "_list_pods",
    # guards (API faults) and the 410-surviving watcher
    "_adopt_completed_pods",
    "get_pod_combined_search_str_to_pod_map",
    "try_adopt_task_instances",
    "_make_safe_label_value",
)

#: AirflowKubernetesScheduler methods we wrap on the executor's instance (both creation paths
#: build every pod through ``_build_pod_request``; the watcher factory is replaced).
REQUIRED_SCHEDULER_HOOKS = ("_build_pod_request", "run_next", "run_next_batch", "_make_kube_watcher")


class IncompatibleProviderError(ImportError):
    pass


def _installed(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def check(executor_cls: type, base_executor_cls: type, scheduler_cls: type) -> None:
    """Raise IncompatibleProviderError if a hook we rely on is missing."""
    missing = [name for name in REQUIRED_EXECUTOR_HOOKS if not callable(getattr(executor_cls, name, None))]
    missing += [f"AirflowKubernetesScheduler.{name}" for name in REQUIRED_SCHEDULER_HOOKS
                if not callable(getattr(scheduler_cls, name, None))]
    if not hasattr(base_executor_cls, "pre_assigns_external_executor_id"):
        missing.append("BaseExecutor.pre_assigns_external_executor_id")
    if missing:
        raise IncompatibleProviderError(
            "fenced-k8s-executor cannot fence this KubernetesExecutor: missing hooks "
            f"{', '.join(missing)}. Installed: apache-airflow {_installed('apache-airflow-core')}, "
            "apache-airflow-providers-cncf-kubernetes "
            f"{_installed('apache-airflow-providers-cncf-kubernetes')}; supported: apache-airflow "
            f"{SUPPORTED_AIRFLOW}, apache-airflow-providers-cncf-kubernetes {SUPPORTED_PROVIDER}."
        )
