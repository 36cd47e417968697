"""The lab's measurements, as pure functions over the evidence a run leaves behind.

Executor-agnostic on purpose: the same rules judge the stock and the fenced executor. A
*launch* is one transition of a TI id into QUEUED, read from a trigger-fed log of every
``task_instance`` change (``evidence.ti_log``), so launches of stock rows (which carry no token)
are told apart as well as ours. A pod belongs to the latest launch of its TI id before the pod
was created; it is *superseded* from the next launch of that id, or from the moment the id
disappears (clear, retry, reset), whichever comes first.

Two measurements do not come from the launch log and so cannot be fooled by the fences: leaked
executor slots come from each live scheduler's own ``executor.running_tasks`` gauge (Airflow's
``BaseExecutor`` statsd metrics) at the end of the run, and deletions of another deployment's
pods come from the API audit (who created and who deleted each pod).
"""

from __future__ import annotations

import bisect
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

TERMINAL = {"success", "failed", "skipped", "upstream_failed", "removed"}
#: TI states in which a TI legitimately holds an executor slot.
HOLDS_SLOT = {"queued", "running", "restarting"}
#: A scheduler whose gauges are older than this at collection time is gone (killed) and not counted.
GAUGE_FRESH_SECONDS = 20.0
STALE_EXIT_MARK = "stale executor launch: not running the task"
#: ``fenced_k8s_executor.worker.STOPPED``: a pod told to stop before its task started.
STOPPED_MARK = "stopped before the task started: not running it"
RUN_PATH = re.compile(r"/execution/task-instances/([0-9a-f-]{36})/run")


@dataclass
class Evidence:
    """What one executor run left behind (plain data; see ``lab/evidence.py`` for collection)."""

    ti_log: list[dict]  # {ts, ti_id, op: INSERT|UPDATE|gone|delete, state, try_number, task_id}
    tis: list[dict]  # final task_instance rows {id, dag_id, task_id, run_id, map_index, try_number, state}
    history: list[dict]  # task_instance_history rows {ti_id, dag_id, task_id, run_id, map_index, try_number, state}
    pods: list[dict]  # {name, ti_id, task_id, try_number, created, started, finished, exit_code,
    #                    output_stale_exit, stopped_at_start, told_to_stop, ran_task, ran_at, failed_on_purpose}
    run_calls: list[dict]  # api-server /run responses {ts, ti_id, status}
    deletes: list[dict]  # scheduler deletes from the API audit {ts, who, name}
    decisions: list[dict]  # fence decision log lines {decision, path, reason, pod}
    wall_seconds: float = 0.0
    faults: list[dict] = field(default_factory=list)  # {ts, what}
    #: last executor gauges per scheduler process {sender, executor.running_tasks, ..., ts}; None: not measured
    gauges: list[dict] | None = None
    collected_at: float | None = None  # when the gauges were read
    cleared: list[dict] = field(default_factory=list)  # TIs a user cleared through the REST API {ts, task_id}
    #: deletions of the other deployment's pods in a shared namespace {ts, who, name, creator}; None: no neighbour
    cross_deletes: list[dict] | None = None
    #: terminal executor events the schedulers received, from their logs {log, task_id, try_number, state}; None: not read
    executor_events: list[dict] | None = None
    #: the pod watcher dying or being restarted, from the scheduler logs {log, kind: crash|restart}; None: not read
    watcher_lines: list[dict] | None = None
    #: scheduler processes that exited while the run went on {ts, role, returncode, requested, last_error};
    #: ``requested``: the scenario killed it on purpose. None: not supervised
    scheduler_exits: list[dict] | None = None
    #: scheduler processes started while the run went on (a rolling update's new pods, a crashed
    #: one started again) {ts, role, why}; None: not supervised
    scheduler_restarts: list[dict] | None = None
    #: API requests of the schedulers that an injected fault hit, from the API audit {verb, who, code}
    api_faults: list[dict] | None = None
    #: the run gate's own ``409 stale_executor_launch`` answers {ts, ti_id}; None: not read
    gate_rejections: list[dict] | None = None
    #: airflow-core's stuck-in-queued handler {ts, ti_id, outcome: requeued | failed}; None: not read
    stuck_in_queued: list[dict] | None = None


