"""Every fencing decision becomes one metric (through Airflow's Stats) and one structured log line.

Log lines carry short token forms only (first 8 hex chars): tokens are launch capabilities
for the launch gate, so whole tokens and JWTs never reach logs.

Plain statsd drops tags, so each metric that has them is sent twice, as airflow-core sends its
own (``ti.finish`` and ``ti.finish.<dag_id>.<task_id>.<state>``, under ``[metrics]
legacy_names_on``): once by its name with its tags (dogstatsd, OpenTelemetry, the influxdb format),
and once with the tags' values in the name, in the order of ``NAME_ORDER`` (other keys after, by
key), e.g. ``fenced_k8s_executor.pod.deleted.reconcile.superseded.enforce``. Every call goes
through here, so a new metric follows the same rule; docs/operations.md lists every name.
"""

from __future__ import annotations

import functools
import logging
import re
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
    """The Stats this process set up: airflow-core's own (``airflow._shared...stats``, which the
    scheduler, the executor and the api-server initialize) where it was, else the Task SDK's (a
    worker). They are two modules on Airflow 3.3 and 3.4; on 3.4 importing the SDK's no longer sets it
    up from ``[metrics]``, and a scheduler's metrics sent through it went nowhere. Core keeps its
    factory on the module from 3.3 on and on ``Stats`` (its metaclass) on 3.2."""
    try:
        from airflow._shared.observability.metrics import stats as core
    except ImportError:  # an Airflow without core's shared copy: the SDK's is the one
        core = None
    if core is not None and (getattr(core, "_factory", None) or vars(core.Stats).get("factory")) is not None:
        return core.Stats
    from airflow.providers.common.compat.sdk import Stats

    return Stats


#: The dimensions an operator alerts on, in the order they follow a metric's name on plain statsd.
NAME_ORDER = ("path", "call", "reason", "status", "error", "mode")
_NOT_IN_NAMES = re.compile(r"[^A-Za-z0-9_-]")


def named(name: str, tags: dict[str, str] | None) -> str:
    """``name`` with its tags' values appended, as plain statsd receives it: ``NAME_ORDER`` first,
    any other key after (by key); a value's dots become ``__`` (as airflow-core's names do) and any
    other character a statsd name cannot hold ``_``."""
    if not tags:
        return name
    keys = [k for k in NAME_ORDER if k in tags] + sorted(k for k in tags if k not in NAME_ORDER)
    values = [_NOT_IN_NAMES.sub("_", str(tags[k]).replace(".", "__")) or "_" for k in keys]
    return ".".join([name, *values])


@functools.cache
def _names_on() -> bool:
    """airflow-core's switch for its own names with values in them (``[metrics] legacy_names_on``,
    on by default): ours follow it."""
    try:
        from airflow.configuration import conf

        return conf.getboolean("metrics", "legacy_names_on", fallback=True)
    except Exception:
        return True


def _emit(kind: str, name: str, value: Any, tags: dict[str, str] | None) -> None:
    full = f"{METRIC_PREFIX}.{name}"
    try:
        send = getattr(_stats(), kind)
        send(full, value, tags=tags or {})
        if tags and _names_on():
            send(named(full, tags), value, tags={})
    except Exception:  # metrics must never break a fence
        log.debug("metric %s not emitted", name, exc_info=True)


def incr(name: str, tags: dict[str, str] | None = None, count: int = 1) -> None:
    _emit("incr", name, count, tags)


def timing(name: str, seconds: float, tags: dict[str, str] | None = None) -> None:
    from datetime import timedelta

    _emit("timing", name, timedelta(seconds=seconds), tags)


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
