"""Sequences that break the fenced executor's promises, each replayed as an ordinary test: what
the interleaving checker (``test_interleavings.py``) found on its own, minimised, and issue 35's
sequences as the checker's replay (``interleavings.script``) confirmed them.

Each one broke a promise of ``docs/design.md`` on the code before issue 35's fixes (each failed
there; ``interleavings.harness.GAPS`` names them). A finding that cannot be fixed at once is
marked ``xfail(strict=True)`` here and entered in ``harness.KNOWN_GAPS`` (which the checker's
default run records instead of raising). Every state change is airflow-core's own (the lab
driver); faults are the emulator's.
"""

from __future__ import annotations

import time

import pytest

from fenced_k8s_executor.names import TOKEN_ANNOTATION

from interleavings.machine import heartbeat

pytestmark = pytest.mark.integration


@pytest.fixture
def quick_heartbeats(monkeypatch):
    """Heartbeats due every 0.3 s: with the harness's 1 s health-check threshold, a peer's
    launches are handed over after 1 s without a heartbeat."""
    monkeypatch.setenv("AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC", "0.3")


def _pending(world, row) -> str:
    """The one Pending pod of ``row``'s launch."""
    (name,) = [p.metadata.name for p in world.live_pods(row)
               if (p.metadata.annotations or {}).get(TOKEN_ANNOTATION) == row.token]
    return name


def _alive(world, name: str) -> bool:
    return name in {p.metadata.name for p in world.live_pods()}


def test_pending_pod_forgotten_after_a_stuck_in_queued_reschedule(world, needs_emulator):
    """Issue 35's sequence, replayed through the checker (``interleavings.script``) before it was
    written here: A loops (pod P Pending); A's deletes answer 404; stuck in queued (the revoke's
    delete is lost, the task goes back to SCHEDULED with the same id, try and token); the API
    heals; A syncs once while SCHEDULED (P is dropped from the in-flight picture); A loops twice
    (re-queued under a new token). The checker's own runs found the 404 variant below."""
    a = world.scheduler("fenced")
    world.queue(a)
    a.executor.sync()
    first = world.row("t1")
    stale = _pending(world, first)
    fault = world.backend.add_fault(method="DELETE", path=r"/pods/", status=404, who=a.user)
    a.stuck_in_queued()
    world.backend.clear_faults(fault)
    assert world.row("t1").state == "scheduled" and _alive(world, stale)
    a.executor.sync()  # one loop while the task is SCHEDULED
    for _ in range(2):
        world.queue(a)
        a.executor.sync()
    assert world.row("t1").token != first.token
    assert not _alive(world, stale), "a superseded Pending pod outlived two loops of its own creator"


def test_pending_pod_forgotten_after_its_delete_answered_404(world, needs_emulator):
    """Checker sequence (long run, example 35, hand-minimised): A loops (pod P Pending); a user
    clears the task; A's deletes answer 404 (a lost or raced delete: the pod stays); A loops (the
    task is queued again, P is superseded, its delete answers 404); the API heals; A loops twice."""
    a = world.scheduler("fenced")
    stale = _superseded_while_deletes_fail(world, a, 404)
    assert not _alive(world, stale), "a superseded Pending pod outlived two loops of its creator after one lost delete"


def _superseded_while_deletes_fail(world, a, status: int) -> str:
    """A loops (pod P Pending); a user clears the task; A's deletes answer ``status``; A loops (the
    task is queued again, P is superseded, its delete fails); the API heals; A loops twice. P."""
    world.queue(a)
    a.executor.sync()
    first = world.row("t1")
    (stale,) = [p.metadata.name for p in world.live_pods(first)]
    world.airflow.clear(first)
    fault = world.backend.add_fault(method="DELETE", path=r"/pods/", status=status, who=a.user)
    world.queue(a)
    a.executor.sync()
    world.backend.clear_faults(fault)
    assert _alive(world, stale)
    for _ in range(2):
        world.queue(a)
        a.executor.sync()
    return stale


