"""Evidence for the TF2 distribution rules (TFM201, TFM202, TFM204): what the pitfall does on
2 logical CPU devices under MirroredStrategy, and that the rules' fixes match one device.

TensorFlow runs in ONE subprocess (the logical devices must be configured before TF starts, and
the rest of the suite must not import TF); it runs every scenario and prints JSON. The code under
test for TFM202 and TFM204 is fixed by the rules themselves here, so the fix is what is measured.
The numbers quoted in the rule docs come from this file.
"""

from __future__ import annotations

import textwrap

import pytest
from conftest import run_harness

from tfmigrate.engine import Settings, process_source
from tfmigrate.rules.restore_outside_strategy_scope import RestoreOutsideStrategyScope
from tfmigrate.rules.small_batch_batch_norm import SmallBatchBatchNorm
from tfmigrate.rules.unscaled_replica_loss import UnscaledReplicaLoss

pytestmark = pytest.mark.slow

# A custom training loop as users write it; `model`, `optimizer` come from the harness.
STEP_SOURCE = textwrap.dedent(
    """
    import tensorflow as tf
    GLOBAL_BATCH_SIZE = 8

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(model(x) - y), axis=-1)
            loss = tf.reduce_mean(per_example)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(x, y):
        per_replica = strategy.run(step_fn, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
    """
).lstrip()

# Model code under a MirroredStrategy with 4 examples per replica.
BN_SOURCE = textwrap.dedent(
    """
    import keras
    import tensorflow as tf
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    BATCH_PER_REPLICA = 4
    GLOBAL_BATCH = BATCH_PER_REPLICA * strategy.num_replicas_in_sync

    def build():
        inputs = keras.Input((3,))
        return keras.Model(inputs, keras.layers.BatchNormalization(momentum=0.5)(inputs))
    """
).lstrip()

LOAD_SOURCE = textwrap.dedent(
    """
    import keras
    import tensorflow as tf
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    model = keras.models.load_model(PATH)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    """
).lstrip()

