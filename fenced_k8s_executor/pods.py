"""The Kubernetes calls the fences make: guarded delete, identity read, metadata-only list pages
and watches, with what they all share: the request args, and how an API error is told and reported.

Deletes always carry a uid precondition, so a pod recreated under the same name (deterministic
names make that possible) is never hit by a decision taken about its predecessor. API errors are
reported to the caller as "nothing done", never raised into the scheduler loop.
"""

from __future__ import annotations

import functools
import json
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from kubernetes.client import V1DeleteOptions, V1Preconditions
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import TRANSIENT_CONNECTION_ERRORS

from fenced_k8s_executor import metadata_pb, metrics
from fenced_k8s_executor.launch import LaunchIdentity, from_pod_metadata

log = logging.getLogger("fenced_k8s_executor")

METADATA_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
#: Protobuf where the server speaks it (kube-apiserver), JSON otherwise: see ``metadata_pb``.
LIST_ACCEPT = f"{metadata_pb.ACCEPT}, {METADATA_LIST_ACCEPT}"

#: (connect, read) seconds after which the fences' own calls give up, unless
#: ``kube_client_request_args`` sets ``_request_timeout``: a call nobody answers (a dead
#: connection) would otherwise hold the scheduler loop, or the sweep and its advisory lock, until
#: TCP gives up, if ever. kube-apiserver ends a non-watch request after 60 s itself
#: (``--request-timeout``), so this cuts only connections nobody answers on.
REQUEST_TIMEOUT = (30.0, 120.0)


def request_args(configured: Mapping | None) -> dict:
    """The request args of a fence's own call: the configured ones (``kube_client_request_args``),
    with ``REQUEST_TIMEOUT`` when they set no ``_request_timeout``."""
    return {"_request_timeout": REQUEST_TIMEOUT, **(configured or {})}


_API_ERRORS: tuple[type[BaseException], ...] = (
    ApiException,
    *TRANSIENT_CONNECTION_ERRORS,
    ConnectionError,
    TimeoutError,
)


def is_api_error(error: BaseException) -> bool:
    """An error from talking to the Kubernetes API (status or transport), not a bug of ours."""
    return isinstance(error, _API_ERRORS)


def status_of(error: BaseException) -> str:
    status = getattr(error, "status", None)
    return str(status) if status else type(error).__name__


def report(call: str, error: BaseException, then: str = "retrying next loop") -> None:
    """The one log line and the one metric of an API error."""
    status = status_of(error)
    metrics.incr("api_error", {"call": call, "status": status})
    text = str(error).strip()
    detail = getattr(error, "reason", None) or (text.splitlines()[0][:200] if text else type(error).__name__)
    log.warning("fenced_k8s_executor API error call=%s status=%s %s: %s", call, status, then, detail)


@dataclass(frozen=True)
class PodRef:
    """What a fence needs to know about a pod: where it is, which object it is, whose launch."""

    name: str
    namespace: str
    uid: str | None
    launch: LaunchIdentity | None
    deleting: bool = False


def ref_from_metadata(metadata: Any) -> PodRef:
    """Build a PodRef from a V1ObjectMeta or a dynamic-client metadata object."""
    annotations = _as_dict(getattr(metadata, "annotations", None))
    return PodRef(
        name=metadata.name,
        namespace=metadata.namespace,
        uid=getattr(metadata, "uid", None),
        launch=from_pod_metadata(annotations, regions=_regions()),
        deleting=bool(getattr(metadata, "deletion_timestamp", None) or getattr(metadata, "deletionTimestamp", None)),
    )


@functools.cache
def _regions() -> bool:
    """Whether a task can sit in a dynamic region on the installed Airflow (3.4): before it, a pod
    naming one names no task that has a row (read as "the task is gone", it would be deleted)."""
    from fenced_k8s_executor import provider_compat

    return provider_compat.task_columns().region is not None


