"""A "process kubelet": runs pods from any Kubernetes API as local process groups.

The lab has no nodes, so this stands in for one. It watches a namespace with the real
`kubernetes` client (so it works against the emulator and, unchanged, against a real cluster)
and, for each unbound Pending pod: waits a start delay (to model quota/autoscaler pressure),
waits for a node slot (capacity), binds the pod, runs the first container's `command + args`
with the pod's env, and reports Pending -> Running -> Succeeded/Failed through `/status`, as a
real kubelet would. Deletion follows the kubelet's contract: SIGTERM, grace period, SIGKILL,
then the final delete with gracePeriodSeconds=0 and a uid precondition (both in the
DeleteOptions body: a real kube-apiserver ignores ?gracePeriodSeconds= when a body is sent).

Against a real kube-apiserver (tests/lab/test_kubelet.py runs both) everything goes through the
API: `pods/binding`, `pods/status` merge patches, the final delete. Only pod output differs: the
emulator serves the kubelet's output file as `pods/log`; a real apiserver would proxy pods/log
to a kubelet on a Node object that does not exist (404), so read the file named by the pod's
record (`log_file`) instead.

Every pod leaves JSON-lines records (a full snapshot on each transition; the last line per uid
wins, see `read_records`) that the lab's measurements read.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Union

log = logging.getLogger(__name__)

START_DELAY_ANNOTATION = "lab.fenced-k8s-executor.io/start-delay"
#: ``ProcessKubelet(hold=...)``: no hold (pods run their command), or where every pod is held.
HOLDS = (None, "pending", "running")
DelaySpec = Union[float, Callable[[dict], float], "LongTailDelay", None]


def _now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class LongTailDelay:
    """Seeded long-tailed start delays (most pods start fast, a few wait long), capped.

    kind="lognormal": median `scale`, shape `sigma`; kind="pareto": minimum `scale`, tail `alpha`;
    kind="uniform": between `scale` and `cap` (an image pull of 35-70 s: scale=35,cap=70).
    """

    def __init__(self, kind: str = "lognormal", scale: float = 1.0, sigma: float = 1.0,
                 alpha: float = 1.5, cap: float = 120.0, seed: int | None = 0):
        if kind not in ("lognormal", "pareto", "uniform"):
            raise ValueError(f"unknown delay distribution {kind!r}")
        self.kind, self.scale, self.sigma, self.alpha, self.cap = kind, scale, sigma, alpha, cap
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def __call__(self, pod: dict) -> float:
        with self._lock:
            if self.kind == "lognormal":
                v = self._rng.lognormvariate(math.log(self.scale), self.sigma)
            elif self.kind == "uniform":
                v = self._rng.uniform(self.scale, self.cap)
            else:
                v = self.scale * self._rng.paretovariate(self.alpha)
        return min(v, self.cap)

    @classmethod
    def parse(cls, text: str, seed: int | None = 0) -> "LongTailDelay":
        """'lognormal:scale=2,sigma=1,cap=60' -> LongTailDelay."""
        kind, _, rest = text.partition(":")
        kw = {k: float(v) for k, v in (p.split("=") for p in rest.split(",") if p)}
        return cls(kind, seed=seed, **kw)


def read_records(path: str | os.PathLike) -> dict[str, dict]:
    """Latest record per pod uid from a kubelet records file."""
    out: dict[str, dict] = {}
    p = Path(path)
    if p.exists():
        for line in p.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                out[rec["uid"]] = rec
    return out


def default_base_env() -> dict[str, str]:
    """A small environment for pod processes; this interpreter's bin dir first so `python` works."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV", "TZ")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    return env


def _field_ref(pod: dict, path: str) -> str:
    md, st = pod.get("metadata", {}), pod.get("status", {})
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return (md.get(m.group(1)) or {}).get(m.group(2), "")
    simple = {
        "metadata.name": md.get("name"), "metadata.namespace": md.get("namespace"),
        "metadata.uid": md.get("uid"), "spec.nodeName": pod.get("spec", {}).get("nodeName"),
        "spec.serviceAccountName": pod.get("spec", {}).get("serviceAccountName"),
        "status.podIP": st.get("podIP") or "127.0.0.1", "status.hostIP": st.get("hostIP") or "127.0.0.1",
        "status.podIPs": st.get("podIP") or "127.0.0.1", "status.hostIPs": "127.0.0.1",
    }
    if path in ("metadata.labels", "metadata.annotations"):
        return "\n".join(f'{k}="{v}"' for k, v in sorted((md.get(path.split(".")[1]) or {}).items()))
    return str(simple.get(path) or "")


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes $(VAR) expansion ($$ escapes; unknown references stay as written)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


