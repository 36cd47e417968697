"""The benchmark's world: embedded PostgreSQL with a realistic metadata DB, the Kubernetes API
emulator (and process kubelets) in subprocesses, real stock/fenced executors, and counters.

The emulator and kubelets run in their own processes so that their CPU work does not share the
measured process's GIL (a real API server and kubelet never do).
"""

from __future__ import annotations

import functools
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from fenced_k8s_lab.stack import STOCK_EXECUTOR as STOCK
from fenced_k8s_executor.names import EXECUTOR_CLASS_PATH as FENCED

KINDS = ("stock", "fenced")
JWT_SECRET = "bench-jwt-secret-" + "x" * 48
BUNDLE = "dags-folder"

#: The bench's pods sleep in a shell: the process kubelets run them on the scheduler's own two
#: cores, where a Python interpreter per pod (20-25 a second in the loop) was CPU load a
#: scheduler never carries (its task pods run on other nodes), for stock and fenced alike.
POD_TEMPLATE = """\
apiVersion: v1
kind: Pod
metadata:
  name: placeholder
spec:
  restartPolicy: Never
  containers:
    - name: base
      image: lab/airflow:local
      command: ["/bin/sh", "-c", "sleep 0.5"]
"""

_T0 = time.monotonic()


def progress(msg: str) -> None:
    print(f"[bench {time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, int(-(-q * len(ordered) // 100)))  # ceil(q/100 * n)
    return ordered[min(rank, len(ordered)) - 1]


def interleaved(reps: int) -> Iterator[tuple[int, str]]:
    """(rep, kind) in ABBA order: stock, fenced, fenced, stock, ... to cancel drift."""
    for rep in range(reps):
        for kind in (KINDS if rep % 2 == 0 else KINDS[::-1]):
            yield rep, kind


def spread(stock: list[float], fenced: list[float]) -> dict:
    """fenced/stock per repetition (rep i's stock sample with rep i's fenced sample, both taken
    back to back in ABBA order), and their median, min and max. A target is met only when the
    whole spread (min..max) meets it."""
    return ratio_spread([f / s if s else float("nan") for s, f in zip(stock, fenced)])


def ratio_spread(per: list[float]) -> dict:
    """Median, min and max of per-repetition ratios."""
    return {"median": median(per), "min": min(per) if per else float("nan"),
            "max": max(per) if per else float("nan"), "per_rep": per, "reps": len(per)}


def fmt_spread(sp: dict) -> str:
    if sp["reps"] <= 1:
        return f"{sp['median']:.3f} (1 rep)"
    return f"{sp['median']:.3f} [{sp['min']:.3f}-{sp['max']:.3f}]"


# ---------------------------------------------------------------- DB round-trip counting


class RoundTrips:
    """SQLAlchemy event listeners on Airflow's engine: what really goes over the wire.

    ``statements`` are cursor executes (before_cursor_execute), plus the fenced reads' own
    (``ledger.ROUND_TRIPS``: they use raw psycopg2 cursors); psycopg2 also sends BEGIN before a
    transaction's first statement and COMMIT/ROLLBACK at its end (none in autocommit), and with
    ``pool_pre_ping`` every pool checkout pings the server (SELECT 1, not seen by cursor events).
    The fences' own pool (``fenced_k8s_executor.db``: their transactions, their pre-pings) is
    counted with Airflow's engine.
    Statements psycopg2 sends on its own (``SET default_transaction_isolation`` when a
    connection with an explicit isolation level switches autocommit) are not seen either:
    checked with strace for the fenced read (2 round trips, ping and statement).
    """

    def __init__(self, engine: Any):
        from sqlalchemy import event

        self.engine = engine
        self.pre_ping = bool(getattr(engine.pool, "_pre_ping", False))
        self.counts = {"statements": 0, "begin": 0, "commit": 0, "rollback": 0, "checkout": 0}
        self.texts: list[str] = []
        self.keep_texts = False
        for each in (engine, *_fences_engine(engine)):
            event.listen(each, "before_cursor_execute", self._on_stmt)
            event.listen(each, "begin", lambda conn: self._bump_sent("begin", conn))
            event.listen(each, "commit", lambda conn: self._bump_sent("commit", conn))
            event.listen(each, "rollback", lambda conn: self._bump_sent("rollback", conn))
            event.listen(each.pool, "checkout", lambda *a: self._bump("checkout"))

    def _bump(self, name: str) -> None:
        self.counts[name] += 1

    def _bump_sent(self, name: str, conn: Any) -> None:
        """What psycopg2 really sends: BEGIN only outside autocommit, COMMIT/ROLLBACK only inside
        a transaction (SQLAlchemy fires these events for its own transaction either way)."""
        if conn.invalidated:
            return
        try:
            dbapi = conn.connection.dbapi_connection
            if name == "begin":
                sent = not dbapi.autocommit
            else:
                sent = dbapi.info.transaction_status != 0  # not idle (psycopg2 and psycopg 3 alike)
        except Exception:
            sent = True
        if sent:
            self._bump(name)

    def _on_stmt(self, conn, cursor, statement, parameters, context, executemany) -> None:
        self.counts["statements"] += 1
        if self.keep_texts:
            self.texts.append(statement.split("\n", 1)[0][:120])

    def snapshot(self) -> dict:
        from fenced_k8s_executor import ledger

        return {**self.counts, "raw": ledger.ROUND_TRIPS, "prepare": ledger.PREPARES}

    def since(self, before: dict) -> dict:
        """Counts since ``before``. The fenced reads run on psycopg2 cursors of their own, which
        SQLAlchemy's events never see: their statements are the ledger's own count."""
        from fenced_k8s_executor import ledger

        d = {k: self.counts[k] - before[k] for k in self.counts}
        d["raw"] = ledger.ROUND_TRIPS - before["raw"]
        d["prepare"] = ledger.PREPARES - before["prepare"]  # once per connection, not per loop
        d["statements"] += d["raw"]
        d["wire"] = (d["statements"] + d["prepare"] + d["begin"] + d["commit"] + d["rollback"]
                     + (d["checkout"] if self.pre_ping else 0))
        return d


def _fences_engine(engine: Any) -> tuple:
    """The fences' own engine, built from ``engine`` (none for package versions without one)."""
    try:
        from fenced_k8s_executor import db
    except ImportError:
        return ()
    ours = db.engine()
    return () if ours is engine else (ours,)


# ---------------------------------------------------------------- subprocess helpers


def _die_with_parent() -> None:  # in the child between fork and exec: a killed bench leaves no emulator/kubelet
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Proc:
    def __init__(self, args: list[str], log: Path, env: dict | None = None):
        self.log = log
        self._f = open(log, "w")
        self._drainer: threading.Thread | None = None
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._f, text=True,
                                  env={**os.environ, **(env or {})}, start_new_session=True,
                                  preexec_fn=_die_with_parent)

    def ready_line(self, prefix: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.p.stdout.readline()
            if line.startswith(prefix):
                self._drainer = threading.Thread(target=self._drain, name=f"drain-{self.p.pid}", daemon=True)
                self._drainer.start()
                return line.strip()
            if not line and self.p.poll() is not None:
                break
        raise RuntimeError(f"{self.p.args} did not print {prefix!r}; see {self.log}")

    def _drain(self) -> None:
        """Copy what the child prints after its ready line into its log: a pipe nobody reads fills
        (64 KiB) and blocks the child's next print (the emulator logs a handler's traceback there)."""
        for line in self.p.stdout:
            try:
                self._f.write(line)
                self._f.flush()
            except ValueError:  # stopped: the log is closed
                return

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        if self._drainer is not None:
            self._drainer.join(5)  # the child's last lines, up to its exit
        self._f.close()


# ---------------------------------------------------------------- the lab


BENCH_USERS = (["admin", "bench", "sweeper", "bench-setup"] + [f"scheduler-{i}" for i in range(1001, 1601)]
               + [f"kubelet-b{i}" for i in range(200)])


@dataclass
class Lab:
    workdir: Path
    backend: str = "emulator"  # or "real": kube-apiserver + etcd from KUBEBUILDER_ASSETS
    driver: str = "psycopg2"  # or "psycopg" (3): what SQLAlchemy 2.1 gives the chart's plain postgresql:// URL
    pg: Any = None
    url: str = ""
    engine: Any = None  # our own (NullPool) engine for seeding; not counted
    emu_proc: Proc | None = None
    emu: Any = None  # EmulatorControl, or the ControlPlane (same audit/summary/set_tokens interface)
    emu_url: str = ""
    trips: RoundTrips | None = None
    executors: list = field(default_factory=list)
    procs: list = field(default_factory=list)
    history: list = field(default_factory=list)  # (ti_id, token) of the seeded history TIs
    _job_ids: Any = None
    _namespaces: set = field(default_factory=set)
    _kubelets: int = 0
    profile_dir: Path | None = None  # --profile: cProfile of the fenced hot paths goes here

    # ---- lifecycle

    @classmethod
    def start(cls, workdir: Path | None = None, backend: str = "emulator", stock_pagination: bool = False,
              driver: str = "psycopg2") -> "Lab":
        lab = cls(Path(workdir or tempfile.mkdtemp(prefix="fenced-bench-")), backend=backend, driver=driver)
        lab.workdir.mkdir(parents=True, exist_ok=True)
        try:
            lab._start_db()
            if backend == "real":
                lab._start_real()
            else:
                lab._start_emulator(stock_pagination)
        except BaseException:
            lab.stop()
            raise
        import itertools

        lab._job_ids = itertools.count(1001)
        return lab

    @property
    def real(self) -> bool:
        return self.backend == "real"

    def stop(self) -> None:
        for ex in self.executors:
            try:
                ex.end()
            except Exception:
                pass
        self.executors.clear()
        for p in self.procs:
            p.stop()
        if self.emu_proc:
            self.emu_proc.stop()
        if self.real and self.emu is not None:
            self.emu.stop()
        if self.engine is not None:
            self.engine.dispose()
        if self.pg is not None:
            self.pg.stop()

    def _start_db(self) -> None:
        from fenced_k8s_lab.postgres import airflow_db_env, new_airflow_db, start_from_template

        progress("starting embedded PostgreSQL from the migrated template")
        self.pg = start_from_template()
        self.url = new_airflow_db(self.pg).replace("+psycopg2://", f"+{self.driver}://", 1)
        os.environ.update(airflow_db_env(self.url))
        os.environ["AIRFLOW__API_AUTH__JWT_SECRET"] = JWT_SECRET
        from airflow import settings
        from airflow.configuration import conf

        conf.set("database", "sql_alchemy_conn", self.url)
        settings.configure_vars()
        settings.reconfigure_orm()
        import sqlalchemy as sa

        self.engine = sa.create_engine(self.url, poolclass=sa.pool.NullPool)
        self.trips = RoundTrips(settings.engine)

    def _start_emulator(self, stock_pagination: bool) -> None:
        from fenced_k8s_lab.kubeapi import EmulatorControl

        self.emu_proc = Proc([sys.executable, "-m", "fenced_k8s_lab.bench.emuserver", "--port", "0",
                              "--history-size", "20000", "--tokens", json.dumps({"bench": "bench"})]
                             + (["--stock-pagination"] if stock_pagination else []),
                             self.workdir / "emulator.log")
        self.emu_url = self.emu_proc.ready_line("READY").split()[1]
        self.emu = EmulatorControl(self.emu_url)
        progress(f"Kubernetes API emulator (subprocess) at {self.emu_url}"
                 f" ({'stock' if stock_pagination else 'lazy'} list pagination)")

    def _start_real(self) -> None:
        from fenced_k8s_lab.controlplane import ControlPlane

        progress("starting etcd + kube-apiserver from KUBEBUILDER_ASSETS")
        self.emu = ControlPlane(workdir=self.workdir / "controlplane", users=BENCH_USERS).start()
        self.emu_url = self.emu.url
        progress(f"real kube-apiserver at {self.emu_url} (started in {self.emu.startup_seconds:.1f}s)")

    def _bench_control(self, method: str, path: str, body: Any = None) -> dict:
        import urllib.request

        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.emu_url}/_bench/{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as resp:
            return json.loads(resp.read())

    def ensure_namespace(self, namespace: str) -> None:
        if self.real and namespace not in self._namespaces:
            self.emu.ensure_namespace(namespace)
        self._namespaces.add(namespace)

    def kubeconfig(self, token: str, namespace: str = "default") -> str:
        path = self.workdir / "kube" / f"{token}-{namespace}.kubeconfig"
        path.parent.mkdir(exist_ok=True)
        self.ensure_namespace(namespace)
        if self.real:
            return self.emu.write_kubeconfig(str(path), token=token, namespace=namespace)
        from fenced_k8s_lab.kubeconfig import write_kubeconfig

        self.emu.set_tokens({token: token})
        return write_kubeconfig(str(path), self.emu_url, token=token, namespace=namespace)

    def core_api(self, token: str = "bench", namespace: str = "default"):
        from kubernetes import client, config

        return client.CoreV1Api(config.new_client_from_config(config_file=self.kubeconfig(token, namespace)))

    def pods_in(self, namespace: str) -> int:
        """Pods in one namespace (not timed: a bench control on the emulator, a list on the real one)."""
        if not self.real:
            return int(self._bench_control("GET", f"count?namespace={namespace}")["pods"])
        from fenced_k8s_executor import pods as podsmod

        api = self.core_api("bench", namespace)
        return sum(len(page) for page in podsmod.list_pages(api, namespace, label_selector="", page_size=5000))

    def server_cpu(self) -> float:
        """CPU seconds (user + system) used so far by the Kubernetes API side: the emulator
        process, or kube-apiserver + etcd. With the bench process's own ``time.process_time()``
        this gives the work a scenario costs, which (unlike wall time) a loaded machine barely moves."""
        pids = self.emu.pids if self.real else ([self.emu_proc.p.pid] if self.emu_proc else [])
        total = 0.0
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (OSError, IndexError, ValueError):
                pass
        return total

    def api_calls(self, since: int, who: str | None = None) -> list[dict]:
        return [e for e in self.emu.audit(since) if who is None or e.get("who") == who]

    def audit_mark(self) -> int:
        if self.real:  # ControlPlane.summary() does not read the audit file; audit(since) does
            self._mark = getattr(self, "_mark", 0)
            self._mark += len(self.emu.audit(self._mark))
            return self._mark
        return int(self.emu.summary()["audit"])

    def start_kubelet(self, namespace: str, max_running: int = 16) -> Proc:
        self._kubelets += 1
        kc = self.kubeconfig(f"kubelet-b{self._kubelets}", namespace)
        p = Proc([sys.executable, "-m", "fenced_k8s_lab.kubelet", "--kubeconfig", kc, "--namespace",
                  namespace, "--node-name", f"node-{namespace}", "--max-running", str(max_running), "--workdir", str(self.workdir / f"kubelet-{namespace}")],
                 self.workdir / f"kubelet-{namespace}.log")
        self.procs.append(p)
        return p

    # ---- metadata DB

    def seed_history(self, dags: int, runs: int, tasks: int) -> None:
        """dags x runs x tasks finished TIs (with tokens), written in bulk SQL like the scheduler leaves them."""
        import sqlalchemy as sa

        from fenced_k8s_lab import seed

        t0 = time.monotonic()
        for d in range(dags):
            seed.seed_dag(self.engine, f"bench_dag_{d:03d}")
        with self.engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO dag_run(dag_id, run_id, run_type, run_after, state, logical_date, start_date,"
                " created_dag_version_id)"
                " SELECT dv.dag_id, 'scheduled__' || r, 'scheduled', now() - r * interval '1 hour', 'success',"
                " now() - r * interval '1 hour', now() - r * interval '1 hour', dv.id"
                " FROM dag_version dv CROSS JOIN generate_series(1, :runs) AS r WHERE dv.dag_id LIKE 'bench_dag_%'"
            ), {"runs": runs})
            conn.execute(sa.text(
                f"INSERT INTO task_instance(id, task_id, dag_id, run_id, {seed.index_column(self.engine)}, try_number, max_tries, pool,"
                " pool_slots, state, queue, priority_weight, dag_version_id, external_executor_id,"
                " queued_by_job_id, queued_dttm, start_date, end_date)"
                " SELECT gen_random_uuid(), 'task_' || t, dr.dag_id, dr.run_id, -1, 1, 2, 'default_pool', 1,"
                " 'success', 'default', 1, dr.created_dag_version_id, gen_random_uuid()::text, 1 + (t % 2),"
                " dr.logical_date, dr.logical_date, dr.logical_date + interval '1 minute'"
                " FROM dag_run dr CROSS JOIN generate_series(1, :tasks) AS t WHERE dr.dag_id LIKE 'bench_dag_%'"
            ), {"tasks": tasks})
            conn.execute(sa.text("ANALYZE task_instance; ANALYZE dag_run"))
            self.history = [(str(r[0]), r[1]) for r in conn.execute(sa.text(
                "SELECT id, external_executor_id FROM task_instance WHERE dag_id LIKE 'bench_dag_%' ORDER BY id"))]
        progress(f"seeded {dags} DAGs x {runs} runs x {tasks} tasks = {len(self.history)} TIs"
                 f" in {time.monotonic() - t0:.1f}s")

    def queued_tis(self, count: int, job_id: int, tag: str) -> list:
        """A new DAG run with ``count`` TIs queued by ``job_id`` (token pre-assigned), as the scheduler
        leaves them right before the executor's heartbeat."""
        from fenced_k8s_lab import seed

        dag_id = "bench_live"
        version = getattr(self, "_live_version", None)
        if version is None:
            version = self._live_version = seed.seed_dag(self.engine, dag_id)
        run_id = f"manual__{tag}_{uuid.uuid4().hex[:8]}"
        seed.seed_run(self.engine, dag_id, run_id, version)
        tis = seed.insert_tis(self.engine, dag_id, run_id, version, [f"t{i:04d}" for i in range(count)],
                              queued_by_job_id=job_id)
        self._queued = getattr(self, "_queued", []) + [ti.id for ti in tis]
        return tis

    def finish_queued(self) -> None:
        """End a scenario's queued TIs (``success``): a deployment's queued and running rows are its
        tasks in flight, and the fenced loop's digest reads them all; rows a finished scenario left
        queued would be charged to the next one."""
        queued, self._queued = getattr(self, "_queued", []), []
        for i in range(0, len(queued), 10_000):
            self.set_ti_state(queued[i:i + 10_000], "success")

    def set_ti_state(self, ti_ids: list[str], state: str) -> None:
        import sqlalchemy as sa

        if not ti_ids:
            return
        with self.engine.begin() as conn:
            conn.execute(sa.text("UPDATE task_instance SET state=:s WHERE id = ANY(CAST(:ids AS uuid[]))"),
                         {"s": state, "ids": list(ti_ids)})

    # ---- executors

    def next_job_id(self) -> int:
        return next(self._job_ids)

    def scheduler_job(self, job_id: int) -> None:
        """The running scheduler job row ``job_id`` names, as a deployment's scheduler has one
        (airflow-core's ``Job``, started and heartbeating now): the fenced executor reads it once
        per heartbeat interval for its pods' launcher stamp, and without a row it would read again
        in every creation batch."""
        from airflow.jobs.job import Job, JobState
        from airflow.utils.session import create_session

        with create_session() as session:
            if session.get(Job, job_id) is None:
                job = Job(id=job_id, job_type="SchedulerJob")
                job.state = JobState.RUNNING
                session.add(job)

    def executor(self, kind: str, *, namespace: str, batch_size: int = 32, async_creation: bool = False,
                 delete_worker_pods: bool = False, job_id: int | None = None, **fenced: str):
        """A started stock or fenced executor, configured by env vars exactly as in a deployment."""
        import importlib

        job_id = job_id or self.next_job_id()
        template = self.workdir / "pod_template.yaml"
        template.write_text(POD_TEMPLATE)
        env = {
            "AIRFLOW__KUBERNETES_EXECUTOR__IN_CLUSTER": "False",
            "AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE": namespace,
            "AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE": self.kubeconfig(f"scheduler-{job_id}", namespace),
            "AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE": str(template),
            "AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_REPOSITORY": "lab/airflow",
            "AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_TAG": "local",
            "AIRFLOW__KUBERNETES_EXECUTOR__DELETE_WORKER_PODS": str(delete_worker_pods),
            "AIRFLOW__KUBERNETES_EXECUTOR__TASK_PUBLISH_MAX_RETRIES": "-1",
            "AIRFLOW__KUBERNETES_EXECUTOR__KUBE_CLIENT_REQUEST_ARGS": '{"_request_timeout": [10, 30]}',
            "AIRFLOW__KUBERNETES_EXECUTOR__WORKER_PODS_CREATION_BATCH_SIZE": str(batch_size),
            "AIRFLOW__KUBERNETES_EXECUTOR__ASYNC_POD_CREATION": str(async_creation),
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "3600",
            "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__SWEEP_INTERVAL": "0",
        }
        env.update({f"AIRFLOW__FENCED_KUBERNETES_EXECUTOR__{k.upper()}": str(v) for k, v in fenced.items()})
        os.environ.update(env)
        module, _, name = (STOCK if kind == "stock" else FENCED).rpartition(".")
        executor = getattr(importlib.import_module(module), name)()
        self.scheduler_job(job_id)
        executor.job_id = job_id
        # start() forks the provider's Manager (and watcher) from this process, whose heap holds
        # every earlier repetition: frozen, a child's full collection skips it instead of pausing
        # (and copy-on-write faulting) for hundreds of ms in the middle of a timed section. Airflow
        # freezes before its own forks (dag processor, local executor) for the same reason.
        gc.collect()
        gc.freeze()
        executor.start()
        self.executors.append(executor)
        return executor

    def end_executor(self, executor) -> None:
        try:
            executor.end()
        finally:
            if executor in self.executors:
                self.executors.remove(executor)


