"""Which Airflow deployment this is: the id stamped on every pod, and the only pods a fence deletes.

A fence judges a pod against *this* deployment's metadata DB, so "no row for its task" is evidence
only for pods this deployment launched. The id must therefore name the database itself, not the
address a scheduler reaches it by: behind a Cloud SQL Auth Proxy or a pgbouncer sidecar, two
deployments reach two databases at the same ``127.0.0.1:5432/airflow``. Builds before 0.2.0 hashed that address,
so two such deployments in one namespace deleted each other's current pods.

The id, in order:

1. ``[fenced_kubernetes_executor] deployment_id`` when set;
2. else the database's own identity: PostgreSQL's system identifier (unique per cluster, fixed at
   ``initdb``), the database name and the schema; MySQL's ``server_uuid`` and database; SQLite's
   absolute file path;
3. else, when that identity cannot be read (a server that refuses the query), the address, but
   only when the address names a server: a loopback host or a socket (where proxies and sidecars
   listen) fails the start, naming ``deployment_id``.

A transient DB error is retried, then fails the start: guessing an id would make this scheduler
treat its own deployment's pods as foreign (safe, but its fences would go quiet).
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import time
from dataclasses import dataclass
from typing import Any

from fenced_k8s_executor.config import FencedConfig, FencedConfigError
from fenced_k8s_executor.names import CONFIG_SECTION

log = logging.getLogger("fenced_k8s_executor")

CONFIGURED, DATABASE, ADDRESS = "configured", "database", "address"
ATTEMPTS, PAUSE = 3, 2.0


@dataclass(frozen=True)
class Deployment:
    """This deployment's id, where it came from, and the id builds before 0.2.0 derived from the address."""

    id: str
    source: str  # CONFIGURED | DATABASE | ADDRESS
    address_id: str | None = None  # what builds before 0.2.0 stamped (pods carrying it are left alone)


def _hashed(*parts: object) -> str:
    return "db-" + hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()[:16]


def address_id(url: Any) -> str:
    """The id of builds before 0.2.0: a hash of the DB address without credentials (kept to say what
    upgrades see)."""
    url = _url(url)
    return _hashed(url.get_backend_name(), (url.host or "").lower(), url.port or "", url.database or "")


def identity_id(backend: str, server: str, database: str, schema: str | None) -> str:
    """The id of one database: its server's own identity, the database and the schema in it."""
    return _hashed("identity", backend, server, database, schema or "")


def local_address(url: Any) -> bool:
    """True when the address could be a proxy or sidecar on this pod: no host (a socket), a socket
    path, ``localhost`` or a loopback IP. Two deployments may share such an address."""
    url = _url(url)
    hosts = [url.host or ""] + [str(v) for k, v in url.query.items() if k == "host"]
    for host in hosts:
        host = host.strip("[]").lower()
        if not host or host.startswith("/") or host == "localhost" or host.endswith(".localhost"):
            return True
        try:
            if ipaddress.ip_address(host).is_loopback:
                return True
        except ValueError:
            pass
    return False


def _url(url: Any) -> Any:
    from sqlalchemy.engine import make_url

    return make_url(url) if isinstance(url, str) else url


class Unreadable(Exception):
    """The server refused to say who it is (no privilege, no such function): not transient."""


def read_identity(engine: Any, schema: str | None = None) -> tuple[str, str, str | None]:
    """(server identity, database, schema) as the database itself reports them. Raises
    ``Unreadable`` when the server will not say, other errors when it cannot be reached."""
    from sqlalchemy import exc, text

    dialect = engine.dialect.name
    queries = {
        "postgresql": "SELECT (SELECT system_identifier::text FROM pg_control_system()), current_database(),"
                      " current_schema()",
        "mysql": "SELECT @@server_uuid, DATABASE(), NULL",
    }
    if dialect == "sqlite":
        import os

        path = engine.url.database or ""
        if not path or path == ":memory:":
            raise Unreadable("an in-memory SQLite database has no identity")
        return "sqlite-file", os.path.abspath(path), None
    if dialect not in queries:
        raise Unreadable(f"no identity query for the {dialect} dialect")
    try:
        with engine.connect() as conn:
            server, database, current = conn.execute(text(queries[dialect])).one()
    except exc.ProgrammingError as error:  # privilege or function missing: deterministic
        raise Unreadable(str(error.orig).strip().splitlines()[0] if error.orig else str(error)) from error
    if not server or not database:
        raise Unreadable("the server returned no identity")
    return str(server), str(database), schema or current


def resolve(fence: FencedConfig, engine: Any = None, schema: str | None = None, *, attempts: int = ATTEMPTS,
            pause: float = PAUSE) -> Deployment:
    """This deployment's id (see the module docstring). Raises ``FencedConfigError`` naming
    ``deployment_id`` when it must be configured, and the DB error after ``attempts`` tries when the
    database cannot be reached."""
    if engine is None:
        from airflow import settings
        from airflow.configuration import conf

        engine = settings.engine
        schema = schema or conf.get("database", "sql_alchemy_schema", fallback=None) or None
    old = address_id(engine.url)
    if fence.deployment_id:
        return Deployment(fence.deployment_id, CONFIGURED, old)
    for attempt in range(1, attempts + 1):
        try:
            server, database, schema_name = read_identity(engine, schema)
            return Deployment(identity_id(engine.dialect.name, server, database, schema_name), DATABASE, old)
        except Unreadable as why:
            if local_address(engine.url):
                raise FencedConfigError(
                    f"Cannot derive [{CONFIG_SECTION}] deployment_id: the metadata database does not report its "
                    f"identity ({why}) and its address ({engine.url.host or 'a socket'}) may be a proxy or sidecar "
                    "that another deployment shares. Set deployment_id to a Kubernetes label value unique to this "
                    "Airflow deployment (1-63 of [A-Za-z0-9-_.], alphanumeric ends).") from None
            log.warning("fenced_k8s_executor deployment id derived from the DB address: the database does not "
                        "report its identity (%s)", why)
            return Deployment(old, ADDRESS, old)
        except Exception as error:  # the database could not be reached: retry, then fail the start
            if attempt == attempts:
                raise
            log.warning("fenced_k8s_executor could not read the database identity (attempt %d of %d), retrying "
                        "in %.0fs: %r", attempt, attempts, pause, error)
            time.sleep(pause)
    raise AssertionError("unreachable")
