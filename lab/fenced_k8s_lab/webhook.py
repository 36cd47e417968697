"""Write faults on a real kube-apiserver, produced by a real validating admission webhook.

The emulator injects faults itself; a real apiserver has no such switch, but it does call the
validating admission webhooks registered with it on every write it admits. This module is such a
webhook: an HTTPS server (stdlib, a daemon thread, a certificate from the control plane's own CA)
that answers `AdmissionReview` v1 for pods (CREATE, UPDATE, DELETE; the `status` and `binding`
subresources too) and for coordination.k8s.io leases outside kube-system by matching the
request against the active faults, exactly as the emulator matches them (`kubeapi.controls.Fault`:
method, path regex, who, times, after), then sleeping `delay` and allowing, or denying with the
fault's `status` code.

What the client sees (kube-apiserver v1.36, `ToStatusErr`): the HTTP status is the code the
webhook denies with (any code >= 400 passes through: 403, 404, 409, 429, 500, 503 ...), the
Status `reason` is ours (the emulator's for that code) and the message reads
`admission webhook "faults.fenced-lab.test" denied the request: injected fault N`. No Retry-After
header is sent (none is on the emulator either). A denied write is not carried out.

Where the apiserver decides before admission, the webhook is never asked (so the fault neither
fires nor counts): a DELETE or PATCH of a pod that does not exist (404), a DELETE whose UID
precondition fails (409), a second DELETE of a pod already terminating, requests the apiserver
rejects as invalid. A webhook sees no HTTP verb: PATCH and PUT both arrive as UPDATE, so a PATCH
or PUT fault matches either. Reads (GET, LIST, WATCH) never reach a webhook: they, connection
drops and persist-then-timeout stay emulator-only, and asking for them raises NotImplementedError.

The ValidatingWebhookConfiguration exists only while a fault is active, so every other test
pays nothing. Registering returns once the apiserver provably calls this webhook: a dry-run
create of a marked pod (a "probe") is polled until the webhook's denial carries the marker of
the configuration just written; clearing waits until the probe goes through unasked.
"""

from __future__ import annotations

import base64
import itertools
import json
import ssl
import threading
import time
import urllib.error
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .kubeapi.controls import Fault
from .kubeapi.errors import REASONS

__all__ = ["FaultWebhook", "CONFIG_NAME", "WEBHOOK_NAME", "LEASE_WEBHOOK_NAME", "TIMEOUT_SECONDS",
           "PROBE_ANNOTATION"]

CONFIG_NAME = "fenced-lab-faults"
WEBHOOK_NAME = "faults.fenced-lab.test"
LEASE_WEBHOOK_NAME = "lease-faults.fenced-lab.test"  # the same server, for coordination.k8s.io leases
TIMEOUT_SECONDS = 30  # the most the apiserver allows; a fault's delay must stay well under it
MAX_DELAY = TIMEOUT_SECONDS - 5
PROBE_ANNOTATION = "fenced-lab.test/webhook-probe"
PROBE_NAMESPACE = "default"
_OPERATIONS = {"CREATE": ("POST",), "DELETE": ("DELETE",), "UPDATE": ("PATCH", "PUT")}
_WRITES = {m for methods in _OPERATIONS.values() for m in methods}
_FIELDS = set(Fault.__dataclass_fields__) - {"id", "seen", "fired", "_rx"}


def request_path(req: dict) -> str:
    """The path the client sent, as the emulator matches it: a create's collection path, else the
    object's path with its subresource (/api/v1/... for pods, /apis/GROUP/VERSION/... for leases)."""
    ns, name, sub = req.get("namespace"), req.get("name"), req.get("subResource") or ""
    res = req["resource"]
    root = f"/apis/{res['group']}/{res['version']}" if res.get("group") else "/api/v1"
    base = f"{root}/namespaces/{ns}/{res['resource']}"
    if req["operation"] == "CREATE" and not sub:
        return base
    return f"{base}/{name}" + (f"/{sub}" if sub else "")