HARNESS = textwrap.dedent(
    r'''
    import json, os, sys, tempfile
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    import numpy as np

    src = json.load(sys.stdin)
    out = {}
    DEVICES = ["/cpu:0", "/cpu:1"]
    mirrored = tf.distribute.MirroredStrategy(DEVICES)
    # One strategy per process: a second MirroredStrategy reuses collective instance keys and
    # its all-reduces then clash with the first one's ("Shape mismatch in the collective").
    tf.distribute.MirroredStrategy = lambda *args, **kwargs: mirrored
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 3)).astype("float32")
    y = rng.normal(size=(8, 1)).astype("float32")
    tmp = tempfile.mkdtemp()

    # -- TFM202: one SGD step, unscaled vs fixed vs one device -----------------------------
    def sgd_step(source, strategy):
        with strategy.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False,
                                      kernel_initializer="zeros")])
            optimizer = keras.optimizers.SGD(0.1)
            optimizer.build(model.trainable_variables)  # Keras 3 must build before strategy.run
        ns = {"model": model, "optimizer": optimizer}
        exec(source, ns)
        ns["strategy"] = strategy  # the harness decides how many devices
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
        if strategy is not tf.distribute.get_strategy():
            data = strategy.experimental_distribute_dataset(data)
        for xb, yb in data:
            reported = float(ns["train_step"](xb, yb))
        return model.get_weights()[0].ravel(), reported

    w1, loss1 = sgd_step(src["step"], tf.distribute.get_strategy())
    w2, loss2 = sgd_step(src["step"], mirrored)
    wf, lossf = sgd_step(src["step_fixed"], mirrored)
    out["tfm202"] = {
        "one_device_step": float(np.abs(w1).max()),
        "unscaled_step": float(np.abs(w2).max()),
        "fixed_step": float(np.abs(wf).max()),
        "ratio": float(np.abs(w2).max() / np.abs(w1).max()),
        "fixed_max_diff": float(np.abs(wf - w1).max()),
        "one_device_loss": loss1, "unscaled_reported_loss": loss2, "fixed_reported_loss": lossf,
    }

    # -- TFM204: per-replica moving statistics, saved file, synchronized=True --------------
    xb = x.copy()
    xb[4:] += 5.0  # replica 1's half has another mean

    def bn_run(source):
        ns = {}
        exec(source, ns)
        strategy = ns["strategy"]
        with strategy.scope():
            model = ns["build"]()
        bn = model.layers[-1]
        data = strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices(xb).batch(ns["GLOBAL_BATCH"]))

        @tf.function
        def step(batch):
            strategy.run(lambda b: model(b, training=True), args=(batch,))

        for batch in data:
            step(batch)
        replicas = [v.numpy().tolist() for v in bn.moving_mean.value.values]
        path = os.path.join(tmp, f"bn{len(out)}.weights.h5")
        model.save_weights(path)
        fresh = ns["build"]()
        fresh.load_weights(path)
        return replicas, fresh.layers[-1].moving_mean.numpy().tolist(), ns["build"]

    replicas, saved, build = bn_run(src["bn"])
    sync_replicas, sync_saved, _ = bn_run(src["bn_fixed"])
    single = build()
    single(xb, training=True)
    one = single.layers[-1].moving_mean.numpy()
    out["tfm204"] = {
        "replica_means": replicas,
        "saved": saved,
        "one_device_global": one.tolist(),
        "replica_gap": float(np.abs(np.subtract(*replicas)).max()),
        "saved_minus_replica0": float(np.abs(np.subtract(saved, replicas[0])).max()),
        "sync_replica_gap": float(np.abs(np.subtract(*sync_replicas)).max()),
        "sync_minus_one_device": float(np.abs(np.subtract(sync_replicas[0], one)).max()),
        "sync_saved_minus_one_device": float(np.abs(np.subtract(sync_saved, one)).max()),
    }

    # -- TFM201: load_model outside / inside the scope; optimizer outside the scope --------
    with mirrored.scope():
        trained = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        trained.compile(optimizer=keras.optimizers.Adam(0.1), loss="mse")
    trained.fit(x, y, batch_size=8, epochs=2, verbose=0)
    path = os.path.join(tmp, "trained.keras")
    trained.save(path)

    def load_run(source):
        ns = {"PATH": path, "x": x, "y": y}
        try:
            exec(source, ns)
            error = None
        except Exception as exc:  # noqa: BLE001 - what fails is the measurement
            error = type(exc).__name__
        model = ns["model"]
        return {
            "strategy": type(model.distribute_strategy).__name__,
            "weight": type(model.weights[0].value).__name__,
            "slot": type(model.optimizer.variables[-1].value).__name__,
            "error": error,
        }

    out["tfm201_load"] = {"outside": load_run(src["load"]), "fixed": load_run(src["load_fixed"])}
    # fit inside the scope of a model loaded outside it
    loaded = keras.models.load_model(path)
    try:
        with mirrored.scope():
            loaded.fit(x, y, batch_size=8, epochs=1, verbose=0)
        out["tfm201_load"]["fit_in_scope_error"] = None
    except Exception as exc:  # noqa: BLE001
        out["tfm201_load"]["fit_in_scope_error"] = type(exc).__name__

    opt = trained.optimizer
    ckpt = tf.train.Checkpoint(model=trained, optimizer=opt).save(os.path.join(tmp, "ck", "c"))

    def custom_step(model, optimizer):
        @tf.function
        def step(xb, yb):
            def fn(a, b):
                with tf.GradientTape() as tape:
                    loss = tf.nn.compute_average_loss(tf.square(model(a) - b)[:, 0])
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
            mirrored.run(fn, args=(xb, yb))
        data = mirrored.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(8))
        for a, b in data:
            step(a, b)

    def restored(inside):
        with mirrored.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            if inside:
                optimizer = keras.optimizers.Adam(0.1)
        if not inside:
            optimizer = keras.optimizers.Adam(0.1)
        tf.train.Checkpoint(model=model, optimizer=optimizer).restore(ckpt).expect_partial()
        if inside:
            with mirrored.scope():
                optimizer.build(model.trainable_variables)
        return model, optimizer

    model_in, opt_in = restored(True)
    custom_step(model_in, opt_in)
    custom_step(trained, opt)
    moments = lambda o: np.concatenate([v.numpy().ravel() for v in o.variables[2:]])
    model_out, opt_out = restored(False)
    try:
        custom_step(model_out, opt_out)
        outside_error = None
    except Exception as exc:  # noqa: BLE001
        outside_error = str(exc).strip().splitlines()[-1]
    out["tfm201_optimizer"] = {
        "inside_moments_diff": float(np.abs(moments(opt_in) - moments(opt)).max()),
        "inside_slot": type(opt_in.variables[-1].value).__name__,
        "outside_iterations_restored": int(opt_out.iterations.numpy()),
        "outside_error": outside_error,
    }
    print("RESULT " + json.dumps(out))
    '''
)


