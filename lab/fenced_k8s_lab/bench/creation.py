"""Scenarios: queue time (execute_async), the pre-creation check per batch, pod launch throughput."""

from __future__ import annotations

from contextlib import nullcontext
import itertools
import math
import pickle
import queue
import time

from fenced_k8s_executor import ledger
from fenced_k8s_lab.bench.env import (Lab, fmt_spread, forget, interleaved, median, pinned_apart, profiled,
                                               progress, quiet_gc, spread, workload)
from fenced_k8s_lab.core import trigger  # trigger_workloads on Airflow 3.4


#: One queue-time repetition is an ABBA block of runs, each kind's fastest of its eight runs
#: counting (timeit's ``repeat``; a run is ~0.1 s). Successive runs alternated fast and slow by
#: up to 15 % whichever executor ran, so a kind timed once per repetition landed on the slow
#: phase in every other pair. Pinned (``pinned_apart``), with four runs per kind one backend run
#: of four reached a fenced/stock max of 1.104; with eight, six of six stayed within 1.076.
#: ``control`` is a second stock executor (the A/A noise floor: control/stock), placed so that
#: every executor's runs sit, on average, at the same point of the block.
QUEUE_BLOCK = (("stock", "fenced", "control", "control", "fenced", "stock") * 4,
               ("fenced", "stock", "control", "control", "stock", "fenced") * 4)
#: The order the three executors of a repetition are started in: every executor takes every
#: place in turn, so that no kind is always created first or last.
QUEUE_STARTS = tuple(itertools.permutations(("stock", "fenced", "control")))


def queue_time(lab: Lab, workloads: int, reps: int) -> dict:
    """Wall time of ``trigger_tasks`` for ``workloads`` queued workloads: the scheduler's
    ``execute_async`` per workload (stock: build the KubernetesJob and put it on the Manager
    queue; fenced: the same plus its LaunchBook entry). A repetition is a ``QUEUE_BLOCK`` run by
    new executors (stock, fenced and a second stock one, the control, started in the orders of
    ``QUEUE_STARTS``); the real (Manager) task queue is drained, untimed, after each run.
    control/stock is the noise floor the fenced/stock ratio is read against.

    The measuring process and the executors' Manager processes run on separate CPUs
    (``pinned_apart``): an instance's queue time followed where the OS happened to place its
    Manager (with five executors in one process, two were ~25 % slower than the other three for
    the whole run, one of them stock), which no interleaving cancels. New executors per
    repetition all the same, so that no kind keeps one instance's luck.
    Also the time of ``queue_workload`` (BaseExecutor's, the same for both) for reference."""
    raw: dict = {"stock": [], "fenced": [], "control": []}
    for rep in range(reps):
        order = QUEUE_STARTS[rep % len(QUEUE_STARTS)]
        execs = {kind: lab.executor("stock" if kind == "control" else kind, namespace=f"bench-queue-{kind}")
                 for kind in order}
        tis = {kind: lab.queued_tis(workloads, ex.job_id, f"queue_{kind}_{rep}") for kind, ex in execs.items()}
        runs: dict = {kind: [] for kind in raw}
        with pinned_apart(list(execs.values())) as placement:
            for kind in order:  # warm-up
                with profiled(lab, f"queue_trigger_tasks_{kind}") if rep == 0 else nullcontext():
                    _queue_once(execs[kind], tis[kind], workloads)
            for kind in QUEUE_BLOCK[rep % 2]:
                runs[kind].append(_queue_once(execs[kind], tis[kind], workloads))
        for kind, mine in runs.items():
            raw[kind].append(min(mine, key=lambda run: run["seconds"]))
        for ex in execs.values():
            lab.end_executor(ex)
    secs = {k: median([x["seconds"] for x in v]) for k, v in raw.items()}
    sp = spread([x["seconds"] for x in raw["stock"]], [x["seconds"] for x in raw["fenced"]])
    aa = spread([x["seconds"] for x in raw["stock"]], [x["seconds"] for x in raw["control"]])
    progress(f"queue time, {workloads} workloads: stock {secs['stock']:.3f}s, fenced {secs['fenced']:.3f}s,"
             f" ratio {fmt_spread(sp)}; A/A (second stock executor / stock) {fmt_spread(aa)}")
    cpu_sp = spread([x["cpu_seconds"] for x in raw["stock"]], [x["cpu_seconds"] for x in raw["fenced"]])
    return {"raw": raw, "workloads": workloads, "seconds": secs, "ratio": sp["median"], "spread": sp,
            "cpu_spread": cpu_sp, "aa_spread": aa, "placement": placement,
            "job_pickle_bytes": {k: v[0]["job_pickle_bytes"] for k, v in raw.items()},
            "job_pickle_us": {k: median([x["job_pickle_seconds"] for x in v]) * 1e6 for k, v in raw.items()},
            "us_per_workload": {k: v / workloads * 1e6 for k, v in secs.items()}}


