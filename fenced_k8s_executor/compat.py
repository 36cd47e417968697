"""Version checks in one place, run once at import (``executor.py``): a scheduler on a combination
the fences cannot work with stops at start with a message naming the installed and the supported
versions; one on a newer, untested release runs with a loud warning naming both.

The policy (docs/versions.md):

- a provider hook the fences override or call is missing, or no longer accepts the arguments the
  fences pass, or airflow-core does not pre-assign the launch token: refused
  (``IncompatibleProviderError``), whatever the version numbers say. Executor keys of either kind
  (``TaskInstanceKey``, or ``TaskInstanceUuid`` once core has ``BaseExecutor.get_task_key``, 3.4)
  are taken as the provider makes them (``provider_compat.executor_key``);
- installed versions older than the supported range: refused;
- installed versions newer than the range tested in CI (``TESTED_AIRFLOW``/``TESTED_PROVIDER``)
  that pass every check above: accepted, with a WARNING at import and again when the scheduler
  starts the executor (``Support.warning``);
- otherwise: supported, silent.

What differs between the supported provider releases lives in ``provider_compat``.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

log = logging.getLogger("fenced_k8s_executor")

#: Declared in pyproject.toml; what the CI matrix (.ci/matrix) runs, at both ends of each range.
SUPPORTED_AIRFLOW = ">=3.2.2,<3.5"
SUPPORTED_PROVIDER = ">=10.23.0,<10.26"
#: The combinations the CI matrix measured (README "Supported"). 3.4 is supported from its betas:
#: tested on 3.4.0b2 until 3.4.0 ships.
TESTED_AIRFLOW = ("3.2.2", "3.3.2", "3.4.0b2")
TESTED_PROVIDER = ("10.23.0", "10.24.0", "10.25.0")

AIRFLOW_DIST = "apache-airflow-core"
PROVIDER_DIST = "apache-airflow-providers-cncf-kubernetes"

#: KubernetesExecutor methods we override or call, with the arguments the fences pass
#: (positional count after self, keyword names): each must exist and accept them.
REQUIRED_EXECUTOR_HOOKS = {
    "start": (0, ()),
    "sync": (0, ()),
    "end": (0, ()),
    "execute_async": (2, ("queue", "executor_config")),
    "_process_workloads": (1, ()),
    "_should_create_pod_for_job": (1, ()),
    "_discard_stale_pod_creation_task": (1, ()),
    "_create_pods_sequentially": (0, ()),
    "_create_pods_concurrently": (0, ()),
    "_handle_pod_publish_error": (2, ()),
    "_change_state": (1, ("session",)),
    "adopt_launched_task": (3, ()),
    "revoke_task": (0, ("ti",)),
    "_list_pods": (1, ()),
    # guards (API faults) and the 410-surviving watcher
    "_adopt_completed_pods": (1, ()),
    "get_pod_combined_search_str_to_pod_map": (0, ()),
    "try_adopt_task_instances": (1, ()),
    "_make_safe_label_value": (1, ()),
}
#: What ``provider_compat.executor_key`` calls when the provider keys by task-instance UUID (3.4).
UUID_KEY_HOOKS = {"get_task_key": (1, ())}

#: AirflowKubernetesScheduler methods we wrap on the executor's instance (both creation paths
#: build every pod through ``_build_pod_request``; the watcher factory is replaced) or call.
REQUIRED_SCHEDULER_HOOKS = {
    "_build_pod_request": (1, ()),
    "run_next": (1, ()),
    "run_next_batch": (1, ()),
    "_make_kube_watcher": (1, ()),
    "patch_pod_revoked": (0, ("pod_name", "namespace")),
    "patch_pod_executor_done": (0, ("pod_name", "namespace")),
}

#: KubernetesJobWatcher methods ``watching.ResilientJobWatcher`` overrides or calls.
REQUIRED_WATCHER_HOOKS = {
    "run": (0, ()),
    "_run": (4, ()),
    "_pod_events": (2, ()),
    "process_status": (6, ()),
    "process_error": (1, ()),
}


class IncompatibleProviderError(ImportError):
    pass


def _installed(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def _accepts(func: object, positional: int, keywords: tuple[str, ...]) -> bool:
    """Whether ``func`` (a function defined on a class) accepts self, ``positional`` positional
    arguments and ``keywords`` as keyword arguments, the way the fences call it."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # no signature to read (a builtin): only callability is known
        return True
    this = [] if inspect.ismethod(func) else [None]  # a classmethod read off its class is bound already
    try:
        signature.bind(*this, *([None] * positional), **{name: None for name in keywords})
    except TypeError:
        return False
    return True


