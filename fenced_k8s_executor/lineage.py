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
- an entry *behind* this database's row by more than its posting lag explains is a scheduler
  that wrote to this database (or to the one it was copied from) without posting (``mute``: its
  Lease writes refused, or late): it may be alive, writing to an original, so it is never taken
  for dead;
- a live entry this database holds, level with its row and not yet seen moving, cannot be
  judged yet (``unproven``): a copy taken between two heartbeats looks exactly like this until
  that scheduler's next heartbeat, so nothing it launched is judged until then.

A heartbeat is compared with this database's row of the same job, which the same scheduler wrote
with the same clock. Liveness (``posting``) still reads the poster's timestamps against this
reader's clock: an original whose host runs behind by more than three renewal intervals can be
taken for dead by a copy (issue 59, open; docs/design.md).

A pod of this deployment is ours to delete only when it is ``HERE``; costs of the doubt fall on
the pods in doubt alone. Tables: docs/design.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Collection, Iterable, Mapping

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
        return self.renewed is None or now - self.renewed <= timedelta(seconds=self.window(1.0))

    @property
    def launcher(self) -> Launcher:
        return Launcher(self.job_id, self.started)

    def window(self, floor: float) -> float:
        """How long its scheduler may go without posting and still be live: three of its renewal
        intervals (``floor`` at least)."""
        return 3 * max(self.every, floor)

    def mute_after(self) -> timedelta:
        """How far its database's row of its job may run ahead of its post before it is a scheduler
        that wrote there without posting: it posts the heartbeat its previous renewal read, and
        airflow-core heartbeats once per interval: two intervals behind is ordinary, three the bound."""
        return timedelta(seconds=3 * max(self.every, 1.0))


def posting(entries: Iterable[Entry], now: datetime, alive_for: timedelta) -> frozenset[Launcher]:
    """The launchers of the live entries (``Entry.live``)."""
    return frozenset(e.launcher for e in entries if e.live(now, alive_for))


#: What this reader observed of each entry: the entry as last read, and whether this reader ever
#: saw it change (not only appear).
Sightings = Mapping[Launcher, "tuple[Entry, bool]"]


def observe(before: Sightings, posted: Iterable[Entry]) -> dict[Launcher, tuple[Entry, bool]]:
    """The sightings after a reading: an entry whose value differs from the one read before has
    changed; entries no longer posted are forgotten."""
    seen = {}
    for entry in posted:
        last = before.get(entry.launcher)
        seen[entry.launcher] = (entry, last is not None and (last[1] or last[0] != entry))
    return seen


def silent(sightings: Sightings, launchers: Collection[Launcher]) -> frozenset[Launcher]:
    """Of ``launchers``, the ones this reader has never seen post: a scheduler declared gone stays
    gone until it is seen posting."""
    return frozenset(launchers) - {launcher for launcher, (_, changed) in sightings.items() if changed}


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
    mute: tuple[Entry, ...] = ()  # schedulers that wrote to this database's line without posting: their pods wait

    def in_doubt(self, launcher: Launcher | None) -> bool:
        """A pod of this launcher is never judged now: its scheduler wrote without posting (``mute``)."""
        return launcher is not None and any(e.launcher == launcher for e in self.mute)

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
          live: Collection[Launcher], copied_before: datetime | None = None,
          gone: Collection[Launcher] = frozenset()) -> View:
    """One read of the witness. ``rows``: this database's rows of the entries' jobs, read after the
    witness; ``here``: the jobs this process has seen writing to this database; ``me``: this
    scheduler's launcher; ``live``: the launchers of the live entries (``posting``);
    ``copied_before``: the copy's date this database already knew (a copy stays one whatever the
    Lease holds now); ``gone``: schedulers an operator declared gone with
    the database they wrote to (a point-in-time restore: ``ancestry``) and not seen posting since
    (``silent``): their posts are this database's past, no evidence of a copy."""
    here = frozenset(here) | ({me.job_id} if me is not None else frozenset())
    rivals, unproven, peers, mute = [], [], [], []
    copied = [copied_before] if copied_before is not None else []
    for entry in entries:
        if me is not None and entry.launcher == me:
            continue
        alive = entry.launcher in live
        if entry.launcher in gone:
            continue  # its database is this one's past: a dead scheduler of this database
        row = rows.get(entry.job_id)
        if row is None or row.started != entry.started:
            if alive:
                rivals.append(entry)  # a job this database never had
            continue
        if alive:
            peers.append(entry)
        if entry.job_id in here:
            continue  # it writes here: a heartbeat this database lacks is a write a failover lost
        if row.heartbeat is None or row.heartbeat < entry.heartbeat:
            # It went on elsewhere: this database was copied after the last it holds of that job
            # (its start included: airflow-core writes the first heartbeat a moment before it).
            copied.append(max(t for t in (row.heartbeat, row.started, entry.started) if t is not None))
            if alive:
                rivals.append(entry)
        elif row.heartbeat - entry.heartbeat > entry.mute_after():
            # It wrote to this database's line long after its last post: alive or not, writing here
            # or to an original, no reader can tell; never taken for dead. Its pods alone wait.
            mute.append(entry)
        elif alive:
            unproven.append(entry)
    return View(True, here, tuple(rivals), tuple(unproven), max(copied, default=None), tuple(peers), tuple(mute))


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
    if view.in_doubt(launcher):
        return Provenance.UNSETTLED  # its scheduler may be alive, writing to an original
    if view.copied_at is not None and launcher.started <= view.copied_at:
        return Provenance.ELSEWHERE  # started before this database was copied: the original's
    return Provenance.HERE if view.quiet else Provenance.UNSETTLED
