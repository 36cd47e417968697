"""The deployment identity's contract (docs/design.md, "The deployment id"), one test per row, on
real PostgreSQL servers and the operations platform teams perform on them (``fenced_k8s_lab.pgops``:
``pg_upgrade``, ``pg_dump``/``pg_restore``, a streaming replica promoted, a ``pg_basebackup`` clone).

Rows 1-6: the same deployment keeps its id. Rows 7-9: two deployments get two ids, or, for clones
(which no stored fact can tell apart), the same id and a collision caught at run time
(tests/integration/test_clone_deployments.py). Before: the id was derived from the system
identifier, which ``pg_upgrade`` and a dump/restore change (the review's probe: every running task
of the upgraded deployment was reset and run again).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest
import sqlalchemy as sa

from fenced_k8s_executor import config, deployment
from fenced_k8s_lab import pgops
from fenced_k8s_lab.postgres import TEMPLATE_DB, PostgresServer, airflow_db_env, start_from_template

DB = "airflow"


@pytest.fixture
def primary():
    """A PostgreSQL server holding a migrated Airflow metadata database ``airflow``."""
    server = start_from_template()
    server.create_database(DB, template=TEMPLATE_DB)
    servers = [server]
    yield servers  # tests append the servers they make, stopped at the end
    for each in servers:
        each.stop()


def _resolved(url: str, schema: str | None = None, **options: str) -> deployment.Deployment:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    if schema:
        engine = engine.execution_options(schema_translate_map={None: schema})
    try:
        return deployment.resolve(config.parse(options), engine, schema)
    finally:
        engine.dispose()


def _id(url: str, schema: str | None = None, **options: str) -> str:
    return _resolved(url, schema, **options).id


# --- the same deployment keeps its id ---------------------------------------------------------


def test_the_id_survives_pg_upgrade(primary):
    """An in-place major upgrade (RDS, Cloud SQL): ``pg_upgrade`` gives the cluster a new system
    identifier, so the 0.2 derivation changed the id and adoption hid every running pod."""
    (old,) = primary
    before = _id(old.url(DB))
    old_system = pgops.system_identifier(old)
    new = pgops.upgraded(old)
    primary.append(new)
    assert pgops.system_identifier(new) != old_system  # the real operation, not a copy
    assert _id(new.url(DB)) == before


def test_the_id_survives_a_dump_and_restore(primary):
    """A migration by dump/restore (or logical replication: RDS Blue/Green) into another server."""
    (source,) = primary
    before = _id(source.url(DB))
    target = pgops.restored(source, DB)
    primary.append(target)
    assert pgops.system_identifier(target) != pgops.system_identifier(source)
    assert _id(target.url(DB)) == before


def test_the_id_survives_a_failover_to_a_replica(primary):
    (source,) = primary
    before = _id(source.url(DB))
    standby = pgops.replica(source)
    primary.append(standby)
    source.stop(cleanup=False)  # the primary is lost
    pgops.promote(standby)
    assert _id(standby.url(DB)) == before


def test_the_id_survives_a_new_proxy_address(primary):
    from fenced_k8s_lab.pgproxy import UserRoutingProxy

    (server,) = primary
    before = _id(server.url(DB))
    with UserRoutingProxy({"postgres": ("127.0.0.1", server.port)}) as proxy:
        assert _id(proxy.url("postgres", DB)) == before


def test_the_id_survives_a_scheduler_restart(primary):
    """Every scheduler start reads the stored id; none stores another (also under psycopg 3, the
    official chart's driver)."""
    (server,) = primary
    first = _resolved(server.url(DB))
    again = _resolved(server.url(DB).replace("+psycopg2", "+psycopg"))
    assert again.id == first.id and first.source == again.source == deployment.STORED


def test_the_id_survives_an_airflow_upgrade(primary):
    """airflow-core's own migrations run over the Variable: the schema goes down to the previous
    release's (``airflow db downgrade``) and up again (``airflow db migrate``), as an upgrade from
    that release runs them."""
    from airflow.utils import db

    (server,) = primary
    before = _id(server.url(DB))
    previous = list(db._REVISION_HEADS_MAP)[-2]
    with tempfile.TemporaryDirectory(prefix="fenced-upgrade-") as home:
        env = {**os.environ, "AIRFLOW_HOME": home, "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
               **airflow_db_env(server.url(DB))}
        for args in (["db", "downgrade", "--to-version", previous, "-y"], ["db", "migrate"]):
            done = subprocess.run([sys.executable, "-m", "airflow", *args], env=env, capture_output=True, text=True,
                                  timeout=600)
            assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
    assert _id(server.url(DB)) == before


def test_the_id_is_stored_in_clear_for_every_component_whatever_its_fernet_key(primary):
    """A Variable Airflow encrypts reads as None in a process with another fernet key (the CLI in a
    half-configured container, a scheduler mid key rotation): the id is no secret, stored in clear."""
    (server,) = primary
    found = _id(server.url(DB))
    engine = sa.create_engine(server.url(DB), poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT val, is_encrypted FROM variable WHERE key = :k"),
                              {"k": deployment.ID_VARIABLE}).one()
    engine.dispose()
    assert tuple(stored) == (found, False)


def test_pods_launched_before_the_stored_id_keep_their_stamp(primary):
    """Upgrading from 0.2.x: the first stored id is the one 0.2.x derived from the system identifier,
    the database and the schema, so the pods in flight at the upgrade are still this deployment's."""
    (server,) = primary
    derived = deployment.identity_id("postgresql", pgops.system_identifier(server), DB, "public")
    assert _id(server.url(DB)) == derived


# --- two deployments ----------------------------------------------------------------------------


def test_two_schemas_of_one_database_get_two_ids(primary):
    """Two deployments in one database, each in its own schema (``[database] sql_alchemy_schema``)."""
    from airflow.models.team import Team
    from airflow.models.variable import Variable

    (server,) = primary
    ids = []
    for schema in ("team_a", "team_b"):
        server.execute(f"CREATE SCHEMA {schema}", database=DB)
        engine = sa.create_engine(server.url(DB), poolclass=sa.pool.NullPool).execution_options(
            schema_translate_map={None: schema})
        with engine.begin() as conn:
            Team.__table__.create(conn)
            Variable.__table__.create(conn)
        engine.dispose()
        ids.append(_id(server.url(DB), schema))
    assert ids[0] != ids[1]
    assert _id(server.url(DB), "team_a") == ids[0]


def test_two_databases_behind_one_proxy_address_get_two_ids(primary):
    """Two deployments' Cloud SQL Auth Proxy or pgbouncer sidecars both answer at one address."""
    from fenced_k8s_lab.pgproxy import UserRoutingProxy

    (ours,) = primary
    theirs = pgops.restored(ours, DB)  # another server: its own initdb
    primary.append(theirs)
    theirs.execute("DELETE FROM variable", database=DB)  # a deployment of its own, not a migration of ours
    for server, role in ((ours, "alpha"), (theirs, "beta")):
        server.execute(f"CREATE ROLE {role} SUPERUSER LOGIN")
    with UserRoutingProxy({"alpha": ("127.0.0.1", ours.port), "beta": ("127.0.0.1", theirs.port)}) as proxy:
        a, b = _id(proxy.url("alpha", DB)), _id(proxy.url("beta", DB))
    assert deployment.address_id(proxy.url("alpha", DB)) == deployment.address_id(proxy.url("beta", DB))
    assert a != b


def test_a_clone_carries_the_id_and_a_configured_id_parts_them(primary):
    """A physical clone (snapshot, Aurora/Cloud SQL clone, pg_basebackup) carries the Variable: no
    stored fact tells it apart (the collision is caught at run time: test_clone_deployments.py).
    ``deployment_id`` on the copy parts them."""
    (source,) = primary
    before = _id(source.url(DB))
    copy = pgops.cloned(source)
    primary.append(copy)
    assert pgops.system_identifier(copy) == pgops.system_identifier(source)
    assert _id(copy.url(DB)) == before
    assert _id(copy.url(DB), deployment_id="staging") == "staging"


# --- refusals ---------------------------------------------------------------------------------


def test_a_database_that_will_not_say_who_it_is_gets_a_random_id(primary):
    """The identity query refused with a deterministic SQLSTATE: 0A000 (feature not supported), as a
    managed service may answer for ``pg_control_system()``; here a function of that name earlier on
    the role's search_path raises it, so the server itself refuses. A random id is stored and the
    fences are on. Before, only ProgrammingError counted as a refusal: NotSupportedError was
    retried every loop, and every pod went out unstamped (no fence ever deleted anything)."""
    (server,) = primary
    server.execute("CREATE ROLE managed SUPERUSER LOGIN")
    server.execute("CREATE FUNCTION public.pg_control_system() RETURNS TABLE(system_identifier bigint) "
                   "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'not on this service' "
                   "USING ERRCODE = 'feature_not_supported'; END $$", database=DB)
    server.execute("ALTER ROLE managed SET search_path = public, pg_catalog")
    url = server.url(DB).replace("postgres@", "managed@")
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with pytest.raises(deployment.Unreadable, match="0A000"):
        deployment.read_identity(engine)
    engine.dispose()
    found = _resolved(url)
    assert found.id.startswith("d-") and found.source == deployment.STORED
    assert _id(server.url(DB)) == found.id  # stored: every scheduler reads the same


def test_a_deterministic_refusal_of_the_variable_stops_the_start_naming_deployment_id(primary):
    """No privilege on the Variable table: asking again every loop would never store the id, and
    pods would go out without it (fences quietly off). The start stops, naming the option."""
    (server,) = primary
    server.execute("CREATE ROLE reader LOGIN", database=DB)
    server.execute("GRANT CONNECT ON DATABASE airflow TO reader", database=DB)
    url = server.url(DB).replace("postgres@", "reader@")
    with pytest.raises(config.FencedConfigError, match="deployment_id"):
        _id(url)


def test_a_transient_error_is_raised_for_the_caller_to_retry():
    """Nobody listening (class 08 / a socket error): the scheduler keeps running, deletes wait."""
    from fenced_k8s_lab.postgres import free_port

    engine = sa.create_engine(f"postgresql+psycopg2://postgres@127.0.0.1:{free_port()}/airflow",
                              poolclass=sa.pool.NullPool)
    with pytest.raises(sa.exc.OperationalError):
        deployment.resolve(config.FencedConfig(), engine)
