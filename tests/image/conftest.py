"""Builds the images once per session with fenced_k8s_lab.image (the stand-in base is
cached, so only the first run on a machine pays for debootstrap and the Airflow install), unpacks
each tar's layer into a temporary rootfs, and runs commands in it the way a container runtime would:
the image's entrypoint, env, working dir and user, via chroot in a private mount namespace.

Skipped (with the reason) when not root, or when debootstrap / ../shared/node/mkimage.py is missing
and cannot be installed. Marked `image`: `-m "not image"` leaves these tests out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "image: builds the container images (minutes on the first run; root)")


def _mounts_under(*dirs: Path) -> list[str]:
    """Mount points at or below `dirs` (the rest of the host may change meanwhile: other work)."""
    roots = [os.path.realpath(d) for d in dirs]
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return sorted(p for p in points for r in roots if p == r or p.startswith(r + "/"))


@dataclass
class Image:
    tar: Path
    root: Path
    config: dict
    layer: str  # the layer's member name in the tar

    @property
    def env(self) -> dict:
        env = {}
        for kv in self.config.get("Env") or []:  # later entries win, as containerd merges them
            k, _, v = kv.partition("=")
            env[k] = v
        return env

    def jail(self, user: str | None = None, env: dict | None = None):
        from fenced_k8s_lab.image.chroot import Jail, user_ids

        uid, gid, home = user_ids(self.root, user if user is not None else (self.config.get("User") or "0"))
        full = {"HOME": home, "HOSTNAME": "image-test", **self.env, **(env or {})}
        return Jail(self.root, uid=uid, gid=gid, cwd=self.config.get("WorkingDir") or "/", env=full)

    def argv(self, args: list[str]) -> list[str]:
        return list(self.config.get("Entrypoint") or []) + (args or list(self.config.get("Cmd") or []))

    def run(self, args: list[str], env: dict | None = None, timeout: float = 180, user: str | None = None):
        """Runs the image's entrypoint with `args` (like `docker run IMAGE ARGS...`)."""
        return self.jail(user, env).run(self.argv(args), check=False, capture_output=True, text=True,
                                        timeout=timeout)


def _unpack(tar: Path, dest: Path) -> Image:
    with tarfile.open(tar) as t:
        manifest = json.load(t.extractfile("manifest.json"))[0]
        config = json.load(t.extractfile(manifest["Config"]))["config"]
        (layer,) = manifest["Layers"]
    dest.mkdir()
    outer = subprocess.Popen(["tar", "-xOf", str(tar), layer], stdout=subprocess.PIPE)
    subprocess.run(["tar", "--numeric-owner", "--same-permissions", "-C", str(dest), "-xf", "-"],
                   stdin=outer.stdout, check=True)
    outer.stdout.close()
    assert outer.wait() == 0
    return Image(tar, dest, config, layer)


@pytest.fixture(scope="session")
def image_env():
    if os.environ.get("IMAGE_TESTS") != "1":
        pytest.skip("opt-in (3-6 min): IMAGE_TESTS=1; the default run builds the same image for tests/node, "
                    "which checks Airflow, the providers and the package in its pods")
    if os.geteuid() != 0:
        pytest.skip("image tests need root (debootstrap, chroot, mount namespaces)")
    if not shutil.which("debootstrap"):
        if shutil.which("apt-get"):
            subprocess.run(["apt-get", "install", "-y", "-qq", "debootstrap"], capture_output=True)
        if not shutil.which("debootstrap"):
            pytest.skip("debootstrap is missing and `apt-get install debootstrap` did not provide it")
    from fenced_k8s_lab.image.build import node_tool, repo_root

    repo = repo_root()
    tool = node_tool(repo, "mkimage.py", "FENCED_MKIMAGE")
    if not tool.exists():
        pytest.skip(f"no mkimage.py at {tool} (set FENCED_MKIMAGE)")
    return repo


@pytest.fixture(scope="session")
def image_tmp(tmp_path_factory, image_env):
    """A work dir next to the repo's out/ (same filesystem as the build; /tmp may be small)."""
    base = image_env / "out" / "image"
    base.mkdir(parents=True, exist_ok=True)
    import tempfile

    from fenced_k8s_lab.image.base import cache_dir
    from fenced_k8s_lab.image.chroot import rmtree

    d = Path(tempfile.mkdtemp(prefix=".test-", dir=base))
    watched = [d, cache_dir()] if cache_dir().exists() else [d]
    assert _mounts_under(*watched) == []
    yield d
    left = _mounts_under(*watched)
    assert left == [], f"the image tests left mounts behind: {left}"
    rmtree(d)


def _build(image_tmp: Path, name: str, args: list[str]) -> Image:
    from fenced_k8s_lab.image import main

    out = image_tmp / name
    assert main(["--out", str(out), *args]) == 0
    (tar,) = out.glob("*.tar")
    return _unpack(tar, out / "rootfs")


@pytest.fixture(scope="session")
def kind_image(image_tmp) -> Image:
    return _build(image_tmp, "kind", ["--target", "kind"])


@pytest.fixture(scope="session")
def postgres_image(image_tmp) -> Image:
    return _build(image_tmp, "postgres", ["--postgres"])
