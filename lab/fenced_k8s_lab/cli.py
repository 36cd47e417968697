"""``fenced-k8s-repro``: the HA reproduction, stock vs fenced side by side (and ``bench``)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from fenced_k8s_lab.scenarios import DEFAULT, SCENARIOS


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fenced-k8s-repro",
        description="Run real Airflow HA (embedded PostgreSQL, Kubernetes API emulator or a real kube-apiserver, "
        "process kubelet) "
        "through the failure modes of apache/airflow#69760 with the stock and the fenced executor.",
        epilog="Subcommands: `fenced-k8s-repro bench --help` for the cost benchmark; `fenced-k8s-repro image "
        "--help` builds the project image from the Dockerfile without Docker (and loads it onto ../shared/node); "
        "`fenced-k8s-repro report OUT` rewrites a saved run's report from its evidence.",
    )
    p.add_argument("--executor", choices=["stock", "fenced", "both"], default="both")
    p.add_argument("--scenario", default=",".join(DEFAULT),
                   help=f"comma-separated names or 'all' ({', '.join(SCENARIOS)}); default: {','.join(DEFAULT)}")
    p.add_argument("--schedulers", type=int, default=2)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="small sizes (what CI runs)")
    p.add_argument("--out", type=Path, default=None, help="directory for evidence, Markdown report and PNG timelines")
    p.add_argument("--json", type=Path, default=None, help="write the measurements as JSON")
    p.add_argument("--kube", choices=["emulator", "real"], default="emulator",
                   help="Kubernetes API: the emulator (fresh per run; every scenario), or a real kube-apiserver "
                   "v1.36.2 + etcd started from KUBEBUILDER_ASSETS (fault-free scenarios only)")
    p.add_argument("--kubeconfig", type=Path, default=None,
                   help="run on an existing cluster instead (../shared/node, kind): its kubelet runs the worker pods "
                   "in --image as real containers; fault-free scenarios only. The lab's Airflow processes run on "
                   "this machine, which must share its file system with the node (hostPath DAGs)")
    p.add_argument("--node", action="store_true",
                   help="bring up ../shared/node, build and load the project image, run there (--kubeconfig of "
                   "that node), take the node down after")
    p.add_argument("--image", default=None, help="worker image on the cluster (default localhost/fenced-k8s-executor:dev,"
                   " built and loaded by `fenced-k8s-repro image --load`)")
    p.add_argument("--worker-host", default=None,
                   help="the address pods reach this machine by (default: the cluster node's InternalIP when it is "
                   "an address of this machine, as on ../shared/node)")
    return p


_FAULT_CONTROLS = {"fault", "clear_faults", "watch_gap", "scheduler_faults", "close_watches", "pod_quota"}


def needs_faults(fn: Any, _seen: set | None = None) -> bool:
    """Whether a scenario's drive function (or a module function it calls) injects API faults or
    watch gaps, which only the emulator can do on demand."""
    import inspect

    seen = _seen if _seen is not None else set()
    if fn in seen or not inspect.isfunction(fn):
        return False
    seen.add(fn)
    names = set(fn.__code__.co_names)
    return bool(names & _FAULT_CONTROLS) or any(needs_faults(fn.__globals__.get(n), seen) for n in names)


def _open_kube(args: argparse.Namespace, say) -> Any:
    """None (a fresh emulator per run), or a shared real apiserver / existing cluster."""
    kubeconfig = getattr(args, "kubeconfig", None)
    kind = getattr(args, "kube", "emulator")
    if not kubeconfig and kind == "emulator":
        return None
    from fenced_k8s_lab.controlplane import Shared, open_backend

    t0 = time.time()
    backend = open_backend(kind, kubeconfig)
    say(f"Kubernetes API: {backend.name} at {backend.url} (ready in {time.time() - t0:.1f}s)")
    return Shared(backend)


def run(args: argparse.Namespace, say=print) -> dict[str, dict[str, dict[str, Any]]]:
    import tempfile

    from fenced_k8s_lab import report
    from fenced_k8s_lab.postgres import start_from_template
    from fenced_k8s_lab.runner import run_one

    names = list(SCENARIOS) if args.scenario == "all" else [n.strip() for n in args.scenario.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIOS)} or all")
    executors = ["stock", "fenced"] if args.executor == "both" else [args.executor]
    if getattr(args, "kubeconfig", None) or getattr(args, "kube", "emulator") != "emulator":
        emulator_only = [n for n in names if needs_faults(SCENARIOS[n].drive)]
        if emulator_only:
            say(f"skipping {emulator_only}: they inject API faults, which only the emulator does on demand")
        names = [n for n in names if n not in emulator_only]
        if not names:
            raise SystemExit("no fault-free scenario selected for a real Kubernetes API")
    if getattr(args, "node", False):
        return _on_node(args, say)
    out = args.out or Path(tempfile.mkdtemp(prefix="fenced-lab-"))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    at = commit()  # the tree the run starts on (the checkout may move while it runs)
    say(f"fenced-k8s-repro: scenarios {names}, executors {executors}, seed {args.seed}, evidence in {out}")
    started = time.time()
    kube = _open_kube(args, say)
    say("starting embedded PostgreSQL (migrated template cached after the first run)")
    try:
        pg = start_from_template()
    except BaseException:
        if kube is not None:
            kube._backend.stop()
        raise
    results: dict[str, dict[str, dict[str, Any]]] = {}
    try:
        for name in names:
            runs = {}
            for executor in executors:
                outcome = run_one(SCENARIOS[name], executor, pg_server=pg, out_dir=out, seed=args.seed,
                                  quick=args.quick, schedulers=args.schedulers, say=say, kube=kube,
                                  image=getattr(args, "image", None), worker_host=getattr(args, "worker_host", None))
                results.setdefault(name, {})[executor] = outcome["metrics"]
                runs[executor] = outcome["evidence"]
            if args.out:
                report.write_timeline(name, runs, out / f"{name}-timeline.png")
    finally:
        pg.stop()
        if kube is not None:
            kube._backend.stop()
    say(report.table(results))
    say(f"\ntotal wall time {time.time() - started:.0f}s")
    if args.json:
        report.write_json(results, args.json)
    context = {"command": getattr(args, "command", None), "scenarios": names, "seed": args.seed,
               "quick": args.quick, "schedulers": args.schedulers, "wall_seconds": time.time() - started,
               "machine": machine(load), "commit": at}
    say("\n" + report.headline_markdown(results, context))
    if args.out:
        (out / "run.json").write_text(json.dumps({"context": context, "results": results}, indent=1, default=str))
        report.write_markdown(results, out / "report.md", context)
        (out / "headline.md").write_text(report.headline_markdown(results, context))
        say(f"report: {out / 'report.md'}; the headline table: {out / 'headline.md'}")
    return results


def machine(load: float | None = None) -> str:
    """This machine in a few words: cores, CPU model, load when the run started."""
    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    except OSError:
        pass
    text = f"a {os.cpu_count()}-core {platform.machine()} machine" + (f" ({model})" if model else "")
    if load is not None:
        text += f", load average {load:.1f} at the start"
    return text + f", Python {platform.python_version()}"


def commit() -> str | None:
    """The checkout's commit (with "+ local changes" when its tree differs), None outside git."""
    import subprocess

    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + (" + local changes" if dirty.stdout.strip() else "")


