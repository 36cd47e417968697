"""Worker pod entrypoint: the stock Task SDK entrypoint, exiting 0 on a stale or stopped launch.

``python -m fenced_k8s_executor.worker --json-string <workload>`` runs
``airflow.sdk.execution_time.execute_workload.main`` unchanged (same arguments, same logging,
same exit codes) with two differences, both before the task is sent anything to run.

When the supervisor's ``PATCH .../run`` (the first thing it does) is refused because this launch
is stale, it logs ONE line and exits 0 instead of dying with a traceback (exit 1, container reason
``Error``, pod ``Failed``; the stock behaviour). A launch is stale when /run answers

- 409 with ``reason == "stale_executor_launch"`` (the api-server run gate), or
- 404 for this very TI id while the workload token carries a launch claim: the TI id this
  launch targets no longer exists (cleared, retried or reset: a new id was minted), or
- 410 likewise (Airflow 3.4): the attempt this TI id names was archived by a clear, retry or
  reset, and the task has a new live attempt.

When the pod is told to stop (SIGTERM or SIGINT: a revoke, the stuck-in-queued handler's delete,
a drain) before /run is sent, it exits 0 without sending it, with ONE line; a /run in flight when
the signal came that is refused also ends in that line and exit 0. The stock worker sends /run
anyway on Airflow 3.4 (the Task SDK's warm shutdown covers the start), where core answers 409
``invalid_state`` to a revoked launch and the worker exits 1; before 3.4 the signal kills it
(exit 143). Once /run has been sent, signals are the SDK's again: a started task is never cut
short here.

A workload without a launch claim (legacy, or ``launch_claim`` off) gets the stock behaviour
for 404 and 410. The token is read, never verified, here: the api-server verified it.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from typing import Any

from fenced_k8s_executor import metrics
from fenced_k8s_executor.launch_claim import launch_claim_of, unverified_claims

MODULE = "fenced_k8s_executor.worker"
_RUN_PATH = re.compile(r"/task-instances/([^/]+)/run/?$")
#: /run statuses that say this claimed TI id is no longer the task's live attempt, and the reason
#: logged: the id is gone (cleared, retried or reset before Airflow 3.4), or the attempt was
#: archived (3.4 keeps it as a row of its own and answers 410; 404 to clients of older API versions).
GONE = {404: "ti_not_found", 410: "attempt_archived"}
#: The signals a pod is stopped with (kubelet: SIGTERM; an interactive run: SIGINT).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: The one line a stopped launch logs (the lab counts it).
STOPPED = "stopped before the task started: not running it"


#: The pod's program: this module when the worker image has the package, else the stock Task SDK
#: entrypoint with the same arguments. A worker image built without the package must never fail
#: its tasks (the launch gate is then simply absent there).
BOOTSTRAP = (
    "import sys\n"
    "try:\n"
    "    from fenced_k8s_executor.worker import main\n"
    "except ImportError as exc:\n"
    "    print('fenced_k8s_executor not importable in this image (%s): stock entrypoint' % exc,"
    " file=sys.stderr)\n"
    "    from airflow.sdk.execution_time.execute_workload import main\n"
    "sys.exit(main())\n"
)


def command_args(workload: Any) -> list[str]:
    """Pod args for ``workload``: the provider's ``workload_to_command_args`` shape, started
    through ``BOOTSTRAP`` so that an image without this package runs the stock entrypoint."""
    return ["python", "-c", BOOTSTRAP, "--json-string", workload.model_dump_json()]


def stale_launch(exc: BaseException) -> dict[str, str] | None:
    """If ``exc`` is the /run refusal of a stale launch, the log-safe facts about it; else None."""
    refusal = run_refusal(exc)
    if refusal is None:
        return None
    ti_id, status, detail, claims = refusal
    claim = launch_claim_of(claims)
    if status == 409 and detail.get("reason") == "stale_executor_launch":
        return {
            "ti_id": ti_id,
            "reason": "stale_executor_launch",
            "launch": str(detail.get("launch") or metrics.short(claim)),
            "current_launch": str(detail.get("current_launch") or "-"),
        }
    if status in GONE and claim is not None and str(claims.get("sub")) == ti_id:
        return {"ti_id": ti_id, "reason": GONE[status], "launch": metrics.short(claim), "current_launch": "-"}
    return None


def run_refusal(exc: BaseException) -> tuple[str, int, dict, dict] | None:
    """(TI id, status, detail, unverified JWT claims) when ``exc`` is the api-server refusing this
    worker's ``PATCH .../run``; else None."""
    from airflow.sdk.api.client import ServerResponseError

    if not isinstance(exc, ServerResponseError):
        return None
    request = exc.request
    match = _RUN_PATH.search(request.url.path)
    if request.method != "PATCH" or match is None:
        return None
    detail = exc.detail if isinstance(exc.detail, dict) else {}
    bearer = request.headers.get("authorization", "")
    claims = unverified_claims(bearer.partition(" ")[2] if bearer.lower().startswith("bearer ") else "")
    return match.group(1), exc.response.status_code, detail, claims


class StoppedBeforeRun(Exception):
    """The pod was told to stop before this launch's /run was sent (raised at the /run call, where
    the SDK kills the forked task process it had prepared, as on any error there)."""


