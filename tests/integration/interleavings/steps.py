"""The steps the machine may take (a mixin), each one ordinary thing a scheduler, a user, the
kubelet, a worker or the infrastructure does. ``STEPS`` gives each a weight and a precondition;
the machine draws one applicable step at a time, and the step draws its own arguments.
"""

from __future__ import annotations

import os

import threading
import time
from typing import Any

import hypothesis.strategies as st

from interleavings.model import Violation

TASKS = ("t1", "t2")
#: t2 is a sensor in reschedule mode: its pokes share one try, each a launch of its own.
SENSOR = "t2"
#: The DAG file's ``task`` made per task: t2 a reschedule-mode sensor (``@task.sensor``), t1 a task.
DAG_IMPORTS = """
from airflow.sdk import task as _task


def task(task_id, **kwargs):
    if task_id == %r:
        return _task.sensor(task_id=task_id, mode="reschedule", poke_interval=1, timeout=3600, **kwargs)
    return _task(task_id=task_id, **kwargs)
""" % SENSOR
#: Seconds of an explicit wait: past the 3 s health-check threshold (airflow-core's orphan check)
#: and the fenced hand-over grace (two 1 s heartbeats): every heartbeat not written meanwhile is missed.
WAIT = 3.2
PERSISTENT = {"500": dict(method="*", path=r"/pods", status=500),
              "503": dict(method="*", path=r"/pods", status=503),
              "delete404": dict(method="DELETE", path=r"/pods/", status=404)}
LIVE = ("Pending", "Running")


def _live(m):
    return bool(m.live_slots())


def _peers(m):
    return len(m.live_slots()) > 1


#: Clone deployments per run (``clone_appears``: a copy of the PostgreSQL cluster and a scheduler
#: process of its own, 10-20 s a draw here once the source is checkpointed first): four in the
#: default budget (seed 2 draws four), none more, so that its cost stays bounded; the long run
#: (CHECKER_EXAMPLES) has no cap. A shrink replays without a clone once the run had its last one.
CLONES = int(os.environ.get("CHECKER_CLONES", "4" if "CHECKER_EXAMPLES" not in os.environ else "1000000"))
#: step -> (weight, precondition). The compound steps (below ``sensor_reschedules``, in
#: ``compound.py``) each build in one draw a state where a fence must act, which chains of single
#: steps reached about once per hundred steps or never (docs/checker.md); issue 45's steps are in
#: ``ground.py``. Hypothesis draws the first entry of a list far more often than
#: its weight says (about one draw in six) and shrinks towards it: a scheduler loop, which every
#: promise needs anyway (it was ``idle``, which made a fifth of all steps do nothing).
STEPS: dict[str, tuple[int, Any]] = {
    "scheduler_loop": (6, _live),
    "idle": (1, lambda m: True),
    "heartbeat": (1, _live),
    "enqueue": (2, _live),
    "trigger": (2, _live),
    "sync": (4, _live),
    "wait": (2, lambda m: True),
    "clear": (2, lambda m: True),
    "stuck_in_queued": (2, _live),
    "adopt_orphans": (1, _live),
    "kubelet_starts": (3, lambda m: m.pods_where("Pending")),
    "worker_runs": (3, lambda m: m.pods_where("Running", ran=None)),
    "worker_finishes": (2, lambda m: m.pods_where("Running", ran="won")),
    "kubelet_fails": (1, lambda m: m.pods_where(*LIVE)),
    "api_fault": (2, _live),
    "heal": (1, lambda m: any(s.faults for s in m.live_slots())),
    "watch_dropped": (1, _live),
    "slow_create_loop": (1, lambda m: [s for s in m.live_slots() if not s.busy]),
    "db_down_loop": (1, _live),
    "scheduler_exits": (1, _peers),
    "scheduler_restarts": (1, lambda m: m.slots),
    "third_scheduler": (1, lambda m: len(m.slots) < 3),
    "other_deployments_pod": (1, lambda m: True),
    "tokenless_pod": (1, lambda m: True),
    "sensor_reschedules": (2, lambda m: m.pods_where("Running", ran="won", task=SENSOR)),
    "start_then_supersede": (3, _live),
    "cut_off_then_supersede": (2, _peers),
    "revoke_loses_delete": (2, _live),
    "orphaned_queued_task": (1, lambda m: _peers(m) and m.schedulable()),
    "sensor_pokes_again": (2, _live),
    "supersede_past_a_failing_delete": (2, _live),
    "retry_while_finishing": (2, _live),
    "finishing_pod_ends": (1, lambda m: m.pods_where("Running", ran="reported")),
    "cut_off_supersede_then_heal": (1, _peers),
    "outage_while_finishing": (1, _live),
    "clear_while_running": (2, _live),
    "revoked_pod_runs": (2, _live),
    "foreign_pod_then_revoke": (1, _live),
    # issue 45's ground (ground.py)
    "new_generation": (1, _live),
    "clone_appears": (1, lambda m: m.clone is None and _live(m) and type(m).clones < CLONES),
    "black_holed_loop": (1, lambda m: m.hop is not None and _live(m)),
    "hostile_pod": (2, _live),
}
#: Steps every example may draw; each other step is in a given example's menu or not, half and half
#: (swarm testing: an example without workers, say, lets Running pods wait before /run).
CORE = ("idle", "heartbeat", "scheduler_loop", "enqueue", "trigger", "sync", "wait")
OPTIONAL = tuple(name for name in STEPS if name not in CORE)


