"""Side-by-side report: terminal table, JSON, Markdown and a PNG timeline per scenario."""

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
    ("run_404", "/run 404 (unhandled)"),
    ("run_409", "/run 409 (unhandled)"),
    ("run_410", "/run 410 (unhandled; Airflow 3.4's archived attempts)"),
    ("duplicate_pods", "duplicate pods per launch"),
    ("retries_burned", "retries burned"),
    ("retries_burned_by_stale", "  of which by stale launches"),
    ("tries_burned_by_ha", "tries burned by HA"),
    ("tasks_failed", "tasks failed"),
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

#: The headline: one row per scenario, "stock / fenced" per cell.
HEADLINE = [
    ("pods_started_for_superseded_launch", "pods started for superseded launches"),
    ("stale_task_runs", "task code run by a stale pod"),
    (("run_404", "run_409", "run_410"), "`/run` 404 / 409 / 410, unhandled"),
    ("retries_burned_by_stale", "retries burned by stale launches"),
    ("tries_burned_by_ha", "tries burned by HA"),
    (("tasks_failed", "tasks_not_terminal"), "tasks failed / not terminal"),
    ("executor_slots_leaked", "executor slots leaked"),
    ("scheduler_crashes", "scheduler crashes"),
    ("scheduler_restarts", "scheduler restarts"),
    ("watcher_crashes", "watcher crashes"),
    ("events_not_applied_once", "pod events applied ≠ once"),
    ("other_deployment_pods_deleted", "other deployment's pods deleted"),
    ("false_positive_deletions", "false-positive deletions"),
    ("wasted_pod_seconds", "wasted pod-seconds"),
]


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _label(executor: str, settings: dict[str, str] | None) -> str:
    extra = (settings or {}).get(executor)
    return f"{executor} [{extra}]" if extra else executor


def settings_of(names: list[str]) -> dict[str, dict[str, str]]:
    """{scenario: {executor: non-default settings}} for the scenarios that need any."""
    from fenced_k8s_lab.scenarios import SCENARIOS

    return {n: {"fenced": SCENARIOS[n].settings} for n in names if n in SCENARIOS and SCENARIOS[n].settings}


def headline(results: dict[str, dict[str, dict[str, Any]]], settings: dict[str, dict[str, str]] | None = None) -> str:
    """The README table: a row per scenario, each cell stock / fenced; a scenario whose fenced run
    needed a non-default setting names it in its row."""
    settings = settings if settings is not None else settings_of(list(results))
    out = ["| scenario | " + " | ".join(label for _, label in HEADLINE) + " |",
           "|---|" + "---|" * len(HEADLINE)]
    for scenario, by_executor in results.items():
        name = scenario
        extra = (settings.get(scenario) or {}).get("fenced")
        if extra:
            name += f" (fenced: `{extra}`)"
        cells = []
        for key, _ in HEADLINE:
            per = []
            for executor in ("stock", "fenced"):
                m = by_executor.get(executor)
                if m is None:
                    per.append("-")
                elif isinstance(key, tuple):
                    per.append(" / ".join(_cell(m.get(k)) for k in key))
                else:
                    per.append(_cell(m.get(key)))
            cells.append(" → ".join(per) if len(per) > 1 else per[0])
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


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


def write_markdown(results: dict, path: Path, context: dict[str, Any],
                   settings: dict[str, dict[str, str]] | None = None) -> None:
    settings = settings if settings is not None else settings_of(list(results))
    out = ["# fenced-k8s-executor lab report", ""]
    out += [f"- {k}: {v}" for k, v in context.items()]
    out += ["- the fenced executor runs on its shipped defaults, except where a column header names a setting",
            "", "## Summary (stock → fenced)", "", headline(results, settings)]
    for scenario, by_executor in results.items():
        executors = list(by_executor)
        out += ["", f"## {scenario}", "", f"![timeline]({scenario}-timeline.png)", "",
                "| metric | " + " | ".join(_label(e, settings.get(scenario)) for e in executors) + " |",
                "|---|" + "---|" * len(executors)]
        for key, label in ROWS:
            out.append(f"| {label.strip()} | " + " | ".join(_cell(by_executor[e].get(key, "-")) for e in executors) + " |")
        for e in executors:
            faults = by_executor[e].get("api_faults_hit") or {}
            if faults:
                out += ["", f"{e}: API faults that hit the schedulers, by verb: "
                        + ", ".join(f"{k}={v}" for k, v in faults.items())]
    path.write_text("\n".join(out) + "\n")


def write_timeline(scenario: str, runs: dict[str, Any], path: Path) -> None:
    """One row per task, one bar per pod (green: current launch, red: superseded), faults marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(7 * len(runs), 5), squeeze=False)
    for ax, (executor, evidence) in zip(axes[0], runs.items()):
        t0 = min([f["ts"] for f in evidence.faults] + [p["created"] for p in evidence.pods if p.get("created")] or [0])
        tasks = sorted({p.get("task_id") or "?" for p in evidence.pods})
        row = {task: i for i, task in enumerate(tasks)}
        seen: dict[str, int] = {}
        for pod in sorted(evidence.pods, key=lambda p: p.get("created") or 0):
            if not pod.get("created"):
                continue
            task = pod.get("task_id") or "?"
            seen[task] = seen.get(task, 0) + 1
            y = row[task] + 0.18 * (seen[task] - 1)  # one lane per pod of the task
            start = pod.get("started")
            end = pod.get("finished") or (start or pod["created"])
            stale = pod.get("_stale", False)
            ax.plot([pod["created"] - t0, (start or end) - t0], [y, y], color="lightgray", lw=3)
            if start:
                ax.plot([start - t0, end - t0], [y, y], color="tab:red" if stale else "tab:green", lw=6,
                        solid_capstyle="butt")
        for k, fault in enumerate(evidence.faults):
            ax.axvline(fault["ts"] - t0, color="tab:orange", ls="--", lw=1)
            ax.text(fault["ts"] - t0 + 0.4 * k, len(tasks) - 0.4, fault["what"][:32], rotation=90, fontsize=6,
                    va="top")
        ax.set_yticks(range(len(tasks)), tasks, fontsize=7)
        ax.set_xlabel("seconds")
        ax.set_title(f"{scenario}: {executor} (grey pending, green current, red superseded)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