@pytest.mark.parametrize("kind", ["stock", "fenced"])
def test_a_delete_that_met_an_api_error_is_sent_again_next_loop(world, needs_write_faults, kind):
    """Found by mutation testing (mutant ``failed_delete_settles``, tests/mutation: 9c4ada6 taken
    back): no test made the reconcile's own delete fail with no peer to take over, so a delete that
    met an API error could be taken as done and the pod never offered again. A loops (pod P
    Pending); a user clears the task; A's deletes answer 500; A loops (the task is queued again, P
    is superseded, its delete fails); the API heals; A loops twice, alone (no peer takes over)."""
    stale = _superseded_while_deletes_fail(world, world.scheduler(kind), 500)
    if kind == "stock":
        assert _alive(world, stale), "stock no longer leaves the superseded Pending pod"
        return
    assert not _alive(world, stale), "a superseded Pending pod outlived two loops after one failed delete"


@pytest.mark.parametrize("kind", ["stock", "fenced"])
def test_a_superseded_launch_never_gets_a_pod(world, kind):
    """Found by mutation testing (mutants ``precreate_ignores_the_token`` and
    ``creation_acts_on_the_stock_verdict``): race a1's test counts the pods left, and the in-flight
    reconcile deletes a superseded launch's pod on the next loop, so a pre-creation check that let
    it through went unseen. A pod made for a superseded launch costs a scheduled, pulled, started
    container (issue 12's target: none). J1 waits in the task queue; stuck in queued re-queues the
    task under a new token (J2, same id and try); one loop: the API must have been asked to create
    one pod, J2's."""
    sched = world.scheduler(kind)
    world.queue(sched)
    world.requeue_stuck(sched)
    second = world.row("t1")
    sched.executor.sync()
    world.settle(sched.executor, 1.0)
    creates = [e for e in world.audit() if e.get("verb") == "create" and e.get("resource", "pods") == "pods"
               and e.get("who") == sched.user and e.get("code") in (200, 201)]
    if kind == "stock":
        assert len(creates) == 2, "stock executor no longer shows race a1"
        return
    assert len(creates) == 1, f"pods created for launches of one task: {[e.get('name') for e in creates]}"
    assert [p.metadata.annotations[TOKEN_ANNOTATION] for p in world.pods(second)] == [second.token]


def test_superseded_pending_pod_of_a_live_peer_whose_api_calls_fail(world, needs_emulator, quick_heartbeats):
    """Checker finding (seed 7, gap ``live_creator_skipped``), hand-minimised: A loops (pod P
    Pending); the API answers A with 503; a user clears the task; B queues it again and loops
    while A goes on heartbeating, past the hand-over grace."""
    a, b = world.scheduler("fenced"), world.scheduler("fenced")
    world.queue(a)
    a.executor.sync()
    first = world.row("t1")
    stale = _pending(world, first)
    world.backend.add_fault(method="*", path=r"/pods", status=503, who=a.user)
    world.airflow.clear(first)
    world.queue(b)
    deadline = time.monotonic() + 3.0  # three times the 1 s grace, A's heartbeat never older than 0.3 s
    while time.monotonic() < deadline and _alive(world, stale):
        heartbeat(a)
        a.executor.sync()  # A loops too: its deletes fail
        heartbeat(b)
        b.executor.sync()
        time.sleep(0.2)
    assert world.row("t1").queued_by_job_id == b.job_id
    assert not _alive(world, stale), "a live peer's superseded Pending pod outlived 3 s of B's loops"


def test_superseded_running_pod_is_fenced_before_run(world):
    """Issue 35's sequence (the checker's ``running_never_fenced`` findings were pods it had
    already found forgotten, then started by its kubelet): A loops (pod P); the kubelet starts P;
    A stops (``end()``, Job success);
    a user clears the task; B queues it again and loops twice. P is Running for a launch the row
    no longer names and is not the pod the row names as running (no /run yet): issue 35 wants it
    deleted within one loop. Its creator would have deleted it (it re-checks its own launches
    until they report), but the peers watch Pending pods only."""
    a, b = world.scheduler("fenced"), world.scheduler("fenced")
    world.queue(a)
    a.executor.sync()
    first = world.row("t1")
    stale = _pending(world, first)
    world.set_pod_phase(stale, "Running")
    world.settle(a.executor, 1.0)  # the watcher has seen it start
    a.stop()
    world.airflow.clear(first)
    world.queue(b)
    world.settle(b.executor, 2.0)  # B's loops, and a second for the watch to deliver
    assert world.row("t1").token != first.token
    assert not _alive(world, stale), "a stopped peer's superseded Running pod outlived 2 s of loops"


