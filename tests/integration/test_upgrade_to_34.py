"""Upgrade to Airflow 3.4: the pods 3.3 schedulers launched, after the schedulers restart on 3.4.

airflow-core's 3.4 migration keeps every task instance's id and external_executor_id (the live
rows get working_set TRUE, the sentinel region and region_index = map_index; task_instance_history
becomes archived rows), so the in-flight TIs of the old schedulers are what a 3.4 scheduler reads
here: rows made by airflow-core itself, queued by a scheduler that is gone. Their pods are built as
the 3.3 schedulers built them: without the ``task_instance_id`` annotation 3.4's provider finds a
pod's attempt by. A stock pod's attempt can still be parsed from its worker arguments; a pod of the
fenced entrypoint (``python -c`` bootstrap) names its attempt only in our own annotation.

What each kind of in-flight pod meets (docs/versions.md, "Upgrading to 3.4"):

| 3.3 pod | stock 3.4 | fenced 3.4 |
|---|---|---|
| fenced, Running (TI running) | not adopted: the TI is reset (a try burned) and the pod runs on unwatched | adopted: same attempt, try and token; its end reaches the scheduler |
| fenced, Pending (TI queued) | not adopted: reset (a try burned) | adopted, then watched |
| none yet (TI queued) | reset (a try burned) | launched by the adopter under the same token |
| stock, Running (legacy row) | adopted (its arguments name the attempt) | adopted, as stock |
"""

from __future__ import annotations

import uuid

import pytest

from fenced_k8s_executor import provider_compat, worker
from fenced_k8s_executor.names import TOKEN_ANNOTATION

KINDS = ["stock", "fenced"]

pytestmark = pytest.mark.skipif(provider_compat.task_columns().live is None,
                                reason="Airflow 3.4 only: the upgrade's target")


def _workload(row):
    """The workload the 3.3 scheduler sent for ``row`` (airflow-core's own constructor)."""
    from sqlalchemy import select

    from airflow.executors.workloads import ExecuteTask
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = session.scalar(select(TI).where(TI.id == uuid.UUID(row.id)))
        return ExecuteTask.make(ti)