def workload(ti, executor) -> Any:
    """The ExecuteTask the scheduler would hand ``executor.queue_workload`` for a seeded TI: its
    token minted by ``ExecuteTask.generate_token`` with the executor's own ``jwt_generator`` and
    its log path rendered from ``[logging] log_filename_template``, as ``ExecuteTask.make`` does
    (the shipped template; the seeded TI has no ``dag_run`` or ``logical_date`` for others).
    A placeholder token made stock's pods and Manager-queue jobs smaller than a scheduler's,
    while fenced's pods carry a minted launch claim."""
    from airflow.executors.workloads import BundleInfo, ExecuteTask
    from airflow.executors.workloads.task import TaskInstanceDTO

    dto = TaskInstanceDTO(
        id=uuid.UUID(ti.id), task_id=ti.task_id, dag_id=ti.dag_id, run_id=ti.run_id,
        try_number=ti.try_number, map_index=ti.map_index, dag_version_id=uuid.UUID(ti.dag_version_id),
        pool_slots=1, priority_weight=1, queue="default", external_executor_id=ti.token,
    )
    return ExecuteTask(ti=dto, dag_rel_path=Path(f"{ti.dag_id}.py"), bundle_info=BundleInfo(name=BUNDLE),
                       token=ExecuteTask.generate_token(str(ti.id), executor.jwt_generator),
                       log_path=_log_path_renderer()(ti=ti))


