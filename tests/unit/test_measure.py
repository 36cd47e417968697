"""The lab's measurement rules on hand-built evidence: launches, superseded starts, duplicates,
burned retries and false-positive deletions."""

from __future__ import annotations

import pytest

from fenced_k8s_lab.measure import Evidence, launches, measure, stale_exit_reason

A, B = "00000000-0000-0000-0000-00000000000a", "00000000-0000-0000-0000-00000000000b"


def log(ts, ti, op="UPDATE", state=None):
    return {"ts": ts, "ti_id": ti, "op": op, "state": state}


def pod(name, ti, created, started=None, finished=None, exit_code=None, stale_exit=None, ran=False, iat=None):
    return {"name": name, "ti_id": ti, "created": created, "started": started, "finished": finished,
            "exit_code": exit_code, "output_stale_exit": stale_exit, "ran_task": ran, "task_id": "t",
            "launch_iat": iat}


def evidence(**kw):
    base = dict(ti_log=[], tis=[], history=[], pods=[], run_calls=[], deletes=[], decisions=[])
    base.update(kw)
    return Evidence(**base)


def test_launches_are_transitions_into_queued_and_end_when_the_id_goes():
    found = launches([log(1, A, "INSERT", "scheduled"), log(2, A, state="queued"), log(3, A, state="queued"),
                      log(4, A, state="scheduled"), log(5, A, state="queued"), log(9, A, "gone")])
    assert [(l.queued_at, l.superseded_at) for l in found[A]] == [(2, 5), (5, 9)]


def test_same_id_requeue_old_pod_started_late_is_superseded_and_burns_a_retry():
    ev = evidence(
        ti_log=[log(1, A, "INSERT", "queued"), log(10, A, state="scheduled"), log(11, A, state="queued"),
                log(26, A, state="up_for_retry"), log(27, A, state="queued")],
        pods=[pod("old", A, 12, started=20, finished=25, exit_code=1, iat=1),  # old job, created late
              pod("new", A, 12, started=14, finished=40, exit_code=0, ran=True, iat=11)],
        history=[{"ti_id": A, "state": "up_for_retry"}],
        tis=[{"id": A, "state": "success"}],
    )
    m = measure(ev)
    assert m["launches"] == 3
    assert m["pods_started_for_superseded_launch"] == 1
    assert m["wasted_pod_seconds"] == 5
    assert m["retries_burned"] == 1 and m["retries_burned_by_stale"] == 1
    assert m["duplicate_pods"] == 0 and m["tasks_not_terminal"] == 0


def test_duplicates_and_handled_stale_exits():
    ev = evidence(
        ti_log=[log(1, A, "INSERT", "queued"), log(5, A, "gone"), log(5, B, "INSERT", "queued")],
        pods=[pod("p1", A, 2, started=3, finished=4, exit_code=0), pod("p2", A, 2.5, started=3.5, finished=4.5),
              pod("p3", A, 3, started=6, finished=6.5, exit_code=0, stale_exit="ti_not_found"),
              pod("p4", B, 6, started=7, finished=9, exit_code=0, ran=True)],
        run_calls=[{"ti_id": A, "status": 404}, {"ti_id": A, "status": 404}, {"ti_id": B, "status": 200}],
        tis=[{"id": B, "state": "success"}],
    )
    m = measure(ev)
    assert m["duplicate_pods"] == 2  # p1, p2, p3 started for the same launch of A (p3 after it ended)
    assert m["pods_started_for_superseded_launch"] == 1
    assert m["stale_pods_turned_away"] == 1
    assert m["run_404"] == 1 and m["run_rejected_stale"] == 1


def test_false_positive_is_a_fence_deleting_a_current_launch():
    ev = evidence(
        ti_log=[log(1, A, "INSERT", "queued"), log(1, B, "INSERT", "queued"), log(8, B, "gone")],
        pods=[pod("current", A, 2), pod("stale", B, 2)],
        deletes=[{"ts": 5, "who": "scheduler-0", "name": "current"}, {"ts": 9, "who": "scheduler-0", "name": "stale"},
                 {"ts": 6, "who": "scheduler-1", "name": "revoked"}],
        decisions=[{"decision": "pod.deleted", "path": "sweep", "reason": "x", "pod": "ns/current"},
                   {"decision": "pod.deleted", "path": "sweep", "reason": "ti_gone", "pod": "ns/stale"},
                   {"decision": "pod.deleted", "path": "revoke", "reason": "revoked", "pod": "ns/revoked"}],
    )
    m = measure(ev)
    assert m["false_positive_deletions"] == 1
    assert m["pods_deleted_by_executor"] == 3


