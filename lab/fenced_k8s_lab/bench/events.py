"""Scenarios 3 and 5: the state-change fence per watcher event, and the scheduler loop's sync()."""

from __future__ import annotations

from contextlib import nullcontext
import time

from fenced_k8s_lab.bench.env import (KINDS, Lab, fmt_spread, forget, interleaved, median, percentile,
                                               profiled, progress, quiet_gc, ratio_spread, spread, workload,
                                               write_profile)
from fenced_k8s_lab.core import trigger  # trigger_workloads on Airflow 3.4


def state_change(lab: Lab, events: int, reps: int) -> dict:
    """Cost of one sync() handling ``events`` watcher results (Succeeded, state None) for pods that
    exist, stock vs fenced; fenced with its pod-name -> launch map filled (hit) or empty (fallback:
    one pod read per event). Added cost per event = (fenced - stock) / events."""
    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_types import KubernetesWatch

    execs, watches = {}, {}
    for kind in ("stock", "fenced"):
        ns = f"bench-state-{kind}"
        ex = execs[kind] = lab.executor(kind, namespace=ns, batch_size=events)
        for ti in lab.queued_tis(events, ex.job_id, f"state_{kind}"):
            ex.queue_workload(workload(ti, ex), session=None)
        trigger(ex, open_slots=events)
        while len(ex.running) and lab.pods_in(ns) < events:
            ex.sync()
        pods = lab.core_api().list_namespaced_pod(ns).items
        watches[kind] = [KubernetesWatch(p.metadata.name, ns, None, dict(p.metadata.annotations),
                                         p.metadata.resource_version, None) for p in pods]
        ex._bench_running = set(ex.running)
        ex._bench_launches = ex.book.snapshot() if hasattr(ex, "book") else {}
    out: dict = {"events": events, "raw": {}, "seconds_per_event": {}, "added_us_per_event": {}, "ratio": {}}
    for mode in ("hit", "fallback"):
        raw: dict = {"stock": [], "fenced": []}
        for rep, kind in [(-1, "stock"), (-1, "fenced")] + list(interleaved(reps)):
            with quiet_gc():
                sample = _state_once(lab, execs[kind], watches[kind], mode)
            if rep >= 0:
                raw[kind].append(sample)
        per = {k: median([x["seconds"] for x in v]) / events for k, v in raw.items()}
        out["raw"][mode] = raw
        out["seconds_per_event"][mode] = per
        out["added_us_per_event"][mode] = (per["fenced"] - per["stock"]) * 1e6
        sp = spread([x["seconds"] for x in raw["stock"]], [x["seconds"] for x in raw["fenced"]])
        out.setdefault("spread", {})[mode] = sp
        out["ratio"][mode] = sp["median"]
        out.setdefault("fence_us_per_event", {})[mode] = median([x["fence_seconds"] for x in raw["fenced"]]) / events * 1e6
        progress(f"state change ({mode}): stock {per['stock'] * 1e6:.0f} us/event, fenced"
                 f" {per['fenced'] * 1e6:.0f} us/event (+{out['added_us_per_event'][mode]:.0f} us);"
                 f" fence itself {out['fence_us_per_event'][mode]:.0f} us/event;"
                 f" fenced {raw['fenced'][0]['db']['statements']} DB statements,"
                 f" {raw['fenced'][0]['api_reads']} pod reads per batch")
    for ex in execs.values():
        lab.end_executor(ex)
    return out


