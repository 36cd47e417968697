# syntax=docker/dockerfile:1.7
# Airflow image with fenced-k8s-executor baked in. The wheel is built first (the README's recipe),
# in the git checkout, so that it records the commit (`airflow fenced-k8s version` prints it):
#
#   pip wheel --no-deps . -w dist
#   docker build --target runtime -t fenced-k8s-executor:runtime .   # runtime image (production base)
#   docker build --target kind -t fenced-k8s-executor:dev .          # + the reproduction DAG (kind-config/up.sh)
#   kind load docker-image fenced-k8s-executor:dev --name fenced-k8s
#
# The same image serves both flavours of the kind lab: the stock flavour simply does not
# configure the fenced executor (helm-values/stock-ha.yaml), so the comparison is like for like.
#
# The runtime stage is the README's install recipe, instruction for instruction
# (tests/image/test_install_recipe.py keeps them one, and runs its pip line in CI). It pins
# Airflow in the same pip call, so installing the package can never move the Airflow the base
# image ships, against this repository's constraints file (.ci/constraints.txt: Airflow 3.3.2,
# cncf-kubernetes 10.25.0, resolved for Python 3.11, hence the python3.11 image); for another
# Airflow release, change the tag, the pin and the constraints file together (docs/operations.md).
FROM apache/airflow:3.3.2-python3.11 AS runtime
USER airflow
COPY --chown=airflow:0 dist/fenced_k8s_executor-0.3.0-py3-none-any.whl .ci/constraints.txt /tmp/
RUN pip install --no-cache-dir "apache-airflow==3.3.2" /tmp/fenced_k8s_executor-0.3.0-py3-none-any.whl --constraint /tmp/constraints.txt
RUN python -c "import fenced_k8s_executor; fenced_k8s_executor.FencedKubernetesExecutor" && rm /tmp/fenced_k8s_executor-0.3.0-py3-none-any.whl /tmp/constraints.txt

# ---------------------------------------------------------------------------------------------
# Reproduction DAG for the kind scenarios (tests/kind). Baked in (LocalDagBundle at
# /opt/airflow/dags) so scheduler, dag-processor and worker pods all see the same file without
# git-sync or a shared volume. Not part of the runtime image.
FROM runtime AS kind
COPY --chown=airflow:0 <<'PYEOF' /opt/airflow/dags/fenced_repro.py
"""DAG driven by tests/kind: N independent sleeping tasks, parameters from dag_run.conf.

N is FENCED_REPRO_WIDTH (default 24), read when the file is parsed: it must be the same in the
dag-processor and the worker pods, so set it for every Airflow container (the chart's `extraEnv`;
kind-config/node/values.yaml sets 6). Each task prints LAB-TASK-RAN <pod> <try> to its pod's
output (the worker copies task output to stdout): tests/kind reads it to tell which pods ran
the task code, as the lab does.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

from airflow.sdk import dag, get_current_context, task

WIDTH = int(os.environ.get("FENCED_REPRO_WIDTH", "24"))


@dag(
    dag_id="fenced_repro",
    schedule=None,
    catchup=False,
    max_active_tasks=WIDTH,
    max_active_runs=4,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=5)},
    params={"sleep_seconds": 20},
    tags=["fenced-k8s-executor", "kind"],
)
def fenced_repro():
    @task
    def work(i: int) -> int:
        context = get_current_context()
        print("LAB-TASK-RAN", os.environ.get("HOSTNAME"), context["ti"].try_number, flush=True)
        seconds = int(context["params"].get("sleep_seconds", 20))
        time.sleep(seconds)
        return i

    for i in range(WIDTH):
        work.override(task_id=f"work_{i:02d}")(i)


fenced_repro()
PYEOF

# Smallest end-to-end check of the image on a cluster: two short tasks, one after the other.
COPY --chown=airflow:0 <<'PYEOF' /opt/airflow/dags/fenced_smoke.py
"""Smoke DAG baked into the kind image: `hello` then `world`, each done in well under a second."""

from __future__ import annotations

from airflow.sdk import dag, task


@dag(dag_id="fenced_smoke", schedule=None, catchup=False, tags=["fenced-k8s-executor", "smoke"])
def fenced_smoke():
    @task
    def hello() -> str:
        return "hello"

    @task
    def world(greeting: str) -> str:
        return f"{greeting} world"

    world(hello())


fenced_smoke()
PYEOF
