"""Fetch the installed cncf-kubernetes provider's own executor tests, and a migrated SQLite DB.

Everything lands in one cache folder inside the virtualenv (``<venv>/cache/upstream-provider-<ver>/``),
so it is fetched once per machine and provider version:

* the provider sdist, downloaded with pip (``--no-deps --no-binary :all:``) and hash-checked;
* the executor tests unpacked from it (``tests/unit/cncf/kubernetes/executors``, the kubernetes
  ``conftest.py`` and ``data_files``), read-only copies of the shipped files;
* the apache-airflow-devel-common wheel (the ``tests_common`` helpers the tests import), unpacked
  only, never installed: its own requirements (pytest<9, pinned ruff, mypy...) clash with ours;
* ``airflow-<airflow version>.db``: an SQLite database made by ``airflow db migrate``.

Hashes: versions listed in ``PINNED_SHA256`` are downloaded with pip's ``--require-hashes``. For
any other provider version there is nothing to pin yet: pip still checks the download against
the sha256 the index publishes for the file, and this module records the digest it got in the
cache (``SHA256SUMS``) and prints it, to be added to ``PINNED_SHA256`` when the version is adopted.
``FENCED_UPSTREAM_SHA256`` (hex digest) pins an unlisted version from the environment.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

PROVIDER = "apache-airflow-providers-cncf-kubernetes"
DEVEL_COMMON = "apache-airflow-devel-common"
DEVEL_COMMON_VERSION = "0.1.1"

#: sha256 of the provider sdist per version (the file PyPI serves for ``--no-binary :all:``).
PINNED_SHA256 = {
    "10.23.0": "602ff0b0ca48edbd7980c7778a04583bfe717ebd23761007f58fc53317ceb73b",
    "10.24.0": "9f9ca2ee57d2ff88c7e241fdc6d19be16b0d6acd82c5545af1a90dd846be79b7",
    "10.25.0": "134809a37537cedf05cd6d60c51b64cd1df430c29e289786214d33307b27accf",
}
#: sha256 of the devel-common wheel per version.
DEVEL_COMMON_SHA256 = {
    "0.1.1": "951ab206cf2f95768d08ad8c15b1cfaa7df404308c9e32998e3e16d217d2b032",
}

#: What is taken out of the sdist (relative to its top folder). Only the executor tests and what
#: they load: the package markers and conftests on their path, and the kubernetes data files.
SUITE_DIR = "tests/unit/cncf/kubernetes/executors"
EXTRACT = (
    "tests/conftest.py",
    "tests/unit/__init__.py",
    "tests/unit/cncf/__init__.py",
    "tests/unit/cncf/kubernetes/__init__.py",
    "tests/unit/cncf/kubernetes/conftest.py",
    "tests/unit/cncf/kubernetes/data_files/",
    SUITE_DIR + "/",
)


@dataclass(frozen=True)
class Suite:
    provider_version: str
    cache: Path  # <venv>/cache/upstream-provider-<ver>
    root: Path  # the unpacked sdist subset (rootdir of the upstream run)
    tests: Path  # root / SUITE_DIR
    devel_common: Path  # folder holding the unpacked ``tests_common`` package
    db_template: Path  # migrated SQLite database, copied per run
    sha256: str
    pinned: bool


def installed_provider_version() -> str:
    return version(PROVIDER)


def cache_root() -> Path:
    return Path(os.environ.get("FENCED_UPSTREAM_CACHE") or Path(sys.prefix) / "cache")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _pip_download(requirement: str, dest: Path, sha256: str | None, sdist: bool) -> Path:
    """Download one distribution with pip; with ``sha256`` pip refuses any other file."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        args = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                "--quiet", "--dest", scratch]
        args += ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
        if sha256:
            req = Path(scratch) / "requirements.txt"
            req.write_text(f"{requirement} --hash=sha256:{sha256}\n")
            args += ["--require-hashes", "-r", str(req)]
        else:
            args.append(requirement)
        subprocess.run(args, check=True)
        files = [p for p in Path(scratch).iterdir() if p.name != "requirements.txt"]
        if len(files) != 1:
            raise RuntimeError(f"pip download {requirement} gave {files}")
        target = dest / files[0].name
        shutil.move(str(files[0]), target)
    return target


def _checked(path: Path, expected: str | None) -> str:
    got = _sha256(path)
    if expected and got != expected:
        path.unlink()
        raise RuntimeError(f"{path.name}: sha256 {got} != pinned {expected}")
    return got


