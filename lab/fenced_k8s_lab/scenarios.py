"""The reproduction scenarios: each one drives a real trigger of apache/airflow#69760.

A scenario is plain data (sizes, settings, kubelet pressure) plus a ``drive`` function that acts
on a running deployment through ``RunContext`` (trigger, clear, pause/kill schedulers, inject API
faults) and records every fault it injects. The same seed, DAG, settings and fault schedule are
used for both executors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable



def quota_message(limit: int) -> str:
    """The API server's refusal of a pod create beyond a namespace pod quota."""
    return f'pods "x" is forbidden: exceeded quota: lab-quota, requested: pods=1, used: pods={limit}, limited: pods={limit}'


QUOTA_MESSAGE = quota_message(3)


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    width: tuple[int, int]  # tasks in the fan-out DAG: (quick, full)
    drive: Callable[["Any"], None]
    env: dict[str, str] = field(default_factory=dict)
    capacity: int | None = None  # concurrent pods the kubelet runs (node capacity)
    delay: str | None = None  # LongTailDelay spec, e.g. "lognormal:scale=3,sigma=0.8,cap=30"
    schedulers: int | None = None  # override of --schedulers
    #: non-default settings of the fenced run only (the report prints them beside its figures)
    fenced_env: dict[str, str] = field(default_factory=dict)
    timeout: float = 300.0  # seconds to wait for every task to be terminal
    task_seconds: float = 1.0  # how long each task's code runs
    fail_first: bool = False  # each task fails its first try on purpose (its own failure, not HA's)
    retries: int = 2  # the DAG's default_args retries
    #: a second deployment on the same executor (own DB, api-server, one scheduler) in the same
    #: namespace running the same DAG: (tasks, task seconds, pod start delay)
    neighbour: tuple[int, float, float | None] | None = None

    @property
    def settings(self) -> str:
        """The fenced run's non-default settings, as an operator would write them."""
        prefix = "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__"
        return ", ".join(f"{k[len(prefix):].lower() if k.startswith(prefix) else k}={v}"
                         for k, v in sorted(self.fenced_env.items()))


def _storm(ctx: Any) -> None:
    ctx.fault("quota 403 on pod create", method="POST", path=r"/pods$", status=403, message=QUOTA_MESSAGE)
    if len(ctx.stack.schedulers) > 1:
        # The race needs the owner to re-queue its own TIs (another scheduler's re-queue is caught
        # by the provider's owner check): the peer stalls (a GC pause) below the health threshold.
        ctx.pause_scheduler(1, "SIGSTOP scheduler-1 for 26 s (GC pause)")
    ctx.trigger()
    ctx.sleep(26)
    if len(ctx.stack.schedulers) > 1:
        ctx.resume_scheduler(1, "SIGCONT scheduler-1")
    ctx.sleep(9)
    ctx.clear_faults("quota freed")


def _pending_storm(ctx: Any) -> None:
    """Pod creation hits the namespace quota (403) while pods start slowly: jobs cycle in the
    task queue (task_publish_max_retries=-1), stuck-in-queued re-queues the same TI ids with the
    same try on the same scheduler, and old jobs create their pods once the quota frees."""
    _storm(ctx)
    ctx.wait_terminal()


def _quota_storm(ctx: Any) -> None:
    """A namespace pod quota of 4 under a fan-out of 16 with one scheduler: a create beyond the
    quota is refused (403) and its job waits in the task queue (task_publish_max_retries=-1);
    tasks queued longer than task_queued_timeout (30 s: a pod holds its place for its whole start
    and run) are revoked and re-queued (same TI id and try), up to the re-queue limit."""
    ctx.pod_quota(4, quota_message(4))
    ctx.trigger()
    ctx.wait_terminal()


def _clear_churn(ctx: Any) -> None:
    """Queued task instances are cleared through the REST API while their pods are still Pending:
    each clear gives the TI a new id and try; the old pods start later."""
    ctx.slow_start_until_marked(25.0)
    ctx.trigger()
    ctx.wait_pods(ctx.width)
    ctx.clear_tasks("clear queued TIs via REST while pods are Pending")
    ctx.mark()  # pods created from now on start quickly
    ctx.wait_terminal()


