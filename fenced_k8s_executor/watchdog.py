"""A client-side wall-clock bound on a DB connection's operations: when an operation outlives its
deadline, the watchdog shuts the connection's socket down, and the driver's blocked read returns
at once with a lost-connection error.

Why on the client's own socket: behind a TCP-terminating pooler (pgbouncer, RDS Proxy) whose server
side went silent, nothing else ends the wait. The client's keepalives and ``tcp_user_timeout``
reach the pooler, which is alive, and the server's ``statement_timeout`` is the silent server's;
libpq has no client-side statement timeout, and neither psycopg2 nor psycopg 3 adds one to a
blocking call. ``shutdown(SHUT_RDWR)`` wakes a thread blocked in ``poll``/``recv`` on the socket
on both drivers (psycopg2: "server closed the connection unexpectedly", psycopg 3: "consuming
input failed"), and the connection is broken for good: it must never be used again (``cut`` says
whether a connection was).

One daemon thread for the process, woken only by the earliest deadline; arming is a ``dup`` of
the socket's descriptor and a heap push. The duplicate keeps the socket itself (not a descriptor
number another connection may reuse once the driver closes its own) until the watch ends.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import socket
import threading
import time
import weakref
from typing import Any

log = logging.getLogger("fenced_k8s_executor")

_ARMED, _DONE, _CUT = "armed", "done", "cut"


class Watch:
    """One armed deadline over one connection's socket."""

    __slots__ = ("connection", "deadline", "fd", "state", "what")

    def __init__(self, connection: Any, fd: int, deadline: float, what: str):
        self.connection = weakref.ref(connection)
        self.fd = fd
        self.deadline = deadline
        self.state = _ARMED
        self.what = what


_lock = threading.Lock()
_wake = threading.Condition(_lock)
_heap: list[tuple[float, int, Watch]] = []
_order = itertools.count()
_thread: threading.Thread | None = None
_cut: "weakref.WeakSet[Any]" = weakref.WeakSet()  # DBAPI connections cut: never to be used again
#: Called with (what, seconds) after each cut, outside the lock (``db`` counts them as a metric).
on_cut: Any = None


def arm(connection: Any, seconds: float, what: str) -> Watch | None:
    """Watch ``connection`` (a DBAPI connection with ``fileno()``) for ``seconds``; ``what`` names
    the operation for the log. None when it has no socket (closed: its operation fails at once)."""
    try:
        fd = os.dup(connection.fileno())
    except Exception:  # noqa: BLE001 - a closed connection (each driver raises its own error)
        return None
    watch = Watch(connection, fd, time.monotonic() + max(0.0, seconds), what)
    with _lock:
        _ensure_thread()
        heapq.heappush(_heap, (watch.deadline, next(_order), watch))
        if _heap[0][2] is watch:
            _wake.notify()
    return watch


def disarm(watch: Watch | None) -> bool:
    """End the watch; True when the watchdog cut the connection (its result, if it has one, came
    in before the cut, but the connection is broken: discard it)."""
    if watch is None:
        return False
    with _lock:
        state, watch.state = watch.state, _DONE
        if state == _ARMED:
            _close(watch.fd)
    return state == _CUT


def cut(connection: Any) -> bool:
    """Whether the watchdog cut ``connection``."""
    return connection in _cut


def _ensure_thread() -> None:
    global _thread
    if _thread is None or not _thread.is_alive():
        _thread = threading.Thread(target=_run, name="fenced-db-watchdog", daemon=True)
        _thread.start()


def _run() -> None:
    while True:
        with _lock:
            while not _heap or _heap[0][0] > time.monotonic():
                _wake.wait(None if not _heap else _heap[0][0] - time.monotonic())
            _, _, watch = heapq.heappop(_heap)
            if watch.state != _ARMED:
                continue
            watch.state = _CUT  # from here the descriptor is the watchdog's: disarm leaves it
            connection = watch.connection()
            if connection is not None:
                _cut.add(connection)
        # Said before the cut, which wakes the operation's thread: whoever sees its error can see
        # the metric too.
        log.warning("fenced_k8s_executor a DB %s outlived its bound: the connection is cut and discarded", watch.what)
        if on_cut is not None:
            try:
                on_cut(watch.what)
            except Exception:  # noqa: BLE001 - a metric must not stop the watchdog
                pass
        _shutdown(watch.fd)


def _shutdown(fd: int) -> None:
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        _close(fd)
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already gone
        pass
    finally:
        sock.close()  # the duplicate


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _forget_in_child() -> None:
    """A forked child has no watchdog thread and none of its parent's operations: it starts anew,
    and closes the parent's duplicates it inherited."""
    global _lock, _wake, _heap, _thread
    for _, _, watch in _heap:
        if watch.state == _ARMED:
            _close(watch.fd)
    _lock = threading.Lock()
    _wake = threading.Condition(_lock)
    _heap, _thread = [], None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
