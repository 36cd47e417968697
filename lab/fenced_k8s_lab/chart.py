"""Install the official Airflow chart on a cluster without helm: render, then server-side apply.

``helm install`` is not available here; ``../shared/helm``'s minihelm renders the chart (helm's own
``helm template`` pipeline) and ``kubectl apply --server-side`` applies the manifests, the route
GitOps tools (Argo CD, Flux) take for charts. Helm hooks are then plain objects: the migration
Job runs alongside the Deployments, whose ``wait-for-airflow-migrations`` init containers wait for
it, as they do under helm.

What a real install here needs beyond the chart and ``helm-values/<flavour>-ha.yaml``:
``kind-config/node/values.yaml`` (images imported on the node, no StorageClass, no statsd image),
generated secrets, and the metadata database of ``kind-config/postgres.yaml`` running a locally
built PostgreSQL image. Used by ``tests/node``; nothing here is imported by the executor.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("FENCED_SHARED", ROOT.parent / "shared"))
CHART = SHARED / "helm" / "chart"
MINIHELM_INSTALL = SHARED / "helm" / "install.sh"
VALUES = ROOT / "helm-values"
NODE_VALUES = ROOT / "kind-config" / "node" / "values.yaml"
WITNESS_RBAC = VALUES / "witness-rbac.yaml"
POSTGRES = ROOT / "kind-config" / "postgres.yaml"
POSTGRES_IMAGE = "localhost/fenced/postgres:15"
EXECUTORS = {"fenced": "fenced_k8s_executor.FencedKubernetesExecutor", "stock": "KubernetesExecutor"}


class InstallError(RuntimeError):
    pass


def minihelm() -> str:
    out = subprocess.run(["bash", str(MINIHELM_INSTALL)], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def generated_secrets() -> dict:
    """fernetKey, apiSecretKey and jwtSecret, shared by every Airflow process of one install."""
    return {"fernetKey": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
            "apiSecretKey": secrets.token_urlsafe(32), "jwtSecret": secrets.token_urlsafe(32)}


def render(flavour: str, namespace: str, extra_values: list[Path], release: str = "airflow") -> list[dict]:
    """The chart's manifests for ``helm-values/<flavour>-ha.yaml`` plus ``extra_values``."""
    cmd = [minihelm(), release, str(CHART), namespace, "-f", str(VALUES / f"{flavour}-ha.yaml")]
    for path in extra_values:
        cmd += ["-f", str(path)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise InstallError(f"the chart refused the values: {out.stderr.strip()[-2000:]}")
    docs = [doc for doc in yaml.safe_load_all(out.stdout) if doc]
    return docs + (witness_rbac(release, namespace) if flavour == "fenced" else [])


def witness_rbac(release: str, namespace: str) -> list[dict]:
    """``helm-values/witness-rbac.yaml`` as an operator applies it beside the chart: in the release's
    namespace, bound to the release's scheduler ServiceAccount."""
    docs = [doc for doc in yaml.safe_load_all(WITNESS_RBAC.read_text()) if doc]
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects", ()):
            subject.update(name=f"{release}-scheduler", namespace=namespace)
    return docs


def postgres_manifests(image: str = POSTGRES_IMAGE) -> list[dict]:
    """``kind-config/postgres.yaml`` with the locally built image (the official one cannot be pulled)."""
    docs = [doc for doc in yaml.safe_load_all(POSTGRES.read_text()) if doc]
    for doc in docs:
        if doc["kind"] == "Deployment":
            for ctr in doc["spec"]["template"]["spec"]["containers"]:
                ctr["image"], ctr["imagePullPolicy"] = image, "Never"
    return docs


@dataclass
class Cluster:
    """kubectl against one kubeconfig; every call has a timeout and raises with its output."""

    kubeconfig: str
    kubectl_bin: str = field(default_factory=lambda: shutil.which("kubectl") or "kubectl")

    def run(self, *args: str, stdin: str | None = None, timeout: float = 120, check: bool = True) -> str:
        env = {**os.environ, "KUBECONFIG": self.kubeconfig}
        out = subprocess.run([self.kubectl_bin, *args], input=stdin, capture_output=True, text=True,
                             timeout=timeout, env=env)
        if check and out.returncode != 0:
            raise InstallError(f"kubectl {' '.join(args[:4])}: {out.stderr.strip()[-2000:]}")
        return out.stdout

    def apply(self, docs: list[dict], namespace: str) -> None:
        self.run("apply", "--server-side", "--force-conflicts", "--field-manager", "fenced-k8s-repro",
                 "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(docs), timeout=300)

    def get(self, kind: str, namespace: str, *names: str, selector: str | None = None) -> dict:
        args = ["get", kind, *names, "-n", namespace, "-o", "json"]
        if selector:
            args += ["-l", selector]
        return json.loads(self.run(*args))

    def airflow(self, namespace: str, *args: str, target: str = "deploy/airflow-scheduler",
                container: str = "scheduler", timeout: float = 180) -> str:
        """An Airflow CLI command in a running component, through the image's entrypoint."""
        return self.run("exec", "-n", namespace, target, "-c", container, "--", "/entrypoint", "airflow", *args,
                        timeout=timeout)


def wait(what: str, predicate, timeout: float, interval: float = 2.0, describe=None):
    """Poll ``predicate`` until it returns a truthy value; on timeout raise with ``describe()``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = describe() if describe else ""
            raise InstallError(f"timed out after {timeout:.0f}s waiting for {what}\n{detail}")
        time.sleep(interval)


def _ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def pods_summary(cluster: Cluster, namespace: str) -> str:
    pods = cluster.get("pods", namespace)["items"]
    lines = []
    for pod in pods:
        st = pod.get("status", {})
        states = [f"{c['name']}:{next(iter(c.get('state', {})), '?')}"
                  f"{'(' + c['state'].get('waiting', {}).get('reason', '') + ')' if 'waiting' in c.get('state', {}) else ''}"
                  f" restarts={c.get('restartCount', 0)}"
                  for c in st.get("initContainerStatuses", []) + st.get("containerStatuses", [])]
        lines.append(f"{pod['metadata']['name']}: {st.get('phase')} ready={_ready(pod)} {' '.join(states)}")
    return "\n".join(lines)


def diagnostics(cluster: Cluster, namespace: str) -> str:
    """Pods, events and the last log lines of containers not ready, for a failed install or run."""
    try:
        parts = [pods_summary(cluster, namespace),
                 cluster.run("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False)[-6000:]]
        for pod in cluster.get("pods", namespace)["items"]:
            st = pod.get("status", {})
            if st.get("phase") != "Succeeded" and not all(c.get("ready") for c in st.get("containerStatuses", [])):
                name = pod["metadata"]["name"]
                logs = cluster.run("logs", "-n", namespace, name, "--all-containers", "--tail=40", check=False)
                parts.append(f"--- {name}\n{logs[-4000:]}")
        return "\n".join(parts)
    except Exception as exc:  # diagnostics only
        return f"(diagnostics failed: {exc})"


@dataclass
class Install:
    """One Airflow release on a cluster, with timings of each step (seconds)."""

    cluster: Cluster
    flavour: str
    namespace: str = "airflow"
    values_dir: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def _step(self, name: str, fn, *args, **kwargs):
        t0 = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            self.timings[name] = round(time.monotonic() - t0, 1)

    def run(self, ready_timeout: float = 900) -> "Install":
        if self.flavour not in EXECUTORS:
            raise InstallError(f"flavour must be one of {sorted(EXECUTORS)}, not {self.flavour!r}")
        ns = self.namespace
        self.cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}], ns)
        self._step("postgres", self._postgres)
        secrets_file = Path(self.values_dir or ROOT / "out" / "node") / f"{ns}-secrets.yaml"
        secrets_file.parent.mkdir(parents=True, exist_ok=True)
        if not secrets_file.exists():
            secrets_file.write_text(yaml.safe_dump(generated_secrets()))
            secrets_file.chmod(0o600)
        docs = self._step("render", render, self.flavour, ns, [NODE_VALUES, secrets_file])
        self._step("apply", self.cluster.apply, docs, ns)
        self._step("migrations", self._wait_job, "airflow-run-airflow-migrations", ready_timeout)
        self._step("ready", self._wait_ready, ready_timeout)
        return self

    def _postgres(self) -> None:
        self.cluster.apply(postgres_manifests(), self.namespace)
        wait("the metadata database", lambda: self._deploy_ready("airflow-metadata-db"), 180,
             describe=lambda: pods_summary(self.cluster, self.namespace))

    def _deploy_ready(self, name: str) -> bool:
        d = self.cluster.get("deploy", self.namespace, name)
        want = d["spec"].get("replicas", 1)
        st = d.get("status", {})
        return (st.get("readyReplicas", 0) == want and st.get("updatedReplicas", 0) == want
                and st.get("observedGeneration", 0) >= d["metadata"]["generation"])

    def _wait_job(self, name: str, timeout: float) -> None:
        def done():
            st = self.cluster.get("job", self.namespace, name).get("status", {})
            if any(c["type"] == "Failed" and c["status"] == "True" for c in st.get("conditions", [])):
                raise InstallError(f"job {name} failed:\n{pods_summary(self.cluster, self.namespace)}")
            return st.get("succeeded", 0) >= 1
        wait(f"job {name}", done, timeout, describe=lambda: pods_summary(self.cluster, self.namespace))

    def components(self) -> list[tuple[str, str]]:
        out = [("deploy", d["metadata"]["name"]) for d in
               self.cluster.get("deploy", self.namespace, selector="tier=airflow")["items"]]
        out += [("statefulset", s["metadata"]["name"]) for s in
                self.cluster.get("statefulset", self.namespace, selector="tier=airflow")["items"]]
        return out

    def _wait_ready(self, timeout: float) -> None:
        def all_ready():
            for kind, name in self.components():
                if kind == "deploy" and not self._deploy_ready(name):
                    return False
                if kind == "statefulset":
                    s = self.cluster.get(kind, self.namespace, name)
                    if s.get("status", {}).get("readyReplicas", 0) != s["spec"].get("replicas", 1):
                        return False
            return True
        wait("every Airflow component Ready", all_ready, timeout, interval=5,
             describe=lambda: pods_summary(self.cluster, self.namespace))

    # ---- what the running install says ----------------------------------------------------
    def executor(self) -> str:
        return self.cluster.airflow(self.namespace, "config", "get-value", "core", "executor").strip().splitlines()[-1]

    def alive_schedulers(self) -> int:
        """SchedulerJobs heartbeating now, as ``airflow jobs check`` counts them."""
        out = self.cluster.run("exec", "-n", self.namespace, "deploy/airflow-scheduler", "-c", "scheduler", "--",
                               "/entrypoint", "airflow", "jobs", "check", "--job-type", "SchedulerJob",
                               "--allow-multiple", "--limit", "10", check=False, timeout=180)
        for line in out.splitlines():
            if line.startswith("Found ") and "alive job" in line:
                return int(line.split()[1])
        return 0


@dataclass
class RestApi:
    """The api-server's public REST API through its Service, with a token from the auth manager."""

    base_url: str
    username: str = "admin"
    password: str = "admin"
    _token: str | None = None

    def _call(self, method: str, path: str, body: dict | None = None, auth: bool = True) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        req = urllib.request.Request(self.base_url + path, method=method, headers=headers,
                                     data=json.dumps(body).encode() if body is not None else None)
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"{}")

    def token(self) -> str:
        """FAB: POST user and password; SimpleAuthManager with every user an admin: GET."""
        if self._token is None:
            try:
                answer = self._call("POST", "/auth/token", {"username": self.username, "password": self.password},
                                    auth=False)
            except urllib.error.HTTPError:
                answer = self._call("GET", "/auth/token", auth=False)
            self._token = answer["access_token"]
        return self._token

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        self._call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
        run = self._call("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})
        return run["dag_run_id"]

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self._call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"]

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        return self._call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=1000")[
            "task_instances"]

    def dag_known(self, dag_id: str) -> bool:
        try:
            self._call("GET", f"/api/v2/dags/{dag_id}")
            return True
        except (urllib.error.URLError, OSError):
            return False

    def clear(self, dag_id: str, run_id: str, task_ids: list[str] | None = None) -> list[dict]:
        """Clear the run's task instances (all, or ``task_ids``) as a user would; the cleared TIs."""
        body = {"dry_run": False, "dag_run_id": run_id, "only_failed": False, "reset_dag_runs": True}
        if task_ids is not None:
            body["task_ids"] = task_ids
        return self._call("POST", f"/api/v2/dags/{dag_id}/clearTaskInstances", body)["task_instances"]

    def alive_scheduler_jobs(self) -> list[dict]:
        """SchedulerJobs heartbeating now ({id, hostname, ...})."""
        return self._call("GET", "/api/v2/jobs?job_type=SchedulerJob&is_alive=true&limit=100")["jobs"]


def api_server_url(cluster: Cluster, namespace: str) -> str:
    svc = cluster.get("svc", namespace, "airflow-api-server")
    return f"http://{svc['spec']['clusterIP']}:8080"
