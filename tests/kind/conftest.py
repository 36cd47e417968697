"""Fixtures and gating for the kind scenarios (tests/kind/test_kind_ha.py).

The scenarios run only when ALL of these hold, otherwise every test here is skipped at
collection with a reason naming what is missing:

* ``KIND_TESTS=1`` in the environment;
* ``kind``, ``kubectl``, ``helm`` and ``docker`` on PATH;
* the ``kubernetes`` and ``requests`` Python packages importable;
* the cluster answers (kubeconfig from ``KUBECONFIG``, context ``KIND_CONTEXT``, default
  ``kind-$KIND_CLUSTER_NAME`` = ``kind-fenced-k8s`` when that context exists).

Environment: ``KIND_FLAVOUR`` (stock|fenced: run only that flavour), ``KIND_REINSTALL=1``
(switch the release to the other flavour with kind-config/up.sh when needed),
``AIRFLOW_NAMESPACE`` (airflow), ``RELEASE`` (airflow), ``KIND_AIRFLOW_URL``
(http://127.0.0.1:8080), ``KIND_AIRFLOW_USER`` / ``KIND_AIRFLOW_PASSWORD`` (admin/admin).
"""

from __future__ import annotations

import configparser
import io
import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = ROOT / "out" / "kind"

REQUIRED_TOOLS = ("kind", "kubectl", "helm", "docker")
CLUSTER_NAME = os.environ.get("KIND_CLUSTER_NAME", "fenced-k8s")
NAMESPACE = os.environ.get("AIRFLOW_NAMESPACE", "airflow")
RELEASE = os.environ.get("RELEASE", "airflow")
AIRFLOW_URL = os.environ.get("KIND_AIRFLOW_URL", "http://127.0.0.1:8080").rstrip("/")
DAG_ID = "fenced_repro"  # baked into the image by the Dockerfile's "kind" target
FLAVOURS = ("stock", "fenced")
WORKER_SELECTOR = "kubernetes_executor=True"


# --------------------------------------------------------------------------- gating


def _kube_context() -> str | None:
    wanted = os.environ.get("KIND_CONTEXT")
    if wanted:
        return wanted
    try:
        from kubernetes import config

        contexts, _active = config.list_kube_config_contexts()
    except Exception:
        return None
    default = f"kind-{CLUSTER_NAME}"
    return default if any(c["name"] == default for c in contexts) else None


