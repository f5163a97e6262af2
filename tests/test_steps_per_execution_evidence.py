"""Why TFM107's converted `compile` keeps Keras' one training step per call (its Fix safety).

`compile(steps_per_execution=N)` makes `fit` run N steps per tf.function call, which would make a
small model's `fit` several times faster. With the installed Keras 3 and TensorFlow, `fit` with
it fails at its first step under a MirroredStrategy of two replicas (two logical CPU devices
here), while one replica works. Where it works, it changes training in
two ways a rewrite would have to rule out: a `steps_per_epoch` that is not a multiple of N runs
a whole execution past it, and per-batch callbacks run once per execution.

verify steps a `fit` program in a loop of its own (as many steps per call as `fit` would run),
so the protocol TFM107 writes into the program runs `fit`'s own function for several steps once
before verify trains: the program that cannot train on several replicas is named, not verified.

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

from tfmigrate.rules._keras_fit_protocol import PROTOCOL

# A Keras 3 `fit` program compiled for 4 steps per call, with verify's entry point.
PROGRAM = (
    textwrap.dedent(
        """
        import keras
        import numpy as np
        import tensorflow as tf


        def main():
            strategy = tf.distribute.MirroredStrategy()
            with strategy.scope():
                inputs = keras.Input((8,))
                model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(inputs))
                model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                              loss="categorical_crossentropy", steps_per_execution=4)
            rng = np.random.RandomState(0)
            x = rng.randn(256, 8).astype("float32")
            y = np.eye(3, dtype="float32")[rng.randint(0, 3, 256)]
            model.fit(x, y, batch_size=64, shuffle=False, verbose=0)
        """
    )
    + PROTOCOL
    + '\n\nif __name__ == "__main__":\n    main()\n'
)

PROBE = textwrap.dedent(
    """
    import json
    import runpy
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

    def program(devices):
        # verify's entry point; the variables as they were before its probe of fit's function
        made = keras.Model.make_train_function
        before = {}
        def spy(model, force=False):
            before["values"] = [np.array(v) for v in [*model.variables, *model.optimizer.variables]]
            return made(model, force)
        keras.Model.make_train_function = spy
        try:
            entry = runpy.run_path(sys.argv[1], run_name="program")["tfmigrate_program"]
            got = entry(tf.distribute.MirroredStrategy(devices), [])
        except RuntimeError as error:
            return str(error)
        finally:
            keras.Model.make_train_function = made
        model = got["model"]
        after = [np.array(v) for v in [*model.variables, *model.optimizer.variables]]
        same = all(np.array_equal(a, b) for a, b in zip(before["values"], after, strict=True))
        return {"steps_per_call": got["steps_per_call"], "variables unchanged": same}

    print("RESULT " + json.dumps({
        "protocol, two replicas": program(two),
        "protocol, one replica": program(one),
        "two replicas, 4 per call": fit(two, 4),
        "one replica, 4 per call, steps_per_epoch 6": fit(one, 4, source=repeated, steps_per_epoch=6),
    }))
    """
)


@pytest.mark.slow
def test_fit_with_several_steps_per_call_fails_on_two_replicas(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PROGRAM, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(script)],
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
    # verify's entry point runs fit's own function once: on two replicas it names the failure
    assert result["protocol, two replicas"] == (
        "the program's fit cannot run steps_per_execution=4 steps per call on 2 replicas "
        "(InvalidArgumentError, above)"
    )
    # on one replica it trains a step and puts every variable back (optimizer slots included)
    assert result["protocol, one replica"] == {"steps_per_call": 4, "variables unchanged": True}
