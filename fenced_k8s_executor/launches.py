"""LaunchBook: the one owner of what this scheduler knows about the launches it has in flight.

Every fence path asks the book instead of keeping state of its own:

- which launch a pod belongs to (pod name -> launch; bounded, so finished and fenced-out pods
  keep resolving for their late events without a pod read);
- which launch holds an executor key's slot (``running`` / ``pod_launch_attempts``): a swallowed
  event releases the slot only when its own launch holds it, never a newer launch's;
- which pods it created that the deployment-wide watch has not shown yet: the per-loop reconcile
  re-checks them with every pod the watch shows (a Pending pod emits no events).

Plain Python, no Airflow or Kubernetes imports; thread-safe because the sweep thread records
what it finds here too. Memory is bounded by the launches in flight plus ``memory`` pod names.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable, Iterable

from fenced_k8s_executor.launch import LaunchIdentity, as_token
from fenced_k8s_executor.verdicts import releases_slot

#: Pod names remembered after their launch ended (hours of churn; an entry is a few hundred bytes).
MEMORY = 20_000
#: Loops between two full prunes of the slot holders when no key is known to have left (``tidy``).
PRUNE_EVERY = 64


@dataclass(frozen=True)
class Pending:
    """A pod this scheduler created that has not reported Running (or finished) yet."""

    name: str
    namespace: str
    key: Hashable
    launch: LaunchIdentity


class LaunchBook:
    def __init__(self, memory: int = MEMORY):
        self._memory = memory
        self._lock = threading.Lock()
        self._pods: OrderedDict[str, LaunchIdentity] = OrderedDict()
        self._holders: dict[Hashable, str] = {}  # key -> token of the launch holding its slot
        self._pending: dict[str, Pending] = {}
        self.pending_version = 0  # bumped whenever the pending launches change
        self._tidied = 0  # loops since start (``tidy``)

    # ------------------------------------------------------------ recording

    def queued_all(self, pairs: Iterable[tuple[Hashable, str | None]]) -> None:
        """The executor put each ``key`` in ``running`` for the launch of its ``token``
        (execute_async; None: a legacy launch): a whole trigger_tasks batch under one lock. Only
        the tokens: this runs for every workload the scheduler queues."""
        with self._lock:
            for key, token in pairs:
                self._holders[key] = token or ""

    def created(self, key: Hashable, name: str, namespace: str, launch: LaunchIdentity) -> None:
        """A pod was created for ``launch``: it is pending until it reports Running or finishes."""
        with self._lock:
            self._remember(name, launch)
            self._pending[name] = Pending(name, namespace, key, launch)
            self.pending_version += 1

    def adopted(self, key: Hashable, name: str, launch: LaunchIdentity) -> None:
        with self._lock:
            self._remember(name, launch)
            self._holders[key] = as_token(launch.token) or ""

    def remember(self, name: str, launch: LaunchIdentity) -> None:
        with self._lock:
            self._remember(name, launch)

    def remember_all(self, pairs: Iterable[tuple[str, LaunchIdentity]]) -> None:
        with self._lock:
            for name, launch in pairs:
                self._remember(name, launch)

    def observed(self, name: str) -> None:
        """The pod reported Running or a terminal state: no longer pending."""
        with self._lock:
            if self._pending.pop(name, None) is not None:
                self.pending_version += 1

    def fenced(self, name: str) -> None:
        """The pod was deleted as stale: nothing more to re-check."""
        self.observed(name)

    def watched(self, name: str) -> None:
        """The deployment-wide watch has seen the pod: it is re-checked from there until it finishes."""
        self.observed(name)

    # ------------------------------------------------------------ questions

    def launch_of(self, name: str) -> LaunchIdentity | None:
        with self._lock:
            return self._pods.get(name)

    def knows(self, name: str) -> bool:
        with self._lock:
            return name in self._pods

    def holder(self, key: Hashable) -> str | None:
        """Token of the launch holding ``key``'s slot ("" for a legacy launch), None if none."""
        with self._lock:
            return self._holders.get(key)

    def key_held_by(self, launch: LaunchIdentity) -> Hashable | None:
        """The executor key whose slot ``launch`` holds here, if any (a pod of this scheduler's own
        launch, or one it adopted, deleted by the reconcile: the provider reports nothing for a
        Pending pod that is deleted, so the slot is freed here). Scans: called per delete only."""
        token = as_token(launch.token)
        if not token:
            return None
        with self._lock:
            return next((key for key, holder in self._holders.items() if holder == token), None)

    def holds(self, key: Hashable, launch: LaunchIdentity | None) -> bool:
        """True when ``launch`` (or nobody known) holds ``key``: its discard may release the slot."""
        with self._lock:
            return releases_slot(self._holders.get(key), launch)

    def release(self, key: Hashable, launch: LaunchIdentity | None) -> bool:
        """Should a stale ``launch``'s event free ``key``'s slot? Forgets the holder if so."""
        with self._lock:
            if not releases_slot(self._holders.get(key), launch):
                return False
            self._holders.pop(key, None)
            return True

    def pending(self) -> list[Pending]:
        with self._lock:
            return list(self._pending.values())

    def prune(self, running: Iterable[Hashable]) -> None:
        """Forget the holders of keys that left ``running`` by any path (revoke, fail, adoption).

        Pending launches stay: a revoked launch's pod may still exist (its delete failed, or its
        create was in flight), and the reconcile must still see it. A pending launch leaves only on
        evidence from its pod: it reported, was fenced, or the deployment-wide watch has it."""
        live = running if isinstance(running, (set, frozenset)) else set(running)
        with self._lock:
            for key in [k for k in self._holders if k not in live]:
                del self._holders[key]

    def tidy(self, running: set | frozenset) -> None:
        """``prune``, once per loop, only when a key may have left ``running``: at once when the
        book holds more keys than ``running`` does, otherwise every ``PRUNE_EVERY``-th loop (a key
        left while another came in). A full prune hashes every key, which on Airflow 3.4 (a
        dataclass around a UUID) cost an idle loop 1 ms per 1,000 launches in flight; a holder
        left behind meanwhile names a key that is not running, where releasing it frees nothing
        (every path that puts a key back in ``running`` records its holder anew)."""
        self._tidied += 1
        if len(self._holders) > len(running) or self._tidied % PRUNE_EVERY == 0:
            self.prune(running)

    def snapshot(self) -> dict[str, LaunchIdentity]:
        """Pod name -> launch, as remembered now (a copy)."""
        with self._lock:
            return dict(self._pods)

    def sizes(self) -> dict[str, Any]:
        with self._lock:
            return {"pods": len(self._pods), "holders": len(self._holders), "pending": len(self._pending)}

    # ------------------------------------------------------------ internals

    def _remember(self, name: str, launch: LaunchIdentity) -> None:
        self._pods[name] = launch
        self._pods.move_to_end(name)
        while len(self._pods) > self._memory:
            self._pods.popitem(last=False)
