"""TFM303's model conversion: TF1 layer-call model functions -> Keras 3 model classes.

The numerics test runs each legacy function (graph mode, tf.compat.v1, tf_slim) and the Keras
model written for it with the legacy weights copied in: same outputs, same batch-norm moving
statistics after a training-mode call, same regularization loss, the same initial values.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest
from keras_model_source import convert, run_numerics

from tfmigrate.engine import Settings, process_source
from tfmigrate.names import NameResolver
from tfmigrate.rules import _keras_model_emit as emit
from tfmigrate.rules import _tower_program_example as example
from tfmigrate.rules._static_loops import unroll
from tfmigrate.rules._variable_names import VariableNames
from tfmigrate.rules.tower_program import TowerProgramToMirroredStrategy

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"

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
    net = tf.compat.v1.nn.dropout(net, rate=0.0)
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
# Layers built in loops over literal lists (unrolled; names from %, f-strings and .format).
LOOP_CNN = """
import tensorflow as tf

def loop_cnn(images, training):
    net = images
    # Two conv blocks.
    for k, (filters, stride) in enumerate(zip([4, 6], (1, 2))):
        net = tf.compat.v1.layers.conv2d(net, filters, 3, strides=stride, padding='same',
                                         use_bias=False, name='conv%d' % (k + 1))
        net = tf.compat.v1.layers.batch_normalization(net, momentum=0.5, training=training,
                                                      name=f'bn{k + 1}')
        net = tf.nn.relu(net)
    net = tf.compat.v1.layers.flatten(net)
    for i in range(2):
        if i == 1:
            net = tf.compat.v1.layers.dense(net, NUM_CLASSES, name='logits')
        else:
            net = tf.compat.v1.layers.dense(net, 5, activation=tf.nn.tanh,
                                            name='fc_{}'.format(i + 1))
    return net
"""
# slim's normalizer_fn / normalizer_params (a frozen batch norm on 4-D and on 2-D inputs),
# arg_scopes from a function and in the model function, slim.repeat, a dropout and a mean pool
# between layers, variance-scaling initializers.
SLIM_NORMALIZED = """
import tensorflow as tf
import tf_slim as slim

def net_arg_scope(weight_decay=0.01, bn_decay=0.9):
    batch_norm_params = {'decay': bn_decay, 'epsilon': 0.01}
    with slim.arg_scope([slim.conv2d, slim.fully_connected],
                        weights_initializer=slim.variance_scaling_initializer(),
                        weights_regularizer=slim.l2_regularizer(weight_decay),
                        normalizer_fn=slim.batch_norm, normalizer_params=batch_norm_params):
        with slim.arg_scope([slim.max_pool2d], padding='SAME') as sc:
            return sc

def net(images, is_training, scope='Net'):
    with tf.compat.v1.variable_scope(scope, 'Net', [images]):
        with slim.arg_scope(net_arg_scope(bn_decay=0.5)):
            with slim.arg_scope([slim.conv2d], activation_fn=tf.nn.relu6,
                                normalizer_params={'is_training': is_training, 'decay': 0.5}):
                net = slim.conv2d(images, 4, [3, 3], scope='conv1', normalizer_params={
                    'is_training': is_training, 'trainable': False})
                net = slim.max_pool2d(net, [3, 3], scope='pool1')
                net = slim.repeat(net, 2, slim.conv2d, 5, [3, 3], scope='conv2')
            net = tf.reduce_mean(net, [1, 2], name='global_pool')
            net = slim.fully_connected(net, 6, scope='fc1', normalizer_params={
                'is_training': is_training, 'trainable': False, 'decay': 0.5})
            net = slim.dropout(net, 1.0, is_training=is_training, scope='dropout')
            logits = slim.fully_connected(net, NUM_CLASSES, activation_fn=None,
                                          normalizer_fn=None, scope='logits')
    return logits
