"""Real migration bugs planted in correct migrated programs: verify must fail, naming the first
diverging step (the fixtures are built so that every bug shows inside the compared steps)."""

from __future__ import annotations

import pytest
from verify_support import pair, plant, verify

from tfmigrate.verify import compare as cmp

MUTATIONS = [
    # (id, fixture, correct code, planted bug, first diverging step, quantity contains)
    ("loss-not-scaled-by-replicas", "cifar_average",
     "scaled_loss = total_loss / strategy.num_replicas_in_sync", "scaled_loss = total_loss", 1, ""),
    ("regularization-loss-dropped", "cifar_average",
     "total_loss = cross_entropy + tf.add_n(model.losses)", "total_loss = cross_entropy", 1, "total_loss"),
    ("bn-momentum-as-1-minus-decay", "bn_rmsprop",
     "TF1BatchNorm(momentum=0.9,", "TF1BatchNorm(momentum=0.1,", 1, "moving_"),
    ("rmsprop-slot-zeros", "bn_rmsprop",
     'add_variable_from_reference(v, "rms", initializer="ones")',
     'add_variable_from_reference(v, "rms", initializer="zeros")', 1, ""),
    ("lr-schedule-off-by-one", "sum_ema_decay",
     "keras.optimizers.SGD(learning_rate=schedule)",
     "keras.optimizers.SGD(learning_rate=lambda: schedule(optimizer.iterations + 1))", 4, "learning_rate"),
    ("ema-decay-without-num-updates", "sum_ema_decay",
     "decay = tf.minimum(MOVING_AVERAGE_DECAY, (1.0 + n) / (10.0 + n))",
     "decay = tf.constant(MOVING_AVERAGE_DECAY)", 1, "ExponentialMovingAverage"),
    # Keras 2 multi_gpu_model + fit -> Keras 3 fit under MirroredStrategy
    ("fit-momentum-dropped", "keras2_fit",  # the first SGD step is the same with or without momentum
     "keras.optimizers.SGD(learning_rate=flags.lr, momentum=0.9)",
     "keras.optimizers.SGD(learning_rate=flags.lr)", 2, ""),
    # the summed loss matches no legacy loss as is or scaled for the replicas, so it is not
    # compared; the weights (the ground truth) diverge at step 1, the update 64x too large
    ("fit-loss-summed-not-averaged", "keras2_fit",
     'loss="categorical_crossentropy"', 'loss=keras.losses.CategoricalCrossentropy(reduction="sum")', 1,
     "hidden1/kernel"),
]
# What the report must also say for a bug whose first divergence is not where it was planted
NOTES = {"fit-loss-summed-not-averaged": "matches no per-tower legacy fetch at step 1"}
# The smallest bugs (weights 2e-5 apart after step 1, a learning rate wrong from step 4) also run
# with the noise floor (the others skip it to save two legacy runs each): the legacy program
# under other kernel settings drifts from itself by nothing or ~1e-7 on these fixtures, so a real
# bug must stay DIVERGED.
WITH_NOISE_FLOOR = {"regularization-loss-dropped", "lr-schedule-off-by-one"}


@pytest.mark.slow
@pytest.mark.parametrize(("name", "fixture", "old", "new", "step", "quantity"), MUTATIONS,
                         ids=[m[0] for m in MUTATIONS])
def test_planted_bug_diverges_at_the_first_affected_step(tmp_path, legacy_cache, name, fixture, old, new, step,
                                                       quantity):
    legacy, _ = pair(fixture)
    noise_floor = name in WITH_NOISE_FLOOR
    outcome = verify(legacy, plant(tmp_path, fixture, old, new), cache=legacy_cache, noise_floor=noise_floor)
    comp = outcome.comparison
    assert comp.verdict == cmp.DIVERGED, comp.reason
    assert comp.exit_code == 1
    assert comp.first_divergence["step"] == step, comp.reason
    assert quantity in comp.first_divergence["quantity"], comp.reason
    assert f"step {step}" in comp.reason
    if name in NOTES:
        assert any(NOTES[name] in note for note in comp.notes), comp.notes
    if noise_floor:
        assert outcome.noise is not None and any("noise floor:" in n for n in comp.notes), comp.notes
        assert not any(r.status == cmp.NOISE for r in comp.rows if r.quantity == comp.first_divergence["quantity"])
