"""Collect a run's evidence for ``measure``: the DB (a trigger-fed change log of task_instance,
final rows, history), the kubelet's pod records and outputs, the API audit log, the api-server's
/run responses, the schedulers' fence decision lines and the schedulers' own executor gauges
(Airflow's statsd metrics, received by ``GaugeListener``)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from fenced_k8s_lab.dags import FAIL_MARK, TASK_MARK
from fenced_k8s_lab.measure import RUN_PATH, Evidence, stale_exit_reason, stopped_at_start

#: Every change of a task_instance row that matters for launches, with a wall-clock timestamp
#: taken when the row changes (lab databases only; Airflow never sees the table).
CHANGE_LOG_DDL = """
CREATE TABLE lab_ti_log (
    seq bigserial PRIMARY KEY,
    ts double precision NOT NULL DEFAULT extract(epoch from clock_timestamp()),
    ti_id uuid NOT NULL, op text NOT NULL, state text, try_number int, token text, queued_by int,
    task_id text
);
CREATE FUNCTION lab_ti_log_fn() RETURNS trigger AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    INSERT INTO lab_ti_log(ti_id, op) VALUES (OLD.id, 'delete');
    RETURN OLD;
  END IF;
  {archive}IF TG_OP = 'UPDATE' AND OLD.id <> NEW.id THEN
    INSERT INTO lab_ti_log(ti_id, op) VALUES (OLD.id, 'gone');
  END IF;
  IF TG_OP = 'INSERT' OR OLD.id <> NEW.id OR OLD.state IS DISTINCT FROM NEW.state
     OR OLD.external_executor_id IS DISTINCT FROM NEW.external_executor_id THEN
    INSERT INTO lab_ti_log(ti_id, op, state, try_number, token, queued_by, task_id)
    VALUES (NEW.id, TG_OP, NEW.state, NEW.try_number, NEW.external_executor_id, NEW.queued_by_job_id, NEW.task_id);
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER lab_ti_log_trg AFTER INSERT OR UPDATE OR DELETE ON task_instance
FOR EACH ROW EXECUTE FUNCTION lab_ti_log_fn();
"""

DECISION = re.compile(r"decision=(\S+) path=(\S+) reason=(\S+) enforced=(\S+)(?:.*?pod=(\S+))?")
ACCESS_STATUS = re.compile(r"status_code[\"']?\s*[=:]\s*(\d{3})")
ACCESS_DURATION = re.compile(r"duration_us[\"']?\s*[=:]\s*(\d+)")
#: The ISO timestamp Airflow's console log lines start with (UTC).
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z")
#: The api-server's run gate answering 409 ``stale_executor_launch`` (its decision line).
GATE_REJECTED = re.compile(r"decision=run_gate\.rejected .*?ti_id=([0-9a-f-]{36})")
#: airflow-core's stuck-in-queued handler: a re-queue, or the task failed at its re-queue limit.
STUCK_IN_QUEUED = re.compile(r"Task (stuck in queued; will try to requeue|requeue attempts exceeded max; marking "
                             r"failed)\..*?ti_id=([0-9a-f-]{36})")
#: airflow-core's SchedulerJobRunner._process_executor_events, once per event it takes from the buffer.
EXECUTOR_EVENT = re.compile(r"Received executor event with state (\w+) for task instance TaskInstanceKey\("
                            r"dag_id='([^']*)', task_id='([^']*)', run_id='([^']*)', try_number=(\d+)")
#: Airflow 3.4 logs every event it takes from the buffer by attempt UUID (``for task instance <uuid>
#: (coordinates=...``) and then drops those of archived attempts without a word: an event it applies
#: is its ``TaskInstance Finished`` line (the live attempt's try).
UUID_EVENTS = "(coordinates=TaskInstanceKey("
FINISHED = re.compile(r"TaskInstance Finished: dag_id=([^,]*), task_id=([^,]*), run_id=([^,]*), .*?"
                      r"executor_state=(\w+), try_number=(\d+)")
#: The provider's KubernetesJobWatcher.run re-raising (its process exits) and the executor's health
#: check finding a dead watcher process and starting a new one.
WATCHER_CRASH = "Unknown error in KubernetesJobWatcher. Failing"
WATCHER_RESTART = "Error while health checking kube watcher process"


#: Airflow 3.4 archives an attempt in place (``working_set`` leaves TRUE; a try archived while queued
#: or running is marked failed as it goes) and inserts its successor: logged as the attempt going,
#: as 3.3's move of the row to a new id was, not as a state change of the try.
ARCHIVED = """IF TG_OP = 'UPDATE' AND OLD.working_set IS TRUE AND NEW.working_set IS NOT TRUE THEN
    INSERT INTO lab_ti_log(ti_id, op) VALUES (OLD.id, 'gone');
    RETURN NEW;
  END IF;
  """


def _has_working_set(conn: Any) -> bool:
    """Airflow 3.4's task_instance keeps every attempt, the live one marked by ``working_set``."""
    return bool(conn.exec_driver_sql(
        "SELECT 1 FROM information_schema.columns WHERE table_name = 'task_instance'"
        " AND column_name = 'working_set' AND table_schema = current_schema()").first())


