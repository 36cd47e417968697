"""Which Airflow deployment this is: the id stamped on every pod, and the only pods a fence deletes.

The id lives in the metadata database itself, as the Airflow Variable ``ID_VARIABLE``: it travels
with the data, so the same deployment keeps it through everything operators do to a database
(a ``pg_upgrade`` or an in-place major upgrade, which gives the cluster a new system identifier;
a dump and restore or a logical-replication migration; a failover to a replica; a new proxy or
sidecar address; scheduler restarts; Airflow upgrades). It is written once, by the first fenced
scheduler to start, and read by every one after it. Its first value continues what builds 0.2.x
derived (a hash of PostgreSQL's system identifier, the database and the schema; MySQL's
``server_uuid`` and database; SQLite's path), so pods launched before the upgrade keep their
stamp; a database that will not say who it is gets a random id instead.

In order:

1. ``[fenced_kubernetes_executor] deployment_id`` when set;
2. else the stored Variable (written now if absent).

What the stored id cannot tell apart: two deployments whose databases are copies of one another
(a restored snapshot, a clone, a ``pg_basebackup``, a ``airflow variables import`` of another
deployment's Variables) carry the same id. No stored fact can separate them, so ownership is
checked at run time as well: every pod names the scheduler job that launched it, and a fence
deletes a pod only when the witness (a Lease beside the pods, ``witness.py``) says a scheduler of
this database launched it. Set ``deployment_id`` on a copy before it starts (deleting the Variable
there does not help: a physical copy keeps what the first id is derived from, and stores it again).

Errors are classified by SQLSTATE (``sqlstate``): a transient one is retried by the caller (a
scheduler keeps running with deletes waiting); a deterministic refusal (no privilege on the
Variable table, an unsupported statement) stops the start naming ``deployment_id``, so the fences
are never quietly off.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import dataclass
from contextlib import contextmanager
from typing import Any, Iterator

from fenced_k8s_executor import db, sqlstate
from fenced_k8s_executor.config import FencedConfig, FencedConfigError
from fenced_k8s_executor.launch import LABEL_VALUE
from fenced_k8s_executor.names import CONFIG_SECTION

log = logging.getLogger("fenced_k8s_executor")

CONFIGURED, STORED = "configured", "stored"
#: The Airflow Variable holding this deployment's id (visible with ``airflow variables get``).
ID_VARIABLE = "fenced_k8s_executor.deployment_id"
ID_DESCRIPTION = (
    "fenced-k8s-executor: the id this Airflow deployment stamps on its worker pods; its fences delete "
    "only pods with this id. On a restored snapshot or a clone of this database that runs beside it, set "
    "[fenced_kubernetes_executor] deployment_id before the schedulers start (deleting this Variable there "
    "stores the same id again)."
)


@dataclass(frozen=True)
class Deployment:
    """This deployment's id, where it came from, and the id builds before 0.2.0 derived from the address."""

    id: str
    source: str  # CONFIGURED | STORED
    address_id: str | None = None  # what builds before 0.2.0 stamped (pods carrying it are left alone)
    #: The id stored in this database when a configured one differs from it: a copy given its own
    #: id still holds its original's here, whose witness says whether this database is that copy.
    stored: str | None = None


class NotStored(LookupError):
    """No fenced scheduler has stored this deployment's id yet (``resolve(create=False)``)."""


#: ``Deployment.source`` of ``preview``'s answer before any fenced scheduler has stored the id.
NOT_STORED = "not stored yet"
#: ``preview``'s id when no id is stored and the database will not say who it is: the first fenced
#: scheduler then stores a random one, which no pod carries yet. Not a label value, so no pod's stamp
#: ever equals it.
NO_ID_YET = "(none yet)"


def _hashed(*parts: object) -> str:
    return "db-" + hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()[:16]


def address_id(url: Any) -> str:
    """The id of builds before 0.2.0: a hash of the DB address without credentials (kept to say what
    upgrades see)."""
    url = _url(url)
    return _hashed(url.get_backend_name(), (url.host or "").lower(), url.port or "", url.database or "")


