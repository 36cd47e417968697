"""The witness's own format: the Lease's name for any deployment id, one annotation per scheduler
process, and entries read back exactly or not at all (the Lease is written by every scheduler of
every database sharing the id: what does not read is no evidence). The Lease itself runs against a
real kube-apiserver and the emulator in tests/integration/test_witness.py."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from fenced_k8s_executor.launch import Launcher
from fenced_k8s_executor.lineage import Entry, View
from fenced_k8s_executor.witness import collision_line, entries, entry_key, entry_value, lease_name

DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
ANNOTATION_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
times = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.timezones())


@given(st.from_regex(r"\A[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z"))
def test_any_deployment_id_names_a_valid_lease(deployment):
    name = lease_name(deployment)
    assert DNS_SUBDOMAIN.fullmatch(name) and len(name) <= 253
    assert name == lease_name(deployment) != lease_name(deployment + "x")


@given(st.integers(0, 2**63 - 1), times, times, st.text(max_size=300), st.none() | times,
       st.floats(0, 3600, allow_nan=False), st.booleans())
def test_an_entry_reads_back_exactly(job_id, started, heartbeat, host, renewed, every, stopped):
    key = entry_key(Launcher(job_id, started))
    prefix, _, name = key.partition("/")
    assert prefix == "fenced-k8s-executor.io" and ANNOTATION_NAME.fullmatch(name)
    (read,) = entries({key: entry_value(heartbeat, host, renewed, every, stopped), "unrelated": "x"})
    utc = timezone.utc
    assert read == Entry(job_id, started.astimezone(utc), heartbeat.astimezone(utc), host[:253],
                         renewed.astimezone(utc) if renewed else None, every if renewed else 0.0, stopped)
    assert read.launcher == Launcher(job_id, started.astimezone(timezone.utc))


@given(st.dictionaries(st.one_of(st.text(max_size=60), st.just("fenced-k8s-executor.io/job.7.1"),
                                 st.from_regex(r"\Afenced-k8s-executor\.io/job\.[0-9x]{1,20}\.[0-9-]{1,20}\Z")),
                       st.one_of(st.text(max_size=80), st.just('{"heartbeat": "2026-12-05T08:00:00"}'),
                                 st.just('{"heartbeat": "2026-12-05T08:00:00+00:00"}'), st.just('[]'))))
def test_what_does_not_read_is_not_an_entry(annotations):
    for found in entries(annotations):
        assert found.heartbeat.utcoffset() == timedelta(0) and found.started.utcoffset() == timedelta(0)
        assert found.job_id >= 0


def test_a_naive_heartbeat_is_no_entry():
    key = entry_key(Launcher(7, datetime(2026, 12, 5, tzinfo=timezone.utc)))
    assert entries({key: json.dumps({"heartbeat": "2026-12-05T08:00:00"})}) == []


def test_the_collision_line_names_both_sides_and_what_to_do():
    start = datetime(2026, 12, 5, 8, tzinfo=timezone.utc)
    view = View(renewed=True, rivals=(Entry(12, start, start, "staging-scheduler-0"),),
                peers=(Entry(51, start, start, "prod-scheduler-1"),), copied_at=None)
    line = collision_line(view, "db-prod", "airflow/fenced-k8s-witness-x", Launcher(50, start))
    assert "job 12 started 2026-12-05T08:00:00+00:00 on staging-scheduler-0" in line
    assert "job 50 started" in line and "(this one)" in line and "job 51" in line
    assert "deployment_id" in line and "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__DEPLOYMENT_ID" in line
    assert "point-in-time restore" in line and "airflow fenced-k8s pods" in line
