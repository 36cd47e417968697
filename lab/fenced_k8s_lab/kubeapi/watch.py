"""Watch streams: newline-delimited JSON events over a chunked HTTP response.

The initial events (synthetic ADDED for ""/"0", or a replay of history after a given
resourceVersion) are computed and the watcher registered without yielding to the loop, so
no write can fall between them. Expired resourceVersions get kube's ERROR event
(Status 410 Expired) and the stream ends, as a watch-cache-backed apiserver does.
"""

from __future__ import annotations

import asyncio
import json
from typing import Callable

from aiohttp import web

from .controls import AUDIT_KEY
from .errors import ApiError, status_body
from .store import Expired, Watcher

__all__ = ["serve_watch"]

_DISCONNECT_POLL = 1.0


def _line(kind: str, obj: dict) -> bytes:
    return (json.dumps({"type": kind, "object": obj}, separators=(",", ":")) + "\n").encode()


def _gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


async def serve_watch(request: web.Request, state, watcher: Watcher, rv_param: str | None,
                      timeout: int | None, bookmarks: bool, view: Callable[[dict], dict],
                      kind: str, api_version: str = "v1") -> web.StreamResponse:
    store = state.store
    initial: list[tuple[str, dict]] = []
    expired = None
    if rv_param in (None, "", "0"):
        initial = [("ADDED", o) for o in store.list(watcher.resource, watcher.namespace) if watcher.matches(o)]
    else:
        try:
            rv = int(rv_param)
        except ValueError:
            raise ApiError.bad_request(f'invalid resource version "{rv_param}"')
        try:
            initial = [t for t in (watcher.translate(e) for e in store.events_since(rv)) if t]
        except Expired as exc:
            expired = str(exc)
    if expired is None:
        store.watchers.add(watcher)

    resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    resp.enable_chunked_encoding()
    if AUDIT_KEY in request:
        request[AUDIT_KEY]["code"] = 200
    try:
        await resp.prepare(request)
        if expired is not None:
            await resp.write(_line("ERROR", status_body(410, expired, "Expired")))
            await resp.write_eof()
            return resp
        for kind_, obj in initial:
            await resp.write(_line(kind_, view(obj)))
        await _pump(request, resp, state, watcher, timeout, bookmarks, view, kind, api_version)
        await resp.write_eof()
    except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
        pass
    finally:
        store.watchers.discard(watcher)
    return resp


async def _pump(request, resp, state, watcher: Watcher, timeout, bookmarks, view, kind, api_version) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout if timeout else None
    next_bookmark = loop.time() + state.bookmark_interval if bookmarks else None
    while True:
        now = loop.time()
        if deadline is not None and now >= deadline:
            return
        if next_bookmark is not None and now >= next_bookmark:
            watcher.queue.put_nowait(("bookmark", state.store.rv))
            next_bookmark = now + state.bookmark_interval
        wait = min(x for x in (_DISCONNECT_POLL, deadline and deadline - now, next_bookmark and next_bookmark - now)
                   if x is not None and x is not False)
        try:
            item = await asyncio.wait_for(watcher.queue.get(), timeout=max(0.01, wait))
        except asyncio.TimeoutError:
            if _gone(request):
                return
            continue
        if item[0] == "close":
            return
        if item[0] == "bookmark":
            if bookmarks:
                await resp.write(_line("BOOKMARK", {"kind": kind, "apiVersion": api_version,
                                                    "metadata": {"resourceVersion": str(item[1])}}))
            continue
        _, kind_, obj = item
        await resp.write(_line(kind_, view(obj)))
