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
from fenced_k8s_executor.fences.common import QUEUED
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

        The same query re-checks the pods created in the previous loop (post-create, a2), so a
        busy scheduler pays one round trip per loop for both checks.
        """
        if not self._fencing or self.task_queue is None:
            yield
            return
        real = self.task_queue
        size = self.kube_config.worker_pods_creation_batch_size
        jobs = [self._carry.popleft() for _ in range(min(size, len(self._carry)))]
        jobs += batches.drain(real, size - len(jobs))
        unverified, self._unverified = self._unverified, []
        if not jobs and not unverified:
            yield
            return
        launches = {id(job): self._launch_of_job(job) for job in jobs}
        ti_ids = {launch.ti_id for launch in launches.values() if launch is not None}
        ti_ids |= {launch.ti_id for _, launch in unverified}
        try:
            with metrics.timed("fence_check.duration", path="pre_create"):
                rows = ledger.read_rows(ti_ids)
        except Exception as error:
            # No evidence either way: create nothing and drop nothing this loop.
            log.warning("fenced_k8s_executor pre-create check failed, retrying next loop: %r", error)
            metrics.incr("fence_check.error", {"path": "pre_create"})
            self._carry.extendleft(reversed(jobs))
            self._unverified = unverified + self._unverified
            jobs = []
            rows = None
        if rows is not None:
            self._recheck_created(unverified, rows)
            scheduler_job_id = self._scheduler_job_int()
            for job in jobs:
                launch = launches[id(job)]
                if launch is not None:
                    verdict = verdicts.should_create(launch, rows.get(launch.ti_id), scheduler_job_id)
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
                self._unverified.append((job, launch))
                name, _ = self._pod_location(job)
                if name:
                    self._remember(name, launch)
                metrics.incr("launch.created", {"reason": verdict.reason.value})
        self._precreate.clear()
        self._publish_failed = set()

    def _should_create_pod_for_job(self, task: KubernetesJob) -> bool:
        entry = self._precreate.get(id(task))
        if entry is None:  # not an ExecuteTask job, or fencing is off: the provider's own check
            return super()._should_create_pod_for_job(task)
        launch, verdict = entry
        create = verdict.act if self._enforcing else verdict.stock
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
            attempt = self.pod_launch_attempts.get(task.key)
            newest = self._launch_of_job(attempt.job) if attempt is not None else None
            if launch is not None and newest is not None and newest.token != launch.token:
                return  # a newer launch of the same key owns `running` and the event buffer
            if launch is not None and launch.token and self.event_buffer.get(task.key) == (QUEUED, launch.token):
                self.event_buffer.pop(task.key, None)
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
            ref = pods.read_ref(self.kube_client, name, namespace, self.kube_config.kube_client_request_args)
        except Exception:
            return None
        if ref is None:  # gone again since the 409: create it on the next loop
            return None
        return ref.launch is not None and ref.launch.token == launch.token

    def _recheck_created(self, created: list[tuple[KubernetesJob, LaunchIdentity]], rows: dict) -> None:
        """Post-create re-check: delete pods whose launch went stale between check and create (a2)."""
        for job, launch in created:
            row = rows.get(launch.ti_id)
            verdict = verdicts.should_delete(launch, row)
            if not verdict.act:
                continue
            name, namespace = self._pod_location(job)
            if self._enforcing and name:
                self._delete_launch_pod(name, namespace, launch, "post_create", verdict, row)
            else:
                # audit, or a pod renamed by a mutation hook: reported here, the sweep finds it
                metrics.decision("pod.stale", path="post_create", reason=verdict.reason.value,
                                 enforced=self._enforcing,
                                 ti=launch.ti_id, launch=short(launch.token), current=short(row.token if row else None))