def rerender(out: Path, say=print) -> None:
    """``fenced-k8s-repro report OUT``: judge a saved run's evidence again with this checkout's rules
    and rewrite its report.md, headline.md and timelines (the context is the run's own)."""
    from fenced_k8s_lab import report
    from fenced_k8s_lab.measure import Evidence, measure

    saved = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {"context": {}}
    results: dict[str, dict[str, dict[str, Any]]] = {}
    names = saved["context"].get("scenarios") or sorted(p.parent.parent.name for p in out.glob("*/*/evidence.json"))
    for name in names:
        runs = {}
        for executor in ("stock", "fenced"):
            path = out / name / executor / "evidence.json"
            if path.exists():
                runs[executor] = Evidence(**json.loads(path.read_text()))
                results.setdefault(name, {})[executor] = measure(runs[executor])
        if runs:
            report.write_timeline(name, runs, out / f"{name}-timeline.png")
    report.write_markdown(results, out / "report.md", saved["context"])
    (out / "headline.md").write_text(report.headline_markdown(results, saved["context"]))
    say(report.headline_markdown(results, saved["context"]))


def _on_node(args: argparse.Namespace, say) -> dict[str, dict[str, dict[str, Any]]]:
    """``--node``: ../shared/node up, the project image built and loaded, the run, the node down."""
    import subprocess

    from fenced_k8s_lab import node as node_mod

    why = node_mod.skip_reason()
    if why:
        raise SystemExit(f"--node: {why}")
    node = node_mod.Node().start()
    try:
        say(f"real node up ({node.timings}); building and loading the project image")
        built = subprocess.run([sys.executable, "-m", "fenced_k8s_lab.image", "--target", "kind"],
                               capture_output=True, text=True)
        if built.returncode != 0:
            raise SystemExit(f"image build failed:\n{built.stderr[-3000:]}")
        node.load(built.stdout.strip().splitlines()[-1])
        return run(argparse.Namespace(**{**vars(args), "node": False, "kubeconfig": Path(node.kubeconfig)}), say)
    finally:
        node.stop()
        say(f"real node steps (s): {node.timings}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        from fenced_k8s_lab.bench import main as bench_main

        return bench_main(argv[1:]) or 0
    if argv[:1] == ["report"]:
        if len(argv) != 2:
            raise SystemExit("usage: fenced-k8s-repro report OUT (a directory a run with --out wrote)")
        rerender(Path(argv[1]))
        return 0
    if argv[:1] == ["image"]:
        from fenced_k8s_lab.image import main as image_main

        return image_main(argv[1:])
    args = _parser().parse_args(argv)
    args.command = " ".join(["fenced-k8s-repro", *argv])
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
