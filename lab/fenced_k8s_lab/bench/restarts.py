"""Issue 28's and 35's costs: a live scheduler's loop with another scheduler's launches in flight
(a dead one's, or a live peer's), and the start-up of a fenced scheduler with many pods in its
namespace (stock vs fenced in one run)."""

from __future__ import annotations

import os
import time
from typing import Any

from fenced_k8s_lab.bench.env import (KINDS, Lab, fmt_spread, median, percentile, progress, quiet_gc,
                                               ratio_spread, spread, workload)
from fenced_k8s_lab.core import trigger  # trigger_workloads on Airflow 3.4
from fenced_k8s_lab.bench.sweeping import DEPLOYMENT, clear, fill

#: The dead scheduler's job id: no Job row has it, so no scheduler of that id is running.
DEAD_JOB = 1
_DEPLOYMENT_VAR = "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__DEPLOYMENT_ID"


def _executor(lab: Lab, kind: str, namespace: str, **kwargs):
    """An executor of the deployment the filled pods name; the option is not left to later scenarios."""
    try:
        return lab.executor(kind, namespace=namespace, deployment_id=DEPLOYMENT, **kwargs)
    finally:
        os.environ.pop(_DEPLOYMENT_VAR, None)


def _dead_schedulers_pods(lab: Lab, namespace: str, count: int, creator: int = DEAD_JOB) -> None:
    """``count`` Pending pods of this deployment created by ``creator`` (default: a scheduler that is
    gone), each the current launch of a QUEUED TI (so no fence deletes them)."""
    tis = lab.queued_tis(count, creator, f"orphans_{namespace}")
    fill(lab, namespace, [(ti.id, ti.dag_id, ti.task_id, ti.run_id, ti.token) for ti in tis], creator=creator)


class _LivePeer:
    """A running SchedulerJob row kept heartbeating: the creator of the pods in the ``peers`` scenario."""

    def __init__(self) -> None:
        from airflow.jobs.job import Job

        self.job = Job(job_type="SchedulerJob")
        self.job.hostname = "bench-live-peer"
        self.job.prepare_for_execution()

    def beat(self) -> None:
        from airflow.utils.session import create_session

        with create_session() as session:
            self.job.heartbeat(heartbeat_callback=lambda session=None: None, session=session)

    def close(self) -> None:
        self.job.complete_execution()


def peers(lab: Lab, count: int, syncs: int, per_loop: int = 2) -> dict:
    """``orphans`` with a live peer as the pods' creator (running and heartbeating)."""
    peer = _LivePeer()
    try:
        return orphans(lab, count, syncs, per_loop, peer=peer)
    finally:
        peer.close()


