"""Why TFM107's converted `compile` keeps Keras' one training step per call (its Fix safety).

`compile(steps_per_execution=N)` makes `fit` run N steps per tf.function call, which would make a
small model's `fit` several times faster. With the installed Keras 3 and TensorFlow, `fit` with
it fails at its first step under a MirroredStrategy of two replicas (two logical CPU devices
here), while one replica works. Where it works, it changes training in
two ways a rewrite would have to rule out: a `steps_per_epoch` that is not a multiple of N runs
a whole execution past it, and per-batch callbacks run once per execution.

When the first assertion fails, Keras has fixed `fit`: TFM107 may then add `steps_per_execution`
where the program's `fit` calls allow it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """
    import json
    import sys

    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras

    rng = np.random.RandomState(0)
    x = rng.randn(512, 8).astype("float32")
    y = np.eye(3, dtype="float32")[rng.randint(0, 3, 512)]
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)  # 8 batches

    class BatchEnds(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.count = 0
        def on_train_batch_end(self, batch, logs=None):
            self.count += 1

    def model(devices, steps_per_execution):
        with tf.distribute.MirroredStrategy(devices).scope():
            inputs = keras.Input((8,))
            m = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(inputs))
            m.compile(optimizer="sgd", loss="categorical_crossentropy",
                      steps_per_execution=steps_per_execution)
        return m

    def fit(devices, steps_per_execution, **kwargs):
        m, ends = model(devices, steps_per_execution), BatchEnds()
        try:
            m.fit(kwargs.pop("source", data), verbose=0, callbacks=[ends], **kwargs)
        except Exception as error:
            return type(error).__name__
        return {"steps": int(m.optimizer.iterations.numpy()), "batch_ends": ends.count}

    two, one = ["/cpu:0", "/cpu:1"], ["/cpu:0"]
    repeated = data.repeat()

    print("RESULT " + json.dumps({
        "two replicas, 4 per call": fit(two, 4),
        "one replica, 4 per call, steps_per_epoch 6": fit(one, 4, source=repeated, steps_per_epoch=6),
    }))
    """
)


@pytest.mark.slow
def test_fit_with_several_steps_per_call_fails_on_two_replicas():
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    assert result["two replicas, 4 per call"] == "InvalidArgumentError"
    # one replica runs it, with a callback's batch hooks once per call, and whole executions:
    # steps_per_epoch=6 trains 8 steps an epoch
    assert result["one replica, 4 per call, steps_per_epoch 6"] == {"steps": 8, "batch_ends": 2}
