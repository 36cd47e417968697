"""The worker's start guard with real signals, in child processes: a pod told to stop before its
/run is sent never sends it, also when the stop comes while the Task SDK's own handler is in place
(Airflow 3.4's warm shutdown around the start); once /run is sent, a stop gets the stock action.
The end-to-end runs against a real api-server are in tests/integration/test_launch_gate.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from fenced_k8s_executor import worker


def _child(body: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent("""
        import os, signal, sys, time
        from fenced_k8s_executor.worker import StartGuard, StoppedBeforeRun, _Interrupted
        guard = StartGuard()
        assert guard.install()
    """) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_stop_before_run_ends_the_work_at_once():
    done = _child("""
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            print("went on")
        except _Interrupted as stop:
            print("interrupted", stop)
        try:
            guard.before_run()
        except StoppedBeforeRun as stop:
            print("no /run", stop)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["interrupted SIGTERM", "no /run SIGTERM"]


def test_a_stop_inside_the_sdks_own_handler_still_stops_the_launch():
    """Airflow 3.4's Task SDK replaces SIGTERM's handler around the start (warm shutdown): a stop
    then reaches only the SDK, which logs it and lets /run go out. The guard still sees it."""
    coordinator = pytest.importorskip("airflow.sdk.execution_time.coordinator",
                                      reason="this Task SDK has no coordinator (before Airflow 3.3)")
    if not hasattr(coordinator, "_warm_shutdown_signals"):
        pytest.skip("this Task SDK has no warm shutdown around the start (before Airflow 3.4)")
    done = _child("""
        from airflow.sdk.execution_time.coordinator import _warm_shutdown_signals
        with _warm_shutdown_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)
            print("the SDK's handler took it")
            try:
                guard.before_run()
                print("/run sent")
            except StoppedBeforeRun as stop:
                print("no /run", stop)
    """)
    assert done.returncode == 0, done.stderr
    assert "the SDK's handler took it\nno /run SIGTERM" in done.stdout


def test_once_run_is_sent_a_stop_gets_the_stock_action():
    done = _child("""
        guard.before_run()
        guard.after_run()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        print("survived")
    """)
    assert done.returncode == -15 and "survived" not in done.stdout, done


def test_the_stop_line_names_a_refused_run_in_flight():
    guard = worker.StartGuard()
    assert worker.stopped_launch(guard, RuntimeError("x")) is None
    assert worker.stopped_launch(guard, worker.StoppedBeforeRun("SIGTERM")) == {
        "reason": "stopped_before_run", "signal": "SIGTERM", "status": "-"}


def test_a_stop_that_cuts_the_import_of_airflow_short_still_exits_0_with_the_line():
    """Seen in the lab on Airflow 3.4: the revoke's SIGTERM came while the worker imported Airflow;
    telling the stop then imported Airflow again from its half-initialized modules, which raised
    from its logging configuration: a traceback and exit 1 instead of the stop line."""
    code = textwrap.dedent("""
        import os, signal, sys

        class StopDuringImport:  # the pod is told to stop while Airflow's settings import
            def find_spec(self, name, path=None, target=None):
                if name == "airflow.settings":
                    os.kill(os.getpid(), signal.SIGTERM)
                return None

        sys.meta_path.insert(0, StopDuringImport())
        from fenced_k8s_executor.worker import main
        sys.exit(main(["--json-string", "{}"]))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [line] = [x for x in (done.stdout + done.stderr).splitlines() if worker.STOPPED in x]
    assert "stopped_before_run" in line and "SIGTERM" in line
    assert "Traceback" not in done.stdout + done.stderr
