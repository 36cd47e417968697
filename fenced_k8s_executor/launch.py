"""Launch identity: which QUEUED transition of a task instance a job or a pod belongs to.

Pure data and pure conversions to and from pod metadata. A *token* is the UUID the scheduler
pre-assigns to ``TaskInstance.external_executor_id`` for every QUEUED transition; anything else
found there (None, or a scheduler job id written by the stock executor) is *legacy* and never
used as evidence. What a pod says is read in one place, ``from_pod_metadata``, and checked there.
"""

from __future__ import annotations

import functools
import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping

from fenced_k8s_executor.names import (
    DEPLOYMENT_ANNOTATION,
    DEPLOYMENT_LABEL,
    REGION_ANNOTATION,
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
    """The scheduler process that launched a pod: its SchedulerJob id and that job's ``start_date``
    (aware). A job id alone does not say which process it was (copies of a database allocate the
    same ids again). ``started`` None: the pod's stamp does not read (never deleted for it).
    Only a delete asks, and the witness answers (``lineage``, ``witness``)."""

    job_id: int
    started: datetime | None

    def annotations(self) -> dict[str, str]:
        """Written in UTC. Checked here, where the executor stamps a pod, not at construction: a
        sweep reads a launcher off every pod it lists, and a naive time cannot come from there."""
        if self.started is None or self.started.utcoffset() is None:
            raise ValueError("Launcher times must be timezone-aware")
        return {SCHEDULER_STARTED_ANNOTATION: _utc(self.started).isoformat()}


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
    launcher: Launcher | None = None  # None: not stamped (builds before 0.3.0)

    #: Why the pod's identity does not read (its first bad field), or None. Set by
    #: ``from_pod_metadata``, once: identities the executor builds from workloads are trusted.
    malformed: str | None = None

    # Derived values are cached on the (immutable) instance: every loop asks them of every launch
    # in flight, and a sweep of every pod it lists.
    @functools.cached_property
    def legacy(self) -> bool:
        """No launch token, or an identity that does not read: either way never evidence."""
        return self.malformed is not None or as_token(self.token) is None

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


#: Airflow's ``ID_LEN``: the longest dag_id, task_id and run_id its columns hold.
ID_LEN = 250
#: A Kubernetes label value (the deployment id is one: it is a label too), not empty; ``fullmatch`` it.
LABEL_VALUE = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
#: Airflow 3.4's region of a task outside any (``provider_compat.SENTINEL_REGION``): no region.
_NO_REGION = str(uuid.UUID(int=0))
_ABSENT = object()


def from_pod_metadata(annotations: Any, *, regions: bool = True) -> LaunchIdentity | None:
    """The launch identity a pod carries, or None for a pod without our annotations (legacy).

    A pod's annotations are a trust boundary: anyone who can write a pod can write them, in any
    shape (a protobuf client even bytes that are not UTF-8, read here as lone surrogates; a JSON
    body or a test, values that are not strings). So every field a fence reads is parsed and
    checked here, once, and the statements, logs and verdicts downstream only ever see canonical
    values. A field present but unreadable makes the identity ``malformed`` (naming the first such
    field); that field then holds its absent value, and the launch names no task (``task`` None)
    and counts as ``legacy``: never put to the database, never fenced, never deleted. It costs that
    pod alone. The task coordinates come from the provider's own annotations (dag_id, task_id,
    run_id, map_index), which every executor pod carries; a pod without them names no task either.
    ``regions``: whether the installed Airflow has dynamic regions (3.4): before it, a pod naming
    one names no task that can have a row.
    """
    annotations = _mapping(annotations)
    if annotations is None or TI_ID_ANNOTATION not in annotations:
        return None
    get = annotations.get
    bad: list[str] = []
    ti_id = _uuid_text(get(TI_ID_ANNOTATION))
    if ti_id is None:
        bad.append("ti_id is not a UUID")
    token = get(TOKEN_ANNOTATION, _ABSENT)
    if token is _ABSENT:
        token = None
    elif (token := _uuid_text(token)) is None:
        bad.append("launch_token is not a UUID")
    try_number = _number(get(TRY_NUMBER_ANNOTATION), 2**31)
    if try_number is None:
        bad.append("try_number is not a number in [0, 2^31)")
    job = get(SCHEDULER_JOB_ANNOTATION, _ABSENT)
    if job is _ABSENT:
        job = None
    elif (job := _number(job, 2**63)) is None:
        bad.append("scheduler_job_id is not a number in [0, 2^63)")
    coordinates = []
    for name in ("dag_id", "task_id", "run_id"):
        value = get(name, _ABSENT)
        if value is _ABSENT:
            value = None
        elif not _id_text(value):
            value = None
            bad.append(f"{name} is not 1-{ID_LEN} characters of UTF-8 without NUL")
        coordinates.append(value)
    map_index = get("map_index", _ABSENT)
    if map_index is _ABSENT:
        map_index = -1
    elif (map_index := _map_index(map_index)) is None:
        bad.append("map_index is not a 32-bit integer")
    deployment = get(DEPLOYMENT_ANNOTATION, _ABSENT)
    if deployment is _ABSENT:
        deployment = None
    elif not (isinstance(deployment, str) and LABEL_VALUE.fullmatch(deployment)):
        deployment = None
        bad.append("deployment is not a Kubernetes label value")
    region = get(REGION_ANNOTATION, "")
    if region != "":
        region = _uuid_text(region)
        if region == _NO_REGION:
            region = ""
        elif region is None or not regions:
            bad.append("region_id is not a UUID" if region is None
                       else "region_id names a dynamic region, which this Airflow has not")
            region = ""
    return LaunchIdentity(
        ti_id=ti_id or "",
        token=token,
        try_number=try_number or 0,
        scheduler_job_id=None if job is None else str(job),
        dag_id=coordinates[0],
        task_id=coordinates[1],
        run_id=coordinates[2],
        map_index=map_index,
        deployment=deployment,
        region=region,
        launcher=_launcher(job, get(SCHEDULER_STARTED_ANNOTATION)),
        malformed=bad[0] if bad else None,
    )


def _mapping(annotations: Any) -> Mapping | None:
    """Annotations as a mapping: a dict as the lists and the watch give them, or the dynamic
    client's ``ResourceField`` (the provider's lists), whose ``get`` an annotation named "get"
    would shadow; None for anything else."""
    if type(annotations) is dict or annotations is None or isinstance(annotations, Mapping):
        return annotations
    to_dict = getattr(type(annotations), "to_dict", None)
    data = to_dict(annotations) if to_dict is not None else None
    return data if isinstance(data, Mapping) else None


def _uuid_text(value: object) -> str | None:
    """A UUID as ``str(uuid)`` writes it (in either case), in its canonical spelling; else None.
    Only that spelling: what the executor writes, and nothing ``uuid.UUID`` would stretch to."""
    if isinstance(value, str) and len(value) == 36:
        if _CANONICAL.fullmatch(value):  # as the executor writes it
            return value
        value = value.lower()
        if _CANONICAL.fullmatch(value):
            return value
    return None


def _number(value: object, bound: int) -> int | None:
    """A plain decimal number (ASCII digits, at most 20 of them) in [0, bound), or None."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
        number = int(value)
        return number if number < bound else None
    return None


def _map_index(value: object) -> int | None:
    """A map index: a decimal 32-bit integer (the provider writes it only for a mapped task)."""
    if isinstance(value, str) and value.startswith("-"):
        number = _number(value[1:], 2**31 + 1)
        return None if number is None else -number
    return _number(value, 2**31)


def _id_text(value: object) -> bool:
    """A dag_id, task_id or run_id that a row could hold: 1 to ``ID_LEN`` characters, no NUL
    (PostgreSQL refuses it in text), encodable as UTF-8 (no lone surrogate)."""
    if not isinstance(value, str) or not 0 < len(value) <= ID_LEN or "\x00" in value:
        return False
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _launcher(job: int | None, started: object) -> Launcher | None:
    """The launcher a pod names: None when it names none (no start stamp: builds before 0.3.0), a
    launcher whose start is None when the stamp does not read (``job``: the scheduler job id,
    read). Never a reason to call the pod malformed: its launch is judged by its token; only
    deletes need the launcher, and one that does not read is never deleted for."""
    if started is None:
        return None
    return Launcher(job if job is not None else -1, _stamp(started) if job is not None else None)


def _stamp(value: object) -> datetime | None:
    """An aware ISO 8601 time as UTC, or None (not a string, too long, naive, or out of range)."""
    if not isinstance(value, str) or len(value) > STAMP_MAX:
        return None
    return _parsed_stamp(value)


@functools.lru_cache(maxsize=1024)
def _parsed_stamp(text: str) -> datetime | None:
    """Parsed once per string: every pod of one scheduler carries its start."""
    try:
        parsed = datetime.fromisoformat(text)
        if parsed.tzinfo is timezone.utc:  # as ``Launcher.annotations`` writes it
            return parsed
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
