"""Run the safety mutants (``mutants.py``) against their named tests, the checker at its CI budget
and the checker's long run, and write the table (tests/mutation/README.md says how to read it).

Each mutant is applied to a scratch copy of the tree (the files git knows, modified or not), never
to the tree itself, and run with ``PYTHONPATH`` on that copy, so a crash leaves nothing mutated.

    python tests/mutation/mutate.py check                      # every mutant still applies (and compiles)
    python tests/mutation/mutate.py run [--stages named,ci,long] [--only a,b] [--fast] [--baseline]
    python tests/mutation/mutate.py table                      # the table from the results so far
    python tests/mutation/mutate.py generated                  # cosmic-ray over verdicts.py and launch.py

Results go to ``out/mutation/results.jsonl`` (one line per mutant and stage, appended as each ends:
an interrupted run keeps what it finished) and ``out/mutation/table.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import py_compile
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

from mutants import BY_NAME, MUTANTS, Mutant, NoLongerApplies  # noqa: E402

OUT = ROOT / "out" / "mutation"
CHECKER = "tests/integration/test_interleavings.py::test_fenced_executor_keeps_its_promises"
#: Parameters a named test runs under that the mutation run leaves out: the stock executor (no
#: fence to mutate) and the real apiserver (the same fences, a slower start).
SKIPPED_PARAMS = {"stock", "real"}
#: Seconds each stage may take before it is stopped (and reported as a timeout).
LIMITS = {"named": 900, "ci": 1200}


# ---------------------------------------------------------------------------- the scratch copy

def tracked_files(root: Path = ROOT) -> list[str]:
    """The files git knows in ``root`` (modified or not), or every file of an exported tree."""
    if not (root / ".git").exists():
        return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root, check=True,
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line and (root / line).is_file()]


def scratch_copy(mutant: Mutant | None, root: Path = ROOT) -> Path:
    """A copy of the tree with ``mutant`` applied (None: unmutated), every edited file compiled."""
    scratch = Path(tempfile.mkdtemp(prefix=f"mutant-{mutant.name if mutant else 'baseline'}-"))
    try:
        for name in tracked_files(root):
            target = scratch / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, target)
        if mutant is not None:
            mutant.apply(scratch)
            for path, _, _ in mutant.edits:
                py_compile.compile(str(scratch / path), doraise=True)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return scratch


def check(root: Path = ROOT) -> list[str]:
    """Every mutant applied to a copy of the files it edits: the problems, one line each."""
    problems = []
    for mutant in MUTANTS:
        scratch = Path(tempfile.mkdtemp(prefix="mutant-check-"))
        try:
            for path, _, _ in mutant.edits:
                (scratch / path).parent.mkdir(parents=True, exist_ok=True)
                if (root / path).exists():
                    shutil.copy2(root / path, scratch / path)
            mutant.apply(scratch)
            for path, _, _ in mutant.edits:
                py_compile.compile(str(scratch / path), doraise=True)
            missing = [t for t in mutant.named if not (root / t.split("::")[0]).exists()]
            if missing:
                problems.append(f"{mutant.name}: named test files missing: {missing}")
        except NoLongerApplies as error:
            problems.append(f"NO LONGER APPLIES {error}")
        except py_compile.PyCompileError as error:
            problems.append(f"{mutant.name}: does not compile: {error.msg}")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return problems


# ---------------------------------------------------------------------------- running pytest

#: Each run here is one pytest process (this tool runs several at once), not the default run's
#: pytest-xdist workers (pyproject.toml's addopts); without plugins (PYTEST_DISABLE_PLUGIN_AUTOLOAD)
#: xdist's ``-n`` is not even an option, so those runs leave the addopts out.
ONE_PROCESS = ("-n", "0")
NO_PLUGINS = ("-o", "addopts=")

def child_env(scratch: Path, extra: dict | None = None) -> dict:
    """The environment of a run on ``scratch``: its code first on the path, nothing of an outer
    test session (Airflow's settings, the checker's variables)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "CHECKER_", "PYTEST_"))}
    env["PYTHONPATH"] = f"{scratch}{os.pathsep}{scratch / 'lab'}"
    env.update(extra or {})
    return env