def test_other_deployment_behind_the_same_address_keeps_its_pods(world):
    """Checker finding (default seed; Hypothesis shrank it to: the pod appears, then a scheduler
    whose job id is not the pod's creator loops): another deployment's Pending pod appears; its
    scheduler reaches its own metadata DB through a proxy sidecar at the very address ours has
    (other credentials); B loops. Its TI id is unknown to our DB. Builds before 0.2.0 stamped
    both deployments' pods with the one id the address gave; the id now comes from each DB's
    identity (test_deployments derives both from two real servers behind one address)."""
    import uuid

    from airflow.configuration import conf
    from sqlalchemy.engine import make_url

    from fenced_k8s_lab.core import our_deployment

    from interleavings.bystanders import their_deployment_id

    b = world.scheduler("fenced")
    theirs = make_url(conf.get("database", "sql_alchemy_conn")).set(password="theirs")
    stamp = their_deployment_id(theirs.render_as_string(hide_password=False), "7312345678901234567")
    assert stamp != our_deployment()  # builds before 0.2.0 derived one id from the address for both
    from fenced_k8s_executor.launch import LaunchIdentity

    launch = LaunchIdentity(ti_id=str(uuid.uuid4()), token=str(uuid.uuid4()), try_number=1,
                            scheduler_job_id="999999", deployment=stamp)  # their scheduler, unknown here
    task = {"dag_id": "their_dag", "task_id": "t1", "run_id": "scheduled__2026-01-01T0000000000-a1b2c3",
            "try_number": "1"}
    body = {"metadata": {"name": "their-dag-t1-pod", "annotations": {**task, **launch.annotations()},
                         "labels": {"kubernetes_executor": "True", "airflow-worker": "999999", **task,
                                    **launch.labels()}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "base", "image": "x"}]}}
    world.kube.create_namespaced_pod(world.namespace, body)
    world.settle(b.executor, 2.0)  # B's loops; its watch of this deployment's Pending pods sees the pod
    assert _alive(world, "their-dag-t1-pod"), "our scheduler deleted another deployment's pod"


def test_stuck_in_queued_revoke_never_deletes_another_deployments_pod(world):
    """Another deployment (its own metadata DB, so its job ids overlap ours) runs the same DAG code
    in the same namespace: a scheduled run has the same run id in both. Its pod for t1 carries our
    scheduler's job id in ``airflow-worker``, its own deployment stamp, a TI id unknown here, and
    was listed after ours. Our scheduler's stuck-in-queued handler revokes t1: the provider's
    revoke (called first by ours) picks one pod by coordinates and job id, and takes theirs.
    Checker steps: another deployment's Pending pod appears (its own address, our DAG and run);
    A loops; A's stuck-in-queued handler."""
    import uuid

    from fenced_k8s_executor.launch import LaunchIdentity, pod_name

    a = world.scheduler("fenced")
    world.queue(a)
    a.executor.sync()
    row = world.row("t1")
    ours = _pending(world, row)
    token = "ffffffff-ffff-4fff-bfff-" + uuid.uuid4().hex[:12]  # their pod's name sorts after ours
    launch = LaunchIdentity(ti_id=str(uuid.uuid4()), token=token, try_number=row.try_number,
                            scheduler_job_id=str(a.job_id), deployment="their-deployment")
    task = {"dag_id": row.dag_id, "task_id": "t1", "run_id": row.run_id, "try_number": str(row.try_number)}
    labels = {**task, "run_id": _run_label(row.run_id), "kubernetes_executor": "True",
              "airflow-worker": str(a.job_id), **launch.labels()}
    theirs = pod_name(row.dag_id, "t1", token, 0)
    world.kube.create_namespaced_pod(world.namespace, {
        "metadata": {"name": theirs, "labels": labels, "annotations": {**task, **launch.annotations()}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "base", "image": "x"}]}})
    a.stuck_in_queued()
    assert world.row("t1").state == "scheduled"
    assert _alive(world, theirs), "our revoke deleted another deployment's pod"


