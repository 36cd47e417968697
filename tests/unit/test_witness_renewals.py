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
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def witness(clock: Clock, rows: dict[int, JobRow], interval: float = 5.0) -> Witness:
    return Witness(SimpleNamespace(api_client=None), "ns", "dep", ME.job_id, host="me", interval=interval,
                   alive_for=30.0, read=lambda ids: {j: rows[j] for j in ids if j in rows}, now=clock)


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
    gone = pruned(dead + live + old, now, timedelta(seconds=30))
    assert set(gone) == set(dead[DEAD_KEPT:]) | set(old)
