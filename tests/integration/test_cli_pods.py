"""``airflow fenced-k8s pods``: the operator's view of this deployment's pods by launch standing.

One namespace holds a pod of every standing, each made by the real executors and airflow-core's
own state changes: a current launch (running, and one finished), a launch superseded by a clear and
a new queueing, a launch whose DAG was deleted (``delete_dag``), the stock executor's pods (no
token) and a pod another deployment stamped. The command runs through Airflow's own parser in this
process and through the real ``airflow`` entry point in a child process, as an operator with a
kubeconfig of its own; it must report what enforce would do to each pod and change nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from airflow_process import airflow_env, run_airflow

OPERATOR = "lab"  # a user the real apiserver has (token == name); the command's own kube identity
WRITES = {"create", "update", "patch", "delete", "deletecollection"}


def _short(token: str) -> str:
    return token.replace("-", "")[:8]


@pytest.fixture
def standings(world):
    """Pods of every standing in ``world``'s namespace; returns {pod name: (standing, action)}."""
    from airflow.api.common.delete_dag import delete_dag

    sched = world.scheduler("fenced", mode="audit")  # audit: nothing here deletes what the command must see
    world.queue(sched)
    sched.executor.sync()
    rows = {t: world.row(t) for t in ("t1", "t2", "t3")}
    pods = {t: world.pod_of(row) for t, row in rows.items()}
    world.set_pod_phase(pods["t1"], "Running")
    world.set_pod_phase(pods["t3"], "Succeeded")

    gone_dag = f"gone_{uuid.uuid4().hex[:8]}"
    world.airflow.add_dag(gone_dag, ["g1"])
    gone_run = world.airflow.create_run(gone_dag)
    sched.queue(gone_dag, gone_run)
    sched.executor.sync()
    gone_pod = world.pod_of(world.airflow.row(gone_dag, "g1", gone_run))
    delete_dag(gone_dag)  # what `airflow dags delete` does: the task has no row any more
    (world.airflow.dags_folder / f"{gone_dag}.py").unlink()

    world.airflow.clear(rows["t2"])  # a user's clear, then the next scheduling: a new launch of t2
    world.queue(sched, trigger=False)
    new_t2 = world.row("t2")
    assert new_t2.token and new_t2.token != rows["t2"].token

    foreign = world.stale_pod(rows["t2"], rows["t2"].token, sched=sched, deployment="another-deployment")

    legacy_run = world.new_run()
    stock = world.scheduler("stock")
    world.queue(stock, legacy_run)
    stock.executor.sync()
    legacy = [p.metadata.name for p in world.pods() if p.metadata.annotations.get("run_id") == legacy_run]
    assert len(legacy) == 3

    expected = {
        pods["t1"]: ("current", "keep", "names this launch"),
        pods["t2"]: ("superseded", "delete", f"names launch {_short(new_t2.token)} now"),
        pods["t3"]: ("current", "keep", "finished"),
        gone_pod: ("task gone", "delete", "no row"),
        foreign: ("another deployment's", "keep", "another-deployment"),
        **{name: ("legacy (no token)", "keep", "no launch token") for name in legacy},
    }
    assert set(expected) == {p.metadata.name for p in world.live_pods()}
    return expected


def _operator_kubeconfig(world) -> str:
    world.backend.set_tokens({OPERATOR: OPERATOR})
    return world.backend.write_kubeconfig(str(world.tmp_path / "operator.kubeconfig"), token=OPERATOR,
                                          namespace=world.namespace)


def _json_rows(out: str) -> list[dict]:
    """The command's JSON (one line), whatever log lines come before it."""
    return json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("[")))


def _check(rows: list[dict], expected: dict) -> None:
    got = {r["pod"]: r for r in rows}
    assert set(got) == set(expected)
    for name, (standing, action, why) in expected.items():
        assert (got[name]["standing"], got[name]["enforce would"]) == (standing, action), got[name]
        assert why in got[name]["why"], got[name]


def _writes_by_operator(world, since: int) -> list[dict]:
    return [e for e in world.audit()[since:] if e.get("who") == OPERATOR and e.get("verb") in WRITES]


def _lists_by_operator(world, since: int) -> list[dict]:
    deadline = time.monotonic() + 5  # the real apiserver writes its audit entry when the response completes
    while True:
        found = [e for e in world.audit()[since:] if e.get("who") == OPERATOR and e.get("verb") == "list"]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@pytest.mark.tasks("t1", "t2", "t3")
def test_pods_by_standing_through_airflows_parser(world, standings, monkeypatch, capsys):
    """In this process, through ``airflow.cli.cli_parser`` as ``airflow`` builds it: the group is
    there beside the provider's ``kubernetes`` group, and the table says what enforce would do."""
    from airflow.cli import cli_parser

    from fenced_k8s_lab.core import our_deployment

    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE", _operator_kubeconfig(world))
    monkeypatch.setenv("AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE", "audit")
    assert {"kubernetes", "fenced-k8s"} <= set(cli_parser.ALL_COMMANDS_DICT)
    since = len(world.audit())
    parser = cli_parser.get_parser()
    args = parser.parse_args(["fenced-k8s", "pods", "--output", "json"])
    capsys.readouterr()
    args.func(args)
    _check(_json_rows(capsys.readouterr().out), standings)

    args = parser.parse_args(["fenced-k8s", "pods", "--output", "plain"])
    args.func(args)
    out = capsys.readouterr().out
    assert f"deployment {our_deployment()} (stored), mode audit, {world.namespace}" in out
    assert "8 pods; enforce would delete 2 and keep 6 (mode audit: nothing is deleted now)" in out
    assert _lists_by_operator(world, since), "the command's calls are not in the audit log: read-only unproven"
    assert _writes_by_operator(world, since) == []
    assert set(standings) == {p.metadata.name for p in world.live_pods()}


