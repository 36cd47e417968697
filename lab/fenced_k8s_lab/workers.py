"""Worker pods as real containers on an existing cluster (``fenced-k8s-repro --kubeconfig``).

On a real cluster the cluster's own kubelet runs the pods the schedulers create, in the project
image, so the lab neither starts nor finishes them. What it adds is what the process kubelet gave
the emulator runs:

* **A pod template** per deployment: the project image, the deployment's worker settings (the
  execution API at this machine's address on the pod network), the DAGs and a gate through a
  ``hostPath`` volume (the lab's Airflow processes run on this machine, which must be the node or
  share its file system), and an init container that holds the pod Pending for the scenario's
  start delay. The delay is real time in a real Pending phase (the init container runs; the
  kubelet reports ``PodInitializing``); its length is the scenario's model of an image pull,
  drawn by the lab when it first sees the pod and written to the gate.
* **An observer** that watches the namespace and records, per pod, what ``evidence`` needs: when
  it was seen, when its container started and finished, its exit code, when its deletion began,
  and its container output (followed as it runs, so a deleted pod keeps its evidence).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from fenced_k8s_lab.kubelet import START_DELAY_ANNOTATION, workload_identity

IMAGE = "localhost/fenced-k8s-executor:dev"
DEPLOYMENT_LABEL = "lab.fenced-k8s-executor.io/deployment"
#: One value per lab run: the observer sees this run's pods only, not an earlier run's still going.
RUN_LABEL = "lab.fenced-k8s-executor.io/run"
MAIN, NEIGHBOUR = "main", "neighbour"  # the deployment label's values
#: Environment of the lab's host processes that means nothing (or the wrong thing) inside a pod.
_HOST_ONLY = ("AIRFLOW__DATABASE__", "AIRFLOW__METRICS__", "AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE",
              "AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE", "AIRFLOW__LOGGING__BASE_LOG_FOLDER")
#: Waits for the lab to write this pod's start delay, then sleeps it (coreutils sleep: fractions).
_GATE_SCRIPT = 'f="$LAB_GATE/$POD_NAME"; while [ ! -s "$f" ]; do sleep 0.2; done; sleep "$(cat "$f")"'


def shared_dir(prefix: str = "fenced-lab-") -> Path:
    """A directory on this machine that the image's user (uid 50000) may read through hostPath."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


def local_addresses() -> set[str]:
    """IPv4 addresses of this machine's interfaces (``ip -o -4 addr``), for the worker host check."""
    import subprocess

    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {line.split()[3].split("/")[0] for line in out.splitlines() if len(line.split()) > 3}


def worker_host(node_addresses: list[str], given: str | None = None) -> str:
    """The address pods reach this machine by: ``given``, or the cluster node's InternalIP when it
    is one of this machine's own addresses (``../shared/node``: the bridge 10.88.0.1)."""
    if given:
        return given
    local = local_addresses()
    for address in node_addresses:
        if address in local:
            return address
    raise SystemExit(f"no node address of the cluster ({', '.join(node_addresses) or 'none'}) is an address of this "
                     "machine: pass --worker-host, the address pods reach this machine by")


def pod_template(stack_env: dict[str, str], *, image: str, share: Path, gate: Path, deployment: str, run: str,
                 start_delay: float | None = None) -> dict:
    """The worker pod template of one lab deployment, as a chart's pod template file would be."""
    env = [{"name": k, "value": v} for k, v in sorted(stack_env.items())
           if k.startswith("AIRFLOW__") and not k.startswith(_HOST_ONLY)]
    mount = {"name": "lab-share", "mountPath": str(share), "readOnly": True}
    metadata: dict[str, Any] = {"name": "lab-worker", "labels": {DEPLOYMENT_LABEL: deployment, RUN_LABEL: run}}
    if start_delay is not None:
        metadata["annotations"] = {START_DELAY_ANNOTATION: str(start_delay)}
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 10,
            "initContainers": [{
                "name": "lab-start-delay", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", _GATE_SCRIPT],
                "env": [{"name": "LAB_GATE", "value": str(gate)},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "volumeMounts": [mount],
            }],
            "containers": [{"name": "base", "image": image, "imagePullPolicy": "IfNotPresent",
                            "env": env, "volumeMounts": [mount]}],
            "volumes": [{"name": "lab-share", "hostPath": {"path": str(share), "type": "Directory"}}],
        },
    }


