"""The witness's renewals when the Lease does not answer: what it said last stays what it says (a
scheduler live at the last reading is not taken for dead because this process cannot read), a
loop tries once and never waits on the thread's renewal, a refusal after the start went on is
retried, a stop is posted after a renewal in flight, and a crash loop's entries stay bounded.

The Lease is a fake (``CoordinationV1Api`` replaced; it answers as a merge PATCH does), this
database's job rows a dict, the clock a variable: each test fails on the code before its fix.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import kubernetes.client
import pytest
from kubernetes.client.rest import ApiException

from fenced_k8s_executor import lineage
from fenced_k8s_executor.ancestry import Record
from fenced_k8s_executor.launch import Launcher
from fenced_k8s_executor.lineage import Entry, JobRow, Provenance
from fenced_k8s_executor.witness import DEAD_KEPT, PRUNE_AFTER, Witness, entries, entry_key, entry_value, pruned

T0 = datetime(2026, 12, 6, 8, tzinfo=timezone.utc)
ME, PEER = Launcher(1, T0 - timedelta(hours=1)), Launcher(2, T0 - timedelta(hours=2))


class Lease:
    """One Lease's annotations behind ``patch_namespaced_lease``; ``fail`` raises instead, ``hold``
    makes the next call wait for ``release`` (and sets ``entered`` meanwhile)."""

    def __init__(self) -> None:
        self.annotations: dict[str, str] = {}
        self.fail: Exception | None = None
        self.calls = 0
        self.hold = False
        self.entered, self.release = threading.Event(), threading.Event()

    def patch_namespaced_lease(self, name, namespace, body, **kwargs):
        self.calls += 1
        held, self.hold = self.hold, False
        if held:
            self.entered.set()
            assert self.release.wait(10)
        if self.fail is not None:
            raise self.fail
        for key, value in body["metadata"]["annotations"].items():
            if value is None:
                self.annotations.pop(key, None)
            else:
                self.annotations[key] = value
        return SimpleNamespace(metadata=SimpleNamespace(annotations=dict(self.annotations)))


@pytest.fixture
def lease(monkeypatch) -> Lease:
    fake = Lease()
    monkeypatch.setattr(kubernetes.client, "CoordinationV1Api", lambda api_client=None: fake)
    return fake


class Clock:
    """This host's wall clock (``now``) and its monotonic clock (``mono``), moved together."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def mono(self) -> float:
        return (self.now - T0).total_seconds() + 1000.0


def witness(clock: Clock, rows: dict[int, JobRow], interval: float = 5.0, record: Record = Record()) -> Witness:
    return Witness(SimpleNamespace(api_client=None), "ns", "dep", ME.job_id, host="me", interval=interval,
                   alive_for=30.0, read=lambda ids: {j: rows[j] for j in ids if j in rows}, now=clock,
                   clock=clock.mono, recall=lambda: record, remember=lambda at: None)


def a_live_peer_level_with_its_row(lease: Lease, clock: Clock) -> dict[int, JobRow]:
    """A peer of this database posting a heartbeat its row holds: unproven until it moves (a copy
    taken between two heartbeats reads so)."""
    lease.annotations[entry_key(PEER)] = entry_value(T0, "peer", renewed=clock.now, every=5.0)
    return {ME.job_id: JobRow(ME.started, T0), PEER.job_id: JobRow(PEER.started, T0)}


def test_a_peer_unproven_at_the_last_reading_stays_unproven_while_the_witness_cannot_be_read(lease):
    clock = Clock()
    w = witness(clock, a_live_peer_level_with_its_row(lease, clock))
    assert w.renew().unproven
    lease.fail = ApiException(status=500)
    clock.now += timedelta(seconds=20)  # past three of the peer's renewal intervals
    view = w.current(since=time.monotonic())
    assert view.unproven and not view.ready, "a scheduler live at the last reading was taken for dead"
    assert lineage.provenance(PEER, JobRow(PEER.started, None), view) is Provenance.UNSETTLED


def test_a_loop_tries_a_failing_witness_once_not_once_per_pod(lease):
    clock = Clock()
    w = witness(clock, a_live_peer_level_with_its_row(lease, clock))
    w.renew()
    lease.fail, before = ApiException(status=503), lease.calls
    loop_began = time.monotonic()
    for _ in range(50):  # fifty verdicts in one loop
        w.current(since=loop_began)
    assert lease.calls - before == 1


def test_a_loop_never_waits_for_the_threads_renewal(lease):
    clock = Clock()
    w = witness(clock, a_live_peer_level_with_its_row(lease, clock))
    w.renew()
    lease.hold = True
    in_flight = threading.Thread(target=w.renew)  # the daemon thread's renewal, stuck on the API
    in_flight.start()
    assert lease.entered.wait(5)
    verdict = threading.Thread(target=lambda: w.current(since=time.monotonic()))
    verdict.start()
    verdict.join(2)
    waited = verdict.is_alive()
    lease.release.set()
    in_flight.join(5)
    verdict.join(5)
    assert not waited, "the loop waited on a renewal in flight"


