"""A real Kubernetes control plane (etcd + kube-apiserver) for tests and the lab.

Assets are laid out as controller-runtime's envtest assets: one folder holding `etcd` and
`kube-apiserver`, named by KUBEBUILDER_ASSETS (`bash ../shared/envtest/install.sh` prints one;
its default destination, ~/.cache/fenced-envtest/1.36.2, is also looked at).

    from fenced_k8s_lab.controlplane import ControlPlane, find_assets

    assets, why = find_assets()            # (folder, None) or (None, reason)
    cp = ControlPlane(assets).start()      # free loopback ports, fresh etcd data dir, own PKI
    cp.write_kubeconfig(path, token="scheduler-1", namespace="default")
    cp.ensure_namespace("airflow")
    cp.audit(since=0)                      # the emulator's audit shape, from the audit log
    cp.stop()                              # SIGTERM then SIGKILL, by PID

Each start generates a CA, a serving certificate for 127.0.0.1/localhost, a service-account
key pair and a static token file: every user in `users` has the token equal to its name and
the group system:masters (the tests attribute requests by user name, as with the emulator);
the users in `rbac_users` (`RBAC_USERS`: rbac-1..rbac-4) are in the plain group `RBAC_GROUP`
only, so they may do exactly what RBAC grants them (`grant(user, namespace, rules)`).
The audit policy logs pods (and pods/* subresources) and coordination.k8s.io leases at level
Metadata, nothing else (not the apiserver's own identity leases); entries are JSON lines mapped
to {index, ts, who, verb, path, query, namespace, name, resource, subresource, code}. The
processes get PR_SET_PDEATHSIG, so they die with the process that started them even if it is
SIGKILLed (start the plane from the main thread).

Write faults (`add_fault` with method POST, PATCH/PUT or DELETE: a status code and/or a delay,
`who`, `times`, `after`) come from a real validating admission webhook (`webhook.py`), registered
only while a fault is active: `supports_write_faults` is True. What a real apiserver cannot do on
demand (read faults, dropped connections, 410 compaction, watch closing, log injection,
bookmarks) stays with the emulator: `supports_faults` is False here and those controls raise.
"""

from __future__ import annotations

import base64
import ctypes
import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["ControlPlane", "ExternalCluster", "Shared", "open_backend", "find_assets", "DEFAULT_ASSETS",
           "DEFAULT_USERS", "RBAC_USERS", "RBAC_GROUP", "ADMIN"]

DEFAULT_ASSETS = Path(os.environ.get("HOME") or "/root") / ".cache" / "fenced-envtest" / "1.36.2"
ADMIN = "admin"  # the fixture's own user (namespaces, reset); filtered out of nothing
_LAB_ROLES = ["api-server", "dag-processor", "triggerer"] + [f"scheduler-{i}" for i in range(0, 201)]
DEFAULT_USERS = (
    [ADMIN, "test", "kubelet", "conformance", "lab"]
    + [f"kubelet-{n}" for n in ("lab-node", "lab-node-2", "node-1", "node-2", "node-3", "node-4")]
    + _LAB_ROLES + [f"neighbour-{r}" for r in _LAB_ROLES[:13]]
    + [f"scheduler-{c}" for c in "abcd"]
)
RBAC_USERS = tuple(f"rbac-{i}" for i in range(1, 5))  # not system:masters: only what a Role grants
RBAC_GROUP = "fenced-lab:rbac"
LEASES = "/apis/coordination.k8s.io/v1"
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})

AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "resources": [{"group": "", "resources": ["pods", "pods/*"]}]},
        {"level": "None", "users": ["system:apiserver"],  # its own identity leases in kube-system, every 10 s
         "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
        {"level": "Metadata", "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
        {"level": "None"},
    ],
}


