"""Issue 59 item 9: Airflow's engine and the fences' pool on psycopg 3 behind pgbouncer in
transaction mode, configured as helm-values/fenced-production.yaml configures them.

The official chart's pgbouncer pools in transaction mode (1.23.1, ``max_prepared_statements`` left
off), and SQLAlchemy 2.1 picks psycopg 3 for the plain ``postgresql://`` URL the chart writes.
psycopg 3 prepares a statement on its connection at the statement's sixth execution
(``prepare_threshold`` 5) and names it from a per-connection counter (``_pg3_0`` first); through
the pooler, another client's transaction lands on the same server connection and prepares the same
name: ``DuplicatePreparedStatement`` (or executes a statement of another client's). Airflow 3.3
leaves preparation on (3.4 turns it off for psycopg 3). Here a real pgbouncer in transaction mode
(the Debian package), clients taking turns as a scheduler's do: Airflow's engine fails without the
values file's setting and answers with it, and so does the fences' pool, which takes Airflow's
connect arguments.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

yaml = pytest.importorskip("yaml")

PRODUCTION = Path(__file__).resolve().parents[2] / "helm-values" / "fenced-production.yaml"
#: Turns per client: past psycopg 3's threshold (prepared at the sixth execution) on every client.
TURNS = 8


@pytest.fixture
def transaction_pooler(pg_server):
    from fenced_k8s_lab.pgbouncer import Pgbouncer, skip_reason

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with Pgbouncer(pg_server, pool_mode="transaction") as pooler:
        yield pooler


@contextmanager
def airflows_engine(url: str, monkeypatch, local_settings: Path | None) -> Iterator[None]:
    """Airflow's ORM (``settings.reconfigure_orm``) and the fences' pool on ``url``; with
    ``local_settings``, the chart's files as the production values render them: that file as
    ``$AIRFLOW_HOME/config/airflow_local_settings.py`` (on ``sys.path``, as Airflow puts that
    directory) and ``[database] sql_alchemy_connect_args`` naming the dict in it."""
    from airflow import settings
    from airflow.configuration import conf

    from fenced_k8s_executor import db

    values = yaml.safe_load(PRODUCTION.read_text())
    before = conf.get("database", "sql_alchemy_conn")
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", url)
    monkeypatch.delitem(sys.modules, "airflow_local_settings", raising=False)
    if local_settings is not None:
        local_settings.mkdir(parents=True, exist_ok=True)
        (local_settings / "airflow_local_settings.py").write_text(values["airflowLocalSettings"])
        monkeypatch.syspath_prepend(str(local_settings))
        monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS",
                           values["config"]["database"]["sql_alchemy_connect_args"])
    settings.configure_vars()
    settings.reconfigure_orm()
    db.dispose()
    try:
        yield
    finally:
        db.dispose()
        sys.modules.pop("airflow_local_settings", None)
        monkeypatch.delenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS", raising=False)
        monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", before)
        settings.configure_vars()
        settings.reconfigure_orm()


def take_turns() -> None:
    """Two connections of Airflow's engine and one of the fences' pool, each a client of the
    pooler, run the same statement in turns, one transaction at a time."""
    import sqlalchemy as sa
    from airflow import settings

    from fenced_k8s_executor import db

    clients = [settings.engine.connect(), settings.engine.connect(), db.engine().connect()]
    try:
        for turn in range(TURNS):
            for client in clients:
                client.execute(sa.text("SELECT count(*) FROM job WHERE id = :id"), {"id": turn}).scalar()
                client.commit()
    finally:
        for client in clients:
            client.close()


def _sets_it_itself() -> bool:
    """Airflow 3.4 defaults ``prepare_threshold`` to None for psycopg 3 URLs (``settings``)."""
    from airflow import __version__
    from packaging.version import Version

    return Version(__version__) >= Version("3.4.0b1")


def test_psycopg_3_behind_a_transaction_pooler_needs_the_production_values_setting(
        transaction_pooler, metadata_db, monkeypatch, tmp_path):
    """Without the setting, before Airflow 3.4, the second client's sixth statement is refused
    (the first one's prepared statement holds the name on the shared server connection); with the
    values file's ``airflowLocalSettings`` and ``sql_alchemy_connect_args`` every turn answers."""
    from airflow import settings
    from airflow.configuration import conf
    from sqlalchemy.exc import ProgrammingError

    url = transaction_pooler.url(metadata_db.url.database, "psycopg")
    with airflows_engine(url, monkeypatch, None):
        assert settings.engine.dialect.driver == "psycopg"
        if _sets_it_itself():
            take_turns()
        else:
            with pytest.raises(ProgrammingError, match="prepared statement"):
                take_turns()
    with airflows_engine(url, monkeypatch, tmp_path / "config"):
        from fenced_k8s_executor import db

        assert conf.getimport("database", "sql_alchemy_connect_args") == {"prepare_threshold": None}
        assert db.engine().dialect.driver == "psycopg"
        take_turns()