def _state_once(lab: Lab, ex, watches: list, mode: str) -> dict:
    forget(ex)
    ex.running.update(ex._bench_running)
    if hasattr(ex, "book") and mode == "hit":
        ex.book.remember_all(ex._bench_launches.items())
    for w in watches:  # exactly what the watcher hands over
        ex.kube_scheduler.process_watcher_task(w)
    while ex.result_queue.qsize() < len(watches):
        time.sleep(0.01)
    fence = [0.0]
    prefetch = getattr(ex, "_prefetch_state_verdicts", None)
    if prefetch is not None:  # time the fence's own work too (map lookups / pod reads + one DB read)
        def timed_prefetch(batch, _real=prefetch):
            f0 = time.perf_counter()
            try:
                return _real(batch)
            finally:
                fence[0] += time.perf_counter() - f0
        ex._prefetch_state_verdicts = timed_prefetch
    mark, before = lab.audit_mark(), lab.trips.snapshot()
    t0 = time.perf_counter()
    try:
        ex.sync()
    finally:
        seconds = time.perf_counter() - t0
        ex.__dict__.pop("_prefetch_state_verdicts", None)
    db = lab.trips.since(before)
    calls = lab.api_calls(mark, who=f"scheduler-{ex.job_id}")
    done = sum(1 for k in ex._bench_running if k not in ex.running)
    if done != len(watches):
        raise RuntimeError(f"{type(ex).__name__}: {done} of {len(watches)} results applied")
    return {"seconds": seconds, "fence_seconds": fence[0], "db": db, "api_calls": len(calls),
            "api_reads": sum(1 for c in calls if c.get("verb") == "get")}


def scheduler_loop(lab: Lab, tasks_per_scheduler: int, reps: int, heartbeat: float, max_running: int,
                   per_loop: int = 2) -> dict:
    """p50/p99 of sync() in steady state, stock and fenced side by side in the same time window.

    A repetition runs two stock and two fenced executors (two 'schedulers' of each kind, each kind
    in its own namespace with its own process kubelet running pods that sleep in /bin/sh). Every loop queues
    ``per_loop`` new tasks on each executor, then runs trigger_tasks and a timed sync() on each,
    the kinds taking turns to go first (ABBA by loop), until ``tasks_per_scheduler`` have arrived;
    only those arrival loops are timed, so both kinds are compared over the same syncs doing the
    same work. Timed in separate runs, the machine's drift between runs (the real apiserver and
    etcd share its two cores) moved a kind's p50 by up to 2.5x from one run to the next, more than
    any difference between the kinds; within one window both kinds see the same machine.
    One untimed warm-up repetition first (mapper configuration, first pod build, pooled
    connections). Per repetition and kind: p50/p99, DB statements and API calls per sync. The
    noise floor: each executor's p50/p99 over its own syncs, one executor of a kind against the
    other (A/A) beside fenced against stock at that same sample size."""
    with quiet_gc():
        _loop_window(lab, -1, 4 * per_loop, heartbeat, max_running, per_loop)
    raw: dict = {"stock": [], "fenced": []}
    for rep in range(reps):
        with quiet_gc():
            samples = _loop_window(lab, rep, tasks_per_scheduler, heartbeat, max_running, per_loop)
        for kind, sample in samples.items():
            raw[kind].append(sample)
            progress(f"scheduler loop rep {rep} {kind}: {len(sample['syncs'])} syncs, p50 {sample['p50'] * 1e3:.1f} ms,"
                     f" p99 {sample['p99'] * 1e3:.1f} ms, {sample['statements_per_sync']:.2f} DB statements and"
                     f" {sample['api_calls_per_sync']:.2f} API calls per sync, {sample['seconds']:.1f}s for"
                     f" {sample['done']} tasks")
    out: dict = {"raw": raw, "p50": {}, "p99": {}, "pooled": {}, "tasks": 2 * tasks_per_scheduler,
                 "per_loop": per_loop, "window": "shared"}
    for kind, samples in raw.items():
        allsyncs = [s for x in samples for s in x["syncs"]]
        out["pooled"][kind] = {"p50": percentile(allsyncs, 50), "p99": percentile(allsyncs, 99), "syncs": len(allsyncs)}
        out["p50"][kind] = median([x["p50"] for x in samples])
        out["p99"][kind] = median([x["p99"] for x in samples])
        out.setdefault("run_seconds", {})[kind] = median([x["seconds"] for x in samples])
        out.setdefault("statements_per_sync", {})[kind] = median([x["statements_per_sync"] for x in samples])
        out.setdefault("wire_per_sync", {})[kind] = median([x["wire_per_sync"] for x in samples])
        out.setdefault("api_calls_per_sync", {})[kind] = median([x["api_calls_per_sync"] for x in samples])
        out.setdefault("api_verbs", {})[kind] = samples[0]["api_verbs"]
    out["spread"] = {q: spread([x[q] for x in raw["stock"]], [x[q] for x in raw["fenced"]])
                     for q in ("p50", "p99", "cpu_p50", "cpu_p99")}
    for q in ("p50", "p99"):  # the noise floor, at one executor's syncs (half a kind's)
        by = f"{q}_by_executor"
        out["spread"][f"{q}_aa"] = ratio_spread([x[by][1] / x[by][0] for kind in KINDS for x in raw[kind]])
        out["spread"][f"{q}_single"] = ratio_spread([f[by][i] / s[by][i] for s, f in zip(raw["stock"], raw["fenced"])
                                                     for i in (0, 1)])
    out["p50_ratio"] = out["spread"]["p50"]["median"]
    out["p99_ratio"] = out["spread"]["p99"]["median"]
    progress(f"scheduler loop: p50 ratio {fmt_spread(out['spread']['p50'])}, p99 ratio {fmt_spread(out['spread']['p99'])};"
             f" one executor against another: p99 fenced/stock {fmt_spread(out['spread']['p99_single'])},"
             f" A/A (same kind) {fmt_spread(out['spread']['p99_aa'])}")
    return out


