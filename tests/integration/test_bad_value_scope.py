"""A bad ``[fenced_kubernetes_executor]`` value stops only what it governs (issue 54).

Before, the ``fenced_run_gate`` plugin, which every process that loads Airflow's plugins loads
from the package's entry point, stopped each of them on a bad value: the stock executor's
scheduler, ``airflow plugins``, ``dags test``, the dag-processor, the triggerer and the Task SDK's
plugin loader inside task pods; the package-only rollout step was not inert, and neither rollback
route escaped a bad value. Now the scheduler and the api-server of a deployment whose ``[core]
executor`` is the fenced executor, and ``airflow fenced-k8s``, stop naming it
(``test_config_fails_closed.py``); every other process logs one warning and goes on. The likeliest
bad value, an unquoted ``mode: off`` in Helm values (``mode = false``), is named as such.

Each process runs through the real ``airflow`` entry point (the task pod's step through the Task
SDK's own plugin loader), configured by its environment only; a long-running one is stopped once
it shows it went past its plugins (a line it logs after loading them). Three at a time, about 1-2
minutes together on a 2-core machine.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_process import Done, airflow_env, run_airflow
from fenced_k8s_executor.names import EXECUTOR_CLASS_PATH

pytestmark = pytest.mark.integration

BAD = {"AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE": "false"}  # `mode: off` unquoted in a Helm values file
STOCK = {"AIRFLOW__CORE__EXECUTOR": "KubernetesExecutor"}
WARNED = "mode = 'false': a YAML boolean"
DAG = '''
from airflow.sdk import dag, task

@dag(dag_id="scope_probe", schedule=None)
def scope_probe():
    @task
    def hello():
        return 1

    hello()

scope_probe()
'''
TASK_POD_PLUGINS = ("from airflow.sdk.plugins_manager import integrate_macros_plugins\n"
                    "integrate_macros_plugins()  # what the task runner does before it runs the task\n"
                    "print('@@TASK_CODE_WOULD_RUN@@', flush=True)\n")


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]  # airflow arguments; () for the task pod's step
    variables: dict
    went_on: str | None  # a line that shows the process went past its plugins (regex), or None: it exits 0
    warned: str = WARNED  # what its one warning says


def run_until(args: list[str], env: dict, marker: str, wait: float = 180) -> tuple[Done, bool]:
    """``args`` until a line matches ``marker`` (then the process group is ended), it exits, or
    ``wait`` seconds pass; (what it printed, whether the marker appeared)."""
    proc = subprocess.Popen(args, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    lines, seen = [], threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if re.search(marker, line):
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = threading.Event()
    while not seen.is_set() and proc.poll() is None and not deadline.wait(0.2):
        wait -= 0.2
        if wait <= 0:
            break
    code = proc.poll()
    if code is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    reader.join(timeout=30)
    return Done(code, "".join(lines), ""), seen.is_set()


def _airflow() -> str:
    return str(Path(sys.executable).with_name("airflow"))


CASES = {
    # the stock executor's scheduler: the package-only step and the rollback to stock
    "stock_scheduler": Case(("scheduler",), STOCK, r"Adopting or resetting orphaned tasks|Starting the scheduler"),
    # an api-server whose schedulers run the stock executor: no launch carries a claim to check
    # no bad value, but the section set while the executor is stock (a lost AIRFLOW__CORE__EXECUTOR override)
    "stock_scheduler_with_the_section": Case(("scheduler",), {**STOCK, "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE": "audit"},
                                             r"Adopting or resetting orphaned tasks|Starting the scheduler",
                                             "[fenced_kubernetes_executor] is set but [core] executor = KubernetesExecutor"),
    "stock_api_server": Case(("api-server", "-H", "127.0.0.1", "-p", "{port}"), STOCK, r"Application startup complete"),
    "dag_processor": Case(("dag-processor",), {}, r"scope_probe|DagFileProcessorManager|Processing files|Searching for files"),
    "triggerer": Case(("triggerer",), {}, r"Starting the triggerer|TriggererJobRunner|trigger runner"),
    # --verbose: `airflow plugins` silences every log line without it (Airflow's own choice), ours too
    "plugins": Case(("plugins", "--verbose"), {}, None),
    "dags_test": Case(("dags", "test", "scope_probe"), {}, None),
    "task_pod": Case((), {}, None),
}


@pytest.fixture(scope="module")
def outcomes(metadata_db, emulator_session, tmp_path_factory) -> dict[str, tuple[Done, bool]]:
    url = metadata_db.url.render_as_string(hide_password=False)
    from fenced_k8s_lab.postgres import free_port

    def one(name: str) -> tuple[Done, bool]:
        case = CASES[name]
        home = tmp_path_factory.mktemp(name)
        env = airflow_env(url, home, **{**BAD, **case.variables})
        (home / "dags" / "scope_probe.py").write_text(DAG)
        kubeconfig = emulator_session.write_kubeconfig(str(home / "kubeconfig"), namespace="airflow")
        env.update(AIRFLOW__KUBERNETES_EXECUTOR__IN_CLUSTER="False", AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE=kubeconfig,
                   AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE="airflow")
        if not case.args:
            done = subprocess.run([sys.executable, "-c", TASK_POD_PLUGINS], env=env, capture_output=True, text=True,
                                  timeout=300, cwd=home)
            return Done(done.returncode, done.stdout, done.stderr), "@@TASK_CODE_WOULD_RUN@@" in done.stdout
        args = [a.format(port=free_port()) for a in case.args]
        if case.went_on is None:
            done = run_airflow(args, env, wait=240)
            return done, done.returncode == 0
        return run_until([_airflow(), *args], env, case.went_on, wait=240)

    with ThreadPoolExecutor(3) as pool:
        return dict(zip(CASES, pool.map(one, CASES)))


@pytest.mark.parametrize("process", [name for name, case in CASES.items() if case.warned == WARNED])
def test_a_bad_value_warns_once_and_the_process_goes_on(outcomes, process):
    done, went_on = outcomes[process]
    assert went_on, f"{process} did not go on:\n{done.output[-4000:]}"
    warnings = [line for line in done.output.splitlines() if "fenced_k8s_executor:" in line]
    assert len(warnings) == 1, f"{process}: {len(warnings)} warnings:\n{done.output[-4000:]}"
    assert WARNED in warnings[0] and 'quote it, mode: "off"' in warnings[0] and "goes on without them" in warnings[0]
    assert "Traceback" not in done.output, done.output[-4000:]


def test_the_stock_scheduler_says_in_one_line_that_the_section_is_not_loaded(outcomes):
    """Audit on the stock executor reports nothing; the scheduler says why, once, and goes on."""
    done, went_on = outcomes["stock_scheduler_with_the_section"]
    assert went_on, done.output[-4000:]
    warnings = [line for line in done.output.splitlines() if "fenced_k8s_executor:" in line]
    assert len(warnings) == 1 and CASES["stock_scheduler_with_the_section"].warned in warnings[0], done.output[-4000:]
    assert "an audit reports nothing" in warnings[0] and EXECUTOR_CLASS_PATH in warnings[0]


def test_airflow_plugins_still_lists_the_gate_plugin_without_its_middleware(outcomes):
    done, _ = outcomes["plugins"]
    assert "fenced_run_gate" in done.output, done.output[-3000:]
    assert "FencedRunGateMiddleware" not in done.output, done.output[-3000:]


def test_the_fenced_scheduler_and_api_server_still_refuse_it(metadata_db, tmp_path):
    """What the value governs stops, naming it and the fix."""
    url = metadata_db.url.render_as_string(hide_password=False)
    from fenced_k8s_lab.postgres import free_port

    commands = {"scheduler": ["scheduler"], "api-server": ["api-server", "-H", "127.0.0.1", "-p", str(free_port())],
                "cli": ["fenced-k8s", "pods"]}
    with ThreadPoolExecutor(3) as pool:
        done = dict(zip(commands, pool.map(
            lambda item: run_airflow(item[1], airflow_env(url, tmp_path / item[0], **BAD), wait=150),
            commands.items())))
    for name, result in done.items():
        assert result.returncode not in (None, 0), f"{name} kept running:\n{result.output[-3000:]}"
        assert WARNED in result.output and 'mode: "off"' in result.output, result.output[-3000:]
        assert "goes on without them" not in result.output, result.output[-3000:]
