"""``Launchers``: what it reads, when it reads again, and how long a collision stays raised."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from fenced_k8s_executor import launchers as launchers_module
from fenced_k8s_executor.launch import Launcher, LaunchIdentity
from fenced_k8s_executor.launchers import HOLD, Launchers
from fenced_k8s_executor.verdicts import JobFact

START = datetime(2026, 12, 5, 8, 0, tzinfo=timezone.utc)


class Jobs:
    """The job table as a dict; counts the reads."""

    def __init__(self):
        self.rows: dict[int, JobFact] = {}
        self.reads: list[set[int]] = []

    def read(self, ids):
        self.reads.append(set(ids))
        return {i: self.rows[i] for i in ids if i in self.rows}, max(self.rows, default=None)


class Clock:
    now = 1000.0

    def __call__(self):
        return self.now


def pod(job_id=7, beat=START, deployment="db-here"):
    return LaunchIdentity(ti_id=str(uuid.uuid4()), token=str(uuid.uuid4()), try_number=1, dag_id="d", task_id="t",
                          run_id="r", deployment=deployment, launcher=Launcher(job_id, START, beat))


@pytest.fixture
def world():
    jobs, clock = Jobs(), Clock()
    return jobs, clock, Launchers(read=jobs.read, clock=clock)


def test_rows_are_read_once_and_again_only_when_a_pod_names_a_later_heartbeat(world):
    jobs, clock, book = world
    jobs.rows[7] = JobFact(START, START + timedelta(seconds=5), True)
    assert book.owned(pod(beat=START), "db-here")
    assert book.owned(pod(beat=START + timedelta(seconds=5)), "db-here")
    assert len(jobs.reads) == 1  # cached: the row had seen both heartbeats
    jobs.rows[7] = JobFact(START, START + timedelta(seconds=10), True)
    assert book.owned(pod(beat=START + timedelta(seconds=10)), "db-here")  # behind: read again
    assert len(jobs.reads) == 2


def test_a_copy_that_never_saw_the_heartbeat_raises_a_collision_for_hold_seconds(world):
    jobs, clock, book = world
    jobs.rows[7] = JobFact(START, START + timedelta(seconds=5), False)  # stopped here at +5 s
    later = pod(beat=START + timedelta(minutes=3))
    assert not book.owned(later, "db-here")
    assert book.collision
    clock.now += HOLD - 1
    assert book.collision
    clock.now += 2
    assert not book.collision


def test_a_failover_that_lost_a_heartbeat_is_no_evidence(world):
    jobs, clock, book = world
    jobs.rows[7] = JobFact(START, START + timedelta(seconds=5), True)  # alive here, one write behind
    assert not book.owned(pod(beat=START + timedelta(seconds=10)), "db-here")  # not yet: nothing deleted
    assert not book.collision
    jobs.rows[7] = JobFact(START, START + timedelta(seconds=15), True)  # it heartbeats on the new primary
    assert book.owned(pod(beat=START + timedelta(seconds=10)), "db-here")


def test_survey_checks_every_pod_with_one_read(world):
    jobs, clock, book = world
    jobs.rows[7] = JobFact(START, START + timedelta(seconds=5), True)
    found = book.survey([("a", pod()), ("b", pod(job_id=99)), ("c", None), ("d", pod(job_id=5))], "db-here")
    assert found == 1 and book.collision  # job 99 is beyond this database's jobs (7); 5 was purged
    assert jobs.reads == [{7, 5, 99}]


def test_own_reads_this_schedulers_row_once_per_interval(world):
    jobs, clock, book = world
    jobs.rows[7] = JobFact(START, START + timedelta(seconds=5), True)
    assert book.own(7, max_age=5) == Launcher(7, START, START + timedelta(seconds=5))
    jobs.rows[7] = JobFact(START, START + timedelta(seconds=10), True)
    assert book.own(7, max_age=5).heartbeat == START + timedelta(seconds=5)  # cached
    clock.now += 6
    assert book.own(7, max_age=5).heartbeat == START + timedelta(seconds=10)
    assert book.own(None, max_age=5) is None


def test_a_db_error_is_raised_to_the_caller(world):
    jobs, clock, book = world

    def broken(ids):
        raise ConnectionError("db down")

    book = Launchers(read=broken, clock=clock)
    with pytest.raises(ConnectionError):
        book.owned(pod(), "db-here")


def test_the_collision_line_names_the_pod_and_the_option_and_holds_no_token(world, caplog):
    jobs, clock, book = world
    jobs.rows[7] = JobFact(START + timedelta(seconds=1), START, True)
    the_pod = pod()
    assert not book.owned(the_pod, "db-here", pod="ns/pod-1")
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "ns/pod-1" in line and "deployment_id" in line and the_pod.token not in line
    book.owned(pod(), "db-here", pod="ns/pod-2")  # the same evidence again: logged once per HOLD
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 1
    assert launchers_module.HOLD == HOLD
