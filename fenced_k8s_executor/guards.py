"""API fault guards: a transient Kubernetes API error never leaves the scheduler's heartbeat.

The provider lets several periodic API calls raise into the scheduler loop: the completed-pod
adoption LIST in ``sync()`` (a 500 there crashes the scheduler), the LIST in ``revoke_task``
(stuck-in-queued handling) and in ``try_adopt_task_instances`` (orphan adoption), and a failed
pod DELETE or a dropped PATCH inside ``_change_state``, which the provider re-queues on the very
queue it is draining, so a persistent fault spins the heartbeat forever.

:class:`ApiGuard` and the helpers here wrap those calls narrowly: each hook has one override,
reading guard, fence, stock (``super()``), in the fence module of its path. An API error
(any ``ApiException``: 5xx, 429, 403, ...; a connection error or timeout) is logged once,
counted as ``api_error`` tagged with the call and the status, and the work is retried on the
next loop. An API error is never evidence: nothing is deleted, reset or dropped because of it.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import annotations_to_key

from fenced_k8s_executor import metrics, verdicts
from fenced_k8s_executor.launch import from_pod_metadata
from fenced_k8s_executor.pods import is_api_error, list_pages, report, request_args

log = logging.getLogger("fenced_k8s_executor")


def coordinates(pod: Any) -> Any:
    """The provider's task key of a pod (its coordinate annotations), or None when they do not read
    (a try_number or map_index that is no number: the provider's own parse raises)."""
    try:
        return annotations_to_key(pod.metadata.annotations)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


class NotJudgedYet(Exception):
    """An adoption listed a pod the witness cannot judge yet: the adoption waits (``_adopt_later``)
    rather than hand the provider a listing without it, which would reset a task whose pod runs."""


@dataclass(frozen=True)
class _Orphan:
    """What adoption needs of a dead scheduler's TI once its session is gone (what the provider's
    adoption and ``get_task_key`` read of a TI)."""

    id: Any  # the TI's own id object: 3.4's provider compares it with the pod's UUID
    key: Any
    external_executor_id: str | None
    queued_by_job_id: int


@contextmanager
def reporting_api_errors(call: str, then: str = "retrying next loop") -> Iterator[None]:
    """Report an API error (``report``) instead of raising it; any other error is raised."""
    try:
        yield
    except Exception as error:
        if not is_api_error(error):
            raise
        report(call, error, then=then)


def transient(error: BaseException) -> bool:
    """A create that may succeed if retried: 429, 5xx, a connection error or a timeout."""
    status = getattr(error, "status", None)
    if isinstance(status, int) and status:
        return status == 429 or status in (500, 502, 503, 504)
    return is_api_error(error)


def retry_transient(executor: Any, stock: Callable[[Any, Exception], bool], task: Any, error: Exception) -> bool:
    """The provider's handling of a transient create error, re-queueing even when
    ``task_publish_max_retries`` (default 0) would fail the task: a fenced launch's pod name is
    deterministic, so a retried create that had reached the server ends in AlreadyExists,
    recognised as created. Stuck-in-queued still bounds a launch that never gets its pod.
    Launches without a token (fencing off, legacy rows) keep the provider's rule (the caller's)."""
    report("create", error, then="re-queued for the next loop")
    configured, executor.task_publish_max_retries = executor.task_publish_max_retries, -1
    try:
        return stock(task, error)
    finally:
        executor.task_publish_max_retries = configured


def _hidden_because(launch: Any, origin: Any, executor: Any) -> str:
    if verdicts.foreign(launch, executor._stamps_of_ours):
        return "other_deployment"
    return "other_database" if origin is verdicts.Provenance.ELSEWHERE else "not_judged_yet"


class ApiGuard:
    """Executor mixin (first in the bases): what API errors postpone, kept for the next loop, the
    provider calls no fence overrides, guarded, and the provider's pod listings without other
    deployments' pods. The hooks a fence overrides call the
    guard themselves (guard, fence, stock, in that order, in one override each)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deferred_results: list = []  # state changes an API error postponed to the next loop
        self._pending_adoption: dict[Any, _Orphan] = {}  # adopted in the DB, pods not relabelled yet

    @property
    def _api_args(self) -> dict:
        """Request args of the fences' own API calls: the provider's, with a timeout unless
        they set one (``pods.REQUEST_TIMEOUT``)."""
        return request_args(self.kube_config.kube_client_request_args)

    # ---------------------------------------------------------------- postponed work

    def _resume_postponed(self) -> None:
        """At the top of each loop: the state changes an API error postponed (ahead of this loop's
        watcher results, as they came), and the relabelling of pods adopted while they could not
        be listed."""
        if self._deferred_results and self.result_queue is not None:
            deferred, self._deferred_results = self._deferred_results, []
            for results in deferred:
                self.result_queue.put(results)
        if self._pending_adoption and self.kube_client is not None and self._witness_ready():
            with reporting_api_errors("adoption"):
                self._finish_adoption()

    def _witness_ready(self) -> bool:
        """Whether the witness can judge every live scheduler's pods (``lineage.View.ready``): until
        then, what adoption would relabel waits (the pods of an original this database may be a
        copy of look like its own until that scheduler's next heartbeat)."""
        witness = getattr(self, "witness", None)
        return witness is None or witness.current().ready

    def _postpone(self, results: Any, error: BaseException) -> None:
        report("change_state", error, then=f"pod {results.namespace}/{results.pod_name} retried next loop")
        self._deferred_results.append(results)

    # ---------------------------------------------------------------- guarded provider calls

    def _adopt_completed_pods(self, kube_client: Any) -> None:
        try:
            super()._adopt_completed_pods(kube_client)
        except Exception as error:
            if not is_api_error(error):
                raise
            report("adopt_completed_pods", error)
            self._last_completed_pod_adoption = float("-inf")  # due again on the next loop

    def _list_pods(self, query_kwargs: dict) -> list:
        """Stock's listing, less the pods another deployment or database launched
        (``verdicts.hidden_from_provider``): the provider's revoke picks one pod by DAG, task, run and
        this scheduler's job id, and its adoption relabels pods by a dead scheduler's job id; in a
        shared namespace both can match another deployment's pods, or the original's pods in a copy
        of its database. Hidden on the witness's positive evidence; a pod in doubt (the witness
        cannot judge yet, its launcher wrote without posting, or the launchers could not be read) is
        hidden from a revoke, and stops an adoption (``NotJudgedYet``): a pod left out of its
        listing is a task reset."""
        found = super()._list_pods(query_kwargs)
        witness = getattr(self, "witness", None)
        if witness is None:
            return found
        launches = [from_pod_metadata(pod.metadata.annotations) for pod in found]
        try:
            launched, view = witness.provenances(launches), witness.current()
        except Exception as error:  # noqa: BLE001 - without the jobs, nothing in doubt is handed over
            log.warning("fenced_k8s_executor could not read the launchers of %d listed pods: %r", len(found), error)
            launched, view = [verdicts.Provenance.UNSETTLED] * len(found), None
        kept = []
        for pod, launch, origin in zip(found, launches, launched):
            ready = view is not None and view.ready and not view.in_doubt(launch.launcher if launch else None)
            if not verdicts.hidden_from_provider(launch, self._stamps_of_ours, origin, ready):
                kept.append(pod)
                continue
            name = f"{pod.metadata.namespace}/{pod.metadata.name}"
            if self._adopting and self._enforcing and not verdicts.hidden_from_provider(
                    launch, self._stamps_of_ours, origin, True):
                raise NotJudgedYet(f"the witness cannot judge pod {name} yet")
            if origin is verdicts.Provenance.ELSEWHERE and launch.deployment == self.deployment:
                witness.elsewhere(name, launch, "provider_list")
            metrics.decision("pod.foreign", path="provider_list", reason=_hidden_because(launch, origin, self),
                             enforced=self._enforcing, pod=name, deployment=launch.deployment)
            if not self._enforcing:
                kept.append(pod)
        return kept

    def get_pod_combined_search_str_to_pod_map(self) -> dict:
        try:
            return super().get_pod_combined_search_str_to_pod_map()
        except Exception as error:
            if not is_api_error(error):
                raise
            report("revoke_list", error, then="no pod revoked by coordinates (the sweep follows up)")
            return {}

    # ---------------------------------------------------------------- adoption

    def _adopt_later(self, tis: Any, why: BaseException | str) -> Any:
        """The dead scheduler's pods could not be listed (an API error), or cannot be judged yet
        (``why``: the witness): no evidence that they are gone, so no TI is reset. They are adopted
        in the DB (as when their pods were found) and their pods relabelled on the next loops; TIs
        without a scheduler are reset as the provider does."""
        from fenced_k8s_executor import provider_compat

        to_reset = [ti for ti in tis if not ti.queued_by_job_id]
        for ti in tis:
            if ti.queued_by_job_id and provider_compat.executor_key(self, ti) not in self.running:
                self._pending_adoption[ti.key] = _Orphan(ti.id, ti.key, ti.external_executor_id,
                                                         int(ti.queued_by_job_id))
        then = f"{len(self._pending_adoption)} TIs adopted, pods relabelled next loop"
        if isinstance(why, str):
            log.info("fenced_k8s_executor adoption: %s, %s", why, then)
            self._remember_pods_of({int(ti.queued_by_job_id) for ti in tis if ti.queued_by_job_id})
        else:
            report("adoption", why, then=then)
        return to_reset

    def _remember_pods_of(self, job_ids: set[int]) -> None:
        """The launches of the dead schedulers' pods, from metadata-only lists (what stock's adoption
        lists), so that their events resolve from memory while their relabelling waits for the
        witness, instead of a pod read each; an API error leaves them to those reads."""
        for job_id in job_ids:
            selector = f"kubernetes_executor=True,airflow-worker={self._make_safe_label_value(str(job_id))}"
            try:
                for namespace in self._namespaces():
                    for page in list_pages(self.kube_client, namespace, label_selector=selector,
                                           request_args=self._api_args):
                        self.book.remember_all((ref.name, ref.launch) for ref in page if ref.launch is not None)
            except Exception as error:  # noqa: BLE001 - the events read their pods instead
                log.info("fenced_k8s_executor could not list the pods of scheduler %s: %r", job_id, error)

    def _launch_unresolved(self, orphans: list[_Orphan]) -> int:
        """Adopted TIs no pod was found for, once their pods could be listed: those still QUEUED
        here under the same token are launched here (``_adopt_by_launching``), as adoption does when
        the list succeeds at once; the others are left to stuck-in-queued. Returns how many."""
        from sqlalchemy import select

        from airflow.models.taskinstance import TaskInstance

        from fenced_k8s_executor import db

        ids = [o.id for o in orphans if o.external_executor_id]
        if not ids:
            return 0
        launched = 0
        with db.bounded_session() as session:
            for ti in session.scalars(select(TaskInstance).where(TaskInstance.id.in_(ids))):
                token = next(o.external_executor_id for o in orphans if str(o.id) == str(ti.id))
                if ti.external_executor_id == token and ti.queued_by_job_id == self._scheduler_job_int():
                    launched += bool(self._adopt_by_launching(ti))
        return launched

    def _finish_adoption(self) -> None:
        """Relabel the pods of TIs adopted while their dead scheduler's pods could not be listed."""
        from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_types import POD_EXECUTOR_DONE_KEY

        from fenced_k8s_executor import provider_compat

        for job_id in sorted({o.queued_by_job_id for o in self._pending_adoption.values()}):
            orphans = {key: o for key, o in self._pending_adoption.items() if o.queued_by_job_id == job_id}
            label = self._make_safe_label_value(str(job_id))
            # Every phase: a pod that succeeded meanwhile resolves its TI too (the completed-pod
            # adoption relabels it and reports its end, as for stock).
            query = {"label_selector": f"kubernetes_executor=True,airflow-worker={label},{POD_EXECUTOR_DONE_KEY}!=True"}
            flush = dict(orphans)
            adopting, self._adopting = self._adopting, dict(orphans)
            finished = set()
            try:
                for pod in self._list_pods(query):
                    if getattr(getattr(pod, "status", None), "phase", None) == "Succeeded":
                        finished.add(coordinates(pod))  # the TI key it names, as _Orphan.key holds it
                        continue
                    self.adopt_launched_task(self.kube_client, pod, flush)
            except NotJudgedYet as why:  # this scheduler's pods wait; the next one's are adopted
                log.info("fenced_k8s_executor adoption: %s, %d pods of scheduler %s relabelled once it can",
                         why, len(orphans), job_id)
                continue
            except Exception as error:
                if not is_api_error(error):
                    raise
                report("adoption", error, then=f"{len(orphans)} pods of scheduler {job_id} relabelled next loop")
                return
            finally:
                self._adopting = adopting
            for key in orphans:
                self._pending_adoption.pop(key, None)
            unresolved = [o for o in orphans.values() if provider_compat.executor_key(self, o) not in self.running
                          and o.key not in finished]
            launched = self._launch_unresolved(unresolved) if self._enforcing else 0
            if len(unresolved) > launched:
                metrics.incr("adoption.unresolved", count=len(unresolved) - launched)
                log.warning("fenced_k8s_executor adoption: no pod found for %d TIs of scheduler %s "
                            "(left to stuck-in-queued and task heartbeats)", len(unresolved) - launched, job_id)
            self._last_completed_pod_adoption = float("-inf")  # its finished pods: next loop
