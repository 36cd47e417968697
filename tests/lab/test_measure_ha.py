"""The lab's HA measurements on hand-built evidence (pure functions, no processes): scheduler
crashes, pod watcher crashes, pod events applied more or less than once, and the scheduler log
and API audit parsers behind them."""

from __future__ import annotations

from fenced_k8s_lab import evidence as ev
from fenced_k8s_lab.measure import (Evidence, events_applied, measure, scheduler_crashes,
                                             watcher_crashes)
from fenced_k8s_lab.report import ROWS, table

A = "00000000-0000-0000-0000-00000000000a"

EVENT = ("2026-11-30T23:14:54.918102Z [info     ] Received executor event with state {state} for task instance "
         "TaskInstanceKey(dag_id='lab_x', task_id='{task}', run_id='manual__2026-11-30T23:14:52+00:00', "
         "try_number={tr}, map_index=-1) [airflow.jobs.scheduler_job_runner.SchedulerJobRunner] "
         "loc=scheduler_job_runner.py:1347")
CRASH = ("2026-11-30T23:15:13Z [error    ] Unknown error in KubernetesJobWatcher. Failing "
         "[airflow.providers.cncf.kubernetes.executors.kubernetes_executor_utils.KubernetesJobWatcher]")
RESTART = ("2026-11-30T23:15:19Z [error    ] Error while health checking kube watcher process for namespace "
           "lab-x. Process died for unknown reasons [airflow.providers...AirflowKubernetesScheduler]")


def pod(task, tr, exit_code=0, stale=False):
    return {"name": f"p-{task}-{tr}-{stale}", "task_id": task, "try_number": str(tr), "exit_code": exit_code,
            "_stale": stale}


def event(task, tr, state="success"):
    return {"task_id": task, "try_number": tr, "state": state}


def test_scheduler_crashes_are_the_exits_nobody_asked_for():
    assert scheduler_crashes(None) is None
    assert scheduler_crashes([]) == 0
    exits = [{"role": "scheduler-0", "requested": True, "returncode": -9},
             {"role": "scheduler-1", "requested": False, "returncode": 1},
             {"role": "scheduler-1", "requested": False, "returncode": 1}]
    assert scheduler_crashes(exits) == 2


def test_watcher_crashes_count_each_death_once_across_crash_and_restart_lines():
    assert watcher_crashes(None) is None
    assert watcher_crashes([]) == 0
    lines = [
        {"log": "scheduler-0.log", "kind": "crash"}, {"log": "scheduler-0.log", "kind": "restart"},  # one death
        {"log": "scheduler-0.log", "kind": "restart"},  # a death without a logged exception
        {"log": "scheduler-1.log", "kind": "crash"},  # died, the scheduler went before its health check
        {"log": "scheduler-1.0.log", "kind": "restart"},  # another process' log: not explained by the above
    ]
    assert watcher_crashes(lines) == 4


def test_each_finished_current_pod_must_reach_the_scheduler_exactly_once():
    pods = [pod("t00", 1), pod("t01", 1, exit_code=1), pod("t02", 1), pod("t03", 1),
            pod("t04", 1, stale=True),  # started after its launch was superseded: no event expected
            pod("t04", 2), pod("t05", 1, exit_code=None)]  # t05 never ran: nothing expected
    events = [event("t00", 1), event("t01", 1, "failed"),
              event("t02", 1), event("t02", 1),  # replayed after a watch gap: applied twice
              # t03: lost
              event("t04", 1, "failed"),  # the stale pod's failure landed on the TI: applied though not expected
              event("t04", 2),
              {"task_id": "t00", "try_number": 1, "state": "queued"}]  # not a terminal event
    assert events_applied(events, pods) == {"events_not_applied_once": 3, "events_lost": 1,
                                            "events_applied_extra": 2}
    assert events_applied(None, pods) == dict.fromkeys(
        ("events_not_applied_once", "events_lost", "events_applied_extra"))
    assert events_applied([], [])["events_not_applied_once"] == 0


