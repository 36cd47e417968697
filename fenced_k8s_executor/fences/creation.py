"""Creation-side fences (races a1, a2, a3), mixed into FencedKubernetesExecutor.

The provider dequeues creation jobs one by one; ``_fenced_creation_batch`` hands it a batch
whose rows were read in ONE query, and the same query re-checks the previous loop's creations.
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from fenced_k8s_executor import batches, ledger, metrics, pods, verdicts
from fenced_k8s_executor.launch import LaunchIdentity
from fenced_k8s_executor.metrics import short

if TYPE_CHECKING:
    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_types import KubernetesJob

log = logging.getLogger("fenced_k8s_executor")


def _is_already_exists(error: Exception) -> bool:
    if getattr(error, "status", None) != 409:
        return False
    try:
        return json.loads(getattr(error, "body", None) or "{}").get("reason") == "AlreadyExists"
    except (TypeError, ValueError):
        return "already exists" in str(getattr(error, "body", ""))


class CreationFence:
    """Pre-creation check, post-create re-check, AlreadyExists recognition, safe discards."""

    def _create_pods_sequentially(self) -> None:
        with self._fenced_creation_batch():
            super()._create_pods_sequentially()

    def _create_pods_concurrently(self) -> None:
        with self._fenced_creation_batch():
            super()._create_pods_concurrently()

    @contextmanager
    def _fenced_creation_batch(self) -> Iterator[None]:
        """Read the whole creation batch's rows in one query, then let the provider create.

        The same query re-checks every launch this scheduler created that has not reported
        Running yet (the in-flight reconcile, which also covers the check-then-create gap a2), so
        a busy scheduler pays one round trip per loop for both.
        """
        if not self._fencing or self.task_queue is None:
            yield
            return
        real = self.task_queue
        size = self.kube_config.worker_pods_creation_batch_size
        jobs = [self._carry.popleft() for _ in range(min(size, len(self._carry)))]
        jobs += batches.drain(real, size - len(jobs))
        pending = self.book.pending()
        if not jobs and not pending:
            yield
            return
        launches = {id(job): self._launch_of_job(job) for job in jobs}
        tasks = {launch.task for launch in launches.values() if launch is not None}
        tasks |= {p.launch.task for p in pending}
        try:
            with metrics.timed("fence_check.duration", path="pre_create"):
                rows = self._loop_rows_for(tasks)
        except Exception as error:
            # No evidence either way: create nothing and drop nothing this loop.
            log.warning("fenced_k8s_executor pre-create check failed, retrying next loop: %r", error)
            metrics.incr("fence_check.error", {"path": "pre_create"})
            self._carry.extendleft(reversed(jobs))
            jobs = []
            rows = None
        if rows is not None:
            self._reconcile(pending, rows)
            scheduler_job_id = self._scheduler_job_int()
            for job in jobs:
                launch = launches[id(job)]
                if launch is not None:
                    verdict = verdicts.should_create(launch, rows.get(launch.task), scheduler_job_id)
                    self._precreate[id(job)] = (launch, verdict)
        adapter = batches.BatchQueue(real, jobs)
        self.task_queue = adapter
        self._publish_failed = set()
        try:
            yield
        finally:
            self.task_queue = real
            self._carry.extendleft(reversed(adapter.leftovers()))
            self._finish_creation_batch(adapter.served)

    def _finish_creation_batch(self, served: list[KubernetesJob]) -> None:
        for job in served:
            entry = self._precreate.pop(id(job), None)
            if entry is None or id(job) in self._publish_failed:
                continue
            launch, verdict = entry
            if verdict.act or (not self._enforcing and verdict.stock):
                name, namespace = self._pod_location(job)
                if name:
                    self.book.created(job.key, name, namespace, launch)
                metrics.incr("launch.created", {"reason": verdict.reason.value})
        self._precreate.clear()
        self._publish_failed = set()

    def _take_creation_batch(self) -> list:
        """This loop's creation batch, taken from the task queue early (kept in ``_carry``) so
        that the loop's single query can cover it too."""
        size = self.kube_config.worker_pods_creation_batch_size
        if self.task_queue is not None and len(self._carry) < size:
            self._carry.extend(batches.drain(self.task_queue, size - len(self._carry)))
        return list(self._carry)[:size]

    def _loop_rows_for(self, tasks: set) -> dict:
        """Rows of ``tasks``: from the loop's one query when it covered them, else one more
        query for the rest (a job re-queued during the loop). Raises on DB errors."""
        covered, rows = self._loop_rows if self._loop_rows is not None else (set(), {})
        missing = set(tasks) - covered
        if missing:
            rows = {**rows, **ledger.read_rows(missing)}
            self._loop_rows = (covered | missing, rows)
        return rows

    def _reconcile_in_flight(self) -> None:
        """The in-flight reconcile when no creation batch read the rows this loop: at most one
        query, and none when every launch of this scheduler has reported Running."""
        pending = self.book.pending()
        if not pending:
            return
        try:
            with metrics.timed("fence_check.duration", path="reconcile"):
                rows = self._loop_rows_for({p.launch.task for p in pending})
        except Exception as error:
            log.warning("fenced_k8s_executor in-flight reconcile failed, retrying next loop: %r", error)
            metrics.incr("fence_check.error", {"path": "reconcile"})
            return
        self._reconcile(pending, rows)

    def _reconcile(self, pending: list, rows: dict) -> None:
        """Delete the pods of launches superseded since they were created (a2, and any clear,
        peer re-queue or revoke while a pod is Pending), and free their slots."""
        self._reconciled = True
        for p in pending:
            row = rows.get(p.launch.task)
            verdict = verdicts.should_delete(p.launch, row, self.deployment)
            if not verdict.act:
                if verdict.reason is verdicts.Reason.CURRENT and row.state != verdicts.QUEUED:
                    self.book.observed(p.name)  # it ran (or is running): no longer in flight
                continue
            if not self._enforcing:
                metrics.decision("pod.stale", path="reconcile", reason=verdict.reason.value, enforced=False,
                                 pod=f"{p.namespace}/{p.name}", ti=p.launch.ti_id, launch=short(p.launch.token),
                                 current=short(row.token if row else None))
                self.book.observed(p.name)  # reported once; the stock executor carries on
                continue
            settled = self._delete_launch_pod(p.name, p.namespace, p.launch, "reconcile", verdict, row)
            if settled is None:
                continue  # API error: no evidence the pod is gone, re-check next loop
            self.book.fenced(p.name)
            self._release(p.key, p.launch)

    def _should_create_pod_for_job(self, task: KubernetesJob) -> bool:
        entry = self._precreate.get(id(task))
        if entry is None:  # not an ExecuteTask job, or fencing is off: the provider's own check
            return super()._should_create_pod_for_job(task)
        launch, verdict = entry
        create = verdict.act if self._enforcing else verdict.stock
        if create:
            self._arm(task, launch)
        if not verdict.act:
            metrics.decision(
                "launch.dropped",
                path="pre_create",
                reason=verdict.reason.value,
                enforced=self._enforcing,
                ti=launch.ti_id,
                try_number=launch.try_number,
                launch=short(launch.token),
            )
        return create

    def _discard_stale_pod_creation_task(self, task: KubernetesJob) -> None:
        if self._enforcing:
            launch = self._launch_of_job(task)
            if launch is not None and not self.book.holds(task.key, launch):
                return  # a newer launch of the same key owns `running` and the event buffer
            if launch is not None:
                self.book.release(task.key, launch)
        super()._discard_stale_pod_creation_task(task)

    def _handle_pod_publish_error(self, task: KubernetesJob, e: Exception) -> bool:
        created = self._created_by_earlier_try(task) if self._enforcing and _is_already_exists(e) else False
        if created is None:  # could not read the pod: no evidence either way, try again next loop
            self._publish_failed.add(id(task))
            self.task_queue.put(task)
            return False
        if created:
            self.task_publish_retries.pop(task.key, None)
            launch = self._launch_of_job(task)
            metrics.decision(
                "launch.already_created",
                path="pre_create",
                reason="already_exists",
                enforced=True,
                ti=launch.ti_id if launch else "-",
                launch=short(launch.token if launch else None),
            )
            return False
        self._publish_failed.add(id(task))
        return super()._handle_pod_publish_error(task, e)

    def _created_by_earlier_try(self, task: KubernetesJob) -> bool | None:
        """A 409 AlreadyExists on our deterministic name: was it our own earlier, timed-out create
        (a3)? None when the pod could not be read."""
        launch = self._launch_of_job(task)
        name, namespace = self._pod_location(task)
        if launch is None or not launch.token or not name:
            return False
        try:
            ref = pods.read_ref(self.kube_client, name, namespace, self._api_args)
        except Exception:
            return None
        if ref is None:  # gone again since the 409: create it on the next loop
            return None
        if ref.launch is None or ref.launch.token != launch.token:
            return False
        if ref.launch.scheduler_job_id != str(self.scheduler_job_id):
            self._take_over_if_ours(name, namespace, launch)
        return True

    def _take_over_if_ours(self, name: str, namespace: str, launch: LaunchIdentity) -> None:
        """The pod of this very launch was created by another scheduler (a woken scheduler's
        create raced this one's, after this one adopted the launch). If the task's row names
        this scheduler, watch the pod here, as adoption would; otherwise its creator watches it."""
        try:
            row = ledger.read_rows([launch.task]).get(launch.task)
        except Exception as error:
            log.warning("fenced_k8s_executor could not read the row of pod %s/%s: %r", namespace, name, error)
            return
        if row is None or row.queued_by_job_id != self._scheduler_job_int():
            return
        body = {"metadata": {"labels": {"airflow-worker": self._make_safe_label_value(str(self.scheduler_job_id))}}}
        try:
            self.kube_client.patch_namespaced_pod(name=name, namespace=namespace, body=body,
                                                  **self._api_args)
        except Exception as error:  # the owner of the label still watches it; nothing is lost
            log.warning("fenced_k8s_executor could not relabel pod %s/%s: %r", namespace, name, error)