def identity_id(backend: str, server: str, database: str, schema: str | None) -> str:
    """The id builds 0.2.x derived for one database: its server's identity, the database and the schema."""
    return _hashed("identity", backend, server, database, schema or "")


def _url(url: Any) -> Any:
    from sqlalchemy.engine import make_url

    return make_url(url) if isinstance(url, str) else url


class Unreadable(Exception):
    """The server refused to say who it is (no privilege, no such function): not transient."""


@contextmanager
def _session(engine: Any) -> Iterator[Any]:
    """One transaction: on the fences' bounded pool (``db.bounded_session``), or on ``engine`` (tests)."""
    if engine is None:
        with db.bounded_session() as session:
            yield session
        return
    from sqlalchemy.orm import Session

    with Session(bind=engine) as session, session.begin():
        yield session


def read_identity(engine: Any = None, schema: str | None = None) -> tuple[str, str, str | None]:
    """(server identity, database, schema) as the database itself reports them (``engine`` None:
    the fences' bounded pool). Raises ``Unreadable`` when the server deterministically will not
    say, other errors when it cannot be reached (``sqlstate.transient``)."""
    from sqlalchemy import exc, text

    dialect, url = _where(engine)

    queries = {
        "postgresql": "SELECT (SELECT system_identifier::text FROM pg_control_system()), current_database(),"
                      " current_schema()",
        "mysql": "SELECT @@server_uuid, DATABASE(), NULL",
    }
    if dialect == "sqlite":
        import os

        path = url.database or ""
        if not path or path == ":memory:":
            raise Unreadable("an in-memory SQLite database has no identity")
        return "sqlite-file", os.path.abspath(path), None
    if dialect not in queries:
        raise Unreadable(f"no identity query for the {dialect} dialect")
    try:
        with _session(engine) as session:
            server, database, current = session.execute(text(queries[dialect])).one()
    except exc.DBAPIError as error:
        if sqlstate.transient(error):
            raise
        raise Unreadable(sqlstate.describe(error)) from error
    if not server or not database:
        raise Unreadable("the server returned no identity")
    return str(server), str(database), schema or current


def _where(engine: Any) -> tuple[str, Any]:
    """(dialect name, URL) of ``engine``, or of the fences' pool when None."""
    engine = engine if engine is not None else db.engine()
    return engine.dialect.name, engine.url


def _derived(engine: Any, schema: str | None) -> str:
    """What 0.2.x derived for this database (raises ``Unreadable`` when it will not say who it is)."""
    server, database, schema_name = read_identity(engine, schema)
    return identity_id(_where(engine)[0], server, database, schema_name)


def _seed(engine: Any, schema: str | None) -> str:
    """The first stored id: what 0.2.x derived when the database says who it is (pods launched
    before the upgrade keep their stamp), else a random one."""
    try:
        return _derived(engine, schema)
    except Unreadable as why:
        log.warning("fenced_k8s_executor the metadata DB does not report its identity (%s): this deployment's "
                    "id is a random one", why)
        return "d-" + uuid.uuid4().hex[:16]


def _stored(session: Any) -> Any:
    from sqlalchemy import select

    from airflow.models.variable import Variable

    return session.scalars(select(Variable).where(Variable.key == ID_VARIABLE)).first()


def _stored_beside(engine: Any, schema: str | None, configured: str) -> str | None:
    """The stored id when it differs from the configured one (None when absent or unreadable: the
    start goes on, and the witness reads this deployment's own Lease alone)."""
    try:
        stored = _read_or_store(engine, schema, create=False)
    except Exception as error:  # noqa: BLE001 - no stored id to consult; never stops the start
        if not isinstance(error, NotStored):
            log.warning("fenced_k8s_executor could not read the stored deployment id beside the configured %s: %r",
                        configured, error)
        return None
    return stored if stored != configured else None


