"""The LaunchBook: bookkeeping properties over arbitrary orders of executor events."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from fenced_k8s_executor.launch import LaunchIdentity
from fenced_k8s_executor.launches import PRUNE_EVERY, LaunchBook

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


class Asked(set):
    """``running`` counting the membership tests a prune makes (one per key held)."""

    asked = 0

    def __contains__(self, key: object) -> bool:
        self.asked += 1
        return super().__contains__(key)


def test_an_idle_loop_does_not_scan_the_slot_holders_and_a_key_that_left_is_forgotten_at_once():
    """Scanning every holder each loop cost an idle loop 1 ms per 1,000 launches on Airflow 3.4
    (its keys hash through a UUID in Python). The loop's tidy scans only when a key may have left
    ``running``: at once when the book holds more keys than ``running``, else every PRUNE_EVERY
    loops (a key left while another without a known holder came in)."""
    book = LaunchBook()
    keys = [f"k{i}" for i in range(100)]
    book.queued_all([(key, launch().token) for key in keys])
    running = Asked(keys)
    for _ in range(PRUNE_EVERY - 1):
        book.tidy(running)
    assert running.asked == 0  # nothing left: no scan

    running.discard("k1")  # a revoke: k1's slot is gone
    book.tidy(running)
    assert book.holder("k1") is None and running.asked == 100  # one scan: each of the 100 holders asked once

    running.discard("k2")
    running.add("legacy")  # a key without a known holder came in: the sizes match
    asked = running.asked
    book.tidy(running)
    assert book.holder("k2") is not None and running.asked == asked  # left for the periodic scan
    for _ in range(PRUNE_EVERY):
        book.tidy(running)
    assert book.holder("k2") is None and book.holder("k3") is not None
    assert book.release("k2", launch())  # nobody holds it: a late event of the key frees nothing else


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
