"""Steps for what production does to the ground the fences stand on (issue 45), a mixin: the
deployment id changes between two scheduler generations, a clone deployment appears in the
namespace, the fences' DB connections are black-holed, a pod arrives with hostile annotations.

Each step names the promise that would catch its defect:

- ``new_generation``: a running task survives the id change, as on stock (``adopted_task_reset``;
  before issue 45 the new generation's adoption hid every pod stamped with the old id);
- ``clone_appears``: neither deployment deletes the other's pods, whenever the copy was taken
  (``current_pod_deleted`` and ``host_pod_deleted`` judge the clone's deletes of ours,
  ``bystander_deleted`` ours of its);
- ``black_holed_loop``: every scheduler loop returns within the fences' bound, nothing deleted on
  the error (``loop_blocked``; before issue 45 the loop's read blocked for Linux's 15 minutes);
- ``hostile_pod``: one pod whose annotations do not read costs that pod alone: it is never
  deleted, nothing raises, and a superseded launch of ours is fenced as before
  (``bystander_deleted``, ``sync_raised``, ``superseded_pending_lingers``).
"""

from __future__ import annotations

import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterator

import hypothesis.strategies as st

from interleavings.model import Violation
from interleavings.steps import WAIT

#: When ``clone_appears`` takes its copy: the first is issue 52's probe (a copy taken between two
#: heartbeats deleted the original's running pods).
COPY_INSTANTS = ("right after a heartbeat, before a launch", "a heartbeat interval after one")

#: Seconds a loop may take after its flows were black-holed before ``loop_blocked``: several times
#: the fences' bound (``db.bounds().operation`` per dead statement, a few statements per loop)
#: even on a loaded machine, and far below Linux's retransmissions (about 15 minutes).
WATCHDOG = 120.0


@dataclass
class Clone:
    """Another deployment whose metadata DB is a physical copy of ours (``pgops.cloned``: a restored
    snapshot, a cloud clone), with one scheduler of its own in the same namespace."""

    server: Any  # its PostgreSQL server
    child: Any  # its scheduler process (``World.scheduler_process``)
    started: datetime  # its scheduler job's start: the launcher stamp its pods carry (fenced)

    @property
    def user(self) -> str:
        return self.child.user

    def made(self, pod: Any, seen_launch: bool) -> bool:
        """Whether the clone's scheduler made ``pod``: by the launcher stamp (fenced), else (stock
        pods carry none) by its job's label on a launch none of our schedulers queued."""
        from fenced_k8s_executor.launch import from_pod_metadata

        launch = from_pod_metadata(pod.metadata.annotations)
        if launch is not None and launch.launcher is not None:
            return launch.launcher.started == self.started
        worker = (pod.metadata.labels or {}).get("airflow-worker")
        return worker == str(self.child.job_id) and not seen_launch

    def stop(self) -> None:
        self.child.kill()
        self.server.stop()


class HopRoute:
    """The NAT hop of one checker run (``fenced_k8s_lab.hop``), started the first time an example
    routes the fences through it and closed when the run ends. Root only: elsewhere the examples
    that would black-hole the fences' flows run without (said once in the run's report)."""

    def __init__(self, pg_server: Any):
        self.pg_server = pg_server
        self.nat: Any = None

    def route(self, stack: Any, driver: str, database: str, log: Any) -> Any:
        """The fences' engine (``fenced_k8s_executor.db`` builds it from ``airflow.settings.engine``)
        through the hop until ``stack`` closes; Airflow's own sessions keep their direct connections,
        as a scheduler's would where only the fences' flow was forgotten. Returns the hop, or None."""
        from fenced_k8s_lab.hop import NatHop, skip_reason

        reason = skip_reason()
        if reason:
            log(f"black_holed_loop does nothing here: {reason}")
            return None
        if self.nat is None:
            self.nat = NatHop({"postgres": ("127.0.0.1", self.pg_server.port)}).start()
        from airflow import settings
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        from fenced_k8s_executor import db

        engine = create_engine(self.nat.url("postgres", database, driver), poolclass=NullPool)
        original, settings.engine = settings.engine, engine

        def restore() -> None:
            settings.engine = original
            db.dispose()
            engine.dispose()

        stack.callback(restore)
        return self.nat

    def close(self) -> None:
        if self.nat is not None:
            self.nat.sever()
            self.nat.close()
            self.nat = None


