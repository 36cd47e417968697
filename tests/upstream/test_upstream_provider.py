"""Drop-in proof: the cncf-kubernetes provider's own executor tests pass against
FencedKubernetesExecutor wherever they pass against the stock KubernetesExecutor.

The suite comes from the installed provider's sdist (``upstream_fetch``); both runs happen in
subprocesses in this one pytest run (``upstream_run``); the fenced run uses the fenced
executor's defaults, sweep thread included. A test that passes on stock and not on fenced fails
this test unless ``allowlist.txt`` lists it with a reason.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from upstream_run import ALLOWLIST, compare, read_allowlist, run_suites

#: The suite must really have run: a broken harness must not pass as "no regressions".
MIN_STOCK_PASSED = 100


def test_provider_suite_passes_on_fenced_wherever_it_passes_on_stock(upstream_suite, upstream_report):
    # Own folder, not tmp_path: other pytest sessions of the same user prune old basetemps.
    workdir = Path(tempfile.mkdtemp(prefix="fenced-upstream-"))
    runs = run_suites(upstream_suite, workdir)
    upstream_report.append(f"logs: {workdir}")
    stock, fenced = runs["stock"], runs["fenced"]
    pin = "pinned sha256" if upstream_suite.pinned else "UNPINNED sha256 (checked by pip against the index)"
    upstream_report.append(f"apache-airflow-providers-cncf-kubernetes {upstream_suite.provider_version} "
                           f"sdist, {pin} {upstream_suite.sha256[:16]}")
    upstream_report.extend(run.summary() for run in (stock, fenced))
    upstream_report.append(f"stock run evidence: {stock.evidence}")
    upstream_report.append(f"fenced run evidence: {fenced.evidence}")
    warnings = fenced.log.parent / "fenced-warnings.txt"
    if warnings.is_file():  # logged by passing tests too; a drop-in hint, not a verdict
        upstream_report.extend(f"  fenced warning x{line.strip()}" for line in warnings.read_text().splitlines()[:8])

    for run in (stock, fenced):
        assert run.returncode in (0, 1) and run.outcomes, (
            f"the {run.executor} run did not complete (exit {run.returncode}); see {run.log}:\n"
            + run.log.read_text()[-3000:])
    assert stock.count("passed") >= MIN_STOCK_PASSED, f"stock run too small to prove anything: {stock.summary()}"
    # Fenced on its defaults: enforce mode, sweeper included, in every start.
    assert fenced.evidence.get("started", 0) > 0, "no FencedKubernetesExecutor was started in the fenced run"
    assert fenced.evidence["started"] == fenced.evidence.get("started mode=enforce") == fenced.evidence.get(
        "started with a sweeper"), fenced.evidence

    allow = read_allowlist()
    regressions = compare(stock, fenced)
    upstream_report.extend(f"{'allowlisted' if t in allow else 'REGRESSION'}: {t}" for t in regressions)
    stale = sorted(set(allow) - set(regressions))
    upstream_report.extend(f"stale allowlist entry (passes on fenced now, remove it): {t}" for t in stale)
    unexpected = [t for t in regressions if t not in allow]
    assert not unexpected, (
        f"pass on stock, fail on fenced ({len(unexpected)}): {unexpected}\n"
        f"fenced log: {fenced.log}\n" + fenced.log.read_text()[-6000:])
    assert not stale, f"{ALLOWLIST.name} lists tests that pass on fenced now: {stale}"
    # A process the fenced executor starts outside the provider's (patched) classes outlives the
    # test that started it: the run would hang at exit without upstream_plugin ending it.
    leftover = fenced.evidence.get("leftover processes", 0)
    assert leftover <= stock.evidence.get("leftover processes", 0), (
        f"the fenced run left {leftover} child processes running at its end: "
        f"{ {k: v for k, v in fenced.evidence.items() if k.startswith('leftover')} }")
    shutil.rmtree(workdir, ignore_errors=True)
