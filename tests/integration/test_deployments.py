"""Issue 11 (3): the fences only ever delete this deployment's pods.

A second Airflow deployment (its own metadata DB, a second database in the same PostgreSQL)
runs a fenced scheduler against the same Kubernetes API. Its pod names a TaskInstance this
deployment's DB has never seen: to a fence that only asks "is the task gone?", it is stale.
The pod is built by that deployment's own fenced executor (a separate process configured
against the other DB); each test then finds it in the namespace it shares with us, or in a
namespace our multi-namespace scheduler (empty namespace list: all namespaces) sweeps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from fenced_k8s_lab.stack import POD_TEMPLATE

KINDS = ["stock", "fenced"]

FOREIGN_SCHEDULER = r"""
import json, os, sys
from pathlib import Path
from fenced_k8s_executor import FencedKubernetesExecutor
from fenced_k8s_lab.core import Airflow, Scheduler

airflow = Airflow(Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]))
airflow.add_dag("other_deployment", ["t1"])
run_id = airflow.create_run("other_deployment")
job = Scheduler.new_job()
executor = FencedKubernetesExecutor()
executor.job_id = job.id
sched = Scheduler(job, [executor])
executor.start()
try:
    sched.queue("other_deployment", run_id)
    executor.sync()
    row = airflow.row("other_deployment", "t1", run_id)
    pods = executor.kube_client.list_namespaced_pod(os.environ["AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE"]).items
    out = [executor.kube_client.api_client.sanitize_for_serialization(p) for p in pods]
    print("FOREIGN=" + json.dumps({"pods": out, "ti_id": row.id, "token": row.token}))
finally:
    executor.end()