def _zombie_scheduler(ctx: Any) -> None:
    """The pending storm, then scheduler-0 freezes (GC pause, partition) past the health threshold
    while it owns pending and running pods, stale ones among them; its peer adopts or resets; then
    it wakes up with its old in-memory state (races c, d)."""
    _storm(ctx)
    ctx.sleep(5)
    ctx.pause_scheduler(0, "SIGSTOP scheduler-0")
    ctx.sleep(55)
    ctx.resume_scheduler(0, "SIGCONT scheduler-0")
    ctx.wait_terminal()


def _failover(ctx: Any) -> None:
    """The pending storm, then scheduler-0 is killed while it owns pending pods, stale ones among
    them; its peer adopts by coordinates or resets (race c, d)."""
    _storm(ctx)
    ctx.sleep(5)
    ctx.kill_scheduler(0, "SIGKILL scheduler-0")
    ctx.wait_terminal()


def _watch_gap(ctx: Any) -> None:
    """The pending storm, with every watch answered 410 Gone and closed while pods finish."""
    _storm(ctx)
    ctx.wait_terminal(every=(6.0, ctx.watch_gap))


def _flaky_api(ctx: Any) -> None:
    """Creates time out after the API server stored the pod; 429 and 5xx bursts."""
    ctx.fault("create persisted then timed out", method="POST", path=r"/pods$", persist_then_timeout=True,
              hang_seconds=8, times=3)
    ctx.trigger()
    ctx.sleep(20)
    ctx.fault("429 burst on create", method="POST", path=r"/pods$", status=429, times=4)
    ctx.fault("503 burst on list/get", method="GET", path=r"/pods", status=503, times=6)
    ctx.wait_terminal()


def _zombie_backlog(ctx: Any) -> None:
    """A scheduler freezes (SIGSTOP) ~8 s into the run while its task queue still holds
    pod-creation jobs (default ``worker_pods_creation_batch_size`` = 1 pod per loop, creates slowed
    to 2 s each), past the health threshold; the peer's orphan check (every 10 s) finds its QUEUED
    TIs without pods: stock resets them (each reset archives the never-started try and burns a
    retry), the fenced adopter launches them under the same token. The frozen scheduler wakes at
    ~88 s with its old task queue; the run goes on for 45 s after that."""
    ctx.fault("slow pod create (2 s each)", method="POST", path=r"/pods$", delay=2.0)
    ctx.trigger()
    deadline = time.time() + 60
    backlog: dict[str, int] = {}
    while time.time() < deadline:
        backlog = ctx.queued_backlog()
        if backlog and time.time() >= ctx.t0 + 8:
            break
        time.sleep(0.5)
    roles = [p.name for p in ctx.stack.schedulers]
    target = max((r for r in roles if r in backlog), key=lambda r: backlog[r], default=roles[0])
    ctx.pause_scheduler(roles.index(target), f"SIGSTOP {target} ({backlog.get(target, 0)} queued TIs without a pod; "
                        f"backlog {dict(sorted(backlog.items()))})")
    ctx.clear_faults("pod create back to normal speed")
    ctx.sleep(max(0.0, ctx.t0 + 88 - time.time()))
    ctx.resume_scheduler(roles.index(target), f"SIGCONT {target}")
    woke = time.time()
    ctx.wait_terminal()
    # The woken scheduler takes one old job per loop off its task queue (creates them on stock, drops
    # them on fenced): give it time to work through them before the evidence is read.
    ctx.sleep(max(0.0, woke + 45 - time.time()))
    ctx.note("45 s after SIGCONT")