def menu(swarm: int) -> list[str]:
    """The weighted steps of one example: the core ones, and the optional ones whose bit is clear
    (so Hypothesis's simplest draw, 0, is the whole menu, and shrinking moves towards it)."""
    enabled = set(CORE) | {name for i, name in enumerate(OPTIONAL) if not swarm >> i & 1}
    return [name for name, (weight, _) in STEPS.items() if name in enabled for _ in range(weight)]


class Steps:
    def idle(self, data):
        """Nothing happens (what the shrinker turns a step into when it cannot delete it)."""

    # ------------------------------------------------------------------ the scheduler's loop

    def scheduler_loop(self, data):
        """One whole loop as ``airflow scheduler`` runs it: heartbeat (or a skipped one), the critical
        section, then the executor's heartbeat (trigger, sync) and its events."""
        slot = self.pick(data)
        beat = data.draw(st.booleans(), label="heartbeats")
        with self.step(f"{slot.name}: scheduler loop ({'heartbeat' if beat else 'heartbeat skipped'}, enqueue, "
                       f"trigger, sync, events)"):
            self.whole_loop(slot, beat)

    def whole_loop(self, slot, beat: bool = True) -> None:
        self.join(slot)
        if beat:
            self.beat(slot)
        self.enqueue_by(slot)
        slot.sched.trigger()
        self.after_loop(slot, self.loop(slot))

    def enqueue_by(self, slot) -> None:
        """The critical section of ``slot``'s scheduler (its loop's schedule + enqueue), and the launches it made."""
        self.core(slot, "enqueue", slot.sched.queue, self.world.dag_id, self.world.run_id, trigger=False)
        self.capture_launches(self.rows())

    def enqueue(self, data):
        slot = self.pick(data)
        with self.step(f"{slot.name}: schedule + enqueue (critical section)"):
            self.join(slot)
            self.core(slot, "enqueue", slot.sched.queue, self.world.dag_id, self.world.run_id, trigger=False)

    def trigger(self, data):
        slot = self.pick(data)
        with self.step(f"{slot.name}: trigger_tasks"):
            self.join(slot)
            slot.sched.trigger()

    def sync(self, data):
        slot = self.pick(data)
        with self.step(f"{slot.name}: sync + process executor events"):
            self.join(slot)
            self.after_loop(slot, self.loop(slot))

    def after_loop(self, slot, error) -> None:
        if error is not None:
            self.fail("sync_raised", f"{slot.name}.sync() raised {error!r}", key=("sync", slot.name, repr(error)))
        elif slot.capable:
            self.count_loop(slot)

    def heartbeat(self, data):
        slot = self.pick(data)
        with self.step(f"{slot.name}: heartbeat (when due)"):
            self.beat(slot)

    def wait(self, data):
        """Time passes: a scheduler that did not heartbeat meanwhile skipped its heartbeats."""
        with self.step(f"wait {WAIT} s"):
            self.pass_time()

    def pass_time(self, beating: tuple = ()) -> None:
        """WAIT seconds pass (a new epoch); the schedulers in ``beating`` heartbeat meanwhile, when due."""
        self.join_all()
        end = time.monotonic() + WAIT
        while time.monotonic() < end:
            for slot in beating:
                self.beat(slot)
            time.sleep(min(0.25, max(0.0, end - time.monotonic())))
        self.clock.epoch += 1
        for slot in self.slots:
            for fault_id in slot.transient.values():
                self.env.emulator.clear_faults(fault_id)
            slot.transient = {}

    def stuck_in_queued(self, data):
        slot = self.pick(data)
        with self.step(f"{slot.name}: stuck-in-queued handler (timeout 0)"):
            self.join(slot)
            self.stuck(slot, timeout=0.0)

    def stuck(self, slot, timeout: float) -> None:
        before = self.rows()
        mine = {t: r for t, r in before.items() if r.state == "queued" and r.queued_by == slot.sched.job_id}
        self.sanctioned |= {(slot.user, r.id) for r in mine.values()}
        self.revoking.add(slot.user)
        self.core(slot, "stuck-in-queued", slot.sched.stuck_in_queued, timeout=timeout)
        after = self.rows()
        for task in mine:
            if after[task].state != "queued":
                self.launches.revoked.add(self.launches.latest(task))
                if after[task].state == "failed":
                    self.burns.allow(task)  # requeued too often: failed, as stock fails it

    def adopt_orphans(self, data):
        slot = self.pick(data)
        with self.step(f"{slot.name}: adopt_or_reset_orphaned_tasks"):
            self.join(slot)
            self.adopt(slot)

    def adopt(self, slot) -> None:
        before = self.rows()
        adoptable = self.adoptable(before) if not slot.faults else {}
        from airflow.utils.session import create_session

        def orphans():
            self.beat(slot)
            with create_session() as session:
                slot.sched.runner.adopt_or_reset_orphaned_tasks(session=session)

        self.core(slot, "adopt_or_reset_orphaned_tasks", orphans)
        for task, row in self.rows().items():
            if before[task].state in ("queued", "running") and row.state is None:
                if task in adoptable:
                    self.fail("adopted_task_reset", f"{slot.name}'s adoption reset task {task} ({before[task].state}) "
                              f"whose pod {adoptable[task]} of its current launch is alive",
                              key=("reset", task, before[task].id))
                self.burns.allow(task)  # reset: the try is archived, as stock archives it

    def adoptable(self, rows: dict) -> dict[str, str]:
        """Task -> the live pod stock's adoption finds for it: of its current launch, its TI id and try,
        labelled for the scheduler that queued it (``adopt_or_reset_orphaned_tasks`` lists a dead
        scheduler's pods by that label). The checker's own pods (other deployments', hostile) are none."""
        from interleavings.kubelet import workload_of

        found = {}
        for pod in self.world.kube.list_namespaced_pod(self.world.namespace).items:
            record, meta = self.pods.get(pod.metadata.name), pod.metadata
            row = rows.get((meta.annotations or {}).get("task_id"))
            if record is None or record.bystander or row is None or meta.deletion_timestamp or row.queued_by is None:
                continue
            workload = workload_of(pod)
            if ((pod.status.phase if pod.status else None) or "Pending") in ("Pending", "Running") \
                    and (meta.labels or {}).get("airflow-worker") == str(row.queued_by) \
                    and (meta.annotations or {}).get("try_number") == str(row.try_number) \
                    and workload is not None and workload.ti_id == row.id \
                    and self.launches.current(row.task, record.launch):
                found[row.task] = meta.name
        return found

    # ------------------------------------------------------------------ users

    def clear(self, data):
        task = data.draw(st.sampled_from(TASKS), label="task")
        with self.step(f"user clears {task}"):
            self.clear_task(task)

    def clear_task(self, task: str) -> None:
        row = self.world.row(task)
        if row.state is not None:
            self.burns.cleared(task)
        self.world.airflow.clear(row)

    # ------------------------------------------------------------------ kubelet and workers

    def kubelet_starts(self, data):
        name = data.draw(st.sampled_from(self.pods_where("Pending")), label="pod")
        with self.step(f"kubelet starts {name}"):
            self.kubelet.start(name)
            self.pods[name].phase = "Running"

    def worker_runs(self, data):
        name = data.draw(st.sampled_from(self.pods_where("Running", ran=None)), label="pod")
        with self.step(f"worker of {name} calls /run"):
            self.run_worker(self.pods[name])

    def run_worker(self, pod) -> None:
        stale = self.launches.superseded(pod.task, pod.launch)
        obj = self.world.kube.read_namespaced_pod(pod.name, self.world.namespace)
        answer = self.worker.run(obj)
        pod.ran = "won" if answer.won else "refused"
        if answer.won and stale:
            self.fail("superseded_wins_run", f"{pod.name}'s /run answered 200 although task {pod.task} was "
                      f"launched again since", key=("run", pod.name))
        if not answer.won:
            pod.phase = "Succeeded" if self.worker.exits_cleanly(obj, answer) else "Failed"
            self.kubelet.end(pod.name, ok=pod.phase == "Succeeded")

    def worker_finishes(self, data):
        name = data.draw(st.sampled_from(self.pods_where("Running", ran="won")), label="pod")
        ok = data.draw(st.booleans(), label="succeeds")
        with self.step(f"worker of {name} reports {'success' if ok else 'failure'}"):
            self.finish_worker(self.pods[name], ok)

    def finish_worker(self, pod, ok: bool, finishing: bool = False) -> None:
        """The worker reports its task's outcome and its pod ends; ``finishing``: the pod goes on
        running a while (``finalize``: callbacks, listeners, the log upload) and ends later."""
        from interleavings.kubelet import workload_of

        row = self.rows()[pod.task]
        state = "success" if ok else ("up_for_retry" if row.try_number <= row.max_tries else "failed")
        obj = self.world.kube.read_namespaced_pod(pod.name, self.world.namespace)
        code = self.worker.report(workload_of(obj).ti_id, state)
        clean = ok and code in (200, 204)
        if not clean and self.launches.current(pod.task, pod.launch):
            self.burns.allow(pod.task)  # the task failed in its own pod: stock spends the try too
        if finishing:
            pod.ran = "reported"
            return
        pod.phase = "Succeeded" if clean else "Failed"
        self.kubelet.end(pod.name, ok=clean)

    def retry_while_finishing(self, data):
        """The pod of a current launch starts and wins /run; its task fails (up_for_retry) while the pod
        goes on finishing; the scheduler queues the retry: a new launch, and the row names the old
        pod as its host until the retry's /run. The old pod must be left to finish. On the task's last
        try the worker reports failed (the trace says so): the row is terminal while the pod finishes."""
        slot = self.pick(data)
        with self.step(f"{slot.name}'s newest pod starts (after a loop if it has none), wins /run, reports "
                       f"up_for_retry and goes on finishing; {slot.name} loops"):
            pod = self.winning_pod(data, slot)
            if pod is not None:
                self.finish_worker(pod, ok=False, finishing=True)
                if self.rows()[pod.task].state == "failed":
                    self.trace[-1] += " [its last try: reported failed]"
                self.whole_loop(slot)

    def finishing_pod_ends(self, data):
        name = data.draw(st.sampled_from(self.pods_where("Running", ran="reported")), label="pod")
        with self.step(f"{name} is done finishing and exits"):
            self.pods[name].phase = "Failed"
            self.kubelet.end(name, ok=False)

    def kubelet_fails(self, data):
        name = data.draw(st.sampled_from(self.pods_where(*LIVE)), label="pod")
        reason = data.draw(st.sampled_from(["Error", "OOMKilled", "ContainerCannotRun"]), label="reason")
        pod = self.pods[name]
        with self.step(f"kubelet: {name} fails ({reason})"):
            if self.launches.current(pod.task, pod.launch):
                self.burns.allow(pod.task)
            pod.phase = "Failed"
            self.kubelet.end(name, ok=False, reason=reason)

    # ------------------------------------------------------------------ faults

    def api_fault(self, data):
        slot = self.pick(data)
        kind = data.draw(st.sampled_from(sorted(PERSISTENT)), label="fault")
        with self.step(f"API answers {slot.name} with {kind} until healed"):
            if kind not in slot.faults:
                slot.faults[kind] = self.env.emulator.add_fault(who=slot.user, **PERSISTENT[kind])

    def heal(self, data):
        slot = self.pick(data, [s for s in self.live_slots() if s.faults])
        with self.step(f"API heals for {slot.name}"):
            for fault_id in slot.faults.values():
                self.env.emulator.clear_faults(fault_id)
            slot.faults = {}

    def watch_dropped(self, data):
        slot = self.pick(data)
        with self.step(f"watches dropped; {slot.name}'s reconnects wait 1 s"):
            slot.transient["watch"] = self.env.emulator.add_fault(method="GET", path=r"/pods$", delay=1.0,
                                                                  times=3, who=slot.user)
            self.env.emulator.close_watches()

    def slow_create_loop(self, data):
        """A loop whose pod create is slow (lands after 1.5 s) or whose answer is lost (stored, then
        the client times out): it runs in the background while the next steps happen."""
        slot = self.pick(data, [s for s in self.live_slots() if not s.busy])
        lost = data.draw(st.booleans(), label="answer lost")
        what = "create stored, answer lost" if lost else "create slow (1.5 s)"
        with self.step(f"{slot.name}: sync in the background, {what}"):
            spec = dict(persist_then_timeout=True, hang_seconds=3.5) if lost else dict(delay=1.5)
            slot.transient["create"] = self.env.emulator.add_fault(method="POST", path=r"/pods$", times=1,
                                                                   who=slot.user, **spec)

            def run():
                error = self.loop(slot)
                if error is not None:
                    slot.outcome["error"] = error

            slot.thread = threading.Thread(target=run, daemon=True, name=f"loop-{slot.name}")
            slot.thread.start()
            time.sleep(0.3)  # the loop is past its pre-create check, its create in flight

    def db_down_loop(self, data):
        slot = self.pick(data)
        with self.step(f"{slot.name}: sync while the metadata DB refuses connections"):
            from test_db_faults import db_outage

            self.join_all()
            raised: list[BaseException] = []
            done = threading.Event()

            def sync() -> None:
                try:
                    slot.sched.executor.sync()
                except BaseException as error:  # noqa: BLE001 - judged below, on the machine's thread
                    raised.append(error)
                finally:
                    done.set()

            # The outage lasts 3 s at most: the provider's sync puts a result whose state change
            # failed back on its queue and takes it again, so stock spins until the DB answers.
            with db_outage(self.world, self.env.pg_server):
                threading.Thread(target=sync, name=f"{slot.name}-sync", daemon=True).start()
                returned = done.wait(3.0)
            done.wait(60.0)
            if not returned:
                self.fail("loop_blocked", f"{slot.name}.sync() did not return while the DB refused connections (3 s)",
                          key=("dbsync", slot.name))
            for error in raised:
                if isinstance(error, Violation):
                    raise error
                self.fail("sync_raised", f"{slot.name}.sync() raised {error!r} during a DB outage",
                          key=("dbsync", slot.name))

    # ------------------------------------------------------------------ a sensor's pokes

    def sensor_reschedules(self, data):
        """The sensor's worker finds its condition unmet: ``PATCH /state`` up_for_reschedule (ready at
        once) and exits 0. airflow-core queues it again within the same try: a new launch, the same
        TI id and try."""
        name = data.draw(st.sampled_from(self.pods_where("Running", ran="won", task=SENSOR)), label="pod")
        with self.step(f"sensor {name} pokes, reschedules (up_for_reschedule), exits"):
            self.reschedule_worker(self.pods[name])

    def reschedule_worker(self, pod) -> None:
        from interleavings.kubelet import workload_of

        obj = self.world.kube.read_namespaced_pod(pod.name, self.world.namespace)
        row = self.rows()[pod.task]
        code = self.worker.reschedule(workload_of(obj).ti_id)
        if code in (200, 204):
            self.poked[pod.task] = (row.id, row.try_number, row.token)
        pod.phase = "Succeeded" if code in (200, 204) else "Failed"
        if code not in (200, 204) and self.launches.current(pod.task, pod.launch):
            self.burns.allow(pod.task)
        self.kubelet.end(pod.name, ok=pod.phase == "Succeeded")

    # ------------------------------------------------------------------ scheduler lifecycle

    def scheduler_exits(self, data):
        slot = self.pick(data)
        how = data.draw(st.sampled_from(["end", "kill"]), label="how")
        what = "stops (end(), Job success)" if how == "end" else "is killed (Job left running)"
        with self.step(f"{slot.name} {what}"):
            self.join(slot)
            self.exit(slot, how)

    def exit(self, slot, how: str) -> None:
        for fault_id in list(slot.faults.values()) + list(slot.transient.values()):
            self.env.emulator.clear_faults(fault_id)
        slot.faults, slot.transient = {}, {}
        if how == "end":
            slot.sched.stop()
            slot.status = "stopped"
            return
        executor = slot.sched.executor
        for watcher in executor.kube_scheduler.kube_watchers.values():
            watcher.kill()  # SIGKILL takes the whole process group
        if getattr(executor, "in_flight_pods", None) is not None:
            executor.in_flight_pods.stop()
        slot.status = "killed"

    def scheduler_restarts(self, data):
        slot = self.pick(data, self.slots)
        with self.step(f"{slot.name} restarts under a new job on {slot.host} (was {slot.status})"):
            self.join(slot)
            if slot.status == "live":
                self.exit(slot, "end")
            self.start(slot)

    def third_scheduler(self, data):
        from interleavings.machine import Slot

        with self.step("C starts"):
            self.slots.append(self.start(Slot("C", host="host-c")))

    # ------------------------------------------------------------------ other pods in the namespace

    def other_deployments_pod(self, data):
        same_address = data.draw(st.booleans(), label="same address")
        same_dag = data.draw(st.booleans(), label="same DAG")
        running = data.draw(st.booleans(), label="running")
        with self.step(f"another deployment's {'Running' if running else 'Pending'} pod appears (its DB "
                       f"{'behind the same address as ours' if same_address else 'at its own address'}, "
                       f"{'the same DAG and run as ours' if same_dag else 'its own DAG'})"):
            self.bystander("foreign", same_address=same_address, same_dag=same_dag, running=running)

    def tokenless_pod(self, data):
        running = data.draw(st.booleans(), label="running")
        with self.step(f"a tokenless (pre-upgrade) {'Running' if running else 'Pending'} pod appears"):
            self.bystander("tokenless", running=running)

    def bystander(self, origin: str, **how: Any) -> None:
        from interleavings.bystanders import make_pod

        make_pod(self, origin, **how)

    def legacy_job(self) -> int:
        """A stock scheduler's Job from before the upgrade (gone since): what tokenless pods name."""
        if self._legacy is None:
            from fenced_k8s_lab.core import Scheduler

            self._legacy = Scheduler.new_job(hostname="pre-upgrade-host").id
        return self._legacy
