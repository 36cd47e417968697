"""The witness: a Lease beside the pods, where every live scheduler of this deployment id posts the
heartbeat its own database has committed; read against this database's job rows, it says which
database launched a pod (``lineage``).

One ``coordination.k8s.io`` Lease per deployment id, in ``[kubernetes_executor] namespace``
(``fenced-k8s-witness-<hash of the id>``, labelled with the id). Each scheduler owns one
annotation, ``fenced-k8s-executor.io/job.<job id>.<start>``, holding ``{"heartbeat", "host"}``,
and renews it once per ``[scheduler] scheduler_heartbeat_sec`` from a daemon thread: one merge
PATCH of its own key (which answers with every scheduler's entry: no read, no conflict between
writers), then one read of this database's rows of the jobs posted. Entries a week old, the
stopped or dead beyond the newest ``DEAD_KEPT`` and the oldest beyond ``MAX_ENTRIES`` or
``BUDGET`` bytes go in the same PATCH, from the first on (and in a second one when the first
answer shows some): a crash loop never fills the Lease. A copy of the database never copies the
Lease: two databases posting under one id are seen within one renewal of each. Costs per
scheduler: one PATCH and one small statement per heartbeat interval, whatever the number of pods;
one Lease per deployment.

A copy's date, once learned, is kept in the process and in this database (``ancestry``) whatever
the Lease holds later.

Until this process has renewed once, and while a live scheduler of this database has not been
seen writing here, a pod is judged only if this very process launched it: the witness cannot
yet tell whether that scheduler writes here or to an original this database was copied from.
A missing permission stops the start naming the verb; any other API or DB error is retried at
the next renewal and never deletes anything (pods not judged are never deleted).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Collection, Iterable, Mapping

from fenced_k8s_executor import ancestry, lineage, metrics
from fenced_k8s_executor.ancestry import Record
from fenced_k8s_executor.config import FencedConfigError
from fenced_k8s_executor.launch import Launcher, LaunchIdentity
from fenced_k8s_executor.lineage import Entry, JobRow, Provenance, View
from fenced_k8s_executor.names import DEPLOYMENT_LABEL, WITNESS_ENTRY_PREFIX

log = logging.getLogger("fenced_k8s_executor")

#: Entries whose heartbeat is older than this are removed by the next renewal: the evidence that a
#: database is a copy lives in its original's last entries, and a pod that old has finished.
PRUNE_AFTER = timedelta(days=7)
#: Seconds a job this database lacks is remembered as absent before it is read again.
ABSENT_FOR = 60.0
#: Pods named in the log as launched elsewhere are remembered so: once per pod.
REPORTED_MAX = 10_000
#: Seconds a reading is trusted, outside a scheduler loop, before a fence that needs a verdict reads
#: again while a live scheduler is unproven (a loop reads once, at its first such verdict).
REFRESH = 1.0
#: Entries of stopped or dead schedulers kept, newest first, whatever their age: a scheduler in a
#: crash loop posts one entry per start.
DEAD_KEPT = 256
#: Entries kept in all, and their bytes: a Lease's annotations hold 256 KiB, and a write past that
#: is refused (422) for every scheduler. The oldest posts go first; this scheduler's never.
MAX_ENTRIES = 400
BUDGET = 192 * 1024
#: The verbs a scheduler needs on leases (the chart's Role in helm-values/ grants them).
VERBS = ("create", "patch")


def lease_name(deployment: str) -> str:
    """A DNS-1123 name for any deployment id (a label value may hold ``_`` and capitals)."""
    return "fenced-k8s-witness-" + hashlib.sha256(deployment.encode()).hexdigest()[:16]


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICRO = timedelta(microseconds=1)


def entry_key(launcher: Launcher) -> str:
    """``fenced-k8s-executor.io/job.<job id>.<start in microseconds since 1970>``: one key per
    scheduler process (job ids repeat across copies of a database; their starts do not)."""
    return f"{WITNESS_ENTRY_PREFIX}{launcher.job_id}.{(launcher.started - _EPOCH) // _MICRO}"


def entry_value(heartbeat: datetime, host: str, renewed: datetime | None = None, every: float = 0.0,
                stopped: bool = False) -> str:
    data: dict[str, Any] = {"heartbeat": _utc(heartbeat).isoformat(), "host": host[:253]}
    if renewed is not None:
        data.update(renewed=_utc(renewed).isoformat(), every=every)
    if stopped:
        data["stopped"] = True
    return json.dumps(data, separators=(",", ":"))


def entries(annotations: Mapping | None) -> list[Entry]:
    """The entries of the Lease's annotations; anything that does not read is not an entry."""
    found = []
    for key, value in (annotations or {}).items():
        if not isinstance(key, str) or not key.startswith(WITNESS_ENTRY_PREFIX):
            continue
        job, _, micros = key[len(WITNESS_ENTRY_PREFIX):].partition(".")
        try:
            data = json.loads(value)
            if not (job.isdigit() and micros.isdigit() and len(micros) <= 18):
                continue
            started = _EPOCH + int(micros) * _MICRO
            beat = datetime.fromisoformat(data["heartbeat"])
            renewed = datetime.fromisoformat(data["renewed"]) if "renewed" in data else None
            every = float(data.get("every", 0.0))
            if beat.utcoffset() is None or (renewed is not None and renewed.utcoffset() is None) \
                    or not 0 <= every < 86400:
                continue
            found.append(Entry(int(job), started, _utc(beat), str(data.get("host", "-"))[:253],
                               _utc(renewed) if renewed is not None else None, every, data.get("stopped") is True))
        except (TypeError, ValueError, KeyError, OverflowError, OSError, AttributeError):
            continue
    return found