@pytest.mark.tasks("t1", "t2", "t3")
def test_pods_by_standing_through_the_airflow_command(world, standings):
    """The real ``airflow`` entry point in a child process, configured only by its environment
    (metadata DB, executor namespace, the operator's kubeconfig); no scheduler is involved."""
    for sched in world.schedulers:  # no scheduler of this deployment runs while the operator looks
        sched.stop()
    world.schedulers.clear()
    env = {**os.environ, "AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE": _operator_kubeconfig(world)}
    since = len(world.audit())
    airflow = Path(sys.executable).with_name("airflow")
    done = subprocess.run([str(airflow), "fenced-k8s", "pods", "--output", "json"], env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    _check(_json_rows(done.stdout), standings)
    assert _lists_by_operator(world, since)
    assert _writes_by_operator(world, since) == []
    assert set(standings) == {p.metadata.name for p in world.live_pods()}


# --- what the operator gets when something is missing: one line, exit 1, no traceback (issue 47) ---

DEAD_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: dead, cluster: {server: "https://127.0.0.1:%d"}}]
contexts: [{name: dead, context: {cluster: dead, user: operator, namespace: airflow}}]
current-context: dead
users: [{name: operator, user: {token: not-a-known-token}}]
"""


def _free_port() -> int:
    from fenced_k8s_lab.postgres import free_port

    return free_port()


def _operator_env(metadata_db, home: Path, **variables: str) -> dict:
    return airflow_env(metadata_db.url.render_as_string(hide_password=False), home, **variables)


def _answers_in_one_line(done, expected: str) -> None:
    """Exit 1, no traceback, and the answer as stderr's last line; before it only the deployment
    id's retry lines (``deployment.resolve`` logs each failed attempt)."""
    assert done.returncode == 1, done.output[-3000:]
    assert "Traceback" not in done.output, done.output[-3000:]
    *before, answer = done.stderr.strip().splitlines()
    assert answer.startswith("airflow fenced-k8s pods: ") and expected in answer, done.stderr[-3000:]
    assert all("could not read the database identity" in line for line in before), done.stderr[-3000:]


def test_pods_answers_an_unreachable_api_server_in_one_line(metadata_db, tmp_path):
    port = _free_port()  # nothing listens there
    kubeconfig = tmp_path / "dead.kubeconfig"
    kubeconfig.write_text(DEAD_KUBECONFIG % port)
    env = _operator_env(metadata_db, tmp_path / "home", AIRFLOW__KUBERNETES_EXECUTOR__IN_CLUSTER="False",
                        AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE=str(kubeconfig))
    done = run_airflow(["fenced-k8s", "pods"], env)
    _answers_in_one_line(done, f"the Kubernetes API server at https://127.0.0.1:{port} did not answer")
    assert done.stderr.strip().count("\n") == 0  # not one retry line of the kubernetes client's


def test_pods_answers_an_api_server_that_refuses_the_operator_in_one_line(metadata_db, envtest_session, tmp_path):
    """The real kube-apiserver, with a token it does not know."""
    kubeconfig = envtest_session.write_kubeconfig(str(tmp_path / "stranger.kubeconfig"), token="a-stranger",
                                                   namespace="airflow")
    env = _operator_env(metadata_db, tmp_path / "home", AIRFLOW__KUBERNETES_EXECUTOR__IN_CLUSTER="False",
                        AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE=kubeconfig)
    _answers_in_one_line(run_airflow(["fenced-k8s", "pods"], env), "the Kubernetes API server answered 401")


@pytest.mark.parametrize("where, variables, expected", [
    ("no in-cluster config", {}, "no Kubernetes client configuration (Service host/port is not set.)"),
    ("a missing kubeconfig", {"AIRFLOW__KUBERNETES_EXECUTOR__IN_CLUSTER": "False",
                              "AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE": "/nonexistent/kubeconfig"},
     "no Kubernetes client configuration"),
])
def test_pods_answers_no_kubernetes_configuration_in_one_line(metadata_db, tmp_path, where, variables, expected):
    env = _operator_env(metadata_db, tmp_path / "home", **variables)
    env = {k: v for k, v in env.items() if not k.startswith(("KUBERNETES_SERVICE", "KUBECONFIG"))}
    _answers_in_one_line(run_airflow(["fenced-k8s", "pods"], env), expected)


def test_pods_answers_an_unreachable_database_in_one_line(metadata_db, tmp_path):
    from fenced_k8s_lab.postgres import airflow_db_env

    env = _operator_env(metadata_db, tmp_path / "home",
                        **airflow_db_env(f"postgresql+psycopg2://airflow:secret-password@127.0.0.1:{_free_port()}/airflow"))
    done = run_airflow(["fenced-k8s", "pods"], env)
    _answers_in_one_line(done, "the metadata database could not be read: connection to server at")
    assert "secret-password" not in done.output


def test_pods_answers_a_bad_option_in_one_line(metadata_db, tmp_path):
    env = _operator_env(metadata_db, tmp_path / "home", AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE="enforcing")
    _answers_in_one_line(run_airflow(["fenced-k8s", "pods"], env),
                         "Invalid [fenced_kubernetes_executor] mode = 'enforcing'; accepted values: enforce | audit | off")
