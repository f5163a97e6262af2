"""Every converted fixture's output matches its golden file exactly (see tests/goldens.py)."""

from __future__ import annotations

import difflib

import pytest
from conftest import rewritten
from goldens import FIXTURES, GOLDEN_FIXTURES, GOLDENS, changed_files


@pytest.mark.parametrize("fixture", sorted(GOLDEN_FIXTURES))
def test_rewrite_output_matches_its_golden_files(fixture):
    out, result = rewritten(FIXTURES / fixture, *GOLDEN_FIXTURES[fixture])
    assert result.returncode in (0, 1), result
    golden = GOLDENS / fixture
    expected = sorted(p.relative_to(golden).as_posix() for p in golden.rglob("*") if p.is_file())
    assert changed_files(FIXTURES / fixture, out) == expected, "run `make goldens` and review"
    for rel in expected:
        want, got = (golden / rel).read_text(), (out / rel).read_text()
        if want != got:
            diff = "".join(
                difflib.unified_diff(
                    want.splitlines(True), got.splitlines(True), f"golden/{rel}", f"rewrite/{rel}"
                )
            )
            pytest.fail(f"{fixture}/{rel} differs from its golden file (`make goldens`):\n{diff}")