@dataclass
class Launch:
    ti_id: str
    queued_at: float
    superseded_at: float | None = None


def launches(ti_log: Iterable[dict]) -> dict[str, list[Launch]]:
    """Launches per TI id from the change log (ordered by time)."""
    out: dict[str, list[Launch]] = defaultdict(list)
    state: dict[str, str | None] = {}
    for entry in sorted(ti_log, key=lambda e: e["ts"]):
        ti_id, op = entry["ti_id"], entry["op"]
        if op in ("gone", "delete"):
            if out[ti_id] and out[ti_id][-1].superseded_at is None:
                out[ti_id][-1].superseded_at = entry["ts"]
            state[ti_id] = None
            continue
        new_state = entry.get("state")
        if new_state == "queued" and state.get(ti_id) != "queued":
            if out[ti_id] and out[ti_id][-1].superseded_at is None:
                out[ti_id][-1].superseded_at = entry["ts"]
            out[ti_id].append(Launch(ti_id, entry["ts"]))
        state[ti_id] = new_state
    return dict(out)


def launch_of(pod: dict, by_ti: dict[str, list[Launch]]) -> Launch | None:
    """The launch a pod was created for: the latest launch of its TI id before its workload was
    issued (the workload JWT's ``iat``, whole seconds, hence the 1 s slack), or, without one,
    before the pod was created. An old job that creates its pod after a newer launch began is
    thereby still attributed to its own, older launch."""
    found = by_ti.get(pod.get("ti_id") or "")
    if not found:
        return None
    issued = pod["launch_iat"] + 1.0 if pod.get("launch_iat") is not None else pod["created"]
    index = bisect.bisect_right([launch.queued_at for launch in found], min(issued, pod["created"])) - 1
    return found[index] if index >= 0 else None


def _superseded_when_started(pod: dict, launch: Launch | None) -> bool:
    return (
        launch is not None
        and pod.get("started") is not None
        and launch.superseded_at is not None
        and pod["started"] >= launch.superseded_at
    )


def _ran_superseded(pod: dict, launch: Launch | None) -> bool:
    """The pod ran the task code after its launch had been superseded: by when its task code
    started (``ran_at``) when known, which counts a pod that started in time and ran late (a
    stuck-in-queued re-queue of the same TI id lets it through /run); else by its container start."""
    if not pod.get("ran_task"):
        return False
    if pod.get("ran_at") is None:
        return bool(pod.get("_stale"))
    return launch is not None and launch.superseded_at is not None and pod["ran_at"] >= launch.superseded_at


def _sent(call: dict) -> float:
    """When a /run request came in (older evidence: when it was answered)."""
    return call["sent"] if call.get("sent") is not None else call["ts"]


def _ran_then(pod: dict, call: dict) -> bool:
    """Whether ``pod``'s container ran when ``call`` (a /run of its TI id) came in."""
    if pod.get("started") is None or call.get("ts") is None or call.get("ti_id") != pod.get("ti_id"):
        return False
    end = pod.get("finished") or float("inf")
    return pod["started"] <= _sent(call) <= end + 1.0


def _run_calls_of(pod: dict, calls: list[dict], pods: list[dict]) -> list[dict]:
    """The /run calls this pod sent: its TI id's calls while its container ran, each given to one
    pod only. When two pods of one TI id ran at once (a stuck-in-queued re-queue keeps the id), a
    call goes to the one not yet told to stop, then to the one started last: the access log does
    not name the pod, and the re-queue's new pod is the one that sends /run."""
    def owner(call: dict) -> dict | None:
        running = [p for p in pods if _ran_then(p, call)]
        if not running:
            return None
        return max(running, key=lambda p: (p.get("told_to_stop") is None or p["told_to_stop"] > _sent(call),
                                           p["started"]))

    return [c for c in calls if _ran_then(pod, c) and owner(c) is pod]


