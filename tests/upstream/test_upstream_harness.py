"""The comparison and the allowlist of the upstream-suite runner (no subprocess, no download)."""

from __future__ import annotations

import pytest

from upstream_fetch import PINNED_SHA256, installed_provider_version
from upstream_run import ALLOWLIST, Run, compare, read_allowlist, read_junit

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.unit.k8s.test_x.TestA" name="test_ok" time="0.1"/>
<testcase classname="tests.unit.k8s.test_x.TestA" name="test_bad[503 x]" time="0.1"><failure message="no"/></testcase>
<testcase classname="tests.unit.k8s.test_x" name="test_skip" time="0"><skipped message="3.4"/></testcase>
<testcase classname="tests.unit.k8s.test_x" name="test_teardown" time="0.1"/>
<testcase classname="tests.unit.k8s.test_x" name="test_teardown" time="0.1"><error message="teardown"/></testcase>
</testsuite></testsuites>"""


def test_junit_outcomes_by_nodeid(tmp_path):
    (tmp_path / "tests/unit/k8s").mkdir(parents=True)
    (tmp_path / "tests/unit/k8s/test_x.py").touch()
    (tmp_path / "junit.xml").write_text(JUNIT)
    assert read_junit(tmp_path / "junit.xml", tmp_path) == {
        "tests/unit/k8s/test_x.py::TestA::test_ok": "passed",
        "tests/unit/k8s/test_x.py::TestA::test_bad[503 x]": "failed",
        "tests/unit/k8s/test_x.py::test_skip": "skipped",
        "tests/unit/k8s/test_x.py::test_teardown": "failed",
    }


def test_compare_counts_anything_but_a_fenced_pass_as_a_regression():
    stock = Run("stock", 0, 1, {"a": "passed", "b": "passed", "c": "passed", "d": "passed", "e": "failed", "f": "skipped"})
    fenced = Run("fenced", 1, 1, {"a": "passed", "b": "failed", "c": "skipped", "e": "failed", "f": "passed"})
    assert compare(stock, fenced) == ["b", "c", "d"]


def test_allowlist_entries_need_a_reason(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("# comment\n\ntests/x.py::test_a[p 1]  # reason one\n")
    assert read_allowlist(good) == {"tests/x.py::test_a[p 1]": "reason one"}
    bad = tmp_path / "bad.txt"
    bad.write_text("tests/x.py::test_b\n")
    with pytest.raises(ValueError, match="has no reason"):
        read_allowlist(bad)


def test_shipped_allowlist_is_empty():
    assert read_allowlist(ALLOWLIST) == {}


def test_installed_provider_sdist_is_pinned():
    assert installed_provider_version() in PINNED_SHA256
