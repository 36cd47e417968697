"""Worker pod entrypoint: the stock Task SDK entrypoint, exiting 0 on a stale launch.

``python -m fenced_k8s_executor.worker --json-string <workload>`` runs
``airflow.sdk.execution_time.execute_workload.main`` unchanged (same arguments, same logging,
same exit codes) with one difference: when the supervisor's ``PATCH .../run`` (the first thing
it does, before the task process is sent anything to run) is refused because this launch is
stale, it logs ONE line and exits 0 instead of dying with a traceback (exit 1, container reason
``Error``, pod ``Failed``; the stock behaviour). A launch is stale when /run answers

- 409 with ``reason == "stale_executor_launch"`` (the api-server run gate), or
- 404 for this very TI id while the workload token carries a launch claim: the TI id this
  launch targets no longer exists (cleared, retried or reset: a new id was minted), or
- 410 likewise (Airflow 3.4): the attempt this TI id names was archived by a clear, retry or
  reset, and the task has a new live attempt.

A workload without a launch claim (legacy, or ``launch_claim`` off) gets the stock behaviour
for 404 and 410. The token is read, never verified, here: the api-server verified it.
"""

from __future__ import annotations

import re
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
    from airflow.sdk.api.client import ServerResponseError

    if not isinstance(exc, ServerResponseError):
        return None
    request = exc.request
    match = _RUN_PATH.search(request.url.path)
    if request.method != "PATCH" or match is None:
        return None
    ti_id = match.group(1)
    status = exc.response.status_code
    detail = exc.detail if isinstance(exc.detail, dict) else {}
    bearer = request.headers.get("authorization", "")
    claims = unverified_claims(bearer.partition(" ")[2] if bearer.lower().startswith("bearer ") else "")
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


def main(argv: list[str] | None = None) -> int:
    from airflow.sdk.execution_time import execute_workload

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    try:
        execute_workload.main()
    except Exception as exc:
        facts = stale_launch(exc)
        if facts is None:
            raise
        import structlog

        metrics.incr("worker.stale_exit", {"reason": facts["reason"]})
        structlog.get_logger(logger_name=MODULE).warning(
            "stale executor launch: not running the task",
            reason=facts["reason"],
            ti_id=facts["ti_id"],
            launch=facts["launch"],
            current_launch=facts["current_launch"],
        )
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
