"""Issue 28: fences that survive scheduler restarts.

A Pending pod superseded by a clear dies within one loop of a live scheduler, whichever process
created it: one that exited after SIGTERM (``end()``, its Job marked ``success`` as airflow-core
marks it), one that was killed (SIGKILL of a real scheduler process: its Job stays ``running``
until its heartbeat ages), or one restarted under a new job id on the same host. The sweep is
off (the harness default): only the deployment-wide in-flight reconcile sees these pods. Each
test asserts that the stock executor leaves the stale pod behind; the safety test asserts that
nobody deletes a live peer's current pod. Every supersession is airflow-core's own
(``clear_task_instances``, then the scheduler's critical section re-queues with a new token).
"""

from __future__ import annotations

import threading
import time
from urllib.parse import unquote

import pytest

from fenced_k8s_executor.names import TOKEN_ANNOTATION

KINDS = ["stock", "fenced"]


@pytest.fixture
def quick_heartbeats(monkeypatch):
    """Schedulers heartbeat every 0.3 s (the harness's health-check threshold is 1 s)."""
    monkeypatch.setenv("AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC", "0.3")


def _stale_pod(world, first) -> str:
    (name,) = [p.metadata.name for p in world.live_pods(first)
               if (p.metadata.annotations or {}).get(TOKEN_ANNOTATION, first.token) == first.token]
    return name


def _supersede(world, sched, first) -> None:
    """A user clears the task (new row id, token gone) and ``sched`` queues it again (new token)."""
    world.airflow.clear(first)
    world.queue(sched)
    again = world.row("t1")
    assert again.id != first.id and again.state == "queued" and again.queued_by_job_id == sched.job_id


def _alive(world, first, name: str) -> bool:
    return name in {p.metadata.name for p in world.live_pods(first)}


def _wait_heartbeat_older_than(world, job_id: int, seconds: float) -> None:
    from sqlalchemy import text

    while True:
        with world.engine.connect() as conn:
            age = conn.execute(text("SELECT EXTRACT(EPOCH FROM (now() - latest_heartbeat)) FROM job WHERE id = :id"),
                               {"id": job_id}).scalar()
        if float(age) > seconds:
            return
        time.sleep(0.1)


def _assert_fenced_by(world, kind, first, stale, sched) -> None:
    if kind == "stock":
        assert _alive(world, first, stale), "stock executor no longer leaves the superseded Pending pod"
        return
    assert not _alive(world, first, stale)
    assert stale in {d["name"] for d in world.deletes_by(sched, succeeded=True)}
    assert world.pod_of(world.row("t1"))  # the current launch's pod is there, untouched


@pytest.mark.parametrize("kind", KINDS)
def test_pending_pod_of_a_scheduler_that_exited_after_sigterm_dies_within_one_loop_of_its_peer(world, kind):
    creator, peer = world.scheduler(kind), world.scheduler(kind)
    world.queue(creator)
    creator.executor.sync()  # the pod is created and stays Pending
    first = world.row("t1")
    stale = _stale_pod(world, first)
    creator.stop()  # SIGTERM's path: end() the executor, the Job marked success and completed
    _supersede(world, peer, first)
    peer.executor.sync()  # one loop of the surviving scheduler
    _assert_fenced_by(world, kind, first, stale, peer)


@pytest.mark.parametrize("kind", KINDS)
def test_pending_pod_of_a_killed_scheduler_dies_within_one_loop_of_its_peer(world, quick_heartbeats, kind):
    peer = world.scheduler(kind)
    creator = world.scheduler_process(kind, hostname="scheduler-host-a")
    first = world.row("t1")
    assert first.queued_by_job_id == creator.job_id
    stale = _stale_pod(world, first)
    creator.kill()  # SIGKILL: its Job row says running until its heartbeat ages out
    _supersede(world, peer, first)
    _wait_heartbeat_older_than(world, creator.job_id, 1.0)  # the harness's health-check threshold
    peer.executor.sync()  # one loop once the creator is not running
    _assert_fenced_by(world, kind, first, stale, peer)


