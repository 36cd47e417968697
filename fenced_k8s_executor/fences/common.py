"""Small things every fence module shares, and the one value a scheduler loop's fences share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow.executors.workloads import ExecuteTask
from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_types import ADOPTED
from airflow.utils.state import TaskInstanceState

QUEUED = TaskInstanceState.QUEUED
RUNNING = TaskInstanceState.RUNNING
FAILED = TaskInstanceState.FAILED

__all__ = ["ADOPTED", "FAILED", "QUEUED", "RUNNING", "Loop", "TaskInstanceState", "workload_of"]


def workload_of(command: Any) -> Any:
    """The ExecuteTask workload a job or command carries, or None (other workload kinds)."""
    if command and isinstance(command[0], ExecuteTask):
        return command[0]
    return None


@dataclass
class Loop:
    """What the fences of one scheduler loop (one ``sync``) read and decided, dropped when it ends.

    The loop's first fence read (``InFlightFence._rows_for``) covers every task the loop will ask
    about (the watcher results, the creation batch) and every launch of this deployment in flight;
    later reads fetch only what it missed.
    """

    read: bool = False  # the loop's first read happened
    covered: set = field(default_factory=set)  # tasks whose rows are in ``rows`` (absent: no row)
    rows: dict = field(default_factory=dict)  # task -> TaskRow
    changed: list = field(default_factory=list)  # (Flying, row) of launches in flight whose row no longer names them
    reconciled: bool = False  # the in-flight reconcile ran this loop
    precreate: dict = field(default_factory=dict)  # id(job) -> (launch, pre-creation verdict)
    publish_failed: set = field(default_factory=set)  # id(job) of creations that did not go through
    state_verdicts: dict = field(default_factory=dict)  # id(result) -> (launch, verdict, row)
    handling: tuple | None = None  # (key, row) of the result the provider's _change_state is handling
