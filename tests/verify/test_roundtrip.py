"""--roundtrip: the trained migrated model, saved the program's way and reloaded in a fresh process
without a strategy, predicts what the in-strategy model predicted (the passing case is part of the
bn_rmsprop fixture-pair test)."""

from __future__ import annotations

import pytest
from verify_support import pair, plant, verify

from tfmigrate.verify import compare as cmp


@pytest.mark.slow
def test_roundtrip_fails_when_batch_norm_statistics_are_not_saved(tmp_path, legacy_cache):
    migrated = plant(tmp_path, "bn_rmsprop", "checkpoint = tf.train.Checkpoint(model=model)",
                     "checkpoint = tf.train.Checkpoint(weights=model.trainable_weights)")
    outcome = verify(pair("bn_rmsprop")[0], migrated, cache=legacy_cache, roundtrip=True)
    assert outcome.comparison.verdict == cmp.DIVERGED
    assert outcome.comparison.exit_code == 1
    assert "round trip failed" in outcome.comparison.reason
