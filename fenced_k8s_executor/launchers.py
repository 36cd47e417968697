"""Did this database launch that pod? The scheduler jobs the fences compare pods' launchers with.

The deployment id lives in the metadata database (``deployment.py``), so a copy of that database
(a restored snapshot, a clone) carries the same id, and its schedulers would judge the original's
pods against a frozen copy of the rows: every launch made since the copy looks superseded. So
every pod also names its launcher (``launch.Launcher``: the SchedulerJob id, that job's start and
a heartbeat of that job the DB had committed when the pod was built), and a fence deletes a pod
only when this database's row of that job has that start and has seen that heartbeat
(``verdicts.provenance``). Heartbeats only move forward in the database a scheduler writes them
to; in a copy they stopped at the copy. A pod whose launcher proves another database launches
under this deployment's id (``verdicts.collision_evidence``) raises a collision: a metric, an
error line, and, until no evidence has been seen for ``HOLD`` seconds, deletes only of what a
scheduler alive in this database launched.

``Launchers`` reads the ``job`` rows on demand (one statement for every launcher a decision needs
that the cache lacks or that is behind the heartbeat a pod names) through airflow-core's ``Job``
model (its own ``is_alive()``), and is thread-safe: the sweep's thread asks too. A DB error is
raised to the caller, which then deletes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from fenced_k8s_executor import metrics, verdicts
from fenced_k8s_executor.launch import Launcher, LaunchIdentity

log = logging.getLogger("fenced_k8s_executor")

#: Seconds a collision stays raised after its last evidence: the copy's pods come and go with its
#: tasks; a quiet spell of this length is needed before deletes of dead schedulers' pods resume.
HOLD = 600.0
#: Seconds a job's row is trusted for its ``is_alive()`` while a collision is raised.
ALIVE_FRESH = 10.0


@dataclass(frozen=True)
class _Cached:
    fact: verdicts.JobFact
    read_at: float


def read_jobs(ids: Iterable[int]) -> tuple[dict[int, verdicts.JobFact], int | None]:
    """This database's rows of the scheduler jobs ``ids`` (absent: no such row) and the highest job
    id it has allocated. Raises on DB errors."""
    from sqlalchemy import func, select

    from airflow.jobs.job import Job

    from fenced_k8s_executor import db

    wanted = sorted(set(ids))
    with db.bounded_session() as session:
        jobs = session.scalars(select(Job).where(Job.id.in_(wanted))).all() if wanted else []
        last = session.scalar(select(func.max(Job.id)))
        found = {job.id: verdicts.JobFact(job.start_date, job.latest_heartbeat, job.is_alive()) for job in jobs}
    return found, last


class Launchers:
    """This database's scheduler jobs, read on demand, and whether a collision is raised."""

    def __init__(self, read: Callable[[Iterable[int]], tuple[dict, int | None]] = read_jobs,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[int, _Cached] = {}
        self._last_job_id: int | None = None
        self._raised_until = float("-inf")
        self._reported: dict[str, float] = {}  # evidence -> when it was last logged

    @property
    def last_job_id(self) -> int | None:
        """The highest job id this database had allocated at the last read."""
        return self._last_job_id

    @property
    def collision(self) -> bool:
        """Another database was seen launching under this deployment's id within ``HOLD`` seconds."""
        return self._clock() < self._raised_until

    def facts(self, launches: Iterable[LaunchIdentity | None]) -> dict[int, verdicts.JobFact]:
        """Facts for the launchers of ``launches``, fresh enough to judge them: rows the cache
        lacks, or that are behind a launcher's heartbeat, or (while a collision is raised) older
        than ``ALIVE_FRESH``, are read in one statement. Raises on DB errors."""
        launchers = [launch.launcher for launch in launches if launch is not None and launch.launcher is not None]
        if not launchers:
            return {}
        now = self._clock()
        collision = self.collision
        with self._lock:
            stale = {l.job_id for l in launchers if self._stale(self._jobs.get(l.job_id), l, now, collision)}
        if stale:
            found, last = self._read(stale)
            now = self._clock()
            with self._lock:
                for job_id in stale:
                    if job_id in found:
                        self._jobs[job_id] = _Cached(found[job_id], now)
                    else:
                        self._jobs.pop(job_id, None)
                self._last_job_id = last
        with self._lock:
            return {l.job_id: self._jobs[l.job_id].fact for l in launchers if l.job_id in self._jobs}

    @staticmethod
    def _stale(cached: _Cached | None, launcher: Launcher, now: float, collision: bool) -> bool:
        if cached is None:
            return True
        heartbeat = cached.fact.heartbeat
        if heartbeat is None or heartbeat < launcher.heartbeat:
            return True
        return collision and now - cached.read_at > ALIVE_FRESH

    def job_of(self, launch: LaunchIdentity | None) -> verdicts.JobFact | None:
        """The fact for ``launch``'s launcher (``facts`` first), or None."""
        if launch is None or launch.launcher is None:
            return None
        return self.facts([launch]).get(launch.launcher.job_id)

    def owned(self, launch: LaunchIdentity | None, deployment: str | None, pod: str = "-") -> bool:
        """``verdicts.owned`` with this database's facts; a pod that proves a collision raises it.
        Raises on DB errors (the caller then deletes nothing)."""
        job = self.job_of(launch)
        self.check(launch, deployment, job, pod)
        return verdicts.owned(launch, deployment, job, self.collision)

    def check(self, launch: LaunchIdentity | None, deployment: str | None, job: verdicts.JobFact | None,
              pod: str = "-") -> str | None:
        """Raise the collision when this pod proves one; returns the evidence (None: none)."""
        evidence = verdicts.collision_evidence(launch, deployment, job, self._last_job_id)
        if evidence is not None:
            self.raise_collision(evidence, pod, launch)
        return evidence

    def survey(self, launches: Iterable[tuple[str, LaunchIdentity | None]], deployment: str | None) -> int:
        """Check every (pod, launch) for collision evidence (the sweep's pages, the picture of pods in
        flight at start): one read for their launchers. Returns how many pods proved one."""
        pairs = [(pod, launch) for pod, launch in launches if launch is not None and launch.launcher is not None]
        found = self.facts(launch for _, launch in pairs)
        return sum(self.check(launch, deployment, found.get(launch.launcher.job_id), pod) is not None
                   for pod, launch in pairs)

    def raise_collision(self, evidence: str, pod: str, launch: LaunchIdentity | None) -> None:
        now = self._clock()
        with self._lock:
            self._raised_until = now + HOLD
            last = self._reported.get(evidence)
            report = last is None or now - last > HOLD
            if report:
                self._reported[evidence] = now
        metrics.incr("deployment.collision")
        if report:
            log.error("fenced_k8s_executor deployment id collision: pod %s is stamped with this deployment's id %s "
                      "but another database launched it (%s). Two Airflow deployments share this id (a restored "
                      "snapshot or clone of the metadata DB?): until no such pod is seen for %.0f s this scheduler "
                      "deletes only pods a scheduler alive in this database launched. Give one of them its own "
                      "[fenced_kubernetes_executor] deployment_id.", pod,
                      launch.deployment if launch is not None else "-", evidence, HOLD)

    def own(self, job_id: int | None, max_age: float) -> Launcher | None:
        """The launcher to stamp on this scheduler's pods: its job's start and latest heartbeat as the
        DB holds them, read again when older than ``max_age`` seconds (the heartbeat interval: the
        row changes no faster). None while unknown. Raises on DB errors."""
        if job_id is None:
            return None
        now = self._clock()
        with self._lock:
            cached = self._jobs.get(job_id)
        if cached is None or now - cached.read_at > max_age:
            found, last = self._read([job_id])
            now = self._clock()
            with self._lock:
                self._last_job_id = last
                if job_id in found:
                    cached = self._jobs[job_id] = _Cached(found[job_id], now)
        if cached is None or cached.fact.started is None or cached.fact.heartbeat is None:
            return None
        return Launcher(job_id, cached.fact.started, cached.fact.heartbeat)

    def describe(self) -> dict[str, Any]:
        """What ``airflow fenced-k8s pods`` and tests show."""
        return {"collision": self.collision, "last_job_id": self._last_job_id}
