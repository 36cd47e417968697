"""Issue 45: an identity that survives what operators do to databases (copies of a database, which
share the id: test_copies.py).

An id that changes (an operator sets ``deployment_id``; builds 0.2.x derived it from the system
identifier, which ``pg_upgrade`` changes) never costs a running task: adoption sees the pods this
database launched whatever their stamp.
"""

from __future__ import annotations

import pytest

from fenced_k8s_executor.names import TOKEN_ANNOTATION

KINDS = ["stock", "fenced"]


def _names(pods) -> set[str]:
    return {p.metadata.name for p in pods}


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
    row, pod = world.start_in_pod("t1")
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