def find_assets(folder: str | os.PathLike | None = None) -> tuple[Path | None, str | None]:
    """(assets folder, None) when it holds executable etcd and kube-apiserver, else (None, reason).

    Looks at `folder`, else KUBEBUILDER_ASSETS, else DEFAULT_ASSETS (install.sh's default)."""
    candidates: list[tuple[str, Path]] = []
    if folder:
        candidates.append(("folder", Path(folder)))
    elif os.environ.get("KUBEBUILDER_ASSETS"):
        candidates.append(("KUBEBUILDER_ASSETS", Path(os.environ["KUBEBUILDER_ASSETS"])))
    else:
        candidates.append(("default install dir", DEFAULT_ASSETS))
    source, path = candidates[0]
    missing = [b for b in ("etcd", "kube-apiserver") if not os.access(path / b, os.X_OK)]
    if missing:
        hint = "" if source != "default install dir" else " (KUBEBUILDER_ASSETS unset)"
        return None, (f"no real kube-apiserver: {source} {path}{hint} lacks {' and '.join(missing)}; "
                      f"run `export KUBEBUILDER_ASSETS=$(bash ../shared/envtest/install.sh)`")
    return path, None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


# -- PKI --------------------------------------------------------------------------------------

def make_pki(folder: Path) -> dict[str, Path]:
    """CA, serving certs (the apiserver's: SAN 127.0.0.1, localhost, kubernetes.default...; the fault
    webhook's: SAN 127.0.0.1), SA key pair; PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    pem_key = lambda k: k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,  # noqa: E731
                                        serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fenced-envtest-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=7))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))

    def serving(common_name: str, sans: list) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
                .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=7))
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        return key, cert

    loopback = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
    key, cert = serving("kube-apiserver", [
        loopback, x509.IPAddress(ipaddress.ip_address("10.96.0.1")), x509.DNSName("localhost"),
        x509.DNSName("kubernetes"), x509.DNSName("kubernetes.default"), x509.DNSName("kubernetes.default.svc")])
    hook_key, hook_cert = serving("fenced-fault-webhook", [loopback])  # the admission webhook (webhook.py)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    files = {
        "ca": (folder / "ca.crt", ca.public_bytes(serialization.Encoding.PEM)),
        "cert": (folder / "apiserver.crt", cert.public_bytes(serialization.Encoding.PEM)),
        "key": (folder / "apiserver.key", pem_key(key)),
        "webhook_cert": (folder / "webhook.crt", hook_cert.public_bytes(serialization.Encoding.PEM)),
        "webhook_key": (folder / "webhook.key", pem_key(hook_key)),
        "sa_key": (folder / "sa.key", pem_key(sa_key)),
        "sa_pub": (folder / "sa.pub", sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)),
    }
    for path, data in files.values():
        path.write_bytes(data)
        os.chmod(path, 0o600)
    return {k: p for k, (p, _) in files.items()}


# -- the control plane ------------------------------------------------------------------------

class ControlPlane:
    """etcd + kube-apiserver on free loopback ports; the `kube_backend` interface (name "real")."""

    name = "real"
    supports_faults = False  # reads, drops, compaction, watch closing: the emulator's alone
    supports_write_faults = True  # through the admission webhook (webhook.py)

    def __init__(self, assets: str | os.PathLike | None = None, workdir: str | os.PathLike | None = None, *,
                 users: list[str] | tuple[str, ...] = tuple(DEFAULT_USERS),
                 rbac_users: list[str] | tuple[str, ...] = RBAC_USERS, start_timeout: float = 90.0,
                 extra_args: list[str] | None = None):
        found, why = find_assets(assets)
        if found is None:
            raise FileNotFoundError(why)
        self.assets = found
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="fenced-envtest-"))
        self.rbac_users = [u for u in dict.fromkeys(rbac_users) if u not in users]
        self.users = list(dict.fromkeys(users)) + self.rbac_users
        self.start_timeout = start_timeout
        self.extra_args = list(extra_args or [])
        self.url: str | None = None
        self.etcd: subprocess.Popen | None = None
        self.apiserver: subprocess.Popen | None = None
        self.pki: dict[str, Path] = {}
        self.startup_seconds: float | None = None
        self._audit_lock = threading.Lock()
        self._audit_entries: list[dict] = []
        self._audit_pos = 0
        self._audit_base = 0
        self._audit_started: set[str] = set()
        self._ssl: ssl.SSLContext | None = None
        self._webhook = None  # webhook.FaultWebhook, made on the first add_fault

    # -- lifecycle
    def start(self) -> "ControlPlane":
        if self.apiserver is not None:
            return self
        t0 = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def _start(self) -> None:
        w = self.workdir
        w.mkdir(parents=True, exist_ok=True)
        self.pki = make_pki(w)
        self._ssl = ssl.create_default_context(cafile=str(self.pki["ca"]))
        shm = Path("/dev/shm")
        self._etcd_dir = Path(tempfile.mkdtemp(prefix="fenced-etcd-", dir=shm if shm.is_dir() else w))
        (w / "tokens.csv").write_text("".join(
            f"{u},{u},{u},{RBAC_GROUP if u in self.rbac_users else 'system:masters'}\n" for u in self.users))
        (w / "audit-policy.json").write_text(json.dumps(AUDIT_POLICY))
        self.audit_path = w / "audit.log"

        client, peer = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{client}"
        self.etcd = self._spawn("etcd", [
            str(self.assets / "etcd"), "--name", "default", "--data-dir", str(self._etcd_dir / "data"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}", "--initial-cluster", f"default=http://127.0.0.1:{peer}",
            "--logger", "zap", "--log-level", "warn", "--quota-backend-bytes", str(2 * 1024 ** 3),
        ])
        self._wait("etcd", self.etcd, lambda: json.loads(self._get(f"{etcd_url}/health")).get("health") == "true")

        port = free_port()
        self.url = f"https://127.0.0.1:{port}"
        self.apiserver = self._spawn("kube-apiserver", [
            str(self.assets / "kube-apiserver"), f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", f"--secure-port={port}", "--advertise-address=127.0.0.1",
            f"--cert-dir={w}", f"--tls-cert-file={self.pki['cert']}", f"--tls-private-key-file={self.pki['key']}",
            f"--service-account-key-file={self.pki['sa_pub']}",
            f"--service-account-signing-key-file={self.pki['sa_key']}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.96.0.0/16", "--endpoint-reconciler-type=none",
            "--disable-admission-plugins=ServiceAccount", f"--token-auth-file={w / 'tokens.csv'}",
            "--authorization-mode=RBAC", "--allow-privileged=true", "--profiling=false",
            f"--audit-policy-file={w / 'audit-policy.json'}", f"--audit-log-path={self.audit_path}",
            "--audit-log-format=json", "--audit-log-mode=blocking", "--audit-log-maxsize=0",
            "--audit-log-maxbackup=0", "--audit-log-maxage=0", "--v=0",
            *self.extra_args,
        ])
        self._wait("kube-apiserver", self.apiserver, lambda: self._get(f"{self.url}/readyz", ADMIN) == "ok")
        self.kubeconfig = self.write_kubeconfig(w / "admin.kubeconfig", token=ADMIN)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "ab")
        try:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=self.workdir, preexec_fn=_die_with_parent, close_fds=True)
        finally:
            log.close()

    def _wait(self, name: str, proc: subprocess.Popen, ready) -> None:
        deadline = time.monotonic() + self.start_timeout
        last: Any = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode} during start-up:\n{self._tail(name)}")
            try:
                if ready():
                    return
            except Exception as exc:  # not up yet
                last = exc
            time.sleep(0.2)
        raise TimeoutError(f"{name} not ready within {self.start_timeout}s (last: {last}):\n{self._tail(name)}")

    def _tail(self, name: str, lines: int = 30) -> str:
        try:
            return "\n".join((self.workdir / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop kube-apiserver then etcd by PID (SIGTERM, then SIGKILL after 10 s); drop the data."""
        if self._webhook is not None:
            self._webhook.stop()
            self._webhook = None
        for attr in ("apiserver", "etcd"):
            proc: subprocess.Popen | None = getattr(self, attr)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
            setattr(self, attr, None)
        etcd_dir = getattr(self, "_etcd_dir", None)
        if etcd_dir is not None:
            shutil.rmtree(etcd_dir, ignore_errors=True)
            self._etcd_dir = None
        if self._own_workdir and not os.environ.get("FENCED_ENVTEST_KEEP"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "ControlPlane":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in (self.etcd, self.apiserver) if p is not None]

    # -- HTTP plumbing (stdlib only: usable without the kubernetes client)
    def _get(self, url: str, token: str | None = None) -> str:
        return self.request("GET", url, token=token)

    def request(self, method: str, path_or_url: str, body: Any = None, *, token: str | None = ADMIN,
                content_type: str = "application/json", timeout: float = 30.0) -> str:
        url = path_or_url if "://" in path_or_url else f"{self.url}{path_or_url}"
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        headers = {"Accept": "application/json", "Content-Type": content_type}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        ctx = self._ssl if url.startswith("https:") else None
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
            return resp.read().decode()

    def _api(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (),
             content_type: str = "application/json") -> dict | None:
        try:
            return json.loads(self.request(method, path, body, content_type=content_type) or "null")
        except urllib.error.HTTPError as exc:
            if exc.code in ok:
                return None
            raise RuntimeError(f"{method} {path}: {exc.code} {exc.read()[:500]!r}") from exc

    # -- the backend interface shared with the emulator
    def write_kubeconfig(self, path: str | os.PathLike, token: str | None = None, namespace: str = "default") -> str:
        """A kubeconfig naming https://127.0.0.1:N, the generated CA and `token` (a user name)."""
        ca = base64.b64encode(self.pki["ca"].read_bytes()).decode()
        user = token or ADMIN
        cfg = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "envtest", "cluster": {"server": self.url, "certificate-authority-data": ca}}],
            "users": [{"name": user, "user": {"token": user}}],
            "contexts": [{"name": user, "context": {"cluster": "envtest", "user": user, "namespace": namespace}}],
            "current-context": user, "preferences": {},
        }
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(cfg, fh, indent=2)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
        return path

    def set_tokens(self, mapping: dict[str, str]) -> None:
        """No-op: tokens are the pre-provisioned user names (`users`). Unknown ones would get 401."""
        unknown = sorted(set(mapping) - set(self.users))
        if unknown:
            raise ValueError(f"tokens not provisioned on the real apiserver (token == user name): {unknown[:5]}")

    def ensure_namespace(self, name: str) -> None:
        self._api("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                  ok=(409,))

    def reset(self) -> None:
        """Delete every pod and lease outside the system namespaces at once (finalizers dropped,
        grace 0); start the audit view afresh (audit indexes restart at 0, as after an emulator
        reset); faults cleared, as the emulator's reset clears them."""
        self.clear_faults()
        for prefix, plural in (("/api/v1", "pods"), (LEASES, "leases")):
            for obj in (self._api("GET", f"{prefix}/{plural}") or {}).get("items", []):
                meta = obj["metadata"]
                if meta["namespace"] in SYSTEM_NAMESPACES:
                    continue
                base = f"{prefix}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"
                if meta.get("finalizers"):
                    self._api("PATCH", base, {"metadata": {"finalizers": None}}, ok=(404,),
                              content_type="application/merge-patch+json")
                self._api("DELETE", base, {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                                           "preconditions": {"uid": meta["uid"]}}, ok=(404, 409))
        with self._audit_lock:
            self._read_audit()
            self._audit_base = len(self._audit_entries)

    def audit(self, since: int = 0) -> list[dict]:
        """Pod and lease requests from the kube-apiserver audit log, in the emulator's shape."""
        with self._audit_lock:
            self._read_audit()
            out = self._audit_entries[self._audit_base + since:]
            return [dict(e, index=i) for i, e in enumerate(out, start=since)]

    def clear_audit(self) -> None:
        with self._audit_lock:
            self._read_audit()
            self._audit_base = len(self._audit_entries)

    def _read_audit(self) -> None:
        try:
            with open(self.audit_path, "rb") as fh:
                fh.seek(self._audit_pos)
                chunk = fh.read()
        except (OSError, AttributeError):
            return
        end = chunk.rfind(b"\n") + 1  # complete lines only
        self._audit_pos += end
        for line in chunk[:end].splitlines():
            if line.strip():
                entry = self._audit_entry(json.loads(line))
                if entry is not None:
                    self._audit_entries.append(entry)

    def _audit_entry(self, ev: dict) -> dict | None:
        who = (ev.get("user") or {}).get("username")
        if who == "system:apiserver":  # the apiserver's own watch cache reflector
            return None
        if who == ADMIN and "dryRun=" in ev.get("requestURI", ""):  # the fault webhook's probes
            return None
        audit_id, stage = ev.get("auditID"), ev.get("stage")
        if stage == "ResponseStarted":  # long-running (watch, log follow): record at start
            self._audit_started.add(audit_id)
        elif stage == "ResponseComplete" and audit_id in self._audit_started:
            self._audit_started.discard(audit_id)
            return None
        ref = ev.get("objectRef") or {}
        uri = ev.get("requestURI", "")
        parsed = urllib.parse.urlsplit(uri)
        ts = ev.get("stageTimestamp") or ev.get("requestReceivedTimestamp")
        try:
            when = datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
        except Exception:
            when = None
        entry = {
            "ts": when, "who": who, "verb": ev.get("verb"),
            "path": parsed.path, "query": dict(urllib.parse.parse_qsl(parsed.query)),
            "namespace": ref.get("namespace"), "name": ref.get("name"), "resource": ref.get("resource"),
            "subresource": ref.get("subresource"), "code": (ev.get("responseStatus") or {}).get("code"),
        }
        return entry

    def pods(self, namespace: str | None = None) -> list[dict]:
        """The stored pods (all namespaces when namespace is None), as the emulator's `pods()`."""
        path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        items = (self._api("GET", path) or {}).get("items", [])
        return [{"kind": "Pod", "apiVersion": "v1", **p} for p in items]

    def pod(self, namespace: str, name: str) -> dict | None:
        return self._api("GET", f"/api/v1/namespaces/{namespace}/pods/{name}", ok=(404,))

    def leases(self, namespace: str | None = None) -> list[dict]:
        """The stored Leases (all namespaces when namespace is None), as the emulator's `leases()`."""
        path = f"{LEASES}/namespaces/{namespace}/leases" if namespace else f"{LEASES}/leases"
        items = (self._api("GET", path) or {}).get("items", [])
        return [{"kind": "Lease", "apiVersion": "coordination.k8s.io/v1", **x} for x in items]

    def lease(self, namespace: str, name: str) -> dict | None:
        return self._api("GET", f"{LEASES}/namespaces/{namespace}/leases/{name}", ok=(404,))

    # -- RBAC for the users outside system:masters
    def grant(self, user: str, namespace: str, rules: list[dict], timeout: float = 30.0) -> None:
        """Bind `user` (one of `rbac_users`) exactly `rules` in `namespace` (a Role and RoleBinding
        named fenced-lab-<user>, replacing earlier ones); returns once the authorizer applies them."""
        if user not in self.rbac_users:
            raise ValueError(f"{user!r} is not an RBAC user of this control plane ({self.rbac_users}); "
                             f"the others are system:masters and may do anything")
        name, base = f"fenced-lab-{user}", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
        role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": name, "namespace": namespace}, "rules": rules}
        binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": name, "namespace": namespace},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}
        for kind, body in (("roles", role), ("rolebindings", binding)):
            self._api("DELETE", f"{base}/{kind}/{name}", ok=(404,))
            self._api("POST", f"{base}/{kind}", body)
        want = [(verb, group, resource) for rule in rules for verb in rule.get("verbs", [])
                for group in rule.get("apiGroups", [""]) for resource in rule.get("resources", [])
                if "*" not in (verb, group, resource)]
        deadline = time.monotonic() + timeout
        while want and not all(self._allowed(user, namespace, *w) for w in want):
            if time.monotonic() > deadline:
                raise TimeoutError(f"RBAC rules for {user} in {namespace} not in effect within {timeout}s")
            time.sleep(0.05)

    def _allowed(self, user: str, namespace: str, verb: str, group: str, resource: str) -> bool:
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
            "user": user, "groups": [RBAC_GROUP, "system:authenticated"],
            "resourceAttributes": {"namespace": namespace, "verb": verb, "group": group, "resource": resource}}}
        out = self._api("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review) or {}
        return bool((out.get("status") or {}).get("allowed"))

    # -- write faults, through the admission webhook (webhook.py)
    def add_fault(self, **spec: Any) -> int:
        """A write fault, as the emulator's `add_fault` (method POST/PATCH/PUT/DELETE, path regex,
        status, delay, who, times, after); returns once the apiserver calls the webhook. Read
        faults, drops and hangs raise NotImplementedError."""
        if self._webhook is None:
            from .webhook import FaultWebhook

            self._webhook = FaultWebhook(self)
        return self._webhook.add(spec)

    def clear_faults(self, fault_id: int | None = None) -> None:
        """Drop one fault or all; with none left the webhook is unregistered (and no longer called)."""
        if self._webhook is not None:
            self._webhook.clear(fault_id)

    def faults(self) -> list[dict]:
        return self._webhook.faults() if self._webhook is not None else []

    # -- emulator-only controls
    def _unsupported(self, *_: Any, **__: Any) -> Any:
        raise NotImplementedError("the real kube-apiserver has no compaction, watch closing or log injection "
                                  "on demand: check `supports_faults` and use the emulator")

    compact = close_watches = bookmark = append_log = set_log = set_log_file = _unsupported

    def summary(self) -> dict:
        return {"url": self.url, "pids": self.pids, "startup_seconds": self.startup_seconds,
                "audit": len(self._audit_entries) - self._audit_base}


class ExternalCluster:
    """An existing cluster (e.g. kind) named by a kubeconfig, behind the backend interface.

    Kubeconfigs written for the lab reuse the file's credentials (tokens cannot be minted, so
    every lab process is the same caller) with the namespace changed; no audit log is readable
    (`audit()` is empty: the lab reads who deleted what from the schedulers' logs instead) and
    there are no faults. Its own kubelet runs the pods (``runs_pods``: ``lab/workers.py``).
    ``stop()`` deletes the namespaces the lab created, and only those."""

    name = "external"
    supports_faults = False
    supports_write_faults = False
    runs_pods = True

    def __init__(self, kubeconfig: str | os.PathLike, context: str | None = None):
        import yaml

        self.path = Path(kubeconfig).expanduser().resolve()
        self.config = yaml.safe_load(self.path.read_text())
        self.context = context or self.config.get("current-context")
        ctx = next((c for c in self.config.get("contexts") or [] if c["name"] == self.context), None)
        if ctx is None:
            raise ValueError(f"{self.path}: no context {self.context!r}")
        cluster = next(c for c in self.config["clusters"] if c["name"] == ctx["context"]["cluster"])
        self.url = cluster["cluster"]["server"]
        self._core = None
        self._namespaces: set[str] = set()
        self._created: set[str] = set()

    def _v1(self):
        if self._core is None:
            from kubernetes import client, config

            self._core = client.CoreV1Api(config.new_client_from_config(config_file=str(self.path),
                                                                        context=self.context))
        return self._core

    def start(self) -> "ExternalCluster":
        self._v1().get_api_resources()  # fail early when the cluster is unreachable
        return self

    def stop(self) -> None:
        from kubernetes.client.exceptions import ApiException

        for ns in sorted(self._created):
            try:
                self._v1().delete_namespace(ns)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        self._created.clear()

    def write_kubeconfig(self, path: str | os.PathLike, token: str | None = None, namespace: str = "default") -> str:
        cfg = json.loads(json.dumps(self.config, default=str))
        base = self.path.parent
        for section, keys in (("clusters", ("certificate-authority",)),
                              ("users", ("client-certificate", "client-key", "tokenFile"))):
            for entry in cfg.get(section) or []:
                inner = entry.get(section[:-1]) or {}
                for key in keys:
                    if inner.get(key) and not os.path.isabs(inner[key]):
                        inner[key] = str(base / inner[key])
        cfg["current-context"] = self.context
        for c in cfg.get("contexts") or []:
            if c["name"] == self.context:
                c["context"]["namespace"] = namespace
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as fh:
            json.dump(cfg, fh, indent=2)
        os.chmod(path, 0o600)
        return path

    def set_tokens(self, mapping: dict[str, str]) -> None:
        pass

    def ensure_namespace(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        self._namespaces.add(name)
        try:
            self._v1().create_namespace({"metadata": {"name": name}})
            self._created.add(name)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def pods(self, namespace: str | None = None) -> list[dict]:
        v1 = self._v1()
        resp = (v1.list_namespaced_pod(namespace, _preload_content=False) if namespace
                else v1.list_pod_for_all_namespaces(_preload_content=False))
        return [{"kind": "Pod", "apiVersion": "v1", **p} for p in json.loads(resp.data).get("items", [])]

    def leases(self, namespace: str | None = None) -> list[dict]:
        from kubernetes import client

        api = client.CoordinationV1Api(self._v1().api_client)
        resp = (api.list_namespaced_lease(namespace, _preload_content=False) if namespace
                else api.list_lease_for_all_namespaces(_preload_content=False))
        return [{"kind": "Lease", "apiVersion": "coordination.k8s.io/v1", **x}
                for x in json.loads(resp.data).get("items", [])]

    def audit(self, since: int = 0) -> list[dict]:
        return []

    def reset(self, timeout: float = 120) -> None:
        """Delete the pods and leases of the namespaces the lab made sure of (grace 0), nothing else,
        and wait until the pods are gone (a real kubelet stops their containers first)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        for ns in sorted(self._namespaces):
            client.CoordinationV1Api(self._v1().api_client).delete_collection_namespaced_lease(ns)
            for pod in self.pods(ns):
                try:
                    self._v1().delete_namespaced_pod(pod["metadata"]["name"], ns, body={"gracePeriodSeconds": 0})
                except ApiException as exc:
                    if exc.status != 404:
                        raise
        deadline = time.monotonic() + timeout
        while any(self.pods(ns) for ns in self._namespaces) and time.monotonic() < deadline:
            time.sleep(1)

    def clear_faults(self, fault_id: int | None = None) -> None:
        pass

    def faults(self) -> list[dict]:
        return []

    def _unsupported(self, *_: Any, **__: Any) -> Any:
        raise NotImplementedError("an external cluster has no on-demand faults, compaction or watch closing")

    add_fault = compact = close_watches = bookmark = append_log = set_log = set_log_file = _unsupported


class Shared:
    """A backend lent to code that starts and stops what it is given (the lab runner, once per
    run): start() resets it (pods of earlier runs deleted, audit view restarted), stop() does nothing."""

    def __init__(self, backend: Any):
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def start(self) -> Any:
        self._backend.reset()
        return self

    def stop(self) -> None:
        pass


def open_backend(kind: str = "emulator", kubeconfig: str | os.PathLike | None = None) -> Any:
    """A started backend: "emulator" (in-process), "real" (etcd + kube-apiserver from the envtest
    assets), or an existing cluster when `kubeconfig` is given. The caller stops it."""
    if kubeconfig:
        return ExternalCluster(kubeconfig).start()
    if kind == "real":
        return ControlPlane().start()
    if kind == "emulator":
        from .kubeapi import Emulator

        emu = Emulator()
        emu.start()
        return emu
    raise ValueError(f"unknown Kubernetes backend {kind!r} (emulator, real)")


def main(argv: list[str] | None = None) -> int:
    """`python -m fenced_k8s_lab.controlplane [--kubeconfig PATH]`: run until Ctrl-C."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--assets", default=None)
    p.add_argument("--kubeconfig", default=None, help="write an admin kubeconfig here")
    args = p.parse_args(argv)
    cp = ControlPlane(args.assets).start()
    try:
        if args.kubeconfig:
            cp.write_kubeconfig(args.kubeconfig, token=ADMIN)
        print(f"READY {cp.url} kubeconfig={args.kubeconfig or cp.kubeconfig} "
              f"started in {cp.startup_seconds:.1f}s", flush=True)
        done = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: done.set())
        while not done.wait(1.0):
            pass
    finally:
        cp.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
