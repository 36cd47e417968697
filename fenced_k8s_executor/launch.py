"""Launch identity: which QUEUED transition of a task instance a job or a pod belongs to.

Pure data and pure conversions to and from pod metadata. A *token* is the UUID the scheduler
pre-assigns to ``TaskInstance.external_executor_id`` for every QUEUED transition; anything else
found there (None, or a scheduler job id written by the stock executor) is *legacy* and never
used as evidence.
"""

from __future__ import annotations

import functools
import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Mapping

from fenced_k8s_executor.names import (
    DEPLOYMENT_ANNOTATION,
    DEPLOYMENT_LABEL,
    REGION_ANNOTATION,
    SCHEDULER_HEARTBEAT_ANNOTATION,
    SCHEDULER_JOB_ANNOTATION,
    SCHEDULER_STARTED_ANNOTATION,
    TI_ID_ANNOTATION,
    TOKEN_ANNOTATION,
    TI_ID_LABEL,
    TOKEN_LABEL,
    TRY_NUMBER_ANNOTATION,
)

POD_NAME_MAX = 63
#: The longest timestamp annotation read (an ISO 8601 UTC time with microseconds is 32 characters).
STAMP_MAX = 40


#: A launch token as the scheduler writes it (``str(uuid4())``): taken as is, no parse, no cache.
_CANONICAL = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def as_token(value: object) -> str | None:
    """Return the canonical token if ``value`` is a launch token (a UUID), else None (legacy)."""
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    return text if _CANONICAL.fullmatch(text) else _parsed(text)


@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> str | None:
    """Any other spelling (upper case, braces, a job id) is parsed once: a legacy row or pod is
    compared again every loop. Canonical tokens skip this cache, so a sweep over 100,000 pods
    does not fill it."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None


#: A task, independent of its row id and try: (dag_id, task_id, run_id, map_index), plus its region
#: for a task inside an Airflow 3.4 dynamic region (two iterations of a loop share the other four).
#: The row for a task keeps this key across clears and retries, which give it a new id.
TaskKey = tuple  # tuple[str, str, str, int] | tuple[str, str, str, int, str]


def task_key(dag_id: str, task_id: str, run_id: str, map_index: int, region: str = "") -> TaskKey:
    return (dag_id, task_id, run_id, map_index, region) if region else (dag_id, task_id, run_id, map_index)


@dataclass(frozen=True)
class Launcher:
    """The scheduler process that launched a pod: its SchedulerJob id and ``start_date``, and a
    ``latest_heartbeat`` of that job the DB had committed when the pod was built (aware datetimes).
    A job id alone does not say which process it was, nor that it was alive then: only a delete
    needs this, and a pod whose launcher is unknown is never deleted for its launcher's sake."""

    job_id: int
    started: datetime
    heartbeat: datetime

    def __post_init__(self) -> None:
        if self.started.utcoffset() is None or self.heartbeat.utcoffset() is None:
            raise ValueError("Launcher times must be timezone-aware")

    def annotations(self) -> dict[str, str]:
        return {SCHEDULER_STARTED_ANNOTATION: _utc(self.started).isoformat(),
                SCHEDULER_HEARTBEAT_ANNOTATION: _utc(self.heartbeat).isoformat()}


@dataclass(frozen=True)
class LaunchIdentity:
    """One launch: the TI row id, its launch token, the try and the scheduler that launched it,
    the task it belongs to and the deployment (metadata DB) that launched it."""

    ti_id: str
    token: str | None
    try_number: int
    scheduler_job_id: str | None = None
    dag_id: str | None = None
    task_id: str | None = None
    run_id: str | None = None
    map_index: int | None = -1  # None: the pod's map_index did not read as one
    deployment: str | None = None
    region: str = ""  # Airflow 3.4 dynamic region ("": none)
    launcher: Launcher | None = None  # with scheduler_job_id; None: not stamped, or unreadable

    # Derived values are cached on the (immutable) instance: every loop asks them of every launch
    # in flight, and a sweep of every pod it lists.
    @functools.cached_property
    def legacy(self) -> bool:
        return as_token(self.token) is None

    @functools.cached_property
    def creator(self) -> int | None:
        """The SchedulerJob id of the scheduler process that launched it, when it reads as one."""
        text = self.scheduler_job_id
        return int(text) if isinstance(text, str) and text.isascii() and text.isdigit() else None

    @functools.cached_property
    def task(self) -> TaskKey | None:
        """The task this launch is for, or None when the pod does not say, or says it in a way no
        row could match (``malformed``): such a launch names no task and is never fenced."""
        if not (self.dag_id and self.task_id and self.run_id) or self.map_index is None or self.malformed:
            return None
        return task_key(self.dag_id, self.task_id, self.run_id, int(self.map_index), self.region)

    @functools.cached_property
    def malformed(self) -> str | None:
        """Why this identity cannot be put to the database as it is, or None. The loop reads every
        launch in flight in one statement, so one pod's bad annotation must cost that pod alone
        (it is skipped), never the statement: a TI id that is no UUID, a NUL in a text field (which
        PostgreSQL refuses), a map index beyond a 32-bit integer."""
        if _uuid(self.ti_id) is None:
            return "ti_id is not a UUID"
        if any("\x00" in (value or "") for value in (self.dag_id, self.task_id, self.run_id)):
            return "task key holds a NUL character (dag_id, task_id or run_id)"
        if self.map_index is not None and not -(2**31) <= int(self.map_index) < 2**31:
            return "map_index out of range"
        return None

    def annotations(self) -> dict[str, str]:
        data = {TI_ID_ANNOTATION: self.ti_id, TRY_NUMBER_ANNOTATION: str(self.try_number)}
        if self.region:
            data[REGION_ANNOTATION] = self.region
        if self.token:
            data[TOKEN_ANNOTATION] = self.token
        if self.scheduler_job_id is not None:
            data[SCHEDULER_JOB_ANNOTATION] = str(self.scheduler_job_id)
        if self.launcher is not None:
            data.update(self.launcher.annotations())
        if self.deployment:
            data[DEPLOYMENT_ANNOTATION] = self.deployment
        return data

    def labels(self) -> dict[str, str]:
        labels = {TI_ID_LABEL: self.ti_id}
        if self.token:
            labels[TOKEN_LABEL] = self.token
        if self.deployment:
            labels[DEPLOYMENT_LABEL] = self.deployment
        return labels


