"""The backstop sweep: find unfinished pods of superseded launches that no live scheduler
re-checks (a dead scheduler's, or those left by a restart; each scheduler re-checks its own
in-flight launches every loop).

Level-triggered and idempotent: list this deployment's executor pods that carry a launch token
(metadata only, page by page), read their tasks' rows in one query per page, delete the stale
ones. It runs in a background thread so the scheduler loop never waits on it, and a PostgreSQL
advisory lock makes schedulers take turns instead of all sweeping the same pods at once.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from fenced_k8s_executor import ledger, metrics, pods, verdicts
from fenced_k8s_executor.lineage import Provenance
from fenced_k8s_executor.metrics import short
from fenced_k8s_executor.names import DEPLOYMENT_LABEL, TOKEN_LABEL

log = logging.getLogger("fenced_k8s_executor")

#: Label selector of the pods a sweep may look at: this deployment's executor pods with a launch
#: token. Legacy pods (no token label) and other deployments' pods are never listed, so never touched.
SWEEP_LABEL_SELECTOR = f"kubernetes_executor=True,{TOKEN_LABEL}"


def label_selector(deployment: str) -> str:
    return f"{SWEEP_LABEL_SELECTOR},{DEPLOYMENT_LABEL}={deployment}"
#: Finished pods are the watcher's business (and cost nothing to keep).
SWEEP_FIELD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"
#: Advisory lock id shared by every scheduler of one metadata DB ("fencedk8" in ASCII).
ADVISORY_LOCK_KEY = 0x66656E6365646B38 & 0x7FFFFFFFFFFFFFFF


@dataclass
class SweepReport:
    pages: int = 0
    pods_seen: int = 0
    db_queries: int = 0
    stale: int = 0
    elsewhere: int = 0  # stale pods of this deployment another database launched (never deleted)
    deleted: int = 0
    skipped: str | None = None
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


class Sweeper:
    """One scheduler's sweep schedule and the sweep itself."""

    def __init__(
        self,
        *,
        kube_client: Any,
        namespaces: Iterable[str | None],
        interval: float,
        page_size: int,
        enforcing: bool,
        deployment: str,
        request_args: dict | None = None,
        read_rows: Callable = ledger.read_rows,
        lock: Callable[[], Any] | None = None,
        on_stale: Callable[[pods.PodRef], None] | None = None,
        witness: Any = None,
    ):
        self.kube_client = kube_client
        self.namespaces = list(namespaces)
        self.interval = interval
        self.page_size = page_size
        self.enforcing = enforcing
        self.deployment = deployment
        self.request_args = pods.request_args(request_args)  # with a timeout unless configured
        self._read_rows = read_rows
        self._lock = lock if lock is not None else advisory_lock
        self._on_stale = on_stale
        self.witness = witness  # witness.Witness: which database launched a pod (None: none judged ours)
        self._thread: threading.Thread | None = None
        self._counting = threading.Lock()
        self._next_due = time.monotonic() + interval
        self.last_report: SweepReport | None = None

    def maybe_start(self) -> bool:
        """Start a sweep in the background if one is due and none is running."""
        if self.interval <= 0 or time.monotonic() < self._next_due:
            return False
        if self._thread is not None and self._thread.is_alive():
            return False
        self._next_due = time.monotonic() + self.interval
        self._thread = threading.Thread(target=self.run_once, name="fenced-k8s-sweep", daemon=True)
        self._thread.start()
        return True

    def run_once(self) -> SweepReport:
        report = SweepReport()
        start = time.monotonic()
        try:
            with self._lock() as held:
                if not held:
                    report.skipped = "another scheduler is sweeping"
                else:
                    deletes = (pods.Deletes(self.kube_client, self.request_args, backlog=self.page_size)
                               if self.enforcing else None)
                    try:
                        for namespace in self.namespaces:
                            self._sweep_namespace(namespace, report, deletes)
                    finally:
                        if deletes is not None:
                            deletes.close()  # every delete answered before the lock is let go
        except Exception as error:  # never let a sweep error escape: next interval retries
            report.errors.append(repr(error))
            if pods.is_api_error(error):
                pods.report("sweep", error, then="next interval retries")
            else:
                log.warning("fenced_k8s_executor sweep failed: %r", error)
        report.seconds = time.monotonic() - start
        metrics.timing("sweep.duration", report.seconds)
        metrics.incr("sweep.pods_scanned", count=report.pods_seen)
        self.last_report = report
        return report

    def _sweep_namespace(self, namespace: str | None, report: SweepReport, deletes: pods.Deletes | None) -> None:
        for page in pods.list_pages(
            self.kube_client,
            namespace,
            label_selector=label_selector(self.deployment),
            field_selector=SWEEP_FIELD_SELECTOR,
            page_size=self.page_size,
            request_args=self.request_args,
            prefetch=True,
        ):
            report.pages += 1
            candidates = [ref for ref in page if ref.launch is not None and not ref.deleting]
            report.pods_seen += len(page)
            if not candidates:
                continue
            rows = self._read_rows(ref.launch.task for ref in candidates)
            report.db_queries += 1
            launched = self._launched(candidates)
            for ref, origin in zip(candidates, launched):
                row = rows.get(ref.launch.task)
                verdict = verdicts.should_delete(ref.launch, row, self.deployment, ref.name, origin)
                if verdict.act and verdicts.host_unresolved(row, ref.name):
                    verdict = self._judge_by_address(ref, row, origin)
                if not verdict.act:
                    if verdict.reason is verdicts.Reason.FOREIGN and origin is Provenance.ELSEWHERE:
                        report.elsewhere += 1
                        self.witness.elsewhere(f"{ref.namespace}/{ref.name}", ref.launch, "sweep")
                    continue
                report.stale += 1
                if self._on_stale is not None:
                    self._on_stale(ref)
                decided = functools.partial(self._decided, report, ref, verdict.reason.value, row)
                if deletes is None:
                    decided(False)
                else:
                    deletes.submit(ref, decided)

    def _launched(self, candidates: list[pods.PodRef]) -> list[Provenance]:
        """The witness's word on each candidate's launcher (one statement for jobs it has not read)."""
        if self.witness is None:
            return [Provenance.UNSETTLED] * len(candidates)
        return self.witness.provenances([ref.launch for ref in candidates])

    def _judge_by_address(self, ref: pods.PodRef, row: Any, origin: Provenance) -> verdicts.Verdict:
        """The row names a host that is not the pod's name (a ``hostname_callable`` reporting IPs):
        judge again with the pod's IPs. An API error keeps the pod (no evidence)."""
        try:
            found = pods.read_with_addresses(self.kube_client, ref.name, ref.namespace, self.request_args)
        except Exception as error:  # noqa: BLE001 - no evidence either way
            log.warning("fenced_k8s_executor sweep could not read pod %s/%s: %r", ref.namespace, ref.name, error)
            return verdicts.Verdict(False, False, verdicts.Reason.RUNS_THE_TASK)
        if found is None or found[0].uid != ref.uid:
            return verdicts.Verdict(False, False, verdicts.Reason.SUPERSEDED)  # gone, or another object now
        return verdicts.should_delete(ref.launch, row, self.deployment, (ref.name, *found[1]), origin)

    def _decided(self, report: SweepReport, ref: pods.PodRef, reason: str, row: Any, deleted: bool | None) -> None:
        """One stale pod's outcome (in a delete worker when enforcing): count it, metric and log."""
        if deleted:
            with self._counting:
                report.deleted += 1
        metrics.decision(
            "pod.deleted" if deleted else "pod.stale",
            path="sweep",
            reason=reason,
            enforced=self.enforcing,
            pod=f"{ref.namespace}/{ref.name}",
            ti=ref.launch.ti_id,
            launch=short(ref.launch.token),
            current=short(row.token if row else None),
        )


class _Held:
    def __init__(self, held: bool, close: Callable[[], None] | None = None):
        self.held = held
        self._close = close

    def __enter__(self) -> bool:
        return self.held

    def __exit__(self, *exc: object) -> None:
        if self._close:
            self._close()


def advisory_lock() -> _Held:
    """Hold a transaction-scoped PostgreSQL advisory lock for the sweep (taken or not, never waited
    for), in a bounded transaction on the fences' own pool (``db.bounded_connection``) that ends
    with the sweep; other DBs sweep unlocked."""
    from contextlib import ExitStack

    from sqlalchemy import text

    from fenced_k8s_executor import db

    with ExitStack() as stack:
        conn = stack.enter_context(db.bounded_connection())
        if conn.dialect.name != "postgresql":
            return _Held(True)
        held = bool(conn.execute(text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY}).scalar())
        return _Held(held, stack.pop_all().close)
