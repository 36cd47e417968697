"""Issue 35: a superseded launch's pod is fenced by its launch, not by who created it.

Every live fenced scheduler deletes, within one loop, any unfinished pod of this deployment whose
launch is superseded, whatever state its creator is in, unless the task's row names that pod as
the host the task runs on. A pod leaves the in-flight picture only on evidence from the pod itself
(it finished, or was deleted), never because its row is momentarily SCHEDULED under its token.

Each test asserts the stock executor leaves the pod behind (what 0.1.0's fences also did), and
each state change goes through airflow-core's own code: the stuck-in-queued handler, clears, the
execution API's ``/run``, the scheduler's critical section.
"""

from __future__ import annotations

import pytest

from fenced_k8s_executor.names import TOKEN_ANNOTATION

@pytest.fixture
def quick_witness(monkeypatch):
    """Heartbeats, and so the witness's renewals, every 0.2 s: a peer is seen writing to the database
    within a fraction of a second (``World.witnessed``)."""
    monkeypatch.setenv("AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC", "0.2")


KINDS = ["stock", "fenced"]


def _write_faults(world) -> None:
    backend = world.backend
    if not getattr(backend, "supports_write_faults", backend.supports_faults):
        pytest.skip("needs write faults (the emulator, or the real apiserver's admission webhook)")


def _alive(world, row, name: str) -> bool:
    return name in {p.metadata.name for p in world.live_pods(row)}


def _launch_pod(world, row) -> str:
    names = [p.metadata.name for p in world.live_pods(row)
             if (p.metadata.annotations or {}).get(TOKEN_ANNOTATION, row.token) == row.token]
    assert len(names) == 1, names
    return names[0]


@pytest.mark.parametrize("kind", KINDS)
def test_a_pending_pod_is_not_forgotten_while_its_task_waits_scheduled_under_the_same_token(world, kind):
    """Item 1. The stuck-in-queued revoke loses its delete of pod P (the API answers 404, P stays);
    ``_reschedule_stuck_task`` sends the task back to SCHEDULED keeping its token; one loop runs
    before the task is queued again (slots full, a peer in the critical section); then it is queued
    under a new token, same id and try. 0.1.0 took "current token, not QUEUED" for "P no longer in
    flight" in that loop and never looked at P again: P started and, gate off, ran the task."""
    _write_faults(world)
    sched = world.scheduler(kind)
    world.queue(sched)
    sched.executor.sync()  # P is created and stays Pending
    first = world.row("t1")
    stale = _launch_pod(world, first)
    world.backend.add_fault(method="DELETE", path=r"/pods/", status=404, times=10, who=sched.user)
    sched.stuck_in_queued()  # revoke: the delete is lost; the task goes back to SCHEDULED, same token
    world.backend.clear_faults()
    assert world.row("t1").state == "scheduled" and world.row("t1").token == first.token
    sched.executor.sync()  # one loop while the task waits SCHEDULED under P's token
    sched.enqueue()  # queued again: the same id and try, a new token (stock has no tokens)
    second = world.row("t1")
    assert second.id == first.id and (kind == "stock" or second.token != first.token)
    sched.executor.sync()  # one loop after P's launch was superseded
    if kind == "stock":
        assert _alive(world, first, stale), "stock executor no longer leaves the superseded Pending pod"
    else:
        assert not _alive(world, first, stale)


