"""The scale bench's figures judged: per size, stock beside fenced (medians over repetitions),
fenced/stock per ABBA pair with its spread, the A/A spread beside it, the targets of issue 48,
fits against tasks in flight, the docs table and the plot.

    python -m fenced_k8s_lab.bench.scale_report scale.json --out DIR   # table and plot again
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from fenced_k8s_lab.bench.env import median, ratio_spread
from fenced_k8s_lab.bench.report import fit

KINDS = ("stock", "fenced")
SCHEDULERS = ("scheduler-0", "scheduler-1")
#: The API verbs the table shows, as the emulator's audit names them.
VERBS = ("create", "get", "list", "watch", "patch", "delete")
#: The witness's Lease calls, counted apart from the pod calls (``scale.WITNESS``).
WITNESS = "lease:"
#: The fences' one list and watch per scheduler process (``in_flight.InFlightPods``), beside the
#: provider's own; the targets allow these, per deployment, and nothing else.
LIST_WATCH = ("list", "watch")
LIMITS = {"loop": 1.05, "throughput": 0.95, "memory": 1.10, "startup_seconds": 5.0}
#: The phases whose loops are judged: the fan-out, N tasks in flight, and their completion.
BUSY = ("fanout", "steady", "finish")


def _median(values: list[float]) -> float | None:
    return median(values) if values else None


def _num(v) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _metrics(run: dict) -> dict:
    """One run's figures as flat numbers (None: not measured)."""
    ph = run["phases"]
    out = {}
    for phase in ("idle", *BUSY):
        out[f"{phase}_p50"] = _num(ph[phase]["loop_p50"])
        out[f"{phase}_p99"] = _num(ph[phase]["loop_p99"])
        out[f"{phase}_share"] = _num(ph[phase]["executor_share"])
        per = [v for v in ph[phase]["statements_per_loop"].values() if v is not None]
        out[f"{phase}_statements"] = sum(per) / len(per) if per else None
        for r in SCHEDULERS:
            out[f"{phase}_p50_{r}"] = _num(ph[phase]["loop_p50_by_scheduler"][r])
            out[f"{phase}_p99_{r}"] = _num(ph[phase]["loop_p99_by_scheduler"][r])
    out["all_pods"] = _num(run["fanout"]["all_pods"])
    out["all_running"] = _num(run["fanout"]["all_running"])
    out["throughput"] = _num(run["tasks_per_second"])
    out["startup"] = _num(run["startup"]["first_loop_after_job_start"])
    out["startup_spawn"] = _num(run["startup"]["first_loop_after_spawn"])
    for step in ("executors_start", "adoption", "first_loop"):
        out[f"startup_{step}"] = _num(run["startup"].get(step))
    out["old_exit"] = _num(run["startup"]["old_exit_seconds"])
    out["finish_deleted"] = _num(run["finish"]["all_deleted"])
    pss = [run["memory"]["peak_pss_mb"].get(r) for r in SCHEDULERS]
    out["pss"] = max(pss) if all(pss) else None
    rss = [run["memory"]["peak_rss_mb"].get(r) for r in SCHEDULERS]
    out["rss"] = max(rss) if all(rss) else None
    calls = api_calls(run)
    for verb in VERBS:
        out[f"api_{verb}"] = sum(calls.get(verb, {}).values()) / run["size"]
    deletes = sum(calls.get("delete", {}).values())
    out["api_delete_404"] = calls.get("delete", {}).get("404", 0) / run["size"]
    out["delete_404_share"] = calls.get("delete", {}).get("404", 0) / deletes if deletes else 0.0
    out["api_other"] = sum(sum(c.values()) for v, c in calls.items()
                           if v not in VERBS and not v.startswith(WITNESS)) / run["size"]
    per_loop = [p.get("witness_calls_per_loop") for p in run["phases"].values()]
    out["witness_per_loop"] = max((x for x in per_loop if x is not None), default=None)
    handed = run["startup"].get("handed_over")
    restart = run["phases"]["restart"]["api"].get("patch", {})
    out["patch_per_handed_over"] = sum(restart.values()) / handed if handed else None
    return out


