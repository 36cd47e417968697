"""The state-change fence (races b1-b5), mixed into FencedKubernetesExecutor.

Every watcher result and adopted completed pod is judged before it can touch ``running``, the
event buffer or the pre-execution requeue; the DB is read once per sync for all of them.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from fenced_k8s_executor import batches, ledger, metrics, pods, verdicts
from fenced_k8s_executor.fences.common import ADOPTED, FAILED, RUNNING, TaskInstanceState
from fenced_k8s_executor.launch import pod_name
from fenced_k8s_executor.metrics import short

if TYPE_CHECKING:
    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_types import KubernetesResults

log = logging.getLogger("fenced_k8s_executor")

#: Unknown pods in one sync beyond which one metadata list beats reading pods one by one.
PRIME_AFTER_MISSES = 8


class EventFence:
    """Judge pod events by their launch token; swallow the stale ones, free their slots."""

    @contextmanager
    def _fenced_loop(self) -> Iterator[None]:
        """Around the provider's ``sync``: the watcher results are batched so that the loop's one
        read covers them (``_prefetch_state_verdicts``), and the in-flight reconcile runs even
        when no creation batch did. The loop's state is dropped when it ends."""
        if not self._fencing or self.result_queue is None:
            yield
            return
        if self.sweeper is not None:
            self.sweeper.maybe_start()
        real = self.result_queue
        self.result_queue = batches.LazyBatchQueue(real, self._prefetch_state_verdicts)
        self._loop_state = None
        try:
            yield
            if not self._loop.reconciled:  # no creation batch ran this loop (rate limit, empty queue)
                self._reconcile_in_flight()
        finally:
            self.result_queue = real
            self._loop_state = None
        self.book.tidy(self.running)

    def _prefetch_state_verdicts(self, batch: list[KubernetesResults]) -> None:
        """The loop's one DB read: every watcher result of this sync (pods resolved from memory
        first), and with it this loop's creation batch and the launches in flight, which the
        creation fence and the reconcile then find already read."""
        try:
            misses = sum(1 for result in batch if not self.book.knows(result.pod_name))
            if misses > PRIME_AFTER_MISSES:  # a watcher relist after a restart or a 410
                self._prime_launches()
            launches = {id(result): self._launch_of_pod(result.pod_name, result.namespace) for result in batch}
            tasks = {launch.task for launch in launches.values() if launch is not None and not launch.legacy}
            tasks |= {launch.task for launch in map(self._launch_of_job, self._take_creation_batch())
                      if launch is not None}
            tasks.discard(None)
            with metrics.timed("fence_check.duration", path="state_change"):
                rows = self._rows_for(tasks)
        except Exception as error:  # each result is then checked (and retried) on its own
            if pods.is_api_error(error):
                pods.report("read", error, then="each result checked on its own")
            else:
                log.warning("fenced_k8s_executor state-change prefetch failed: %r", error)
            return
        verdicts_of = self._loop.state_verdicts
        for result in batch:
            launch = launches[id(result)]
            row = rows.get(launch.task) if launch is not None else None
            verdicts_of[id(result)] = (launch, verdicts.is_stale(launch, row), row)

    def _change_state(self, results: KubernetesResults, **kwargs: Any) -> None:
        """Guard, fence, stock. An API error postpones the result to the next loop
        (``_postpone``): re-raised, the provider would put it back on the very queue it is
        draining and retry it at once for as long as the fault lasts. A DB error is raised: the
        provider re-queues the result."""
        try:
            launch = None
            if self._fencing:
                done, launch = self._fence_state_change(results)
                if done:
                    return
            try:
                super()._change_state(results, **kwargs)
            finally:
                self._loop.handling = None
            if launch is not None and launch.token and self.event_buffer.get(results.key) == (RUNNING, None):
                # No token info: a None would erase the pre-assigned token (b3, b5).
                self.event_buffer.pop(results.key, None)
        except Exception as error:
            if not pods.is_api_error(error):
                raise
            self._postpone(results, error)

    def _fence_state_change(self, results: KubernetesResults) -> tuple[bool, Any]:
        """Judge the result: (True, launch) when it belonged to a stale launch and ends here
        (enforce), else (False, launch) for the stock handling."""
        entry = self._loop.state_verdicts.pop(id(results), None)
        if entry is None:  # raises on a DB or API error
            launch = self._launch_of_pod(results.pod_name, results.namespace)
            row = None
            if launch is not None and not launch.legacy and launch.task is not None:
                row = ledger.read_rows([launch.task]).get(launch.task)
            entry = (launch, verdicts.is_stale(launch, row), row)
        launch, verdict, row = entry
        self.book.observed(results.pod_name)
        if verdict.act:
            metrics.decision(
                "event.swallowed",
                path="state_change",
                reason=verdict.reason.value,
                enforced=self._enforcing,
                pod=f"{results.namespace}/{results.pod_name}",
                state=results.state,
                ti=launch.ti_id,
                launch=short(launch.token),
                current=short(row.token if row else None),
            )
            if self._enforcing:
                self._fence_out(results, launch, verdict, row)
                return True, launch
        elif results.state == ADOPTED and launch is not None and not self.book.holds(results.key, launch):
            return True, launch  # an old pod of this key left for another scheduler; a newer launch holds the slot
        if self._enforcing and results.state == FAILED:
            self._remember_requeue_pod(results.key)
        self._loop.handling = (results.key, row) if row is not None else None
        return False, launch

    def _get_task_instance_state(self, key: Any, **kwargs: Any) -> Any:
        """The provider reads a finished pod's task state with one query of its own per pod (a pool
        check-out, its ping, the query and a commit: a fifth of a finishing loop at 1,000 pods, on
        stock too); the loop's one statement read that row moments earlier in the same ``sync``.
        Answered from it when it is the very attempt ``key`` names; otherwise the provider's query."""
        known = self._loop_state.handling if self._loop_state is not None else None
        if known is not None and known[0] == key and _same_attempt(key, known[1]):
            return TaskInstanceState(known[1].state) if known[1].state else None
        return super()._get_task_instance_state(key, **kwargs)

    def _fence_out(self, results: KubernetesResults, launch: Any, verdict: verdicts.Verdict, row: Any) -> None:
        """A stale launch's event never reaches the scheduler; its pod goes (a running one now,
        a finished one by the stock clean-up rules) and its slot is freed as stock would free it."""
        if results.state == RUNNING:
            delete = self._delete_verdict(launch, row, f"{results.namespace}/{results.pod_name}")
            if delete is not None and delete.act:
                self._delete_launch_pod(results.pod_name, results.namespace, launch, "state_change", delete, row)
        elif results.state != ADOPTED:
            self._retire_finished_pod(results.pod_name, results.namespace, launch, results.state)
        self._release(results.key, launch)

    def _remember_requeue_pod(self, key: Any) -> None:
        """Know the pod of a launch's pre-execution requeue before it exists: the next attempt
        gets the next name (``_planned_name``; the failed pod keeps its name until deleted)."""
        attempt = self.pod_launch_attempts.get(key)
        launch = self._launch_of_job(attempt.job) if attempt is not None else None
        if launch is None or not launch.token:
            return
        self.book.remember(pod_name(launch.dag_id, launch.task_id, launch.token, attempt.attempts + 1), launch)


def _same_attempt(key: Any, row: Any) -> bool:
    """Is ``row`` the attempt the provider's own state query would find for ``key``: by id
    (``TaskInstanceUuid``), or by task and try (``TaskInstanceKey``, outside a dynamic region)?"""
    if hasattr(key, "try_number"):
        return not row.region and (key.dag_id, key.task_id, key.run_id, key.map_index, key.try_number) == (
            row.dag_id, row.task_id, row.run_id, row.map_index, row.try_number)
    ident = getattr(key, "id", None)
    return ident is not None and str(ident) == row.ti_id
