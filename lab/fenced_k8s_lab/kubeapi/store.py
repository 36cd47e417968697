"""Object store: one global resourceVersion counter, a bounded event history, and watchers.

Stored objects are never mutated in place (every write stores a fresh dict), so list
snapshots, history entries and queued watch events can share references safely.
Everything here runs on the server's event loop; nothing is thread-safe by itself.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from .selectors import FieldSelector, LabelSelector

__all__ = ["Event", "Watcher", "Store", "Expired"]


class Expired(Exception):
    """A resourceVersion older than the retained history (kube answers 410 Expired)."""


@dataclass(frozen=True)
class Event:
    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    resource: str  # "pods" | "namespaces" | "leases"
    old: dict | None  # state before the write (None for ADDED)
    new: dict  # state after the write; for DELETED the final object stamped with the delete's rv


@dataclass(eq=False)
class Watcher:
    """One open watch: its scope and selectors, and a queue of items for the HTTP stream.

    Queue items: ("event", type, obj) | ("bookmark", rv) | ("close",).
    """

    resource: str
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)

    def matches(self, obj: dict | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata", {})
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        return self.labels.matches(meta.get("labels")) and self.fields.matches(obj)

    def translate(self, ev: Event) -> tuple[str, dict] | None:
        """The event this watcher sees, applying kube's selector-transition rules."""
        if ev.resource != self.resource:
            return None
        was, now = self.matches(ev.old), self.matches(ev.new)
        if ev.type == "DELETED":
            return ("DELETED", ev.new) if was else None
        if was and now:
            return ("MODIFIED", ev.new)
        if now:
            return ("ADDED", ev.new)
        if was:  # as kube-apiserver's watch cache: the last state that matched, at the new resourceVersion
            old = ev.old or ev.new
            return ("DELETED", {**old, "metadata": {**old["metadata"],
                                                    "resourceVersion": ev.new["metadata"]["resourceVersion"]}})
        return None

    def offer(self, ev: Event) -> None:
        seen = self.translate(ev)
        if seen:
            self.queue.put_nowait(("event", *seen))


class Store:
    def __init__(self, history_size: int = 1000, snapshot_limit: int = 256):
        self.rv = 0
        self.objects: dict[str, dict[tuple[str, str], dict]] = {"pods": {}, "namespaces": {}, "leases": {}}
        self.history: deque[Event] = deque(maxlen=max(1, history_size))
        self.floor = 0  # events with rv > floor are all still in history
        self.watchers: set[Watcher] = set()
        self._snapshots: OrderedDict[int, tuple[int, list[dict]]] = OrderedDict()
        self._snapshot_ids = itertools.count(1)
        self._snapshot_limit = snapshot_limit

    # -- reads
    def get(self, resource: str, ns: str, name: str) -> dict | None:
        return self.objects[resource].get((ns, name))

    def list(self, resource: str, ns: str | None) -> list[dict]:
        items = self.objects[resource]
        keys = sorted(k for k in items if ns is None or k[0] == ns)
        return [items[k] for k in keys]

    # -- writes
    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def _record(self, ev: Event) -> None:
        if len(self.history) == self.history.maxlen:
            self.floor = self.history[0].rv
        self.history.append(ev)
        for w in list(self.watchers):
            w.offer(ev)

    def write(self, resource: str, obj: dict, old: dict | None) -> dict:
        """Store obj (ADDED if old is None else MODIFIED) stamped with a new resourceVersion."""
        rv = self.next_rv()
        meta = obj["metadata"]
        obj = {**obj, "metadata": {**meta, "resourceVersion": str(rv)}}
        self.objects[resource][(meta.get("namespace", ""), meta["name"])] = obj
        self._record(Event(rv, "ADDED" if old is None else "MODIFIED", resource, old, obj))
        return obj

    def remove(self, resource: str, ns: str, name: str) -> dict:
        old = self.objects[resource].pop((ns, name))
        rv = self.next_rv()
        final = {**old, "metadata": {**old["metadata"], "resourceVersion": str(rv)}}
        self._record(Event(rv, "DELETED", resource, old, final))
        return final

    # -- history
    def events_since(self, rv: int) -> list[Event]:
        if rv < self.floor:
            raise Expired(f"too old resource version: {rv} ({self.floor + 1})")
        return [e for e in self.history if e.rv > rv]

    def compact(self) -> None:
        """Forget all history: any resourceVersion older than the current one is now expired."""
        self.history.clear()
        self.floor = self.rv
        self._snapshots.clear()

    # -- list snapshots for limit/continue
    def snapshot(self, rv: int, items: list[dict]) -> int:
        sid = next(self._snapshot_ids)
        self._snapshots[sid] = (rv, items)
        while len(self._snapshots) > self._snapshot_limit:
            self._snapshots.popitem(last=False)
        return sid

    def snapshot_get(self, sid: int) -> tuple[int, list[dict]]:
        if sid not in self._snapshots:
            raise Expired("The provided continue parameter is too old to display a consistent list result.")
        return self._snapshots[sid]

    # -- watchers
    def close_watchers(self) -> int:
        n = len(self.watchers)
        for w in list(self.watchers):
            w.queue.put_nowait(("close",))
        self.watchers.clear()
        return n

    def bookmark_all(self) -> int:
        for w in self.watchers:
            w.queue.put_nowait(("bookmark", self.rv))
        return len(self.watchers)

    def reset(self) -> None:
        """Drop every object and all history; the rv counter keeps counting (old rvs expire)."""
        self.close_watchers()
        for table in self.objects.values():
            table.clear()
        self.compact()