def test_stale_exit_reason_reads_the_worker_line():
    line = '{"event":"stale executor launch: not running the task","reason":"stale_executor_launch","ti_id":"x"}'
    assert stale_exit_reason("noise\n" + line) == "stale_executor_launch"
    assert stale_exit_reason("Traceback ... ServerResponseError") is None


def test_a_users_clear_is_not_a_burned_retry():
    ev = evidence(ti_log=[log(1, A, "INSERT", "queued"), log(3, A, "gone"), log(3, B, "UPDATE", None),
                          log(4, B, state="queued"), log(9, B, state="success")],
                  history=[{"ti_id": A, "state": "failed"}], tis=[{"id": B, "state": "success"}])
    assert measure(ev)["retries_burned"] == 0


def test_a_tasks_own_failure_is_not_a_burned_retry_nor_a_try_burned_by_ha():
    ev = evidence(
        ti_log=[log(1, A, "INSERT", "queued") | {"task_id": "t", "try_number": 1},
                log(5, A, "gone"), log(5, B, state="up_for_retry") | {"task_id": "t", "try_number": 1},
                log(8, B, state="queued") | {"task_id": "t", "try_number": 2},
                log(12, B, state="success") | {"task_id": "t", "try_number": 2}],
        pods=[pod("p1", A, 2, started=3, finished=4, exit_code=1) | {"try_number": "1", "failed_on_purpose": True},
              pod("p2", B, 9, started=10, finished=11, exit_code=0, ran=True) | {"try_number": "2"}],
        tis=[{"id": B, "task_id": "t", "try_number": 2, "state": "success"}],
    )
    m = measure(ev)
    assert m["retries_burned"] == 0
    assert m["tries_burned_by_ha"] == 0


def test_tries_burned_by_ha_are_the_tries_no_task_failure_or_user_clear_took():
    tis = [{"id": A, "task_id": "t", "try_number": 4, "state": "success"},
           {"id": B, "task_id": "u", "try_number": 1, "state": "success"}]
    pods = [pod("p1", A, 1, started=2, finished=3, exit_code=1) | {"try_number": "1", "failed_on_purpose": True}]
    ev = evidence(tis=tis, pods=pods, cleared=[{"ts": 5, "task_id": "t"}])
    assert measure(ev)["tries_burned_by_ha"] == 1  # try 4 = first + own failure + clear + one reset
    assert measure(evidence(tis=[{"id": A, "state": "success"}]))["tries_burned_by_ha"] is None


def test_slots_leaked_come_from_the_live_schedulers_gauges():
    gauges = [{"sender": "s0", "executor.running_tasks": 3, "executor.open_slots": 1, "ts": 100},
              {"sender": "s1", "executor.running_tasks": 1, "executor.open_slots": 3, "ts": 99},
              {"sender": "killed", "executor.running_tasks": 4, "ts": 10}]
    tis = [{"id": A, "state": "running"}, {"id": B, "state": "success"}]
    m = measure(evidence(gauges=gauges, collected_at=101, tis=tis))
    assert m["executor_slots_leaked"] == 3  # 3 + 1 held by live schedulers, 1 TI running
    assert measure(evidence(tis=tis))["executor_slots_leaked"] is None  # no statsd: not measured


def test_gauge_listener_keeps_the_latest_executor_gauges_per_sender():
    from fenced_k8s_lab.evidence import GaugeListener

    listener = GaugeListener()
    try:
        listener.feed("a", "airflow.executor.running_tasks:2|g", 1)
        listener.feed("a", "airflow.executor.running_tasks:0|g", 2)
        listener.feed("a", "airflow.executor.open_slots.FencedKubernetesExecutor:4|g", 2)
        listener.feed("b", "airflow.scheduler.heartbeat:1|c", 3)
        listener.feed("b", "airflow.dag_processing.running_tasks:7|g", 3)
        assert listener.snapshot() == [{"sender": "a", "executor.running_tasks": 0, "executor.open_slots": 4,
                                        "executor.running_tasks.peak": 2, "executor.open_slots.peak": 4,
                                        "ts": 2}]
    finally:
        listener.stop()


