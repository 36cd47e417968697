"""This deployment's pods in flight (Pending or Running), whichever scheduler process created them.

What one scheduler knows of its launches (the LaunchBook) dies with its process; a peer whose
API calls fail cannot delete its own stale pods, and the provider's watcher (10.25) reports
nothing when a pod starts. So every fenced scheduler keeps this picture: one metadata-only list
per namespace at start, then a watch, of the unfinished pods this deployment launched (token and
deployment labels). Each loop it re-checks every one of them (``ledger.InFlightReads``), so a
superseded launch's pod dies within one loop of any live scheduler that can reach the API,
whoever created it and whatever state that creator is in.

Unfinished only (the field selector): a pod leaves the picture when it finishes or is deleted
(the API server sends DELETED for an object that stops matching a watch), so memory is bounded
by the pods in flight. Like a client-go reflector it resumes a broken watch from the last
resourceVersion and lists again after a 410. The picture only feeds verdicts: an API error here
deletes nothing, and a scheduler starts even when the first list fails (it keeps trying). A pod
whose identity cannot be put to the database (``LaunchIdentity.malformed``) stays in the picture
but is never offered: one warning and one metric, that pod alone.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Iterable

from fenced_k8s_executor import metrics, pods
from fenced_k8s_executor.names import DEPLOYMENT_LABEL, TOKEN_LABEL

log = logging.getLogger("fenced_k8s_executor")

FIELD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"
#: Seconds a watch request lasts before it is renewed (the server ends it; bookmarks keep its version fresh).
WATCH_SECONDS = 300
#: Seconds between attempts after an API error (doubling up to the maximum: what bounds how late
#: the picture catches up once the API answers again, as for the pod watcher).
BACKOFF_START, BACKOFF_MAX = 0.5, 2.0
#: A watch the server (or a proxy) ends sooner than this, with nothing in it, is an error for the
#: back-off: a proxy answering every watch with an empty body would otherwise spin this thread.
SHORT_WATCH = 1.0
#: Seconds ``stop`` waits for all the threads together: the scheduler's exit (``end()``) must fit
#: the chart's 10 s grace with time to spare; the threads are daemons either way.
STOP_WAIT = 2.0
#: Pods that left the picture remembered between two loops (more are rare: one loop's worth of churn).
GONE_MAX = 10_000
PAGE_SIZE = 1000


def label_selector(deployment: str) -> str:
    return f"kubernetes_executor=True,{TOKEN_LABEL},{DEPLOYMENT_LABEL}={deployment}"


class InFlightView:
    """The picture itself: (namespace, name) -> PodRef per watched namespace. Plain data, thread-safe.

    ``settle`` marks a pod decided (deleted, or reported in audit) so that later loops skip it
    until it leaves the picture; keyed by uid, so a new pod under the same name is judged anew."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], pods.PodRef] = {}
        self._settled: set[str] = set()
        self.version = 0  # bumped by every change: what the loop built from the picture is reused until then
        self._gone: list[pods.PodRef] = []  # pods that left the picture (finished or deleted) since the last take

    def replace(self, namespace: str | None, refs: Iterable[pods.PodRef]) -> None:
        """A fresh list of ``namespace`` (None: every namespace) replaces what was known of it."""
        with self._lock:
            self.version += 1
            listed = {(ref.namespace, ref.name) for ref in refs}
            for key in [k for k in self._pods if namespace is None or k[0] == namespace]:
                self._drop(key, gone=key not in listed)
            for ref in refs:
                self._pods[(ref.namespace, ref.name)] = ref

    def apply(self, kind: str, ref: pods.PodRef) -> None:
        """One watch event: ADDED / MODIFIED keep the pod's latest metadata, DELETED drops it."""
        key = (ref.namespace, ref.name)
        with self._lock:
            self.version += 1
            if kind == "DELETED":
                self._drop(key, gone=True)
                return
            old = self._pods.get(key)
            if old is not None and old.uid != ref.uid:
                self._settled.discard(old.uid)
            self._pods[key] = ref

    def settle(self, ref: pods.PodRef) -> None:
        with self._lock:
            if ref.uid and (ref.namespace, ref.name) in self._pods:
                self._settled.add(ref.uid)
                self.version += 1

    def unsettled(self) -> list[pods.PodRef]:
        """Pods with a usable launch identity, not terminating and not yet decided."""
        with self._lock:
            return [ref for ref in self._pods.values()
                    if ref.launch is not None and not ref.deleting and ref.uid not in self._settled
                    and ref.launch.task is not None]

    def has(self, namespace: str, name: str) -> bool:
        with self._lock:
            return (namespace, name) in self._pods

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods)

    def take_gone(self) -> list[pods.PodRef]:
        """The pods that left the picture since the last call: the loop frees the executor slot of
        a launch of its own whose pod someone else deleted (the provider reports nothing for a
        deleted Pending pod)."""
        with self._lock:
            gone, self._gone = self._gone, []
            return gone

    def _drop(self, key: tuple[str, str], gone: bool = False) -> None:
        ref = self._pods.pop(key, None)
        if ref is not None:
            self._settled.discard(ref.uid)
            if gone and ref.launch is not None and len(self._gone) < GONE_MAX:
                self._gone.append(ref)


