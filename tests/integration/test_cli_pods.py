"""``airflow fenced-k8s pods``: the operator's view of this deployment's pods by launch standing.

One namespace holds a pod of every standing, each made by the real executors and airflow-core's
own state changes: a current launch (running, and one finished), a launch superseded by a clear and
a new queueing, a launch whose DAG was deleted (``delete_dag``), the stock executor's pods (no
token) and a pod another deployment stamped. The command runs through Airflow's own parser in this
process and through the real ``airflow`` entry point in a child process, as an operator with a
kubeconfig of its own; it must report what enforce would do to each pod and change nothing.

It must also answer, in table and JSON alike, in every state the runbooks send the operator to it
in (docs/operations.md): during a collision, on a restored database, before any fenced scheduler
has stored the deployment id.
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


# --- the states the runbooks send the operator here in (issue 59 item 7) ----------------------------

#: A job id this database never allocated: the rival database's scheduler.
RIVAL_JOB = 2_000_000_000 + int(uuid.uuid4().int % 100_000_000)


def _post(world, launcher, heartbeat, *, host: str, stopped: bool = False) -> None:
    """One scheduler's entry in this deployment's witness Lease, as the witness posts it."""
    from datetime import datetime, timezone

    from kubernetes.client import CoordinationV1Api

    from fenced_k8s_executor import witness
    from fenced_k8s_lab.core import our_deployment

    value = witness.entry_value(heartbeat, host, datetime.now(timezone.utc), 300.0, stopped=stopped)
    CoordinationV1Api(world.kube.api_client).patch_namespaced_lease(
        witness.lease_name(our_deployment()), world.namespace,
        {"metadata": {"annotations": {witness.entry_key(launcher): value}}},
        _content_type="application/merge-patch+json")


@pytest.fixture
def seen_by_both(world):
    """This deployment's pod of t1, its scheduler stopped since (as when the operator looks): (pod,
    the scheduler, its launcher and its job row as the witness reads them)."""
    from fenced_k8s_executor import witness
    from fenced_k8s_executor.launch import Launcher

    sched = world.scheduler("fenced", mode="audit")
    world.queue(sched)
    sched.executor.sync()
    pod = world.pod_of(world.row("t1"))
    sched.stop()
    world.schedulers.clear()
    row = witness.read_jobs([sched.job_id])[sched.job_id]
    return pod, sched, Launcher(sched.job_id, row.started), row


def _during(world, output: str) -> tuple:
    """``airflow fenced-k8s pods`` (``output``) in a child process: (done, rows, the lines around them)."""
    env = {**os.environ, "AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE": _operator_kubeconfig(world),
           # the rival's post stays live through the command's start, however liveness is judged
           "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "600"}
    done = run_airflow(["fenced-k8s", "pods", "--output", output], env)
    assert done.returncode == 0, done.output[-3000:]
    assert "Traceback" not in done.output, done.output[-3000:]
    if output == "json":
        return done, {r["pod"]: r for r in _json_rows(done.stdout)}, done.stderr
    return done, None, done.stdout


@pytest.mark.tasks("t1")
@pytest.mark.parametrize("output", ["table", "json"])
def test_pods_answers_during_a_collision_in_table_and_json(world, seen_by_both, output):
    """Another database posts under this deployment's id (a live scheduler job this database never
    had) and has launched a pod stamped with it. The command answers with exit 0 in both outputs:
    the collision line naming the other side's job and host, the other side's pod ``launched by
    another database`` (keep), this side's kept. Before: the table printed, then
    ``AttributeError`` (``collision_line`` with no scheduler of its own) and exit 1; JSON exited 0
    and said nothing of the collision."""
    from datetime import datetime, timedelta, timezone

    from fenced_k8s_executor.launch import Launcher
    from fenced_k8s_executor.names import SCHEDULER_JOB_ANNOTATION

    ours, sched, _, _ = seen_by_both
    now = datetime.now(timezone.utc)
    rival = Launcher(RIVAL_JOB, now - timedelta(hours=1))
    _post(world, rival, now, host="prod-scheduler-0")
    row = world.row("t1")
    theirs = world.stale_pod(row, row.token, sched=sched,  # the rival's launch of its copy of t1
                             launcher={**rival.annotations(), SCHEDULER_JOB_ANNOTATION: str(RIVAL_JOB)})
    done, rows, around = _during(world, output)
    assert "COLLISION: fenced_k8s_executor deployment id collision" in around, done.output[-3000:]
    assert f"job {RIVAL_JOB} started" in around and "on prod-scheduler-0" in around, around
    assert "1 pods stamped with this deployment's id were launched by another database" in around
    if rows is not None:
        assert (rows[theirs]["standing"], rows[theirs]["enforce would"]) == ("launched by another database", "keep")
        assert rows[ours]["enforce would"] == "keep" and rows[ours]["standing"] == "current"
        assert "COLLISION" not in done.stdout  # stdout stays the rows alone: valid JSON
    else:
        assert theirs in around and ours in around


@pytest.mark.tasks("t1")
@pytest.mark.parametrize("output", ["table", "json"])
def test_pods_answers_on_a_restored_database_in_table_and_json(world, seen_by_both, output):
    """This database restored to an earlier point: its scheduler's witness entry holds a heartbeat
    later than the restored row of its job (it ran on, on the database that was discarded, and was
    stopped for the restore). The command says this database is a copy and lists that scheduler's
    pod as ``launched by another database`` (keep), the pods the runbook deletes by hand. Before:
    ``AttributeError`` and exit 1 in the table, nothing of the copy in JSON."""
    from datetime import timedelta

    ours, _, launcher, row = seen_by_both
    _post(world, launcher, row.heartbeat + timedelta(seconds=60), host=f"scheduler-of-{launcher.job_id}",
          stopped=True)
    done, rows, around = _during(world, output)
    assert "COLLISION: " in around and "this database is a copy taken about" in around, done.output[-3000:]
    assert "1 pods stamped with this deployment's id were launched by another database" in around
    if rows is not None:
        assert (rows[ours]["standing"], rows[ours]["enforce would"]) == ("launched by another database", "keep")
    else:
        assert ours in around


@pytest.mark.tasks("t1")
@pytest.mark.parametrize("output", ["table", "json"])
def test_pods_answers_before_any_scheduler_stored_the_id(world, pg_server, output):
    """A metadata database no fenced scheduler has run on (the Variable absent; say, just upgraded
    from 0.2.x, whose pods carry the id it derived): the command answers, exit 0, judging by the id
    the first fenced scheduler will store (derived the same way: the 0.2 pod is this deployment's,
    its task gone here; another deployment's pod is left alone), says the id is not stored yet, and
    stores nothing; the first scheduler's id is the one it showed. Before: exit 1, ``no fenced
    scheduler has stored this deployment's id yet``, although operations.md says it needs none."""
    import sqlalchemy as sa

    from fenced_k8s_executor import deployment
    from fenced_k8s_executor.config import FencedConfig
    from fenced_k8s_lab.postgres import airflow_db_env, new_airflow_db

    url = new_airflow_db(pg_server)
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        stored = sa.text("SELECT count(*) FROM variable WHERE key = :k").bindparams(k=deployment.ID_VARIABLE)
        with engine.connect() as conn:
            assert conn.execute(stored).scalar() == 0
        server, database, schema = deployment.read_identity(engine)
        derived = deployment.identity_id("postgresql", server, database, schema)
        sched = world.scheduler("fenced", start=False)  # of the session's database: another deployment here
        world.queue(sched, trigger=False)
        row = world.row("t1")
        other = world.stale_pod(row, row.token, sched=sched)
        upgraded = world.stale_pod(row, row.token, sched=sched, deployment=derived, launcher={})  # as 0.2 stamped
        env = {**os.environ, **airflow_db_env(url),
               "AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE": _operator_kubeconfig(world)}
        done = run_airflow(["fenced-k8s", "pods", "--output", output], env)
        assert done.returncode == 0, done.output[-3000:]
        around = done.stderr if output == "json" else done.stdout
        assert f"deployment {derived} (not stored yet: no fenced scheduler has run on this database" in around, \
            done.output[-3000:]
        if output == "json":
            got = {r["pod"]: (r["standing"], r["enforce would"]) for r in _json_rows(done.stdout)}
            assert got == {other: ("another deployment's", "keep"), upgraded: ("task gone", "delete")}
        else:
            assert "2 pods; enforce would delete 1 and keep 1" in around
        with engine.connect() as conn:
            assert conn.execute(stored).scalar() == 0, "the command stored the id"
        assert deployment.resolve(FencedConfig(), engine).id == derived  # what the first scheduler stores
    finally:
        engine.dispose()
        pg_server.drop_database(sa.engine.make_url(url).database)
