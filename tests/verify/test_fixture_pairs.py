"""Each legacy tower fixture and its hand migration train the same on 2 logical CPU devices."""

from __future__ import annotations

import pytest
from verify_support import PAIRS, pair, verify

from tfmigrate.verify import compare as cmp


@pytest.mark.slow
@pytest.mark.parametrize("name", PAIRS)
def test_fixture_pair_is_equivalent(name, legacy_cache):
    roundtrip = name == "bn_rmsprop"  # the fixture whose checkpoint must carry batch-norm statistics
    outcome = verify(*pair(name), cache=legacy_cache, roundtrip=roundtrip)
    comp = outcome.comparison
    assert comp.verdict == cmp.EQUIVALENT, comp.reason
    assert comp.steps_compared == 8
    compared = [r for r in comp.rows if r.status == cmp.PASS]
    assert any(r.phase == cmp.FETCH_PHASE for r in compared), "no per-step scalar was compared"
    assert sum(r.category == "weight" for r in compared) >= 4
    assert all(r.status != cmp.FAIL for r in comp.rows)
    assert outcome.legacy.record.devices == 2 and outcome.migrated.record.devices == 2
    assert all(s.inputs for s in outcome.legacy.record.steps), "legacy inputs not fingerprinted"
    if roundtrip:
        assert [r.status for r in comp.rows if r.category == "roundtrip"] == [cmp.PASS]
