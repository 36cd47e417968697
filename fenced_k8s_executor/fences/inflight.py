"""The in-flight reconcile, mixed into FencedKubernetesExecutor: every loop, the launches still
Pending are re-checked against their tasks' rows, this scheduler's own (the LaunchBook) and this
deployment's whose creating scheduler is not running (``pending.PendingPods``): a Pending pod
emits no events, so nothing else would look at it before it starts.

One DB read per loop serves every fence of the loop (``_rows_for``): the watcher results, the
creation batch, these launches, and which peers are running.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

from fenced_k8s_executor import ledger, metrics, pods, verdicts
from fenced_k8s_executor.fences.common import Loop
from fenced_k8s_executor.metrics import short

log = logging.getLogger("fenced_k8s_executor")


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
        statement, these tasks, this scheduler's launches in flight and the Pending pods of peers
        that are not running; later calls read only tasks the first one did not cover (a job
        re-queued during the loop). Raises on DB errors."""
        loop = self._loop
        if loop.read:
            missing = set(tasks) - loop.covered
            if missing:
                loop.rows.update(ledger.read_rows(missing))
                loop.covered |= missing
            return loop.rows
        wanted = set(tasks) | {p.launch.task for p in self.book.pending()}
        peers = self._peer_launches()
        reading = ledger.read_with_peers(wanted, [(ref.launch.task, ref.launch.token, ref.launch.creator)
                                                  for ref in peers], self._alive_since())
        loop.read = True
        loop.rows = reading.rows
        loop.covered = wanted  # a peer's task is not covered: its row was read only if it looked stale
        if reading.superseded:
            me = self._scheduler_job_int()
            loop.orphans = [(ref, reading.superseded[key]) for ref in peers
                            if (key := (ref.launch.task, ref.launch.token)) in reading.superseded
                            and verdicts.rechecks_peer(ref.launch, me, reading.running)]
        return loop.rows

    def _peer_launches(self) -> list[pods.PodRef]:
        """This deployment's Pending pods that other scheduler processes created (ours are in the
        book), once per loop."""
        loop = self._loop
        if loop.peers is None:
            loop.peers = []
            if self.pending_pods is not None:
                mine = {p.name for p in self.book.pending()}
                me = str(self.scheduler_job_id)
                loop.peers = [ref for ref in self.pending_pods.refs()
                              if ref.launch.scheduler_job_id != me and ref.name not in mine
                              and ref.launch.task is not None and not ref.launch.legacy]
        return loop.peers

    def _alive_since(self) -> datetime:
        return datetime.now(timezone.utc) - timedelta(seconds=self._handover_after)

    def _reconcile_in_flight(self) -> None:
        """The reconcile when no creation batch read the rows this loop: one read at most, and none
        when nothing is in flight."""
        if not self.book.pending() and not self._peer_launches():
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
        """Delete the pods of launches superseded since they were created (a2, and any clear, peer
        re-queue or revoke while a pod is Pending), this scheduler's and its stopped peers'."""
        loop = self._loop
        loop.reconciled = True
        for p in self.book.pending():
            if p.launch.task in loop.covered:
                self._reconcile_own(p, loop.rows.get(p.launch.task))
        for ref, row in loop.orphans:
            self._reconcile_orphan(ref, row)
        loop.orphans = []

    def _reconcile_own(self, p, row) -> None:
        verdict = verdicts.should_delete(p.launch, row, self.deployment)
        if not verdict.act:
            if verdict.reason is verdicts.Reason.CURRENT and row.state != verdicts.QUEUED:
                self.book.observed(p.name)  # it ran (or is running): no longer in flight
            return
        if not self._enforcing:
            metrics.decision("pod.stale", path="reconcile", reason=verdict.reason.value, enforced=False,
                             pod=f"{p.namespace}/{p.name}", ti=p.launch.ti_id, launch=short(p.launch.token),
                             current=short(row.token if row else None))
            self.book.observed(p.name)  # reported once; the stock executor carries on
            return
        settled = self._delete_launch_pod(p.name, p.namespace, p.launch, "reconcile", verdict, row)
        if settled is None:
            return  # API error: no evidence the pod is gone, re-check next loop
        self.book.fenced(p.name)
        self._release(p.key, p.launch)

    def _reconcile_orphan(self, ref: pods.PodRef, row) -> None:
        """A stopped, crashed or replaced scheduler's Pending pod: deleted when superseded (it holds
        no slot here). Another live scheduler may delete it too: the uid precondition makes the
        second delete a no-op, and a current launch is never touched."""
        verdict = verdicts.should_delete(ref.launch, row, self.deployment)
        if not verdict.act:
            return
        fields = dict(pod=f"{ref.namespace}/{ref.name}", ti=ref.launch.ti_id, launch=short(ref.launch.token),
                      current=short(row.token if row else None), creator=ref.launch.scheduler_job_id or "-")
        if not self._enforcing:
            metrics.decision("pod.stale", path="reconcile_orphan", reason=verdict.reason.value, enforced=False,
                             **fields)
            self.pending_pods.view.settle(ref)
            return
        deleted = pods.delete(self.kube_client, ref, self._api_args)
        if deleted is None:
            return  # API error: judged again next loop
        self.pending_pods.view.settle(ref)
        self.book.remember(ref.name, ref.launch)
        if deleted:
            metrics.decision("pod.deleted", path="reconcile_orphan", reason=verdict.reason.value, enforced=True,
                             **fields)