def _extract_suite(sdist: Path, root: Path) -> None:
    scratch = root.with_name(root.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = []
        for member in tar.getmembers():
            parts = member.name.split("/", 1)
            if len(parts) != 2 or not (member.isfile() or member.isdir()):
                continue
            inner = parts[1]
            if any(inner == p or (p.endswith("/") and inner.startswith(p)) for p in EXTRACT):
                member.name = inner
                members.append(member)
        tar.extractall(scratch, members=members, filter="data")
    if not (scratch / SUITE_DIR / "test_kubernetes_executor.py").is_file():
        raise RuntimeError(f"{sdist.name} does not ship {SUITE_DIR}/test_kubernetes_executor.py")
    shutil.rmtree(root, ignore_errors=True)
    scratch.rename(root)


def _devel_common(cache: Path) -> Path:
    target = cache / f"devel-common-{DEVEL_COMMON_VERSION}"
    if (target / "tests_common" / "__init__.py").is_file():
        return target
    wheel = _pip_download(f"{DEVEL_COMMON}=={DEVEL_COMMON_VERSION}", cache / "dist",
                          DEVEL_COMMON_SHA256[DEVEL_COMMON_VERSION], sdist=False)
    _checked(wheel, DEVEL_COMMON_SHA256[DEVEL_COMMON_VERSION])
    scratch = target.with_name(target.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    with zipfile.ZipFile(wheel) as whl:
        whl.extractall(scratch, [n for n in whl.namelist() if n.startswith("tests_common/")])
    scratch.rename(target)
    return target


def airflow_env(home: Path, db: Path) -> dict[str, str]:
    """The environment of an isolated Airflow: own AIRFLOW_HOME, own SQLite file, no AIRFLOW_* leaks."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW", "PYTEST_", "FENCED_UPSTREAM_")) and k != "PYTHONPATH"}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{db}",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
    })
    return env


def _migrated_db(cache: Path) -> Path:
    import airflow

    target = cache / f"airflow-{airflow.__version__}.db"
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        db = Path(scratch) / "airflow.db"
        airflow_bin = Path(sys.executable).with_name("airflow")
        subprocess.run([str(airflow_bin), "db", "migrate"], env=airflow_env(Path(scratch) / "home", db),
                       check=True, stdout=subprocess.DEVNULL)
        db.rename(target)
    return target


@contextlib.contextmanager
def _locked(cache: Path):
    """One fetcher per cache folder at a time (parallel test runs on one machine)."""
    with (cache / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def ensure_suite(provider_version: str | None = None) -> Suite:
    """Fetch (once) and return the provider's executor test suite for the installed provider."""
    ver = provider_version or installed_provider_version()
    cache = cache_root() / f"upstream-provider-{ver}"
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache):
        return _ensure_suite(ver, cache)


def _ensure_suite(ver: str, cache: Path) -> Suite:
    expected = PINNED_SHA256.get(ver) or os.environ.get("FENCED_UPSTREAM_SHA256") or None
    sums = cache / "SHA256SUMS"
    sdists = sorted((cache / "dist").glob("apache_airflow_providers_cncf_kubernetes-*.tar.gz"))
    if sdists:
        sdist = sdists[0]
    else:
        sdist = _pip_download(f"{PROVIDER}=={ver}", cache / "dist", expected, sdist=True)
    digest = _checked(sdist, expected)
    if not expected:
        recorded = sums.read_text().split()[0] if sums.is_file() else None
        if recorded and recorded != digest:
            raise RuntimeError(f"{sdist.name}: sha256 {digest} differs from the one first recorded {recorded}")
        print(f"upstream suite: {sdist.name} is not pinned; pip checked it against the index's sha256; "
              f"pin it in tests/upstream/upstream_fetch.py: PINNED_SHA256[{ver!r}] = {digest!r}")
    sums.write_text(f"{digest}  {sdist.name}\n")
    root = cache / "src"
    if not (root / SUITE_DIR).is_dir():
        _extract_suite(sdist, root)
    return Suite(
        provider_version=ver,
        cache=cache,
        root=root,
        tests=root / SUITE_DIR,
        devel_common=_devel_common(cache),
        db_template=_migrated_db(cache),
        sha256=digest,
        pinned=bool(expected),
    )


if __name__ == "__main__":  # python tests/upstream/upstream_fetch.py [provider version]
    print(ensure_suite(sys.argv[1] if len(sys.argv) > 1 else None))