def pruned(posted: list[Entry], me: Launcher | None, live: Collection[Launcher], now: datetime) -> list[Entry]:
    """The entries a write removes, this scheduler's own never: of those not live (stopped, or dead:
    ``lineage.posting``), the ones a week old and the ones beyond the newest ``DEAD_KEPT``; and the
    oldest posts beyond ``MAX_ENTRIES`` or ``BUDGET`` bytes, whatever they are (a live one posts
    itself again at its next renewal). Recency orders only: it decides nothing else."""
    others = sorted((e for e in posted if e.launcher != me), key=_recency, reverse=True)
    gone = [e for e in others if e.launcher not in live and now - e.heartbeat > PRUNE_AFTER]
    kept = [e for e in others if e not in gone]
    gone += [e for e in kept if e.launcher not in live][DEAD_KEPT:]
    kept = [e for e in kept if e not in gone]
    size = 0
    for count, entry in enumerate(kept, start=2):  # this scheduler's own entry first
        size += _size(entry)
        if count > MAX_ENTRIES or size > BUDGET - 1024:
            gone.append(entry)
    return gone


def _recency(entry: Entry) -> datetime:
    return entry.renewed or entry.heartbeat


def _size(entry: Entry) -> int:
    return len(entry_key(entry.launcher)) + len(entry_value(entry.heartbeat, entry.host, entry.renewed, entry.every,
                                                            entry.stopped))


def read_jobs(ids: Iterable[int]) -> dict[int, JobRow]:
    """This database's rows of the scheduler jobs ``ids`` (absent: no such row). Raises on DB errors."""
    from sqlalchemy import select

    from airflow.jobs.job import Job

    from fenced_k8s_executor import db

    wanted = sorted(set(ids))
    if not wanted:
        return {}
    with db.bounded_session() as session:
        found = session.execute(select(Job.id, Job.start_date, Job.latest_heartbeat).where(Job.id.in_(wanted)))
        return {job: JobRow(_aware(started), _aware(beat)) for job, started, beat in found}


class Forbidden(FencedConfigError):
    """The scheduler may not write the witness: a start that cannot tell its pods from a copy's."""