def test_deletions_of_the_other_deployments_pods_are_read_from_the_audit():
    from fenced_k8s_lab.evidence import audit_deletes, cross_deletes, pod_creators

    def entry(verb, who, name, code=200):
        return {"verb": verb, "who": who, "name": name, "code": code, "resource": "pods", "ts": 1}

    audit = [entry("create", "scheduler-0", "ours", 201), entry("create", "neighbour-scheduler-0", "theirs", 201),
             entry("delete", "scheduler-1", "theirs"), entry("delete", "scheduler-0", "ours"),
             entry("delete", "neighbour-scheduler-0", "ours"), entry("delete", "kubelet", "theirs"),
             entry("delete", "scheduler-0", "theirs", 404)]
    found = cross_deletes(audit_deletes(audit), pod_creators(audit), "neighbour-")
    assert [(d["who"], d["name"]) for d in found] == [("scheduler-1", "theirs"), ("neighbour-scheduler-0", "ours")]
    m = measure(evidence(cross_deletes=found))
    assert m["other_deployment_pods_deleted"] == 2 and m["own_pods_deleted_by_neighbour"] == 1
    assert measure(evidence())["other_deployment_pods_deleted"] is None


def test_on_a_cluster_without_an_audit_deletes_are_attributed_by_the_schedulers_own_log_lines(tmp_path):
    from fenced_k8s_lab.evidence import cross_deletes, log_deleters, observed_deletes, scheduler_deletes

    (tmp_path / "scheduler-0.log").write_text(
        "[x] INFO - Deleting pod ours-a in namespace lab-x\n"
        "[x] INFO - fenced_k8s_executor decision=pod.deleted path=sweep reason=token_superseded enforced=True "
        "pod=lab-x/theirs-b\n"
        "[x] INFO - fenced_k8s_executor decision=pod.kept path=sweep reason=legacy enforced=True pod=lab-x/ours-c\n")
    (tmp_path / "n.log").write_text("[x] INFO - Deleting pod ours-d in namespace lab-x\n")
    who = log_deleters({"scheduler-0": [tmp_path / "scheduler-0.log"], "neighbour-scheduler-0": [tmp_path / "n.log"]})
    assert who == {"ours-a": "scheduler-0", "theirs-b": "scheduler-0", "ours-d": "neighbour-scheduler-0"}
    seen = [{"ts": 3.0, "name": "theirs-b"}, {"ts": 1.0, "name": "ours-a"}, {"ts": 2.0, "name": "ours-d"},
            {"ts": 4.0, "name": "ours-e"}]
    deletes = observed_deletes(seen, who)
    assert [(d["name"], d["who"]) for d in deletes] == [
        ("ours-a", "scheduler-0"), ("ours-d", "neighbour-scheduler-0"), ("theirs-b", "scheduler-0"), ("ours-e", "?")]
    assert [d["name"] for d in scheduler_deletes(deletes)] == ["ours-a", "theirs-b"]
    creators = {"ours-a": "scheduler", "ours-d": "scheduler", "theirs-b": "neighbour-scheduler", "ours-e": "scheduler"}
    assert [(d["who"], d["name"]) for d in cross_deletes(deletes, creators, "neighbour-")] == [
        ("neighbour-scheduler-0", "ours-d"), ("scheduler-0", "theirs-b")]


def test_a_running_try_the_user_cleared_is_not_a_burned_retry():
    ev = evidence(ti_log=[log(1, A, "INSERT", "running"), log(3, A, "gone"), log(3, B, state="restarting"),
                          log(6, B, state="up_for_retry"), log(8, B, state="queued"), log(12, B, state="success")],
                  tis=[{"id": B, "task_id": "t", "try_number": 2, "state": "success"}],
                  cleared=[{"ts": 3, "task_id": "t"}])
    m = measure(ev)
    assert m["retries_burned"] == 0 and m["tries_burned_by_ha"] == 0


