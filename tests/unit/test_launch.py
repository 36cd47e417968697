"""Launch identity <-> pod metadata, and deterministic pod names."""

from __future__ import annotations

import dataclasses
import re
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fenced_k8s_executor import verdicts
from fenced_k8s_executor.launch import Launcher, LaunchIdentity, as_token, from_pod_metadata, pod_name
from fenced_k8s_executor.lineage import Provenance
from fenced_k8s_executor.names import (DEPLOYMENT_ANNOTATION, REGION_ANNOTATION,                                        SCHEDULER_JOB_ANNOTATION, SCHEDULER_STARTED_ANNOTATION, TI_ID_ANNOTATION,
                                       TI_ID_LABEL, TOKEN_ANNOTATION, TOKEN_LABEL, TRY_NUMBER_ANNOTATION)

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
    assert verdicts.should_delete(from_pod_metadata(base), None, "ours", launched=HERE).act  # task gone: stale
    assert from_pod_metadata(base).task == ("d", "t", "r", -1)
    assert from_pod_metadata({**base, "map_index": "4"}).task == ("d", "t", "r", 4)
    for garbled in ("garbage", "3x", "1_0", " 3", "", "\u0663"):  # int() would take some of these
        launch = from_pod_metadata({**base, "map_index": garbled})
        assert launch.task is None, garbled  # names no task: never fenced, whatever the row
        assert verdicts.should_delete(launch, None, "ours", launched=HERE).act is False
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


HERE = Provenance.HERE
STARTED = datetime(2026, 12, 5, 8, 1, 2, 345678, tzinfo=timezone.utc)


def _stamped(**annotations) -> LaunchIdentity:
    launch = LaunchIdentity(ti_id=str(uuid.uuid4()), token=str(uuid.uuid4()), try_number=1, scheduler_job_id="42",
                            launcher=Launcher(42, STARTED))
    return from_pod_metadata({**launch.annotations(), **annotations})


def test_the_launcher_stamp_round_trips_as_iso_utc():
    launch = LaunchIdentity(ti_id=str(uuid.uuid4()), token=str(uuid.uuid4()), try_number=1, scheduler_job_id="42",
                            launcher=Launcher(42, STARTED))
    stamp = launch.annotations()
    assert stamp[SCHEDULER_STARTED_ANNOTATION] == "2026-12-05T08:01:02.345678+00:00"
    assert stamp[SCHEDULER_JOB_ANNOTATION] == "42"
    assert from_pod_metadata(stamp) == launch
    unstamped = LaunchIdentity(ti_id=launch.ti_id, token=launch.token, try_number=1, scheduler_job_id="42")
    assert SCHEDULER_STARTED_ANNOTATION not in unstamped.annotations()
    assert from_pod_metadata(unstamped.annotations()).launcher is None


def test_the_launcher_is_written_in_utc_whatever_the_zone_it_was_given_in():
    tokyo = timezone(timedelta(hours=9))
    launcher = Launcher(7, STARTED.astimezone(tokyo))
    assert launcher.annotations()[SCHEDULER_STARTED_ANNOTATION] == "2026-12-05T08:01:02.345678+00:00"
    with pytest.raises(ValueError):  # a naive time would be written as the scheduler's local time
        Launcher(7, STARTED.replace(tzinfo=None)).annotations()


@pytest.mark.parametrize("field, value", [
    (SCHEDULER_STARTED_ANNOTATION, "yesterday"),
    (SCHEDULER_STARTED_ANNOTATION, "2026-12-05T08:01:02"),  # naive
    (SCHEDULER_STARTED_ANNOTATION, "2026-12-05"),  # a date: naive
    (SCHEDULER_STARTED_ANNOTATION, "2026-12-05T08:21:30.123456+00:00" + " " * 9),  # 41 characters
    (SCHEDULER_STARTED_ANNOTATION, "0001-01-01T00:00:00+01:00"),  # before year 1 in UTC
    (SCHEDULER_STARTED_ANNOTATION, ""),
    (SCHEDULER_STARTED_ANNOTATION, 1733386890),  # wrong type (a JSON body, a test)
])
def test_an_unreadable_launcher_stamp_is_a_launcher_that_does_not_read_and_leaves_the_launch_readable(field, value):
    launch = _stamped(**{field: value})
    assert launch.launcher is not None and launch.launcher.started is None  # never deleted for its launcher
    assert launch.malformed is None and not launch.legacy and launch.token is not None


def test_a_pod_without_a_start_stamp_names_no_launcher():  # builds before 0.3.0
    assert _stamped(**{SCHEDULER_STARTED_ANNOTATION: None}).launcher is None


