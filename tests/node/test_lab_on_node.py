"""The lab's HA scenarios with real worker containers: ``fenced-k8s-repro --kubeconfig`` on the
real node, stock and fenced side by side. Part of the full real-node suite (``KIND_TESTS=1``,
docs/lab.md "The lab on the real node"); the default run skips it.

The Airflow processes (api-server, dag-processor, schedulers) and PostgreSQL run on this
machine as in every lab run; the node's kubelet runs the worker pods in the project image,
Pending in an init container for the scenario's start delay, reaching the api-server through
the node network. Stock's symptoms are recorded (the report, out/node/lab/); the fenced
executor must show none of them, on its shipped defaults.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "out" / "node" / "lab"
SCENARIOS = ("clear_churn", "clear_running", "rolling_restart", "shared_namespace")
#: Fenced must show none of these on any scenario (stock's figures are the reproduction).
CLEAN = ("pods_started_for_superseded_launch", "stale_task_runs", "run_404", "run_409", "duplicate_pods",
         "retries_burned_by_stale", "tries_burned_by_ha", "tasks_failed", "tasks_not_terminal",
         "executor_slots_leaked", "false_positive_deletions", "scheduler_crashes", "events_not_applied_once")

pytestmark = pytest.mark.skipif(os.environ.get("KIND_TESTS") != "1",
                                reason="the full real-node suite runs with KIND_TESTS=1 (docs/lab.md)")


@pytest.fixture(scope="module")
def lab_results(real_node, images):
    from fenced_k8s_lab.cli import run

    lines: list[str] = []
    args = argparse.Namespace(executor="both", scenario=",".join(SCENARIOS), schedulers=2, seed=7, quick=True,
                              out=OUT, json=OUT / "results.json", kube="emulator",
                              kubeconfig=Path(real_node.kubeconfig), node=False, image=None, worker_host=None)
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        return run(args, say=lines.append)
    finally:
        (OUT / "run.log").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_fenced_shows_no_stale_pod_symptom_with_real_workers(lab_results, scenario):
    fenced, stock = lab_results[scenario]["fenced"], lab_results[scenario]["stock"]
    assert fenced["tasks"] > 0 and fenced["tasks_succeeded"] == fenced["tasks"], fenced
    assert {k: fenced[k] for k in CLEAN if fenced.get(k)} == {}, json.dumps({"fenced": fenced, "stock": stock})
    if scenario == "shared_namespace":
        assert fenced["other_deployment_pods_deleted"] == 0, fenced


def test_stock_shows_the_reproduction_on_real_workers(lab_results):
    """The scenarios are not vacuous on real containers: stock starts pods for superseded launches
    (the clears while Pending and the rolling restart), as on the emulator."""
    started = {s: lab_results[s]["stock"]["pods_started_for_superseded_launch"] for s in SCENARIOS}
    assert started["clear_churn"] > 0 and started["rolling_restart"] > 0, started
