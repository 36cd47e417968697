"""The README's install recipe, as written: its Dockerfile block is the runtime stage of the
repository's Dockerfile (which the real node's image is built from, tests/node), and its
``pip install`` line installs Airflow and the package into a fresh virtualenv, against the
constraints file it names.

Docker is not here, so the test plays the instructions before the line: the wheel is built as the
README's first command builds it, and the stage's ``COPY`` puts the files it names into a scratch
directory standing for the image's ``/tmp/``. The ``RUN`` line then runs through ``/bin/sh`` as
written but for that one path, with the fresh virtualenv's ``pip`` first on ``PATH`` (in the image,
the base's own). It needs the package index and takes a few minutes: ``--no-cache-dir`` downloads
everything.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fenced_k8s_lab.image.base import STANDIN_PYTHON
from fenced_k8s_lab.image.dockerfile import Instruction, parse
from fenced_k8s_lab.image.wheel import RUNTIME, build_wheel

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _readme_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), re.M | re.S)


def _runtime_stage() -> list[Instruction]:
    stage, inside = [], False
    for ins in parse((ROOT / "Dockerfile").read_text()):
        if ins.cmd == "FROM":
            inside = ins.args.endswith(" AS runtime")
        if inside:
            stage.append(ins)
    return stage


def _recipe() -> tuple[Instruction, Instruction, Instruction]:
    """The stage's FROM, its COPY and the RUN of its pip line."""
    stage = _runtime_stage()
    (copy,) = [i for i in stage if i.cmd == "COPY"]
    pip = next(i for i in stage if i.cmd == "RUN" and i.args.startswith("pip install"))
    return stage[0], copy, pip


def test_the_readme_recipe_is_the_dockerfiles_runtime_stage():
    (block,) = _readme_blocks("dockerfile")
    stage = [(i.cmd, i.args.removesuffix(" AS runtime")) for i in _runtime_stage()]
    assert [(i.cmd, i.args) for i in parse(block)] == stage
    assert any("pip wheel --no-deps . -w dist" in b.splitlines() for b in _readme_blocks("bash"))


def test_the_recipe_pins_this_version_and_what_its_constraints_pin():
    import fenced_k8s_executor

    base, copy, pip = _recipe()
    (pinned,) = re.findall(r'"apache-airflow==([^"]+)"', pip.args)
    constraints = (ROOT / ".ci" / "constraints.txt").read_text().splitlines()
    assert f"apache-airflow=={pinned}" in constraints and ".ci/constraints.txt" in copy.args.split()
    assert base.args.removesuffix(" AS runtime") == f"apache/airflow:{pinned}-python{STANDIN_PYTHON}"
    wheel = f"fenced_k8s_executor-{fenced_k8s_executor.__version__}-py3-none-any.whl"
    assert f"dist/{wheel}" in copy.args.split() and f"/tmp/{wheel}" in pip.args.split()
    cleanup = [i.args for i in _runtime_stage() if i.cmd == "RUN" and " rm " in i.args]
    assert cleanup and cleanup[-1].endswith(f"rm /tmp/{wheel} /tmp/constraints.txt")  # nothing left in /tmp


def test_the_readme_pip_install_line_installs_into_a_fresh_venv(tmp_path):
    base, copy, pip = _recipe()
    if f"{sys.version_info.major}.{sys.version_info.minor}" != STANDIN_PYTHON:
        pytest.skip(f"the recipe's image and constraints are Python {STANDIN_PYTHON}'s; this is {sys.version}")
    *sources, destination = copy.args.split()[1:]  # after --chown
    assert destination == "/tmp/"
    image_tmp, context = tmp_path / "image-tmp", tmp_path / "context"
    image_tmp.mkdir()
    build_wheel(ROOT, RUNTIME, context / "dist")  # `pip wheel --no-deps . -w dist`
    for source in sources:
        built = context / source
        shutil.copy(built if built.exists() else ROOT / source, image_tmp / Path(source).name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # as in a fresh image: none of this test session's Airflow settings (an earlier test's metadata
    # DB URL names a driver the image's pip line does not install)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("AIRFLOW")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", AIRFLOW_HOME=str(tmp_path / "airflow"))
    line = pip.args.replace("/tmp/", f"{image_tmp}/")
    done = subprocess.run(["/bin/sh", "-c", line], env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"{line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"

    probe = ("import fenced_k8s_executor.executor, airflow; from importlib.metadata import version as v; "
             "print(airflow.__version__, v('apache-airflow-providers-cncf-kubernetes'), fenced_k8s_executor.__version__,"
             " fenced_k8s_executor.__file__)")
    found = subprocess.run([str(venv / "bin" / "python"), "-c", probe], env=env, capture_output=True, text=True,
                           timeout=600, cwd=tmp_path)  # not the checkout: `-c` puts the cwd first on sys.path
    assert str(venv) in found.stdout.split()[-1], found.stdout  # the installed wheel, not the checkout
    assert found.returncode == 0, found.stderr[-3000:]
    import fenced_k8s_executor

    pins = dict(pin.split("==") for pin in (ROOT / ".ci" / "constraints.txt").read_text().splitlines() if "==" in pin)
    assert found.stdout.split()[:3] == [pins["apache-airflow"], pins["apache-airflow-providers-cncf-kubernetes"],
                                        fenced_k8s_executor.__version__]
    checked = subprocess.run([str(venv / "bin" / "pip"), "check"], env=env, capture_output=True, text=True, timeout=300,
                             cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout[-3000:]


def test_the_stand_in_builder_copies_what_the_pip_line_installs(tmp_path):
    """The real node's image replays the same stage (``fenced-k8s-repro image``, which builds the
    wheel first): its COPY finds both files in the build context, .dockerignore and all."""
    from fenced_k8s_lab.image.build import Builder, Stage
    from fenced_k8s_lab.image.chroot import Timer

    if os.geteuid() != 0:
        pytest.skip("COPY --chown needs root, as in the image build")
    _, copy, pip = _recipe()
    context, root = tmp_path / "context", tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text("airflow:x:50000:0::/home/airflow:/bin/bash\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    (context / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".dockerignore", context / ".dockerignore")
    shutil.copy(ROOT / ".ci" / "constraints.txt", context / ".ci" / "constraints.txt")
    build_wheel(ROOT, RUNTIME, context / "dist")
    builder = Builder(context, tmp_path, bases=None, timer=Timer(lambda m: None), build_args={}, say=lambda m: None)
    builder._step(Stage("runtime", root, {}, "airflow", "/opt/airflow", [], []), copy, {})
    installed = [word for word in pip.args.split() if word.startswith("/tmp/")]
    assert len(installed) == 2 and all((root / path.lstrip("/")).stat().st_uid == 50000 for path in installed)
