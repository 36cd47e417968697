"""The sweep scenario (run last): one ``Sweeper.run_once()`` over 100 ... 100,000 executor
pods, across namespaces, and with several schedulers sweeping at once (they take turns on a
PostgreSQL advisory lock)."""

from __future__ import annotations

import asyncio
import json
from contextlib import nullcontext
import threading
import time
import tracemalloc
import uuid

from fenced_k8s_lab.bench.env import Lab, median, profiled, progress
from fenced_k8s_executor.launch import LaunchIdentity
from fenced_k8s_executor.sweep import Sweeper
from fenced_k8s_executor.witness import Witness


DEPLOYMENT = "bench-deployment"


def pod_body(ti: tuple, token: str, job_id: int = 1) -> dict:
    """An executor pod of a fenced scheduler of deployment ``DEPLOYMENT``."""
    ti_id, dag_id, task_id, run_id = ti
    launch = LaunchIdentity(ti_id=ti_id, token=token, try_number=1, scheduler_job_id=str(job_id),
                            dag_id=dag_id, task_id=task_id, run_id=run_id, deployment=DEPLOYMENT)
    name = f"{dag_id}-{task_id}-{uuid.uuid4().hex[:10]}".replace("_", "-")
    labels = {"kubernetes_executor": "True", "airflow-worker": str(job_id), "dag_id": dag_id, "task_id": task_id,
              "try_number": "1", "run_id": run_id, **launch.labels()}
    annotations = {"dag_id": dag_id, "task_id": task_id, "try_number": "1", "run_id": run_id,
                   **launch.annotations()}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "base", "image": "lab/airflow:local"}]}}


def create_pods(lab: Lab, namespace: str, bodies: list[dict], concurrency: int = 48) -> None:
    """Bulk-create pods with concurrent POSTs (aiohttp): the real kube-apiserver's way in."""
    import aiohttp

    url = f"{lab.emu_url}/api/v1/namespaces/{namespace}/pods"
    headers = {"Authorization": "Bearer bench-setup", "Content-Type": "application/json"}
    lab.ensure_namespace(namespace)
    ssl_ctx = getattr(lab.emu, "_ssl", None) if lab.real else None
    if not lab.real:
        lab.emu.set_tokens({"bench-setup": "bench-setup"})

    async def run() -> None:
        sem = asyncio.Semaphore(concurrency)
        connector = aiohttp.TCPConnector(limit=concurrency, ssl=ssl_ctx if ssl_ctx is not None else False)
        async with aiohttp.ClientSession(connector=connector) as session:
            async def one(body: dict) -> None:
                async with sem:
                    async with session.post(url, data=json.dumps(body), headers=headers) as resp:
                        if resp.status != 201:
                            raise RuntimeError(f"create pod: {resp.status} {await resp.text()}")

            await asyncio.gather(*(one(b) for b in bodies))

    asyncio.run(run())


def fill(lab: Lab, namespace: str, rows: list[tuple], chunk: int = 5000, creator: int = 1) -> None:
    """Pods for ``rows`` (ti_id, dag_id, task_id, run_id, token) created by scheduler job ``creator``:
    built inside the emulator process (bench control, no HTTP per pod), or POSTed one by one to a
    real apiserver."""
    if lab.real:
        create_pods(lab, namespace, [pod_body(tuple(r[:4]), r[4], creator) for r in rows])
        return
    for i in range(0, len(rows), chunk):
        lab._bench_control("POST", "fill", {"namespace": namespace, "rows": [list(r) for r in rows[i:i + chunk]],
                                            "job_id": creator})


def clear(lab: Lab, namespace: str) -> None:
    if not lab.real:
        lab._bench_control("POST", "clear", {"namespace": namespace})