@functools.cache
def _log_path_renderer() -> Any:
    from airflow.utils.helpers import log_filename_template_renderer

    return log_filename_template_renderer()


def forget(executor) -> None:
    """Drop an executor's in-memory bookkeeping between repetitions (pods are left where they are)."""
    executor.running.clear()
    executor.event_buffer.clear()
    executor.pod_launch_attempts.clear()
    if hasattr(executor, "_carry"):
        executor._carry.clear()
    if hasattr(executor, "_loop_state"):  # the loop's reads and verdicts, reset by every sync(): not across loops
        executor._loop_state = None
    if hasattr(executor, "book"):
        from fenced_k8s_executor.launches import LaunchBook

        executor.book = LaunchBook()


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` (the affinity call takes one thread; threads started later inherit it)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return  # the process ended
    for tid in tids:
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, FileNotFoundError):
            pass  # the thread ended meanwhile


@contextmanager
def pinned_apart(executors: list) -> Iterator[dict | None]:
    """This process on one CPU and the executors' Manager processes (the task queue's other end)
    on another, for the duration; yields the placement, or None with fewer than two CPUs.

    Each ``task_queue.put`` is a round trip to the Manager process. Left to the OS, where the
    Manager ran relative to this process differed from one executor instance to the next and
    moved an instance's queue time by up to 40 % (the A/A ratio, two stock executors, spread
    0.98-1.43); pinned apart, four runs on both backends gave 0.95-1.05. Stock and fenced are
    placed alike. The first two allowed CPUs: on an SMT machine they may share a core.
    """
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        yield None
        return
    mine, theirs = {allowed[0]}, {allowed[1]}
    managers = [ex._manager._process.pid for ex in executors]
    try:
        _pin(os.getpid(), mine)
        for pid in managers:
            _pin(pid, theirs)
        yield {"bench_cpu": allowed[0], "manager_cpu": allowed[1]}
    finally:
        _pin(os.getpid(), set(allowed))  # the Managers end with their executors


@contextmanager
def quiet_gc() -> Iterator[None]:
    """timeit's convention for a timed section, for stock and fenced alike: collect first, no
    collection during. Both executors share this process's heap, so a full collection (tens of
    ms) lands on whichever side happens to allocate at that moment, and one such pause is larger
    than the difference being measured. Allocation counts still show in the figures."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextmanager
def timed() -> Iterator[list]:
    box: list[float] = []
    t0 = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - t0)


@contextmanager
def profiled(lab: Lab, name: str) -> Iterator[None]:
    """cProfile the block into ``<profile_dir>/<name>.prof`` and ``.txt`` (top 40 by cumulative
    time, then by own time) when ``--profile`` is on; otherwise nothing."""
    if lab.profile_dir is None:
        yield
        return
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        write_profile(lab, prof, name)


def write_profile(lab: Lab, prof: Any, name: str) -> None:
    import io
    import pstats

    lab.profile_dir.mkdir(parents=True, exist_ok=True)
    prof.dump_stats(str(lab.profile_dir / f"{name}.prof"))
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("cumulative").print_stats(40)
    stats.sort_stats("tottime").print_stats(25)
    (lab.profile_dir / f"{name}.txt").write_text(out.getvalue())
