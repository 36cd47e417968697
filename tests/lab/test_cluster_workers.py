"""The lab's worker side on an existing cluster (``lab/workers.py``): the pod template each
deployment's schedulers launch from, the address pods reach this machine by, and the observer
that turns a real kubelet's pods into the evidence the process kubelet gives. The observer runs
here against the emulator over HTTP (list, watch, status, deletion); the real node runs it in
``tests/node/test_lab_on_node.py``."""

from __future__ import annotations

import time

import pytest

from fenced_k8s_lab import workers as cw

pytestmark = pytest.mark.lab


def test_the_pod_template_carries_the_deployments_worker_settings_and_nothing_of_the_host(tmp_path):
    env = {"AIRFLOW__CORE__EXECUTION_API_SERVER_URL": "http://10.88.0.1:8080/execution/",
           "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path / "main" / "dags"),
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://127.0.0.1:5432/x",
           "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
           "AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE": "/x/kubeconfig",
           "AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE": "/x/pod.yaml",
           "PYTHONPATH": "/x", "AIRFLOW_HOME": "/x/home"}
    tpl = cw.pod_template(env, image="localhost/img:1", share=tmp_path, gate=tmp_path / "gate", deployment="main",
                          run="r1", start_delay=15.0)
    base = tpl["spec"]["containers"][0]
    assert {e["name"] for e in base["env"]} == {"AIRFLOW__CORE__EXECUTION_API_SERVER_URL", "AIRFLOW__CORE__DAGS_FOLDER"}
    assert base["image"] == "localhost/img:1" and base["name"] == "base"
    assert tpl["metadata"]["labels"] == {cw.DEPLOYMENT_LABEL: "main", cw.RUN_LABEL: "r1"}
    assert tpl["metadata"]["annotations"] == {"lab.fenced-k8s-executor.io/start-delay": "15.0"}
    init = tpl["spec"]["initContainers"][0]
    assert init["image"] == "localhost/img:1" and "$LAB_GATE/$POD_NAME" in init["command"][-1]
    assert {"name": "LAB_GATE", "value": str(tmp_path / "gate")} in init["env"]
    assert tpl["spec"]["volumes"] == [{"name": "lab-share", "hostPath": {"path": str(tmp_path), "type": "Directory"}}]
    assert base["volumeMounts"] == init["volumeMounts"] == [
        {"name": "lab-share", "mountPath": str(tmp_path), "readOnly": True}]


def test_pods_reach_this_machine_at_a_node_address_of_its_own_or_the_one_given():
    assert cw.worker_host(["192.0.2.7"], given="198.51.100.1") == "198.51.100.1"
    assert cw.worker_host(["192.0.2.7", "127.0.0.1"]) == "127.0.0.1"
    with pytest.raises(SystemExit, match="--worker-host"):
        cw.worker_host(["192.0.2.7"])
    assert cw.image_env("localhost/fenced-k8s-executor:dev") == {
        "AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_REPOSITORY": "localhost/fenced-k8s-executor",
        "AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_TAG": "dev"}
    assert cw.image_env("registry:5000/airflow")["AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_TAG"] == "latest"


def _pod(name: str, run: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"kubernetes_executor": "True", cw.RUN_LABEL: run,
                                                   cw.DEPLOYMENT_LABEL: "main"},
                         "annotations": {"task_id": "t00", "try_number": "1"}},
            "spec": {"containers": [{"name": "base", "image": "x"}]}}


def _until(what, predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_the_observer_records_each_pods_life_and_opens_its_gate(emulator, tmp_path):
    from fenced_k8s_lab.controlplane import ExternalCluster

    emulator.set_tokens({"lab-test": "lab-test"})
    cluster = ExternalCluster(emulator.write_kubeconfig(str(tmp_path / "kubeconfig"), token="lab-test",
                                                        namespace="lab-x")).start()
    cluster.ensure_namespace("lab-x")
    v1 = cluster._v1()
    gate = tmp_path / "gate"
    gate.mkdir()
    observer = cw.PodObserver(cluster, "lab-x", tmp_path / "pods", gate, "r1",
                              start_delay=lambda pod: 7.5 if pod["metadata"]["name"] == "a" else 0.25).start()
    try:
        for name, run in (("a", "r1"), ("b", "r1"), ("other-run", "r0")):
            v1.create_namespaced_pod("lab-x", _pod(name, run))
        _until("both gates", lambda: (gate / "a").exists() and (gate / "b").exists())
        assert (gate / "a").read_text() == "7.50\n" and (gate / "b").read_text() == "0.25\n"
        assert not (gate / "other-run").exists()

        running = {"phase": "Running", "containerStatuses": [
            {"name": "base", "ready": True, "restartCount": 0, "image": "x", "imageID": "", "state": {"running": {}}}]}
        v1.patch_namespaced_pod_status("a", "lab-x", {"status": running})
        _until("a started", lambda: observer.records() and any(
            r["name"] == "a" and r.get("started_at") for r in observer.records().values()))
        done = {"phase": "Succeeded", "containerStatuses": [
            {"name": "base", "ready": False, "restartCount": 0, "image": "x", "imageID": "",
             "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}
        v1.patch_namespaced_pod_status("a", "lab-x", {"status": done})
        v1.delete_namespaced_pod("b", "lab-x", grace_period_seconds=0)
        _until("a finished and b deleted", lambda: {r["name"]: r for r in observer.records().values()}.get(
            "a", {}).get("finished_at") and any(d["name"] == "b" for d in observer.deletions()))
    finally:
        observer.stop()
    records = {r["name"]: r for r in observer.records().values()}
    assert set(records) == {"a", "b"}
    a, b = records["a"], records["b"]
    assert a["seen_at"] <= a["started_at"] <= a["finished_at"] and a["exit_code"] == 0 and a.get("deleted_at") is None
    assert b.get("started_at") is None and b["deleted_at"] >= b["seen_at"]
    assert [(d["name"], d["deployment"]) for d in observer.deletions()] == [("b", "main")]
