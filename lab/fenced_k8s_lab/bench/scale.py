"""``fenced-k8s-repro bench --only scale``: what fencing costs a real scheduler, end to end, with
thousands of tasks in flight (issue 48; docs/performance.md, "At scale").

Per size and kind, one deployment on the bench's PostgreSQL and emulator: a real api-server,
dag-processor and two ``airflow scheduler`` processes (SchedulerJobRunner), the process kubelet
holding pods (bound and Running with no process; each task started by the worker's first call,
``/run``), and one mapped task of N instances. Every figure is read from outside the processes
(``probes``): Airflow's loop timers through statsd, the emulator's audit, pg_stat_statements by
process role, /proc. Phases, on this process's clock:

- ``idle``: before the trigger, nothing in flight;
- ``fanout``: from the DAG run's start until every pod exists and every task is running;
- ``steady``: N tasks in flight, nothing changing;
- ``restart``: scheduler-1 gets SIGTERM and a new process starts with N pods in flight, until its
  fifth loop; start-up is the time from the new job's start to its first full loop. The old
  process gets ``restart_grace`` (60 s) to exit: the chart's 10 s would SIGKILL stock's (its
  shutdown waits on its watch) and leave its job alive, so that the new process would adopt
  nothing at start where fenced's, which exits in time, adopts half the pods: apples and pears;
- ``finish``: every held pod finishes as a worker that succeeded (``/state``, then Succeeded),
  until the executors have deleted every pod.

``--scale-tasks-per-run K`` spreads each size over N/K DAG runs of K mapped tasks, triggered
together; ``--scale-batch`` and ``--scale-max-tis-per-query`` raise the creation batch and the
scheduler's ``max_tis_per_query`` (both kinds alike): the set-up for 5,000 and 10,000 (issue 53).

Kinds run one after another, ABBA per size (stock, fenced, fenced, stock, ...): same machine,
same hour, nothing shared between runs but the PostgreSQL server and the emulator process.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from fenced_k8s_lab.bench.env import FENCED, STOCK, Lab, Proc, interleaved, progress
from fenced_k8s_lab.bench.probes import (HEARTBEAT, LOOP, MemorySampler, StatementCounter, TimerListener,
                                         create_roles, enable_statement_stats)
from fenced_k8s_lab.stack import AirflowProcess, AirflowStack

SCHEDULERS = ("scheduler-0", "scheduler-1")
ROLES = (*SCHEDULERS, "api-server", "dag-processor")
PHASES = ("idle", "fanout", "steady", "restart", "finish")
DAG_ID = "scale_fanout"

FULL = {"sizes": [1000, 5000, 10000], "reps": 2, "idle_seconds": 20, "steady_seconds": 60, "batch": 16,
        "max_tis_per_query": 16, "tasks_per_run": None,
        "restart_loops": 5, "restart_grace": 60.0}
QUICK = {**FULL, "sizes": [200, 1000], "idle_seconds": 10, "steady_seconds": 30}
SMOKE = {**FULL, "sizes": [12], "reps": 1, "idle_seconds": 4, "steady_seconds": 6, "restart_loops": 2}

DAG = '''
import pendulum
from airflow.sdk import dag, task


@dag(dag_id="{dag_id}", schedule=None, start_date=pendulum.datetime(2024, 1, 1), catchup=False,
     max_active_tasks={n}, max_active_runs={runs})
def scale_fanout():
    @task
    def work(i: int):
        return i

    work.expand(i=list(range({per_run})))


scale_fanout()
'''


def runs_of(n: int, cfg: dict) -> tuple[int, int]:
    """(DAG runs, mapped tasks per run) for ``n`` tasks in flight: one run of ``n``, or with
    ``tasks_per_run`` (``--scale-tasks-per-run``) ``n / tasks_per_run`` runs, as a deployment at
    that size spreads its tasks in flight over DAG runs."""
    per_run = cfg.get("tasks_per_run") or n
    if n % per_run:
        raise ValueError(f"--scale-tasks-per-run {per_run} does not divide {n} tasks")
    return n // per_run, per_run


def settings(n: int, cfg: dict) -> dict[str, str]:
    """What the bench changes from the shipped configuration, for stock and fenced alike (with the
    default pool's slots, set to N through the REST API, and the DAG's ``max_active_tasks`` = N).
    The caps make N tasks in flight possible at all; the provider's creation batch is its
    documented advice ("HIGHLY recommended"), sized to the scheduler's ``max_tis_per_query`` (16,
    kept): each loop can queue 16 tasks and create 16 pods. Held tasks run no process, so they
    never heartbeat, and report their end long after ``/run``. The periodic orphan check (300 s)
    is put out of the run's reach, so that the restarted scheduler alone adopts its predecessor's
    tasks, at its start, in every run: a peer whose check happened to fall in the restart adopted
    them too, and the restart's API calls and start-up depended on that timing. At the larger
    sizes an operator raises the scheduler's ``max_tis_per_query`` (16) and the creation batch
    with it (``--scale-max-tis-per-query``, ``--scale-batch``): alike for both kinds."""
    return {
        "AIRFLOW__CORE__PARALLELISM": str(n),  # 32: per scheduler; either may hold every task
        "AIRFLOW__CORE__MAX_MAP_LENGTH": str(runs_of(n, cfg)[1]),  # 1024
        "AIRFLOW__SCHEDULER__MAX_TIS_PER_QUERY": str(cfg.get("max_tis_per_query", 16)),  # 16
        "AIRFLOW__KUBERNETES_EXECUTOR__WORKER_PODS_CREATION_BATCH_SIZE": str(cfg["batch"]),  # 1
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "86400",  # 300
        "AIRFLOW__EXECUTION_API__JWT_EXPIRATION_TIME": "86400",  # 600
        "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "86400",  # 300 (the lab's stack: 30)
    }


#: The prefix of the witness's Lease calls in a phase's API counts (``lease:patch``, ``lease:create``).
WITNESS = "lease:"


def _user(role: str) -> str:
    return role.replace("-", "_")


class ScaleStack(AirflowStack):
    """The lab's deployment, each process with its own DB role and statsd prefix (``<tag>_<role>``)."""

    def __init__(self, *args: Any, tag: str, profile: Path | None = None, **kwargs: Any) -> None:
        self.tag, self.profile = tag, profile
        super().__init__(*args, **kwargs)

    def prefix(self, role: str) -> str:
        return f"{self.tag}_{_user(role)}"

    def process_env(self, role: str) -> dict[str, str]:
        from sqlalchemy.engine import make_url

        from fenced_k8s_lab.postgres import airflow_db_env

        env = super().process_env(role)
        url = make_url(self.db_url).set(username=_user(role)).render_as_string(hide_password=False)
        return {**env, **airflow_db_env(url), "AIRFLOW__METRICS__STATSD_PREFIX": self.prefix(role)}

    def _add(self, role: str, *args: str) -> AirflowProcess:
        if self.profile is None or role != SCHEDULERS[0]:
            return super()._add(role, *args)
        argv = [sys.executable, "-m", "cProfile", "-o", str(self.profile), "-m", "airflow", *args]
        self.processes[role] = proc = AirflowProcess(role, argv, self.process_env(role), self.log_dir)
        return proc.start()  # cProfile of the first scheduler (--profile); it writes on a graceful exit


