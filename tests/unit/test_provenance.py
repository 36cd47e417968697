"""Did this database launch the pod? ``verdicts.provenance``, ``owned``, ``collision_evidence``,
``hidden_from_provider``, the host rule by address, and the SQLSTATE classification: tables and
properties over plain values."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fenced_k8s_executor import sqlstate
from fenced_k8s_executor.launch import Launcher, LaunchIdentity, TaskRow
from fenced_k8s_executor.verdicts import (
    JobFact,
    Provenance,
    Reason,
    collision_evidence,
    hidden_from_provider,
    host_unresolved,
    names_host,
    owned,
    provenance,
    should_delete,
)

HERE, THERE, OLD = "db-here", "db-there", "db-old"
T1, T2 = str(uuid.uuid4()), str(uuid.uuid4())
START = datetime(2026, 12, 5, 8, 0, tzinfo=timezone.utc)
BEAT = START + timedelta(minutes=30)
LAUNCHER = Launcher(7, START, BEAT)


def launch(launcher=LAUNCHER, deployment=HERE, token=T1):
    return LaunchIdentity(ti_id=str(uuid.uuid4()), token=token, try_number=1, scheduler_job_id="7",
                          dag_id="d", task_id="t", run_id="r", deployment=deployment, launcher=launcher)


def job(started=START, heartbeat=BEAT, alive=True):
    return JobFact(started, heartbeat, alive)


@pytest.mark.parametrize("the_launcher, the_job, expected", [
    (LAUNCHER, job(), Provenance.HERE),
    (LAUNCHER, job(heartbeat=BEAT + timedelta(seconds=5)), Provenance.HERE),  # it heartbeat since
    (LAUNCHER, job(heartbeat=BEAT - timedelta(microseconds=1)), Provenance.NOT_SEEN),  # a copy stopped before
    (LAUNCHER, job(heartbeat=None), Provenance.NOT_SEEN),
    (LAUNCHER, job(started=START + timedelta(seconds=1)), Provenance.OTHER_JOB),  # another process, same id
    (LAUNCHER, None, Provenance.UNKNOWN_JOB),
    (None, job(), Provenance.UNSTAMPED),
    (None, None, Provenance.UNSTAMPED),
])
def test_provenance_table(the_launcher, the_job, expected):
    assert provenance(the_launcher, the_job) is expected


@pytest.mark.parametrize("the_launch, the_job, collision, expected", [
    (launch(), job(), False, True),
    (launch(), job(alive=False), False, True),  # a dead scheduler's pods: the sweep's backstop
    (launch(), job(alive=False), True, False),  # ... not while another database launches under the id
    (launch(), job(), True, True),  # a live scheduler of this database: still fenced
    (launch(launcher=None), None, False, True),  # builds before 0.3.0: the stamp alone, as then
    (launch(launcher=None), None, True, False),
    (launch(), job(heartbeat=BEAT - timedelta(seconds=1)), False, False),
    (launch(), job(started=START - timedelta(days=1)), False, False),
    (launch(), None, False, False),
    (launch(deployment=THERE), job(), False, False),  # another deployment's stamp
    (launch(deployment=None), job(), False, False),
    (None, None, False, False),
])
def test_owned_table(the_launch, the_job, collision, expected):
    assert owned(the_launch, HERE, the_job, collision) is expected
    assert owned(the_launch, None, the_job, collision) is False  # no id of ours yet: nothing is ours


@pytest.mark.parametrize("the_launch, the_job, last, evidence", [
    (launch(), job(started=START + timedelta(seconds=1)), 7, "started at another time"),
    (launch(), job(heartbeat=BEAT - timedelta(seconds=1), alive=False), 7, "stopped here before"),
    (launch(), job(heartbeat=BEAT - timedelta(seconds=1), alive=True), 7, None),  # a failover lost a write
    (launch(launcher=Launcher(9, START, BEAT)), None, 8, "beyond this database's jobs"),
    (launch(launcher=Launcher(7, START, BEAT)), None, 8, None),  # purged by airflow db clean: no evidence
    (launch(launcher=Launcher(9, START, BEAT)), None, None, None),
    (launch(), job(), 7, None),
    (launch(launcher=None), None, 7, None),
    (launch(deployment=THERE), job(started=START + timedelta(seconds=1)), 7, None),  # not our id's business
])
def test_collision_evidence_table(the_launch, the_job, last, evidence):
    found = collision_evidence(the_launch, HERE, the_job, last)
    assert (found is None) if evidence is None else (evidence in found)


@pytest.mark.parametrize("the_launch, the_job, collision, adopting, hidden", [
    (launch(deployment=OLD), job(), False, None, False),  # our id changed: this DB launched it
    (launch(deployment=OLD, launcher=None), None, False, T1, False),  # 0.2 pod, the very launch adopted
    (launch(deployment=OLD, launcher=None), None, False, T2, True),  # stamped elsewhere, nothing links it
    (launch(deployment=OLD, launcher=None), None, False, None, True),
    (launch(deployment=THERE), None, False, None, True),
    (launch(deployment=THERE), job(started=START + timedelta(1)), False, None, True),
    (launch(), job(), False, None, False),
    (launch(), job(started=START + timedelta(seconds=1)), False, None, False),  # no collision raised
    (launch(), job(started=START + timedelta(seconds=1)), True, None, True),  # another DB's, same id
    (launch(), job(heartbeat=BEAT - timedelta(1), alive=False), True, None, True),
    (launch(launcher=None), None, True, None, False),  # no evidence either way: stock's listing
    (launch(token=None, launcher=None), None, False, None, False),
    (None, None, True, None, False),
])
def test_hidden_from_provider_table(the_launch, the_job, collision, adopting, hidden):
    assert hidden_from_provider(the_launch, frozenset({HERE}), HERE, the_job, collision, 7, adopting) is hidden


def row(hostname):
    return TaskRow(ti_id=str(uuid.uuid4()), state="queued", try_number=2, queued_by_job_id=7,
                   external_executor_id=T2, dag_id="d", task_id="t", run_id="r", hostname=hostname)


@pytest.mark.parametrize("hostname, pod, names, unresolved", [
    ("pod-a", ("pod-a",), True, False),
    ("pod-a.ns.svc.cluster.local", ("pod-a",), True, False),  # getfqdn in a pod
    ("10.244.0.17", ("pod-a",), False, True),  # get_host_ip_address: a read of the pod tells
    ("10.244.0.17", ("pod-a", "10.244.0.17"), True, False),
    ("10.244.0.17", ("pod-a", "10.244.0.18"), False, True),
    ("fd00::17", ("pod-a", "fd00::17"), True, False),
    (None, ("pod-a",), False, False),  # never ran: nothing to resolve
    ("", ("pod-a",), False, False),
])
def test_the_host_rule_by_address(hostname, pod, names, unresolved):
    assert names_host(row(hostname), pod) is names
    assert host_unresolved(row(hostname), pod) is unresolved
    verdict = should_delete(launch(), row(hostname), HERE, pod, job())
    assert verdict.act is not names
    assert verdict.reason is (Reason.RUNS_THE_TASK if names else Reason.SUPERSEDED)


launchers = st.builds(Launcher, st.integers(1, 20), st.sampled_from([START, START + timedelta(seconds=1)]),
                      st.sampled_from([BEAT, BEAT + timedelta(seconds=1)]))
facts = st.none() | st.builds(JobFact, st.sampled_from([START, START + timedelta(seconds=1), None]),
                              st.sampled_from([BEAT, BEAT + timedelta(seconds=1), None]), st.booleans())
launches = st.none() | st.builds(launch, launcher=st.none() | launchers,
                                 deployment=st.sampled_from([HERE, THERE, OLD, None]),
                                 token=st.sampled_from([T1, T2, None]))


@given(launches, facts, st.booleans(), st.none() | st.integers(0, 20), st.sampled_from([None, T1, T2]))
def test_ownership_properties(the_launch, the_job, collision, last, adopting):
    is_owned = owned(the_launch, HERE, the_job, collision)
    evidence = collision_evidence(the_launch, HERE, the_job, last)
    found = provenance(the_launch.launcher if the_launch is not None else None, the_job)
    if is_owned:  # only this deployment's stamp, and never against evidence or the launcher's row
        assert the_launch.deployment == HERE and evidence is None
        assert found in (Provenance.HERE, Provenance.UNSTAMPED)
        if collision:
            assert found is Provenance.HERE and the_job.alive
    if evidence is not None:  # evidence is never about a pod this database launched
        assert found is not Provenance.HERE and not is_owned
    if found is Provenance.HERE:  # this database launched it: never hidden from adoption
        assert not hidden_from_provider(the_launch, frozenset({HERE}), HERE, the_job, collision, last, adopting)


@pytest.mark.parametrize("code, transient", [
    ("08006", True), ("08001", True), ("57P01", True), ("57P03", True), ("57014", True), ("53300", True),
    ("40001", True), ("40P01", True),
    ("0A000", False), ("42501", False), ("42P01", False), ("XX000", False), ("22P02", False), ("57P04", False),
])
def test_sqlstate_classes(code, transient):
    class DriverError(Exception):
        sqlstate = code

    assert sqlstate.transient(DriverError("x")) is transient
    assert code in sqlstate.describe(DriverError("the server's line\nmore"))


def test_a_socket_error_without_sqlstate_is_transient_and_a_bare_error_is_not():
    class OperationalError(Exception):
        pass

    class NotSupportedError(Exception):
        pass

    assert sqlstate.transient(OperationalError("server closed the connection unexpectedly"))
    assert not sqlstate.transient(NotSupportedError("feature not supported"))


def test_sqlalchemy_wrapped_driver_errors_are_classified_by_the_driver_error():
    import psycopg.errors
    import sqlalchemy.exc

    refused = sqlalchemy.exc.NotSupportedError("SELECT 1", {}, psycopg.errors.FeatureNotSupported("no"))
    dropped = sqlalchemy.exc.OperationalError("SELECT 1", {}, psycopg.errors.AdminShutdown("bye"))
    assert not sqlstate.transient(refused) and sqlstate.of(refused) == "0A000"
    assert sqlstate.transient(dropped) and sqlstate.of(dropped) == "57P01"
