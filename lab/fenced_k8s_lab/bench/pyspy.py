"""Sampling profiles of the scale bench's scheduler processes (``--scale-pyspy DIR``, issue 53), and
where each phase's loop time goes by them.

``Recorders`` runs one ``py-spy record`` per scheduler process and phase (``--idle``: the loop's
time is wall time, most of it waiting on the database or the API server; ``--nonblocking``: the
scheduler is never paused to be sampled, so both kinds run as unprofiled), writing py-spy's raw
collapsed stacks (``<run>_<kind>_<phase>_<role>_<pid>.raw``). ``summarise`` reads them back: the
main thread's samples inside ``_run_scheduler_loop`` but not in its idle sleep are the loop's
time; every figure is a share of those samples, pooled over a kind's runs and schedulers (a
shared machine's absolute times mean little, their shares much more).

    python -m fenced_k8s_lab.bench.pyspy DIR [--top 15]   # markdown tables, per phase and kind
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

LOOP = "_run_scheduler_loop"
#: The loop's own steps (airflow-core's ``_run_scheduler_loop``) and the executor's, by frame name.
STEPS = ("_do_scheduling", "heartbeat", "_process_executor_events", "_process_task_event_logs",
         "perform_heartbeat", "run", "adopt_or_reset_orphaned_tasks")
_THREAD = re.compile(r"^thread \((0x[0-9a-f]+|\d+)\)")
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def binary() -> str:
    """py-spy beside this interpreter (``pip install py-spy``), else on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    found = str(here) if here.exists() else shutil.which("py-spy")
    if not found:
        raise SystemExit("--scale-pyspy needs py-spy: pip install py-spy")
    return found


class Recorders:
    """One py-spy per (phase, process); ``stop_all`` ends them (SIGINT: py-spy writes its file)."""

    def __init__(self, out: Path, rate: int = 100):
        self.out, self.rate = out, rate
        self.out.mkdir(parents=True, exist_ok=True)
        self._running: list[subprocess.Popen] = []
        self._exe = binary()

    def start(self, name: str, pid: int) -> None:
        path = self.out / f"{name}_{pid}.raw"
        self._running.append(subprocess.Popen(
            [self._exe, "record", "--pid", str(pid), "--idle", "--threads", "--nonblocking", "--nolineno",
             "--rate", str(self.rate), "--format", "raw", "--output", str(path)],
            stdout=subprocess.DEVNULL, stderr=open(self.out / f"{name}_{pid}.log", "wb"), start_new_session=True))

    def stop_all(self) -> None:
        for proc in self._running:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in self._running:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self._running = []


# ---------------------------------------------------------------- reading them back


def _frames(stack: str) -> tuple[int | None, list[str]]:
    """(thread id, frames root first) of one collapsed stack."""
    parts = stack.split(";")
    m = _THREAD.match(parts[0]) if parts else None
    if m is None:
        return None, parts
    return int(m[1], 16) if m[1].startswith("0x") else int(m[1]), parts[1:]


def _short(frame: str) -> str:
    """``func (path)`` with the path from its package on (``airflow/jobs/...``, ``fenced_k8s_executor/...``)."""
    m = _FRAME.match(frame)
    if not m:
        return frame
    path = m["file"]
    for root in ("fenced_k8s_executor/", "airflow/", "kubernetes/", "urllib3/", "sqlalchemy/", "psycopg2/",
                 "psycopg/", "multiprocessing/", "http/", "socket", "ssl", "json/", "threading"):
        at = path.find(root)
        if at >= 0:
            path = path[at:]
            break
    return f"{m['func']} ({path})"


def _func(frame: str) -> str:
    """A frame's function name without its class (``SchedulerJobRunner._do_scheduling`` -> ``_do_scheduling``)."""
    return frame.split(" (", 1)[0].rsplit(".", 1)[-1]


def samples(path: Path, root: str = LOOP) -> list[tuple[list[str], int]]:
    """The main thread's stacks from the frame ``root`` down (the scheduler loop's body, by
    default), with their sample counts. Left out: the loop's idle sleep, the samples whose
    innermost Python frame is the loop itself (``time.sleep`` is a C call; the loop's own
    bytecode is a negligible share)."""
    pid = int(path.stem.rsplit("_", 1)[1])
    out = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        tid, frames = _frames(stack)
        if tid is not None and tid != pid:
            continue
        names = [_short(f) for f in frames]
        at = next((i for i, f in enumerate(names) if _func(f) == root), None)
        if at is None or _func(names[-1]) == LOOP:
            continue
        out.append((names[at:], int(count)))
    return out


