"""Run the provider's executor tests against one executor, and compare two runs.

``run_suite`` starts ``python -m pytest <suite> -p upstream_plugin`` in a subprocess with its own
AIRFLOW_HOME and its own copy of the migrated SQLite database, and reads each test's outcome from
the junit XML it writes. ``compare`` lists the tests that pass on stock and do not pass on fenced.

By hand (prints the counts and the regressions; exit 1 on a regression not in the allowlist)::

    .venv/bin/python tests/upstream/upstream_run.py [--keep DIR] [pytest args, e.g. -k gauge]
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]  # the subprocesses import fenced_k8s_executor from this same checkout
ALLOWLIST = HERE / "allowlist.txt"
EXECUTORS = ("stock", "fenced")

PYTEST_INI = """\
[pytest]
# The upstream run: no ini options of this repository, no cache, default (strict-free) markers.
addopts = -p no:cacheprovider -p no:tests_common.pytest_plugin -p upstream_plugin
"""


@dataclass
class Run:
    executor: str
    returncode: int
    seconds: float
    outcomes: dict[str, str] = field(default_factory=dict)  # nodeid -> passed | failed | skipped
    log: Path | None = None
    evidence: dict[str, int] = field(default_factory=dict)  # leftover processes; fenced: what it did

    def count(self, outcome: str) -> int:
        return sum(1 for value in self.outcomes.values() if value == outcome)

    def summary(self) -> str:
        return (f"{self.executor}: {self.count('passed')} passed / {self.count('failed')} failed / "
                f"{self.count('skipped')} skipped in {self.seconds:.0f} s")


def _nodeid(case: ET.Element, suite_root: Path) -> str:
    """junit classname ``unit.cncf.kubernetes.executors.test_x.TestY`` + name -> a readable nodeid."""
    classname = case.get("classname", "")
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        candidate = suite_root.joinpath(*parts[:i]).with_suffix(".py")
        if candidate.is_file():
            path = candidate.relative_to(suite_root).as_posix()
            return "::".join([path, *parts[i:], case.get("name", "")])
    return f"{classname}::{case.get('name', '')}"


def read_junit(path: Path, suite_root: Path) -> dict[str, str]:
    outcomes: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            outcome = "failed"
        elif "skipped" in tags:
            outcome = "skipped"
        else:
            outcome = "passed"
        nodeid = _nodeid(case, suite_root)
        # a test failing in teardown gets a second testcase entry: the worse outcome wins
        if outcomes.get(nodeid) != "failed":
            outcomes[nodeid] = outcome
    return outcomes


class _Started:
    def __init__(self, suite, executor: str, workdir: Path, extra_args, timeout: float):
        from upstream_fetch import airflow_env

        assert executor in EXECUTORS
        self.suite, self.executor, self.timeout = suite, executor, timeout
        work = workdir / executor
        shutil.rmtree(work, ignore_errors=True)
        (work / "home").mkdir(parents=True)
        db = work / "airflow.db"
        shutil.copyfile(suite.db_template, db)
        ini = work / "pytest.ini"
        ini.write_text(PYTEST_INI)
        self.junit = work / "junit.xml"
        self.log = work / "pytest.log"
        env = airflow_env(work / "home", db)
        env["PYTHONPATH"] = f"{REPO}:{HERE}:{suite.devel_common}"
        env["FENCED_UPSTREAM_EXECUTOR"] = executor
        cmd = [sys.executable, "-m", "pytest", str(suite.tests), "-c", str(ini), "--rootdir", str(suite.root),
               "-q", "-rfE", "--tb=short", f"--junitxml={self.junit}", *extra_args]
        self.start = time.monotonic()
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(cmd, env=env, cwd=work, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # its own process group, see wait()

    def wait(self) -> Run:
        try:
            returncode = self.proc.wait(timeout=max(1.0, self.start + self.timeout - time.monotonic()))
        except subprocess.TimeoutExpired:  # the run and anything it forked (watcher processes)
            os.killpg(self.proc.pid, signal.SIGKILL)
            returncode = self.proc.wait()
        seconds = time.monotonic() - self.start
        outcomes = read_junit(self.junit, self.suite.root) if self.junit.is_file() else {}
        evidence_file = self.log.parent / "evidence.json"
        evidence = json.loads(evidence_file.read_text()) if evidence_file.is_file() else {}
        return Run(self.executor, returncode, seconds, outcomes, self.log, evidence)


def run_suites(suite, workdir: Path, extra_args: list[str] = (), timeout: float = 900) -> dict[str, Run]:
    """Both runs at once (each is one mostly single-threaded pytest process)."""
    started = [_Started(suite, name, workdir, extra_args, timeout) for name in EXECUTORS]
    return {s.executor: s.wait() for s in started}


def run_suite(suite, executor: str, workdir: Path, extra_args: list[str] = (), timeout: float = 900) -> Run:
    """One run of the upstream suite in a subprocess, ``executor`` being ``stock`` or ``fenced``."""
    return _Started(suite, executor, workdir, extra_args, timeout).wait()


def read_allowlist(path: Path = ALLOWLIST) -> dict[str, str]:
    """``nodeid  # reason`` per line; blank lines and lines starting with ``#`` are comments."""
    entries: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        nodeid, _, reason = text.partition(" #")
        if not reason.strip():
            raise ValueError(f"{path.name}:{number}: {nodeid.strip()} has no reason (`nodeid  # reason`)")
        entries[nodeid.strip()] = reason.strip()
    return entries


def compare(stock: Run, fenced: Run) -> list[str]:
    """Tests that pass on stock and do not pass on fenced (failed, skipped or not run at all)."""
    return sorted(t for t, o in stock.outcomes.items() if o == "passed" and fenced.outcomes.get(t) != "passed")


def main(argv: list[str]) -> int:
    from upstream_fetch import ensure_suite

    keep = None
    if argv[:1] == ["--keep"]:
        keep, argv = Path(argv[1]), argv[2:]
    suite = ensure_suite()
    workdir = keep or Path(tempfile.mkdtemp(prefix="upstream-"))
    runs = run_suites(suite, workdir, argv)
    for run in runs.values():
        print(run.summary(), f"(log {run.log})", run.evidence)
    allow = read_allowlist()
    regressions = compare(runs["stock"], runs["fenced"])
    for test in regressions:
        print(("allowlisted: " if test in allow else "REGRESSION: ") + test)
    return 1 if set(regressions) - set(allow) else 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    raise SystemExit(main(sys.argv[1:]))
