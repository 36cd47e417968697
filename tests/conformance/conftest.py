"""Conformance fixtures: the real `kubernetes` client against the emulator and a real apiserver.

By default every test runs twice, against two targets: `emulator` (a private emulator instance)
and `real` (the session's kube-apiserver v1.36.2 + etcd from envtest assets, see tests/conftest.py;
skipped with the reason when no assets are installed). Set CONFORMANCE_KUBECONFIG=/path/to/kubeconfig
to run them once, against that cluster (target `external`), instead.
Each test gets its own namespace, created and deleted by the fixture. Tests that need
emulator-only controls (compaction, read faults, drops, audit, log injection, on-demand bookmarks)
take the `emu` fixture and are skipped against a real apiserver; write faults run on both
(test_write_faults.py: the real apiserver's come from an admission webhook). Nothing else
differs between targets.

Pods use a scheduler name no scheduler serves, so on a real cluster they stay unbound (and are
never run) unless a test binds them or sets spec.nodeName itself (to a node that does not exist).
Where the emulator and a real apiserver disagree, the real apiserver is right.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import uuid

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from fenced_k8s_lab.kubeapi import Emulator

KUBECONFIG = os.environ.get("CONFORMANCE_KUBECONFIG")
TARGETS = ["external"] if KUBECONFIG else ["emulator", "real"]
TOKEN = "conformance"  # the real apiserver's static tokens equal the user names
FAKE_NODE = "conformance-no-such-node"
UNSCHEDULED = "conformance-no-such-scheduler"
PARTIAL_LIST = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
PARTIAL = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"
WAIT = 15.0  # generous: a loaded 2-core box, or a real cluster


@pytest.fixture(scope="session", params=TARGETS)
def target(request):
    """The API under test: a private Emulator, the session's real apiserver, or None (external)."""
    if request.param == "external":
        yield None
    elif request.param == "emulator":
        emu = Emulator(tokens={TOKEN: "conformance"})
        emu.start()
        yield emu
        emu.stop()
    else:
        yield request.getfixturevalue("envtest_session")


@pytest.fixture(scope="session")
def emulator(target):
    """The emulator when it is the target, else None."""
    return target if target is not None and target.name == "emulator" else None


@pytest.fixture
def emu(emulator):
    """The emulator's test controls; skips the test against a real apiserver."""
    if emulator is None:
        pytest.skip("needs emulator-only test controls (compaction, faults, audit, log injection, bookmarks)")
    return emulator


@pytest.fixture(scope="session")
def api_client(target, tmp_path_factory):
    path = KUBECONFIG or target.write_kubeconfig(str(tmp_path_factory.mktemp("kube") / "config"), token=TOKEN)
    c = config.new_client_from_config(config_file=path)
    yield c
    c.close()


@pytest.fixture(scope="session")
def v1(api_client) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


def _make_namespace(v1: client.CoreV1Api) -> str:
    name = "conf-" + uuid.uuid4().hex[:10]
    v1.create_namespace({"metadata": {"name": name, "labels": {"conformance.fenced.test/suite": "true"}}})
    return name


