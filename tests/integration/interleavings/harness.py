"""What a checker run is given (session fixtures, a profile) and what it hands back (findings).

A *profile* says which executor runs and which broken promises are recorded instead of failing
the run: for the stock executor, the promises that are the fenced executor's alone; for the
fenced executor, the gaps it is known to have (``KNOWN_GAPS``: none since issue 35's fixes).
Everything else fails the run, with the shrunk sequence. Findings are labelled with the gap that
explains them (``GAPS``), which is how a run on the code before issue 35 reads.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

#: The gaps issue 35 lists, and one the checker found: gap name -> (the invariant it breaks, the
#: regression test that failed until its fix landed).
GAPS: dict[str, tuple[str, str]] = {
    "forgotten_in_flight": ("superseded_pending_lingers",
                            "test_pending_pod_forgotten_after_a_stuck_in_queued_reschedule, "
                            "test_pending_pod_forgotten_after_its_delete_answered_404"),
    "live_creator_skipped": ("superseded_pending_lingers",
                             "test_superseded_pending_pod_of_a_live_peer_whose_api_calls_fail"),
    "running_never_fenced": ("superseded_running_lingers",
                             "test_superseded_running_pod_is_fenced_before_run"),
    "shared_deployment_id": ("bystander_deleted",
                             "test_other_deployment_behind_the_same_address_keeps_its_pods"),
    # not in issue 35: found with the checker (issue 36)
    "revoke_by_coordinates": ("bystander_deleted",
                              "test_stuck_in_queued_revoke_never_deletes_another_deployments_pod"),
}

#: The gaps today's fenced executor still has, recorded by default instead of raised. Add one
#: (with its xfail'd regression test) when a finding cannot be fixed at once.
KNOWN_GAPS: frozenset = frozenset()

#: The promises the stock executor cannot keep, recorded (not raised) in its run: no fence of
#: superseded pods (race d) and no launch gate; a stale pod's events burn tries and hold slots
#: (b1-b4); API and DB errors escape its sync and revoke, and it spins while the DB refuses
#: connections (test_api_faults, test_db_faults); its
#: revoke picks a pod by coordinates and job id (another deployment's too); what a stale pod
#: that won /run leaves behind never finishes.
STOCK_CANNOT = frozenset({
    "superseded_pending_lingers", "superseded_running_lingers", "superseded_wins_run", "slot_held",
    "try_burned", "sync_raised", "loop_blocked", "step_raised", "bystander_deleted", "not_terminal",
})


@dataclass(frozen=True)
class Profile:
    kind: str  # "fenced" | "stock"
    expected: frozenset = frozenset()  # invariants recorded, never raised
    waived: frozenset = frozenset()  # names of KNOWN_GAPS recorded, not raised

    def waives(self, invariant: str, gap: str | None) -> bool:
        return gap in self.waived and GAPS[gap][0] == invariant


def waived_gaps() -> frozenset:
    """CHECKER_GAPS: ``record`` (default: the known gaps waived), ``raise`` (none), ``all`` (every
    gap of ``GAPS``: the code before issue 35's fixes), or a comma list of gap names to waive (hunt
    for the next defect once one is known)."""
    chosen = os.environ.get("CHECKER_GAPS", "record").strip()
    if chosen == "record":
        return KNOWN_GAPS
    if chosen == "raise":
        return frozenset()
    if chosen == "all":
        return frozenset(GAPS)
    names = frozenset(n.strip() for n in chosen.split(",") if n.strip())
    unknown = names - set(GAPS)
    if unknown:
        raise ValueError(f"CHECKER_GAPS names unknown gaps {sorted(unknown)}; known: {sorted(GAPS)}")
    return names


def recorded_invariants(default: frozenset = frozenset()) -> frozenset:
    """CHECKER_RECORD=all records every broken promise instead of raising (long runs that count)."""
    from interleavings.model import INVARIANTS

    return frozenset(INVARIANTS) if os.environ.get("CHECKER_RECORD") == "all" else default


@dataclass
class Finding:
    invariant: str
    detail: str
    gap: str | None
    example: int
    step: int
    trace: list[str]


@dataclass
class Findings:
    """Broken promises that were recorded, not raised, across a run's examples."""

    found: list[Finding] = field(default_factory=list)
    examples: int = 0
    steps: int = 0
    seconds: dict = field(default_factory=dict)  # step kind -> [count, seconds]
    reached: dict = field(default_factory=dict)  # hard state -> the distinct occurrences (hard.HARD)
    held: dict = field(default_factory=dict)  # hard state -> steps after which it held
    drivers: dict = field(default_factory=dict)  # metadata DB driver -> examples run on it
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def hard_states(self, held: set) -> None:
        """The hard states that hold after one step: (state, occurrence) pairs."""
        for state in {state for state, _ in held}:
            self.held[state] = self.held.get(state, 0) + 1
        for state, occurrence in held:
            self.reached.setdefault(state, set()).add((self.examples, occurrence))

    def hard_summary(self) -> str:
        """Per 100 steps: distinct occurrences reached, and steps after which the state held."""
        from interleavings.hard import HARD

        per = 100.0 / max(1, self.steps)
        return ", ".join(f"{state} {len(self.reached.get(state, ())) * per:.1f} reached / "
                         f"{self.held.get(state, 0) * per:.1f} held" for state in HARD)

    def timed(self, kind: str, seconds: float) -> None:
        entry = self.seconds.setdefault(kind, [0, 0.0])
        entry[0] += 1
        entry[1] += seconds

    def add(self, finding: Finding) -> None:
        with self._lock:
            self.found.append(finding)
        self.log(f"FINDING {finding.invariant} gap={finding.gap} example={finding.example} step={finding.step} "
                 f"steps_so_far={self.steps}: {finding.detail}\n" + "".join(f"    {i + 1}. {s}\n" for i, s in
                                                                           enumerate(finding.trace)))

    def log(self, text: str) -> None:
        """Append to CHECKER_REPORT (a long run leaves its findings there as they come)."""
        path = os.environ.get("CHECKER_REPORT")
        if path:
            with open(path, "a") as out:
                out.write(text.rstrip("\n") + "\n")

    def by_invariant(self) -> dict[str, list[Finding]]:
        out: dict[str, list[Finding]] = {}
        for f in self.found:
            out.setdefault(f.invariant, []).append(f)
        return out

    def summary(self) -> str:
        lines = [f"{self.examples} examples, {self.steps} steps; drivers {self.drivers}",
                 f"  hard states per 100 steps: {self.hard_summary()}"]
        if self.seconds:
            lines.append("  seconds: " + ", ".join(f"{k} {n}x {t:.1f}" for k, (n, t) in
                                                    sorted(self.seconds.items(), key=lambda kv: -kv[1][1])))
        for name, items in sorted(self.by_invariant().items()):
            first = items[0]
            gaps = sorted({f.gap for f in items if f.gap})
            lines.append(f"  {name}: {len(items)} (first: example {first.example} step {first.step}"
                         f"{'; gaps ' + ', '.join(gaps) if gaps else ''}) {first.detail}")
        return "\n".join(lines)


@dataclass
class Env:
    """Session fixtures the machine builds each example's world from."""

    profile: Profile
    metadata_db: Any
    airflow: Any
    emulator: Any
    pg_server: Any
    run_client: Any  # TestClient of the api-server app (run gate + execution API)
    tmp_factory: Any
    open_world: Callable
    hops: Any = None  # ground.HopRoute: the NAT hop of the run, started on first use
    findings: Findings = field(default_factory=Findings)


def budget() -> dict[str, Any]:
    """Examples and steps per example: the default run's, or the long run's (CHECKER_EXAMPLES).
    CHECKER_SHRINK=0 leaves shrinking out: the first broken promise ends the run (the mutation
    runs count the steps to it)."""
    from hypothesis import Phase

    chosen = {"max_examples": int(os.environ.get("CHECKER_EXAMPLES", "8")),
              "stateful_step_count": int(os.environ.get("CHECKER_STEPS", "30"))}
    if os.environ.get("CHECKER_SHRINK", "1") == "0":
        chosen["phases"] = [Phase.explicit, Phase.reuse, Phase.generate]
    return chosen
