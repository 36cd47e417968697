"""The ``[fenced_kubernetes_executor]`` options, parsed and validated once at executor start.

Bad values fail loudly at start (naming the option and the accepted values) rather than
silently falling back: a fence that is quietly off is worse than a scheduler that won't start.
So do names that miss the section: an option it does not know, and an environment variable or
configuration section named close to it (``AIRFLOW__FENCED_KUBERNETES__MODE=audit``), which Airflow
would never hand to the executor, leaving it in enforce during the rollout phase meant to observe.
"""

from __future__ import annotations

import difflib
import enum
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from fenced_k8s_executor.launch import LABEL_VALUE
from fenced_k8s_executor.names import CONFIG_SECTION


class Mode(str, enum.Enum):
    """How the fences act on a verdict."""

    ENFORCE = "enforce"  # decide, report and act (drop jobs, swallow events, delete pods)
    AUDIT = "audit"  # decide and report exactly as enforce, but act like the stock executor
    OFF = "off"  # the stock executor: new pods carry no fencing metadata


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
        "Names this Airflow deployment on its pods; fences delete only pods stamped with it (and launched"
        " by this database). Empty: the id stored in the metadata database (Airflow Variable"
        " fenced_k8s_executor.deployment_id, written by the first fenced scheduler). Set it on a"
        " deployment whose database is a copy of another's (a restored snapshot, a clone).",
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


#: What YAML 1.1 (Helm's values) reads as a boolean, as Airflow then renders it into airflow.cfg.
YAML_BOOLEANS = {"false", "true", "no", "yes", "n", "y", "on"}


def _mode_refused(raw: str, text: str) -> FencedConfigError:
    accepted = " | ".join(m.value for m in Mode)
    if text in YAML_BOOLEANS:  # `mode: off` unquoted in a Helm values file arrives as `mode = false`
        return FencedConfigError(
            f"Invalid [{CONFIG_SECTION}] mode = {raw!r}: a YAML boolean, not a mode. An unquoted `mode: off` in a "
            f"Helm values file (YAML reads off, no and false as false) is rendered as mode = false: quote it, "
            f'mode: "off"; accepted values: {accepted}')
    return _fail("mode", raw, accepted)


def _parse_deployment_id(raw: str) -> str:
    text = raw.strip()
    if text and not LABEL_VALUE.fullmatch(text):
        raise _fail("deployment_id", raw, "empty, or a Kubernetes label value (1-63 of [A-Za-z0-9-_.], alphanumeric ends)")
    return text


def _nearest_option(key: str) -> str | None:
    found = difflib.get_close_matches(key, OPTIONS, n=1, cutoff=0.6)
    return found[0] if found else None


def unknown_options(keys: Iterable[str]) -> list[str]:
    """One problem per key the section holds that is not an option, naming the nearest option."""
    problems = []
    for key in sorted(set(keys) - set(OPTIONS)):
        nearest = _nearest_option(key)
        hint = f"did you mean {nearest!r}? " if nearest else ""
        problems.append(f"unknown [{CONFIG_SECTION}] option {key!r}: {hint}accepted options: {', '.join(OPTIONS)}")
    return problems