"""
CASES = [
    dict(source=SLIM_NORMALIZED, function="net", shape=[4, 6, 6, 2], training_kw="is_training",
         glorot=False),
    dict(source=SLIM_MLP, function="mlp", shape=[8, 5], training_kw="is_training"),
    dict(source=LAYERS_CNN, function="cnn", shape=[4, 6, 6, 2], training_kw="training", dropout=True),
    dict(source=LAYERS_MLP, function="model", shape=[8, 5], training_kw="training"),
    dict(source=SLIM_CNN, function="convnet", shape=[4, 6, 6, 2], training_kw="is_training"),
    dict(source=LOOP_CNN, function="loop_cnn", shape=[4, 6, 6, 2], training_kw="training"),
]  # fmt: skip


def _convert(source: str, function: str) -> emit.KerasModel:
    return convert(textwrap.dedent(source), function)


@pytest.fixture(scope="module")
def numerics() -> dict:
    return run_numerics("keras_model_numerics.py", CASES, TF_USE_LEGACY_KERAS="1")


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(CASES)), ids=[c["function"] for c in CASES])
def test_keras_model_computes_what_the_legacy_function_did(numerics, index):
    result = numerics["cases"][index]
    assert result["unmapped"] == [], result["source"]  # every legacy variable has a Keras weight
    assert result["eval"] < 1e-5, result
    if result["train"] is not None:  # dropout's masks are random on both sides
        assert result["train"] < 1e-5, result
    if result["statistics"]:
        assert result["statistics_moved"]  # decay 0.5: the update is visible
        assert max(result["statistics"].values()) < 1e-5, result
    if result["regularization"] is not None:
        assert result["regularization"] < 1e-6, result
    assert result["trainable"] == [], result["trainable"]  # the same variables are trained
    for name, value in result["init"].items():
        if isinstance(value, list):  # glorot-uniform kernels: within the limit, near it
            assert all(0.5 < v <= 1.0 + 1e-6 for v in value), (name, value)
        else:  # biases, beta/gamma, moving statistics: the same start
            assert value == 0.0, (name, value)


@pytest.mark.slow
def test_variance_scaling_initializer_draws_like_slims(numerics):
    # slim: a normal truncated at 2 stddev, of stddev sqrt(1.3 * 2 / fan_in); 36,864 draws.
    assert numerics["variance_scaling"]["std"] < 0.02, numerics["variance_scaling"]
    assert numerics["variance_scaling"]["max"] < 0.02, numerics["variance_scaling"]


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


NN_DROPOUT = """
import tensorflow as tf

def classifier(x, keep_prob):
    h = tf.contrib.layers.fully_connected(x, 64, scope='hidden')
    h = tf.nn.dropout(h, keep_prob)
    h = tf.nn.dropout(h, keep_prob=KEEP + 0.1, name='second')
    h = tf.nn.dropout(x=h, rate=0.25)
    return tf.contrib.layers.fully_connected(h, 5, activation_fn=None, scope='out')