def test_a_refusal_after_the_start_went_on_is_reported_and_retried(lease):
    clock = Clock()
    w = witness(clock, {ME.job_id: JobRow(ME.started, T0)}, interval=0.2)
    lease.hold, lease.fail = True, ApiException(status=403)
    w.start(wait=0.1)  # gives up waiting: the first renewal is still in flight
    lease.release.set()
    time.sleep(0.3)  # the late 403 arrives
    lease.fail = None
    deadline = time.monotonic() + 5
    while not w.view.renewed and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert w.view.renewed, "a late refusal stopped the renewals for good"
    finally:
        w.stop()


def test_the_stop_is_posted_after_a_renewal_in_flight(lease):
    clock = Clock()
    w = witness(clock, {ME.job_id: JobRow(ME.started, T0)}, interval=1.0)
    w.renew()
    lease.hold = True
    in_flight = threading.Thread(target=w.renew)
    in_flight.start()
    assert lease.entered.wait(5)
    stopping = threading.Thread(target=w.stop)
    stopping.start()
    time.sleep(0.2)  # the stop is posted meanwhile, or waits
    lease.release.set()
    in_flight.join(5)
    stopping.join(5)
    (mine,) = [e for e in entries(lease.annotations) if e.launcher == ME]
    assert mine.stopped, "a renewal in flight overwrote the stop"


def test_a_crash_loop_leaves_the_newest_dead_entries_and_every_live_one():
    now = T0
    dead = [Entry(100 + i, now - timedelta(hours=1, seconds=i), now - timedelta(minutes=5, seconds=i),
                  stopped=True) for i in range(DEAD_KEPT + 40)]
    live = [Entry(1, T0 - timedelta(days=30), now, renewed=now, every=5.0)]
    old = [Entry(7, now - timedelta(days=9), now - PRUNE_AFTER - timedelta(seconds=1))]
    gone = pruned(dead + live + old, ME, {live[0].launcher}, now)
    assert set(gone) == set(dead[DEAD_KEPT:]) | set(old)


def test_a_copy_remembers_it_is_one_when_the_lease_is_deleted(lease):
    """Issue 59: a Lease deleted by hand while a copy ran: the copy made it again with its own entry,
    and its copy's date, recomputed from that reading, was gone: it deleted production's pods."""
    clock = Clock()
    held = {ME.job_id: JobRow(ME.started, T0), PEER.job_id: JobRow(PEER.started, T0 - timedelta(minutes=3))}
    lease.annotations[entry_key(PEER)] = entry_value(T0, "production", renewed=T0, every=5.0)  # ahead of our row
    w = witness(clock, held)
    assert w.renew().copied_at == T0 - timedelta(minutes=3)
    lease.annotations.clear()  # kubectl delete lease
    clock.now += timedelta(seconds=5)
    view = w.renew()
    assert view.copied_at == T0 - timedelta(minutes=3), "the copy forgot it is one"
    assert lineage.provenance(PEER, held[PEER.job_id], view) is Provenance.ELSEWHERE


def test_the_first_write_prunes_a_crash_loops_entries(lease):
    """Issue 59: a crash loop whose processes die within one interval of their first renewal added
    one entry per start and pruned none (a process pruned only from its previous PATCH's answer):
    at 256 KiB every renewal was refused. The first write removes the oldest beyond the bounds."""
    from fenced_k8s_executor.witness import BUDGET, MAX_ENTRIES

    clock = Clock()
    for i in range(MAX_ENTRIES + 300):  # one entry per start, each posted once, long hostnames
        started = T0 - timedelta(hours=2, seconds=i)
        lease.annotations[entry_key(Launcher(1000 + i, started))] = entry_value(
            started, "h" * 200, renewed=started, every=5.0)
    w = witness(clock, {ME.job_id: JobRow(ME.started, T0)})
    assert w.renew() is not None
    posted = entries(lease.annotations)
    assert len(posted) <= MAX_ENTRIES and ME in {e.launcher for e in posted}
    assert sum(len(k) + len(v) for k, v in lease.annotations.items()) < BUDGET
    others = {e.job_id for e in posted if e.launcher != ME}
    assert 1000 in others and max(others) < 1000 + MAX_ENTRIES  # the oldest posts went


