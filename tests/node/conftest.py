"""The official chart installed with ``helm-values/fenced-ha.yaml`` on the real node
(``real_node`` in tests/conftest.py: up for the session, down after it), with the project images
built here and imported. Skipped with the reason when the node cannot run here (``NODE_TESTS=0``
skips it too). Timings of each step are printed after the run and kept in out/node/timings.json.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = ROOT / "out" / "node"


def _timed(timings: dict, name: str, fn, *args, **kwargs):
    t0 = time.monotonic()
    try:
        return fn(*args, **kwargs)
    finally:
        timings[name] = round(time.monotonic() - t0, 1)


@pytest.fixture(scope="session")
def images(real_node):
    """The project image (Dockerfile target ``kind``) and the PostgreSQL image, imported."""
    tars = [_timed(real_node.timings, f"build {what}", _build, *args) for what, args in
            (("project image", ["--target", "kind"]), ("postgres image", ["--postgres"]))]
    for tar in tars:
        real_node.load(tar)
    return tars


def _build(*args: str) -> str:
    """``fenced-k8s-repro image ARGS``: the Dockerfile on the stand-in base; the tar's path."""
    out = subprocess.run([sys.executable, "-m", "fenced_k8s_executor.lab.image", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"image build {' '.join(args)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def fenced_install(real_node, images):
    from fenced_k8s_executor.lab.chart import Cluster, Install

    cluster = Cluster(real_node.kubeconfig, real_node.kubectl)
    install = Install(cluster, "fenced", namespace="airflow", values_dir=OUT)
    try:
        _timed(real_node.timings, "chart install", install.run)
    except Exception:
        _dump(cluster, "airflow")
        raise
    finally:
        real_node.timings.update({f"chart install: {k}": v for k, v in install.timings.items()})
    yield install
    if not real_node.owned:  # a cluster we did not start: leave it as we found it
        cluster.run("delete", "namespace", "airflow", "--wait=false", check=False)


def _dump(cluster, namespace: str) -> None:
    """Pods, events and the last log lines of failing containers, for a failed install."""
    from fenced_k8s_executor.lab.chart import pods_summary

    try:
        print(pods_summary(cluster, namespace), file=sys.stderr)
        print(cluster.run("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False)[-6000:],
              file=sys.stderr)
        for pod in cluster.get("pods", namespace)["items"]:
            if not all(c.get("ready") for c in pod.get("status", {}).get("containerStatuses", [])):
                name = pod["metadata"]["name"]
                print(f"--- {name}", cluster.run("logs", "-n", namespace, name, "--all-containers", "--tail=40",
                                               check=False)[-4000:], file=sys.stderr)
    except Exception as exc:  # diagnostics only
        print(f"(diagnostics failed: {exc})", file=sys.stderr)
