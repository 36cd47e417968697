"""Small things every fence module shares."""

from __future__ import annotations

from typing import Any

from airflow.executors.workloads import ExecuteTask
from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_types import ADOPTED
from airflow.utils.state import TaskInstanceState

QUEUED = TaskInstanceState.QUEUED
RUNNING = TaskInstanceState.RUNNING
FAILED = TaskInstanceState.FAILED

__all__ = ["ADOPTED", "FAILED", "QUEUED", "RUNNING", "workload_of"]


def workload_of(command: Any) -> Any:
    """The ExecuteTask workload a job or command carries, or None (other workload kinds)."""
    if command and isinstance(command[0], ExecuteTask):
        return command[0]
    return None
