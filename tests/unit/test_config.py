"""[fenced_kubernetes_executor] options: defaults, parsing, and failures that name the option."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fenced_k8s_executor import config


def test_defaults():
    cfg = config.parse({})
    assert cfg.mode is config.Mode.ENFORCE and cfg.enforcing and cfg.fencing
    assert cfg.sweep_interval == 60 and cfg.sweep_page_size == 1000
    assert cfg.launch_claim and cfg.worker_entrypoint and cfg.run_gate


@pytest.mark.parametrize("text, mode", [("audit", config.Mode.AUDIT), (" OFF ", config.Mode.OFF), ("Enforce", config.Mode.ENFORCE)])
def test_mode_parsing(text, mode):
    assert config.parse({"mode": text}).mode is mode


@pytest.mark.parametrize(
    "raw, option, accepted",
    [
        ({"mode": "strict"}, "mode", "enforce | audit | off"),
        ({"sweep_interval": "-1"}, "sweep_interval", "a number from 0 to 86400"),
        ({"sweep_interval": "soon"}, "sweep_interval", "a number"),
        ({"sweep_page_size": "0"}, "sweep_page_size", "a number from 1 to 5000"),
        ({"launch_claim": "maybe"}, "launch_claim", "True or False"),
    ],
)
def test_bad_values_name_the_option_and_the_accepted_values(raw, option, accepted):
    with pytest.raises(config.FencedConfigError) as excinfo:
        config.parse(raw)
    message = str(excinfo.value)
    assert f"[fenced_kubernetes_executor] {option}" in message and accepted in message


@pytest.mark.parametrize("raw", ["false", "False", "FALSE", "no", "true", "on"])
def test_a_mode_read_as_a_yaml_boolean_says_to_quote_it(raw):
    """``mode: off`` unquoted in a Helm values file is YAML 1.1's false, rendered ``mode = false``
    (tests/helm renders it): the refusal names the cause and the fix (issue 54)."""
    with pytest.raises(config.FencedConfigError) as refused:
        config.parse({"mode": raw})
    text = str(refused.value)
    assert f"mode = {raw!r}: a YAML boolean" in text and 'quote it, mode: "off"' in text
    assert text.endswith("accepted values: enforce | audit | off")


def test_unknown_option_is_refused():
    with pytest.raises(config.FencedConfigError, match="accepted options"):
        config.parse({"mdoe": "audit"})


def test_load_reads_an_airflow_config_section():
    from airflow.configuration import conf

    conf.set("fenced_kubernetes_executor", "mode", "audit")
    try:
        assert config.load(conf).mode is config.Mode.AUDIT
    finally:
        conf.remove_option("fenced_kubernetes_executor", "mode")


# --- names that miss the section fail closed (issue 47) --------------------------------------------

#: The typos the issue found leaving enforce on, and what each refusal must name.
ISSUE_TYPOS = {
    "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODES": ["'modes'", "did you mean 'mode'"],
    "AIRFLOW__FENCED_KUBERNETES__MODE": ["AIRFLOW__FENCED_KUBERNETES__MODE", "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE"],
    "AIRFLOW__FENCED_K8S_EXECUTOR__MODE": ["AIRFLOW__FENCED_K8S_EXECUTOR__MODE", "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE"],
    "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__SWEEP_INTREVAL": ["'sweep_intreval'", "did you mean 'sweep_interval'"],
}


@pytest.mark.parametrize("key, nearest", [("modes", "mode"), ("sweep_intreval", "sweep_interval"),
                                          ("runGate", "run_gate"), ("deployment", "deployment_id")])
def test_an_unknown_option_names_the_nearest(key, nearest):
    (problem,) = config.unknown_options([key, "mode"])
    assert f"option {key!r}: did you mean {nearest!r}?" in problem and "accepted options: mode, " in problem


def test_an_unknown_option_far_from_all_lists_them():
    (problem,) = config.unknown_options(["zzz"])
    assert "did you mean" not in problem and all(name in problem for name in config.OPTIONS)


@pytest.mark.parametrize("name, meant", [
    ("AIRFLOW__FENCED_KUBERNETES__MODE", "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE"),
    ("AIRFLOW__FENCED_K8S_EXECUTOR__MODE", "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE"),
    ("AIRFLOW__FENCED_KUBERNETS_EXECUTOR__SWEEP_INTREVAL", "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__SWEEP_INTERVAL"),
    ("AIRFLOW__FENCED__MODE", "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE"),
    ("AIRFLOW__FENCED_KUBERNETES_EXECUTOR_MODE", "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE"),  # one underscore
    ("AIRFLOW_FENCED_KUBERNETES_EXECUTOR__MODE", "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE"),  # one after AIRFLOW
    ("airflow__fenced_kubernetes_executor__mode", "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE"),  # Airflow reads upper case
    ("AIRFLOW__FENCED_KUBERNETES_EXECUTOR__", None),  # caught as the option '' by unknown_options
    ("AIRFLOW__TEAM_A___FENCED_KUBERNETES_EXECUTOR__MODES", "AIRFLOW__TEAM_A___FENCED_KUBERNETES_EXECUTOR__MODE"),
    ("AIRFLOW__TEAM_A___FENCED_K8S__MODE", "AIRFLOW__TEAM_A___FENCED_KUBERNETES_EXECUTOR__MODE"),
])
def test_a_variable_named_close_to_ours_is_refused_naming_ours(name, meant):
    problems = config.misnamed_variables([name])
    if meant is None:
        assert problems == []
        return
    (problem,) = problems
    assert problem.startswith(f"environment variable {name} is not read") and problem.endswith(f"did you mean {meant}?")


@pytest.mark.parametrize("name", [
    "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE", "AIRFLOW__TEAM_A___FENCED_KUBERNETES_EXECUTOR__MODE",
    "AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE", "AIRFLOW__CORE__EXECUTOR", "AIRFLOW_HOME", "AIRFLOW_UID",
    "AIRFLOW_CONN_FENCED_DB", "AIRFLOW_VAR_FENCED", "FENCED_REPRO_WIDTH", "FENCED_KUBERNETES_EXECUTOR__MODE",
    # the chart copies every `env` entry into the worker pods' environment variables section
    "AIRFLOW__KUBERNETES_ENVIRONMENT_VARIABLES__AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE",
])
def test_other_variables_pass(name):
    assert config.misnamed_variables([name]) == []


def test_sections_close_to_ours_are_refused_unless_airflow_knows_them():
    problems = config.misnamed_sections(["core", "fenced_kubernetes_executor", "fenced_kubernetes", "Fenced-Kubernetes-Executor",
                                         "team_a=fenced_k8s_executor", "team_a=fenced_kubernetes_executor"])
    assert problems == [
        "configuration section [Fenced-Kubernetes-Executor] is not read by fenced-k8s-executor; did you mean "
        "[fenced_kubernetes_executor]?",
        "configuration section [fenced_kubernetes] is not read by fenced-k8s-executor; did you mean "
        "[fenced_kubernetes_executor]?",
        "configuration section [team_a=fenced_k8s_executor] is not read by fenced-k8s-executor; did you mean "
        "[team_a=fenced_kubernetes_executor]?",
    ]
    assert config.misnamed_sections(["fenced_kubernetes"], known=["fenced_kubernetes"]) == []


def test_no_section_airflow_knows_reads_as_ours():
    from airflow.configuration import conf

    assert [s for s in conf.configuration_description if config.near_our_section(s)] == []
    assert config.CONFIG_SECTION in conf.configuration_description  # the provider's defaults are loaded


_EDIT = st.tuples(st.sampled_from(["insert", "delete", "replace"]), st.integers(0, 40),
                  st.sampled_from("abcdefghijklmnopqrstuvwxyz_0123456789"))


@given(st.lists(_EDIT, min_size=1, max_size=config.SECTION_EDITS))
def test_any_few_edits_of_our_section_read_as_ours(edits):
    name = config.CONFIG_SECTION
    for kind, at, char in edits:
        at %= len(name) + 1
        name = {"insert": name[:at] + char + name[at:], "delete": name[:at] + name[at + 1:],
                "replace": name[:at] + char + name[at + 1:]}[kind]
    assert config.near_our_section(name) == (name != config.CONFIG_SECTION)


@given(st.text("ab_", max_size=8), st.text("ab_", max_size=8))
def test_edit_distance_is_symmetric_and_zero_only_for_equal_names(a, b):
    assert config._edits(a, b) == config._edits(b, a) <= max(len(a), len(b))
    assert (config._edits(a, b) == 0) == (a == b)


@pytest.mark.parametrize("variable", list(ISSUE_TYPOS))
def test_load_refuses_each_typo_of_the_issue_through_airflows_config(variable, monkeypatch):
    """Before: each left the executor in enforce. Through Airflow's own config object."""
    from airflow.configuration import conf

    monkeypatch.setenv(variable, "audit")
    with pytest.raises(config.FencedConfigError) as refused:
        config.load(conf)
    for name in ISSUE_TYPOS[variable]:
        assert name in str(refused.value)


