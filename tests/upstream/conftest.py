"""tests/upstream: the cncf-kubernetes provider's own executor tests, run against the stock
KubernetesExecutor and against FencedKubernetesExecutor (see README.md here).

The helpers are plain modules beside this file (``upstream_fetch``, ``upstream_run``,
``upstream_plugin``); pytest's default import mode puts this folder on ``sys.path``.
"""

from __future__ import annotations

import pytest

_SUMMARY = pytest.StashKey[list]()


@pytest.fixture(scope="session")
def upstream_suite():
    """The installed provider's executor tests, fetched once into the virtualenv's cache."""
    from upstream_fetch import ensure_suite

    return ensure_suite()


@pytest.fixture
def upstream_report(request):
    """Lines for the end-of-run summary (shown even with -q and when the test passes)."""
    return request.config.stash.setdefault(_SUMMARY, [])


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = config.stash.get(_SUMMARY, [])
    if lines:
        terminalreporter.section("provider test suite: stock vs fenced")
        for line in lines:
            terminalreporter.write_line(line)