@pytest.mark.parametrize("how", ["sigterm", "kill"])
@pytest.mark.parametrize("kind", KINDS)
def test_pending_pod_of_a_restarted_scheduler_dies_in_the_new_process_first_loop(world, quick_heartbeats, kind, how):
    """The restarted process (same host, new job id) starts after the pod exists: it knows it from
    its one list at start; with SIGKILL the old Job is still ``running`` and fresh, but a newer
    scheduler runs on its host."""
    if how == "sigterm":
        creator = world.scheduler(kind, hostname="scheduler-host-a")
        world.queue(creator)
        creator.executor.sync()
    else:
        creator = world.scheduler_process(kind, hostname="scheduler-host-a")
    first = world.row("t1")
    stale = _stale_pod(world, first)
    if how == "sigterm":
        creator.stop()
    else:
        creator.kill()
    restarted = world.scheduler(kind, hostname="scheduler-host-a")
    assert restarted.job_id != creator.job_id
    _supersede(world, restarted, first)
    restarted.executor.sync()  # the new process's first loop
    _assert_fenced_by(world, kind, first, stale, restarted)
    if kind == "fenced":  # what it knew came from one metadata list at start, no pod read per pod
        mine = [e for e in world.audit() if e.get("who") == restarted.user and e.get("resource", "pods") == "pods"]
        lists = [e for e in mine if e.get("verb") == "list" and "status.phase!=Succeeded" in unquote(str(e.get("query")))]
        assert len(lists) == 1, lists
        assert not [e for e in mine if e.get("verb") == "get" and e.get("name") == stale]


@pytest.mark.parametrize("kind", KINDS)
def test_current_pod_of_a_live_peer_is_never_deleted_by_another_scheduler(world, quick_heartbeats, kind):
    other = world.scheduler(kind)
    peer = world.scheduler_process(kind, hostname="scheduler-host-a")  # live: it loops and heartbeats
    row = world.row("t1")
    current = world.pod_of(row)
    world.settle(other.executor, 3.0)  # the peer is running: its launches are its own business
    peer.kill()
    _wait_heartbeat_older_than(world, peer.job_id, 1.0)
    world.settle(other.executor, 2.0)  # now it is not running: its launch is re-checked here, and current
    assert _alive(world, row, current)
    assert current not in {d["name"] for d in world.deletes_by(other)}
    assert world.row("t1").token == row.token


@pytest.mark.parametrize("kind", KINDS)
def test_a_woken_schedulers_create_that_lost_to_the_adopter_frees_its_slot(world, needs_write_faults,
                                                                          quick_heartbeats, kind):
    """The woken scheduler's create was in flight (slow API) while its peer adopted the launch
    and created its pod (same token, same name); the woken create then meets AlreadyExists. The
    slot must not stay in ``running``: the adopter's pod carries the adopter's label, so the
    woken scheduler's watcher never reports it (before the fix: 31 of 32 slots held for good).
    Quick heartbeats: the adopter's heartbeat waits out a heartbeat interval since its start, and
    at the default 5 s its create came only ~1 s before the woken one's (6 s in flight) landed,
    so under load the woken create sometimes won (once in 9 runs of the 3.4 race step here, beside a CI run)."""
    # the woken scheduler's create waits for its answer (no client-side timeout before it lands)
    world.monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__KUBE_CLIENT_REQUEST_ARGS", '{"_request_timeout": [5, 30]}')
    woken, adopter = world.scheduler(kind), world.scheduler(kind)
    world.queue(woken)
    first = world.row("t1")
    world.backend.add_fault(method="POST", path=r"/pods$", delay=6.0, times=1, who=woken.user)
    loop = threading.Thread(target=woken.executor.sync)  # pre-check passes, the create waits 6 s
    loop.start()
    time.sleep(0.5)
    world.kill(woken)
    adopter.adopt_or_reset_orphans()  # fenced: launched here under the same token; stock: reset
    adopter.trigger()
    adopter.executor.sync()
    if kind == "fenced":  # the adopter's pod exists before the woken create lands
        assert [p.metadata.labels["airflow-worker"] for p in world.live_pods(first)] == [str(adopter.job_id)]
    loop.join()
    (create,) = [e for e in world.audit() if e.get("verb") == "create" and e.get("who") == woken.user
                 and e.get("resource") == "pods"]
    if kind == "fenced":
        assert create["code"] == 409, "the woken create landed before the adopter's: no race to lose"
    world.settle(woken.executor, 1.5)
    if kind == "stock":  # the reset TI's stale pod is the woken scheduler's, and so is the slot
        assert first.key in woken.executor.running, "stock executor no longer holds the woken slot"
        return
    assert first.key not in woken.executor.running
    (pod,) = world.live_pods(first)
    assert pod.metadata.labels["airflow-worker"] == str(adopter.job_id)