def test_load_refuses_an_unknown_option_of_the_file_section_and_names_every_problem(monkeypatch):
    from airflow.configuration import conf

    monkeypatch.setenv("AIRFLOW__FENCED_K8S__MODE", "audit")
    conf.set(config.CONFIG_SECTION, "mdoe", "audit")
    try:
        with pytest.raises(config.FencedConfigError) as refused:
            config.load(conf)
    finally:
        conf.remove_option(config.CONFIG_SECTION, "mdoe")
    assert "'mdoe': did you mean 'mode'?" in str(refused.value) and "AIRFLOW__FENCED_K8S__MODE" in str(refused.value)


def test_load_refuses_a_cmd_variable_airflow_would_not_run(monkeypatch):
    """Airflow runs ``*_CMD`` only for its sensitive options: ``getsection`` cannot read it."""
    from airflow.configuration import conf

    monkeypatch.setenv("AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE_CMD", "echo audit")
    with pytest.raises(config.FencedConfigError, match="'mode_cmd': did you mean 'mode'"):
        config.load(conf)


def test_load_refuses_a_teams_typo_through_its_executor_conf(monkeypatch):
    from airflow.executors.base_executor import ExecutorConf

    monkeypatch.setenv("AIRFLOW__TEAM_A___FENCED_KUBERNETES_EXECUTOR__MODES", "audit")
    with pytest.raises(config.FencedConfigError, match="AIRFLOW__TEAM_A___FENCED_KUBERNETES_EXECUTOR__MODE[?]"):
        config.load(ExecutorConf(team_name="team_a"))


def test_load_takes_the_exact_names(monkeypatch):
    from airflow.configuration import conf

    monkeypatch.setenv("AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE", "audit")
    monkeypatch.setenv("AIRFLOW__FENCED_KUBERNETES_EXECUTOR__SWEEP_INTERVAL", "10")
    loaded = config.load(conf)
    assert (loaded.mode, loaded.sweep_interval) == (config.Mode.AUDIT, 10)
