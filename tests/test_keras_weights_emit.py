"""TFM303's conversion of tf.get_variable model functions (the CIFAR-10 tutorial style): a Keras
model that owns every variable (add_weight) and keeps the TF1 computation in call().

The numerics test runs each legacy function in a graph (tf.compat.v1, under a tower's name
scope) and the Keras model written for it with the legacy weights copied in: same outputs, same
weight decay (the 'losses' collection against model.losses), every variable mapped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from keras_model_source import run_numerics
from keras_weights_source import convert

from tfmigrate.engine import Settings, process_source
from tfmigrate.rules._keras_model_emit import NotConvertible
from tfmigrate.rules.tower_program import TowerProgramToMirroredStrategy

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"

# Sources as TFM303 sees them: TF1 names on their tf.compat.v1 spellings. Two helper levels
# (a CPU-pinned creator and a weight-decay wrapper), keyword and positional arguments, a
# decay of None and of 0.0, lrn and max_pool between the scopes, `scope.name` op names.
CONVNET = """
import tensorflow as tf

NUM_CLASSES = 3


def _variable_on_cpu(name, shape, initializer):
    with tf.device('/cpu:0'):
        var = tf.compat.v1.get_variable(name, shape, initializer=initializer, dtype=tf.float32)
    return var


def _variable_with_weight_decay(name, shape, stddev, wd):
    var = _variable_on_cpu(name, shape, tf.compat.v1.truncated_normal_initializer(stddev=stddev))
    if wd is not None:
        weight_decay = tf.multiply(tf.nn.l2_loss(var), wd, name='weight_loss')
        tf.compat.v1.add_to_collection('losses', weight_decay)
    return var


def inference(images):
    with tf.compat.v1.variable_scope('conv1') as scope:
        kernel = _variable_with_weight_decay('weights', shape=[3, 3, 3, 8], stddev=5e-2, wd=None)
        conv = tf.nn.conv2d(images, kernel, [1, 1, 1, 1], padding='SAME')
        biases = _variable_on_cpu('biases', [8], tf.compat.v1.constant_initializer(0.0))
        conv1 = tf.nn.relu(tf.nn.bias_add(conv, biases), name=scope.name)
    pool1 = tf.nn.max_pool2d(conv1, ksize=[1, 3, 3, 1], strides=[1, 2, 2, 1], padding='SAME')
    norm1 = tf.nn.lrn(pool1, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75, name='norm1')
    with tf.compat.v1.variable_scope('local3') as scope:
        reshape = tf.reshape(norm1, [-1, 4 * 4 * 8])
        weights = _variable_with_weight_decay('weights', [4 * 4 * 8, 16], stddev=0.04, wd=0.004)
        biases = _variable_on_cpu('biases', [16], tf.compat.v1.constant_initializer(0.1))
        local3 = tf.nn.relu(tf.matmul(reshape, weights) + biases, name=scope.name)
    with tf.compat.v1.variable_scope('softmax_linear') as scope:
        weights = _variable_with_weight_decay('weights', [16, NUM_CLASSES], stddev=1 / 16.0,
                                              wd=0.0)
        biases = _variable_on_cpu('biases', [NUM_CLASSES], tf.compat.v1.zeros_initializer())
        softmax_linear = tf.add(tf.matmul(local3, weights), biases, name=scope.name)
    return softmax_linear
"""
# No helper, no decay, a return inside the last scope, get_variable's default initializer.
MLP = """
import tensorflow as tf


def net(x):
    with tf.compat.v1.variable_scope('hidden'):
        w = tf.compat.v1.get_variable('w', [5, 4])
        b = tf.compat.v1.get_variable('b', [4], initializer=tf.compat.v1.zeros_initializer())
        h = tf.nn.tanh(tf.matmul(x, w) + b)
    with tf.compat.v1.variable_scope('out'):
        w = tf.compat.v1.get_variable('w', [4, 2],
                                      initializer=tf.compat.v1.random_normal_initializer(stddev=0.3))
        return tf.matmul(h, w)
"""
# Weight shapes read from the computation (the input's depth, a flattened size), the decay added
# to the collection inline.
DYNAMIC = """
import tensorflow as tf


def _weight(name, shape, wd):
    var = tf.compat.v1.get_variable(
        name, shape, initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.1))
    tf.compat.v1.add_to_collection('losses', tf.multiply(tf.nn.l2_loss(var), wd))
    return var


