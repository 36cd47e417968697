"""The compound steps (a mixin): each builds, in one draw, a state where a fence must act (a *hard
state*, ``hard.py``), which chains of single steps reached about once per hundred steps or never
(docs/checker.md). Each lets the scheduler it names loop first when it has no pod yet, so that it
applies from any start, and ends where the promise that would catch a broken fence is judged.
"""

from __future__ import annotations

import re

import hypothesis.strategies as st

from interleavings.steps import LIVE, PERSISTENT, SENSOR, WAIT


class CompoundSteps:
    def pod_of(self, data, slot, *phases: str) -> str | None:
        """A live pod of a current launch made by ``slot``, before /run; ``slot`` loops first when it
        has none (one loop: its creation batch), so that the step builds its state from any start."""
        def mine():
            return [n for n in self.current_pods(*phases) if self.pods[n].creator == str(slot.sched.job_id)]

        if not mine():
            self.whole_loop(slot)
            self.observe()
        found = mine()
        if not found:
            return None
        name = data.draw(st.sampled_from(found), label="pod")
        self.trace[-1] += f" [{name}]"
        return name

    def started_pod(self, data, slot):
        """``slot``'s newest Pending pod of a current launch (``pod_of``), started by the kubelet."""
        name = self.pod_of(data, slot, "Pending")
        if name is None:
            return None
        self.kubelet.start(name)
        self.pods[name].phase = "Running"
        return self.pods[name]

    def winning_pod(self, data, slot):
        """``started_pod``, whose worker then calls /run: the pod if it won /run, else None."""
        pod = self.started_pod(data, slot)
        if pod is None:
            return None
        self.run_worker(pod)
        return pod if pod.ran == "won" else None

    def start_then_supersede(self, data):
        """A current launch's pod starts (its worker boots, no /run yet), then its task is cleared and
        a live scheduler queues it again: a Running pod of a superseded launch before /run."""
        slot = self.pick(data)
        other = self.pick(data, label="other")
        with self.step(f"{slot.name}'s newest pod starts (after a loop if it has none); user clears its task; "
                       f"{other.name}: schedule + enqueue"):
            pod = self.started_pod(data, slot)
            if pod is None:
                return
            self.clear_task(pod.task)
            self.join(other)
            self.enqueue_by(other)

    def cut_off_then_supersede(self, data):
        """The creator of a current launch's live pod is cut off from the API (it goes on
        heartbeating), the task is cleared and a peer queues it again: only a peer can fence it."""
        creator = self.pick(data)
        peer = self.pick(data, [s for s in self.live_slots() if s is not creator], label="peer")
        kind = data.draw(st.sampled_from(["500", "503"]), label="fault")
        with self.step(f"API answers {creator.name} with {kind} until healed (after a loop if it has no pod); user "
                       f"clears the task of its newest pod; {peer.name}: schedule + enqueue; {WAIT} s pass, "
                       f"{creator.name} heartbeating; {peer.name} loops"):
            self.cut_off_and_superseded(data, creator, peer, kind)

    def cut_off_and_superseded(self, data, creator, peer, kind: str) -> bool:
        name = self.pod_of(data, creator, *LIVE)
        if name is None:
            return False
        pod = self.pods[name]
        if kind not in creator.faults:
            creator.faults[kind] = self.env.emulator.add_fault(who=creator.user, **PERSISTENT[kind])
        self.clear_task(pod.task)
        self.join(peer)
        self.enqueue_by(peer)
        self.observe()  # the superseded pod is marked now, its epoch before the wait's
        self.pass_time(beating=tuple(self.live_slots()))
        self.whole_loop(peer)
        return True

    def cut_off_supersede_then_heal(self, data):
        """``cut_off_then_supersede``, then the creator's API heals; once its watches had time to
        reconnect (a wait, every live scheduler heartbeating) it loops twice: the peer deleted its
        superseded pod, so the slot it held for the launch must be free."""
        creator = self.pick(data)
        peer = self.pick(data, [s for s in self.live_slots() if s is not creator], label="peer")
        kind = data.draw(st.sampled_from(["500", "503"]), label="fault")
        with self.step(f"API answers {creator.name} with {kind} (after a loop if it has no pod); user clears the task "
                       f"of its newest pod; {peer.name}: schedule + enqueue; {WAIT} s pass; {peer.name} loops; "
                       f"{creator.name}'s API heals; {WAIT} s pass; {creator.name} loops twice"):
            if not self.cut_off_and_superseded(data, creator, peer, kind):
                return
            self.heal_slot(creator)
            self.observe()
            self.pass_time(beating=tuple(self.live_slots()))
            self.whole_loop(creator)
            self.whole_loop(creator)

    def heal_slot(self, slot) -> None:
        for fault_id in slot.faults.values():
            self.env.emulator.clear_faults(fault_id)
        slot.faults = {}

    def outage_while_finishing(self, data):
        """A finished task's slot after an API outage (issue 36's finding): a scheduler's newest pod
        starts and wins /run; the API answers that scheduler 500 and every watch is dropped; the
        worker reports success and the pod ends; three waits pass (its watchers fail again and
        again, every live scheduler heartbeating); the API heals; once a watcher that waits at most
        2 s between attempts had time to reconnect (a wait), the scheduler loops twice: the
        finished task's slot must be free."""
        slot = self.pick(data)
        with self.step(f"{slot.name}'s newest pod starts (after a loop if it has none) and wins /run; the API "
                       f"answers {slot.name} 500, every watch dropped; the task succeeds, its pod ends; "
                       f"{3 * WAIT:.1f} s pass; the API heals; {WAIT} s pass; {slot.name} loops twice"):
            pod = self.winning_pod(data, slot)
            if pod is None:
                return
            slot.faults.setdefault("500", self.env.emulator.add_fault(who=slot.user, **PERSISTENT["500"]))
            self.env.emulator.close_watches()
            self.finish_worker(pod, ok=True)
            self.observe()  # the slot is held for a finished task from here
            for _ in range(3):
                self.pass_time(beating=tuple(self.live_slots()))
            self.heal_slot(slot)
            self.pass_time(beating=tuple(self.live_slots()))
            self.whole_loop(slot)
            self.whole_loop(slot)

    def clear_while_running(self, data):
        """A user clears a running task (airflow-core: RESTARTING, the row under a new id, the token
        kept); its worker stops and the pod ends; the scheduler loops: the pod's end is the event that
        sends the task on (a RESTARTING task has no other way on but the task heartbeat timeout)."""
        slot = self.pick(data)
        ok = data.draw(st.booleans(), label="exits 0")
        with self.step(f"{slot.name}'s newest pod starts (after a loop if it has none) and wins /run; user clears "
                       f"its task; the pod ends ({'Succeeded' if ok else 'Failed'}); {slot.name} loops"):
            pod = self.winning_pod(data, slot)
            if pod is None:
                return
            self.clear_task(pod.task)
            pod.phase = "Succeeded" if ok else "Failed"
            self.kubelet.end(pod.name, ok=ok)
            self.whole_loop(slot)

    def revoked_pod_runs(self, data):
        """The run gate's case: the stuck-in-queued revoke of a scheduler's newest Pending pod meets a
        404 (the pod stays), the task is queued again under a new token (the same TI id and try), and
        before any loop can delete it the old pod starts and its worker calls /run: only the gate
        stands between it and a second worker of the try."""
        slot = self.pick(data)
        with self.step(f"{slot.name}: stuck-in-queued revokes its newest Pending pod (after a loop if it has none; "
                       f"the delete answered 404); schedule + enqueue; the revoked pod starts, its worker calls /run"):
            name = self.pod_of(data, slot, "Pending")
            if name is None:
                return
            fault = self.env.emulator.add_fault(method="DELETE", path=r"/pods/", status=404, who=slot.user)
            try:
                self.stuck(slot, timeout=0.0)
            finally:
                self.env.emulator.clear_faults(fault)
            self.enqueue_by(slot)
            pod = self.pods[name]
            self.kubelet.start(name)
            pod.phase = "Running"
            self.run_worker(pod)

    def foreign_pod_then_revoke(self, data):
        """The provider's revoke picks a pod by DAG, task and run among those labelled with this
        scheduler's job id, and two deployments' job ids overlap: a scheduler queues a task (no pod
        yet); another deployment's Pending pod of the same DAG, task, run and try, labelled with that
        job id, appears (its token, a random UUID, drawn to list after ours); the scheduler's
        stuck-in-queued handler revokes the task."""
        from interleavings.bystanders import make_pod

        slot = self.pick(data)
        with self.step(f"{slot.name}: schedule + enqueue; another deployment's Pending pod of a task it queued "
                       f"(the same DAG, run and try, {slot.name}'s job id) appears; {slot.name}'s stuck-in-queued "
                       f"handler"):
            self.join(slot)
            self.enqueue_by(slot)
            rows = self.rows()
            queued = sorted(t for t, r in rows.items() if r.state == "queued" and r.queued_by == slot.sched.job_id)
            if not queued:
                return
            task = data.draw(st.sampled_from(queued), label="task")
            self.trace[-1] += f" [{task}]"
            make_pod(self, "foreign", same_dag=True, task_id=task, try_number=rows[task].try_number,
                     creator_slot=slot, token_first="f")
            self.stuck(slot, timeout=0.0)

    def revoke_loses_delete(self, data):
        """Issue 35 item 1 in one draw: the stuck-in-queued revoke's delete of a Pending pod is answered
        404 (the pod stays), the task waits SCHEDULED under the same token for one loop, then it is
        queued again under a new token."""
        slot = self.pick(data)
        with self.step(f"{slot.name}: stuck-in-queued revokes its newest Pending pod (after a loop if it has "
                       f"none; the delete answered 404), one loop, then schedule + enqueue"):
            if self.pod_of(data, slot, "Pending") is None:
                return
            fault = self.env.emulator.add_fault(method="DELETE", path=r"/pods/", status=404, who=slot.user)
            try:
                self.stuck(slot, timeout=0.0)
            finally:
                self.env.emulator.clear_faults(fault)
            self.after_loop(slot, self.loop(slot))
            self.enqueue_by(slot)

    def supersede_past_a_failing_delete(self, data):
        """The fence's own delete fails once: a scheduler's newest Pending pod is superseded (a user
        clears the task, the scheduler queues it again) and its next delete is answered 404 (a
        webhook, a proxy, a lost race) or 500; it loops once (the delete fails), then once more before
        any peer could take over: that loop must send the delete again."""
        slot = self.pick(data)
        status = data.draw(st.sampled_from([404, 500]), label="status")
        with self.step(f"{slot.name}'s newest Pending pod superseded (after a loop if it has none; user clears, "
                       f"{slot.name} queues again); its next delete answered {status}; {slot.name} loops twice"):
            name = self.pod_of(data, slot, "Pending")
            if name is None:
                return
            # this pod's delete alone: a fault on every delete would hit the next one of an older
            # superseded pod too, and the checker would blame the fence for the fault it made
            self.env.emulator.add_fault(method="DELETE", path=rf"/pods/{re.escape(name)}$", status=status, times=1,
                                        who=slot.user)
            self.clear_task(self.pods[name].task)
            self.enqueue_by(slot)
            self.whole_loop(slot)
            self.whole_loop(slot)

    def sensor_pokes_again(self, data):
        """A whole poke of the reschedule-mode sensor in one draw: a live scheduler loops (the sensor
        queued, its pod made), the pod starts, its worker wins /run, reschedules and exits; the
        scheduler loops again (queued anew: the same try, a new launch)."""
        slot = self.pick(data)
        with self.step(f"{slot.name}: the sensor's pod starts, wins /run, reschedules, exits; {slot.name} loops"):
            names = [n for n in self.pod_of_task(slot, SENSOR)]
            if not names:
                return
            pod = self.pods[names[-1]]
            self.trace[-1] += f" [{pod.name}]"
            if pod.phase == "Pending":
                self.kubelet.start(pod.name)
                pod.phase = "Running"
            if pod.ran is None:
                self.run_worker(pod)
            if pod.ran == "won" and pod.phase == "Running":
                self.reschedule_worker(pod)
                self.whole_loop(slot)

    def pod_of_task(self, slot, task: str) -> list[str]:
        """Live pods of ``task``'s current launch (``slot`` loops first when there is none)."""
        def found():
            return [n for n in self.pods_where(*LIVE, task=task) if self.launches.current(task, self.pods[n].launch)
                    and self.pods[n].ran != "refused"]

        if not found():
            self.whole_loop(slot)
            self.observe()
        return found()

    def orphaned_queued_task(self, data):
        """A scheduler queues a task and is killed before it creates the pod; its heartbeat ages past
        the orphan check and a peer adopts: the fenced peer launches the task under the same token."""
        slot = self.pick(data)
        peer = self.pick(data, [s for s in self.live_slots() if s is not slot], label="peer")
        with self.step(f"{slot.name}: schedule + enqueue, then killed; wait {WAIT} s; {peer.name} adopts orphans"):
            self.join(slot)
            self.enqueue_by(slot)
            self.exit(slot, "kill")
            self.pass_time()
            self.beat(peer)
            self.adopt(peer)