def api_calls(run: dict) -> dict[str, dict[str, int]]:
    """The schedulers' API calls over the whole run (every phase), by verb and status."""
    total: dict[str, dict[str, int]] = {}
    for phase in run["phases"].values():
        for verb, codes in phase["api"].items():
            for code, count in codes.items():
                total.setdefault(verb, {})
                total[verb][code] = total[verb].get(code, 0) + count
    return total


def _pairs(runs: dict[str, list[dict]], key: str) -> tuple[list[float], list[float]]:
    """fenced/stock of each repetition, and the A/A ratios: each kind's next repetition over its
    previous one, and each run's scheduler-1 over scheduler-0 where the key has one per scheduler."""
    ratio = [f[key] / s[key] for s, f in zip(runs["stock"], runs["fenced"]) if f.get(key) and s.get(key)]
    aa = [b[key] / a[key] for kind in KINDS for a, b in zip(runs[kind], runs[kind][1:]) if a.get(key) and b.get(key)]
    k0, k1 = f"{key}_{SCHEDULERS[0]}", f"{key}_{SCHEDULERS[1]}"
    aa += [m[k1] / m[k0] for kind in KINDS for m in runs[kind] if m.get(k0) and m.get(k1)]
    return ratio, aa


def summarise(result: dict) -> dict:
    """Per size: each kind's medians, fenced/stock spreads, A/A spreads; the targets; the fits."""
    sizes: dict[str, dict] = {}
    for n in result["config"]["sizes"]:
        runs = {kind: [_metrics(r) for r in sorted(result["runs"], key=lambda r: r["rep"])
                       if r["size"] == n and r["kind"] == kind and "error" not in r] for kind in KINDS}
        if not all(runs.values()):
            sizes[str(n)] = {"error": "a kind has no complete run at this size"}
            continue
        medians = {kind: {k: _median([m[k] for m in runs[kind] if m.get(k) is not None])
                          for k in runs[kind][0]} for kind in KINDS}
        spreads, aa = {}, {}
        for key in (*(f"{p}_{q}" for p in BUSY for q in ("p50", "p99")), "throughput", "finish_deleted", "pss", "rss",
                    "startup"):
            ratio, noise = _pairs(runs, key)
            if ratio:
                spreads[key] = ratio_spread(ratio)
            if noise:
                aa[key] = ratio_spread(noise)
        sizes[str(n)] = {"stock": medians["stock"], "fenced": medians["fenced"], "ratio": spreads, "aa": aa,
                         "runs": {kind: len(runs[kind]) for kind in KINDS}}
    return {"sizes": sizes, "targets": targets(sizes), "fits": fits(result, sizes)}


def _judge(name: str, sp: dict | None, limit: float, at_most: bool, aa: dict | None) -> dict | None:
    if not sp:
        return None
    worst = sp["max"] if at_most else sp["min"]
    ok = (lambda v: v <= limit) if at_most else (lambda v: v >= limit)
    row = {"target": name, "measured": _r(sp), "met": ok(worst), "met_median": ok(sp["median"])}
    if aa:
        row["aa"] = {**_r(aa), "meets": ok(aa["max"] if at_most else aa["min"])}
    if not row["met"]:
        off = (worst / limit - 1) if at_most else (1 - worst / limit)
        row["by"] = f"{off * 100:.1f} %"
        if aa and not row["aa"]["meets"]:
            row["note"] = "the A/A spread misses it too: not resolvable in this run"
    return row


def _r(sp: dict) -> dict:
    return {k: round(sp[k], 3) for k in ("median", "min", "max")} | {"reps": sp["reps"]}


