"""Issue 12: a Pending pod of a superseded launch is deleted within one scheduler loop, with the
sweep off (shipped sweep or not, a Pending pod emits no events: only the per-loop reconcile of
the launches this scheduler has in flight sees it).

Every supersession goes through airflow-core: a clear through the public REST API
(``POST /api/v2/dags/{dag_id}/clearTaskInstances`` on the real FastAPI app) followed by the
scheduler's own re-queue, the peer scheduler re-queueing a stuck task, and the stuck-in-queued
revoke. Each test asserts the stock executor leaves the stale pod behind.
"""

from __future__ import annotations

import os

import pytest

from fenced_k8s_executor.names import TOKEN_ANNOTATION

KINDS = ["stock", "fenced"]


def _stale_left(world, row) -> list[str]:
    return [p.metadata.name for p in world.live_pods(row)
            if (p.metadata.annotations or {}).get(TOKEN_ANNOTATION, row.token) == row.token]


@pytest.fixture(scope="module")
def rest_api():
    """The api-server's public REST API in process (all users admins, as in the lab)."""
    from fastapi.testclient import TestClient

    from airflow.configuration import conf

    previous = os.environ.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS")
    os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] = "True"
    conf.set("core", "simple_auth_manager_all_admins", "True")
    from airflow.api_fastapi.app import create_app

    with TestClient(create_app(apps="core")) as client:
        yield client
    if previous is None:
        os.environ.pop("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", None)
    else:
        os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] = previous
    conf.set("core", "simple_auth_manager_all_admins", previous or "False")


@pytest.mark.parametrize("kind", KINDS)
def test_pending_pod_superseded_by_a_rest_clear_dies_within_one_loop(world, rest_api, kind):
    sched = world.scheduler(kind)
    world.queue(sched)
    sched.executor.sync()  # loop 1: the pod is created and stays Pending
    first = world.row("t1")
    (stale,) = [p.metadata.name for p in world.live_pods(first)]
    resp = rest_api.post(f"/api/v2/dags/{world.dag_id}/clearTaskInstances",
                         json={"dry_run": False, "task_ids": ["t1"], "dag_run_id": world.run_id,
                               "only_failed": False, "reset_dag_runs": False})
    assert resp.status_code == 200, resp.text
    cleared = world.row("t1")
    assert cleared.id != first.id  # airflow-core gave the task a new row id
    world.queue(sched)  # the scheduler re-queues the cleared task: a new launch, a new token
    sched.executor.sync()  # loop 2: one loop after the launch was superseded
    names = {p.metadata.name for p in world.live_pods(first)}
    if kind == "stock":
        assert stale in names, "stock executor no longer leaves the cleared launch's Pending pod"
    else:
        assert stale not in names
        assert world.pod_of(world.row("t1")) in names  # the new launch's pod is there


@pytest.mark.parametrize("kind", KINDS)
def test_pending_pod_superseded_by_the_peer_scheduler_dies_within_one_loop(world, needs_write_faults, kind):
    """The owner's stuck-in-queued revoke loses its delete of the Pending pod (the API answers
    404 but the pod stays: a lost or raced delete), sends the task back to SCHEDULED, and the
    PEER scheduler's critical section queues it again."""
    sched = world.scheduler(kind)
    peer = world.scheduler(kind)
    world.queue(sched)
    sched.executor.sync()
    first = world.row("t1")
    (stale,) = [p.metadata.name for p in world.live_pods(first)]
    world.backend.add_fault(method="DELETE", path=r"/pods/", status=404, times=10)
    sched.stuck_in_queued()  # revoke: the delete is lost; the task goes back to SCHEDULED
    assert world.backend.faults()[0]["fired"] >= 1, "the revoke's delete was not lost"
    world.backend.clear_faults()
    peer.enqueue()  # the peer wins the re-queue: a new launch, a new token
    peer.trigger()
    assert world.row("t1").queued_by_job_id == peer.job_id
    sched.executor.sync()  # one loop of the scheduler that created the Pending pod
    names = {p.metadata.name for p in world.live_pods(first)}
    if kind == "stock":
        assert stale in names, "stock executor no longer leaves the Pending pod the peer superseded"
    else:
        assert stale not in names
        assert {d["name"] for d in world.deletes_by(sched, succeeded=True)} == {stale}
    assert first.key not in sched.executor.running  # the revoke freed the slot either way


@pytest.mark.parametrize("kind", KINDS)
def test_pending_pod_of_a_revoked_launch_never_outlives_one_loop(world, needs_write_faults, kind):
    """The stuck-in-queued revoke and the re-queue land while the launch's create request is in
    flight (check-then-create gap): the revoke finds no pod, the create lands after it."""

    sched = world.scheduler(kind)
    world.queue(sched)
    first = world.row("t1")
    world.backend.add_fault(method="POST", path=r"/pods$", delay=1.5, times=1)

    def revoke_and_requeue():
        sched.stuck_in_queued()
        sched.enqueue()

    moving = world.while_held(revoke_and_requeue)
    sched.executor.sync()  # pre-check passes; the create lands after the revoke
    moving.join()
    assert [f["fired"] for f in world.backend.faults()] == [1], "the create was not held in flight"
    stale = [p.metadata.name for p in world.live_pods(first)
             if (p.metadata.annotations or {}).get(TOKEN_ANNOTATION, first.token) == first.token]
    if kind == "stock":
        assert stale, "stock executor no longer leaves the revoked launch's pod"
        return
    sched.executor.sync()  # one loop
    stale = [p.metadata.name for p in world.live_pods(first)
             if (p.metadata.annotations or {}).get(TOKEN_ANNOTATION) == first.token]
    assert stale == []
