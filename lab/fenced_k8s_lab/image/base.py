"""The stand-in bases: Debian bookworm (debootstrap minbase), the apache/airflow stand-in on top of
it, and the PostgreSQL image. Each cached rootfs is a tar in the cache dir, keyed by a hash of its
recipe: the source text of the functions that build it, the package lists, the Airflow version and
extras, the constraints file's contents and the entrypoint scripts. The PostgreSQL image is not
cached (about 30 s on top of the cached Debian base)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import json
import os
import re
import subprocess
import tempfile
from configparser import ConfigParser
from pathlib import Path

from fenced_k8s_lab.image.chroot import Bind, Jail, Timer, rmtree, tar_create, tar_extract

SUITE = "bookworm"
STANDIN_PYTHON = "3.11"  # bookworm's python3: the Dockerfile's base is apache/airflow:<version>-python3.11
DEBIAN_PACKAGES = ["bash", "ca-certificates", "dumb-init", "python3", "python3-venv"]
AIRFLOW_EXTRAS = "cncf.kubernetes,postgres"
AIRFLOW_UID = 50000
AIRFLOW_HOME = "/opt/airflow"
AIRFLOW_USER_HOME = "/home/airflow"
VENV = f"{AIRFLOW_USER_HOME}/.local"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
APT_ENV = {"PATH": BASE_PATH, "DEBIAN_FRONTEND": "noninteractive", "LANG": "C.UTF-8", "HOME": "/root"}
BUILD_CA = "/etc/ssl/certs/ca-certificates.crt"  # host bundle bound here for pip, build steps only
PIP_CACHE_MOUNT = "/var/cache/fenced-build-pip"   # host pip cache bound here, build steps only

# The image config of the stand-in (what apache/airflow:3.x declares).
AIRFLOW_ENTRYPOINT = ["/usr/bin/dumb-init", "--", "/entrypoint"]
AIRFLOW_ENV = {
    "AIRFLOW_HOME": AIRFLOW_HOME,
    "AIRFLOW_USER_HOME_DIR": AIRFLOW_USER_HOME,
    "AIRFLOW_UID": str(AIRFLOW_UID),
    "PATH": f"{VENV}/bin:{BASE_PATH}",
    "PYTHONUNBUFFERED": "1",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
}
AIRFLOW_USER = str(AIRFLOW_UID)
AIRFLOW_WORKDIR = AIRFLOW_HOME

# The entrypoint: the part of apache/airflow's entrypoint_prod.sh the Helm chart relies on.
ENTRYPOINT_SH = r"""#!/usr/bin/env bash
# Stand-in for apache/airflow's /entrypoint (fenced-k8s-executor lab image; see
# lab/fenced_k8s_lab/image). Subset: umask, waiting for the metadata DB, and the
# bash/python/airflow dispatch. Not reproduced: adding an arbitrary UID to /etc/passwd,
# _PIP_ADDITIONAL_REQUIREMENTS, _AIRFLOW_DB_MIGRATE/_AIRFLOW_WWW_USER_CREATE, Celery broker waits.
set -euo pipefail
umask 0002

: "${CONNECTION_CHECK_MAX_COUNT:=20}"
: "${CONNECTION_CHECK_SLEEP_TIME:=3}"

wait_for_airflow_db() {
    local count=0
    until airflow db check >/dev/null 2>&1; do
        count=$((count + 1))
        if [[ ${count} -ge ${CONNECTION_CHECK_MAX_COUNT} ]]; then
            echo "ERROR! Maximum number of retries (${CONNECTION_CHECK_MAX_COUNT}) reached while checking the metadata database" >&2
            airflow db check >&2 || true
            exit 1
        fi
        echo "Waiting for the metadata database (${count}/${CONNECTION_CHECK_MAX_COUNT}), sleeping ${CONNECTION_CHECK_SLEEP_TIME}s" >&2
        sleep "${CONNECTION_CHECK_SLEEP_TIME}"
    done
}

if [[ ${1:-} == "bash" ]]; then
    shift
    exec /bin/bash "$@"
elif [[ ${1:-} == "python" ]]; then
    shift
    exec python "$@"
elif [[ ${1:-} == "airflow" ]]; then
    shift
fi