def start_stops(ev: Evidence) -> dict[str, int | None]:
    """Pods told to stop (deleted) after their container started and before they sent /run (a
    stuck-in-queued revoke of a slow start, a fence's delete), and /run requests pods sent after
    they had been told to stop (the Task SDK's warm shutdown on Airflow 3.4; a request already in
    flight at the stop does not count). None without /run times."""
    if not ev.run_calls or any(c.get("ts") is None for c in ev.run_calls) or any(
            "told_to_stop" not in p for p in ev.pods):
        return {"pods_stopped_while_starting": None, "run_after_stop": None}
    stopped, late = 0, 0
    for pod in ev.pods:
        told = pod.get("told_to_stop")
        if told is None or pod.get("started") is None or told < pod["started"]:
            continue
        calls = _run_calls_of(pod, ev.run_calls, ev.pods)
        if not any(_sent(c) < told for c in calls):
            stopped += 1
        late += sum(1 for c in calls if _sent(c) >= told)
    return {"pods_stopped_while_starting": stopped, "run_after_stop": late}


def measure(ev: Evidence) -> dict[str, Any]:
    by_ti = launches(ev.ti_log)
    pods_by_launch: dict[tuple, list[dict]] = defaultdict(list)
    superseded_started: list[dict] = []
    for pod in ev.pods:
        launch = launch_of(pod, by_ti)
        pod["_launch"] = (launch.ti_id, launch.queued_at) if launch else None
        if launch is not None and pod.get("started") is not None:
            pods_by_launch[pod["_launch"]].append(pod)
        pod["_stale"] = _superseded_when_started(pod, launch)
        # Its launch was still current when the pod finished: its terminal event must be applied.
        pod["_current_at_finish"] = launch is not None and (
            launch.superseded_at is None or pod.get("finished") is None or pod["finished"] < launch.superseded_at)
        pod["_ran_superseded"] = _ran_superseded(pod, launch)
        if pod["_stale"]:
            superseded_started.append(pod)

    wasted = sum(max(0.0, (p.get("finished") or p["started"]) - p["started"]) for p in superseded_started)
    duplicates = sum(len(started) - 1 for started in pods_by_launch.values() if len(started) > 1)

    statuses = Counter(call["status"] for call in ev.run_calls)
    stale_exits = sum(1 for p in ev.pods if p.get("output_stale_exit"))
    handled_404 = sum(1 for p in ev.pods if p.get("output_stale_exit") == "ti_not_found")
    # The run gate's own 409s, from the api-server's decision lines: a launch the fence turned away,
    # never a failure, whatever became of the worker (older evidence: the workers' stale lines).
    gate_409 = (len(ev.gate_rejections) if ev.gate_rejections is not None
                else sum(1 for p in ev.pods if p.get("output_stale_exit") == "stale_executor_launch"))
    # Airflow 3.4 answers /run of an archived attempt with 410 (the fenced worker: attempt_archived).
    handled_410 = sum(1 for p in ev.pods if p.get("output_stale_exit") == "attempt_archived")
    # A pod told to stop while its /run was in flight, then refused: the stop's doing, not a failure.
    stopped = Counter(str((p.get("stopped_at_start") or {}).get("status")) for p in ev.pods if p.get("stopped_at_start"))

    # The lab's tasks fail only on purpose (``failed_on_purpose``: the task printed its fail mark for
    # that try): every other transition of a try into failed or up_for_retry is a burned retry (a
    # user's clear archives the try without one). It is burned by a stale launch when a superseded
    # pod of that TI id had ended Failed before it.
    # A try a user cleared while it ran goes restarting -> up_for_retry without using a retry: not
    # burned either.
    own_failures = {(p.get("task_id"), str(p.get("try_number"))) for p in ev.pods if p.get("failed_on_purpose")}
    failed_tries, previous = [], {}
    for e in sorted(ev.ti_log, key=lambda e: e["ts"]):
        if (e.get("state") in ("failed", "up_for_retry") and e["op"] == "UPDATE"
                and previous.get(e["ti_id"]) != "restarting"
                and (e.get("task_id"), str(e.get("try_number"))) not in own_failures):
            failed_tries.append(e)
        previous[e["ti_id"]] = e.get("state")
    stale_failures: dict[str, float] = {}
    for pod in superseded_started:
        if pod.get("exit_code") not in (None, 0):
            end = pod.get("finished") or pod["started"]
            stale_failures[pod["ti_id"]] = min(end, stale_failures.get(pod["ti_id"], end))
    burned_by_stale = sum(
        1 for e in failed_tries if e["ti_id"] in stale_failures and stale_failures[e["ti_id"]] <= e["ts"] + 1.0
    )

    pod_launch = {p["name"]: p for p in ev.pods}
    fence_deletes = {d["pod"].split("/")[-1]: d for d in ev.decisions if d["decision"] == "pod.deleted"}
    false_positives = 0
    for delete in ev.deletes:
        decision = fence_deletes.get(delete["name"])
        if decision is None or decision.get("path") == "revoke":
            continue  # not a fence's own verdict (completion cleanup, scheduler-requested revoke)
        pod = pod_launch.get(delete["name"])
        launch = launch_of(pod, by_ti) if pod else None
        if launch is not None and (launch.superseded_at is None or launch.superseded_at > delete["ts"]):
            false_positives += 1  # the pod's launch was still current when it was deleted

    decisions = Counter(f"{d['decision']}:{d['reason']}" for d in ev.decisions)
    final_states = Counter(t.get("state") for t in ev.tis)
    return {
        "tasks": len(ev.tis),
        "launches": sum(len(v) for v in by_ti.values()),
        "pods_created": len(ev.pods),
        "pods_started": sum(1 for p in ev.pods if p.get("started") is not None),
        "pods_started_for_superseded_launch": len(superseded_started),
        "stale_pods_turned_away": stale_exits,
        "run_404": max(0, statuses.get(404, 0) - handled_404 - stopped["404"]),
        "run_409": max(0, statuses.get(409, 0) - gate_409 - stopped["409"]),
        "run_410": max(0, statuses.get(410, 0) - handled_410 - stopped["410"]),
        # A workload token past its lifetime (task_queued_timeout from when it was minted): a job
        # that waited out a quota before its pod was created.
        "run_403": max(0, statuses.get(403, 0) - stopped["403"]),
        "run_rejected_stale": gate_409 + handled_404 + handled_410,
        "run_gate_rejected": None if ev.gate_rejections is None else len(ev.gate_rejections),
        "stopped_at_start": sum(1 for p in ev.pods if p.get("stopped_at_start")),
        **start_stops(ev),
        "duplicate_pods": duplicates,
        "retries_burned": len(failed_tries),
        "retries_burned_by_stale": burned_by_stale,
        "tries_burned_by_ha": tries_burned_by_ha(ev, own_failures),
        "stale_task_runs": sum(1 for p in ev.pods if p["_ran_superseded"]),
        "tasks_failed": sum(1 for t in ev.tis if t.get("state") == "failed"),
        "tasks_succeeded": sum(1 for t in ev.tis if t.get("state") == "success"),
        "tasks_not_terminal": sum(1 for t in ev.tis if t.get("state") not in TERMINAL),
        **stuck_in_queued(ev.stuck_in_queued),
        "wasted_pod_seconds": round(wasted, 1),
        "pods_deleted_by_executor": len(ev.deletes),
        "false_positive_deletions": false_positives,
        "executor_slots_leaked": slots_leaked(ev, sum(final_states[s] for s in HOLDS_SLOT)),
        "other_deployment_pods_deleted": None if ev.cross_deletes is None else len(ev.cross_deletes),
        "own_pods_deleted_by_neighbour": None if ev.cross_deletes is None else sum(
            1 for d in ev.cross_deletes if not str(d["who"]).startswith("scheduler")),
        "scheduler_crashes": scheduler_crashes(ev.scheduler_exits),
        "scheduler_restarts": None if ev.scheduler_restarts is None else len(ev.scheduler_restarts),
        "watcher_crashes": watcher_crashes(ev.watcher_lines),
        **events_applied(ev.executor_events, ev.pods, failed_in_queue(ev)),
        "api_faults_hit": None if ev.api_faults is None else dict(sorted(Counter(
            f["verb"] for f in ev.api_faults).items())),
        "fencing_decisions": dict(sorted(decisions.items())),
        "wall_seconds": round(ev.wall_seconds, 1),
    }


