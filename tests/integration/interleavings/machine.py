"""The state machine: each rule is one ordinary step of the real parts, in an order Hypothesis picks.

Schedulers are slots A, B (and C): each slot holds one scheduler process at a time (a real
SchedulerJob row, a SchedulerJobRunner and a started executor with its watcher processes). Every
metadata change goes through airflow-core's own code (``fenced_k8s_lab.core``); the test plays the
kubelet and the workers; faults are the emulator's, per scheduler (its kube user). After every
step ``Promises.observe`` checks the promises; the example's teardown runs a quiescence phase
(faults off, loops go on) in which every task must finish.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import hypothesis.strategies as st
from hypothesis import reject
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from interleavings.compound import CompoundSteps
from interleavings.ground import GroundSteps
from interleavings.hard import HardStates
from interleavings.harness import Env
from interleavings.kubelet import Kubelet, Worker
from interleavings.model import Burns, Clock, Launches, Violation
from interleavings.promises import Promises
from interleavings.quiesce import Quiescence
from interleavings.steps import DAG_IMPORTS, OPTIONAL, STEPS, TASKS, Steps, menu

VERBOSE = bool(os.environ.get("CHECKER_VERBOSE"))
#: The metadata DB drivers the examples alternate between (the integration conftest's ``DRIVERS``):
#: psycopg2, the lab's, and psycopg 3, what the official chart's ``postgresql://`` URL gets.
#: CHECKER_DRIVER=psycopg2|psycopg runs every example on one.
DRIVERS = ("psycopg2", "psycopg")
#: CHECKER_SWARM=0 gives every example the whole menu of steps (as before the swarm).
SWARM = os.environ.get("CHECKER_SWARM", "1") != "0"
#: A heartbeat is due every second; a peer is taken for gone after 3 s (airflow-core's orphan check)
#: and its launches handed over after 2 s (the fenced grace: two heartbeats, capped by the threshold).
HEARTBEAT_SEC, HEALTH_CHECK_THRESHOLD = "1", "3"
#: CHECKER_QUIESCE=0 skips the quiescence phase: shrinking a safety violation goes several times faster.
QUIESCE = os.environ.get("CHECKER_QUIESCE", "1") != "0"


@dataclass
class Slot:
    name: str
    host: str
    sched: Any = None
    status: str = "live"  # live | stopped (end(), Job success) | killed (Job left running)
    faults: dict = field(default_factory=dict)  # kind -> emulator fault id, until healed
    transient: dict = field(default_factory=dict)  # kind -> fault id, until the next wait
    thread: threading.Thread | None = None  # a loop running in the background (slow create)
    outcome: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)  # [fenced_kubernetes_executor] options of its generation

    def __repr__(self) -> str:
        return self.name

    def _repr_pretty_(self, printer, cycle) -> None:  # how Hypothesis prints a drawn scheduler
        printer.text(self.name)

    @property
    def busy(self) -> bool:
        return self.thread is not None

    @property
    def user(self) -> str:
        return self.sched.user

    @property
    def capable(self) -> bool:
        return self.status == "live" and not self.faults and not self.transient


class Choices:
    """Stands in for Hypothesis's ``data`` inside a step: the step's arguments come from a block of
    integers drawn before it runs. Drawn inside the step, their number and ranges depended on the
    state the parts' timing left (which pods exist, which schedulers live), and Hypothesis stopped
    long runs with ``FlakyStrategyDefinition`` when a replay drew differently. A choice among n
    options takes the next integer modulo n; no option at all rejects the example, as drawing from
    an empty ``sampled_from`` did."""

    SIZE = 6

    def __init__(self, numbers: list[int]):
        self.numbers = list(numbers)
        self.used = 0

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        inner = getattr(strategy, "wrapped_strategy", strategy)
        options = getattr(inner, "elements", None)
        if options is None and type(inner).__name__ == "BooleansStrategy":
            options = (False, True)
        if not options:
            reject()
        number = self.numbers[self.used % len(self.numbers)]
        self.used += 1
        return options[number % len(options)]


class InterleavingMachine(Steps, CompoundSteps, GroundSteps, Promises, HardStates, Quiescence, RuleBasedStateMachine):
    env: Env  # set on a subclass by the test
    examples = 0
    clones = 0  # clone deployments this run (``steps.CLONES``)

    def __init__(self) -> None:
        super().__init__()
        env = self.env
        type(self).examples += 1
        self.example = type(self).examples
        env.findings.examples += 1
        self.stack = contextlib.ExitStack()
        self.trace: list[str] = []
        self.clean = True
        self.recorded: set = set()
        self.pods: dict = {}
        self.slots: list[Slot] = []
        self.users: dict[str, Slot] = {}
        self.slot_watch: dict = {}
        self.sanctioned: set = set()  # (kube user, TI id): deletes this step's revoke makes
        self.revoking: set = set()  # kube users whose stuck-in-queued handler ran this step
        self.launches, self.clock, self.burns = Launches(), Clock(), Burns()
        self.audit_at = 0
        self._legacy = None
        self.rows_seen: dict = {}  # task -> its row after the last step (HardStates)
        self.poked: dict = {}  # task -> (id, try, token) of a sensor poke that rescheduled (HardStates)
        self.menu = menu(0)  # every step, until the swarm draw narrows it
        self.generation = 0  # scheduler generations since the example began (``new_generation``)
        self.clone = None  # the clone deployment in the namespace, once one appeared (``ground.Clone``)
        self.hop = None  # the NAT hop the fences' connections pass through, in examples that black-hole it
        self.flows_forgotten = 0  # the last step in which the hop forgot a flow of the fences (HardStates)
        self.others: dict[str, str] = {}  # kube user -> who, for schedulers of other deployments (the clone's)
        self.driver = os.environ.get("CHECKER_DRIVER") or DRIVERS[self.example % len(DRIVERS)]
        env.findings.drivers[self.driver] = env.findings.drivers.get(self.driver, 0) + 1
        try:
            import pytest

            mp = self.stack.enter_context(pytest.MonkeyPatch.context())
            env.emulator.reset()
            tmp = env.tmp_factory.mktemp("interleaving")
            self.world = self.stack.enter_context(
                env.open_world(env.emulator, env.metadata_db, env.airflow, tmp, mp, list(TASKS),
                               {"imports": DAG_IMPORTS}, driver=self.driver))
            mp.setenv("AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC", HEARTBEAT_SEC)
            mp.setenv("AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD", HEALTH_CHECK_THRESHOLD)
            self.kubelet = Kubelet(self.world)
            self.worker = Worker(env.run_client, env.airflow)
            for name in "AB":
                self.slots.append(self.start(Slot(name, host=f"host-{name.lower()}")))
        except BaseException:
            self.stack.close()
            raise

    # ------------------------------------------------------------------ plumbing

    def start(self, slot: Slot) -> Slot:
        slot.sched = self.world.scheduler(self.env.profile.kind, hostname=slot.host, **slot.options)
        slot.status, slot.faults, slot.transient = "live", {}, {}
        self.users[slot.sched.user] = slot
        return slot

    def live_slots(self) -> list[Slot]:
        return [s for s in self.slots if s.status == "live"]

    def pick(self, data: Any, slots: list[Slot] | None = None, label: str = "scheduler") -> Slot:
        slots = self.live_slots() if slots is None else slots
        return data.draw(st.sampled_from(slots), label=label)

    @contextlib.contextmanager
    def step(self, text: str):
        self.trace.append(text)
        if VERBOSE:
            print(f"CHECKER ex{self.example} step {len(self.trace)}: {text}", flush=True)
        self.env.findings.steps += 1
        self.clean = False
        yield
        self.clean = True

    def join(self, slot: Slot) -> None:
        if slot.thread is not None:
            slot.thread.join(60)
            slot.thread = None
            error = slot.outcome.pop("error", None)
            if error is not None:
                self.fail("sync_raised", f"{slot.name}'s background sync raised {error!r}")

    def join_all(self) -> None:
        for slot in self.slots:
            self.join(slot)

    def beat(self, slot: Slot) -> None:
        """The scheduler loop's heartbeat, written when due (every HEARTBEAT_SEC), as the loop's
        ``perform_heartbeat(only_if_necessary=True)`` writes it."""
        from airflow.utils import timezone

        job = slot.sched.job
        if job.latest_heartbeat is None or (timezone.utcnow() - job.latest_heartbeat).total_seconds() >= job.heartrate:
            heartbeat(slot.sched)

    def loop(self, slot: Slot) -> BaseException | None:
        """One scheduler loop's executor part: ``sync()``, then airflow-core's executor events."""
        try:
            slot.sched.executor.sync()
        except Exception as error:  # noqa: BLE001 - the promise is that nothing escapes
            return error
        self.core(slot, "process executor events", slot.sched.process_events)
        return None

    def core(self, slot: Slot, what: str, call, *args, **kwargs):
        """airflow-core's own step for ``slot``; an exception through the executor hooks breaks a promise."""
        try:
            return call(*args, **kwargs)
        except Violation:
            raise
        except Exception as error:  # noqa: BLE001
            self.fail("step_raised", f"{slot.name}: {what} raised {error!r}", key=("step", slot.name, what))
            return None

    def pods_where(self, *phases: str, ran: Any = ..., ours: bool = True, task: str | None = None) -> list[str]:
        return sorted(p.name for p in self.pods.values() if not p.gone and not p.deleting and p.phase in phases
                      and (not ours or not p.bystander) and (ran is ... or p.ran == ran)
                      and (task is None or p.task == task))

    def current_pods(self, *phases: str, creator_live: bool = False) -> list[str]:
        """Live pods of ours of a current launch whose worker has not called /run (optionally: whose
        creator is a live scheduler)."""
        return [name for name in self.pods_where(*phases, ran=None)
                if self.launches.current(self.pods[name].task, self.pods[name].launch)
                and (not creator_live or self.creator_slot(self.pods[name]) is not None)]

    def schedulable(self) -> bool:
        """A task the critical section would queue now (none queued or running yet)."""
        return any(r.state in (None, "scheduled", "up_for_retry", "up_for_reschedule") for r in self.rows().values())

    # ------------------------------------------------------------------ one step

    @initialize(swarm=st.integers(0, 2 ** len(OPTIONAL) - 1))
    def choose_menu(self, swarm):
        """Swarm testing: this example's menu is the core steps and about half of the others, so
        that some examples leave out what would end a hard state early (workers calling /run,
        heals) and the rest is drawn more often."""
        if SWARM:
            self.menu = menu(swarm)
        if "black_holed_loop" in self.menu:
            self.hop = self.env.hops.route(self.stack, self.driver, self.world.engine.url.database,
                                           self.env.findings.log)
        left_out = sorted(name for name in OPTIONAL if name not in self.menu)
        self.env.findings.log(f"example {self.example}: driver {self.driver}, menu without {', '.join(left_out)}")

    @rule(data=st.data())
    def act(self, data):
        """One step, drawn by weight (``STEPS``) from the example's menu (fixed when the example starts,
        so that a shrunk sequence keeps its meaning); a step that does not apply now (no such pod, no
        live scheduler) does nothing. Its arguments come from a block drawn with it (``Choices``):
        every step draws the same, whatever the timing of the parts made applicable."""
        name = data.draw(st.sampled_from(self.menu), label="step")
        numbers = data.draw(st.lists(st.integers(0, 255), min_size=Choices.SIZE, max_size=Choices.SIZE),
                            label="arguments")
        if not STEPS[name][1](self):
            return
        began = time.monotonic()
        try:
            getattr(self, name)(Choices(numbers))
        finally:
            self.env.findings.timed(name, time.monotonic() - began)

    # ------------------------------------------------------------------ checks

    @invariant()
    def promises_hold(self):
        self.clean = False
        began = time.monotonic()
        self.track(self.observe())
        self.env.findings.timed("checks", time.monotonic() - began)
        self.clean = True

    def teardown(self):
        try:
            if self.clean and QUIESCE:
                began = time.monotonic()
                try:
                    self.quiesce()
                finally:
                    self.env.findings.timed("quiescence", time.monotonic() - began)
        finally:
            try:
                self.join_all()
            finally:
                self.stack.close()
                findings = self.env.findings
                findings.log(f"example {self.example} done: {len(self.trace)} steps; run total "
                             f"{findings.examples} examples, {findings.steps} steps, {len(findings.found)} findings")


def heartbeat(sched: Any) -> None:
    """Write ``sched``'s Job heartbeat now. It runs on the Job as merged into the session:
    ``Job.heartbeat`` on a detached Job (the lab driver's) merges it, then sets the time on the
    detached copy, so the driver's heartbeat stores the previous heartbeat's time."""
    from airflow.utils.session import create_session

    with create_session() as session:
        attached = session.merge(sched.job)
        attached.heartbeat(heartbeat_callback=sched.runner.heartbeat_callback, session=session)
        sched.job.latest_heartbeat = attached.latest_heartbeat