def test_a_pod_that_started_in_time_and_ran_for_a_later_launch_is_a_stale_task_run():
    """Issue 47 (a): a stuck-in-queued re-queue keeps the TI id and try, so a pod of the revoked
    launch that had already started gets through /run and runs the task for the new launch. Its
    container started before the re-queue: by container start alone it was counted as current."""
    ev = evidence(
        ti_log=[log(1, A, "INSERT", "queued"), log(16, A, state="scheduled"), log(17, A, state="queued"),
                log(21, A, state="running"), log(23, A, state="success")],
        pods=[pod("slow", A, 2, started=9, finished=24, exit_code=0, ran=True, iat=1) | {"ran_at": 21.5},
              pod("new", A, 18, iat=17)],
        tis=[{"id": A, "state": "success"}],
    )
    m = measure(ev)
    assert m["pods_started_for_superseded_launch"] == 0
    assert m["stale_task_runs"] == 1
    current = evidence(ti_log=ev.ti_log[:1], pods=[pod("p", A, 2, started=9, ran=True, iat=1) | {"ran_at": 12}])
    assert measure(current)["stale_task_runs"] == 0
    # evidence without the task's start time: judged by container start, as before
    assert measure(evidence(ti_log=ev.ti_log, pods=[pod("slow", A, 2, started=9, ran=True, iat=1)]))[
        "stale_task_runs"] == 0


def test_the_run_gates_409_is_a_launch_turned_away_never_an_unhandled_409():
    """Issue 47: the fence's own 409 was listed as a failure when its worker left no stale line."""
    calls = [{"ts": 5, "ti_id": A, "status": 409}, {"ts": 6, "ti_id": B, "status": 409},
             {"ts": 7, "ti_id": B, "status": 200}]
    m = measure(evidence(run_calls=calls, gate_rejections=[{"ts": 5, "ti_id": A}]))
    assert m["run_409"] == 1 and m["run_gate_rejected"] == 1 and m["run_rejected_stale"] == 1
    assert m["run_403"] == 0
    assert measure(evidence(run_calls=[{"ts": 5, "ti_id": A, "status": 403}]))["run_403"] == 1
    assert measure(evidence(run_calls=calls))["run_gate_rejected"] is None


def test_a_run_refused_after_the_pod_was_told_to_stop_is_not_a_failure():
    stopped = {"reason": "stopped_during_run", "status": "409", "signal": "SIGTERM"}
    ev = evidence(
        ti_log=[log(1, A, "INSERT", "queued"), log(16, A, state="scheduled")],
        pods=[pod("p", A, 2, started=5, finished=19, exit_code=0, iat=1)
              | {"told_to_stop": 16.2, "stopped_at_start": stopped}],
        run_calls=[{"ts": 18, "ti_id": A, "status": 409}], gate_rejections=[],
    )
    m = measure(ev)
    assert m["run_409"] == 0 and m["stopped_at_start"] == 1
    assert m["pods_stopped_while_starting"] == 1 and m["run_after_stop"] == 1


def test_stops_and_late_runs_need_run_times():
    early = pod("early", A, 2, started=3, finished=9, exit_code=0, ran=True, iat=1) | {"told_to_stop": 8}
    quiet = pod("quiet", B, 2, started=3, finished=7, exit_code=143, iat=1) | {"told_to_stop": 6}
    ev = evidence(pods=[early, quiet], run_calls=[{"ts": 4, "ti_id": A, "status": 200}])
    assert (measure(ev)["pods_stopped_while_starting"], measure(ev)["run_after_stop"]) == (1, 0)
    # a /run sent before the stop and answered after it (a slow api-server) was not sent after it
    slow = evidence(pods=[early], run_calls=[{"ts": 8.5, "sent": 7.5, "ti_id": A, "status": 200}])
    assert (measure(slow)["pods_stopped_while_starting"], measure(slow)["run_after_stop"]) == (0, 0)
    old = evidence(pods=[early, quiet], run_calls=[{"ti_id": A, "status": 200}])
    assert measure(old)["pods_stopped_while_starting"] is None and measure(old)["run_after_stop"] is None


def test_a_run_of_the_requeues_new_pod_is_not_the_stopped_pods_late_run():
    """pending_storm at load: a stuck-in-queued re-queue revoked a pod that had sent /run, and the
    re-queue's new pod (same TI id) sent its own /run within a second of the old one finishing.
    Judged by TI id and time alone, the new pod's call counted as the stopped pod's late /run."""
    old = pod("old", A, 8, started=21.7, finished=30.9, exit_code=0, ran=True, iat=8) | {"told_to_stop": 25.2}
    new = pod("new", A, 25.6, started=28.8, finished=38.8, exit_code=0, ran=True, iat=25) | {"told_to_stop": None}
    calls = [{"ts": 25.1, "sent": 25.0, "ti_id": A, "status": 200},
             {"ts": 31.4, "sent": 31.4, "ti_id": A, "status": 200}]
    m = measure(evidence(pods=[old, new], run_calls=calls))
    assert (m["pods_stopped_while_starting"], m["run_after_stop"]) == (0, 0)
    # the old pod alone: its call after the stop is late
    assert measure(evidence(pods=[old], run_calls=calls))["run_after_stop"] == 1


