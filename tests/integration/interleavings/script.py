"""Replay a written sequence of steps through the machine, without Hypothesis: to check a shrunk
sequence by hand, or to see what the checker says about a sequence someone thought of.

    play(machine, [("scheduler_loop", {"scheduler": "A", "heartbeats": True}), ("wait", {})])

Each step's draws are answered by label from its dict (a scheduler by its slot name, a pod by the
task it runs, e.g. ``{"pod": "t1"}`` picks the newest live pod of t1).
"""

from __future__ import annotations

from typing import Any


class Answers:
    """Stands in for Hypothesis's ``data``: ``draw`` answers by label."""

    def __init__(self, machine: Any, answers: dict):
        self.machine = machine
        self.answers = answers

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        want = self.answers[label]
        if label in ("scheduler", "peer", "other"):
            return next(s for s in self.machine.slots if s.name == want)
        if label == "pod":
            pods = [p for p in self.machine.pods.values() if p.task == want or p.name == want]
            live = [p for p in pods if not p.gone and not p.deleting]
            return (live or pods)[-1].name
        return want


def play(machine: Any, steps: list[tuple[str, dict]]) -> None:
    """Run ``steps`` then the checks, as the state machine would; raises the first Violation."""
    machine.promises_hold()
    for name, answers in steps:
        getattr(machine, name)(Answers(machine, answers))
        machine.promises_hold()