def _api_faults(ctx: Any) -> None:
    """Bursts of HTTP 500 on every verb the executor uses on pods (create, get, list, patch,
    delete, and watch: a watch request is a list with ``watch=true``), aimed at the schedulers'
    own API callers, plus dropped connections and closed watches. A transient API error must
    never kill the scheduler; every task must still end terminal."""
    pods, pod = r"/pods$", r"/pods/[^/]+$"
    burst = [
        dict(method="GET", path=pods, status=500, times=3),  # list and watch (same path)
        dict(method="POST", path=pods, status=500, times=1),  # create
        dict(method="GET", path=pod, status=500, times=2),  # get
        dict(method="PATCH", path=pod, status=500, times=2),  # patch
        dict(method="DELETE", path=pod, status=500, times=2),  # delete
        dict(method="GET", path=pods, drop=True, times=1),  # a dropped list/watch connection
    ]
    ctx.trigger()
    for n in range(5):
        ctx.sleep(3 if n == 0 else 12)
        ctx.scheduler_faults(f"500 burst {n + 1} on create/get/list/patch/delete/watch + a dropped connection",
                             burst)
        ctx.emulator.close_watches()
        ctx.note("watches closed")
    ctx.sleep(10)
    ctx.clear_faults("bursts over (faults not yet fired are dropped)")
    ctx.wait_terminal()
    # Work an API error postponed (a pod delete retried next loop holds its executor slot until
    # it goes through) finishes before the slots are read.
    ctx.sleep(15)
    ctx.note("15 s after the last task ended")


def _clear_running(ctx: Any) -> None:
    """Tasks are cleared through the REST API while they run (a user re-running a stuck-looking
    task): each cleared TI gets a new id and try, its running pod belongs to a superseded launch,
    and the scheduler must still bring every TI to a terminal state."""
    ctx.trigger()
    running = ctx.wait_states(("running",), ctx.width, timeout=150)
    ctx.sleep(3)  # well inside the task's sleep
    ctx.clear_tasks(f"clear running TIs via REST ({running} running)", states=("running",))
    ctx.wait_terminal()


def _retry_storm(ctx: Any) -> None:
    """Every task fails its first try on purpose, more first-try failures than executor slots
    (parallelism): each failure must free its slot, or the retries starve and the DAG stalls."""
    ctx.trigger()
    ctx.wait_terminal()


def _shared_namespace(ctx: Any) -> None:
    """Two deployments (two metadata DBs, each with its api-server and schedulers) share one
    namespace and run the same DAG with the same run id, both on the executor under test (the
    neighbour with one scheduler): the neighbour's pods start late and run long, across at least
    one sweep of the other deployment. Nobody may delete the other deployment's pods."""
    run_id = "lab_shared_run"
    ctx.trigger_neighbour(run_id)
    ctx.trigger(run_id)
    ctx.wait_terminal()
    until = ctx.t0 + 80  # past the first sweep (default interval 60 s) with the neighbour's pods around
    while time.time() < until or not ctx.neighbour_terminal():
        if time.time() > ctx.t0 + ctx.scenario.timeout:
            ctx.say("  the neighbour's run is not terminal")
            break
        time.sleep(3)
    ctx.note("neighbour run terminal")


def _rolling_restart(ctx: Any) -> None:
    """Both schedulers are replaced one after the other, as ``kubectl rollout restart`` or a chart
    upgrade does (a new scheduler pod starts and heartbeats, then the old one gets SIGTERM and
    10 s to exit), while pods are still Pending (35-70 s image pulls); right after each SIGTERM
    the queued tasks are cleared through the REST API, so the stopping scheduler's Pending pods
    belong to superseded launches and only another scheduler process can delete them."""
    ctx.trigger()
    ctx.wait_pods(ctx.width)
    for i in range(len(ctx.stack.schedulers)):
        ctx.roll_scheduler(i, during=lambda: ctx.clear_tasks("clear queued TIs via REST while a scheduler stops"))
    ctx.wait_terminal()


def _db_outage(ctx: Any) -> None:
    """The metadata database stops for 20 s while pods are Pending (35-70 s image pulls) and comes
    back; schedulers that exit are started again as a Deployment would (back-off 10 s, 20 s,
    40 s). Once every scheduler heartbeats again (new SchedulerJobs on the same host names; the
    crashed ones' Jobs were never closed) the user clears the queued tasks through the REST API:
    the crashed processes' Pending pods now belong to superseded launches. (A clear while no
    scheduler is up leaves rows without a token, no evidence against any pod: only the launch
    gate stands between a pod that starts then and the task.)"""
    ctx.trigger()
    ctx.wait_pods(ctx.width)
    ctx.sleep(3)
    ctx.db_outage(20)
    ctx.wait_api()
    ctx.wait_schedulers()
    ctx.clear_tasks("clear queued TIs via REST once the schedulers are back")
    ctx.wait_terminal()