def _checked(value: Any, where: str) -> str:
    if not isinstance(value, str) or not LABEL_VALUE.fullmatch(value.strip()):
        raise FencedConfigError(
            f"The Airflow Variable {ID_VARIABLE} ({where}) holds {value!r}, which is not a deployment id (a "
            f"Kubernetes label value, 1-63 of [A-Za-z0-9-_.] with alphanumeric ends; an undecryptable value "
            f"reads as None). Delete it to have a new id stored, or set [{CONFIG_SECTION}] deployment_id.")
    return value.strip()


def _read_or_store(engine: Any, schema: str | None, create: bool) -> str:
    from sqlalchemy import exc

    from airflow.models.variable import Variable

    with _session(engine) as session:
        found = _stored(session)
        value = None if found is None else found.val
    if found is not None:
        return _checked(value, "stored")
    if not create:
        raise NotStored(f"no fenced scheduler has stored this deployment's id yet (Variable {ID_VARIABLE})")
    seed = _seed(engine, schema)
    variable = Variable(key=ID_VARIABLE, description=ID_DESCRIPTION)
    # Stored in clear, whatever the fernet key: the id is no secret, and every component (the CLI,
    # a scheduler with a rotated or missing key) must read it; an encrypted one reads as None there.
    variable._val, variable.is_encrypted = seed, False
    try:
        with _session(engine) as session:
            session.add(variable)
    except exc.IntegrityError:  # another scheduler stored it first: theirs wins
        pass
    else:
        log.info("fenced_k8s_executor stored this deployment's id %s in the Variable %s", seed, ID_VARIABLE)
        return seed
    with _session(engine) as session:
        found = _stored(session)
        if found is None:
            raise NotStored(f"the Variable {ID_VARIABLE} vanished while it was being stored")
        return _checked(found.val, "stored by another scheduler")


def resolve(fence: FencedConfig, engine: Any = None, schema: str | None = None, *, create: bool = True) -> Deployment:
    """This deployment's id (see the module docstring). ``create=False`` (read-only callers: the
    CLI) raises ``NotStored`` instead of storing one. A transient DB error is raised as it is (the
    caller retries); a deterministic refusal raises ``FencedConfigError`` naming ``deployment_id``."""
    from sqlalchemy import exc

    if engine is None:
        from airflow.configuration import conf

        schema = schema or conf.get("database", "sql_alchemy_schema", fallback=None) or None
    old = address_id(_where(engine)[1])
    if fence.deployment_id:
        return Deployment(fence.deployment_id, CONFIGURED, old, _stored_beside(engine, schema, fence.deployment_id))
    try:
        return Deployment(_read_or_store(engine, schema, create), STORED, old)
    except exc.SQLAlchemyError as error:
        if sqlstate.transient(error):
            raise
        raise FencedConfigError(
            f"Cannot read or store this deployment's id in the metadata DB (the Airflow Variable {ID_VARIABLE}): "
            f"{sqlstate.describe(error)}. Set [{CONFIG_SECTION}] deployment_id to a Kubernetes label value unique "
            "to this Airflow deployment (1-63 of [A-Za-z0-9-_.], alphanumeric ends).") from None


def preview(fence: FencedConfig, engine: Any = None, schema: str | None = None) -> Deployment:
    """``resolve`` for read-only callers (``airflow fenced-k8s pods``), which must answer before any
    fenced scheduler has run: then the id the first one will store, derived as it derives it and not
    stored (source ``NOT_STORED``; what 0.2.x stamped, so pods of an upgrade not yet rolled out are
    judged as this deployment's), or ``NO_ID_YET`` when the database will not say who it is."""
    try:
        return resolve(fence, engine, schema, create=False)
    except NotStored:
        pass
    if engine is None:
        from airflow.configuration import conf

        schema = schema or conf.get("database", "sql_alchemy_schema", fallback=None) or None
    try:
        found = _derived(engine, schema)
    except Unreadable:
        found = NO_ID_YET
    return Deployment(found, NOT_STORED, address_id(_where(engine)[1]))