class Deployment:
    """One kind at one size: start, the five phases, the figures, stop."""

    def __init__(self, lab: Lab, timers: TimerListener, kind: str, n: int, tag: str, cfg: dict):
        self.lab, self.timers, self.kind, self.n, self.tag, self.cfg = lab, timers, kind, n, tag, cfg
        self.dir = lab.workdir / tag
        self.namespace = f"scale-{tag}"
        self.marks: dict[str, dict] = {}  # phase -> {t, audit, statements}
        self.events: dict[str, float] = {}
        self.memory = MemorySampler()
        self.stack: ScaleStack | None = None
        self.kubelet: Proc | None = None
        self.engine: Any = None  # the bench's own reads of this deployment's DB (progress, jobs)
        self._quiet_until = 0.0  # progress lines at most every 10 s
        self.recorders = None  # --scale-pyspy: one py-spy per scheduler process and phase (pyspy.py)

    # ---- set-up

    def start(self) -> None:
        from fenced_k8s_lab.postgres import new_airflow_db

        self.dir.mkdir(parents=True, exist_ok=True)
        dags = self.dir / "dags"
        dags.mkdir(exist_ok=True)
        runs, per_run = runs_of(self.n, self.cfg)
        (dags / f"{DAG_ID}.py").write_text(DAG.format(dag_id=DAG_ID, n=self.n, runs=runs, per_run=per_run))
        import sqlalchemy as sa

        self.db_url = new_airflow_db(self.lab.pg)
        self.database = self.db_url.rsplit("/", 1)[1]
        self.engine = sa.create_engine(self.db_url, poolclass=sa.pool.NullPool)
        self.statements = StatementCounter(self.lab.pg, self.database)
        profile = None
        if self.lab.profile_dir is not None:
            self.lab.profile_dir.mkdir(parents=True, exist_ok=True)
            profile = self.lab.profile_dir / f"scale_{self.n}_{self.kind}_{self.tag}.prof"
        self.lab.ensure_namespace(self.namespace)
        env = {**settings(self.n, self.cfg), **self.timers.env(prefix=f"{self.tag}_unnamed")}
        self.stack = ScaleStack(self.dir, self.db_url, self.lab.emu_url, dags,
                                executor=STOCK if self.kind == "stock" else FENCED, schedulers=len(SCHEDULERS),
                                namespace=self.namespace, env=env, emulator=self.lab.emu, tag=self.tag, profile=profile)
        kubeconfig = self.lab.kubeconfig("kubelet", self.namespace)
        self.kubelet = Proc([sys.executable, "-m", "fenced_k8s_lab.kubelet", "--kubeconfig", kubeconfig,
                             "--namespace", self.namespace, "--node-name", f"node-{self.tag}", "--hold", "running",
                             "--workdir", str(self.dir / "kubelet"),
                             "--env", f"AIRFLOW__CORE__EXECUTION_API_SERVER_URL={self.stack.api_url}/execution/"],
                            self.dir / "kubelet.log")
        self.stack.start()
        self.stack.wait_schedulers_heartbeat(timeout=300)
        client = self.stack.client()
        client.wait_dags([DAG_ID], timeout=300)
        client._req("PATCH", "/api/v2/pools/default_pool?update_mask=slots", {"slots": self.n})
        for role in SCHEDULERS:
            self.memory.watch(role, self.stack.processes[role].pid)
        self.memory.start()
        if self.cfg.get("pyspy"):
            from fenced_k8s_lab.bench.pyspy import Recorders

            self.recorders = Recorders(Path(self.cfg["pyspy"]))

    # ---- phases

    def mark(self, phase: str) -> None:
        self.marks[phase] = {"t": time.time(), "audit": self.lab.audit_mark(), "statements": self.statements.snapshot(),
                             "load": _load()}
        if self.recorders is not None:  # the phase before ends here; each live scheduler is sampled anew
            self.recorders.stop_all()
            if phase in PHASES:
                for role in SCHEDULERS:
                    self._record(phase, role, self.stack.processes[role].pid)

    def _record(self, phase: str, role: str, pid: int | None) -> None:
        if self.recorders is not None and pid is not None:
            self.recorders.start(f"{self.tag}_{self.kind}_{phase}_{role}", pid)

    def run(self) -> dict:
        self.mark("idle")
        time.sleep(self.cfg["idle_seconds"])
        self.mark("fanout")
        self.events["triggered"] = time.time()
        client = self.stack.client()
        for _ in range(runs_of(self.n, self.cfg)[0]):  # the runs' tasks in flight together
            client.trigger(DAG_ID)
        self._fan_out()
        self.mark("steady")
        time.sleep(self.cfg["steady_seconds"])
        self.mark("restart")
        self._restart(self.stack.processes[SCHEDULERS[1]])
        self.mark("finish")
        self._finish()
        self.mark("end")
        return self.figures()

    def _sql(self, text: str, **params: Any) -> list:
        """Rows of one read-only statement on this deployment's DB (the bench's own connection)."""
        import sqlalchemy as sa

        with self.engine.connect() as conn:
            return conn.execute(sa.text(text), params).all()

    def _progress(self) -> tuple[int, dict[str, int]]:
        states = dict(self._sql("SELECT coalesce(state, 'none'), count(*) FROM task_instance WHERE dag_id = :d"
                                " GROUP BY 1", d=DAG_ID))
        (started,), = self._sql("SELECT EXTRACT(EPOCH FROM min(start_date)) FROM dag_run WHERE dag_id = :d", d=DAG_ID)
        if started is not None:
            self.events.setdefault("run_started", float(started))
        return self.lab.pods_in(self.namespace), states

    def _wait(self, what: str, done, timeout: float) -> bool:
        """Poll every 0.5 s until ``done(pods, states)``; record when each ``what`` first held."""
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            pods, states = self._progress()
            for name, test in done.items():
                if name not in self.events and test(pods, states):
                    self.events[name] = time.time()
            summary = (pods, tuple(sorted(states.items())))
            if summary != last and time.monotonic() > self._quiet_until:
                progress(f"  [{self.tag} {self.kind} {self.n}] {what}: {pods} pods, {dict(states)}")
                self._quiet_until = time.monotonic() + 10
            last = summary
            if all(name in self.events for name in done):
                return True
            time.sleep(0.5)
        progress(f"  [{self.tag}] {what}: not done after {timeout:.0f} s")
        return False

    def _fan_out(self) -> None:
        n = self.n
        self._wait("fan-out", {"all_pods": lambda pods, states: pods >= n,
                               "all_running": lambda pods, states: states.get("running", 0) >= n},
                   timeout=max(600.0, n * 0.5))

    def _restart(self, proc) -> None:
        """SIGTERM (``restart_grace``, then SIGKILL), then a new process for the same role."""
        prefix = self.stack.prefix(proc.name)
        self.events["handed_over"] = self._tasks_of(proc.name)
        t0 = time.time()
        proc.stop(timeout=self.cfg["restart_grace"])
        self.events["old_exit"] = time.time() - t0
        self.events["old_returncode"] = proc.proc.returncode
        proc.restarts += 1
        self.events["spawned"] = time.time()
        proc.start()
        self._record("restart", "restarted", proc.pid)  # from its start: the executor's, the adoption, the loops
        self.memory.watch(proc.name, proc.pid)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            loops = [ts for ts, p, t, _ in list(self.timers.samples)
                     if p == prefix and t == LOOP and ts > self.events["spawned"]]
            if loops and "first_loop" not in self.events:
                self.events["first_loop"] = loops[0]
                self.events["job_started"] = self._job_start(proc.name)
                self.events["first_loop_seconds"] = self.timers.series(prefix, LOOP, loops[0], loops[0] + 1e-6)[0]
                self.events.update(_start_steps(proc.log_path))
            if len(loops) >= self.cfg["restart_loops"] or not proc.alive():
                return
            time.sleep(0.5)
        progress(f"  [{self.tag}] the restarted {proc.name} did not loop {self.cfg['restart_loops']} times")

    def _tasks_of(self, role: str) -> int:
        """Tasks in flight that ``role``'s running scheduler job queued: what its successor adopts."""
        (count,), = self._sql("SELECT count(*) FROM task_instance t JOIN job j ON j.id = t.queued_by_job_id"
                              " WHERE j.hostname = :h AND j.state = 'running' AND t.state IN ('queued', 'running')",
                              h=role)
        return int(count)

    def _job_start(self, role: str) -> float | None:
        """When ``role``'s latest scheduler job started."""
        rows = self._sql("SELECT EXTRACT(EPOCH FROM start_date) FROM job WHERE hostname = :h"
                         " AND job_type = 'SchedulerJob' ORDER BY id DESC LIMIT 1", h=role)
        return float(rows[0][0]) if rows else None

    def _finish(self) -> None:
        self.events["released"] = time.time()
        self.kubelet.p.send_signal(signal.SIGUSR1)
        n = self.n
        self._wait("finish", {"all_success": lambda pods, states: states.get("success", 0) >= n,
                              "all_deleted": lambda pods, states: pods == 0 and states.get("success", 0) >= n},
                   timeout=max(600.0, n * 0.5))
        time.sleep(3)  # the last deletes' answers

    # ---- figures

    @staticmethod
    def _after(phase: str) -> str:
        """The mark that ends ``phase``."""
        return PHASES[PHASES.index(phase) + 1] if phase != PHASES[-1] else "end"

    def _window(self, phase: str) -> tuple[float, float]:
        return self.marks[phase]["t"], self.marks[self._after(phase)]["t"]

    def _api(self, phase: str) -> dict:
        start, end = self.marks[phase]["audit"], self.marks[self._after(phase)]["audit"]
        counts: dict[str, dict[str, int]] = {}
        for entry in self.lab.api_calls(start):
            if entry["index"] >= end or entry.get("who") not in SCHEDULERS:
                continue
            verb = entry["verb"] + (f"/{entry['subresource']}" if entry.get("subresource") else "")
            if entry.get("resource") == "leases":
                verb = f"{WITNESS}{verb}"  # the witness's calls, apart from the pod calls both kinds make
            code = str(entry.get("code"))
            counts.setdefault(verb, {})
            counts[verb][code] = counts[verb].get(code, 0) + 1
        return counts

    def figures(self) -> dict:
        from fenced_k8s_lab.bench.env import percentile

        out: dict[str, Any] = {"kind": self.kind, "size": self.n, "tag": self.tag, "phases": {}}
        for phase in PHASES:
            start, end = self._window(phase)
            loops = {r: self.timers.series(self.stack.prefix(r), LOOP, start, end) for r in SCHEDULERS}
            beats = {r: self.timers.series(self.stack.prefix(r), HEARTBEAT, start, end) for r in SCHEDULERS}
            pooled = [v for r in SCHEDULERS for v in loops[r]]
            before, after = self.marks[phase]["statements"], self.marks[self._after(phase)]["statements"]
            db = {r: StatementCounter.diff(before, after, _user(r), top=12 if r in SCHEDULERS or phase == "steady" else 0)
                  for r in ROLES}
            out["phases"][phase] = {
                "seconds": end - start,
                "load": self.marks[phase].get("load"),
                "loops": {r: len(loops[r]) for r in SCHEDULERS},
                "loop_p50": percentile(pooled, 50), "loop_p99": percentile(pooled, 99),
                "loop_mean": sum(pooled) / len(pooled) if pooled else None,
                "loop_p50_by_scheduler": {r: percentile(loops[r], 50) for r in SCHEDULERS},
                "loop_p99_by_scheduler": {r: percentile(loops[r], 99) for r in SCHEDULERS},
                "executor_share": (sum(v for r in SCHEDULERS for v in beats[r]) / sum(pooled)) if pooled else None,
                "api": self._api(phase),
                "db": db,
                "statements_per_loop": {r: (db[r]["statements"] / len(loops[r]) if loops[r] else None)
                                        for r in SCHEDULERS},
            }
            witness = sum(sum(codes.values()) for verb, codes in out["phases"][phase]["api"].items()
                          if verb.startswith(WITNESS))
            runs = sum(len(loops[r]) for r in SCHEDULERS)
            out["phases"][phase]["witness_calls_per_loop"] = witness / runs if runs else None
        ev = self.events
        began = ev.get("run_started", ev["triggered"])
        out["fanout"] = {k: (ev[k] - began if k in ev else None) for k in ("all_pods", "all_running")}
        out["fanout"]["from_trigger"] = {k: (ev[k] - ev["triggered"] if k in ev else None)
                                         for k in ("all_pods", "all_running")}
        out["tasks_per_second"] = self.n / out["fanout"]["all_running"] if out["fanout"]["all_running"] else None
        out["finish"] = {k: (ev[k] - ev["released"] if k in ev else None) for k in ("all_success", "all_deleted")}
        out["startup"] = {
            "first_loop_after_spawn": ev["first_loop"] - ev["spawned"] if "first_loop" in ev else None,
            "first_loop_after_job_start": (ev["first_loop"] - ev["job_started"]
                                           if ev.get("job_started") and "first_loop" in ev else None),
            "old_exit_seconds": ev.get("old_exit"), "old_returncode": ev.get("old_returncode"),
            "handed_over": ev.get("handed_over")}
        if {"first_loop", "log_starting", "log_adopting"} <= set(ev):  # where the start-up went
            out["startup"]["executors_start"] = ev["log_adopting"] - ev["log_starting"]
            out["startup"]["adoption"] = ev["first_loop"] - ev["first_loop_seconds"] - ev["log_adopting"]
            out["startup"]["first_loop"] = ev["first_loop_seconds"]
        out["memory"] = {"peak_pss_mb": dict(self.memory.peak_pss_mb), "peak_rss_mb": dict(self.memory.peak_rss_mb),
                         "peak_parts_mb": dict(self.memory.peak_parts_mb)}
        return out

    def stop(self) -> None:
        self.memory.stop()
        if self.recorders is not None:
            self.recorders.stop_all()
        if self.stack is not None:
            if self.stack.profile is not None and SCHEDULERS[0] in self.stack.processes:
                self.stack.processes[SCHEDULERS[0]].stop(timeout=90)  # SIGTERM: cProfile writes on the way out
            self.stack.stop()
        if self.kubelet is not None:
            self.kubelet.stop()
        try:
            self.lab._bench_control("POST", "clear", {"namespace": self.namespace})
        except Exception as error:  # noqa: BLE001 - the next run has its own namespace
            progress(f"  [{self.tag}] could not clear {self.namespace}: {error}")
        if self.engine is not None:
            self.engine.dispose()
            self.lab.pg.drop_database(self.database)
        if self.stack is not None and self.stack.profile is not None and self.stack.profile.exists():
            _profile_text(self.stack.profile)