def test_measure_judges_events_against_the_launch_of_each_pod():
    """``measure`` marks stale pods itself: a pod started after its launch was superseded expects no event."""
    log = [{"ts": 1, "ti_id": A, "op": "INSERT", "state": "queued", "task_id": "t00", "try_number": 1},
           {"ts": 10, "ti_id": A, "op": "UPDATE", "state": "scheduled", "task_id": "t00", "try_number": 1},
           {"ts": 11, "ti_id": A, "op": "UPDATE", "state": "queued", "task_id": "t00", "try_number": 1},
           {"ts": 30, "ti_id": A, "op": "UPDATE", "state": "success", "task_id": "t00", "try_number": 1}]
    pods = [{"name": "old", "ti_id": A, "task_id": "t00", "try_number": "1", "created": 2, "launch_iat": 1,
             "started": 20, "finished": 25, "exit_code": 0},
            {"name": "new", "ti_id": A, "task_id": "t00", "try_number": "1", "created": 12, "launch_iat": 11,
             "started": 13, "finished": 28, "exit_code": 0}]
    m = measure(Evidence(ti_log=log, tis=[{"id": A, "task_id": "t00", "try_number": 1, "state": "success"}],
                         history=[], pods=pods, run_calls=[], deletes=[], decisions=[],
                         executor_events=[event("t00", 1), event("t00", 1)], watcher_lines=[],
                         scheduler_exits=[], api_faults=[{"verb": "list"}, {"verb": "list"}, {"verb": "create"}]))
    assert m["pods_started_for_superseded_launch"] == 1
    assert m["events_applied_extra"] == 1 and m["events_lost"] == 0
    assert m["scheduler_crashes"] == 0 and m["watcher_crashes"] == 0
    assert m["api_faults_hit"] == {"create": 1, "list": 2}


def test_old_evidence_without_the_new_fields_measures_as_not_measured():
    m = measure(Evidence(ti_log=[], tis=[], history=[], pods=[], run_calls=[], deletes=[], decisions=[]))
    assert m["scheduler_crashes"] is None and m["watcher_crashes"] is None
    assert m["events_not_applied_once"] is None and m["api_faults_hit"] is None
    assert "scheduler crashes" in table({"s": {"stock": m}})


def test_scheduler_log_parsers(tmp_path):
    log = tmp_path / "scheduler-0.log"
    log.write_text("\n".join([EVENT.format(state="queued", task="t00", tr=1), EVENT.format(state="success", task="t00", tr=1),
                              CRASH, "Traceback ...", RESTART, EVENT.format(state="failed", task="t01", tr=2)]))
    events = ev.executor_events([log])
    assert [(e["state"], e["task_id"], e["try_number"], e["dag_id"]) for e in events] == [
        ("success", "t00", 1, "lab_x"), ("failed", "t01", 2, "lab_x")]
    assert [(w["kind"], w["log"]) for w in ev.watcher_lines([log])] == [("crash", "scheduler-0.log"),
                                                                       ("restart", "scheduler-0.log")]


UUID_EVENT = ("2026-12-03T12:42:11Z [info     ] Received executor event with state {state} for task instance "
              "01a23bec-b2ca-7847-a766-82e432eac7fe (coordinates=TaskInstanceKey(dag_id='lab_x', task_id='{task}', "
              "run_id='manual__2026-12-03T12:41:37+00:00', try_number={tr}, map_index=-1)) [airflow.jobs...]")
FINISHED = ("2026-12-03T12:41:52Z [info     ] TaskInstance Finished: dag_id=lab_x, task_id={task}, "
            "run_id=manual__2026-12-03T12:41:37+00:00, map_index=-1, ti_id=01a23bec-c16a-7fcf-a58d-7ffba3ad0d80, "
            "run_start_date=2026-12-03 12:41:47+00:00, run_end_date=2026-12-03 12:41:49+00:00, run_duration=2.4, "
            "state=success, executor=KubernetesExecutor(parallelism=64), executor_state={state}, try_number={tr}, "
            "max_tries=2, pool=default_pool, queue=default, priority_weight=1, operator=_PythonDecoratedOperator")