def model(images):
    with tf.compat.v1.variable_scope('conv') as scope:
        kernel = _weight('weights', [3, 3, images.get_shape()[-1], 4], 0.001)
        net = tf.nn.relu(tf.nn.conv2d(images, kernel, [1, 2, 2, 1], padding='SAME'),
                         name=scope.name)
    with tf.compat.v1.variable_scope('local'):
        reshape = tf.reshape(net, [-1, 4 * 4 * 4])
        dim = reshape.get_shape()[1]
        weights = _weight('weights', [dim, 3], 0.004)
        return tf.matmul(reshape, weights)
"""
CASES = [
    {"source": CONVNET, "function": "inference", "shape": [4, 8, 8, 3]},
    {"source": MLP, "function": "net", "shape": [6, 5]},
    {"source": DYNAMIC, "function": "model", "shape": [2, 8, 8, 3]},
]


def test_variables_become_weights_the_model_owns():
    converted = convert(CONVNET, "inference")
    source = converted.source
    assert "class Inference(keras.Model):" in source
    assert "get_variable" not in source and "variable_scope" not in source
    assert "collection" not in source and "_variable_" not in source  # helpers read, not kept
    assert source.count(".add_weight(") == 6
    # Each TF1 initializer and decay, spelled the Keras way (the same distribution / value).
    flat = " ".join(source.split())
    assert (
        'self.local3_weights = local3_scope.add_weight( name="weights", shape=[4 * 4 * 8, 16], '
        "initializer=keras.initializers.TruncatedNormal(stddev=0.04), "
        "regularizer=keras.regularizers.L2(0.5 * 0.004))"
    ) in flat
    assert "initializer=keras.initializers.Constant(0.1))" in flat
    assert 'shape=[NUM_CLASSES], initializer="zeros")' in flat
    assert "regularizer=keras.regularizers.L2(0.5 * 0.0))" in flat  # wd=0.0 is not None
    assert 'local3_scope = keras.layers.Layer(name="local3")' in source
    # call() keeps the computation; the scopes name ops only; scope.name is each block's own.
    assert "with tf.name_scope('conv1'):" in source and "name='conv1')" in source
    assert "softmax_linear = tf.add(tf.matmul(local3, weights), biases, name='softmax_linear')" in (
        source
    )
    assert "kernel = self.conv1_weights" in source
    assert converted.variables("inference") == {
        "conv1/weights": "inference/conv1/weights", "conv1/biases": "inference/conv1/biases",
        "local3/weights": "inference/local3/weights", "local3/biases": "inference/local3/biases",
        "softmax_linear/weights": "inference/softmax_linear/weights",
        "softmax_linear/biases": "inference/softmax_linear/biases",
    }  # fmt: skip
    compile(source, "model.py", "exec")


def test_get_variable_defaults_spelled_out():
    source = convert(MLP, "net").source
    flat = " ".join(source.split())
    assert 'name="w", shape=[5, 4], initializer="glorot_uniform")' in flat  # TF1's default
    assert "initializer=keras.initializers.RandomNormal(stddev=0.3))" in flat
    assert "return tf.matmul(h, w)" in source and "regularizer" not in source


def test_shapes_read_from_the_computation_are_made_in_a_traced_call():
    source = convert(DYNAMIC.replace("[1]\n", "[1].value\n"), "model").source
    assert "def __init__" not in source  # built on the first call, from the input's shape
    assert "tf.function(self.call).get_concrete_function(" in source
    assert "`images`, `dim`" in source  # the comment names what the shapes read
    assert "dim = reshape.get_shape()[1]\n" in source  # TF1's Dimension.value: an int now
    flat = " ".join(source.split())
    assert (
        'weights = self.weight( "local", name="weights", shape=[dim, 3], '
        "initializer=keras.initializers.TruncatedNormal(stddev=0.1), "
        "regularizer=keras.regularizers.L2(0.5 * 0.004))"
    ) in flat


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (
            "reshape = tf.reshape(norm1, [-1, 4 * 4 * 8])\n",
            "reshape = tf.reshape(norm1, [-1, 4 * 4 * 8])\n        dim = 4 * 4 * 8\n",
            None,  # a shape computed from constants is fine (`dim` is not a tensor here)
        ),
        (
            "pool1 = tf.nn.max_pool2d(",
            "print(conv1)\n    pool1 = tf.nn.max_pool2d(",
            None,
        ),
        ("if wd is not None:", "if wd:", "branches on something other than `x is None`"),
        (
            "biases = _variable_on_cpu('biases', [16], tf.compat.v1.constant_initializer(0.1))",
            "biases = _variable_on_cpu('weights', [16], tf.compat.v1.constant_initializer(0.1))",
            "a variable created twice under one name",
        ),
        (
            "dtype=tf.float32)",
            "dtype=tf.float16)",
            "another dtype than float32",
        ),
        (
            "norm1 = tf.nn.lrn(",
            "tf.compat.v1.add_to_collection('acts', pool1)\n    norm1 = tf.nn.lrn(",
            "`tf.compat.v1.add_to_collection` in the model computation",
        ),
    ],
)
def test_what_it_cannot_read_is_refused_with_the_reason(old, new, reason):
    assert old in CONVNET
    source = CONVNET.replace(old, new)
    if reason is None:
        assert "add_weight" in convert(source, "inference").source
        return
    with pytest.raises(NotConvertible) as caught:
        convert(source, "inference")
    assert reason in caught.value.reason


CIFAR = (FIXTURES / "towers" / "cifar_average" / "train.py").read_text()


def _rewrite(source: str):  # type: ignore[no-untyped-def]
    return process_source(
        source, "train.py", Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    )


def test_tower_helper_takes_the_model_and_reads_its_losses():
    """The model called in a helper of the tower (tower_loss): the helper takes the model, and
    the tower's 'losses' collection becomes the model's losses first, then what the helper
    added; the variable helper goes; the global step is a plain tf.Variable."""
    code = _rewrite(CIFAR).new_code
    assert code is not None
    assert "def tower_loss(inference, scope, images, labels):" in code
    assert "loss = tower_loss(inference, scope, images, labels)" in code
    assert (
        "losses = [*inference.losses, tf.reduce_mean(cross_entropy, name='cross_entropy')]"
    ) in code
    assert "def _variable_with_weight_decay" not in code and "def inference" not in code
    assert (
        "global_step = tf.Variable(0, dtype=tf.float32, trainable=False, name='global_step')"
        in (code)
    )
    assert _rewrite(code).new_code is None  # a second rewrite changes nothing


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (
            "losses = tf.get_collection('losses', scope)",
            "losses = tf.get_collection('losses')",
            "read without the tower's scope",
        ),
        (
            "  logits = inference(images)\n",
            "  tf.add_to_collection('losses', tf.constant(0.0))\n  logits = inference(images)\n",
            "used before the model adds its weight decay to it",
        ),
        (
            "  logits = inference(images)\n",
            "  logits = inference(images)\n  _variable_with_weight_decay('extra', [2], 0.1, None)\n",
            "2 functions make tf.get_variable variables",
        ),
        (
            "            loss = tower_loss(scope, image_splits[i], label_splits[i])\n",
            "            loss = tower_loss(scope, image_splits[i], label_splits[i])\n"
            "            loss = loss + tf.losses.get_regularization_loss()\n",
            "reads TF1's regularization losses besides the decay's collection",
        ),
        (
            "  pool1 = tf.nn.max_pool(",
            "  conv1 = tf.Print(conv1, [conv1])\n  pool1 = tf.nn.max_pool(",
            "`tf.compat.v1.Print` (TF1 only) in the model computation (line 44)",
        ),
    ],
)
def test_tower_program_that_cannot_use_it_says_why(old, new, reason):
    source = CIFAR.replace(old, new)
    assert source != CIFAR
    result = _rewrite(source)
    notes = result.manifest.get("notes", [])
    assert "class TF1Variables" in result.new_code  # the model code stays on tf.compat.v1
    assert any("not converted to Keras layers: " in n and reason in n for n in notes), notes


@pytest.fixture(scope="module")
def numerics() -> dict:
    return run_numerics("keras_weights_numerics.py", CASES)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(CASES)), ids=[c["function"] for c in CASES])
def test_keras_model_computes_what_the_legacy_function_did(numerics, index):
    result = numerics["cases"][index]
    assert result["unmapped"] == [], result  # every legacy variable is a Keras weight
    assert result["out"] < 1e-5, result
    legacy, keras = result["decay_legacy"], result["decay_keras"]
    assert len(legacy) == len(keras), result
    assert all(abs(a - b) <= 1e-6 * max(1.0, abs(a)) for a, b in zip(legacy, keras, strict=True)), (
        result
    )
    if index == 0:
        assert len(keras) == 2 and keras[0] > 0 and keras[1] == 0.0  # wd=0.004, then wd=0.0
    if index == 2:  # made in the traced call, with the legacy paths
        assert result["paths"] == ["model/conv/weights", "model/local/weights"], result


@pytest.mark.slow
def test_truncated_normal_draws_like_tf1(numerics):
    # Both: a normal of the given stddev truncated at 2 stddev (so std ~0.88 of it).
    drawn = numerics["truncated_normal"]
    assert drawn["std"] < 0.01, drawn
    assert all(1.9 < bound <= 2.0 for bound in drawn["bound"]), drawn
