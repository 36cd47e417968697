"""The real Airflow processes for one lab run: api-server, dag-processor and N schedulers.

Fencing bugs only show across processes (a paused or killed scheduler, another one adopting
its pods), so the lab runs the real CLI commands, not in-process fakes. Every process shares
one environment (DB, secrets, execution API URL, executor) that makes them one deployment;
each scheduler gets its OWN kubeconfig and bearer token (`scheduler-0`, ...) so the emulator's
audit log says which scheduler made which call. Processes run in their own process groups so a
scenario can SIGSTOP/SIGCONT/SIGKILL a scheduler (and its executor subprocesses) as a unit.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Iterable

from fenced_k8s_lab.postgres import airflow_db_env, free_port

STOCK_EXECUTOR = "airflow.providers.cncf.kubernetes.executors.kubernetes_executor.KubernetesExecutor"
#: The runtime package (repo root) and the lab (lab/), importable by the lab's processes uninstalled.
PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
LAB_ROOT = str(Path(__file__).resolve().parents[1])
EXECUTION_AUDIENCE = "urn:airflow.apache.org:task"

POD_TEMPLATE = """\
apiVersion: v1
kind: Pod
metadata:
  name: lab-worker
spec:
  containers:
    - name: base
      image: lab/airflow:local
  restartPolicy: Never
