"""Which database launched a pod: ``lineage`` (the witness's verdicts), ``verdicts.owned`` and
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
from fenced_k8s_executor.lineage import Entry, JobRow, Provenance, View, judge, moved, posting, provenance
from fenced_k8s_executor.verdicts import (
    Reason,
    hidden_from_provider,
    host_unresolved,
    names_host,
    owned,
    should_delete,
)

HERE, THERE, OLD = "db-here", "db-there", "db-old"
T1, T2 = str(uuid.uuid4()), str(uuid.uuid4())
START = datetime(2026, 12, 5, 8, 0, tzinfo=timezone.utc)
NOW = START + timedelta(hours=1)
BEAT = NOW - timedelta(seconds=3)  # a live scheduler's heartbeat
OLD_BEAT = NOW - timedelta(minutes=5)  # a dead one's
ALIVE = timedelta(seconds=30)
ME = Launcher(9, START + timedelta(minutes=50))
LAUNCHER = Launcher(7, START)


def launch(launcher=LAUNCHER, deployment=HERE, token=T1):
    return LaunchIdentity(ti_id=str(uuid.uuid4()), token=token, try_number=1, scheduler_job_id="7",
                          dag_id="d", task_id="t", run_id="r", deployment=deployment, launcher=launcher)


def entry(job_id=7, started=START, heartbeat=BEAT):
    return Entry(job_id, started, heartbeat, "host")


def rows(**by_job):
    """This database's job rows: ``j7=(started, heartbeat)``."""
    return {int(k[1:]): JobRow(*v) for k, v in by_job.items()}


def seen_live(posted):
    """The live entries at ``NOW`` (``lineage.posting``)."""
    return posting(posted, NOW, ALIVE)


def judged(posted, held, here=(), me=ME, live=None, copied_before=None):
    return judge(posted, held, here, me, seen_live(posted) if live is None else live, copied_before)


QUIET = View(renewed=True, here=frozenset({ME.job_id}))


# --- one reading of the witness --------------------------------------------------------------------

@pytest.mark.parametrize("posted, held, here, expect", [
    # a live peer of this database not yet seen writing here: cannot be judged yet (a copy taken
    # between two heartbeats reads exactly like this)
    ([entry()], rows(j7=(START, BEAT)), (), "unproven"),
    ([entry()], rows(j7=(START, BEAT + timedelta(seconds=1))), (), "unproven"),  # not seen *moving*
    ([entry()], rows(j7=(START, BEAT)), {7}, "ready"),  # seen moving: writes here
    ([entry(heartbeat=OLD_BEAT)], rows(j7=(START, OLD_BEAT)), (), "ready"),  # a dead scheduler of ours
    # ahead of this database's row: a scheduler it inherited went on writing elsewhere: a copy
    ([entry()], rows(j7=(START, BEAT - timedelta(seconds=5))), (), "copy, collision"),
    ([entry(heartbeat=OLD_BEAT)], rows(j7=(START, OLD_BEAT - timedelta(seconds=5))), (), "copy"),  # now dead
    ([entry()], rows(j7=(START, BEAT - timedelta(seconds=5))), {7}, "ready"),  # writes here: a lost write
    # airflow-core writes a job's first heartbeat a moment before its start: copied right then
    ([entry()], rows(j7=(START, START - timedelta(microseconds=700))), (), "copy, collision"),
    # a job this database does not hold (or holds with another start): another database's
    ([entry()], {}, (), "collision"),
    ([entry()], rows(j7=(START + timedelta(seconds=1), BEAT)), (), "collision"),  # job ids repeat
    ([entry(heartbeat=OLD_BEAT)], {}, (), "ready"),  # a dead one's: its pods cost themselves alone
    ([entry(job_id=ME.job_id, started=ME.started)], {}, (), "ready"),  # this scheduler itself
    ([], {}, (), "ready"),
])
def test_a_reading_of_the_witness(posted, held, here, expect):
    view = judged(posted, held, here)
    said = {"unproven": bool(view.unproven), "copy": view.copied_at is not None, "collision": view.collision}
    assert {k for k, v in said.items() if v} == ({*expect.split(", ")} - {"ready"})
    assert view.ready is ("unproven" not in expect)


def test_a_copy_is_dated_by_the_last_heartbeat_it_holds_of_a_scheduler_that_went_on():
    view = judged([entry(), entry(job_id=8, heartbeat=BEAT)], rows(j7=(START, NOW - timedelta(minutes=9)),
                                                                    j8=(START, NOW - timedelta(minutes=2))))
    assert view.copied_at == NOW - timedelta(minutes=2)


def test_a_scheduler_the_copy_inherited_is_never_its_own_though_its_first_heartbeat_precedes_its_start():
    """Found on the real apiserver: a copy taken before the original's first heartbeat after its start
    held a heartbeat 0.7 ms older than the start, dated itself before that start, and took the
    original's pods for a dead scheduler's of its own."""
    held = rows(j7=(START, START - timedelta(microseconds=700)))
    view = judged([entry(heartbeat=OLD_BEAT)], held)  # the original stopped since
    assert provenance(LAUNCHER, held[7], view) is Provenance.ELSEWHERE