class InFlightPods:
    """Keeps an InFlightView current: one list, then a watch, per namespace, each in a daemon thread."""

    def __init__(self, kube_client: Any, namespaces: Iterable[str | None], deployment: str,
                 request_args: dict | None = None, page_size: int = PAGE_SIZE):
        self.view = InFlightView()
        self._kube_client = kube_client
        self._namespaces = list(namespaces)
        self._selector = label_selector(deployment)
        self._args = pods.request_args(request_args)
        self._page_size = page_size
        self._stop = threading.Event()
        self._listed: dict[str | None, threading.Event] = {ns: threading.Event() for ns in self._namespaces}
        self._tried: dict[str | None, threading.Event] = {ns: threading.Event() for ns in self._namespaces}
        self._responses: dict[str | None, Any] = {}
        self._threads: list[threading.Thread] = []
        self.lists = 0
        self.errors = 0
        self._warned: set[str] = set()  # uids of malformed pods already reported

    def start(self, wait: float) -> bool:
        """Start watching; wait for every namespace's first list attempt, at most ``wait``
        seconds. True if all were listed (the first loop then knows every launch in flight);
        False if one failed or is still waiting for the API: the threads go on trying and the
        picture fills in when it answers."""
        for namespace in self._namespaces:
            thread = threading.Thread(target=self._follow, args=(namespace,), daemon=True,
                                      name=f"fenced-k8s-pending-{namespace or 'all'}")
            thread.start()
            self._threads.append(thread)
        deadline = time.monotonic() + wait
        for tried in self._tried.values():
            tried.wait(max(0.0, deadline - time.monotonic()))
        return all(listed.is_set() for listed in self._listed.values())

    def stop(self) -> None:
        """Stop every thread, waiting ``STOP_WAIT`` seconds for all of them together (a thread stuck
        in a list during an API outage is a daemon: it does not hold the process)."""
        self._stop.set()
        for response in list(self._responses.values()):
            _interrupt(response)
        deadline = time.monotonic() + STOP_WAIT
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def refs(self) -> list[pods.PodRef]:
        return self.view.unsettled()

    # ------------------------------------------------------------ the thread

    def _follow(self, namespace: str | None) -> None:
        version: str | None = None
        backoff = BACKOFF_START
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._list(namespace)
                started = time.monotonic()
                version, events = self._watch(namespace, version)
                if not events and time.monotonic() - started < SHORT_WATCH:
                    raise EOFError("the watch ended at once with no event")
                backoff = BACKOFF_START
            except pods.Expired:
                metrics.incr("pending_watch.gone")
                version = None
            except Exception as error:  # noqa: BLE001 - the picture must outlive any one request
                self._tried[namespace].set()
                if self._stop.is_set():
                    return
                self.errors += 1
                if pods.is_api_error(error):
                    pods.report("pending_watch", error, then=f"retried in {backoff:.1f}s")
                else:
                    log.warning("fenced_k8s_executor pending-pod watch of %s failed, retried in %.1fs: %r",
                                namespace or "all namespaces", backoff, error)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)

    def _list(self, namespace: str | None) -> str | None:
        refs, version = pods.list_with_version(self._kube_client, namespace, label_selector=self._selector,
                                               field_selector=FIELD_SELECTOR, page_size=self._page_size,
                                               request_args=self._args)
        self._check(refs)
        self.view.replace(namespace, refs)
        self.lists += 1
        self._listed[namespace].set()
        self._tried[namespace].set()
        log.info("fenced_k8s_executor pods in flight of this deployment in %s: %d listed at resourceVersion %s",
                 namespace or "all namespaces", len(refs), version)
        return version

    def _watch(self, namespace: str | None, version: str | None) -> tuple[str | None, int]:
        """One watch request, applied event by event; returns the version to resume from and how
        many events (bookmarks included) it brought."""
        connect = self._args["_request_timeout"]
        connect = connect[0] if isinstance(connect, (tuple, list)) else connect
        args = {**self._args, "_request_timeout": (connect, WATCH_SECONDS + 30)}
        events = pods.watch_refs(self._kube_client, namespace, label_selector=self._selector,
                                 field_selector=FIELD_SELECTOR, resource_version=version or "",
                                 timeout_seconds=WATCH_SECONDS, request_args=args,
                                 on_response=lambda r: self._responses.__setitem__(namespace, r))
        seen = 0
        try:
            for kind, ref, event_version in events:
                seen += 1
                if self._stop.is_set():
                    break
                if ref is not None:
                    if kind != "DELETED":
                        self._check([ref])
                    self.view.apply(kind, ref)
                version = event_version or version
        finally:
            self._responses.pop(namespace, None)
        return version, seen

    def _check(self, refs: Iterable[pods.PodRef]) -> None:
        """One warning and one metric per malformed pod of this deployment (it is never offered)."""
        for ref in refs:
            why = ref.launch.malformed if ref.launch is not None else None
            if why and ref.uid not in self._warned:
                if len(self._warned) > 10_000:
                    self._warned.clear()
                self._warned.add(ref.uid)
                metrics.incr("pod.malformed", {"reason": why.split(" ")[0]})
                log.warning("fenced_k8s_executor pod %s/%s is never fenced: its launch identity cannot be read (%s)",
                            ref.namespace, ref.name, why)


def _interrupt(response: Any) -> None:
    """End a watch read blocked in another thread: shut its socket down (closing the response
    from here would wait on the reader's own lock)."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    try:
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed: the read has ended anyway
        pass
