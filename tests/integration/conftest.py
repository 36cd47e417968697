"""Executor integration harness: real PostgreSQL (migrated Airflow schema), a real Kubernetes API
(the emulator, or a real kube-apiserver: ``kube_backend``), the real kubernetes client and real
executors (stock or fenced) with their watcher processes.

Every metadata change goes through airflow-core's own code (``fenced_k8s_lab.core``):
DAG files parsed and serialized like the dag-processor does, runs from the serialized DAG,
scheduling, queueing (which pre-assigns the launch token), stuck-in-queued, orphan adoption,
executor events and clears by the scheduler's own functions, the worker's calls through the
execution API routes. The test plays the kubelet (pod status) and picks the order of the steps.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pytest

from fenced_k8s_lab.core import Airflow, Row, Scheduler, our_deployment
from fenced_k8s_lab.stack import POD_TEMPLATE, STOCK_EXECUTOR
from fenced_k8s_executor.names import EXECUTOR_CLASS_PATH

JWT_SECRET = "integration-jwt-secret-" + "x" * 48
KINDS = ["stock", "fenced"]


@pytest.fixture(scope="session")
def metadata_db(pg_server, tmp_path_factory):
    """One migrated metadata DB for the session, with this process's Airflow ORM pointed at it."""
    from fenced_k8s_lab.postgres import airflow_db_env, new_airflow_db

    url = new_airflow_db(pg_server)
    os.environ.update(airflow_db_env(url))
    os.environ["AIRFLOW__API_AUTH__JWT_SECRET"] = JWT_SECRET
    dags = tmp_path_factory.mktemp("dags")
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    from airflow import settings
    from airflow.configuration import conf

    conf.set("database", "sql_alchemy_conn", url)
    conf.set("core", "dags_folder", str(dags))
    settings.configure_vars()
    settings.reconfigure_orm()
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    engine.dags_folder = dags
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def airflow(metadata_db):
    driver = Airflow(metadata_db.dags_folder)
    yield driver
    driver.close()


def _executor_class(kind: str) -> type:
    import importlib

    module, _, name = (STOCK_EXECUTOR if kind == "stock" else EXECUTOR_CLASS_PATH).rpartition(".")
    return getattr(importlib.import_module(module), name)


