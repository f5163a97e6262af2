"""The TensorFlow data files, their loader, and the rules built on them (TFM205, TFM301, TFM302)."""

from __future__ import annotations

import gzip
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tfmigrate import tfapi
from tfmigrate.engine import Settings, process_source
from tfmigrate.registry import all_rules

REPO = Path(__file__).resolve().parents[1]


def test_data_records_versions():
    assert tfapi.versions()["tensorflow"].startswith("2.")
    assert tfapi.upgrade_tables()["tensorflow_version"] == tfapi.versions()["tensorflow"]


def test_upgrade_tables_have_known_entries():
    assert tfapi.rename("tf.Session") == "tf.compat.v1.Session"
    assert tfapi.rename("tf.log") == "tf.math.log"
    # Chains are resolved at generation time, so one fix pass is enough.
    assert tfapi.rename("tf.nn.max_pool_v2") == "tf.nn.max_pool2d"
    assert tfapi.keyword_renames("tf.reduce_mean")["keep_dims"] == "keepdims"
    assert tfapi.reorder("tf.argmax")[2] == "name"
    assert tfapi.is_transformed("tf.nn.dropout")
    assert tfapi.module_deprecation("tf.contrib.layers.conv2d")[0] == "tf.contrib"
    assert "LayerNormalization" in tfapi.warning("tf.contrib.layers.layer_norm")


def test_api_has_known_entries():
    assert tfapi.exists("tf.distribute.MirroredStrategy") is True
    assert tfapi.exists("tf.distribute.MirroredStrategy.run") is True
    assert tfapi.exists("tf.distribute.MirroredStrategy.unwrap_model") is False
    assert tfapi.exists("tf.Session") is False
    assert tfapi.exists("tf.compat.v1.Session") is True
    assert tfapi.exists("tf.contrib") is False
    assert tfapi.exists("numpy.mean") is None
    predict = tfapi.lookup("keras.Model.predict")
    assert predict is not None and predict.accepts_keyword("training") is False
    assert predict.accepts_keyword("batch_size") is True
    assert tfapi.lookup("tf.keras.Model") is not None
    assert tfapi.needs_legacy_keras("tf.compat.v1.layers.dense")
    assert tfapi.compat_v1_only("tf.layers.dense") == "tf.compat.v1.layers.dense"
    assert tfapi.tf_slim_name("tf.contrib.layers.conv2d") == "tf_slim.layers.conv2d"


def test_loader_does_not_import_tensorflow():
    code = (
        "import sys\nfrom tfmigrate import tfapi\nassert tfapi.exists('tf.nn.conv2d')\n"
        "assert 'tensorflow' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_data_files_are_small():
    assert (tfapi.API_FILE.stat().st_size + tfapi.UPGRADE_FILE.stat().st_size) < 1_000_000


TF1_TOWER_SCRIPT = """
import numpy as np
import tensorflow as tf
slim = tf.contrib.slim

FLAGS = tf.app.flags.FLAGS


def model(images, is_training):
    net = slim.conv2d(images, 16, [3, 3], scope='conv1')
    net = tf.contrib.layers.batch_norm(net, is_training=is_training, trainable=False)
    net = tf.reduce_mean(net, reduction_indices=[1, 2], keep_dims=False)
    net = tf.nn.dropout(net, 0.5)
    return tf.layers.dense(net, 10)


def average_gradients(tower_grads):
    average = []
    for grads_and_vars in zip(*tower_grads):
        grads = [tf.expand_dims(g, 0) for g, _ in grads_and_vars]
        grad = tf.reduce_mean(tf.concat(axis=0, values=grads), 0)
        average.append((grad, grads_and_vars[0][1]))
    return average


def train():
    images = tf.placeholder(tf.float32, [None, 8, 8, 3])
    labels = tf.placeholder(tf.int64, [None])
    opt = tf.train.MomentumOptimizer(0.1, 0.9)
    tower_grads = []
    for i in range(2):
        with tf.device('/gpu:%d' % i), tf.name_scope('tower_%d' % i):
            logits = model(images, True)
            loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
            tf.get_variable_scope().reuse_variables()
            tower_grads.append(opt.compute_gradients(loss))
    update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
    with tf.control_dependencies(update_ops):
        train_op = opt.apply_gradients(average_gradients(tower_grads))
    config = tf.ConfigProto(allow_soft_placement=True)
    config.gpu_options.allow_growth = True
    with tf.Session(config=config) as sess:
        sess.run(tf.global_variables_initializer())
        for step in range(10):
            x = np.zeros((4, 8, 8, 3), np.float32)
            _, value = sess.run([train_op, loss], feed_dict={images: x, labels: np.zeros(4)})
            if step % 5 == 0:
                tf.logging.info('step %d loss %f', step, value)
"""


def test_all_rules_together_on_a_tf1_script():
    source = textwrap.dedent(TF1_TOWER_SCRIPT).lstrip()
    settings = Settings(rules=all_rules(), fix=True)
    result = process_source(source, "train.py", settings)
    assert result.error is None
    codes = {f.code for f in result.findings}
    assert {"TFM301", "TFM302"} <= codes
    assert "TFM205" not in codes  # TF1 code
    out = result.new_code
    assert out is not None
    compile(out, "train.py", "exec")
    # TFM303's staged converter takes the towers: the placeholders are the train step's
    # arguments; the rest is on tf.compat.v1 spellings (TFM301)
    assert "def train_step(images, labels)" in out and "tf.compat.v1.placeholder" not in out
    assert "tf.compat.v1.train.MomentumOptimizer" in out
    assert "keepdims=False" in out
    assert "tf.Session(" not in out and "tf.placeholder(" not in out
    # Renamed names stay matchable by the structural rules: what they found and did not fix
    # themselves, they still find after the renames.
    pending = {f.code for f in result.findings if not f.applied and not f.code.startswith("TFM3")}
    after = {f.code for f in process_source(out, "train.py", Settings(rules=all_rules())).findings}
    if any(f.code == "TFM303" and f.applied for f in result.findings):
        assert "TFM101" not in after  # the towers became the train step
    else:
        assert pending <= after
    # A second rewrite is a no-op.
    assert process_source(out, "train.py", settings).new_code is None


def test_tf2_script_gets_tfm205_only():
    source = textwrap.dedent(
        """
        import tensorflow as tf
        strategy = tf.distribute.MirroredStrategy()
        with strategy.scope():
            model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        model.fit(x, y, epochs=1)
        single = strategy.unwrap_model(model)
        y = model.predict(x, training=False)
        """
    ).lstrip()
    result = process_source(source, "x.py", Settings(rules=all_rules(), fix=True))
    found = [(f.line, f.code) for f in result.findings if f.code.startswith(("TFM205", "TFM3"))]
    assert found == [(6, "TFM205"), (7, "TFM205")]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs TensorFlow")
def test_committed_data_matches_installed_tensorflow(tmp_path):
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "generate_tf_api_data.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    for name in ("tf_upgrade_v2.json", "tf_api.json.gz"):
        new, old = (tmp_path / name).read_bytes(), (tfapi.DATA / name).read_bytes()
        if name.endswith(".gz"):  # compare content, not zlib's byte choices
            new, old = gzip.decompress(new), gzip.decompress(old)
        assert new == old, f"{name} drifted: rerun scripts/generate_tf_api_data.py"
