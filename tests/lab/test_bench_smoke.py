"""`fenced-k8s-repro bench --smoke` end to end on the emulator (about a minute on a quiet 2-core
machine, several on a loaded one): every scenario runs at tiny sizes
and writes its keys; the fenced pre-creation check and the per-loop in-flight reconcile are one DB
statement each; the sweep's calls are O(pages). Counts and shapes only; no timing is asserted
(ratios at these sizes and on a shared machine mean nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.lab

KEYS = ("queue_time_ratio", "precreate_round_trips_per_batch", "precreate_wall_ratio", "launch_throughput_ratio",
        "sweep_seconds", "sync_p50_ratio", "sync_p99_ratio", "loop_statements_per_sync", "ratio_spreads", "machine",
        "raw", "targets", "sync_statements_per_sync", "sync_api_calls_per_sync", "sweep_peak_bytes", "orphans",
        "startup_seconds")


def _smoke(tmp_path, *args: str, timeout: float = 600) -> tuple[str, dict]:
    """Run ``bench --smoke`` on the emulator with ``args``; its stdout and figures."""
    out = tmp_path / "bench.json"
    proc = subprocess.Popen([sys.executable, "-m", "fenced_k8s_lab.bench", "--smoke", "--backend", "emulator",
                             *args, "--json", str(out), "--workdir", str(tmp_path / "work")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)  # ~1 min on a quiet 2-core machine
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: the bench stops its PostgreSQL and emulator on the way out
        stdout, stderr = proc.communicate(timeout=60)
        pytest.fail(f"bench --smoke {' '.join(args)} did not finish in {timeout:.0f} s:\n{stderr[-4000:]}")
    assert proc.returncode == 0, stderr[-4000:]
    return stdout, json.loads(out.read_text())


def test_bench_smoke_writes_all_figures(tmp_path):
    stdout, figures = _smoke(tmp_path)
    assert "fenced/stock" in stdout  # the summary table
    # both executors log at the shipped logging_level (INFO), to a file rather than the report
    assert "Add task" not in stdout
    lines = (tmp_path / "work" / "airflow.log").read_text().splitlines()
    for logger in ("[fenced_k8s_executor.executor.FencedKubernetesExecutor]",
                   "[airflow.providers.cncf.kubernetes.executors.kubernetes_executor.KubernetesExecutor]"):
        assert any("[info" in line and "Add task" in line and logger in line for line in lines), logger
    for key in KEYS:
        assert key in figures, key
    trips = figures["precreate_round_trips_per_batch"]
    assert {n: v["fenced"] for n, v in trips.items()} == {"1": 1, "8": 1, "32": 1, "128": 1}
    assert {n: v["stock"] for n, v in trips.items()} == {"1": 1, "8": 8, "32": 32, "128": 128}
    assert set(figures["launch_throughput_ratio"]) == {"sequential", "concurrent"}
    # every ratio has its spread, under the same key
    spreads = figures["ratio_spreads"]
    for key in ("queue_time_ratio", "sync_p50_ratio", "sync_p99_ratio", "queue_time_aa_ratio", "sync_p99_aa_ratio",
                "sync_p99_single_ratio"):
        assert set(spreads[key]) >= {"median", "min", "max", "per_rep", "reps"}, key
    # the noise floor (two executors of one kind) is reported beside a ratio target, not counted in it
    queue_target = next(t for t in figures["targets"] if t["target"].startswith("queue time"))
    assert set(queue_target["aa"]) == {"median", "min", "max", "reps", "meets"}
    assert set(spreads["launch_throughput_ratio"]) == {"sequential", "concurrent"}
    # one statement per loop for the in-flight reconcile, none for stock
    assert {n: v["fenced"] for n, v in figures["loop_statements_per_sync"].items()} == {"4": 1, "16": 1}
    assert {n: v["stock"] for n, v in figures["loop_statements_per_sync"].items()} == {"4": 0, "16": 0}
    # a dead scheduler's launches in flight: one fence statement per idle loop, no API call when idle.
    # A loop that creates pods also reads this scheduler's job row once per heartbeat interval (the
    # launcher its pods name, issue 45: three statements in one bounded transaction), so a busy loop
    # is one statement, or four when the stamp is due; fewer than stock's check per job on average.
    orphans = figures["orphans"]
    assert orphans["idle"]["fenced"]["statements_per_sync_max"] == 1
    assert orphans["busy"]["fenced"]["statements_per_sync_max"] in (1, 4)
    assert orphans["busy"]["fenced"]["statements_per_sync"] <= orphans["busy"]["stock"]["statements_per_sync"]
    assert orphans["idle"]["fenced"]["api_calls_per_sync"] == 0
    assert figures["orphans_known_at_start"] == figures["config"]["orphan_pods"]
    assert figures["startup_known_at_start"] == [figures["config"]["startup_pods"]]  # listed once, at start
    # the sweep: one list per page; the lock's transaction (its statement_timeout, the lock) + one query per page
    for size, pages in figures["sweep_pages"].items():
        assert figures["sweep_api_calls"][size]["list"] == pages
        assert figures["sweep_db_queries"][size] == pages + 2
    assert figures["machine"]["cores"] and figures["machine"]["versions"]["apache-airflow"]
    assert figures["machine"]["airflow_logging_level"] == os.environ.get("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO")
    if len(os.sched_getaffinity(0)) >= 2:  # queue time: this process and the Managers on separate CPUs
        assert set(figures["queue_time_placement"]) == {"bench_cpu", "manager_cpu"}


def test_bench_runs_on_the_charts_driver(tmp_path):
    """``--driver psycopg``: the figures of psycopg 3, the driver SQLAlchemy 2.1 gives the official
    chart's plain ``postgresql://`` URL; the fenced loop stays one statement and one wire round trip."""
    _, figures = _smoke(tmp_path, "--only", "inflight", "--driver", "psycopg")
    assert figures["machine"]["driver"] == "psycopg"
    assert {n: v["fenced"] for n, v in figures["loop_statements_per_sync"].items()} == {"4": 1, "16": 1}
    assert {n: v["fenced"] for n, v in figures["loop_wire_round_trips_per_sync"].items()} == {"4": 1, "16": 1}