@dataclass
class World:
    """One test's DAG, run(s), namespace, kube client and schedulers."""

    engine: Any
    airflow: Airflow
    backend: Any
    namespace: str
    kube: Any
    dag_id: str
    run_id: str
    tmp_path: Any
    monkeypatch: Any
    schedulers: list = field(default_factory=list)
    children: list = field(default_factory=list)
    _users: int = 0
    driver: str = "psycopg2"  # the metadata DB driver of Airflow's ORM in this world (``world_driver``)
    _witness: Any = None  # the world's own witness (``World.witness``)

    @property
    def emulator(self):  # the name older tests use for the Kubernetes API under test
        return self.backend

    # ---------------------------------------------------------------- airflow-core

    def row(self, task_id: str, run_id: str | None = None) -> Row:
        return self.airflow.row(self.dag_id, task_id, run_id or self.run_id)

    def new_run(self) -> str:
        return self.airflow.create_run(self.dag_id)

    def scheduler(self, kind: str, *, start: bool = True, batch_size: int = 8, hostname: str | None = None,
                  user: str | None = None, **options: str) -> Scheduler:
        """A scheduler (real Job row + SchedulerJobRunner) around a stock or fenced executor.

        ``options`` are ``[fenced_kubernetes_executor]`` options. ``start=False`` leaves the
        executor unstarted: enough to queue (pre-assign tokens) for a scheduler that dies.
        ``hostname``: the host its Job row names (default: one of its own, as each scheduler pod
        of a Deployment has; give a stopped scheduler's to model its restart on the same host).
        ``user``: its Kubernetes user (default a fresh ``scheduler-N``; an RBAC user of the real
        apiserver to run it with exactly the rules a test grants)."""
        self._users += 1
        user = user or f"scheduler-{self._users}"
        kc = self.backend.write_kubeconfig(str(self.tmp_path / f"{user}.kubeconfig"), token=user,
                                           namespace=self.namespace)
        self.backend.set_tokens({user: user, "test": "test"})
        self.monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE", kc)
        self.monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__WORKER_PODS_CREATION_BATCH_SIZE", str(batch_size))
        before = {}
        for name, value in options.items():
            var = f"AIRFLOW__FENCED_KUBERNETES_EXECUTOR__{name.upper()}"
            before[var] = os.environ.get(var)
            self.monkeypatch.setenv(var, str(value))
        job = Scheduler.new_job(hostname=hostname or user)
        executor = _executor_class(kind)()
        executor.job_id = job.id
        sched = Scheduler(job, [executor])
        sched.user = user
        sched.kind = kind
        self.schedulers.append(sched)
        if start:
            executor.start()
        for var, value in before.items():  # options apply to this scheduler only
            if value is None:
                self.monkeypatch.delenv(var)
            else:
                self.monkeypatch.setenv(var, value)
        return sched

    def queue(self, sched: Scheduler, run_id: str | None = None, *, trigger: bool = True) -> int:
        """One scheduler loop for the run: schedule, enqueue (token), trigger (task queue)."""
        return sched.queue(self.dag_id, run_id or self.run_id, trigger=trigger)

    def requeue_stuck(self, sched: Scheduler, *, trigger: bool = True) -> int:
        """Stuck in queued (revoke, back to SCHEDULED: same id and try), queued again by ``sched``."""
        return sched.requeue_stuck(self.dag_id, self.run_id, trigger=trigger)

    def scheduler_process(self, kind: str, *, hostname: str, batch_size: int = 8,
                          env: dict | None = None, serve: bool = False) -> "ChildScheduler":
        """A scheduler in its own process (``scheduler_child.py``) that queues this world's run,
        creates its pods and loops until it is killed (``ChildScheduler.kill``: SIGKILL). ``env``:
        variables of its own (another address for the metadata DB, say); ``serve``: it also takes
        commands (``ChildScheduler.do``) and queues again what a clear or a retry sends back."""
        import json
        import subprocess
        import sys
        from pathlib import Path

        self._users += 1
        user = f"scheduler-{self._users}"
        kc = self.backend.write_kubeconfig(str(self.tmp_path / f"{user}.kubeconfig"), token=user,
                                           namespace=self.namespace)
        self.backend.set_tokens({user: user, "test": "test"})
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE": kc,
               "AIRFLOW__KUBERNETES_EXECUTOR__WORKER_PODS_CREATION_BATCH_SIZE": str(batch_size), **(env or {})}
        from scheduler_child import READY

        script = Path(__file__).with_name("scheduler_child.py")
        proc = subprocess.Popen([sys.executable, str(script), kind, self.dag_id, self.run_id, hostname]
                                + ["--serve"] * serve, env=env,
                                stdin=subprocess.PIPE if serve else None,
                                stdout=subprocess.PIPE, stderr=open(self.tmp_path / f"{user}.log", "wb"),
                                start_new_session=True, text=True)
        with open(self.tmp_path / f"{user}.out", "a") as out:
            for line in proc.stdout:  # Airflow logs to stdout too: kept in its .out file
                out.write(line)
                if line.startswith(READY):
                    break
            else:
                line = None
        if line is None:
            proc.wait(timeout=10)
            raise RuntimeError(f"child scheduler exited: {(self.tmp_path / f'{user}.log').read_text()[-3000:]}")
        ready, _ = json.JSONDecoder().raw_decode(line[len(READY):])  # a log line may follow on the same line
        child = ChildScheduler(proc, ready["job_id"], user, hostname)
        # Its output keeps coming: read on into its log, or a full pipe would stall the child mid-loop.
        threading.Thread(target=_drain, args=(proc.stdout, self.tmp_path / f"{user}.out", child.answers),
                         daemon=True).start()
        self.children.append(child)
        return child

    def kill(self, sched: Scheduler) -> None:
        """The scheduler stops heartbeating; its peers' orphan check fails it once
        ``[scheduler] scheduler_health_check_threshold`` (1 s here) has passed since its last one."""
        from airflow.utils import timezone

        last = sched.job.latest_heartbeat
        waited = (timezone.utcnow() - last).total_seconds() if last is not None else 0.0
        time.sleep(max(0.0, 1.2 - waited))

    def ref(self, row: Row):
        return row

    # ---------------------------------------------------------------- Kubernetes

    def pods(self, row: Row | None = None) -> list:
        pods = self.kube.list_namespaced_pod(self.namespace).items
        if row is not None:
            pods = [p for p in pods if (p.metadata.annotations or {}).get("task_id") == row.task_id
                    and (p.metadata.annotations or {}).get("run_id") == row.run_id]
        return pods

    def live_pods(self, row: Row | None = None) -> list:
        return [p for p in self.pods(row) if not p.metadata.deletion_timestamp]

    def sync_until(self, executor, predicate: Callable[[], bool], timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            executor.sync()
            if predicate():
                return True
            time.sleep(0.2)
        return predicate()

    def while_held(self, action: Callable[[], None], timeout: float = 30.0) -> threading.Thread:
        """Run ``action`` in a thread once the backend holds a write in flight (a fault fired):
        a timer guessed when the write would be sent, and under load it fired before the
        scheduler's loop had sent it. Not run if no fault fires within ``timeout``."""
        def run() -> None:
            deadline = time.monotonic() + timeout
            while not any(f["fired"] for f in self.backend.faults()):
                if time.monotonic() > deadline:
                    return
                time.sleep(0.02)
            action()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def settle(self, executor, seconds: float = 2.0) -> None:
        """Let the watcher deliver what it has seen, syncing as the heartbeat would."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            executor.sync()
            time.sleep(0.2)

    def bind(self, name: str) -> None:
        self.kube.create_namespaced_pod_binding(
            name, self.namespace, {"target": {"kind": "Node", "name": "lab-node"}, "metadata": {"name": name}},
            _preload_content=False,
        )

    def set_pod_phase(self, name: str, phase: str, *, reason: str | None = None, container_reason: str | None = None,
                      exit_code: int = 1) -> None:
        """Play the kubelet: bind the pod if needed and report a phase on its status."""
        pod = self.kube.read_namespaced_pod(name, self.namespace)
        if not pod.spec.node_name:
            self.bind(name)
        state: dict = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
        if phase in ("Failed", "Succeeded"):
            state = {"terminated": {"exitCode": 0 if phase == "Succeeded" else exit_code,
                                    "reason": container_reason or ("Completed" if phase == "Succeeded" else "Error")}}
        body = {"status": {"phase": phase, "reason": reason,
                           "containerStatuses": [{"name": "base", "ready": False, "restartCount": 0, "image": "x",
                                                  "imageID": "", "state": state}]}}
        self.kube.patch_namespaced_pod_status(name, self.namespace, body)

    def pod_of(self, row: Row, token: str | None = None) -> str:
        """The name of the (one) live pod of ``row``'s task, or of launch ``token``."""
        from fenced_k8s_executor.names import TOKEN_ANNOTATION

        names = [p.metadata.name for p in self.live_pods(row)
                 if token is None or (p.metadata.annotations or {}).get(TOKEN_ANNOTATION) == token]
        assert len(names) == 1, names
        return names[0]

    def start_in_pod(self, task_id: str = "t1") -> tuple[Row, str]:
        """The task's (one) pod runs and the task starts in it, its host the pod (the execution
        API's ``/run``, as the worker sends it): (row, pod)."""
        row = self.row(task_id)
        pod = self.pod_of(row)
        self.set_pod_phase(pod, "Running")
        self.airflow.start(row, hostname=pod)
        return row, pod

    def stale_pod(self, row: Row, token: str, *, sched: Scheduler, phase: str = "Pending", name: str | None = None,
                  container_reason: str | None = None, deployment: str | None = None,
                  launcher: dict | None = None) -> str:
        """A pod the fenced executor of ``sched`` made earlier for launch ``token`` of ``row``
        (a launch whose pod no watcher reported, e.g. created after its revoke), stamped with
        ``sched``'s launcher as the executor stamps it; ``launcher``: these launcher annotations
        instead (``{}``: none, as 0.2 stamped)."""
        from fenced_k8s_executor.launch import LaunchIdentity

        launch = _launch(row, token, sched.job_id, deployment or our_deployment())
        name = name or f"{row.task_id.replace('_', '-')}-{uuid.uuid4().hex[:8]}"
        from fenced_k8s_executor import provider_compat

        # What the provider and the stamp put on a pod, the attempt's task_instance_id included
        # (Airflow 3.4's provider finds a pod's attempt by it).
        labels = {"kubernetes_executor": "True", "airflow-worker": str(sched.job_id), "dag_id": row.dag_id,
                  "task_id": row.task_id, "try_number": str(row.try_number), "run_id": row.run_id,
                  **launch.labels(), provider_compat.TASK_INSTANCE_ID_LABEL: row.id}
        annotations = {"dag_id": row.dag_id, "task_id": row.task_id, "try_number": str(row.try_number),
                       "run_id": row.run_id, **launch.annotations(), provider_compat.TASK_INSTANCE_ID_ANNOTATION: row.id,
                       **(launcher if launcher is not None else _launcher_of(sched))}
        assert isinstance(launch, LaunchIdentity)
        body = {"metadata": {"name": name, "labels": labels, "annotations": annotations},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "base", "image": "x"}]}}
        self.kube.create_namespaced_pod(self.namespace, body)
        if phase != "Pending":
            self.set_pod_phase(name, phase, container_reason=container_reason)
        return name

    def cleared_launch_pod(self, peer: Scheduler) -> tuple[Row, str]:
        """A dead scheduler queued t1, a user cleared it (new id) and ``peer`` queued it again:
        the dead launch's Pending pod, which only a sweep re-checks. Returns (old row, pod name)."""
        dead = self.scheduler("fenced", start=False)
        self.queue(dead, trigger=False)
        row1 = self.row("t1")
        self.airflow.clear(row1)
        self.queue(peer, trigger=False)
        return row1, self.stale_pod(row1, row1.token, sched=dead)

    def sweeper(self, **options: Any):
        """A Sweeper of this world's namespace for this deployment, outside any scheduler's loop: with
        the witness of a scheduler job of its own, as the sweep of a live scheduler has it."""
        from fenced_k8s_executor.sweep import Sweeper

        if "witness" not in options and _has_witness():
            options["witness"] = self.witness()
        return Sweeper(kube_client=self.kube, namespaces=[self.namespace], interval=1, page_size=50,
                       enforcing=True, deployment=our_deployment(), **options)

    def witness(self):
        """The witness (``witness.Witness``) of a scheduler job of its own, renewed once: what a live
        fenced scheduler's sweep and loop consult."""
        if self._witness is None:
            from fenced_k8s_executor.witness import Witness

            job = Scheduler.new_job(hostname="sweeper")
            self._witness = Witness(self.kube, self.namespace, our_deployment(), job.id, host="sweeper",
                                    interval=1.0, alive_for=1.0)
            self._witness.start(wait=30)
        return self._witness

    def witnessed(self, *scheds: Scheduler, timeout: float = 30.0) -> None:
        """Wait until each fenced scheduler's witness can judge every live scheduler's pods (its peers
        heartbeat meanwhile, as live schedulers do): what a scheduler's first heartbeat intervals
        give it after a start (docs/design.md, the witness). Quick with a short
        ``[scheduler] scheduler_heartbeat_sec`` (the witness renews at that rate)."""
        deadline = time.monotonic() + timeout
        for sched in scheds:
            witness = getattr(sched.executor, "witness", None)
            while witness is not None and not witness.view.ready:
                assert time.monotonic() < deadline, f"{sched.user}'s witness never judged its peers: {witness.view}"
                for peer in self.schedulers:
                    if peer.job.state == "running":
                        peer.heartbeat()
                time.sleep(0.1)

    def audit(self) -> list[dict]:
        return self.backend.audit()

    def deletes_by(self, who: str | Scheduler, *, succeeded: bool = False) -> list[dict]:
        """Pod deletes ``who`` sent; ``succeeded`` keeps those the server carried out (two fences
        of one process, say the sweep and the loop's reconcile, may race to the same delete: the
        loser's 404 or 409 is no second deletion)."""
        user = who.user if isinstance(who, Scheduler) else who
        deadline = time.monotonic() + (2.0 if self.backend.name == "real" else 0)
        while True:  # the real apiserver's audit log is written when the response completes
            found = [e for e in self.backend.audit() if e.get("verb") == "delete" and e.get("who") == user
                     and e.get("resource", "pods") == "pods"
                     and (not succeeded or e.get("code") in (200, 202))]
            if found or time.monotonic() >= deadline:
                return found
            time.sleep(0.2)