def _hook_problems(cls: type, hooks: dict, prefix: str = "") -> list[str]:
    problems = []
    for name, (positional, keywords) in hooks.items():
        func = getattr(cls, name, None)
        if not callable(func):
            problems.append(f"{prefix}{name} is missing")
        elif not _accepts(func, positional, keywords):
            problems.append(f"{prefix}{name}{inspect.signature(func)} does not take the arguments the fences pass")
    return problems


def _tested(installed: str, tested: tuple[str, ...]) -> str:
    return f"{installed} (tested: {', '.join(tested)})"


@dataclass(frozen=True)
class Support:
    """What ``check`` found: the installed versions and, for a newer untested release, why."""

    airflow: str
    provider: str
    untested: tuple[str, ...] = field(default=())

    @property
    def warning(self) -> str | None:
        if not self.untested:
            return None
        return (
            "fenced-k8s-executor runs on an UNTESTED combination: "
            f"{'; '.join(self.untested)}. Installed: apache-airflow {self.airflow}, "
            f"apache-airflow-providers-cncf-kubernetes {self.provider}; tested: apache-airflow "
            f"{', '.join(TESTED_AIRFLOW)} with apache-airflow-providers-cncf-kubernetes "
            f"{', '.join(TESTED_PROVIDER)} (supported {SUPPORTED_AIRFLOW}, {SUPPORTED_PROVIDER}). Every hook "
            "the fences use is present and takes the fences' arguments, but the fences have not been "
            "run against this release: check docs/versions.md, or pin the provider/Airflow back."
        )


def _incompatible(problems: list[str], airflow: str, provider: str) -> IncompatibleProviderError:
    return IncompatibleProviderError(
        "fenced-k8s-executor cannot fence this KubernetesExecutor: "
        f"{'; '.join(problems)}. Installed: apache-airflow {airflow}, "
        f"apache-airflow-providers-cncf-kubernetes {provider}; supported: apache-airflow "
        f"{SUPPORTED_AIRFLOW}, apache-airflow-providers-cncf-kubernetes {SUPPORTED_PROVIDER}."
    )


def _version_verdict(name: str, installed: str, supported: str, tested: tuple[str, ...]) -> tuple[str | None, str | None]:
    """(refusal, untested) for one distribution: older than ``supported`` refuses, newer than it
    is untested; unparsable or absent versions are left to the hook checks."""
    try:
        got = Version(installed)
    except InvalidVersion:
        return None, None
    spec = SpecifierSet(supported)
    if got in spec or got.is_prerelease and Version(got.base_version) in spec:
        return None, None
    floor = min(Version(s.version) for s in spec if s.operator == ">=")
    if got < floor:
        return f"{name} {installed} is older than the first supported release {floor}", None
    return None, f"{name} {_tested(installed, tested)} is newer than the supported {supported}"


def check(executor_cls: type, base_executor_cls: type, scheduler_cls: type, watcher_cls: type | None = None,
          *, airflow_version: str | None = None, provider_version: str | None = None) -> Support:
    """Raise IncompatibleProviderError when the fences cannot work with these classes or versions;
    otherwise return what was found, logging the warning of an untested newer release."""
    airflow = airflow_version or _installed(AIRFLOW_DIST)
    provider = provider_version or _installed(PROVIDER_DIST)
    problems = _hook_problems(executor_cls, REQUIRED_EXECUTOR_HOOKS)
    problems += _hook_problems(scheduler_cls, REQUIRED_SCHEDULER_HOOKS, "AirflowKubernetesScheduler.")
    if watcher_cls is not None:
        from fenced_k8s_executor import provider_compat

        problems += _hook_problems(watcher_cls, REQUIRED_WATCHER_HOOKS, "KubernetesJobWatcher.")
        problems += [f"KubernetesJobWatcher.__init__ does not take {name}"
                     for name in provider_compat.missing_watcher_args(watcher_cls)]
    if getattr(executor_cls, "supports_task_instance_uuid", False):
        problems += _hook_problems(executor_cls, UUID_KEY_HOOKS)
    if not hasattr(base_executor_cls, "pre_assigns_external_executor_id"):
        problems.append("BaseExecutor.pre_assigns_external_executor_id is missing (the scheduler does not "
                        "pre-assign the launch token)")
    untested = []
    for name, installed, supported, tested in (
            ("apache-airflow", airflow, SUPPORTED_AIRFLOW, TESTED_AIRFLOW),
            ("apache-airflow-providers-cncf-kubernetes", provider, SUPPORTED_PROVIDER, TESTED_PROVIDER)):
        refusal, newer = _version_verdict(name, installed, supported, tested)
        problems += [refusal] if refusal else []
        untested += [newer] if newer else []
    if problems:
        raise _incompatible(problems, airflow, provider)
    support = Support(airflow, provider, tuple(untested))
    if support.warning:
        log.warning(support.warning)
    return support
