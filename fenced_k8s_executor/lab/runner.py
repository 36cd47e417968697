"""Run one scenario on one executor: a fresh DB, namespace and emulator, the Airflow HA stack and
the process kubelet; drive the scenario; collect evidence; tear everything down."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from fenced_k8s_executor.lab import evidence as ev
from fenced_k8s_executor.lab.dags import write_fanout
from fenced_k8s_executor.lab.measure import TERMINAL, measure
from fenced_k8s_executor.lab.scenarios import Scenario
from fenced_k8s_executor.lab.stack import STOCK_EXECUTOR
from fenced_k8s_executor.names import EXECUTOR_CLASS_PATH

EXECUTORS = {"stock": STOCK_EXECUTOR, "fenced": EXECUTOR_CLASS_PATH}
#: The fenced executor as an operator would run it in a lab: the sweep a little more often.
FENCED_ENV = {"AIRFLOW__FENCED_KUBERNETES_EXECUTOR__SWEEP_INTERVAL": "5"}
COMMON_ENV = {
    # Keep finished pods as evidence (the stock executor would delete Succeeded ones).
    "AIRFLOW__KUBERNETES_EXECUTOR__DELETE_WORKER_PODS": "False",
    "AIRFLOW__CORE__PARALLELISM": "64",
}


@dataclass
class RunContext:
    """What a scenario's ``drive`` may do to the deployment; every fault is recorded."""

    scenario: Scenario
    width: int
    stack: Any
    emulator: Any
    dag_id: str
    say: Callable[[str], None]
    t0: float = field(default_factory=time.time)
    faults: list[dict] = field(default_factory=list)
    run_id: str | None = None
    marked: threading.Event = field(default_factory=threading.Event)
    slow_start: float | None = None

    def note(self, what: str) -> None:
        self.faults.append({"ts": time.time(), "what": what})
        self.say(f"  fault @{time.time() - self.t0:5.1f}s: {what}")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def fault(self, what: str, **spec: Any) -> None:
        self.emulator.add_fault(**spec)
        self.note(what)

    def clear_faults(self, what: str) -> None:
        self.emulator.clear_faults()
        self.note(what)

    def trigger(self) -> None:
        run = self.stack.client().trigger(self.dag_id)
        self.run_id = run["dag_run_id"]
        self.say(f"  triggered {self.dag_id} run {self.run_id}")

    def task_instances(self) -> list[dict]:
        return self.stack.client().task_instances(self.dag_id, self.run_id) if self.run_id else []

    def wait_pods(self, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while len(self.emulator.pods(self.stack.namespace)) < count and time.monotonic() < deadline:
            time.sleep(0.5)

    def clear_tasks(self, what: str) -> None:
        queued = [ti["task_id"] for ti in self.task_instances() if ti.get("state") == "queued"]
        if queued:
            self.stack.client().clear(self.dag_id, self.run_id, task_ids=queued)
        self.note(f"{what} ({len(queued)} TIs)")

    def slow_start_until_marked(self, seconds: float) -> None:
        self.slow_start = seconds

    def mark(self) -> None:
        self.marked.set()

    def start_delay(self, base: Callable[[dict], float] | None) -> Callable[[dict], float]:
        def delay(pod: dict) -> float:
            if self.slow_start is not None and not self.marked.is_set():
                return self.slow_start
            return base(pod) if base else 0.5

        return delay

    def pause_scheduler(self, i: int, what: str) -> None:
        self.stack.schedulers[i].pause()
        self.note(what)

    def resume_scheduler(self, i: int, what: str) -> None:
        self.stack.schedulers[i].resume()
        self.note(what)

    def kill_scheduler(self, i: int, what: str) -> None:
        self.stack.schedulers[i].kill()
        self.note(what)

    def watch_gap(self) -> None:
        self.emulator.compact()
        self.emulator.close_watches()
        self.note("410 Gone: history compacted, watches closed")

    def wait_terminal(self, every: tuple[float, Callable[[], None]] | None = None) -> bool:
        deadline = time.monotonic() + self.scenario.timeout
        next_tick = time.monotonic() + (every[0] if every else 0)
        last = ""
        while time.monotonic() < deadline:
            tis = self.task_instances()
            states = sorted(str(ti.get("state")) for ti in tis)
            summary = ", ".join(f"{s}={states.count(s)}" for s in sorted(set(states)))
            if summary != last:
                self.say(f"  @{time.time() - self.t0:5.1f}s tasks: {summary}")
                last = summary
            if tis and all(ti.get("state") in TERMINAL for ti in tis):
                return True
            if every and time.monotonic() >= next_tick:
                every[1]()
                next_tick = time.monotonic() + every[0]
            time.sleep(2)
        self.say("  timed out waiting for terminal states")
        return False


def _settle(kubelet: Any, emulator: Any, namespace: str, *, timeout: float, say: Callable[[str], None]) -> None:
    """Wait until every pod has finished or is gone: a superseded pod often starts after its task
    instance is long done, and that is exactly what the lab must see."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live = [p for p in emulator.pods(namespace)
                if (p.get("status") or {}).get("phase") in (None, "Pending", "Running")]
        if not live:
            return
        time.sleep(1)
    say(f"  {len(live)} pod(s) still Pending/Running after {timeout:.0f}s")


def run_one(scenario: Scenario, executor: str, *, pg_server: Any, out_dir: Path, seed: int, quick: bool,
            schedulers: int, say: Callable[[str], None] = print) -> dict[str, Any]:
    """One scenario on one executor; returns the measurements (and writes the evidence)."""
    from fenced_k8s_executor.lab.kubeapi import Emulator
    from fenced_k8s_executor.lab.kubelet import LongTailDelay, ProcessKubelet
    from fenced_k8s_executor.lab.postgres import new_airflow_db
    from fenced_k8s_executor.lab.stack import AirflowStack

    run_dir = out_dir / scenario.name / executor
    run_dir.mkdir(parents=True, exist_ok=True)
    width = scenario.width[0 if quick else 1]
    dag_id = f"lab_{scenario.name}"
    dags = write_fanout(run_dir / "dags", dag_id, width).parent
    db_url = new_airflow_db(pg_server)
    ev.install_change_log(db_url)
    env = {**COMMON_ENV, **scenario.env, **(FENCED_ENV if executor == "fenced" else {}),
           **(scenario.fenced_env if executor == "fenced" else {})}
    emulator = Emulator()
    emulator.start()
    stack = kubelet = None
    started = time.time()
    try:
        say(f"[{scenario.name}/{executor}] starting PostgreSQL DB, emulator, api-server, dag-processor, "
            f"{scenario.schedulers or schedulers} scheduler(s)")
        stack = AirflowStack(run_dir, db_url, emulator.url, dags, executor=EXECUTORS[executor],
                             schedulers=scenario.schedulers or schedulers, namespace=f"lab-{scenario.name}",
                             env=env, emulator=emulator)
        stack.start()
        ctx = RunContext(scenario, width, stack, emulator, dag_id, say)
        base = LongTailDelay.parse(scenario.delay, seed=seed) if scenario.delay else None
        kubelet = ProcessKubelet(emulator.write_kubeconfig(str(run_dir / "kube" / "kubelet.kubeconfig"),
                                                           token="kubelet", namespace=stack.namespace),
                                 stack.namespace, start_delay=ctx.start_delay(base),
                                 max_running=scenario.capacity, base_env=stack.worker_env(),
                                 workdir=run_dir / "kubelet")
        kubelet.start()
        stack.wait_schedulers_heartbeat()
        stack.client().wait_dags([dag_id], timeout=180)
        say(f"[{scenario.name}/{executor}] stack up in {time.time() - started:.0f}s; driving the scenario")
        ctx.t0 = time.time()
        scenario.drive(ctx)
        _settle(kubelet, emulator, stack.namespace, timeout=60, say=say)  # stale pods may start late
        time.sleep(3)  # let the last events land
        evidence = ev.collect(db_url=db_url, kubelet_records=kubelet.records(), audit=emulator.audit(),
                              log_dir=stack.log_dir, wall_seconds=time.time() - ctx.t0, faults=ctx.faults)
    finally:
        if kubelet is not None:
            kubelet.stop()
        if stack is not None:
            stack.stop()
        emulator.stop()
    ev.dump(evidence, run_dir / "evidence.json")
    return {"metrics": measure(evidence), "evidence": evidence}
