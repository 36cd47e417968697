"""Ways to run and drive the emulator: in-process (`Emulator`) or remote (`EmulatorControl`).

Both expose the same control methods, so a test or the lab can switch between an emulator
in a background thread and one in a subprocess (`python -m fenced_k8s_lab.kubeapi`)
without changing code.
"""

from __future__ import annotations

import asyncio
import copy
import ipaddress
import json
import threading
import urllib.parse
import urllib.request
from typing import Any, Callable

from aiohttp import web

from .controls import State
from .server import make_app

__all__ = ["Emulator", "EmulatorControl", "check_loopback"]


def check_loopback(host: str) -> None:
    """The emulator has no authentication worth the name: never expose it beyond this machine."""
    try:
        ok = ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = host == "localhost"
    if not ok:
        raise ValueError(f"refusing to bind the Kubernetes API emulator to non-loopback host {host!r}")


class _Controls:
    """Control methods shared by Emulator and EmulatorControl (implemented via `_control`)."""

    def _control(self, name: str, *args: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def compact(self) -> str:
        """Forget watch history: watches resuming from any older resourceVersion get 410 Expired."""
        return self._control("compact")

    def close_watches(self) -> int:
        """End every open watch stream cleanly (as an apiserver restart or timeout would)."""
        return self._control("close_watches")

    def bookmark(self) -> int:
        """Send a BOOKMARK now to every watch opened with allowWatchBookmarks=true."""
        return self._control("bookmark")

    def add_fault(self, **spec: Any) -> int:
        """Inject a fault; see `controls.Fault` for fields. Returns its id."""
        return self._control("add_fault", spec)

    def faults(self) -> list[dict]:
        return self._control("list_faults")

    def clear_faults(self, fault_id: int | None = None) -> None:
        self._control("clear_faults", fault_id)

    def audit(self, since: int = 0) -> list[dict]:
        """Audit entries from index `since` on: who, verb, path, namespace, name, code, ..."""
        return self._control("audit", since)

    def clear_audit(self) -> None:
        self._control("clear_audit")

    def set_tokens(self, mapping: dict[str, str]) -> None:
        """Map bearer tokens to caller names used in the audit log and fault `who` filters."""
        self._control("set_tokens", dict(mapping))

    def append_log(self, namespace: str, pod: str, text: str | bytes, container: str | None = None) -> None:
        """Append to the text served by pods/log (per container, or pod-wide when container is None)."""
        self._control("append_log", namespace, pod, _bytes(text), container)

    def set_log(self, namespace: str, pod: str, text: str | bytes, container: str | None = None) -> None:
        self._control("set_log", namespace, pod, _bytes(text), container)

    def set_log_file(self, namespace: str, pod: str, path: str, container: str | None = None) -> None:
        """Serve pods/log from a file (read at each request), e.g. a kubelet's output file."""
        self._control("set_log_file", namespace, pod, str(path), container)

    def reset(self) -> None:
        """Drop all objects, history, logs, faults and audit entries (rv keeps counting)."""
        self._control("reset")

    def summary(self) -> dict:
        return self._control("summary")


def _bytes(text: str | bytes) -> bytes:
    return text.encode() if isinstance(text, str) else bytes(text)


class Emulator(_Controls):
    """A Kubernetes API emulator served from a background thread with its own event loop.

    >>> emu = Emulator(tokens={"tok-a": "scheduler-a"})
    >>> url = emu.start()            # "http://127.0.0.1:<free port>"
    >>> emu.write_kubeconfig("/tmp/kc", token="tok-a")
    >>> emu.stop()

    `name`, `supports_faults` and `ensure_namespace` make it one of the `kube_backend`s (tests/conftest.py)
    next to the real kube-apiserver (`lab.controlplane.ControlPlane`, name "real").
    """

    name = "emulator"
    supports_faults = True  # every fault: reads, drops, hangs, compaction, watch closing
    supports_write_faults = True  # the subset a real apiserver has too (controlplane.py, webhook.py)

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, history_size: int = 1000,
                 tokens: dict[str, str] | None = None, bookmark_interval: float = 60.0,
                 implicit_namespaces: bool = True):
        check_loopback(host)
        self.host, self.port = host, port
        self.state = State(history_size=history_size, tokens=tokens, bookmark_interval=bookmark_interval,
                           implicit_namespaces=implicit_namespaces)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.url: str | None = None

    # -- lifecycle
    async def _serve(self) -> None:
        self._runner = web.AppRunner(make_app(self.state), access_log=None, shutdown_timeout=1.0,
                                     handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{self.host}:{self.port}"

    def start(self) -> str:
        """Start serving; returns the base URL."""
        if self._thread is not None:
            return self.url  # type: ignore[return-value]
        ready = threading.Event()
        error: list[BaseException] = []

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._serve())
            except BaseException as exc:  # surface bind errors to start()
                error.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())  # type: ignore[union-attr]
            self._loop.close()

        self._thread = threading.Thread(target=run, name="kubeapi-emulator", daemon=True)
        self._thread.start()
        ready.wait(30)
        if error:
            self._thread = None
            raise error[0]
        return self.url  # type: ignore[return-value]

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self._call(self.state.close_watches)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(15)
        self._thread = None

    def __enter__(self) -> "Emulator":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- plumbing
    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._loop is None or self._thread is None:
            return fn(*args)

        async def run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(30)

    def _control(self, name: str, *args: Any) -> Any:
        return copy.deepcopy(self._call(getattr(self.state, name), *args))

    # -- conveniences for tests and the lab
    def pods(self, namespace: str | None = None) -> list[dict]:
        """Deep copies of the stored pods (all namespaces when namespace is None)."""
        return copy.deepcopy(self._call(self.state.store.list, "pods", namespace))

    def pod(self, namespace: str, name: str) -> dict | None:
        return copy.deepcopy(self._call(self.state.store.get, "pods", namespace, name))

    def leases(self, namespace: str | None = None) -> list[dict]:
        """Deep copies of the stored coordination.k8s.io/v1 Leases (all namespaces when None)."""
        return copy.deepcopy(self._call(self.state.store.list, "leases", namespace))

    def lease(self, namespace: str, name: str) -> dict | None:
        return copy.deepcopy(self._call(self.state.store.get, "leases", namespace, name))

    def ensure_namespace(self, name: str) -> None:
        """Create namespace `name` unless it exists (pods need it only with implicit_namespaces=False)."""
        from .objects import prepare_namespace

        def make() -> None:
            if self.state.store.get("namespaces", "", name) is None:
                body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
                self.state.store.write("namespaces", prepare_namespace(body, lambda n: False), None)

        self._call(make)

    def write_kubeconfig(self, path: str, token: str | None = None, namespace: str = "default") -> str:
        from ..kubeconfig import write_kubeconfig

        return write_kubeconfig(path, self.url, token=token, namespace=namespace)


