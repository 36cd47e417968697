"""``airflow fenced-k8s pods``: its registration (light to import: Airflow builds its parser on
every ``airflow`` call) and the judgement of each pod, table-driven. The command itself runs
against real PostgreSQL and a real Kubernetes API in tests/integration/test_cli_pods.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone

import pytest

from fenced_k8s_executor.cli import DELETE, KEEP, judge
from fenced_k8s_executor.deployment import Deployment
from fenced_k8s_executor.launch import LaunchIdentity, TaskRow
from fenced_k8s_executor.lineage import Provenance
from fenced_k8s_executor.pods import PodRef

OURS = Deployment("db-ours", "database", address_id="db-old-address")
TOKEN, NEWER = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"
TASK = dict(dag_id="d", task_id="t", run_id="r", map_index=-1)


def _ref(token=TOKEN, deployment="db-ours", deleting=False, **task):
    launch = LaunchIdentity(ti_id="33333333-3333-4333-8333-333333333333", token=token, try_number=1, deployment=deployment, **{**TASK, **task})
    return PodRef("p", "ns", "uid", launch, deleting)


def _row(token, hostname=None):
    return TaskRow("ti2", "queued", 1, None, token, **TASK, hostname=hostname)


CASES = [(*case, Provenance.HERE)[:5] for case in [
    (_ref(), _row(TOKEN), False, ("current", KEEP, "names this launch")),
    (_ref(), _row(NEWER), False, ("superseded", DELETE, "names launch 22222222 now")),
    (_ref(), None, False, ("task gone", DELETE, "no row")),
    (_ref(), _row(NEWER, hostname="p"), False, ("superseded", KEEP, "its host")),
    (_ref(), _row(NEWER), True, ("superseded", KEEP, "finished")),
    (_ref(deleting=True), None, False, ("task gone", KEEP, "already being deleted")),
    (_ref(), _row(None), False, ("legacy row", KEEP, "no token")),
    (_ref(run_id=None), None, False, ("legacy (no task)", KEEP, "names no task")),
    (_ref(token=None), None, False, ("legacy (no token)", KEEP, "never fenced")),
    (PodRef("p", "ns", "uid", None), None, False, ("legacy (no token)", KEEP, "never fenced")),
    (_ref(deployment="db-theirs"), None, False, ("another deployment's", KEEP, "db-theirs")),
    (_ref(deployment=None), None, False, ("another deployment's", KEEP, "no deployment")),
    (_ref(deployment="db-old-address"), None, False, ("this deployment (old stamp)", KEEP, "left alone")),
    (_ref(), _row(NEWER), False, ("launched by another database", KEEP, "never deleted"), Provenance.ELSEWHERE),
    (_ref(), _row(NEWER), False, ("superseded", KEEP, "cannot tell yet"), Provenance.UNSETTLED),
    (_ref(malformed="try_number"), _row(TOKEN), False, ("malformed: try_number", KEEP, "never fenced")),
]]


@pytest.mark.parametrize("ref, row, finished, expected, launched", CASES)
def test_judge(ref, row, finished, expected, launched):
    standing, action, why = judge(ref, row, OURS, finished, launched)
    assert (standing, action) == expected[:2]
    assert expected[2] in why
    assert TOKEN not in why and NEWER not in why  # short forms only


def test_the_table_reaches_every_standing_and_judge_gives_no_other():
    """``cli.STANDINGS`` is what docs/operations.md lists (test_docs.py): each is reached above."""
    from fenced_k8s_executor.cli import STANDINGS

    assert {expected[0].partition(":")[0] for *_, expected, _ in CASES} == set(STANDINGS)


def _entry(job, host):
    from fenced_k8s_executor.lineage import Entry

    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return Entry(job, at, at, host)


@pytest.mark.parametrize("view, expected", [
    (dict(rivals=(_entry(7, "prod-0"),)), "Its schedulers: job 7 started 2026-01-01T00:00:00+00:00 on prod-0"),
    (dict(copied_at=datetime(2026, 1, 2, tzinfo=timezone.utc)), "this database is a copy taken about 2026-01-02T00:00:00+00:00"),
])
def test_the_summary_names_a_collision_without_a_scheduler_of_its_own(view, expected):
    """Either side of a collision, or a restored database: the command is no scheduler, so the line
    names no job of its own (it raised ``AttributeError`` there, after printing the table)."""
    from fenced_k8s_executor.cli import summary
    from fenced_k8s_executor.config import FencedConfig
    from fenced_k8s_executor.lineage import View

    rows = [{"standing": "launched by another database", "enforce would": KEEP}]
    lines = summary(rows, View(renewed=True, **view), "db-ours", "ns/fenced-k8s-witness-x", FencedConfig())
    assert lines[0] == "1 pods; enforce would delete 0 and keep 1"
    assert lines[1].startswith("COLLISION: fenced_k8s_executor deployment id collision") and expected in lines[1]
    assert lines[2].startswith("1 pods stamped with this deployment's id were launched by another database")


def test_the_deployment_line_says_whether_the_id_is_stored():
    from fenced_k8s_executor import deployment
    from fenced_k8s_executor.cli import deployment_line

    assert deployment_line(Deployment("db-ours", deployment.STORED)) == "deployment db-ours (stored)"
    assert deployment_line(Deployment("db-ours", deployment.NOT_STORED)).startswith(
        "deployment db-ours (not stored yet: no fenced scheduler has run on this database; the first one stores this id")
    assert "a random id, which no pod carries yet" in deployment_line(
        Deployment(deployment.NO_ID_YET, deployment.NOT_STORED))


def test_the_executor_keeps_the_providers_commands_and_adds_its_own():
    from fenced_k8s_executor import FencedKubernetesExecutor

    groups = {g.name: g for g in FencedKubernetesExecutor.get_cli_commands()}
    assert list(groups) == ["kubernetes", "fenced-k8s"]
    assert "cleanup-pods" in {c.name for c in groups["kubernetes"].subcommands}
    assert [c.name for c in groups["fenced-k8s"].subcommands] == ["pods", "restored", "version"]


def test_airflow_builds_its_parser_with_the_command_without_importing_the_runtime(tmp_path):
    """What every ``airflow`` call does: the provider's ``cli`` section gives the group; neither
    the executor, the fences' DB and API modules nor the kubernetes client are imported for it."""
    probe = ("import json, sys\nfrom airflow.cli import cli_parser\n"
             "print(json.dumps({'groups': sorted(cli_parser.ALL_COMMANDS_DICT),"
             " 'modules': sorted(m for m in sys.modules if m.startswith(('fenced_k8s_executor', 'kubernetes')))}))")
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"kubernetes", "fenced-k8s"} <= set(seen["groups"])
    heavy = {"fenced_k8s_executor.executor", "fenced_k8s_executor.ledger", "fenced_k8s_executor.pods",
             "fenced_k8s_executor.deployment", "kubernetes.client"}
    assert not heavy & set(seen["modules"]), seen["modules"]