if [[ ${CONNECTION_CHECK_MAX_COUNT} -gt 0 ]]; then
    wait_for_airflow_db
fi

exec airflow "$@"
"""

# The log groomer the Helm chart runs as a sidecar (`bash /clean-logs`), as in apache/airflow.
CLEAN_LOGS_SH = r"""#!/usr/bin/env bash
# Stand-in for apache/airflow's /clean-logs (the Helm chart's log-groomer sidecar): deletes task
# logs older than AIRFLOW__LOG_RETENTION_DAYS (default 15) every
# AIRFLOW__LOG_CLEANUP_FREQUENCY_MINUTES (default 15). Not reproduced: the size-based trimming.
set -euo pipefail
readonly DIRECTORY="${AIRFLOW_HOME:-/opt/airflow}"
readonly RETENTION="${AIRFLOW__LOG_RETENTION_DAYS:-15}"
readonly FREQUENCY="${AIRFLOW__LOG_CLEANUP_FREQUENCY_MINUTES:-15}"
trap "exit" INT TERM
readonly EVERY=$((FREQUENCY * 60))
echo "Cleaning logs every $EVERY seconds"
while true; do
    echo "Trimming airflow logs to ${RETENTION} days."
    find "${DIRECTORY}"/logs -type d -name 'lost+found' -prune -o \
        -type f -mtime +"${RETENTION}" -name '*.log' -print0 | xargs -0 rm -f || true
    find "${DIRECTORY}"/logs -mindepth 1 -type d -empty -delete || true
    seconds=$(($(date -u +%s) % EVERY))
    ((seconds < 1)) || sleep $((EVERY - seconds - 1)) &
    wait $! || true
    sleep 1 &
    wait $! || true
done
"""

# PostgreSQL: behaves like the official postgres image for POSTGRES_USER/PASSWORD/DB and PGDATA.
POSTGRES_MAJOR = 15
POSTGRES_ENTRYPOINT = ["/usr/local/bin/docker-entrypoint.sh"]
POSTGRES_CMD = ["postgres"]
POSTGRES_ENV = {
    "PATH": f"/usr/lib/postgresql/{POSTGRES_MAJOR}/bin:{BASE_PATH}",
    "PGDATA": "/var/lib/postgresql/data",
    "LANG": "C.UTF-8",
}
POSTGRES_ENTRYPOINT_SH = r"""#!/usr/bin/env bash
# Stand-in for the official postgres image's docker-entrypoint.sh (fenced-k8s-executor lab image):
# POSTGRES_USER (default postgres), POSTGRES_PASSWORD (required unless
# POSTGRES_HOST_AUTH_METHOD=trust), POSTGRES_DB (default POSTGRES_USER), PGDATA. Started as root it
# fixes the ownership of PGDATA and the socket dir and re-runs itself as postgres.
# Difference: SIGTERM (what Kubernetes sends) is turned into PostgreSQL's fast shutdown (SIGINT),
# what the official image gets from STOPSIGNAL SIGINT; a plain SIGTERM would wait for every client.
set -Eeo pipefail

if [[ ${1:-} == -* ]]; then
    set -- postgres "$@"
fi
: "${PGDATA:=/var/lib/postgresql/data}"
export PGDATA

if [[ ${1:-} == postgres && $(id -u) == 0 ]]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA"
    chmod 0700 "$PGDATA"
    chown postgres:postgres /var/run/postgresql
    chmod 3777 /var/run/postgresql
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$BASH_SOURCE" "$@"
fi

if [[ ${1:-} == postgres && ! -s $PGDATA/PG_VERSION ]]; then
    : "${POSTGRES_USER:=postgres}"
    : "${POSTGRES_DB:=$POSTGRES_USER}"
    : "${POSTGRES_HOST_AUTH_METHOD:=scram-sha-256}"
    if [[ -z ${POSTGRES_PASSWORD:-} && $POSTGRES_HOST_AUTH_METHOD != trust ]]; then
        echo "error: POSTGRES_PASSWORD is not set (or set POSTGRES_HOST_AUTH_METHOD=trust)" >&2
        exit 1
    fi
    pwfile=$(mktemp)
    printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$pwfile"
    initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust \
        --auth-host="$POSTGRES_HOST_AUTH_METHOD" --encoding=UTF8 --locale=C.UTF-8 >&2
    rm -f "$pwfile"
    printf '\nhost all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD" >>"$PGDATA/pg_hba.conf"
    printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
    if [[ $POSTGRES_DB != postgres ]]; then
        pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -p ${PGPORT:-5432}" start >&2
        psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --no-password --dbname postgres \
            -p "${PGPORT:-5432}" -c "CREATE DATABASE \"$POSTGRES_DB\"" >&2
        pg_ctl -D "$PGDATA" -m fast -w stop >&2
    fi
    echo "PostgreSQL init process complete; ready for start up." >&2