class _Interrupted(BaseException):
    """Our signal handler's way out before /run: a BaseException, so that no ``except Exception``
    on the way (argument parsing, plugin and secrets loading) turns the stop into a failure."""


class StartGuard:
    """Stops a launch told to stop before its task started, without touching a started one.

    ``install()`` catches SIGTERM and SIGINT and records every arrival through a wakeup fd, which
    the interpreter writes to whichever Python handler is installed (the Task SDK replaces ours
    around its start on Airflow 3.4). Until /run is sent, our handler ends the process's work at
    once (``_Interrupted``); the /run call checks for a recorded signal first and raises
    ``StoppedBeforeRun`` instead of sending. Once /run is sent, signals are handled the stock way
    again (our handler gives way to the default action; the SDK's own handlers are left alone) and
    the wakeup fd is given back when /run has its answer.
    """

    def __init__(self) -> None:
        self.stopped_by: str | None = None  # the first stop signal's name
        self.run_sent = False
        self._owner = os.getpid()
        self._pipe: tuple[int, int] | None = None
        self._previous_fd = -1

    def install(self) -> bool:
        """Start listening; False (and no change) outside the main thread, where signals cannot be set."""
        import threading

        if threading.current_thread() is not threading.main_thread():
            return False
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        self._pipe = (read, write)
        self._previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        return True

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.run_sent or os.getpid() != self._owner:  # the stock (default) action
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        first = self.stopped_by is None
        self.stopped_by = self.stopped_by or signal.Signals(signum).name
        if first:
            raise _Interrupted(self.stopped_by)

    def drain(self) -> None:
        """Record the stop signals that reached any handler since the last look."""
        if self._pipe is None:
            return
        try:
            data = os.read(self._pipe[0], 4096)
        except OSError:  # nothing arrived (EAGAIN)
            return
        for signum in STOP_SIGNALS:
            if bytes([int(signum)]) in data:
                self.stopped_by = self.stopped_by or signal.Signals(signum).name

    def before_run(self) -> None:
        """Right before /run is sent: raise if a stop signal came, else hand signals back."""
        self.drain()
        if self.stopped_by is not None:
            raise StoppedBeforeRun(self.stopped_by)
        self.run_sent = True
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, signal.SIG_DFL)

    def after_run(self) -> None:
        """Once /run has its answer (or failed): a last look, then stop listening."""
        self.drain()
        if self._pipe is not None:
            signal.set_wakeup_fd(self._previous_fd)
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None

    def wrap_run(self, start: Any) -> Any:
        """``TaskInstanceOperations.start`` (the /run call), checked before it is sent."""
        guard = self

        def start_checked(ops: Any, *args: Any, **kwargs: Any) -> Any:
            if os.getpid() != guard._owner:  # a forked child of the supervisor: not ours to stop
                return start(ops, *args, **kwargs)
            guard.before_run()
            try:
                return start(ops, *args, **kwargs)
            finally:
                guard.after_run()

        start_checked.__wrapped__ = start  # type: ignore[attr-defined]
        return start_checked


def stopped_launch(guard: StartGuard, exc: BaseException) -> dict[str, str] | None:
    """If ``exc`` ended a launch told to stop before its task started, the log-safe facts about it
    (a /run in flight when the signal came, then refused, counts); else None. A stop before /run
    is told without importing anything: it may have cut an import of Airflow short."""
    if isinstance(exc, (StoppedBeforeRun, _Interrupted)):
        return {"reason": "stopped_before_run", "signal": str(exc), "status": "-"}
    refusal = run_refusal(exc)
    if refusal is not None and guard.stopped_by is not None:
        return {"reason": "stopped_during_run", "signal": guard.stopped_by, "status": str(refusal[1]),
                "ti_id": refusal[0]}
    return None


def _loaded(module: str) -> bool:
    """Whether ``module`` was imported to the end (a stop may have cut its import short)."""
    found = sys.modules.get(module)
    return found is not None and not getattr(getattr(found, "__spec__", None), "_initializing", False)


def main(argv: list[str] | None = None) -> int:
    guard = StartGuard()
    guard.install()
    try:
        from airflow.sdk.api.client import TaskInstanceOperations
        from airflow.sdk.execution_time import execute_workload

        TaskInstanceOperations.start = guard.wrap_run(TaskInstanceOperations.start)  # type: ignore[method-assign]
        if argv is not None:
            sys.argv = [sys.argv[0], *argv]
        execute_workload.main()
    except (Exception, _Interrupted) as exc:
        import structlog

        logger = structlog.get_logger(logger_name=MODULE)
        early = isinstance(exc, (StoppedBeforeRun, _Interrupted))
        facts = None if early else stale_launch(exc)
        if facts is not None:
            metrics.incr("worker.stale_exit", {"reason": facts["reason"]})
            logger.warning(
                "stale executor launch: not running the task",
                reason=facts["reason"],
                ti_id=facts["ti_id"],
                launch=facts["launch"],
                current_launch=facts["current_launch"],
            )
            return 0
        stopped = stopped_launch(guard, exc)
        if stopped is None:
            raise
        logger.warning(STOPPED, **stopped)
        if _loaded("airflow"):  # metrics go through Airflow's Stats
            metrics.incr("worker.stopped_at_start", {"reason": stopped["reason"]})
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