def test_a_stopped_scheduler_is_stopped_as_airflow_core_stops_one(world):
    """``Scheduler.stop`` (what the tests call a clean exit) leaves the Job as ``run_job`` does
    after SIGTERM: ``success`` with an end date, not ``running`` with an ageing heartbeat."""
    from sqlalchemy import text

    sched = world.scheduler("stock")
    sched.stop()
    with world.engine.connect() as conn:
        state, end_date = conn.execute(text("SELECT state, end_date FROM job WHERE id = :id"),
                                       {"id": sched.job_id}).one()
    assert (state, end_date is not None) == ("success", True)


@pytest.mark.parametrize("kind", KINDS)
def test_a_watcher_ends_on_sigterm_so_a_stopping_scheduler_hands_over_at_once(world, kind):
    """The scheduler registers its SIGTERM handler before it starts its executors; the watcher
    processes they fork inherit it, and it does nothing outside the main process. The provider's
    ``end()`` then waits 20 s for each watcher before killing it, with the Job still running."""
    sched = world.scheduler(kind, start=False)
    resetter = sched.runner.register_signals()
    try:
        sched.executor.start()
    finally:
        resetter.close()
    (watcher,) = sched.executor.kube_scheduler.kube_watchers.values()
    time.sleep(1.0)  # the fenced watcher gives SIGTERM back its default as its run() begins
    watcher.terminate()  # SIGTERM, as end() sends it
    watcher.join(timeout=5)
    ended = not watcher.is_alive()
    if not ended:
        watcher.kill()
        watcher.join()
    assert ended is (kind == "fenced"), "stock watcher now ends on SIGTERM" if kind == "stock" else "still alive"


@pytest.mark.parametrize("kind", KINDS)
def test_a_pending_pod_adopted_from_a_stopped_scheduler_then_superseded_frees_the_adopters_slot(world, kind):
    """The adopter lists the stopped scheduler's pods as metadata only (no phase): the adopted
    Pending pod must still be re-checked as one of the adopter's own launches in flight, so that
    when a clear supersedes it, its deletion frees the adopter's slot (the provider reports
    nothing for a Pending pod that is deleted). Before: judged as an orphan, deleted, slot held."""
    creator, adopter = world.scheduler(kind), world.scheduler(kind)
    world.queue(creator)
    creator.executor.sync()
    first = world.row("t1")
    stale = _stale_pod(world, first)
    creator.stop()
    world.kill(creator)  # its Job is closed; the adopter's orphan check runs
    adopter.adopt_or_reset_orphans()
    assert first.key in adopter.executor.running  # adopted, not reset
    _supersede(world, adopter, first)
    adopter.executor.sync()
    world.settle(adopter.executor, 1.5)
    if kind == "stock":
        assert _alive(world, first, stale) and first.key in adopter.executor.running, \
            "stock executor no longer leaves the adopted superseded pod and its slot"
        return
    assert not _alive(world, first, stale)
    assert first.key not in adopter.executor.running
    assert world.row("t1").key in adopter.executor.running  # the current launch holds its own slot


def _stopped_creator_with_superseded_pod(world):
    """A fenced scheduler created t1's pod and stopped; a user cleared t1. Returns (first row, pod)."""
    creator = world.scheduler("fenced", hostname="scheduler-host-a")
    world.queue(creator)
    creator.executor.sync()
    first = world.row("t1")
    stale = _stale_pod(world, first)
    creator.stop()
    return first, stale


def test_an_api_error_at_start_neither_deletes_nor_keeps_the_scheduler_from_starting(world, needs_emulator):
    first, stale = _stopped_creator_with_superseded_pod(world)
    restarted = world.scheduler("fenced", start=False, hostname="scheduler-host-a")
    world.backend.add_fault(method="GET", path=r"/pods$", status=500, times=4, who=restarted.user)
    restarted.executor.start()  # returns although its list of this deployment's Pending pods failed
    _supersede(world, restarted, first)
    assert world.sync_until(restarted.executor, lambda: not _alive(world, first, stale), timeout=30)
    assert world.pod_of(world.row("t1"))  # the current launch's pod, created meanwhile, untouched


def test_a_db_outage_at_start_neither_deletes_nor_keeps_the_scheduler_from_starting(world, pg_server):
    from test_db_faults import db_outage

    first, stale = _stopped_creator_with_superseded_pod(world)
    restarted = world.scheduler("fenced", start=False, hostname="scheduler-host-a")
    world.airflow.clear(first)  # no scheduler has re-queued it: the row names no token yet
    with db_outage(world, pg_server):
        restarted.executor.start()
        for _ in range(5):
            restarted.executor.sync()  # the loop's read fails: no evidence, nothing deleted
        assert _alive(world, first, stale)
    world.queue(restarted)  # re-queued with a new token: now the pod is superseded
    restarted.executor.sync()
    assert not _alive(world, first, stale)
