"""Creation-side races (a1, a3) and the token overwrite (b5), stock vs fenced on the same steps.

Each test is parametrized over both executors and asserts that the stock executor shows the
failure: if it ever stops showing it, the scenario no longer reproduces the race and the test fails.
"""

from __future__ import annotations

import pytest

from fenced_k8s_executor.names import TOKEN_ANNOTATION
KINDS = ["stock", "fenced"]


@pytest.mark.parametrize("kind", KINDS)
def test_a1_same_id_and_try_queued_twice_creates_one_pod(world, kind):
    """J1 waits in the task queue; stuck-in-queued revokes (no pod yet) and the next loop re-queues
    the TI with the same id and try (J2). Both jobs pass the stock check; only J2 is current."""
    sched = world.scheduler(kind)
    world.queue(sched)  # J1 sits in task_queue: no sync yet (backlog / publish retry)
    first = world.row("t1")
    world.requeue_stuck(sched)  # revoke finds no pod; same id and try, a new token; J2
    second = world.row("t1")
    assert (second.id, second.try_number) == (first.id, first.try_number)
    sched.executor.sync()
    world.settle(sched.executor, 1.0)
    pods = world.pods(second)
    if kind == "stock":
        assert len(pods) == 2, "stock executor no longer shows race a1"
    else:
        assert second.token != first.token
        assert len(pods) == 1
        assert pods[0].metadata.annotations[TOKEN_ANNOTATION] == second.token
        assert sched.executor.running == {second.key}


@pytest.mark.parametrize("kind", KINDS)
def test_a3_ambiguous_create_is_recognised_on_retry(world, needs_emulator, kind):
    """The API server stores the pod but the client times out; the job is re-queued and retried."""
    sched = world.scheduler(kind)
    executor = sched.executor
    world.emulator.add_fault(method="POST", path=r"/pods$", persist_then_timeout=True, hang_seconds=8, times=1)
    world.queue(sched)
    row = world.row("t1")
    executor.sync()  # times out after the server stored the pod; the provider re-queues the job
    world.sync_until(executor, lambda: executor.task_queue.qsize() == 0 and not getattr(executor, "_carry", None),
                     timeout=15)
    world.settle(executor, 1.0)
    pods = world.pods(row)
    if kind == "stock":
        assert len(pods) == 2, "stock executor no longer shows race a3"
    else:
        assert len(pods) == 1
        assert row.key in executor.running
        assert not any(state == "failed" for state, _ in executor.event_buffer.values())


@pytest.mark.parametrize("kind", KINDS)
def test_b5_queued_event_never_overwrites_the_token(world, kind):
    """The scheduler writes QUEUED/RUNNING event info into external_executor_id."""
    sched = world.scheduler(kind)
    world.queue(sched)
    before = world.row("t1")
    sched.process_events()
    token_after = world.row("t1").external_executor_id
    if kind == "stock":
        assert token_after == str(sched.job_id), "stock executor no longer overwrites the token"
    else:
        assert before.token and token_after == before.token
