"""What a lab run says, for people: the terminal table, JSON, ``report.md`` and ``headline.md``.

The headline (the README's table) and the report's summary show the few metrics an adopter
decides on; every failure, on either side, is also said in a sentence, so a reader never has to
decode a cell. Each metric is defined once, in ``DEFINITIONS``, and the report prints them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROWS = [
    ("pods_created", "pods created"),
    ("launches", "launches (QUEUED transitions)"),
    ("pods_started", "pods started"),
    ("pods_started_for_superseded_launch", "pods started for superseded launches"),
    ("stale_pods_turned_away", "  of which turned away at start (exit 0)"),
    ("stale_task_runs", "task code run by stale pods"),
    ("run_rejected_stale", "stale launches turned away at /run (the fence)"),
    ("run_gate_rejected", "  of which by the run gate's 409"),
    ("run_404", "/run 404 (unhandled)"),
    ("run_409", "/run 409 (unhandled)"),
    ("run_410", "/run 410 (unhandled; Airflow 3.4's archived attempts)"),
    ("run_403", "/run 403 (the workload token expired)"),
    ("pods_stopped_while_starting", "pods stopped while starting (deleted before /run)"),
    ("run_after_stop", "/run sent after the pod was told to stop"),
    ("stopped_at_start", "pods that exited 0 on the stop, before their task"),
    ("duplicate_pods", "duplicate pods per launch"),
    ("retries_burned", "retries burned"),
    ("retries_burned_by_stale", "  of which by stale launches"),
    ("tries_burned_by_ha", "tries burned by HA"),
    ("requeues", "stuck-in-queued re-queues"),
    ("tasks_failed", "tasks failed"),
    ("tasks_failed_in_queue", "  of which at the stuck-in-queued limit"),
    ("tasks_not_terminal", "tasks not terminal"),
    ("executor_slots_leaked", "executor slots leaked"),
    ("scheduler_crashes", "scheduler crashes"),
    ("scheduler_restarts", "scheduler (re)starts during the run"),
    ("watcher_crashes", "pod watcher crashes"),
    ("events_not_applied_once", "pod events applied more or less than once"),
    ("events_lost", "  of which never applied"),
    ("events_applied_extra", "  of which applied more than once"),
    ("wasted_pod_seconds", "wasted pod-seconds"),
    ("pods_deleted_by_executor", "pods deleted by the executor"),
    ("false_positive_deletions", "  false-positive deletions"),
    ("other_deployment_pods_deleted", "other deployment's pods deleted (either way)"),
    ("own_pods_deleted_by_neighbour", "  of which ours, by the neighbour"),
    ("wall_seconds", "wall time (s)"),
]

#: One sentence per metric: what it counts (derivations: docs/lab.md, "Measurements").
DEFINITIONS = {
    "pods_created": "pods the executor created (the kubelet's records).",
    "launches": "transitions of a task instance into `queued`; a launch is superseded by the next one of its "
                "task instance, or when the task instance id disappears (clear, retry, reset).",
    "pods_started": "pods whose container started.",
    "pods_started_for_superseded_launch": "pods whose container started after their launch had been superseded: "
                                          "the pods apache/airflow#69760 is about.",
    "stale_pods_turned_away": "of those, pods whose worker met the launch gate and exited 0 without running the task.",
    "stale_task_runs": "pods whose task code ran (its first line printed) after their launch had been superseded, "
                       "whenever their container started: the task ran for a launch that was no longer its current "
                       "one (a pod that started in time and got through /run after a stuck-in-queued re-queue of "
                       "the same task instance counts).",
    "run_rejected_stale": "`/run` calls of superseded launches the fence turned away: the run gate's "
                          "`409 stale_executor_launch`, and 404/410 for a claimed task instance id that is gone, "
                          "which the worker handled (exit 0). Launches fenced, not failures.",
    "run_gate_rejected": "of those, the run gate's own 409s (the api-server's decision lines).",
    "run_404": "`/run` calls the api-server answered 404 that no worker handled as a stale launch: a task failing "
               "with an opaque `not_found`.",
    "run_409": "`/run` calls answered 409 that no worker handled as a stale launch.",
    "run_410": "`/run` calls answered 410 (Airflow 3.4: an archived attempt) that no worker handled as a stale "
               "launch.",
    "run_403": "`/run` calls answered 403 `Invalid auth token`: the workload's token outlived its lifetime "
               "(`task_queued_timeout` from when it was minted), e.g. a job that waited out a quota before its pod "
               "was created; the worker exits 1.",
    "duplicate_pods": "pods started beyond the first for one launch.",
    "pods_stopped_while_starting": "pods told to stop (deleted: a stuck-in-queued revoke, a fence) after their "
                                   "container started and before they sent `/run`.",
    "run_after_stop": "`/run` calls a pod sent after it had been told to stop (the Task SDK's warm shutdown on "
                      "Airflow 3.4 lets a pod deleted during its start go on to `/run`).",
    "stopped_at_start": "pods whose worker, told to stop before its task started, exited 0 without running it "
                        "(no `/run`, or a `/run` in flight that was refused).",
    "requeues": "re-queues by airflow-core's stuck-in-queued handler (a task queued longer than "
                "`task_queued_timeout`: revoked, back to scheduled, same task instance id and try).",
    "tasks_failed_in_queue": "of the tasks failed, those airflow-core failed at its stuck-in-queued re-queue "
                             "limit (`num_stuck_in_queued_retries`).",
    "retries_burned": "tries that ended `failed` or `up_for_retry` without the task failing on purpose (the lab's "
                      "tasks never fail by themselves unless the scenario says so).",
    "retries_burned_by_stale": "of those, the ones that followed a failed pod of a superseded launch of the same "
                               "task instance: a stale pod's failure landing on the live try.",
    "tries_burned_by_ha": "per task: final try number - 1 - the retries its deliberate failures used - the user's "
                          "clears. What is left went to orphan resets, stuck-in-queued failures and failures "
                          "reported for lost or stale pods.",
    "tasks_failed": "task instances that ended `failed`.",
    "tasks_not_terminal": "task instances still not finished when the scenario gave up waiting.",
    "executor_slots_leaked": "executor slots Airflow still counts as taken at the end (its own "
                             "`executor.running_tasks` gauge) beyond the task instances that may hold one.",
    "scheduler_crashes": "scheduler processes that exited on their own during the run (the lab restarts them, as a "
                         "Deployment would).",
    "scheduler_restarts": "scheduler processes started during the run (a rolling update's replacements, restarts "
                          "after a crash): part of the scenario, not a failure.",
    "watcher_crashes": "pod watcher processes that died (from the scheduler logs).",
    "events_not_applied_once": "tries whose pod's terminal state reached the scheduler not exactly once "
                               "(lost, or applied twice, or a stale pod's state applied to the live try).",
    "events_lost": "of those, expected events never applied.",
    "events_applied_extra": "of those, events applied more often than the pods allow.",
    "wasted_pod_seconds": "run time of pods started for superseded launches.",
    "pods_deleted_by_executor": "pod deletes by the schedulers (the API server's audit log).",
    "false_positive_deletions": "pods a fence deleted while their launch was still current (judged from the task "
                                "instance change log, not by the fence).",
    "other_deployment_pods_deleted": "shared_namespace only: pods of one deployment deleted by the other.",
    "own_pods_deleted_by_neighbour": "of those, the neighbour deleting the tested deployment's pods.",
    "wall_seconds": "from the scenario's first step to the end of the run.",
}

#: The summary and the README headline: the metrics an adopter decides on.
SUMMARY = [
    ("pods_started_for_superseded_launch", "pods started for superseded launches"),
    ("stale_task_runs", "task code run by stale pods"),
    (("run_404", "run_409", "run_410"), "/run 404 / 409 / 410 (unhandled)"),
    ("run_rejected_stale", "stale launches turned away at /run"),
    ("tries_burned_by_ha", "tries burned by HA"),
    ("requeues", "stuck-in-queued re-queues"),
    ("tasks_failed", "tasks failed"),
    ("tasks_not_terminal", "tasks not terminal"),
    ("false_positive_deletions", "false-positive deletions"),
]

#: What counts as a failure, worded for a sentence: (metric, singular, plural).
FAILURES = [
    ("pods_started_for_superseded_launch", "pod started for a launch already superseded",
     "pods started for launches already superseded"),
    ("stale_task_runs", "of them ran the task code", "of them ran the task code"),
    ("run_404", "`/run` call failed with an opaque 404", "`/run` calls failed with an opaque 404"),
    ("run_409", "`/run` call failed with 409", "`/run` calls failed with 409"),
    ("run_403", "`/run` call was refused with 403 (an expired workload token)",
     "`/run` calls were refused with 403 (expired workload tokens)"),
    ("duplicate_pods", "launch got a duplicate pod", "duplicate pods started for one launch"),
    ("retries_burned_by_stale", "retry was burned by a stale pod's failure",
     "retries were burned by stale pods' failures"),
    ("tries_burned_by_ha", "try was burned by HA", "tries were burned by HA"),
    ("tasks_failed", "task ended failed", "tasks ended failed"),
    ("tasks_failed_in_queue", "of them at the stuck-in-queued limit", "of them at the stuck-in-queued limit"),
    ("tasks_not_terminal", "task never finished", "tasks never finished"),
    ("executor_slots_leaked", "executor slot leaked", "executor slots leaked"),
    ("scheduler_crashes", "scheduler crashed", "schedulers crashed"),
    ("watcher_crashes", "pod watcher died", "pod watchers died"),
    ("events_not_applied_once", "pod event was applied not exactly once", "pod events were applied not exactly once"),
    ("other_deployment_pods_deleted", "pod of the other deployment was deleted",
     "pods of the other deployment were deleted"),
    ("false_positive_deletions", "pod of a current launch was deleted", "pods of current launches were deleted"),
]

#: Failures said as a clause of another one when that one is said too: {metric: (the other one,
#: its own words when said alone, singular and plural)}.
CLAUSES = {
    "stale_task_runs": ("pods_started_for_superseded_launch", "pod ran the task code for a superseded launch",
                        "pods ran the task code for superseded launches"),
    "tasks_failed_in_queue": ("tasks_failed", "task failed at the stuck-in-queued limit",
                              "tasks failed at the stuck-in-queued limit"),
}

DEFINITIONS_ANCHOR = "metric-definitions"


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _label(executor: str, settings: dict[str, str] | None) -> str:
    extra = (settings or {}).get(executor)
    return f"{executor} [{extra}]" if extra else executor


def settings_of(names: list[str]) -> dict[str, dict[str, str]]:
    """{scenario: {executor: non-default settings}} for the scenarios that need any."""
    from fenced_k8s_lab.scenarios import SCENARIOS

    return {n: {"fenced": SCENARIOS[n].settings} for n in names if n in SCENARIOS and SCENARIOS[n].settings}


def summary(results: dict[str, dict[str, dict[str, Any]]], settings: dict[str, dict[str, str]] | None = None) -> str:
    """A row per scenario and executor, the ``SUMMARY`` columns; a run with non-default settings
    names them beside its executor."""
    settings = settings if settings is not None else settings_of(list(results))
    out = ["| scenario | executor | " + " | ".join(label for _, label in SUMMARY) + " |",
           "|---|---|" + "---:|" * len(SUMMARY)]
    for scenario, by_executor in results.items():
        for i, (executor, m) in enumerate(by_executor.items()):
            cells = [" / ".join(_cell(m.get(k)) for k in key) if isinstance(key, tuple) else _cell(m.get(key))
                     for key, _ in SUMMARY]
            name = scenario if i == 0 else ""
            out.append(f"| {name} | {_label(executor, settings.get(scenario))} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def failures(metrics: dict[str, Any]) -> str | None:
    """Every failure of one run in a sentence, or None when it had none."""
    parts = []
    for key, one, many in FAILURES:
        n = metrics.get(key)
        if not n:
            continue
        if key in CLAUSES:
            parent, one_alone, many_alone = CLAUSES[key]
            if metrics.get(parent):  # said right after it, as a clause of it
                parts[-1] += f", {n} {one if n == 1 else many}"
                continue
            one, many = one_alone, many_alone
        part = f"{n} {one if n == 1 else many}"
        if key == "pods_started_for_superseded_launch" and metrics.get("wasted_pod_seconds"):
            part += f" ({metrics['wasted_pod_seconds']:g} pod-seconds)"
        parts.append(part)
    if not parts:
        return None
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def failure_lines(results: dict[str, dict[str, dict[str, Any]]], executors: tuple[str, ...] = ("stock", "fenced"),
                  settings: dict[str, dict[str, str]] | None = None) -> list[str]:
    """A bullet per scenario and executor saying what failed (or that nothing did)."""
    settings = settings if settings is not None else settings_of(list(results))
    lines = []
    for scenario, by_executor in results.items():
        for executor in executors:
            if executor in by_executor:
                said = failures(by_executor[executor]) or "no failure."
                lines.append(f"- **{scenario}, {_label(executor, settings.get(scenario))}**: {said}")
    return lines


def what_it_does(scenario: str) -> str:
    """One line on what the scenario does to the cluster."""
    from fenced_k8s_lab.scenarios import SCENARIOS, WHAT_IT_DOES

    if scenario in WHAT_IT_DOES:
        return WHAT_IT_DOES[scenario]
    text = SCENARIOS[scenario].summary.split(". ")[0].strip() if scenario in SCENARIOS else ""
    return (text.rstrip(".") + ".") if text else ""


def table(results: dict[str, dict[str, dict[str, Any]]], settings: dict[str, dict[str, str]] | None = None) -> str:
    """results: {scenario: {executor: metrics}} -> a fixed-width side-by-side table; an executor
    run with non-default settings has them in its column header."""
    settings = settings if settings is not None else settings_of(list(results))
    lines = []
    for scenario, by_executor in results.items():
        executors = list(by_executor)
        lines.append("")
        lines.append(f"== {scenario} " + "=" * max(0, 60 - len(scenario)))
        labels = [_label(e, settings.get(scenario)) for e in executors]
        widths = [max(12, len(label) + 2) for label in labels]
        lines.append(f"{'metric':44s}" + "".join(f"{label:>{w}s}" for label, w in zip(labels, widths)))
        for key, label in ROWS:
            values = [_cell(by_executor[e].get(key, "-")) for e in executors]
            lines.append(f"{label:44s}" + "".join(f"{v:>{w}s}" for v, w in zip(values, widths)))
        for e in executors:
            decisions = by_executor[e].get("fencing_decisions") or {}
            if decisions:
                lines.append(f"{e} fencing decisions: " + ", ".join(f"{k}={v}" for k, v in decisions.items()))
            faults = by_executor[e].get("api_faults_hit") or {}
            if faults:
                lines.append(f"{e} API faults that hit the schedulers, by verb: "
                             + ", ".join(f"{k}={v}" for k, v in faults.items()))
    return "\n".join(lines)


def write_json(results: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"scenarios": results}, indent=2, sort_keys=True))


def describe_run(context: dict[str, Any]) -> str:
    """One sentence: the command, the scenarios, the sizes, the machine, how long, which commit."""
    bits = [f"`{context['command']}`" if context.get("command") else "this run",
            f"scenarios {', '.join(context.get('scenarios', []))}" if context.get("scenarios") else "",
            "quick sizes" if context.get("quick") else "full sizes",
            f"{context.get('schedulers', 2)} schedulers, seed {context.get('seed', 7)}",
            "the fenced executor on its shipped defaults unless a row names a setting"]
    text = "Measured by " + ", ".join(b for b in bits if b)
    if context.get("wall_seconds") is not None:
        minutes, seconds = divmod(int(round(context["wall_seconds"])), 60)
        text += f", in {minutes} min {seconds:02d} s" if minutes else f", in {seconds} s"
    if context.get("machine"):
        text += f" on {context['machine']}"
    if context.get("commit"):
        text += f", at commit {context['commit']}"
    return text + "."


def headline_markdown(results: dict, context: dict[str, Any], settings: dict | None = None) -> str:
    """``headline.md``: what the README pastes, exactly."""
    return "\n".join([describe_run(context), "", summary(results, settings), "", *failure_lines(results,
                      settings=settings)]) + "\n"


def write_markdown(results: dict, path: Path, context: dict[str, Any],
                   settings: dict[str, dict[str, str]] | None = None) -> None:
    settings = settings if settings is not None else settings_of(list(results))
    out = ["# fenced-k8s-executor lab report", "", describe_run(context), "", "## What each scenario did", ""]
    out += [f"- **{name}**: {what_it_does(name)}" for name in results]
    out += ["", "## Summary", "",
            f"Counts per run; what each column counts: [metric definitions](#{DEFINITIONS_ANCHOR}).", "",
            summary(results, settings), "", "What failed, in words:", "", *failure_lines(results, settings=settings)]
    for scenario, by_executor in results.items():
        executors = list(by_executor)
        out += ["", f"## {scenario}", "", what_it_does(scenario), "", f"![{scenario} timeline]({scenario}-timeline.png)",
                "", "| metric | " + " | ".join(_label(e, settings.get(scenario)) for e in executors) + " |",
                "|---|" + "---:|" * len(executors)]
        for key, label in ROWS:
            out.append(f"| {label.strip()} | " + " | ".join(_cell(by_executor[e].get(key)) for e in executors) + " |")
        for e in executors:
            faults = by_executor[e].get("api_faults_hit") or {}
            if faults:
                out += ["", f"Injected API faults that hit the {e} run's schedulers, by verb: "
                        + ", ".join(f"{k} {v}" for k, v in faults.items()) + "."]
    out += ["", "## Metric definitions", "",
            "`-`: not measured in this scenario. Derivations: docs/lab.md, section Measurements.", ""]
    out += [f"- **{label.strip()}**: {DEFINITIONS[key]}" for key, label in ROWS if key in DEFINITIONS]
    path.write_text("\n".join(out) + "\n")


def write_timeline(scenario: str, runs: dict[str, Any], path: Path) -> None:
    from fenced_k8s_lab.timeline import write

    write(scenario, runs, path)