def _drain(stream, path, answers) -> None:
    import json

    from scheduler_child import DONE

    with open(path, "a") as out:
        for line in stream:
            out.write(line)
            out.flush()  # read by the test while the child runs
            if DONE in line:
                answers.put(json.JSONDecoder().raw_decode(line[line.index(DONE) + len(DONE):])[0])


@dataclass
class ChildScheduler:
    """A scheduler process started by ``World.scheduler_process``."""

    proc: Any
    job_id: int
    user: str
    hostname: str
    answers: Any = field(default_factory=queue.Queue)
    audit_from: int = 0  # the API server's audit index when it started (set by the test that wants it)

    def do(self, op: str, timeout: float = 60.0, **args: Any) -> dict:
        """One command carried out between two of its loops (``scheduler_child.py --serve``)."""
        import json

        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        answer = self.answers.get(timeout=timeout)
        if "error" in answer:
            raise RuntimeError(f"the child scheduler could not {op}: {answer['error']}")
        return answer

    def kill(self) -> None:
        """SIGKILL its whole process group (the scheduler, its watcher and Manager processes), as
        the kernel's OOM killer or a node loss would; its Job row stays ``running``."""
        import signal

        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)


def _has_witness() -> bool:
    """Whether the installed package has a witness (the code before issue 52 has none)."""
    try:
        import fenced_k8s_executor.witness  # noqa: F401
    except ImportError:
        return False
    return True