def tries_burned_by_ha(ev: Evidence, own_failures: set[tuple] | None = None) -> int | None:
    """Tries consumed that neither the task code nor a user asked for: per task, the final
    try_number minus the first try, the retries its own deliberate failures used (a failed try
    below the final one) and the user's clears through the REST API (each clear archives the try;
    the next scheduling takes a new one). What is left was taken by HA: orphan resets, failures
    the executor reported for pods it lost or for stale pods, stuck-in-queued failures."""
    if own_failures is None:
        own_failures = {(p.get("task_id"), str(p.get("try_number"))) for p in ev.pods if p.get("failed_on_purpose")}
    if not ev.tis or any(t.get("try_number") is None or t.get("task_id") is None for t in ev.tis):
        return None
    clears = Counter(c.get("task_id") for c in ev.cleared)
    burned = 0
    for ti in ev.tis:
        final = int(ti["try_number"])
        own = sum(1 for task, tr in own_failures if task == ti["task_id"] and tr.isdigit() and int(tr) < final)
        burned += max(0, final - 1 - own - clears[ti["task_id"]])
    return burned


def scheduler_crashes(exits: list[dict] | None) -> int | None:
    """Scheduler processes that exited on their own while the run went on (the lab restarts
    them, as a Deployment would): every exit the scenario did not ask for (SIGKILL in
    ``failover``). None when the processes were not supervised."""
    if exits is None:
        return None
    return sum(1 for e in exits if not e.get("requested"))