@dataclass(frozen=True)
class TaskRow:
    """What the metadata DB says about a task right now (its one row, whatever its current id)."""

    ti_id: str
    state: str | None
    try_number: int
    queued_by_job_id: int | None
    external_executor_id: str | None
    dag_id: str | None = None
    task_id: str | None = None
    run_id: str | None = None
    map_index: int = -1
    hostname: str | None = None  # where the task last ran (``/run`` writes it; a pod's name in a pod)
    region: str = ""

    @property
    def token(self) -> str | None:
        return as_token(self.external_executor_id)

    def runs_on(self, pod: str | None) -> bool:
        """Does the row name ``pod`` as the host the task last ran on (its name, or an FQDN of it)?
        Kept until the next ``/run``: a pod that ran the task and is finishing (log upload,
        callbacks) while its next launch waits is still the row's host."""
        host = (self.hostname or "").lower()
        return bool(pod and host) and (host == pod.lower() or host.startswith(pod.lower() + "."))

    @property
    def task(self) -> TaskKey | None:
        if not (self.dag_id and self.task_id and self.run_id):
            return None
        return task_key(self.dag_id, self.task_id, self.run_id, int(self.map_index), self.region)


def _uuid(value: object) -> str | None:
    try:
        return str(uuid.UUID(str(value)))
    except (TypeError, ValueError):
        return None


def _int(value: object, default: int) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


def _map_index(value: object) -> int | None:
    """-1 when absent (the provider writes it only for a mapped task), the number when it is
    one, and None otherwise: a pod whose map index does not read exactly names no task, so it
    is never fenced (read as -1, a mapped task's pod would look like a task without a row)."""
    if value is None:
        return -1
    text = value if isinstance(value, str) else str(value)
    digits = text[1:] if text.startswith("-") else text
    return int(text) if digits.isascii() and digits.isdigit() else None


def from_pod_metadata(annotations: Mapping[str, str] | None) -> LaunchIdentity | None:
    """The launch identity a pod carries, or None for a pod without our annotations (legacy).

    The task coordinates come from the provider's own annotations (dag_id, task_id, run_id,
    map_index), which every executor pod carries.
    """
    annotations = annotations or {}
    ti_id = annotations.get(TI_ID_ANNOTATION)
    if not ti_id:
        return None
    return LaunchIdentity(
        ti_id=str(ti_id),
        token=as_token(annotations.get(TOKEN_ANNOTATION)),
        try_number=_int(annotations.get(TRY_NUMBER_ANNOTATION), 0),
        scheduler_job_id=annotations.get(SCHEDULER_JOB_ANNOTATION),
        dag_id=annotations.get("dag_id"),
        task_id=annotations.get("task_id"),
        run_id=annotations.get("run_id"),
        map_index=_map_index(annotations.get("map_index")),
        deployment=annotations.get(DEPLOYMENT_ANNOTATION) or None,
        region=str(annotations.get(REGION_ANNOTATION) or "").lower(),
        launcher=_launcher(annotations.get(SCHEDULER_JOB_ANNOTATION), annotations.get(SCHEDULER_STARTED_ANNOTATION),
                           annotations.get(SCHEDULER_HEARTBEAT_ANNOTATION)),
    )


def _launcher(job_id: object, started: object, heartbeat: object) -> Launcher | None:
    """The launcher a pod names, or None when any of its three stamps is missing or unreadable:
    never a reason to call the pod malformed (its launch is judged by its token; only deletes
    need the launcher, and an unknown one is never deleted for)."""
    job, began, beat = _job_id(job_id), _stamp(started), _stamp(heartbeat)
    return Launcher(job, began, beat) if job is not None and began and beat else None


def _job_id(value: object) -> int | None:
    """A SchedulerJob id: a plain decimal number that fits its bigint column."""
    if not isinstance(value, str) or not (value.isascii() and value.isdigit()):
        return None
    number = int(value) if len(value) <= 20 else 2**63
    return number if number < 2**63 else None


def _stamp(value: object) -> datetime | None:
    """An aware ISO 8601 time as UTC, or None (not a string, too long, naive, or out of range)."""
    if not isinstance(value, str) or len(value) > STAMP_MAX:
        return None
    try:
        parsed = datetime.fromisoformat(value)
        return _utc(parsed) if parsed.utcoffset() is not None else None
    except (ValueError, OverflowError):
        return None


def _utc(value: datetime) -> datetime:
    return value.astimezone(timezone.utc)


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
