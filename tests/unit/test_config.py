"""[fenced_kubernetes_executor] options: defaults, parsing, and failures that name the option."""

from __future__ import annotations

import pytest

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
