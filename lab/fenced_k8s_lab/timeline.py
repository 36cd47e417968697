"""A scenario's timeline PNG: stock above fenced, on one shared x-axis (seconds since each run's
first step or pod), so a glance compares like with like.

One band per task, one lane per pod in it: grey while Pending, green while it runs for the
current launch, red when it started after its launch was superseded (hatched when it ran the task
code for a superseded launch, whenever it started). A task that ended failed has its name in red
and a cross where it failed; each stuck-in-queued re-queue is a short black tick on its band.
Scenario steps are dashed lines with a number; the numbers are stacked so that none overlap, and
the text of each step is listed beside its panel, never on the plot.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

LIST_WIDTH = 46  # characters per line of the step list
MIN_GAP = 0.03  # of the x range: closer step numbers go on another level


def _t0(evidence: Any) -> float:
    times = [f["ts"] for f in evidence.faults] + [p["created"] for p in evidence.pods if p.get("created")]
    return min(times) if times else 0.0


def _end(evidence: Any, t0: float) -> float:
    times = [f["ts"] for f in evidence.faults]
    for p in evidence.pods:
        times += [t for t in (p.get("created"), p.get("started"), p.get("finished")) if t]
    return max(times, default=t0) - t0


def levels(xs: list[float], gap: float) -> list[int]:
    """The level of each step's number: the lowest one whose last number is at least ``gap`` to
    the left (``xs`` in time order), so two numbers on one level never overlap."""
    last: list[float] = []
    out = []
    for x in xs:
        for level, at in enumerate(last):
            if x - at >= gap:
                last[level] = x
                out.append(level)
                break
        else:
            last.append(x)
            out.append(len(last) - 1)
    return out


def step_list(evidence: Any, t0: float) -> list[str]:
    lines = []
    for n, fault in enumerate(sorted(evidence.faults, key=lambda f: f["ts"]), 1):
        wrapped = textwrap.wrap(f"{fault['ts'] - t0:4.0f} s  {fault['what']}", LIST_WIDTH - 4,
                                subsequent_indent="        ")
        lines += [f"{n:>2}  {wrapped[0]}"] + [f"    {w}" for w in wrapped[1:]]
    return lines


def _tasks(evidence: Any) -> list[str]:
    """Every task with a pod or a row (a task that never got a pod, or failed, is shown too)."""
    return sorted({p.get("task_id") or "?" for p in evidence.pods} | {t["task_id"] for t in evidence.tis
                                                                      if t.get("task_id")})


def task_marks(evidence: Any) -> tuple[dict[str, float], dict[str, list[float]]]:
    """({task: when it ended failed}, {task: its stuck-in-queued re-queues}) from the change log and
    the scheduler logs (``stuck_in_queued``)."""
    failed_tasks = {t["task_id"] for t in evidence.tis if t.get("state") == "failed"}
    task_of, failed_at = {}, {}
    for entry in sorted(evidence.ti_log, key=lambda e: e["ts"]):
        if entry.get("task_id"):
            task_of[entry["ti_id"]] = entry["task_id"]
        if entry.get("state") == "failed" and entry.get("task_id") in failed_tasks:
            failed_at[entry["task_id"]] = entry["ts"]
    requeued: dict[str, list[float]] = {}
    for line in getattr(evidence, "stuck_in_queued", None) or ():
        if line["outcome"] == "requeued" and line["ti_id"] in task_of and line.get("ts") is not None:
            requeued.setdefault(task_of[line["ti_id"]], []).append(line["ts"])
    return failed_at, requeued


def _panel(ax: Any, side: Any, evidence: Any, t0: float, span: float, title: str) -> None:
    tasks = _tasks(evidence)
    row = {task: i for i, task in enumerate(tasks)}
    per_task: dict[str, list[dict]] = {}
    for pod in sorted(evidence.pods, key=lambda p: p.get("created") or 0):
        if pod.get("created"):
            per_task.setdefault(pod.get("task_id") or "?", []).append(pod)
    for task, task_pods in per_task.items():
        lane = 0.8 / len(task_pods)
        for k, pod in enumerate(task_pods):
            y = row[task] - 0.4 + lane * (k + 0.5)
            start, end = pod.get("started"), pod.get("finished")
            pending_end = start or end or pod["created"]
            ax.barh(y, max(pending_end - pod["created"], 0.3), left=pod["created"] - t0, height=lane * 0.85,
                    color="lightgray", linewidth=0)
            if start:
                stale = pod.get("_stale", False)
                ran_stale = pod.get("_ran_superseded", stale and pod.get("ran_task"))
                ax.barh(y, max((end or start) - start, 0.3), left=start - t0, height=lane * 0.85,
                        color="tab:red" if stale else "tab:green", hatch="////" if ran_stale else None,
                        edgecolor="black" if ran_stale else None, linewidth=0)
    failed_at, requeued = task_marks(evidence)
    for task, times in requeued.items():
        ax.scatter([t - t0 for t in times], [row[task] + 0.42] * len(times), marker="|", s=30, color="black",
                   linewidths=0.8, zorder=3)
    for task, when in failed_at.items():
        ax.scatter([when - t0], [row[task]], marker="x", s=45, color="tab:red", linewidths=2, zorder=4)
    steps = sorted(evidence.faults, key=lambda f: f["ts"])
    xs = [f["ts"] - t0 for f in steps]
    stacked = levels(xs, MIN_GAP * span)
    top = len(tasks) - 0.5
    for n, (x, level) in enumerate(zip(xs, stacked), 1):
        ax.axvline(x, color="tab:orange", ls="--", lw=1)
        ax.text(x, top + 0.45 + 0.75 * level, str(n), ha="center", va="center", fontsize=7,
                bbox=dict(boxstyle="circle,pad=0.2", fc="white", ec="tab:orange", lw=0.8))
    ax.set_ylim(-0.6, top + 0.9 + 0.75 * (max(stacked, default=0)))
    ax.set_yticks(range(len(tasks)), [f"{t} failed" if t in failed_at else t for t in tasks], fontsize=7)
    for label, task in zip(ax.get_yticklabels(), tasks):
        if task in failed_at:
            label.set_color("tab:red")
    ax.set_title(title, fontsize=9, loc="left")
    side.axis("off")
    side.text(0.0, 1.0, "\n".join(step_list(evidence, t0)) or "no steps recorded", transform=side.transAxes,
              va="top", ha="left", fontsize=6.5, family="monospace")


def write(scenario: str, runs: dict[str, Any], path: Path, settings: dict[str, str] | None = None) -> None:
    import matplotlib.pyplot as plt

    fig = figure(scenario, runs, settings)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(scenario: str, runs: dict[str, Any], settings: dict[str, str] | None = None) -> Any:
    """The figure: a panel per executor (in ``runs`` order) on one x-axis, its steps beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from fenced_k8s_lab.report import settings_of, what_it_does

    settings = settings if settings is not None else settings_of([scenario]).get(scenario, {})
    starts = {executor: _t0(evidence) for executor, evidence in runs.items()}
    span = max([_end(evidence, starts[e]) for e, evidence in runs.items()] + [1.0])
    heights = []
    for evidence in runs.values():
        tasks = len(_tasks(evidence)) or 1
        heights.append(max(0.32 * tasks + 0.6, 0.105 * len(step_list(evidence, 0.0)) + 0.3, 1.6))
    fig, axes = plt.subplots(len(runs), 2, figsize=(12, sum(heights) + 1.6), squeeze=False,
                             gridspec_kw={"height_ratios": heights, "width_ratios": [3, 1]})
    for ax in axes[1:, 0]:
        ax.sharex(axes[0, 0])
    for (ax, side), (executor, evidence) in zip(axes, runs.items()):
        extra = settings.get(executor)
        _panel(ax, side, evidence, starts[executor], span, f"{executor} [{extra}]" if extra else executor)
    axes[-1, 0].set_xlim(0, span * 1.02)
    axes[-1, 0].set_xlabel("seconds since the run's first step or pod (the same scale in every panel)")
    fig.suptitle(textwrap.fill(f"{scenario}: {what_it_does(scenario)}", 120), fontsize=9, x=0.01, ha="left")
    fig.legend(handles=[Patch(color="lightgray", label="pod Pending"),
                        Patch(color="tab:green", label="pod running, current launch"),
                        Patch(color="tab:red", label="pod running, superseded launch"),
                        Patch(facecolor="tab:red", hatch="////", edgecolor="black",
                              label="ran the task code for a superseded launch"),
                        Line2D([], [], marker="|", ls="", color="black", label="stuck-in-queued re-queue"),
                        Line2D([], [], marker="x", ls="", color="tab:red", mew=2, label="task failed")],
               loc="lower left", ncol=6, fontsize=7, frameon=False, bbox_to_anchor=(0.01, 0.0))
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    return fig
