"""Edges of the functional core (``launch``, ``verdicts``) that generated mutants showed untested:
each test kills mutants of cosmic-ray's run over those modules that the unit and property tests
let live (docs/checker.md lists the run and its survivors). Pure: no fixture, no I/O."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from fenced_k8s_executor.lineage import Provenance
from fenced_k8s_executor import launch, verdicts
from fenced_k8s_executor.launch import LaunchIdentity, TaskRow, as_token, from_pod_metadata, pod_name
from fenced_k8s_executor.names import TI_ID_ANNOTATION, TOKEN_ANNOTATION, TRY_NUMBER_ANNOTATION

TOKEN = "0f1e2d3c-4b5a-4987-8654-3210fedcba98"
TI = "11111111-2222-4333-8444-555555555555"


def _launch(**kw) -> LaunchIdentity:
    base = dict(ti_id=TI, token=TOKEN, try_number=2, scheduler_job_id="7", dag_id="d", task_id="t", run_id="r",
                map_index=-1, deployment="dep")
    return LaunchIdentity(**{**base, **kw})


def _read(**kw) -> LaunchIdentity:
    """The launch a pod stamped with ``_launch(**kw)`` reads as: through ``from_pod_metadata``, where
    every field is validated (issue 45), with the provider's task annotations beside ours."""
    stamped = _launch(**kw)
    coordinates = {"dag_id": stamped.dag_id, "task_id": stamped.task_id, "run_id": stamped.run_id}
    if stamped.map_index != -1:
        coordinates["map_index"] = str(stamped.map_index)
    return from_pod_metadata({**stamped.annotations(), **coordinates})


def _row(**kw) -> TaskRow:
    base = dict(ti_id=TI, state="queued", try_number=2, queued_by_job_id=7, external_executor_id=TOKEN,
                dag_id="d", task_id="t", run_id="r")
    return TaskRow(**{**base, **kw})


def test_a_uuid_object_reads_as_its_token():
    assert as_token(uuid.UUID(TOKEN)) == TOKEN
    assert as_token(TOKEN.upper()) == TOKEN


def test_pod_names_use_all_63_characters_and_the_tokens_first_16_hex_digits():
    name = pod_name("d" * 80, "t" * 80, TOKEN, 3)
    assert len(name) == 63 and name.endswith(f"-{uuid.UUID(TOKEN).hex[:16]}-3")
    assert pod_name("my_dag", "a.task", TOKEN) == f"my-dag-a-task-{uuid.UUID(TOKEN).hex[:16]}-0"


@pytest.mark.parametrize("job_id, creator", [("12", 12), ("sched-7", None), ("\u0661\u0662", None), (None, None)])
def test_the_creator_is_an_ascii_job_id_or_nothing(job_id, creator):
    assert _launch(scheduler_job_id=job_id).creator == creator


@pytest.mark.parametrize("field", ["dag_id", "task_id", "run_id"])
def test_a_nul_anywhere_in_the_task_key_is_malformed(field):
    assert _read(**{field: "a\x00b"}).malformed
    assert _read(**{field: "a\x00b"}).task is None


@pytest.mark.parametrize("index, bad", [(100, False), (2**31 - 1, False), (-(2**31), False), (2**31, True),
                                        (-(2**31) - 1, True)])
def test_a_map_index_is_malformed_only_beyond_32_bits(index, bad):
    assert bool(_read(map_index=index).malformed) is bad


def test_a_rows_map_index_is_minus_one_unless_given():
    assert _row().task == ("d", "t", "r", -1)
    assert _row(dag_id=None).task is None and _row(task_id="").task is None and _row(run_id=None).task is None


@pytest.mark.parametrize("host, pod, runs", [("pod-a", "pod-a", True), ("POD-A.ns.svc", "pod-a", True),
                                              ("pod-a", "pod-b", False), ("pod-b", "pod-a", False),
                                              ("pod-ab", "pod-a", False), ("pod-a", None, False), (None, "pod-a", False)])
def test_the_row_names_its_host_by_name_or_fqdn_only(host, pod, runs):
    assert _row(hostname=host).runs_on(pod) is runs


@pytest.mark.parametrize("value, index", [(None, None), ("-1", -1), ("-12", -12), ("7", 7), ("1e3", None),
                                          ("3x", None), ("--1", None), (5, None), ("-2147483648", -(2**31)),
                                          ("-2147483649", None), ("2147483648", None)])
def test_map_index_annotations_read_exactly(value, index):
    """Only a decimal string is a map index (annotations are strings; anything else is hostile)."""
    assert launch._map_index(value) == index


def test_an_unreadable_try_number_reads_as_zero():
    annotations = {TI_ID_ANNOTATION: TI, TOKEN_ANNOTATION: TOKEN, TRY_NUMBER_ANNOTATION: "x"}
    read = from_pod_metadata(annotations)
    assert read.try_number == 0 and read.malformed and read.task is None