class EmulatorControl(_Controls):
    """The same controls over HTTP, for an emulator running in another process."""

    def __init__(self, base_url: str, timeout: float = 30.0):
        self.base = base_url.rstrip("/") + "/_emulator/"
        self.timeout = timeout

    def _req(self, method: str, path: str, body: bytes | None = None, ctype: str = "application/json") -> bytes:
        req = urllib.request.Request(self.base + path, data=body, method=method, headers={"Content-Type": ctype})
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            return resp.read()

    def _post(self, path: str, payload: Any = None) -> dict:
        body = json.dumps(payload).encode() if payload is not None else b""
        return json.loads(self._req("POST", path, body))

    def _control(self, name: str, *args: Any) -> Any:
        q = urllib.parse.quote
        if name in ("compact", "close_watches", "bookmark", "reset"):
            out = self._post(name.replace("_", "-"))
            return {"compact": out.get("resourceVersion"), "close_watches": out.get("closed"),
                    "bookmark": out.get("watchers")}.get(name)
        if name == "add_fault":
            return self._post("faults", args[0])["ids"][0]
        if name == "list_faults":
            return json.loads(self._req("GET", "faults"))
        if name == "clear_faults":
            self._req("DELETE", "faults" + (f"/{args[0]}" if args[0] is not None else ""))
            return None
        if name == "audit":
            return json.loads(self._req("GET", f"audit?since={int(args[0])}"))
        if name == "clear_audit":
            self._req("DELETE", "audit")
            return None
        if name == "set_tokens":
            self._post("tokens", args[0])
            return None
        if name in ("append_log", "set_log"):
            ns, pod, data, container = args
            suffix = f"?container={q(container)}" if container else ""
            self._req("POST" if name == "append_log" else "PUT", f"logs/{q(ns)}/{q(pod)}{suffix}", data,
                      "application/octet-stream")
            return None
        if name == "set_log_file":
            ns, pod, path, container = args
            self._post(f"logfiles/{q(ns)}/{q(pod)}", {"path": path, "container": container})
            return None
        if name == "summary":
            return json.loads(self._req("GET", "state"))
        raise AttributeError(name)
