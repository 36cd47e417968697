"""The launch claim: the launch token minted into the workload JWT.

The stock scheduler signs every ``ExecuteTask`` workload with a "workload" scoped JWT
(``BaseWorkloadSchema.generate_token``: ``sub`` = TI id, ``scope`` = "workload", lifetime
``[scheduler] task_queued_timeout``). :func:`mint` re-mints that token with the executor's own
``JWTGenerator`` and one extra claim, :data:`~fenced_k8s_executor.names.LAUNCH_CLAIM`, holding
the launch token of this QUEUED transition. The execution API accepts extra claims unchanged
(``TIClaims`` is ``extra="allow"``), so an api-server without the run-gate plugin behaves
exactly as before; with the plugin, ``PATCH /execution/task-instances/{id}/run`` compares the
claim with the row's current token (see :mod:`fenced_k8s_executor.run_gate`).

Never log the token or the JWT: both are launch capabilities. Use ``metrics.short``.
"""

from __future__ import annotations

from typing import Any, Mapping

from fenced_k8s_executor.launch import as_token
from fenced_k8s_executor.names import LAUNCH_CLAIM

__all__ = ["LAUNCH_CLAIM", "launch_claim_of", "mint", "unverified_claims"]


def mint(generator: Any, *, ti_id: str, token: str, valid_for: float) -> str:
    """Sign a workload JWT for ``ti_id`` that also carries ``token`` as the launch claim.

    Same claims as the stock ``BaseWorkloadSchema.generate_token`` (``sub``, ``scope``
    "workload", and the generator's ``jti``/``iss``/``aud``/``nbf``/``iat``/``exp``), same
    lifetime when called with ``valid_for=conf.getfloat("scheduler", "task_queued_timeout")``,
    plus ``{LAUNCH_CLAIM: <canonical token>}``.

    Like the stock helper, returns "" when there is no generator (executors built without one
    send no token at all). Raises ValueError when ``token`` is not a launch token (a UUID):
    legacy launches get the stock token, never a claim.
    """
    if not generator:
        return ""
    canonical = as_token(token)
    if canonical is None:
        raise ValueError("launch_claim.mint needs a launch token (a UUID); got a legacy value")
    return generator.generate(
        extras={"sub": str(ti_id), "scope": "workload", LAUNCH_CLAIM: canonical},
        valid_for=valid_for,
    )


def launch_claim_of(claims: Mapping[str, Any] | None) -> str | None:
    """The canonical launch token carried by JWT ``claims``, or None (no claim / not a token)."""
    if not claims:
        return None
    return as_token(claims.get(LAUNCH_CLAIM))


def unverified_claims(jwt_token: str | None) -> dict[str, Any]:
    """Read a JWT's claims WITHOUT verifying it ({} when it is not a JWT).

    For the worker side only: the worker holds the token it was given and just needs to know
    which launch it is; the api-server is where tokens are verified.
    """
    if not jwt_token:
        return {}
    import jwt

    try:
        claims = jwt.decode(jwt_token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return {}
    return claims if isinstance(claims, dict) else {}
