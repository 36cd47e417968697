"""Emulator state and its test controls: faults, audit log, log texts, tokens, compaction.

`State` holds everything one emulator instance knows. Its control methods are plain
synchronous functions that must run on the server's loop; the HTTP routes under
`/_emulator/` and the in-process `Emulator` class both call them.
"""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import asdict, dataclass, field

from aiohttp import web

from .store import Store

__all__ = ["Fault", "State", "AUDIT_KEY"]

#: Where a request's audit entry lives while it is handled (handlers add details, e.g. code).
AUDIT_KEY = web.RequestKey("audit", dict) if hasattr(web, "RequestKey") else "audit"


@dataclass
class Fault:
    """One injected fault. Matching requests (after `after` skips, at most `times` times) get
    `delay` seconds of latency, then: a Status error `status`, a dropped connection (`drop`),
    or (`persist_then_timeout`) normal processing whose response is never sent: the server
    hangs for `hang_seconds` (default: until the client gives up) and then drops the connection.
    """

    method: str = "*"
    path: str = ".*"  # regex searched in the request path (query string excluded)
    status: int | None = None
    message: str | None = None
    delay: float = 0.0
    drop: bool = False
    persist_then_timeout: bool = False
    hang_seconds: float | None = None
    times: int | None = None
    after: int = 0
    who: str | None = None  # only requests from this caller (token name)
    id: int = 0
    seen: int = 0
    fired: int = 0
    _rx: re.Pattern | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.method = (self.method or "*").upper()
        self._rx = re.compile(self.path)
        if self.status is None and not (self.delay or self.drop or self.persist_then_timeout):
            raise ValueError("a fault needs status, delay, drop or persist_then_timeout")

    def take(self, method: str, path: str, who: str) -> bool:
        if self.method not in ("*", method) or not self._rx.search(path):
            return False
        if self.who is not None and self.who != who:
            return False
        if self.times is not None and self.fired >= self.times:
            return False
        self.seen += 1
        if self.seen <= self.after:
            return False
        self.fired += 1
        return True

    def describe(self) -> dict:
        d = asdict(self)
        d.pop("_rx", None)
        return d


_FAULT_FIELDS = set(Fault.__dataclass_fields__) - {"id", "seen", "fired", "_rx"}


class State:
    def __init__(self, *, history_size: int = 1000, tokens: dict[str, str] | None = None,
                 bookmark_interval: float = 60.0, implicit_namespaces: bool = True):
        self.store = Store(history_size)
        self.tokens: dict[str, str] = dict(tokens or {})
        self.bookmark_interval = bookmark_interval
        self.implicit_namespaces = implicit_namespaces
        self.audit_log: list[dict] = []
        self.faults: list[Fault] = []
        self._fault_ids = itertools.count(1)
        self.logs: dict[tuple[str, str, str | None], bytearray] = {}
        self.log_files: dict[tuple[str, str, str | None], str] = {}

    # -- callers and audit
    def who(self, authorization: str | None) -> str:
        if not authorization:
            return "system:anonymous"
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return "system:anonymous"
        return self.tokens.get(token.strip()) or "token:" + token.strip()[:8]

    def audit_begin(self, **entry) -> dict:
        entry = {"index": len(self.audit_log), "ts": time.time(), **entry, "code": None}
        self.audit_log.append(entry)
        return entry

    def audit(self, since: int = 0) -> list[dict]:
        return [dict(e) for e in self.audit_log[since:]]

    def clear_audit(self) -> None:
        self.audit_log.clear()

    def set_tokens(self, mapping: dict[str, str]) -> None:
        self.tokens.update(mapping)

    # -- faults
    def add_fault(self, spec: dict) -> int:
        unknown = set(spec) - _FAULT_FIELDS
        if unknown:
            raise ValueError(f"unknown fault fields: {sorted(unknown)}")
        fault = Fault(**spec, id=next(self._fault_ids))
        self.faults.append(fault)
        return fault.id

    def take_fault(self, method: str, path: str, who: str) -> Fault | None:
        for f in self.faults:
            if f.take(method, path, who):
                return f
        return None

    def list_faults(self) -> list[dict]:
        return [f.describe() for f in self.faults]

    def clear_faults(self, fault_id: int | None = None) -> None:
        self.faults = [f for f in self.faults if fault_id is not None and f.id != fault_id]

    # -- logs
    def append_log(self, ns: str, name: str, data: bytes, container: str | None = None) -> None:
        self.logs.setdefault((ns, name, container), bytearray()).extend(data)

    def set_log(self, ns: str, name: str, data: bytes, container: str | None = None) -> None:
        self.logs[(ns, name, container)] = bytearray(data)

    def set_log_file(self, ns: str, name: str, path: str, container: str | None = None) -> None:
        self.log_files[(ns, name, container)] = path

    def read_log(self, ns: str, name: str, container: str | None) -> bytes | None:
        """Log bytes for a container (falling back to the pod-wide log), None if never written."""
        for key in ((ns, name, container), (ns, name, None)):
            if key in self.log_files:
                try:
                    with open(self.log_files[key], "rb") as fh:
                        return fh.read()
                except OSError:
                    return b""
            if key in self.logs:
                return bytes(self.logs[key])
        return None

    # -- store-level controls
    def compact(self) -> int:
        self.store.compact()
        return self.store.rv

    def close_watches(self) -> int:
        return self.store.close_watchers()

    def bookmark(self) -> int:
        return self.store.bookmark_all()

    def reset(self) -> None:
        self.store.reset()
        self.audit_log.clear()
        self.faults.clear()
        self.logs.clear()
        self.log_files.clear()

    def summary(self) -> dict:
        s = self.store
        return {"resourceVersion": str(s.rv), "oldestResumable": str(s.floor), "history": len(s.history),
                "watchers": len(s.watchers), "pods": len(s.objects["pods"]),
                "namespaces": len(s.objects["namespaces"]), "leases": len(s.objects["leases"]),
                "audit": len(self.audit_log), "faults": len(self.faults)}
