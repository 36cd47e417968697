"""The fences' metrics as a statsd server receives them: real UDP datagrams from Airflow's own
statsd client, in a child process configured only by ``[metrics]`` variables, with Stats set up as
a scheduler sets it up (the executor's constructor, ``BaseExecutor.__init__``).

Plain statsd drops tags: before, ``fenced_k8s_executor.launch.dropped:1|c`` reached the wire and
audit and enforce counts merged. Now each metric that has tags also arrives with their values in
its name (``metrics.NAME_ORDER``); the tags stay on the name without them for the backends that
read tags (the influxdb format here); ``[metrics] legacy_names_on = False`` turns the names with
values off, as it does airflow-core's own. Three child processes at once, about 6 s.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

EMIT = """
from fenced_k8s_executor import FencedKubernetesExecutor, metrics
FencedKubernetesExecutor()  # Stats as the scheduler's executor initializes them
metrics.decision("pod.deleted", path="reconcile", reason="superseded", enforced=True, pod="ns/p")
metrics.decision("launch.dropped", path="pre_create", reason="superseded", enforced=False)
metrics.incr("api_error", {"call": "create", "status": "503"})
metrics.incr("watcher.error", {"error": "some.module.Error"})
metrics.timing("fence_check.duration", 0.004, {"path": "reconcile"})
metrics.incr("sweep.pods_scanned", count=7)
print("@@EMITTED@@", flush=True)
"""


def _datagrams(tmp_path, **variables: str) -> list[str]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update(AIRFLOW_HOME=str(tmp_path), AIRFLOW__METRICS__STATSD_ON="True",
                   AIRFLOW__METRICS__STATSD_HOST="127.0.0.1", AIRFLOW__METRICS__STATSD_PORT=str(server.getsockname()[1]),
                   AIRFLOW__METRICS__STATSD_PREFIX="airflow", **variables)
        done = subprocess.run([sys.executable, "-c", EMIT], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0 and "@@EMITTED@@" in done.stdout, done.stderr[-3000:]
        server.settimeout(0)  # every datagram was sent before the child exited: read what arrived
        lines = []
        while True:
            try:
                lines += server.recv(65535).decode().splitlines()
            except BlockingIOError:
                return lines


@pytest.fixture(scope="module")
def wire(tmp_path_factory) -> dict[str, list[str]]:
    cases = {"plain": {}, "influxdb": {"AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True"},
             "names_off": {"AIRFLOW__METRICS__LEGACY_NAMES_ON": "False"}}
    homes = {name: tmp_path_factory.mktemp(name) for name in cases}  # mktemp is not thread-safe
    with ThreadPoolExecutor(len(cases)) as pool:
        found = pool.map(lambda item: _datagrams(homes[item[0]], **item[1]), cases.items())
        return dict(zip(cases, found))


def ours(lines: list[str]) -> list[str]:
    return sorted(line for line in lines if line.startswith("airflow.fenced_k8s_executor."))


def test_plain_statsd_receives_the_dimensions_in_the_names(wire):
    lines = ours(wire["plain"])
    for expected in ("airflow.fenced_k8s_executor.pod.deleted.reconcile.superseded.enforce:1|c",
                     "airflow.fenced_k8s_executor.launch.dropped.pre_create.superseded.audit:1|c",
                     "airflow.fenced_k8s_executor.api_error.create.503:1|c",
                     "airflow.fenced_k8s_executor.watcher.error.some__module__Error:1|c",
                     "airflow.fenced_k8s_executor.sweep.pods_scanned:7|c"):
        assert expected in lines, lines
    assert [line for line in lines if line.startswith("airflow.fenced_k8s_executor.fence_check.duration.reconcile:")
            and line.endswith("|ms")], lines
    # and the totals, by the names without values, as before
    assert "airflow.fenced_k8s_executor.pod.deleted:1|c" in lines and "airflow.fenced_k8s_executor.api_error:1|c" in lines


def test_audit_and_enforce_counts_arrive_apart(wire):
    names = {line.split(":")[0] for line in ours(wire["plain"])}
    assert {n for n in names if n.endswith(".audit")} == {"airflow.fenced_k8s_executor.launch.dropped.pre_create.superseded.audit"}
    assert {n for n in names if n.endswith(".enforce")} == {"airflow.fenced_k8s_executor.pod.deleted.reconcile.superseded.enforce"}


def test_the_tags_stay_on_the_names_without_values(wire):
    lines = ours(wire["influxdb"])
    assert "airflow.fenced_k8s_executor.pod.deleted,path=reconcile,reason=superseded,mode=enforce:1|c" in lines, lines
    assert "airflow.fenced_k8s_executor.api_error,call=create,status=503:1|c" in lines, lines


def test_legacy_names_off_sends_the_names_without_values_only(wire):
    lines = ours(wire["names_off"])
    assert "airflow.fenced_k8s_executor.pod.deleted:1|c" in lines, lines
    assert not [line for line in lines if line.startswith("airflow.fenced_k8s_executor.pod.deleted.")], lines
