"""Fences on hand-over paths, mixed into FencedKubernetesExecutor: adoption by a peer (race c)
and revoke (stuck in queued) across schedulers."""

from __future__ import annotations

import logging
from typing import Any

from fenced_k8s_executor import guards, metrics, orphans, pods, provider_compat, verdicts
from fenced_k8s_executor.launch import as_token
from fenced_k8s_executor.metrics import short
from fenced_k8s_executor.names import TI_ID_LABEL

log = logging.getLogger("fenced_k8s_executor")


class HandoverFence:
    """Adopt only the current launch's pod; revoke every pod of a task instance."""

    def try_adopt_task_instances(self, tis: Any) -> Any:
        """Guard, stock (with ``adopt_launched_task`` fenced), fence. Guard: when the dead
        scheduler's pods cannot be listed, nothing is reset (``_adopt_later``). Fence: a QUEUED
        TI no pod was adopted for is launched here instead of reset (``_adopt_by_launching``)."""
        orphans.preload(tis)  # one statement, not one per attribute per TI (stock's cost too)
        if self._fencing and not self._witness_ready():
            # The witness cannot yet tell this database's pods from an original's (a copy taken
            # between two heartbeats looks so until the next one): adopted in the DB, not reset;
            # the pods are relabelled once it can (``_resume_postponed``).
            return self._adopt_later(tis, "the witness has not judged every live scheduler yet")
        # The provider forgets a TI once one pod was adopted for it; the fence must still judge
        # the other pods of that key against the TI (several pods, one key). Keyed as the provider
        # looks pods up: by their coordinates, whatever key kind its executor uses.
        self._adopting = {ti.key: ti for ti in tis}
        try:
            to_reset = super().try_adopt_task_instances(tis)
        except guards.NotJudgedYet as why:  # the witness's view changed since the check above
            return self._adopt_later(tis, str(why))
        except Exception as error:
            if not pods.is_api_error(error):
                raise
            return self._adopt_later(tis, error)
        finally:
            self._adopting = {}
        if not self._enforcing:
            return to_reset
        return [ti for ti in to_reset if not self._adopt_by_launching(ti)]

    def _adopt_by_launching(self, ti: Any) -> bool:
        """A dead scheduler's QUEUED TI with a launch token and no pod: launch it here under the
        same token (hence the same deterministic pod name) instead of letting the scheduler reset
        it, which would archive the never-started try and burn a retry.

        The workload comes from airflow-core's own constructor. If the dead scheduler wakes up,
        its pre-creation check drops its job (the TI is now queued by this scheduler); if its
        create races ours, the shared pod name lets exactly one pod exist. Legacy TIs (no
        token) and RUNNING TIs without a pod are reset as stock resets them.
        """
        from airflow.executors import workloads
        from airflow.utils.state import TaskInstanceState

        if ti.state != TaskInstanceState.QUEUED or as_token(ti.external_executor_id) is None:
            return False
        key = provider_compat.executor_key(self, ti)
        if key in self.running or key in provider_compat.queued_workloads(self):
            return True  # queued by an earlier attempt of the scheduler's retried transaction
        try:
            workload = workloads.ExecuteTask.make(ti, generator=self.jwt_generator)
        except Exception as error:  # no workload, no launch: the stock reset is the safe answer
            log.warning("fenced_k8s_executor cannot build the workload of %s, leaving it to reset: %r", key, error)
            return False
        self.queue_workload(workload, session=None)
        metrics.decision("adoption.launched", path="adoption", reason="queued_without_pod", enforced=True,
                         ti=str(ti.id), launch=short(as_token(ti.external_executor_id)))
        return True

    def adopt_launched_task(self, kube_client: Any, pod: Any, tis_to_flush_by_key: dict) -> None:
        if not self._fencing:
            return super().adopt_launched_task(kube_client, pod, tis_to_flush_by_key)
        ref = pods.ref_from_metadata(pod.metadata)
        coordinates = guards.coordinates(pod)
        if coordinates is None:
            # The provider's own coordinates do not read (a try_number or map_index that is no
            # number): stock fails the whole adoption on it. This pod alone is left alone.
            metrics.incr("pod.malformed", {"reason": "task_key"})
            log.warning("fenced_k8s_executor pod %s/%s is not adopted: its task coordinates cannot be read",
                        ref.namespace, ref.name)
            return
        ti = tis_to_flush_by_key.get(coordinates) or self._adopting.get(coordinates)
        if ti is not None and ref.launch is not None:
            verdict = verdicts.should_adopt(ref.launch, ti.external_executor_id)
            if not verdict.act:
                self._refuse_adoption(kube_client, pod, ref, ti, verdict)
                if self._enforcing:
                    return  # not adopted: the live launch's pod (if any) is adopted, or the TI reset
        if ref.launch is not None:
            _name_attempt(pod, ref.launch.ti_id)
        super().adopt_launched_task(kube_client, pod, tis_to_flush_by_key)
        if ref.launch is not None:
            key = provider_compat.executor_key(self, ti) if ti is not None else coordinates
            if key in self.running:
                self.book.adopted(key, ref.name, ref.launch)
                if getattr(getattr(pod, "status", None), "phase", None) in (None, "Pending"):
                    # In flight here now: the per-loop reconcile re-checks it until its row or its
                    # events say it ran. The provider lists metadata only, so the phase is unknown
                    # (None) here: a pod already running leaves at the first reconcile.
                    self.book.created(key, ref.name, ref.namespace, ref.launch)
            else:
                self.book.remember(ref.name, ref.launch)

    def _refuse_adoption(self, kube_client: Any, pod: Any, ref: Any, ti: Any, verdict: Any) -> None:
        """A dead scheduler's pod of a superseded launch (c): never adopted; deleted when this
        deployment launched it and it has not finished (a finished one is left as stock leaves it)."""
        phase = getattr(getattr(pod, "status", None), "phase", None)
        deleted = False
        if self._enforcing and phase not in ("Succeeded", "Failed") and self._owned(
                ref.launch, f"{ref.namespace}/{ref.name}", "adoption"):
            deleted = pods.delete(kube_client, ref, self._api_args)
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
            metrics.incr("pod.deleted", {"path": "adoption", "reason": verdict.reason.value, "mode": "enforce"})
        self.book.remember(ref.name, ref.launch)

    def revoke_task(self, *, ti: Any) -> None:
        """Guard, stock, fence: the provider's revoke (an API error is reported, never raised into
        the stuck-in-queued handler), then every pod of ours with this TI id, whatever its try."""
        with guards.reporting_api_errors("revoke", then="the reconcile and the sweep follow up"):
            super().revoke_task(ti=ti)
        if not self._fencing:
            return
        for namespace in self._namespaces():
            try:
                for page in pods.list_pages(
                    self.kube_client,
                    namespace,
                    label_selector=f"{TI_ID_LABEL}={ti.id}",
                    request_args=self._api_args,
                ):
                    for ref in page:
                        if ref.deleting or ref.launch is None or ref.launch.malformed or ref.launch.ti_id != str(ti.id):
                            continue  # a malformed pod is never deleted: nothing it says is evidence
                        if not self._owned(ref.launch, f"{ref.namespace}/{ref.name}", "revoke"):
                            continue
                        deleted = False
                        if self._enforcing:
                            # Like the provider: a revoked pod's events are not the task's outcome.
                            self.kube_scheduler.patch_pod_revoked(pod_name=ref.name, namespace=ref.namespace)
                            deleted = pods.delete(self.kube_client, ref, self._api_args)
                            if deleted:
                                self.book.fenced(ref.name)
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
                if pods.is_api_error(error):
                    pods.report("revoke", error, then="the reconcile and the sweep follow up")
                else:
                    log.warning("fenced_k8s_executor revoke listing failed for %s: %r", ti.id, error)


def _name_attempt(pod: Any, ti_id: str) -> None:
    """Airflow 3.4's provider adopts a pod only when it can read the pod's attempt: from the
    ``task_instance_id`` annotation, else from the stock worker's arguments (a full pod read). A pod
    this package launched before that annotation was stamped (an Airflow 3.3 scheduler's, across an
    upgrade) names its attempt in our own annotation, which every version wrote: given to the
    provider here, on the listed object only. The provider then writes it on the pod as it adopts."""
    annotations, name = pod.metadata.annotations, provider_compat.TASK_INSTANCE_ID_ANNOTATION
    if annotations is None or annotations.get(name) is not None:
        return
    if isinstance(annotations, dict):
        annotations[name] = ti_id
    else:  # the provider lists pods through the dynamic client: a ResourceField
        setattr(annotations, name, ti_id)
