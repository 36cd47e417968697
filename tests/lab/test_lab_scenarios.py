"""The short lab run CI does: pending storm and clear churn, small sizes, stock and fenced on
real Airflow processes. The stock executor must show a stale-launch symptom (otherwise the
scenario no longer reproduces anything and the test fails); the fenced executor must show none.
"""

from __future__ import annotations

import argparse

import pytest

pytestmark = pytest.mark.lab

SYMPTOMS = ("pods_started_for_superseded_launch", "run_404", "run_409", "duplicate_pods",
            "retries_burned_by_stale", "stale_task_runs")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from fenced_k8s_executor.lab.cli import run

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
    fenced = results[scenario]["fenced"]
    assert fenced["pods_started_for_superseded_launch"] == 0, fenced
    assert fenced["stale_task_runs"] == 0, fenced
    assert fenced["run_404"] == 0 and fenced["run_409"] == 0, fenced
    assert fenced["duplicate_pods"] == 0, fenced
    assert fenced["retries_burned_by_stale"] == 0, fenced
    assert fenced["false_positive_deletions"] == 0, fenced
    assert fenced["tasks_not_terminal"] == 0 and fenced["tasks_failed"] == 0, fenced
    assert fenced["tasks_succeeded"] == fenced["tasks"], fenced
