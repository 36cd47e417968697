"""The images built without Docker: the Dockerfile's `kind` stage on the apache/airflow stand-in,
and the PostgreSQL image. Everything runs in the unpacked image tar, through the image's own
entrypoint, env, working dir and user (see conftest.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import pytest

from fenced_k8s_lab.image.base import VENV  # the airflow user's ~/.local

pytestmark = pytest.mark.image

NO_DB_WAIT = {"CONNECTION_CHECK_MAX_COUNT": "0"}


def _ok(cp: subprocess.CompletedProcess) -> str:
    assert cp.returncode == 0, f"exit {cp.returncode}\nstdout:\n{cp.stdout}\nstderr:\n{cp.stderr}"
    return cp.stdout


# --- the kind image ------------------------------------------------------------------------------

def test_image_config(kind_image):
    cfg = kind_image.config
    assert cfg["Entrypoint"][0] == "/usr/bin/dumb-init" and cfg["Entrypoint"][-1] == "/entrypoint"
    assert cfg["Cmd"] == []
    assert cfg["User"] == "airflow"  # the Dockerfile's USER, as docker stores it
    assert cfg["WorkingDir"] == "/opt/airflow"
    env = kind_image.env
    assert env["PATH"].split(":")[0] == f"{VENV}/bin"
    assert env["AIRFLOW_HOME"] == "/opt/airflow"
    assert env["AIRFLOW_UID"] == "50000" and env["AIRFLOW_USER_HOME_DIR"] == "/home/airflow"
    assert env["PYTHONUNBUFFERED"] == "1"
    passwd = (kind_image.root / "etc/passwd").read_text().splitlines()
    assert "airflow:x:50000:0::/home/airflow:/bin/bash" in passwd


def test_airflow_version(kind_image):
    out = _ok(kind_image.run(["airflow", "version"], env=NO_DB_WAIT))
    assert out.strip().splitlines()[-1] == "3.3.2"


def test_entrypoint_prefixes_airflow_and_waits_for_the_db(kind_image):
    # No `airflow` in front: the entrypoint adds it; the default DB wait (sqlite here) passes.
    out = _ok(kind_image.run(["version"]))
    assert out.strip().splitlines()[-1] == "3.3.2"


def test_entrypoint_gives_up_on_an_unreachable_db(kind_image):
    cp = kind_image.run(["version"], env={
        "CONNECTION_CHECK_MAX_COUNT": "2", "CONNECTION_CHECK_SLEEP_TIME": "0",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql+psycopg2://x:y@127.0.0.1:9/none"})
    assert cp.returncode != 0
    assert "Maximum number of retries (2)" in cp.stderr


def test_entrypoint_passes_bash_through(kind_image):
    # $0 is bash's, not airflow's: the command ran as is; uid 50000, gid 0, umask 0002.
    out = _ok(kind_image.run(["bash", "-c", 'echo "$0|$(id -u):$(id -g)|$(umask)|$PWD|$HOME"']))
    assert out.strip() == "/bin/bash|50000:0|0002|/opt/airflow|/home/airflow"


def test_entrypoint_passes_python_through(kind_image):
    out = _ok(kind_image.run(["python", "-c", "import fenced_k8s_executor, sys; "
                              "fenced_k8s_executor.FencedKubernetesExecutor; "
                              "print(fenced_k8s_executor.__file__); print(sys.prefix)"]))
    path, prefix = out.strip().splitlines()[-2:]
    assert path.startswith(f"{VENV}/lib/python3.")
    assert prefix == VENV


def test_log_groomer_sidecar_runs_and_stops_on_sigterm(kind_image):
    """The Helm chart's log-groomer sidecar runs `bash /clean-logs` in this image."""
    old = kind_image.root / "opt/airflow/logs/dag_id=x/old.log"
    old.parent.mkdir(parents=True, exist_ok=True)
    old.write_text("old\n")
    os.utime(old, (time.time() - 20 * 86400,) * 2)
    for p in (old.parent, old):
        os.chown(p, 50000, 0)  # as the task that wrote it would have
    jail = kind_image.jail()
    proc = jail.popen(kind_image.argv(["bash", "/clean-logs"]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while old.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not old.exists() and not old.parent.exists(), proc.poll()
        os.kill(proc.pid, signal.SIGTERM)  # dumb-init's pid: it forwards the signal
        proc.wait(timeout=15)
        assert "Cleaning logs every 900 seconds" in proc.stdout.read().decode()
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        jail.cleanup()


def test_providers_list(kind_image):
    out = _ok(kind_image.run(["airflow", "providers", "list", "--output", "json"], env=NO_DB_WAIT))
    names = {p["package_name"] for p in json.loads(out[out.index("["):])}
    assert "fenced-k8s-executor" in names
    assert "apache-airflow-providers-cncf-kubernetes" in names


def test_dags_are_baked_in(kind_image):
    dags = kind_image.root / "opt/airflow/dags"
    for name in ("fenced_repro.py", "fenced_smoke.py"):
        st = (dags / name).stat()
        assert (st.st_uid, st.st_gid) == (50000, 0), name
    # Both files run in the image's Python (import errors would show here).
    for name in ("fenced_repro.py", "fenced_smoke.py"):
        _ok(kind_image.run(["python", f"/opt/airflow/dags/{name}"]))
    assert 'dag_id="fenced_smoke"' in (dags / "fenced_smoke.py").read_text()


def test_no_build_leftovers(kind_image):
    """In the tar as built (the other tests run airflow in the unpacked copy and may add files)."""
    layer = subprocess.run(f"tar -xOf '{kind_image.tar}' '{kind_image.layer}' | tar -tvf - --numeric-owner",
                           shell=True, check=True, capture_output=True, text=True).stdout.splitlines()
    names = {line.split()[-1].rstrip("/") for line in layer if " -> " not in line}
    for gone in ("./tmp/fenced-k8s-executor", "./var/cache/fenced-build-pip", "./home/airflow/.cache/pip",
                 "./root/.cache/pip", "./usr/sbin/policy-rc.d", "./opt/airflow/airflow.cfg",
                 "./opt/airflow/airflow.db"):
        assert gone not in names, gone
    assert not [n for n in names if n.startswith("./tmp/")]
    resolv = next(line for line in layer if line.split()[-1] == "./etc/resolv.conf")
    assert resolv.split()[2] == "0", resolv  # empty: the runtime provides it


# --- the PostgreSQL image ------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_postgres_starts_and_takes_password_logins(postgres_image):
    psycopg2 = pytest.importorskip("psycopg2")
    port = _free_port()
    jail = postgres_image.jail(env={"POSTGRES_USER": "airflow", "POSTGRES_PASSWORD": "s3cret pw",
                                    "POSTGRES_DB": "airflow", "PGPORT": str(port)})
    proc = jail.popen(postgres_image.argv([]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        conn = None
        while conn is None:
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace")
            try:
                conn = psycopg2.connect(host="127.0.0.1", port=port, user="airflow", password="s3cret pw",
                                        dbname="airflow", connect_timeout=3)
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        with conn, conn.cursor() as cur:
            cur.execute("select current_user, current_database(), current_setting('listen_addresses')")
            assert cur.fetchone() == ("airflow", "airflow", "*")
        conn.close()
        with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
            psycopg2.connect(host="127.0.0.1", port=port, user="airflow", password="wrong", dbname="airflow",
                             connect_timeout=3)
        pgdata = postgres_image.root / "var/lib/postgresql/data"
        owner = next(line.split(":") for line in (postgres_image.root / "etc/passwd").read_text().splitlines()
                     if line.startswith("postgres:"))
        st = pgdata.stat()
        assert owner[2:4] == ["999", "999"]  # as in the official image
        assert (st.st_uid, oct(st.st_mode & 0o777)) == (999, "0o700")
        assert (pgdata / "PG_VERSION").read_text().strip() == "15"
        # SIGTERM (what the kubelet sends) stops it cleanly and quickly.
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        log = proc.stdout.read().decode(errors="replace")
        assert "database system is shut down" in log, log
        assert time.monotonic() - t0 < 30
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        pidfile = postgres_image.root / "var/lib/postgresql/data/postmaster.pid"
        if pidfile.exists():  # the entrypoint is gone but its postmaster is not: stop that one too
            pid = int(pidfile.read_text().split()[0])
            if os.path.exists(f"/proc/{pid}") and "postgres" in open(f"/proc/{pid}/cmdline").read():
                os.kill(pid, signal.SIGINT)
        jail.cleanup()
