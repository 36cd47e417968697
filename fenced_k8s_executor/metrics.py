"""Every fencing decision becomes one metric (through Airflow's Stats) and one structured log line.

Log lines carry short token forms only (first 8 hex chars): tokens are launch capabilities
for the launch gate, so whole tokens and JWTs never reach logs.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Any, Iterator

from fenced_k8s_executor.names import METRIC_PREFIX

log = logging.getLogger("fenced_k8s_executor")


def short(token: str | None) -> str:
    """A log-safe short form of a launch token."""
    if not token:
        return "-"
    return token.replace("-", "")[:8]


def _stats():
    from airflow.providers.common.compat.sdk import Stats

    return Stats


def incr(name: str, tags: dict[str, str] | None = None, count: int = 1) -> None:
    try:
        _stats().incr(f"{METRIC_PREFIX}.{name}", count, tags=tags or {})
    except Exception:  # metrics must never break a fence
        log.debug("metric %s not emitted", name, exc_info=True)


def timing(name: str, seconds: float, tags: dict[str, str] | None = None) -> None:
    from datetime import timedelta

    try:
        _stats().timing(f"{METRIC_PREFIX}.{name}", timedelta(seconds=seconds), tags=tags or {})
    except Exception:
        log.debug("metric %s not emitted", name, exc_info=True)


@contextmanager
def timed(name: str, **tags: str) -> Iterator[None]:
    start = time.monotonic()
    try:
        yield
    finally:
        timing(name, time.monotonic() - start, tags)


def decision(metric: str, *, path: str, reason: str, enforced: bool, **fields: Any) -> None:
    """Emit the metric and the one structured log line for a fencing decision.

    ``fields`` must already be log-safe (use :func:`short` for tokens).
    """
    tags = {"path": path, "reason": reason, "mode": "enforce" if enforced else "audit"}
    incr(metric, tags)
    details = " ".join(f"{k}={v}" for k, v in fields.items())
    log.info(
        "fenced_k8s_executor decision=%s path=%s reason=%s enforced=%s %s",
        metric,
        path,
        reason,
        enforced,
        details,
    )