class Witness:
    """This scheduler's post in the witness and what the last reading said; thread-safe."""

    def __init__(self, kube_client: Any, namespace: str, deployment: str, job_id: int | None, *, host: str,
                 interval: float, alive_for: float, request_args: Mapping | None = None,
                 read: Callable[[Iterable[int]], dict[int, JobRow]] = read_jobs,
                 now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 clock: Callable[[], float] = time.monotonic, recall: Callable[[], Record] = ancestry.read,
                 remember: Callable[[datetime], Any] = ancestry.remember_copy, also: Iterable[str] = ()) -> None:
        self.namespace, self.name, self.deployment = namespace, lease_name(deployment), deployment
        self.job_id, self.host = job_id, host
        self.interval, self.alive_for = interval, timedelta(seconds=alive_for)
        self._kube, self._args, self._read = kube_client, dict(request_args or {}), read
        self._now, self._clock = now, clock
        self._recall, self._remember = recall, remember
        #: Leases of the ids this database held before (``Deployment.stored``), read only: a copy
        #: given its own id learns there that it is one.
        self._also = tuple(lease_name(other) for other in also)
        self._beside: list[Entry] = []  # their entries at the last reading
        self._record = Record()  # what this database remembers of its lineage (``ancestry``), as last read
        self._lock = threading.Lock()
        self._renewing = threading.Lock()
        self._tried_at = float("-inf")  # when the last renewal was tried (monotonic)
        self._read_wall: datetime | None = None  # when the last reading was made (this clock)
        self._seen: dict[Launcher, tuple[Entry, bool]] = {}  # lineage.observe's sightings
        self._copied_at: datetime | None = None  # this database is a copy taken about then: never forgotten
        self._failing_since: float | None = None  # when this scheduler's posts began to fail (``clock``)
        self._said_mute = False  # the error line of this streak of failures is out
        self._starting = False  # start() waits for the first renewal: a refusal stops the start
        self._me: Launcher | None = None
        self._beat: datetime | None = None  # this job's latest heartbeat as this database last said
        self._rows: dict[int, JobRow] = {}  # the posted jobs' rows at the last reading
        self._posted: list[Entry] = []  # the entries at the last reading
        self._renewed = False
        self._here: set[int] = set()
        self._started: dict[int, tuple[datetime | None, float]] = {}  # launcher rows: job -> (start, read at)
        self._reported: OrderedDict[str, None] = OrderedDict()
        self._said: tuple = (((), None), ())  # (rivals and the copy's date, mute schedulers) last said
        self._stop = threading.Event()
        self._first = threading.Event()
        self._refusal: Forbidden | None = None
        self._thread: threading.Thread | None = None
        self._last: Mapping = {}  # the Lease's annotations as the last renewal found them

    # ------------------------------------------------------------------ the loop's view

    def current(self, since: float | None = None) -> View:
        """The view, read again first when a live scheduler of this database is still unproven and
        the reading is older than ``since`` (a monotonic time: the loop's start), else than
        ``REFRESH`` seconds: a peer that stopped (or heartbeat) since is judged now, not at the
        next renewal, so its pods are judged within one loop. A failed reading keeps the one
        before (no evidence either way) and is not tried again before ``since`` moves on (a loop
        tries once, not once per pod); a renewal in progress is not waited for."""
        view = self.view
        due = self._tried_at < since if since is not None else time.monotonic() - self._tried_at > REFRESH
        if view.unproven and due and not self._stop.is_set() and self._renewing.acquire(blocking=False):
            try:
                view = self._renew() or self.view
            finally:
                self._renewing.release()
        return view

    @property
    def view(self) -> View:
        """The last reading, judged again now, but never later than one renewal interval after it:
        an entry whose heartbeat has aged out since is a dead scheduler's, no longer one to wait
        for (its database's schedulers judge it so too); while renewals fail, a scheduler that was
        live at the last reading stays live (that it stopped is no evidence this process has)."""
        if not self._renewed:
            return View()
        with self._lock:
            at = min(self._now(), self._read_wall + timedelta(seconds=self.interval))
            posted = self._posted + self._beside
            view = lineage.judge(posted, self._rows, self._here, self._me, lineage.posting(posted, at, self.alive_for),
                                 self._copied_at, lineage.silent(self._seen, self._record.gone))
        # What the other ids' Leases say of this database's jobs counts; their own schedulers are
        # another deployment's now, no collision with this id.
        return replace(view, rivals=tuple(e for e in view.rivals if e not in self._beside))

    @property
    def launcher(self) -> Launcher | None:
        """This scheduler's launcher stamp, once its job row has been read."""
        return self._me

    def provenance(self, launch: LaunchIdentity | None, since: float | None = None) -> Provenance:
        """``lineage.provenance`` of one pod's launch (``since``: see ``current``). Raises on DB
        errors (no evidence: the caller deletes nothing)."""
        return self.provenances([launch], since)[0]

    def provenances(self, launches: list[LaunchIdentity | None], since: float | None = None) -> list[Provenance]:
        """``provenance`` of each launch, with one statement for launcher jobs not read before."""
        view = self.current(since)
        launchers = [launch.launcher if launch is not None else None for launch in launches]
        self._learn({l.job_id for l in launchers if l is not None and l.started is not None})
        with self._lock:
            started = {job: start for job, (start, _) in self._started.items()}
        return [lineage.provenance(l, None if l is None or started.get(l.job_id) is None
                                   else JobRow(started[l.job_id], None), view) for l in launchers]

    def _learn(self, jobs: set[int]) -> None:
        """Read the start of launcher jobs not known yet (absent ones again after ``ABSENT_FOR``)."""
        clock = time.monotonic()
        with self._lock:
            unknown = {j for j in jobs if j not in self._started
                       or (self._started[j][0] is None and clock - self._started[j][1] > ABSENT_FOR)}
        if not unknown:
            return
        found = self._read(unknown)
        with self._lock:
            for job in unknown:
                self._started[job] = (found[job].started if job in found else None, clock)

    def elsewhere(self, pod: str, launch: LaunchIdentity | None, path: str) -> None:
        """A pod of this deployment that another database launched: never deleted or adopted here.
        Counted each time, named in the log once per pod."""
        metrics.incr("pod.launched_elsewhere", {"path": path})
        with self._lock:
            if pod in self._reported:
                return
            self._reported[pod] = None
            if len(self._reported) > REPORTED_MAX:
                self._reported.popitem(last=False)
        launcher = launch.launcher if launch is not None else None
        named = (f"scheduler job {launcher.job_id} started {_iso(launcher.started)}"
                 if launcher is not None and launcher.started is not None else "an unreadable launcher")
        log.warning("fenced_k8s_executor pod %s carries this deployment's id %s but names %s, which %s: never "
                    "deleted or adopted by this deployment (named once per pod)", pod, self.deployment, named,
                    "this database inherited from the one it was copied from" if launcher is not None
                    and (copied := self.view.copied_at) is not None and launcher.started and launcher.started <= copied
                    else "is not a scheduler of this database")

    # ------------------------------------------------------------------ renewing

    def start(self, wait: float) -> None:
        """Renew once in the background and wait up to ``wait`` seconds for it; a missing permission
        stops the start (``Forbidden``), anything else is retried at the next renewal."""
        self._starting = True
        self._thread = threading.Thread(target=self._run, name="fenced-k8s-witness", daemon=True)
        self._thread.start()
        self._first.wait(wait)
        with self._lock:  # a refusal after this is reported and retried (the start went on)
            self._starting, refusal = False, self._refusal
        if refusal is not None:
            raise refusal

    def stop(self) -> None:
        """Stop renewing and post, once more, that this scheduler stopped (best effort): no live
        scheduler for its peers to wait for, and still the last heartbeat it posted, which a copy
        of this database taken before it reads as the original's. After a renewal in flight, which
        would overwrite it (waited for up to one interval)."""
        self._stop.set()
        if self._me is None or self._beat is None or self._refusal is not None:
            return
        from kubernetes.client import CoordinationV1Api

        waited = self._renewing.acquire(timeout=max(self.interval, 1.0))
        try:
            value = entry_value(self._beat, self.host, self._now(), self.interval, stopped=True)
            CoordinationV1Api(self._kube.api_client).patch_namespaced_lease(
                self.name, self.namespace, {"metadata": {"annotations": {entry_key(self._me): value}}},
                _content_type="application/merge-patch+json", **self._args)
        except Exception as error:  # noqa: BLE001 - its entry ages out on its own
            log.info("fenced_k8s_executor could not post this scheduler's stop in the witness: %r", error)
        finally:
            if waited:
                self._renewing.release()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.renew()
            self._first.set()
            if self._refusal is not None:
                return
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def renew(self) -> View | None:
        """Post this scheduler's heartbeat and read everyone's; None when that could not be done.
        One at a time (the thread's, or the loop's through ``current``)."""
        with self._renewing:
            return self._renew()

    def _renew(self) -> View | None:
        self._tried_at = time.monotonic()
        done = False  # this scheduler's post went through
        try:
            if self._me is None or self._beat is None:
                self._read_me()
            annotations = self._post() if self._me is not None and self._beat is not None else None
            if annotations is None:
                return None
            done, self._failing_since, self._said_mute = True, None, False
            posted = entries(annotations)
            mine = {e.launcher for e in posted}
            beside = [e for name in self._also for e in _read_lease(self._kube, self.namespace, name, self._args)
                      if e.launcher not in mine]
            rows = self._read({e.job_id for e in posted + beside} | {self._me.job_id})
            record = self._recall()
        except Exception as error:  # noqa: BLE001 - never evidence; the next renewal tries again
            self._failed(error, done)
            return None
        with self._lock:
            if record.declared != self._record.declared:  # an operator's declaration starts afresh
                self._copied_at = record.copied_at
            elif record.copied_at is not None:
                self._copied_at = max(filter(None, (self._copied_at, record.copied_at)))
            self._record = record
            self._here |= lineage.moved(self._rows, rows)
            self._rows = rows
            mine = rows.get(self._me.job_id)
            if mine is not None and mine.heartbeat is not None:
                self._beat = mine.heartbeat
            self._posted, self._beside, self._renewed, self._read_wall = posted, beside, True, self._now()
            self._seen = lineage.observe(self._seen, posted + beside)
        view = self.view
        with self._lock:
            self._copied_at = view.copied_at
        if view.copied_at is not None and (record.copied_at is None or view.copied_at > record.copied_at):
            try:
                self._remember(view.copied_at)
            except Exception as error:  # noqa: BLE001 - kept in this process; stored at the next renewal
                log.warning("fenced_k8s_executor could not store that this database is a copy: %r", error)
        self._say(view)
        return view

    def _read_me(self) -> None:
        if self.job_id is None:
            return
        mine = self._read([self.job_id]).get(self.job_id)
        if mine is not None and mine.started is not None and mine.heartbeat is not None:
            self._me, self._beat = Launcher(self.job_id, mine.started), mine.heartbeat
            with self._lock:
                self._started[self.job_id] = (mine.started, time.monotonic())

    def _post(self) -> Mapping | None:
        """Merge-patch this scheduler's entry (create the Lease when it is absent), removing what
        ``pruned`` names; the Lease's annotations as the server holds them after it. An answer
        that shows entries to remove which this write did not (the first write, or another
        scheduler's posts since) is followed by a second write removing them; a write refused for
        the Lease's size (422) reads the Lease and removes them first."""
        from kubernetes.client import CoordinationV1Api
        from kubernetes.client.rest import ApiException

        api = CoordinationV1Api(self._kube.api_client)
        try:
            lease = self._write(api, entries(self._last))
        except ApiException as error:
            if error.status != 422:
                raise
            held = _as("get", functools.partial(api.read_namespaced_lease, self.name, self.namespace, **self._args))
            lease = self._write(api, entries(held.metadata.annotations))
        answer = lease.metadata.annotations or {}
        if self._doomed(entries(answer)):
            lease = self._write(api, entries(answer))
        self._last = lease.metadata.annotations or {}
        return self._last

    def _doomed(self, posted: list[Entry]) -> set[Launcher]:
        now = self._now()
        return {e.launcher for e in pruned(posted, self._me, lineage.posting(posted, now, self.alive_for), now)}

    def _write(self, api: Any, posted: list[Entry]) -> Any:
        """One merge PATCH of this scheduler's entry, removing what ``pruned`` names of ``posted``
        (one create when the Lease is absent)."""
        from kubernetes.client.rest import ApiException

        now = self._now()
        mine = {entry_key(self._me): entry_value(self._beat, self.host, now, self.interval)}
        body = {"metadata": {"labels": {DEPLOYMENT_LABEL: self.deployment},
                             "annotations": {**mine, **{entry_key(gone): None for gone in self._doomed(posted)}}},
                "spec": {"holderIdentity": f"{self.host}/{self.job_id}", "renewTime": _micro(now),
                         "leaseDurationSeconds": max(1, int(self.alive_for.total_seconds()))}}
        patch = functools.partial(api.patch_namespaced_lease, self.name, self.namespace, body,
                                  _content_type="application/merge-patch+json", **self._args)
        try:
            return _as("patch", patch)
        except ApiException as error:
            if error.status != 404:
                raise
        new = {"metadata": {"name": self.name, "labels": body["metadata"]["labels"], "annotations": mine},
               "spec": body["spec"]}
        try:
            return _as("create", functools.partial(api.create_namespaced_lease, self.namespace, new, **self._args))
        except ApiException as raced:
            if raced.status != 409:
                raise
        return _as("patch", patch)

    def _failed(self, error: BaseException, posted: bool) -> None:
        from fenced_k8s_executor import pods, sqlstate

        status = getattr(error, "status", None)
        with self._lock:
            refused = status == 403 and self._refusal is None and self._starting
        if not refused and not posted:
            self._mute(error)
        if refused:
            verb = getattr(error, "fenced_verb", "patch")
            self._refusal = Forbidden(
                f"fenced_k8s_executor: the scheduler may not {verb} the Lease {self.namespace}/{self.name} (the "
                f"witness that tells this deployment's pods from a copy's): grant its service account the verbs "
                f"{', '.join(VERBS)} on leases.coordination.k8s.io in namespace {self.namespace} "
                f"(helm-values/fenced-production.yaml does), or set [fenced_kubernetes_executor] mode = off")
            log.error("%s", self._refusal)
            return
        metrics.incr("witness.error", {"status": str(status) if status else type(error).__name__})
        if pods.is_api_error(error):
            pods.report("witness", error, then="pods are judged once it answers")
        else:
            log.warning("fenced_k8s_executor could not renew the witness, pods are judged once it answers: %s",
                        sqlstate.describe(error) if hasattr(error, "orig") else repr(error))

    def _mute(self, error: BaseException) -> None:
        """This scheduler's posts keep failing: once they have for three renewal intervals (when its
        peers stop taking it for live), say so at error level (once per streak) and count it at
        every failed renewal. It goes on launching: its pods stay safe, for a reader never takes a
        scheduler that wrote to its database without posting for dead (``lineage.judge``), and a
        refused Lease must not stop a whole deployment's launches (design.md)."""
        clock = self._clock()
        if self._failing_since is None:
            self._failing_since = clock
        failing = clock - self._failing_since
        window = 3 * max(self.interval, 1.0)
        if failing < window:
            return
        metrics.incr("witness.mute")
        if not self._said_mute:
            self._said_mute = True
            log.error("fenced_k8s_executor this scheduler (job %s) has not posted in the witness %s/%s for %.0f s "
                      "(last error: %s): its peers and any copy of this database no longer see it renew, and "
                      "leave its pods alone until it posts again; check its RBAC on leases "
                      "(helm-values/witness-rbac.yaml), API Priority and Fairness, admission webhooks",
                      self.job_id, self.namespace, self.name, failing,
                      f"HTTP {error.status}" if getattr(error, "status", None) else type(error).__name__)

    def _say(self, view: View) -> None:
        """One error line when another database shows up, this one turns out to be a copy, or a
        scheduler of its line writes without posting; one info line when the other database is
        gone again. A metric at every renewal while any holds."""
        if view.collision:
            metrics.incr("witness.collision", count=len(view.rivals))
        if view.copied_at is not None:
            metrics.incr("witness.copy")
        if view.mute:
            metrics.incr("witness.mute_peer", count=len(view.mute))
        rivals = (tuple(sorted((e.job_id, e.started) for e in view.rivals)), view.copied_at)
        mute = tuple(sorted((e.job_id, e.started) for e in view.mute))
        (rivals_before, mute_before), self._said = self._said, (rivals, mute)
        if mute and mute != mute_before:
            log.error("%s", mute_line(view, f"{self.namespace}/{self.name}"))
        if rivals == rivals_before:
            return
        if view.collision or view.copied_at is not None:
            log.error("%s", collision_line(view, self.deployment, f"{self.namespace}/{self.name}", self._me))
        elif rivals_before != ((), None):
            log.info("fenced_k8s_executor deployment id %s: no other database posts under it any more; every "
                     "scheduler job of this database is judged again", self.deployment)