@pytest.mark.parametrize("value", ["x", str(2**63), "-1", "", 42])
def test_an_unreadable_scheduler_job_id_is_an_unreadable_launcher_and_a_malformed_launch(value):
    launch = _stamped(**{SCHEDULER_JOB_ANNOTATION: value})
    assert launch.launcher.started is None and launch.scheduler_job_id is None
    assert launch.malformed.startswith("scheduler_job_id ") and launch.legacy


def test_a_launcher_in_another_zone_reads_as_utc():
    launch = _stamped(**{SCHEDULER_STARTED_ANNOTATION: "2026-12-05T17:01:02.345678+09:00"})
    assert launch.launcher == Launcher(42, STARTED)
    assert launch.launcher.started.tzinfo is timezone.utc


@given(st.one_of(st.none(), st.integers(), st.text(max_size=60), st.datetimes().map(datetime.isoformat),
                 st.datetimes(timezones=st.timezones()).map(datetime.isoformat)))
def test_any_started_stamp_reads_as_an_aware_utc_time_or_one_that_does_not_read(value):
    launcher = _stamped(**{SCHEDULER_STARTED_ANNOTATION: value}).launcher
    assert launcher is None or launcher.started is None or launcher.started.tzinfo is timezone.utc


# --- a pod's annotations as a trust boundary ----------------------------------------------------------

GOOD = {TI_ID_ANNOTATION: "0b3a3d2c-7f4e-4c1a-9d2b-5e6f7a8b9c0d", TOKEN_ANNOTATION: "5f0c6d1e-2a3b-4c4d-8e5f-6a7b8c9d0e1f",
        TRY_NUMBER_ANNOTATION: "3", SCHEDULER_JOB_ANNOTATION: "42", DEPLOYMENT_ANNOTATION: "db-0123abcd",
        "dag_id": "d", "task_id": "t", "run_id": "manual__2026-12-05T08:00:00+00:00", "map_index": "4"}
HUGE = "x" * 100_000
NOT_UTF8 = b"\xff\xfe-\xc3".decode("utf-8", "surrogateescape")  # how metadata_pb reads bytes a protobuf client wrote


@pytest.mark.parametrize("field, value", [
    (TI_ID_ANNOTATION, "not-a-uuid"), (TI_ID_ANNOTATION, ""), (TI_ID_ANNOTATION, None), (TI_ID_ANNOTATION, 7),
    (TI_ID_ANNOTATION, "{0b3a3d2c-7f4e-4c1a-9d2b-5e6f7a8b9c0d}"), (TI_ID_ANNOTATION, "0b3a3d2c7f4e4c1a9d2b5e6f7a8b9c0d"),
    (TI_ID_ANNOTATION, "0b3a3d2c-7f4e-4c1a-9d2b-5e6f7a8b9c0d\x00"), (TI_ID_ANNOTATION, HUGE),
    (TOKEN_ANNOTATION, "garbage"), (TOKEN_ANNOTATION, ""), (TOKEN_ANNOTATION, ["5f0c6d1e-2a3b-4c4d-8e5f-6a7b8c9d0e1f"]),
    (TRY_NUMBER_ANNOTATION, "-1"), (TRY_NUMBER_ANNOTATION, str(2**31)), (TRY_NUMBER_ANNOTATION, "1.0"),
    (TRY_NUMBER_ANNOTATION, 3), (TRY_NUMBER_ANNOTATION, "\u0663"), (TRY_NUMBER_ANNOTATION, "9" * 5000),
    (SCHEDULER_JOB_ANNOTATION, "sched-7"), (SCHEDULER_JOB_ANNOTATION, str(2**63)), (SCHEDULER_JOB_ANNOTATION, None),
    ("dag_id", ""), ("dag_id", "d\x00"), ("dag_id", "d" * 251), ("dag_id", NOT_UTF8), ("dag_id", 1),
    ("task_id", "\ud800"), ("task_id", HUGE), ("run_id", ["r"]), ("run_id", "r\x00"),
    ("map_index", "garbage"), ("map_index", "3x"), ("map_index", "1_0"), ("map_index", " 3"), ("map_index", ""),
    ("map_index", "\u0663"), ("map_index", str(2**31)), ("map_index", str(-(2**31) - 1)), ("map_index", -1),
    ("map_index", None), ("map_index", "--1"),
    (DEPLOYMENT_ANNOTATION, ""), (DEPLOYMENT_ANNOTATION, "-db"), (DEPLOYMENT_ANNOTATION, "d" * 64),
    (DEPLOYMENT_ANNOTATION, "db ours"), (DEPLOYMENT_ANNOTATION, "db-\u00e9"), (DEPLOYMENT_ANNOTATION, {"id": "db"}),
    (REGION_ANNOTATION, "not-a-uuid"), (REGION_ANNOTATION, "region-1"), (REGION_ANNOTATION, "'; DROP TABLE x; --"),
    (REGION_ANNOTATION, NOT_UTF8), (REGION_ANNOTATION, HUGE), (REGION_ANNOTATION, 0), (REGION_ANNOTATION, None),
])
def test_a_field_that_does_not_read_makes_the_launch_malformed(field, value):
    """Issue 45 item 4: the pod is malformed, naming the field; it names no task, is legacy (no
    evidence) and is never deleted: read as it was, a stale launch whose task has no row."""
    readable = from_pod_metadata(GOOD)
    assert readable.malformed is None and verdicts.should_delete(readable, None, GOOD[DEPLOYMENT_ANNOTATION], launched=HERE).act

    launch = from_pod_metadata({**GOOD, field: value})

    name = {TI_ID_ANNOTATION: "ti_id", TOKEN_ANNOTATION: "launch_token", TRY_NUMBER_ANNOTATION: "try_number",
            SCHEDULER_JOB_ANNOTATION: "scheduler_job_id", DEPLOYMENT_ANNOTATION: "deployment",
            REGION_ANNOTATION: "region_id"}.get(field, field)
    assert launch.malformed.split(" ")[0] == name, launch.malformed
    assert launch.task is None and launch.legacy
    assert not verdicts.should_delete(launch, None, GOOD[DEPLOYMENT_ANNOTATION], launched=HERE).act
    assert verdicts.standing(launch, None) is verdicts.Standing.LEGACY_LAUNCH
    assert verdicts.should_adopt(launch, "6a0c6d1e-2a3b-4c4d-8e5f-6a7b8c9d0e1f").act  # as stock: no evidence
    assert len(repr(launch)) < 2000  # what a field that did not read held is gone