def _loop_window(lab: Lab, rep: int, per: int, heartbeat: float, max_running: int, per_loop: int) -> dict:
    from airflow.utils.state import TaskInstanceState

    tag = str(rep) if rep >= 0 else "warmup"
    kubelets, execs, arrivals, ti_of = {}, {}, {}, {}
    for kind in KINDS:
        ns = f"bench-loop-{tag}-{kind}"
        kubelets[kind] = lab.start_kubelet(ns, max_running=max_running)
        execs[kind] = [lab.executor(kind, namespace=ns, batch_size=32, delete_worker_pods=True) for _ in range(2)]
        arrivals[kind] = []
        for ex in execs[kind]:
            tis = lab.queued_tis(per, ex.job_id, f"loop_{kind}")
            arrivals[kind].append([tis[i:i + per_loop] for i in range(0, len(tis), per_loop)])
            for ti in tis:
                ti_of[(ti.dag_id, ti.task_id, ti.run_id)] = str(ti.id)
    ti_ids = {ti_id: ti_id for ti_id in ti_of.values()}
    m: dict = {kind: {"syncs": [], "cpus": [], "statements": [], "wire": [], "done": set(), "by_ex": [[], []]}
               for kind in KINDS}
    mark = lab.audit_mark()
    profs: dict = {}
    if lab.profile_dir is not None and rep == 0:  # the syncs only, not the benchmark's own work
        import cProfile

        profs = {kind: cProfile.Profile() for kind in KINDS}
    loops = max(len(a) for kind in KINDS for a in arrivals[kind])
    t0 = time.monotonic()
    deadline = t0 + 60 + per * 4
    loop = 0
    timed_calls = None
    while (loop < loops or any(len(m[k]["done"]) < 2 * per for k in KINDS)) and time.monotonic() < deadline:
        timed = loop < loops  # the arrival loops; the drain after them only lets the run finish
        for kind in (KINDS if loop % 4 in (0, 3) else KINDS[::-1]):
            pairs = list(enumerate(zip(execs[kind], arrivals[kind])))
            for i, (ex, arriving) in (pairs if loop % 2 == 0 else pairs[::-1]):  # no executor always first
                if loop < len(arriving):
                    for ti in arriving[loop]:
                        ex.queue_workload(workload(ti, ex), session=None)
                trigger(ex, open_slots=32)
                before = lab.trips.snapshot()
                prof = profs.get(kind) if timed else None
                if prof is not None:
                    prof.enable()
                s0, c0 = time.perf_counter(), time.process_time()
                ex.sync()
                seconds, cpu = time.perf_counter() - s0, time.process_time() - c0
                if prof is not None:
                    prof.disable()
                db = lab.trips.since(before)
                if timed:
                    m[kind]["syncs"].append(seconds)
                    m[kind]["by_ex"][i].append(seconds)
                    m[kind]["cpus"].append(cpu)
                    m[kind]["statements"].append(db["statements"])
                    m[kind]["wire"].append(db["wire"])
                started = []
                for key, (state, info) in ex.get_event_buffer().items():
                    # Airflow 3.4's provider keys events by TaskInstanceUuid
                    ti_id = (ti_of.get((key.dag_id, key.task_id, key.run_id)) if hasattr(key, "dag_id")
                             else ti_ids.get(str(getattr(key, "id", ""))))
                    if ti_id is None:
                        continue
                    if state == TaskInstanceState.RUNNING:
                        started.append(ti_id)  # the worker would now run the task and report success
                    elif state in (TaskInstanceState.SUCCESS, TaskInstanceState.FAILED) or info is None:
                        m[kind]["done"].add(ti_id)
                lab.set_ti_state(started, "success")
        if loop == loops - 1:
            timed_calls = lab.api_calls(mark)
        loop += 1
        time.sleep(heartbeat)
    seconds = time.monotonic() - t0
    if timed_calls is None:  # the deadline passed during the arrival loops
        timed_calls = lab.api_calls(mark)
    out = {}
    for kind in KINDS:
        if kind in profs:
            write_profile(lab, profs[kind], f"loop_syncs_{kind}")
        whos = {f"scheduler-{ex.job_id}" for ex in execs[kind]}
        calls = [c for c in timed_calls if c.get("who") in whos and c.get("verb") != "watch"]
        verbs: dict = {}
        for c in calls:
            verbs[c.get("verb")] = verbs.get(c.get("verb"), 0) + 1
        for ex in execs[kind]:
            lab.end_executor(ex)
        kubelets[kind].stop()
        lab.procs.remove(kubelets[kind])
        k = m[kind]
        if len(k["done"]) < 2 * per:
            progress(f"WARNING: scheduler loop {kind} rep {rep}: only {len(k['done'])} of {2 * per} tasks finished")
        n = max(1, len(k["syncs"]))
        out[kind] = {"syncs": k["syncs"], "statements": k["statements"], "seconds": seconds, "done": len(k["done"]),
                     "p50": percentile(k["syncs"], 50), "p99": percentile(k["syncs"], 99),
                     "p50_by_executor": [percentile(x, 50) for x in k["by_ex"]],
                     "p99_by_executor": [percentile(x, 99) for x in k["by_ex"]],
                     "cpu_p50": percentile(k["cpus"], 50), "cpu_p99": percentile(k["cpus"], 99),
                     "statements_per_sync": sum(k["statements"]) / n, "wire_per_sync": sum(k["wire"]) / n,
                     "api_calls_per_sync": len(calls) / n, "api_verbs": verbs}
    return out


