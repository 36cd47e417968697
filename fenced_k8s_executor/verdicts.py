"""The fencing decisions, as pure functions over plain values.

One question underlies every path: *is this launch still the current one?* ``standing`` answers
it from the launch identity and the row of its task (found by dag, task, run and map index, so a
clear or a retry that gives the row a new id does not hide it). A row with the launch's token is
the same launch whatever its id (RESTARTING after a clear, a task that reported its own retry).
Only positive evidence makes a launch stale: the row names another token, or the task has no row
at all. Legacy launches (no token) and legacy rows (no token to compare) are never fenced: they
get exactly the stock executor's treatment. Deleting needs one more fact: the pod was launched by
this deployment (its stamp) and this database (``lineage.provenance``). Tables: docs/design.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

from fenced_k8s_executor.launch import LaunchIdentity, TaskRow, as_token
from fenced_k8s_executor.lineage import Provenance

QUEUED = "queued"


class Standing(str, enum.Enum):
    """How a launch stands against the current row of its task."""

    CURRENT = "current"  # the row carries this launch's token (whatever its id)
    SUPERSEDED = "superseded"  # the row carries another token: positive evidence
    TASK_GONE = "task_gone"  # the task has no row any more (run or DAG deleted): positive evidence
    LEGACY_LAUNCH = "legacy_launch"  # the launch has no token (or no task coordinates): never fenced
    LEGACY_ROW = "legacy_row"  # the row has no token to compare: no evidence


STALE = frozenset({Standing.SUPERSEDED, Standing.TASK_GONE})


def standing(launch: LaunchIdentity | None, row: TaskRow | None) -> Standing:
    """Compare a launch with the current row of its task (``row`` None: the task has no row)."""
    if launch is None or launch.legacy or launch.task is None:
        return Standing.LEGACY_LAUNCH
    if row is None:
        return Standing.TASK_GONE
    if row.token is None:
        return Standing.LEGACY_ROW
    return Standing.CURRENT if row.token == as_token(launch.token) else Standing.SUPERSEDED


def owned(launch: LaunchIdentity | None, deployment: str | None, launched: Provenance) -> bool:
    """True when this deployment launched the pod: the only pods a fence may delete. The pod carries
    this deployment's stamp, and the witness says a scheduler of this database launched it
    (``launched``, ``lineage.provenance``: HERE)."""
    return bool(launch is not None and deployment and launch.deployment == deployment
                and launched is Provenance.HERE)


def foreign(launch: LaunchIdentity | None, ours: frozenset[str]) -> bool:
    """True when the pod says another deployment launched it. The provider finds pods by labels
    another deployment's pods can share in one namespace (DAG, task, run, a scheduler job id from
    its own DB), so its revoke and adoption must not see them. Tokenless pods, our stamps (today's
    id and the DB-address id of builds before 0.2.0) and anything while no id of ours is known
    are not foreign."""
    return bool(launch is not None and launch.deployment and ours and launch.deployment not in ours)


def hidden_from_provider(launch: LaunchIdentity | None, ours: frozenset[str], launched: Provenance,
                         ready: bool) -> bool:
    """Leave this pod out of the provider's listings (its adoption relabels pods by a dead
    scheduler's job id, its revoke deletes one by coordinates): only on positive evidence that
    another deployment or database launched it, never because its stamp is old. A pod this database
    launched (``launched`` HERE) is ours whatever its stamp: an id that changed (set by an operator,
    or an upgrade) never costs a running task. Otherwise a stamp of another deployment hides it, and
    so does the witness's word that another database launched it (ELSEWHERE; a TI of this database
    that names the pod's token is no evidence: a copy's rows name the original's launches). While
    the witness cannot judge yet (not ``ready``) nothing in doubt is handed to the provider."""
    if launch is None or (launched is Provenance.HERE and launch.launcher is not None):
        return False  # a scheduler of this database launched it (a pod without a launcher: its stamp decides)
    return foreign(launch, ours) or launched is Provenance.ELSEWHERE or not ready


class Reason(str, enum.Enum):
    CURRENT = "current"
    SUPERSEDED = "superseded"
    TASK_GONE = "task_gone"
    TI_ID_CHANGED = "ti_id_changed"
    NOT_QUEUED = "not_queued"
    TRY_MISMATCH = "try_mismatch"
    OTHER_SCHEDULER = "other_scheduler"
    LEGACY = "legacy"
    FOREIGN = "foreign"  # stale, but not launched by this deployment: never deleted
    RUNS_THE_TASK = "runs_the_task"  # stale, but the task's row names this pod as its host: left to finish


@dataclass(frozen=True)
class Verdict:
    """``act`` is the fenced decision; ``stock`` what the stock executor would do on the same data."""

    act: bool
    stock: bool
    reason: Reason


_REASONS = {Standing.CURRENT: Reason.CURRENT, Standing.SUPERSEDED: Reason.SUPERSEDED,
            Standing.TASK_GONE: Reason.TASK_GONE}
#: ``is_stale``'s verdict per standing, and the foreign one: shared immutable values, so that a
#: sweep or a loop's reconcile builds no object per pod for them.
_STATE_VERDICTS = {s: Verdict(s in STALE, False, _REASONS.get(s, Reason.LEGACY)) for s in Standing}
_FOREIGN = Verdict(False, False, Reason.FOREIGN)
_HOST = Verdict(False, False, Reason.RUNS_THE_TASK)


def should_create(launch: LaunchIdentity, row: TaskRow | None, scheduler_job_id: int | None) -> Verdict:
    """Pre-creation: ``act`` = create the pod.

    The stock check (the row still has the workload's id, is QUEUED, same try, queued by this
    scheduler) plus the token: two launches of the same TI id and try differ only there (a1).
    """
    if row is None:
        return Verdict(False, False, Reason.TASK_GONE)
    stock, reason = True, Reason.CURRENT
    if row.ti_id != launch.ti_id:
        stock, reason = False, Reason.TI_ID_CHANGED
    elif scheduler_job_id is not None:
        if row.state != QUEUED:
            stock, reason = False, Reason.NOT_QUEUED
        elif row.try_number != launch.try_number:
            stock, reason = False, Reason.TRY_MISMATCH
        elif row.queued_by_job_id != scheduler_job_id:
            stock, reason = False, Reason.OTHER_SCHEDULER
    s = standing(launch, row)
    if s is Standing.SUPERSEDED:
        return Verdict(False, stock, Reason.SUPERSEDED)
    if stock and s is not Standing.CURRENT:
        reason = Reason.LEGACY
    return Verdict(stock, stock, reason)


def is_stale(launch: LaunchIdentity | None, row: TaskRow | None) -> Verdict:
    """State change (watcher or adopted completed pod): ``act`` = the event belongs to a stale
    launch and must not reach the scheduler. Needs no ownership: swallowing deletes nothing."""
    return _STATE_VERDICTS[standing(launch, row)]


def should_delete(launch: LaunchIdentity | None, row: TaskRow | None, deployment: str | None,
                  pod: str | Sequence[str] | None = None,
                  launched: Provenance = Provenance.UNSETTLED) -> Verdict:
    """Reconcile, post-create re-check and sweep: ``act`` = delete the (unfinished) pod ``pod``
    (its name, and its IPs where known: the addresses a ``hostname_callable`` may report).

    Stale, launched by this deployment (``owned``: ``launched`` is the witness's word on the pod's
    launcher), and not the pod the task's row names as its host: a pod that ran the task keeps
    that until the next launch's ``/run``, and is left to finish as stock leaves it (a finishing
    try's log upload and callbacks). Whoever created the pod does not decide whether it is
    stale. The stock executor never does this.
    """
    verdict = is_stale(launch, row)
    if not verdict.act:
        return verdict
    if not owned(launch, deployment, launched):
        return _FOREIGN
    if names_host(row, pod):
        return _HOST
    return verdict


def names_host(row: TaskRow | None, pod: str | Sequence[str] | None) -> bool:
    """Does the task's row name this pod (any of its addresses) as the host its task last ran on?"""
    return row is not None and any(row.runs_on(address) for address in _addresses(pod))


