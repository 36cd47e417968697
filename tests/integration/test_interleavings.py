"""Issue 36: a randomized interleaving checker over the integration world.

Hypothesis picks short sequences of ordinary steps (queue, trigger, sync, heartbeats and waits,
clears, stuck in queued, adoption, /run, pod phases, scheduler exits and restarts, API and DB
faults, other pods in the namespace) and the machine (``interleavings``) checks the promises
after every step, then lets every task finish. Failing sequences shrink to a minimal one.

- ``test_fenced_executor_keeps_its_promises``: the default run (fixed seed, bounded budget),
  the known gaps recorded rather than raised (``KNOWN_GAPS``, none today; each would have an xfail'd
  regression test in ``test_interleaving_regressions.py``). ``CHECKER_GAPS=raise`` raises them too.
- ``test_stock_executor_breaks_the_fenced_promises``: the same machine on the stock executor; the
  promises it cannot keep (``STOCK_CANNOT``) are recorded and must show up, the others must hold.

Long runs: ``CHECKER_EXAMPLES=5000 CHECKER_SEED=random`` (docs/checker.md).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from interleavings.ground import HopRoute
from interleavings.harness import STOCK_CANNOT, Env, Profile, budget, recorded_invariants, waived_gaps
from interleavings.machine import InterleavingMachine
from interleavings.script import play

pytestmark = pytest.mark.integration

#: The default run's seed: CI explores the same sequences every time. Within the default
#: budget this one shows stock leaving a superseded Pending and a Running pod and superseded pods
#: winning /run (seed 7 did before the steps drew their arguments up front; docs/checker.md).
SEED = 2
#: Stock's seeds, the next tried only when the one before left no superseded Pending pod: whether
#: a step applies depends on timing, and after the fenced run in the same session seed 2 alone
#: showed only sync_raised and step_raised on stock in three runs of three here.
STOCK_SEEDS = (SEED, 3, 5)


@pytest.fixture(scope="module")
def run_client(metadata_db):
    """The api-server app in process: the execution API behind real JWT auth, plus the root
    middlewares of installed plugins (the fenced run gate), as ``airflow api-server`` serves them."""
    from fastapi.testclient import TestClient

    from airflow.api_fastapi.app import create_app

    with TestClient(create_app(apps="core,execution")) as client:
        yield client


@pytest.fixture
def machine_for(metadata_db, airflow, emulator_session, pg_server, run_client, tmp_path_factory, world_opener):
    """A machine class for ``profile``: each instance is one example with its own world. The NAT hop
    the examples that black-hole the fences' flows route them through is the run's, closed at its end."""
    hops = HopRoute(pg_server)

    def make(profile: Profile) -> type:
        env = Env(profile, metadata_db, airflow, emulator_session, pg_server, run_client, tmp_path_factory,
                  world_opener[0], hops)
        return type(f"{profile.kind.title()}Interleavings", (InterleavingMachine,), {"env": env, "examples": 0})

    yield make
    hops.close()


@pytest.fixture
def checker(machine_for):
    def run(profile: Profile, default_seed: int = SEED) -> Env:
        machine = machine_for(profile)
        env = machine.env
        chosen = os.environ.get("CHECKER_SEED", str(default_seed))
        if chosen != "random":
            machine = seed(int(chosen))(machine)
        try:
            run_state_machine_as_test(machine, settings=settings(
                **budget(), deadline=None, database=None, suppress_health_check=list(HealthCheck),
                report_multiple_bugs=False, print_blob=True))
        finally:
            summary = f"{profile.kind} checker: {env.findings.summary()}"
            print("\n" + summary)  # shown with -s or -rP
            env.findings.log(summary)
        return env

    return run


def test_fenced_executor_keeps_its_promises(checker):
    """Every promise holds, except the known gaps (recorded and printed, each with an xfail'd
    regression test); any other broken promise fails with its shrunk sequence."""
    checker(Profile("fenced", expected=recorded_invariants(), waived=waived_gaps()))


def test_stock_executor_breaks_the_fenced_promises(checker):
    """The stock executor on the same steps: the promises it cannot keep are recorded; those it
    keeps must hold. Within the default budget it must at least leave a superseded launch's
    Pending pod behind (race d), or the checker cannot tell the two executors apart."""
    broken: set = set()
    for default_seed in STOCK_SEEDS[:1 if "CHECKER_SEED" in os.environ else None]:
        env = checker(Profile("stock", expected=recorded_invariants(STOCK_CANNOT)), default_seed)
        broken |= set(env.findings.by_invariant())
        if "superseded_pending_lingers" in broken:
            break
    assert "superseded_pending_lingers" in broken, f"stock kept the per-loop fence promise; broke only {broken}"


#: Issue 55's finding, the steps that matter (1, 2, 3 and 6 of 14; its clone, at step 13, only
#: let time pass and loops run): t1's third try, its last, is launched by A; its pod wins /run,
#: reports the try failed and goes on finishing (callbacks, the log upload).
LAST_TRY_FINISHING = [
    ("clear_while_running", {"scheduler": "B", "exits 0": True, "pod": "t1"}),
    ("clear_while_running", {"scheduler": "A", "exits 0": True, "pod": "t1"}),
    ("scheduler_loop", {"scheduler": "A", "heartbeats": True}),
    ("retry_while_finishing", {"scheduler": "A", "pod": "t1"}),
]
A_LOOPS_AFTER_A_WAIT = [("wait", {})] + [("scheduler_loop", {"scheduler": "A", "heartbeats": True})] * 2


@pytest.mark.parametrize("kind", ["stock", "fenced"])
def test_a_finishing_worker_keeps_its_slot_until_its_pod_ends(machine_for, kind):
    """Issue 55: the checker reported ``slot_held`` for a slot the executor must hold. The last try's
    worker reports failed (the row is terminal) and its pod goes on running; after a wait A loops
    twice: A holds the try's slot, as the provider holds every slot until its pod's terminal event
    (stock and fenced alike), and the checker took it for a slot held for a failed task. Once the
    pod ends, the promise judges again: A must free the slot within its loops."""
    machine = machine_for(Profile(kind))()
    try:
        play(machine, LAST_TRY_FINISHING)
        row = machine.rows()["t1"]
        (finishing,) = [p for p in machine.pods.values() if p.task == "t1" and p.ran == "reported"]
        a = machine.slots[0].sched
        (key,) = [k for k in a.executor.running if k.task_id == "t1"]
        assert row.state == "failed" and finishing.phase == "Running" and key.try_number == row.try_number
        assert machine.worker_on_node(a.job_id, key)
        play(machine, A_LOOPS_AFTER_A_WAIT)  # raised slot_held before the fix
        play(machine, [("finishing_pod_ends", {"pod": finishing.name})])
        assert not machine.worker_on_node(a.job_id, key)  # judged from here
        play(machine, A_LOOPS_AFTER_A_WAIT)
        assert key not in a.executor.running, f"{kind}: A still holds t1 after its pod ended"
    finally:
        machine.clean = False  # no quiescence: the sequence is judged
        machine.teardown()
