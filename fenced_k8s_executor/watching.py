"""A pod watcher that survives 410 Gone (and every other API error) without losing events.

The provider's ``KubernetesJobWatcher`` dies on a 410: ``Watch.stream`` is lazy, so the
``try/except`` in ``_pod_events`` never sees the error, and with ``timeout_seconds`` set the
client does not retry either. The ``ApiException(410)`` escapes ``_run``, ``run`` re-raises it, the
process exits, and ``_health_check_kube_watchers`` starts a new one from resourceVersion "0" on
a later executor loop. Pods deleted in that gap never get their DELETED event; finished pods
still present are reported a second time.

``ResilientJobWatcher`` runs the same ``_run``/``process_status`` code, in the same separate process
(no DB), and adds what a client-go reflector does:

- it tracks the pods it has seen (name, resourceVersion, last object) and the resourceVersion
  of the last event it handed to ``process_status``;
- after any error it resumes from that resourceVersion; after a 410 (raised by the client or
  returned by ``process_error``) it relists, starts watching from the list's resourceVersion,
  and turns the difference between the list and what it had seen into events: new or changed
  pods as ADDED/MODIFIED, vanished pods as the DELETED event the provider would have received
  (a pod that left the selector: its current object, which ``process_status`` reports as
  ADOPTED; a deleted pod: its last known object with a deletion timestamp). A vanished pod
  whose terminal phase was already reported is not reported again;
- it starts with such a list instead of a watch from "0", so its own relists never replay.

The executor makes its ``AirflowKubernetesScheduler`` build watchers of this class
(``install_resilient_watchers``, from ``start()``), so restarts by the provider's health check use it too.
"""

from __future__ import annotations

import copy
import logging
import signal
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from types import MethodType
from typing import Any, Iterator

from kubernetes.client.rest import ApiException
from urllib3.exceptions import ReadTimeoutError

from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_types import ALL_NAMESPACES, POD_EXECUTOR_DONE_KEY
from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_utils import KubernetesJobWatcher

from fenced_k8s_executor import metrics, pods, provider_compat

log = logging.getLogger("fenced_k8s_executor")

TERMINAL_PHASES = ("Succeeded", "Failed")
#: Where a finished pod's uid travels from the watcher to the scheduler, beside the task
#: annotations the provider hands over (never written to a pod).
UID_KEY = "fenced-k8s-executor/pod-uid"
#: Finished pods whose uid is remembered until their delete (more wait only after an API outage).
UIDS_MAX = 10_000
RELIST_PAGE_SIZE = 500
#: Seconds between attempts after an API error (doubling up to the maximum). The maximum bounds
#: how late events come once the API answers again: the stock watcher dies on an error and is
#: restarted on the next executor loop, and a 15 s cap here kept a finished task's slot held up to
#: 15 s after an outage ended (test_a_slot_is_freed_soon_after_an_api_outage_ends). One request
#: every 2 s per namespace during an outage is no load for an API server.
BACKOFF_START = 0.5
BACKOFF_MAX = 2.0


def _is_gone(error: BaseException) -> bool:
    return isinstance(error, ApiException) and str(getattr(error, "status", "")) == "410"


@dataclass
class _Seen:
    resource_version: str | None
    pod: Any  # the V1Pod of the last event handed to process_status
    phase: str | None


