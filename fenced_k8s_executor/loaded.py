"""What this process runs: its ``airflow`` command, the executors ``[core] executor`` names, and so
whether a bad ``[fenced_kubernetes_executor]`` value must stop it.

A bad value stops only what it governs: the scheduler and the api-server of a deployment whose
``[core] executor`` names the fenced executor (the executor's ``start()`` and the run gate), and
``airflow fenced-k8s``. Every other process that loads Airflow's plugins, and with them the
``fenced_run_gate`` entry point (the stock executor's scheduler, ``airflow plugins``, ``dags
test``, the dag-processor, the triggerer, task pods), logs one warning and goes on: the fences do
not run there, and stopping them would turn a typo into an outage of the stock path, rollback
included.

The other trap is the opposite one: the section set, the executor stock (a values file that lost
the ``AIRFLOW__CORE__EXECUTOR`` override). Audit on the stock executor reports nothing, which reads
as a quiet audit; the stock scheduler says so in one line, and so does ``airflow fenced-k8s``.
"""

from __future__ import annotations

import configparser
import logging
import os
import sys
from typing import Any

from fenced_k8s_executor.names import CONFIG_SECTION, EXECUTOR_CLASS_PATH

log = logging.getLogger("fenced_k8s_executor")

#: The processes a bad value stops when ``[core] executor`` names the fenced executor.
GOVERNED = ("scheduler", "api-server")
_PACKAGE = EXECUTOR_CLASS_PATH.split(".")[0] + "."
_warned: set[str] = set()


def airflow_command(argv: list[str] | None = None) -> str | None:
    """The ``airflow`` subcommand this process runs (``scheduler``, ``api-server``, ``plugins``...),
    or None when it is not the ``airflow`` program (a task pod's entrypoint, a test). The api-server's
    uvicorn and gunicorn workers keep their parent's arguments."""
    argv = sys.argv if argv is None else argv
    if not argv:
        return None
    program = argv[0]
    if os.path.basename(program) != "airflow" and not program.endswith(os.path.join("airflow", "__main__.py")):
        return None
    return next((arg for arg in argv[1:] if not arg.startswith("-")), None)


def executor_paths(value: str) -> list[str]:
    """The executors a ``[core] executor`` value names, in order: team sections (``;``,
    ``team=``) and aliases (``alias:path``) taken off."""
    paths = []
    for part in value.split(";"):
        for entry in part.rpartition("=")[2].split(","):
            path = entry.rpartition(":")[2].strip()
            if path:
                paths.append(path)
    return paths


def is_fenced(path: str) -> bool:
    """Whether an executor path is this package's executor (a subclass under another module is not
    recognised: it is not loaded here to find out)."""
    return path.startswith(_PACKAGE)


def core_executor(conf: Any) -> str:
    try:
        return str(conf.get("core", "executor", fallback="") or "")
    except Exception:  # a broken [core] is for Airflow to report
        return ""


def fenced_named(conf: Any) -> bool:
    return any(is_fenced(path) for path in executor_paths(core_executor(conf)))


def section_set(conf: Any) -> bool:
    """Whether the deployment sets any option of the section (``airflow.cfg`` or the environment);
    the provider's defaults alone do not count."""
    if any(name.upper().startswith(f"AIRFLOW__{CONFIG_SECTION.upper()}__") for name in os.environ):
        return True
    try:
        return bool(configparser.RawConfigParser.options(conf, CONFIG_SECTION))
    except (configparser.Error, TypeError):
        return False


def executor_line(conf: Any) -> str:
    """``[core] executor`` and whether it loads the fenced executor, in one line."""
    value = core_executor(conf) or "(not set)"
    if not fenced_named(conf):
        return f"[core] executor = {value} (not the fenced executor)"
    if any(path.rpartition(".")[2] == "KubernetesExecutor" for path in executor_paths(value)):
        return (f"[core] executor = {value} (the fenced executor AND the stock KubernetesExecutor: both would "
                "watch and adopt the same pods; list one of them)")
    return f"[core] executor = {value} (the fenced executor)"


def stock_warning(conf: Any) -> str | None:
    """The one line for a section that is set while the executor is stock, else None."""
    if fenced_named(conf) or not section_set(conf):
        return None
    return (f"[{CONFIG_SECTION}] is set but {executor_line(conf)}: nothing is fenced, stamped or reported, and an "
            f"audit reports nothing (that is not a quiet audit). Load {EXECUTOR_CLASS_PATH} (with the Helm chart: "
            "its AIRFLOW__CORE__EXECUTOR entry, docs/helm.md) or drop the section")


