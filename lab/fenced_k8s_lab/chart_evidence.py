"""Evidence of one HA scenario on a real cluster running the chart (tests/kind), judged by the
lab's own ``measure()``, so the symptom counts mean on a cluster what they mean in the lab.

What the lab reads from its own parts, read here from the cluster and Airflow's public surfaces:

* launches (``ti_log``): the run's task instances polled through the REST API about once a
  second. A launch is a TI id with a new ``queued_when`` (Airflow's own time of queueing, to the
  microsecond); a TI id that leaves the run's listing (a clear or a new try gives the TI a new id)
  is superseded at the first poll that misses it, so up to a poll interval late;
* pods: every worker pod (label ``kubernetes_executor=True``) seen by a watch, deleted ones
  included; its TI id and launch time from its ``--json-string`` workload, ``started``/``finished``
  and the exit code from the container status (whole seconds, as Kubernetes gives them), its
  output (``kubectl logs``) read when the pod ends, when its deletion is first seen, and at the end;
* ``/run`` answers: the api-server's access log lines (``request finished ... status_code=``);
* fence decisions and executor events: the scheduler pods' logs, streamed for the whole scenario
  by ``kubectl logs -f`` (a scheduler pod deleted in the scenario takes its log with it);
* deletions: worker pods whose deletion the watch saw (the test itself never deletes one), at the
  time it was first seen; a fence's ``decision=pod.deleted`` line says which were the fence's.

Airflow state is changed only through Airflow (the REST API) and Kubernetes (pods, rollouts).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fenced_k8s_lab import evidence as lab_evidence
from fenced_k8s_lab.chart import Cluster, RestApi
from fenced_k8s_lab.kubelet import workload_identity
from fenced_k8s_lab.measure import TERMINAL, Evidence, measure

WORKER_SELECTOR = "kubernetes_executor=True"
WORKER_CONTAINER = "base"
SCHEDULER_SELECTOR = "component=scheduler"


def epoch(value: Any) -> float | None:
    """An RFC 3339 / ISO 8601 time from the Kubernetes or Airflow API as seconds since the epoch."""
    if value in (None, ""):
        return None
    if isinstance(value, datetime):
        stamp = value
    else:
        stamp = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------------- launches
class TiLog:
    """The lab's ``ti_log`` rebuilt from successive REST listings of one run's task instances."""

    def __init__(self) -> None:
        self.entries: list[dict] = []
        self.latest: list[dict] = []
        self._last: dict[str, dict] = {}

    def feed(self, tis: list[dict], now: float) -> None:
        seen = set()
        for ti in tis:
            ti_id, state = str(ti["id"]), ti.get("state")
            seen.add(ti_id)
            queued = epoch(ti.get("queued_when"))
            prev = self._last.get(ti_id)
            base = {"ti_id": ti_id, "task_id": ti.get("task_id"), "try_number": ti.get("try_number")}
            if queued is not None and (prev is None or prev["queued"] != queued):  # (see without_carried_launches)
                if prev is not None and prev["state"] == "queued":
                    # queued again without a poll seeing it leave queued (stuck-in-queued requeue)
                    self.entries.append({**base, "ts": queued - 0.001, "op": "UPDATE", "state": "scheduled"})
                self.entries.append({**base, "ts": queued, "op": "UPDATE" if prev else "INSERT", "state": "queued"})
                if state != "queued":
                    self.entries.append({**base, "ts": max(now, queued), "op": "UPDATE", "state": state})
            elif prev is None:
                self.entries.append({**base, "ts": now, "op": "INSERT", "state": state})
            elif prev["state"] != state:
                self.entries.append({**base, "ts": now, "op": "UPDATE", "state": state})
            self._last[ti_id] = {"state": state, "queued": queued, "gone": False, "task_id": ti.get("task_id")}
        for ti_id, prev in self._last.items():
            if ti_id not in seen and not prev["gone"]:
                prev["gone"] = True
                self.entries.append({"ti_id": ti_id, "task_id": prev["task_id"], "try_number": None, "ts": now,
                                     "op": "gone", "state": None})
        self.latest = tis

    def current_ids(self) -> set[str]:
        return {str(ti["id"]) for ti in self.latest}


class TiPoller:
    """Feeds a ``TiLog`` from the REST API in a thread (about once a second)."""

    def __init__(self, api: RestApi, dag_id: str, run_id: str, interval: float = 1.0):
        self.api, self.dag_id, self.run_id, self.interval = api, dag_id, run_id, interval
        self.log = TiLog()
        self.errors = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ti-poller", daemon=True)

    def start(self) -> "TiPoller":
        self.poll()
        self._thread.start()
        return self

    def poll(self) -> list[dict]:
        try:
            tis = self.api.task_instances(self.dag_id, self.run_id)
        except Exception:  # an api-server hiccup: the next poll sees the change
            self.errors += 1
            return self.latest()
        with self._lock:
            self.log.feed(tis, time.time())
        return tis

    def latest(self) -> list[dict]:
        with self._lock:
            return list(self.log.latest)

    def current_ids(self) -> set[str]:
        with self._lock:
            return self.log.current_ids()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.poll()


# --------------------------------------------------------------------------------- pods
def pod_facts(obj: dict, now: float) -> dict:
    """What one observation of a worker pod (API JSON) says about it."""
    meta, status = obj["metadata"], obj.get("status") or {}
    facts: dict[str, Any] = {"phase": status.get("phase"), "deleting": bool(meta.get("deletionTimestamp"))}
    for ctr in status.get("containerStatuses") or []:
        if ctr.get("name") != WORKER_CONTAINER:
            continue
        state = ctr.get("state") or {}
        running, terminated = state.get("running") or {}, state.get("terminated") or {}
        last = (ctr.get("lastState") or {}).get("terminated") or {}
        facts["started_at"] = epoch(running.get("startedAt") or terminated.get("startedAt") or last.get("startedAt"))
        if terminated:
            facts["finished_at"] = epoch(terminated.get("finishedAt")) or now
            facts["exit_code"] = terminated.get("exitCode")
    return facts


class PodRecorder:
    """Watches the worker pods of a namespace in a thread and keeps every pod it ever saw."""

    def __init__(self, core_api, namespace: str, log_dir: Path):
        self.core, self.namespace, self.log_dir = core_api, namespace, log_dir
        self.records: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-recorder", daemon=True)

    def start(self) -> "PodRecorder":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _observe(self, event_type: str, pod) -> None:
        obj = self.core.api_client.sanitize_for_serialization(pod)
        meta, now = obj["metadata"], time.time()
        with self._lock:
            rec = self.records.get(meta["uid"])
            if rec is None:
                ti_id, iat = workload_identity(obj)
                rec = self.records[meta["uid"]] = {
                    "name": meta["name"], "uid": meta["uid"], "seen_at": now, "ti_id": ti_id, "launch_iat": iat,
                    "annotations": meta.get("annotations") or {}, "labels": meta.get("labels") or {},
                    "started_at": None, "finished_at": None, "exit_code": None, "deleted_at": None,
                    "log_file": None, "phases": [],
                }
            facts = pod_facts(obj, now)
            if not rec["phases"] or rec["phases"][-1] != facts["phase"]:
                rec["phases"].append(facts["phase"])
            for key in ("started_at", "finished_at", "exit_code"):
                if facts.get(key) is not None:
                    rec[key] = facts[key]
            ended = facts["phase"] in ("Succeeded", "Failed") or facts["deleting"] or event_type == "DELETED"
            if (facts["deleting"] or event_type == "DELETED") and rec["deleted_at"] is None:
                rec["deleted_at"] = now
            fetch = ended and rec["started_at"] is not None and not rec.get("log_final")
        if fetch and event_type != "DELETED":
            self.read_log(rec, final=facts["phase"] in ("Succeeded", "Failed"))

    def _gone_since_last_watch(self, listed: set[str]) -> None:
        """Pods deleted between two watches (no DELETED event seen): deleted when first missed."""
        now = time.time()
        with self._lock:
            for uid, rec in self.records.items():
                if uid not in listed and rec["deleted_at"] is None:
                    rec["deleted_at"] = now

    def read_log(self, rec: dict, final: bool = False) -> None:
        try:
            text = self.core.read_namespaced_pod_log(rec["name"], self.namespace, container=WORKER_CONTAINER,
                                                     _request_timeout=30)
        except Exception:
            return  # gone already: what was read before stays
        path = self.log_dir / f"{rec['name']}.log"
        if not path.exists() or len(text) >= path.stat().st_size:
            path.write_text(text)
        rec["log_file"] = str(path)
        rec["log_final"] = rec.get("log_final") or final

    def _run(self) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            try:
                listing = self.core.list_namespaced_pod(self.namespace, label_selector=WORKER_SELECTOR)
                for pod in listing.items:
                    self._observe("ADDED", pod)
                self._gone_since_last_watch({pod.metadata.uid for pod in listing.items})
                w = watch.Watch()
                for event in w.stream(self.core.list_namespaced_pod, self.namespace, label_selector=WORKER_SELECTOR,
                                      resource_version=listing.metadata.resource_version, timeout_seconds=20):
                    self._observe(event["type"], event["object"])
                    if self._stop.is_set():
                        w.stop()
                        break
            except Exception:  # 410 Gone, a reset connection: list again
                time.sleep(1)

    def of_run(self, run_id: str) -> list[dict]:
        with self._lock:
            return [dict(r) for r in self.records.values() if r["annotations"].get("run_id") == run_id]

    def finish(self, run_id: str) -> list[dict]:
        """The run's pods, with the output of every pod still there read once more."""
        for rec in self.of_run(run_id):
            if rec["deleted_at"] is None and rec["started_at"] is not None:
                self.read_log(self.records[rec["uid"]], final=True)
        return self.of_run(run_id)