def _launcher_of(sched: Scheduler) -> dict:
    """The launcher annotations ``sched``'s fenced executor stamps (its job and the job's start)."""
    try:
        from fenced_k8s_executor.launch import Launcher
    except ImportError:
        return {}
    from airflow.utils import timezone

    started = sched.job.start_date
    if started is None:
        return {}
    started = timezone.coerce_datetime(started)
    try:
        return Launcher(sched.job_id, started).annotations()
    except TypeError:  # builds before the witness also stamped a heartbeat (for runs on the code before it)
        return Launcher(sched.job_id, started, sched.job.latest_heartbeat or started).annotations()


def _launch(row: Row, token: str, job_id: int, deployment: str | None):
    import dataclasses

    from fenced_k8s_executor.launch import LaunchIdentity

    fields = {f.name for f in dataclasses.fields(LaunchIdentity)}
    extra = {}
    if "dag_id" in fields:
        extra.update(dag_id=row.dag_id, task_id=row.task_id, run_id=row.run_id, map_index=row.map_index)
    if "deployment" in fields and deployment:
        extra["deployment"] = deployment
    return LaunchIdentity(ti_id=row.id, token=token, try_number=row.try_number, scheduler_job_id=str(job_id),
                          **extra)


@pytest.fixture
def kube_api(kube_backend):
    """The backend under test, reset for this test."""
    kube_backend.reset()
    yield kube_backend
    kube_backend.clear_faults()


