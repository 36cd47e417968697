"""Launch identity: which QUEUED transition of a task instance a job or a pod belongs to.

Pure data and pure conversions to and from pod metadata. A *token* is the UUID the scheduler
pre-assigns to ``TaskInstance.external_executor_id`` for every QUEUED transition; anything else
found there (None, or a scheduler job id written by the stock executor) is *legacy* and never
used as evidence.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Mapping

from fenced_k8s_executor.names import (
    SCHEDULER_JOB_ANNOTATION,
    TI_ID_ANNOTATION,
    TOKEN_ANNOTATION,
    TI_ID_LABEL,
    TOKEN_LABEL,
    TRY_NUMBER_ANNOTATION,
)

POD_NAME_MAX = 63


def as_token(value: object) -> str | None:
    """Return the canonical token if ``value`` is a launch token (a UUID), else None (legacy)."""
    if value is None:
        return None
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        return None


@dataclass(frozen=True)
class LaunchIdentity:
    """One launch: the TI row id, its launch token, the try and the scheduler that launched it."""

    ti_id: str
    token: str | None
    try_number: int
    scheduler_job_id: str | None = None

    @property
    def legacy(self) -> bool:
        return as_token(self.token) is None

    def annotations(self) -> dict[str, str]:
        data = {TI_ID_ANNOTATION: self.ti_id, TRY_NUMBER_ANNOTATION: str(self.try_number)}
        if self.token:
            data[TOKEN_ANNOTATION] = self.token
        if self.scheduler_job_id is not None:
            data[SCHEDULER_JOB_ANNOTATION] = str(self.scheduler_job_id)
        return data

    def labels(self) -> dict[str, str]:
        labels = {TI_ID_LABEL: self.ti_id}
        if self.token:
            labels[TOKEN_LABEL] = self.token
        return labels


@dataclass(frozen=True)
class TaskRow:
    """What the metadata DB says about a task instance id right now."""

    ti_id: str
    state: str | None
    try_number: int
    queued_by_job_id: int | None
    external_executor_id: str | None

    @property
    def token(self) -> str | None:
        return as_token(self.external_executor_id)


def from_pod_metadata(annotations: Mapping[str, str] | None) -> LaunchIdentity | None:
    """The launch identity a pod carries, or None for a pod without our annotations (legacy)."""
    annotations = annotations or {}
    ti_id = annotations.get(TI_ID_ANNOTATION)
    if not ti_id:
        return None
    try:
        try_number = int(annotations.get(TRY_NUMBER_ANNOTATION, "0"))
    except ValueError:
        try_number = 0
    return LaunchIdentity(
        ti_id=str(ti_id),
        token=as_token(annotations.get(TOKEN_ANNOTATION)),
        try_number=try_number,
        scheduler_job_id=annotations.get(SCHEDULER_JOB_ANNOTATION),
    )


_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def pod_name(dag_id: str, task_id: str, token: str, attempt: int = 0) -> str:
    """Deterministic pod name for one launch and pod attempt (DNS-1123 label, <= 63 chars).

    The same launch and attempt always yield the same name, so a create that timed out after
    the API server stored the pod is answered 409 AlreadyExists on retry instead of making a
    second pod; a pre-execution requeue (next attempt) gets a fresh name.
    """
    suffix = f"-{uuid.UUID(token).hex[:16]}-{attempt}"
    slug = _NOT_DNS.sub("-", f"{dag_id}-{task_id}".lower()).strip("-") or "task"
    slug = slug[: POD_NAME_MAX - len(suffix)].rstrip("-") or "task"
    return f"{slug}{suffix}"
