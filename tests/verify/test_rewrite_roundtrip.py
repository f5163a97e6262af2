"""verify accepts what `tfmigrate rewrite` writes: the project proves its own rewrites."""

from __future__ import annotations

import subprocess
import sys

import pytest
from verify_support import pair, verify

from tfmigrate.verify import compare as cmp

# The tower programs' rewrites are verified, with their specific rows, by
# tests/test_tower_conversion.py::test_converted_fixture_verifies; here: the Keras fit program.
REWRITTEN = ("keras2_fit",)


@pytest.mark.slow
@pytest.mark.parametrize("name", REWRITTEN)
def test_rewritten_fixture_is_equivalent(tmp_path, legacy_cache, name):
    legacy, _ = pair(name)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "tfmigrate", "rewrite", str(legacy.parent), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    migrated = out / "train.py"
    assert "def tfmigrate_program" in migrated.read_text()
    outcome = verify(legacy, migrated, cache=legacy_cache)
    comp = outcome.comparison
    assert comp.verdict == cmp.EQUIVALENT, comp.reason
    assert any(r.phase == cmp.FETCH_PHASE and r.status == cmp.PASS for r in comp.rows)