def _run_label(run_id: str) -> str:
    from airflow.providers.cncf.kubernetes.pod_generator import make_safe_label_value

    return make_safe_label_value(run_id)


def _started(world, kind: str):
    """A scheduler of ``kind`` launches t1 and its pod starts: (the scheduler, t1's row, its pod)."""
    a = world.scheduler(kind)
    world.queue(a)
    a.executor.sync()
    row = world.row("t1")
    (pod,) = [p.metadata.name for p in world.live_pods(row)]
    world.set_pod_phase(pod, "Running")
    world.settle(a.executor, 1.0)
    assert row.key in a.executor.running
    return a, row, pod


@pytest.mark.parametrize("kind", ["stock", "fenced"])
def test_slot_of_a_task_adopted_from_a_live_scheduler_is_freed_when_its_pod_finishes(world, needs_emulator, kind):
    """A first minimisation of the long run's one finding on today's code (``slot_held``,
    examples 62-63, docs/checker.md), which it does not reproduce: the fenced executor keeps the
    promise here, stock does not. A launches t1 and its pod starts; the API answers A with 503
    (its watches too) and A misses its heartbeats, yet lives on; B's orphan check fails A's job
    and adopts t1 (same token, its pod relabelled to B); the task succeeds and the pod ends; A's
    API heals. Stock's watcher lists its pods by A's label again: the pod is not among them, no
    event for it reaches A, and A's slot for t1 stays held for good."""
    a, row, pod = _started(world, kind)
    fault = world.backend.add_fault(method="*", path=r"/pods", status=503, who=a.user)
    world.settle(a.executor, 0.5)
    world.kill(a)  # no heartbeat for longer than the health-check threshold; the process lives on
    b = world.scheduler(kind)
    b.adopt_or_reset_orphans()
    adopted = world.row("t1")
    assert (adopted.queued_by_job_id, adopted.token) == (b.job_id, row.token)
    world.airflow.start(adopted, hostname=pod)
    world.airflow.finish(adopted, "success")
    world.set_pod_phase(pod, "Succeeded")
    world.settle(b.executor, 1.0)
    world.backend.clear_faults(fault)
    world.settle(a.executor, 3.0)  # A's loops once its API answers again
    assert world.row("t1").state == "success"
    if kind == "stock":
        assert row.key in a.executor.running, "stock no longer keeps the slot of a task adopted away"
        return
    assert row.key not in a.executor.running, "A still holds the slot of a task B adopted and finished"


@pytest.mark.parametrize("kind", ["stock", "fenced"])
def test_a_slot_is_freed_soon_after_an_api_outage_ends(world, needs_emulator, kind):
    """The long run's ``slot_held`` (seed 20261203, example 107, docs/checker.md), minimised: a
    scheduler's API answers 500 for 8 s (its watches broken) while its task finishes and its pod
    succeeds. The fenced pod watcher outlives the errors (stock's dies and is restarted on the next
    loop) but waited longer after each one, up to 15 s: the outage over, its next attempt came
    7.5 s later, and the slot of a finished task stayed held that long, where stock's restarted
    watcher freed it at once. The wait between attempts is now capped at 2 s."""
    a, row, pod = _started(world, kind)
    fault = world.backend.add_fault(method="*", path=r"/pods", status=500, who=a.user)
    world.backend.close_watches()  # the open watches end; every new request of A's fails
    world.airflow.start(row, hostname=pod)
    world.airflow.finish(row, "success")
    world.set_pod_phase(pod, "Succeeded")
    world.settle(a.executor, 8.0)  # the watcher's attempts fail: 0.5, 1, 2, 4 s apart, then longer
    world.backend.clear_faults(fault)
    deadline = time.monotonic() + 5.0
    while row.key in a.executor.running and time.monotonic() < deadline:
        a.executor.sync()
        a.process_events()
        time.sleep(0.2)
    assert world.row("t1").state == "success"
    assert row.key not in a.executor.running, f"{kind}: the slot of a finished task is still held 5 s after the outage"
