"""The in-flight reconcile, mixed into FencedKubernetesExecutor: every loop, every launch of this
deployment still in flight is re-checked against its task's row, whoever created its pod.

In flight means a pod that has not finished: this scheduler's just-created pods (the LaunchBook)
until the deployment-wide watch (``in_flight.InFlightPods``) has seen them, then every unfinished
pod the watch shows. Who created a pod never decides whether it is stale, and only evidence from
the pod itself (it finished, or was deleted) takes it out of the picture: a peer whose API calls
fail, a stopped or killed scheduler, a row that is momentarily SCHEDULED under the same token, a
pod that started before its launch was superseded (the provider reports nothing when a pod
starts) all leave the pod re-checked here every loop.

One DB statement per loop serves every fence of the loop (``_rows_for``): the watcher results,
the creation batch and these launches, of which only those whose row changed come back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Hashable, Iterable

from fenced_k8s_executor import ledger, metrics, pods, verdicts
from fenced_k8s_executor.fences.common import Loop
from fenced_k8s_executor.launch import LaunchIdentity
from fenced_k8s_executor.metrics import short

log = logging.getLogger("fenced_k8s_executor")


@dataclass(frozen=True)
class Flying:
    """One launch in flight as the reconcile sees it: its pod, and the executor key whose slot it
    holds here when known from the book (this scheduler's pods not yet seen by the watch)."""

    name: str
    namespace: str
    launch: LaunchIdentity
    uid: str | None = None  # known when the watch saw the pod
    key: Hashable | None = None


@dataclass(frozen=True)
class InFlight:
    """Every launch in flight, by token, and the loop statement's view of them (``ledger.Probe``)."""

    version: tuple
    by_token: dict
    probe: ledger.Probe

    @classmethod
    def of(cls, version: tuple, own: Iterable[Any], refs: Iterable[pods.PodRef]) -> "InFlight":
        by_token: dict[str, list[Flying]] = {}
        for p in own:
            by_token.setdefault(p.launch.token, []).append(Flying(p.name, p.namespace, p.launch, key=p.key))
        for ref in refs:
            by_token.setdefault(ref.launch.token, []).append(Flying(ref.name, ref.namespace, ref.launch, uid=ref.uid))
        return cls(version, by_token, ledger.probe(flights[0].launch for flights in by_token.values()))


class InFlightFence:
    """Re-check the launches in flight each loop; delete the superseded ones' pods."""

    @property
    def _loop(self) -> Loop:
        """This loop's fence state (made on first use: the creation path may run outside ``sync``)."""
        if self._loop_state is None:
            self._loop_state = Loop()
        return self._loop_state

    def _rows_for(self, tasks: set) -> dict:
        """Rows of ``tasks`` (absent: the task has no row). The loop's first call reads, in one
        statement, these tasks and every launch in flight (only the changed ones come back, for
        ``_reconcile``); later calls read only tasks the first one did not cover (a job re-queued
        during the loop). Raises on DB errors."""
        loop = self._loop
        if loop.read:
            missing = set(tasks) - loop.covered
            if missing:
                loop.rows.update(ledger.read_rows(missing))
                loop.covered |= missing
            return loop.rows
        flying = self._in_flight()
        reading = self._reads.read(tasks, flying.probe)
        loop.read = True
        loop.rows = reading.rows
        loop.covered = set(tasks)
        loop.changed = [(f, row) for token, row in reading.changed.items() for f in flying.by_token.get(token, ())]
        return loop.rows

    def _in_flight(self) -> InFlight:
        """This scheduler's created pods the watch has not shown yet, then every pod the watch shows.
        A pod of ours the watch has seen is the watch's from then on: evidence from the pod itself.

        Built again only when the book's pending pods or the watch's picture changed: an idle loop
        with thousands of launches in flight does no work per launch here."""
        view = self.in_flight_pods.view if self.in_flight_pods is not None else None
        for p in self.book.pending():
            if view is not None and view.has(p.namespace, p.name):
                self.book.watched(p.name)
        version = (self.book.pending_version, view.version if view is not None else -1)
        if self._flying is None or self._flying.version != version:
            self._flying = InFlight.of(version, self.book.pending(), view.unsettled() if view is not None else ())
        return self._flying

    def _anything_in_flight(self) -> bool:
        return bool(self.book.pending()) or (self.in_flight_pods is not None and len(self.in_flight_pods.view) > 0)

    def _reconcile_in_flight(self) -> None:
        """The reconcile when no creation batch read the rows this loop: one read at most, and none
        when nothing is in flight."""
        if not self._anything_in_flight():
            self._release_gone()
            return
        try:
            with metrics.timed("fence_check.duration", path="reconcile"):
                self._rows_for(set())
        except Exception as error:
            log.warning("fenced_k8s_executor in-flight reconcile failed, retrying next loop: %r", error)
            metrics.incr("fence_check.error", {"path": "reconcile"})
            return
        self._reconcile()

    def _reconcile(self) -> None:
        """Delete the pods of launches superseded since they were created (a2, any clear, peer
        re-queue or revoke while a pod is in flight), whoever created them."""
        loop = self._loop
        loop.reconciled = True
        for flying, row in loop.changed:
            self._fence_in_flight(flying, row)
        loop.changed = []
        self._release_gone()

    def _release_gone(self) -> None:
        """Free the slots of this scheduler's superseded launches whose pods left the picture without
        a word to it: deleted by a peer (or the sweep) while Pending, which the provider never
        reports. Stock frees such a slot when the stale pod fails at ``/run``; a current launch's
        pod deleted by someone else is left to stock's handling."""
        if self.in_flight_pods is None:
            return
        held = [(key, ref) for ref in self.in_flight_pods.view.take_gone()
                if (key := self.book.key_held_by(ref.launch)) is not None and key in self.running]
        if not held:
            return
        try:
            rows = ledger.read_rows(ref.launch.task for _, ref in held)
        except Exception as error:  # no evidence: the slots are looked at again when the pods' events come
            log.warning("fenced_k8s_executor could not read the rows of %d pods gone: %r", len(held), error)
            return
        for key, ref in held:
            row = rows.get(ref.launch.task)
            verdict = verdicts.is_stale(ref.launch, row)
            if verdict.act and self._enforcing and self.book.holds(key, ref.launch):
                self._release(key, ref.launch)
                metrics.decision("slot.released", path="reconcile", reason=verdict.reason.value, enforced=True,
                                 pod=f"{ref.namespace}/{ref.name}", ti=ref.launch.ti_id,
                                 launch=short(ref.launch.token), current=short(row.token if row else None))

    def _fence_in_flight(self, f: Flying, row: Any) -> None:
        verdict = self._delete_verdict(f.launch, row, f.name)
        if verdict is None or not verdict.act:
            return
        if f.uid is not None and verdicts.host_unresolved(row, f.name):
            # The row names a host that is not this pod's name (a hostname_callable that reports
            # IPs): decide again with the pod's addresses, read once per pod.
            addresses = self._addresses_of(f)
            if addresses is None:
                return  # API error: re-checked next loop
            verdict = self._delete_verdict(f.launch, row, f.name, addresses)
            if verdict is None or not verdict.act:
                return
        if not self._enforcing:
            metrics.decision("pod.stale", path="reconcile", reason=verdict.reason.value, enforced=False,
                             **self._fields(f, row))
            self._settle(f)  # reported once; the stock executor carries on
            return
        if f.uid is None:  # our own pod, not seen by the watch yet: read it for its uid
            deleted = self._delete_launch_pod(f.name, f.namespace, f.launch, "reconcile", verdict, row)
        else:
            deleted = pods.delete(self.kube_client, pods.PodRef(f.name, f.namespace, f.uid, f.launch), self._api_args)
            if deleted:
                metrics.decision("pod.deleted", path="reconcile", reason=verdict.reason.value, enforced=True,
                                 **self._fields(f, row))
            elif deleted is False:
                # 404 or 409: the answer says gone, but only the watch shows it. A pod that left is
                # dropped from the view (and its slot freed by _release_gone); one still listed, its
                # delete answered by a webhook or a proxy, is offered again next loop.
                return
        if deleted is None:
            return  # API error: no evidence the pod is gone, re-check next loop
        self._settle(f)
        self.book.remember(f.name, f.launch)
        key = f.key if f.key is not None else self.book.key_held_by(f.launch)
        if key is not None:  # the provider reports nothing for a deleted Pending pod: free its slot here
            self._release(key, f.launch)

    def _addresses_of(self, f: Flying) -> tuple[str, ...] | None:
        """The pod's IPs (a pod keeps them for its life: cached by uid); None on an API error."""
        cache = self._pod_addresses
        if f.uid in cache:
            return cache[f.uid]
        try:
            found = pods.read_with_addresses(self.kube_client, f.name, f.namespace, self._api_args)
        except Exception as error:  # noqa: BLE001 - no evidence either way
            log.warning("fenced_k8s_executor could not read pod %s/%s: %r", f.namespace, f.name, error)
            return None
        if len(cache) > 10_000:
            cache.clear()
        cache[f.uid] = () if found is None or found[0].uid != f.uid else found[1]
        return cache[f.uid]

    def _settle(self, f: Flying) -> None:
        """Decided: not offered again (until a new object takes the name)."""
        self.book.fenced(f.name)
        if f.uid is not None and self.in_flight_pods is not None:
            self.in_flight_pods.view.settle(pods.PodRef(f.name, f.namespace, f.uid, f.launch))

    @staticmethod
    def _fields(f: Flying, row: Any) -> dict:
        return dict(pod=f"{f.namespace}/{f.name}", ti=f.launch.ti_id, launch=short(f.launch.token),
                    current=short(row.token if row is not None else None), creator=f.launch.scheduler_job_id or "-")