def test_a_region_that_is_no_uuid_is_malformed():
    """Issue 45 item 4's regression: on Airflow 3.4 the loop's one statement casts the region to
    uuid, so one pod whose region annotation was not a UUID failed that statement every loop on
    every scheduler (no pod created anywhere), the sweep's page and ``airflow fenced-k8s pods``."""
    launch = from_pod_metadata({**GOOD, REGION_ANNOTATION: "not-a-uuid"})
    assert launch.malformed == "region_id is not a UUID" and launch.task is None and launch.region == ""


def test_a_region_reads_canonical_and_the_sentinel_is_no_region():
    region = "6F1D2C3B-4A5E-4F60-8A7B-9C0D1E2F3A4B"
    assert from_pod_metadata({**GOOD, REGION_ANNOTATION: region}).task[4] == region.lower()
    assert from_pod_metadata({**GOOD, REGION_ANNOTATION: ""}).task == from_pod_metadata(GOOD).task
    # 3.4's sentinel region is the key of a task outside any region: read as one, its row is found
    nil = from_pod_metadata({**GOOD, REGION_ANNOTATION: "00000000-0000-0000-0000-000000000000"})
    assert nil.malformed is None and nil.task == from_pod_metadata(GOOD).task


def test_before_airflow_34_a_pod_naming_a_region_names_no_task():
    """Before 3.4 no row has a region: a pod naming one, read as (task, region), found no row and
    looked like a task that is gone, which the sweep deletes."""
    region = {REGION_ANNOTATION: "6f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b"}
    launch = from_pod_metadata({**GOOD, **region}, regions=False)
    assert launch.malformed.startswith("region_id ") and launch.task is None
    assert from_pod_metadata({**GOOD, REGION_ANNOTATION: "00000000-0000-0000-0000-000000000000"}, regions=False).task
    assert from_pod_metadata({**GOOD, **region}).task  # 3.4


def test_absent_fields_are_no_error():
    """What the executor leaves out: the token (a legacy launch), the creator, the deployment, the
    region, the map index (an unmapped task); and the provider's coordinates (the pod names no
    task). A pod without the TI id is not one of ours."""
    def without(*keys):
        return from_pod_metadata({k: v for k, v in GOOD.items() if k not in keys})

    assert without(TOKEN_ANNOTATION).legacy and without(TOKEN_ANNOTATION).malformed is None
    assert without(SCHEDULER_JOB_ANNOTATION, DEPLOYMENT_ANNOTATION).malformed is None
    assert without("map_index").task == ("d", "t", GOOD["run_id"], -1)
    assert without("run_id").task is None and without("run_id").malformed is None
    assert without(TRY_NUMBER_ANNOTATION).malformed.startswith("try_number ")  # the executor always writes it
    assert without(TI_ID_ANNOTATION) is None


@pytest.mark.parametrize("annotations", [None, {}, "x", ["a"], 3, {"dag_id": "d"}])
def test_annotations_that_are_not_ours_or_not_a_mapping_are_no_launch(annotations):
    assert from_pod_metadata(annotations) is None