def pytest(scratch: Path, args: list[str], env: dict, limit: float, log: Path) -> tuple[int | None, float]:
    """Run pytest on ``scratch``; (exit code or None on a timeout, seconds). A run past ``limit`` gets
    SIGINT (pytest then tears its fixtures down: PostgreSQL, the emulator), then SIGKILL on its
    process group if it is still there after 90 s."""
    began = time.monotonic()
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ONE_PROCESS, *args], cwd=scratch,
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code = None
    return code, time.monotonic() - began


def named_ids(scratch: Path, tests: tuple, env: dict) -> tuple[list[str], list[str]]:
    """The node ids ``tests`` collect to, split into those run and those left out (the stock
    executor's and the real apiserver's cases). Runs go by the tests as named, with the left-out
    ids deselected: some tables' ids hold values drawn at collection."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", *ONE_PROCESS,
                          *tests],
                         cwd=scratch, env=env, capture_output=True, text=True).stdout
    kept, left = [], []
    for line in out.splitlines():
        if "::" not in line or line.startswith(" "):
            continue
        params = re.search(r"\[(.*)\]$", line.strip())
        (left if params and SKIPPED_PARAMS & set(params.group(1).split("-")) else kept).append(line.strip())
    return kept, left


def verdict_of(code: int | None) -> str:
    return {0: "survived", 1: "killed", None: "timeout"}.get(code, f"error (exit {code})")


def run_named(mutant: Mutant | None, tests: tuple, log: Path, root: Path = ROOT) -> dict:
    scratch = scratch_copy(mutant, root)
    try:
        env = child_env(scratch)
        kept, left = named_ids(scratch, tests, env)
        if not kept:
            return {"outcome": "error (no test collected)", "seconds": 0, "tests": 0}
        args = [*tests, *(arg for test in left for arg in ("--deselect", test))]
        code, seconds = pytest(scratch, args, env, LIMITS["named"], log)
        return {"outcome": verdict_of(code), "seconds": round(seconds), "tests": len(kept)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def first_violation(report: Path) -> dict | None:
    """The first promise the checker saw broken (``VIOLATION`` lines of CHECKER_REPORT)."""
    if not report.exists():
        return None
    for line in report.read_text().splitlines():
        found = re.match(r"VIOLATION (\w+) example=(\d+) step=(\d+) steps_so_far=(\d+)", line)
        if found:
            return {"promise": found.group(1), "example": int(found.group(2)), "step": int(found.group(3)),
                    "steps": int(found.group(4))}
    return None


def steps_run(report: Path) -> int:
    totals = re.findall(r"run total \d+ examples, (\d+) steps", report.read_text()) if report.exists() else []
    return int(totals[-1]) if totals else 0


def run_checker(mutant: Mutant | None, log: Path, *, long: bool = False, examples: int = 200,
                minutes: float = 30.0, seed: str | None = None, root: Path = ROOT) -> dict:
    """The fenced checker on the mutant: its CI budget (default seed and examples), or a long run
    (``examples`` at the fixed ``seed``, stopped after ``minutes``). No shrinking: the first broken
    promise ends the run, and its step count is the finding's cost."""
    scratch = scratch_copy(mutant, root)
    try:
        report = scratch / "checker-report.txt"
        extra = {"CHECKER_SHRINK": "0", "CHECKER_REPORT": str(report)}
        if long:
            seed = seed or str(random.randrange(1, 2**31))
            extra.update(CHECKER_EXAMPLES=str(examples), CHECKER_SEED=seed)
        code, seconds = pytest(scratch, [CHECKER, "-s"], child_env(scratch, extra),
                               minutes * 60 if long else LIMITS["ci"], log)
        found = first_violation(report)
        outcome = "killed" if found else ("survived" if code in (0, None) else f"error (exit {code})")
        result = {"outcome": outcome, "seconds": round(seconds), "steps_run": steps_run(report)}
        if long:
            result.update(seed=seed, stopped=code is None)
        if found:
            result.update(found)
        if report.exists():
            shutil.copy(report, log.with_suffix(".report.txt"))
        return result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ---------------------------------------------------------------------------- results and the table

def record(entry: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "results.jsonl", "a") as out:
        out.write(json.dumps(entry) + "\n")


