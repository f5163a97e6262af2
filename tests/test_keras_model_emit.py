"""TFM303's model conversion: TF1 layer-call model functions -> Keras 3 model classes.

The numerics test runs each legacy function (graph mode, tf.compat.v1, tf_slim) and the Keras
model written for it with the legacy weights copied in: same outputs, same batch-norm moving
statistics after a training-mode call, same regularization loss, the same initial values.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from keras_model_source import convert

from tfmigrate.engine import Settings, process_source
from tfmigrate.rules import _keras_model_emit as emit
from tfmigrate.rules import _tower_program_example as example
from tfmigrate.rules.tower_program import TowerProgramToMirroredStrategy

HERE = Path(__file__).resolve().parent

# Every supported layer kind appears in one of these (sources as TFM303 sees them: TF1 names on
# their tf.compat.v1 spellings, tf.contrib as tf_slim).
SLIM_MLP = """
import tensorflow as tf
import tf_slim as slim

def mlp(images, is_training, weight_decay):
    regularizer = slim.l2_regularizer(weight_decay)
    with tf.compat.v1.variable_scope('mlp'):
        net = slim.fully_connected(images, 6, weights_regularizer=regularizer, scope='fc1')
        net = slim.batch_norm(net, decay=0.5, is_training=is_training, scope='bn1')
        return slim.fully_connected(net, NUM_CLASSES, activation_fn=None,
                                    weights_regularizer=regularizer, scope='logits')
"""
LAYERS_CNN = """
import tensorflow as tf

def cnn(images, training):
    net = tf.compat.v1.layers.conv2d(images, 4, 3, padding='same', activation=tf.nn.relu,
                                     name='conv1')
    net = tf.compat.v1.layers.batch_normalization(net, momentum=0.5, training=training,
                                                  name='bn1')
    net = tf.compat.v1.layers.max_pooling2d(net, 2, 2)
    net = tf.compat.v1.layers.flatten(net)
    net = tf.compat.v1.layers.dropout(net, rate=0.5, training=training)
    return tf.compat.v1.layers.dense(net, NUM_CLASSES, name='logits')
"""
LAYERS_MLP = """
import tensorflow as tf

def model(inputs, training=False):
    net = tf.compat.v1.layers.dense(inputs, 5, use_bias=False, name='fc1')
    net = tf.compat.v1.layers.batch_normalization(net, momentum=0.5, training=training, name='bn1')
    net = tf.nn.tanh(net)
    return tf.compat.v1.layers.dense(net, NUM_CLASSES, name='logits')
"""
SLIM_CNN = """
import tensorflow as tf
import tf_slim

def convnet(images, is_training):
    net = tf_slim.conv2d(images, 4, [3, 3], scope='conv1')
    net = tf_slim.batch_norm(net, is_training=is_training, decay=0.5, scale=True, scope='bn1')
    net = tf_slim.max_pool2d(net, [2, 2])
    net = tf_slim.flatten(net)
    return tf_slim.fully_connected(net, NUM_CLASSES, activation_fn=None, scope='logits')