def seed_tis(lab: Lab, count: int) -> list[tuple]:
    """``count`` finished TIs with tokens: the seeded history first, then a bulk-inserted
    ``bench_sweep`` DAG (runs of 1,000 tasks) for what the history lacks."""
    import sqlalchemy as sa

    from fenced_k8s_lab import seed

    query = ("SELECT id::text, dag_id, task_id, run_id, external_executor_id FROM task_instance"
             " WHERE dag_id LIKE 'bench_dag_%' OR dag_id = 'bench_sweep' ORDER BY dag_id, id LIMIT :n")
    with lab.engine.connect() as conn:
        rows = [tuple(r) for r in conn.execute(sa.text(query), {"n": count})]
    missing = count - len(rows)
    if missing > 0:
        t0 = time.monotonic()
        version = seed.seed_dag(lab.engine, "bench_sweep")
        runs = -(-missing // 1000)
        with lab.engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO dag_run(dag_id, run_id, run_type, run_after, state, logical_date, start_date,"
                " created_dag_version_id) SELECT 'bench_sweep', 'scheduled__' || r, 'scheduled',"
                " now() - r * interval '1 hour', 'running', now() - r * interval '1 hour',"
                " now() - r * interval '1 hour', :v FROM generate_series(1, :runs) AS r"), {"runs": runs, "v": version})
            conn.execute(sa.text(
                f"INSERT INTO task_instance(id, task_id, dag_id, run_id, {seed.index_column(lab.engine)}, try_number, max_tries, pool,"
                " pool_slots, state, queue, priority_weight, dag_version_id, external_executor_id,"
                " queued_by_job_id, queued_dttm, start_date)"
                " SELECT gen_random_uuid(), 'task_' || t, dr.dag_id, dr.run_id, -1, 1, 2, 'default_pool', 1,"
                " 'running', 'default', 1, dr.created_dag_version_id, gen_random_uuid()::text, 1,"
                " dr.logical_date, dr.logical_date"
                " FROM dag_run dr CROSS JOIN generate_series(1, 1000) AS t WHERE dr.dag_id = 'bench_sweep'"))
            conn.execute(sa.text("ANALYZE task_instance; ANALYZE dag_run"))
        with lab.engine.connect() as conn:
            rows = [tuple(r) for r in conn.execute(sa.text(query), {"n": count})]
        progress(f"sweep: seeded {runs * 1000} more TIs (bench_sweep) in {time.monotonic() - t0:.1f}s;"
                 f" task_instance now has {len(rows)}+ rows for the sweep")
    if len(rows) < count:
        raise RuntimeError(f"need {count} TIs for the sweep, have {len(rows)}")
    return rows


def _witness(lab: Lab) -> Witness:
    """The witness a live scheduler's sweep consults: a scheduler job of its own, posted once (its
    renewals fall outside the measured sweeps, and under its own user: not the sweeper's calls).
    Without one the sweep judges no pod this database's and deletes nothing."""
    ns = "bench-sweep-witness"
    lab.ensure_namespace(ns)
    job_id = lab.next_job_id()
    lab.scheduler_job(job_id)
    witness = Witness(lab.core_api("bench", ns), ns, DEPLOYMENT, job_id, host="bench-sweeper",
                      interval=3600.0, alive_for=3600.0)
    witness.start(wait=30)
    if not witness.view.quiet:
        raise RuntimeError(f"the sweep's witness cannot judge: {witness.view}")
    return witness


def _pods_for(rows: list[tuple], stale_fraction: float) -> tuple[list[tuple], list[tuple]]:
    n_stale = max(1, int(len(rows) * stale_fraction))
    current = [tuple(r) for r in rows[n_stale:]]
    stale = [(r[0], r[1], r[2], r[3], str(uuid.uuid4())) for r in rows[:n_stale]]  # superseded token
    return current, stale


def _once(lab: Lab, sweeper: Sweeper, expect_seen: int, expect_deleted: int) -> dict:
    mark, before = lab.audit_mark(), lab.trips.snapshot()
    cpu0, server0 = time.process_time(), lab.server_cpu()
    report = sweeper.run_once()
    cpu, server = time.process_time() - cpu0, lab.server_cpu() - server0
    db = lab.trips.since(before)
    calls = [c for c in lab.api_calls(mark) if c.get("who") == "sweeper"]
    if report.errors or report.deleted != expect_deleted or report.pods_seen != expect_seen:
        raise RuntimeError(f"sweep of {expect_seen} pods: {report}")
    return {"seconds": report.seconds, "cpu_seconds": cpu, "server_cpu_seconds": server, "pages": report.pages,
            "deleted": report.deleted, "db": db,
            "api_calls": len(calls), "api_lists": sum(1 for c in calls if c.get("verb") == "list"),
            "api_deletes": sum(1 for c in calls if c.get("verb") == "delete")}


