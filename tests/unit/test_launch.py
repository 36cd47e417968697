"""Launch identity <-> pod metadata, and deterministic pod names."""

from __future__ import annotations

import re
import uuid

from hypothesis import given
from hypothesis import strategies as st

from fenced_k8s_executor import verdicts
from fenced_k8s_executor.launch import LaunchIdentity, as_token, from_pod_metadata, pod_name
from fenced_k8s_executor.names import (DEPLOYMENT_ANNOTATION, TI_ID_ANNOTATION, TI_ID_LABEL, TOKEN_ANNOTATION, TOKEN_LABEL,
                                       TRY_NUMBER_ANNOTATION)

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_as_token_accepts_uuids_only():
    token = str(uuid.uuid4())
    assert as_token(token) == token
    assert as_token(token.upper()) == token
    assert as_token(None) is None
    assert as_token("17") is None  # a scheduler job id written by the stock executor
    assert as_token("") is None


def test_identity_round_trips_through_pod_metadata():
    launch = LaunchIdentity(ti_id=str(uuid.uuid4()), token=str(uuid.uuid4()), try_number=3, scheduler_job_id="9")
    assert from_pod_metadata(launch.annotations()) == launch
    assert launch.labels() == {TOKEN_LABEL: launch.token, TI_ID_LABEL: launch.ti_id}


def test_pod_without_our_annotations_is_legacy():
    assert from_pod_metadata({"dag_id": "d", "task_id": "t", "try_number": "1"}) is None
    assert from_pod_metadata(None) is None


def test_task_coordinates_come_from_the_providers_annotations():
    """The provider writes map_index only for a mapped task (>= 0): absent reads as -1, and one
    that does not read exactly as a number names no task."""
    base = {TI_ID_ANNOTATION: str(uuid.uuid4()), TOKEN_ANNOTATION: str(uuid.uuid4()), TRY_NUMBER_ANNOTATION: "2",
            DEPLOYMENT_ANNOTATION: "ours", "dag_id": "d", "task_id": "t", "run_id": "r"}
    assert verdicts.should_delete(from_pod_metadata(base), None, "ours").act  # task gone: stale
    assert from_pod_metadata(base).task == ("d", "t", "r", -1)
    assert from_pod_metadata({**base, "map_index": "4"}).task == ("d", "t", "r", 4)
    for garbled in ("garbage", "3x", "1_0", " 3", "", "\u0663"):  # int() would take some of these
        launch = from_pod_metadata({**base, "map_index": garbled})
        assert launch.task is None, garbled  # names no task: never fenced, whatever the row
        assert verdicts.should_delete(launch, None, "ours").act is False
    assert from_pod_metadata(base).try_number == 2
    assert from_pod_metadata({**base, TRY_NUMBER_ANNOTATION: "x"}).try_number == 0


def test_garbled_token_annotation_reads_as_no_token():
    launch = from_pod_metadata({"fenced-k8s-executor.io/ti-id": "x", TOKEN_ANNOTATION: "garbage"})
    assert launch is not None and launch.legacy


@given(st.text(min_size=1, max_size=300), st.text(min_size=1, max_size=300), st.uuids(), st.integers(0, 99))
def test_pod_names_are_valid_deterministic_and_distinct_per_attempt(dag_id, task_id, token, attempt):
    name = pod_name(dag_id, task_id, str(token), attempt)
    assert len(name) <= 63 and DNS_LABEL.match(name), name
    assert name == pod_name(dag_id, task_id, str(token), attempt)
    assert name != pod_name(dag_id, task_id, str(token), attempt + 1)


def _parse_or_none(text: str) -> str | None:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None


@given(st.one_of(st.uuids().map(str), st.uuids().map(lambda u: str(u).upper()), st.uuids().map(lambda u: u.hex),
                 st.text(max_size=40), st.integers().map(str)))
def test_as_token_agrees_with_uuid_parsing_whatever_the_spelling(text):
    assert as_token(text) == _parse_or_none(text)
