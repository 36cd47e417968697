"""Issue 11 (6): a worker image without the package must not fail its tasks.

The pod's own program (container command + args, read back from the pod the executor created)
runs as a real worker process in an environment where ``import fenced_k8s_executor`` fails, as in
an image built without the package. It must run the stock Task SDK entrypoint: the task really
runs against the execution API (served here from the api-server's execution API app) and the
TI ends ``success`` in the metadata DB.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

KINDS = ["stock", "fenced"]

#: Loaded at interpreter start (``sitecustomize`` on PYTHONPATH): the worker image has neither the
#: package's modules nor its distribution metadata (so no provider/plugin entry points either).
IMAGE_WITHOUT_PACKAGE = '''
import importlib.abc
import importlib.machinery
import sys

PACKAGE, DISTRIBUTION = "fenced_k8s_executor", "fenced-k8s-executor"


class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == PACKAGE or name.startswith(PACKAGE + "."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())


def _hide(finder):
    found = finder.find_distributions  # bound: a staticmethod or a classmethod

    def find_distributions(*args, **kwargs):
        for dist in found(*args, **kwargs):
            if (dist.metadata["Name"] or "").lower().replace("_", "-") != DISTRIBUTION:
                yield dist

    finder.find_distributions = staticmethod(find_distributions)


_hide(importlib.machinery.PathFinder)
try:  # Airflow reads entry points through the importlib_metadata backport
    import importlib_metadata
except ImportError:
    pass
else:
    _hide(importlib_metadata.MetadataPathFinder)
'''


@pytest.fixture(scope="module")
def execution_api(metadata_db):
    """The execution API routes over HTTP (the in-process app Airflow's dag.test() uses: real
    routes and DB, request auth bypassed), on a free local port."""
    import uvicorn

    from airflow.api_fastapi.execution_api.app import InProcessExecutionAPI

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(InProcessExecutionAPI().app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.started, f"execution API did not start (thread alive: {thread.is_alive()})"
    yield f"http://127.0.0.1:{port}/"
    server.should_exit = True
    thread.join(10)


@pytest.mark.parametrize("kind", KINDS)
def test_pod_program_without_the_package_runs_the_stock_entrypoint(world, execution_api, kind):
    sched = world.scheduler(kind)
    world.queue(sched)
    sched.executor.sync()
    row = world.row("t1")
    pod = world.kube.read_namespaced_pod(world.pod_of(row), world.namespace)
    container = pod.spec.containers[0]
    program = list(container.command or []) + list(container.args or [])
    assert program[0] == "python"
    shadow = world.tmp_path / "image_without_package"
    shadow.mkdir()
    (shadow / "sitecustomize.py").write_text(IMAGE_WITHOUT_PACKAGE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")]),
           "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": execution_api,
           "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(world.tmp_path / "logs"), "PYTHONUNBUFFERED": "1"}
    probe = ("import importlib.metadata as m, importlib_metadata as b\n"
             "for md in (m, b):\n"
             "    assert 'fenced-k8s-executor' not in {(d.metadata['Name'] or '').lower() for d in md.distributions()}\n"
             "import fenced_k8s_executor\n")
    check = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60,
                           cwd=str(world.tmp_path))
    assert check.returncode != 0 and "No module named 'fenced_k8s_executor'" in check.stderr, check.stderr
    proc = subprocess.Popen([sys.executable, *program[1:]], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=str(world.tmp_path))
    try:
        output, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"worker timed out:\n{output[-4000:]}")
    assert "Executing workload" in output, f"{kind}: the stock entrypoint never started:\n{output[-4000:]}"
    assert proc.returncode == 0, output[-4000:]
    assert world.row("t1").state == "success", output[-4000:]
