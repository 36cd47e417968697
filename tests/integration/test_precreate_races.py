"""Creation-side races (a1, a3) and the token overwrite (b5), stock vs fenced on the same steps.

Each test is parametrized over both executors and asserts that the stock executor shows the
failure: if it ever stops showing it, the scenario no longer reproduces the race and the test fails.
"""

from __future__ import annotations

import pytest

from fenced_k8s_executor.lab import seed

KINDS = ["stock", "fenced"]
JOB = 11


@pytest.mark.parametrize("kind", KINDS)
def test_a1_same_id_and_try_queued_twice_creates_one_pod(world, make_executor, kind):
    """J1 waits in the task queue; stuck-in-queued revokes (no pod yet) and re-queues the TI with
    the same id and try (J2). Both jobs pass the stock check; only J2 is the current launch."""
    executor = make_executor(kind, JOB)
    (ti,) = world.tis("a1", job_id=JOB)
    world.queue(executor, ti)  # J1 sits in task_queue: no sync yet (backlog / publish retry)
    executor.revoke_task(ti=world.ref(ti, JOB))  # finds no pod
    ti2 = seed.requeue_same_id(world.engine, ti, JOB)
    world.queue(executor, ti2)  # J2
    executor.sync()
    world.settle(executor, 1.0)
    pods = world.pods(ti)
    if kind == "stock":
        assert len(pods) == 2, "stock executor no longer shows race a1"
    else:
        assert len(pods) == 1
        assert pods[0].metadata.annotations["fenced-k8s-executor.io/launch-token"] == ti2.token
        assert executor.running == {world.ref(ti, JOB).key}


@pytest.mark.parametrize("kind", KINDS)
def test_a3_ambiguous_create_is_recognised_on_retry(world, make_executor, kind):
    """The API server stores the pod but the client times out; the job is re-queued and retried."""
    executor = make_executor(kind, JOB)
    (ti,) = world.tis("a3", job_id=JOB)
    world.emulator.add_fault(method="POST", path=r"/pods$", persist_then_timeout=True, hang_seconds=8, times=1)
    world.queue(executor, ti)
    executor.sync()  # times out after the server stored the pod; the provider re-queues the job
    world.sync_until(executor, lambda: executor.task_queue.qsize() == 0 and not executor._carry
                     if kind == "fenced" else executor.task_queue.qsize() == 0, timeout=15)
    world.settle(executor, 1.0)
    pods = world.pods(ti)
    if kind == "stock":
        assert len(pods) == 2, "stock executor no longer shows race a3"
    else:
        assert len(pods) == 1
        assert world.ref(ti, JOB).key in executor.running
        assert not any(state == "failed" for state, _ in executor.event_buffer.values())


@pytest.mark.parametrize("kind", KINDS)
def test_b5_queued_event_never_overwrites_the_token(world, make_executor, kind):
    """The scheduler writes QUEUED/RUNNING event info into external_executor_id."""
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.utils.session import create_session

    executor = make_executor(kind, JOB)
    (ti,) = world.tis("b5", job_id=JOB)
    world.queue(executor, ti)
    with create_session() as session:
        SchedulerJobRunner.process_executor_events(executor=executor, job_id=JOB, scheduler_dag_bag=None,
                                                   session=session)
    token_after = seed.row(world.engine, ti.id)["external_executor_id"]
    if kind == "stock":
        assert token_after == str(JOB), "stock executor no longer overwrites the token"
    else:
        assert token_after == ti.token