fi

if [[ ${1:-} == postgres ]]; then
    "$@" &
    pid=$!
    trap 'kill -INT "$pid" 2>/dev/null || true' TERM INT
    # wait returns early when a trapped signal arrives: wait until postgres is gone, then take
    # its own exit status (bash keeps it for the last wait).
    while kill -0 "$pid" 2>/dev/null; do wait "$pid" || true; done
    wait "$pid"
    exit
fi
exec "$@"
"""


def cache_dir() -> Path:
    """${FENCED_IMAGE_CACHE} or ${XDG_CACHE_HOME:-~/.cache}/fenced-k8s-executor/image."""
    if os.environ.get("FENCED_IMAGE_CACHE"):
        return Path(os.environ["FENCED_IMAGE_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "fenced-k8s-executor" / "image"


def debian_mirror() -> str:
    """The Debian mirror of this host's apt sources (deb822 or one-line), else deb.debian.org."""
    env = os.environ.get("FENCED_DEBIAN_MIRROR")
    if env:
        return env
    src = Path("/etc/apt/sources.list.d/debian.sources")
    if src.exists():
        for block in src.read_text().split("\n\n"):
            uris = re.search(r"^URIs:\s*(\S+)", block, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", block, re.M)
            if uris and suites and SUITE in suites.group(1).split():
                return uris.group(1)
    lst = Path("/etc/apt/sources.list")
    if lst.exists():
        for line in lst.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE:
                return parts[1] if not parts[1].startswith("[") else parts[2]
    return "http://deb.debian.org/debian"


def host_ca_bundle() -> str | None:
    """The CA bundle the host's pip uses (PIP_CERT, pip.conf `cert`, SSL_CERT_FILE, REQUESTS_CA_BUNDLE,
    else the system bundle): bound into the rootfs for pip during the build only."""
    cands = [os.environ.get("PIP_CERT")]
    for conf in ("/etc/pip.conf", os.path.expanduser("~/.config/pip/pip.conf"), os.path.expanduser("~/.pip/pip.conf")):
        if os.path.exists(conf):
            cp = ConfigParser()
            try:
                cp.read(conf)
                cands.append(cp.get("global", "cert", fallback=None))
            except Exception:
                pass
    cands += [os.environ.get("SSL_CERT_FILE"), os.environ.get("REQUESTS_CA_BUNDLE"), "/etc/ssl/certs/ca-certificates.crt"]
    return next((c for c in cands if c and os.path.isfile(c)), None)


def build_env() -> tuple[dict, list[Bind]]:
    """Extra env and binds for network steps: the host's CA bundle and its pip index/proxy settings
    (not PIP_FIND_LINKS and such: host paths mean nothing in the rootfs). Build steps only."""
    env, binds = {}, []
    ca = host_ca_bundle()
    if ca:
        binds.append(Bind(ca, BUILD_CA, readonly=True))
        env.update(PIP_CERT=BUILD_CA, SSL_CERT_FILE=BUILD_CA, REQUESTS_CA_BUNDLE=BUILD_CA)
    for k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT",
              "PIP_DISABLE_PIP_VERSION_CHECK", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
              "http_proxy", "https_proxy", "no_proxy"):
        if os.environ.get(k):
            env[k] = os.environ[k]
    return env, binds


