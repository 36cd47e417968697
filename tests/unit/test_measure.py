"""The lab's measurement rules on hand-built evidence: launches, superseded starts, duplicates,
burned retries and false-positive deletions."""

from __future__ import annotations

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