def _edits(a: str, b: str) -> int:
    """Levenshtein distance: insertions, deletions and substitutions."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


#: A section name at most this many edits from ours is taken for a typo of it.
SECTION_EDITS = 3


def near_our_section(name: str) -> bool:
    """Whether a section name reads as ours mistyped: it is ours in another spelling (case,
    hyphens), starts with ``fenced`` (``fenced_k8s_executor``, ``fenced_kubernetes``) or is a few
    edits from it. Ours itself is not near."""
    text = name.lower()
    if text == CONFIG_SECTION:
        return False
    return text.startswith("fence") or _edits(text.replace("-", "_"), CONFIG_SECTION) <= SECTION_EDITS


_ENV_PREFIX = "AIRFLOW__"
OUR_ENV_PREFIX = f"{_ENV_PREFIX}{CONFIG_SECTION.upper()}__"


def _suggested_variable(prefix: str, section: str, key: str) -> str:
    if not key and section.startswith(CONFIG_SECTION + "_"):  # AIRFLOW__FENCED_KUBERNETES_EXECUTOR_MODE
        key = section[len(CONFIG_SECTION) + 1:]
    option = key if key in OPTIONS else _nearest_option(key) or "<option>"
    return f"{prefix}{CONFIG_SECTION.upper()}__{option.upper()}"


def misnamed_variables(names: Iterable[str]) -> list[str]:
    """One problem per environment variable that reads as one of our options but that Airflow
    never hands to the executor: a section named close to ours, ours with a wrong prefix or case,
    or a team's variable (``AIRFLOW__<TEAM>___<SECTION>__<KEY>``) naming no option. Variables
    under our exact prefix are options, judged by ``unknown_options``."""
    problems = []
    for name in sorted(names):
        if name.startswith(OUR_ENV_PREFIX) or not name.upper().startswith("AIRFLOW_"):
            continue
        rest = name.upper()[len("AIRFLOW"):].lstrip("_")
        team, teamed, after_team = rest.partition("___")
        readings = [(f"{_ENV_PREFIX}{team}___", after_team)] if teamed else []
        for prefix, reading in readings + [(_ENV_PREFIX, rest)]:
            section, _, key = reading.lower().partition("__")
            if section == CONFIG_SECTION and name == prefix + reading and key in OPTIONS:
                break  # a team's option, spelled as Airflow reads it
            if section == CONFIG_SECTION or near_our_section(section):
                problems.append(f"environment variable {name} is not read as a [{CONFIG_SECTION}] option; "
                                f"did you mean {_suggested_variable(prefix, section, key)}?")
                break
    return problems


def misnamed_sections(sections: Iterable[str], known: Iterable[str] = ()) -> list[str]:
    """One problem per configuration-file section named close to ours (a team's section,
    ``<team>=<section>``, by its section), unless Airflow itself knows the section."""
    known = set(known)
    problems = []
    for name in sorted(sections):
        team, _, section = name.rpartition("=")
        if name not in known and near_our_section(section):
            ours = f"{team}={CONFIG_SECTION}" if team else CONFIG_SECTION
            problems.append(f"configuration section [{name}] is not read by fenced-k8s-executor; did you mean [{ours}]?")
    return problems


def _refuse(problems: list[str]) -> FencedConfigError:
    return FencedConfigError("Invalid fenced-k8s-executor configuration: " + "; ".join(problems))


def parse(raw: dict[str, str]) -> FencedConfig:
    """Build a FencedConfig from raw option strings (missing options take their defaults)."""
    problems = unknown_options(raw)
    if problems:
        raise _refuse(problems)
    value = {name: raw.get(name, default) for name, (default, _) in OPTIONS.items()}
    mode_text = value["mode"].strip().lower()
    try:
        mode = Mode(mode_text)
    except ValueError:
        raise _mode_refused(value["mode"], mode_text) from None
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
    """Read the section from an Airflow config object (global ``conf`` or a team ``ExecutorConf``).

    The whole section is read through ``getsection`` (the configuration file and the environment,
    merged by Airflow), so a key the executor does not know stops the start, as does an
    environment variable or a file section named close to ours (``misnamed_*``); every problem
    found is named in one error."""
    from airflow.configuration import conf as airflow_conf

    keys = {name[len(OUR_ENV_PREFIX):].lower() for name in os.environ if name.startswith(OUR_ENV_PREFIX)}
    problems = misnamed_variables(os.environ)
    problems += misnamed_sections(airflow_conf.sections(), getattr(airflow_conf, "configuration_description", ()))
    try:
        keys |= set(conf.getsection(CONFIG_SECTION) or ())
    except Exception as error:  # e.g. AIRFLOW__..._MODE_CMD: Airflow runs *_cmd only for secrets
        problems.append(f"[{CONFIG_SECTION}] cannot be read: {error}")
    problems = unknown_options(keys) + problems
    if problems:
        raise _refuse(problems)
    raw = {}
    for name in OPTIONS:
        text = conf.get(CONFIG_SECTION, name, fallback=None)
        if text is not None:
            raw[name] = str(text)
    return parse(raw)
