"""The lab report for people: the summary, failures said in words, scenario lines, and the
timeline's layout (shared x-axis, step numbers that never overlap). Pure functions on hand-made
metrics and evidence."""

from __future__ import annotations

import pytest

from fenced_k8s_lab import report, timeline
from fenced_k8s_lab.measure import Evidence
from fenced_k8s_lab.scenarios import DEFAULT, SCENARIOS, WHAT_IT_DOES

STOCK = {"pods_started_for_superseded_launch": 10, "stale_task_runs": 1, "run_404": 0, "run_409": 1,
         "retries_burned_by_stale": 6, "tries_burned_by_ha": 2, "tasks_failed": 8, "tasks_not_terminal": 0,
         "false_positive_deletions": 0, "wasted_pod_seconds": 269.5, "executor_slots_leaked": 0,
         "scheduler_restarts": 2, "other_deployment_pods_deleted": None}
FENCED = {**dict.fromkeys(STOCK, 0), "scheduler_restarts": 2, "other_deployment_pods_deleted": None}


def test_failures_say_every_failure_and_only_failures():
    said = report.failures(STOCK)
    assert said == ("10 pods started for launches already superseded (269.5 pod-seconds), 1 of them ran the task "
                    "code; 1 `/run` call failed with 409; 6 retries were burned by stale pods' failures; 2 tries "
                    "were burned by HA; 8 tasks ended failed.")
    assert report.failures(FENCED) is None  # scheduler restarts are the scenario, not a failure
    assert report.failures({**FENCED, "executor_slots_leaked": 8}) == "8 executor slots leaked."


def test_a_stale_run_and_the_stuck_in_queued_limit_are_said_on_their_own_or_as_a_clause():
    alone = {**FENCED, "stale_task_runs": 2, "tasks_failed": 4, "tasks_failed_in_queue": 4}
    assert report.failures(alone) == ("2 pods ran the task code for superseded launches; 4 tasks ended failed, "
                                      "4 of them at the stuck-in-queued limit.")
    assert report.failures({**FENCED, "run_rejected_stale": 7, "run_gate_rejected": 7, "requeues": 30}) is None


def test_summary_has_a_row_per_executor_and_names_non_default_settings():
    text = report.summary({"pending_storm": {"stock": STOCK, "fenced": FENCED},
                           "late_start": {"stock": STOCK, "fenced": FENCED}})
    lines = text.splitlines()
    assert len(lines) == 2 + 4 and "→" not in text
    assert lines[2].startswith("| pending_storm | stock | 10 | 1 | 0 / 1 / - | - | 2 | - | 8 | 0 | 0 |")
    assert lines[3].startswith("|  | fenced | 0 | 0 | 0 / 0 / - | - | 0 | - | 0 | 0 | 0 |")
    assert "| fenced [sweep_interval=0] |" in lines[5]


def test_every_scenario_says_in_one_line_what_it_does():
    assert set(WHAT_IT_DOES) == set(SCENARIOS)
    for name in SCENARIOS:
        line = report.what_it_does(name)
        assert line.endswith(".") and "\n" not in line and len(line) < 220, name


def test_headline_names_the_command_the_machine_and_the_commit():
    context = {"command": "fenced-k8s-repro --out out/lab", "scenarios": list(DEFAULT), "quick": False,
               "schedulers": 2, "seed": 7, "wall_seconds": 843.4, "machine": "a 2-core x86_64 machine",
               "commit": "abc1234"}
    text = report.headline_markdown({"pending_storm": {"stock": STOCK, "fenced": FENCED}}, context)
    first = text.splitlines()[0]
    assert first.startswith("Measured by `fenced-k8s-repro --out out/lab`, scenarios pending_storm")
    assert "in 14 min 03 s on a 2-core x86_64 machine, at commit abc1234." in first
    assert "- **pending_storm, fenced**: no failure." in text


def test_report_defines_every_metric_it_shows(tmp_path):
    path = tmp_path / "report.md"
    report.write_markdown({"pending_storm": {"stock": STOCK, "fenced": FENCED}}, path, {"seed": 7})
    text = path.read_text()
    assert f"](#{report.DEFINITIONS_ANCHOR})" in text and "\n## Metric definitions\n" in text
    assert {key for key, _ in report.ROWS} <= set(report.DEFINITIONS)
    assert f"- **pending_storm**: {WHAT_IT_DOES['pending_storm']}" in text


@pytest.mark.parametrize("xs", [[0, 0.5, 1, 1.5, 2, 30, 30.2], [5, 5, 5, 5], list(range(0, 100, 3))])
def test_step_numbers_never_share_a_level_closer_than_the_gap(xs):
    gap = 2.0
    levels = timeline.levels(xs, gap)
    for level in set(levels):
        on = [x for x, lv in zip(xs, levels) if lv == level]
        assert all(b - a >= gap for a, b in zip(on, on[1:])), (level, on)


def _evidence(t0: float, span: float, steps: int) -> Evidence:
    pods = [{"task_id": f"t{i}", "created": t0 + i, "started": t0 + i + 5, "finished": t0 + span, "_stale": i == 0,
             "ran_task": i == 0} for i in range(4)]
    faults = [{"ts": t0 + 1 + k * 0.2, "what": f"step {k} " + "x" * 60} for k in range(steps)]
    return Evidence(ti_log=[], tis=[], history=[], pods=pods, run_calls=[], deletes=[], decisions=[], faults=faults)


def test_timeline_panels_share_one_x_axis_and_list_every_step():
    fig = timeline.figure("clear_churn", {"stock": _evidence(1000.0, 200.0, 6), "fenced": _evidence(5000.0, 60.0, 6)})
    stock, stock_steps, fenced, fenced_steps = fig.axes[:4]
    assert stock.get_xlim() == fenced.get_xlim() and stock.get_xlim()[1] >= 200.0
    listed = stock_steps.texts[0].get_text()
    assert all(f"step {k}" in listed for k in range(6))
    assert max(len(line) for line in listed.splitlines()) <= timeline.LIST_WIDTH