def _api_cut_off(ctx: Any) -> None:
    """Scheduler-0 is cut off from the API server (every call it sends answers 503 at once, as from
    an overloaded API server, a failing admission webhook or a broken RBAC binding) while it keeps
    heartbeating, and the queued tasks are cleared through the REST API while their pods are Pending
    (35-70 s image pulls): its superseded launches' pods can be deleted only by another scheduler.
    The cut lasts 40 s; every task must end terminal once it is over."""
    ctx.trigger()
    ctx.wait_pods(ctx.width)
    cut = ctx.stack.schedulers[0].name
    ctx.fault(f"{cut} cut off: every API call it sends answers 503", method="*", path=r".*", status=503, who=cut)
    ctx.clear_tasks(f"clear queued TIs via REST while {cut} is cut off")
    ctx.sleep(40)
    ctx.clear_faults(f"{cut} reaches the API server again")
    ctx.wait_terminal()


_STORM_ENV = {
    "AIRFLOW__KUBERNETES_EXECUTOR__WORKER_PODS_CREATION_BATCH_SIZE": "8",
    # Stuck in queued fires at 15-18 s, well inside the peer's 26 s pause.
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "15",
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "3",
    "AIRFLOW__SCHEDULER__NUM_STUCK_IN_QUEUED_RETRIES": "8",
    "AIRFLOW__KUBERNETES_EXECUTOR__TASK_PUBLISH_MAX_RETRIES": "-1",
}

