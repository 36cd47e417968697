"""Executor integration harness: real PostgreSQL (migrated Airflow schema), the Kubernetes API
emulator over HTTP, the real kubernetes client and real executors (stock or fenced) with their
watcher processes. The test plays the scheduler: it writes rows the way the scheduler does and
calls the executor's hooks in the order a race needs.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from fenced_k8s_executor.lab import seed
from fenced_k8s_executor.lab.stack import POD_TEMPLATE, STOCK_EXECUTOR
from fenced_k8s_executor.names import EXECUTOR_CLASS_PATH

JWT_SECRET = "integration-jwt-secret-" + "x" * 48


@pytest.fixture(scope="session")
def metadata_db(pg_server):
    """One migrated metadata DB for the session, with this process's Airflow ORM pointed at it."""
    from fenced_k8s_executor.lab.postgres import airflow_db_env, new_airflow_db

    url = new_airflow_db(pg_server)
    os.environ.update(airflow_db_env(url))
    os.environ["AIRFLOW__API_AUTH__JWT_SECRET"] = JWT_SECRET
    from airflow import settings
    from airflow.configuration import conf

    conf.set("database", "sql_alchemy_conn", url)
    settings.configure_vars()
    settings.reconfigure_orm()
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    yield engine
    engine.dispose()


@dataclass
class TIRef:
    """What the scheduler hands to revoke/adopt: a TaskInstance's identity and launch fields."""

    ti: seed.SeededTI
    queued_by_job_id: int | None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ti, name)

    @property
    def external_executor_id(self) -> str | None:
        return self.ti.token

    @property
    def executor_config(self) -> dict:
        return {}

    @property
    def key(self):
        from airflow.models.taskinstancekey import TaskInstanceKey

        return TaskInstanceKey(self.ti.dag_id, self.ti.task_id, self.ti.run_id, self.ti.try_number, self.ti.map_index)


@dataclass
class World:
    """One test's DAG run, namespace, kube client and executors."""

    engine: Any
    emulator: Any
    namespace: str
    kube: Any
    dag_id: str
    run_id: str
    dag_version_id: str
    started: list

    def ref(self, ti: seed.SeededTI, queued_by_job_id: int | None) -> TIRef:
        return TIRef(ti, queued_by_job_id)

    def tis(self, *task_ids: str, job_id: int | None, with_token: bool = True) -> list[seed.SeededTI]:
        return seed.insert_tis(
            self.engine, self.dag_id, self.run_id, self.dag_version_id, task_ids,
            queued_by_job_id=job_id, with_token=with_token,
        )

    def workload(self, ti: seed.SeededTI):
        from pathlib import Path

        from airflow.executors.workloads import BundleInfo, ExecuteTask
        from airflow.executors.workloads.task import TaskInstanceDTO

        dto = TaskInstanceDTO(
            id=uuid.UUID(ti.id), task_id=ti.task_id, dag_id=ti.dag_id, run_id=ti.run_id,
            try_number=ti.try_number, map_index=ti.map_index, dag_version_id=uuid.UUID(ti.dag_version_id),
            pool_slots=1, priority_weight=1, queue="default", external_executor_id=ti.token,
        )
        return ExecuteTask(
            ti=dto, dag_rel_path=Path(f"{ti.dag_id}.py"), bundle_info=BundleInfo(name=seed.BUNDLE),
            token="stock-workload-token", log_path=None,
        )

    def queue(self, executor, ti: seed.SeededTI) -> None:
        """The scheduler's hand-off: queue_workload, then the heartbeat's trigger_tasks."""
        executor.queue_workload(self.workload(ti), session=None)
        executor.trigger_tasks(open_slots=64)

    def pods(self, ti: seed.SeededTI | None = None) -> list:
        pods = self.kube.list_namespaced_pod(self.namespace).items
        if ti is not None:
            pods = [p for p in pods if (p.metadata.annotations or {}).get("task_id") == ti.task_id]
        return pods

    def sync_until(self, executor, predicate: Callable[[], bool], timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            executor.sync()
            if predicate():
                return True
            time.sleep(0.2)
        return predicate()

    def settle(self, executor, seconds: float = 2.0) -> None:
        """Let the watcher deliver what it has seen, syncing as the heartbeat would."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            executor.sync()
            time.sleep(0.2)

    def set_pod_phase(self, name: str, phase: str, *, reason: str | None = None, container_reason: str | None = None,
                      exit_code: int = 1) -> None:
        """Play the kubelet: report a terminal or running phase on the pod's status."""
        state: dict = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
        if phase in ("Failed", "Succeeded"):
            state = {"terminated": {"exitCode": 0 if phase == "Succeeded" else exit_code,
                                    "reason": container_reason or ("Completed" if phase == "Succeeded" else "Error")}}
        body = {"status": {"phase": phase, "reason": reason,
                           "containerStatuses": [{"name": "base", "ready": False, "restartCount": 0, "image": "x",
                                                  "imageID": "", "state": state}]}}
        self.kube.patch_namespaced_pod_status(name, self.namespace, body)

    def stale_pod(self, ti: seed.SeededTI, token: str, *, job_id: int, phase: str = "Pending", name: str | None = None,
                  container_reason: str | None = None) -> str:
        """A pod a (fenced) scheduler created earlier for launch ``token`` of ``ti``."""
        from fenced_k8s_executor.launch import LaunchIdentity

        launch = LaunchIdentity(ti_id=ti.id, token=token, try_number=ti.try_number, scheduler_job_id=str(job_id))
        name = name or f"{ti.task_id.replace('_', '-')}-{uuid.uuid4().hex[:8]}"
        labels = {"kubernetes_executor": "True", "airflow-worker": str(job_id), "dag_id": ti.dag_id,
                  "task_id": ti.task_id, "try_number": str(ti.try_number), "run_id": ti.run_id, **launch.labels()}
        annotations = {"dag_id": ti.dag_id, "task_id": ti.task_id, "try_number": str(ti.try_number),
                       "run_id": ti.run_id, **launch.annotations()}
        body = {"metadata": {"name": name, "labels": labels, "annotations": annotations},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "base", "image": "x"}]}}
        self.kube.create_namespaced_pod(self.namespace, body)
        if phase != "Pending":
            self.kube.create_namespaced_pod_binding(
                name, self.namespace, {"target": {"kind": "Node", "name": "lab-node"}, "metadata": {"name": name}},
                _preload_content=False,
            )
            self.set_pod_phase(name, phase, container_reason=container_reason)
        return name

    def deletes_by(self, who: str) -> list[dict]:
        return [e for e in self.emulator.audit() if e.get("verb") == "delete" and e.get("who") == who]


