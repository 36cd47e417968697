"""`fenced-k8s-repro bench --only scale --smoke` end to end on the emulator: two real deployments
(stock, then fenced), each with two real schedulers, an api-server and a dag-processor, 12 mapped
tasks held Running by the process kubelet; every figure of the scale bench is produced, with the
docs table and the plot. About 3-4 minutes on a quiet 2-core machine. Counts and shapes only: no
timing is asserted (ratios at 12 tasks on a shared machine mean nothing)."""

from __future__ import annotations

import pytest
from test_bench_smoke import _smoke

from fenced_k8s_lab.bench.scale import PHASES, ROLES, SCHEDULERS

pytestmark = pytest.mark.lab


def test_scale_bench_smoke_produces_every_figure(tmp_path):
    docs = tmp_path / "docs"
    stdout, figures = _smoke(tmp_path, "--only", "scale", "--scale-docs", str(docs), timeout=1500)
    (line,) = figures["scale"].values()
    runs = line["runs"]
    assert [r["kind"] for r in runs] == ["stock", "fenced"]
    for run in runs:
        assert "error" not in run, run
        n = run["size"]
        for name in PHASES:
            phase = run["phases"][name]
            assert all(phase["loops"][r] > 0 for r in SCHEDULERS), (run["kind"], name, phase["loops"])
            assert 0 < phase["loop_p50"] <= phase["loop_p99"], (run["kind"], name)
            assert 0 < phase["executor_share"] < 1, (run["kind"], name)
            assert all(v > 0 for v in phase["statements_per_loop"].values()), (run["kind"], name)
        calls = {verb: sum(codes.values()) for p in run["phases"].values() for verb, codes in p["api"].items()}
        created = sum(p["api"].get("create", {}).get("201", 0) for p in run["phases"].values())
        assert created == n and calls["delete"] >= n, calls  # one pod per task, every pod deleted at the end
        assert run["phases"]["fanout"]["db"]["api-server"]["statements"] > 0  # each task's /run
        assert set(run["phases"]["steady"]["db"]) == set(ROLES)
        assert run["fanout"]["all_pods"] is not None and run["fanout"]["all_running"] is not None
        assert run["tasks_per_second"] > 0 and run["finish"]["all_deleted"] is not None
        assert run["startup"]["old_returncode"] == 0  # both kinds exit within the grace: alike at start
        assert all(run["startup"][k] is not None for k in ("first_loop_after_job_start", "executors_start",
                                                         "adoption", "first_loop"))
        assert all(run["memory"]["peak_pss_mb"][r] > 0 and run["memory"]["peak_rss_mb"][r] > 0 for r in SCHEDULERS)
    summary = line["summary"]
    size = summary["sizes"][str(runs[0]["size"])]
    assert set(size["ratio"]) >= {"fanout_p50", "fanout_p99", "steady_p50", "steady_p99", "finish_p50", "throughput",
                                  "finish_deleted", "pss", "startup"}
    assert set(size["aa"]) >= {"steady_p50", "steady_p99"}  # one scheduler against the other, each run
    assert {t["met"] for t in summary["targets"]} <= {True, False, None} and len(summary["targets"]) == 13
    (lease,) = [t for t in summary["targets"] if "the witness's Lease calls per scheduler loop" in t["target"]]
    assert lease["measured"]["fenced"] > 0  # it renews once per heartbeat interval, whatever the load
    assert all(summary["fits"][kind]["loop_p50"]["slope"] is not None for kind in ("stock", "fenced"))
    assert "fenced/stock" in stdout and "fenced/stock" in (docs / "scale.md").read_text()
    assert (docs / "scale.png").stat().st_size > 0
