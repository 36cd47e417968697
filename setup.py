"""The build hook: every wheel records the commit it was built from (``fenced_k8s_executor/_build.py``).

Everything else is declared in ``pyproject.toml``. ``pip wheel --no-deps .`` runs this in the
checkout, so ``git`` answers for it; a build from a copy without ``.git`` (a source archive, a
Docker context) takes ``FENCED_BUILD_COMMIT`` (and ``FENCED_BUILD_DIRTY=1`` for a tree with
uncommitted changes) or records that it does not know. ``fenced_k8s_executor.build`` reads it.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
RECORD = "_build.py"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(HERE), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def build_record() -> dict:
    """Where this build's source came from: the commit, whether the tree had uncommitted changes
    (None: not known), the commit's date, and how it was found."""
    given = os.environ.get("FENCED_BUILD_COMMIT", "").strip().lower()
    if given:
        if not re.fullmatch(r"[0-9a-f]{7,40}", given):
            raise SystemExit(f"FENCED_BUILD_COMMIT={given!r} is not a git commit id (7-40 hex digits)")
        dirty = os.environ.get("FENCED_BUILD_DIRTY", "").strip()
        return {"COMMIT": given, "DIRTY": {"1": True, "0": False}.get(dirty), "COMMIT_DATE": None,
                "SOURCE": "FENCED_BUILD_COMMIT"}
    commit = _git("rev-parse", "--verify", "HEAD")
    if not commit:
        return {"COMMIT": None, "DIRTY": None, "COMMIT_DATE": None, "SOURCE": "none"}
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".")
    return {"COMMIT": commit, "DIRTY": None if status is None else bool(status),
            "COMMIT_DATE": _git("log", "-1", "--format=%cs", commit), "SOURCE": "git"}


class BuildPyWithRecord(build_py):
    """setuptools' ``build_py``, then the record written beside the built modules (never into the
    source tree; an editable install has none, and says so)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "fenced_k8s_executor" / RECORD
        lines = ['"""Written by the build (setup.py): what this wheel was built from."""', ""]
        lines += [f"{key} = {value!r}" for key, value in build_record().items()]
        target.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":  # as setuptools' build backend runs it (tests import build_record alone)
    setup(cmdclass={"build_py": BuildPyWithRecord})
