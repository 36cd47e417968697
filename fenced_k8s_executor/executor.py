"""FencedKubernetesExecutor: the provider's KubernetesExecutor with launch-token fences wired in.

Wiring only: the class gives every pod its launch identity and composes the per-path fences
(``fences.creation``, ``fences.events``, ``fences.inflight``, ``fences.handover``), one override per
provider hook, each reading guard (``guards``), fence, then ``super()``; a fence asks a pure
verdict (``verdicts``) about data read by ``ledger`` (DB) and ``pods`` (Kubernetes) and acts on it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from airflow.executors.base_executor import BaseExecutor
from airflow.providers.cncf.kubernetes.executors.kubernetes_executor import KubernetesExecutor
from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_utils import (
    AirflowKubernetesScheduler,
    KubernetesJobWatcher,
)

from fenced_k8s_executor import (compat, config, deployment, guards, ledger, metrics, pods, provider_compat, sqlstate,
                                 stamp, verdicts)
from fenced_k8s_executor.fences.common import FAILED, QUEUED, Loop, workload_of
from fenced_k8s_executor.fences.creation import CreationFence
from fenced_k8s_executor.fences.events import EventFence
from fenced_k8s_executor.fences.handover import HandoverFence
from fenced_k8s_executor.fences.inflight import InFlightFence
from fenced_k8s_executor.guards import ApiGuard
from fenced_k8s_executor.launch import LaunchIdentity, as_token, pod_name
from fenced_k8s_executor.launches import LaunchBook
from fenced_k8s_executor.lineage import Provenance
from fenced_k8s_executor.loaded import start_fields
from fenced_k8s_executor.metrics import short
from fenced_k8s_executor.names import TOKEN_LABEL
from fenced_k8s_executor.in_flight import InFlightPods
from fenced_k8s_executor.stock_identity import StockMetricIdentity
from fenced_k8s_executor.sweep import Sweeper
from fenced_k8s_executor.watching import install_resilient_watchers
from fenced_k8s_executor.witness import Witness

if TYPE_CHECKING:
    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_types import KubernetesJob

log = logging.getLogger("fenced_k8s_executor")


#: Seconds ``start()`` waits for the first list of this deployment's pods in flight; past that the
#: scheduler starts anyway and the picture fills in when the API answers.
IN_FLIGHT_LIST_WAIT = 30.0


class FencedKubernetesExecutor(ApiGuard, StockMetricIdentity, CreationFence, EventFence, InFlightFence,
                               HandoverFence, KubernetesExecutor):
    """KubernetesExecutor whose pods carry their launch token and whose every path checks it."""

    pre_assigns_external_executor_id = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # No I/O here: the api-server builds executors only to read logs. Options are
        # validated in start(), where a bad value must stop the scheduler.
        self.fence: config.FencedConfig | None = None
        self.deployment: str | None = None
        self._stamps_of_ours: frozenset[str] = frozenset()  # deployment ids our pods carry (verdicts.foreign)
        self._stored_id: str | None = None  # the id stored in the DB beside a configured one (Witness ``also``)
        self.witness: Witness | None = None  # which database launched a pod (witness.py), from start()
        self._loop_began: float | None = None  # when this scheduler loop's sync() began (monotonic)
        self._pod_addresses: dict[str, tuple[str, ...]] = {}  # uid -> IPs of pods whose row names an IP host
        self.sweeper: Sweeper | None = None
        self.in_flight_pods: InFlightPods | None = None  # this deployment's unfinished pods, any scheduler's
        self.book = LaunchBook()  # every launch this scheduler has in flight, and its pods
        self._reads = ledger.InFlightReads()  # the loop's one statement (remembers vanished TI ids)
        self._flying = None  # the launches in flight as last built (fences.inflight.InFlight)
        self._loop_state: Loop | None = None  # what this loop's fences read and decided
        self._carry: deque[KubernetesJob] = deque()  # fenced batch jobs not reached last loop
        self._claim_lifetime = 600.0
        self._adopting: dict = {}  # key -> TI, during try_adopt_task_instances
        self._queued_batch: list | None = None  # (key, workload) queued by this trigger_tasks

    @staticmethod
    def get_cli_commands() -> list:
        """The provider's ``airflow kubernetes ...`` commands and ``airflow fenced-k8s pods``."""
        from fenced_k8s_executor.cli import commands

        return [*KubernetesExecutor.get_cli_commands(), *commands()]

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        if SUPPORT.warning:  # where operators read the scheduler's start-up
            log.warning(SUPPORT.warning)
        self.fence = config.load(self.conf)
        from airflow.configuration import conf

        self._claim_lifetime = conf.getfloat("scheduler", "task_queued_timeout")
        self.deployment = self._resolve_deployment()
        super().start()
        install_resilient_watchers(self.kube_scheduler)
        if self.fence.mode is not config.Mode.OFF:
            self._stamp_built_pods()
        if self.deployment is not None:
            self._start_watching()
        log.info("fenced_k8s_executor started mode=%s sweep_interval=%s deployment=%s %s", self.fence.mode.value,
                 self.fence.sweep_interval, self.deployment or "- (the metadata DB did not answer yet)",
                 start_fields(conf))

    def _resolve_deployment(self) -> str | None:
        """This deployment's id (``deployment.resolve``), or None while the metadata DB cannot be read
        (a transient error, by SQLSTATE): that never stops the scheduler. Until it is known, pods go
        out without the deployment stamp (so no fence ever deletes them, the safe direction) and
        nothing is deleted. A deterministic refusal, or a configuration that cannot name this
        deployment, stops the start (FencedConfigError)."""
        try:
            found = deployment.resolve(self.fence)
        except config.FencedConfigError:
            raise
        except Exception as error:
            if not sqlstate.transient(error):
                raise
            log.warning("fenced_k8s_executor cannot read this deployment's id from the metadata DB yet, deletes "
                        "wait for it: %s", sqlstate.describe(error))
            metrics.incr("deployment.unresolved")
            return None
        self._stamps_of_ours = frozenset(filter(None, (found.id, found.address_id)))
        self._stored_id = found.stored
        if found.address_id and found.address_id != found.id:
            log.info("fenced_k8s_executor deployment=%s (%s); pods stamped %s by builds before 0.2.0 (the DB address) "
                     "are not this id's and are never deleted by a fence", found.id, found.source, found.address_id)
        return found.id

    def _start_watching(self) -> None:
        """The witness, the deployment-wide watch of pods in flight and the backstop sweep: all
        three are this deployment id's."""
        if not self.fence.fencing:
            return
        self._start_witness()
        self.in_flight_pods = InFlightPods(self.kube_client, self._namespaces(), self.deployment,
                                           request_args=self.kube_config.kube_client_request_args)
        if not self.in_flight_pods.start(wait=IN_FLIGHT_LIST_WAIT):
            log.warning("fenced_k8s_executor started before this deployment's pods in flight could be listed: "
                        "they are re-checked once the API answers")
        if self.fence.sweep_interval > 0:
            self.sweeper = Sweeper(
                kube_client=self.kube_client,
                namespaces=self._namespaces(),
                interval=self.fence.sweep_interval,
                page_size=self.fence.sweep_page_size,
                enforcing=self.fence.enforcing,
                deployment=self.deployment,
                request_args=self.kube_config.kube_client_request_args,
                on_stale=lambda ref: self.book.remember(ref.name, ref.launch),
                witness=self.witness,
            )

    def _start_witness(self) -> None:
        """Post in the witness (``witness.py``) and wait for the first reading, at most
        ``IN_FLIGHT_LIST_WAIT``: until it answers, this scheduler judges only pods it launched
        itself. A missing permission on leases stops the start (``witness.Forbidden``)."""
        import socket

        from airflow.configuration import conf

        self.witness = Witness(
            self.kube_client, self.kube_config.kube_namespace, self.deployment, self._scheduler_job_int(),
            host=socket.getfqdn(), interval=conf.getfloat("scheduler", "scheduler_heartbeat_sec", fallback=5.0),
            alive_for=conf.getfloat("scheduler", "scheduler_health_check_threshold", fallback=30.0),
            request_args=self._api_args, also=tuple(filter(None, [self._stored_id])))
        self.witness.start(wait=IN_FLIGHT_LIST_WAIT)

    def _launched(self, launch: LaunchIdentity | None, pod: str, path: str) -> Provenance | None:
        """The witness's word on which database launched the pod (``lineage.provenance``); a pod of
        this deployment launched elsewhere is named once. None when the DB could not be read."""
        if self.witness is None:
            return Provenance.UNSETTLED
        try:
            launched = self.witness.provenance(launch, self._loop_began)
        except Exception as error:  # noqa: BLE001 - a DB error is never evidence
            log.warning("fenced_k8s_executor could not read the launcher of pod %s, left for a later check: %r",
                        pod, error)
            return None
        if launched is Provenance.ELSEWHERE and launch is not None and launch.deployment == self.deployment:
            self.witness.elsewhere(pod, launch, path)
        return launched

    def _owned(self, launch: LaunchIdentity | None, pod: str, path: str) -> bool | None:
        """Did this deployment launch the pod (``verdicts.owned`` with the witness's word)? None when
        the DB could not be read: no evidence, delete nothing now."""
        launched = self._launched(launch, pod, path)
        return None if launched is None else verdicts.owned(launch, self.deployment, launched)

    def _delete_verdict(self, launch: LaunchIdentity | None, row: Any, pod: str,
                        addresses: tuple[str, ...] = (), path: str = "reconcile") -> verdicts.Verdict | None:
        """``verdicts.should_delete`` with the witness's word on the pod's launcher; None when the DB
        could not be read (no evidence: nothing is deleted now)."""
        stale = verdicts.is_stale(launch, row)
        if not stale.act:
            return stale
        launched = self._launched(launch, pod, path)
        if launched is None:
            return None
        return verdicts.should_delete(launch, row, self.deployment, (pod, *addresses), launched)

    def _await_deployment(self) -> None:
        """A deployment id the start could not read: tried again once per loop."""
        if self.deployment is None and self.fence is not None and self.fence.mode is not config.Mode.OFF:
            self.deployment = self._resolve_deployment()
            if self.deployment is not None:
                log.info("fenced_k8s_executor deployment=%s: fences act from this loop on", self.deployment)
                self._start_watching()

    def end(self) -> None:
        if self.in_flight_pods is not None:
            self.in_flight_pods.stop()
        if self.witness is not None:
            self.witness.stop()
        self._reads.close()
        if self.task_queue is not None:
            for job in self._carry:  # hand unreached jobs back so the provider flushes them
                self.task_queue.put(job)
            self._carry.clear()
        super().end()

    def sync(self) -> None:
        """Guard, fence, stock: what an API error postponed goes first; the fenced loop (one DB read
        for every fence of the loop, the in-flight reconcile) wraps the provider's sync; an API
        error ends this loop early, never the scheduler."""
        self._loop_began = time.monotonic()  # the witness reads again at most once a loop (Witness.current)
        self._await_deployment()
        self._resume_postponed()
        with guards.reporting_api_errors("sync"):
            with self._fenced_loop():
                super().sync()

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
            dag_id=ti.dag_id,
            task_id=ti.task_id,
            run_id=ti.run_id,
            map_index=provider_compat.stored_index(ti),
            deployment=self.deployment,
            region=provider_compat.region_of(getattr(ti, "region_id", None)),
        )

    def _launch_of_job(self, job: KubernetesJob | None) -> LaunchIdentity | None:
        workload = workload_of(job.command) if job is not None else None
        return self._launch_of_workload(workload) if workload is not None else None

    def _pod_location(self, job: KubernetesJob) -> tuple[str | None, str]:
        """Where the pod of ``job`` is (or will be) created: its deterministic name (None for a
        legacy launch, which gets the provider's random name) and namespace."""
        launch = self._launch_of_job(job)
        name = self._planned_name(job, launch) if launch is not None else None
        meta = getattr(job.kube_executor_config, "metadata", None)
        namespace = getattr(meta, "namespace", None) or self.kube_config.kube_namespace
        return name, namespace

    def _planned_name(self, job: KubernetesJob, launch: LaunchIdentity) -> str | None:
        """``<dag>-<task>-<token[:16]>-<attempt>``: the attempt is the provider's count of
        pre-execution requeues of this launch, so a retried create of the same attempt gets the
        same name (a3) and a requeued one a fresh name."""
        if not launch.token:
            return None
        attempt = self.pod_launch_attempts.get(job.key)
        same = attempt is not None and (self._launch_of_job(attempt.job) or launch).token == launch.token
        return pod_name(launch.dag_id, launch.task_id, launch.token, attempt.attempts if same else 0)

    def _stamp_built_pods(self) -> None:
        """Wrap the provider's pod build (both creation paths call it, after the pre-creation
        check) so that every pod it builds for a launch leaves with the launch identity."""
        build = self.kube_scheduler._build_pod_request

        def build_stamped(job: KubernetesJob) -> Any:
            return self._stamped(build(job), job)

        self.kube_scheduler._build_pod_request = build_stamped

    def _stamped(self, pod: Any, job: KubernetesJob) -> Any:
        """The built pod with its launch identity (``stamp``), and with the worker entrypoint as
        its program when enforcing. Audit names pods like enforce, so that it resolves events
        from memory exactly as enforce does."""
        workload = workload_of(job.command)
        if workload is None:
            return pod
        launcher = self.witness.launcher if self.witness is not None else None
        launch = dataclasses.replace(self._launch_of_workload(workload), launcher=launcher)
        program = None
        if self._enforcing and launch.token and self.fence.worker_entrypoint:
            from fenced_k8s_executor import worker

            program = worker.command_args(workload)
        stamp.stamp(pod, launch, self._planned_name(job, launch), program)
        return pod

    def _process_workloads(self, workloads: Any) -> None:
        """Stock queueing; the launches' bookkeeping once for the batch, after the provider's
        loop: done per workload, between its Manager round trips, the same few lookups cost
        ~4.5 us each instead of <1 us."""
        if self.fence is None or self.fence.mode is config.Mode.OFF:
            return super()._process_workloads(workloads)
        outer, batch = self._queued_batch, []
        self._queued_batch = batch
        try:
            super()._process_workloads(workloads)
        finally:
            self._queued_batch = outer  # a nested call (none upstream today) keeps the outer batch
            self._record_queued(batch)

    def execute_async(self, key: Any, command: Any, queue: str | None = None, executor_config: Any = None) -> None:
        """Stock queueing plus the launch's bookkeeping. The job goes on the task queue as stock
        builds it: the identity is stamped on the pod once the provider has built it
        (``_stamped``); a pod override pickled through the provider's Manager queue per workload
        made queueing several times slower than stock."""
        # By keyword, as the provider's own _process_workloads calls it (a test double of the
        # provider's execute_async may compare the exact call).
        super().execute_async(key=key, command=command, queue=queue, executor_config=executor_config)
        workload = workload_of(command)
        if self.fence is None or self.fence.mode is config.Mode.OFF or workload is None:
            return
        if self._queued_batch is not None:
            self._queued_batch.append((key, workload))  # recorded when the batch is done
        else:
            self._record_queued([(key, workload)])

    def _record_queued(self, batch: list) -> None:
        holders = []
        for key, workload in batch:
            token = as_token(workload.ti.external_executor_id)
            if key in self.running:
                holders.append((key, token))  # legacy launches too: their slot is theirs alone
            if token and self.event_buffer.get(key) == (QUEUED, self.scheduler_job_id):
                # No token info at all: the scheduler writes QUEUED/RUNNING info into
                # external_executor_id by task, so a late event would overwrite a newer launch's
                # token (b5). The scheduler's own pre-assigned value is the token.
                self.event_buffer.pop(key, None)
        self.book.queued_all(holders)

    def _arm(self, job: KubernetesJob, launch: LaunchIdentity) -> None:
        """Right before a pod is created for a current launch (never for a dropped one): mint the
        launch claim into the workload JWT, so its lifetime starts at creation, whatever time the
        job spent in quota or publish-retry loops. The pod build that follows serialises it."""
        if not (self._enforcing and launch.token and self.fence.launch_claim):
            return
        workload = workload_of(job.command)
        if workload is None:
            return
        from fenced_k8s_executor import launch_claim

        workload.token = launch_claim.mint(self.jwt_generator, ti_id=launch.ti_id, token=launch.token,
                                           valid_for=self._claim_lifetime)

    def _prime_launches(self) -> None:
        """Learn the identity of every pod this scheduler watches with metadata-only list pages,
        instead of one pod read per unknown pod."""
        selector = f"airflow-worker={self._make_safe_label_value(str(self.scheduler_job_id))},{TOKEN_LABEL}"
        for namespace in self._namespaces():
            for page in pods.list_pages(self.kube_client, namespace, label_selector=selector,
                                        request_args=self._api_args):
                self.book.remember_all((ref.name, ref.launch) for ref in page if ref.launch is not None)

    def _launch_of_pod(self, name: str, namespace: str) -> LaunchIdentity | None:
        launch = self.book.launch_of(name)
        if launch is None:
            ref = pods.read_ref(self.kube_client, name, namespace, self._api_args)
            launch = ref.launch if ref is not None else None
            if launch is not None:
                self.book.remember(name, launch)
        return launch

    # ---------------------------------------------------------------- shared actions

    def _release(self, key: Any, launch: LaunchIdentity | None) -> None:
        """Free what the stock path frees for a finished launch, unless a newer launch of the
        same key holds the slot here."""
        if self.book.release(key, launch):
            self.pod_launch_attempts.pop(key, None)
            self.running.discard(key)

    def _delete_launch_pod(
        self,
        name: str,
        namespace: str,
        launch: LaunchIdentity,
        path: str,
        verdict: verdicts.Verdict,
        row: Any,
    ) -> bool | None:
        """Delete the pod of a stale launch if this deployment launched it; re-read it so the uid
        precondition names the very object whose annotations carry that launch's token.

        True: deleted (or already gone); False: left alone (not ours, another launch's object,
        already terminating); None: could not tell (API error), try again later.
        """
        try:
            found = pods.read_with_addresses(self.kube_client, name, namespace, self._api_args)
        except Exception as error:
            if pods.is_api_error(error):
                pods.report("read", error, then=f"pod {namespace}/{name} checked again later")
            else:
                log.warning("fenced_k8s_executor could not read pod %s/%s: %r", namespace, name, error)
            return None
        if found is None:
            return True
        ref, addresses = found
        if ref.deleting or ref.launch is None or ref.launch.token != launch.token:
            return False
        if verdicts.names_host(row, addresses):
            return False  # the row names this pod by its IP: it ran the task and is finishing
        owned = self._owned(ref.launch, f"{namespace}/{name}", path)
        if not owned:
            return owned
        deleted = pods.delete(self.kube_client, ref, self._api_args)
        if deleted is None:
            return None  # API error: the caller keeps the launch for another look
        if deleted:
            self.book.fenced(name)
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

    def _retire_finished_pod(self, name: str, namespace: str, launch: LaunchIdentity, state: Any) -> None:
        """A finished pod of a stale launch: clean it up exactly as the stock executor would
        (``delete_worker_pods`` / ``delete_worker_pods_on_failure``), if this deployment owns it."""
        if not self._owned(launch, f"{namespace}/{name}", "finished"):
            return
        if self.kube_config.delete_worker_pods:
            if state != FAILED or self.kube_config.delete_worker_pods_on_failure:
                verdict = verdicts.Verdict(True, False, verdicts.Reason.SUPERSEDED)
                self._delete_launch_pod(name, namespace, launch, "finished", verdict, None)
        else:
            self.kube_scheduler.patch_pod_executor_done(pod_name=name, namespace=namespace)


#: The provider's classes, not our overrides: refuses what the fences cannot work with, warns on an
#: untested newer release (logged again at every start).
SUPPORT = compat.check(KubernetesExecutor, BaseExecutor, AirflowKubernetesScheduler, KubernetesJobWatcher)
