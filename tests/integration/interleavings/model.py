"""What the checker knows of launches, pods and loops, and the promises it checks. Pure Python.

The model never decides what the executor should do; it only remembers what happened (which
launches each task had, which pods exist, who looped while what held) so that a promise broken
by the real parts can be named. A launch is judged the way the fences judge it, but from the
checker's own record: a launch is *superseded* once a newer launch of its task exists, *current*
while it is the newest one and was not revoked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The promises checked after every step (and at quiescence), by name.
INVARIANTS: dict[str, str] = {
    "current_pod_deleted": "no pod of this deployment is deleted while its launch is current",
    "bystander_deleted": "no other deployment's pod, tokenless pod or malformed pod is ever deleted",
    "superseded_pending_lingers": "a superseded launch's Pending pod is gone within a bounded number of loops of "
                                  "any live scheduler that can reach the API",
    "superseded_running_lingers": "a superseded launch's Running pod that the task's row does not name is gone "
                                  "within a bounded number of loops (issue 35's promise)",
    "superseded_wins_run": "a superseded launch's pod never wins /run",
    "host_pod_deleted": "the pod the task's row names as its host (it won /run) is never deleted while the row "
                        "names it: it is running or finishing the try (issue 35's rule of the row's host)",
    "slot_held": "no executor slot stays held for a task that is terminal or belongs to another scheduler",
    "try_burned": "no try is burned that stock would not burn",
    "not_terminal": "every task reaches a terminal state once faults stop and loops continue",
    "sync_raised": "no exception escapes sync()",
    "loop_blocked": "sync() returns within its bound: 3 s while the DB refuses connections, the fences' bound "
                    "(a few dead statements of db.bounds().operation each) when their flows are black-holed",
    "step_raised": "no exception escapes the executor hooks airflow-core calls (revoke, adoption)",
    "adopted_task_reset": "adoption never resets a task whose current launch's pod is alive and labelled for the "
                          "scheduler that queued it: stock adopts it, whatever the deployment id (issue 45 item 1)",
}

#: Loops of a capable scheduler after which a promise "within one loop" is broken (one spare).
LOOPS = 2
TERMINAL = {"success", "failed", "skipped", "upstream_failed", "removed"}


class Violation(AssertionError):
    """A promise broken by the real parts; ``invariant`` names it (a key of INVARIANTS)."""

    def __init__(self, invariant: str, detail: str, trace: list[str] | None = None):
        self.invariant = invariant
        self.detail = detail
        steps = "\n".join(f"  {i + 1:>3}. {s}" for i, s in enumerate(trace or []))
        super().__init__(f"[{invariant}] {INVARIANTS[invariant]}\n  {detail}\n steps:\n{steps}")


@dataclass
class Launches:
    """Per task, its launches in order (a fenced token, or the stock workload's JWT), and the
    launches the stuck-in-queued handler revoked."""

    order: dict[str, list[str]] = field(default_factory=dict)
    revoked: set[str] = field(default_factory=set)

    def saw(self, task: str, launch: str | None) -> bool:
        if not launch:
            return False
        seen = self.order.setdefault(task, [])
        if launch in seen:
            return False
        seen.append(launch)
        return True

    def latest(self, task: str) -> str | None:
        seen = self.order.get(task)
        return seen[-1] if seen else None

    def superseded(self, task: str | None, launch: str | None) -> bool:
        seen = self.order.get(task or "", [])
        return launch in seen and launch != seen[-1]

    def current(self, task: str | None, launch: str | None) -> bool:
        return launch is not None and self.latest(task or "") == launch and launch not in self.revoked


@dataclass
class Pod:
    """One pod the checker has seen in the namespace."""

    name: str
    origin: str  # "ours" (an executor made it), "clone" (the clone's scheduler made it), or the checker made it:
    # "foreign", "tokenless", "hostile"
    task: str | None = None
    launch: str | None = None  # token (fenced) or workload JWT (stock); None: unknown
    ti_id: str | None = None
    creator: str | None = None  # airflow-worker label: the job id of the scheduler that created it
    phase: str = "Pending"  # as the checker's kubelet last set it
    ran: str | None = None  # "won" / "refused" once its worker called /run; "reported": finishing after its report
    try_number: str | None = None  # the try its annotations name
    worker: str | None = None  # airflow-worker label as last listed: the scheduler whose watch reports its end
    gone: bool = False
    deleting: bool = False
    collides: bool = False  # another deployment's pod stamped with our deployment id
    stamp: str | None = None  # the deployment id it carries (HardStates: pods stamped before an id change)
    protected: bool = True  # a checker-made pod no fence may delete
    stale_since: int | None = None  # the clock's epoch when it was first seen superseded
    loops: int = 0  # capable loops counted against it since
    own_loops: int = 0  # of which its creator's

    @property
    def bystander(self) -> bool:
        return self.origin != "ours"


@dataclass
class Clock:
    """Model time: one epoch per explicit wait (heartbeats age past the hand-over grace). Loops
    by other schedulers count against a promise only from the next epoch on, so a sequence's
    verdict does not depend on how fast the machine ran it."""

    epoch: int = 0


@dataclass
class Burns:
    """Tries a task may spend, counted from the causes that spend one on stock too."""

    allowed: dict[str, int] = field(default_factory=dict)
    clears: dict[str, int] = field(default_factory=dict)

    def allow(self, task: str, n: int = 1) -> None:
        self.allowed[task] = self.allowed.get(task, 0) + n

    def cleared(self, task: str) -> None:
        self.clears[task] = self.clears.get(task, 0) + 1

    def excess(self, task: str, try_number: int, state: str | None) -> int:
        """Tries spent beyond what clears and allowed causes explain (>0: a burn stock would not make)."""
        spent = max(0, try_number - 1) + (1 if state == "failed" else 0)
        return spent - self.clears.get(task, 0) - self.allowed.get(task, 0)