def test_the_dynamic_clients_annotations_read_even_when_one_is_named_get():
    """The provider lists pods through the dynamic client, whose ResourceField answers ``.get``
    with an annotation of that name when there is one."""
    from kubernetes.dynamic.resource import ResourceField

    field = ResourceField({**GOOD, "get": "x", "keys": "y"})
    assert from_pod_metadata(field) == from_pod_metadata(GOOD)


def test_canonical_spellings():
    upper = {k: v.upper() if k in (TI_ID_ANNOTATION, TOKEN_ANNOTATION) else v for k, v in GOOD.items()}
    assert from_pod_metadata(upper) == from_pod_metadata(GOOD)
    assert from_pod_metadata({**GOOD, "map_index": "-2147483648"}).map_index == -(2**31)
    assert from_pod_metadata({**GOOD, SCHEDULER_JOB_ANNOTATION: str(2**63 - 1)}).creator == 2**63 - 1
    assert from_pod_metadata({**GOOD, "run_id": "r" * 250, "dag_id": "dåg 🐢"}).malformed is None


# Every field a fence reads, with values that read and values that do not: what a pod can say.
_UUIDS = st.uuids().map(str)
_HOSTILE = st.one_of(
    st.none(), st.integers(), st.floats(allow_nan=False), st.lists(st.text(max_size=3), max_size=2), st.booleans(),
    st.text(max_size=60), st.binary(max_size=40).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.sampled_from(["", HUGE, "\x00", "-1", str(2**31), str(2**63), "1e3", "0x10", "00000000-0000-0000-0000-000000000000",
                     "0b3a3d2c-7f4e-4c1a-9d2b-5e6f7a8b9c0", "{0b3a3d2c-7f4e-4c1a-9d2b-5e6f7a8b9c0d}"]),
    _UUIDS.map(lambda u: u + "\x00"),
)
_TASK_ID = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), min_size=1, max_size=250)
_READABLE = {
    TI_ID_ANNOTATION: _UUIDS, TOKEN_ANNOTATION: _UUIDS, TRY_NUMBER_ANNOTATION: st.integers(0, 2**31 - 1).map(str),
    SCHEDULER_JOB_ANNOTATION: st.integers(0, 2**63 - 1).map(str), "dag_id": _TASK_ID, "task_id": _TASK_ID,
    "run_id": _TASK_ID,
    "map_index": st.integers(-(2**31), 2**31 - 1).map(str), DEPLOYMENT_ANNOTATION: st.from_regex(
        r"\A[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z"), REGION_ANNOTATION: _UUIDS,
    SCHEDULER_STARTED_ANNOTATION: st.datetimes(timezones=st.timezones()).map(datetime.isoformat),
}
_ABSENT = object()
pod_annotations = st.fixed_dictionaries({key: st.one_of(readable, _HOSTILE, st.just(_ABSENT))
                                         for key, readable in _READABLE.items()}).map(
    lambda drawn: {k: v for k, v in drawn.items() if v is not _ABSENT})


def _reads(launch: LaunchIdentity) -> None:
    """Every field of a launch that is not malformed is in its canonical form."""
    uuids = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
    assert uuids.fullmatch(launch.ti_id)
    assert launch.token is None or uuids.fullmatch(launch.token)
    assert 0 <= launch.try_number < 2**31
    assert launch.scheduler_job_id is None or 0 <= launch.creator < 2**63
    for text in (launch.dag_id, launch.task_id, launch.run_id):
        assert text is None or (0 < len(text) <= 250 and "\x00" not in text and text.encode())
    assert -(2**31) <= launch.map_index < 2**31
    assert launch.deployment is None or re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", launch.deployment)
    assert launch.region == "" or (uuids.fullmatch(launch.region) and launch.region != "00000000-0000-0000-0000-000000000000")


@given(pod_annotations, st.booleans())
def test_whatever_a_pod_says_its_launch_reads_canonical_or_malformed(annotations, regions):
    launch = from_pod_metadata(annotations, regions=regions)
    if TI_ID_ANNOTATION not in annotations:
        assert launch is None
        return
    if launch.malformed:
        assert launch.task is None and launch.legacy
        assert not verdicts.should_delete(launch, None, launch.deployment, launched=HERE).act
    else:
        _reads(launch)
        assert not launch.region or regions
    assert launch.launcher is None or launch.launcher.started is None or (
        launch.launcher.job_id == launch.creator and launch.launcher.started.tzinfo is timezone.utc)


@given(st.fixed_dictionaries(_READABLE), st.booleans())
def test_what_the_executor_writes_reads_back_exactly(annotations, launcher):
    written = from_pod_metadata(annotations)
    assert written.malformed is None
    if not launcher:
        written = dataclasses.replace(written, launcher=None)
    assert from_pod_metadata({**written.annotations(), **{k: annotations[k] for k in ("dag_id", "task_id", "run_id",
                                                                                      "map_index")}}) == written