class GroundSteps:
    """Mixin of ``InterleavingMachine``: issue 45's steps."""

    def deployment_id(self) -> str | None:
        """The id the live schedulers stamp on their pods (fenced), else the stored one."""
        for slot in self.live_slots():
            stamp = getattr(slot.sched.executor, "deployment", None)
            if stamp:
                return stamp
        from fenced_k8s_lab.core import our_deployment

        return our_deployment()

    # ------------------------------------------------------------------ the id changes

    def new_generation(self, data):
        """Every live scheduler stops (``end()``) and a new generation starts on the same hosts under
        another deployment id: an operator sets ``deployment_id`` (a new value), or removes it (the
        stored id again); before issue 45, a ``pg_upgrade`` changed the derived id. The new
        generation's first loop adopts the stopped schedulers' tasks: a running task must be adopted
        with its pod, as stock adopts it. So that one runs, the drawn scheduler's newest Pending pod
        starts and its worker calls /run first (after a loop if it has none)."""
        slot = self.pick(data)
        to_stored = data.draw(st.booleans(), label="back to the stored id")
        with self.step(f"{slot.name}'s newest pod starts and its worker calls /run (after a loop if it has none); "
                       "every live scheduler stops; the next generation starts under "
                       f"{'the stored id' if to_stored else 'a new deployment_id'} and adopts"):
            self.join_all()
            pod = self.started_pod(data, slot)
            if pod is not None:
                self.run_worker(pod)
            live = self.live_slots()
            if not live:
                return
            self.generation += 1
            options = {} if to_stored and live[0].options else {"deployment_id": f"gen-{self.generation}-"
                                                                                 f"{uuid.uuid4().hex[:8]}"}
            for slot in live:
                self.exit(slot, "end")
            for slot in live:
                slot.options = dict(options)
                self.start(slot)
            self.trace[-1] += f" [{options.get('deployment_id', 'stored')}]"
            self.adopt(live[0])

    # ------------------------------------------------------------------ a clone deployment

    def clone_appears(self, data):
        """Issue 52 item 2 in one draw: a physical copy of our metadata DB is taken (a staging
        deployment made from production's snapshot) at a drawn instant: right after our schedulers'
        heartbeats, with the drawn scheduler's next launch before any further heartbeat (the copy
        then holds the very heartbeat its pods' launcher last posted), or a heartbeat interval
        later. The copy's own scheduler starts in our namespace, queues its copy of the run and
        creates its pods; time passes with every live scheduler heartbeating; each loops."""
        slot = self.pick(data)
        instant = data.draw(st.sampled_from(COPY_INSTANTS), label="copy taken")
        with self.step(f"a clone of our metadata DB is taken {instant}; {slot.name} loops (no heartbeat); the "
                       f"clone's scheduler starts; {WAIT} s pass, every live scheduler heartbeating; each loops"):
            from fenced_k8s_lab import pgops

            from interleavings.machine import heartbeat

            self.join_all()
            for live in self.live_slots():
                heartbeat(live.sched)
            _checkpoint(self.env.pg_server)
            server = pgops.cloned(self.env.pg_server)
            self.stack.callback(server.stop)
            if instant != COPY_INSTANTS[0]:
                time.sleep(1.1)  # past the heartbeat interval
                for live in self.live_slots():
                    heartbeat(live.sched)
            self.whole_loop(slot, beat=False)  # a launch before the next heartbeat
            url = server.url(self.world.engine.url.database).replace("+psycopg2", f"+{self.driver}")
            with _beating(self.live_slots()):  # our schedulers live on while the clone's starts
                child = self.world.scheduler_process(self.env.profile.kind, hostname="clone-scheduler",
                                                     env={"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url})
            self.stack.callback(child.kill)
            self.clone = Clone(server, child, _job_start(server, self.world.engine.url.database, child.job_id))
            type(self).clones += 1
            self.others[child.user] = "the clone's scheduler"
            self.observe()
            self.pass_time(beating=tuple(self.live_slots()))
            for live in self.live_slots():
                self.whole_loop(live)

    # ------------------------------------------------------------------ the fences' flows black-holed

    def black_holed_loop(self, data):
        """The NAT hop in front of PostgreSQL forgets the flows it carries (the fences' connections:
        the loop's own, the pool's): their packets are dropped without a word, as a cloud NAT or
        load balancer drops an idle flow. Then every live scheduler's ``sync()`` runs, the drawn one
        first: each must return within the bound, deleting nothing on the error. None counts as a
        capable loop (a loop whose read failed fences nothing)."""
        slot = self.pick(data)
        with self.step(f"the NAT hop forgets the fences' flows; {slot.name} syncs, then every other live "
                       "scheduler"):
            self.join_all()
            forgotten = self.hop.forget() if self.hop is not None else set()
            self.trace[-1] += f" [{len(forgotten)} flows]"
            if forgotten:
                self.flows_forgotten = len(self.trace)
            for live in [slot] + [s for s in self.live_slots() if s is not slot]:
                self.bounded_sync(live)

    def bounded_sync(self, slot) -> None:
        """``slot``'s ``sync()`` in a thread: ``loop_blocked`` past ``WATCHDOG`` (the hop then severs
        this process's flows, so the thread ends), ``sync_raised`` on an exception; then airflow-core's
        executor events."""
        raised: list[BaseException] = []

        def sync() -> None:
            try:
                slot.sched.executor.sync()
            except BaseException as error:  # noqa: BLE001 - judged below, on the machine's thread
                raised.append(error)

        thread = threading.Thread(target=sync, name=f"{slot.name}-sync", daemon=True)
        began = time.monotonic()
        thread.start()
        thread.join(WATCHDOG)
        if thread.is_alive():
            if self.hop is not None:
                self.hop.sever()
            thread.join(60.0)
            self.fail("loop_blocked", f"{slot.name}.sync() was still blocked {WATCHDOG:.0f} s after the NAT hop "
                      "forgot the fences' flows", key=("blocked", slot.name))
            return
        self.env.findings.timed("black-holed sync", time.monotonic() - began)
        for error in raised:
            if isinstance(error, Violation):
                raise error
            self.fail("sync_raised", f"{slot.name}.sync() raised {error!r} after its flows were black-holed",
                      key=("holesync", slot.name))
        if not raised:
            self.core(slot, "process executor events", slot.sched.process_events)

    # ------------------------------------------------------------------ hostile annotations

    def hostile_pod(self, data):
        """A pod of ours whose one annotation does not read appears (a copy of a superseded launch's
        pod, launched by a live scheduler: read anyway, a fence would delete it); then the drawn
        scheduler's newest Pending pod is superseded (a user clears its task, it queues it again) and
        it loops twice: the hostile pod costs itself alone, the superseded pod goes as before."""
        from interleavings.bystanders import HOSTILE, make_pod

        slot = self.pick(data)
        field_ = data.draw(st.sampled_from(sorted(HOSTILE)), label="field")
        value = data.draw(st.sampled_from(HOSTILE[field_]), label="value")
        task = data.draw(st.sampled_from(("t1", "t2")), label="task")
        running = data.draw(st.booleans(), label="running")
        shown = repr(value) if len(value) <= 40 else f"{value[:12]!r}... ({len(value)} characters)"
        with self.step(f"a {'Running' if running else 'Pending'} pod of {task} launched by {slot.name} appears, its "
                       f"{field_} {shown}; {slot.name}'s newest Pending pod superseded (after a loop if it has none; "
                       f"user clears, {slot.name} queues again); {slot.name} loops twice"):
            self.join(slot)
            make_pod(self, "hostile", field_=field_, value=value, task_id=task, running=running, creator_slot=slot)
            name = self.pod_of(data, slot, "Pending")
            if name is None:
                return
            self.clear_task(self.pods[name].task)
            self.enqueue_by(slot)
            self.whole_loop(slot)
            self.whole_loop(slot)


@contextmanager
def _beating(slots: list) -> Iterator[None]:
    """Heartbeat ``slots``' schedulers in a thread, when due, until the block ends: a process that
    starts takes seconds here, longer than the checker's health-check threshold, and a live
    original heartbeats meanwhile (else the clone would meet an original whose schedulers look
    dead, which the witness cannot tell from a copy of a stopped deployment)."""
    from interleavings.machine import heartbeat

    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.5):
            for slot in slots:
                try:
                    heartbeat(slot.sched)
                except Exception:  # noqa: BLE001 - a missed heartbeat is a step's business, not this thread's
                    pass

    thread = threading.Thread(target=beat, name="clone-start-heartbeats", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


def _checkpoint(server: Any) -> None:
    """An immediate checkpoint: ``pg_basebackup`` starts with a spread one, which took about 150 s
    here on the first clone of a session; with the dirty pages already written it has next to
    nothing to spread."""
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=server.port, user="postgres", dbname="postgres")
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("CHECKPOINT")
    finally:
        conn.close()


def _job_start(server: Any, database: str, job_id: int) -> datetime:
    """The start of scheduler job ``job_id`` in the clone's database (what its pods' launcher names)."""
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=server.port, user="postgres", dbname=database)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT start_date FROM job WHERE id = %s", (job_id,))
            return cur.fetchone()[0]
    finally:
        conn.close()
