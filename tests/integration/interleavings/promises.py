"""Observation and the promise checks the machine runs after every step (a mixin).

Everything here reads: the task rows (read-only SQL), the namespace's pods, the API server's
audit log (who deleted what) and each scheduler's ``running`` set. The only write is the
kubelet's: a graceful deletion is finished as a real kubelet finishes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fenced_k8s_executor.launch import as_token
from fenced_k8s_executor.names import DEPLOYMENT_ANNOTATION, TI_ID_ANNOTATION

from interleavings.kubelet import creator_of, launch_of, workload_of
from interleavings.model import LOOPS, TERMINAL, Pod, Violation

LIVE_PHASES = ("Pending", "Running")


@dataclass(frozen=True)
class TaskRow:
    task: str
    id: str
    state: str | None
    try_number: int
    max_tries: int
    token: str | None  # external_executor_id as stored (a UUID, a job id or None)
    queued_by: int | None
    hostname: str | None


@dataclass
class SlotWatch:
    """A slot held for a task that is terminal or another scheduler's, since ``since``."""

    since: int
    loops: int = 0


class Promises:
    """Mixin: ``observe()`` after every step; ``fail()`` raises or records a broken promise."""

    # ------------------------------------------------------------------ reading

    def rows(self) -> dict[str, TaskRow]:
        from sqlalchemy import text

        query = text("SELECT task_id, id::text, state, try_number, max_tries, external_executor_id,"
                     " queued_by_job_id, hostname FROM task_instance WHERE dag_id = :d AND run_id = :r"
                     " AND map_index = -1")
        with self.world.engine.connect() as conn:
            found = conn.execute(query, {"d": self.world.dag_id, "r": self.world.run_id}).all()
        return {r[0]: TaskRow(*r) for r in found}

    def capture_launches(self, rows: dict[str, TaskRow]) -> None:
        """Every QUEUED transition is a launch: a new token in the row (fenced), or a workload the
        scheduler handed an executor (stock: its JWT, minted for that one launch)."""
        for task, row in rows.items():
            if self.env.profile.kind == "fenced":
                self.launches.saw(task, as_token(row.token))
        for slot in self.live_slots():
            for _ in range(3):  # a background loop may be changing the dict
                try:
                    queued = list(slot.sched.executor.queued_tasks.values())
                    break
                except RuntimeError:
                    queued = []
            for workload in queued:
                ti = getattr(workload, "ti", None)
                if ti is None:
                    continue
                launch = as_token(ti.external_executor_id) if self.env.profile.kind == "fenced" else workload.token
                self.launches.saw(ti.task_id, launch)

    # ------------------------------------------------------------------ the check after each step

    def observe(self) -> dict[str, TaskRow]:
        rows = self.rows()
        self.capture_launches(rows)
        listed = self.world.kube.list_namespaced_pod(self.world.namespace).items
        seen = set()
        for pod in listed:
            name = pod.metadata.name
            seen.add(name)
            record = self.pods.get(name)
            if record is None:
                workload = workload_of(pod)
                annotations = pod.metadata.annotations or {}
                task, launch = annotations.get("task_id"), launch_of(pod)
                made_by_clone = self.clone is not None and self.clone.made(pod, launch in self.launches.order.get(task, ()))
                record = self.pods[name] = Pod(
                    name=name, origin="clone" if made_by_clone else "ours", task=task, launch=launch,
                    creator=creator_of(pod), stamp=annotations.get(DEPLOYMENT_ANNOTATION),
                    ti_id=annotations.get(TI_ID_ANNOTATION) or (workload and workload.ti_id),
                    try_number=annotations.get("try_number"))
            record.phase = (pod.status.phase if pod.status else None) or "Pending"
            record.worker = (pod.metadata.labels or {}).get("airflow-worker")
            record.deleting = bool(pod.metadata.deletion_timestamp)
        self.judge_deletes(rows)
        self.kubelet.reap(listed)
        for name, record in self.pods.items():
            if name not in seen:
                record.gone = True
        self.check_superseded(rows)
        self.check_slots(rows)
        self.check_burns(rows)
        self.sanctioned, self.revoking = set(), set()
        return rows

    def judge_deletes(self, rows: dict[str, TaskRow]) -> None:
        entries = self.env.emulator.audit(self.audit_at)
        if entries:
            self.audit_at = entries[-1]["index"] + 1
        for e in entries:
            if e.get("verb") != "delete" or e.get("resource") != "pods" or e.get("code") not in (200, 202):
                continue
            slot = self.users.get(e.get("who"))
            who = slot.name if slot is not None else self.others.get(e.get("who"))
            pod = self.pods.get(e.get("name") or "")
            if who is None or pod is None:
                continue  # the kubelet's own final delete, or a pod made and deleted within one step
            if slot is None and pod.origin == "clone":
                continue  # the clone's scheduler fencing its own pods: its promises, not ours
            if pod.bystander and pod.protected:
                gap = ("shared_deployment_id" if pod.collides
                       else "revoke_by_coordinates" if e.get("who") in self.revoking else None)
                self.fail("bystander_deleted", f"{who} deleted {pod.origin} pod {pod.name}", gap=gap,
                          key=("bystander", pod.name))
            elif not pod.bystander and (self.launches.current(pod.task, pod.launch) and pod.phase in LIVE_PHASES
                  and (e.get("who"), pod.ti_id) not in self.sanctioned):
                self.fail("current_pod_deleted", f"{who} deleted {pod.phase} pod {pod.name} of task "
                          f"{pod.task}'s current launch", key=("current", pod.name))
            elif (not pod.bystander and pod.ran in ("won", "reported") and pod.phase == "Running"
                  and getattr(rows.get(pod.task), "hostname", None) == pod.name
                  and (e.get("who"), pod.ti_id) not in self.sanctioned):
                self.fail("host_pod_deleted", f"{who} deleted Running pod {pod.name}, the host task "
                          f"{pod.task}'s row names", key=("host", pod.name))

    def stale_pods(self) -> list[Pod]:
        """Live pods of superseded launches, each marked with the epoch it was first seen so."""
        stale = []
        for pod in self.pods.values():
            if pod.bystander or pod.gone or pod.deleting or pod.phase not in LIVE_PHASES:
                continue
            if self.launches.superseded(pod.task, pod.launch):
                if pod.stale_since is None:
                    pod.stale_since = self.clock.epoch
                stale.append(pod)
        return stale

    def check_superseded(self, rows: dict[str, TaskRow]) -> None:
        for pod in self.stale_pods():
            if pod.loops < LOOPS:
                continue
            row = rows.get(pod.task)
            if pod.phase == "Pending":
                self.fail("superseded_pending_lingers", f"{pod.name} (task {pod.task}, created by job "
                          f"{pod.creator}) still Pending after {pod.loops} capable loops since superseded",
                          gap=self.pending_gap(pod), key=("pending", pod.name))
            elif row is None or row.hostname != pod.name:
                self.fail("superseded_running_lingers", f"{pod.name} (task {pod.task}) still Running after "
                          f"{pod.loops} capable loops since superseded", gap="running_never_fenced",
                          key=("running", pod.name))

    def check_slots(self, rows: dict[str, TaskRow]) -> None:
        held_now = set()
        for slot in self.live_slots():
            if slot.busy:
                continue
            job = slot.sched.job_id
            for key in list(slot.sched.executor.running):
                row = rows.get(key.task_id)
                wrong = row is None or row.state in TERMINAL or (
                    row.queued_by not in (None, job) and row.state in ("queued", "running"))
                if not wrong or self.worker_on_node(job, key):
                    continue
                ident = (slot.name, job, key)
                held_now.add(ident)
                watch = self.slot_watch.setdefault(ident, SlotWatch(self.clock.epoch))
                if watch.loops >= LOOPS:
                    self.fail("slot_held", f"{slot.name} holds {key.task_id} try {key.try_number} for "
                              f"{watch.loops} capable loops; row {row and row.state} queued by {row and row.queued_by}",
                              key=("slot",) + ident)
        for ident in [i for i in self.slot_watch if i not in held_now]:
            del self.slot_watch[ident]

    def worker_on_node(self, job: int, key: Any) -> bool:
        """Whether the worker of ``key``'s try still runs in its pod on ``job``'s watch: it won /run
        and its pod is Running (it runs the try, or finishes it after its report: callbacks, the log
        upload). The row may be terminal by then (issue 55: the last try reported failed), yet the
        slot is the pod's until the pod ends, when the provider frees it on its terminal event, stock
        and fenced alike; judging it from then is the promise."""
        return any(not pod.bystander and not pod.gone and not pod.deleting and pod.phase == "Running"
                   and pod.ran in ("won", "reported") and pod.task == key.task_id
                   and pod.try_number == str(key.try_number) and pod.worker == str(job)
                   for pod in self.pods.values())

    def check_burns(self, rows: dict[str, TaskRow]) -> None:
        for task, row in rows.items():
            excess = self.burns.excess(task, row.try_number, row.state)
            if excess > 0:
                self.fail("try_burned", f"task {task} at try {row.try_number} ({row.state}): {excess} more "
                          f"than its clears and failures explain", key=("burn", task, row.try_number, row.state))

    def count_loop(self, slot: Any) -> None:
        """One capable loop of ``slot``: it counts against each superseded pod it could fence (its
        own at once; a peer's from the next epoch: the hand-over grace) and each wrongly held slot."""
        job = str(slot.sched.job_id)
        # Once a clone posts under our id in the witness (a collision), by design only pods of
        # schedulers seen writing to this database are deleted until it stops: the per-loop
        # promises are the clone's steps' to judge no more (docs/checker.md).
        # A pod stamped with an id the live schedulers no longer have (``new_generation``) is not
        # this deployment's by design (``verdicts.owned``): never deleted, it is left to the run gate.
        stamp = self.deployment_id() if self.env.profile.kind == "fenced" and self.generation else None
        for pod in self.stale_pods() if self.clone is None else ():
            if stamp and pod.stamp and pod.stamp != stamp:
                continue
            own = pod.creator == job
            if own or self.clock.epoch > pod.stale_since:
                pod.loops += 1
                pod.own_loops += own
        for ident, watch in self.slot_watch.items():
            if ident[0] == slot.name and ident[1] == slot.sched.job_id and self.clock.epoch > watch.since:
                watch.loops += 1

    def pending_gap(self, pod: Pod) -> str | None:
        """Which of issue 35's gaps explains a lingering superseded Pending pod of a live creator:
        the creator looped and did not delete it (it stopped re-checking a pod that still exists),
        or only its peers looped and they skip a live creator's pods."""
        creator = next((s for s in self.slots if str(s.sched.job_id) == pod.creator), None)
        if creator is None or creator.status != "live":
            return None
        return "forgotten_in_flight" if pod.own_loops >= LOOPS else "live_creator_skipped"

    # ------------------------------------------------------------------ verdicts

    def fail(self, invariant: str, detail: str, *, gap: str | None = None, key: Any = None) -> None:
        from interleavings.harness import Finding

        profile = self.env.profile
        if invariant not in profile.expected and not profile.waives(invariant, gap):
            self.env.findings.log(f"VIOLATION {invariant} example={self.example} step={len(self.trace)} "
                                  f"steps_so_far={self.env.findings.steps}: {detail}")
            raise Violation(invariant, detail + (f" (issue 35 gap: {gap})" if gap else ""), self.trace)
        if key is not None and key in self.recorded:
            return
        self.recorded.add(key)
        self.env.findings.add(Finding(invariant, detail, gap, self.example, len(self.trace), list(self.trace)))