def observe(kube_client: Any, namespace: str, deployment: str, *, interval: float, alive_for: float,
            request_args: Mapping | None = None, read: Callable[[Iterable[int]], dict[int, JobRow]] = read_jobs,
            sleep: Callable[[float], None] = time.sleep, recall: Callable[[], Record] = ancestry.read,
            also: Iterable[str] = ()) -> View:
    """The witness as a process that does not post sees it (``airflow fenced-k8s pods``): one read of
    the Lease (and, read only, those of the ids in ``also``: ``Deployment.stored``) and of the
    posted jobs' rows, with what this database remembers (``ancestry``), and while a live
    scheduler of this database is not yet seen writing here, a second read of the rows one
    heartbeat interval later."""
    alive, record = timedelta(seconds=alive_for), recall()

    def reading() -> tuple[list[Entry], list[Entry]]:
        posted = _read_lease(kube_client, namespace, lease_name(deployment), request_args)
        mine = {e.launcher for e in posted}
        return posted, [e for other in also for e in _read_lease(kube_client, namespace, lease_name(other),
                                                                   request_args) if e.launcher not in mine]

    def judged(rows: dict[int, JobRow], here: Iterable[int]) -> View:
        every = posted + beside
        view = lineage.judge(every, rows, here, None, lineage.posting(every, datetime.now(timezone.utc), alive),
                             record.copied_at, lineage.silent(seen, record.gone))
        return replace(view, rivals=tuple(e for e in view.rivals if e not in beside))

    posted, beside = reading()
    seen = lineage.observe({}, posted + beside)
    before = read({e.job_id for e in posted + beside})
    view = judged(before, ())
    if view.unproven:
        sleep(interval + 1.0)
        posted, beside = reading()
        seen = lineage.observe(seen, posted + beside)
        after = read({e.job_id for e in posted + beside})
        view = judged(after, lineage.moved(before, after))
    return view