def _fixed(source: str, rule: type) -> str:
    result = process_source(source, "example.py", Settings(rules=(rule,), fix=True, unsafe_fixes=True))
    assert result.error is None and result.new_code is not None, result
    return result.new_code


@pytest.fixture(scope="module")
def measured() -> dict:
    sources = {
        "step": STEP_SOURCE,
        "step_fixed": _fixed(STEP_SOURCE, UnscaledReplicaLoss),
        "bn": BN_SOURCE,
        "bn_fixed": _fixed(BN_SOURCE, SmallBatchBatchNorm),
        "load": LOAD_SOURCE,
        "load_fixed": _fixed(LOAD_SOURCE, RestoreOutsideStrategyScope),
    }
    data = run_harness(HARNESS, sources)
    return data


def test_tfm202_fix_is_compute_average_loss():
    fixed = _fixed(STEP_SOURCE, UnscaledReplicaLoss)
    assert (
        "tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH_SIZE)" in fixed
    )


def test_tfm202_unscaled_loss_doubles_the_step(measured):
    m = measured["tfm202"]
    assert m["ratio"] == pytest.approx(2.0, rel=1e-5)
    # SUM of two per-replica means reports about twice the loss.
    assert m["unscaled_reported_loss"] > 1.5 * m["one_device_loss"]


def test_tfm202_fixed_step_matches_one_device(measured):
    m = measured["tfm202"]
    assert m["fixed_max_diff"] < 1e-6
    assert m["fixed_reported_loss"] == pytest.approx(m["one_device_loss"], abs=1e-5)


def test_tfm204_replicas_drift_and_save_keeps_replica_0(measured):
    m = measured["tfm204"]
    assert m["replica_gap"] > 1.0  # the halves differ by 5.0, momentum 0.5
    assert m["saved_minus_replica0"] == 0.0


def test_tfm204_synchronized_matches_one_device_on_global_batch(measured):
    m = measured["tfm204"]
    assert m["sync_replica_gap"] == 0.0
    assert m["sync_minus_one_device"] < 1e-5
    assert m["sync_saved_minus_one_device"] < 1e-5


def test_tfm201_load_model_outside_scope_is_single_device(measured):
    m = measured["tfm201_load"]
    assert m["outside"]["strategy"] == "_DefaultDistributionStrategy"
    assert m["outside"]["weight"] == "ResourceVariable"
    assert m["outside"]["slot"] == "ResourceVariable"
    assert m["outside"]["error"] is None  # trains silently, on one device
    assert m["fit_in_scope_error"] is not None
    assert m["fixed"] == {
        "strategy": "MirroredStrategy",
        "weight": "MirroredVariable",
        "slot": "MirroredVariable",
        "error": None,
    }


def test_tfm201_optimizer_outside_scope(measured):
    m = measured["tfm201_optimizer"]
    assert m["inside_slot"] == "MirroredVariable"
    assert m["inside_moments_diff"] == 0.0
    assert m["outside_iterations_restored"] == 2
    assert "Mixing different tf.distribute.Strategy" in m["outside_error"]
