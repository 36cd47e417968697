"""Real parts shared by every test directory: one embedded PostgreSQL server started from the
cached migrated template, one Kubernetes API emulator (reset per test), and -- when envtest
assets are installed -- one real kube-apiserver v1.36.2 + etcd for the session.

`kube_backend` (session, parametrized "emulator" | "real") is the Kubernetes API a test runs
against. Both backends share this interface:

    backend.name                      # "emulator" | "real"
    backend.url                       # http://127.0.0.1:N (emulator) | https://127.0.0.1:N (real)
    backend.write_kubeconfig(path, token="scheduler-1", namespace="default") -> path
    backend.set_tokens({"scheduler-1": "scheduler-1"})   # real: no-op (token == user name,
                                      #   pre-provisioned: test, kubelet, conformance, lab, admin,
                                      #   kubelet-lab-node, scheduler-1..scheduler-200, ...; rbac-1..
                                      #   rbac-4 are not system:masters: real.grant(user, ns, rules))
    backend.ensure_namespace(name)    # real apiservers need namespaces to exist
    backend.audit(since=0)            # [{index, ts, who, verb, path, query, namespace, name,
                                      #   resource, subresource, code}]; real: pods and leases only,
                                      #   from the audit log (entries appear when the response completes)
    backend.reset()                   # emulator: drop everything; real: delete all non-system
                                      #   pods and leases at once, restart the audit view at index 0
    backend.leases(ns=None)           # the stored coordination.k8s.io/v1 Leases (dicts)
    backend.supports_faults           # True only for the emulator: read faults, drops, hangs,
    backend.compact() / close_watches()   #   compaction, watch closing (real: NotImplementedError)
    backend.supports_write_faults     # True for both: add_fault(method=POST|PATCH|PUT|DELETE,
    backend.add_fault(...) / clear_faults() / faults()   # path=, status=, delay=, who=, times=,
                                      #   after=); real: through an admission webhook
                                      #   (fenced_k8s_lab/webhook.py), reads raise NotImplementedError

The real backend is skipped, with the reason, when no assets are found: KUBEBUILDER_ASSETS (or,
when unset, ~/.cache/fenced-envtest/1.36.2) must hold executable `etcd` and `kube-apiserver`
(`export KUBEBUILDER_ASSETS=$(bash ../shared/envtest/install.sh)`).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import parallel

ROOT = Path(__file__).resolve().parents[1]

KUBE_BACKENDS = ["emulator", "real"]


@pytest.fixture(scope="session")
def pg_server():
    """One PostgreSQL server for the session, started from the cached migrated template."""
    from fenced_k8s_lab.postgres import start_from_template

    server = start_from_template()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def emulator_session():
    from fenced_k8s_lab.kubeapi import Emulator

    emu = Emulator()
    emu.start()
    yield emu
    emu.stop()


@pytest.fixture
def emulator(emulator_session):
    """The session emulator, reset for this test (objects, logs, faults, audit)."""
    emulator_session.reset()
    yield emulator_session
    emulator_session.clear_faults()


@pytest.fixture(scope="session")
def envtest_session():
    """A real kube-apiserver v1.36.2 + etcd for the session (skips when the assets are absent)."""
    from fenced_k8s_lab.controlplane import ControlPlane, find_assets

    assets, why = find_assets()
    if assets is None:
        pytest.skip(why)
    plane = ControlPlane(assets).start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session", params=KUBE_BACKENDS)
def kube_backend(request):
    """The Kubernetes API for this session: the emulator, or the real kube-apiserver (see module doc)."""
    return request.getfixturevalue("emulator_session" if request.param == "emulator" else "envtest_session")


@pytest.fixture
def kube(kube_backend):
    """`kube_backend`, reset for this test (faults cleared at teardown)."""
    kube_backend.reset()
    yield kube_backend
    kube_backend.clear_faults()


@pytest.fixture
def needs_faults(kube_backend):
    """Skip on a backend without on-demand faults, compaction and watch closing (the real apiserver)."""
    if not kube_backend.supports_faults:
        pytest.skip("needs emulator-only controls (read faults, dropped or hung connections, compaction, "
                    "close_watches); the real apiserver's webhook makes write faults only")


@pytest.fixture
def needs_write_faults(kube_backend):
    """Skip on a backend without write faults (add_fault on POST/PATCH/PUT/DELETE: status, delay)."""
    if not getattr(kube_backend, "supports_write_faults", False):
        pytest.skip("needs write faults (add_fault on POST/PATCH/PUT/DELETE); this backend has none")


# ------------------------------------------------------------------ parallel workers (parallel.py)
def pytest_configure(config):
    config.addinivalue_line("markers", "serial: runs alone, after every other test (one worker, the "
                                       "others stopped; tests/parallel.py)")


@pytest.hookimpl(tryfirst=True)  # before xdist names grouped tests by their group
def pytest_collection_modifyitems(config, items):
    """Tests on the real node run last, together: the node is up only for them (it costs two
    cores' worth of start-up and ~750 MiB), and nothing timing-sensitive runs beside it (with
    parallel workers: the ``serial`` group, alone after the others, parallel.py)."""
    on_node = [item for item in items if parallel.needs_node(item)]
    if on_node:
        items[:] = [item for item in items if item not in on_node] + on_node
    parallel.add_groups(config, items)
    parallel.write_groups(config, items)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    parallel.configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return parallel.make_scheduler(config, log)


def pytest_unconfigure(config):
    parallel.unconfigure(config)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report):
    parallel.strip_group(report)


@pytest.hookimpl(trylast=True)  # after the sections of tests/kind's
def pytest_sessionfinish(session):
    """On a worker: what the summary needs goes to the controller with the worker's end."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None and NODE_TIMINGS:
        out["node_timings"] = dict(NODE_TIMINGS)
    parallel.send_sections(session.config)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    NODE_TIMINGS.update(getattr(node, "workeroutput", {}).get("node_timings", {}))
    parallel.receive_sections(node.config, node)