def _pod_of_33(world, row, sched, *, fenced: bool, phase: str) -> str:
    """The pod a 3.3 scheduler made for ``row``: the provider's labels and annotations (no
    task_instance_id: 3.3's provider sets it only for UUID keys), the worker program, and for the
    fenced executor of that time its launch identity and its ``python -c`` bootstrap."""
    from airflow.providers.cncf.kubernetes.pod_generator import workload_to_command_args

    from fenced_k8s_executor.launch import LaunchIdentity
    from fenced_k8s_lab.core import our_deployment

    workload = _workload(row)
    args = worker.command_args(workload) if fenced else workload_to_command_args(workload)
    name = f"{row.task_id}-{uuid.uuid4().hex[:8]}"
    labels = {"kubernetes_executor": "True", "airflow-worker": str(sched.job_id), "dag_id": row.dag_id,
              "task_id": row.task_id, "try_number": str(row.try_number), "run_id": row.run_id}
    annotations = {"dag_id": row.dag_id, "task_id": row.task_id, "try_number": str(row.try_number),
                   "run_id": row.run_id}
    if fenced:
        launch = LaunchIdentity(ti_id=row.id, token=row.token, try_number=row.try_number,
                                scheduler_job_id=str(sched.job_id), dag_id=row.dag_id, task_id=row.task_id,
                                run_id=row.run_id, map_index=row.map_index, deployment=our_deployment())
        labels.update(launch.labels())
        annotations.update(launch.annotations())
    body = {"metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "base", "image": "x", "args": args}]}}
    world.kube.create_namespaced_pod(world.namespace, body)
    if phase != "Pending":
        world.set_pod_phase(name, phase)
    return name


def _attempts(world, task_id: str) -> list[str]:
    with world.engine.connect() as conn:
        return [r[0] for r in conn.exec_driver_sql(
            "SELECT id::text FROM task_instance WHERE dag_id = %s AND task_id = %s AND run_id = %s",
            (world.dag_id, task_id, world.run_id)).fetchall()]


@pytest.mark.tasks("running", "pending", "unlaunched")
@pytest.mark.parametrize("kind", KINDS)
def test_a_fenced_33_deployments_pods_lose_no_try_after_the_restart_on_34(world, kind):
    old = world.scheduler("fenced", start=False)  # the 3.3 scheduler: queued (tokens), then gone
    world.queue(old, trigger=False)
    rows = {t: world.row(t) for t in ("running", "pending", "unlaunched")}
    running = _pod_of_33(world, rows["running"], old, fenced=True, phase="Running")
    world.airflow.start(rows["running"])  # its worker started the task before the upgrade
    pending = _pod_of_33(world, rows["pending"], old, fenced=True, phase="Pending")
    before = {t: world.row(t) for t in rows}
    world.kill(old)
    new = world.scheduler(kind)  # the scheduler restarted on 3.4
    reset = new.adopt_or_reset_orphans()
    after = {t: world.row(t) for t in rows}
    if kind == "stock":
        assert reset == 3, "stock 3.4 no longer resets what a fenced 3.3 scheduler launched"
        assert all(after[t].id != before[t].id for t in rows)  # every attempt archived: a try each
        owner = {p.metadata.name: p.metadata.labels["airflow-worker"] for p in world.live_pods()}
        assert owner[running] == str(old.job_id)  # the running pod runs on, watched by nobody
        return
    assert reset == 0
    for t in rows:
        assert (after[t].id, after[t].try_number, after[t].token) == (before[t].id, before[t].try_number,
                                                                     before[t].token)
        assert _attempts(world, t) == [before[t].id]  # nothing archived
    pods = {p.metadata.name: p for p in world.live_pods()}
    for name in (running, pending):
        assert pods[name].metadata.labels["airflow-worker"] == str(new.job_id)
        assert pods[name].metadata.annotations[provider_compat.TASK_INSTANCE_ID_ANNOTATION]  # written on adoption
    assert {rows["running"].key, rows["pending"].key} <= new.executor.running
    new.trigger()  # the unlaunched task: launched here under its token
    world.sync_until(new.executor, lambda: world.live_pods(after["unlaunched"]), timeout=10)
    (made,) = world.live_pods(after["unlaunched"])
    assert made.metadata.annotations[TOKEN_ANNOTATION] == before["unlaunched"].token
    # the running task ends: its pod's end reaches the scheduler, nothing is stuck
    world.airflow.finish(after["running"], "success")
    world.set_pod_phase(running, "Succeeded")
    assert world.sync_until(new.executor, lambda: rows["running"].key not in new.executor.running, timeout=10)
    new.process_events()
    assert world.row("running").state == "success"


@pytest.mark.parametrize("kind", KINDS)
def test_a_stock_33_deployments_running_pod_is_adopted_after_the_restart_on_34(world, kind):
    """A stock 3.3 scheduler's pod: no token (the row holds the job id: legacy, never fenced) and
    no task_instance_id, but the stock worker's arguments name the attempt."""
    old = world.scheduler("stock")
    world.queue(old)
    old.process_events()  # the stock QUEUED event writes the job id into external_executor_id
    row = world.row("t1")
    assert row.token == str(old.job_id)
    pod = _pod_of_33(world, row, old, fenced=False, phase="Running")
    world.airflow.start(row)
    world.kill(old)
    new = world.scheduler(kind)
    assert new.adopt_or_reset_orphans() == 0
    after = world.row("t1")
    assert (after.id, after.try_number) == (row.id, row.try_number)
    owner = {p.metadata.name: p.metadata.labels["airflow-worker"] for p in world.live_pods(row)}
    assert owner[pod] == str(new.job_id)