# --------------------------------------------------------------------------------- scheduler logs
class SchedulerLogs:
    """``kubectl logs -f`` of every scheduler pod (new ones as they start), from ``since`` on."""

    def __init__(self, cluster: Cluster, namespace: str, log_dir: Path, since: float, interval: float = 2.0):
        self.cluster, self.namespace, self.log_dir, self.since, self.interval = (
            cluster, namespace, log_dir, since, interval)
        self.procs: dict[str, subprocess.Popen] = {}
        self.pods_seen: dict[str, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduler-logs", daemon=True)

    def start(self) -> "SchedulerLogs":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._tick()
        self._thread.start()
        return self

    def _tick(self) -> None:
        try:
            pods = self.cluster.get("pods", self.namespace, selector=SCHEDULER_SELECTOR)["items"]
        except Exception:
            return
        for pod in pods:
            name = pod["metadata"]["name"]
            self.pods_seen.setdefault(name, {"name": name, "created": epoch(pod["metadata"]["creationTimestamp"])})
            started = any(c.get("name") == "scheduler" and ("running" in (c.get("state") or {})
                                                             or "terminated" in (c.get("state") or {}))
                          for c in pod.get("status", {}).get("containerStatuses") or [])
            proc, path = self.procs.get(name), self.log_dir / f"scheduler-{name}.log"
            if not started or (proc is not None and (proc.poll() is None or path.stat().st_size > 0)):
                continue
            # not streaming yet, or the last try ended before it read a line: (re)start from `since`
            out = path.open("wb")
            env_args = ["logs", "-f", "-n", self.namespace, name, "-c", "scheduler", f"--since-time={rfc3339(self.since)}"]
            self.procs[name] = subprocess.Popen([self.cluster.kubectl_bin, *env_args], stdout=out,
                                                stderr=subprocess.DEVNULL, env=self._env())
            out.close()

    def _env(self) -> dict:
        import os

        return {**os.environ, "KUBECONFIG": self.cluster.kubeconfig}

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._tick()

    def stop(self) -> list[Path]:
        self._stop.set()
        self._thread.join(timeout=30)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        return sorted(self.log_dir.glob("scheduler-*.log"))

    def started_after(self, ts: float) -> list[dict]:
        """Scheduler pods created after ``ts`` (a rollout's or a failover's new pods)."""
        return [p for p in self.pods_seen.values() if p["created"] is not None and p["created"] >= ts - 1]


# --------------------------------------------------------------------------------- one scenario
@dataclass
class ScenarioRun:
    """Observers started before the disruption; ``collect()`` judges the run with ``measure()``."""

    cluster: Cluster
    core_api: Any
    api: RestApi
    namespace: str
    flavour: str
    scenario: str
    dag_id: str
    out_dir: Path
    run_id: str | None = None
    cleared: list[dict] = field(default_factory=list)
    marks: dict[str, float] = field(default_factory=dict)
    report: dict | None = None

    def __post_init__(self) -> None:
        self.t0 = time.time()
        self.log_dir = self.out_dir / "logs" / f"{self.scenario}-{self.flavour}"
        shutil.rmtree(self.log_dir, ignore_errors=True)  # an earlier session's logs are not this run's
        self.pods = PodRecorder(self.core_api, self.namespace, self.log_dir / "pods").start()
        self.schedulers = SchedulerLogs(self.cluster, self.namespace, self.log_dir, since=self.t0 - 1).start()
        self.poller: TiPoller | None = None

    def mark(self, what: str) -> None:
        self.marks[what] = round(time.time() - self.t0, 1)

    def trigger(self, conf: dict) -> str:
        self.run_id = self.api.trigger(self.dag_id, conf)
        self.poller = TiPoller(self.api, self.dag_id, self.run_id).start()
        self.mark("triggered")
        return self.run_id

    def tis(self) -> list[dict]:
        return self.poller.latest()

    def clear(self, task_ids: list[str] | None = None) -> list[dict]:
        done = self.api.clear(self.dag_id, self.run_id, task_ids)
        now = time.time()
        self.cleared += [{"ts": now, "task_id": ti["task_id"]} for ti in done]
        self.poller.poll()
        self.mark(f"clear {sum(1 for m in self.marks if m.startswith('clear ')) + 1}: {len(done)} TIs")
        return done

    def current_pods(self, phase: str) -> list[dict]:
        """The run's pods in ``phase``, not being deleted, that belong to a TI id now in the run."""
        ids = self.poller.current_ids()
        return [p for p in self.pods.of_run(self.run_id) if p["deleted_at"] is None and p["phases"]
                and p["phases"][-1] == phase and p["ti_id"] in ids]

    def done(self) -> bool:
        state = self.api.run_state(self.dag_id, self.run_id)
        return state in ("success", "failed") and all(ti.get("state") in TERMINAL for ti in self.poller.poll())

    def stop(self) -> list[Path]:
        """Every observer off (threads joined, ``kubectl logs`` processes ended); the scheduler logs."""
        if self.poller is not None:
            self.poller.stop()
        self.pods.stop()
        return self.schedulers.stop()

    def collect(self, incomplete: bool = False) -> dict:
        """Stop observing, build the evidence, measure it, write the report; the report.
        ``incomplete``: the scenario stopped before its end (the report says so)."""
        self.mark("collect")
        scheduler_logs = self.stop()
        pods = self.pods.finish(self.run_id)
        api_log = self.log_dir / "api-server.log"
        api_log.write_text(self.cluster.run("logs", "-n", self.namespace, "deploy/airflow-api-server", "-c",
                                            "api-server", f"--since-time={rfc3339(self.t0 - 1)}", check=False,
                                            timeout=120))
        ev = build_evidence(self.poller.log, self.poller.latest(), pods, api_log, scheduler_logs, self.cleared,
                            self.run_id, wall_seconds=time.time() - self.t0,
                            scheduler_restarts=self.schedulers.started_after(self.t0))
        metrics = measure(ev)
        report = {"scenario": self.scenario, "flavour": self.flavour, "run_id": self.run_id,
                  "run_state": self.api.run_state(self.dag_id, self.run_id), "metrics": metrics,
                  "run_statuses": run_statuses(ev.run_calls),
                  "marks": self.marks, "ti_poll_errors": self.poller.errors, "incomplete": incomplete}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        lab_evidence.dump(ev, self.log_dir / "evidence.json")
        (self.out_dir / f"report-{self.scenario}-{self.flavour}.json").write_text(json.dumps(report, indent=2))
        self.report = report
        return report


def without_carried_launches(entries: list[dict]) -> list[dict]:
    """``ti_log`` sorted, less the launches a cleared TI's new id only carries over: a clear gives
    the TI a new id but keeps its ``queued_when``, so the new id's first listing shows the old
    launch's time, which is no launch of its own."""
    out, launched = [], set()
    for e in sorted(entries, key=lambda e: e["ts"]):
        if e["state"] == "queued" and e["op"] == "INSERT" and (e.get("task_id"), e["ts"]) in launched:
            continue
        if e["state"] == "queued":
            launched.add((e.get("task_id"), e["ts"]))
        out.append(e)
    return out


def run_statuses(run_calls: list[dict]) -> dict[str, int]:
    """Every ``/run`` answer of the run by status (403: e.g. a workload token that expired while
    its pod waited: Airflow signs it for ``[scheduler] task_queued_timeout`` seconds)."""
    counts: dict[str, int] = {}
    for call in run_calls:
        counts[str(call["status"])] = counts.get(str(call["status"]), 0) + 1
    return dict(sorted(counts.items()))


def judge(evidence_json: Path) -> dict:
    """``measure()`` of a scenario's saved evidence (``logs/<scenario>-<flavour>/evidence.json``)."""
    data = json.loads(evidence_json.read_text())
    data["ti_log"] = without_carried_launches(data["ti_log"])
    return measure(Evidence(**data))


def build_evidence(ti_log: TiLog, final_tis: list[dict], pod_records: list[dict], api_log: Path,
                   scheduler_logs: list[Path], cleared: list[dict], run_id: str, wall_seconds: float,
                   scheduler_restarts: list[dict] | None = None) -> Evidence:
    """The lab's ``Evidence`` from what a scenario on a cluster observed (module docstring)."""
    records = {r["uid"]: {**r, "finished_at": r["finished_at"] or r["deleted_at"]} for r in pod_records}
    ids = {e["ti_id"] for e in ti_log.entries} | {r["ti_id"] for r in pod_records if r.get("ti_id")}
    deletes = [{"ts": r["deleted_at"], "who": "?", "name": r["name"]} for r in pod_records if r["deleted_at"]]
    events = [e for e in lab_evidence.executor_events(scheduler_logs) if e["run_id"] == run_id]
    pods = lab_evidence.pod_evidence(records)  # "created": when the watch first saw the pod
    return Evidence(
        ti_log=without_carried_launches(ti_log.entries),
        tis=[{"id": str(t["id"]), "task_id": t["task_id"], "map_index": t.get("map_index"),
              "try_number": t.get("try_number"), "state": t.get("state"), "run_id": run_id} for t in final_tis],
        history=[],
        pods=pods,
        run_calls=[c for c in lab_evidence.run_calls(api_log) if c["ti_id"] in ids],
        deletes=deletes,
        decisions=lab_evidence.decisions(scheduler_logs),
        wall_seconds=wall_seconds,
        cleared=cleared,
        executor_events=events,
        watcher_lines=lab_evidence.watcher_lines(scheduler_logs),
        scheduler_restarts=scheduler_restarts,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m fenced_k8s_lab.chart_evidence [OUT]``: judge every scenario's saved
    evidence again (OUT, default out/kind) and rewrite the metrics of its report."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "out/kind")
    for report_path in sorted(out.glob("report-*.json")):
        report = json.loads(report_path.read_text())
        evidence_json = out / "logs" / f"{report['scenario']}-{report['flavour']}" / "evidence.json"
        report["metrics"] = judge(evidence_json)
        report["run_statuses"] = run_statuses(json.loads(evidence_json.read_text())["run_calls"])
        report_path.write_text(json.dumps(report, indent=2))
        print(report_path.name, {k: report["metrics"][k] for k in (
            "pods_started_for_superseded_launch", "stale_task_runs", "run_404", "tries_burned_by_ha")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