def targets(sizes: dict) -> list[dict]:
    out: list[dict] = []
    ok_sizes = {n: s for n, s in sizes.items() if "error" not in s}
    for n, s in ok_sizes.items():
        for phase in BUSY:
            for q in ("p50", "p99"):
                key = f"{phase}_{q}"
                out.append(_judge(f"{int(n):,} tasks: loop duration {q} ({phase}) <= {LIMITS['loop']}x stock",
                                  s["ratio"].get(key), LIMITS["loop"], True, s["aa"].get(key)))
        out.append(_judge(f"{int(n):,} tasks: throughput >= {LIMITS['throughput']}x stock",
                          s["ratio"].get("throughput"), LIMITS["throughput"], False, s["aa"].get("throughput")))
        stock, fenced = s["stock"], s["fenced"]
        # patches: the restarted scheduler adopting its predecessor's pods, one each; how many pods
        # that was depends on which scheduler queued which task: per pod handed over, not per task
        keys = {v: f"api_{v}" for v in VERBS if v not in LIST_WATCH} | {"patch": "patch_per_handed_over"}
        measured = {v: {k: None if s[k][key] is None else round(s[k][key], 3) for k in KINDS}
                    for v, key in keys.items()}
        out.append({"target": f"{int(n):,} tasks: no more API calls per task than stock (create, get, delete; patch"
                              " per pod handed over at the restart)", "measured": measured,
                    "met": all(m["fenced"] <= m["stock"] for m in measured.values() if None not in m.values())})
        extra = {v: round((fenced[f"api_{v}"] - stock[f"api_{v}"]) * int(n), 1) for v in LIST_WATCH}
        out.append({"target": f"{int(n):,} tasks: list and watch calls beyond stock's: the fences' own, per"
                              " scheduler process (3 per run: two, and the restarted one)",
                    "measured": {"extra_calls_per_run": extra}, "met": None})
        out.append({"target": f"{int(n):,} tasks: the witness's Lease calls per scheduler loop (fenced only; the"
                              " busiest phase)", "measured": {"fenced": s["fenced"].get("witness_per_loop")},
                    "met": None})
        out.append({"target": f"{int(n):,} tasks: no more 404s per delete than stock",
                    "measured": {k: round(s[k]["delete_404_share"], 3) for k in KINDS},
                    "met": s["fenced"]["delete_404_share"] <= s["stock"]["delete_404_share"]})
    if ok_sizes:
        biggest = max(ok_sizes, key=int)
        s = ok_sizes[biggest]
        out.append(_judge(f"{int(biggest):,} tasks: peak scheduler PSS <= stock's + 10 %", s["ratio"].get("pss"),
                          LIMITS["memory"], True, s["aa"].get("pss")))
        startup = s["fenced"].get("startup")
        out.append({"target": f"{int(biggest):,} tasks: start-up (job start to its first full loop) < "
                              f"{LIMITS['startup_seconds']:g} s, fenced",
                    "measured": {k: None if s[k].get("startup") is None else round(s[k]["startup"], 2) for k in KINDS},
                    "met": None if startup is None else startup < LIMITS["startup_seconds"]})
    return [t for t in out if t is not None]


def fits(result: dict, sizes: dict) -> dict:
    """Least-squares lines against tasks in flight, per kind: the steady loop's p50 and p99 (with
    the idle phase as 0 tasks) and the schedulers' peak PSS."""
    out: dict[str, dict] = {}
    for kind in KINDS:
        runs = [r for r in result["runs"] if r["kind"] == kind and "error" not in r]
        points = {"loop_p50": [], "loop_p99": [], "pss": []}
        for r in runs:
            m = _metrics(r)
            for q in ("p50", "p99"):
                if m[f"idle_{q}"] is not None:
                    points[f"loop_{q}"].append((0, m[f"idle_{q}"]))
                if m[f"steady_{q}"] is not None:
                    points[f"loop_{q}"].append((r["size"], m[f"steady_{q}"]))
            if m["pss"] is not None:
                points["pss"].append((r["size"], m["pss"]))
        out[kind] = {k: {**fit([x for x, _ in v], [y for _, y in v]), "xy": v} for k, v in points.items()}
    return out