def _key(path: Path) -> tuple[str, str, str]:
    """(kind, phase, role) of a recording named ``<run>_<kind>_<phase>_<role>_<pid>.raw``."""
    run, kind, phase, rest = path.stem.split("_", 3)
    return kind, phase, rest.rsplit("_", 1)[0]


def summarise(directory: Path, top: int = 15, match: str | None = None, runs: str | None = None) -> dict:
    """Per (phase, kind): the loop's samples, the steps' shares, our package's share, and the top
    frames by inclusive and by self share, pooled over runs and schedulers. The restarted
    scheduler's recording also gives ``startup``: its whole ``_execute`` (the executor's start,
    the adoption, its first loops). ``match``: a regex; the inclusive share of every frame it
    finds is listed too."""
    pooled: dict[tuple[str, str], list] = defaultdict(list)
    wanted_runs = set(runs.split(",")) if runs else None
    for path in sorted(directory.glob("*.raw")):
        kind, phase, role = _key(path)
        if wanted_runs is not None and path.stem.split("_", 1)[0] not in wanted_runs:
            continue
        if role == "restarted":
            pooled[("startup", kind)].extend(samples(path, "_execute"))
        else:
            pooled[(phase, kind)].extend(samples(path))
    wanted = re.compile(match) if match else None
    result: dict = {}
    for (phase, kind), found in sorted(pooled.items()):
        total = sum(n for _, n in found)
        inclusive: Counter = Counter()
        own: Counter = Counter()
        steps: Counter = Counter()
        ours = 0
        for frames, n in found:
            for frame in set(frames[1:]):
                inclusive[frame] += n
            own[frames[-1]] += n
            step = _func(frames[1]) if len(frames) > 1 else "(itself)"
            steps[step if step in STEPS or phase == "startup" else "other"] += n
            ours += n if any("fenced_k8s_executor/" in f for f in frames) else 0
        share = (lambda c: [(f, c[f] / total) for f, _ in c.most_common(top)]) if total else (lambda c: [])
        result.setdefault(phase, {})[kind] = {
            "samples": total, "steps": {s: n / total for s, n in steps.most_common(8)} if total else {},
            "ours": ours / total if total else None, "inclusive": share(inclusive), "self": share(own),
            "matched": sorted(((f, n / total) for f, n in inclusive.items() if wanted and wanted.search(f)),
                              key=lambda fv: -fv[1])[:top] if total else []}
    return result


def markdown(summary: dict, top: int = 15, brief: bool = False) -> str:
    """Per phase and kind: the steps, then the top frames (inclusive, self) and the ``match``ed
    ones; ``brief``: the matched frames only, both kinds side by side."""
    lines = []
    for phase, kinds in summary.items():
        lines.append(f"#### {phase}\n")
        if brief:
            lines.extend(_side_by_side(kinds))
            continue
        for kind, s in kinds.items():
            lines.append(f"**{kind}**: {s['samples']} samples, fenced_k8s_executor in {s['ours'] or 0:.1%}; steps: "
                         + ", ".join(f"{k} {v:.0%}" for k, v in s["steps"].items()))
            lines.append("")
            lines.append("| inclusive | frame | | self | frame |")
            lines.append("|---|---|---|---|---|")
            for (fi, vi), (fs, vs) in zip(s["inclusive"][:top], s["self"][:top]):
                lines.append(f"| {vi:.1%} | `{fi}` | | {vs:.1%} | `{fs}` |")
            for f, v in s["matched"]:
                lines.append(f"| {v:.1%} | `{f}` | | | |")
            lines.append("")
    return "\n".join(lines)


def _side_by_side(kinds: dict) -> list[str]:
    names = sorted(kinds, key=lambda k: k != "stock")
    shares = {k: dict(kinds[k]["matched"]) for k in names}
    frames = sorted({f for k in names for f in shares[k]}, key=lambda f: -max(shares[k].get(f, 0) for k in names))
    lines = ["| " + " | ".join(f"{k} ({kinds[k]['samples']} samples)" for k in names) + " | frame |",
             "|" + "---|" * (len(names) + 1)]
    lines += ["| " + " | ".join(f"{shares[k][f]:.1%}" if f in shares[k] else "-" for k in names) + f" | `{f}` |"
              for f in frames]
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fenced_k8s_lab.bench.pyspy", description=__doc__.split("\n")[0])
    ap.add_argument("directory")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--match", help="a regex: the inclusive share of every frame it finds, listed too")
    ap.add_argument("--brief", action="store_true", help="the --match frames only, the kinds side by side")
    ap.add_argument("--runs", help="comma-separated run tags to read (r1,r4): leave the others out")
    args = ap.parse_args(argv)
    print(markdown(summarise(Path(args.directory), args.top, args.match, args.runs), args.top, args.brief))
    return 0


if __name__ == "__main__":
    sys.exit(main())
