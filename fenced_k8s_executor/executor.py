"""FencedKubernetesExecutor: the provider's KubernetesExecutor with launch-token fences wired in.

Wiring only: every override asks a pure verdict (``verdicts``) about data read by ``ledger``
(DB) and ``pods`` (Kubernetes), acts on it, and otherwise hands over to ``super()``.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from collections import OrderedDict, deque
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from kubernetes.client import Configuration
from kubernetes.client import models as k8s

from airflow.executors.base_executor import BaseExecutor
from airflow.providers.cncf.kubernetes.executors.kubernetes_executor import KubernetesExecutor
from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import annotations_to_key
from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
from airflow.utils.state import TaskInstanceState

from fenced_k8s_executor import batches, compat, config, ledger, metrics, pods, verdicts
from fenced_k8s_executor.launch import LaunchIdentity, as_token, pod_name
from fenced_k8s_executor.metrics import short
from fenced_k8s_executor.names import TI_ID_LABEL, TOKEN_LABEL
from fenced_k8s_executor.sweep import Sweeper

if TYPE_CHECKING:
    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_types import (
        KubernetesJob,
        KubernetesResults,
    )

log = logging.getLogger("fenced_k8s_executor")

#: How many pod identities to remember (hours of churn; an entry is a few hundred bytes). Pods
#: keep resolving after they finished or were fenced out: their late DELETED/"adopted" events
#: must be judged too, without a pod read that would find nothing.
LAUNCH_MEMORY = 20_000

#: Unknown pods in one sync beyond which one metadata list beats reading pods one by one.
PRIME_AFTER_MISSES = 8

QUEUED = TaskInstanceState.QUEUED
RUNNING = TaskInstanceState.RUNNING
FAILED = TaskInstanceState.FAILED


class _SharedModelConfiguration(Configuration):
    """One read-only client configuration for the fence's pod override models.

    Every kubernetes model carries its own Configuration, and the provider deep-copies the pod
    override several times per pod; copying a Configuration is the expensive part (it resets
    logger levels). Sharing one instance keeps the override nearly free to merge.
    """

    def __deepcopy__(self, memo: dict) -> _SharedModelConfiguration:
        return self


_MODEL_CONFIG = _SharedModelConfiguration()


def _workload_of(command: Any) -> Any:
    from airflow.executors.workloads import ExecuteTask

    if command and isinstance(command[0], ExecuteTask):
        return command[0]
    return None


def _is_already_exists(error: Exception) -> bool:
    if getattr(error, "status", None) != 409:
        return False
    try:
        return json.loads(getattr(error, "body", None) or "{}").get("reason") == "AlreadyExists"
    except (TypeError, ValueError):
        return "already exists" in str(getattr(error, "body", ""))


class FencedKubernetesExecutor(KubernetesExecutor):
    """KubernetesExecutor whose pods carry their launch token and whose every path checks it."""

    pre_assigns_external_executor_id = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # No I/O here: the api-server builds executors only to read logs. Options are
        # validated in start(), where a bad value must stop the scheduler.
        self.fence: config.FencedConfig | None = None
        self.sweeper: Sweeper | None = None
        # pod name -> launch, for pods created, adopted, read or fenced out here (bounded LRU)
        self._launches: OrderedDict[str, LaunchIdentity] = OrderedDict()
        self._launches_lock = threading.Lock()  # the sweep thread records here too
        self._carry: deque[KubernetesJob] = deque()  # fenced batch jobs not reached this loop
        self._precreate: dict[int, tuple[LaunchIdentity, verdicts.Verdict]] = {}
        self._publish_failed: set[int] = set()
        self._unverified: list[tuple[KubernetesJob, LaunchIdentity]] = []  # created, awaiting re-check
        self._state_verdicts: dict[int, tuple[LaunchIdentity | None, verdicts.Verdict, Any]] = {}
        self._adopting: dict = {}  # key -> TI, during try_adopt_task_instances

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.fence = config.load(self.conf)
        super().start()
        if self.fence.fencing and self.fence.sweep_interval > 0:
            self.sweeper = Sweeper(
                kube_client=self.kube_client,
                namespaces=self._namespaces(),
                interval=self.fence.sweep_interval,
                page_size=self.fence.sweep_page_size,
                enforcing=self.fence.enforcing,
                request_args=self.kube_config.kube_client_request_args,
                on_stale=lambda ref: self._remember(ref.name, ref.launch),
            )
        log.info("fenced_k8s_executor started mode=%s sweep_interval=%s", self.fence.mode.value,
                 self.fence.sweep_interval)

    def end(self) -> None:
        if self.task_queue is not None:
            for job in self._carry:  # hand unreached jobs back so the provider flushes them
                self.task_queue.put(job)
            self._carry.clear()
        super().end()

    @property
    def _fencing(self) -> bool:
        return self.fence is not None and self.fence.fencing

    @property
    def _enforcing(self) -> bool:
        return self.fence is not None and self.fence.enforcing

    def _namespaces(self) -> list[str | None]:
        if self.kube_config.multi_namespace_mode:
            return list(self.kube_config.multi_namespace_mode_namespace_list or [None])
        return [self.kube_config.kube_namespace]

    def _scheduler_job_int(self) -> int | None:
        try:
            return int(self.scheduler_job_id) if self.scheduler_job_id is not None else None
        except ValueError:
            return None

    # ---------------------------------------------------------------- launch identity

    def _launch_of_workload(self, workload: Any) -> LaunchIdentity:
        ti = workload.ti
        return LaunchIdentity(
            ti_id=str(ti.id),
            token=as_token(ti.external_executor_id),
            try_number=int(ti.try_number),
            scheduler_job_id=self.scheduler_job_id,
        )

    def _launch_of_job(self, job: KubernetesJob | None) -> LaunchIdentity | None:
        workload = _workload_of(job.command) if job is not None else None
        return self._launch_of_workload(workload) if workload is not None else None

    def _pod_location(self, job: KubernetesJob) -> tuple[str | None, str]:
        meta = getattr(job.kube_executor_config, "metadata", None)
        name = getattr(meta, "name", None)
        namespace = getattr(meta, "namespace", None) or self.kube_config.kube_namespace
        return name, namespace

    def _fence_pod(self, workload: Any, launch: LaunchIdentity, attempt: int) -> k8s.V1Pod:
        """The pod override carrying the launch identity (and, when enforcing, name and entrypoint)."""
        shared = {"local_vars_configuration": _MODEL_CONFIG}
        meta = k8s.V1ObjectMeta(annotations=launch.annotations(), labels=launch.labels(), **shared)
        pod = k8s.V1Pod(metadata=meta, **shared)
        if self._enforcing and launch.token:
            meta.name = pod_name(workload.ti.dag_id, workload.ti.task_id, launch.token, attempt)
            if self.fence.worker_entrypoint:
                from fenced_k8s_executor import worker

                container = k8s.V1Container(name="base", args=worker.command_args(workload), **shared)
                pod.spec = k8s.V1PodSpec(containers=[container], **shared)
        return pod

    def execute_async(self, key: Any, command: Any, queue: str | None = None, executor_config: Any = None) -> None:
        workload = _workload_of(command)
        if self.fence is None or self.fence.mode is config.Mode.OFF or workload is None:
            return super().execute_async(key, command, queue, executor_config)
        launch = self._launch_of_workload(workload)
        if self._enforcing and launch.token and self.fence.launch_claim:
            from airflow.configuration import conf

            from fenced_k8s_executor import launch_claim

            workload.token = launch_claim.mint(
                self.jwt_generator,
                ti_id=launch.ti_id,
                token=launch.token,
                valid_for=conf.getfloat("scheduler", "task_queued_timeout"),
            )
        try:
            user_pod = PodGenerator.from_obj(executor_config)
        except Exception:  # the provider fails the task for an unreadable executor_config
            return super().execute_async(key, command, queue, executor_config)
        fence_pod = self._fence_pod(workload, launch, attempt=0)
        merged = PodGenerator.reconcile_pods(user_pod, fence_pod) if user_pod is not None else fence_pod
        super().execute_async(key, command, queue, {**(executor_config or {}), "pod_override": merged})
        # Report the token, never the job id: the scheduler writes QUEUED/RUNNING info into
        # external_executor_id, which would erase the token the fences compare with (b5).
        if launch.token and self.event_buffer.get(key) == (QUEUED, self.scheduler_job_id):
            self.event_buffer[key] = (QUEUED, launch.token)

    # ---------------------------------------------------------------- pre-creation fence (a1, a2, a3)

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
        if self._enforcing and _is_already_exists(e) and self._created_by_earlier_try(task):
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

    def _created_by_earlier_try(self, task: KubernetesJob) -> bool:
        """A 409 AlreadyExists on our deterministic name: was it our own earlier, timed-out create (a3)?"""
        launch = self._launch_of_job(task)
        name, namespace = self._pod_location(task)
        if launch is None or not launch.token or not name:
            return False
        try:
            ref = pods.read_ref(self.kube_client, name, namespace, self.kube_config.kube_client_request_args)
        except Exception:
            return False
        return ref is not None and ref.launch is not None and ref.launch.token == launch.token

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

    # ---------------------------------------------------------------- state-change fence (b1-b5)

    def sync(self) -> None:
        if not self._fencing or self.result_queue is None:
            return super().sync()
        if self.sweeper is not None:
            self.sweeper.maybe_start()
        real = self.result_queue
        self.result_queue = batches.LazyBatchQueue(real, self._prefetch_state_verdicts)
        try:
            super().sync()
        finally:
            self.result_queue = real
            self._state_verdicts.clear()

    def _prefetch_state_verdicts(self, batch: list[KubernetesResults]) -> None:
        """One DB read for every watcher result of this sync (pods resolved from memory first)."""
        try:
            with self._launches_lock:
                misses = sum(1 for result in batch if result.pod_name not in self._launches)
            if misses > PRIME_AFTER_MISSES:  # a watcher relist after a restart or a 410
                self._prime_launches()
            launches = {id(result): self._launch_of_pod(result.pod_name, result.namespace) for result in batch}
            ti_ids = {launch.ti_id for launch in launches.values() if launch is not None and not launch.legacy}
            with metrics.timed("fence_check.duration", path="state_change"):
                rows = ledger.read_rows(ti_ids)
        except Exception as error:  # each result is then checked (and retried) on its own
            log.warning("fenced_k8s_executor state-change prefetch failed: %r", error)
            return
        for result in batch:
            launch = launches[id(result)]
            row = rows.get(launch.ti_id) if launch is not None else None
            self._state_verdicts[id(result)] = (launch, verdicts.should_swallow(launch, row), row)

    def _remember(self, name: str, launch: LaunchIdentity) -> None:
        with self._launches_lock:
            self._launches[name] = launch
            self._launches.move_to_end(name)
            while len(self._launches) > LAUNCH_MEMORY:
                self._launches.popitem(last=False)

    def _prime_launches(self) -> None:
        """Learn the identity of every pod this scheduler watches with metadata-only list pages,
        instead of one pod read per unknown pod."""
        selector = f"airflow-worker={self._make_safe_label_value(str(self.scheduler_job_id))},{TOKEN_LABEL}"
        for namespace in self._namespaces():
            for page in pods.list_pages(self.kube_client, namespace, label_selector=selector,
                                        request_args=self.kube_config.kube_client_request_args):
                for ref in page:
                    if ref.launch is not None:
                        self._remember(ref.name, ref.launch)

    def _launch_of_pod(self, name: str, namespace: str) -> LaunchIdentity | None:
        with self._launches_lock:
            launch = self._launches.get(name)
        if launch is None:
            ref = pods.read_ref(self.kube_client, name, namespace, self.kube_config.kube_client_request_args)
            launch = ref.launch if ref is not None else None
            if launch is not None:
                self._remember(name, launch)
        return launch

    def _change_state(self, results: KubernetesResults, **kwargs: Any) -> None:
        if not self._fencing:
            return super()._change_state(results, **kwargs)
        entry = self._state_verdicts.pop(id(results), None)
        if entry is None:  # raises on a DB or API error: the provider re-queues the result
            launch = self._launch_of_pod(results.pod_name, results.namespace)
            row = None
            if launch is not None and not launch.legacy:
                row = ledger.read_rows([launch.ti_id]).get(launch.ti_id)
            entry = (launch, verdicts.should_swallow(launch, row), row)
        launch, verdict, row = entry
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
                self._delete_launch_pod(results.pod_name, results.namespace, launch, "state_change", verdict, row)
                return
        if self._enforcing and results.state == FAILED:
            self._rename_requeue_job(results.key)
        super()._change_state(results, **kwargs)
        if (
            launch is not None
            and verdict.reason is verdicts.Reason.CURRENT
            and self.event_buffer.get(results.key) == (RUNNING, None)
        ):
            self.event_buffer[results.key] = (RUNNING, launch.token)

    def _rename_requeue_job(self, key: Any) -> None:
        """Give the pre-execution requeue of a launch the next attempt's pod name (the failed pod
        keeps its name until deleted)."""
        attempt = self.pod_launch_attempts.get(key)
        launch = self._launch_of_job(attempt.job) if attempt is not None else None
        name, _ = self._pod_location(attempt.job) if attempt is not None else (None, None)
        if launch is None or not launch.token or not name:
            return
        workload = _workload_of(attempt.job.command)
        override = copy.deepcopy(attempt.job.kube_executor_config)
        override.metadata.name = pod_name(workload.ti.dag_id, workload.ti.task_id, launch.token, attempt.attempts + 1)
        attempt.job = attempt.job._replace(kube_executor_config=override)
        self._remember(override.metadata.name, launch)

    # ---------------------------------------------------------------- adoption fence (c)

    def try_adopt_task_instances(self, tis: Any) -> Any:
        # The provider forgets a TI once one pod was adopted for it; the fence must still judge
        # the other pods of that key against the TI (several pods, one key).
        self._adopting = {ti.key: ti for ti in tis}
        try:
            return super().try_adopt_task_instances(tis)
        finally:
            self._adopting = {}

    def adopt_launched_task(self, kube_client: Any, pod: Any, tis_to_flush_by_key: dict) -> None:
        if not self._fencing:
            return super().adopt_launched_task(kube_client, pod, tis_to_flush_by_key)
        ref = pods.ref_from_metadata(pod.metadata)
        key = annotations_to_key(pod.metadata.annotations)
        ti = tis_to_flush_by_key.get(key) or self._adopting.get(key)
        if ti is not None and ref.launch is not None:
            verdict = verdicts.should_adopt(ref.launch, str(ti.id), ti.external_executor_id)
            if not verdict.act:
                deleted = self._enforcing and pods.delete(kube_client, ref, self.kube_config.kube_client_request_args)
                metrics.decision(
                    "adoption.refused",
                    path="adoption",
                    reason=verdict.reason.value,
                    enforced=self._enforcing,
                    pod=f"{ref.namespace}/{ref.name}",
                    ti=str(ti.id),
                    launch=short(ref.launch.token),
                    current=short(as_token(ti.external_executor_id)),
                    deleted=deleted,
                )
                if deleted:
                    metrics.incr("pod.deleted", {"path": "adoption", "reason": verdict.reason.value})
                    self._remember(ref.name, ref.launch)
                if self._enforcing:
                    return  # not adopted: the scheduler resets the TI as usual
        super().adopt_launched_task(kube_client, pod, tis_to_flush_by_key)
        if ref.launch is not None:
            self._remember(ref.name, ref.launch)

    # ---------------------------------------------------------------- revoke

    def revoke_task(self, *, ti: Any) -> None:
        super().revoke_task(ti=ti)
        if not self._fencing:
            return
        for namespace in self._namespaces():
            try:
                for page in pods.list_pages(
                    self.kube_client,
                    namespace,
                    label_selector=f"{TI_ID_LABEL}={ti.id}",
                    request_args=self.kube_config.kube_client_request_args,
                ):
                    for ref in page:
                        if ref.deleting or ref.launch is None or ref.launch.ti_id != str(ti.id):
                            continue
                        deleted = False
                        if self._enforcing:
                            # Like the provider: a revoked pod's events are not the task's outcome.
                            self.kube_scheduler.patch_pod_revoked(pod_name=ref.name, namespace=ref.namespace)
                            deleted = pods.delete(self.kube_client, ref, self.kube_config.kube_client_request_args)
                        metrics.decision(
                            "pod.deleted" if deleted else "pod.revoked",
                            path="revoke",
                            reason="revoked",
                            enforced=self._enforcing,
                            pod=f"{ref.namespace}/{ref.name}",
                            ti=str(ti.id),
                            launch=short(ref.launch.token),
                        )
            except Exception as error:  # the stuck-queued handler must go on; the sweep follows up
                log.warning("fenced_k8s_executor revoke listing failed for %s: %r", ti.id, error)

    # ---------------------------------------------------------------- shared action

    def _delete_launch_pod(
        self,
        name: str,
        namespace: str,
        launch: LaunchIdentity,
        path: str,
        verdict: verdicts.Verdict,
        row: Any,
    ) -> bool:
        """Delete the pod of a stale launch: re-read it so the uid precondition names the very
        object whose annotations carry that launch's token."""
        try:
            ref = pods.read_ref(self.kube_client, name, namespace, self.kube_config.kube_client_request_args)
        except Exception as error:
            log.warning("fenced_k8s_executor could not read pod %s/%s: %r", namespace, name, error)
            return False
        if ref is None or ref.deleting or ref.launch is None or ref.launch.token != launch.token:
            return False
        deleted = pods.delete(self.kube_client, ref, self.kube_config.kube_client_request_args)
        if deleted:
            metrics.decision(
                "pod.deleted",
                path=path,
                reason=verdict.reason.value,
                enforced=True,
                pod=f"{namespace}/{name}",
                ti=launch.ti_id,
                launch=short(launch.token),
                current=short(row.token if row is not None else None),
            )
        return deleted


compat.check(FencedKubernetesExecutor, BaseExecutor)