def pod_env(pod: dict, base_env: dict[str, str], node_name: str) -> dict[str, str]:
    """The process environment: base env, HOSTNAME, then the container's env in order."""
    env = dict(base_env)
    env["HOSTNAME"] = pod["metadata"]["name"]
    pod = {**pod, "spec": {**pod.get("spec", {}), "nodeName": node_name}}
    for var in (pod["spec"]["containers"][0].get("env") or []):
        if "value" in var:
            env[var["name"]] = _expand(str(var["value"]), env)
        elif (ref := (var.get("valueFrom") or {}).get("fieldRef")):
            env[var["name"]] = _field_ref(pod, ref.get("fieldPath", ""))
        else:
            env.setdefault(var["name"], "")  # secret/configMap refs: not modelled
    return env


def pod_workload(pod: dict) -> dict | None:
    """The pod's `--json-string` workload (the ExecuteTask the scheduler handed the executor), or None."""
    for ctr in (pod.get("spec") or {}).get("containers") or []:
        args = [*(ctr.get("command") or []), *(ctr.get("args") or [])]
        if "--json-string" not in args:
            continue
        try:
            workload = json.loads(args[args.index("--json-string") + 1])
        except (IndexError, TypeError, ValueError):
            return None
        return workload if isinstance(workload, dict) else None
    return None


def workload_identity(pod: dict) -> tuple[str | None, int | None]:
    """(TI id, JWT issued-at) of the pod's `--json-string` workload: which task instance the pod
    runs and when its launch was handed to the executor (stock and fenced pods alike)."""
    workload = pod_workload(pod)
    if workload is not None:
        try:
            ti_id = workload["ti"]["id"]
        except (KeyError, TypeError):
            return None, None
        try:
            payload = workload["token"].split(".")[1]
            claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
            return ti_id, int(claims["iat"])
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            return ti_id, None
    return None, None


class _PodRun:
    """Per-pod state shared by the watch thread and the pod's worker thread."""

    def __init__(self, pod: dict):
        md = pod["metadata"]
        self.pod = pod
        self.name, self.uid = md["name"], md["uid"]
        self.deleting = threading.Event()   # deletionTimestamp seen or object gone
        self.gone = False                    # the API object no longer exists
        self.grace: float = float(pod.get("spec", {}).get("terminationGracePeriodSeconds", 30) or 0)
        self.proc: subprocess.Popen | None = None
        self.finished = False
        self.held = threading.Lock()  # hold mode: one step of this pod at a time
        self.task_token: str | None = None  # hold mode: the execution token /run handed back
        self.record: dict[str, Any] = {
            "name": self.name, "namespace": md.get("namespace"), "uid": self.uid,
            "labels": md.get("labels") or {}, "annotations": md.get("annotations") or {},
            "created": md.get("creationTimestamp"), "seen_at": time.time(), "start_delay": None,
            "ti_id": workload_identity(pod)[0], "launch_iat": workload_identity(pod)[1],
            "bound_at": None, "started_at": None, "pid": None, "finished_at": None, "exit_code": None,
            "reason": None, "phase": "Pending", "deletion_seen_at": None, "deleted_at": None,
            "deleted_before_start": False, "log_file": None,
        }