@pytest.mark.parametrize("creator_state", ["live", "stopped"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_superseded_launch_whose_pod_started_dies_within_one_loop(world, kind, creator_state, quick_witness):
    """Items 2 and 7. The pod of a launch that was current when it started (kubelet: Running), whose
    task is cleared while the worker boots, before ``/run``. Provider 10.25 reports nothing when a
    pod starts, and 0.1.0 re-checked Pending pods only: the pod lived until its ``/run`` met 404."""
    sched, peer = world.scheduler(kind), world.scheduler(kind)
    world.queue(sched)
    sched.executor.sync()
    first = world.row("t1")
    started = _launch_pod(world, first)
    world.set_pod_phase(started, "Running")  # the container starts; the task process boots
    if creator_state == "stopped":
        sched.stop()
    world.airflow.clear(first)  # a user clears the task: a new id, the token wiped
    world.queue(peer)  # re-queued by the peer: a new launch
    assert world.row("t1").id != first.id
    world.witnessed(peer)  # the peer has seen its peers write here (or stop), as it has once running
    peer.executor.sync()  # one loop of the peer
    if kind == "stock":
        assert _alive(world, first, started), "stock executor no longer leaves the started superseded pod"
    else:
        assert not _alive(world, first, started)


@pytest.mark.tasks("t1", retries=2)
@pytest.mark.parametrize("kind", KINDS)
def test_the_pod_the_task_last_ran_on_is_left_to_finish_until_the_next_try_starts(world, kind):
    """A superseded launch's pod that ran the task is the row's host until the next launch's ``/run``:
    a try that reported up_for_retry (retry_delay 0) is still uploading logs while the next try is
    queued. It is left to finish; once the next try's pod has started the task, it goes."""
    sched = world.scheduler(kind)
    world.queue(sched)
    sched.executor.sync()
    first = world.row("t1")
    ran = _launch_pod(world, first)
    world.set_pod_phase(ran, "Running")
    world.airflow.start(first, hostname=ran)  # /run from the pod: the row names it as the host
    world.airflow.finish(first, "up_for_retry")  # the task fails; the worker finalizes (logs, callbacks)
    world.queue(sched)  # the next try is queued at once: a new id and token
    second = world.row("t1")
    assert second.try_number == first.try_number + 1 and second.id != first.id
    sched.executor.sync()
    assert _alive(world, first, ran)  # the task's row still names it: left to finish, stock or fenced
    (next_pod,) = [p.metadata.name for p in world.live_pods(second) if p.metadata.name != ran]
    world.set_pod_phase(next_pod, "Running")
    world.airflow.start(second, hostname=next_pod)  # the next try runs: the row names its pod now
    sched.executor.sync()
    if kind == "stock":
        assert _alive(world, first, ran), "stock executor no longer leaves the previous try's pod"
    else:
        assert not _alive(world, first, ran)
        assert _alive(world, second, next_pod)


@pytest.mark.parametrize("kind", KINDS)
def test_a_live_peer_whose_api_calls_fail_leaves_no_superseded_pod_alive(world, kind, quick_witness):
    """Item 3. Scheduler A's API calls fail fast (503: an overloaded API server or webhook, broken
    RBAC) while it keeps heartbeating. Its task is cleared and re-queued by peer B: 0.1.0 left A's
    Pending pods to A, whose deletes fail; every live scheduler now deletes them."""
    _write_faults(world)
    # Airflow's defaults: a scheduler is alive for 30 s after its last heartbeat (the harness's 1 s
    # would take the creator for dead between two of the steps below; Job.heartbeat sleeps to keep
    # its 5 s rate).
    world.monkeypatch.setenv("AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD", "30")
    creator, peer = world.scheduler(kind), world.scheduler(kind)
    world.queue(creator)
    creator.executor.sync()
    first = world.row("t1")
    stale = _launch_pod(world, first)
    for method in ("POST", "DELETE", "PATCH"):  # its writes fail; it still lists and heartbeats
        world.backend.add_fault(method=method, path=r"/pods", status=503, who=creator.user)
    world.airflow.clear(first)
    world.queue(peer)
    creator.executor.sync()  # its own loop: every call fails, nothing is deleted
    creator.heartbeat()  # alive, as far as the database can tell
    world.witnessed(peer)  # the peer has seen the creator write here, as it has once running
    peer.executor.sync()  # one loop of the peer
    world.backend.clear_faults()
    if kind == "stock":
        assert _alive(world, first, stale), "stock executor no longer leaves the superseded Pending pod"
    else:
        assert not _alive(world, first, stale)
        assert {d["name"] for d in world.deletes_by(peer, succeeded=True)} == {stale}
        # The creator frees the slot of its superseded launch, though no event of the deleted
        # Pending pod ever reaches it (the lab's api_cut_off leaked 11 slots before this).
        world.settle(creator.executor, 1.5)
        assert first.key not in creator.executor.running


@pytest.mark.parametrize("annotation,value,fenced", [
    # beyond a 32-bit integer: its launcher is a job this database never had (the witness's
    # ELSEWHERE since issue 52: never deleted, whatever its token says)
    ("fenced-k8s-executor.io/scheduler-job-id", "99999999999", False),
    ("map_index", "4294967296", False),
    ("fenced-k8s-executor.io/ti-id", "not-a-uuid", False),
], ids=["scheduler-job-id", "map-index", "ti-id"])
@pytest.mark.parametrize("kind", KINDS)
def test_one_malformed_pod_costs_that_pod_alone(world, kind, annotation, value, fenced):
    """Item 5. A pod of this deployment with an annotation the loop's one statement cannot take (a
    number beyond its integer columns, a TI id that is no UUID) made that statement fail for every
    scheduler, every loop: the pre-creation check carried every job forward and no pod was created
    anywhere. Now a pod whose task cannot be named is skipped (one warning, one metric) and never
    fenced; the creator's id is no part of the evidence, so a bad one changes nothing."""
    sched = world.scheduler(kind)
    dead = world.scheduler("fenced", start=False)
    world.queue(dead, trigger=False)
    row = world.row("t1")
    bad = world.stale_pod(row, row.token, sched=dead)
    world.kube.patch_namespaced_pod(bad, world.namespace, {"metadata": {"annotations": {annotation: value}}})
    world.airflow.clear(row)  # the task moves on: a new launch is queued by the live scheduler
    world.queue(sched)
    world.settle(sched.executor, 1.0)
    current = world.row("t1")
    assert [p for p in world.live_pods(current)
            if (p.metadata.annotations or {}).get(TOKEN_ANNOTATION) == current.token], "no pod was created"
    if kind == "fenced" and fenced:
        assert not _alive(world, row, bad)  # superseded, ours: whoever created it
    else:
        assert _alive(world, row, bad)  # never fenced: its task cannot be named


# --- the hand-over edges the issue asked to look into ---------------------------------------------


def test_a_queued_task_adopted_while_pods_could_not_be_listed_is_launched_once_they_can(world, needs_emulator):
    """A dead scheduler queued t1 (a token) and never made its pod. The adopter's list of the dead
    scheduler's pods fails, so it adopts in the DB and relabels on later loops (``_adopt_later``).
    Before: once the list worked and found no pod, the task was left to stuck-in-queued (10 minutes
    by default, and one of its two re-queues); now it is launched under its token, as adoption does
    when the list works at once."""
    dead = world.scheduler("fenced", start=False)
    world.queue(dead, trigger=False)
    row = world.row("t1")
    adopter = world.scheduler("fenced")
    world.kill(dead)
    fault = world.backend.add_fault(method="GET", path=r"/pods$", status=503, who=adopter.user)  # lists fail
    adopter.adopt_or_reset_orphans()
    world.backend.clear_faults(fault)
    adopted = world.row("t1")
    assert (adopted.id, adopted.token, adopted.try_number) == (row.id, row.token, row.try_number)
    assert adopted.queued_by_job_id == adopter.job_id  # adopted, not reset
    for _ in range(3):
        adopter.trigger()
        adopter.executor.sync()
    assert [p.metadata.name for p in world.live_pods(row)
            if (p.metadata.annotations or {}).get(TOKEN_ANNOTATION) == row.token], "the adopted task got no pod"
    assert world.row("t1").try_number == row.try_number


def test_a_terminating_pod_under_the_launch_name_is_never_taken_for_the_launch_pod(world, needs_emulator):
    """The create of a launch times out after the server stored the pod (a3); before the retry, the
    stored pod is deleted but held by a finalizer (terminating). Before: the retry's 409 was taken
    for "already created", the pod went away and the task waited for task_queued_timeout. Now the
    retry waits for the name to be free and creates the launch's pod."""
    sched = world.scheduler("fenced")
    world.queue(sched)
    world.emulator.add_fault(method="POST", path=r"/pods$", persist_then_timeout=True, hang_seconds=8, times=1)
    sched.executor.sync()  # the create times out; the server stored the pod; the job is re-queued
    row = world.row("t1")
    (stored,) = [p.metadata.name for p in world.live_pods(row)]
    world.kube.patch_namespaced_pod(stored, world.namespace, {"metadata": {"finalizers": ["test.example/hold"]}})
    world.kube.delete_namespaced_pod(stored, world.namespace)  # terminating, held by its finalizer
    sched.executor.sync()  # the retry meets 409 AlreadyExists on the launch's name
    world.kube.patch_namespaced_pod(stored, world.namespace, {"metadata": {"finalizers": None}})  # gone
    world.settle(sched.executor, 2.0)
    assert [p.metadata.name for p in world.live_pods(row)] == [stored], "no live pod for the launch"
