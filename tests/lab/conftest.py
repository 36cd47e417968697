"""Session fixtures for lab tests: embedded PostgreSQL, migrated DBs, the emulator, kubelets.

Expensive things are session-scoped (one PostgreSQL server, one emulator); per-test state is
cheap (a database cloned from the migrated template, an emulator reset, a fresh kubelet).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

SMOKE_DAG = textwrap.dedent('''
    import pendulum
    from airflow.sdk import dag, task

    @dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1), catchup=False)
    def lab_smoke():
        @task
        def hello():
            print("hello from the lab")
            return 1

        hello()

    lab_smoke()
''')


@pytest.fixture(scope="session")
def airflow_db_factory(pg_server):
    """Call it to get the SQLAlchemy URL of a fresh, already migrated Airflow database."""
    from fenced_k8s_lab.postgres import new_airflow_db

    return lambda name=None: new_airflow_db(pg_server, name)


@pytest.fixture
def airflow_db(airflow_db_factory) -> str:
    return airflow_db_factory()


@pytest.fixture
def kubeconfig_factory(emulator, tmp_path):
    """kubeconfig_factory(token) -> path of a kubeconfig for the emulator with that bearer token."""
    def make(token: str) -> str:
        emulator.set_tokens({token: token})
        return emulator.write_kubeconfig(str(tmp_path / "kube" / f"{token}.kubeconfig"), token=token)

    return make


@pytest.fixture
def kubelet_factory(emulator, kubeconfig_factory, tmp_path):
    """kubelet_factory(**ProcessKubelet kwargs) -> a started kubelet (stopped at teardown)."""
    from fenced_k8s_lab.kubelet import ProcessKubelet

    made = []

    def make(namespace: str = "default", node_name: str = "lab-node", **kw) -> ProcessKubelet:
        kw.setdefault("workdir", tmp_path / f"kubelet-{node_name}")
        k = ProcessKubelet(kubeconfig_factory(f"kubelet-{node_name}"), namespace, node_name=node_name, **kw)
        made.append(k)
        return k.start()

    yield make
    for k in made:
        k.stop()


@pytest.fixture
def kubelet(kubelet_factory):
    return kubelet_factory()


@pytest.fixture
def kube_api(kubeconfig_factory):
    """A CoreV1Api for the test itself (token `test`)."""
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig_factory("test")))


@pytest.fixture
def lab_dags(tmp_path) -> Path:
    """A DAGs folder holding `lab_smoke` (one task that prints and returns)."""
    d = tmp_path / "dags"
    d.mkdir()
    (d / "lab_smoke.py").write_text(SMOKE_DAG)
    return d


@pytest.fixture
def airflow_stack_factory(airflow_db_factory, emulator, tmp_path):
    """airflow_stack_factory(dags_folder, **AirflowStack kwargs) -> started stack (stopped at teardown)."""
    from fenced_k8s_lab.stack import AirflowStack

    made = []

    def make(dags_folder, **kw):
        stack = AirflowStack(tmp_path / f"run{len(made)}", airflow_db_factory(), emulator.url, dags_folder,
                             emulator=emulator, **kw)
        made.append(stack)
        return stack.start()

    yield make
    for s in made:
        s.stop()
