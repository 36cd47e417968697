"""What a process runs (``loaded``): its ``airflow`` command, the executors ``[core] executor``
names, whether the section is set, and so whether a bad value stops it (issue 54). The processes
themselves run in tests/integration/test_bad_value_scope.py; Airflow's own config parser here."""

from __future__ import annotations

import configparser

import pytest

from fenced_k8s_executor import loaded
from fenced_k8s_executor.names import EXECUTOR_CLASS_PATH


@pytest.mark.parametrize("argv, command", [
    (["/home/airflow/.local/bin/airflow", "scheduler"], "scheduler"),
    (["/usr/bin/airflow", "api-server", "-p", "8080"], "api-server"),
    (["/venv/lib/python3.11/site-packages/airflow/__main__.py", "dag-processor"], "dag-processor"),
    (["airflow", "--verbose", "plugins"], "plugins"),
    (["airflow"], None),
    (["python", "-c", "..."], None),  # a task pod's bootstrap
    (["/venv/bin/pytest", "tests"], None),
    ([], None),
])
def test_the_airflow_command_of_a_process(argv, command):
    assert loaded.airflow_command(argv) == command


@pytest.mark.parametrize("value, paths", [
    ("KubernetesExecutor", ["KubernetesExecutor"]),
    (EXECUTOR_CLASS_PATH, [EXECUTOR_CLASS_PATH]),
    (f"CeleryExecutor, k8s:{EXECUTOR_CLASS_PATH}", ["CeleryExecutor", EXECUTOR_CLASS_PATH]),
    (f"LocalExecutor;team1={EXECUTOR_CLASS_PATH}", ["LocalExecutor", EXECUTOR_CLASS_PATH]),
    ("", []),
])
def test_the_executors_core_executor_names(value, paths):
    assert loaded.executor_paths(value) == paths


def _conf(text: str = "", executor: str = "KubernetesExecutor") -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read_string(f"[core]\nexecutor = {executor}\n{text}")
    return parser


def test_the_section_is_set_by_the_file_or_the_environment_not_by_defaults(monkeypatch):
    for name in [n for n in __import__("os").environ if n.startswith("AIRFLOW__FENCED_KUBERNETES_EXECUTOR__")]:
        monkeypatch.delenv(name)
    assert not loaded.section_set(_conf())
    assert not loaded.section_set(_conf("[fenced_kubernetes_executor]\n# mode = audit\n"))  # a generated file
    assert loaded.section_set(_conf("[fenced_kubernetes_executor]\nmode = audit\n"))
    monkeypatch.setenv("AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE", "audit")
    assert loaded.section_set(_conf())


def test_the_executor_line_says_whether_the_fences_are_loaded(monkeypatch):
    monkeypatch.setenv("AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE", "audit")
    assert loaded.executor_line(_conf(executor=EXECUTOR_CLASS_PATH)).endswith("(the fenced executor)")
    assert "AND the stock KubernetesExecutor" in loaded.executor_line(
        _conf(executor=f"KubernetesExecutor,{EXECUTOR_CLASS_PATH}"))
    assert loaded.stock_warning(_conf(executor=EXECUTOR_CLASS_PATH)) is None
    warning = loaded.stock_warning(_conf())
    assert warning.startswith("[fenced_kubernetes_executor] is set but [core] executor = KubernetesExecutor")
    assert "an audit reports nothing" in warning and EXECUTOR_CLASS_PATH in warning


@pytest.mark.parametrize("command, executor, stops", [
    ("scheduler", EXECUTOR_CLASS_PATH, True),
    ("api-server", EXECUTOR_CLASS_PATH, True),
    ("scheduler", "KubernetesExecutor", False),
    ("api-server", "KubernetesExecutor", False),  # a stock scheduler mints no launch claim: nothing to gate
    ("dag-processor", EXECUTOR_CLASS_PATH, False),
    ("triggerer", EXECUTOR_CLASS_PATH, False),
    ("plugins", EXECUTOR_CLASS_PATH, False),
    ("dags", EXECUTOR_CLASS_PATH, False),
    (None, EXECUTOR_CLASS_PATH, False),  # a task pod
])
def test_a_bad_value_stops_only_what_it_governs(command, executor, stops):
    assert loaded.governs(_conf(executor=executor), command) is stops


def test_plugin_load_warns_once_where_it_governs_nothing(monkeypatch):
    """One warning however often plugins load (Airflow's and the Task SDK's loaders both may)."""
    from airflow.configuration import conf

    monkeypatch.setattr(loaded, "_warned", set())
    monkeypatch.setattr(loaded.log, "warning", lambda message: warned.append(message))
    warned: list[str] = []
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", EXECUTOR_CLASS_PATH)
    monkeypatch.setenv("AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE", "audti")
    assert loaded.plugin_load(conf, ["/bin/airflow", "dag-processor"]) is None
    assert loaded.plugin_load(conf, ["/bin/airflow", "dag-processor"]) is None
    (line,) = warned
    assert "mode = 'audti'" in line and "airflow dag-processor does not run the fences" in line
    with pytest.raises(SystemExit, match="mode = 'audti'"):
        loaded.plugin_load(conf, ["/bin/airflow", "api-server"])