def declare_restored(kube_client: Any, namespace: str, deployment: str, *, interval: float,
                     request_args: Mapping | None = None, sleep: Callable[[float], None] = time.sleep,
                     now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> list[Entry]:
    """``airflow fenced-k8s restored``: after a point-in-time restore of this deployment's own database,
    declare the schedulers of the database it replaced gone (``ancestry.declare_gone``): the entries
    ahead of this database's rows of their jobs. Checked first: each must stay silent for three of
    its renewal intervals (a scheduler still posting writes to another database: this one is then
    a copy beside a live original, and nothing is declared: ``StillPosting``). Returns the entries
    declared."""
    def reading() -> list[Entry]:
        return _read_lease(kube_client, namespace, lease_name(deployment), request_args)

    first = reading()
    rows = read_jobs({e.job_id for e in first})
    ahead = [e for e in first if (row := rows.get(e.job_id)) is not None and row.started == e.started
             and (row.heartbeat is None or row.heartbeat < e.heartbeat)]
    if ahead:
        sleep(max(e.window(max(interval, 1.0)) for e in ahead) + 0.5)
    seen = lineage.observe(lineage.observe({}, first), reading())
    posting = [seen[e.launcher][0] for e in ahead if e.launcher in seen and seen[e.launcher][1]
               and not seen[e.launcher][0].stopped]
    if posting:
        raise StillPosting(posting)
    ancestry.declare_gone([e.launcher for e in ahead], now())
    log.warning("fenced_k8s_executor deployment id %s: declared gone after a point-in-time restore: %s",
                deployment, _some([_job(e.launcher, e.host) for e in ahead]) or "no scheduler (the copy's date cleared)")
    return ahead


class StillPosting(Exception):
    """A scheduler this database inherited still posts: it writes to another database."""

    def __init__(self, posting: list[Entry]) -> None:
        self.posting = posting
        super().__init__(
            f"{_some([_job(e.launcher, e.host) for e in posting])} still posts heartbeats this database lacks: it "
            f"writes to another database, so this one is a copy beside a live original, not a restore. Nothing "
            f"was declared. Stop those schedulers if that database is to go, or give this copy its own "
            f"[fenced_kubernetes_executor] deployment_id")


def _read_lease(kube_client: Any, namespace: str, name: str, request_args: Mapping | None) -> list[Entry]:
    """The entries of one Lease (none when it is absent)."""
    from kubernetes.client import CoordinationV1Api
    from kubernetes.client.rest import ApiException

    try:
        lease = _as("get", functools.partial(CoordinationV1Api(kube_client.api_client).read_namespaced_lease,
                                             name, namespace, **dict(request_args or {})))
    except ApiException as error:
        if error.status != 404:
            raise
        return []
    return entries(lease.metadata.annotations)


def _as(verb: str, call: Callable[[], Any]) -> Any:
    """``call()``, its API error marked with the verb it was refused (a 403 names it)."""
    from kubernetes.client.rest import ApiException

    try:
        return call()
    except ApiException as error:
        error.fenced_verb = verb
        raise


def collision_line(view: View, deployment: str, lease: str, me: Launcher | None) -> str:
    """The one error line: both sides' scheduler jobs, what this side does meanwhile, what to do."""
    ours = _some(([f"{_job(me)} (this one)"] if me is not None else []) + [_job(e.launcher, e.host) for e in view.peers])
    theirs = _some([_job(e.launcher, e.host) for e in view.rivals]) or "none live now"
    copy = (f"; this database is a copy taken about {_iso(view.copied_at)}: pods of its schedulers that started "
            "before then are the original's and are never deleted or adopted here" if view.copied_at else "")
    return (f"fenced_k8s_executor deployment id collision: another metadata database posts under deployment id "
            f"{deployment} in the witness {lease}. Its schedulers: {theirs}. This database's: {ours or 'none live'}"
            f"{copy}. Meanwhile {'this scheduler deletes' if me is not None else 'its schedulers delete'} only pods "
            f"of schedulers seen writing to this database. "
            f"If one of the two is a copy of the other (a staging clone, a restored snapshot), set "
            f"[fenced_kubernetes_executor] deployment_id (AIRFLOW__FENCED_KUBERNETES_EXECUTOR__DEPLOYMENT_ID) to an id "
            f"of its own on the copy and restart its schedulers; after a point-in-time restore of this deployment's "
            f"own database the other side will not come back: its pods are left alone, `airflow fenced-k8s pods` "
            f"lists them to delete by hand.")


def mute_line(view: View, lease: str) -> str:
    """The one error line for schedulers that wrote to this database's line without posting."""
    named = _some([_job(e.launcher, e.host) + f" (last posted heartbeat {_iso(e.heartbeat)})" for e in view.mute])
    return (f"fenced_k8s_executor the witness {lease} lags this database's heartbeats of {named}: each wrote to "
            f"this database, or to the one it was copied from, long after its last post (its Lease writes refused "
            f"or late: its own log says so), so it may be alive and is never taken for dead. Until it posts again, "
            f"or this scheduler sees it write here, pods of schedulers not seen writing to this database are left "
            f"alone. If it is known dead and this database is no copy, remove its entry from the Lease "
            f"(docs/operations.md, 'A scheduler that stopped posting').")


def _some(jobs: list[str], named: int = 5) -> str:
    """At most ``named`` jobs, and how many more: a crash loop can post hundreds, a log line stays short."""
    return ", ".join(jobs[:named]) + (f" and {len(jobs) - named} more" if len(jobs) > named else "")


def _job(launcher: Launcher, host: str | None = None) -> str:
    return f"job {launcher.job_id} started {_iso(launcher.started)}" + (f" on {host}" if host else "")


def _iso(value: datetime | None) -> str:
    return _utc(value).isoformat(timespec="seconds") if value is not None else "-"


def _micro(value: datetime) -> str:
    return _utc(value).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _utc(value: datetime) -> datetime:
    return value.astimezone(timezone.utc)


def _aware(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=timezone.utc) if value.utcoffset() is None else _utc(value)
