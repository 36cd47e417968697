"""Issue 45: an identity that survives what operators do to databases.

Two deployments whose databases are copies of one another (a restored snapshot, an Aurora or
Cloud SQL clone, a ``pg_basebackup``) share the stored deployment id: no stored fact tells them
apart. A staging deployment made from production's snapshot, in production's namespace, judged
production's pods against its frozen copy of the rows: every launch made since the copy looked
superseded, and it deleted production's pods within one loop. Now every delete also asks whether
this database launched the pod (``launchers.py``): the copy never saw the heartbeats the
original's later pods name, and the original never had the copy's scheduler jobs. Both raise a
collision (a metric, an error line) and delete nothing the other launched.

And an id that changes (an operator sets ``deployment_id``; builds 0.2.x derived it from the system
identifier, which ``pg_upgrade`` changes) never costs a running task: adoption sees the pods this
database launched whatever their stamp.
"""

from __future__ import annotations

import time

import pytest

from fenced_k8s_executor.names import DEPLOYMENT_LABEL, TOKEN_ANNOTATION

KINDS = ["stock", "fenced"]
TASKS = ("t1", "t2", "t3")


@pytest.fixture
def snapshot(pg_server, metadata_db):
    """A physical copy of the metadata DB's server, taken now (``pgops.cloned``); the URL of this
    world's database on it."""
    from fenced_k8s_lab import pgops

    clone = pgops.cloned(pg_server)
    yield clone.url(metadata_db.url.database)
    clone.stop()


def _names(pods) -> set[str]:
    return {p.metadata.name for p in pods}


@pytest.mark.tasks(*TASKS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_clone_in_the_same_namespace_never_deletes_the_originals_pods(world, snapshot, kind):
    origin = world.scheduler(kind)
    # Time passes after the snapshot: the original keeps heartbeating, then launches its tasks.
    time.sleep(1.1)
    origin.heartbeat()
    world.queue(origin)
    world.sync_until(origin.executor, lambda: all(world.live_pods(world.row(t)) for t in TASKS), timeout=15)
    ours = _names(world.live_pods())
    assert len(ours) == len(TASKS)
    # The copy's own scheduler starts in the same namespace: its copy of the run is still unqueued,
    # so it queues and launches the same tasks under tokens of its own, and loops.
    clone = world.scheduler_process(kind, hostname="staging-scheduler",
                                    env={"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": snapshot})
    try:
        deadline = time.monotonic() + 6.0
        while time.monotonic() < deadline:  # both loop: each re-checks every pod of "its" deployment
            origin.executor.sync()
            time.sleep(0.2)
    finally:
        clone.kill()
    assert not [d for d in world.deletes_by(clone.user) if d.get("name") in ours], \
        f"{kind}: the clone deleted the original's pods"
    assert ours <= _names(world.live_pods())
    assert not [d for d in world.deletes_by(origin) if d.get("name") not in ours], "the original deleted the clone's"
    theirs = _names(world.live_pods()) - ours
    assert len(theirs) == len(TASKS), "the clone launched nothing: the scenario did not happen"
    if kind == "fenced":
        labels = {p.metadata.labels.get(DEPLOYMENT_LABEL) for p in world.live_pods()}
        assert len(labels) == 1  # one id: only the launchers tell the two databases apart
        assert origin.executor.launchers.collision
        from fenced_k8s_executor import cli, config, deployment

        rows = cli.survey(world.kube, [world.namespace], deployment.resolve(config.FencedConfig(), create=False))
        standing = {r["pod"]: (r["standing"], r["enforce would"]) for r in rows}
        assert {standing[name] for name in theirs} == {("launched by another database", "keep")}
        assert {standing[name] for name in ours} == {("current", "keep")}
        log = (world.tmp_path / f"{clone.user}.log").read_text() + (world.tmp_path / f"{clone.user}.out").read_text()
        assert "deployment id collision" in log


@pytest.mark.tasks("t1")
@pytest.mark.parametrize("kind", KINDS)
def test_a_running_task_survives_a_scheduler_restart_under_a_new_id(world, kind):
    """The review's reproduction: both schedulers stop, the id changes (here an operator sets
    ``deployment_id``; before, a ``pg_upgrade`` changed the derived one), a new scheduler starts and
    adopts. Stock adopts the running pod and the task finishes; 0.2 hid it (another deployment's
    stamp), reset the task and ran it again."""
    first = world.scheduler(kind)
    world.queue(first)
    world.sync_until(first.executor, lambda: bool(world.live_pods(world.row("t1"))), timeout=15)
    row = world.row("t1")
    pod = world.pod_of(row)
    world.set_pod_phase(pod, "Running")
    world.airflow.start(row, hostname=pod)
    first.stop()
    second = world.scheduler(kind, deployment_id="renamed-after-upgrade")
    reset = second.adopt_or_reset_orphans()
    after = world.row("t1")
    assert reset == 0, f"{kind}: the running task was reset"
    assert (after.id, after.state, after.try_number) == (row.id, "running", row.try_number)
    assert after.queued_by_job_id == second.job_id
    (adopted,) = world.live_pods(after)
    assert adopted.metadata.name == pod and adopted.metadata.labels["airflow-worker"] == str(second.job_id)
    world.settle(second.executor, 1.5)
    assert world.live_pods(after), f"{kind} deleted the running task's pod"
    if kind == "fenced":
        assert adopted.metadata.annotations[TOKEN_ANNOTATION] == row.token


@pytest.mark.tasks("t1", retries=2)
@pytest.mark.parametrize("kind", KINDS)
def test_the_pod_the_task_last_ran_on_is_left_to_finish_when_the_row_names_its_ip(world, kind):
    """``[core] hostname_callable = airflow.utils.net.get_host_ip_address``: the row names the pod by
    its IP. A try that reported up_for_retry is still finishing (log upload, callbacks) while the
    next try is queued: left to finish as stock leaves it. Before, only the pod's name counted, and
    the finishing try was deleted as soon as its successor was queued."""
    sched = world.scheduler(kind)
    world.queue(sched)
    sched.executor.sync()
    first = world.row("t1")
    ran = world.pod_of(first)
    world.set_pod_phase(ran, "Running")
    world.kube.patch_namespaced_pod_status(ran, world.namespace,
                                           {"status": {"podIP": "10.244.0.17", "podIPs": [{"ip": "10.244.0.17"}]}})
    world.airflow.start(first, hostname="10.244.0.17")
    world.airflow.finish(first, "up_for_retry")
    world.queue(sched)  # the next try: a new id and token
    second = world.row("t1")
    assert second.id != first.id
    world.settle(sched.executor, 1.0)
    assert ran in _names(world.live_pods(first)), f"{kind} deleted the try that is still finishing"
    (next_pod,) = _names(world.live_pods(second)) - {ran}
    world.set_pod_phase(next_pod, "Running")
    world.airflow.start(second, hostname="10.244.0.18")  # the next try runs: the row names its IP now
    world.settle(sched.executor, 1.0)
    if kind == "stock":
        assert ran in _names(world.live_pods(first)), "stock executor no longer leaves the previous try's pod"
    else:
        assert ran not in _names(world.live_pods(first))
