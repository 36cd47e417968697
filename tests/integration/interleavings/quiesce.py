"""The quiescence phase of every example (a mixin): faults stop, loops continue, every task must
reach a terminal state.

Each round every live scheduler runs its loop as ``airflow scheduler`` would (heartbeat, the orphan
check every third round, schedule + enqueue, trigger, sync, executor events; from the tenth round
the stuck-in-queued handler for tasks queued since before the phase began), and the kubelet moves
every pod of ours one stage on (a Pending pod starts after three rounds, as pods take a while to
schedule; a started pod's worker calls /run; a worker that won reports success). The promises of
every step are checked each round. A scheduler is restarted if none is live.
"""

from __future__ import annotations

import time

from interleavings.model import TERMINAL

#: Rounds (and seconds) the phase may take before "every task reaches a terminal state" is
#: broken: both, so that the verdict counts what the parts were given, not how fast a loaded
#: machine ran them (at a load average of 15 a round took 15 s: 4 rounds in 60 s failed tasks that
#: needed 8). Past QUIESCE_CAP seconds the phase ends with the verdict whatever the rounds.
QUIESCE_SECONDS, QUIESCE_ROUNDS, QUIESCE_CAP = 60.0, 30, 600.0
#: Rounds a Pending pod waits before the kubelet starts it.
START_AFTER = 3
#: Rounds per epoch (each at least WAIT seconds long): the verdicts count rounds, not seconds.
EPOCH_ROUNDS = 6
#: Rounds after which tasks still queued from before the phase are handed to stuck-in-queued.
STUCK_AFTER = 10


class Quiescence:
    def quiesce(self) -> None:
        from interleavings.steps import WAIT

        with self.step("quiescence: faults stop, every live scheduler loops, the kubelet runs every pod"):
            self.join_all()
            self.env.emulator.clear_faults()
            for slot in self.slots:
                slot.faults, slot.transient = {}, {}
            if not self.live_slots():
                self.start(self.slots[0])
            began = last_tick = time.monotonic()
            ages: dict[str, int] = {}
            rounds, done_at = 0, None
            while True:
                rows = self.observe()
                if all(r.state in TERMINAL for r in rows.values()):
                    if done_at is None:
                        done_at = (rounds, self.clock.epoch)
                    # every task is done: stop once nothing is left to judge, or once the promises
                    # still pending had a hand-over grace (one epoch) and two loops to be kept
                    if rounds - done_at[0] >= 2 and (not self.pending_judgements() or self.clock.epoch > done_at[1]):
                        return
                elif (rounds >= QUIESCE_ROUNDS and time.monotonic() - began > QUIESCE_SECONDS
                      or time.monotonic() - began > QUIESCE_CAP):
                    states = {t: (r.state, r.try_number) for t, r in sorted(rows.items())}
                    self.fail("not_terminal", f"after {rounds} rounds ({time.monotonic() - began:.0f} s): {states}",
                              key=("quiesce",))
                    return
                for slot in self.live_slots():
                    self.scheduler_round(slot, rounds, began)
                self.kubelet_round(ages)
                if rounds % EPOCH_ROUNDS == EPOCH_ROUNDS - 1:  # an epoch every few rounds, at least WAIT long
                    time.sleep(max(0.0, WAIT - (time.monotonic() - last_tick)))
                    self.clock.epoch += 1
                    last_tick = time.monotonic()
                rounds += 1
                time.sleep(0.1)

    def pending_judgements(self) -> bool:
        """Superseded pods still there, or slots held that should not be."""
        return bool(self.stale_pods() or self.slot_watch)

    def scheduler_round(self, slot, rounds: int, began: float) -> None:
        sched = slot.sched
        self.beat(slot)
        if rounds % 3 == 2:
            self.adopt(slot)
        if rounds >= STUCK_AFTER:
            self.stuck(slot, timeout=time.monotonic() - began)
        self.core(slot, "enqueue", sched.queue, self.world.dag_id, self.world.run_id, trigger=False)
        self.capture_launches(self.rows())
        sched.trigger()
        self.after_loop(slot, self.loop(slot))

    def kubelet_round(self, ages: dict[str, int]) -> None:
        for pod in list(self.pods.values()):
            if pod.bystander or pod.gone or pod.deleting:
                continue
            if pod.phase == "Pending":
                ages[pod.name] = ages.get(pod.name, 0) + 1
                if ages[pod.name] >= START_AFTER:
                    self.kubelet.start(pod.name)
                    pod.phase = "Running"
            elif pod.phase == "Running" and pod.ran is None:
                self.run_worker(pod)
            elif pod.phase == "Running" and pod.ran == "won":
                self.finish_worker(pod, ok=True)
            elif pod.phase == "Running" and pod.ran == "reported":  # done finishing
                pod.phase = "Failed"
                self.kubelet.end(pod.name, ok=False)