def _drop_namespace(v1: client.CoreV1Api, name: str) -> None:
    try:
        v1.delete_namespace(name, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture
def ns(v1):
    name = _make_namespace(v1)
    yield name
    _drop_namespace(v1, name)


@pytest.fixture(scope="module")
def module_ns(v1):
    name = _make_namespace(v1)
    yield name
    _drop_namespace(v1, name)


def pod_body(name=None, generate_name=None, labels=None, annotations=None, node=None, finalizers=None,
             containers=None, grace=None) -> dict:
    meta: dict = {}
    if name:
        meta["name"] = name
    if generate_name:
        meta["generateName"] = generate_name
    for key, value in (("labels", labels), ("annotations", annotations), ("finalizers", finalizers)):
        if value:
            meta[key] = value
    spec: dict = {"schedulerName": UNSCHEDULED, "restartPolicy": "Never", "automountServiceAccountToken": False,
                  "containers": containers or [{"name": "base", "image": "registry.invalid/conformance:1"}]}
    if node:
        spec["nodeName"] = node
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def create_pod(v1: client.CoreV1Api, ns: str, body: dict, **kwargs) -> client.V1Pod:
    """Create a pod, retrying only while a fresh namespace's default service account appears."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return v1.create_namespaced_pod(ns, body, **kwargs)
        except ApiException as exc:
            if exc.status == 403 and "serviceaccount" in (exc.body or "") and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            raise


@pytest.fixture
def make_pod(v1, ns):
    def make(name=None, **kwargs) -> client.V1Pod:
        if name is None and "generate_name" not in kwargs:
            name = "p-" + uuid.uuid4().hex[:8]
        return create_pod(v1, ns, pod_body(name=name, **kwargs))

    return make


def status_of(exc: ApiException) -> dict:
    """The kube Status body of an error response."""
    return json.loads(exc.body)


def read_log(v1: client.CoreV1Api, name: str, ns: str, **kwargs) -> str:
    """pods/log as text; like the provider, with _preload_content=False (the generated client
    would otherwise return str(bytes) for a text/plain body)."""
    return v1.read_namespaced_pod_log(name, ns, _preload_content=False, **kwargs).data.decode()


def raw(api_client, method: str, path: str, *, body=None, query=None, headers=None, timeout=WAIT):
    """A raw API call through the same client (auth, TLS); returns the urllib3 response."""
    hdrs = {"Accept": "application/json", "Content-Type": "application/json", **(headers or {})}
    try:
        return api_client.call_api(path, method, query_params=list((query or {}).items()), header_params=hdrs,
                                   body=body, auth_settings=["BearerToken"], _preload_content=False,
                                   _request_timeout=timeout, _return_http_data_only=True)
    except ApiException as exc:
        return exc


class Collector:
    """Runs watch.Watch().stream(...) in a thread and queues its events (or the exception)."""

    def __init__(self, func, *args, **kwargs):
        self.events: "queue.Queue[dict]" = queue.Queue()
        self.seen: list[dict] = []
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.watch = watch.Watch()
        kwargs.setdefault("timeout_seconds", 30)
        self._thread = threading.Thread(target=self._run, args=(func, args, kwargs), daemon=True)
        self._thread.start()

    def _run(self, func, args, kwargs) -> None:
        try:
            for event in self.watch.stream(func, *args, **kwargs):
                self.events.put(event)
        except BaseException as exc:  # surfaced to the test
            self.error = exc
        finally:
            self.done.set()

    def next(self, timeout: float = WAIT) -> dict:
        try:
            event = self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no watch event within {timeout}s (seen: {self.summary()}, error: {self.error})")
        self.seen.append(event)
        return event

    def until(self, predicate, timeout: float = WAIT) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            event = self.next(max(0.01, deadline - time.monotonic()))
            if predicate(event):
                return event

    def summary(self) -> list[tuple[str, str]]:
        return [(e["type"], _name(e)) for e in self.seen]

    def stop(self) -> None:
        self.watch.stop()
        resp = getattr(self.watch, "_resp", None)
        if resp is not None:
            try:
                resp.close()
            except Exception:
                pass


def _name(event: dict) -> str:
    obj = event.get("raw_object") or {}
    return (obj.get("metadata") or {}).get("name", "")


@pytest.fixture
def collectors():
    made: list[Collector] = []

    def start(func, *args, **kwargs) -> Collector:
        c = Collector(func, *args, **kwargs)
        made.append(c)
        return c

    yield start
    for c in made:
        c.stop()


@pytest.fixture(scope="session")
def h():
    """Helpers for tests (conftest modules are not importable by name across test folders)."""
    import types

    return types.SimpleNamespace(
        pod_body=pod_body, create_pod=create_pod, read_log=read_log, status_of=status_of, raw=raw, Collector=Collector,
        FAKE_NODE=FAKE_NODE, PARTIAL=PARTIAL, PARTIAL_LIST=PARTIAL_LIST, WAIT=WAIT, ApiException=ApiException,
    )


@pytest.fixture
def faults(target):
    """The target's fault controls (emulator or real); skips a target without write faults."""
    if target is None or not getattr(target, "supports_write_faults", False):
        pytest.skip("needs write faults (the emulator, or the real apiserver's admission webhook)")
    target.clear_faults()  # the target is the session's: start from none, whatever ran before on this worker
    yield target
    target.clear_faults()