class ResilientJobWatcher(KubernetesJobWatcher):
    """``KubernetesJobWatcher`` that relists and resumes inside its process instead of dying."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._seen: dict[tuple[str, str], _Seen] = {}
        self._last_rv: str | None = None  # of the last event processed (or of the last list)
        self._current_rv: str | None = None  # of the event being processed
        self._needs_relist = self.resource_version in (None, "", "0")
        self._replay: list[dict] = []  # synthetic events of the last relist, not yet processed
        self._in_replay = False
        self._backoff = BACKOFF_START
        self.relists = 0
        self.errors = 0

    # ---------------------------------------------------------------- the watch loop

    def run(self) -> None:
        """The provider's loop, after giving SIGTERM its default action back. This process is
        forked from the scheduler after it registered ``_exit_gracefully``, which does nothing
        outside the main process: ``terminate()`` at shutdown was ignored and the scheduler's
        ``end()`` waited 20 s for each watcher before killing it, with its Job still ``running``,
        so its peers could not take over its launches. Nothing here needs a graceful exit: it holds
        no DB session, and the events it queued stay queued for ``end()`` to flush."""
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        super().run()

    def _run(self, kube_client: Any, resource_version: str | None, scheduler_job_id: str, kube_config: Any) -> str | None:
        """One watch cycle of the provider, with a relist before it when needed and every error
        turned into "resume (or relist) on the next cycle" instead of a dead process."""
        try:
            if self._needs_relist:
                resource_version = self._relist(kube_client, scheduler_job_id, kube_config)
            elif self._last_rv:
                resource_version = self._last_rv
            returned = super()._run(kube_client, resource_version, scheduler_job_id, kube_config)
        except Exception as error:  # noqa: BLE001 - the watcher must outlive any one cycle
            self._on_error(error)
            return self._last_rv or resource_version
        if returned == "0":  # process_error saw an ERROR event with code 410
            self._on_gone("error event")
        else:
            self._backoff = BACKOFF_START
        return self._last_rv or resource_version

    def _pod_events(self, kube_client: Any, query_kwargs: dict) -> Iterator[dict]:
        """The relist's synthetic events first, then the stream; remember each event's
        resourceVersion once ``_run`` has processed it, and skip events already processed."""
        while self._replay:  # an event leaves the list only once processed
            self._in_replay = True
            yield self._replay[0]
            self._replay.pop(0)
        self._in_replay = False
        for event in super()._pod_events(kube_client, query_kwargs):
            meta = getattr(event.get("object"), "metadata", None)
            rv = getattr(meta, "resource_version", None)
            if event.get("type") in ("ADDED", "MODIFIED") and meta is not None:
                seen = self._seen.get((meta.namespace, meta.name))
                if seen is not None and seen.resource_version == rv:
                    self._last_rv = rv
                    continue  # a resumed watch repeating what was already handed over
            self._current_rv = rv
            yield event
            if rv:  # _run asked for the next event: this one went through process_status
                self._last_rv = rv

    def process_status(self, pod_name: str, namespace: str, status: str, annotations: dict, resource_version: str,
                       event: Any) -> None:
        key = (namespace, pod_name)
        repeat = _repeated_end(self._seen.get(key), status, event)
        if event["type"] == "DELETED":
            self._seen.pop(key, None)
        else:
            self._seen[key] = _Seen(resource_version, event["object"], status)
        if repeat:
            # The deletion of a finished pod whose end this watcher already reported: the provider
            # would report that end again for each of the deletion's two events (its first write
            # and DELETED), and the executor send a delete for each, answered 404
            # (apache/airflow#72803). The first report stays queued, and retried, until handled.
            metrics.incr("watcher.repeat_skipped")
            return
        uid = getattr(getattr(event.get("object"), "metadata", None), "uid", None)
        if status in TERMINAL_PHASES and uid and isinstance(annotations, dict):
            annotations = {**annotations, UID_KEY: uid}  # for the delete's precondition (``install_uid_deletes``)
        super().process_status(pod_name, namespace, status, annotations, resource_version, event)

    # ---------------------------------------------------------------- errors

    def _on_error(self, error: BaseException) -> None:
        if _is_gone(error):
            self._on_gone("status")
            return
        if isinstance(error, ReadTimeoutError):  # no event within the read timeout: just resume
            log.debug("fenced_k8s_executor watcher %s: read timeout, resuming from %s", self.namespace, self._last_rv)
            return
        self.errors += 1
        if pods.is_api_error(error):
            metrics.incr("api_error", {"call": "watch", "status": pods.status_of(error)})
            log.warning("fenced_k8s_executor watcher %s: API error %s, resuming from %s in %.1fs",
                        self.namespace, pods.status_of(error), self._last_rv or "a relist", self._backoff)
        else:  # the event being processed broke process_status: report it, do not retry it forever
            metrics.incr("watcher.error", {"error": type(error).__name__})
            log.exception("fenced_k8s_executor watcher %s: could not process an event (resourceVersion %s)",
                          self.namespace, self._current_rv)
            if self._in_replay and self._replay:
                self._replay.pop(0)
            elif self._current_rv:
                self._last_rv = self._current_rv
        if not self._last_rv:
            self._needs_relist = True
        time.sleep(self._backoff)
        self._backoff = min(self._backoff * 2, BACKOFF_MAX)

    def _on_gone(self, how: str) -> None:
        metrics.incr("watcher.gone")
        log.info("fenced_k8s_executor watcher %s: resourceVersion %s expired (410, %s); relisting",
                 self.namespace, self._last_rv, how)
        self._needs_relist = True

    # ---------------------------------------------------------------- relist

    def _relist(self, kube_client: Any, scheduler_job_id: str, kube_config: Any) -> str:
        """List the watched pods, queue the events the gap hid, return the resourceVersion to
        watch from. Raises on API errors (the cycle is retried, the relist with it)."""
        selector = f"airflow-worker={scheduler_job_id},{POD_EXECUTOR_DONE_KEY}!=True"
        request_args = pods.request_args(kube_config.kube_client_request_args)
        found, list_rv = self._list(kube_client, selector, request_args)
        sanitize = kube_client.api_client.sanitize_for_serialization
        events: list[dict] = []
        listed = set()
        for pod in found:
            key = (pod.metadata.namespace, pod.metadata.name)
            listed.add(key)
            seen = self._seen.get(key)
            if seen is not None and seen.resource_version == pod.metadata.resource_version:
                continue  # no change during the gap
            events.append(_event("ADDED" if seen is None else "MODIFIED", pod, sanitize))
        for key, seen in list(self._seen.items()):
            if key in listed:
                continue
            final = self._final_state(kube_client, key, seen, request_args)
            if final is None:  # deleted after its terminal phase was reported: nothing new
                self._seen.pop(key, None)
                continue
            events.append(_event("DELETED", final, sanitize))
        self._replay = events
        self._needs_relist = False
        self._last_rv = list_rv
        self.relists += 1
        metrics.incr("watcher.relist")
        log.info("fenced_k8s_executor watcher %s: relisted %d pods at resourceVersion %s, %d events from the gap",
                 self.namespace, len(found), list_rv, len(events))
        return list_rv

    def _list(self, kube_client: Any, selector: str, request_args: dict) -> tuple[list, str]:
        found: list = []
        token = None
        while True:
            kwargs = {"label_selector": selector, "limit": RELIST_PAGE_SIZE, **request_args}
            if token:
                kwargs["_continue"] = token
            if self.namespace == ALL_NAMESPACES:
                page = kube_client.list_pod_for_all_namespaces(**kwargs)
            else:
                page = kube_client.list_namespaced_pod(self.namespace, **kwargs)
            found.extend(page.items or [])
            token = page.metadata._continue
            if not token:
                return found, page.metadata.resource_version
            # A continued list is consistent at the first page's resourceVersion.

    def _final_state(self, kube_client: Any, key: tuple[str, str], seen: _Seen, request_args: dict) -> Any | None:
        """The object of the DELETED event a pod that vanished from the list would have sent."""
        namespace, name = key
        try:
            current = kube_client.read_namespaced_pod(name, namespace, **request_args)
        except ApiException as error:
            if error.status != 404:
                raise
            current = None
        if current is not None:
            return current  # left the selector (adopted, done) or still terminating: as it is now
        if seen.phase in TERMINAL_PHASES:
            return None
        final = copy.deepcopy(seen.pod)
        if not final.metadata.deletion_timestamp:
            final.metadata.deletion_timestamp = datetime.now(timezone.utc)
        return final


def _repeated_end(seen: _Seen | None, status: str, event: Any) -> bool:
    """An event of a pod being deleted (a deletion timestamp, or DELETED) that reports the same
    terminal phase this watcher already handed over for the same pod object: nothing new."""
    meta = getattr(event.get("object"), "metadata", None)
    if seen is None or status not in TERMINAL_PHASES or seen.phase != status or meta is None:
        return False
    if not getattr(meta, "deletion_timestamp", None):
        return False  # a DELETED without one is the pod leaving the selector: the provider's ADOPTED
    return getattr(getattr(seen.pod, "metadata", None), "uid", None) == getattr(meta, "uid", None)


def _event(kind: str, pod: Any, sanitize: Any) -> dict:
    return {"type": kind, "object": pod, "raw_object": sanitize(pod)}


def _make_resilient_watcher(self: Any, namespace: str) -> ResilientJobWatcher:
    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_utils import ResourceVersion

    # The provider's own arguments, as its ``_make_kube_watcher`` passes them (they differ by release).
    watcher = ResilientJobWatcher(**provider_compat.watcher_kwargs(
        self, namespace, ResourceVersion().resource_version.get(namespace, "0")))
    watcher.start()
    return watcher


def install_uid_deletes(kube_scheduler: Any) -> None:
    """The provider deletes a finished pod by name; wrapped here so that the delete carries the uid
    of the pod object whose end the watcher reported (``UID_KEY``), as every delete of the fences
    does: a newer object under the same name is never deleted for its predecessor's end. The
    provider's own ``delete_pod`` sends it (its options, metrics and 404 handling), with the uid
    among the delete options; its 409 (the name holds another object now) is the end of it."""
    from collections import OrderedDict

    from kubernetes.client import V1Preconditions

    if getattr(kube_scheduler, "_fenced_uid_deletes", False):
        return
    record, delete = kube_scheduler.process_watcher_task, kube_scheduler.delete_pod
    uids: OrderedDict = OrderedDict()

    def process_watcher_task(task: Any) -> None:
        uid = task.annotations.get(UID_KEY) if isinstance(task.annotations, dict) else None
        if uid:
            uids[(task.namespace, task.pod_name)] = uid
            uids.move_to_end((task.namespace, task.pod_name))
            while len(uids) > UIDS_MAX:  # the oldest is deleted by name, as stock deletes it
                uids.popitem(last=False)
        record(task)

    def delete_pod(pod_name: str, namespace: str) -> None:
        uid = uids.get((namespace, pod_name))
        if uid is None:
            return delete(pod_name=pod_name, namespace=namespace)
        config = kube_scheduler.kube_config
        configured = config.delete_option_kwargs
        config.delete_option_kwargs = {**(configured or {}), "preconditions": V1Preconditions(uid=uid)}
        try:
            delete(pod_name=pod_name, namespace=namespace)
        except ApiException as error:
            if error.status != 409:
                raise  # kept for the retry (the provider's, or the fences' next loop)
            metrics.incr("pod.kept", {"path": "finished", "reason": "name_reused"})
            log.info("fenced_k8s_executor pod %s/%s not deleted: the name holds another object now", namespace,
                     pod_name)
        finally:
            config.delete_option_kwargs = configured
        uids.pop((namespace, pod_name), None)

    kube_scheduler.process_watcher_task = process_watcher_task
    kube_scheduler.delete_pod = delete_pod
    kube_scheduler._fenced_uid_deletes = True


def install_resilient_watchers(kube_scheduler: Any) -> None:
    """Bind the watcher factory on this kube scheduler and replace the provider's watchers it
    has just started (their events already queued stay queued); finished pods' deletes carry
    their uid (``install_uid_deletes``)."""
    watchers = getattr(kube_scheduler, "kube_watchers", None)
    if not isinstance(watchers, dict):  # no kube scheduler (or a test double): nothing to replace
        return
    install_uid_deletes(kube_scheduler)
    kube_scheduler._make_kube_watcher = MethodType(_make_resilient_watcher, kube_scheduler)
    for namespace, old in list(kube_scheduler.kube_watchers.items()):
        if isinstance(old, ResilientJobWatcher) or not isinstance(old, KubernetesJobWatcher):
            continue
        # SIGKILL, not SIGTERM: in a scheduler process the watcher inherits the scheduler's
        # SIGTERM handler, which runs only when its blocking watch read returns, so a terminate()
        # stalled every start for the whole join timeout (10 s, measured in the lab) with the
        # provider's watcher live. Nothing is lost: it started moments ago and the new watcher
        # lists from the same resource version; what it already queued stays queued.
        old.kill()
        old.join(timeout=5)
        kube_scheduler.kube_watchers[namespace] = kube_scheduler._make_kube_watcher(namespace)
    log.info("fenced_k8s_executor watchers relist on 410 (pid %s)",
             ",".join(str(w.pid) for w in kube_scheduler.kube_watchers.values()) or "-")