def test_a_write_refused_for_the_leases_size_reads_it_and_prunes(lease, monkeypatch):
    """Issue 59: a full Lease answered every later scheduler's renewal with 422 for good."""
    clock = Clock()
    for i in range(DEAD_KEPT + 50):
        lease.annotations[entry_key(Launcher(1000 + i, T0 - timedelta(hours=3, seconds=i)))] = entry_value(
            T0 - timedelta(hours=2), "old", renewed=T0 - timedelta(hours=2), every=5.0, stopped=True)
    real = lease.patch_namespaced_lease

    def patch(name, namespace, body, **kwargs):
        if len(lease.annotations) > DEAD_KEPT + 1 and not any(v is None for v in body["metadata"]["annotations"].values()):
            raise ApiException(status=422, reason="metadata.annotations: Too long")
        return real(name, namespace, body, **kwargs)

    reads = []
    lease.read_namespaced_lease = lambda name, namespace, **kw: reads.append(name) or SimpleNamespace(
        metadata=SimpleNamespace(annotations=dict(lease.annotations)))
    monkeypatch.setattr(lease, "patch_namespaced_lease", patch)
    w = witness(clock, {ME.job_id: JobRow(ME.started, T0)})  # a new process: no answer of its own yet
    assert w.renew() is not None, "the full Lease refused the renewal"
    assert reads and len(entries(lease.annotations)) <= DEAD_KEPT + 1


def test_a_scheduler_whose_posts_keep_failing_says_so_at_error_level(lease, caplog, monkeypatch):
    """Issue 59: a 403 or 429 after the start was a warning per renewal, retried for ever, while its
    peers and any copy took it for dead. Past its liveness window it says so once at error level,
    and counts each failed renewal."""
    from fenced_k8s_executor import metrics

    counted = []
    clock = Clock()
    w = witness(clock, {ME.job_id: JobRow(ME.started, T0)})
    w.renew()
    lease.fail = ApiException(status=429)
    monkeypatch.setattr(metrics, "incr", lambda name, *a, **k: counted.append(name))
    for _ in range(8):
        clock.now += timedelta(seconds=5)
        w.renew()
    errors = [r.getMessage() for r in caplog.records
              if r.levelname == "ERROR" and "has not posted in the witness" in r.getMessage()]
    assert len(errors) == 1 and "HTTP 429" in errors[0]
    assert counted.count("witness.mute") == 5  # the renewals failing 15 s and more after the first


def test_a_copy_stores_its_date_in_its_own_database_and_reads_it_back(lease):
    """Issue 59: a copy forgot it was one once the Lease no longer showed it (deleted, pruned, or its
    scheduler restarted after that): the date is kept in its own database, which the original
    cannot copy it from, and a new process reads it back before judging anything."""
    clock = Clock()
    held = {ME.job_id: JobRow(ME.started, T0), PEER.job_id: JobRow(PEER.started, T0 - timedelta(minutes=3))}
    lease.annotations[entry_key(PEER)] = entry_value(T0, "production", renewed=T0, every=5.0)
    stored = []
    w = witness(clock, held)
    w._remember = stored.append
    w.renew()
    assert stored == [T0 - timedelta(minutes=3)]
    lease.annotations.clear()
    restarted = witness(clock, held, record=Record(copied_at=stored[0]))
    view = restarted.renew()
    assert view.copied_at == stored[0], "a restarted copy forgot it is one"
    assert lineage.provenance(PEER, held[PEER.job_id], view) is Provenance.ELSEWHERE


def test_schedulers_declared_gone_after_a_restore_are_this_databases_until_they_post_again(lease):
    """Issue 59: after a point-in-time restore the old database's schedulers' posts are ahead of the
    restored rows: the restored database took itself for a copy, and left its own running pods to
    nothing. Once an operator declares them gone (``airflow fenced-k8s restored``) they are dead
    schedulers of this database; one seen posting again was not gone: a copy after all."""
    clock = Clock()
    held = {ME.job_id: JobRow(ME.started, T0), PEER.job_id: JobRow(PEER.started, T0 - timedelta(minutes=3))}
    lease.annotations[entry_key(PEER)] = entry_value(T0, "old", renewed=T0, every=5.0, stopped=True)
    assert witness(clock, held).renew().copied_at is not None  # undeclared: a copy, as before
    declared = Record(gone=frozenset({PEER}), declared=T0)
    w = witness(clock, held, record=declared)
    view = w.renew()
    assert view.copied_at is None and view.quiet
    assert lineage.provenance(PEER, held[PEER.job_id], view) is Provenance.HERE
    lease.annotations[entry_key(PEER)] = entry_value(T0 + timedelta(seconds=5), "old", renewed=T0, every=5.0)
    clock.now += timedelta(seconds=5)
    view = w.renew()  # it posts again: its database is not gone
    assert view.copied_at is not None and view.collision
    assert lineage.provenance(PEER, held[PEER.job_id], view) is Provenance.ELSEWHERE


def test_the_lineage_record_reads_back_what_it_stored():
    from fenced_k8s_executor.ancestry import dump, parse

    record = Record(T0, frozenset({PEER, ME}), T0 + timedelta(hours=1))
    assert parse(dump(record)) == record
    assert parse(None) == Record() and parse("not json") == Record()
