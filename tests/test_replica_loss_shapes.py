"""Evidence for TFM202's fix on a loss whose shape the rule cannot see: a per-pixel loss averaged
per replica inside `strategy.run`. `tf.nn.compute_average_loss` sums every element, so on such a
loss it would multiply the step by the pixels per example; the fix the rule writes (the replica's
mean divided by the replica count) takes the one-device step. The numbers quoted in the rule docs
come from this file.

TensorFlow runs in a subprocess (the logical devices must exist before TF starts); the program it
trains is the source below, as written and as the rule fixes it.
"""

from __future__ import annotations

import textwrap

import pytest
from conftest import run_harness

from tfmigrate.engine import Settings, process_source
from tfmigrate.rules.unscaled_replica_loss import UnscaledReplicaLoss

# A TF2 segmentation step: class-weighted per-pixel cross-entropy, averaged per replica.
PROGRAM = textwrap.dedent(
    """
    import numpy as np
    import tensorflow as tf
    import keras

    GLOBAL_BATCH = 8
    rng = np.random.RandomState(0)
    images = rng.rand(GLOBAL_BATCH, 16, 16, 1).astype('float32')
    labels = rng.randint(0, 3, (GLOBAL_BATCH, 16, 16)).astype('int32')
    ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


    def weighted_loss(labels, logits):
        per_pixel = ce(labels, logits) * tf.gather(tf.constant([0.2, 1.0, 3.0]), labels)
        return tf.reduce_mean(per_pixel)


    def train_one_step(strategy):
        with strategy.scope():
            keras.utils.set_random_seed(0)
            net = keras.Sequential([keras.Input((16, 16, 1)), keras.layers.Conv2D(3, 3, padding='same')])
            opt = keras.optimizers.SGD(0.5)

        def step_fn(x, y):
            with tf.GradientTape() as tape:
                loss = weighted_loss(y, net(x, training=True))
            opt.apply_gradients(zip(tape.gradient(loss, net.trainable_variables),
                                    net.trainable_variables))

        batches = tf.data.Dataset.from_tensor_slices((images, labels)).batch(GLOBAL_BATCH)
        batch = next(iter(strategy.experimental_distribute_dataset(batches)))
        strategy.run(tf.function(step_fn), args=batch)
        return [w.numpy() for w in net.weights]
    """
)

HARNESS = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices('CPU')[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras

    sources = json.loads(sys.stdin.read())
    def trained(source, devices):
        scope = {}
        exec(compile(source, 'program.py', 'exec'), scope)
        strategy = (tf.distribute.MirroredStrategy(devices) if len(devices) > 1
                    else tf.distribute.OneDeviceStrategy(devices[0]))
        return scope['train_one_step'](strategy)

    keras.utils.set_random_seed(0)
    start = keras.Sequential([keras.Input((16, 16, 1)), keras.layers.Conv2D(3, 3, padding='same')])
    start = start.get_weights()
    def moved(weights):
        return float(max(np.abs(a - b).max() for a, b in zip(weights, start)))
    def apart(a, b):
        return float(max(np.abs(x - y).max() for x, y in zip(a, b)))

    two = ['/cpu:0', '/cpu:1']
    one = trained(sources['original'], ['/cpu:0'])
    results = {'one_device_moved': moved(one)}
    for name in ('original', 'fixed', 'sum_of_pixels'):
        weights = trained(sources[name], two)
        results[name] = {'moved': moved(weights), 'apart_from_one_device': apart(weights, one)}
    print('RESULT ' + json.dumps(results))
    """
)


def _fixed(source: str) -> str:
    settings = Settings(rules=(UnscaledReplicaLoss,), fix=True, unsafe_fixes=True)
    result = process_source(source, "train.py", settings)
    assert [f.code for f in result.findings] == ["TFM202"]
    assert result.new_code is not None
    return result.new_code


def test_the_fix_of_a_loss_of_unknown_shape_divides_by_the_replicas():
    fixed = _fixed(PROGRAM)
    assert (
        "return tf.reduce_mean(per_pixel) / tf.distribute.get_replica_context()"
        ".num_replicas_in_sync" in fixed
    )
    assert "compute_average_loss" not in fixed


@pytest.mark.slow
def test_per_pixel_loss_fixed_takes_the_one_device_step():
    sources = {
        "original": PROGRAM,
        "fixed": _fixed(PROGRAM),
        # what the fix used to write: compute_average_loss on the per-pixel losses
        "sum_of_pixels": PROGRAM.replace(
            "return tf.reduce_mean(per_pixel)",
            "return tf.nn.compute_average_loss(per_pixel, global_batch_size=GLOBAL_BATCH)",
        ),
    }
    m = run_harness(HARNESS, sources)
    one = m["one_device_moved"]
    assert m["original"]["moved"] / one == pytest.approx(2.0, rel=1e-3)
    assert m["sum_of_pixels"]["moved"] / one == pytest.approx(256.0, rel=1e-3)
    assert m["fixed"]["apart_from_one_device"] < 1e-6
