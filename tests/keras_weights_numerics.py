"""Run a legacy tf.get_variable model function and the Keras model TFM303 writes for it; print
what differs.

Used by test_keras_weights_emit.py in a subprocess. Input: a JSON list of cases on stdin, each
{"source": module text, "function": name, "shape": input shape}. Output: one JSON object per
case with the largest differences measured.

The legacy side builds the function in a tf.Graph under a tower's name scope (as a tower did),
reads that scope's 'losses' collection (the weight decay the helpers added) and runs both in a
Session; the Keras side (eager, Keras 3) gets the legacy initial weights through the
conversion's name mapping and runs the same batch; its weight decay is `model.losses`.
"""

from __future__ import annotations

import json
import sys

import keras
import numpy as np
import tensorflow as tf
from keras_weights_source import convert


def legacy_run(source: str, function: str, x: np.ndarray) -> dict:
    namespace: dict = {}
    exec(compile(source, "legacy_model.py", "exec"), namespace)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(1)
        inputs = tf.compat.v1.placeholder(tf.float32, x.shape)
        with tf.name_scope("tower_0") as scope:
            out = namespace[function](inputs)
            decay = tf.compat.v1.get_collection("losses", scope)
        variables = tf.compat.v1.global_variables()
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            initial = {v.op.name: sess.run(v) for v in variables}
            value, decay_values = sess.run([out, decay], {inputs: x})
    return dict(initial=initial, out=value, decay=[float(d) for d in decay_values])


def keras_run(source: str, function: str, x: np.ndarray, legacy: dict) -> dict:
    converted = convert(source, function)
    namespace: dict = {}
    exec(compile(source, "legacy_model.py", "exec"), namespace)  # its imports and constants
    namespace["keras"] = keras
    exec(converted.source, namespace)
    model = namespace[converted.class_name](name="model")
    model(tf.constant(x))  # builds it (a model with shapes read from the computation: now)
    mapping = converted.variables("model")
    weights = {w.path: w for w in model.weights}
    for legacy_name, path in mapping.items():
        weights[path].assign(legacy["initial"][legacy_name])
    value = model(tf.constant(x)).numpy()
    decay = [float(loss) for loss in model.losses]
    return dict(
        out=value,
        decay=decay,
        unmapped=sorted(set(legacy["initial"]) ^ set(mapping)),
        paths=sorted(weights),
    )


def truncated_normal() -> dict:
    """TF1's truncated_normal_initializer and the Keras initializer written for it, on a large
    draw: relative difference of their standard deviations, and the largest |value| / stddev."""
    legacy = tf.compat.v1.truncated_normal_initializer(stddev=0.1)([400_000]).numpy()
    fresh = keras.ops.convert_to_numpy(keras.initializers.TruncatedNormal(stddev=0.1)([400_000]))
    return {
        "std": float(abs(fresh.std() / legacy.std() - 1.0)),
        "bound": [float(abs(legacy).max() / 0.1), float(abs(fresh).max() / 0.1)],
    }


def main() -> None:
    results = []
    for case in json.load(sys.stdin):
        x = np.random.RandomState(0).rand(*case["shape"]).astype(np.float32)
        legacy = legacy_run(case["source"], case["function"], x)
        migrated = keras_run(case["source"], case["function"], x, legacy)
        results.append(
            {
                "out": float(abs(legacy["out"] - migrated["out"]).max()),
                "decay_legacy": legacy["decay"],
                "decay_keras": migrated["decay"],
                "unmapped": migrated["unmapped"],
                "paths": migrated["paths"],
            }
        )
    print(json.dumps({"cases": results, "truncated_normal": truncated_normal()}))


if __name__ == "__main__":
    main()
