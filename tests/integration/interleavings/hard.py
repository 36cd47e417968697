"""The hard states: where the fences act, and how often the checker's draws reach them (a mixin).

A sequence can only break a promise in a state where a fence has something to do, so what the
checker draws is measured by how often it gets there. After every step ``track`` looks at what
the parts show and counts each state (``HARD``) twice: once per distinct occurrence (a pod, a
launch: *reached*) and once per step after which it holds (*held*). The run's summary gives both
per 100 steps (docs/checker.md has the figures before and after the steering).
"""

from __future__ import annotations

from typing import Any

#: state -> what it is.
HARD: dict[str, str] = {
    "running_superseded_before_run": "a pod of ours Running, its worker not yet at /run, its launch superseded",
    "requeued_same_token": "a launch queued again under the same token: the provider's pre-execution requeue "
                           "(a second pod of one launch), stuck-in-queued back to SCHEDULED, adoption by launching",
    "peer_cut_off_heartbeating": "a superseded launch's live pod whose creator is live and heartbeating while its "
                                 "API calls fail (only a peer can fence it)",
    "host_pod_finishing": "a superseded launch's pod still Running after its worker reported, which the task's "
                          "row names as its host: left to finish",
    "sensor_poked_again": "a reschedule-mode sensor queued again within the same try (a new launch, the same "
                          "id and try)",
    "stamped_before_an_id_change": "a live pod of a current launch of ours stamped with a deployment id the live "
                                   "schedulers no longer have (issue 45 item 1)",
    "clone_beside_ours": "a live pod of the clone deployment's beside a live pod of ours of the same task, one "
                         "deployment id on both (issue 45 item 2)",
    "fences_flow_black_holed": "a flow of the fences' connections forgotten by the NAT hop (issue 45 item 3)",
    "hostile_beside_superseded": "a live pod whose annotations do not read beside a live pod of a superseded launch "
                                 "of ours (issue 45 item 4)",
}


class HardStates:
    """Mixin: ``track(rows)`` after every step (``Promises.observe``)."""

    def track(self, rows: dict) -> None:
        held: set[tuple[str, Any]] = set()
        by_launch: dict[str, list] = {}
        for pod in self.pods.values():
            if pod.bystander or not pod.launch:
                continue
            by_launch.setdefault(pod.launch, []).append(pod)
            if pod.gone or pod.deleting or pod.phase not in ("Pending", "Running"):
                continue
            if not self.launches.superseded(pod.task, pod.launch):
                continue
            if pod.phase == "Running" and pod.ran is None:
                held.add(("running_superseded_before_run", pod.name))
            if pod.phase == "Running" and pod.ran == "reported" and getattr(rows.get(pod.task), "hostname", None) == pod.name:
                held.add(("host_pod_finishing", pod.name))
            creator = self.creator_slot(pod)
            if creator is not None and creator.faults and self.heartbeat_fresh(creator):
                held.add(("peer_cut_off_heartbeating", pod.name))
        self.track_ground(held)
        for launch, pods in by_launch.items():  # a second pod of one launch, live
            if any(not p.gone and not p.deleting and p.phase in ("Pending", "Running") for p in pods[1:]):
                held.add(("requeued_same_token", ("pods", launch)))
        seen = self.rows_seen
        for task, row in rows.items():
            before = seen.get(task)
            if before is not None and row.token and row.token == before.token and row.id == before.id:
                if before.state == "queued" and row.state == "scheduled":
                    held.add(("requeued_same_token", ("rescheduled", row.token)))
                if before.state == row.state == "queued" and row.queued_by != before.queued_by:
                    held.add(("requeued_same_token", ("adopted", row.token)))
            poked = self.poked.get(task)  # (id, try, token) of a poke that rescheduled
            if poked is not None and (row.id, row.try_number) == poked[:2] and row.token != poked[2] \
                    and row.state in ("scheduled", "queued", "running"):
                held.add(("sensor_poked_again", (row.id, row.token)))
                del self.poked[task]
            seen[task] = row
        self.env.findings.hard_states(held)

    def track_ground(self, held: set) -> None:
        """Issue 45's hard states."""
        live = [p for p in self.pods.values() if not p.gone and not p.deleting and p.phase in ("Pending", "Running")]
        stamp = self.deployment_id() if self.env.profile.kind == "fenced" and self.generation else None
        for pod in live:
            if stamp and pod.origin == "ours" and pod.stamp and pod.stamp != stamp \
                    and self.launches.current(pod.task, pod.launch):
                held.add(("stamped_before_an_id_change", pod.name))
            if pod.origin == "clone" and any(p.origin == "ours" and p.task == pod.task for p in live):
                held.add(("clone_beside_ours", pod.name))
            if pod.origin == "hostile" and any(p.origin == "ours" and self.launches.superseded(p.task, p.launch)
                                               for p in live):
                held.add(("hostile_beside_superseded", pod.name))
        if self.flows_forgotten and self.flows_forgotten == len(self.trace):  # this step's
            held.add(("fences_flow_black_holed", self.flows_forgotten))

    def creator_slot(self, pod: Any) -> Any:
        return next((s for s in self.slots if s.status == "live" and str(s.sched.job_id) == pod.creator), None)

    @staticmethod
    def heartbeat_fresh(slot: Any) -> bool:
        """Its Job's heartbeat is within the orphan check's threshold: its peers take it for live."""
        from airflow.utils import timezone

        from interleavings.machine import HEALTH_CHECK_THRESHOLD

        last = slot.sched.job.latest_heartbeat
        return last is not None and (timezone.utcnow() - last).total_seconds() < float(HEALTH_CHECK_THRESHOLD)