class ProcessKubelet:
    """Run pods of one namespace as local processes. `start()`/`stop()` or use as a context manager.

    start_delay: seconds, a callable(pod dict) -> seconds, a `LongTailDelay`, or None; the pod
    annotation `lab.fenced-k8s-executor.io/start-delay` overrides it per pod.
    max_running: node capacity; pods beyond it stay Pending (bound only when a slot frees).
    emulator_logs: serve pod output through the emulator's log controls (None: auto-detect).
    watch_timeout: seconds per watch request; each ended watch is followed by a relist (resync).
    delay_stage: where the start delay is spent. "scheduling" (quota, autoscaler): the pod waits
    unbound, so deleting it removes it at once. "pulling" (an image pull): bound at once and
    Pending with its container waiting in ContainerCreating, as a real kubelet reports it.
    images: the images the node holds (None: every image). A missing one is never "pulled": the
    container waits in ErrImageNeverPull (pull policy Never) or ErrImagePull, then ImagePullBackOff.

    A bound pod deleted before its container started ends as a real kubelet ends it (checked
    against a real node by tests/conformance/test_lifecycle.py): phase Failed, its container
    terminated with ContainerStatusUnknown (137), then the final delete.

    hold: run no process at all, for measurements with thousands of pods in flight on two cores.
    "pending": every pod stays Pending and unbound. "running": every pod is bound and Running, and
    its task starts as a worker's first call starts it (``PATCH /execution/task-instances/{id}/run``
    with the workload's token, at the pod env's execution API URL), so Airflow counts it running;
    then nothing, until ``release()`` (SIGUSR1 from the command line) finishes every held pod as
    a worker that succeeded would: ``/state`` success, then the pod Succeeded. A held pod that is
    deleted ends at once (exit 143, as SIGTERM ends a container). ``hold_workers`` threads make
    the calls, not a thread per pod.
    """

    def __init__(self, kubeconfig: str | os.PathLike | None = None, namespace: str = "default", *,
                 api_client=None, node_name: str = "lab-node", start_delay: DelaySpec = 0.0,
                 max_running: int | None = None, base_env: dict[str, str] | None = None,
                 workdir: str | os.PathLike | None = None, records_path: str | os.PathLike | None = None,
                 emulator_logs: bool | None = None, watch_timeout: int = 30,
                 delay_stage: str = "scheduling", images: set[str] | None = None,
                 hold: str | None = None, hold_workers: int = 8):
        from concurrent.futures import ThreadPoolExecutor

        from kubernetes import client, config

        if api_client is None:
            api_client = config.new_client_from_config(config_file=str(kubeconfig) if kubeconfig else None)
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.namespace, self.node_name = namespace, node_name
        self.start_delay = start_delay
        self.base_env = default_base_env() if base_env is None else dict(base_env)
        self.workdir = Path(workdir) if workdir else Path.cwd() / f"kubelet-{node_name}"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.records_path = Path(records_path) if records_path else self.workdir / "pods.jsonl"
        self.emulator_logs = emulator_logs
        self.watch_timeout = watch_timeout
        if delay_stage not in ("scheduling", "pulling"):
            raise ValueError(f"delay_stage must be 'scheduling' or 'pulling', not {delay_stage!r}")
        self.delay_stage = delay_stage
        self.images = None if images is None else set(images)
        if hold not in HOLDS:
            raise ValueError(f"hold must be one of {HOLDS}, not {hold!r}")
        self.hold = hold
        self._hold_pool = ThreadPoolExecutor(hold_workers, thread_name_prefix="kubelet-hold") if hold else None
        self._slots = threading.BoundedSemaphore(max_running) if max_running else None
        self._runs: dict[str, _PodRun] = {}      # uid -> run
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp = None

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> "ProcessKubelet":
        if self.emulator_logs is None:
            self.emulator_logs = self._probe_emulator()
        self._thread = threading.Thread(target=self._watch_loop, name=f"kubelet-{self.node_name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, kill_pods: bool = True) -> None:
        """Stop watching; SIGKILL still-running pod processes (the 'node' goes away)."""
        self._stop.set()
        _interrupt(self._resp)
        if self._thread:
            self._thread.join(timeout=5)
        if self._hold_pool is not None:
            self._hold_pool.shutdown(wait=False, cancel_futures=True)
        if kill_pods:
            with self._lock:
                runs = list(self._runs.values())
            for run in runs:
                if run.proc and run.proc.poll() is None:
                    _killpg(run.proc, signal.SIGKILL)

    def __enter__(self) -> "ProcessKubelet":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def records(self) -> dict[str, dict]:
        """Latest record per uid (from memory, includes pods still running)."""
        with self._lock:
            return {uid: dict(r.record) for uid, r in self._runs.items()}

    def running_pids(self) -> dict[str, int]:
        with self._lock:
            return {r.name: r.proc.pid for r in self._runs.values() if r.proc and r.proc.poll() is None}

    # ---- API helpers ---------------------------------------------------------------------
    def _retry(self, what: str, fn: Callable, *args, tries: int = 8, **kw):
        """Call the API, retrying 429/5xx/connection errors with backoff; 404/409 raise to the caller."""
        from kubernetes.client.exceptions import ApiException

        delay = 0.2
        for attempt in range(tries):
            try:
                return fn(*args, **kw)
            except ApiException as e:
                if e.status in (404, 409, 400, 410, 422) or attempt == tries - 1:
                    raise
                log.info("%s: API error %s, retrying", what, e.status)
            except Exception as e:  # connection refused/reset while the emulator restarts
                if attempt == tries - 1 or self._stop.is_set():
                    raise
                log.info("%s: %s, retrying", what, e)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _patch_status(self, run: _PodRun, status: dict) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            self._retry("patch status", self.core.patch_namespaced_pod_status, run.name, self.namespace,
                        {"status": status}, _content_type="application/merge-patch+json")
            return True
        except ApiException as e:
            log.info("status patch for %s failed: %s", run.name, e.status)
            return False
        except Exception as e:
            log.warning("status patch for %s failed: %s", run.name, e)
            return False

    def _final_delete(self, run: _PodRun) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        if not run.gone:
            try:
                self._retry("final delete", self.core.delete_namespaced_pod, run.name, self.namespace,
                            body=client.V1DeleteOptions(grace_period_seconds=0,
                                                        preconditions=client.V1Preconditions(uid=run.uid)))
            except ApiException as e:
                if e.status not in (404, 409):
                    log.warning("final delete of %s failed: %s", run.name, e.status)
            except Exception as e:
                log.warning("final delete of %s failed: %s", run.name, e)
        run.record["deleted_at"] = time.time()
        self._write(run)

    def _probe_emulator(self) -> bool:
        try:
            resp = self.api_client.call_api("/_emulator/state", "GET", auth_settings=["BearerToken"],
                                            _preload_content=False, _return_http_data_only=True,
                                            _request_timeout=5)
            return resp.status == 200
        except Exception:
            return False

    def _register_log(self, run: _PodRun, path: Path) -> bool:
        """Point the emulator's pods/log at the output file (it reads it live)."""
        if not self.emulator_logs:
            return False
        try:
            resp = self.api_client.call_api(f"/_emulator/logfiles/{self.namespace}/{run.name}", "POST",
                                            header_params={"Content-Type": "application/json"},
                                            body={"path": str(path.resolve())}, auth_settings=["BearerToken"],
                                            _preload_content=False, _return_http_data_only=True,
                                            _request_timeout=5)
            return resp.status == 200
        except Exception as e:
            log.debug("log file registration for %s failed: %s", run.name, e)
            return False

    def _push_log(self, run: _PodRun, text: str) -> None:
        """Fallback for emulators without log files: append output chunks."""
        if not (self.emulator_logs and text):
            return
        try:
            self.api_client.call_api(f"/_emulator/logs/{self.namespace}/{run.name}", "POST",
                                     header_params={"Content-Type": "text/plain"}, body=text,
                                     auth_settings=["BearerToken"], _preload_content=False,
                                     _return_http_data_only=True, _request_timeout=5)
        except Exception as e:
            log.debug("log push for %s failed: %s", run.name, e)

    def _write(self, run: _PodRun) -> None:
        line = json.dumps(run.record, default=str)
        with self._lock, open(self.records_path, "a") as f:
            f.write(line + "\n")

    # ---- watch ---------------------------------------------------------------------------
    def _watch_loop(self) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        rv, backoff = None, 0.5
        while not self._stop.is_set():
            try:
                if rv is None:
                    resp = self.core.list_namespaced_pod(self.namespace, _preload_content=False,
                                                         _request_timeout=30)
                    body = json.loads(resp.data)
                    items = body.get("items") or []
                    for pod in items:
                        self._on_pod("ADDED", pod)
                    self._forget_missing({p["metadata"]["uid"] for p in items})
                    rv = body["metadata"].get("resourceVersion") or "0"
                self._resp = self.core.list_namespaced_pod(
                    self.namespace, watch=True, resource_version=rv, allow_watch_bookmarks=True,
                    timeout_seconds=self.watch_timeout, _preload_content=False,
                    _request_timeout=(10, self.watch_timeout + 30))
                for line in iter_resp_lines(self._resp):
                    if self._stop.is_set():
                        break
                    ev = json.loads(line)
                    obj = ev.get("object") or {}
                    if ev.get("type") == "ERROR":
                        log.info("watch ERROR %s: relisting", obj.get("code"))
                        rv = None
                        break
                    new_rv = obj.get("metadata", {}).get("resourceVersion")
                    if new_rv:
                        rv = new_rv
                    if ev.get("type") != "BOOKMARK":
                        self._on_pod(ev["type"], obj)
                else:  # the watch ended: relist, as an informer resync (and to notice a reset)
                    rv = None
                backoff = 0.5
            except Exception as e:
                if self._stop.is_set():
                    break
                status = getattr(e, "status", None)
                log.info("watch failed (%s %s); relisting in %.1fs", status, e.__class__.__name__, backoff)
                rv = None  # relist: also recovers from an emulator reset
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                self._resp = None

    def _forget_missing(self, present: set[str]) -> None:
        with self._lock:
            missing = [r for uid, r in self._runs.items() if uid not in present and not r.gone]
        for run in missing:
            self._on_gone(run)

    def _on_gone(self, run: _PodRun) -> None:
        run.gone = True
        if run.record["deletion_seen_at"] is None:
            run.record["deletion_seen_at"] = time.time()
        run.deleting.set()

    def _on_pod(self, kind: str, pod: dict) -> None:
        md, spec = pod.get("metadata", {}), pod.get("spec", {})
        uid = md.get("uid")
        if not uid:
            return
        with self._lock:
            run = self._runs.get(uid)
        if kind == "DELETED":
            if run:
                self._on_gone(run)
            return
        if run is not None:
            if md.get("deletionTimestamp") and not run.deleting.is_set():
                g = md.get("deletionGracePeriodSeconds")
                run.grace = float(run.grace if g is None else g)
                run.record["deletion_seen_at"] = time.time()
                run.deleting.set()
                if run.finished:  # process already over: only the final delete is left
                    threading.Thread(target=self._final_delete, args=(run,), daemon=True).start()
                elif self.hold:
                    self._hold_pool.submit(self._held_call, self._stop_held, run)
            return
        node = spec.get("nodeName")
        phase = (pod.get("status") or {}).get("phase", "Pending")
        if node and node != self.node_name:
            return
        if phase in ("Succeeded", "Failed"):
            if node and md.get("deletionTimestamp"):  # finished before we (re)started: finalize it
                run = _PodRun(pod)
                run.finished = True
                run.deleting.set()
                with self._lock:
                    self._runs[uid] = run
                threading.Thread(target=self._final_delete, args=(run,), daemon=True).start()
            return
        run = _PodRun(pod)
        with self._lock:
            self._runs[uid] = run
        if self.hold:
            if md.get("deletionTimestamp"):
                run.deleting.set()
            self._hold_pool.submit(self._held_call, self._hold_pod, run, bool(node), phase == "Running")
            return
        if node and phase == "Running":  # ours, but we have no process for it (kubelet restart)
            self._patch_status(run, {"phase": "Failed", "reason": "ContainerStatusUnknown",
                                     "message": "process kubelet lost the container"})
            run.finished = True
            return
        if md.get("deletionTimestamp"):
            run.deleting.set()
        threading.Thread(target=self._run_pod, args=(run, bool(node)), name=f"pod-{run.name}",
                         daemon=True).start()

    # ---- one pod -------------------------------------------------------------------------
    def _delay_for(self, pod: dict) -> float:
        ann = (pod["metadata"].get("annotations") or {}).get(START_DELAY_ANNOTATION)
        if ann is not None:
            return float(ann)
        d = self.start_delay
        if d is None:
            return 0.0
        return float(d(pod)) if callable(d) else float(d)

    def _run_pod(self, run: _PodRun, already_bound: bool) -> None:
        try:
            self._run_pod_inner(run, already_bound)
        except Exception:
            log.exception("kubelet worker for %s crashed", run.name)

    def _abandon_unstarted(self, run: _PodRun) -> None:
        run.record["deleted_before_start"] = True
        run.finished = True
        if run.record["bound_at"] is not None:  # bound pods need the kubelet to finish the deletion
            if not run.gone:
                run.record.update(phase="Failed", reason="ContainerStatusUnknown", exit_code=137)
                self._patch_status(run, {"phase": "Failed", "containerStatuses": [self._container_status(run, {
                    "terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown",
                                   "message": "The container could not be located when the pod was terminated"}})]})
            self._final_delete(run)
        else:
            run.record["deleted_at"] = run.record["deletion_seen_at"] or time.time()
            self._write(run)

    def _run_pod_inner(self, run: _PodRun, already_bound: bool) -> None:
        self._write(run)
        delay = self._delay_for(run.pod)
        run.record["start_delay"] = delay
        if self.delay_stage == "pulling" and not already_bound:
            if not self._bind(run):
                return
            already_bound = True
            self._patch_status(run, {"phase": "Pending", "containerStatuses": [
                self._container_status(run, {"waiting": {"reason": "ContainerCreating"}})]})
        if run.deleting.wait(delay):
            return self._abandon_unstarted(run)
        if self._slots is not None:
            while not self._slots.acquire(timeout=0.2):
                if run.deleting.is_set():
                    return self._abandon_unstarted(run)
                if self._stop.is_set():
                    return
        if self._stop.is_set():
            return
        try:
            if not already_bound and not self._bind(run):
                return
            run.record["bound_at"] = run.record["bound_at"] or time.time()
            if run.deleting.is_set():
                return self._abandon_unstarted(run)
            if not self._image_present(run):
                return self._wait_for_missing_image(run)
            self._execute(run)
        finally:
            if self._slots is not None:
                self._slots.release()

    def _bind(self, run: _PodRun) -> bool:
        """pods/binding to this node; False when the pod is not ours to run (gone, bound elsewhere)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            self._retry("bind", self.core.create_namespaced_pod_binding, run.name, self.namespace,
                        client.V1Binding(metadata=client.V1ObjectMeta(name=run.name),
                                         target=client.V1ObjectReference(kind="Node", name=self.node_name)),
                        _preload_content=False)
        except ApiException as e:
            log.info("bind %s failed: %s", run.name, e.status)
            if e.status == 404:  # deleted while we waited
                run.gone = True
                run.deleting.set()
                self._abandon_unstarted(run)
                return False
            with self._lock:  # bound elsewhere (another kubelet): not ours
                self._runs.pop(run.uid, None)
            return False
        run.record["bound_at"] = time.time()
        return True

    def _container_status(self, run: _PodRun, state: dict) -> dict:
        ctr = run.pod["spec"]["containers"][0]
        return {"name": ctr["name"], "image": ctr.get("image", ""), "imageID": "", "ready": False,
                "started": False, "restartCount": 0, "state": state}

    def _image_present(self, run: _PodRun) -> bool:
        return self.images is None or run.pod["spec"]["containers"][0].get("image") in self.images

    def _wait_for_missing_image(self, run: _PodRun) -> None:
        """Pending for good: the kubelet cannot get the image (no registry answers for it)."""
        ctr = run.pod["spec"]["containers"][0]
        image = ctr.get("image", "")
        if ctr.get("imagePullPolicy") == "Never":
            waits = [("ErrImageNeverPull", f'Container image "{image}" is not present with pull policy of Never')]
        else:
            waits = [("ErrImagePull", f'failed to pull and unpack image "{image}"'),
                     ("ImagePullBackOff", f'Back-off pulling image "{image}"')]
        for i, (reason, message) in enumerate(waits):
            self._patch_status(run, {"phase": "Pending", "containerStatuses": [
                self._container_status(run, {"waiting": {"reason": reason, "message": message}})]})
            if i + 1 < len(waits) and run.deleting.wait(1.0):
                break
        while not run.deleting.wait(0.5):
            if self._stop.is_set():
                return
        return self._abandon_unstarted(run)

    def _execute(self, run: _PodRun) -> None:
        pod = run.pod
        ctr = pod["spec"]["containers"][0]
        env = pod_env(pod, self.base_env, self.node_name)
        argv = [_expand(a, env) for a in (ctr.get("command") or []) + (ctr.get("args") or [])]
        logf = self.workdir / f"{self.namespace}_{run.name}_{run.uid[:8]}.log"
        run.record["log_file"] = str(logf)
        started = _now_iso()
        try:
            if not argv:
                raise FileNotFoundError("container has no command/args (image entrypoints are not modelled)")
            with open(logf, "ab") as out:
                run.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=self.workdir,
                                            start_new_session=True)
        except OSError as e:
            logf.write_text(f"failed to start: {e}\n")
            self._register_log(run, logf)
            return self._finish(run, 128, "StartError", started)
        pump = not self._register_log(run, logf) and self.emulator_logs
        run.record.update(started_at=time.time(), pid=run.proc.pid, phase="Running")
        self._write(run)
        self._patch_status(run, {
            "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
            "hostIP": "127.0.0.1", "startTime": started,
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": started}
                           for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
            "containerStatuses": [{
                "name": ctr["name"], "image": ctr.get("image", ""), "imageID": "", "ready": True,
                "started": True, "restartCount": 0, "containerID": f"process://{run.proc.pid}",
                "state": {"running": {"startedAt": started}}}],
        })
        offset = 0
        terminated_by_us = False
        while True:
            if run.deleting.wait(0.5):
                break
            if pump:
                offset = self._pump_log(run, logf, offset)
            if run.proc.poll() is not None:
                break
        if run.deleting.is_set() and run.proc.poll() is None:
            terminated_by_us = True
            _killpg(run.proc, signal.SIGTERM)
            try:
                run.proc.wait(timeout=max(run.grace, 0))
            except subprocess.TimeoutExpired:
                _killpg(run.proc, signal.SIGKILL)
                run.proc.wait()
        code = run.proc.wait()
        code = 128 - code if code < 0 else code  # killed by signal N -> 128+N, as containers report
        if pump:
            self._pump_log(run, logf, offset)
        reason = "Completed" if code == 0 else "Error"
        self._finish(run, code, reason, started, terminated_by_us)

    def _pump_log(self, run: _PodRun, logf: Path, offset: int) -> int:
        try:
            with open(logf, "rb") as f:
                f.seek(offset)
                chunk = f.read()
        except OSError:
            return offset
        if chunk:
            self._push_log(run, chunk.decode("utf-8", "replace"))
        return offset + len(chunk)

    def _finish(self, run: _PodRun, code: int, reason: str, started: str, deleted: bool = False) -> None:
        phase = "Succeeded" if code == 0 else "Failed"
        run.record.update(finished_at=time.time(), exit_code=code, reason=reason, phase=phase)
        if not run.gone:
            status = self._container_status(run, {"terminated": {
                "exitCode": code, "reason": reason, "startedAt": started, "finishedAt": _now_iso()}})
            status["containerID"] = f"process://{run.proc.pid if run.proc else 0}"
            self._patch_status(run, {"phase": phase, "containerStatuses": [status],
                                     "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted"}]})
        run.finished = True
        self._write(run)
        if run.deleting.is_set():
            self._final_delete(run)


    # ---- hold mode (no processes) --------------------------------------------------------
    def release(self) -> int:
        """Finish every held pod that is not being deleted (see ``hold``); returns how many."""
        with self._lock:
            runs = [r for r in self._runs.values() if not (r.finished or r.deleting.is_set())]
        for run in runs:
            self._hold_pool.submit(self._held_call, self._finish_held, run)
        return len(runs)

    def _held_call(self, step: Callable[[_PodRun], None], run: _PodRun, *args) -> None:
        """One held pod's steps run one at a time (the pool may hold its start and its stop)."""
        try:
            with run.held:
                if not run.finished and not self._stop.is_set():
                    step(run, *args)
        except Exception:
            log.exception("held pod %s: %s failed", run.name, step.__name__)

    def _hold_pod(self, run: _PodRun, bound: bool, running: bool = False) -> None:
        self._write(run)
        if run.deleting.is_set():
            return self._stop_held(run)
        if self.hold == "pending" and not bound:
            return
        if not bound and not self._bind(run):
            return
        run.record["bound_at"] = run.record["bound_at"] or time.time()
        if running:  # already Running on this node (the kubelet restarted): its task's start is unknown
            run.record.update(started_at=time.time(), started_iso=_now_iso(), phase="Running")
        else:
            self._start_held(run)

    def _start_held(self, run: _PodRun) -> None:
        started = _now_iso()
        run.record.update(started_at=time.time(), started_iso=started, phase="Running")
        ctr = run.pod["spec"]["containers"][0]
        self._patch_status(run, {
            "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}], "hostIP": "127.0.0.1",
            "startTime": started,
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": started}
                           for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
            "containerStatuses": [{**self._container_status(run, {"running": {"startedAt": started}}),
                                   "ready": True, "started": True, "containerID": f"held://{run.uid}"}]})
        run.record["ti_run"] = self._task_call(run, "run", {
            "state": "running", "hostname": run.name, "unixname": "airflow", "pid": 1, "start_date": started})
        self._write(run)

    def _finish_held(self, run: _PodRun) -> None:
        if run.deleting.is_set():
            return
        if run.record["started_at"] is None:  # held Pending: it starts now
            if run.record["bound_at"] is None and not self._bind(run):
                return
            run.record["bound_at"] = run.record["bound_at"] or time.time()
            self._start_held(run)
        if run.record.get("ti_run") == 200:
            run.record["ti_state"] = self._task_call(run, "state", {
                "state": "success", "end_date": _now_iso(), "task_outlets": [], "outlet_events": []})
        self._finish(run, 0, "Completed", run.record["started_iso"])

    def _stop_held(self, run: _PodRun) -> None:
        if run.record["started_at"] is None:
            return self._abandon_unstarted(run)
        self._finish(run, 143, "Error", run.record["started_iso"])  # deleting: ends with the final delete

    def _task_call(self, run: _PodRun, what: str, body: dict) -> int | None:
        """``PATCH <execution API>/task-instances/{id}/<what>`` as the pod's worker would send it;
        the HTTP status (None: no workload, no API URL, or no answer). /run's refreshed token is
        kept for /state, as the task SDK keeps it."""
        import urllib.error
        import urllib.request

        workload = pod_workload(run.pod) or {}
        url = pod_env(run.pod, self.base_env, self.node_name).get("AIRFLOW__CORE__EXECUTION_API_SERVER_URL")
        ti_id = (workload.get("ti") or {}).get("id")
        token = run.task_token or workload.get("token")
        if not (url and ti_id and token):
            return None
        req = urllib.request.Request(f"{url.rstrip('/')}/task-instances/{ti_id}/{what}", method="PATCH",
                                     data=json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        for attempt in range(5):
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    run.task_token = resp.headers.get("Refreshed-API-Token") or token
                    return resp.status
            except urllib.error.HTTPError as e:
                if e.code < 500 or attempt == 4:
                    return e.code
            except OSError as e:
                if attempt == 4 or self._stop.is_set():
                    log.warning("%s of %s: %s", what, run.name, e)
                    return None
            time.sleep(0.5 * 2 ** attempt)
        return None


def _interrupt(resp) -> None:
    """Unblock a thread reading a watch stream (close() alone waits for the read to return)."""
    conn = getattr(resp, "connection", None) or getattr(resp, "_connection", None)
    sock = getattr(conn, "sock", None)
    try:
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _killpg(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", default="default")
    p.add_argument("--node-name", default="lab-node")
    p.add_argument("--start-delay", type=float, default=0.0, help="fixed seconds")
    p.add_argument("--delay-dist", help="e.g. lognormal:scale=2,sigma=1,cap=60 or pareto:scale=1,alpha=1.5,cap=90")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-running", type=int)
    p.add_argument("--workdir")
    p.add_argument("--records")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE added to the base environment")
    p.add_argument("--hold", choices=[h for h in HOLDS if h], help="run no process: hold every pod Pending, or"
                   " Running with its task started through the execution API; SIGUSR1 finishes them (success)")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if a.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    base = default_base_env()
    base.update(kv.split("=", 1) for kv in a.env)
    delay: DelaySpec = LongTailDelay.parse(a.delay_dist, a.seed) if a.delay_dist else a.start_delay
    kubelet = ProcessKubelet(a.kubeconfig, a.namespace, node_name=a.node_name, start_delay=delay,
                             max_running=a.max_running, base_env=base, workdir=a.workdir,
                             records_path=a.records, hold=a.hold).start()
    done = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: done.set())
    if a.hold:
        signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(target=kubelet.release, daemon=True).start())
    done.wait()
    kubelet.stop()


if __name__ == "__main__":
    main()