# ---------------------------------------------------------------- output


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.0f}" if v >= 0.1 else f"{v * 1e3:.1f}"


def _sp(sp: dict | None) -> str:
    if not sp:
        return "-"
    return f"{sp['median']:.3f}" + ("" if sp["reps"] <= 1 else f" [{sp['min']:.3f}-{sp['max']:.3f}]")


def _line_table(version: str, r: dict) -> list[str]:
    """Two tables (the loop; the rest), the fits and the targets of one Airflow line."""
    if "error" in r:
        return [f"Airflow {version}: not run ({r['error']})", ""]
    m = r["machine"]
    sm = r["summary"]
    lines = [f"**Airflow {version}**, cncf-kubernetes {m['versions'].get('apache-airflow-providers-cncf-kubernetes')},"
             f" commit {m.get('package_tree', {}).get('head')}, load average {_load(m.get('load_before'))} before,"
             f" {_load(m.get('load_after'))} after, {r.get('seconds', 0) / 60:.0f} min", "",
             "| tasks | kind | loop p50 / p99 (ms): fan-out | steady | finish | executor share: fan-out, steady,"
             " finish | statements per loop: fan-out, steady, finish |", "|---|---|---|---|---|---|---|"]
    rest = ["| tasks | kind | all pods / all running (s) | tasks/s | finish: all deleted (s) | API calls per task:"
            " create, get, list, watch, patch, delete (404) | peak PSS (main RSS), MB | start-up (s) |",
            "|---|---|---|---|---|---|---|---|"]
    for n, s in sm["sizes"].items():
        if "error" in s:
            lines.append(f"| {int(n):,} | - | {s['error']} |||||")
            continue
        for kind in KINDS:
            k = s[kind]
            loops = " | ".join(f"{_ms(k[f'{p}_p50'])} / {_ms(k[f'{p}_p99'])}" for p in BUSY)
            shares = ", ".join(_pct(k[f"{p}_share"]) for p in BUSY)
            statements = ", ".join(_f(k[f"{p}_statements"], 1) for p in BUSY)
            lines.append(f"| {int(n):,} | {kind} ({s['runs'][kind]}) | {loops} | {shares} | {statements} |")
            api = ", ".join(f"{k[f'api_{v}']:.2f}" for v in VERBS) + f" ({k['api_delete_404']:.2f})"
            rest.append(f"| {int(n):,} | {kind} ({s['runs'][kind]}) | {_f(k['all_pods'])} / {_f(k['all_running'])} |"
                        f" {_f(k['throughput'])} | {_f(k['finish_deleted'])} | {api} | {_f(k['pss'], 0)}"
                        f" ({_f(k['rss'], 0)}) | {_f(k['startup'])}: executor {_f(k['startup_executors_start'])},"
                        f" adoption {_f(k['startup_adoption'])}, loop {_f(k['startup_first_loop'])} |")
        ratio = {k: f"{_sp(s['ratio'].get(k))} (A/A {_sp(s['aa'].get(k))})" for k in s["ratio"]}
        loops = " | ".join(f"{ratio.get(f'{p}_p50', '-')} / {ratio.get(f'{p}_p99', '-')}" for p in BUSY)
        lines.append(f"| {int(n):,} | fenced/stock (A/A) | {loops} | | |")
        rest.append(f"| {int(n):,} | fenced/stock (A/A) | | {ratio.get('throughput', '-')} |"
                    f" {ratio.get('finish_deleted', '-')} | | {ratio.get('pss', '-')} | {ratio.get('startup', '-')} |")
    lines += [""] + rest
    lines.append("")
    for kind, f in sm["fits"].items():
        p50, p99, pss = f["loop_p50"], f["loop_p99"], f["pss"]
        if p50.get("slope") is not None:
            lines.append(f"- fit, {kind}: loop p50 = {p50['intercept'] * 1e3:.1f} ms + {p50['slope'] * 1e6:.2f} ms"
                         f" per 1,000 tasks in flight; p99 = {p99['intercept'] * 1e3:.1f} ms +"
                         f" {(p99['slope'] or 0) * 1e6:.2f} ms per 1,000" +
                         (f"; peak PSS = {pss['intercept']:.0f} MB + {pss['slope'] * 1000:.1f} MB per 1,000"
                          if pss.get("slope") is not None else ""))
    lines.append("")
    for t in sm["targets"]:
        mark = {True: "met", False: "MISSED", None: "reported"}[t["met"]]
        extra = f" (by {t['by']})" if t.get("by") else ""
        if t.get("aa"):
            extra += f"; A/A {t['aa']['median']} [{t['aa']['min']}-{t['aa']['max']}]"
        if t.get("note"):
            extra += f"; {t['note']}"
        lines.append(f"- **{mark}** {t['target']}: {_measured(t['measured'])}{extra}")
    return lines + [""]


