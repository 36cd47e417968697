"""The official chart installed with ``helm-values/fenced-ha.yaml`` on the real node
(``real_node`` in tests/conftest.py: up for the session, down after it; the install for one
module), with the project images
built here and imported. Skipped with the reason when the node cannot run here (``NODE_TESTS=0``
skips it too). Timings of each step are printed after the run and kept in out/node/timings.json.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = ROOT / "out" / "node"


@pytest.fixture(scope="module")
def fenced_install(real_node, images):
    """The fenced flavour in namespace ``airflow`` for this module's checks, deleted after them
    (without waiting) so later tests of the session, such as the full real-node suite's
    scenarios, do not share the node's two cores with an idle install."""
    from fenced_k8s_lab.chart import Cluster, Install, diagnostics

    cluster = Cluster(real_node.kubeconfig, real_node.kubectl)
    install = Install(cluster, "fenced", namespace="airflow", values_dir=OUT)
    t0 = time.monotonic()
    try:
        # A reused node may hold an earlier session's install (pods still on the image that was
        # loaded then) or its namespace still terminating: start from none.
        cluster.run("delete", "namespace", "airflow", "--ignore-not-found", "--wait=true", timeout=600)
        install.run()
    except Exception:
        print(diagnostics(cluster, "airflow"), file=sys.stderr)
        raise
    finally:
        real_node.timings["chart install"] = round(time.monotonic() - t0, 1)
        real_node.timings.update({f"chart install: {k}": v for k, v in install.timings.items()})
    yield install
    cluster.run("delete", "namespace", "airflow", "--wait=false", check=False)

