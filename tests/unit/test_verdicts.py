"""The fencing decisions: exhaustive tables and properties over plain values."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fenced_k8s_executor.launch import LaunchIdentity, TaskRow
from fenced_k8s_executor.lineage import Provenance
from fenced_k8s_executor.verdicts import (
    Reason,
    Standing,
    is_stale,
    owned,
    releases_slot,
    should_adopt,
    should_create,
    should_delete,
    standing,
)

# Fixed uuids: they appear in the parametrized tests' ids, which must be the same in every process
# (each pytest-xdist worker collects the suite itself and the ids must match).
T1, T2 = (str(uuid.uuid5(uuid.NAMESPACE_URL, f"test_verdicts/{n}")) for n in ("T1", "T2"))
TI, TI2 = (str(uuid.uuid5(uuid.NAMESPACE_URL, f"test_verdicts/{n}")) for n in ("TI", "TI2"))
JOB = 7
HERE, THERE = "db-here", "db-there"
TASK = dict(dag_id="d", task_id="t", run_id="r", map_index=-1)


def launch(token=T1, try_number=1, ti_id=TI, deployment=HERE, **task):
    return LaunchIdentity(ti_id=ti_id, token=token, try_number=try_number, scheduler_job_id=str(JOB),
                          deployment=deployment, **{**TASK, **task})


def row(token=T1, state="queued", try_number=1, owner=JOB, ti_id=TI):
    return TaskRow(ti_id=ti_id, state=state, try_number=try_number, queued_by_job_id=owner,
                   external_executor_id=token, **TASK)


@pytest.mark.parametrize(
    "the_launch, the_row, expected",
    [
        (launch(), row(), Standing.CURRENT),
        (launch(), row(token=T2), Standing.SUPERSEDED),
        (launch(), None, Standing.TASK_GONE),
        (launch(token=None), row(), Standing.LEGACY_LAUNCH),
        (None, row(), Standing.LEGACY_LAUNCH),
        (launch(dag_id=None), row(), Standing.LEGACY_LAUNCH),  # a pod that names no task
        (launch(), row(token=None), Standing.LEGACY_ROW),
        (launch(), row(token="42"), Standing.LEGACY_ROW),  # stock executor wrote its job id
        (launch(token=T1.upper()), row(), Standing.CURRENT),  # canonical comparison
        # A clear of a RUNNING task: new row id, RESTARTING, token kept -> the same launch.
        (launch(), row(ti_id=TI2, state="restarting"), Standing.CURRENT),
        # The task reported its own retry: new row id, same try and token -> the same launch.
        (launch(), row(ti_id=TI2, state="up_for_retry"), Standing.CURRENT),
        # A clear of a queued task (new id, token wiped) is no evidence until it is re-queued.
        (launch(), row(ti_id=TI2, state=None, token=None), Standing.LEGACY_ROW),
        (launch(), row(ti_id=TI2, try_number=2, token=T2), Standing.SUPERSEDED),
    ],
)
def test_standing_table(the_launch, the_row, expected):
    assert standing(the_launch, the_row) is expected


@pytest.mark.parametrize(
    "the_row, create, stock, reason",
    [
        (row(), True, True, Reason.CURRENT),
        (None, False, False, Reason.TASK_GONE),
        (row(token=T2), False, True, Reason.SUPERSEDED),  # race a1: the stock check passes
        (row(state="scheduled"), False, False, Reason.NOT_QUEUED),
        (row(try_number=2), False, False, Reason.TRY_MISMATCH),
        (row(owner=JOB + 1), False, False, Reason.OTHER_SCHEDULER),
        (row(token=None), True, True, Reason.LEGACY),
        (row(token=T2, state="running"), False, False, Reason.SUPERSEDED),
        (row(ti_id=TI2), False, False, Reason.TI_ID_CHANGED),  # stock: the workload's id is gone
    ],
)
def test_should_create_table(the_row, create, stock, reason):
    verdict = should_create(launch(), the_row, JOB)
    assert (verdict.act, verdict.stock, verdict.reason) == (create, stock, reason)


def test_should_create_legacy_launch_is_the_stock_check():
    assert should_create(launch(token=None), row(token=T2), JOB).act is True
    assert should_create(launch(token=None), row(state="running"), JOB).act is False


def test_should_create_non_numeric_scheduler_skips_the_stock_check_like_the_provider():
    assert should_create(launch(), row(state="running"), None).act is True
    assert should_create(launch(), row(token=T2), None).act is False


@pytest.mark.parametrize(
    "the_launch, the_row, delete, reason",
    [
        (launch(), row(), False, Reason.CURRENT),
        (launch(), row(token=T2), True, Reason.SUPERSEDED),
        (launch(), None, True, Reason.TASK_GONE),
        (launch(token=None), None, False, Reason.LEGACY),
        (None, None, False, Reason.LEGACY),
        (launch(), row(token=None), False, Reason.LEGACY),
        (launch(), row(state="success"), False, Reason.CURRENT),
        (launch(), row(ti_id=TI2, state="up_for_retry"), False, Reason.CURRENT),  # still finishing
        (launch(deployment=THERE), row(token=T2), False, Reason.FOREIGN),
        (launch(deployment=THERE), None, False, Reason.FOREIGN),
        (launch(deployment=None), None, False, Reason.FOREIGN),  # unknown origin
    ],
)
def test_should_delete_table(the_launch, the_row, delete, reason):
    verdict = should_delete(the_launch, the_row, HERE, launched=Provenance.HERE)
    assert (verdict.act, verdict.stock, verdict.reason) == (delete, False, reason)


def test_swallowing_needs_no_ownership_but_deleting_does():
    assert is_stale(launch(deployment=THERE), row(token=T2)).act
    assert not should_delete(launch(deployment=THERE), row(token=T2), HERE, launched=Provenance.HERE).act
    assert not owned(launch(), None, Provenance.HERE)


@pytest.mark.parametrize(
    "the_launch, ti_token, adopt, reason",
    [
        (launch(), T1, True, Reason.CURRENT),
        (launch(), T2, False, Reason.SUPERSEDED),
        (launch(), None, True, Reason.LEGACY),
        (launch(), "12", True, Reason.LEGACY),
        (launch(token=None), T2, True, Reason.LEGACY),
        (None, T2, True, Reason.LEGACY),
    ],
)
def test_should_adopt_table(the_launch, ti_token, adopt, reason):
    verdict = should_adopt(the_launch, ti_token)
    assert (verdict.act, verdict.stock, verdict.reason) == (adopt, True, reason)


@pytest.mark.parametrize(
    "holder, the_launch, frees",
    [
        (None, launch(), True),  # nobody known holds the key: stock frees it
        (T1, launch(), True),  # the stale launch itself holds it
        (T2, launch(), False),  # a newer launch of the key is in flight here
        (T1, None, True),
        ("", launch(token=None), True),  # a legacy launch holds it and a legacy event ends it
        ("", launch(), False),  # a legacy launch holds it: a tokened event is another launch's
        (T1, launch(token=None), False),
    ],
)
def test_releases_slot_table(holder, the_launch, frees):
    assert releases_slot(holder, the_launch) is frees


tokens = st.one_of(st.none(), st.uuids().map(str), st.integers(0, 10**6).map(str), st.text(max_size=8))
states = st.sampled_from([None, "queued", "scheduled", "running", "restarting", "success", "failed", "up_for_retry"])
rows = st.one_of(
    st.none(),
    st.builds(
        TaskRow,
        ti_id=st.sampled_from([TI, TI2]),
        state=states,
        try_number=st.integers(0, 4),
        queued_by_job_id=st.one_of(st.none(), st.integers(0, 9)),
        external_executor_id=tokens,
        dag_id=st.just("d"),
        task_id=st.just("t"),
        run_id=st.just("r"),
    ),
)
launches = st.one_of(
    st.none(),
    st.builds(
        LaunchIdentity,
        ti_id=st.sampled_from([TI, TI2]),
        token=st.one_of(st.none(), st.uuids().map(str)),
        try_number=st.integers(0, 4),
        scheduler_job_id=st.just(str(JOB)),
        dag_id=st.one_of(st.none(), st.just("d")),
        task_id=st.just("t"),
        run_id=st.just("r"),
        deployment=st.sampled_from([None, HERE, THERE]),
    ),
)


@given(launches, rows)
def test_delete_only_on_positive_evidence(the_launch, the_row):
    verdict = should_delete(the_launch, the_row, HERE, launched=Provenance.HERE)
    if verdict.act:
        assert the_launch is not None and the_launch.token is not None
        assert the_launch.deployment == HERE
        assert the_row is None or (the_row.token is not None and the_row.token != the_launch.token)


@given(launches, rows)
def test_the_current_launch_is_never_deleted_or_swallowed_whatever_its_row_id(the_launch, the_row):
    if the_launch is not None and the_row is not None and the_row.token == the_launch.token:
        assert not should_delete(the_launch, the_row, HERE, launched=Provenance.HERE).act
        assert not is_stale(the_launch, the_row).act


@given(launches, rows)
def test_legacy_is_never_fenced(the_launch, the_row):
    legacy = the_launch is None or the_launch.token is None or (the_row is not None and the_row.token is None)
    if legacy:
        assert not should_delete(the_launch, the_row, HERE, launched=Provenance.HERE).act
        assert not is_stale(the_launch, the_row).act


@given(launches, rows)
def test_other_deployments_pods_are_never_deleted(the_launch, the_row):
    if the_launch is None or the_launch.deployment != HERE:
        assert not should_delete(the_launch, the_row, HERE, launched=Provenance.HERE).act


@given(launches.filter(lambda launch: launch is not None), rows, st.one_of(st.none(), st.integers(0, 9)))
def test_fenced_creation_never_creates_what_stock_would_not(the_launch, the_row, job):
    verdict = should_create(the_launch, the_row, job)
    assert not (verdict.act and not verdict.stock)
    if verdict.stock and not verdict.act:
        assert verdict.reason is Reason.SUPERSEDED