def test_requeues_and_tasks_failed_at_the_stuck_in_queued_limit():
    lines = [{"ts": 1, "ti_id": A, "outcome": "requeued"}, {"ts": 2, "ti_id": A, "outcome": "requeued"},
             {"ts": 3, "ti_id": A, "outcome": "failed"}, {"ts": 3, "ti_id": B, "outcome": "requeued"}]
    m = measure(evidence(stuck_in_queued=lines))
    assert m["requeues"] == 3 and m["tasks_failed_in_queue"] == 1
    assert measure(evidence())["requeues"] is None


def test_the_stop_line_is_the_workers_own():
    from fenced_k8s_executor import worker
    from fenced_k8s_lab.measure import STOPPED_MARK, stopped_at_start

    assert STOPPED_MARK == worker.STOPPED
    line = ('{"timestamp":"2026-12-05T08:52:04.6Z","level":"warning","event":"%s","reason":"stopped_during_run",'
            '"signal":"SIGTERM","status":"409"}' % worker.STOPPED)
    assert stopped_at_start("noise\n" + line) == {"reason": "stopped_during_run", "status": "409", "signal": "SIGTERM"}
    assert stopped_at_start("Traceback") is None


def test_the_logs_give_run_times_gate_answers_and_stuck_in_queued(tmp_path):
    from fenced_k8s_lab.evidence import gate_rejections, log_time, run_calls, stuck_in_queued

    api = tmp_path / "api-server.log"
    api.write_text(
        f"2026-12-05T08:52:04.642918Z [info     ] request finished [http.access] method=PATCH "
        f"path=/execution/task-instances/{A}/run query= status_code=409\n"
        f"2026-12-05T08:52:04.5Z [info     ] fenced_k8s_executor decision=run_gate.rejected path=run_gate "
        f"reason=stale_executor_launch enforced=True ti_id={A} launch=aaaa current_launch=bbbb\n")
    sched = tmp_path / "scheduler-0.log"
    sched.write_text(
        "2026-12-05T08:47:47.949232Z [info     ] Task stuck in queued; will try to requeue. task_instance="
        f"<TaskInstance: lab.t00 manual__x [queued] ti_id={A}> [airflow.jobs.scheduler_job_runner]\n"
        "2026-12-05T08:49:47Z [info     ] Task requeue attempts exceeded max; marking failed. task_instance="
        f"<TaskInstance: lab.t00 manual__x [queued] ti_id={A}> [airflow.jobs.scheduler_job_runner]\n")
    at = log_time("2026-12-05T08:52:04.642918Z [info")
    assert run_calls(api) == [{"ts": at, "ti_id": A, "status": 409, "sent": at}]
    api.write_text(api.read_text().replace("method=PATCH", "duration_us=3103228 method=PATCH"))
    assert run_calls(api)[0]["sent"] == pytest.approx(at - 3.103228)
    assert gate_rejections(api) == [{"ts": log_time("2026-12-05T08:52:04.5Z x"), "ti_id": A}]
    assert [(e["ti_id"], e["outcome"]) for e in stuck_in_queued([sched])] == [(A, "requeued"), (A, "failed")]
    assert log_time('{"timestamp":"2026-12-05T08:52:04.642918Z","event":"x"}') == at


def test_the_failed_event_core_sends_at_the_stuck_in_queued_limit_is_not_a_pods_event():
    """Core fails the task and sends its failed event itself (``executor.fail``): counted as
    "applied more than once" when no pod of that try had finished (the fence deleted them Pending)."""
    ev = evidence(
        ti_log=[log(1, A, "INSERT", "queued") | {"task_id": "t", "try_number": 1}, log(16, A, state="scheduled"),
                log(30, A, state="failed") | {"task_id": "t", "try_number": 1}],
        pods=[pod("p", A, 2, finished=16, iat=1)],
        executor_events=[{"log": "scheduler-0.log", "state": "failed", "task_id": "t", "try_number": 1}],
        stuck_in_queued=[{"ts": 30, "ti_id": A, "outcome": "failed"}],
        tis=[{"id": A, "task_id": "t", "try_number": 1, "state": "failed"}],
    )
    assert measure(ev)["events_applied_extra"] == 0
    assert measure(evidence(**{**ev.__dict__, "stuck_in_queued": []}))["events_applied_extra"] == 1
