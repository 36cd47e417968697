"""The targets the figures are judged against, the fitted slopes, and the summary table.

A ratio target is met only when the whole spread of per-repetition ratios meets it (max for
"at most" targets, min for "at least" ones); ``met_median`` says whether the median alone would.
"""

from __future__ import annotations


def _get(d: dict, *path, default=None):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return default
        d = d[p]
    return d


def fit(xs: list[float], ys: list[float]) -> dict:
    """Least-squares line y = intercept + slope * x over the measured points."""
    n = len(xs)
    if n < 2:
        return {"slope": None, "intercept": None, "points": n}
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return {"slope": slope, "intercept": my - slope * mx, "points": n}


def _ratio_target(out: list, name: str, sp: dict | None, value: float | None, limit: float, at_most: bool,
                  aa: dict | None = None) -> None:
    """``aa``: the same measurement between two executors of one kind (the noise floor); reported
    beside the target with whether it would meet it, never counted in ``met``."""
    if value is None:
        return
    if sp is None:
        sp = {"median": value, "min": value, "max": value, "reps": 1}
    worst = sp["max"] if at_most else sp["min"]
    ok = (lambda v: v <= limit) if at_most else (lambda v: v >= limit)
    row = {"target": f"{name} {'<=' if at_most else '>='} {limit}x stock (whole spread)",
           "measured": _rounded(sp), "met": ok(worst), "met_median": ok(sp["median"])}
    if aa is not None:
        row["aa"] = {**_rounded(aa), "meets": ok(aa["max"] if at_most else aa["min"])}
    out.append(row)


def _rounded(sp: dict) -> dict:
    return {"median": round(sp["median"], 3), "min": round(sp["min"], 3), "max": round(sp["max"], 3),
            "reps": sp["reps"]}


def targets(r: dict) -> list[dict]:
    """[{target, measured, met}] for every target whose scenario ran (met None: not measurable here)."""
    out: list[dict] = []
    sp = r.get("ratio_spreads") or {}
    _ratio_target(out, "queue time (trigger_tasks)", sp.get("queue_time_ratio"), r.get("queue_time_ratio"), 1.1, True,
                  sp.get("queue_time_aa_ratio"))
    rt = r.get("precreate_round_trips_per_batch")
    if rt:
        fenced = {n: v["fenced"] for n, v in rt.items()}
        out.append({"target": "pre-create: exactly 1 DB round trip (statement) per batch, fenced",
                    "measured": fenced, "met": all(v == 1 for v in fenced.values())})
    if _get(r, "precreate_wall_ratio", "32") is not None:
        _ratio_target(out, "pre-create wall time at N=32", _get(sp, "precreate_wall_ratio", "32"),
                      r["precreate_wall_ratio"]["32"], 0.25, True)
    for mode, ratio in (r.get("launch_throughput_ratio") or {}).items():
        _ratio_target(out, f"launch throughput ({mode})", _get(sp, "launch_throughput_ratio", mode), ratio, 1.0, False)
    _ratio_target(out, "loop sync p50", sp.get("sync_p50_ratio"), r.get("sync_p50_ratio"), 1.1, True)
    _ratio_target(out, "loop sync p99", sp.get("sync_p99_ratio"), r.get("sync_p99_ratio"), 1.0, True)
    secs = r.get("sweep_seconds") or {}
    if secs:
        biggest = max(secs, key=int)
        for size, limit in (("10000", 2.0), ("100000", 10.0)):
            if size in secs:
                out.append({"target": f"sweep of {int(size):,} pods < {limit:g} s", "measured": round(secs[size], 3),
                            "met": secs[size] < limit})
        pages = _get(r, "sweep_pages", biggest)
        lists = _get(r, "sweep_api_calls", biggest, "list")
        queries = _get(r, "sweep_db_queries", biggest)
        out.append({"target": "sweep: O(pages) API list calls and DB queries",
                    "measured": {"pods": int(biggest), "pages": pages, "list_calls": lists, "db_queries": queries,
                                 "delete_calls": _get(r, "sweep_api_calls", biggest, "delete")},
                    "met": lists == pages and queries is not None and queries <= pages + 1})
        peaks = r.get("sweep_peak_bytes") or {}
        page = _get(r, "config", "page_size") or 1000
        full = [k for k in peaks if int(k) >= 2 * page]  # sizes with at least two full pages
        if len(full) >= 2:
            small, big = min(full, key=int), max(full, key=int)
            out.append({"target": "sweep memory bounded by one page (peak heap at the largest size <= 1.5x the"
                                  " peak at the smallest multi-page size)",
                        "measured": {k: f"{v / 1024:.0f} KiB" for k, v in peaks.items()},
                        "met": peaks[big] <= 1.5 * peaks[small]})
    orphans = r.get("orphans") or {}
    if orphans:
        measured = {mode: {"statements": f["fenced"]["statements_per_sync_max"], "api_calls": f["fenced"]["api_calls_per_sync"]}
                    for mode, f in orphans.items()}
        out.append({"target": "a dead scheduler's launches in flight: 1 DB statement per loop (fenced), API calls"
                              " per loop O(1): none idle, one per pod created busy",
                    "measured": measured,
                    "met": all(m["statements"] == 1 for m in measured.values()) and measured["idle"]["api_calls"] == 0
                    and measured["busy"]["api_calls"] <= r["config"]["loop_per_loop"]})
    loop = r.get("loop_statements_per_sync") or {}
    if loop:
        fenced = {n: v["fenced"] for n, v in loop.items()}
        out.append({"target": "launches in flight: 1 DB statement per loop, whatever their number (fenced)",
                    "measured": fenced, "met": all(v == 1 for v in fenced.values())})
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.2f} ms"


