"""The ``[fenced_kubernetes_executor]`` options, parsed and validated once at executor start.

Bad values fail loudly at start (naming the option and the accepted values) rather than
silently falling back: a fence that is quietly off is worse than a scheduler that won't start.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any, Callable

from fenced_k8s_executor.names import CONFIG_SECTION


class Mode(str, enum.Enum):
    """How the fences act on a verdict."""

    ENFORCE = "enforce"  # decide, report and act (drop jobs, swallow events, delete pods)
    AUDIT = "audit"  # decide and report exactly as enforce, but act like the stock executor
    OFF = "off"  # the stock executor, plus pod identity metadata


class FencedConfigError(ValueError):
    """Raised at executor start for an invalid ``[fenced_kubernetes_executor]`` value."""


#: option -> (default, description); the single source for provider info and docs.
OPTIONS: dict[str, tuple[str, str]] = {
    "mode": ("enforce", "enforce | audit | off. audit decides and reports but never drops or deletes."),
    "sweep_interval": ("60", "Seconds between sweeps for pods of superseded launches; 0 disables."),
    "sweep_page_size": ("1000", "Pods per metadata-only list page in the sweep (1-5000)."),
    "launch_claim": ("True", "Mint the launch token into the workload JWT as an extra claim."),
    "worker_entrypoint": (
        "True",
        "Start pods through fenced_k8s_executor.worker, which exits 0 on a stale launch; an image"
        " without the package falls back to the stock Task SDK entrypoint.",
    ),
    "deployment_id": (
        "",
        "Names this Airflow deployment on its pods; fences delete only pods stamped with it. Empty:"
        " derived from the metadata database's own identity (PostgreSQL: system identifier, database"
        " and schema); required when that cannot be read and the DB address is a loopback or socket.",
    ),
    "run_gate": (
        "True",
        "api-server plugin: answer 409 stale_executor_launch to /run from a superseded launch.",
    ),
    "metrics_executor_name": (
        "KubernetesExecutor",
        "Executor name on Airflow's executor gauges (executor_class_name tag, and the metric name"
        " suffix with several executors). Default: the stock name, so dashboards keep working.",
    ),
}

_TRUE = {"true", "t", "1", "yes", "y", "on"}
_FALSE = {"false", "f", "0", "no", "n", "off"}


@dataclass(frozen=True)
class FencedConfig:
    mode: Mode = Mode.ENFORCE
    sweep_interval: float = 60.0
    sweep_page_size: int = 1000
    launch_claim: bool = True
    worker_entrypoint: bool = True
    run_gate: bool = True
    deployment_id: str = ""
    metrics_executor_name: str = "KubernetesExecutor"

    @property
    def enforcing(self) -> bool:
        return self.mode is Mode.ENFORCE

    @property
    def fencing(self) -> bool:
        """True when verdicts are computed (enforce or audit)."""
        return self.mode is not Mode.OFF


def _fail(option: str, value: Any, accepted: str) -> FencedConfigError:
    return FencedConfigError(
        f"Invalid [{CONFIG_SECTION}] {option} = {value!r}; accepted values: {accepted}"
    )


def _parse_bool(option: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise _fail(option, raw, "True or False")


def _parse_number(option: str, raw: str, kind: Callable[[str], Any], low: float, high: float) -> Any:
    try:
        value = kind(raw.strip())
    except ValueError:
        raise _fail(option, raw, f"a number from {low:g} to {high:g}") from None
    if not low <= value <= high:
        raise _fail(option, raw, f"a number from {low:g} to {high:g}")
    return value


_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def _parse_deployment_id(raw: str) -> str:
    text = raw.strip()
    if text and not _LABEL_VALUE.match(text):
        raise _fail("deployment_id", raw, "empty, or a Kubernetes label value (1-63 of [A-Za-z0-9-_.], alphanumeric ends)")
    return text


def parse(raw: dict[str, str]) -> FencedConfig:
    """Build a FencedConfig from raw option strings (missing options take their defaults)."""
    unknown = set(raw) - set(OPTIONS)
    if unknown:
        raise FencedConfigError(
            f"Unknown [{CONFIG_SECTION}] option(s) {sorted(unknown)}; accepted options: {sorted(OPTIONS)}"
        )
    value = {name: raw.get(name, default) for name, (default, _) in OPTIONS.items()}
    mode_text = value["mode"].strip().lower()
    try:
        mode = Mode(mode_text)
    except ValueError:
        raise _fail("mode", value["mode"], " | ".join(m.value for m in Mode)) from None
    metrics_executor_name = value["metrics_executor_name"].strip()
    if not metrics_executor_name.isidentifier():
        raise _fail("metrics_executor_name", value["metrics_executor_name"],
                    "a non-empty identifier, e.g. KubernetesExecutor or FencedKubernetesExecutor")
    return FencedConfig(
        mode=mode,
        sweep_interval=_parse_number("sweep_interval", value["sweep_interval"], float, 0, 86400),
        sweep_page_size=_parse_number("sweep_page_size", value["sweep_page_size"], int, 1, 5000),
        launch_claim=_parse_bool("launch_claim", value["launch_claim"]),
        worker_entrypoint=_parse_bool("worker_entrypoint", value["worker_entrypoint"]),
        run_gate=_parse_bool("run_gate", value["run_gate"]),
        deployment_id=_parse_deployment_id(value["deployment_id"]),
        metrics_executor_name=metrics_executor_name,
    )


def load(conf: Any) -> FencedConfig:
    """Read the section from an Airflow config object (global ``conf`` or a team ``ExecutorConf``)."""
    raw = {}
    for name in OPTIONS:
        text = conf.get(CONFIG_SECTION, name, fallback=None)
        if text is not None:
            raw[name] = str(text)
    return parse(raw)