"""


def test_tf1_nn_dropout_is_a_dropout_layer_active_in_every_mode():
    model = _convert(NN_DROPOUT, "classifier")
    dropouts = [layer.constructor for layer in model.layers if "Dropout" in layer.constructor]
    # TF1's second argument is the keep probability; a compound one keeps its grouping.
    assert dropouts == [
        "keras.layers.Dropout(1 - keep_prob)",
        'keras.layers.Dropout(1 - (KEEP + 0.1), name="second")',
        "keras.layers.Dropout(0.25)",
    ]
    assert model.init_params == ["keep_prob"]  # a constructor argument, not a call() input
    # tf.nn.dropout has no training flag: it dropped in evaluation too
    assert "h = self.dropout(h, training=True)" in model.source
    assert "h = self.second(h, training=True)" in model.source
    assert model.training_param is None and emit.DROPOUT_NOTE in model.notes


def test_tf2_nn_dropout_and_a_dropout_computed_by_a_call_are_refused():
    v2 = NN_DROPOUT.replace("tf.nn.dropout(h, keep_prob)", "tf.compat.v2.nn.dropout(h, 0.5)")
    with pytest.raises(emit.NotConvertible, match="its second argument is the rate"):
        _convert(v2, "classifier")
    called = NN_DROPOUT.replace("dropout(h, keep_prob)", "dropout(h, min(keep_prob, 1))")
    with pytest.raises(emit.NotConvertible, match="computed by a call"):
        _convert(called, "classifier")


def test_slim_normalizers_arg_scopes_and_repeat_as_slim_applies_them():
    net = _convert(SLIM_NORMALIZED, "net")
    by_name = {layer.name: layer.constructor for layer in net.layers}
    # An explicit normalizer_params replaces the arg_scope's dict whole: slim's defaults.
    assert by_name["conv1_BatchNorm"] == (
        "TF1BatchNorm(unbiased_ranks=(2, 4), frozen=True, momentum=0.999, epsilon=0.001, "
        'center=True, scale=False, name="conv1_BatchNorm")'
    )
    # The inner arg_scope's dict replaced the outer one's (epsilon 0.01 gone); its
    # activation_fn applies to every repetition of slim.repeat.
    assert "momentum=0.5, epsilon=0.001" in by_name["conv2_2_BatchNorm"]
    assert "frozen" not in by_name["conv2_2_BatchNorm"]
    assert by_name["pool1"] == 'keras.layers.MaxPooling2D([3, 3], 2, padding="same", name="pool1")'
    assert "use_bias=False" in by_name["conv2_1"] and "activation" not in by_name["conv2_1"]
    assert "kernel_regularizer=keras.regularizers.L2(0.5 * 0.01)" in by_name["logits"]
    assert "use_bias" not in by_name["logits"]  # normalizer_fn=None: slim's bias again
    assert by_name["dropout"] == 'keras.layers.Dropout(1 - 1.0, name="dropout")'
    assert net.scope == "Net" and net.scope_param == "scope" and net.init_params == []
    assert (
        "        net = self.conv2_2_BatchNorm(net, training=training)\n"
        "        net = tf.nn.relu6(net)\n"
    ) in net.source
    mapping = net.variables("", "Net")
    assert mapping["Net/conv2/conv2_2/BatchNorm/beta"] == "Net/conv2_2_BatchNorm/beta"
    assert [n for n in mapping if n.startswith("Net/fc1/")] == [
        "Net/fc1/weights",
        "Net/fc1/BatchNorm/beta",
        "Net/fc1/BatchNorm/moving_mean",
        "Net/fc1/BatchNorm/moving_variance",
    ]


def test_literal_loops_are_unrolled_with_their_layer_names():
    model = _convert(LOOP_CNN, "loop_cnn")
    by_name = {layer.name: layer.constructor for layer in model.layers}
    assert by_name["conv2"] == (
        'keras.layers.Conv2D(6, 3, strides=2, padding="same", use_bias=False, name="conv2")'
    )
    assert by_name["bn2"].startswith("TF1BatchNorm(unbiased_ranks=(4,), momentum=0.5")
    assert by_name["fc_1"] == 'keras.layers.Dense(5, activation="tanh", name="fc_1")'
    assert (
        "fc_2" not in by_name
        and by_name["logits"] == 'keras.layers.Dense(NUM_CLASSES, name="logits")'
    )
    assert list(model.variables("", "m"))[:3] == ["conv1/kernel", "bn1/gamma", "bn1/beta"]
    # call(): the iterations written out, the loop's comment kept before the first one.
    assert (
        "        net = images\n"
        "        # Two conv blocks.\n"
        "        net = self.conv1(net)\n"
        "        net = self.bn1(net, training=training)\n"
        "        net = tf.nn.relu(net)\n"
        "        net = self.conv2(net)\n"
    ) in model.source
    assert "for " not in model.source and "if " not in model.source
    # The manifest's legacy names read the loop the same way.
    module = cst.parse_module(textwrap.dedent(LOOP_CNN))
    reader = VariableNames(module, NameResolver.for_module(module).qualify)
    names = reader.run([cst.parse_statement("logits = loop_cnn(images, True)")])
    assert names == list(model.variables("", "m"))


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("'conv%d' % (k + 1)", "'conv3'"),
        ("'%s_%d' % ('block', k)", "'block_2'"),
        ("f'bn{k:02d}_{name!s}'", "'bn02_x'"),
        ("'fc_{}_{n}'.format(k * 2, n=name)", "'fc_4_x'"),
        ("str(k) + name", "'2x'"),
        ("[k, -k, k / 4]", "[2, -2, 0.5]"),
        ("k > 1 and name == 'x'", "True"),
        ("'x' * k", "'x' * 2"),  # sequence repetition is not folded
        ("size(k)", "size(2)"),  # nor calls of anything else
    ],
)
def test_loop_expressions_fold_to_literals(expression, value):
    loop = cst.parse_statement(f"for k, name in [(2, 'x')]:\n    y = {expression}\n")
    [statement] = unroll(loop)  # type: ignore[arg-type]
    assert cst.Module([]).code_for_node(statement.body[0].value) == value


def test_manifest_names_come_from_the_conversion_table():
    """VariableNames (the manifest's legacy names) reads layer calls through the Keras
    conversion's mapping: the same names, arg_scopes applied, trainability included."""
    module = cst.parse_module(textwrap.dedent(SLIM_NORMALIZED))
    qualify = NameResolver.for_module(module).qualify
    reader = VariableNames(module, qualify)
    names = reader.run([cst.parse_statement("logits = net(images, True)")])
    assert names == list(_convert(SLIM_NORMALIZED, "net").variables("", "Net"))
    frozen = {"Net/conv1/BatchNorm/beta", "Net/fc1/BatchNorm/beta"}
    moving = {n for n in names if "/moving_" in n}
    assert reader.non_trainable == frozen | moving


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            "net = tf.compat.v1.layers.batch_normalization(x, training=t, trainable=False, name='bn')",
            "`trainable=`",  # Keras 3's trainable=False is inference mode: never mapped
        ),
        ("net = tf.compat.v1.layers.dense(x, 4)", "without a literal name"),
        ("net = tf.compat.v1.get_variable('w', [4])", "a call Keras layers do not cover"),
        ("net = slim.fully_connected(x, 4, normalizer_fn=slim.layer_norm, scope='fc')", "normalizer_fn other than"),
        ("net = slim.conv2d(x, 4, 3, scope='c', normalizer_fn=slim.batch_norm, normalizer_params=p)", "not a literal dict"),
        ("net = slim.repeat(x, k, slim.conv2d, 4, 3, scope='c')", "count that is not a literal"),
        ("for k in range(t):\n        x = tf.compat.v1.layers.dense(x, 4, name='fc%d' % k)", "other than a literal list"),
        ("for k in [1, 2]:\n        x = tf.compat.v1.layers.dense(x, 4, name='fc%d' % k)\n    net = k", "outside its `for` loop"),
        ("for k in [1, 2]:\n        x = tf.compat.v1.layers.dense(x, 4, name='fc%d' % k)\n        break", "break"),
        ("for k in [1, 2]:\n        x = tf.compat.v1.layers.dense(x, 4, name='fc%d' % t)", "literal identifier, in a `for` loop"),
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


