"""What the scale bench reads off real Airflow processes, from outside them: Airflow's own loop
timers through statsd, each process's memory from /proc, and the metadata DB's statements from
pg_stat_statements. Nothing here runs inside a scheduler, so stock and fenced are read alike."""

from __future__ import annotations

import re
import socket
import threading
from pathlib import Path
from typing import Any

from fenced_k8s_lab.evidence import GaugeListener

#: The scheduler's timers the bench keeps (``SchedulerJobRunner._run_scheduler_loop``): the whole
#: loop, and the executors' heartbeat inside it (``trigger_tasks`` + ``sync``).
LOOP = "scheduler.scheduler_loop_duration"
HEARTBEAT = "scheduler.executor_heartbeat_duration"
TIMERS = (LOOP, HEARTBEAT, "scheduler.critical_section_duration")


class TimerListener(GaugeListener):
    """A statsd listener (UDP, 127.0.0.1) keeping every sample of ``TIMERS``, by the sending
    process's statsd prefix (the bench gives each process its own), with its arrival time."""

    def __init__(self) -> None:
        super().__init__()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)  # 10,000 tasks' metrics
        self.samples: list[tuple[float, str, str, float]] = []  # (arrival, prefix, timer, seconds)
        self.lines = 0

    def feed(self, sender: str, line: str, ts: float) -> None:
        self.lines += 1
        name, _, rest = line.partition(":")
        value, _, kind = rest.partition("|")
        if not kind.startswith("ms"):
            return super().feed(sender, line, ts)
        for timer in TIMERS:
            if name.endswith(f".{timer}"):
                try:
                    self.samples.append((ts, name[:-len(timer) - 1], timer, float(value) / 1e3))
                except ValueError:
                    pass
                return

    def series(self, prefix: str, timer: str = LOOP, start: float = 0.0, end: float = float("inf")) -> list[float]:
        """Seconds of each ``timer`` sample ``prefix`` sent between ``start`` and ``end`` (arrival)."""
        return [v for ts, p, t, v in list(self.samples) if p == prefix and t == timer and start <= ts < end]

    def dropped(self) -> int | None:
        """Datagrams the kernel dropped on this socket (its receive buffer full): /proc/net/udp."""
        port = f"{self.port:04X}"
        try:
            for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[1].endswith(f":{port}"):
                    return int(fields[-1])
        except (OSError, ValueError, IndexError):
            pass
        return None


def _proc_kb(pid: int, file: str, field: str) -> int:
    """A ``Field:   N kB`` line of ``/proc/<pid>/<file>`` (status, smaps_rollup); 0 when unreadable."""
    try:
        for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def tree_pss_kb(pid: int) -> dict[int, int]:
    """PSS in kB of a process and its descendants, by pid (Linux /proc: each thread's children)."""
    out: dict[int, int] = {}
    todo = [pid]
    while todo:
        current = todo.pop()
        out[current] = _proc_kb(current, "smaps_rollup", "Pss")
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo += [int(child) for child in task.read_text().split()]
            except (OSError, ValueError):
                continue
    return {p: kb for p, kb in out.items() if kb}


class MemorySampler:
    """Every ``every`` seconds: each watched process's PSS with its descendants' (the scheduler with
    its executor's Manager and watcher processes), and its own peak RSS (the kernel's VmHWM); the
    peaks per name, and at the peak each process's share (``peak_parts_mb``: the scheduler first,
    then the others by pid). ``watch(name, pid)`` again after a restart: the peak is the name's."""

    def __init__(self, every: float = 2.0) -> None:
        self.every = every
        self.pids: dict[str, int] = {}
        self.peak_pss_mb: dict[str, float] = {}
        self.peak_rss_mb: dict[str, float] = {}
        self.peak_parts_mb: dict[str, list[float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-memory", daemon=True)

    def watch(self, name: str, pid: int | None) -> None:
        if pid:
            self.pids[name] = pid

    def start(self) -> "MemorySampler":
        self._thread.start()
        return self

    def sample(self) -> None:
        for name, pid in list(self.pids.items()):
            parts = tree_pss_kb(pid)
            pss = round(sum(parts.values()) / 1024, 1)
            rss = _proc_kb(pid, "status", "VmHWM") / 1024
            if pss and pss > self.peak_pss_mb.get(name, 0.0):
                self.peak_pss_mb[name] = pss
                order = sorted(parts, key=lambda p: (p != pid, p))
                self.peak_parts_mb[name] = [round(parts[p] / 1024, 1) for p in order]
            if rss:
                self.peak_rss_mb[name] = max(round(rss, 1), self.peak_rss_mb.get(name, 0.0))

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.sample()


#: Statements that only open, close or set up a transaction; left out of "statements".
_CONTROL = re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK|SET|RESET|SHOW|DISCARD|DEALLOCATE|SAVEPOINT|RELEASE)\b", re.I)


def enable_statement_stats(pg: Any) -> None:
    """Restart ``pg`` (a lab ``PostgresServer``) with pg_stat_statements loaded, room for every
    run's statements, and the extension created in its ``postgres`` database."""
    pg.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    pg.execute("ALTER SYSTEM SET pg_stat_statements.max = 20000")
    pg.stop(cleanup=False)
    pg.start()
    pg.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


def create_roles(pg: Any, roles: list[str]) -> None:
    """One login role per Airflow process, so pg_stat_statements (keyed by role) tells the
    processes apart; superusers, like the lab's ``postgres``, on this throwaway server."""
    for role in roles:
        pg.execute(f"DO $$ BEGIN CREATE ROLE {role} LOGIN SUPERUSER; EXCEPTION WHEN duplicate_object THEN NULL; END $$")


class StatementCounter:
    """pg_stat_statements of one database, by role: ``snapshot()`` now, ``diff(a, b)`` between two."""

    def __init__(self, pg: Any, database: str) -> None:
        self.pg, self.database = pg, database

    def snapshot(self) -> dict[tuple[str, int], tuple[int, float, str]]:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.pg.port, user="postgres", dbname="postgres")
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT userid::regrole::text, queryid, calls, total_exec_time, query"
                            " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)",
                            (self.database,))
                return {(role, qid): (calls, ms, query) for role, qid, calls, ms, query in cur.fetchall()}
        finally:
            conn.close()

    @staticmethod
    def diff(before: dict, after: dict, role: str, top: int = 0) -> dict:
        """``role``'s statements between two snapshots: ``statements`` (transaction control and
        settings left out), ``all`` calls, DB time in ms, and the ``top`` statements by calls."""
        rows = []
        for (r, qid), (calls, ms, query) in after.items():
            if r != role:
                continue
            c0, ms0, _ = before.get((r, qid), (0, 0.0, ""))
            if calls > c0:
                rows.append((calls - c0, ms - ms0, query))
        statements = [row for row in rows if not _CONTROL.match(row[2])]
        out = {"statements": sum(c for c, _, _ in statements), "all": sum(c for c, _, _ in rows),
               "db_ms": round(sum(ms for _, ms, _ in rows), 1)}
        if top:
            out["top"] = [{"calls": c, "ms": round(ms, 1), "query": " ".join(q.split())[:160]}
                          for c, ms, q in sorted(statements, key=lambda row: -row[0])[:top]]
        return out

