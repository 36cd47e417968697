"""The short lab run: pending storm and clear churn, small sizes, stock and fenced on real
Airflow processes. Opt-in (``LAB=1``), to keep the default test run well under 30 minutes; the
default run keeps the lab's real-apiserver smoke run and the stack smoke test. The stock executor must show a stale-launch symptom (otherwise the
scenario no longer reproduces anything and the test fails); the fenced executor must show none.
Plus a tiny retry storm on the fenced executor alone (stock is clean there): more first-try
failures than executor slots, the DAG completes and no slot leaks (Airflow's own gauges).
"""

from __future__ import annotations

import argparse
import os

import pytest

pytestmark = [pytest.mark.lab,
              pytest.mark.skipif(os.environ.get("LAB") != "1", reason="opt-in (stock and fenced lab runs, minutes each): LAB=1")]

SYMPTOMS = ("pods_started_for_superseded_launch", "run_404", "run_409", "duplicate_pods",
            "retries_burned_by_stale", "stale_task_runs")


@pytest.fixture(scope="module")
def retry_storm(tmp_path_factory):
    pytest.importorskip("statsd", reason="statsd (the lab extra) reports the executor slot gauges")
    from dataclasses import replace

    from fenced_k8s_lab.postgres import start_from_template
    from fenced_k8s_lab.runner import run_one
    from fenced_k8s_lab.scenarios import SCENARIOS

    # 6 first-try failures against 2 schedulers x parallelism 2 = 4 slots.
    tiny = replace(SCENARIOS["retry_storm"], width=(6, 6), env={"AIRFLOW__CORE__PARALLELISM": "2"}, timeout=150)
    pg = start_from_template()
    try:
        return run_one(tiny, "fenced", pg_server=pg, out_dir=tmp_path_factory.mktemp("lab-retry"), seed=7,
                       quick=True, schedulers=2)["metrics"]
    finally:
        pg.stop()


def test_fenced_retry_storm_completes_without_leaking_executor_slots(retry_storm):
    m = retry_storm
    assert m["executor_slots_leaked"] == 0, m
    assert m["tasks_not_terminal"] == 0 and m["tasks_succeeded"] == m["tasks"], m
    assert m["retries_burned"] == 0 and m["tries_burned_by_ha"] == 0, m


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from fenced_k8s_lab.cli import run

    out = tmp_path_factory.mktemp("lab")
    args = argparse.Namespace(executor="both", scenario="pending_storm,clear_churn", schedulers=2, seed=7,
                              quick=True, out=out, json=out / "lab.json")
    return run(args)


@pytest.mark.parametrize("scenario", ["pending_storm", "clear_churn"])
def test_stock_shows_a_stale_launch_symptom(results, scenario):
    stock = results[scenario]["stock"]
    assert any(stock[name] > 0 for name in SYMPTOMS), f"{scenario} reproduced nothing on stock: {stock}"


@pytest.mark.parametrize("scenario", ["pending_storm", "clear_churn"])
def test_fenced_shows_none_and_every_task_succeeds(results, scenario):
    """On a loaded machine a pod may start slower than pending_storm's 15 s task_queued_timeout,
    on either executor: a task core fails at its stuck-in-queued limit is the machine's, never a
    stale launch's (docs/lab.md, slow starts)."""
    fenced = results[scenario]["fenced"]
    assert fenced["pods_started_for_superseded_launch"] == 0, fenced
    assert fenced["stale_task_runs"] == 0, fenced
    assert fenced["run_404"] == 0 and fenced["run_409"] == 0, fenced
    assert fenced["run_after_stop"] == 0, fenced  # a pod told to stop never sends /run
    assert fenced["duplicate_pods"] == 0, fenced
    assert fenced["retries_burned_by_stale"] == 0, fenced
    assert fenced["false_positive_deletions"] == 0, fenced
    assert fenced["tasks_not_terminal"] == 0, fenced
    assert fenced["tasks_failed"] == fenced["tasks_failed_in_queue"], fenced
    if scenario == "clear_churn":
        assert fenced["tasks_succeeded"] == fenced["tasks"], fenced