def test_airflow_34_events_applied_are_the_finished_lines(tmp_path):
    """Airflow 3.4 logs every event by attempt UUID as it takes it from the buffer, then drops
    archived attempts' events silently: only ``TaskInstance Finished`` says one was applied.
    Found in the lab: stock clear_churn's four stale failures counted as applied twice."""
    log = tmp_path / "scheduler-0.log"
    log.write_text("\n".join([UUID_EVENT.format(state="failed", task="t00", tr=1),  # an archived attempt's: dropped
                              UUID_EVENT.format(state="success", task="t01", tr=2),
                              FINISHED.format(state="success", task="t01", tr=2)]))
    assert [(e["state"], e["task_id"], e["try_number"], e["dag_id"]) for e in ev.executor_events([log])] == [
        ("success", "t01", 2, "lab_x")]


def test_api_faults_are_the_schedulers_requests_a_fault_hit():
    audit = [{"verb": "list", "who": "scheduler-0", "code": 500, "fault": 3},
             {"verb": "list", "who": "scheduler-0", "code": 200},
             {"verb": "patch", "who": "kubelet", "code": 500, "fault": 4},
             {"verb": "watch", "who": "scheduler-1", "code": 0, "fault": 5}]
    assert [(f["verb"], f["who"]) for f in ev.api_faults(audit)] == [("list", "scheduler-0"), ("watch", "scheduler-1")]


def test_report_has_the_new_rows():
    keys = {key for key, _ in ROWS}
    assert {"scheduler_crashes", "watcher_crashes", "events_not_applied_once", "tries_burned_by_ha"} <= keys


class _Proc:
    def __init__(self, name):
        self.name, self.rc, self.signals, self.starts = name, None, [], 0
        self.proc = self
        self.log_path = type("P", (), {"name": f"{name}.log"})()

    @property
    def returncode(self):
        return self.rc

    def alive(self):
        return self.rc is None

    def signal(self, sig):
        self.signals.append(sig)

    def tail(self, n=40):
        return "line\nairflow.exceptions.AirflowException: boom\n"


def test_crash_supervisor_restarts_a_crashed_scheduler_and_leaves_a_killed_one_dead(monkeypatch):
    from fenced_k8s_lab import runner

    procs = [_Proc("scheduler-0"), _Proc("scheduler-1")]

    class Stack:
        schedulers = procs

        def start_scheduler(self, i):
            procs[i].rc, procs[i].starts = None, procs[i].starts + 1

    notes = []
    ctx = type("Ctx", (), {"killed": {"scheduler-0"}, "note": lambda self, what: notes.append(what)})()
    clock = [1000.0]
    monkeypatch.setattr(runner.time, "time", lambda: clock[0])
    sup = runner.CrashSupervisor(Stack(), ctx, say=notes.append)
    procs[0].rc, procs[1].rc = -9, 1
    sup.check()
    assert [(e["role"], e["requested"]) for e in sup.exits] == [("scheduler-0", True), ("scheduler-1", False)]
    assert sup.exits[1]["last_error"].endswith("boom")
    clock[0] += 10
    sup.check()
    assert procs[1].starts == 1 and procs[0].starts == 0
    procs[1].rc = 1  # crashes again: recorded again, restarted after a longer back-off
    sup.check()
    clock[0] += 10
    sup.check()
    assert procs[1].starts == 1
    clock[0] += 10
    sup.check()
    assert procs[1].starts == 2
    assert scheduler_crashes(sup.exits) == 2


def test_a_pod_whose_launch_ended_while_it_ran_may_lose_its_event_but_not_repeat_it():
    """The task reported its own failure and the retry minted a new row before the pod exited: the
    fenced executor swallows that pod's event (superseded), stock applies it; neither is wrong."""
    done_early = dict(pod("t00", 1), _current_at_finish=False)
    assert events_applied([], [done_early])["events_not_applied_once"] == 0
    assert events_applied([event("t00", 1)], [done_early])["events_not_applied_once"] == 0
    assert events_applied([event("t00", 1)] * 2, [done_early])["events_applied_extra"] == 1