def watcher_crashes(lines: list[dict] | None) -> int | None:
    """Pod watcher processes that died: each ``Unknown error in KubernetesJobWatcher. Failing``
    (the provider's watcher re-raising; its process exits) is one, and each restart by the
    executor's health check (``Process died for unknown reasons``) that no such line explains is
    one more (a watcher that died without logging). Read per scheduler log, in order."""
    if lines is None:
        return None
    crashes, unexplained = 0, defaultdict(int)
    for line in lines:
        if line["kind"] == "crash":
            crashes += 1
            unexplained[line.get("log")] += 1
        elif line["kind"] == "restart":
            if unexplained[line.get("log")]:
                unexplained[line.get("log")] -= 1
            else:
                crashes += 1
    return crashes


def failed_in_queue(ev: Evidence) -> set[tuple[str, str]]:
    """(task_id, try_number) of the tries airflow-core failed at its stuck-in-queued limit: core
    sends their failed event itself (``executor.fail``), no pod does."""
    failed = {line["ti_id"] for line in ev.stuck_in_queued or () if line["outcome"] == "failed"}
    return {(str(e.get("task_id")), str(e.get("try_number"))) for e in ev.ti_log
            if e["ti_id"] in failed and e.get("state") == "queued"}


def events_applied(events: list[dict] | None, pods: list[dict],
                   sent_by_core: set[tuple[str, str]] = frozenset()) -> dict[str, int | None]:
    """Whether each pod's terminal state reached the scheduler exactly once.

    Expected: one terminal executor event (success/failed) per TI try (task_id, try_number)
    whose pod for that launch started while the launch was current (not ``_stale``) and finished
    while it still was (``_current_at_finish``; both set by ``measure``). A pod whose launch was
    superseded while it ran (the task reported its own failure and the retry minted a new row, a
    user cleared it, an orphan reset) may have its event dropped, never applied twice. Received:
    the schedulers' ``Received executor event with state success|failed`` lines for that try.
    ``events_lost``: expected tries received 0 times; ``events_applied_extra``: tries received more
    often than their pods allow (twice, or for a try whose only finished pods were stale: a stale
    pod's state landing on the live try); a try core failed at the stuck-in-queued limit
    (``sent_by_core``) has its one event from core. None when the logs were not read."""
    keys = ("events_not_applied_once", "events_lost", "events_applied_extra")
    if events is None:
        return dict.fromkeys(keys)
    received = Counter((str(e["task_id"]), str(e["try_number"])) for e in events
                       if e.get("state") in ("success", "failed"))
    expected, allowed = set(), set()
    for p in pods:
        if p.get("exit_code") is None or p.get("_stale") or p.get("task_id") is None:
            continue
        key = (str(p.get("task_id")), str(p.get("try_number")))
        allowed.add(key)
        if p.get("_current_at_finish", True):
            expected.add(key)
    allowed |= set(sent_by_core)
    lost = sum(1 for k in expected if received[k] == 0)
    extra = sum(1 for k, n in received.items() if n > (1 if k in allowed else 0))
    return {"events_not_applied_once": lost + extra, "events_lost": lost, "events_applied_extra": extra}


