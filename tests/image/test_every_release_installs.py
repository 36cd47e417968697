"""Every supported patch release installs (issue 54): for each Airflow release in the declared
range (``pyproject.toml``; read off the package index, so a new release without its file fails
here) ``constraints/airflow-<version>.txt`` resolves the image's ``pip install`` line with each
cncf-kubernetes provider release in the range, and pins everything it resolves but the provider.

Before, only the default recipe's file existed for 3.3 (``.ci/constraints.txt``, Airflow 3.3.2): a
team on 3.3.0 or 3.3.1 got ``ResolutionImpossible``. Resolution only (``pip install --dry-run
--report``, wheels, CPython 3.11; nothing is installed): 15 resolutions, three at a time, about
1-1.5 minutes; the default recipe is installed for real by test_install_recipe.py. Needs the
package index.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tool():
    loader = importlib.machinery.SourceFileLoader("install_constraints", str(ROOT / ".ci" / "install-constraints"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def test_the_declared_range_is_what_the_files_cover(tool):
    airflows = tool.in_range(tool.AIRFLOW)
    assert {"3.2.2", "3.3.0", "3.3.1", "3.3.2"} <= set(airflows)  # the releases of the issue, at least
    assert sorted(p.name for p in (ROOT / "constraints").glob("airflow-*.txt")) == sorted(
        tool.file_for(a).name for a in airflows)


def test_every_airflow_and_provider_release_in_the_range_resolves(tool):
    assert tool.check(say=lambda _: None) == []


def test_the_default_constraints_alone_would_refuse_another_patch_release(tool):
    """The recipe before: 3.3.0 against the default file (Airflow 3.3.2's pins)."""
    with pytest.raises(RuntimeError, match="ResolutionImpossible|conflict"):
        tool.resolve("3.3.0", "10.25.0", ROOT / ".ci" / "constraints.txt")
