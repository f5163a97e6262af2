"""verify says 'could not run' (exit 2) for crashes and different inputs, and reports differences
the migration announced as expected, with their size."""

from __future__ import annotations

import json
import shutil

import pytest
from verify_support import FIXTURES, pair, plant, verify

from tfmigrate.verify import compare as cmp
from tfmigrate.verify.manifest import load_manifest
from tfmigrate.verify.verifier import side_data

CRASHING_LEGACY = '''\
import numpy as np
import tensorflow as tf


def build_loss(inputs):
  weights = tf.get_variable('w', [3, 2])
  return tf.reduce_sum(tf.matmul(inputs, tf.transpose(weights)))  # [4,3] x [2,3]: a user bug


x = tf.placeholder(tf.float32, [4, 3])
loss = build_loss(x)
'''


@pytest.mark.slow
def test_legacy_crash_is_shown_as_the_users_traceback(tmp_path):
    legacy = tmp_path / "crashing.py"
    legacy.write_text(CRASHING_LEGACY)
    mapping = tmp_path / "mapping.json"
    mapping.write_text(json.dumps({"w": "w"}))
    outcome = verify(legacy, pair("cifar_average")[1], mapping=mapping)
    assert outcome.comparison.verdict == cmp.COULD_NOT_RUN
    assert outcome.comparison.exit_code == 2
    assert "legacy script crashed" in outcome.comparison.reason
    tb = outcome.crash.record.traceback
    assert "crashing.py" in tb and "build_loss" in tb and "line 7" in tb
    assert "legacy_boot" not in tb and "runpy" not in tb


@pytest.mark.slow
def test_migrated_crash_is_shown_as_the_users_traceback(tmp_path, legacy_cache):
    migrated = plant(tmp_path, "cifar_average", "logits = model(images, training=True)",
                     "logits = model(tf.reshape(images, [-1, 3]), training=True)")
    outcome = verify(pair("cifar_average")[0], migrated, cache=legacy_cache)
    assert outcome.comparison.verdict == cmp.COULD_NOT_RUN
    assert "migrated script crashed" in outcome.comparison.reason
    assert "train.py" in outcome.crash.record.traceback
    assert "migrated_boot" not in outcome.crash.record.traceback


@pytest.mark.slow
def test_a_step_whose_trace_fails_after_making_a_variable_crashes_as_it_does_alone(
    tmp_path, legacy_cache
):
    # verify traces a step before its first call; after a failed trace that made a variable,
    # TensorFlow's next call of the function returns None: that call must not happen, the
    # user sees the error their program raises when run alone
    migrated = plant(tmp_path, "cifar_average", "        return strategy.run(step_fn, args=batch)\n",
                     "        results = strategy.run(step_fn, args=batch)\n"
                     "        tf.Variable(0.0).assign_add(tf.zeros([2]))  # a user bug\n"
                     "        return results\n")
    outcome = verify(pair("cifar_average")[0], migrated, cache=legacy_cache)
    assert outcome.comparison.verdict == cmp.COULD_NOT_RUN
    assert "migrated script crashed" in outcome.comparison.reason
    assert "NoneType" not in outcome.comparison.reason
    assert "a user bug" in outcome.crash.record.traceback


@pytest.mark.slow
def test_different_data_is_reported_as_different_inputs_not_divergence(tmp_path, legacy_cache):
    migrated = plant(tmp_path, "cifar_average", "images, labels = make_dataset()",
                     "images, labels = make_dataset(seed=99)")
    outcome = verify(pair("cifar_average")[0], migrated, cache=legacy_cache)
    assert outcome.comparison.verdict == cmp.COULD_NOT_RUN
    assert "different inputs at step 1" in outcome.comparison.reason


@pytest.mark.slow
def test_last_tower_batch_norm_statistics(tmp_path, legacy_cache):
    """Legacy keeps the LAST tower's UPDATE_OPS; Keras keeps replica 0's statistics. Announced in
    the manifest → expected, with the measured size; not announced → a divergence at step 1."""
    migrated_dir = tmp_path / "bn_rmsprop"
    shutil.copytree(FIXTURES / "migrated" / "bn_rmsprop", migrated_dir)
    manifest = migrated_dir / "tfmigrate.json"
    data = json.loads(manifest.read_text())
    data["files"]["train.py"]["announced"] = [{
        "match": ["*/moving_mean", "*/moving_variance"], "code": "TFM3xx",
        "reason": "legacy kept the last tower's batch-norm statistics, Keras keeps replica 0's"}]
    manifest.write_text(json.dumps(data))
    outcome = verify(pair("bn_rmsprop")[0], migrated_dir / "train.py", args=("--bn_updates", "last"),
                     cache=legacy_cache, report_dir=tmp_path / "report")
    comp = outcome.comparison
    assert comp.verdict == cmp.EQUIVALENT, comp.reason
    stats = [r for r in comp.rows if r.category == "bn_stat"]
    assert len(stats) == 2
    assert all(r.status == cmp.EXPECTED and r.max_abs > 1e-3 and "measured" in r.note for r in stats)

    # the same two runs judged without the announcement
    silent = load_manifest(manifest, migrated_dir / "train.py")
    silent.announced = []
    again = cmp.compare(side_data(outcome.legacy), side_data(outcome.migrated), silent, cmp.Tolerances())
    assert again.verdict == cmp.DIVERGED
    assert again.first_divergence["step"] == 1 and "moving_" in again.first_divergence["quantity"]


@pytest.mark.slow
def test_a_mapping_that_does_not_fit_is_reported_precisely(tmp_path, legacy_cache):
    migrated_dir = tmp_path / "cifar_average"
    shutil.copytree(FIXTURES / "migrated" / "cifar_average", migrated_dir)
    manifest = migrated_dir / "tfmigrate.json"
    data = json.loads(manifest.read_text())
    data["files"]["train.py"]["variables"]["conv1/weights"] = "cifar/conv1/kernel_typo"
    manifest.write_text(json.dumps(data))
    outcome = verify(pair("cifar_average")[0], migrated_dir / "train.py", cache=legacy_cache)
    assert outcome.comparison.verdict == cmp.COULD_NOT_RUN and outcome.comparison.exit_code == 2
    reason = outcome.comparison.reason
    # which file to edit, which entry is wrong, and what it probably meant
    assert f"the variable mapping of {manifest} [train.py] does not fit" in reason, reason
    assert (
        "migrated 'cifar/conv1/kernel_typo' (mapped from 'conv1/weights') is not a variable of the "
        "migrated program (unmapped migrated variables of shape [3, 3, 3, 16]: cifar/conv1/kernel"
    ) in reason, reason