"""


def write_kubeconfig(path: Path, server: str, token: str, namespace: str = "default") -> Path:
    from fenced_k8s_lab.kubeconfig import write_kubeconfig as write

    return Path(write(path, server, token=token, namespace=namespace))


def _pythonpath() -> str:
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(parts + [root for root in (PROJECT_ROOT, LAB_ROOT) if root not in parts])


class AirflowProcess:
    """One CLI process in its own process group, with its log file and a restart."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path):
        self.name, self.argv, self.env, self.log_dir = name, argv, env, log_dir
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.log_path = log_dir / f"{name}.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> "AirflowProcess":
        suffix = f".{self.restarts}" if self.restarts else ""
        self.log_path = self.log_dir / f"{self.name}{suffix}.log"
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         cwd=self.env.get("AIRFLOW_HOME"))
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Signal the whole process group (the scheduler and its executor subprocesses)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def kill(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        if self.proc:
            self.proc.wait()

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the group, wait up to `timeout`, then SIGKILL whatever is left of the group."""
        if self.alive():
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
        self.reap(time.monotonic() + timeout)

    def reap(self, deadline: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        self.signal(signal.SIGKILL)  # also the group's stragglers (executor subprocesses)
        self.proc.wait()

    def restart(self) -> "AirflowProcess":
        self.stop()
        self.restarts += 1
        return self.start()

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class AirflowClient:
    """Just enough of /api/v2 for scenarios, authenticated via the simple auth manager."""

    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/")
        self._token: str | None = None

    def _req(self, method: str, path: str, body: Any = None, auth: bool = True, timeout: float = 30) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{method} {path} -> {e.code}: {e.read()[:500]!r}") from None
        return json.loads(raw) if raw else None

    def token(self) -> str:
        if self._token is None:  # all-admins mode: GET /auth/token needs no credentials
            self._token = self._req("GET", "/auth/token", auth=False)["access_token"]
        return self._token

    def health(self) -> dict:
        return self._req("GET", "/api/v2/monitor/health", auth=False)

    def get_dag(self, dag_id: str) -> dict:
        return self._req("GET", f"/api/v2/dags/{dag_id}")

    def unpause(self, dag_id: str) -> dict:
        return self._req("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def trigger(self, dag_id: str, conf: dict | None = None, run_id: str | None = None) -> dict:
        body: dict[str, Any] = {"logical_date": None, "conf": conf or {}}
        if run_id:
            body["dag_run_id"] = run_id
        return self._req("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)

    def dag_run(self, dag_id: str, run_id: str) -> dict:
        return self._req("GET", f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}")

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        q = urllib.parse.quote(run_id, safe="")
        return self._req("GET", f"/api/v2/dags/{dag_id}/dagRuns/{q}/taskInstances")["task_instances"]

    def clear(self, dag_id: str, run_id: str, task_ids: list[str] | None = None, only_failed: bool = False) -> Any:
        body: dict[str, Any] = {"dry_run": False, "dag_run_id": run_id, "only_failed": only_failed,
                                "reset_dag_runs": True}
        if task_ids:
            body["task_ids"] = task_ids
        return self._req("POST", f"/api/v2/dags/{dag_id}/clearTaskInstances", body)

    def wait_dags(self, dag_ids: Iterable[str], timeout: float = 120) -> None:
        """Wait until the dag-processor has serialized every DAG in `dag_ids`."""
        pending, deadline = set(dag_ids), time.monotonic() + timeout
        while pending:
            for d in list(pending):
                try:
                    self.get_dag(d)
                    pending.discard(d)
                except RuntimeError:
                    pass
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"DAGs not parsed after {timeout}s: {sorted(pending)}")
            if pending:
                time.sleep(1)

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 180,
                 states: tuple[str, ...] = ("success", "failed")) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            run = self.dag_run(dag_id, run_id)
            if run["state"] in states:
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(f"{dag_id}/{run_id} still {run['state']} after {timeout}s")
            time.sleep(1)


def group_pss_mb(pgid: int | None) -> float:
    """Proportional set size of a process group (what it really costs in RAM)."""
    total = 0
    for entry in Path("/proc").iterdir() if pgid else ():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            for line in (entry / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return round(total / 1024, 1)


def mint_execution_token(jwt_secret: str, ti_id: str | None = None, valid_for: int = 600) -> str:
    """A workload JWT as the scheduler mints it (HS512 over the shared secret)."""
    import jwt

    now = int(time.time())
    claims = {"jti": uuid.uuid4().hex, "sub": ti_id or str(uuid.uuid4()), "aud": EXECUTION_AUDIENCE,
              "nbf": now, "iat": now, "exp": now + valid_for}
    return jwt.encode(claims, jwt_secret, algorithm="HS512")


class AirflowStack:
    """One deployment: `start()` brings up api-server, dag-processor and `schedulers` schedulers.

    kube_url: the Kubernetes API (emulator) URL; kube_token(role) names each process' token
    (registered with `emulator.set_tokens` when an emulator control object is passed).
    emulator: optionally a kube backend (`Emulator`, `lab.controlplane.ControlPlane`/`ExternalCluster`):
    it then writes the kubeconfigs (TLS CA, or an external cluster's credentials) and creates the namespace.
    env: extra environment (AIRFLOW__SECTION__KEY overrides) for every process, workers included.
    Use as a context manager; processes are also stopped at interpreter exit.
    """

    def __init__(self, run_dir: str | os.PathLike, db_url: str, kube_url: str, dags_folder: str | os.PathLike, *,
                 executor: str = STOCK_EXECUTOR, schedulers: int = 1, namespace: str = "default",
                 env: dict[str, str] | None = None, kube_token=lambda role: role,
                 api_port: int | None = None, dag_processor: bool = True, emulator=None,
                 api_host: str = "127.0.0.1"):
        self.run_dir = Path(run_dir).resolve()
        self.home = self.run_dir / "airflow-home"
        self.log_dir = self.run_dir / "logs"
        for d in (self.home, self.log_dir, self.run_dir / "kube"):
            d.mkdir(parents=True, exist_ok=True)
        self.db_url, self.kube_url, self.namespace = db_url, kube_url, self.namespace_name(namespace)
        self.dags_folder = str(Path(dags_folder).resolve())
        self.executor, self.n_schedulers = executor, schedulers
        self.kube_token, self.with_dag_processor = kube_token, dag_processor
        self.emulator = emulator  # optional: gets set_tokens({token: role}) for its audit log
        self.api_port = api_port or free_port()
        self.api_host = api_host  # where workers reach the api-server: a real cluster's pods use the node network
        self.api_url = f"http://{api_host}:{self.api_port}"
        self.jwt_secret = secrets.token_urlsafe(64)
        self.pod_template = self.run_dir / "kube" / "pod_template.yaml"
        self.pod_template.write_text(POD_TEMPLATE)
        self.env = self._shared_env(env or {})
        self.processes: dict[str, AirflowProcess] = {}
        self.timings: dict[str, float] = {}
        self._atexit = False

    @staticmethod
    def namespace_name(name: str) -> str:
        """A DNS label, as a real apiserver demands of namespace names (scenario names have underscores)."""
        return name.replace("_", "-").lower()

    # ---- environment ---------------------------------------------------------------------
    def _shared_env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update({
            "AIRFLOW_HOME": str(self.home),
            "PYTHONPATH": _pythonpath(),
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
            **airflow_db_env(self.db_url),
            "AIRFLOW__CORE__EXECUTOR": self.executor,
            "AIRFLOW__CORE__DAGS_FOLDER": self.dags_folder,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.api_url}/execution/",
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "fenced_k8s_lab.hostname.pod_hostname",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API_AUTH__JWT_SECRET": self.jwt_secret,
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            "AIRFLOW__API__BASE_URL": self.api_url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__KUBERNETES_EXECUTOR__IN_CLUSTER": "False",
            "AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE": self.namespace,
            "AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE": str(self.pod_template),
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "30",
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "30",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        })
        env.update(extra)
        return env

    def kubeconfig(self, role: str) -> Path:
        if self.emulator is not None and hasattr(self.emulator, "set_tokens"):
            self.emulator.set_tokens({self.kube_token(role): role})
        if hasattr(self.emulator, "write_kubeconfig"):  # a kube backend: its CA, or an external cluster's credentials
            return Path(self.emulator.write_kubeconfig(str(self.run_dir / "kube" / f"{role}.kubeconfig"),
                                                       token=self.kube_token(role), namespace=self.namespace))
        return write_kubeconfig(self.run_dir / "kube" / f"{role}.kubeconfig", self.kube_url,
                                self.kube_token(role), self.namespace)

    def process_env(self, role: str) -> dict[str, str]:
        return {**self.env, "HOSTNAME": role,
                "AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE": str(self.kubeconfig(role))}

    def worker_env(self) -> dict[str, str]:
        """Base environment for pod processes (ProcessKubelet(base_env=...)): the same deployment
        settings, so `python -m airflow.sdk.execution_time.execute_workload` reaches this api-server."""
        env = {k: v for k, v in self.env.items() if k != "AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE"}
        env.pop("HOSTNAME", None)  # the kubelet sets it to the pod name
        return env

    # ---- processes -----------------------------------------------------------------------
    def _add(self, role: str, *args: str) -> AirflowProcess:
        p = AirflowProcess(role, [sys.executable, "-m", "airflow", *args], self.process_env(role), self.log_dir)
        self.processes[role] = p
        return p.start()

    @property
    def api_server(self) -> AirflowProcess:
        return self.processes["api-server"]

    @property
    def schedulers(self) -> list[AirflowProcess]:
        return [self.processes[f"scheduler-{i}"] for i in range(self.n_schedulers)
                if f"scheduler-{i}" in self.processes]

    def start_scheduler(self, i: int) -> AirflowProcess:
        role = f"scheduler-{i}"
        if role in self.processes:
            return self.processes[role].restart()
        self.n_schedulers = max(self.n_schedulers, i + 1)
        return self._add(role, "scheduler")

    def client(self) -> AirflowClient:
        return AirflowClient(self.api_url)

    def start(self, timeout: float = 180) -> "AirflowStack":
        if not self._atexit:
            atexit.register(self.stop)
            self._atexit = True
        t0 = time.monotonic()
        if hasattr(self.emulator, "ensure_namespace"):  # a real apiserver needs the namespace to exist
            self.emulator.ensure_namespace(self.namespace)
        try:
            self._add("api-server", "api-server", "-H", self.api_host, "-p", str(self.api_port), "-w", "1")
            if self.with_dag_processor:
                self._add("dag-processor", "dag-processor")
            self.wait_api(timeout)
            self.timings["api_ready"] = time.monotonic() - t0
            self.warm_up()
            self.timings["api_warm"] = time.monotonic() - t0
            for i in range(self.n_schedulers):
                self.start_scheduler(i)
        except BaseException:
            self.stop()
            raise
        self.timings["started"] = time.monotonic() - t0
        return self

    def wait_api(self, timeout: float = 180) -> None:
        deadline, c = time.monotonic() + timeout, self.client()
        while True:
            if not self.api_server.alive():
                raise RuntimeError(f"api-server exited:\n{self.api_server.tail()}")
            try:
                c.health()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"api-server not healthy after {timeout}s:\n{self.api_server.tail()}")
                time.sleep(0.5)

    def warm_up(self) -> float:
        """The first execution-API request builds the versioned routes (~6 s, over the SDK's 5 s
        timeout): pay that here, with a validly signed token for a TI that does not exist."""
        t0 = time.monotonic()
        tok = mint_execution_token(self.jwt_secret)
        for method, path in (("GET", "/execution/health"),
                             ("GET", f"/execution/task-instances/{uuid.uuid4()}/previous-successful-dagrun")):
            req = urllib.request.Request(self.api_url + path, method=method,
                                         headers={"Authorization": f"Bearer {tok}"})
            try:
                urllib.request.urlopen(req, timeout=60).read()
            except urllib.error.HTTPError:
                pass
        return time.monotonic() - t0

    def scheduler_jobs(self) -> list[dict]:
        """Scheduler job rows (id, hostname = process role, state, heartbeat age in seconds)."""
        import sqlalchemy as sa

        engine = sa.create_engine(self.db_url, poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as c:
                rows = c.execute(sa.text(
                    "SELECT id, hostname, state, EXTRACT(EPOCH FROM (now() - latest_heartbeat)) AS age "
                    "FROM job WHERE job_type = 'SchedulerJob' ORDER BY id")).mappings().all()
        finally:
            engine.dispose()
        return [{**r, "age": float(r["age"])} for r in rows]

    def wait_schedulers_heartbeat(self, timeout: float = 120, fresh: float = 15) -> list[dict]:
        """Wait until every live scheduler process has a running job with a recent heartbeat."""
        deadline = time.monotonic() + timeout
        while True:
            for s in self.schedulers:
                if not s.alive():
                    raise RuntimeError(f"{s.name} exited:\n{s.tail()}")
            jobs = [j for j in self.scheduler_jobs() if j["state"] == "running" and j["age"] < fresh]
            want = {s.name for s in self.schedulers if s.alive()}
            if want <= {j["hostname"] for j in jobs}:
                return jobs
            if time.monotonic() > deadline:
                raise TimeoutError(f"schedulers not heartbeating after {timeout}s: {jobs}")
            time.sleep(1)

    def memory_mb(self) -> dict[str, float]:
        """PSS per role in MB, summed over each process group (Linux /proc; 0 when unreadable)."""
        return {n: group_pss_mb(p.pid) for n, p in self.processes.items() if p.alive()}

    def pids(self) -> dict[str, int | None]:
        return {n: p.pid for n, p in self.processes.items()}

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every process: SIGTERM all at once, SIGKILL after `timeout` (the stock executor's
        shutdown can block ~30 s on its watch; a lab run does not need a graceful exit)."""
        procs = list(self.processes.values())
        for p in procs:
            if p.alive():
                p.signal(signal.SIGCONT)
                p.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in procs:
            p.reap(deadline)

    def __enter__(self) -> "AirflowStack":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