@pytest.mark.parametrize("other", ["00000000-0000-4000-8000-000000000000", "ffffffff-ffff-4fff-bfff-ffffffffffff"])
def test_precreate_sees_another_ti_id_whichever_way_it_sorts(other):
    assert verdicts.should_create(_launch(), _row(ti_id=other), 7).reason is verdicts.Reason.TI_ID_CHANGED


@pytest.mark.parametrize("row_try", [1, 3])
def test_precreate_sees_another_try_whichever_way_it_differs(row_try):
    assert verdicts.should_create(_launch(), _row(try_number=row_try), 7).reason is verdicts.Reason.TRY_MISMATCH


def test_precreate_compares_the_state_by_value():
    state = "".join(["que", "ued"])  # as read from the DB: equal to QUEUED, not the same object
    assert verdicts.should_create(_launch(), _row(state=state), 7).act


def test_launches_and_rows_are_immutable_values():
    """Both are keys of the fences' maps and shared between threads (the watch, the loop)."""
    for value in (_launch(), _row()):
        assert hash(value) == hash(dataclasses.replace(value))
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.ti_id = "other"


def test_a_relist_hands_the_loop_the_pods_that_left_while_the_watch_was_down():
    """The in-flight picture's plain data (mutant ``gone_pods_not_reported_after_a_relist``): a pod
    missing from a fresh list left meanwhile (deleted by a peer while Pending, which the provider
    never reports), so the loop must see it to free its slot."""
    from fenced_k8s_executor.in_flight import InFlightView
    from fenced_k8s_executor.pods import PodRef

    kept = PodRef("kept", "ns", "uid-1", _launch())
    left = PodRef("left", "ns", "uid-2", _launch(token="1f1e2d3c-4b5a-4987-8654-3210fedcba98"))
    view = InFlightView()
    view.replace("ns", [kept, left])
    assert view.take_gone() == []
    view.replace("ns", [kept])
    assert view.take_gone() == [left]


def _fresh(text: str) -> str:
    """An equal string that is not the same object (values read from the DB or a pod are not)."""
    return "".join(list(text))


@pytest.mark.parametrize("stamp, ours, is_foreign", [("theirs", {"dep"}, True), ("dep", {"dep"}, False),
                                                     (None, {"dep"}, False), ("theirs", set(), False)])
def test_foreign_means_another_deployments_stamp(stamp, ours, is_foreign):
    assert verdicts.foreign(_launch(deployment=stamp), frozenset(ours)) is is_foreign
    assert verdicts.foreign(None, frozenset(ours)) is False


def test_values_read_from_pods_and_rows_compare_by_value():
    launch = _launch(ti_id=_fresh(TI), deployment=_fresh("dep"), token=_fresh(TOKEN))
    assert verdicts.owned(launch, "dep", Provenance.HERE)
    assert verdicts.should_create(launch, _row(queued_by_job_id=int("1000"), try_number=int("300")),
                                  int("1000")).reason is verdicts.Reason.TRY_MISMATCH
    assert verdicts.should_create(_launch(try_number=300), _row(queued_by_job_id=int("1000"), try_number=int("300")),
                                  int("1000")).act
    assert verdicts.should_adopt(launch, _fresh(TOKEN)).act


@pytest.mark.parametrize("other", ["00000000-0000-4000-8000-000000000000", "ffffffff-ffff-4fff-bfff-ffffffffffff"])
def test_adoption_refuses_another_token_whichever_way_it_sorts(other):
    assert not verdicts.should_adopt(_launch(), other).act


@pytest.mark.parametrize("state", ["failed", "success", "scheduled", None])
def test_precreate_takes_any_other_state_for_not_queued(state):
    assert verdicts.should_create(_launch(), _row(state=state), 7).reason is verdicts.Reason.NOT_QUEUED


def test_the_pod_the_row_names_as_its_host_is_never_deleted():
    row = _row(external_executor_id="1f1e2d3c-4b5a-4987-8654-3210fedcba98", hostname="pod-a")
    verdict = verdicts.should_delete(_launch(), row, "dep", "pod-a", Provenance.HERE)
    assert (verdict.act, verdict.stock, verdict.reason) == (False, False, verdicts.Reason.RUNS_THE_TASK)
    assert verdicts.should_delete(_launch(), row, "dep", "pod-b", Provenance.HERE).act
    with pytest.raises(dataclasses.FrozenInstanceError):
        verdict.act = True


def test_a_map_index_one_past_32_bits_is_malformed():
    assert _read(map_index=2**31 + 1).malformed


def test_annotations_carry_the_region_and_the_deployment_only_when_set():
    from fenced_k8s_executor.names import DEPLOYMENT_ANNOTATION, REGION_ANNOTATION

    plain = _launch(deployment=None).annotations()
    assert DEPLOYMENT_ANNOTATION not in plain and REGION_ANNOTATION not in plain
    stamped = _launch(region="loop-1").annotations()
    assert stamped[REGION_ANNOTATION] == "loop-1" and stamped[DEPLOYMENT_ANNOTATION] == "dep"


def test_a_ti_id_that_is_no_uuid_is_malformed():
    assert _read(ti_id="not-a-uuid").malformed == "ti_id is not a UUID"
    assert _read(ti_id=TI.upper()).malformed is None
