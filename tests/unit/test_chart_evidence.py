"""tests/kind's evidence (lab/fenced_k8s_lab/chart_evidence.py) judged by the lab's measure():
REST listings of a run's task instances become launches, watched pods and logs become pods, /run
answers and deletions, and the symptom counts come out as the lab counts them."""

from __future__ import annotations

import pytest

pytest.importorskip("sqlalchemy")

from fenced_k8s_lab.chart_evidence import TiLog, build_evidence, epoch, pod_facts  # noqa: E402
from fenced_k8s_lab.measure import measure  # noqa: E402

OLD = "0190d2a0-0000-7000-8000-000000000001"
NEW = "0190d2a0-0000-7000-8000-000000000002"
T0 = 1_800_000_000.0


def _iso(ts: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ts, timezone.utc).isoformat()


def _ti(ti_id, state, queued, try_number=1):
    return {"id": ti_id, "task_id": "work_00", "map_index": -1, "try_number": try_number, "state": state,
            "queued_when": _iso(queued) if queued else None}


def _cleared_once() -> TiLog:
    """work_00 queued at T0, cleared at T0+10 (new TI id, queued again at T0+11), then ran."""
    log = TiLog()
    log.feed([_ti(OLD, "queued", T0)], T0 + 0.5)
    log.feed([_ti(OLD, "queued", T0)], T0 + 5)
    log.feed([_ti(NEW, "queued", T0 + 11, 2)], T0 + 11.5)
    log.feed([_ti(NEW, "running", T0 + 11, 2)], T0 + 31)
    log.feed([_ti(NEW, "success", T0 + 11, 2)], T0 + 50)
    return log


def _pod(tmp_path, name, ti_id, seen, started, exit_code, output="", deleted=None):
    path = tmp_path / f"{name}.log"
    path.write_text(output)
    return {"name": name, "uid": f"uid-{name}", "ti_id": ti_id, "launch_iat": None, "seen_at": seen,
            "annotations": {"task_id": "work_00", "try_number": "1" if ti_id == OLD else "2", "run_id": "r"},
            "labels": {}, "started_at": started, "finished_at": started + 15 if started else None,
            "deleted_at": deleted, "exit_code": exit_code, "log_file": str(path), "phases": []}


def _measure(tmp_path, pods, api_lines=(), scheduler_lines=()):
    api_log = tmp_path / "api-server.log"
    api_log.write_text("\n".join(api_lines))
    sched = tmp_path / "scheduler-a.log"
    sched.write_text("\n".join(scheduler_lines))
    log = _cleared_once()
    ev = build_evidence(log, log.latest, pods, api_log, [sched], [{"ts": T0 + 10, "task_id": "work_00"}], "r",
                        wall_seconds=60.0)
    return measure(ev)


def _run_line(ti_id, status):
    return f"[info] request finished method=PATCH path=/execution/task-instances/{ti_id}/run status_code={status}"


def test_tilog_launches_come_from_queued_when_and_a_cleared_id_is_gone():
    log = _cleared_once()
    ops = [(e["ti_id"], e["op"], e["state"], e["ts"]) for e in sorted(log.entries, key=lambda e: e["ts"])]
    assert ops[0] == (OLD, "INSERT", "queued", T0)              # Airflow's queueing time, not the poll's
    assert (OLD, "gone", None, T0 + 11.5) in ops                 # first poll without it
    assert (NEW, "INSERT", "queued", T0 + 11) in ops
    assert log.current_ids() == {NEW}


def test_requeue_without_leaving_queued_is_a_new_launch():
    log = TiLog()
    log.feed([_ti(OLD, "queued", T0)], T0 + 1)
    log.feed([_ti(OLD, "queued", T0 + 70)], T0 + 71)  # stuck-in-queued: queued again, same id
    from fenced_k8s_lab.measure import launches

    assert [launch.queued_at for launch in launches(log.entries)[OLD]] == [T0, T0 + 70]


def test_stale_pod_turned_away_by_404_is_a_superseded_start_not_a_stale_run(tmp_path):
    pods = [_pod(tmp_path, "old", OLD, T0 + 1, T0 + 30, 1),
            _pod(tmp_path, "new", NEW, T0 + 12, T0 + 30, 0, output="LAB-TASK-RAN new 2\n")]
    m = _measure(tmp_path, pods, [_run_line(OLD, 404), _run_line(NEW, 200)])
    assert m["pods_started_for_superseded_launch"] == 1
    assert m["stale_task_runs"] == 0
    assert m["run_404"] == 1
    assert m["tries_burned_by_ha"] == 0  # try 2 is the user's clear
    assert m["tasks_not_terminal"] == 0


def test_stale_pod_that_ran_the_task_is_counted(tmp_path):
    pods = [_pod(tmp_path, "old", OLD, T0 + 1, T0 + 30, 0, output="LAB-TASK-RAN old 1\n"),
            _pod(tmp_path, "new", NEW, T0 + 12, T0 + 30, 0, output="LAB-TASK-RAN new 2\n")]
    assert _measure(tmp_path, pods)["stale_task_runs"] == 1


def test_a_fence_deleting_a_current_pod_is_a_false_positive(tmp_path):
    pods = [_pod(tmp_path, "old", OLD, T0 + 1, None, None, deleted=T0 + 5),
            _pod(tmp_path, "new", NEW, T0 + 12, T0 + 30, 0)]
    line = "fenced_k8s_executor decision=pod.deleted path=sweep reason=stale enforced=True pod=ns/old"
    m = _measure(tmp_path, pods, scheduler_lines=[line])
    assert m["pods_deleted_by_executor"] == 1 and m["false_positive_deletions"] == 1
    pods[0]["deleted_at"] = T0 + 12  # after the clear: the launch was superseded, the delete was right
    assert _measure(tmp_path, pods, scheduler_lines=[line])["false_positive_deletions"] == 0


def test_pod_facts_read_the_worker_container():
    obj = {"metadata": {"deletionTimestamp": None}, "status": {"phase": "Failed", "containerStatuses": [
        {"name": "base", "state": {"terminated": {"startedAt": "2027-01-15T08:00:00Z",
                                                 "finishedAt": "2027-01-15T08:00:09Z", "exitCode": 1}}}]}}
    facts = pod_facts(obj, now=0.0)
    assert facts["started_at"] == epoch("2027-01-15T08:00:00Z")
    assert facts["finished_at"] - facts["started_at"] == 9 and facts["exit_code"] == 1


def test_a_cleared_ti_s_new_id_carries_the_old_queued_when_which_is_no_launch():
    """A clear gives the TI a new id with state None but keeps queued_when: not a launch."""
    from fenced_k8s_lab.chart_evidence import without_carried_launches
    from fenced_k8s_lab.measure import launches

    log = TiLog()
    log.feed([_ti(OLD, "queued", T0)], T0 + 1)
    log.feed([_ti(NEW, None, T0)], T0 + 6)                # cleared: new id, old queued_when
    log.feed([_ti(NEW, "queued", T0 + 7, 2)], T0 + 7.5)   # its own launch
    found = launches(without_carried_launches(log.entries))
    assert [launch.queued_at for launch in found[NEW]] == [T0 + 7]
    assert found[OLD][0].superseded_at == T0 + 6