"""
CASES = [
    dict(source=SLIM_MLP, function="mlp", shape=[8, 5], training_kw="is_training"),
    dict(source=LAYERS_CNN, function="cnn", shape=[4, 6, 6, 2], training_kw="training", dropout=True),
    dict(source=LAYERS_MLP, function="model", shape=[8, 5], training_kw="training"),
    dict(source=SLIM_CNN, function="convnet", shape=[4, 6, 6, 2], training_kw="is_training"),
]  # fmt: skip


def _convert(source: str, function: str) -> emit.KerasModel:
    return convert(textwrap.dedent(source), function)


@pytest.fixture(scope="module")
def numerics() -> list[dict]:
    env = {
        **os.environ,
        "TF_USE_LEGACY_KERAS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "CUDA_VISIBLE_DEVICES": "-1",
    }
    proc = subprocess.run(
        [sys.executable, str(HERE / "keras_model_numerics.py")],
        input=json.dumps(CASES),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(CASES)), ids=[c["function"] for c in CASES])
def test_keras_model_computes_what_the_legacy_function_did(numerics, index):
    result = numerics[index]
    assert result["unmapped"] == [], result["source"]  # every legacy variable has a Keras weight
    assert result["eval"] < 1e-5, result
    if result["train"] is not None:  # dropout's masks are random on both sides
        assert result["train"] < 1e-5, result
    if result["statistics"]:
        assert result["statistics_moved"]  # decay 0.5: the update is visible
        assert max(result["statistics"].values()) < 1e-5, result
    if result["regularization"] is not None:
        assert result["regularization"] < 1e-6, result
    for name, value in result["init"].items():
        if isinstance(value, list):  # glorot-uniform kernels: within the limit, near it
            assert all(0.5 < v <= 1.0 + 1e-6 for v in value), (name, value)
        else:  # biases, beta/gamma, moving statistics: the same start
            assert value == 0.0, (name, value)


def test_each_legacy_default_spelled_out():
    slim_mlp = _convert(SLIM_MLP, "mlp")
    fc1, bn1, logits = slim_mlp.layers
    # slim: relu by default, batch_norm scale=False; l2_regularizer halves (tf.nn.l2_loss).
    assert fc1.constructor == (
        'keras.layers.Dense(6, activation="relu", '
        'kernel_regularizer=keras.regularizers.L2(0.5 * weight_decay), name="fc1")'
    )
    assert bn1.constructor == (
        "TF1BatchNorm(unbiased_ranks=(2, 4), momentum=0.5, epsilon=0.001, center=True, "
        'scale=False, name="bn1")'
    )
    assert "activation" not in logits.constructor
    assert slim_mlp.init_params == ["weight_decay"] and slim_mlp.scope == "mlp"
    assert slim_mlp.variables("clone", "mlp") == {
        "clone/mlp/fc1/weights": "mlp/fc1/kernel",
        "clone/mlp/fc1/biases": "mlp/fc1/bias",
        "clone/mlp/bn1/beta": "mlp/bn1/beta",
        "clone/mlp/bn1/moving_mean": "mlp/bn1/moving_mean",
        "clone/mlp/bn1/moving_variance": "mlp/bn1/moving_variance",
        "clone/mlp/logits/weights": "mlp/logits/kernel",
        "clone/mlp/logits/biases": "mlp/logits/bias",
    }
    assert "def call(self, images, training=False):" in slim_mlp.source
    assert "net = self.bn1(net, training=training)" in slim_mlp.source
    cnn = _convert(LAYERS_CNN, "cnn")
    # tf.layers: batch norm momentum given, scale=True default, fused (unbiased) on 4-D only.
    assert cnn.layers[1].constructor.startswith("TF1BatchNorm(unbiased_ranks=(4,), momentum=0.5")
    assert cnn.layers[2].constructor == "keras.layers.MaxPooling2D(2, 2)"
    slim_cnn = _convert(SLIM_CNN, "convnet")
    # slim conv2d: padding SAME and relu; max_pool2d: stride 2 by default.
    assert slim_cnn.layers[0].constructor == (
        'keras.layers.Conv2D(4, [3, 3], padding="same", activation="relu", name="conv1")'
    )
    assert slim_cnn.layers[2].constructor == "keras.layers.MaxPooling2D([2, 2], 2)"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            "net = tf.compat.v1.layers.batch_normalization(x, training=t, trainable=False, name='bn')",
            "`trainable=`",  # Keras 3's trainable=False is inference mode: never mapped
        ),
        ("net = tf.compat.v1.layers.dense(x, 4)", "without a literal name"),
        ("net = tf.compat.v1.get_variable('w', [4])", "a call Keras layers do not cover"),
        ("net = slim.fully_connected(x, 4, normalizer_fn=slim.batch_norm, scope='fc')", "`normalizer_fn=`"),
        ("for k in range(2):\n        x = tf.compat.v1.layers.dense(x, 4, name='fc%d' % k)", "not straight-line"),
        ("net = tf.compat.v1.layers.dense(x, 4, name='fc', kernel_initializer=my_init())", "initializer"),
    ],
)  # fmt: skip
def test_what_it_cannot_map_is_refused_with_the_reason(body, reason):
    source = f"""
import tensorflow as tf
import tf_slim as slim

def model(x, t):
    {body}
    return net
"""
    with pytest.raises(emit.NotConvertible) as caught:
        _convert(source, "model")
    assert reason in caught.value.reason


def _tower_program(model_def: str, tower_line: str) -> str:
    """The rule's example program with another model function and tower statement."""
    legacy = example.LEGACY
    start = legacy.index("def tower_loss(x, y):")
    end = legacy.index("def average_gradients")
    legacy = legacy[:start] + textwrap.dedent(model_def).lstrip() + "\n\n" + legacy[end:]
    return legacy.replace(
        "                loss = tower_loss(x_splits[i], y_splits[i])\n", tower_line
    )


def test_tower_program_gets_a_keras_model():
    legacy = _tower_program(
        """
        def net(x):
            return tf.layers.dense(x, 2, use_bias=False, name='fc')
        """,
        "                pred = net(x_splits[i])\n"
        "            loss = tf.reduce_mean(tf.square(pred - y_splits[i]), name='loss')\n",
    )
    fixed = process_source(
        legacy, "train.py", Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    )
    code = fixed.new_code
    assert "class Net(keras.Model):" in code and "import keras\n" in code
    assert 'net = Net(name="model")' in code and "pred = net(x)" in code
    assert "TF1Variables" not in code and "variable_scope" not in code
    assert fixed.manifest["variables"] == {"model/fc/kernel": "model/fc/kernel"}
    compile(code, "train.py", "exec")


def test_model_code_it_cannot_map_stays_on_compat_v1_with_the_reason():
    # The loss computed inside the model function: not a layer, not an activation.
    legacy = _tower_program(
        """
        def tower_loss(x, y):
            pred = tf.layers.dense(x, 2, name='fc')
            return tf.reduce_mean(tf.square(pred - y), name='loss')
        """,
        "                loss = tower_loss(x_splits[i], y_splits[i])\n",
    )
    fixed = process_source(
        legacy, "train.py", Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    )
    assert "class TF1Variables:" in fixed.new_code and "keras.Model" not in fixed.new_code
    [note] = [n for n in fixed.manifest["notes"] if "not converted to Keras layers" in n]
    assert "a call Keras layers do not cover: `tf.square` (line 9)" in note
