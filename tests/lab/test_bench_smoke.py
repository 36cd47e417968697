"""`fenced-k8s-repro bench --quick` end to end (~25 s): every figure is produced and the fenced
pre-creation check is one DB statement per batch. Counts only; no timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.lab

KEYS = ("precreate_round_trips_per_batch", "precreate_wall_ratio", "launch_throughput_ratio", "sweep_seconds",
        "sync_p99_ratio", "machine", "raw", "targets")


def test_bench_quick_writes_all_figures(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "fenced_k8s_executor.lab.bench", "--quick", "--json", str(out),
                           "--workdir", str(tmp_path / "work")], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "fenced/stock" in proc.stdout  # the summary table
    figures = json.loads(out.read_text())
    for key in KEYS:
        assert key in figures, key
    trips = figures["precreate_round_trips_per_batch"]
    assert set(trips) == {"1", "8", "32", "128"}
    assert {n: v["fenced"] for n, v in trips.items()} == {"1": 1, "8": 1, "32": 1, "128": 1}
    assert {n: v["stock"] for n, v in trips.items()} == {"1": 1, "8": 8, "32": 32, "128": 128}
    assert set(figures["launch_throughput_ratio"]) == {"sequential", "concurrent"}
    assert figures["machine"]["cores"] and figures["machine"]["versions"]["apache-airflow"]
