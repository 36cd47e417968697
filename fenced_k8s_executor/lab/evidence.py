"""Collect a run's evidence for ``measure``: the DB (a trigger-fed change log of task_instance,
final rows, history), the kubelet's pod records and outputs, the API audit log, the api-server's
/run responses and the schedulers' fence decision lines."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from fenced_k8s_executor.lab.dags import TASK_MARK
from fenced_k8s_executor.lab.measure import RUN_PATH, Evidence, stale_exit_reason

#: Every change of a task_instance row that matters for launches, with a wall-clock timestamp
#: taken when the row changes (lab databases only; Airflow never sees the table).
CHANGE_LOG_DDL = """
CREATE TABLE lab_ti_log (
    seq bigserial PRIMARY KEY,
    ts double precision NOT NULL DEFAULT extract(epoch from clock_timestamp()),
    ti_id uuid NOT NULL, op text NOT NULL, state text, try_number int, token text, queued_by int
);
CREATE FUNCTION lab_ti_log_fn() RETURNS trigger AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    INSERT INTO lab_ti_log(ti_id, op) VALUES (OLD.id, 'delete');
    RETURN OLD;
  END IF;
  IF TG_OP = 'UPDATE' AND OLD.id <> NEW.id THEN
    INSERT INTO lab_ti_log(ti_id, op) VALUES (OLD.id, 'gone');
  END IF;
  IF TG_OP = 'INSERT' OR OLD.id <> NEW.id OR OLD.state IS DISTINCT FROM NEW.state
     OR OLD.external_executor_id IS DISTINCT FROM NEW.external_executor_id THEN
    INSERT INTO lab_ti_log(ti_id, op, state, try_number, token, queued_by)
    VALUES (NEW.id, TG_OP, NEW.state, NEW.try_number, NEW.external_executor_id, NEW.queued_by_job_id);
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER lab_ti_log_trg AFTER INSERT OR UPDATE OR DELETE ON task_instance
FOR EACH ROW EXECUTE FUNCTION lab_ti_log_fn();
"""

DECISION = re.compile(r"decision=(\S+) path=(\S+) reason=(\S+) enforced=(\S+)(?:.*?pod=(\S+))?")
ACCESS_STATUS = re.compile(r"status_code[\"']?\s*[=:]\s*(\d{3})")


def install_change_log(db_url: str) -> None:
    engine = sa.create_engine(db_url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(CHANGE_LOG_DDL)
    finally:
        engine.dispose()


def _rows(conn: Any, sql: str) -> list[dict]:
    return [dict(r) for r in conn.execute(sa.text(sql)).mappings().all()]


def read_db(db_url: str) -> tuple[list[dict], list[dict], list[dict]]:
    engine = sa.create_engine(db_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            log = _rows(conn, "SELECT ts, ti_id::text AS ti_id, op, state FROM lab_ti_log ORDER BY seq")
            tis = _rows(conn, "SELECT id::text AS id, dag_id, task_id, run_id, map_index, try_number, state,"
                              " hostname FROM task_instance")
            history = _rows(conn, "SELECT task_instance_id::text AS ti_id, dag_id, task_id, run_id, map_index,"
                                  " try_number, state, hostname FROM task_instance_history")
    finally:
        engine.dispose()
    return log, tis, history


def pod_evidence(records: dict[str, dict]) -> list[dict]:
    pods = []
    for record in records.values():
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
            "ran_task": f"{TASK_MARK} {record['name']}" in output,
        })
    return pods


def run_calls(api_server_log: Path) -> list[dict]:
    calls = []
    if not api_server_log.exists():
        return calls
    for line in api_server_log.read_text(errors="replace").splitlines():
        path = RUN_PATH.search(line)
        status = ACCESS_STATUS.search(line)
        if path and status and "PATCH" in line:
            calls.append({"ti_id": path.group(1), "status": int(status.group(1))})
    return calls


def decisions(scheduler_logs: list[Path]) -> list[dict]:
    found = []
    for path in scheduler_logs:
        for line in path.read_text(errors="replace").splitlines():
            match = DECISION.search(line)
            if match and "fenced_k8s_executor decision=" in line:
                found.append({"decision": match.group(1), "path": match.group(2), "reason": match.group(3),
                              "enforced": match.group(4) == "True", "pod": match.group(5) or ""})
    return found


def scheduler_deletes(audit: list[dict]) -> list[dict]:
    return [
        {"ts": entry["ts"], "who": entry["who"], "name": entry.get("name")}
        for entry in audit
        if entry.get("verb") == "delete" and str(entry.get("who", "")).startswith("scheduler")
        and entry.get("code") in (200, 202)
    ]


def collect(*, db_url: str, kubelet_records: dict[str, dict], audit: list[dict], log_dir: Path,
            wall_seconds: float, faults: list[dict]) -> Evidence:
    log, tis, history = read_db(db_url)
    return Evidence(
        ti_log=log,
        tis=tis,
        history=history,
        pods=pod_evidence(kubelet_records),
        run_calls=run_calls(log_dir / "api-server.log"),
        deletes=scheduler_deletes(audit),
        decisions=decisions(sorted(log_dir.glob("scheduler-*.log"))),
        wall_seconds=wall_seconds,
        faults=faults,
    )


def dump(evidence: Evidence, path: Path) -> None:
    path.write_text(json.dumps(evidence.__dict__, default=str, indent=1))