def _skip_reason() -> str | None:
    missing: list[str] = []
    if os.environ.get("KIND_TESTS") != "1":
        missing.append("KIND_TESTS=1 not set")
    missing += [f"{tool} not on PATH" for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    for module in ("kubernetes", "requests"):
        try:
            __import__(module)
        except ImportError:
            missing.append(f"python package {module} not installed")
    if missing:
        return "; ".join(missing)
    try:
        from kubernetes import client, config

        config.load_kube_config(context=_kube_context())
        client.VersionApi().get_code(_request_timeout=5)
    except Exception as exc:  # any failure means "no cluster to talk to"
        kubeconfig = os.environ.get("KUBECONFIG", "~/.kube/config")
        return f"Kubernetes cluster does not answer (KUBECONFIG={kubeconfig}): {type(exc).__name__}: {exc}"
    return None


_REASON: list[str | None] = []


def kind_skip_reason() -> str | None:
    if not _REASON:
        _REASON.append(_skip_reason())
    return _REASON[0]


def pytest_collection_modifyitems(config, items):
    ours = [item for item in items if HERE in Path(str(item.fspath)).resolve().parents]
    if not ours:
        return
    reason = kind_skip_reason()
    for item in ours:
        item.add_marker(pytest.mark.kind)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_terminal_summary(terminalreporter):
    """Print the side-by-side table of every scenario report written so far."""
    reports = sorted(OUT.glob("report-*.json")) if OUT.is_dir() else []
    if not reports or kind_skip_reason():
        return
    rows = [json.loads(p.read_text()) for p in reports]
    cols = [
        "superseded_pods_started", "run_404_pods", "duplicate_pod_groups",
        "concurrent_duplicate_groups", "failed_tasks", "tasks_not_terminal",
        "stale_live_pods_at_end", "pods_deleted_seen", "retries_burned",
    ]
    terminalreporter.section("kind scenarios: stock vs fenced (out/kind/report-*.json)")
    header = f"{'scenario':<24}{'flavour':<8}" + "".join(f"{c[:14]:>15}" for c in cols)
    terminalreporter.write_line(header)
    for r in sorted(rows, key=lambda r: (r["scenario"], r["flavour"])):
        terminalreporter.write_line(
            f"{r['scenario']:<24}{r['flavour']:<8}" + "".join(f"{r['metrics'].get(c, '-')!s:>15}" for c in cols)
        )


# --------------------------------------------------------------------------- cluster access


@pytest.fixture(scope="session")
def kube():
    from kubernetes import client, config

    config.load_kube_config(context=_kube_context())
    return client.CoreV1Api()


def kubectl(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    ctx = _kube_context()
    cmd = ["kubectl", *(["--context", ctx] if ctx else []), "-n", NAMESPACE, *args]
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=timeout)


def installed_flavour(kube) -> str | None:
    """The executor the installed scheduler loads, resolved like Airflow does.

    The values files (helm-values/*-ha.yaml, installed unchanged by kind-config/up.sh) keep the
    chart's ``executor`` at KubernetesExecutor, so airflow.cfg says KubernetesExecutor for both
    flavours; the fenced flavour sets AIRFLOW__CORE__EXECUTOR in the scheduler's env, which Airflow
    reads first (a repeated name: the last entry wins). tests/helm proves the same on the render.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    executor = ""
    try:
        deploy = client.AppsV1Api(kube.api_client).read_namespaced_deployment(f"{RELEASE}-scheduler", NAMESPACE)
    except ApiException:
        return None
    for container in deploy.spec.template.spec.containers:
        if container.name == "scheduler":
            for env in container.env or []:
                if env.name == "AIRFLOW__CORE__EXECUTOR" and env.value:
                    executor = env.value
    if not executor:
        try:
            cm = kube.read_namespaced_config_map(f"{RELEASE}-config", NAMESPACE)
        except ApiException:
            return None
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        parser.read_string((cm.data or {}).get("airflow.cfg", ""))
        executor = parser.get("core", "executor", fallback="")
    executor = executor.split(",")[0].strip()
    if not executor:
        return None
    return "fenced" if executor.endswith("FencedKubernetesExecutor") else "stock"


@pytest.fixture(scope="module")
def flavour_cluster(request, kube):
    """The flavour under test, installed. Skips (or reinstalls) when the cluster runs the other."""
    flavour = request.param
    only = os.environ.get("KIND_FLAVOUR")
    if only and only != flavour:
        pytest.skip(f"KIND_FLAVOUR={only}: {flavour} not selected")
    current = installed_flavour(kube)
    if current != flavour:
        if os.environ.get("KIND_REINSTALL") != "1":
            pytest.skip(
                f"cluster runs {current or 'no Airflow release'}; run kind-config/up.sh {flavour} "
                f"(or set KIND_REINSTALL=1)"
            )
        env = {**os.environ, "SKIP_BUILD": os.environ.get("SKIP_BUILD", "1")}
        subprocess.run([str(ROOT / "kind-config" / "up.sh"), flavour], check=True, env=env, timeout=1800)
        assert installed_flavour(kube) == flavour
    return flavour


@pytest.fixture(scope="module")
def airflow(flavour_cluster):
    api = AirflowAPI(AIRFLOW_URL)
    api.wait_ready()
    api.ensure_dag(DAG_ID)
    return api


# --------------------------------------------------------------------------- Airflow REST API


class AirflowAPI:
    """/api/v2 with a JWT from /auth/token (FAB: POST user/password; simple auth: GET)."""

    def __init__(self, base: str):
        import requests

        self.base = base
        self.http = requests.Session()
        self._token_at = 0.0

    def _login(self) -> None:
        user = os.environ.get("KIND_AIRFLOW_USER", "admin")
        password = os.environ.get("KIND_AIRFLOW_PASSWORD", "admin")
        resp = self.http.post(f"{self.base}/auth/token", json={"username": user, "password": password}, timeout=30)
        if resp.status_code >= 400:
            resp = self.http.get(f"{self.base}/auth/token", timeout=30)  # simple_auth_manager_all_admins
        resp.raise_for_status()
        self.http.headers["Authorization"] = f"Bearer {resp.json()['access_token']}"
        self._token_at = time.monotonic()

    def call(self, method: str, path: str, **kw):
        if time.monotonic() - self._token_at > 600:
            self._login()
        resp = self.http.request(method, f"{self.base}/api/v2{path}", timeout=60, **kw)
        if resp.status_code == 401:
            self._login()
            resp = self.http.request(method, f"{self.base}/api/v2{path}", timeout=60, **kw)
        resp.raise_for_status()
        return resp.json() if resp.content else None

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                health = self.http.get(f"{self.base}/api/v2/monitor/health", timeout=10).json()
                if health.get("scheduler", {}).get("status") == "healthy":
                    self._login()
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"Airflow api-server at {self.base} not healthy within {timeout}s")
            time.sleep(5)

    def ensure_dag(self, dag_id: str, timeout: float = 300) -> None:
        import requests

        deadline = time.monotonic() + timeout
        while True:
            try:
                self.call("GET", f"/dags/{dag_id}")
                break
            except requests.HTTPError:
                if time.monotonic() > deadline:
                    pytest.fail(f"DAG {dag_id} not parsed within {timeout}s (is the 'kind' image target loaded?)")
                time.sleep(5)
        self.call("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    def trigger(self, dag_id: str, run_id: str, conf: dict) -> None:
        self.call("POST", f"/dags/{dag_id}/dagRuns", json={"dag_run_id": run_id, "logical_date": None, "conf": conf})

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"]

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        return self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 1000})[
            "task_instances"
        ]

    def clear(self, dag_id: str, run_id: str) -> list:
        body = {"dry_run": False, "dag_run_id": run_id, "only_failed": False, "reset_dag_runs": True}
        return self.call("POST", f"/dags/{dag_id}/clearTaskInstances", json=body)["task_instances"]


# --------------------------------------------------------------------------- pod recorder


@dataclass
class PodRecord:
    name: str
    uid: str
    first_seen: float
    obj: dict = field(default_factory=dict)
    phases: list[str] = field(default_factory=list)
    terminal_at: float | None = None
    deleted_at: float | None = None


class PodRecorder:
    """Watches worker pods (label kubernetes_executor=True) in a thread and keeps every pod it
    ever saw, including pods deleted before the end of the scenario (fenced deletes stale pods)."""

    def __init__(self, kube, namespace: str = NAMESPACE):
        self.kube = kube
        self.namespace = namespace
        self.pods: dict[str, PodRecord] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-recorder", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=30)

    def _record(self, event_type: str, pod) -> None:
        obj = self.kube.api_client.sanitize_for_serialization(pod)
        meta, now = obj["metadata"], time.time()
        with self._lock:
            rec = self.pods.get(meta["uid"])
            if rec is None:
                rec = self.pods[meta["uid"]] = PodRecord(meta["name"], meta["uid"], now)
            rec.obj = obj
            phase = (obj.get("status") or {}).get("phase") or "Unknown"
            if not rec.phases or rec.phases[-1] != phase:
                rec.phases.append(phase)
            if phase in ("Succeeded", "Failed") and rec.terminal_at is None:
                rec.terminal_at = now
            if event_type == "DELETED" and rec.deleted_at is None:
                rec.deleted_at = now

    def _run(self) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            try:
                listing = self.kube.list_namespaced_pod(self.namespace, label_selector=WORKER_SELECTOR)
                for pod in listing.items:
                    self._record("ADDED", pod)
                w = watch.Watch()
                for event in w.stream(
                    self.kube.list_namespaced_pod, self.namespace, label_selector=WORKER_SELECTOR,
                    resource_version=listing.metadata.resource_version, timeout_seconds=30,
                ):
                    self._record(event["type"], event["object"])
                    if self._stop.is_set():
                        w.stop()
                        break
            except Exception:  # 410 Gone, connection resets: relist
                time.sleep(1)

    def snapshot(self) -> list[PodRecord]:
        with self._lock:
            return list(self.pods.values())


# --------------------------------------------------------------------------- DB view (launch tokens)

_TI_QUERY = r"""
import json, sys
from airflow.models.taskinstance import TaskInstance as TI
from airflow.utils.session import create_session
with create_session() as s:
    rows = s.query(TI.id, TI.task_id, TI.map_index, TI.try_number, TI.state,
                   TI.external_executor_id, TI.queued_by_job_id).filter(
        TI.dag_id == sys.argv[1], TI.run_id == sys.argv[2]).all()
out = [dict(id=str(r[0]), task_id=r[1], map_index=r[2], try_number=r[3],
            state=getattr(r[4], "value", r[4]), external_executor_id=r[5],
            queued_by_job_id=r[6]) for r in rows]
print("TI_JSON:" + json.dumps(out))
"""


def scheduler_pods(kube) -> list:
    pods = kube.list_namespaced_pod(NAMESPACE, label_selector=f"component=scheduler,release={RELEASE}").items
    return [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]


def db_task_instances(kube, dag_id: str, run_id: str) -> list[dict]:
    """TaskInstance rows incl. external_executor_id (the REST API does not expose it)."""
    last_error = None
    for pod in scheduler_pods(kube):
        proc = kubectl("exec", pod.metadata.name, "-c", "scheduler", "--", "python", "-c", _TI_QUERY,
                       dag_id, run_id, check=False)
        for line in io.StringIO(proc.stdout):
            if line.startswith("TI_JSON:"):
                return json.loads(line[len("TI_JSON:"):])
        last_error = proc.stderr[-2000:]
    raise AssertionError(f"could not read task instances through a scheduler pod: {last_error}")


# --------------------------------------------------------------------------- helpers for the tests


@pytest.fixture(scope="session")
def kindlib():
    """Helpers for test_kind_ha.py (tests/ has no packages, so they come through a fixture)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        DAG_ID=DAG_ID, NAMESPACE=NAMESPACE, RELEASE=RELEASE, OUT=OUT, ROOT=ROOT,
        PodRecorder=PodRecorder, db_task_instances=db_task_instances,
        kubectl=kubectl, scheduler_pods=scheduler_pods,
    )