def _queue_once(ex, tis: list, workloads: int) -> dict:
    work = [workload(ti, ex) for ti in tis]
    q0 = time.perf_counter()
    for w in work:
        ex.queue_workload(w, session=None)
    q1 = time.perf_counter()
    with quiet_gc():
        t0, c0 = time.perf_counter(), time.process_time()
        trigger(ex, open_slots=workloads)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    job = ex.task_queue.get_nowait()  # what crossed the Manager queue, re-pickled here (untimed)
    ex.task_queue.task_done()
    p0 = time.perf_counter()
    size = len(pickle.dumps(job))
    pickle_seconds = time.perf_counter() - p0
    queued = 1 + _drain(ex)
    forget(ex)
    if queued != workloads:
        raise RuntimeError(f"{type(ex).__name__}: {queued} of {workloads} jobs queued")
    return {"seconds": seconds, "cpu_seconds": cpu, "queue_workload_seconds": q1 - q0, "job_pickle_bytes": size,
            "job_pickle_seconds": pickle_seconds}


def _drain(ex) -> int:
    """Empty the executor's task queue (and the fenced carry-over); returns the jobs found."""
    n = 0
    while True:
        try:
            ex.task_queue.get_nowait()
        except queue.Empty:
            break
        ex.task_queue.task_done()
        n += 1
    return n


def precreate(lab: Lab, sizes: list[int], reps: int) -> dict:
    """DB round trips and wall time of the creation loop's check for a batch of N jobs.

    Both executors run their real ``_create_pods_sequentially`` (the fenced one through
    ``_fenced_creation_batch``) over an in-process queue holding exactly N jobs, with
    ``kube_scheduler.run_next`` made a no-op for this measurement only: what is timed is the
    check (stock: one SELECT per job; fenced: one batched read + a verdict per job).
    """
    execs = {kind: lab.executor(kind, namespace=f"bench-pre-{kind}") for kind in ("stock", "fenced")}
    tis = {kind: lab.queued_tis(max(sizes), ex.job_id, f"pre_{kind}") for kind, ex in execs.items()}
    raw: dict = {str(n): {"stock": [], "fenced": []} for n in sizes}
    for n in sizes:
        for rep, kind in [(-1, "stock"), (-1, "fenced")] + list(interleaved(reps)):  # rep -1: warm-up
            ex = execs[kind]
            sample = _precreate_once(lab, ex, tis[kind][:n])
            if rep >= 0:
                raw[str(n)][kind].append(sample)
        s, f = raw[str(n)]["stock"], raw[str(n)]["fenced"]
        progress(f"pre-create N={n}: stock {median([x['seconds'] for x in s]) * 1e3:.2f} ms"
                 f" / {s[0]['db']['statements']} stmts, fenced {median([x['seconds'] for x in f]) * 1e3:.2f} ms"
                 f" / {f[0]['db']['statements']} stmts")
    for ex in execs.values():
        lab.end_executor(ex)
    out = {"raw": raw, "round_trips": {}, "wire_round_trips": {}, "seconds": {}, "wall_ratio": {}}
    for n, by_kind in raw.items():
        out["round_trips"][n] = {k: max(x["db"]["statements"] for x in v) for k, v in by_kind.items()}
        out["wire_round_trips"][n] = {k: max(x["db"]["wire"] for x in v) for k, v in by_kind.items()}
        out["seconds"][n] = {k: median([x["seconds"] for x in v]) for k, v in by_kind.items()}
        sp = spread([x["seconds"] for x in by_kind["stock"]], [x["seconds"] for x in by_kind["fenced"]])
        out.setdefault("spread", {})[n] = sp
        out["wall_ratio"][n] = sp["median"]
    return out


def _precreate_once(lab: Lab, ex, tis: list) -> dict:
    local: queue.Queue = queue.Queue()
    real_queue = ex.task_queue
    ex.task_queue = local
    ex.kube_config.worker_pods_creation_batch_size = len(tis)
    created: list = []
    try:
        for ti in tis:
            ex.queue_workload(workload(ti, ex), session=None)
        trigger(ex, open_slots=len(tis))
        ex.kube_scheduler.run_next = created.append  # no pod creation: the check alone
        if hasattr(ex, "_loop_state"):  # a new loop: no rows read yet (sync() would reset it too)
            ex._loop_state = None
        before, counter = lab.trips.snapshot(), ledger.ROUND_TRIPS
        with quiet_gc():
            t0 = time.perf_counter()
            ex._create_pods_sequentially()
            seconds = time.perf_counter() - t0
        db = lab.trips.since(before)
    finally:
        ex.kube_scheduler.__dict__.pop("run_next", None)
        ex.task_queue = real_queue
    if len(created) != len(tis) or not local.empty():
        raise RuntimeError(f"{type(ex).__name__} created {len(created)} of {len(tis)} current jobs")
    forget(ex)
    return {"seconds": seconds, "db": db, "ledger_counter": ledger.ROUND_TRIPS - counter}