def test_a_scheduler_that_stopped_posting_is_no_live_one_to_wait_for():
    """A killed scheduler's entry keeps its last heartbeat, fresh for airflow-core's threshold; it
    stops posting at once: three of its renewal intervals later it is dead, and its pods are a dead
    scheduler's of this database (a restart's first loops judge them)."""
    posting_ = Entry(7, START, BEAT, "host", NOW - timedelta(seconds=2), 1.0)
    killed = Entry(7, START, BEAT, "host", NOW - timedelta(seconds=4), 1.0)
    held = rows(j7=(START, BEAT))
    assert judged([posting_], held).unproven == (posting_,)
    assert judged([killed], held).quiet
    stopped = Entry(7, START, BEAT, "host", NOW, 1.0, stopped=True)  # ended cleanly: no one to wait for
    assert judged([stopped], held).quiet
    # ... and still the original's last word to a copy taken before it
    assert judged([stopped], rows(j7=(START, BEAT - timedelta(seconds=1)))).copied_at


def test_a_scheduler_that_writes_here_without_posting_is_never_taken_for_dead():
    """Issue 59: the original's Lease writes refused (API Priority and Fairness, a webhook, a Role
    edited after start) since before the copy, it heartbeats on in its own database: the copy holds
    a row of that job ahead of its last post. Read as a dead scheduler of the copy once the post was
    old enough, its three running pods were deleted. Behind its row by more than its posting lag,
    it is mute: never dead, and its pods, alone, are never judged while it stays so."""
    post = Entry(7, START, BEAT - timedelta(seconds=60), "host", NOW - timedelta(seconds=60), 5.0)
    held = rows(j7=(START, BEAT))  # it heartbeat here (or in the original) a minute after its last post
    view = judge([post], held, (), ME, frozenset())  # unchanged for long: no post seen lately
    assert view.mute == (post,) and view.in_doubt(LAUNCHER)
    assert provenance(LAUNCHER, held[7], view) is Provenance.UNSETTLED
    # ... its pods alone: another dead scheduler's are judged as ever
    other = Launcher(8, START)
    assert not view.in_doubt(other) and provenance(other, JobRow(START, None), view) is Provenance.HERE
    # killed between a heartbeat and its next post: behind by its ordinary lag, a dead scheduler
    lag = Entry(7, START, BEAT - timedelta(seconds=10), "host", NOW - timedelta(seconds=60), 5.0)
    assert judge([lag], held, (), ME, frozenset()).quiet
    assert provenance(LAUNCHER, held[7], judge([lag], held, (), ME, frozenset())) is Provenance.HERE
    # seen writing here: one of this database's, whatever its posts
    assert provenance(LAUNCHER, held[7], judge([post], held, {7}, ME, frozenset())) is Provenance.HERE


def test_a_copy_stays_one_whatever_the_lease_holds_now():
    """Issue 59: a Lease deleted by hand while a copy ran: the copy made it again with its own entry
    alone, recomputed its copy's date from that reading (none) and deleted production's pods."""
    copied = START + timedelta(minutes=30)
    view = judge([], {}, (), ME, frozenset(), copied_before=copied)
    assert view.copied_at == copied
    assert provenance(LAUNCHER, JobRow(START, None), view) is Provenance.ELSEWHERE
    later = judge([entry()], rows(j7=(START, START + timedelta(minutes=40))), (), ME, frozenset(), copied)
    assert later.copied_at == START + timedelta(minutes=40)  # a later date learned: the latest holds


def test_a_job_writes_here_once_its_heartbeat_is_seen_moving():
    before = rows(j7=(START, BEAT), j8=(START, BEAT))
    after = rows(j7=(START, BEAT + timedelta(seconds=5)), j8=(START, BEAT), j9=(START, BEAT))
    assert moved(before, after) == {7}
    assert moved(before, rows(j7=(START + timedelta(1), NOW))) == set()  # another process under that id


# --- which database launched a pod -----------------------------------------------------------------

COPY = View(renewed=True, here=frozenset({ME.job_id}), copied_at=START + timedelta(minutes=30))
COLLIDING = View(renewed=True, here=frozenset({ME.job_id, 8}), rivals=(entry(job_id=3),))
UNSETTLED = View(renewed=True, here=frozenset({ME.job_id}), unproven=(entry(),))