def _peak(lab: Lab, sweeper: Sweeper, restore) -> int:
    """Peak Python heap (tracemalloc) of one untimed sweep: bounded by a page, not by N."""
    restore()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        sweeper.run_once()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def sweep(lab: Lab, sizes: list[int], reps: int, stale_fraction: float, page_size: int,
          namespace_counts: list[int] | None = None, namespace_pods: int = 0, schedulers: list[int] | None = None) -> dict:
    rows = seed_tis(lab, max(sizes + [namespace_pods]))
    witness = _witness(lab)
    try:
        return _sweep(lab, witness, rows, sizes, reps, stale_fraction, page_size, namespace_counts, namespace_pods,
                      schedulers)
    finally:
        witness.stop()


def _sweep(lab: Lab, witness: Witness, rows: list[tuple], sizes: list[int], reps: int, stale_fraction: float,
           page_size: int, namespace_counts: list[int] | None, namespace_pods: int, schedulers: list[int] | None) -> dict:
    out: dict = {"raw": {}, "seconds": {}, "api_calls": {}, "db_queries": {}, "pages": {}, "deleted": {},
                 "peak_bytes": {}, "fill_seconds": {}, "stale_fraction": stale_fraction, "page_size": page_size}
    warm_ns = "bench-sweep-warm"  # warms the client, the lock and the query path before any measured sweep
    warm_current, warm_stale = _pods_for(rows[:min(1000, len(rows))], stale_fraction)
    fill(lab, warm_ns, warm_current)
    for size in sizes:
        ns = f"bench-sweep-{size}"
        current, stale = _pods_for(rows[:size], stale_fraction)
        t0 = time.monotonic()
        fill(lab, ns, current + stale)
        out["fill_seconds"][str(size)] = time.monotonic() - t0
        progress(f"sweep: {size} pods ({len(stale)} stale) in {ns}, filled in {time.monotonic() - t0:.1f}s")
        sweeper = Sweeper(kube_client=lab.core_api("sweeper", ns), namespaces=[ns], interval=0,
                          page_size=page_size, enforcing=True, deployment=DEPLOYMENT, witness=witness)
        key = str(size)
        client = sweeper.kube_client
        Sweeper(kube_client=client, namespaces=[warm_ns], interval=0, page_size=page_size, enforcing=True,
                deployment=DEPLOYMENT, witness=witness).run_once()
        # the first sweep of these pods runs under tracemalloc: its peak heap is the memory figure
        out["peak_bytes"][key] = _peak(lab, sweeper, lambda: None)
        samples = []
        for rep in range(reps):
            fill(lab, ns, stale)  # the previous sweep deleted them
            with profiled(lab, f"sweep_{size}") if rep == 0 else nullcontext():
                samples.append(_once(lab, sweeper, size, len(stale)))
        out["raw"][key] = samples
        out["seconds"][key] = median([s["seconds"] for s in samples])
        out.setdefault("cpu_seconds", {})[key] = median([s["cpu_seconds"] for s in samples])
        out.setdefault("server_cpu_seconds", {})[key] = median([s["server_cpu_seconds"] for s in samples])
        out["api_calls"][key] = {"total": samples[0]["api_calls"], "list": samples[0]["api_lists"],
                                 "delete": samples[0]["api_deletes"]}
        out["db_queries"][key] = samples[0]["db"]["statements"]
        out["pages"][key] = samples[0]["pages"]
        out["deleted"][key] = samples[0]["deleted"]
        progress(f"sweep {size} pods: {out['seconds'][key]:.3f}s wall, CPU {out['cpu_seconds'][key]:.3f}s here +"
                 f" {out['server_cpu_seconds'][key]:.3f}s API server (samples"
                 f" {', '.join('%.3f' % x['seconds'] for x in samples)}), {out['pages'][key]} pages,"
                 f" API {out['api_calls'][key]}, {out['db_queries'][key]} DB statements,"
                 f" peak heap {out['peak_bytes'][key] / 1024:.0f} KiB")
        clear(lab, ns)
    clear(lab, warm_ns)
    if namespace_counts and namespace_pods:
        out["namespaces"] = _by_namespaces(lab, witness, rows[:namespace_pods], namespace_counts, reps, stale_fraction,
                                           page_size)
    if schedulers and namespace_pods:
        out["schedulers"] = _by_schedulers(lab, witness, rows[:namespace_pods], schedulers, reps, stale_fraction,
                                           page_size)
    return out