# ------------------------------------------------------------------ the real node (../shared/node)
NODE_TIMINGS: dict[str, float] = {}


def pytest_terminal_summary(terminalreporter):
    parallel.write_sections(terminalreporter)
    if NODE_TIMINGS:
        terminalreporter.section("real node: seconds per step")
        terminalreporter.write_line(", ".join(f"{k} {v}" for k, v in NODE_TIMINGS.items()))


@pytest.fixture(scope="session")
def real_node():
    """A real single-node Kubernetes 1.36.2 for the session, started and taken down by us (or one
    already up, reused and left running). Skips with the reason when it cannot run here."""
    import json
    import os
    import time
    from pathlib import Path

    from fenced_k8s_lab import node as node_mod

    why = "NODE_TESTS=0" if os.environ.get("NODE_TESTS") == "0" else node_mod.skip_reason()
    if why:
        pytest.skip(why)
    node = node_mod.Node()
    t0 = time.monotonic()
    node.start()
    try:
        yield node
    finally:
        node.stop()
        NODE_TIMINGS.update(node.timings)
        NODE_TIMINGS["node total"] = round(time.monotonic() - t0, 1)
        out = Path(__file__).resolve().parents[1] / "out" / "node"
        out.mkdir(parents=True, exist_ok=True)
        (out / "timings.json").write_text(json.dumps(NODE_TIMINGS, indent=1))


def _timed(timings: dict, name: str, fn, *args, **kwargs):
    t0 = time.monotonic()
    try:
        return fn(*args, **kwargs)
    finally:
        timings[name] = round(time.monotonic() - t0, 1)


@pytest.fixture(scope="session")
def images(real_node):
    """The project image (Dockerfile target ``kind``) and the PostgreSQL image, built here and
    imported into the real node (tests/node and tests/kind)."""
    tars = [_timed(real_node.timings, f"build {what}", _build_image, *args) for what, args in
            (("project image", ["--target", "kind"]), ("postgres image", ["--postgres"]))]
    for tar in tars:
        real_node.load(tar)
    return tars


def _build_image(*args: str) -> str:
    """``fenced-k8s-repro image ARGS``: the Dockerfile on the stand-in base; the tar's path."""
    out = subprocess.run([sys.executable, "-m", "fenced_k8s_lab.image", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"image build {' '.join(args)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]