def launch(lab: Lab, pods: int, reps: int, batch_size: int) -> dict:
    """Pods per second of ``sync()`` time until all ``pods`` pods exist, per creation path.

    Only the syncs are timed (pod creation happens inside them, on both paths), so polling the
    API for the pod count between syncs costs nothing on either side."""
    out: dict = {"raw": {}, "pods_per_second": {}, "ratio": {}, "spread": {}, "batch_size": batch_size, "pods": pods}
    for mode, async_creation in (("sequential", False), ("concurrent", True)):
        execs = {kind: lab.executor(kind, namespace=f"bench-launch-{mode}-{kind}", batch_size=batch_size,
                                    async_creation=async_creation) for kind in ("stock", "fenced")}
        raw: dict = {"stock": [], "fenced": []}
        warm = [(-1, "stock"), (-1, "fenced")]
        for rep, kind in warm + list(interleaved(reps)):
            with profiled(lab, f"launch_{mode}_{kind}") if rep == -1 else nullcontext(), quiet_gc():
                sample = _launch_once(lab, execs[kind], pods if rep >= 0 else batch_size, batch_size)
            if rep >= 0:
                raw[kind].append(sample)
                progress(f"launch {mode} rep {rep} {kind}: {sample['pods_per_second']:.0f} pods/s"
                         f" ({sample['syncs']} syncs, {sample['db']['statements']} DB statements,"
                         f" build_pod {sample['build_pod_seconds'] * 1e3:.2f} ms/pod)")
        for ex in execs.values():
            lab.end_executor(ex)
        pps = {k: median([x["pods_per_second"] for x in v]) for k, v in raw.items()}
        sp = spread([x["pods_per_second"] for x in raw["stock"]], [x["pods_per_second"] for x in raw["fenced"]])
        out["raw"][mode] = raw
        out["pods_per_second"][mode] = pps
        out["spread"][mode] = sp
        out.setdefault("cpu_spread", {})[mode] = spread([x["pods_per_cpu_second"] for x in raw["stock"]],
                                                        [x["pods_per_cpu_second"] for x in raw["fenced"]])
        out["ratio"][mode] = sp["median"]
        out.setdefault("build_pod_seconds", {})[mode] = {
            k: median([x["build_pod_seconds"] for x in v]) for k, v in raw.items()}
        out.setdefault("trigger_seconds", {})[mode] = {k: median([x["trigger_seconds"] for x in v]) for k, v in raw.items()}
        out.setdefault("statements_per_pod", {})[mode] = {
            k: median([x["db"]["statements"] / pods for x in v]) for k, v in raw.items()}
        progress(f"launch {mode}: ratio {fmt_spread(sp)}")
    return out


def _launch_once(lab: Lab, ex, count: int, batch_size: int) -> dict:
    ns = ex.kube_config.kube_namespace
    tis = lab.queued_tis(count, ex.job_id, "launch")
    base = lab.pods_in(ns)
    work = [workload(ti, ex) for ti in tis]  # the scheduler's part (its token), untimed
    t0 = time.perf_counter()
    for w in work:
        ex.queue_workload(w, session=None)
    trigger(ex, open_slots=count)  # execute_async for every job (fenced: pod override, claim)
    t1 = time.perf_counter()
    before = lab.trips.snapshot()
    syncs, sync_seconds, sync_cpu = 0, 0.0, 0.0
    batches_needed = math.ceil(count / batch_size)
    limit = 3 * batches_needed + 20
    while syncs < limit:
        s0, c0 = time.perf_counter(), time.process_time()
        ex.sync()
        sync_seconds += time.perf_counter() - s0
        sync_cpu += time.process_time() - c0
        syncs += 1
        if ex.task_queue.empty() and not getattr(ex, "_carry", None) and syncs >= batches_needed:
            if lab.pods_in(ns) - base >= count:
                break
    t2 = time.perf_counter()
    db = lab.trips.since(before)
    made = lab.pods_in(ns) - base
    build = []  # the provider's pod build (no API call) for the same jobs: where fenced pays extra
    for attempt in list(ex.pod_launch_attempts.values())[:32]:
        b0 = time.perf_counter()
        ex.kube_scheduler._build_pod_request(attempt.job)
        build.append(time.perf_counter() - b0)
    forget(ex)
    if made < count:
        raise RuntimeError(f"{type(ex).__name__}: only {made} of {count} pods after {syncs} syncs")
    return {"seconds": sync_seconds, "wall_seconds": t2 - t1, "trigger_seconds": t1 - t0, "syncs": syncs,
            "pods_per_second": count / sync_seconds, "pods_per_cpu_second": count / max(sync_cpu, 1e-9),
            "pods_per_second_wall": count / (t2 - t1),
            "pods_per_second_incl_trigger": count / (t2 - t0), "db": db, "build_pod_seconds": median(build)}
