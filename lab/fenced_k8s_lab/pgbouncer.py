"""A real pgbouncer (the Debian package's binary) in front of a lab PostgreSQL server, and ways to
make the server behind it go silent.

A TCP-terminating pooler (pgbouncer, RDS Proxy, a Cloud SQL proxy) answers its clients itself: the
client's keepalives and ``tcp_user_timeout`` reach the pooler, which is alive, and a server that
stops answering behind it is never seen in the client's kernel. Two silences:

- ``stopped(pid)``: a PostgreSQL process stopped (SIGSTOP) for the block's duration, as a server
  stuck in the kernel or a frozen VM is. A backend stopped in the middle of a statement answers
  nothing, and its own ``statement_timeout`` does not fire (its timer signal waits with it). The
  postmaster stopped accepts no new server connections: the kernel completes pgbouncer's TCP
  handshake, and the startup packet is never answered.
- ``Pgbouncer.server_pids()``: the backends serving pgbouncer's server connections, to stop.

``Pgbouncer`` runs as the lab PostgreSQL's system user (pgbouncer refuses root), listens on a free
port of 127.0.0.1 with its own config and auth file in a temp dir, trusts the user ``postgres``,
and is stopped by PID. ``skip_reason`` says why it cannot run here.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from fenced_k8s_lab.postgres import PostgresServer, _run_as, free_port

#: Seconds ``start`` waits for pgbouncer to listen, and ``stop`` for it to exit.
SETTLE = 10.0


def skip_reason() -> str | None:
    """Why a pgbouncer cannot be started here (None: it can)."""
    if shutil.which("pgbouncer") is None:
        return "a pooler test needs `pgbouncer` (apt-get install pgbouncer; .ci/setup installs it as root)"
    return None


class Pgbouncer:
    """pgbouncer in ``pool_mode`` (session or transaction) in front of ``server``: every database
    name is forwarded to the server's database of that name."""

    def __init__(self, server: PostgresServer, pool_mode: str = "session"):
        self.server = server
        self.pool_mode = pool_mode
        self.port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="fenced-pgbouncer-"))
        self._process: subprocess.Popen | None = None

    def url(self, database: str, driver: str = "psycopg2") -> str:
        return f"postgresql+{driver}://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> "Pgbouncer":
        owner = _run_as()
        config = self.base / "pgbouncer.ini"
        (self.base / "users.txt").write_text('"postgres" ""\n')
        config.write_text(f"""[databases]
* = host=127.0.0.1 port={self.server.port}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.base / "users.txt"}
pool_mode = {self.pool_mode}
logfile = {self.base / "pgbouncer.log"}
""")
        if owner:
            for path in (self.base, config, self.base / "users.txt"):
                os.chown(path, owner["user"], owner["group"])
        self._process = subprocess.Popen(["pgbouncer", str(config)], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, **owner)
        deadline = time.monotonic() + SETTLE
        while not self._listening():
            if self._process.poll() is not None or time.monotonic() > deadline:
                log = self.log()
                self.stop()
                raise RuntimeError(f"pgbouncer did not start: {log[-2000:]}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        """Stop pgbouncer (by its PID) and remove its directory."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(SETTLE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.base, ignore_errors=True)

    def log(self) -> str:
        path = self.base / "pgbouncer.log"
        return path.read_text() if path.exists() else ""

    def server_pids(self, database: str) -> set[int]:
        """The PostgreSQL backends serving pgbouncer's server connections to ``database``: its
        connections come from 127.0.0.1, from pgbouncer's own sockets."""
        ports = _local_ports(self._process.pid, self.server.port) if self._process is not None else set()
        rows = _query(self.server, f"SELECT pid, client_port FROM pg_stat_activity WHERE datname = '{database}'")
        return {int(pid) for pid, port in rows if port is not None and int(port) in ports}

    def __enter__(self) -> "Pgbouncer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _listening(self) -> bool:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            return sock.connect_ex(("127.0.0.1", self.port)) == 0


def postmaster_pid(server: PostgresServer) -> int:
    """The PID of ``server``'s postmaster (the first line of its ``postmaster.pid``)."""
    return int((Path(server.datadir) / "postmaster.pid").read_text().splitlines()[0])


@contextmanager
def stopped(*pids: int) -> Iterator[None]:
    """The processes ``pids`` stopped (SIGSTOP) inside the block, continued (SIGCONT) after,
    whatever happens: a stopped PostgreSQL process must never outlive the test (the server's
    shutdown would wait for it)."""
    done: list[int] = []
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            done.append(pid)
        yield
    finally:
        for pid in done:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def _query(server: PostgresServer, sql: str, database: str = "postgres") -> list[tuple]:
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=server.port, user="postgres", dbname=database,
                            connect_timeout=10)
    try:
        conn.autocommit = True
        with conn.cursor() as cursor:
            cursor.execute(sql)
            return cursor.fetchall()
    finally:
        conn.close()


def _local_ports(pid: int, remote_port: int) -> set[int]:
    """The local ports of process ``pid``'s TCP sockets connected to 127.0.0.1:``remote_port``."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    with open(f"/proc/{pid}/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if fields[9] in inodes and int(remote.partition(":")[2], 16) == remote_port:
                ports.add(int(local.partition(":")[2], 16))
    return ports