def in_flight(lab: Lab, sizes: list[int], syncs: int, batch_size: int = 128, explain: tuple[int, ...] = (1000, 5000)
              ) -> dict:
    """Idle syncs with N launches in flight (pods created, never started: no kubelet, so every
    one stays Pending and the fenced executor re-checks all N each loop). Per N: DB statements,
    API calls and the time per sync, stock vs fenced, syncs alternating ABBA, with a second stock
    executor beside them whose ratio to the first is the run's own noise (the A/A spread); at the
    sizes in ``explain``, the loop statement's ``EXPLAIN (ANALYZE, BUFFERS)``."""
    out: dict = {"sizes": sizes, "syncs": syncs, "raw": {}, "statements_per_sync": {}, "api_calls_per_sync": {},
                 "p50": {}, "spread": {}, "aa_spread": {}, "pending": {}, "explain": {}}
    kinds = ("stock", "fenced", "stock_b")
    for n in sizes:
        execs = {}
        for kind in kinds:
            ns = f"bench-inflight-{n}-{kind.replace('_', '-')}"
            ex = execs[kind] = lab.executor(kind.split("_")[0], namespace=ns, batch_size=batch_size)
            for ti in lab.queued_tis(n, ex.job_id, f"inflight_{kind}"):
                ex.queue_workload(workload(ti, ex), session=None)
            trigger(ex, open_slots=n)
            guard = 0
            while lab.pods_in(ns) < n and guard < 3 * n // batch_size + 20:
                ex.sync()
                guard += 1
            for _ in range(3):  # let the watcher's ADDED/Pending events drain
                time.sleep(0.2)
                ex.sync()
        pending = _in_flight_count(execs["fenced"])
        raw: dict = {kind: [] for kind in kinds}
        mark = lab.audit_mark()
        for i, kind in _rotated(syncs, kinds):
            ex = execs[kind]
            before = lab.trips.snapshot()
            with profiled(lab, f"inflight_{n}_sync_{kind}") if i == 0 and kind != "stock_b" else nullcontext(), \
                    quiet_gc():
                s0, c0 = time.perf_counter(), time.process_time()
                ex.sync()
                seconds, cpu = time.perf_counter() - s0, time.process_time() - c0
            raw[kind].append({"seconds": seconds, "cpu_seconds": cpu, "db": lab.trips.since(before)})
        calls = lab.api_calls(mark)
        key = str(n)
        out["raw"][key] = raw
        out["pending"][key] = pending
        out["statements_per_sync"][key] = {k: max(x["db"]["statements"] for x in v) for k, v in raw.items()}
        out.setdefault("wire_per_sync", {})[key] = {k: max(x["db"]["wire"] for x in v) for k, v in raw.items()}
        out["api_calls_per_sync"][key] = {
            k: sum(1 for c in calls if c.get("who") == f"scheduler-{execs[k].job_id}" and c.get("verb") != "watch")
            / syncs for k in raw}
        out["p50"][key] = {k: median([x["seconds"] for x in v]) for k, v in raw.items()}
        out.setdefault("cpu_p50", {})[key] = {k: median([x["cpu_seconds"] for x in v]) for k, v in raw.items()}
        out["spread"][key] = spread([x["seconds"] for x in raw["stock"]], [x["seconds"] for x in raw["fenced"]])
        out["aa_spread"][key] = spread([x["seconds"] for x in raw["stock"]], [x["seconds"] for x in raw["stock_b"]])
        if n in explain and hasattr(getattr(execs["fenced"], "_reads", None), "_digest"):  # 0.2.0's statement
            out["explain"][key] = _explain(lab, execs["fenced"])
        progress(f"in flight {n}: fenced in flight {pending}; sync p50 stock {out['p50'][key]['stock'] * 1e3:.2f} ms,"
                 f" fenced {out['p50'][key]['fenced'] * 1e3:.2f} ms (fenced/stock {fmt_spread(out['spread'][key])},"
                 f" stock/stock {fmt_spread(out['aa_spread'][key])}); DB statements per sync"
                 f" {out['statements_per_sync'][key]}, API calls per sync {out['api_calls_per_sync'][key]}")
        for ex in execs.values():
            forget(ex)
            lab.end_executor(ex)
        lab.finish_queued()  # the next size starts with no queued rows left behind
    return out