def _measured(v) -> str:
    if isinstance(v, dict) and "median" in v:
        return _sp(v)
    return json.dumps(v)


def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f} %"


def _load(v) -> str:
    return "-" if not v else "/".join(f"{x:.1f}" for x in v)


def table(result: dict) -> str:
    """The docs table: one block per Airflow line."""
    lines: list[str] = []
    for version, r in result["scale"].items():
        lines += _line_table(version, r)
    return "\n".join(lines)


def plot(result: dict, path: Path) -> Path:
    """Loop duration (steady p50 and p99) and peak scheduler PSS against tasks in flight, stock and
    fenced, every Airflow line (the first filled, the next hollow, each its own line style), with
    the fitted lines; one figure, shared x-axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 7))
    colours = {"stock": "tab:blue", "fenced": "tab:orange"}
    styles = ["-", "--", ":", "-."]
    for i, (version, r) in enumerate(result["scale"].items()):
        if "error" in r:
            continue
        for kind, f in r["summary"]["fits"].items():
            for key, axis, scale, marker in (("loop_p50", top, 1e3, "o"), ("loop_p99", top, 1e3, "^"),
                                             ("pss", bottom, 1.0, "s")):
                xy = f[key]["xy"]
                if not xy:
                    continue
                label = f"{kind}, Airflow {version}" + (f", {key[5:]}" if axis is top else "")
                axis.scatter([x for x, _ in xy], [y * scale for _, y in xy], marker=marker, s=22, alpha=0.8,
                             label=label, edgecolors=colours[kind],
                             facecolors=colours[kind] if i == 0 else "none")  # hollow: the second line
                if f[key].get("slope") is not None:
                    xs = [0, max(x for x, _ in xy)]
                    axis.plot(xs, [(f[key]["intercept"] + f[key]["slope"] * x) * scale for x in xs],
                              color=colours[kind], linestyle=styles[i % len(styles)], linewidth=1)
    top.set_ylabel("scheduler_loop_duration (ms)")
    top.set_title("Scheduler loop with N tasks in flight (steady), two schedulers per deployment")
    bottom.set_ylabel("peak PSS per scheduler (MB)")
    bottom.set_xlabel("tasks in flight (mapped task instances)")
    for axis in (top, bottom):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_docs(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    md = out / "scale.md"
    md.write_text(table(result) + "\n")
    return [md, plot(result, out / "scale.png")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the scale bench's table and plot from its saved JSON")
    ap.add_argument("json")
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    result = json.loads(Path(args.json).read_text())
    for version, r in result["scale"].items():
        if "runs" in r:
            r["summary"] = summarise(r)
    for path in write_docs(result, Path(args.out)):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
