"""The api-server run gate: ``409 stale_executor_launch`` for /run from a superseded launch.

A root ASGI middleware for Airflow's api-server, installed by :class:`FencedRunGatePlugin`
(entry point ``airflow.plugins: fenced_run_gate``) when ``[fenced_kubernetes_executor]
run_gate`` is true. It only looks at ``PATCH .../execution/task-instances/{id}/run`` requests
whose bearer JWT is valid for the execution API (the execution app's own ``JWTValidator``) and
carries the launch claim minted by :func:`fenced_k8s_executor.launch_claim.mint`. For those it
reads ``task_instance.external_executor_id`` with one primary-key SELECT (its own short
session, closed before the request continues) and answers::

    409 {"detail": {"reason": "stale_executor_launch", "message": ..., "ti_id": ...,
                    "launch": <short claim>, "current_launch": <short row token>}}

when the row names another launch token. Everything else passes through untouched and unread:
other paths and methods, requests without the claim, invalid JWTs (the route answers its own
401/403), a token whose subject is not the path id (the route's ``ti:self`` 403), unknown ids
(the route's 404), archived attempts (Airflow 3.4's own 410), legacy rows (no token), and any
error of the gate itself (a DB error never blocks a legitimate start).

What it cannot do (needs airflow-core): the check is not atomic with the route's
``SELECT ... FOR UPDATE``; a re-queue that commits between the two is not seen.
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any

try:  # core's class; the SDK's copy is accepted by name by both plugin managers
    from airflow.plugins_manager import AirflowPlugin
except ImportError:  # pragma: no cover - task-sdk-only images
    from airflow.sdk.plugins_manager import AirflowPlugin  # type: ignore[no-redef]

from fenced_k8s_executor import metrics
from fenced_k8s_executor.launch import as_token
from fenced_k8s_executor.launch_claim import launch_claim_of

log = logging.getLogger("fenced_k8s_executor.run_gate")

REASON = "stale_executor_launch"
#: ``.../execution/task-instances/<id>/run`` (any api root path prefix).
_RUN_PATH = re.compile(r"/execution/task-instances/([^/]+)/run/?$")
_MISSING = object()


def _bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == b"authorization":
            scheme, _, cred = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and cred.strip():
                return cred.strip()
            return None
    return None


def _find_execution_registry(root_app: Any) -> Any:
    """The svcs registry of the mounted execution API app (holds its JWTValidator)."""
    for route in getattr(root_app, "routes", ()):
        sub = getattr(route, "app", None)
        if getattr(route, "path", None) == "/execution" and sub is not None:
            return getattr(getattr(sub, "state", None), "svcs_registry", None)
    return None


def read_row_token(ti_id: uuid.UUID) -> Any:
    """``external_executor_id`` of one TI row by primary key, if it is its task's live attempt;
    ``_MISSING`` when there is no such row.

    Airflow 3.4 keeps archived attempts as rows of their own and answers their /run with 410
    itself: an archived attempt reads as missing here, so the route answers it. What 3.4 lets
    through is a live attempt relaunched under the same id (stuck in queued): that one the token
    check still answers with 409.

    A short transaction of the fences' own pool, bounded as every fence statement is
    (``db.bounded_connection``): a dead flow or a locked table costs the request its bound, then
    the gate passes it through.
    """
    from sqlalchemy import select

    from airflow.models.taskinstance import TaskInstance as TI

    from fenced_k8s_executor import db
    from fenced_k8s_executor.provider_compat import live_attempt_clause

    query = select(TI.external_executor_id).where(TI.id == ti_id)
    live = live_attempt_clause()
    if live is not None:
        query = query.where(live)
    with db.bounded_connection() as conn:
        row = conn.execute(query).first()
    return _MISSING if row is None else row[0]


class FencedRunGateMiddleware:
    """Pure ASGI middleware (never reads or buffers bodies; streaming stays intact)."""

    def __init__(self, app: Any, *, validator: Any = None, row_token_reader: Any = None) -> None:
        self.app = app
        self._validator = validator
        self._read_row_token = row_token_reader or read_row_token

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") == "http" and scope.get("method") == "PATCH":
            match = _RUN_PATH.search(scope.get("path") or "")
            if match is not None:
                try:
                    rejection = await self._check(scope, match.group(1))
                except Exception:  # the gate must never block a legitimate start
                    log.warning("fenced run gate check failed; passing the request through", exc_info=True)
                    metrics.incr("run_gate.error")
                    rejection = None
                if rejection is not None:
                    await rejection(scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _get_validator(self, scope: dict) -> Any:
        if self._validator is not None:
            return self._validator
        from airflow.api_fastapi.auth.tokens import JWTValidator

        registry = _find_execution_registry(scope.get("app"))
        if registry is not None:
            import svcs

            async with svcs.Container(registry) as services:
                self._validator = await services.aget(JWTValidator)
        else:  # no lifespan-populated execution app: build it the way the execution API does
            from airflow.api_fastapi.execution_api.app import _jwt_validator

            self._validator = _jwt_validator()
        return self._validator

    async def _check(self, scope: dict, path_id: str) -> Any:
        bearer = _bearer(scope.get("headers") or [])
        if bearer is None:
            return None
        validator = await self._get_validator(scope)
        try:
            claims = await validator.avalidated_claims(bearer, {})
        except Exception:
            return None  # invalid token: the route answers its own 401/403
        claim = launch_claim_of(claims)
        if claim is None:
            return None
        try:
            ti_id = uuid.UUID(path_id)
        except ValueError:
            return None  # the route answers 422
        if str(claims.get("sub")) != str(ti_id):
            return None  # the route's ti:self check answers 403

        from starlette.concurrency import run_in_threadpool

        try:
            row = await run_in_threadpool(self._read_row_token, ti_id)
        except Exception:
            log.warning(
                "fenced run gate could not read task instance %s; passing /run through", ti_id, exc_info=True
            )
            metrics.incr("run_gate.db_error")
            return None
        if row is _MISSING:
            return None  # stock 404 not_found
        current = as_token(row)
        if current is None or current == claim:
            return None  # legacy row, or this very launch
        metrics.decision(
            "run_gate.rejected",
            path="run_gate",
            reason=REASON,
            enforced=True,
            ti_id=ti_id,
            launch=metrics.short(claim),
            current_launch=metrics.short(current),
        )
        from starlette.responses import JSONResponse

        return JSONResponse(
            status_code=409,
            content={
                "detail": {
                    "reason": REASON,
                    "message": (
                        "This launch of the task instance was superseded by a newer launch; "
                        "the executor no longer expects it to run."
                    ),
                    "ti_id": str(ti_id),
                    "launch": metrics.short(claim),
                    "current_launch": metrics.short(current),
                }
            },
        )


def root_middlewares(run_gate: bool) -> list[dict[str, Any]]:
    """The ``fastapi_root_middlewares`` entries for a given ``run_gate`` setting."""
    if not run_gate:
        return []
    return [{"name": "fenced_run_gate", "middleware": FencedRunGateMiddleware, "args": [], "kwargs": {}}]


class FencedRunGatePlugin(AirflowPlugin):
    """Installs :class:`FencedRunGateMiddleware` on the api-server when ``run_gate`` is true.

    Loaded from the package's ``airflow.plugins`` entry point; Airflow instantiates entry-point
    plugins, so the setting is read at instantiation (plugin load), not at import.

    An invalid ``[fenced_kubernetes_executor]`` value, an option it does not know or a variable or
    section named close to it (``config.load``) stops the api-server and the scheduler of a
    deployment whose ``[core] executor`` is the fenced executor, naming each and what was meant
    (``SystemExit``, the one exception the plugin manager does not catch: a plugin that merely failed
    to load would leave the api-server healthy and gate-less). Every other process that loads
    plugins logs one warning and goes on without the gate (``loaded.plugin_load``).
    """

    name = "fenced_run_gate"

    def __init__(self) -> None:
        from airflow.configuration import conf

        from fenced_k8s_executor import loaded

        fence = loaded.plugin_load(conf)
        self.fastapi_root_middlewares = root_middlewares(fence is not None and fence.run_gate)
