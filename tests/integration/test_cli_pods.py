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
    assert f"deployment {our_deployment()} (database), mode audit, {world.namespace}" in out
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
