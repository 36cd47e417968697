"""Run one scenario on one executor: a fresh DB, namespace and emulator, the Airflow HA stack and
the process kubelet; drive the scenario; collect evidence; tear everything down."""

from __future__ import annotations

import importlib.util
import json
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from fenced_k8s_lab import evidence as ev
from fenced_k8s_lab.dags import write_fanout
from fenced_k8s_lab.measure import TERMINAL, measure
from fenced_k8s_lab.scenarios import Scenario
from fenced_k8s_lab.stack import STOCK_EXECUTOR
from fenced_k8s_executor.names import EXECUTOR_CLASS_PATH

EXECUTORS = {"stock": STOCK_EXECUTOR, "fenced": EXECUTOR_CLASS_PATH}
#: The fenced executor runs on its shipped defaults; a scenario that needs another setting says so
#: in ``Scenario.fenced_env`` and the report prints it beside the figures it produced.
COMMON_ENV = {
    # Keep finished pods as evidence (the stock executor would delete Succeeded ones).
    "AIRFLOW__KUBERNETES_EXECUTOR__DELETE_WORKER_PODS": "False",
    "AIRFLOW__CORE__PARALLELISM": "64",
}


@dataclass
class RunContext:
    """What a scenario's ``drive`` may do to the deployment; every fault is recorded."""

    scenario: Scenario
    width: int
    stack: Any
    emulator: Any
    dag_id: str
    say: Callable[[str], None]
    t0: float = field(default_factory=time.time)
    faults: list[dict] = field(default_factory=list)
    run_id: str | None = None
    marked: threading.Event = field(default_factory=threading.Event)
    slow_start: float | None = None
    cleared: list[dict] = field(default_factory=list)  # TIs cleared through the REST API {ts, task_id}
    neighbour: Any = None  # the other deployment in a shared namespace (its AirflowStack), if any
    neighbour_run_id: str | None = None
    killed: set = field(default_factory=set)  # scheduler roles the scenario killed or retired on purpose
    restarts: list[dict] = field(default_factory=list)  # scheduler processes started during the run {ts, role, why}
    db: Any = None  # the PostgreSQL server holding the metadata DB (``db_outage`` stops it)
    _stops: list = field(default_factory=list)  # background work of the scenario, stopped at the end

    def note(self, what: str) -> None:
        self.faults.append({"ts": time.time(), "what": what})
        self.say(f"  fault @{time.time() - self.t0:5.1f}s: {what}")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def fault(self, what: str, **spec: Any) -> None:
        self.emulator.add_fault(**spec)
        self.note(what)

    def clear_faults(self, what: str) -> None:
        self.emulator.clear_faults()
        self.note(what)

    def pod_quota(self, limit: int, message: str) -> None:
        """A namespace ResourceQuota of ``limit`` pods, as the API server's quota admission applies
        it: a create is refused (403 ``exceeded quota``) while ``limit`` pods that have not finished
        exist. A thread admits one create at a time: it arms a create fault that lets exactly one
        create through (``after=1``) while there is room, else none (``after=0``), and arms the next
        one once that create went through. The used fault refuses every create until it is
        replaced, so no two creates are ever admitted on one count. A create admitted but not yet
        stored counts as live; one whose pod never showed up (it failed after admission, or was
        deleted at once) stops counting after 2 quiet seconds."""
        stop = threading.Event()
        self._stops.append(stop.set)
        namespace = self.stack.namespace

        def live() -> set[str]:
            return {p["metadata"]["uid"] for p in self.emulator.pods(namespace)
                    if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")}

        def arm(room: bool) -> int:
            return self.emulator.add_fault(method="POST", path=r"/pods$", status=403, message=message,
                                           after=1 if room else 0)

        known = live()
        first = arm(len(known) < limit)  # before any create can pass unaccounted

        def keep(armed: int, room: bool, known: set[str]) -> None:
            pending, quiet = 0, time.monotonic()  # creates admitted whose pod was not seen yet
            while not stop.wait(0.1):
                try:
                    now = live()
                    used = room and any(f["id"] == armed and f["seen"] >= 1 for f in self.emulator.faults())
                    pending += used  # an admission comes before its pod shows up
                    if used or now - known:
                        pending, quiet = max(0, pending - len(now - known)), time.monotonic()
                    known = now
                    if pending and time.monotonic() - quiet > 2.0:
                        pending = 0
                    want = len(known) + pending < limit
                    if used or want != room:
                        fresh = arm(want)
                        self.emulator.clear_faults(armed)  # the new one is in force first
                        armed, room = fresh, want
                except Exception as error:  # noqa: BLE001 - the emulator is going away with the run
                    if not stop.is_set():
                        self.say(f"  pod quota: {error!r}")

        threading.Thread(target=keep, args=(first, len(known) < limit, known), name="lab-pod-quota",
                         daemon=True).start()
        self.note(f"namespace pod quota: {limit} pods")

    def close(self) -> None:
        """Stop what the scenario left running in the background (a pod quota)."""
        for stop in self._stops:
            stop()

    def trigger(self, run_id: str | None = None) -> None:
        run = self.stack.client().trigger(self.dag_id, run_id=run_id)
        self.run_id = run["dag_run_id"]
        self.note(f"DAG run triggered ({self.width} tasks)")  # a step of its own on the timeline

    def trigger_neighbour(self, run_id: str | None = None) -> None:
        run = self.neighbour.client().trigger(self.dag_id, run_id=run_id)
        self.neighbour_run_id = run["dag_run_id"]
        self.note(f"neighbour deployment triggered {self.dag_id} run {self.neighbour_run_id}")

    def neighbour_terminal(self) -> bool:
        tis = self.neighbour.client().task_instances(self.dag_id, self.neighbour_run_id)
        return bool(tis) and all(ti.get("state") in TERMINAL for ti in tis)

    def task_instances(self) -> list[dict]:
        return self.stack.client().task_instances(self.dag_id, self.run_id) if self.run_id else []

    def _task_instances_or_none(self) -> list[dict] | None:
        try:
            return self.task_instances()
        except Exception:  # noqa: BLE001 - the api-server answered with an error or not at all
            return None

    def wait_pods(self, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while len(self.emulator.pods(self.stack.namespace)) < count and time.monotonic() < deadline:
            time.sleep(0.5)

    def clear_tasks(self, what: str, states: tuple[str, ...] = ("queued",)) -> None:
        """Clear the TIs in `states` through the REST API, as a user would; the cleared TIs are
        recorded (each clear archives a try: not a try burned by HA)."""
        picked = [ti["task_id"] for ti in self.task_instances() if ti.get("state") in states]
        if picked:
            answer = self.stack.client().clear(self.dag_id, self.run_id, task_ids=picked) or {}
            done = [ti.get("task_id") for ti in answer.get("task_instances", [])] or picked
            self.cleared += [{"ts": time.time(), "task_id": task_id} for task_id in done]
        self.note(f"{what} ({len(picked)} TIs)")

    def wait_states(self, states: tuple[str, ...], count: int, timeout: float = 120) -> int:
        """Wait until at least `count` TIs are in `states`; returns how many are."""
        deadline, found = time.monotonic() + timeout, 0
        while time.monotonic() < deadline:
            found = sum(1 for ti in self._task_instances_or_none() or () if ti.get("state") in states)
            if found >= count:
                break
            time.sleep(1)
        return found

    def slow_start_until_marked(self, seconds: float) -> None:
        self.slow_start = seconds

    def mark(self) -> None:
        self.marked.set()

    def start_delay(self, base: Callable[[dict], float] | None) -> Callable[[dict], float]:
        def delay(pod: dict) -> float:
            if self.slow_start is not None and not self.marked.is_set():
                return self.slow_start
            return base(pod) if base else 0.5

        return delay

    def pause_scheduler(self, i: int, what: str) -> None:
        self.stack.schedulers[i].pause()
        self.note(what)

    def resume_scheduler(self, i: int, what: str) -> None:
        self.stack.schedulers[i].resume()
        self.note(what)

    def kill_scheduler(self, i: int, what: str) -> None:
        self.killed.add(self.stack.schedulers[i].name)  # before the signal: the supervisor must not restart it
        self.stack.schedulers[i].kill()
        self.note(what)

    def roll_scheduler(self, i: int, during: Callable[[], None] | None = None, grace: float = 10.0) -> None:
        """Replace scheduler ``i`` as a Deployment's rolling update does (the chart's schedulers,
        maxSurge 1): a new scheduler (a new pod: its own host name, a new SchedulerJob) starts and
        heartbeats, then the old one gets SIGTERM (its whole process group, as dumb-init forwards
        it) and ``grace`` seconds (the chart's terminationGracePeriodSeconds) before SIGKILL.
        ``during`` runs right after the SIGTERM, while the old scheduler is stopping."""
        old = self.stack.schedulers[i]
        self.killed.add(old.name)  # a requested exit: the supervisor must not start it again
        new = self.stack.start_scheduler(self.stack.n_schedulers)
        self.restarts.append({"ts": time.time(), "role": new.name, "why": f"rolling update of {old.name}"})
        self.note(f"{new.name} started to replace {old.name}")
        deadline = time.monotonic() + 120
        while not any(j["hostname"] == new.name and j["state"] == "running" and j["age"] < 15
                      for j in self.stack.scheduler_jobs()):
            if not new.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{new.name} did not come up:\n{new.tail()}")
            time.sleep(1)
        self.note(f"{new.name} heartbeats; SIGTERM {old.name}")
        t0 = time.monotonic()
        old.signal(signal.SIGCONT)
        old.signal(signal.SIGTERM)
        if during is not None:
            during()
        old.reap(t0 + grace)
        how = "exited" if old.proc.returncode == 0 else f"killed after {grace:.0f} s (rc {old.proc.returncode})"
        self.note(f"{old.name} {how} {time.monotonic() - t0:.1f} s after SIGTERM")

    def db_outage(self, seconds: float) -> None:
        """Stop the metadata database's server (pg_ctl stop -m fast: every connection dropped) for
        ``seconds``, then start it again on the same port and data."""
        self.db.stop(cleanup=False)
        self.note(f"metadata DB stopped for {seconds:.0f} s")
        time.sleep(seconds)
        self.db.start()
        self.note("metadata DB back")

    def wait_api(self, timeout: float = 120) -> None:
        """Until the api-server answers REST calls again (after a DB outage)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.stack.client().get_dag(self.dag_id)
                return
            except Exception:  # noqa: BLE001 - not yet
                time.sleep(1)
        self.say("  the api-server did not answer again")

    def wait_schedulers(self, timeout: float = 180) -> None:
        """Until every scheduler role the scenario did not retire heartbeats (the supervisor starts
        crashed ones again after its back-off)."""
        deadline = time.monotonic() + timeout
        want = {p.name for p in self.stack.schedulers if p.name not in self.killed}
        while time.monotonic() < deadline:
            try:
                jobs = self.stack.scheduler_jobs()
            except Exception:  # noqa: BLE001 - the DB may still be coming back
                jobs = []
            fresh = {j["hostname"] for j in jobs if j["state"] == "running" and j["age"] < 15}
            alive = {p.name for p in self.stack.schedulers if p.alive()}
            if want <= fresh and want <= alive:
                self.note("every scheduler heartbeats again")
                return
            time.sleep(1)
        self.say("  not every scheduler heartbeats again")

    def scheduler_faults(self, what: str, specs: list[dict]) -> None:
        """Inject each fault spec once per scheduler (the fault's ``who``), so the kubelet and the
        api-server never meet them: the faults are aimed at the executor's own API calls."""
        for proc in self.stack.schedulers:
            for spec in specs:
                self.emulator.add_fault(**spec, who=proc.name)
        self.note(what)

    def queued_backlog(self) -> dict[str, int]:
        """{scheduler role: its QUEUED TIs that have no pod yet} (the jobs still in its task queue),
        from the metadata DB (``queued_by_job_id``) and the API's pods (task and try annotations)."""
        import sqlalchemy as sa

        engine = sa.create_engine(self.stack.db_url, poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as conn:
                rows = conn.execute(sa.text(
                    "SELECT ti.task_id, ti.try_number, job.hostname FROM task_instance ti "
                    "LEFT JOIN job ON job.id = ti.queued_by_job_id WHERE ti.state = 'queued'")).all()
        finally:
            engine.dispose()
        have_pod = {((p["metadata"].get("annotations") or {}).get("task_id"),
                     str((p["metadata"].get("annotations") or {}).get("try_number")))
                    for p in self.emulator.pods(self.stack.namespace)}
        backlog: dict[str, int] = {}
        for task_id, try_number, role in rows:
            if (task_id, str(try_number)) not in have_pod:
                backlog[role or "?"] = backlog.get(role or "?", 0) + 1
        return backlog

    def watch_gap(self) -> None:
        self.emulator.compact()
        self.emulator.close_watches()
        self.note("410 Gone: history compacted, watches closed")

    def wait_terminal(self, every: tuple[float, Callable[[], None]] | None = None) -> bool:
        deadline = time.monotonic() + self.scenario.timeout
        next_tick = time.monotonic() + (every[0] if every else 0)
        last = ""
        while time.monotonic() < deadline:
            tis = self._task_instances_or_none()
            if tis is None:  # the api-server could not answer (a DB outage): ask again
                time.sleep(2)
                continue
            states = sorted(str(ti.get("state")) for ti in tis)
            summary = ", ".join(f"{s}={states.count(s)}" for s in sorted(set(states)))
            if summary != last:
                self.say(f"  @{time.time() - self.t0:5.1f}s tasks: {summary}")
                last = summary
            if tis and all(ti.get("state") in TERMINAL for ti in tis):
                return True
            if every and time.monotonic() >= next_tick:
                every[1]()
                next_tick = time.monotonic() + every[0]
            time.sleep(2)
        self.say("  timed out waiting for terminal states")
        return False


class CrashSupervisor:
    """Restarts a scheduler process that exits on its own, as a Deployment's restart policy would
    (back-off 10 s, doubling to 40 s), and records every exit: the evidence behind "scheduler
    crashes". Exits the scenario asked for (``ctx.killed``) are recorded as requested and left
    dead (``failover``). Stopped before the stack is torn down."""

    BACKOFF = (10.0, 20.0, 40.0)

    def __init__(self, stack: Any, ctx: RunContext, say: Callable[[str], None]):
        self.stack, self.ctx, self.say = stack, ctx, say
        self.exits: list[dict] = []
        self.restarts: list[dict] = []  # the exited schedulers it started again {ts, role, why}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lab-crash-supervisor", daemon=True)
        self._due: dict[str, float] = {}  # role -> when to restart it

    def start(self) -> "CrashSupervisor":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.check()
            except Exception as error:  # noqa: BLE001 - never take the run down
                self.say(f"  crash supervisor: {error!r}")

    def check(self) -> None:
        for i, proc in enumerate(self.stack.schedulers):
            if proc.alive() or proc.proc is None:
                continue
            role = proc.name
            if role not in self._due:
                proc.signal(signal.SIGKILL)  # the container goes with its main process: its watcher too
                requested = role in self.ctx.killed
                self.exits.append({"ts": time.time(), "role": role, "returncode": proc.proc.returncode,
                                   "requested": requested, "log": proc.log_path.name,
                                   "last_error": _last_error(proc.tail(150))})
                if requested:
                    self._due[role] = float("inf")
                    continue
                crashes = sum(1 for e in self.exits if e["role"] == role and not e["requested"])
                backoff = self.BACKOFF[min(crashes, len(self.BACKOFF)) - 1]
                self._due[role] = time.time() + backoff
                self.ctx.note(f"{role} exited (rc {proc.proc.returncode}); restart in {backoff:.0f}s")
            elif time.time() >= self._due[role]:
                del self._due[role]
                self.stack.start_scheduler(i)
                self.restarts.append({"ts": time.time(), "role": role, "why": "exited"})
                self.ctx.note(f"{role} restarted")

    def stop(self) -> list[dict]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        return self.exits


def _last_error(tail: str) -> str:
    """The last error line of a dead process' log, with the last airflow frames it went through."""
    import re

    lines = [line for line in tail.splitlines() if line.strip()]
    frames = re.findall(r'File "[^"]*/(airflow/[^"]+)", line (\d+), in (\w+)', tail)
    where = " <- ".join(f"{func} ({path.rsplit('/', 1)[-1]}:{line})" for path, line, func in reversed(frames[-3:]))
    error = next((line.strip() for line in reversed(lines) if "Error" in line or "Exception" in line),
                 lines[-1].strip() if lines else "")
    return (error[:200] + (f" at {where}" if where else ""))[:400]


def _settle(kubelet: Any, emulator: Any, namespace: str, *, timeout: float, say: Callable[[str], None]) -> None:
    """Wait until every pod has finished or is gone: a superseded pod often starts after its task
    instance is long done, and that is exactly what the lab must see."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live = [p for p in emulator.pods(namespace)
                if (p.get("status") or {}).get("phase") in (None, "Pending", "Running")]
        if not live:
            return
        time.sleep(1)
    say(f"  {len(live)} pod(s) still Pending/Running after {timeout:.0f}s")


class _NamedAs:
    """The Kubernetes backend as seen by a second deployment: its callers get a name prefix in
    the audit; everything else (kubeconfigs, namespaces) is the backend's own."""

    def __init__(self, emulator: Any, prefix: str):
        self.emulator, self.prefix = emulator, prefix

    def __getattr__(self, name: str) -> Any:
        return getattr(self.emulator, name)

    def set_tokens(self, mapping: dict[str, str]) -> None:
        self.emulator.set_tokens({token: f"{self.prefix}{name}" for token, name in mapping.items()})


NEIGHBOUR = "neighbour-"


def _neighbour_pod_template(neighbour: Any, ours: dict[str, str], start_delay: float | None) -> None:
    """The neighbour's pods carry their own deployment's settings (API URL, secrets, DB) in the pod
    template's env, as every deployment's template does on a real cluster; the one process kubelet
    applies them over its base environment (ours)."""
    env = [{"name": k, "value": v} for k, v in sorted(neighbour.worker_env().items()) if ours.get(k) != v]
    metadata: dict[str, Any] = {"name": "lab-worker"}
    if start_delay is not None:
        metadata["annotations"] = {"lab.fenced-k8s-executor.io/start-delay": str(start_delay)}
    template = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
                "spec": {"containers": [{"name": "base", "image": "lab/airflow:local", "env": env}],
                         "restartPolicy": "Never"}}
    neighbour.pod_template.write_text(json.dumps(template, indent=1))  # JSON is YAML


def run_one(scenario: Scenario, executor: str, *, pg_server: Any, out_dir: Path, seed: int, quick: bool,
            schedulers: int, say: Callable[[str], None] = print, kube: Any = None,
            image: str | None = None, worker_host: str | None = None) -> dict[str, Any]:
    """One scenario on one executor; returns the measurements (and writes the evidence).

    kube: the Kubernetes API to run on (a `lab.controlplane.Shared` backend: real apiserver or an
    existing cluster); None starts a fresh emulator for this run. On an existing cluster
    (``kube.runs_pods``) its own kubelet runs the worker pods in ``image`` (``lab/workers.py``),
    reaching this machine's api-server at ``worker_host``; elsewhere the process kubelet does."""
    from fenced_k8s_lab.kubeapi import Emulator
    from fenced_k8s_lab.kubelet import LongTailDelay, ProcessKubelet
    from fenced_k8s_lab.postgres import new_airflow_db
    from fenced_k8s_lab.stack import AirflowStack

    run_dir = out_dir / scenario.name / executor
    if run_dir.exists():  # an earlier run's logs would be appended to and read as this run's evidence
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    width = scenario.width[0 if quick else 1]
    dag_id = f"lab_{scenario.name}"
    namespace = f"lab-{scenario.name}"
    cluster = None
    if kube is not None and getattr(kube, "runs_pods", False):
        from fenced_k8s_lab import workers as cw

        image = image or cw.IMAGE
        worker_host = cw.worker_host(cw.node_addresses(kube), worker_host)
        cluster = cw.ClusterWorkers(kube, AirflowStack.namespace_name(namespace), run_dir, image=image)
        if scenario.capacity:
            say(f"  capacity {scenario.capacity} is the process kubelet's model: the cluster's node decides here")
    dags_dir = cluster.dags_folder(cw.MAIN) if cluster else run_dir / "dags"
    dags = write_fanout(dags_dir, dag_id, width, retries=scenario.retries, seconds=scenario.task_seconds,
                        fail_first=scenario.fail_first).parent
    db_url = new_airflow_db(pg_server)
    ev.install_change_log(db_url)
    gauges = ev.GaugeListener().start() if importlib.util.find_spec("statsd") else None
    if gauges is None:
        say("  statsd is not installed: executor slot gauges are not measured")
    env = {**COMMON_ENV, **scenario.env, **(scenario.fenced_env if executor == "fenced" else {}),
           **(gauges.env() if gauges else {}), **(cw.image_env(image) if cluster else {})}
    where = {"api_host": worker_host} if cluster else {}
    emulator = kube if kube is not None else Emulator()
    emulator.start()
    stack = kubelet = neighbour = supervisor = ctx = None
    started = time.time()
    try:
        n_sched = scenario.schedulers or schedulers
        say(f"[{scenario.name}/{executor}] starting PostgreSQL DB, " + ("pod observer" if cluster else "emulator")
            + f", api-server, dag-processor, {n_sched} scheduler(s)"
            + (f" and a {executor} neighbour deployment" if scenario.neighbour else ""))
        stack = AirflowStack(run_dir, db_url, emulator.url, dags, executor=EXECUTORS[executor],
                             schedulers=n_sched, namespace=namespace, env=env, emulator=emulator, **where)
        if cluster:
            cluster.template(stack, cw.MAIN)
        if scenario.neighbour:
            n_dags = write_fanout(cluster.dags_folder(cw.NEIGHBOUR) if cluster else run_dir / "neighbour" / "dags",
                                  dag_id, scenario.neighbour[0], seconds=scenario.neighbour[1]).parent
            neighbour = AirflowStack(run_dir / "neighbour", new_airflow_db(pg_server), emulator.url, n_dags,
                                     executor=EXECUTORS[executor], schedulers=1, namespace=stack.namespace,
                                     env={k: v for k, v in env.items() if not k.startswith("AIRFLOW__METRICS__")},
                                     emulator=_NamedAs(emulator, NEIGHBOUR),
                                     kube_token=lambda role: f"{NEIGHBOUR}{role}", **where)
            if cluster:
                cluster.template(neighbour, cw.NEIGHBOUR, start_delay=scenario.neighbour[2])
            else:
                _neighbour_pod_template(neighbour, stack.worker_env(), scenario.neighbour[2])
            neighbour.start()
        stack.start()
        ctx = RunContext(scenario, width, stack, emulator, dag_id, say, neighbour=neighbour, db=pg_server)
        base = LongTailDelay.parse(scenario.delay, seed=seed) if scenario.delay else None
        if cluster:
            kubelet = cluster.start(ctx.start_delay(base))
        else:
            kubelet = ProcessKubelet(emulator.write_kubeconfig(str(run_dir / "kube" / "kubelet.kubeconfig"),
                                                               token="kubelet", namespace=stack.namespace),
                                     stack.namespace, start_delay=ctx.start_delay(base),
                                     max_running=scenario.capacity, base_env=stack.worker_env(),
                                     workdir=run_dir / "kubelet")
            kubelet.start()
        stack.wait_schedulers_heartbeat()
        stack.client().wait_dags([dag_id], timeout=180)
        if neighbour is not None:
            neighbour.wait_schedulers_heartbeat()
            neighbour.client().wait_dags([dag_id], timeout=180)
        say(f"[{scenario.name}/{executor}] stack up in {time.time() - started:.0f}s; driving the scenario")
        ctx.t0 = time.time()
        supervisor = CrashSupervisor(stack, ctx, say).start()
        scenario.drive(ctx)
        _settle(kubelet, emulator, stack.namespace, timeout=60, say=say)  # stale pods may start late
        time.sleep(3)  # let the last events land
        exits = supervisor.stop()
        observed = cluster.evidence(stack, neighbour, NEIGHBOUR) if cluster else {}
        evidence = ev.collect(db_url=db_url, kubelet_records=kubelet.records(), audit=emulator.audit(),
                              log_dir=stack.log_dir, wall_seconds=time.time() - ctx.t0, faults=ctx.faults,
                              gauges=gauges.snapshot() if gauges else None, cleared=ctx.cleared,
                              foreign_prefix=NEIGHBOUR if neighbour is not None else None,
                              scheduler_exits=exits,
                              scheduler_restarts=sorted(ctx.restarts + supervisor.restarts, key=lambda r: r["ts"]),
                              **observed)
    finally:
        if ctx is not None:
            ctx.close()
        if supervisor is not None:
            supervisor.stop()
        if kubelet is not None:
            kubelet.stop()
        elif cluster is not None:
            cluster.stop()
        for deployment in (stack, neighbour):
            if deployment is not None:
                deployment.stop()
        emulator.stop()
        if gauges is not None:
            gauges.stop()
    ev.dump(evidence, run_dir / "evidence.json")
    return {"metrics": measure(evidence), "evidence": evidence}
