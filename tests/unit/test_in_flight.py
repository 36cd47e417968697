"""The deployment-wide picture of pods in flight (``in_flight.InFlightView``): plain values, no API."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from fenced_k8s_executor.launch import LaunchIdentity, from_pod_metadata
from fenced_k8s_executor.names import TI_ID_ANNOTATION
from fenced_k8s_executor.in_flight import InFlightView
from fenced_k8s_executor.pods import PodRef


def ref(name="p", namespace="ns", uid=None, creator="7", deleting=False, launch=True):
    identity = LaunchIdentity(ti_id=str(uuid.uuid4()), token=str(uuid.uuid4()), try_number=1,
                              scheduler_job_id=creator, dag_id="d", task_id="t", run_id="r") if launch else None
    return PodRef(name=name, namespace=namespace, uid=uid or str(uuid.uuid4()), launch=identity, deleting=deleting)


def test_events_keep_the_latest_metadata_and_deleted_drops_the_pod():
    view = InFlightView()
    a, b = ref("a"), ref("b")
    view.apply("ADDED", a)
    view.apply("ADDED", b)
    moved = PodRef(a.name, a.namespace, a.uid, a.launch, deleting=True)
    view.apply("MODIFIED", moved)
    assert {r.name for r in view.unsettled()} == {"b"}  # a terminating pod is nobody's to delete
    view.apply("DELETED", b)  # deleted, or it finished: it left the field selector
    assert view.unsettled() == [] and len(view) == 1


def test_a_list_replaces_only_its_namespace():
    view = InFlightView()
    view.apply("ADDED", ref("a", "one"))
    view.apply("ADDED", ref("b", "two"))
    view.replace("one", [ref("c", "one")])
    assert sorted((r.namespace, r.name) for r in view.unsettled()) == [("one", "c"), ("two", "b")]
    view.replace(None, [ref("d", "three")])  # every namespace
    assert [(r.namespace, r.name) for r in view.unsettled()] == [("three", "d")]


def test_a_settled_pod_is_skipped_until_a_new_pod_takes_its_name():
    view = InFlightView()
    old = ref("a")
    view.apply("ADDED", old)
    view.settle(old)
    view.apply("MODIFIED", old)  # the same object changing (bound, status): still decided
    assert view.unsettled() == []
    new = ref("a")  # deleted and created again under the same name: a new uid
    view.apply("ADDED", new)
    assert view.unsettled() == [new]


def test_pods_without_a_launch_identity_are_never_offered():
    view = InFlightView()
    view.apply("ADDED", ref("legacy", launch=False))
    assert view.unsettled() == []


@given(events=st.lists(st.tuples(st.sampled_from(["ADDED", "MODIFIED", "DELETED"]), st.sampled_from("abc"),
                                 st.sampled_from(["u1", "u2"])), max_size=30))
def test_memory_is_bounded_by_the_pods_still_in_flight(events):
    """Whatever the order of events, the picture holds exactly the pods whose last event was not
    DELETED, and remembers settled uids of those pods only."""
    view, last = InFlightView(), {}
    for kind, name, uid in events:
        r = ref(name, uid=uid)
        view.apply(kind, r)
        view.settle(r)
        last[name] = kind
    assert len(view) == sum(1 for kind in last.values() if kind != "DELETED")
    assert len(view._settled) <= len(view)


def test_a_malformed_pod_is_kept_but_never_offered():
    """One pod's unreadable identity must cost that pod alone: it is never put to the database."""
    view = InFlightView()
    pod = {**LaunchIdentity(ti_id=str(uuid.uuid4()), token=str(uuid.uuid4()), try_number=1).annotations(),
           "dag_id": "d", "task_id": "t", "run_id": "r"}  # malformed is read off a pod, once
    bad = PodRef("bad", "ns", "u-bad", from_pod_metadata({**pod, TI_ID_ANNOTATION: "not-a-uuid"}))
    nul = PodRef("nul", "ns", "u-nul", from_pod_metadata({**pod, "dag_id": "d\x00"}))
    good = ref("good")
    for r in (bad, nul, good):
        view.apply("ADDED", r)
    assert view.unsettled() == [good] and len(view) == 3
    assert bad.launch.malformed and nul.launch.malformed and good.launch.malformed is None
