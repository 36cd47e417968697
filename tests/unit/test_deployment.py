"""The deployment id: which pods a fence may ever delete."""

from __future__ import annotations

import pytest

from fenced_k8s_executor import config


def test_derived_id_ignores_credentials_and_driver_but_not_the_database():
    a = config.derive_deployment_id("postgresql+psycopg2://airflow:secret@db.example:5432/airflow")
    assert a == config.derive_deployment_id("postgresql://other:rotated@DB.example:5432/airflow")
    assert a != config.derive_deployment_id("postgresql://airflow:secret@db.example:5432/airflow_b")
    assert a != config.derive_deployment_id("postgresql://airflow:secret@db2.example:5432/airflow")
    assert "secret" not in a and a.startswith("db-")


def test_derived_id_is_a_label_value():
    assert config.parse({"deployment_id": config.derive_deployment_id("sqlite:////tmp/a.db")})


@pytest.mark.parametrize("value", ["prod-eu", "a", "team.a_1"])
def test_explicit_deployment_id_accepted(value):
    assert config.parse({"deployment_id": value}).deployment_id == value


@pytest.mark.parametrize("value", ["-bad", "has space", "x" * 64, "ends-"])
def test_bad_deployment_id_fails_naming_the_option(value):
    with pytest.raises(config.FencedConfigError, match="deployment_id"):
        config.parse({"deployment_id": value})
