"""The TF2 spellings a converted program's kept TF1 code gets (rules/tower_program.py): TF1 RNN
cells from tf_keras, contrib.layers' initializers from tf_slim, `flags = tf.app.flags` as absl's
flags; and the converter's variable store making an RNN's variables inside a tf.function."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import libcst as cst

from tfmigrate.convert.emit import STORE
from tfmigrate.rules.tower_program import (
    _contrib_to_tf_slim,
    _model_module_flags,
    _v1_layers_to_tf_keras,
)

RNN_MODEL = """\
import tensorflow as tf


def encode(x):
    cell = tf.compat.v1.nn.rnn_cell.LSTMCell(8, num_proj=8)
    cell = tf.compat.v1.nn.rnn_cell.ResidualWrapper(cell)
    cell = tf.compat.v1.nn.rnn_cell.DropoutWrapper(cell, output_keep_prob=1.0)
    outputs, _ = tf.compat.v1.nn.dynamic_rnn(cell, x, dtype=tf.float32)
    return outputs
"""


def test_tf1_rnn_cells_come_from_tf_keras():
    module = _v1_layers_to_tf_keras(cst.parse_module(RNN_MODEL))
    code = module.code
    assert "from tf_keras.src.layers.rnn import legacy_cells as tf1_rnn_cells" in code
    assert (
        "from tf_keras.src.layers.rnn import legacy_cell_wrappers as tf1_rnn_cell_wrappers" in code
    )
    assert "tf1_rnn_cells.LSTMCell(8, num_proj=8)" in code
    assert "tf1_rnn_cell_wrappers.ResidualWrapper(cell)" in code
    assert "# tf.compat.v1 RNN cells need Keras 2: tf_keras carries them." in code
    assert "tf.compat.v1.nn.dynamic_rnn" in code  # TF's own, not Keras'


def test_an_rnn_s_variables_are_made_once_by_the_store_inside_a_train_step(tmp_path):
    """dynamic_rnn sets a caching device on its scope; eager variable creation refuses one."""
    model = _v1_layers_to_tf_keras(cst.parse_module(RNN_MODEL)).code
    script = (
        model
        + textwrap.dedent(STORE)
        + textwrap.dedent(
            """
            strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
            store = TF1Variables(strategy)

            @tf.function
            def step(x):
                with store.scope():
                    return encode(x)

            for _ in range(2):
                print(tuple(step(tf.ones([2, 3, 8])).shape), len(store.by_name))
            """
        )
    )
    (tmp_path / "rnn.py").write_text(script)
    run = subprocess.run(
        [sys.executable, str(tmp_path / "rnn.py")], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("\n")[-3:-1] == ["(2, 3, 8) 3", "(2, 3, 8) 3"], run.stdout


def test_contrib_layers_initializers_come_from_tf_slim_itself():
    source = (
        "import tensorflow as tf\n"
        "w = tf.get_variable('w', [3], initializer=tf.contrib.layers.xavier_initializer())\n"
        "y = tf.contrib.layers.conv2d(x, 4, 3)\n"
    )
    module = cst.parse_module(source)
    code = _contrib_to_tf_slim(module, module).code
    assert "initializer=tf_slim.xavier_initializer()" in code
    assert "y = tf_slim.layers.conv2d(x, 4, 3)" in code


def test_a_module_level_flags_alias_becomes_absl_s_flags():
    source = (
        "import tensorflow as tf\n"
        "flags = tf.app.flags\n"
        "flags.DEFINE_integer('max_steps', 5, 'steps')\n"
        "FLAGS = flags.FLAGS\n"
    )
    code = _model_module_flags(cst.parse_module(source)).code
    assert "from absl import flags\n" in code
    assert "flags = tf.app.flags" not in code
    assert "flags.DEFINE_integer('max_steps', 5, 'steps')" in code
