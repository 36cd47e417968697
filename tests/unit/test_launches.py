"""The LaunchBook: bookkeeping properties over arbitrary orders of executor events."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from fenced_k8s_executor.launch import LaunchIdentity
from fenced_k8s_executor.launches import LaunchBook

KEYS = ["k1", "k2"]


def launch(token: str | None = None) -> LaunchIdentity:
    return LaunchIdentity(ti_id=str(uuid.uuid4()), token=token or str(uuid.uuid4()), try_number=1,
                          dag_id="d", task_id="t", run_id="r")


def test_a_stale_launch_frees_its_own_slot_once_and_never_a_newer_ones():
    book = LaunchBook()
    old, new = launch(), launch()
    book.queued_all([("k", old.token)])
    assert book.holds("k", old)
    book.queued_all([("k", new.token)])  # the same key re-queued with a new token on this scheduler
    assert not book.release("k", old)  # the old launch's event must not free the new slot
    assert book.holder("k") == new.token
    assert book.release("k", new)
    assert book.holder("k") is None
    assert book.release("k", old)  # nobody known holds it any more: stock would free it


def test_pending_launches_are_those_not_seen_running_and_still_in_running():
    book = LaunchBook()
    a, b = launch(), launch()
    book.queued_all([("k1", a.token)])
    book.created("k1", "pod-a", "ns", a)
    book.queued_all([("k2", b.token)])
    book.created("k2", "pod-b", "ns", b)
    assert {p.name for p in book.pending()} == {"pod-a", "pod-b"}
    book.observed("pod-a")
    assert [p.name for p in book.pending()] == ["pod-b"]
    book.prune(running=["k1"])  # k2 left `running` (a revoke): its pod may still exist
    assert book.holder("k2") is None
    assert [p.name for p in book.pending()] == ["pod-b"]  # the reconcile still re-checks it
    book.fenced("pod-b")
    assert book.pending() == []
    assert book.launch_of("pod-b") == b  # still resolvable for late events


def test_pod_memory_is_bounded():
    book = LaunchBook(memory=3)
    for i in range(5):
        book.remember(f"p{i}", launch())
    assert not book.knows("p0") and not book.knows("p1") and book.knows("p4")
    assert book.sizes()["pods"] == 3


steps = st.lists(
    st.tuples(st.sampled_from(["queue", "stale_event", "current_event", "prune"]), st.sampled_from(KEYS)),
    max_size=40,
)


@given(steps)
def test_every_key_that_enters_running_leaves_it_exactly_once(plan):
    """Model the executor: `running` gains a key per launch queued; every launch's end (a current
    event, or a stale event the fence swallows) frees the key only while that launch holds it."""
    book = LaunchBook()
    running: set[str] = set()
    launches: dict[str, list[LaunchIdentity]] = {k: [] for k in KEYS}
    for action, key in plan:
        if action == "queue":
            fresh = launch()
            launches[key].append(fresh)
            running.add(key)
            book.queued_all([(key, fresh.token)])
        elif action == "stale_event" and len(launches[key]) >= 2:
            stale = launches[key][0]
            if book.release(key, stale):
                running.discard(key)
            # a newer launch holds the key: it must still be running
            assert key in running or book.holder(key) is None
        elif action == "current_event" and launches[key]:
            current = launches[key][-1]
            if book.release(key, current):
                running.discard(key)
            assert key not in running
        elif action == "prune":
            book.prune(running)
        holder = book.holder(key)
        if holder is not None:
            assert key in running
            assert holder == launches[key][-1].token  # only the newest launch ever holds the slot