def host_unresolved(row: TaskRow | None, pod: str | Sequence[str] | None) -> bool:
    """True when the row names a host that none of ``pod``'s known addresses is: with a
    ``hostname_callable`` that reports the pod's IP, the row names the pod by an address only a
    read of the pod tells; the caller reads it before a delete."""
    return row is not None and bool(row.hostname) and not names_host(row, pod)


def _addresses(pod: str | Sequence[str] | None) -> tuple[str, ...]:
    if pod is None:
        return ()
    return (pod,) if isinstance(pod, str) else tuple(a for a in pod if a)


def should_adopt(launch: LaunchIdentity | None, ti_token: object) -> Verdict:
    """Adoption of a dead scheduler's pod for the TI the scheduler hands over: ``act`` = adopt.

    The TI object is the task's current row (already loaded by the scheduler), so only its token
    matters: the same token is the same launch even under a new TI id.
    """
    if launch is None or launch.legacy:
        return Verdict(True, True, Reason.LEGACY)
    token = as_token(ti_token)
    if token is None:
        return Verdict(True, True, Reason.LEGACY)
    if token != launch.token:
        return Verdict(False, True, Reason.SUPERSEDED)
    return Verdict(True, True, Reason.CURRENT)


def releases_slot(holder: str | None, launch: LaunchIdentity | None) -> bool:
    """A swallowed event frees the executor slot of its key exactly as the stock path would,
    unless a newer launch of the same key holds that slot on this scheduler. ``holder`` is the
    token of the launch holding the slot ("" for a legacy launch), None when none is known."""
    if holder is None or launch is None:
        return True
    return holder == (as_token(launch.token) or "")