def _sp(r: dict, key: str, *path) -> str:
    sp = _get(r, "ratio_spreads", key, *path)
    if sp is None:
        v = _get(r, key, *path)
        return "-" if v is None else f"{v:.3f}"
    if sp["reps"] <= 1:
        return f"{sp['median']:.3f} (1 rep)"
    return f"{sp['median']:.3f} [{sp['min']:.3f}-{sp['max']:.3f}]"


def table(r: dict) -> str:
    if "error" in r or "skipped" in r:
        return f"(not run: {r.get('error') or r.get('skipped')})"
    rows: list[tuple[str, str, str, str]] = []
    if r.get("queue_time_seconds"):
        q = r["queue_time_seconds"]
        pin = r.get("queue_time_placement")
        where = f" (bench on CPU {pin['bench_cpu']}, Managers on {pin['manager_cpu']})" if pin else " (not pinned)"
        rows.append((f"queue time, {r['config']['queue_workloads']} workloads{where}", f"{q['stock']:.3f} s",
                     f"{q['fenced']:.3f} s", _sp(r, "queue_time_ratio")))
    for n, secs in (r.get("precreate_seconds_per_batch") or {}).items():
        rt = r["precreate_round_trips_per_batch"][n]
        rows.append((f"pre-create check, N={n}", f"{_ms(secs['stock'])} / {rt['stock']} stmt",
                     f"{_ms(secs['fenced'])} / {rt['fenced']} stmt", _sp(r, "precreate_wall_ratio", n)))
    for mode, pps in (r.get("launch_pods_per_second") or {}).items():
        st = _get(r, "launch_statements_per_pod", mode) or {}
        rows.append((f"launch {mode} (pods/s of sync)", f"{pps['stock']:.0f} ({st.get('stock', 0):.2f} stmt/pod)",
                     f"{pps['fenced']:.0f} ({st.get('fenced', 0):.2f} stmt/pod)",
                     _sp(r, "launch_throughput_ratio", mode)))
    for mode, per in (r.get("state_change_seconds_per_event") or {}).items():
        rows.append((f"state change, {mode} (per event)", f"{per['stock'] * 1e6:.0f} us",
                     f"{per['fenced'] * 1e6:.0f} us (fence {r['state_change_fence_us_per_event'][mode]:.0f} us)",
                     _sp(r, "state_change_ratio", mode)))
    for size, secs in (r.get("sweep_seconds") or {}).items():
        api = r["sweep_api_calls"][size]
        peak = _get(r, "sweep_peak_bytes", size)
        rows.append((f"sweep {int(size):,} pods", "n/a (no sweep)",
                     f"{secs:.3f} s, {api['list']} lists + {api['delete']} deletes, {r['sweep_db_queries'][size]} DB"
                     + (f", peak {peak / 1024:.0f} KiB" if peak is not None else ""), "-"))
    for k, v in (r.get("sweep_namespaces") or {}).items():
        rows.append((f"sweep {r['config']['sweep_fixed_pods']:,} pods in {k} namespaces", "n/a",
                     f"{v['seconds']:.3f} s, {v['api_lists']} lists, {v['db_queries']} DB", "-"))
    for k, v in (r.get("sweep_schedulers") or {}).items():
        rows.append((f"{k} schedulers sweep {r['config']['sweep_fixed_pods']:,} pods at once", "n/a",
                     f"{v['seconds']:.3f} s, {v['sweeps']} swept, {v['api_lists']} lists, {v['db_queries']} DB", "-"))
    for n, secs in (r.get("inflight_sync_seconds") or {}).items():
        st = r["loop_statements_per_sync"][n]
        api = r["loop_api_calls_per_sync"][n]
        rows.append((f"idle sync, {n} launches in flight", f"{_ms(secs['stock'])}, {st['stock']} stmt, {api['stock']:.1f} API",
                     f"{_ms(secs['fenced'])}, {st['fenced']} stmt, {api['fenced']:.1f} API",
                     _sp(r, "inflight_sync_ratio", n)))
    if r.get("sync_p99_seconds"):
        for q in ("p50", "p99"):
            v = r[f"sync_{q}_seconds"]
            rows.append((f"scheduler loop sync {q}", _ms(v["stock"]), _ms(v["fenced"]), _sp(r, f"sync_{q}_ratio")))
        st, api = r["sync_statements_per_sync"], r["sync_api_calls_per_sync"]
        rows.append(("scheduler loop, per sync", f"{st['stock']:.2f} stmt, {api['stock']:.2f} API",
                     f"{st['fenced']:.2f} stmt, {api['fenced']:.2f} API", "-"))
    for key, label in (("queue_time_aa_ratio", "queue time, A/A: control (stock) / stock"),
                       ("sync_p50_aa_ratio", "loop sync p50, A/A: one executor / another, same kind"),
                       ("sync_p50_single_ratio", "loop sync p50, fenced/stock at one executor's syncs"),
                       ("sync_p99_aa_ratio", "loop sync p99, A/A: one executor / another, same kind"),
                       ("sync_p99_single_ratio", "loop sync p99, fenced/stock at one executor's syncs"),
                       ("queue_time_cpu_ratio", "queue time, CPU of this process"),
                       ("sync_p50_cpu_ratio", "loop sync p50, CPU"), ("sync_p99_cpu_ratio", "loop sync p99, CPU")):
        if _get(r, "ratio_spreads", key):
            rows.append((label, "", "", _sp(r, key)))
    for mode in (_get(r, "ratio_spreads", "launch_throughput_cpu_ratio") or {}):
        rows.append((f"launch {mode}, pods per CPU second", "", "", _sp(r, "launch_throughput_cpu_ratio", mode)))
    head = ("measurement", "stock", "fenced", "fenced/stock median [min-max]")
    widths = [max(len(str(row[i])) for row in rows + [head]) for i in range(4)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*row) for row in rows]
    for name, key, unit in (("sweep wall", "sweep_fit", "pods"), ("sweep CPU (bench + API server)", "sweep_cpu_fit", "pods"),
                            ("sweep wall", "sweep_namespaces_fit", "namespaces (same pods)")):
        f = r.get(key)
        if f and f.get("slope") is not None:
            lines.append(f"fit: {name} seconds = {f['intercept']:.4f} + {f['slope'] * 1e6:.2f} us x {unit}")
    for kind, f in (r.get("inflight_fit") or {}).items():
        if f.get("slope") is not None:
            lines.append(f"fit: idle sync ({kind}) = {f['intercept'] * 1e3:.3f} ms + {f['slope'] * 1e6:.3f} us x launches in flight")
    lines.append("")
    lines.append("targets (a ratio target is MET only when its whole min-max spread meets it):")
    for t in r.get("targets", []):
        mark = {True: "MET   ", False: "MISSED", None: "n/a   "}[t["met"]]
        extra = "" if t.get("met_median") is None or t["met"] else f" (median alone: {'met' if t['met_median'] else 'missed'})"
        if t.get("aa"):
            aa = t["aa"]
            extra += f"; A/A {aa['median']} [{aa['min']}-{aa['max']}] {'meets' if aa['meets'] else 'misses'} it"
        lines.append(f"  [{mark}] {t['target']}: {t['measured']}{extra}")
    m = r.get("machine", {})
    lines.append(f"machine: {m.get('cores')} cores, Python {m.get('python')}, PostgreSQL {m.get('postgresql')},"
                 f" Airflow {m.get('versions', {}).get('apache-airflow')}, cncf-kubernetes"
                 f" {m.get('versions', {}).get('apache-airflow-providers-cncf-kubernetes')}, load average"
                 f" before/after {_load(m.get('load_before'))} / {_load(m.get('load_after'))}; kube: {r.get('kube')};"
                 f" Airflow logging_level {m.get('airflow_logging_level')} (to {m.get('airflow_log')})")
    return "\n".join(lines)


def _load(v) -> str:
    return "-" if not v else "/".join(f"{x:.1f}" for x in v)
