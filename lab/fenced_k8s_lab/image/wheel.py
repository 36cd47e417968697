"""A distribution's wheel as the README's first step builds it (`pip wheel --no-deps . -w dist`),
from a clean copy of what the distribution is made of.

A copy, because setuptools builds in the source tree: it would leave build/ and *.egg-info behind,
and a stale build/lib leaks modules since removed into the next wheel. A file the distribution
needs and the list leaves out fails the build, so the lists stay honest. The copy has no ``.git``:
the commit the runtime's wheel records (``setup.py``) is passed as ``FENCED_BUILD_COMMIT`` (and
``FENCED_BUILD_DIRTY``), read from the checkout as ``pip wheel .`` would read it there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable

#: What each distribution is built from, relative to its pyproject.toml.
RUNTIME = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "fenced_k8s_executor")
LAB = ("pyproject.toml", "LICENSE", "fenced_k8s_lab")


def commit_of(source: Path) -> dict[str, str]:
    """``FENCED_BUILD_COMMIT`` and ``FENCED_BUILD_DIRTY`` for the checkout at ``source`` ({} outside git)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--verify", "HEAD")
    if not commit:
        return {}
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    return {"FENCED_BUILD_COMMIT": commit, **({} if status is None else {"FENCED_BUILD_DIRTY": str(int(bool(status)))})}


def build_wheel(source: Path, members: Iterable[str], out: Path) -> Path:
    """Build the wheel of the distribution at ``source`` into ``out``; returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fenced-wheel-") as tmp:
        tree, built = Path(tmp) / "source", Path(tmp) / "wheel"
        tree.mkdir()
        for name in members:
            path = source / name
            if path.is_dir():
                shutil.copytree(path, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(path, tree / name)
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(built),
                               str(tree)], capture_output=True, text=True, env={**os.environ, **commit_of(source)})
        if done.returncode != 0:
            raise RuntimeError(f"pip wheel {source} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        (wheel,) = built.glob("*.whl")
        return Path(shutil.move(str(wheel), str(out / wheel.name)))