#: One line per scenario: what it does to the cluster (the report's scenario lines).
WHAT_IT_DOES = {
    "pending_storm": "Pod creation answered 403 (namespace quota) for 35 s while one scheduler froze 26 s and pods "
                     "started slowly, 2 at a time: stuck-in-queued re-queued the tasks and old jobs created pods "
                     "once the quota freed.",
    "quota_storm": "A namespace quota of 4 pods under a fan-out of 16 with one scheduler: creates beyond the quota "
                   "refused, stuck-in-queued (30 s) re-queuing the tasks that waited.",
    "clear_churn": "Queued tasks cleared through the REST API while their first pods were still Pending (those "
                   "start 25 s late).",
    "late_start": "clear_churn with the fenced executor's sweep off, so stale pods reach their container start and "
                  "meet the launch gate.",
    "zombie_scheduler": "The pending storm, then one scheduler frozen (SIGSTOP) 55 s while it owned Pending pods, "
                        "then woken with its old state.",
    "failover": "The pending storm, then one scheduler killed (SIGKILL) while it owned Pending pods.",
    "failover_noretry": "failover with retries=0 on the DAG: every try HA burns is a failed task.",
    "watch_gap": "The pending storm, with every watch answered 410 Gone and closed every 6 s while pods finished.",
    "flaky_api": "Pod creates that time out after the API server stored the pod, then bursts of 429 on create and "
                 "503 on list/get.",
    "zombie_backlog": "One scheduler frozen 80 s with pod creations still in its task queue, then woken.",
    "api_faults": "Five bursts of HTTP 500 on every pod verb the schedulers use, plus dropped connections and "
                  "closed watches.",
    "clear_running": "Running tasks cleared through the REST API, as a user re-running a task would.",
    "retry_storm": "Every task failed its first try on purpose, more first-try failures than executor slots.",
    "shared_namespace": "A second Airflow deployment (own database, same executor) ran the same DAG in the same "
                        "namespace.",
    "rolling_restart": "Both schedulers replaced one after the other as a rolling update does, the queued tasks "
                       "cleared right after each SIGTERM, while pods took 35-70 s to start.",
    "api_cut_off": "One scheduler's every API call answered 503 for 40 s while it heartbeat and the queued tasks "
                   "were cleared through the REST API with their pods Pending (35-70 s to start).",
    "db_outage": "The metadata database stopped for 20 s while pods were Pending; crashed schedulers restarted, "
                 "then the queued tasks cleared.",
}

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("pending_storm", _pending_storm.__doc__ or "", (8, 16), _pending_storm, env=_STORM_ENV,
                 capacity=2, delay="lognormal:scale=6,sigma=0.8,cap=40"),
        Scenario("quota_storm", _quota_storm.__doc__ or "", (8, 16), _quota_storm, schedulers=1,
                 env={**_STORM_ENV, "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "30"},
                 delay="lognormal:scale=2,sigma=0.8,cap=20", timeout=420),
        Scenario("clear_churn", _clear_churn.__doc__ or "", (4, 12), _clear_churn,
                 env={"AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "600"}),
        Scenario("late_start", "Clear churn with the fenced executor's sweep switched off: stale pods reach "
                 "their container start, where only the launch gate (launch claim, run gate, worker "
                 "entrypoint) stands between them and the task.", (4, 12), _clear_churn,
                 env={"AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "600"},
                 fenced_env={"AIRFLOW__FENCED_KUBERNETES_EXECUTOR__SWEEP_INTERVAL": "0"}),
        Scenario("zombie_scheduler", _zombie_scheduler.__doc__ or "", (8, 12), _zombie_scheduler,
                 env={**_STORM_ENV, "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15"}, capacity=2,
                 delay="lognormal:scale=6,sigma=0.8,cap=40", timeout=420),
        Scenario("failover", _failover.__doc__ or "", (8, 12), _failover,
                 env={**_STORM_ENV, "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15"}, capacity=2,
                 delay="lognormal:scale=6,sigma=0.8,cap=40", timeout=420),
        Scenario("watch_gap", _watch_gap.__doc__ or "", (6, 12), _watch_gap, env=_STORM_ENV, capacity=3,
                 delay="lognormal:scale=3,sigma=0.8,cap=30"),
        Scenario("flaky_api", _flaky_api.__doc__ or "", (4, 10), _flaky_api,
                 delay="lognormal:scale=15,sigma=0.3,cap=40",  # the retry comes while the TI is still queued
                 env={"AIRFLOW__KUBERNETES_EXECUTOR__KUBE_CLIENT_REQUEST_ARGS": '{"_request_timeout": [5, 5]}',
                      "AIRFLOW__KUBERNETES_EXECUTOR__TASK_PUBLISH_MAX_RETRIES": "-1"}),
        Scenario("zombie_backlog", _zombie_backlog.__doc__ or "", (12, 12), _zombie_backlog, timeout=420,
                 env={"AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "10"}),
        Scenario("failover_noretry", "The failover with retries=0 on the DAG: a try burned by HA is a "
                 "failed task. " + (_failover.__doc__ or ""), (8, 12), _failover, retries=0,
                 env={**_STORM_ENV, "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15"}, capacity=2,
                 delay="lognormal:scale=6,sigma=0.8,cap=40", timeout=420),
        Scenario("api_faults", _api_faults.__doc__ or "", (6, 12), _api_faults, task_seconds=8, fail_first=True,
                 timeout=360,
                 # Airflow's default (delete finished pods, keep failed ones, patched done): deletes and
                 # patches are then routine calls of both executors; faster orphan checks list more often.
                 env={"AIRFLOW__KUBERNETES_EXECUTOR__DELETE_WORKER_PODS": "True",
                      "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "10"}),
        Scenario("clear_running", _clear_running.__doc__ or "", (4, 8), _clear_running, task_seconds=40,
                 env={"AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "600"}),
        Scenario("retry_storm", _retry_storm.__doc__ or "", (10, 20), _retry_storm, fail_first=True, timeout=240,
                 env={"AIRFLOW__CORE__PARALLELISM": "4"}),
        Scenario("shared_namespace", _shared_namespace.__doc__ or "", (4, 8), _shared_namespace,
                 neighbour=(4, 60.0, 15.0), timeout=300),
        Scenario("rolling_restart", _rolling_restart.__doc__ or "", (6, 12), _rolling_restart,
                 delay="uniform:scale=35,cap=70", timeout=480,
                 env={"AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "600"}),
        Scenario("api_cut_off", _api_cut_off.__doc__ or "", (6, 12), _api_cut_off,
                 delay="uniform:scale=35,cap=70", timeout=480,
                 env={"AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "600"}),
        Scenario("db_outage", _db_outage.__doc__ or "", (6, 12), _db_outage,
                 delay="uniform:scale=35,cap=70", timeout=480,
                 env={"AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "600"}),
    )
}

#: The default mix: the triggers operators hit most (quota pressure, clears, a chart upgrade's
#: rolling restart), in about 10 minutes for both executors with --quick.
DEFAULT = ("pending_storm", "clear_churn", "rolling_restart")
