"""The targets the figures are judged against, and the summary table."""

from __future__ import annotations


def _get(d: dict, *path, default=None):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return default
        d = d[p]
    return d


def targets(r: dict) -> list[dict]:
    """[{target, measured, met}] for every target whose scenario ran (met None: not measurable here)."""
    out = []
    rt = r.get("precreate_round_trips_per_batch")
    if rt:
        fenced = {n: v["fenced"] for n, v in rt.items()}
        out.append({"target": "pre-create: exactly 1 DB round trip (statement) per batch, fenced",
                    "measured": fenced, "met": all(v == 1 for v in fenced.values())})
    ratio = _get(r, "precreate_wall_ratio", "32")
    if ratio is not None:
        out.append({"target": "pre-create wall time at N=32 <= 0.25x stock", "measured": round(ratio, 3),
                    "met": ratio <= 0.25})
    for mode, ratio in (r.get("launch_throughput_ratio") or {}).items():
        out.append({"target": f"launch throughput ({mode}) fenced >= 1.0x stock", "measured": round(ratio, 3),
                    "met": ratio >= 1.0})
    secs = r.get("sweep_seconds") or {}
    if secs:
        biggest = max(secs, key=int)
        out.append({"target": f"sweep of 10,000 pods < 2 s (largest run: {biggest} pods)",
                    "measured": round(secs[biggest], 3), "met": secs[biggest] < 2.0 if biggest == "10000" else None})
        size = int(biggest)
        pages = _get(r, "sweep_pages", biggest)
        lists = _get(r, "sweep_api_calls", biggest, "list")
        queries = _get(r, "sweep_db_queries", biggest)
        out.append({"target": "sweep: O(pages) API list calls and DB queries",
                    "measured": {"pods": size, "pages": pages, "list_calls": lists, "db_queries": queries,
                                 "delete_calls": _get(r, "sweep_api_calls", biggest, "delete")},
                    "met": lists == pages and queries is not None and queries <= pages + 1})
    ratio = r.get("sync_p99_ratio")
    if ratio is not None:
        out.append({"target": "scheduler loop: sync p99 fenced <= 1.1x stock", "measured": round(ratio, 3),
                    "met": ratio <= 1.1})
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.2f} ms"


def table(r: dict) -> str:
    rows: list[tuple[str, str, str, str]] = []
    for n, secs in (r.get("precreate_seconds_per_batch") or {}).items():
        rt = r["precreate_round_trips_per_batch"][n]
        rows.append((f"pre-create check, N={n}", f"{_ms(secs['stock'])} / {rt['stock']} stmt",
                     f"{_ms(secs['fenced'])} / {rt['fenced']} stmt", f"{r['precreate_wall_ratio'][n]:.3f}"))
    for mode, pps in (r.get("launch_pods_per_second") or {}).items():
        rows.append((f"launch {mode} (pods/s)", f"{pps['stock']:.0f}", f"{pps['fenced']:.0f}",
                     f"{r['launch_throughput_ratio'][mode]:.3f}"))
    for mode, per in (r.get("state_change_seconds_per_event") or {}).items():
        rows.append((f"state change, {mode} (per event)", f"{per['stock'] * 1e6:.0f} us",
                     f"{per['fenced'] * 1e6:.0f} us (fence {r['state_change_fence_us_per_event'][mode]:.0f} us)",
                     f"{r['state_change_ratio'][mode]:.3f}"))
    for size, secs in (r.get("sweep_seconds") or {}).items():
        api = r["sweep_api_calls"][size]
        rows.append((f"sweep {size} pods", "n/a (no sweep)",
                     f"{secs:.3f} s, {api['list']} lists + {api['delete']} deletes, {r['sweep_db_queries'][size]} DB",
                     "-"))
    if r.get("sync_p99_seconds"):
        for q in ("p50", "p99"):
            v = r[f"sync_{q}_seconds"]
            rows.append((f"scheduler loop sync {q}", _ms(v["stock"]), _ms(v["fenced"]), f"{r[f'sync_{q}_ratio']:.3f}"))
    head = ("measurement", "stock", "fenced", "fenced/stock")
    widths = [max(len(str(row[i])) for row in rows + [head]) for i in range(4)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*row) for row in rows]
    lines.append("")
    lines.append("targets:")
    for t in r.get("targets", []):
        mark = {True: "MET   ", False: "MISSED", None: "n/a   "}[t["met"]]
        lines.append(f"  [{mark}] {t['target']}: {t['measured']}")
    m = r.get("machine", {})
    lines.append(f"machine: {m.get('cores')} cores, Python {m.get('python')}, PostgreSQL {m.get('postgresql')},"
                 f" Airflow {m.get('versions', {}).get('apache-airflow')}, cncf-kubernetes"
                 f" {m.get('versions', {}).get('apache-airflow-providers-cncf-kubernetes')}")
    return "\n".join(lines)
