"""CI's fast subset of the mutation run (``mutate.py``): every safety mutant still applies to the
tree, and the fix mutants marked ``fast`` are killed by their named tests, each run in a scratch
copy of the tree with the mutant applied (the fenced executor's cases, on the emulator)."""

from __future__ import annotations

import pytest

import mutate
from mutants import MUTANTS

FAST = [mutant for mutant in MUTANTS if mutant.fast]


def test_every_mutant_still_applies():
    """An edit of the code under a mutant shows up here, naming the mutant to write again."""
    assert mutate.check() == []


def test_the_fast_subset_is_small_and_takes_back_fixes():
    assert 2 <= len(FAST) <= 5 and all(mutant.fix and mutant.promise for mutant in FAST)


@pytest.mark.integration
@pytest.mark.parametrize("mutant", FAST, ids=[mutant.name for mutant in FAST])
def test_named_tests_kill_the_mutant(mutant, tmp_path):
    result = mutate.run_named(mutant, mutant.named, tmp_path / "pytest.log")
    log = (tmp_path / "pytest.log").read_text()[-3000:] if (tmp_path / "pytest.log").exists() else ""
    assert result["outcome"] == "killed", f"{mutant.name}: {result}\n{log}"
