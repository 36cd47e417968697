"""Creation-side fences (races a1, a2, a3), mixed into FencedKubernetesExecutor.

The provider dequeues creation jobs one by one; ``_fenced_creation_batch`` hands it a batch
whose rows were read in ONE query, and the same query feeds the in-flight reconcile.
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from fenced_k8s_executor import batches, guards, ledger, metrics, pods, verdicts
from fenced_k8s_executor.launch import LaunchIdentity
from fenced_k8s_executor.lineage import Provenance
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

        The same read (``_rows_for``) covers the launches in flight, which the reconcile then
        re-checks (which also covers the check-then-create gap a2), so a busy scheduler pays one
        round trip per loop for both.
        """
        if not self._fencing or self.task_queue is None:
            yield
            return
        real = self.task_queue
        loop = self._loop
        size = self.kube_config.worker_pods_creation_batch_size
        jobs = [self._carry.popleft() for _ in range(min(size, len(self._carry)))]
        jobs += batches.drain(real, size - len(jobs))
        if not jobs and not self._anything_in_flight():
            yield
            return
        launches = {id(job): self._launch_of_job(job) for job in jobs}
        tasks = {launch.task for launch in launches.values() if launch is not None}
        try:
            with metrics.timed("fence_check.duration", path="pre_create"):
                rows = self._rows_for(tasks)
        except Exception as error:
            # No evidence either way: create nothing and drop nothing this loop.
            log.warning("fenced_k8s_executor pre-create check failed, retrying next loop: %r", error)
            metrics.incr("fence_check.error", {"path": "pre_create"})
            self._carry.extendleft(reversed(jobs))
            jobs = []
            rows = None
        if rows is not None:
            self._reconcile()
            scheduler_job_id = self._scheduler_job_int()
            for job in jobs:
                launch = launches[id(job)]
                if launch is not None:
                    verdict = verdicts.should_create(launch, rows.get(launch.task), scheduler_job_id)
                    loop.precreate[id(job)] = (launch, verdict)
        adapter = batches.BatchQueue(real, jobs)
        self.task_queue = adapter
        try:
            yield
        finally:
            self.task_queue = real
            self._carry.extendleft(reversed(adapter.leftovers()))
            self._finish_creation_batch(adapter.served)

    def _finish_creation_batch(self, served: list[KubernetesJob]) -> None:
        loop = self._loop
        for job in served:
            entry = loop.precreate.pop(id(job), None)
            if entry is None or id(job) in loop.publish_failed:
                continue
            launch, verdict = entry
            if verdict.act or (not self._enforcing and verdict.stock):
                name, namespace = self._pod_location(job)
                if name:
                    self.book.created(job.key, name, namespace, launch)
                metrics.incr("launch.created", {"reason": verdict.reason.value})
        loop.precreate.clear()
        loop.publish_failed.clear()

    def _take_creation_batch(self) -> list:
        """This loop's creation batch, taken from the task queue early (kept in ``_carry``) so
        that the loop's single query can cover it too."""
        size = self.kube_config.worker_pods_creation_batch_size
        if self.task_queue is not None and len(self._carry) < size:
            self._carry.extend(batches.drain(self.task_queue, size - len(self._carry)))
        return list(self._carry)[:size]

    def _should_create_pod_for_job(self, task: KubernetesJob) -> bool:
        entry = self._loop.precreate.get(id(task))
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
        """Fence, guard, stock. Fence: AlreadyExists on our deterministic name is this very launch's
        pod (a3, or its adopter's). Guard: a transient error is re-queued whatever
        ``task_publish_max_retries`` says (``guards.retry_transient``). Stock: anything else."""
        stock = super()._handle_pod_publish_error
        if self._enforcing and _is_already_exists(e):
            outcome = self._already_created(task)
            if outcome is not None:
                return outcome
        self._loop.publish_failed.add(id(task))
        if guards.transient(e) and self._fencing and self._has_token(task):
            return guards.retry_transient(self, stock, task, e)
        return stock(task, e)

    def _has_token(self, task: KubernetesJob) -> bool:
        launch = self._launch_of_job(task)
        return launch is not None and bool(launch.token)

    def _already_created(self, task: KubernetesJob) -> bool | None:
        """The pod of this launch exists already (409 AlreadyExists on its deterministic name).

        Our own earlier, timed-out create (a3): it is this launch's pod, done. Another scheduler's
        (a woken scheduler whose create lost to the adopter of the launch): watched here only if the
        row says this scheduler holds the launch (``_holds_launch``) and the witness says this
        database launched it; otherwise the job is discarded as the pre-creation check would have
        discarded it, which frees its slot (another database's pod is never relabelled). None:
        not this launch's pod (the provider's rules apply). Could not read the pod: re-queued."""
        launch = self._launch_of_job(task)
        name, namespace = self._pod_location(task)
        if launch is None or not launch.token or not name:
            return None
        try:
            ref = pods.read_ref(self.kube_client, name, namespace, self._api_args)
        except Exception:  # no evidence either way
            ref = None
        if ref is None or ref.deleting:  # unreadable, gone again since the 409, or going: try again next loop
            # (a terminating pod's events never reach the launch: taken for created, the task would
            # wait for task_queued_timeout; its name is free once its deletion completes)
            self._loop.publish_failed.add(id(task))
            self.task_queue.put(task)
            return False
        if ref.launch is None or ref.launch.token != launch.token:
            return None
        mine = self.witness.launcher if self.witness is not None else None
        own = ref.launch.scheduler_job_id == str(self.scheduler_job_id) and ref.launch.launcher == mine
        launched = Provenance.HERE if own else self._launched(ref.launch, f"{namespace}/{name}", "pre_create")
        take_over = False if own or launched is Provenance.ELSEWHERE else self._holds_launch(name, namespace, launch)
        if take_over and launched is not Provenance.HERE:
            # The row gives this scheduler the launch, but the witness cannot tell yet whether this
            # database launched the pod (or the DB did not answer): neither relabelled nor dropped;
            # the job comes back next loop.
            self._loop.publish_failed.add(id(task))
            self.task_queue.put(task)
            return False
        if take_over:
            self._relabel(name, namespace)
        elif not own:
            # A peer's pod of this launch (its creator watches it), or another database's (the
            # original's, when this database is a copy that adopted the launch): never relabelled.
            self._loop.publish_failed.add(id(task))
            self.task_publish_retries.pop(task.key, None)
            self._discard_stale_pod_creation_task(task)
            metrics.decision("launch.dropped", path="pre_create", enforced=True,
                             reason="created_elsewhere" if launched is Provenance.ELSEWHERE else "created_by_peer",
                             ti=launch.ti_id, try_number=launch.try_number, launch=short(launch.token))
            return False
        self.task_publish_retries.pop(task.key, None)
        metrics.decision("launch.already_created", path="pre_create", reason="already_exists", enforced=True,
                         ti=launch.ti_id, launch=short(launch.token))
        return False

    def _holds_launch(self, name: str, namespace: str, launch: LaunchIdentity) -> bool:
        """The pod of this very launch was created by another scheduler (a woken scheduler's create
        raced this one's, after this one adopted the launch): whether the task's row names this
        scheduler, which then watches the pod here, as adoption would."""
        try:
            row = ledger.read_rows([launch.task]).get(launch.task)
        except Exception as error:
            log.warning("fenced_k8s_executor could not read the row of pod %s/%s: %r", namespace, name, error)
            return False
        return row is not None and row.queued_by_job_id == self._scheduler_job_int()

    def _relabel(self, name: str, namespace: str) -> None:
        body = {"metadata": {"labels": {"airflow-worker": self._make_safe_label_value(str(self.scheduler_job_id))}}}
        try:
            self.kube_client.patch_namespaced_pod(name=name, namespace=namespace, body=body,
                                                  **self._api_args)
        except Exception as error:  # the owner of the label still watches it; nothing is lost
            log.warning("fenced_k8s_executor could not relabel pod %s/%s: %r", namespace, name, error)