def install_change_log(db_url: str) -> None:
    engine = sa.create_engine(db_url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(CHANGE_LOG_DDL.replace("{archive}", ARCHIVED if _has_working_set(conn) else ""))
    finally:
        engine.dispose()


def _rows(conn: Any, sql: str) -> list[dict]:
    return [dict(r) for r in conn.execute(sa.text(sql)).mappings().all()]


def read_db(db_url: str) -> tuple[list[dict], list[dict], list[dict]]:
    engine = sa.create_engine(db_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            log = _rows(conn, "SELECT ts, ti_id::text AS ti_id, op, state, try_number, task_id FROM lab_ti_log"
                              " ORDER BY seq")
            if _has_working_set(conn):  # 3.4: earlier tries are the archived rows
                columns = "dag_id, task_id, run_id, region_index AS map_index, try_number, state, hostname"
                tis = _rows(conn, f"SELECT id::text AS id, {columns} FROM task_instance WHERE working_set IS TRUE")
                history = _rows(conn, f"SELECT id::text AS ti_id, {columns} FROM task_instance"
                                      " WHERE working_set IS NOT TRUE")
            else:
                tis = _rows(conn, "SELECT id::text AS id, dag_id, task_id, run_id, map_index, try_number, state,"
                                  " hostname FROM task_instance")
                history = _rows(conn, "SELECT task_instance_id::text AS ti_id, dag_id, task_id, run_id, map_index,"
                                      " try_number, state, hostname FROM task_instance_history")
    finally:
        engine.dispose()
    return log, tis, history


def log_time(line: str) -> float | None:
    """Epoch seconds of an Airflow log line's leading UTC timestamp, or of a JSON line's ``timestamp``."""
    from datetime import datetime, timezone

    match = LOG_TIME.match(line)
    if match is None:
        found = re.search(r'"timestamp"\s*:\s*"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z?"', line)
        if found is None:
            return None
        match = found
    return datetime.fromisoformat(match.group(1)).replace(tzinfo=timezone.utc).timestamp()


def _task_mark_time(output: str, pod_name: str) -> float | None:
    """When the pod's task code printed its mark (the task ran), from the worker's JSON log line."""
    for line in output.splitlines():
        if f"{TASK_MARK} {pod_name} " in line:
            return log_time(line)
    return None


def pod_evidence(records: dict[str, dict], skip: set[str] = frozenset()) -> list[dict]:
    pods = []
    for record in records.values():
        if record["name"] in skip:
            continue
        output = ""
        if record.get("log_file") and Path(record["log_file"]).exists():
            output = Path(record["log_file"]).read_text(errors="replace")
        pods.append({
            "name": record["name"],
            "uid": record["uid"],
            "ti_id": record.get("ti_id"),
            "try_number": (record.get("annotations") or {}).get("try_number"),
            "task_id": (record.get("annotations") or {}).get("task_id"),
            "created": record.get("seen_at"),
            "launch_iat": record.get("launch_iat"),
            "started": record.get("started_at"),
            "finished": record.get("finished_at") or record.get("deleted_at"),
            "exit_code": record.get("exit_code"),
            "output_stale_exit": stale_exit_reason(output),
            "stopped_at_start": stopped_at_start(output),
            "told_to_stop": record.get("deletion_seen_at"),
            "ran_task": f"{TASK_MARK} {record['name']} " in output,
            "ran_at": _task_mark_time(output, record["name"]),
            "failed_on_purpose": f"{FAIL_MARK} {record['name']} " in output,
        })
    return pods


def run_calls(api_server_log: Path) -> list[dict]:
    """Every ``PATCH .../run`` the api-server answered {ts, ti_id, status, sent}, from its access log:
    ``ts`` when it answered, ``sent`` when the request came in (``ts`` less its duration)."""
    calls = []
    if not api_server_log.exists():
        return calls
    for line in api_server_log.read_text(errors="replace").splitlines():
        path = RUN_PATH.search(line)
        status = ACCESS_STATUS.search(line)
        if path and status and "PATCH" in line:
            at, took = log_time(line), ACCESS_DURATION.search(line)
            sent = at - int(took.group(1)) / 1e6 if at is not None and took else at
            calls.append({"ts": at, "ti_id": path.group(1), "status": int(status.group(1)), "sent": sent})
    return calls


def gate_rejections(api_server_log: Path) -> list[dict]:
    """The run gate's own 409s {ts, ti_id}: launches the fence turned away at /run."""
    if not api_server_log.exists():
        return []
    return [{"ts": log_time(line), "ti_id": match.group(1)}
            for line in api_server_log.read_text(errors="replace").splitlines()
            if (match := GATE_REJECTED.search(line))]


def stuck_in_queued(scheduler_logs: list[Path]) -> list[dict]:
    """airflow-core's stuck-in-queued handler at work {ts, ti_id, outcome: requeued | failed, log}."""
    found = []
    for path in scheduler_logs:
        for line in path.read_text(errors="replace").splitlines():
            match = STUCK_IN_QUEUED.search(line)
            if match:
                found.append({"ts": log_time(line), "ti_id": match.group(2), "log": path.name,
                              "outcome": "failed" if match.group(1).startswith("requeue") else "requeued"})
    return found


def decisions(scheduler_logs: list[Path]) -> list[dict]:
    found = []
    for path in scheduler_logs:
        for line in path.read_text(errors="replace").splitlines():
            match = DECISION.search(line)
            if match and "fenced_k8s_executor decision=" in line:
                found.append({"decision": match.group(1), "path": match.group(2), "reason": match.group(3),
                              "enforced": match.group(4) == "True", "pod": match.group(5) or ""})
    return found


def executor_events(scheduler_logs: list[Path], states: tuple[str, ...] = ("success", "failed")) -> list[dict]:
    """Executor events the schedulers applied (``Received executor event``; on Airflow 3.4, which
    drops archived attempts' events after that line, ``TaskInstance Finished``), terminal states
    only by default."""
    found = []
    for path in scheduler_logs:
        text = path.read_text(errors="replace")
        uuid_events = UUID_EVENTS in text
        for line in text.splitlines():
            if uuid_events:
                match = FINISHED.search(line)
                fields = match and (match.group(4), match.group(1), match.group(2), match.group(3), match.group(5))
            else:
                match = EXECUTOR_EVENT.search(line)
                fields = match and match.groups()
            if fields and fields[0] in states:
                found.append({"log": path.name, "state": fields[0], "dag_id": fields[1], "task_id": fields[2],
                              "run_id": fields[3], "try_number": int(fields[4])})
    return found


def watcher_lines(scheduler_logs: list[Path]) -> list[dict]:
    """The pod watcher dying (``crash``) or being restarted by the health check (``restart``), in log order."""
    found = []
    for path in scheduler_logs:
        for line in path.read_text(errors="replace").splitlines():
            if WATCHER_CRASH in line:
                found.append({"log": path.name, "kind": "crash", "line": line[:200]})
            elif WATCHER_RESTART in line:
                found.append({"log": path.name, "kind": "restart", "line": line[:200]})
    return found


def api_faults(audit: list[dict], callers: str = "scheduler") -> list[dict]:
    """The schedulers' API requests an injected fault hit (status, drop, delay), from the audit."""
    return [{"ts": e.get("ts"), "verb": e.get("verb"), "who": e.get("who"), "code": e.get("code"),
             "path": e.get("path")}
            for e in audit if e.get("fault") and str(e.get("who", "")).startswith(callers)]


def audit_deletes(audit: list[dict]) -> list[dict]:
    """Every pod deletion the API server carried out {ts, who, name}, from its audit log."""
    return [{"ts": e["ts"], "who": str(e.get("who", "")), "name": e.get("name")} for e in audit
            if e.get("verb") == "delete" and e.get("resource", "pods") == "pods" and e.get("code") in (200, 202)]


def scheduler_deletes(deletes: list[dict]) -> list[dict]:
    return [d for d in deletes if str(d.get("who", "")).startswith("scheduler")]


def pod_creators(audit: list[dict]) -> dict[str, str]:
    """Pod name -> the caller whose create stored it (from the API audit log)."""
    return {entry["name"]: entry["who"] for entry in audit
            if entry.get("verb") == "create" and entry.get("resource") == "pods" and not entry.get("subresource")
            and entry.get("name") and entry.get("code") in (200, 201)}


#: The provider's ``AirflowKubernetesScheduler.delete_pod`` logs this line before each delete call.
PROVIDER_DELETE = re.compile(r"Deleting pod (\S+) in namespace (\S+)")


def log_deleters(logs: dict[str, list[Path]]) -> dict[str, str]:
    """Pod name -> the scheduler (role) whose log says it deleted that pod: the provider's
    ``Deleting pod`` line or a fence's ``decision=pod.deleted`` line. The attribution of deletes
    on a cluster whose API audit log the lab cannot read (``--kubeconfig``): only Airflow's
    schedulers delete worker pods there, and both executors log every delete they send."""
    found: dict[str, str] = {}
    for role, paths in logs.items():
        for path in paths:
            for line in path.read_text(errors="replace").splitlines():
                match = PROVIDER_DELETE.search(line)
                name = match.group(1) if match else None
                if name is None and "fenced_k8s_executor decision=pod.deleted" in line:
                    decision = DECISION.search(line)
                    name = (decision.group(5) or "").split("/")[-1] if decision else None
                if name:
                    found.setdefault(name, role)
    return found


def observed_deletes(deletions: list[dict], deleters: dict[str, str]) -> list[dict]:
    """Deletions a pod watch saw begin {ts, name}, each with the scheduler that sent it (``who``;
    ``?`` when no scheduler log names the pod)."""
    return [{"ts": d["ts"], "who": deleters.get(d["name"], "?"), "name": d["name"]}
            for d in sorted(deletions, key=lambda d: d["ts"])]


def cross_deletes(deletes: list[dict], creators: dict[str, str], foreign_prefix: str) -> list[dict]:
    """Pod deletions across two deployments sharing a namespace: who deleted a pod the other
    deployment created. Callers named ``<foreign_prefix>...`` are the neighbour deployment."""
    out = []
    for entry in deletes:
        creator, who = creators.get(entry.get("name") or ""), str(entry.get("who", ""))
        if creator is None or not (who.startswith("scheduler") or who.startswith(foreign_prefix)):
            continue
        if who.startswith(foreign_prefix) != creator.startswith(foreign_prefix):
            out.append({"ts": entry["ts"], "who": who, "name": entry["name"], "creator": creator})
    return out


class GaugeListener:
    """A statsd listener on 127.0.0.1 (UDP) that keeps the latest value of each gauge per sender.

    Every Airflow process sends from its own socket, so one sender address is one process: the
    scheduler's ``executor.running_tasks`` / ``executor.open_slots`` gauges (emitted by Airflow's
    ``BaseExecutor.heartbeat`` from ``len(executor.running)``) give each scheduler's own count of
    occupied executor slots, whatever the executor class does with its pods.
    """

    GAUGES = ("executor.running_tasks", "executor.open_slots", "executor.queued_tasks")

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.latest: dict[str, dict] = {}  # sender -> {gauge: value, "ts": last gauge time}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lab-statsd", daemon=True)

    def env(self, prefix: str = "airflow") -> dict[str, str]:
        return {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__STATSD_PORT": str(self.port), "AIRFLOW__METRICS__STATSD_PREFIX": prefix}

    def start(self) -> "GaugeListener":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                data, addr = self.sock.recvfrom(65535)
            except OSError:
                continue
            for line in data.decode(errors="replace").splitlines():
                self.feed(f"{addr[0]}:{addr[1]}", line, time.time())

    def feed(self, sender: str, line: str, ts: float) -> None:
        name, _, rest = line.partition(":")
        value, _, kind = rest.partition("|")
        if not kind.startswith("g"):
            return
        for gauge in self.GAUGES:  # "<prefix>.executor.running_tasks[.<ExecutorClass>]"
            if f".{gauge}" in f".{name}":
                try:
                    number = float(value)
                except ValueError:
                    return
                entry = self.latest.setdefault(sender, {})
                entry[gauge], entry["ts"] = number, ts
                entry[f"{gauge}.peak"] = max(number, entry.get(f"{gauge}.peak", number))

    def snapshot(self) -> list[dict]:
        return [{"sender": sender, **values} for sender, values in sorted(self.latest.items())]

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self.sock.close()


def collect(*, db_url: str, kubelet_records: dict[str, dict], audit: list[dict], log_dir: Path,
            wall_seconds: float, faults: list[dict], gauges: list[dict] | None = None,
            cleared: list[dict] | None = None, foreign_prefix: str | None = None,
            scheduler_exits: list[dict] | None = None, scheduler_restarts: list[dict] | None = None,
            deletes: list[dict] | None = None, creators: dict[str, str] | None = None) -> Evidence:
    """``deletes`` and ``creators`` replace what the audit log would say (a cluster whose audit
    the lab cannot read: ``observed_deletes`` and the pods' deployment labels)."""
    log, tis, history = read_db(db_url)
    scheduler_logs = sorted(log_dir.glob("scheduler-*.log"))
    deletes = audit_deletes(audit) if deletes is None else deletes
    creators = pod_creators(audit) if creators is None else creators
    foreign = {name for name, who in creators.items() if foreign_prefix and who.startswith(foreign_prefix)}
    return Evidence(
        ti_log=log,
        tis=tis,
        history=history,
        pods=pod_evidence(kubelet_records, skip=foreign),
        run_calls=run_calls(log_dir / "api-server.log"),
        gate_rejections=gate_rejections(log_dir / "api-server.log"),
        stuck_in_queued=stuck_in_queued(scheduler_logs),
        deletes=scheduler_deletes(deletes),
        decisions=decisions(scheduler_logs),
        wall_seconds=wall_seconds,
        faults=faults,
        gauges=gauges,
        collected_at=time.time(),
        cleared=cleared or [],
        cross_deletes=cross_deletes(deletes, creators, foreign_prefix) if foreign_prefix else None,
        executor_events=executor_events(scheduler_logs),
        watcher_lines=watcher_lines(scheduler_logs),
        scheduler_exits=scheduler_exits,
        scheduler_restarts=scheduler_restarts,
        api_faults=api_faults(audit),
    )


def dump(evidence: Evidence, path: Path) -> None:
    path.write_text(json.dumps(evidence.__dict__, default=str, indent=1))