def orphans(lab: Lab, count: int, syncs: int, per_loop: int = 2, peer: _LivePeer | None = None) -> dict:
    """Loops of live schedulers sharing a namespace with ``count`` Pending pods of a dead scheduler
    (or of a live ``peer``):
    two stock executors and one fenced, syncs in ABBA order (the second stock executor is the A/A
    floor). ``idle``: nothing else to do; ``busy``: ``per_loop`` new tasks queued and created each
    loop (their pods stay Pending too). Per mode: p50/p99 of sync(), DB statements and API calls
    per sync (the watch excluded: one long request, not per loop)."""
    ns = f"bench-{'peers' if peer else 'orphans'}-{count}"
    _dead_schedulers_pods(lab, ns, count, peer.job.id if peer else DEAD_JOB)
    execs = {"stock": _executor(lab, "stock", ns), "fenced": _executor(lab, "fenced", ns),
             "stock_b": _executor(lab, "stock", ns)}
    deadline = time.monotonic() + 60
    view = _view(execs["fenced"])
    while len(view) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    out: dict = {"pods": count, "syncs": syncs, "per_loop": per_loop, "known_at_start": len(view), "modes": {}}
    for ex in execs.values():  # untimed: the provider's first sync (its own first DB read, the completed-pod list)
        ex.sync()
    order = [k for _, k in _abba(syncs)]
    for mode in ("idle", "busy"):
        raw: dict = {k: [] for k in execs}
        mark = lab.audit_mark()
        for i, kind in enumerate(order):
            ex = execs[kind]
            if peer is not None and i % 3 == 0:
                peer.beat()  # untimed; the peer stays running for every fence that asks
            if mode == "busy":
                for ti in lab.queued_tis(per_loop, ex.job_id, f"orphans_busy_{kind}"):
                    ex.queue_workload(workload(ti, ex), session=None)
                trigger(ex, open_slots=per_loop)
            before = lab.trips.snapshot()
            with quiet_gc():
                s0, c0 = time.perf_counter(), time.process_time()
                ex.sync()
                raw[kind].append({"seconds": time.perf_counter() - s0, "cpu_seconds": time.process_time() - c0,
                                  "db": lab.trips.since(before)})
        calls = lab.api_calls(mark)
        figures: dict = {"raw": raw}
        for kind, samples in raw.items():
            seconds = [x["seconds"] for x in samples]
            who = f"scheduler-{execs[kind].job_id}"
            figures[kind] = {
                "p50": percentile(seconds, 50), "p99": percentile(seconds, 99),
                "statements_per_sync_max": max(x["db"]["statements"] for x in samples),
                "statements_per_sync": sum(x["db"]["statements"] for x in samples) / len(samples),
                "api_calls_per_sync": sum(1 for c in calls if c.get("who") == who and c.get("verb") != "watch")
                / len(samples)}
        figures["spread"] = {q: _quantile_spread(raw, "fenced", q) for q in ("p50", "p99")}
        figures["aa_spread"] = {q: _quantile_spread(raw, "stock_b", q) for q in ("p50", "p99")}
        out["modes"][mode] = figures
        progress(f"{'peers' if peer else 'orphans'} {count} ({mode}): p50 stock {figures['stock']['p50'] * 1e3:.2f} ms, fenced"
                 f" {figures['fenced']['p50'] * 1e3:.2f} ms; p99 {figures['stock']['p99'] * 1e3:.2f} /"
                 f" {figures['fenced']['p99'] * 1e3:.2f} ms; p99 fenced/stock {fmt_spread(figures['spread']['p99'])},"
                 f" stock/stock {fmt_spread(figures['aa_spread']['p99'])}; fenced DB statements per sync"
                 f" {figures['fenced']['statements_per_sync']:.2f} (max {figures['fenced']['statements_per_sync_max']}),"
                 f" API calls per sync {figures['fenced']['api_calls_per_sync']:.2f}")
    for ex in execs.values():
        lab.end_executor(ex)
    clear(lab, ns)
    return out


def _abba(syncs: int):
    """stock, fenced, stock_b in rotating order per round, so drift falls on every executor alike."""
    kinds = ("stock", "fenced", "stock_b")
    for i in range(syncs):
        shift = i % 3
        for kind in kinds[shift:] + kinds[:shift]:
            yield i, kind


def _quantile_spread(raw: dict, kind: str, q: str, chunks: int = 5) -> dict:
    """``kind``/stock of a quantile over matching chunks of the syncs (chunk i of one against
    chunk i of the other, taken in the same rounds): a spread, not one number."""
    pct = 50 if q == "p50" else 99
    a, b = [x["seconds"] for x in raw["stock"]], [x["seconds"] for x in raw[kind]]
    size = max(1, len(a) // chunks)
    per = [percentile(b[i:i + size], pct) / percentile(a[i:i + size], pct) for i in range(0, len(a) - size + 1, size)]
    return ratio_spread(per)


def startup(lab: Lab, pods: int, reps: int) -> dict:
    """Seconds from a scheduler's ``executor.start()`` to its return, stock vs fenced (ABBA), with
    ``pods`` Pending pods of this deployment in the namespace (the worst case: all of them in flight,
    all listed). The fenced figure includes its one metadata list of them."""
    ns = f"bench-startup-{pods}"
    _dead_schedulers_pods(lab, ns, pods)
    raw: dict = {k: [] for k in KINDS}
    known = []
    for i in range(reps):
        for kind in (KINDS if i % 2 == 0 else KINDS[::-1]):
            t0 = time.perf_counter()
            ex = _executor(lab, kind, ns)
            raw[kind].append(time.perf_counter() - t0)
            if kind == "fenced":
                known.append(len(_view(ex)))
            lab.end_executor(ex)
    clear(lab, ns)
    out = {"pods": pods, "reps": reps, "seconds": {k: median(v) for k, v in raw.items()}, "raw": raw,
           "known_at_start": known, "spread": spread(raw["stock"], raw["fenced"])}
    progress(f"start-up with {pods} Pending pods: stock {out['seconds']['stock']:.2f} s, fenced"
             f" {out['seconds']['fenced']:.2f} s (fenced/stock {fmt_spread(out['spread'])}); the fenced executor"
             f" knew {known} pods when start() returned")
    return out


def _view(executor) -> Any:
    """The fenced executor's picture of this deployment's pods in flight (its name changed in 0.2.0)."""
    pods = getattr(executor, "in_flight_pods", None) or getattr(executor, "pending_pods", None)
    return pods.view
