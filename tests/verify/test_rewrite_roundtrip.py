"""verify accepts what `tfmigrate rewrite` writes: the project proves its own rewrites."""

from __future__ import annotations

import subprocess
import sys

import pytest
from verify_support import PAIRS, pair, verify

from tfmigrate.verify import compare as cmp

# Tower programs that exist only in their legacy form (no hand-migrated pair to compare with).
REWRITE_ONLY = ("global_updates", "slim_clones", "queue_saver")


@pytest.mark.slow
@pytest.mark.parametrize("name", PAIRS + REWRITE_ONLY)
def test_rewritten_fixture_is_equivalent(tmp_path, legacy_cache, name):
    legacy, _ = pair(name)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "tfmigrate", "rewrite", str(legacy.parent), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    migrated = out / "train.py"
    if done.returncode >= 2 or not migrated.exists() or "def tfmigrate_program" not in migrated.read_text():
        pytest.skip(f"the rewriter does not convert {name} to a verify-protocol program (yet)")
    outcome = verify(legacy, migrated, cache=legacy_cache)
    comp = outcome.comparison
    assert comp.verdict == cmp.EQUIVALENT, comp.reason
    assert any(r.phase == cmp.FETCH_PHASE and r.status == cmp.PASS for r in comp.rows)