@pytest.fixture
def world(metadata_db, emulator, tmp_path, monkeypatch):
    from kubernetes import client, config

    namespace = f"t-{uuid.uuid4().hex[:8]}"
    test_kc = emulator.write_kubeconfig(str(tmp_path / "test.kubeconfig"), token="test", namespace=namespace)
    kube = client.CoreV1Api(config.new_client_from_config(config_file=test_kc))
    template = tmp_path / "pod_template.yaml"
    template.write_text(POD_TEMPLATE)
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__IN_CLUSTER", "False")
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE", namespace)
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE", str(template))
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_REPOSITORY", "lab/airflow")
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_TAG", "local")
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__DELETE_WORKER_PODS", "False")
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__TASK_PUBLISH_MAX_RETRIES", "-1")
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__KUBE_CLIENT_REQUEST_ARGS", '{"_request_timeout": [5, 3]}')
    monkeypatch.setenv("AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL", "3600")
    monkeypatch.setenv("AIRFLOW__FENCED_KUBERNETES_EXECUTOR__SWEEP_INTERVAL", "0")
    dag_id = f"race_{uuid.uuid4().hex[:8]}"
    version = seed.seed_dag(metadata_db, dag_id)
    run_id = "manual__race"
    seed.seed_run(metadata_db, dag_id, run_id, version)
    w = World(metadata_db, emulator, namespace, kube, dag_id, run_id, version, [])
    w.tmp_path = tmp_path
    w.monkeypatch = monkeypatch
    yield w
    for executor in w.started:
        try:
            executor.end()
        except Exception:
            pass


def _executor_class(kind: str) -> type:
    import importlib

    module, _, name = (STOCK_EXECUTOR if kind == "stock" else EXECUTOR_CLASS_PATH).rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.fixture
def make_executor(world):
    """make_executor(kind, job_id, **fenced_options) -> a started stock or fenced executor."""
    def make(kind: str, job_id: int, batch_size: int = 8, **options: str):
        kc = world.emulator.write_kubeconfig(
            str(world.tmp_path / f"scheduler-{job_id}.kubeconfig"), token=f"scheduler-{job_id}", namespace=world.namespace
        )
        world.emulator.set_tokens({f"scheduler-{job_id}": f"scheduler-{job_id}", "test": "test"})
        world.monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE", kc)
        world.monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__WORKER_PODS_CREATION_BATCH_SIZE", str(batch_size))
        for name, value in options.items():
            world.monkeypatch.setenv(f"AIRFLOW__FENCED_KUBERNETES_EXECUTOR__{name.upper()}", str(value))
        executor = _executor_class(kind)()
        executor.job_id = job_id
        executor.start()
        world.started.append(executor)
        return executor

    return make


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