@pytest.mark.parametrize("launcher, row, view, expected", [
    (LAUNCHER, JobRow(START, None), QUIET, Provenance.HERE),  # a dead scheduler of this database
    (LAUNCHER, JobRow(START, None), View(), Provenance.UNSETTLED),  # not renewed yet
    (LAUNCHER, JobRow(START, None), UNSETTLED, Provenance.UNSETTLED),
    (LAUNCHER, JobRow(START, None), COLLIDING, Provenance.UNSETTLED),  # another DB posts: fail safe
    (Launcher(8, START), JobRow(START, None), COLLIDING, Provenance.HERE),  # seen writing here
    (ME, JobRow(ME.started, None), View(here=frozenset({ME.job_id})), Provenance.HERE),  # this process's own
    (LAUNCHER, JobRow(START, None), COPY, Provenance.ELSEWHERE),  # inherited from the original
    (Launcher(7, START + timedelta(minutes=40)), JobRow(START + timedelta(minutes=40), None), COPY,
     Provenance.HERE),  # the copy's own scheduler, dead since
    (LAUNCHER, None, QUIET, Provenance.ELSEWHERE),  # no such job here
    (LAUNCHER, JobRow(START + timedelta(seconds=1), None), QUIET, Provenance.ELSEWHERE),  # same id, another process
    (Launcher(7, None), JobRow(START, None), QUIET, Provenance.ELSEWHERE),  # a stamp that does not read
    (None, None, QUIET, Provenance.HERE),  # a pod of 0.2: as this database's old jobs
    (None, None, UNSETTLED, Provenance.UNSETTLED),
    (None, None, COPY, Provenance.ELSEWHERE),
])
def test_provenance_table(launcher, row, view, expected):
    assert provenance(launcher, row, view) is expected


@pytest.mark.parametrize("launched, deployment, expected", [
    (Provenance.HERE, HERE, True),
    (Provenance.UNSETTLED, HERE, False),
    (Provenance.ELSEWHERE, HERE, False),
    (Provenance.HERE, THERE, False),  # another deployment's stamp
    (Provenance.HERE, None, False),
])
def test_owned_table(launched, deployment, expected):
    assert owned(launch(deployment=deployment), HERE, launched) is expected
    assert owned(launch(deployment=deployment), None, launched) is False  # no id of ours yet: nothing is ours


@pytest.mark.parametrize("the_launch, launched, ready, hidden", [
    (launch(deployment=OLD), Provenance.HERE, True, False),  # our id changed: this DB launched it
    (launch(deployment=OLD, launcher=None), Provenance.UNSETTLED, True, True),  # stamped elsewhere
    (launch(deployment=THERE, launcher=None), Provenance.HERE, True, True),  # 0.2's pod of another deployment
    (launch(deployment=THERE), Provenance.ELSEWHERE, True, True),
    (launch(), Provenance.HERE, True, False),
    (launch(), Provenance.ELSEWHERE, True, True),  # another database's, same id (a copy's rows name it too)
    (launch(), Provenance.UNSETTLED, True, False),  # a collision: no evidence about this pod, stock's listing
    (launch(), Provenance.UNSETTLED, False, True),  # the witness cannot judge yet: nothing in doubt
    (launch(token=None, launcher=None), Provenance.UNSETTLED, True, False),
    (None, Provenance.UNSETTLED, False, False),  # no identity at all: stock's
])
def test_hidden_from_provider_table(the_launch, launched, ready, hidden):
    assert hidden_from_provider(the_launch, frozenset({HERE}), launched, ready) is hidden


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
    verdict = should_delete(launch(), row(hostname), HERE, pod, Provenance.HERE)
    assert verdict.act is not names
    assert verdict.reason is (Reason.RUNS_THE_TASK if names else Reason.SUPERSEDED)


instants = st.sampled_from([START - timedelta(microseconds=700), START, START + timedelta(minutes=30), BEAT, OLD_BEAT,
                            NOW])
job_rows = st.builds(JobRow, st.sampled_from([START, START + timedelta(seconds=1), None]), st.none() | instants)
posts = st.lists(st.builds(Entry, st.integers(1, 9), st.sampled_from([START, START + timedelta(seconds=1)]), instants),
                 max_size=4)
held = st.dictionaries(st.integers(1, 9), job_rows, max_size=6)


@given(posts, held, st.sets(st.integers(1, 9)), st.sampled_from([None, ME]), st.none() | st.builds(
    Launcher, st.integers(1, 9), st.sampled_from([START, START + timedelta(seconds=1), None])))
def test_what_a_reading_never_lets_through(posted, held_rows, here, me, launcher):
    view = judged(posted, held_rows, here, me)
    found = provenance(launcher, held_rows.get(launcher.job_id) if launcher else None, view)
    if found is Provenance.HERE and launcher is not None:
        # a job of this database, and either seen writing here or judged while nothing is in doubt
        assert held_rows[launcher.job_id].started == launcher.started
        assert launcher.job_id in view.here or view.quiet
        assert view.copied_at is None or launcher.started > view.copied_at or launcher.job_id in view.here
    for rival in view.rivals:  # a rival is never a scheduler seen writing here
        row = held_rows.get(rival.job_id)
        assert row is None or row.started != rival.started or rival.job_id not in view.here
    if launcher is not None and view.in_doubt(launcher):  # wrote without posting: never judged
        assert found is not Provenance.HERE
    if view.unproven:  # in doubt: only what this process or a scheduler seen writing here launched
        assert found is not Provenance.HERE or launcher.job_id in view.here
    for entry_ in posted:  # a scheduler seen going on elsewhere: its pods are never this database's
        row = held_rows.get(entry_.job_id)
        if (row is not None and row.started == entry_.started and entry_.job_id not in view.here
                and (me is None or entry_.launcher != me) and (row.heartbeat is None or row.heartbeat < entry_.heartbeat)):
            assert provenance(entry_.launcher, row, view) is not Provenance.HERE


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