def latest() -> dict:
    """(mutant, stage) -> the last result recorded for it."""
    found: dict = {}
    path = OUT / "results.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            found[(entry["mutant"], entry["stage"])] = entry
    return found


def cell(entry: dict | None, stage: str) -> str:
    if entry is None:
        return "not run"
    outcome = entry["outcome"]
    if stage == "named":
        return f"{outcome} ({entry.get('tests', '?')} tests, {entry['seconds']} s)"
    if outcome == "killed":
        return f"**{entry['promise']}** at step {entry['steps']} ({entry['seconds']} s)"
    if outcome == "survived":
        return f"survived {entry.get('steps_run', '?')} steps ({entry['seconds']} s)"
    return f"{outcome} ({entry['seconds']} s)"


def table(results: dict | None = None) -> str:
    results = latest() if results is None else results
    lines = ["| mutant | origin | named tests | checker, CI budget | checker, long run | promise it breaks |",
             "|---|---|---|---|---|---|"]
    counts = {stage: [0, 0] for stage in ("named", "ci", "long")}
    for mutant in MUTANTS:
        cells = []
        for stage in ("named", "ci", "long"):
            entry = results.get((mutant.name, stage))
            cells.append(cell(entry, stage))
            if entry is not None:
                counts[stage][1] += 1
                counts[stage][0] += entry["outcome"] == "killed"
        lines.append(f"| `{mutant.name}` | {mutant.origin} | {' | '.join(cells)} | "
                     f"{mutant.promise or '- (' + mutant.note + ')'} |")
    summary = ", ".join(f"{stage}: {k} killed of {n} run" for stage, (k, n) in counts.items())
    return "\n".join(lines) + f"\n\n{len(MUTANTS)} mutants; {summary}.\n"


# ---------------------------------------------------------------------------- generated mutants

#: The unit and property tests of the functional core and of what reads it directly.
GENERATED_TESTS = ("tests/unit/test_verdicts.py", "tests/unit/test_launch.py")


def annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Where ``source`` holds annotations: with ``from __future__ import annotations`` they are never
    evaluated, so a mutant there (``X | None`` to ``X + None``) changes nothing and is left out."""
    import ast

    spans = []
    for node in ast.walk(ast.parse(source)):
        found = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            found += [a.annotation for a in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                                             args.vararg, args.kwarg] if a is not None and a.annotation]
            found.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
        spans += [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for n in found if n is not None]
    return spans


def drop_annotation_mutants(session: Path, root: Path) -> int:
    """Remove the jobs whose mutation sits inside an annotation; returns how many."""
    import sqlite3

    conn = sqlite3.connect(session)
    spans: dict[str, list] = {}
    dropped = []
    for job, module, row, col in conn.execute(
            "SELECT job_id, module_path, start_pos_row, start_pos_col FROM mutation_specs"):
        if module not in spans:
            spans[module] = annotation_spans((root / module).read_text())
        if any(start <= (row, col) < end for start, end in spans[module]):
            dropped.append(job)
    for table in ("mutation_specs", "work_items"):
        conn.executemany(f"DELETE FROM {table} WHERE job_id = ?", [(job,) for job in dropped])
    conn.commit()
    conn.close()
    return len(dropped)


def generated(cosmic_ray: str, modules: list[str], resume: bool = False) -> Path:
    """cosmic-ray over ``modules`` with the unit and property tests, in a scratch copy (cosmic-ray
    edits the files it mutates in place). Returns the session file; ``cr-report`` reads it.
    ``resume``: go on with the jobs an interrupted run left pending. The tests run without the
    suite's conftest and pytest's plugins (they need neither): half the time per mutant."""
    scratch = scratch_copy(None)
    OUT.mkdir(parents=True, exist_ok=True)
    session = OUT / "generated.sqlite"
    if not resume:
        session.unlink(missing_ok=True)
    tests = " ".join(GENERATED_TESTS)
    config = scratch / "cosmic-ray.toml"
    config.write_text(
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(modules)}\n"
        "timeout = 120.0\n"
        "excluded-modules = []\n"
        f'test-command = "{sys.executable} -m pytest -x -q -p no:cacheprovider --noconftest {" ".join(NO_PLUGINS)} {tests}"\n'
        "[cosmic-ray.distributor]\n"
        'name = "local"\n')
    env = child_env(scratch, {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    bindir = Path(cosmic_ray).parent
    try:
        if not session.exists():
            subprocess.run([cosmic_ray, "init", str(config), str(session)], cwd=scratch, env=env, check=True)
            dropped = drop_annotation_mutants(session, scratch)
            (OUT / "generated-dropped.txt").write_text(f"{dropped} mutants inside annotations left out\n")
        subprocess.run([cosmic_ray, "exec", str(config), str(session)], cwd=scratch, env=env, check=True)
        report = subprocess.run([str(bindir / "cr-report"), "--show-pending", str(session)], cwd=scratch, env=env,
                                capture_output=True, text=True).stdout
        (OUT / "generated.txt").write_text(report)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return session


#: The tests the survivors of a generated run are run against again (``recheck``): the same, plus
#: the edges their survivors showed untested.
RECHECK_TESTS = GENERATED_TESTS + ("tests/mutation/test_core_edges.py",)


def recheck(tests: tuple = RECHECK_TESTS) -> dict:
    """Run each survivor of the generated session again, against ``tests``: its diff applied to a
    scratch copy, the file restored after. Writes out/mutation/generated-recheck.json; returns the
    score: completed jobs, killed (first run or this one), the survivors left."""
    import sqlite3

    conn = sqlite3.connect(OUT / "generated.sqlite")
    done = conn.execute("SELECT COUNT(*) FROM work_results").fetchone()[0]
    killed_first = conn.execute("SELECT COUNT(*) FROM work_results WHERE test_outcome = 'KILLED'").fetchone()[0]
    survivors = conn.execute(
        "SELECT s.job_id, s.module_path, s.operator_name, s.start_pos_row, s.start_pos_col, r.diff "
        "FROM mutation_specs s JOIN work_results r USING (job_id) WHERE r.test_outcome = 'SURVIVED' "
        "ORDER BY s.module_path, s.start_pos_row").fetchall()
    conn.close()
    last = OUT / "generated-recheck.json"
    if last.exists():  # an earlier recheck's survivors only: what it killed stays killed
        left_before = {entry["job"] for entry in json.loads(last.read_text())["survivors"]}
        survivors = [row for row in survivors if row[0] in left_before]
    scratch = scratch_copy(None)
    env = child_env(scratch, {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    results = []
    try:
        for job, module, row, col, operator, diff in [(j, m, r, c, o, d) for j, m, o, r, c, d in survivors]:
            original = (scratch / module).read_text()
            patch = (diff.split("\n", 1)[1] if diff.startswith("--- mutation diff ---") else diff).rstrip("\n") + "\n"
            applied = subprocess.run(["patch", "-p1", "-s", "--no-backup-if-mismatch", "-r", "-"], input=patch,
                                     text=True, cwd=scratch, capture_output=True).returncode == 0
            code = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--noconftest",
                                   *NO_PLUGINS, *tests], cwd=scratch, env=env, capture_output=True).returncode if applied else -1
            (scratch / module).write_text(original)
            line = original.splitlines()[row - 1].strip()
            results.append({"job": job, "module": module, "line": row, "col": col, "operator": operator,
                            "source": line, "outcome": "killed" if code == 1 else "survived" if code == 0 else
                            "not applied (the module changed)" if code == -1 else f"error (exit {code})"})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    left = [r for r in results if r["outcome"] != "killed"]
    score = {"completed": done, "killed_first": killed_first, "killed_recheck": done - killed_first - len(left),
             "survivors": left, "score": round(100.0 * (done - len(left)) / max(1, done), 1)}
    (OUT / "generated-recheck.json").write_text(json.dumps(score, indent=1))
    return score


# ---------------------------------------------------------------------------- the command line

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="every mutant still applies and compiles")
    sub.add_parser("list", help="the mutants, one line each")
    sub.add_parser("table", help="write out/mutation/table.md from the results so far")
    run = sub.add_parser("run", help="run mutants")
    run.add_argument("--stages", default="named,ci", help="named, ci, long (comma list; default named,ci)")
    run.add_argument("--only", default="", help="mutant names (comma list)")
    run.add_argument("--fast", action="store_true", help="only the mutants of CI's fast subset")
    run.add_argument("--promised", action="store_true", help="only mutants whose defect breaks a checker promise")
    run.add_argument("--skip-killed", action="store_true", help="skip a stage a mutant was killed at before")
    run.add_argument("--baseline", action="store_true", help="first run every named test and the checker unmutated")
    run.add_argument("--long-examples", type=int, default=200)
    run.add_argument("--long-minutes", type=float, default=30.0)
    run.add_argument("--long-seed", default=None, help="default: a new random seed per mutant (recorded)")
    run.add_argument("--root", type=Path, default=ROOT,
                     help="the tree to copy (default: this one; a clean export keeps edits in progress out)")
    gen = sub.add_parser("generated", help="cosmic-ray over the functional core")
    gen.add_argument("--cosmic-ray", default=shutil.which("cosmic-ray") or "cosmic-ray")
    gen.add_argument("--modules", default="fenced_k8s_executor/verdicts.py,fenced_k8s_executor/launch.py")
    gen.add_argument("--resume", action="store_true", help="go on with an interrupted run's pending jobs")
    sub.add_parser("recheck", help="run the generated run's survivors again against the tests of today")
    args = ap.parse_args(argv)

    if args.command == "check":
        problems = check()
        print("\n".join(problems) or f"all {len(MUTANTS)} mutants apply")
        return 1 if problems else 0
    if args.command == "list":
        for mutant in MUTANTS:
            print(f"{mutant.name:45} {mutant.origin:40} {mutant.defect}")
        return 0
    if args.command == "table":
        OUT.mkdir(parents=True, exist_ok=True)
        text = table()
        (OUT / "table.md").write_text(text)
        print(text)
        return 0
    if args.command == "recheck":
        score = recheck()
        for survivor in score["survivors"]:
            print(f"{survivor['module']}:{survivor['line']} {survivor['operator']}: {survivor['source']}")
        print({k: v for k, v in score.items() if k != "survivors"}, f"{len(score['survivors'])} survivors")
        return 0
    if args.command == "generated":
        generated(args.cosmic_ray, args.modules.split(","), args.resume)
        print((OUT / "generated.txt").read_text())
        return 0

    chosen = [BY_NAME[n] for n in args.only.split(",") if n] or [
        m for m in MUTANTS if (m.fast or not args.fast) and (m.promise or not args.promised)]
    stages = [s for s in args.stages.split(",") if s]
    OUT.mkdir(parents=True, exist_ok=True)
    logs = OUT / "logs"
    logs.mkdir(exist_ok=True)
    if args.baseline:
        if "named" in stages:
            tests = tuple(dict.fromkeys(t for m in chosen for t in m.named))
            entry = {"mutant": "(none)", "stage": "named",
                     **run_named(None, tests, logs / "baseline-named.log", args.root)}
            record(entry)
            print("baseline named:", entry, flush=True)
        if "ci" in stages:
            entry = {"mutant": "(none)", "stage": "ci", **run_checker(None, logs / "baseline-ci.log", root=args.root)}
            record(entry)
            print("baseline checker:", entry, flush=True)
    done = latest()
    for mutant in chosen:
        for stage in stages:
            before = done.get((mutant.name, stage))
            if args.skip_killed and before is not None and before["outcome"] == "killed":
                continue
            log = logs / f"{mutant.name}-{stage}.log"
            log.unlink(missing_ok=True)
            try:
                if stage == "named":
                    result = run_named(mutant, mutant.named, log, args.root)
                else:
                    result = run_checker(mutant, log, long=stage == "long", examples=args.long_examples,
                                         minutes=args.long_minutes, seed=args.long_seed, root=args.root)
            except NoLongerApplies as error:
                result = {"outcome": "no longer applies", "seconds": 0, "why": str(error)}
            entry = {"mutant": mutant.name, "stage": stage, "at": time.strftime("%Y-%m-%d %H:%M"),
                     "load": os.getloadavg()[0], **result}
            record(entry)
            print(json.dumps(entry), flush=True)
    (OUT / "table.md").write_text(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