def start_fields(conf: Any) -> str:
    """What the fenced scheduler's start line adds: this build and what ``[core] executor`` says."""
    from fenced_k8s_executor.build import this_build

    return f"{this_build().log_fields()} core_executor={core_executor(conf) or '-'}"


def governs(conf: Any, command: str | None) -> bool:
    """Whether a bad value must stop this process (see the module's docstring)."""
    return command in GOVERNED and fenced_named(conf)


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def plugin_load(conf: Any, argv: list[str] | None = None) -> Any:
    """The section as the ``fenced_run_gate`` plugin reads it in any process: the ``FencedConfig``,
    or None for a bad value where it governs nothing (one warning). Where it governs, the process
    stops (``SystemExit``, the one exception Airflow's plugin loaders do not catch), naming the
    problem. The stock scheduler also warns once when the section is set but not loaded."""
    from fenced_k8s_executor import config

    command = airflow_command(argv)
    where = f"airflow {command}" if command else "this process"
    try:
        fence = config.load(conf)
    except config.FencedConfigError as error:
        if governs(conf, command):
            raise SystemExit(f"fenced_k8s_executor: {error}") from None
        _warn_once(f"fenced_k8s_executor: {error}. {where} does not run the fences and goes on without them"
                   f" (the launch gate is off here); the scheduler and api-server of a deployment whose [core]"
                   f" executor is {EXECUTOR_CLASS_PATH} refuse to start with this value")
        return None
    warning = stock_warning(conf) if command == "scheduler" else None
    if warning:
        _warn_once(f"fenced_k8s_executor: {warning}")
    return fence


def report(conf: Any) -> dict:
    """What ``airflow fenced-k8s version`` reports: this build, Airflow's and the provider's
    versions, the executor ``[core] executor`` names, and the section as the scheduler would read it."""
    from importlib.metadata import PackageNotFoundError, version

    from fenced_k8s_executor import config
    from fenced_k8s_executor.build import this_build

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    out = {**this_build().as_dict(), "apache-airflow": installed("apache-airflow-core") or installed("apache-airflow"),
           "apache-airflow-providers-cncf-kubernetes": installed("apache-airflow-providers-cncf-kubernetes"),
           "core_executor": core_executor(conf), "fenced_executor_loaded": fenced_named(conf),
           "section_set": section_set(conf), "mode": None, "config_error": None}
    try:
        out["mode"] = config.load(conf).mode.value
    except config.FencedConfigError as error:
        out["config_error"] = str(error)
    return out


def version_command(args: Any) -> None:
    """``airflow fenced-k8s version``: everything is reported, a bad value included (its line on
    stderr, exit code 1), so the command answers in a container that is only half configured."""
    from airflow.configuration import conf

    from fenced_k8s_executor.build import this_build

    found = report(conf)
    output = getattr(args, "output", "plain")
    if output == "json":
        import json

        print(json.dumps(found, indent=1))
    elif output == "yaml":
        import yaml

        print(yaml.safe_dump(found, sort_keys=False), end="")
    else:
        build = this_build()
        print(f"fenced-k8s-executor {build.version}")
        print(build.commit_line())
        print(f"apache-airflow {found['apache-airflow']}, apache-airflow-providers-cncf-kubernetes "
              f"{found['apache-airflow-providers-cncf-kubernetes']}")
        print(executor_line(conf))
        if found["mode"]:
            default = "" if found["section_set"] else " (not set: the default)"
            print(f"[{CONFIG_SECTION}] mode {found['mode']}{default}")
        warning = stock_warning(conf)
        if warning:
            print(f"WARNING: {warning}", file=sys.stderr)
    if found["config_error"]:
        raise SystemExit(f"airflow fenced-k8s version: {found['config_error']}")


def cli_header(conf: Any, output: str) -> None:
    """The lines ``airflow fenced-k8s pods`` opens with: this build and the executor ``[core]
    executor`` names (on stdout for the table, stderr for json/yaml), and the stock warning (stderr)."""
    from fenced_k8s_executor.build import this_build

    build = this_build()
    stream = sys.stdout if output in ("table", "plain") else sys.stderr
    print(f"fenced-k8s-executor {build.version} ({build.short_commit}); {executor_line(conf)}", file=stream)
    warning = stock_warning(conf)
    if warning:
        print(f"WARNING: {warning}", file=sys.stderr)