def slots_leaked(ev: Evidence, tis_holding_slots: int) -> int | None:
    """Executor slots still taken at the end of the run, by Airflow's own accounting: the sum of
    ``executor.running_tasks`` over the schedulers still reporting, minus the TIs that may hold a
    slot (queued/running/restarting). None when no gauge arrived (statsd not installed)."""
    if not ev.gauges:
        return None
    now = ev.collected_at or max(g.get("ts", 0) for g in ev.gauges)
    live = [g for g in ev.gauges if "executor.running_tasks" in g and g.get("ts", 0) >= now - GAUGE_FRESH_SECONDS]
    running = sum(int(g["executor.running_tasks"]) for g in live)
    return max(0, running - tis_holding_slots)


def stuck_in_queued(lines: list[dict] | None) -> dict[str, int | None]:
    """airflow-core's stuck-in-queued handler: re-queues (revoke, back to scheduled, same id and
    try) and the tasks it failed at its re-queue limit. None when the logs were not read."""
    if lines is None:
        return {"requeues": None, "tasks_failed_in_queue": None}
    return {"requeues": sum(1 for line in lines if line["outcome"] == "requeued"),
            "tasks_failed_in_queue": len({line["ti_id"] for line in lines if line["outcome"] == "failed"})}


def stopped_at_start(output: str) -> dict[str, str] | None:
    """The worker's line for a pod told to stop before its task started {reason, status}, or None."""
    for line in output.splitlines():
        if STOPPED_MARK in line:
            found = dict(re.findall(r'"(reason|status|signal)"\s*:\s*"([^"]*)"', line)
                         or re.findall(r"(reason|status|signal)=(\S+)", line))
            return {"reason": found.get("reason", "stopped_before_run"), "status": found.get("status", "-"),
                    "signal": found.get("signal", "-")}
    return None


def stale_exit_reason(output: str) -> str | None:
    """The reason a worker gave for a clean stale exit (``stale_executor_launch``, ``ti_not_found``,
    ``attempt_archived``)."""
    for line in output.splitlines():
        if STALE_EXIT_MARK in line:
            match = re.search(r'"reason"\s*:\s*"(\w+)"|reason=(\w+)', line)
            return (match.group(1) or match.group(2)) if match else "stale_executor_launch"
    return None
