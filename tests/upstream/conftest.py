"""tests/upstream: the cncf-kubernetes provider's own executor tests, run against the stock
KubernetesExecutor and against FencedKubernetesExecutor (see README.md here).

The helpers are plain modules beside this file (``upstream_fetch``, ``upstream_run``,
``upstream_plugin``); pytest's default import mode puts this folder on ``sys.path``.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def upstream_suite():
    """The installed provider's executor tests, fetched once into the virtualenv's cache."""
    from upstream_fetch import ensure_suite

    return ensure_suite()


@pytest.fixture
def upstream_report(request):
    """Lines for the end-of-run summary (shown even with -q and when the test passes; printed by
    the controller when the tests run in pytest-xdist workers: ../parallel.py)."""
    from parallel import summary_lines

    return summary_lines(request.config, "provider test suite: stock vs fenced")
