"""What this build is: the package's version and the commit its wheel was built from, so that an
image tag can be checked against the code a scheduler really runs.

The version has one source, ``pyproject.toml``, read here from the installed distribution's
metadata. The commit is in ``_build.py``, which the build writes beside the modules (``setup.py``)
and which is never in the source tree: an editable install or a checkout on ``sys.path`` has none,
and says so instead of guessing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from fenced_k8s_executor.names import DISTRIBUTION

#: The version of a source tree on ``sys.path`` that was never installed (no metadata to read).
UNKNOWN_VERSION = "0+unknown"
#: ``Build.source`` when the code was not installed from a wheel this repository's build made.
NO_RECORD = "no record"


@functools.cache
def version() -> str:
    from importlib.metadata import PackageNotFoundError, version as installed

    try:
        return installed(DISTRIBUTION)
    except PackageNotFoundError:
        return UNKNOWN_VERSION


@dataclass(frozen=True)
class Build:
    version: str
    commit: str | None  # the full commit id, when known
    dirty: bool | None  # the tree had uncommitted changes (None: not known)
    commit_date: str | None
    source: str  # how the commit was found: "git", "FENCED_BUILD_COMMIT", "none" (built without git), NO_RECORD

    @property
    def short_commit(self) -> str:
        """For log lines: 12 hex digits (``+dirty`` for uncommitted changes), or why there is none."""
        if self.commit:
            return self.commit[:12] + ("+dirty" if self.dirty else "")
        return "unknown(built-without-git)" if self.source == "none" else "unknown(not-a-built-wheel)"

    def commit_line(self) -> str:
        """The commit in words, for people."""
        if self.commit:
            state = {True: " + uncommitted changes", False: "", None: " (uncommitted changes not known)"}[self.dirty]
            when = f", committed {self.commit_date}" if self.commit_date else ""
            given = ", as FENCED_BUILD_COMMIT gave it" if self.source == "FENCED_BUILD_COMMIT" else ""
            return f"commit {self.commit}{state}{when}{given}"
        if self.source == "none":
            return ("commit unknown: the wheel was built without git (from a copy of the source: "
                    "set FENCED_BUILD_COMMIT when building from one)")
        return "commit unknown: not installed from a built wheel (an editable install or a source tree)"

    def log_fields(self) -> str:
        return f"version={self.version} commit={self.short_commit}"

    def as_dict(self) -> dict:
        return {"version": self.version, "commit": self.commit, "dirty": self.dirty,
                "commit_date": self.commit_date, "commit_source": self.source}


@functools.cache
def this_build() -> Build:
    try:
        # As a submodule: ``from fenced_k8s_executor import _build`` would ask the package's __getattr__ first.
        import fenced_k8s_executor._build as _build  # type: ignore[import-not-found]
    except ImportError:
        return Build(version(), None, None, None, NO_RECORD)
    return Build(version(), getattr(_build, "COMMIT", None), getattr(_build, "DIRTY", None),
                 getattr(_build, "COMMIT_DATE", None), getattr(_build, "SOURCE", "none"))