# --- every failure in one line (issue 47) ---------------------------------------------------------

def _unreachable():
    from urllib3 import HTTPSConnectionPool
    from urllib3.exceptions import MaxRetryError, NewConnectionError

    pool = HTTPSConnectionPool("127.0.0.1", 9)
    reason = NewConnectionError(pool, "Failed to establish a new connection: [Errno 111] Connection refused")
    return MaxRetryError(pool, "/api/v1/namespaces/ns/pods", reason)


def _db_down():
    from sqlalchemy.exc import OperationalError

    return OperationalError("SELECT 1", {}, Exception('connection to server at "127.0.0.1", port 9 failed: '
                                                      "Connection refused\n\tIs the server running on that host?"))


@pytest.mark.parametrize("make, expected, also", [
    (lambda: __import__("fenced_k8s_executor.config", fromlist=["x"]).FencedConfigError(
        "Invalid [fenced_kubernetes_executor] mode = 'enforcing'; accepted values: enforce | audit | off"),
     "Invalid [fenced_kubernetes_executor] mode = 'enforcing'; accepted values: enforce | audit | off", ""),
    (lambda: __import__("kubernetes.config", fromlist=["x"]).ConfigException("Service host/port is not set."),
     "no Kubernetes client configuration (Service host/port is not set.): set [kubernetes_executor] config_file",
     "in_cluster = False"),
    (lambda: __import__("kubernetes.client", fromlist=["x"]).ApiException(status=403, reason="Forbidden"),
     "the Kubernetes API server answered 403 Forbidden", ""),
    (_unreachable, "the Kubernetes API server at https://127.0.0.1:9 did not answer: ", "[Errno 111] Connection refused"),
    (_db_down, 'the metadata database could not be read: connection to server at "127.0.0.1", port 9 failed: '
               "Connection refused", ""),
    (lambda: RuntimeError("x" * 1000 + "\nsecond line"), "RuntimeError: " + "x" * 297 + "...", ""),
])
def test_a_failure_is_one_line_naming_what_failed(make, expected, also):
    from fenced_k8s_executor.cli import failure

    line = failure(make())
    assert line.startswith(expected) and also in line and "\n" not in line
