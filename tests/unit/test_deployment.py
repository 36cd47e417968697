"""The deployment id: which pods a fence may ever delete."""

from __future__ import annotations

import pytest

from fenced_k8s_executor import config, deployment


def test_identity_id_names_the_server_the_database_and_the_schema():
    a = deployment.identity_id("postgresql", "7715039168456507679", "airflow", "public")
    assert a == deployment.identity_id("postgresql", "7715039168456507679", "airflow", "public")
    assert a != deployment.identity_id("postgresql", "7715039168456507680", "airflow", "public")
    assert a != deployment.identity_id("postgresql", "7715039168456507679", "airflow_b", "public")
    assert a != deployment.identity_id("postgresql", "7715039168456507679", "airflow", "team_b")
    assert config.parse({"deployment_id": a}).deployment_id == a  # a label value


def test_address_id_is_what_0_1_0_derived_and_ignores_credentials():
    a = deployment.address_id("postgresql+psycopg2://airflow:secret@db.example:5432/airflow")
    assert a == deployment.address_id("postgresql://other:rotated@DB.example:5432/airflow")
    assert a != deployment.address_id("postgresql://airflow:secret@db.example:5432/airflow_b")
    assert "secret" not in a and a.startswith("db-")


@pytest.mark.parametrize("value", ["prod-eu", "a", "team.a_1"])
def test_explicit_deployment_id_accepted(value):
    assert config.parse({"deployment_id": value}).deployment_id == value


@pytest.mark.parametrize("value", ["-bad", "has space", "x" * 64, "ends-"])
def test_bad_deployment_id_fails_naming_the_option(value):
    with pytest.raises(config.FencedConfigError, match="deployment_id"):
        config.parse({"deployment_id": value})


@pytest.mark.parametrize("where", ["file", "memory"])
def test_preview_before_any_scheduler_stored_the_id_is_the_one_the_first_will_store(where, tmp_path, monkeypatch):
    """``airflow fenced-k8s pods`` before the first fenced scheduler: the id that scheduler's seed
    derives, not stored; a database that does not say who it is (the scheduler then stores a random
    id) gives ``NO_ID_YET``, which no pod's stamp can equal (not a label value)."""
    import sqlalchemy as sa

    def not_stored(*args, **kwargs):
        raise deployment.NotStored("no fenced scheduler has stored this deployment's id yet")

    monkeypatch.setattr(deployment, "resolve", not_stored)
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'airflow.db'}" if where == "file" else "sqlite://")
    found = deployment.preview(config.FencedConfig(), engine)
    assert found.source == deployment.NOT_STORED
    if where == "file":
        assert found.id == deployment._seed(engine, None)
    else:
        assert found.id == deployment.NO_ID_YET
        with pytest.raises(config.FencedConfigError):
            config.parse({"deployment_id": deployment.NO_ID_YET})