def _container(pod: dict, name: str = "base") -> dict:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == name:
            return status
    return {}


class PodObserver:
    """Watches one namespace's worker pods and keeps a record per pod uid in the shape of the
    process kubelet's ``records()``; writes each pod's start delay to the gate when first seen."""

    def __init__(self, backend: Any, namespace: str, workdir: Path, gate: Path, run: str,
                 start_delay: Callable[[dict], float] = lambda pod: 0.5):
        self.backend, self.namespace = backend, namespace
        self.selector = f"kubernetes_executor=True,{RUN_LABEL}={run}"
        self.workdir, self.gate, self.start_delay = workdir, gate, start_delay
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._records: dict[str, dict] = {}
        self._followers: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lab-pod-observer", daemon=True)

    def start(self) -> "PodObserver":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=40)
        for follower in list(self._followers.values()):
            follower.join(timeout=5)

    def records(self) -> dict[str, dict]:
        with self._lock:
            return {uid: dict(rec) for uid, rec in self._records.items()}

    def deletions(self) -> list[dict]:
        """Every pod whose deletion the observer saw begin {ts, name, uid, deployment}."""
        with self._lock:
            return [{"ts": r["deleted_at"], "name": r["name"], "uid": r["uid"], "deployment": r["deployment"]}
                    for r in self._records.values() if r.get("deleted_at") is not None]

    # ---- watching -------------------------------------------------------------------------
    def _loop(self) -> None:
        from kubernetes import watch

        v1 = self.backend._v1()
        while not self._stop.is_set():
            try:
                listing = v1.list_namespaced_pod(self.namespace, label_selector=self.selector)
                present = set()
                for pod in listing.items:
                    obj = v1.api_client.sanitize_for_serialization(pod)
                    present.add(obj["metadata"]["uid"])
                    self.observe("MODIFIED", obj)
                self._gone_unless(present)
                stream = watch.Watch().stream(v1.list_namespaced_pod, self.namespace, label_selector=self.selector,
                                              resource_version=listing.metadata.resource_version, timeout_seconds=5,
                                              allow_watch_bookmarks=False)
                for event in stream:
                    self.observe(event["type"], v1.api_client.sanitize_for_serialization(event["object"]))
                    if self._stop.is_set():
                        break
            except Exception:  # noqa: BLE001 - 410 Gone, a dropped connection: list again
                time.sleep(0.5)

    def _gone_unless(self, present: set[str]) -> None:
        now = time.time()
        with self._lock:
            for uid, rec in self._records.items():
                if uid not in present and rec.get("deleted_at") is None and rec.get("finished_at") is None:
                    rec["deleted_at"] = now

    def observe(self, kind: str, pod: dict, now: float | None = None) -> None:
        """Fold one watch event into the pod's record (pure bookkeeping plus the gate file)."""
        now = time.time() if now is None else now
        md = pod["metadata"]
        with self._lock:
            rec = self._records.get(md["uid"])
            if rec is None:
                ti_id, iat = workload_identity(pod)
                rec = self._records[md["uid"]] = {
                    "name": md["name"], "uid": md["uid"], "annotations": md.get("annotations") or {},
                    "deployment": (md.get("labels") or {}).get(DEPLOYMENT_LABEL), "ti_id": ti_id,
                    "launch_iat": iat, "seen_at": now, "log_file": str(self.workdir / f"{md['name']}.log")}
                if not md.get("deletionTimestamp") and kind != "DELETED":
                    self._open_gate(pod)
            base = _container(pod)
            state = base.get("state") or {}
            if ("running" in state or "terminated" in state) and rec.get("started_at") is None:
                rec["started_at"] = now
                self._follow(rec)
            if "terminated" in state and rec.get("finished_at") is None:
                rec["finished_at"], rec["exit_code"] = now, (state["terminated"] or {}).get("exitCode")
            if (md.get("deletionTimestamp") or kind == "DELETED") and rec.get("deleted_at") is None:
                rec["deleted_at"] = now

    def _open_gate(self, pod: dict) -> None:
        ann = (pod["metadata"].get("annotations") or {}).get(START_DELAY_ANNOTATION)
        delay = float(ann) if ann is not None else float(self.start_delay(pod))
        path = self.gate / pod["metadata"]["name"]
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{max(0.0, delay):.2f}\n")
        tmp.chmod(0o644)
        tmp.rename(path)

    def _follow(self, rec: dict) -> None:
        """Stream the container's output to its log file until the container ends."""
        def run() -> None:
            try:
                resp = self.backend._v1().read_namespaced_pod_log(
                    rec["name"], self.namespace, container="base", follow=True, _preload_content=False)
                with open(rec["log_file"], "ab") as out:
                    for chunk in resp.stream(4096):
                        out.write(chunk)
            except Exception:  # noqa: BLE001 - the pod went before its log could be read
                pass

        thread = threading.Thread(target=run, name=f"lab-log-{rec['name']}", daemon=True)
        self._followers[rec["uid"]] = thread
        thread.start()