def _rotated(syncs: int, kinds: tuple[str, ...]):
    """Every kind once per round, the order rotating, so drift falls on every executor alike."""
    for i in range(syncs):
        shift = i % len(kinds)
        for kind in kinds[shift:] + kinds[:shift]:
            yield i, kind


def _in_flight_count(executor) -> int | None:
    """The launches the fenced executor re-checks each loop: its own not yet watched, and the watch's."""
    book, pods = getattr(executor, "book", None), getattr(executor, "in_flight_pods", None)
    if book is None:
        return None
    return len(book.pending()) + (len(pods.view) if pods is not None else 0)


def _explain(lab: Lab, executor) -> list[str]:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of the loop's statement as an idle loop sends it (the live set's
    digest, unmoved), then as the loop after a change sends it (the digest moved: the tokens too)."""
    from fenced_k8s_executor import ledger

    digest = executor._reads._digest or (-1, -1)
    plans = []
    for label, (count, total) in (("idle (digest unmoved)", digest), ("after a change (tokens fetched)", (-1, -1))):
        params = {"key_tokens": [], "count": count, "sum": str(total)}
        for prefix in ("", "key_"):
            for name in ("dag_ids", "task_ids", "run_ids", "map_indexes"):
                params[prefix + name] = []
        statement = "EXPLAIN (ANALYZE, BUFFERS) " + ledger._loop_statement(lab.engine, frozenset("d"))
        with lab.engine.connect() as conn:  # one transaction: the reader's planner settings apply
            if getattr(ledger, "PLANNER", ""):
                conn.exec_driver_sql(ledger.PLANNER)
            plans += [f"-- {label}"] + [row[0] for row in conn.exec_driver_sql(statement, params).fetchall()]
    return plans