#: The metadata DB's drivers: psycopg2 (the lab's URLs) and psycopg 3, which SQLAlchemy 2.1 picks
#: for the plain ``postgresql://`` URL the official chart writes (a defect of the loop's reads
#: lived there alone, d63c12c).
DRIVERS = ("psycopg2", "psycopg")


def world_driver(backend) -> str:
    """The driver a world runs on: psycopg 3 on the emulator, psycopg2 on the real apiserver, so
    every test that runs on both backends runs on both drivers at no extra cost (the matrix's race
    tests, emulator only, on the chart's). ``INTEGRATION_DB_DRIVER`` forces one."""
    chosen = os.environ.get("INTEGRATION_DB_DRIVER") or ("psycopg" if backend.name == "emulator" else "psycopg2")
    if chosen not in DRIVERS:
        raise ValueError(f"INTEGRATION_DB_DRIVER={chosen!r}: accepted values are {', '.join(DRIVERS)}")
    return chosen


@contextmanager
def metadata_driver(driver: str, monkeypatch) -> Iterator[None]:
    """Airflow's ORM in this process (the schedulers' sessions, the fences' reads, the execution
    API) on ``driver`` while inside, and on the session's URL again after."""
    from airflow import settings
    from airflow.configuration import conf

    url = conf.get("database", "sql_alchemy_conn")
    scheme, rest = url.split("://", 1)
    wanted = f"{scheme.split('+')[0]}+{driver}://{rest}"
    if wanted == url:
        yield
        return
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", wanted)
    settings.configure_vars()
    settings.reconfigure_orm()
    try:
        yield
    finally:
        monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", url)
        settings.configure_vars()
        settings.reconfigure_orm()


@contextmanager
def open_world(backend, metadata_db, airflow, tmp_path, monkeypatch, task_ids: list[str],
               dag_kwargs: dict, driver: str | None = None) -> Iterator[World]:
    """One test's world on ``backend``: a namespace, a DAG with ``task_ids`` and one run, Airflow's
    ORM on ``driver`` (default ``world_driver``)."""
    driver = driver or world_driver(backend)
    with metadata_driver(driver, monkeypatch):
        with _open_world(backend, metadata_db, airflow, tmp_path, monkeypatch, task_ids, dag_kwargs) as world:
            world.driver = driver
            yield world


