"""HA scenarios on a real cluster with the chart as installed: stock KubernetesExecutor vs
FencedKubernetesExecutor (conftest.py: which cluster, how each flavour is installed).

Worker pods are held Pending by a real scheduling constraint: a NoSchedule taint on the nodes
(``lab/fenced_k8s_lab/hold.py``) that the worker pods do not tolerate and the Airflow
components do; lifting it lets the kube-scheduler bind the Pending pods. While pods are held:

* ``clear_while_pending``: the run's task instances are cleared through the REST API, twice,
  each time once every task's current pod is Pending;
* ``scheduler_deleted_mid_run``: the scheduler pod whose SchedulerJob owns the Pending pods
  (their ``airflow-worker`` label) is deleted (``kubectl delete pod``, graceful); the Deployment
  starts another, and the hold stays on past the orphan-adoption interval;
* ``rolling_restart``: ``kubectl rollout restart`` of the scheduler Deployment, and while the
  rollout's first new pod is up, the task instances then queued are cleared through the REST API.

Then the hold is lifted, the run finishes, and the evidence (``lab/chart_evidence.py``) is judged
by the lab's ``measure()``: the same symptom counts as the lab. Stock results are recorded (the
races are timing dependent); the fenced flavour, on the shipped helm-values/fenced-ha.yaml, must
show none of them: no superseded pod that ran the task, no /run 404, no task left unfinished,
no false-positive deletion, no try burned by HA. A 409 ``stale_executor_launch`` turns a stale pod
away cleanly (``run_rejected_stale``) and is not a failure.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from fenced_k8s_lab import hold
from fenced_k8s_lab.chart import InstallError, wait
from fenced_k8s_lab.chart_evidence import ScenarioRun, epoch

OUT = Path(__file__).resolve().parents[2] / "out" / "kind"
DAG_ID = "fenced_repro"
SLEEP_SECONDS = 15       # each task's sleep (dag_run.conf)
CLEARS = 2               # clear_while_pending
ADOPTION_HOLD = 40       # scheduler_deleted_mid_run: hold kept on after the new scheduler runs
                         # (orphaned_tasks_check_interval 30 + margin)
RUN_TIMEOUT = 900
ENDED_TIMEOUT = 180      # after the run: until none of its pods is Pending or Running
#: What the fenced flavour must never show (lab measure names).
FENCED_ZERO = ("stale_task_runs", "run_404", "tasks_not_terminal", "false_positive_deletions", "tries_burned_by_ha")


@pytest.fixture
def scenario(installed, core_api):
    """Observers on before the disruption; evidence collected however the test ends."""
    runs = []

    def start(name: str) -> ScenarioRun:
        run = ScenarioRun(installed.cluster, core_api, installed.api, installed.namespace, installed.flavour, name,
                          DAG_ID, OUT)
        runs.append(run)
        return run

    yield start
    for run in runs:
        if run.report is None and run.run_id:
            run.collect(incomplete=True)  # the test failed midway: what was seen, marked as such
        elif run.report is None:
            run.stop()


def _all_pending(sc: ScenarioRun, timeout: float = 300) -> int:
    """Wait until every task instance of the run has a current pod Pending; their number."""
    def ready():
        tis = sc.tis()
        return len(tis) if tis and len(sc.current_pods("Pending")) >= len(tis) else 0
    return wait("a Pending pod for every task instance of the run", ready, timeout, interval=2)


def _finish(sc: ScenarioRun) -> dict:
    """Run done (or the timeout), every pod of the run ended, then the evidence judged."""
    sc.mark("released")
    try:
        wait(f"run {sc.run_id} to finish", sc.done, RUN_TIMEOUT, interval=5)
    except InstallError:
        pass  # measured: tasks_not_terminal
    sc.mark("run done")
    try:
        wait("every pod of the run to end", lambda: not any(
            p["deleted_at"] is None and p["phases"] and p["phases"][-1] in ("Pending", "Running")
            for p in sc.pods.of_run(sc.run_id)), ENDED_TIMEOUT, interval=3)
    except InstallError:
        pass  # a pod still Pending/Running at the end shows in the evidence
    sc.report = sc.collect()
    print(sc.report)
    return sc.report


def _check(flavour: str, report: dict) -> None:
    if flavour != "fenced":
        return  # stock: recorded for the side-by-side table
    metrics = report["metrics"]
    found = {name: metrics.get(name) for name in FENCED_ZERO if metrics.get(name) != 0}
    assert not found, f"fenced flavour on the shipped values shows HA symptoms {found}: {report}"


def _scheduler_pods(installed, since: float | None = None) -> list[dict]:
    pods = installed.cluster.get("pods", installed.namespace, selector="component=scheduler")["items"]
    return [p for p in pods if since is None or epoch(p["metadata"]["creationTimestamp"]) >= since - 1]


def _new_scheduler_running(installed, since: float, what: str) -> None:
    def running():
        return any(p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
                   for p in _scheduler_pods(installed, since))
    wait(what, running, 300, interval=2)


def test_clear_while_pending(installed, scenario):
    sc = scenario("clear_while_pending")
    with hold.held(installed.cluster):
        sc.trigger({"sleep_seconds": SLEEP_SECONDS})
        width = _all_pending(sc)
        for _ in range(CLEARS):
            assert len(sc.clear()) == width
            _all_pending(sc)
    report = _finish(sc)
    assert len(sc.cleared) == CLEARS * width
    _check(installed.flavour, report)


def test_scheduler_deleted_mid_run(installed, scenario):
    sc = scenario("scheduler_deleted_mid_run")
    cluster, ns = installed.cluster, installed.namespace
    with hold.held(cluster):
        sc.trigger({"sleep_seconds": SLEEP_SECONDS})
        _all_pending(sc)
        owners = Counter(p["labels"].get("airflow-worker") for p in sc.current_pods("Pending"))
        owner = owners.most_common(1)[0][0]
        jobs = {str(job["id"]): job for job in installed.api.alive_scheduler_jobs()}
        assert owner in jobs, f"pods owned by job {owner}, alive scheduler jobs {sorted(jobs)}"
        victim = jobs[owner]["hostname"].split(".")[0]
        assert victim in {p["metadata"]["name"] for p in _scheduler_pods(installed)}, jobs[owner]
        deleted_at = time.time()
        cluster.run("delete", "pod", victim, "-n", ns, "--wait=false")
        sc.mark(f"deleted {victim} (job {owner}, owner of {owners[owner]} Pending pods)")
        _new_scheduler_running(installed, deleted_at, "a new scheduler pod Running")
        sc.mark("replacement running")
        time.sleep(ADOPTION_HOLD)
    report = _finish(sc)
    assert report["metrics"]["scheduler_restarts"] >= 1
    _check(installed.flavour, report)


def test_rolling_restart(installed, scenario):
    sc = scenario("rolling_restart")
    cluster, ns = installed.cluster, installed.namespace
    with hold.held(cluster):
        sc.trigger({"sleep_seconds": SLEEP_SECONDS})
        _all_pending(sc)
        restarted_at = time.time()
        cluster.run("rollout", "restart", "deploy/airflow-scheduler", "-n", ns)
        sc.mark("rollout restart")
        _new_scheduler_running(installed, restarted_at, "the rollout's first new scheduler pod Running")
        queued = [ti["task_id"] for ti in sc.tis() if ti.get("state") == "queued"]
        assert queued, f"no queued task instance to clear during the rollout: {sc.tis()}"
        sc.clear(queued)
        cluster.run("rollout", "status", "deploy/airflow-scheduler", "-n", ns, "--timeout=600s", timeout=620)
        sc.mark("rollout complete")
        try:
            _all_pending(sc, timeout=120)  # the cleared TIs launched again, their pods held
        except InstallError:
            sc.mark("not every task instance had a Pending pod after the rollout")
    report = _finish(sc)
    assert report["metrics"]["scheduler_restarts"] >= 2  # both replicas replaced
    _check(installed.flavour, report)
