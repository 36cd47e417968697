"""Which database launched a pod: the witness's verdicts, as pure functions over plain values.

Every pod names its launcher (``launch.Launcher``: the SchedulerJob id and that job's
``start_date``). A copy of the metadata database (a staging clone, a restored snapshot, a
point-in-time restore) holds the same job rows as the original, so no row tells the two apart:
what a database says about itself is copied with it. What a copy cannot copy is the future. A
scheduler that writes to this database moves its job's ``latest_heartbeat`` *here*; one that
writes to another database does not. The witness (``witness.py``, a Lease beside the pods) is
where every live scheduler of every database sharing this deployment's id posts the heartbeat
it has just committed to its own database. Read against this database's job rows:

- an entry whose job (id and start) this database does not hold is a scheduler of another
  database (``foreign``);
- an entry ahead of this database's row of its job is a scheduler that started before this
  database was copied and has written elsewhere since (``ahead``): this database is the copy,
  and every job that started before the point it was copied at is the original's;
- a job whose row this process has seen move forward writes here (``here``): proof no copy
  can fake, for its heartbeat stopped at the copy;
- a live entry this database holds, level with its row and not yet seen moving, cannot be
  judged yet (``unproven``): a copy taken between two heartbeats looks exactly like this until
  that scheduler's next heartbeat, so nothing it launched is judged until then.

A pod of this deployment is ours to delete only when it is ``HERE``; costs of the doubt fall on
the pods in doubt alone. Tables: docs/design.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Iterable, Mapping

from fenced_k8s_executor.launch import Launcher


class Provenance(str, enum.Enum):
    """Whether this database launched a pod."""

    HERE = "here"  # a scheduler of this database launched it: ours to judge
    UNSETTLED = "unsettled"  # this database's job, but the witness cannot tell yet (or a collision holds)
    ELSEWHERE = "elsewhere"  # another database's scheduler, or one this database inherited from its original


@dataclass(frozen=True)
class Entry:
    """One scheduler's post in the witness: its job, a heartbeat its database had committed, and
    when it posted (its own clock) and how often it does."""

    job_id: int
    started: datetime
    heartbeat: datetime
    host: str = "-"
    renewed: datetime | None = None
    every: float = 0.0  # seconds between its renewals
    stopped: bool = False  # its scheduler ended cleanly (its last post says so)

    def live(self, now: datetime, alive_for: timedelta) -> bool:
        """Its scheduler runs: a heartbeat as recent as airflow-core's liveness asks, and a post
        within three of its renewal intervals (a killed process stops posting at once; a stopped
        one says so in its last post, which stays: a copy of its database reads it)."""
        if self.stopped or now - self.heartbeat > alive_for:
            return False
        return self.renewed is None or now - self.renewed <= timedelta(seconds=3 * max(self.every, 1.0))

    @property
    def launcher(self) -> Launcher:
        return Launcher(self.job_id, self.started)


@dataclass(frozen=True)
class JobRow:
    """This database's row of a scheduler job (``job`` table)."""

    started: datetime | None
    heartbeat: datetime | None


@dataclass(frozen=True)
class View:
    """What one read of the witness, against this database's job rows, says."""

    renewed: bool = False  # this process has posted and read the witness at least once
    here: frozenset[int] = frozenset()  # jobs seen writing to this database (this process's own included)
    rivals: tuple[Entry, ...] = ()  # live schedulers writing to another database under this deployment's id
    unproven: tuple[Entry, ...] = ()  # live schedulers of this database not yet seen writing here
    copied_at: datetime | None = None  # this database is a copy taken about then (an inherited job went on elsewhere)
    peers: tuple[Entry, ...] = ()  # live schedulers of this database, proven or not (for the operator)

    @property
    def collision(self) -> bool:
        """A live scheduler of another database posts under this deployment's id."""
        return bool(self.rivals)

    @property
    def ready(self) -> bool:
        """Every live scheduler this database holds is judged: posted once, none unproven."""
        return self.renewed and not self.unproven

    @property
    def quiet(self) -> bool:
        """Ready, and no other database posts under this id: every job of this database is ours."""
        return self.ready and not self.collision


def judge(entries: Iterable[Entry], rows: Mapping[int, JobRow], here: Iterable[int], me: Launcher | None,
          now: datetime, alive_for: timedelta) -> View:
    """One read of the witness. ``rows``: this database's rows of the entries' jobs, read after the
    witness; ``here``: the jobs this process has seen writing to this database; ``me``: this
    scheduler's launcher; ``alive_for``: how recent a heartbeat a live scheduler's entry has
    (airflow-core's ``scheduler_health_check_threshold``)."""
    here = frozenset(here) | ({me.job_id} if me is not None else frozenset())
    rivals, unproven, peers, copied = [], [], [], []
    for entry in entries:
        if me is not None and entry.launcher == me:
            continue
        live = entry.live(now, alive_for)
        row = rows.get(entry.job_id)
        if row is None or row.started != entry.started:
            if live:
                rivals.append(entry)  # a job this database never had
            continue
        if live:
            peers.append(entry)
        if entry.job_id in here:
            continue  # it writes here: a heartbeat this database lacks is a write a failover lost
        if row.heartbeat is None or row.heartbeat < entry.heartbeat:
            # It went on elsewhere: this database was copied after the last it holds of that job
            # (its start included: airflow-core writes the first heartbeat a moment before it).
            copied.append(max(t for t in (row.heartbeat, row.started, entry.started) if t is not None))
            if live:
                rivals.append(entry)
        elif live:
            unproven.append(entry)
    return View(True, here, tuple(rivals), tuple(unproven), max(copied, default=None), tuple(peers))


def moved(before: Mapping[int, JobRow], after: Mapping[int, JobRow]) -> set[int]:
    """Jobs whose heartbeat this database holds moved forward between two reads: they write here."""
    return {job for job, row in after.items()
            if (old := before.get(job)) is not None and old.started == row.started
            and old.heartbeat is not None and row.heartbeat is not None and row.heartbeat > old.heartbeat}


def provenance(launcher: Launcher | None, row: JobRow | None, view: View) -> Provenance:
    """Did this database launch the pod whose launcher is ``launcher``? ``row``: this database's row
    of ``launcher.job_id`` (None: no such row). A pod without a launcher (builds before 0.3.0)
    counts as this database's old jobs do."""
    if launcher is None:
        if view.copied_at is not None:
            return Provenance.ELSEWHERE  # older than this database's copy: the original's
        return Provenance.HERE if view.quiet else Provenance.UNSETTLED
    if launcher.started is None or row is None or row.started != launcher.started:
        return Provenance.ELSEWHERE  # not a scheduler of this database (or a stamp that does not read)
    if launcher.job_id in view.here:
        return Provenance.HERE
    if view.copied_at is not None and launcher.started <= view.copied_at:
        return Provenance.ELSEWHERE  # started before this database was copied: the original's
    return Provenance.HERE if view.quiet else Provenance.UNSETTLED