@contextmanager
def _open_world(backend, metadata_db, airflow, tmp_path, monkeypatch, task_ids: list[str],
                dag_kwargs: dict) -> Iterator[World]:
    from kubernetes import client, config

    namespace = f"t-{uuid.uuid4().hex[:8]}"
    backend.ensure_namespace(namespace)
    test_kc = backend.write_kubeconfig(str(tmp_path / "test.kubeconfig"), token="test", namespace=namespace)
    backend.set_tokens({"test": "test"})
    kube = client.CoreV1Api(config.new_client_from_config(config_file=test_kc))
    template = tmp_path / "pod_template.yaml"
    template.write_text(POD_TEMPLATE)
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__IN_CLUSTER", "False")
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE", namespace)
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE", str(template))
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_REPOSITORY", "lab/airflow")
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_TAG", "local")
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__DELETE_WORKER_PODS", "False")
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__TASK_PUBLISH_MAX_RETRIES", "-1")
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__KUBE_CLIENT_REQUEST_ARGS", '{"_request_timeout": [5, 3]}')
    monkeypatch.setenv("AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL", "3600")
    monkeypatch.setenv("AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD", "1")
    monkeypatch.setenv("AIRFLOW__FENCED_KUBERNETES_EXECUTOR__SWEEP_INTERVAL", "0")
    dag_id = f"race_{uuid.uuid4().hex[:8]}"
    airflow.add_dag(dag_id, task_ids, **dag_kwargs)
    run_id = airflow.create_run(dag_id)
    w = World(metadata_db, airflow, backend, namespace, kube, dag_id, run_id, tmp_path, monkeypatch)
    try:
        yield w
    finally:
        for child in w.children:
            child.kill()
        for sched in w.schedulers:
            sched.stop()
        if w._witness is not None:
            w._witness.stop()
        airflow.retire(dag_id)  # its leftover TIs must not reach the next test's schedulers


def tasks_of(request) -> tuple[list[str], dict]:
    """The ``tasks`` marker of a test: (task ids, DAG keyword arguments)."""
    marker = request.node.get_closest_marker("tasks")
    return (list(marker.args), dict(marker.kwargs)) if marker else (["t1"], {})


@pytest.fixture
def world_opener():
    """``(open_world, tasks_of)`` for modules that build their world on a chosen backend."""
    return open_world, tasks_of


@pytest.fixture
def world(metadata_db, airflow, kube_api, tmp_path, monkeypatch, request):
    task_ids, dag_kwargs = tasks_of(request)
    with open_world(kube_api, metadata_db, airflow, tmp_path, monkeypatch, task_ids, dag_kwargs) as w:
        yield w


@pytest.fixture
def count_metric(monkeypatch) -> Callable[..., list]:
    """``count_metric(metric, *wanted)``: every ``metric`` this process emits from then on (it still
    goes out), as the values of its ``wanted`` tags (the value of one, a tuple of several)."""
    from fenced_k8s_executor import metrics

    def counter(metric: str, *wanted: str) -> list:
        counted: list = []
        original = metrics.incr

        def incr(name, tags=None, count=1):
            if name == metric:
                values = tuple((tags or {}).get(tag) for tag in wanted)
                counted.append(values[0] if len(values) == 1 else values)
            return original(name, tags, count)

        monkeypatch.setattr(metrics, "incr", incr)
        return counted

    return counter


@pytest.fixture
def cuts(count_metric):
    """The ``db.cut`` metrics counted in this process, by operation (the watchdog's cuts)."""
    return count_metric("db.cut", "operation")


@pytest.fixture
def needs_emulator(kube_api):
    if not kube_api.supports_faults:
        pytest.skip("needs emulator-only controls (read faults, dropped or hung connections, compaction, "
                    "close_watches); the real apiserver's webhook makes write faults only")


@pytest.fixture
def needs_write_faults(kube_api):
    """Write faults (POST/PATCH/PUT/DELETE: status, delay, who, times, after): the emulator, and the
    real apiserver through its admission webhook. Read faults, drops and hangs need ``needs_emulator``."""
    if not getattr(kube_api, "supports_write_faults", False):
        pytest.skip("needs write faults (add_fault on POST/PATCH/PUT/DELETE); this backend has none")


def pytest_configure(config):
    config.addinivalue_line("markers", "tasks(*task_ids, retries=2): the task ids of the test's DAG")


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