# A conv tower program (one table of layer variables: the manifest lists every conv, batch-norm
# and dense variable), converted by the CLI and verified on 2 logical CPU devices.
CONV_TOWERS = '''"""A small convnet trained on N towers: slim conv + batch norm under an arg_scope, tf.layers
pooling / conv / dense, a global mean pool; the first tower's batch-norm updates; averaged
gradients; Momentum."""
import argparse

import numpy as np
import tensorflow as tf

slim = tf.contrib.slim

NUM_EXAMPLES = 256


def make_dataset(seed=5):
  rng = np.random.RandomState(seed)
  x = (rng.randn(NUM_EXAMPLES, 8, 8, 3) * 1.5 + 0.3).astype(np.float32)
  y = (x.mean(axis=(1, 2, 3)) > 0.3).astype(np.int64) + (x[:, 0, 0, 0] > 0).astype(np.int64)
  return x, y


def convnet(images, is_training):
  with slim.arg_scope([slim.conv2d], normalizer_fn=slim.batch_norm,
                      normalizer_params={'is_training': is_training, 'decay': 0.9}):
    net = slim.conv2d(images, 4, [3, 3], scope='conv1')
    net = tf.layers.max_pooling2d(net, 2, 2, name='pool1')
    net = slim.conv2d(net, 6, [3, 3], activation_fn=tf.nn.tanh, scope='conv2')
  net = tf.layers.conv2d(net, 8, 3, activation=tf.nn.relu, name='conv3')
  net = tf.reduce_mean(net, [1, 2], name='global_pool')
  return tf.layers.dense(net, 3, name='logits')


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--num_gpus', type=int, default=2)
  parser.add_argument('--batch_size', type=int, default=8, help='per GPU')
  parser.add_argument('--steps', type=int, default=50)
  args = parser.parse_args()

  x_all, y_all = make_dataset()
  global_batch = args.batch_size * args.num_gpus
  images = tf.placeholder(tf.float32, [global_batch, 8, 8, 3])
  labels = tf.placeholder(tf.int64, [global_batch])
  image_splits = tf.split(images, args.num_gpus)
  label_splits = tf.split(labels, args.num_gpus)
  opt = tf.train.MomentumOptimizer(0.05, momentum=0.9)
  tower_grads = []
  for i in range(args.num_gpus):
    with tf.device('/gpu:%d' % i), tf.name_scope('tower_%d' % i) as scope:
      with tf.variable_scope('net', reuse=i > 0):
        logits = convnet(image_splits[i], is_training=True)
      loss = tf.losses.sparse_softmax_cross_entropy(labels=label_splits[i], logits=logits,
                                                    scope='xent')
      if i == 0:
        bn_updates = tf.get_collection(tf.GraphKeys.UPDATE_OPS, scope)
      tower_grads.append(opt.compute_gradients(loss))
  averaged = []
  for grads_and_vars in zip(*tower_grads):
    grad = tf.reduce_mean(tf.stack([g for g, _ in grads_and_vars]), axis=0)
    averaged.append((grad, grads_and_vars[0][1]))
  apply_op = opt.apply_gradients(averaged)
  train_op = tf.group(apply_op, *bn_updates)

  with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    for step in range(args.steps):
      start = (step * global_batch) % NUM_EXAMPLES
      feed = {images: x_all[start:start + global_batch], labels: y_all[start:start + global_batch]}
      _, loss_value = sess.run([train_op, loss], feed_dict=feed)
      if step % 10 == 0:
        print('step %d loss %.4f' % (step, loss_value))


if __name__ == '__main__':
  main()
'''


