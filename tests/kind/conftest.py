"""Gating and fixtures for the HA scenarios on a real cluster (tests/kind; docs/kind.md).

Everything here is skipped at collection, with the reason, unless ``KIND_TESTS=1``. Then:

* ``KUBECONFIG`` set: that cluster (a kind cluster on a laptop, or any other). It must answer and
  hold the images the install names (``localhost/fenced-k8s-executor:dev``,
  ``localhost/fenced/postgres:15``) on a node; skipped with the reason otherwise.
* ``KUBECONFIG`` unset: the real node of ../shared/node through ``real_node`` (tests/conftest.py:
  started for the session and taken down after it, or one already up reused), with the images
  built here and imported (``images``). Skipped with the reason where the node cannot run.

Per flavour (stock, then fenced; ``KIND_FLAVOUR`` runs one), the official chart is installed
with ``helm-values/<flavour>-ha.yaml`` + ``kind-config/node/values.yaml`` into the namespace
``airflow-<flavour>`` (``lab/fenced_k8s_lab/chart.py``), the flavour's tests run, and the
namespace is deleted. ``KIND_AIRFLOW_URL`` overrides the api-server address (default: its
ClusterIP Service, reachable from the node's host; on kind use the NodePort mapping,
http://127.0.0.1:8080). Each scenario writes out/kind/report-<scenario>-<flavour>.json; the
terminal summary prints this session's reports side by side and the seconds of each step.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from fenced_k8s_lab.chart import CHART, POSTGRES_IMAGE, Cluster, Install, RestApi, api_server_url, diagnostics

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = ROOT / "out" / "kind"
PROJECT_IMAGE = "localhost/fenced-k8s-executor:dev"  # kind-config/node/values.yaml
DAG_ID = "fenced_repro"  # baked into the image by the Dockerfile's "kind" target
FLAVOURS = ("stock", "fenced")
SESSION_T0 = time.time()
TIMINGS: dict[str, float] = {}


# --------------------------------------------------------------------------- gating
def _cluster_reason(kubeconfig: str) -> str | None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return "kubectl not on PATH"
    try:
        nodes = json.loads(Cluster(kubeconfig, kubectl).run("get", "nodes", "-o", "json", timeout=20))["items"]
    except Exception as exc:
        return f"the cluster of KUBECONFIG={kubeconfig} does not answer: {str(exc)[:300]}"
    held = {name for node in nodes for image in node.get("status", {}).get("images") or []
            for name in image.get("names") or []}
    missing = [image for image in (PROJECT_IMAGE, POSTGRES_IMAGE) if image not in held]
    if missing:
        return f"the cluster of KUBECONFIG={kubeconfig} answers but no node holds {', '.join(missing)} (docs/kind.md)"
    return None


def _skip_reason() -> str | None:
    if os.environ.get("KIND_TESTS") != "1":
        return "KIND_TESTS=1 not set (HA scenarios on a real cluster, ~20 min on the real node; docs/kind.md)"
    if not (CHART / "Chart.yaml").is_file():
        return f"no chart source at {CHART}"
    if os.environ.get("KUBECONFIG"):
        return _cluster_reason(os.environ["KUBECONFIG"])
    from fenced_k8s_lab import node as node_mod

    why = "NODE_TESTS=0" if os.environ.get("NODE_TESTS") == "0" else node_mod.skip_reason()
    return f"no KUBECONFIG, and no real node here: {why}" if why else None


_REASON: list[str | None] = []


def kind_skip_reason() -> str | None:
    if not _REASON:
        _REASON.append(_skip_reason())
    return _REASON[0]


def pytest_collection_modifyitems(config, items):
    ours = [item for item in items if HERE in Path(str(item.fspath)).resolve().parents]
    if not ours:
        return
    reason = kind_skip_reason()
    for item in ours:
        item.add_marker(pytest.mark.kind)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
    if not reason:  # last, with the other tests on the node (tests/conftest.py), in their order
        items[:] = [item for item in items if item not in ours] + ours


REPORT_COLUMNS = [
    ("pods_started_for_superseded_launch", "superseded"), ("stale_task_runs", "stale_ran"),
    ("run_404", "run_404"), ("run_409", "run_409"), ("run_rejected_stale", "turned_away"),
    ("retries_burned", "retries"), ("tries_burned_by_ha", "tries_ha"), ("tasks_not_terminal", "not_term"),
    ("tasks_failed", "failed"), ("false_positive_deletions", "false_del"),
    ("pods_deleted_by_executor", "deleted"), ("pods_created", "pods"), ("wall_seconds", "wall_s"),
]


def pytest_sessionfinish(session):
    """This session's scenario reports side by side, and the seconds of each step: sections of the
    end-of-run summary, made where the scenarios ran (with pytest-xdist, the worker that ran the
    serial group; the controller prints them: ../parallel.py)."""
    from parallel import summary_lines

    if getattr(session.config.option, "numprocesses", None) and not hasattr(session.config, "workerinput"):
        return  # the pytest-xdist controller: the worker that ran the scenarios makes them
    if kind_skip_reason():
        return
    reports = [json.loads(p.read_text()) for p in sorted(OUT.glob("report-*.json"))
               if p.stat().st_mtime >= SESSION_T0] if OUT.is_dir() else []
    if reports:
        lines = summary_lines(session.config, "tests/kind: stock vs fenced (out/kind/report-*.json)")
        lines.append(f"{'scenario':<22}{'flavour':<8}" + "".join(f"{s:>12}" for _, s in REPORT_COLUMNS))
        for r in sorted(reports, key=lambda r: (r["scenario"], r["flavour"] != "stock")):
            name = r["scenario"] + ("*" if r.get("incomplete") else "")
            lines.append(f"{name:<22}{r['flavour']:<8}" + "".join(
                f"{r['metrics'].get(c, '-')!s:>12}" for c, _ in REPORT_COLUMNS))
        if any(r.get("incomplete") for r in reports):
            lines.append("* the test stopped before the scenario's end: what was seen until then")
    if TIMINGS:
        TIMINGS["session"] = round(time.time() - SESSION_T0, 1)
        summary_lines(session.config, "tests/kind: seconds per step").append(
            ", ".join(f"{k} {v}" for k, v in TIMINGS.items()))
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "timings.json").write_text(json.dumps(TIMINGS, indent=1))


# --------------------------------------------------------------------------- cluster and install
def timed(name: str, fn, *args, **kwargs):
    t0 = time.monotonic()
    try:
        return fn(*args, **kwargs)
    finally:
        TIMINGS[name] = round(time.monotonic() - t0, 1)


@dataclass
class Target:
    cluster: Cluster
    owned: bool  # a node this session started (and stops): nothing of ours needs cleaning up there


@pytest.fixture(scope="session")
def kind_target(request) -> Target:
    if os.environ.get("KUBECONFIG"):
        return Target(Cluster(os.environ["KUBECONFIG"], shutil.which("kubectl") or "kubectl"), owned=False)
    node = request.getfixturevalue("real_node")
    t0 = time.monotonic()
    request.getfixturevalue("images")
    TIMINGS["node up"] = node.timings.get("up", 0.0)
    TIMINGS["images built and loaded"] = round(time.monotonic() - t0, 1)
    return Target(Cluster(node.kubeconfig, node.kubectl), owned=node.owned)


@pytest.fixture(scope="session")
def core_api(kind_target):
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(config_file=kind_target.cluster.kubeconfig))


@dataclass
class Installed:
    flavour: str
    install: Install
    api: RestApi

    @property
    def cluster(self) -> Cluster:
        return self.install.cluster

    @property
    def namespace(self) -> str:
        return self.install.namespace


@pytest.fixture(scope="session", params=FLAVOURS)
def installed(request, kind_target) -> Installed:
    """One flavour installed in its own namespace for its tests, then deleted (stock first)."""
    from fenced_k8s_lab import hold
    from fenced_k8s_lab.chart import wait

    flavour = request.param
    only = os.environ.get("KIND_FLAVOUR")
    if only and only != flavour:
        pytest.skip(f"KIND_FLAVOUR={only}: {flavour} not selected")
    cluster, ns = kind_target.cluster, f"airflow-{flavour}"
    hold.release(cluster)  # a hold left by an interrupted session would keep the install Pending
    cluster.run("delete", "namespace", ns, "--ignore-not-found", "--wait=true", timeout=600)
    install = Install(cluster, flavour, namespace=ns, values_dir=OUT)
    try:
        timed(f"{flavour}: chart install", install.run)
        api = RestApi(os.environ.get("KIND_AIRFLOW_URL", "").rstrip("/") or api_server_url(cluster, ns))
        timed(f"{flavour}: {DAG_ID} parsed", wait, f"the dag processor to parse {DAG_ID}",
              lambda: api.dag_known(DAG_ID), 300, interval=5)
    except Exception:
        print(diagnostics(cluster, ns), file=sys.stderr)
        raise
    finally:
        TIMINGS.update({f"{flavour}: chart install: {k}": v for k, v in install.timings.items()})
    yield Installed(flavour, install, api)
    hold.release(cluster)
    # Gone before the next flavour installs, so the two never share the node's cores; on a node
    # this session started, the last one is deleted without waiting (it goes down with the node,
    # and the session's later tests, such as tests/node, need not share the cores with it).
    last = flavour == FLAVOURS[-1] or only
    if not (last and kind_target.owned):
        timed(f"{flavour}: namespace deleted", cluster.run, "delete", "namespace", ns, "--wait=true", timeout=600,
              check=False)
    else:
        cluster.run("delete", "namespace", ns, "--wait=false", check=False)
