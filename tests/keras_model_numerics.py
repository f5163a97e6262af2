"""Run a legacy TF1 model function and the Keras model TFM303 writes for it; print what differs.

Used by test_keras_model_emit.py in a subprocess (TF_USE_LEGACY_KERAS=1 must be set before
TensorFlow starts, for tf.compat.v1.layers). Input: a JSON list of cases on stdin, each
{"source": module text, "function": name, "shape": input shape, "dropout": bool}. Output: one
JSON object per case: the largest differences measured, and what the conversion produced.

The legacy side builds the function in a tf.Graph under `variable_scope('model')` twice (training
and inference, shared variables) and runs it in a Session; the Keras side (eager, Keras 3) gets
the legacy initial weights through the conversion's name mapping, then both run one inference
and one training-mode call on the same batch.
"""

from __future__ import annotations

import importlib
import json
import sys

import numpy as np
import tensorflow as tf

# tf_slim 1.1 on TF 2.21 (as the converted programs do it, see TFM303).
_ops = importlib.import_module("tensorflow.python.framework.ops")
if not hasattr(_ops, "Tensor"):
    _ops.Tensor = tf.Tensor
for _name in ("legacy_tf_layers", "legacy_tf_layers.normalization"):
    sys.modules.setdefault(f"tf_keras.{_name}", importlib.import_module(f"tf_keras.src.{_name}"))

import keras  # noqa: E402
import tf_slim  # noqa: E402
from keras_model_source import convert  # noqa: E402

from tfmigrate.rules import _keras_model_emit as emit  # noqa: E402


def legacy_run(
    source: str, function: str, x: np.ndarray, training_kw: str | None, extra: dict
) -> dict:
    namespace: dict = {"tf": tf, "tf_slim": tf_slim, "slim": tf_slim, "NUM_CLASSES": 3}
    exec(compile(source, "legacy_model.py", "exec"), namespace)
    fn = namespace[function]
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(1)
        inputs = tf.compat.v1.placeholder(tf.float32, x.shape)
        kwargs = lambda on: {**extra, **({training_kw: on} if training_kw else {})}  # noqa: E731
        with tf.compat.v1.variable_scope("model"):
            train_out = fn(inputs, **kwargs(True))
        updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        with tf.compat.v1.variable_scope("model", reuse=True):
            eval_out = fn(inputs, **kwargs(False))
        regularization = tf.compat.v1.losses.get_regularization_losses()
        variables = tf.compat.v1.global_variables()
        trainable = [v.op.name for v in tf.compat.v1.trainable_variables()]
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            initial = {v.op.name: sess.run(v) for v in variables}
            eval_value = sess.run(eval_out, {inputs: x})
            reg_value = float(sess.run(tf.add_n(regularization))) if regularization else None
            train_value, _ = sess.run([train_out, updates], {inputs: x})
            after = {v.op.name: sess.run(v) for v in variables}
    return dict(initial=initial, eval=eval_value, train=train_value, after=after, reg=reg_value,
                trainable=trainable)  # fmt: skip


def init_values(model_info: emit.KerasModel) -> dict:
    return {p: 0.01 for p in model_info.init_params}  # weight decay and the like


def keras_run(
    model_info: emit.KerasModel, source: str, x: np.ndarray, legacy: dict, glorot: bool
) -> dict:
    namespace: dict = {"tf": tf, "keras": keras, "NUM_CLASSES": 3}
    exec(emit.TF1_BATCH_NORM, namespace)
    exec(model_info.source, namespace)
    init_kwargs = init_values(model_info)
    model = namespace[model_info.class_name](name="model", **init_kwargs)
    model(x)  # builds every layer (inference: no statistics update)
    mapping = model_info.variables("model", "model")  # legacy: under variable_scope("model")
    weights = {w.path: w for w in model.weights}
    init_report = {}
    for legacy_name, new_name in mapping.items():
        fresh = np.asarray(weights[new_name].numpy())
        old = legacy["initial"][legacy_name]
        if legacy_name.rsplit("/", 1)[-1] in ("weights", "kernel") and not glorot:
            pass  # another distribution: see variance_scaling()
        elif legacy_name.rsplit("/", 1)[-1] in ("weights", "kernel"):
            # Random: the same distribution (glorot uniform limit), not the same draw.
            receptive = int(np.prod(old.shape[:-2])) if old.ndim > 2 else 1
            limit = np.sqrt(6.0 / (receptive * (old.shape[-2] + old.shape[-1])))
            init_report[legacy_name] = [
                float(abs(fresh).max() / limit),
                float(abs(old).max() / limit),
            ]
        else:
            init_report[legacy_name] = float(abs(fresh - old).max())
        weights[new_name].assign(old)
    kwargs = {"training": False} if model_info.training_param else {}
    eval_value = model(x, **kwargs).numpy()
    kwargs = {"training": True} if model_info.training_param else {}
    train_value = model(x, **kwargs).numpy()
    after = {n: weights[mapping[n]].numpy() for n in mapping}
    reg = float(tf.add_n(model.losses)) if model.losses else None
    unmapped = sorted(set(legacy["initial"]) - set(mapping))
    trained = {w.path for w in model.trainable_weights}
    trainable = sorted(
        set(legacy["trainable"]) ^ {n for n, new in mapping.items() if new in trained}
    )
    return dict(eval=eval_value, train=train_value, after=after, reg=reg, init=init_report,
                unmapped=unmapped, trainable=trainable)  # fmt: skip


def variance_scaling() -> dict:
    """slim's variance_scaling_initializer() and the Keras initializer written for it: the
    standard deviation of a large draw, each (relative difference)."""
    shape = [3, 3, 64, 64]
    legacy = tf_slim.variance_scaling_initializer()(shape).numpy()
    namespace = {"keras": keras}
    keras_init = eval(  # the initializer exactly as the conversion writes it
        "keras.initializers.VarianceScaling(1.3 * 2.0 * 0.87962566103423978**2, "
        '"fan_in", "truncated_normal")',
        namespace,
    )
    fresh = keras.ops.convert_to_numpy(keras_init(shape))
    return {
        "std": float(abs(fresh.std() / legacy.std() - 1.0)),
        "max": float(abs(abs(fresh).max() / abs(legacy).max() - 1.0)),
    }


def main() -> None:
    results = []
    for case in json.load(sys.stdin):
        info = convert(case["source"], case["function"])
        x = np.random.RandomState(0).randn(*case["shape"]).astype(np.float32) * 2.0 + 0.5
        legacy = legacy_run(
            case["source"], case["function"], x, case.get("training_kw"), init_values(info)
        )
        migrated = keras_run(info, case["source"], x, legacy, case.get("glorot", True))
        statistics = {
            n: float(abs(migrated["after"][n] - legacy["after"][n]).max())
            for n in migrated["after"]
            if n.endswith(("moving_mean", "moving_variance"))
        }
        results.append(
            dict(
                eval=float(abs(migrated["eval"] - legacy["eval"]).max()),
                train=None
                if case.get("dropout")
                else float(abs(migrated["train"] - legacy["train"]).max()),
                statistics=statistics,
                statistics_moved=any(
                    float(abs(legacy["after"][n] - legacy["initial"][n]).max()) > 1e-3
                    for n in statistics
                ),
                regularization=None
                if legacy["reg"] is None
                else abs((migrated["reg"] or 0.0) - legacy["reg"]),
                init=migrated["init"],
                unmapped=migrated["unmapped"],
                trainable=migrated["trainable"],
                source=info.source,
            )
        )
    print(json.dumps({"cases": results, "variance_scaling": variance_scaling()}))


if __name__ == "__main__":
    main()