"""


def _other_deployment(kube_backend, home, namespace: str, url: str) -> dict:
    """Run a fenced scheduler of ANOTHER deployment (metadata DB ``url``): it queues its own DAG
    and creates that task's pod in ``namespace``; returns the pod, its TI id and token."""
    from fenced_k8s_lab.postgres import airflow_db_env

    user = "scheduler-190"
    kube_backend.set_tokens({user: user})
    kc = kube_backend.write_kubeconfig(str(home / "kubeconfig"), token=user, namespace=namespace)
    (home / "template.yaml").write_text(POD_TEMPLATE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(airflow_db_env(url))
    env.update(
        AIRFLOW_HOME=str(home), AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"), AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__API_AUTH__JWT_SECRET="other-deployment-secret-" + "y" * 48,
        AIRFLOW__KUBERNETES_EXECUTOR__IN_CLUSTER="False", AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE=namespace,
        AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE=kc,
        AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE=str(home / "template.yaml"),
        AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_REPOSITORY="lab/airflow",
        AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_TAG="local",
        AIRFLOW__FENCED_KUBERNETES_EXECUTOR__SWEEP_INTERVAL="0",
    )
    done = subprocess.run([sys.executable, "-c", FOREIGN_SCHEDULER], env=env, capture_output=True, text=True,
                          timeout=300, cwd=str(home))
    lines = [x for x in done.stdout.splitlines() if x.startswith("FOREIGN=")]
    assert done.returncode == 0 and lines, (done.stdout[-3000:], done.stderr[-3000:])
    return json.loads(lines[0].split("=", 1)[1])


@pytest.fixture(scope="module")
def foreign_pod(kube_backend, pg_server, metadata_db, tmp_path_factory):
    """The pod a fenced scheduler of ANOTHER deployment created (read back as a manifest)."""
    from fenced_k8s_lab.postgres import new_airflow_db

    home = tmp_path_factory.mktemp("other_deployment")
    namespace = f"other-{uuid.uuid4().hex[:6]}"
    kube_backend.ensure_namespace(namespace)
    found = _other_deployment(kube_backend, home, namespace, new_airflow_db(pg_server))
    (pod,) = found["pods"]
    meta = pod["metadata"]
    manifest = {
        "metadata": {"name": meta["name"], "labels": meta.get("labels") or {},
                     "annotations": meta.get("annotations") or {}},
        "spec": pod["spec"],
    }
    return {"manifest": manifest, "ti_id": found["ti_id"], "token": found["token"]}


def _place(world, foreign_pod, namespace: str) -> str:
    """Put the other deployment's pod (its exact manifest) into ``namespace``, running."""
    body = json.loads(json.dumps(foreign_pod["manifest"]))
    body["metadata"]["namespace"] = namespace
    world.kube.create_namespaced_pod(namespace, body)
    name = body["metadata"]["name"]
    world.kube.create_namespaced_pod_binding(
        name, namespace, {"target": {"kind": "Node", "name": "lab-node"}, "metadata": {"name": name}},
        _preload_content=False)
    world.kube.patch_namespaced_pod_status(name, namespace, {"status": {"phase": "Running"}})
    return name


def _exists(world, namespace: str, name: str) -> bool:
    pods = world.kube.list_namespaced_pod(namespace, field_selector=f"metadata.name={name}").items
    return bool(pods) and not pods[0].metadata.deletion_timestamp


@pytest.mark.parametrize("kind", KINDS)
def test_other_deployments_pod_in_a_shared_namespace_is_never_deleted(world, foreign_pod, kind):
    assert world.airflow.row_by_id(foreign_pod["ti_id"]) is None  # unknown to our DB: "task gone"
    name = _place(world, foreign_pod, world.namespace)
    sched = world.scheduler(kind, sweep_interval="0.3")
    world.queue(sched)  # our own work goes on beside it
    sched.executor.sync()
    world.settle(sched.executor, 2.5)
    assert _exists(world, world.namespace, name), f"{kind} deleted another deployment's pod"
    assert world.deletes_by(sched) == []


@pytest.mark.parametrize("kind", KINDS)
def test_multi_namespace_sweep_never_deletes_other_deployments_pods(world, foreign_pod, monkeypatch, kind):
    """multi_namespace_mode with an empty namespace list: the sweep lists every namespace."""
    other = f"o-{uuid.uuid4().hex[:8]}"
    world.backend.ensure_namespace(other)
    name = _place(world, foreign_pod, other)
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__MULTI_NAMESPACE_MODE", "True")
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__MULTI_NAMESPACE_MODE_NAMESPACE_LIST", "")
    sched = world.scheduler(kind, sweep_interval="0.3")
    world.settle(sched.executor, 2.5)
    if kind == "fenced":
        assert sched.executor.sweeper is not None and sched.executor.sweeper.last_report is not None
    assert _exists(world, other, name), f"{kind} deleted another deployment's pod in {other}"
    assert world.deletes_by(sched) == []


# --- two deployments behind one proxy address (issue 35, item 4) ---------------------------------


@pytest.fixture(scope="module")
def behind_one_address(pg_server, metadata_db, tmp_path_factory):
    """Our metadata database and another deployment's, of the same name on two PostgreSQL servers
    (each its own ``initdb``: its own system identifier), reached through ONE proxy address: user
    ``alpha`` reaches ours, ``beta`` the other, as two deployments' Cloud SQL Auth Proxy or pgbouncer
    sidecars both answer at ``127.0.0.1:5432``."""
    from fenced_k8s_lab.pgproxy import UserRoutingProxy
    from fenced_k8s_lab.postgres import TEMPLATE_DB, PostgresServer, _bin

    name = metadata_db.url.database
    other = PostgresServer().start()
    try:
        dump = tmp_path_factory.mktemp("schema") / "airflow.dump"
        subprocess.run([_bin("pg_dump"), "-h", "127.0.0.1", "-p", str(pg_server.port), "-U", "postgres", "-Fc",
                        "-f", str(dump), TEMPLATE_DB], check=True, capture_output=True)
        other.execute(f'CREATE DATABASE "{name}"')
        subprocess.run([_bin("pg_restore"), "-h", "127.0.0.1", "-p", str(other.port), "-U", "postgres",
                        "--no-owner", "-d", name, str(dump)], check=True, capture_output=True)
        pg_server.execute("DO $$ BEGIN CREATE ROLE alpha SUPERUSER LOGIN; EXCEPTION WHEN duplicate_object THEN"
                          " NULL; END $$")
        other.execute("CREATE ROLE beta SUPERUSER LOGIN")
        # Its scheduler jobs are numbered apart from ours: a job id both databases hold would make a
        # peer's pod look like one's own, which no fence re-checks, whatever its deployment id.
        other.execute("ALTER SEQUENCE job_id_seq RESTART WITH 100000", database=name)
        with UserRoutingProxy({"alpha": ("127.0.0.1", pg_server.port), "beta": ("127.0.0.1", other.port)}) as proxy:
            yield proxy, name
    finally:
        other.stop()


def test_a_deployment_behind_the_same_proxy_address_never_deletes_the_others_current_pod(
        world, behind_one_address, tmp_path):
    """Before: both deployments derived ``db-<hash of 127.0.0.1:port/name>``; ours took the other's
    current Pending pod for one of its own whose task is gone, and deleted it within its first loops."""
    proxy, name = behind_one_address
    found = _other_deployment(world.backend, tmp_path, world.namespace, proxy.url("beta", name))
    (pod,) = found["pods"]
    theirs = pod["metadata"]["name"]
    ours = world.scheduler_process("fenced", hostname="ours-behind-the-proxy",
                                   env={"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": proxy.url("alpha", name)})
    time.sleep(3.0)  # loops of ours: each re-checks this deployment's pods in flight
    ours.kill()
    assert _exists(world, world.namespace, theirs), "our scheduler deleted the other deployment's current pod"
    assert [d for d in world.deletes_by(ours.user) if d.get("name") == theirs] == []