class FaultWebhook:
    """The webhook server and the fault table of one control plane (`ControlPlane` owns one)."""

    def __init__(self, plane: Any):
        self.plane = plane
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._ids = itertools.count(1)
        self._generation = 0  # in the URL the configuration names: the probe proves which one is live
        self.registered = False
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None
        self.register_seconds: list[float] = []  # how long each registration / removal waited

    # -- the HTTPS server
    def start(self) -> None:
        if self.server is not None:
            return
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(self.plane.pki["webhook_cert"]), str(self.plane.pki["webhook_key"]))
        server = _Server(("127.0.0.1", 0), _Handler)
        server.socket = ctx.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        server.webhook = self  # type: ignore[attr-defined]
        self.server = server
        self.thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                       name="fenced-fault-webhook", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        self.registered = False

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.server_address[1]

    # -- the fault table
    def add(self, spec: dict) -> int:
        unknown = set(spec) - _FIELDS
        if unknown:
            raise ValueError(f"unknown fault fields: {sorted(unknown)}")
        method = str(spec.get("method") or "*").upper()
        if method not in _WRITES:
            raise NotImplementedError(
                f"a {method} fault needs the emulator: an admission webhook sees only writes (POST = create, "
                f"PATCH/PUT = update, DELETE), never reads (GET, LIST, WATCH); check `supports_faults`")
        for what in ("drop", "persist_then_timeout", "hang_seconds"):
            if spec.get(what):
                raise NotImplementedError(f"`{what}` needs the emulator: a webhook can deny or delay a write, "
                                          f"not drop or hang the client's connection; check `supports_faults`")
        status = spec.get("status")
        if status is not None and not 400 <= int(status) <= 599:
            raise ValueError(f"status {status}: the apiserver turns a denial below 400 into 400")
        if float(spec.get("delay") or 0) > MAX_DELAY:
            raise ValueError(f"delay {spec['delay']} s: the webhook's timeoutSeconds is {TIMEOUT_SECONDS}")
        with self._lock:
            fault = Fault(**{**spec, "method": method}, id=next(self._ids))
            self._faults.append(fault)
        try:
            self.start()
            if not self.registered:
                self._register()
        except BaseException:
            self.clear(fault.id)
            raise
        return fault.id

    def faults(self) -> list[dict]:
        with self._lock:
            return [f.describe() for f in self._faults]

    def clear(self, fault_id: int | None = None) -> None:
        with self._lock:
            self._faults = [f for f in self._faults if fault_id is not None and f.id != fault_id]
            left = bool(self._faults)
        if not left and self.registered:
            self._unregister()

    # -- deciding one admission request
    def decide(self, req: dict, generation: str) -> dict:
        obj = req.get("object") or {}
        if ((obj.get("metadata") or {}).get("annotations") or {}).get(PROBE_ANNOTATION) is not None:
            return _deny(400, f"webhook-probe {generation}")
        methods = _OPERATIONS.get(req.get("operation"), ())
        if not methods:  # CONNECT: no rule asks for it
            return {"allowed": True}
        path, who = request_path(req), (req.get("userInfo") or {}).get("username", "")
        with self._lock:
            fault = next((f for f in self._faults
                          if f.take(f.method if f.method in methods else methods[0], path, who)), None)
        if fault is None:
            return {"allowed": True}
        if fault.delay:
            time.sleep(fault.delay)
        if fault.status is None:
            return {"allowed": True}
        return _deny(fault.status, fault.message or f"injected fault {fault.id}")

    # -- the configuration, and proof that the apiserver uses it (or no longer does)
    def _register(self) -> None:
        t0 = time.monotonic()
        self._generation += 1
        ca = base64.b64encode(self.plane.pki["ca"].read_bytes()).decode()
        config = {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": CONFIG_NAME},
            "webhooks": [{
                "name": WEBHOOK_NAME,
                "clientConfig": {"url": f"https://127.0.0.1:{self.port}/admit/{self._generation}", "caBundle": ca},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE", "DELETE"],
                           "resources": ["pods", "pods/status", "pods/binding"], "scope": "Namespaced"}],
                "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                "timeoutSeconds": TIMEOUT_SECONDS, "matchPolicy": "Equivalent",
            }, {
                # leases too, but not the apiserver's own (kube-system, kube-node-lease): they never wait on us
                "name": LEASE_WEBHOOK_NAME,
                "clientConfig": {"url": f"https://127.0.0.1:{self.port}/admit/{self._generation}", "caBundle": ca},
                "rules": [{"apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"],
                           "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["leases"],
                           "scope": "Namespaced"}],
                "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                                            "values": ["kube-system", "kube-node-lease"]}]},
                "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                "timeoutSeconds": TIMEOUT_SECONDS, "matchPolicy": "Equivalent",
            }],
        }
        path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
        self.plane._api("DELETE", f"{path}/{CONFIG_NAME}", ok=(404,))
        self.plane._api("POST", path, config)
        self.registered = True
        self._wait_probe(f"webhook-probe {self._generation}")
        self.register_seconds.append(time.monotonic() - t0)

    def _unregister(self) -> None:
        t0 = time.monotonic()
        self.plane._api("DELETE", f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/"
                                  f"{CONFIG_NAME}", ok=(404,))
        self.registered = False
        self._wait_probe(None)
        self.register_seconds.append(time.monotonic() - t0)

    def _wait_probe(self, marker: str | None, timeout: float = 30.0) -> None:
        """Poll a dry-run create of a marked pod until it is denied with `marker` (the webhook of
        this generation is called) or, with marker None, until no webhook denies it."""
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "fenced-webhook-probe", "annotations": {PROBE_ANNOTATION: "1"}},
                "spec": {"containers": [{"name": "probe", "image": "registry.invalid/probe:1"}]}}
        deadline = time.monotonic() + timeout
        seen = ""
        while True:
            try:
                self.plane.request("POST", f"/api/v1/namespaces/{PROBE_NAMESPACE}/pods?dryRun=All", body)
                seen = "allowed"
                if marker is None:
                    return
            except urllib.error.HTTPError as exc:
                seen = exc.read().decode(errors="replace")[:300]
                if marker is not None and exc.code == 400 and marker in seen:
                    return
                if marker is None and "webhook-probe" not in seen:  # answered without the webhook
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the apiserver did not {'start' if marker else 'stop'} calling the fault "
                                   f"webhook within {timeout}s (last probe: {seen})")
            time.sleep(0.05)


def _deny(code: int, message: str) -> dict:
    return {"allowed": False, "status": {"code": code, "reason": REASONS.get(code, ""), "message": message}}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: an answer the apiserver no longer waits for (its client gave up during a delay,
        so it cancelled the write) meets a closed connection; the audit log tells the outcome."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the apiserver reuses its connection

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        try:
            review = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            req = review["request"]
            decision = self.server.webhook.decide(req, self.path.rsplit("/", 1)[-1])  # type: ignore[attr-defined]
            out = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "response": {"uid": req["uid"], **decision}}
            data, code = json.dumps(out).encode(), 200
        except Exception as exc:  # a malformed review: the apiserver fails the write (failurePolicy Fail)
            data, code = json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode(), 400
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:  # quiet: the apiserver's audit log tells what happened
        pass