def _as_dict(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    to_dict = getattr(value, "to_dict", None)
    return dict(to_dict()) if to_dict else dict(value)


def read_ref(kube_client: Any, name: str, namespace: str, request_args: Mapping | None = None) -> PodRef | None:
    """Read one pod's identity; None when it no longer exists. Other API errors raise."""
    found = read_with_addresses(kube_client, name, namespace, request_args)
    return None if found is None else found[0]


def read_with_addresses(kube_client: Any, name: str, namespace: str,
                        request_args: Mapping | None = None) -> tuple[PodRef, tuple[str, ...]] | None:
    """As ``read_ref``, with the pod's IPs: what a ``[core] hostname_callable`` that reports the
    host's IP (``airflow.utils.net.get_host_ip_address``) writes into the task's row at ``/run``."""
    try:
        pod = kube_client.read_namespaced_pod(name=name, namespace=namespace, **(request_args or {}))
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    status = getattr(pod, "status", None)
    ips = [getattr(status, "pod_ip", None)] + [getattr(p, "ip", None) for p in getattr(status, "pod_i_ps", None) or []]
    return ref_from_metadata(pod.metadata), tuple(dict.fromkeys(ip for ip in ips if ip))


def delete(kube_client: Any, ref: PodRef, request_args: Mapping | None = None) -> bool | None:
    """Delete exactly this pod object (uid precondition).

    True: the API accepted the delete. False: nothing to delete (gone, or another object holds
    the name now). None: an API or connection error, no evidence either way: check again later.
    """
    if not ref.uid:
        log.warning("fenced_k8s_executor refusing to delete pod %s/%s without a uid", ref.namespace, ref.name)
        return False
    try:
        response = kube_client.delete_namespaced_pod(
            name=ref.name,
            namespace=ref.namespace,
            body=V1DeleteOptions(preconditions=V1Preconditions(uid=ref.uid)),
            # The deleted pod comes back; building a V1Pod of it costs 0.3 ms CPU per delete.
            **{**(request_args or {}), "_preload_content": False},
        )
        response.read()  # drained, so its connection goes back to the pool
        response.release_conn()
        return True
    except ApiException as error:
        if error.status in (404, 409):  # already gone, or a different object now holds the name
            return False
        report("delete", error, then=f"pod {ref.namespace}/{ref.name} left for a later check")
        return None
    except Exception as error:  # connection errors: no evidence the delete happened; try next time
        if is_api_error(error):
            report("delete", error, then=f"pod {ref.namespace}/{ref.name} left for a later check")
        else:
            log.warning("fenced_k8s_executor could not delete pod %s/%s: %r", ref.namespace, ref.name, error)
        return None


class Deletes:
    """Guarded deletes run by a few daemon threads, so a sweep goes on listing while the API
    server commits them (on a real kube-apiserver 1,000 deletes took 3.7 s one at a time, 2.1 s
    with four workers and 1.9 s with eight). ``submit(ref, then)`` calls ``then(result of delete)`` in a worker.

    Bounded: ``submit`` blocks while ``backlog`` deletes wait (the sweep: one page's worth), so
    few refs are ever held, yet a burst of stale pods (one DAG's, listed together) does not stop
    the listing while the workers catch up: with a backlog of four, the real apiserver's sweep
    of 100,000 pods, whose 1,000 stale ones came first, waited 3.6 s in ``submit``. Daemon
    threads: a stopping scheduler never waits on a hung delete. The kubernetes client's default
    pool holds 5 connections per CPU; 4 workers plus a prefetching pager fit a one-CPU scheduler.
    """

    def __init__(self, kube_client: Any, request_args: Mapping | None = None, workers: int = 4,
                 backlog: int | None = None):
        self._kube_client = kube_client
        self._request_args = request_args
        workers = max(1, workers)
        self._queue: queue.Queue = queue.Queue(maxsize=max(workers, backlog or workers))
        self._threads = [threading.Thread(target=self._work, name="fenced-k8s-delete", daemon=True)
                         for _ in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, ref: PodRef, then: Callable[[bool | None], None]) -> None:
        self._queue.put((ref, then))

    def close(self) -> None:
        """Wait for every submitted delete (and its ``then``), then stop the workers."""
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            ref, then = item
            try:
                then(delete(self._kube_client, ref, self._request_args))
            except Exception:  # a failing report must not end the worker: close() would never return
                log.exception("fenced_k8s_executor delete bookkeeping failed for pod %s/%s", ref.namespace, ref.name)


def list_pages(
    kube_client: Any,
    namespace: str | None,
    *,
    label_selector: str,
    field_selector: str | None = None,
    page_size: int = 500,
    request_args: Mapping | None = None,
    prefetch: bool = False,
) -> Iterator[list[PodRef]]:
    """Yield pages of pods as metadata only (PartialObjectMetadataList), following ``continue``.

    ``namespace`` None lists all namespaces. One API call per page. With ``prefetch`` (the sweep)
    a helper thread requests the next page as soon as the caller takes this one, before this one
    is decoded (``_read_ahead``).
    """

    def fetch(token: str | None) -> tuple[str | None, Any]:
        return _split(*_request_page(kube_client, namespace, label_selector, field_selector, page_size,
                                     request_args, token))

    return (_read_ahead if prefetch else _in_turn)(fetch)


def list_with_version(
    kube_client: Any,
    namespace: str | None,
    *,
    label_selector: str,
    field_selector: str | None = None,
    page_size: int = 500,
    request_args: Mapping | None = None,
) -> tuple[list[PodRef], str | None]:
    """Every page of a metadata-only list, and the list's resourceVersion: a continued list is
    one snapshot, at its first page's version, so a watch from it misses nothing."""
    refs: list[PodRef] = []
    token = version = None
    while True:
        body, media = _request_page(kube_client, namespace, label_selector, field_selector, page_size,
                                    request_args, token)
        token, unread = _split(body, media)
        if version is None:
            version = (metadata_pb.resource_version(body) if media == metadata_pb.MEDIA_TYPE
                       else (unread.get("metadata") or {}).get("resourceVersion"))
        refs += _refs(unread)
        if not token:
            return refs, version


#: What a metadata-only watch asks for (each event's object is a PartialObjectMetadata).
WATCH_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


class Expired(Exception):
    """The watch's resourceVersion is gone from the server's history (410): list again."""


def watch_refs(
    kube_client: Any,
    namespace: str | None,
    *,
    label_selector: str,
    field_selector: str | None,
    resource_version: str,
    timeout_seconds: int,
    request_args: Mapping | None = None,
    on_response: Callable[[Any], None] | None = None,
) -> Iterator[tuple[str, PodRef | None, str | None]]:
    """(type, ref, resourceVersion) for each event of a metadata-only watch (``ref`` is None for
    a BOOKMARK). Ends when the server ends the watch; raises ``Expired`` on a 410 ERROR event and
    ApiException or a transport error otherwise. ``on_response`` gets the open response, so that
    another thread can close it to stop the watch."""
    api = kube_client.api_client
    path = "/api/v1/pods" if namespace is None else f"/api/v1/namespaces/{namespace}/pods"
    query: list[tuple[str, Any]] = [("watch", "true"), ("labelSelector", label_selector),
                                    ("resourceVersion", resource_version), ("allowWatchBookmarks", "true"),
                                    ("timeoutSeconds", timeout_seconds)]
    if field_selector:
        query.append(("fieldSelector", field_selector))
    response = api.call_api(path, "GET", query_params=query, header_params={"Accept": WATCH_ACCEPT},
                            auth_settings=["BearerToken"], _return_http_data_only=True,
                            **{**(request_args or {}), "_preload_content": False})
    if on_response is not None:
        on_response(response)
    try:
        for line in iter_resp_lines(response):
            event = json.loads(line)
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Expired(obj.get("message") or "resourceVersion expired")
                raise ApiException(status=obj.get("code"), reason=obj.get("reason") or obj.get("message"))
            meta = obj.get("metadata") or {}
            if kind == "BOOKMARK":
                yield kind, None, meta.get("resourceVersion")
                continue
            yield kind, _ref_of(meta), meta.get("resourceVersion")
    finally:
        response.release_conn()


def _in_turn(fetch: Callable[[str | None], tuple[str | None, Any]]) -> Iterator[list[PodRef]]:
    token = None
    while True:
        token, unread = fetch(token)
        page = _refs(unread)
        del unread  # the caller judges the page while this frame waits: hold the refs, not the body
        yield page
        if not token:
            return


def _read_ahead(fetch: Callable[[str | None], tuple[str | None, Any]]) -> Iterator[list[PodRef]]:
    """Pages listed by a daemon thread: the next page is requested as soon as the caller takes
    this one, before the caller decodes and judges it, so the API server works while this process
    reads. Held at once: the refs of the page the caller took last (until it takes the next),
    the next one's body while it is decoded, and the one after it arriving; the sweep's delete
    queue holds up to a page of refs more. The thread stops when the caller does (a scheduler's
    exit never waits for a list in flight); a failed list is raised to the caller after the pages
    before it."""
    slot: queue.Queue = queue.Queue()
    room = threading.Semaphore(1)  # released when the caller takes a page
    stop = threading.Event()

    def run() -> None:
        token = None
        try:
            while True:
                while not room.acquire(timeout=0.2):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
                token, unread = fetch(token)
                slot.put((unread, not token))
                unread = None  # the caller's now: not held through the next list
                if not token:
                    return
        except BaseException as error:  # handed to the caller, who decides
            slot.put(error)

    threading.Thread(target=run, name="fenced-k8s-list", daemon=True).start()
    try:
        while True:
            item = slot.get()
            if isinstance(item, BaseException):
                raise item
            room.release()
            unread, last = item
            page = _refs(unread)
            del item, unread  # held while the caller judges the page: the refs, not the body
            yield page
            page = None
            if last:
                return
    finally:
        stop.set()


def _request_page(kube_client: Any, namespace: str | None, label_selector: str, field_selector: str | None,
                  page_size: int, request_args: Mapping | None, token: str | None) -> tuple[bytes, str]:
    """One list call: (body, media type)."""
    api = kube_client.api_client
    path = "/api/v1/pods" if namespace is None else f"/api/v1/namespaces/{namespace}/pods"
    query: list[tuple[str, Any]] = [("labelSelector", label_selector), ("limit", page_size)]
    if field_selector:
        query.append(("fieldSelector", field_selector))
    if token:
        query.append(("continue", token))
    response = api.call_api(
        path,
        "GET",
        query_params=query,
        header_params={"Accept": LIST_ACCEPT},
        auth_settings=["BearerToken"],
        _return_http_data_only=True,
        **{**(request_args or {}), "_preload_content": False},
    )
    try:
        return response.data, (response.headers.get("Content-Type") or "").split(";")[0].strip().lower()
    finally:
        response.release_conn()


def _split(body: bytes, media: str) -> tuple[str | None, Any]:
    """(the continue token, the page still to read): protobuf is read for its token alone
    (``metadata_pb.continue_token`` skips the items by their lengths), JSON is parsed once."""
    if media == metadata_pb.MEDIA_TYPE:
        return metadata_pb.continue_token(body), body
    data = json.loads(body)
    return (data.get("metadata") or {}).get("continue") or None, data


def _refs(unread: Any) -> list[PodRef]:
    if isinstance(unread, dict):
        metas = [item.get("metadata") or {} for item in unread.get("items") or []]
    else:
        metas = metadata_pb.decode_list(unread)[0]
    return [_ref_of(meta) for meta in metas]


def _ref_of(meta: dict) -> PodRef:
    """The ref of a pod's metadata as a list or a watch gives it (JSON keys, or ``metadata_pb``'s)."""
    return PodRef(name=meta.get("name"), namespace=meta.get("namespace"), uid=meta.get("uid"),
                  launch=from_pod_metadata(meta.get("annotations"), regions=_regions()),
                  deleting=bool(meta.get("deletionTimestamp")))