def _start_steps(log: Path) -> dict[str, float]:
    """When the new scheduler process logged "Starting the scheduler" (its job begins, then its
    executor's ``start()``) and "Adopting or resetting orphaned tasks" (the executor started; the
    adoption before the first loop begins), from its log's timestamps."""
    from datetime import datetime

    marks = {"log_starting": "Starting the scheduler", "log_adopting": "Adopting or resetting orphaned tasks"}
    found: dict[str, float] = {}
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        for key, text in marks.items():
            if key not in found and text in line:
                try:
                    found[key] = datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")).timestamp()
                except ValueError:
                    pass
        if len(found) == len(marks):
            break
    return found


def _profile_text(path: Path) -> None:
    import io
    import pstats

    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    stats.sort_stats("cumulative").print_stats(60)
    stats.sort_stats("tottime").print_stats(40)
    path.with_suffix(".txt").write_text(out.getvalue())


def run(lab: Lab, cfg: dict, checkpoint=lambda partial: None) -> dict:
    """Every size, stock and fenced ABBA per size; each run's figures, in the order they ran
    (handed to ``checkpoint`` after each run, so that a long run cut short keeps what it measured)."""
    enable_statement_stats(lab.pg)
    create_roles(lab.pg, [_user(r) for r in ROLES])
    timers = TimerListener().start()
    runs: list[dict] = []
    try:
        for n in cfg["sizes"]:
            for rep, kind in interleaved(cfg["reps"]):
                tag = f"r{len(runs) + 1}"
                progress(f"scale: {kind}, {n:,} tasks, repetition {rep + 1} ({tag})")
                deployment = Deployment(lab, timers, kind, n, tag, cfg)
                load = _load()
                try:
                    deployment.start()
                    figures = deployment.run()
                except Exception as error:  # noqa: BLE001 - one failed run costs that run alone
                    progress(f"  [{tag}] failed: {error!r}")
                    figures = {"kind": kind, "size": n, "tag": tag, "error": repr(error)}
                finally:
                    deployment.stop()
                runs.append({**figures, "rep": rep, "load_before": load, "load_after": _load()})
                progress(f"  [{tag}] done: {json.dumps(_brief(runs[-1]), default=str)}")
                checkpoint({"config": cfg, "runs": runs})
    finally:
        dropped = timers.dropped()
        timers.stop()
    return {"config": cfg, "settings": settings(max(cfg["sizes"]), cfg), "runs": runs,
            "statsd": {"lines": timers.lines, "dropped": dropped}}


def _load() -> list[float]:
    import os

    return [round(x, 2) for x in os.getloadavg()]


def _brief(r: dict) -> dict:
    if "error" in r:
        return {"error": r["error"]}
    steady = r["phases"]["steady"]
    return {"fanout_s": r["fanout"], "tasks_per_s": r["tasks_per_second"], "steady_p50": steady["loop_p50"],
            "steady_p99": steady["loop_p99"], "startup": r["startup"], "memory": r["memory"]}
