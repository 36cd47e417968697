"""The fenced executor on a real kubelet: the official chart installed with
``helm-values/fenced-ha.yaml`` on ../shared/node, and a DAG run whose worker pods run as real
containers in the node's containerd."""

from __future__ import annotations

import time

import pytest

from fenced_k8s_lab.chart import RestApi, api_server_url, wait
from fenced_k8s_executor.names import TOKEN_ANNOTATION

DAG = "fenced_smoke"  # baked into the image by the Dockerfile's kind stage


def test_every_airflow_pod_is_ready_and_two_schedulers_heartbeat(fenced_install):
    pods = fenced_install.cluster.get("pods", fenced_install.namespace, selector="tier=airflow")["items"]
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    assert running and all(
        any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"]) for p in running)
    assert len([p for p in running if p["metadata"]["labels"].get("component") == "scheduler"]) == 2
    assert wait("two SchedulerJobs heartbeating", lambda: fenced_install.alive_schedulers() >= 2, 120, interval=10)


def test_the_scheduler_loads_the_fenced_executor(fenced_install):
    assert fenced_install.executor() == "fenced_k8s_executor.FencedKubernetesExecutor"


def test_the_image_holds_airflow_and_the_fenced_provider(fenced_install):
    out = fenced_install.cluster.airflow(fenced_install.namespace, "version")
    assert out.strip().splitlines()[-1] == "3.3.2"
    providers = fenced_install.cluster.airflow(fenced_install.namespace, "providers", "list")
    assert "fenced-k8s-executor" in providers and "apache-airflow-providers-cncf-kubernetes" in providers
    imported = fenced_install.cluster.run(
        "exec", "-n", fenced_install.namespace, "deploy/airflow-scheduler", "-c", "scheduler", "--", "python", "-c",
        "import fenced_k8s_executor, sys; print(fenced_k8s_executor.__file__.startswith(sys.prefix))")
    assert imported.strip().splitlines()[-1] == "True"  # from the image's virtualenv, not a mount


def test_a_dag_run_succeeds_with_worker_pods_on_real_containers(fenced_install):
    cluster, ns = fenced_install.cluster, fenced_install.namespace
    api = RestApi(api_server_url(cluster, ns))
    wait(f"the dag processor to parse {DAG}", lambda: api.dag_known(DAG), 180, interval=5)
    run_id = api.trigger(DAG)
    state = wait(f"{DAG} run {run_id} to finish",
                 lambda: (s := api.run_state(DAG, run_id)) in ("success", "failed") and s, 600, interval=5)
    tis = {ti["task_id"]: ti["state"] for ti in api.task_instances(DAG, run_id)}
    assert state == "success", tis
    assert tis == {"hello": "success", "world": "success"}

    def workers_done():  # a task reports its state before its process exits: wait for the pods
        pods = [p for p in cluster.get("pods", ns, selector="kubernetes_executor=True")["items"]
                if p["metadata"]["annotations"].get("run_id") == run_id]
        return all(p["status"].get("phase") in ("Succeeded", "Failed") for p in pods) and pods

    workers = wait("the worker pods to finish", workers_done, 120)
    assert sorted(p["metadata"]["annotations"]["task_id"] for p in workers) == ["hello", "world"]
    for pod in workers:
        assert pod["status"]["phase"] == "Succeeded"
        (ctr,) = pod["status"]["containerStatuses"]
        assert ctr["containerID"].startswith("containerd://")
        assert ctr["imageID"]  # pulled from the node's image store, not modelled
        assert pod["metadata"]["annotations"].get(TOKEN_ANNOTATION)  # launched through the fences


#: What the fences log when a read of the metadata DB fails (each one retried next loop, never a
#: delete): on a healthy install none may appear. The chart's plain postgresql:// URL gets
#: SQLAlchemy 2.1's psycopg 3 driver, which the lab's psycopg2 URLs never exercised: the loop's
#: reads failed there on every loop while the DAG run above still succeeded.
READ_FAILURES = ("check failed", "reconcile failed", "could not read", "prefetch failed", "sweep failed")


def test_the_fences_read_the_metadata_db_without_errors(fenced_install):
    cluster, ns = fenced_install.cluster, fenced_install.namespace
    schedulers = cluster.get("pods", ns, selector="component=scheduler")["items"]
    assert len(schedulers) == 2
    for pod in schedulers:
        logs = cluster.run("logs", "-n", ns, pod["metadata"]["name"], "-c", "scheduler", timeout=60)
        failures = [line for line in logs.splitlines()
                    if "fenced_k8s_executor" in line and any(what in line for what in READ_FAILURES)]
        assert not failures, failures[:5]