class ClusterWorkers:
    """The real cluster's kubelet as the lab's worker runner: pod templates, gate and observer
    for one run (one namespace, one or two deployments)."""

    def __init__(self, backend: Any, namespace: str, run_dir: Path, *, image: str = IMAGE):
        self.backend, self.namespace, self.image = backend, namespace, image
        self.run = uuid.uuid4().hex[:12]
        self.share = shared_dir()
        self.gate = self.share / "gate"
        self.gate.mkdir(mode=0o755)
        self.observer = PodObserver(backend, namespace, run_dir / "pods", self.gate, self.run)

    def dags_folder(self, name: str) -> Path:
        """Where a deployment's DAG files go: read by its host processes and its pods alike."""
        path = self.share / name / "dags"
        path.mkdir(parents=True, mode=0o755)
        path.parent.chmod(0o755)
        return path

    def template(self, stack: Any, deployment: str, start_delay: float | None = None) -> None:
        stack.pod_template.write_text(json.dumps(pod_template(
            stack.worker_env(), image=self.image, share=self.share, gate=self.gate, deployment=deployment,
            run=self.run, start_delay=start_delay), indent=1))

    def start(self, start_delay: Callable[[dict], float]) -> "ClusterWorkers":
        self.observer.start_delay = start_delay
        self.observer.start()
        return self

    def evidence(self, stack: Any, neighbour: Any, prefix: str) -> dict[str, Any]:
        """What the API audit would have said: who deleted which pod (the schedulers' own log
        lines) and which deployment created it (the pod's deployment label)."""
        from fenced_k8s_lab.evidence import log_deleters, observed_deletes

        logs: dict[str, list[Path]] = {}
        for deployment, who in ((stack, ""), (neighbour, prefix)):
            for path in sorted(deployment.log_dir.glob("scheduler-*.log")) if deployment is not None else ():
                logs.setdefault(who + path.name.split(".")[0], []).append(path)
        records = self.records().values()
        creators = {r["name"]: (prefix if r["deployment"] == NEIGHBOUR else "") + "scheduler" for r in records}
        return {"deletes": observed_deletes(self.observer.deletions(), log_deleters(logs)), "creators": creators}

    def records(self) -> dict[str, dict]:
        return self.observer.records()

    def stop(self) -> None:
        self.observer.stop()
        shutil.rmtree(self.share, ignore_errors=True)


def node_addresses(backend: Any) -> list[str]:
    """InternalIP addresses of the cluster's nodes."""
    nodes = backend._v1().list_node().items
    return [a.address for n in nodes for a in (n.status.addresses or []) if a.type == "InternalIP"]


def image_env(image: str) -> dict[str, str]:
    """The executor's worker image settings, as the chart sets them from ``images.airflow``."""
    repository, _, tag = image.rpartition(":")
    if not repository or "/" in tag:
        repository, tag = image, "latest"
    return {"AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_REPOSITORY": repository,
            "AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_TAG": tag}

