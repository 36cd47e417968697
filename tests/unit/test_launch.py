"""Launch identity <-> pod metadata, and deterministic pod names."""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fenced_k8s_executor import verdicts
from fenced_k8s_executor.launch import Launcher, LaunchIdentity, as_token, from_pod_metadata, pod_name
from fenced_k8s_executor.names import (DEPLOYMENT_ANNOTATION, SCHEDULER_HEARTBEAT_ANNOTATION, SCHEDULER_JOB_ANNOTATION,
                                       SCHEDULER_STARTED_ANNOTATION, TI_ID_ANNOTATION, TI_ID_LABEL, TOKEN_ANNOTATION,
                                       TOKEN_LABEL, TRY_NUMBER_ANNOTATION)

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


STARTED = datetime(2026, 12, 5, 8, 1, 2, 345678, tzinfo=timezone.utc)
BEAT = datetime(2026, 12, 5, 8, 21, 30, 123456, tzinfo=timezone.utc)


def _stamped(**annotations) -> LaunchIdentity:
    launch = LaunchIdentity(ti_id=str(uuid.uuid4()), token=str(uuid.uuid4()), try_number=1, scheduler_job_id="42",
                            launcher=Launcher(42, STARTED, BEAT))
    return from_pod_metadata({**launch.annotations(), **annotations})


def test_the_launcher_stamp_round_trips_as_iso_utc():
    launch = LaunchIdentity(ti_id=str(uuid.uuid4()), token=str(uuid.uuid4()), try_number=1, scheduler_job_id="42",
                            launcher=Launcher(42, STARTED, BEAT))
    stamp = launch.annotations()
    assert stamp[SCHEDULER_STARTED_ANNOTATION] == "2026-12-05T08:01:02.345678+00:00"
    assert stamp[SCHEDULER_HEARTBEAT_ANNOTATION] == "2026-12-05T08:21:30.123456+00:00"
    assert stamp[SCHEDULER_JOB_ANNOTATION] == "42"
    assert from_pod_metadata(stamp) == launch
    unstamped = LaunchIdentity(ti_id=launch.ti_id, token=launch.token, try_number=1, scheduler_job_id="42")
    assert SCHEDULER_STARTED_ANNOTATION not in unstamped.annotations()
    assert from_pod_metadata(unstamped.annotations()).launcher is None


def test_the_launcher_is_written_in_utc_whatever_the_zone_it_was_given_in():
    tokyo = timezone(timedelta(hours=9))
    launcher = Launcher(7, STARTED.astimezone(tokyo), BEAT.astimezone(tokyo))
    assert launcher.annotations()[SCHEDULER_STARTED_ANNOTATION] == "2026-12-05T08:01:02.345678+00:00"
    with pytest.raises(ValueError):
        Launcher(7, STARTED.replace(tzinfo=None), BEAT)


@pytest.mark.parametrize("field, value", [
    (SCHEDULER_STARTED_ANNOTATION, "yesterday"),
    (SCHEDULER_STARTED_ANNOTATION, "2026-12-05T08:01:02"),  # naive
    (SCHEDULER_STARTED_ANNOTATION, "2026-12-05"),  # a date: naive
    (SCHEDULER_HEARTBEAT_ANNOTATION, "2026-12-05T08:21:30.123456+00:00" + " " * 9),  # 41 characters
    (SCHEDULER_HEARTBEAT_ANNOTATION, "0001-01-01T00:00:00+01:00"),  # before year 1 in UTC
    (SCHEDULER_HEARTBEAT_ANNOTATION, ""),
    (SCHEDULER_HEARTBEAT_ANNOTATION, 1733386890),  # wrong type (a JSON body, a test)
    (SCHEDULER_HEARTBEAT_ANNOTATION, None),
    (SCHEDULER_JOB_ANNOTATION, "x"),
    (SCHEDULER_JOB_ANNOTATION, str(2**63)),
    (SCHEDULER_JOB_ANNOTATION, "-1"),
])
def test_an_unreadable_launcher_stamp_is_no_launcher_and_leaves_the_launch_readable(field, value):
    launch = _stamped(**{field: value})
    assert launch.launcher is None
    assert launch.token is not None and not launch.legacy
    if field != SCHEDULER_JOB_ANNOTATION:
        assert launch.malformed is None


def test_a_launcher_in_another_zone_reads_as_utc():
    launch = _stamped(**{SCHEDULER_STARTED_ANNOTATION: "2026-12-05T17:01:02.345678+09:00"})
    assert launch.launcher == Launcher(42, STARTED, BEAT)
    assert launch.launcher.started.tzinfo is timezone.utc


@given(st.one_of(st.none(), st.integers(), st.text(max_size=60), st.datetimes().map(datetime.isoformat),
                 st.datetimes(timezones=st.timezones()).map(datetime.isoformat)))
def test_any_started_stamp_reads_as_an_aware_utc_time_or_no_launcher(value):
    launcher = _stamped(**{SCHEDULER_STARTED_ANNOTATION: value}).launcher
    assert launcher is None or launcher.started.tzinfo is timezone.utc
