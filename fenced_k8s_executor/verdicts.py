"""The fencing decisions, as pure functions over plain values.

One question underlies every path: *is this launch still the current one?* ``standing`` answers
it from the launch identity and the DB row; each path then maps the answer to an action. Only
positive evidence (the row names another token, or the TI id no longer exists) makes a launch
stale. Legacy launches (no token) and legacy rows (no token to compare) are never fenced: they
get exactly the stock executor's treatment. Tables: docs/design.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from fenced_k8s_executor.launch import LaunchIdentity, TaskRow, as_token

QUEUED = "queued"


class Standing(str, enum.Enum):
    """How a launch stands against the DB row of its task instance."""

    CURRENT = "current"  # the row carries this launch's token
    SUPERSEDED = "superseded"  # the row carries another token: positive evidence
    TI_GONE = "ti_gone"  # no row with this TI id any more: positive evidence
    LEGACY_LAUNCH = "legacy_launch"  # the launch has no token: never fenced
    LEGACY_ROW = "legacy_row"  # the row has no token to compare: no evidence


STALE = frozenset({Standing.SUPERSEDED, Standing.TI_GONE})


def standing(launch: LaunchIdentity | None, row: TaskRow | None) -> Standing:
    """Compare a launch with the current row for its TI id (``row`` None: the id is gone)."""
    if launch is None or launch.legacy:
        return Standing.LEGACY_LAUNCH
    if row is None:
        return Standing.TI_GONE
    if row.token is None:
        return Standing.LEGACY_ROW
    return Standing.CURRENT if row.token == as_token(launch.token) else Standing.SUPERSEDED


class Reason(str, enum.Enum):
    CURRENT = "current"
    SUPERSEDED = "superseded"
    TI_GONE = "ti_gone"
    NOT_QUEUED = "not_queued"
    TRY_MISMATCH = "try_mismatch"
    OTHER_SCHEDULER = "other_scheduler"
    LEGACY = "legacy"


@dataclass(frozen=True)
class Verdict:
    """``act`` is the fenced decision; ``stock`` what the stock executor would do on the same data."""

    act: bool
    stock: bool
    reason: Reason


def _reason(s: Standing) -> Reason:
    return {
        Standing.CURRENT: Reason.CURRENT,
        Standing.SUPERSEDED: Reason.SUPERSEDED,
        Standing.TI_GONE: Reason.TI_GONE,
    }.get(s, Reason.LEGACY)


def should_create(launch: LaunchIdentity, row: TaskRow | None, scheduler_job_id: int | None) -> Verdict:
    """Pre-creation: ``act`` = create the pod.

    The stock check (row exists, QUEUED, same try, queued by this scheduler) plus the token:
    two launches of the same TI id and try differ only there (race a1).
    """
    if row is None:
        return Verdict(False, False, Reason.TI_GONE)
    stock = True
    reason = Reason.CURRENT
    if scheduler_job_id is not None:
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


def should_delete(launch: LaunchIdentity | None, row: TaskRow | None) -> Verdict:
    """Post-create re-check and sweep: ``act`` = delete the pod. The stock executor never does."""
    s = standing(launch, row)
    return Verdict(s in STALE, False, _reason(s))


def should_swallow(launch: LaunchIdentity | None, row: TaskRow | None) -> Verdict:
    """State change (watcher or adopted completed pod): ``act`` = swallow the event and delete
    the pod instead of letting it touch ``running``, the event buffer or the pre-execution requeue."""
    return should_delete(launch, row)


def should_adopt(launch: LaunchIdentity | None, ti_id: str, ti_token: object) -> Verdict:
    """Adoption of a dead scheduler's pod for a TI the scheduler hands over: ``act`` = adopt.

    The TI object is already loaded by the scheduler; its id and token are the row.
    """
    if launch is None or launch.legacy:
        return Verdict(True, True, Reason.LEGACY)
    if launch.ti_id != str(ti_id):
        return Verdict(False, True, Reason.TI_GONE)
    row = TaskRow(ti_id=str(ti_id), state=None, try_number=launch.try_number, queued_by_job_id=None,
                  external_executor_id=None if ti_token is None else str(ti_token))
    s = standing(launch, row)
    if s is Standing.SUPERSEDED:
        return Verdict(False, True, Reason.SUPERSEDED)
    return Verdict(True, True, _reason(s))