def _by_namespaces(lab: Lab, witness: Witness, rows: list[tuple], counts: list[int], reps: int, stale_fraction: float,
                   page_size: int) -> dict:
    """The same pods spread over k namespaces, one Sweeper over all k (one list per page per namespace)."""
    out: dict = {"pods": len(rows), "raw": {}, "seconds": {}, "pages": {}, "api_lists": {}, "db_queries": {}}
    for k in counts:
        names = [f"bench-sweepns-{k}-{i}" for i in range(k)]
        stale_all = []
        for i, ns in enumerate(names):
            current, stale = _pods_for(rows[i::k], stale_fraction)
            fill(lab, ns, current + stale)
            stale_all.append((ns, stale))
        sweeper = Sweeper(kube_client=lab.core_api("sweeper", names[0]), namespaces=names, interval=0,
                          page_size=page_size, enforcing=True, deployment=DEPLOYMENT, witness=witness)
        n_stale = sum(len(s) for _, s in stale_all)
        samples = []
        for rep in range(reps + 1):
            if rep > 0:
                for ns, stale in stale_all:
                    fill(lab, ns, stale)
            sample = _once(lab, sweeper, len(rows), n_stale)
            if rep > 0:
                samples.append(sample)
        key = str(k)
        out["raw"][key] = samples
        out["seconds"][key] = median([s["seconds"] for s in samples])
        out["pages"][key] = samples[0]["pages"]
        out["api_lists"][key] = samples[0]["api_lists"]
        out["db_queries"][key] = samples[0]["db"]["statements"]
        progress(f"sweep over {k} namespaces ({len(rows)} pods): {out['seconds'][key]:.3f}s, {out['pages'][key]}"
                 f" pages, {out['api_lists'][key]} lists, {out['db_queries'][key]} DB statements")
        for ns in names:
            clear(lab, ns)
    return out


def _by_schedulers(lab: Lab, witness: Witness, rows: list[tuple], counts: list[int], reps: int, stale_fraction: float,
                   page_size: int) -> dict:
    """s schedulers start a sweep at the same moment over the same pods: the advisory lock lets
    one sweep and the others skip, so the work does not grow with s."""
    ns = "bench-sweep-sched"
    current, stale = _pods_for(rows, stale_fraction)
    fill(lab, ns, current + stale)
    out: dict = {"pods": len(rows), "raw": {}, "seconds": {}, "sweeps": {}, "api_lists": {}, "db_queries": {}}
    for s in counts:
        sweepers = [Sweeper(kube_client=lab.core_api("sweeper", ns), namespaces=[ns], interval=0, page_size=page_size,
                            enforcing=True, deployment=DEPLOYMENT, witness=witness) for _ in range(s)]
        samples = []
        for rep in range(reps):
            fill(lab, ns, stale) if rep > 0 or s != counts[0] else None
            mark, before = lab.audit_mark(), lab.trips.snapshot()
            reports: list = [None] * s
            barrier = threading.Barrier(s)

            def go(i: int) -> None:
                barrier.wait()
                reports[i] = sweepers[i].run_once()

            threads = [threading.Thread(target=go, args=(i,)) for i in range(s)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            db = lab.trips.since(before)
            calls = [c for c in lab.api_calls(mark) if c.get("who") == "sweeper"]
            swept = sum(1 for r in reports if r.skipped is None)
            samples.append({"seconds": wall, "sweeps": swept, "db": db,
                            "api_lists": sum(1 for c in calls if c.get("verb") == "list"),
                            "deleted": sum(r.deleted for r in reports)})
        key = str(s)
        out["raw"][key] = samples
        out["seconds"][key] = median([x["seconds"] for x in samples])
        out["sweeps"][key] = max(x["sweeps"] for x in samples)
        out["api_lists"][key] = max(x["api_lists"] for x in samples)
        out["db_queries"][key] = max(x["db"]["statements"] for x in samples)
        progress(f"{s} schedulers sweeping {len(rows)} pods at once: {out['seconds'][key]:.3f}s,"
                 f" {out['sweeps'][key]} swept (others skipped on the lock), {out['api_lists'][key]} lists,"
                 f" {out['db_queries'][key]} DB statements")
    clear(lab, ns)
    return out