def _hash(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _apt(jail: Jail, packages: list[str]) -> None:
    """apt-get install in the rootfs with no daemon started (policy-rc.d only for the call)."""
    policy = jail.root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    os.chmod(policy, 0o755)
    try:
        _apt_run(jail, packages)
    finally:
        policy.unlink(missing_ok=True)


def _apt_run(jail: Jail, packages: list[str]) -> None:
    jail.sh("apt-get update -qq && apt-get install -y -qq --no-install-recommends " + " ".join(packages)
            + " >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/*")


def _finish_rootfs(root: Path) -> None:
    """What a container runtime provides at start must not be baked in."""
    (root / "etc/resolv.conf").unlink(missing_ok=True)
    (root / "etc/resolv.conf").touch()
    (root / "etc/hostname").write_text("localhost\n")
    for d in ("tmp", "var/tmp"):
        for p in (root / d).iterdir():
            rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


@contextlib.contextmanager
def _locked(path: Path):
    """One builder at a time per cached tar (a second one waits, then finds the tar made)."""
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Bases:
    """Builds or reuses the cached rootfs tars."""

    def __init__(self, repo: Path, timer: Timer, constraints: Path, airflow_version: str,
                 pip_cache: Path | None, say=print):
        self.repo, self.timer, self.say = repo, timer, say
        self.constraints, self.airflow_version = constraints, airflow_version
        self.pip_cache = pip_cache
        self.dir = cache_dir()
        self.dir.mkdir(parents=True, exist_ok=True)

    # --- Debian -------------------------------------------------------------------------------
    def debian_key(self) -> str:
        return _hash("debian-v1", SUITE, " ".join(DEBIAN_PACKAGES),
                     *map(inspect.getsource, (Bases._debian_tar, _apt, _apt_run, _finish_rootfs)))

    def debian_tar(self) -> Path:
        tar = self.dir / f"debian-{SUITE}-{self.debian_key()}.tar"
        with _locked(self.dir / ".lock-debian"):
            return self._debian_tar(tar)

    def _debian_tar(self, tar: Path) -> Path:
        if tar.exists():
            self.say(f"[image] cached Debian base: {tar}")
            return tar
        with tempfile.TemporaryDirectory(dir=self.dir, prefix="work-") as tmp:
            root = Path(tmp) / "rootfs"
            mirror = debian_mirror()
            with self.timer(f"debootstrap --variant=minbase {SUITE} ({mirror})"):
                subprocess.run(["debootstrap", "--variant=minbase", SUITE, str(root), mirror],
                               check=True, stdout=subprocess.DEVNULL)
            with self.timer("apt-get install " + " ".join(DEBIAN_PACKAGES)):
                _apt(Jail(root, env=APT_ENV), DEBIAN_PACKAGES)
            _finish_rootfs(root)
            with self.timer("cache the Debian base"):
                tar_create(root, tar)
            rmtree(root)
        return tar

    # --- apache/airflow stand-in ----------------------------------------------------------------
    def airflow_key(self) -> str:
        return _hash("airflow-v1", self.debian_key(), inspect.getsource(Bases._airflow_tar),
                     self.airflow_version, AIRFLOW_EXTRAS,
                     self.constraints.read_text(), ENTRYPOINT_SH, CLEAN_LOGS_SH, json.dumps(AIRFLOW_ENV, sort_keys=True))

    def airflow_tar(self) -> Path:
        tar = self.dir / f"airflow-{self.airflow_version}-{self.airflow_key()}.tar"
        if not tar.exists():
            self.debian_tar()  # outside the airflow lock (it takes its own)
        with _locked(self.dir / ".lock-airflow"):
            return self._airflow_tar(tar)

    def _airflow_tar(self, tar: Path) -> Path:
        if tar.exists():
            self.say(f"[image] cached apache/airflow:{self.airflow_version} stand-in: {tar}")
            return tar
        debian = self.debian_tar()
        with tempfile.TemporaryDirectory(dir=self.dir, prefix="work-") as tmp:
            root = Path(tmp) / "rootfs"
            with self.timer("unpack the Debian base"):
                tar_extract(debian, root)
            j = Jail(root, env=APT_ENV)
            j.sh(f"useradd --uid {AIRFLOW_UID} --gid 0 --home-dir {AIRFLOW_USER_HOME} --create-home "
                 f"--shell /bin/bash airflow"
                 f" && mkdir -p {AIRFLOW_HOME}/dags {AIRFLOW_HOME}/logs"
                 f" && chown -R airflow:0 {AIRFLOW_HOME} {AIRFLOW_USER_HOME}"
                 f" && chmod -R g+rwX {AIRFLOW_HOME} {AIRFLOW_USER_HOME}")
            for path, text in (("entrypoint", ENTRYPOINT_SH), ("clean-logs", CLEAN_LOGS_SH)):
                (root / path).write_text(text)
                os.chmod(root / path, 0o755)
            (root / "tmp/constraints.txt").write_bytes(self.constraints.read_bytes())
            env, binds = build_env()
            env.update(AIRFLOW_ENV, HOME=AIRFLOW_USER_HOME, USER="airflow")
            if self.pip_cache:
                self.pip_cache.mkdir(parents=True, exist_ok=True)
                os.chown(self.pip_cache, AIRFLOW_UID, 0)
                binds.append(Bind(str(self.pip_cache), PIP_CACHE_MOUNT))
                env["PIP_CACHE_DIR"] = PIP_CACHE_MOUNT
            else:
                env["PIP_NO_CACHE_DIR"] = "1"
            aj = Jail(root, uid=AIRFLOW_UID, gid=0, cwd=AIRFLOW_HOME, env=env, binds=binds, umask=0o002)
            with self.timer(f"venv + pip install apache-airflow[{AIRFLOW_EXTRAS}]=={self.airflow_version}"):
                aj.sh(f"python3 -m venv {VENV} && {VENV}/bin/pip install -q --upgrade pip"
                      f" -c /tmp/constraints.txt"
                      f" && {VENV}/bin/pip install -q 'apache-airflow[{AIRFLOW_EXTRAS}]=={self.airflow_version}'"
                      f" -c /tmp/constraints.txt")
            out = aj.run(["/bin/sh", "-c", "airflow version"], capture_output=True, text=True)
            self.say(f"[image] stand-in airflow version: {out.stdout.strip().splitlines()[-1]}")
            # `airflow version` may have written config/logs into AIRFLOW_HOME: keep it pristine.
            for p in ("airflow.cfg", "airflow.db", "webserver_config.py", "simple_auth_manager_passwords.json.generated"):
                (root / AIRFLOW_HOME.lstrip("/") / p).unlink(missing_ok=True)
            rmtree(root / AIRFLOW_USER_HOME.lstrip("/") / ".cache")
            _finish_rootfs(root)
            with self.timer("cache the apache/airflow stand-in"):
                tar_create(root, tar)
            rmtree(root)
        return tar

    # --- PostgreSQL ------------------------------------------------------------------------------
    def postgres_key(self, name: str) -> str:
        return _hash("postgres-v1", self.debian_key(), name, inspect.getsource(Bases.postgres_rootfs),
                     POSTGRES_ENTRYPOINT_SH, json.dumps([POSTGRES_ENTRYPOINT, POSTGRES_CMD, POSTGRES_ENV]))

    def postgres_rootfs(self, root: Path) -> None:
        debian = self.debian_tar()
        with self.timer("unpack the Debian base"):
            tar_extract(debian, root)
        j = Jail(root, env=APT_ENV)
        with self.timer(f"apt-get install postgresql-{POSTGRES_MAJOR}"):
            # Like the official image: user postgres is 999:999 (manifests may set runAsUser/fsGroup
            # 999), and the package makes no cluster; the entrypoint runs initdb.
            j.sh("groupadd -r postgres --gid=999 && useradd -r -g postgres --uid=999"
                 " --home-dir=/var/lib/postgresql --shell=/bin/bash postgres"
                 " && mkdir -p /var/lib/postgresql && chown -R postgres:postgres /var/lib/postgresql")
            _apt(j, ["postgresql-common"])
            j.sh("sed -ri 's/#(create_main_cluster) .*$/\\1 = false/' /etc/postgresql-common/createcluster.conf")
            _apt(j, [f"postgresql-{POSTGRES_MAJOR}"])
        j.sh("mkdir -p /var/lib/postgresql/data /var/run/postgresql"
             " && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql"
             " && chmod 0700 /var/lib/postgresql/data && chmod 3777 /var/run/postgresql")
        dst = root / "usr/local/bin/docker-entrypoint.sh"
        dst.write_text(POSTGRES_ENTRYPOINT_SH)
        os.chmod(dst, 0o755)
        _finish_rootfs(root)