@pytest.mark.slow
def test_conv_tower_program_converts_and_verifies(cli, tmp_path):
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "train.py").write_text(CONV_TOWERS)
    out = tmp_path / "out"
    result = cli("rewrite", "--out", out, legacy)
    assert result.returncode == 1, result
    code = (out / "train.py").read_text()
    assert "class Convnet(keras.Model):" in code and "TF1Variables" not in code
    program = code.split('"""', 2)[2]  # after the module docstring
    assert "tf_slim" not in code and "tf_keras" not in code and "arg_scope" not in program
    variables = json.loads((out / "tfmigrate.json").read_text())["files"]["train.py"]["variables"]
    assert variables == {
        "net/conv1/weights": "net/conv1/kernel",
        "net/conv1/BatchNorm/beta": "net/conv1_BatchNorm/beta",
        "net/conv1/BatchNorm/moving_mean": "net/conv1_BatchNorm/moving_mean",
        "net/conv1/BatchNorm/moving_variance": "net/conv1_BatchNorm/moving_variance",
        "net/conv2/weights": "net/conv2/kernel",
        "net/conv2/BatchNorm/beta": "net/conv2_BatchNorm/beta",
        "net/conv2/BatchNorm/moving_mean": "net/conv2_BatchNorm/moving_mean",
        "net/conv2/BatchNorm/moving_variance": "net/conv2_BatchNorm/moving_variance",
        "net/conv3/kernel": "net/conv3/kernel",
        "net/conv3/bias": "net/conv3/bias",
        "net/logits/kernel": "net/logits/kernel",
        "net/logits/bias": "net/logits/bias",
    }
    again = cli("rewrite", "--write", "--allow-dirty", out)
    assert " yes " not in again.stdout and (out / "train.py").read_text() == code
    verified = subprocess.run(
        [sys.executable, "-m", "tfmigrate", "verify", str(legacy / "train.py"),
         str(out / "train.py"), "--replicas", "2", "--steps", "3"],
        capture_output=True, text=True, timeout=600, env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    report = verified.stdout
    assert verified.returncode == 0 and "EQUIVALENT" in report, report + verified.stderr
    assert not re.findall(r"^(?:FAIL|DIVERGED|UNMATCHED)", report, re.M), report
    assert re.search(r"^PASS\W+xent/value \(tower 1\)", report, re.M), report  # the loss
    assert len(re.findall(r"^PASS\W+net/conv\d/", report, re.M)) == 10, report


def test_imported_model_it_cannot_map_is_kept_with_file_and_line(cli, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURES / "slim_towers", repo)
    model = repo / "nets" / "small_net.py"
    model.write_text(
        model.read_text().replace("slim.conv2d(net, 128", "slim.separable_conv2d(net, 128")
    )
    out = tmp_path / "out"
    cli("rewrite", "--out", out, repo)
    files = json.loads((out / "tfmigrate.json").read_text())["files"]
    [note] = [n for n in files["train_clones.py"]["notes"] if "not converted to Keras" in n]
    assert "`slim.separable_conv2d` (small_net.py, line 33)" in note
    assert "import tf_slim" in (out / "nets" / "small_net.py").read_text()  # kept, consistently
    assert "class TF1Variables" in (out / "train_clones.py").read_text()


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


def test_arg_scope_function_around_the_call_is_read_and_goes():
    legacy = _tower_program(
        """
        slim = tf.contrib.slim


        def net_arg_scope(weight_decay=0.001):
            with slim.arg_scope([slim.fully_connected], activation_fn=None,
                                weights_regularizer=slim.l2_regularizer(weight_decay)) as sc:
                return sc


        def net(x):
            return slim.fully_connected(x, 2, biases_initializer=None, scope='fc')
        """,
        "                with slim.arg_scope(net_arg_scope(weight_decay=0.01)):\n"
        "                    pred = net(x_splits[i])\n"
        "            loss = tf.reduce_mean(tf.square(pred - y_splits[i]), name='loss')\n",
    )
    fixed = process_source(
        legacy, "train.py", Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    )
    code = fixed.new_code
    # activation_fn=None and the regularizer from the arg_scope, with the call's weight decay
    assert (
        '2, use_bias=False, kernel_regularizer=keras.regularizers.L2(0.5 * 0.01), name="fc")'
    ) in code
    assert "arg_scope" not in code and "slim" not in code and "pred = net(x)" in code
    assert fixed.manifest["variables"] == {"model/fc/weights": "model/fc/kernel"}


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


_BN_ARG_SCOPE = """
slim = tf.contrib.slim


def net_arg_scope(is_training=True):
    with slim.arg_scope([slim.batch_norm], is_training=is_training, decay=0.5) as sc:
        return sc


def net(x, is_training=True):
    h = slim.fully_connected(x, 3, normalizer_fn=slim.batch_norm, scope='fc1')
    h = slim.dropout(h, 0.5, is_training=is_training, scope='dropout')
    return slim.fully_connected(h, 2, activation_fn=None, scope='logits')
"""


@pytest.mark.parametrize(
    ("arg_scope", "call", "fc1_bn", "tower"),
    [
        # tf_slim applies an arg_scope only to the calls made under it: the towers' True is
        # the training call's mode, so it follows Keras' `training`, which the towers pass.
        ("net_arg_scope()", "net(x_splits[i])", "training=training", "net(x, training=True)"),
        ("net_arg_scope(is_training=True)", "net(x_splits[i], is_training=True)",
         "training=training", "net(x, training=True)"),
        # False: slim normalized with the moving statistics and did not update them, in
        # training too: inference mode, whatever `training` the model is called with.
        ("net_arg_scope(is_training=False)", "net(x_splits[i])", "training=False",
         "net(x, training=True)"),
        # The call's own flag is False (dropout off) but the arg_scope trains the batch norm:
        # one `training` cannot say both, so the batch norm's True stays fixed.
        ("net_arg_scope()", "net(x_splits[i], is_training=False)", "training=True",
         "net(x, training=False)"),
    ],
)  # fmt: skip
def test_training_flag_from_the_towers_arg_scope(arg_scope, call, fc1_bn, tower):
    legacy = _tower_program(
        _BN_ARG_SCOPE,
        f"                with slim.arg_scope({arg_scope}):\n"
        f"                    pred = {call}\n"
        "            loss = tf.reduce_mean(tf.square(pred - y_splits[i]), name='loss')\n",
    )
    fixed = process_source(
        legacy, "train.py", Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    )
    code = fixed.new_code
    assert "class Net(keras.Model):" in code and "arg_scope" not in code
    assert "def call(self, x, training=False):" in code
    assert f"h = self.fc1_BatchNorm(h, {fc1_bn})" in code
    assert "h = self.dropout(h, training=training)" in code
    assert f"pred = {tower}" in code
    compile(code, "train.py", "exec")


def test_training_flag_of_an_arg_scope_without_a_model_flag():
    """A model with no training parameter of its own: the towers' arg_scope True becomes one
    (the towers pass training=True); a literal False keeps the model in inference mode."""
    model = """
        slim = tf.contrib.slim


        def net(x):
            return slim.batch_norm(slim.fully_connected(x, 2, scope='fc'), scope='bn')
        """
    codes = {}
    for flag in ("True", "False"):
        legacy = _tower_program(
            model,
            f"                with slim.arg_scope([slim.batch_norm], is_training={flag}):\n"
            "                    pred = net(x_splits[i])\n"
            "            loss = tf.reduce_mean(tf.square(pred - y_splits[i]), name='loss')\n",
        )
        settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
        codes[flag] = process_source(legacy, "train.py", settings).new_code
    assert "def call(self, x, training=False):" in codes["True"]
    assert "return self.bn(self.fc(x), training=training)" in codes["True"]
    assert "pred = net(x, training=True)" in codes["True"]
    assert "def call(self, x):" in codes["False"]
    assert "return self.bn(self.fc(x), training=False)" in codes["False"]
    assert "pred = net(x)\n" in codes["False"]
