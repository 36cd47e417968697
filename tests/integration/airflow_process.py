"""A real ``airflow`` command in a child process, configured only by what a test passes: none of
this process's ``AIRFLOW*`` variables reach it, so its configuration is exactly the test's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from fenced_k8s_executor.names import EXECUTOR_CLASS_PATH


@dataclass
class Done:
    returncode: int | None  # None: still running when the wait ended (then killed)
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def airflow_env(url: str, home: Path, **variables: str) -> dict:
    """A deployment's environment: the metadata DB at ``url``, a home of its own, the fenced
    executor, the secrets an api-server needs; ``variables`` on top."""
    from cryptography.fernet import Fernet

    from fenced_k8s_lab.postgres import airflow_db_env

    (home / "dags").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(airflow_db_env(url))
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__EXECUTOR=EXECUTOR_CLASS_PATH,
        AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__FERNET_KEY=Fernet.generate_key().decode(),
        AIRFLOW__API__SECRET_KEY="integration-api-secret",
        AIRFLOW__API_AUTH__JWT_SECRET="integration-jwt-secret-" + "y" * 48,
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
        PYTHONUNBUFFERED="1",
    )
    env.update(variables)
    return env


def run_airflow(args: list[str], env: dict, *, wait: float = 180) -> Done:
    """``airflow ARGS`` to its end; one still running after ``wait`` seconds (a command that should
    have stopped at start, a server that did not) is killed with its process group."""
    airflow = Path(sys.executable).with_name("airflow")
    proc = subprocess.Popen([str(airflow), *args], env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=wait)
        return Done(proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        return Done(None, out, err)
