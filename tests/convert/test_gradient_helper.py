"""Towers whose gradients are taken in a function they call (fixtures/towers/gradient_helper, a
method returning the tower's losses and gradients, is verified in test_staged_conversion.py).
Here the variants, through the command line: a module-level function with ``tf.gradients`` whose
towers' gradients are summed, and a helper also called outside the towers (refused: its tape
would change that caller too)."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

from conftest import run_cli

SUMMED = """\
import numpy as np
import tensorflow as tf


def net(x):
    w = tf.get_variable('w', [4, 2])
    return tf.matmul(x, w)


def tower_gradients(x, scale):
    \"\"\"One tower: its loss and the gradients of its variables.\"\"\"
    loss = tf.reduce_mean(net(x)) * scale
    params = tf.trainable_variables()
    grads = tf.gradients(loss, params)
    return loss, grads


def sum_gradients(tower_grads):
    summed = []
    for grads in zip(*tower_grads):
        summed.append(tf.add_n(list(grads)))
    return summed


def main(num_gpus=2):
    x = tf.placeholder(tf.float32, [8, 4])
    splits = tf.split(x, num_gpus)
    opt = tf.train.GradientDescentOptimizer(0.1)
    tower_grads = []
    losses = []
    for i in range(num_gpus):
        with tf.device('/gpu:%d' % i):
            with tf.variable_scope(tf.get_variable_scope(), reuse=i > 0):
                loss, grads = tower_gradients(splits[i], 0.5)
                losses.append(loss)
                tower_grads.append(grads)
    params = tf.trainable_variables()
    train_op = opt.apply_gradients(zip(sum_gradients(tower_grads), params))
    total = tf.add_n(losses)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for step in range(3):
            _, value = sess.run([train_op, total], feed_dict={x: np.ones([8, 4], np.float32)})
            print(step, value)


if __name__ == '__main__':
    main()
"""

# the helper is called outside the towers as well
CALLED_TWICE = SUMMED.replace(
    "    total = tf.add_n(losses)\n",
    "    total = tf.add_n(losses)\n    eval_loss, _ = tower_gradients(x, 1.0)\n",
)


def _rewrite(tmp_path: Path, source: str) -> tuple[dict, str]:
    folder = tmp_path / "program"
    folder.mkdir()
    (folder / "train.py").write_text(textwrap.dedent(source))
    out = tmp_path / "out"
    result = run_cli("rewrite", "--unsafe-fixes", "--out", out, "--format", "json", folder)
    (finding,) = [f for f in json.loads(result.stdout)["findings"] if f["code"] == "TFM303"]
    written = out / "train.py"
    return finding, written.read_text() if written.exists() else ""


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    (found,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    return found


def test_a_module_function_taking_tf_gradients_gets_the_tape(tmp_path):
    finding, source = _rewrite(tmp_path, SUMMED)
    assert finding["applied"] and "TODO" not in finding["message"], finding["message"]
    tree = ast.parse(source)
    helper = _function(tree, "tower_gradients")
    docstring, tape, *rest = helper.body
    assert isinstance(docstring, ast.Expr)
    # the forward pass under the tape; summed towers: the loss is not scaled
    assert ast.unparse(tape.items[0]) == "tf.GradientTape() as tape"
    assert [ast.unparse(s) for s in tape.body] == [
        "loss = tf.reduce_mean(net(x)) * scale",
        "params = tape.watched_variables()",
    ]
    assert [ast.unparse(s) for s in rest] == [
        "grads = tape.gradient(loss, params)",
        "return (loss, grads)",
    ]
    # the tower calls it as before, in the replica function, and no tower loop is left
    (step,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.decorator_list]
    assert "loss, grads = tower_gradients(splits[i], 0.5)" in ast.unparse(step)
    assert "strategy.run" in ast.unparse(step) and "tf.device" not in ast.unparse(step)
    # bare gradients: the update still pairs them with the variables
    assert "opt.apply_gradients(zip(grads, params))" in ast.unparse(step)
    assert "Session" not in source and "placeholder" not in source
    compile(source, "train.py", "exec")


def test_a_helper_called_outside_the_towers_too_is_refused(tmp_path):
    finding, source = _rewrite(tmp_path, CALLED_TWICE)
    assert not finding["applied"]
    assert "no gradient call in the tower loop" in finding["message"], finding["message"]


FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "towers" / "gradient_helper"

# the step count resumes from a restored checkpoint, or starts at 0
RESUMED = (
    (FIXTURE / "train.py")
    .read_text()
    .replace(
        """            sess.run(tf.global_variables_initializer())
            for step in range(steps):
""",
        """            sess.run(tf.global_variables_initializer())
            if self._restore_path:
                try:
                    saver.restore(sess, self._restore_path)
                    first = sess.run(self._step) + 1
                except OSError:
                    first = 0
            else:
                first = 0
            for step in range(first, steps):
""",
    )
    .replace(
        "        self._train_op = optimizer.apply_gradients(grads)\n",
        "        self._step = tf.Variable(0, trainable=False)\n"
        "        self._train_op = optimizer.apply_gradients(grads)\n"
        "        self._restore_path = None\n",
    )
    .replace(
        "        config = tf.ConfigProto(allow_soft_placement=True)\n",
        "        config = tf.ConfigProto(allow_soft_placement=True)\n        saver = tf.train.Saver()\n",
    )
)


def test_a_value_bound_again_after_a_todo_keeps_the_loop_that_reads_it(tmp_path):
    assert "first = sess.run(self._step) + 1" in RESUMED
    finding, source = _rewrite(tmp_path, RESUMED)
    assert finding["applied"], finding["message"]
    # the restored step count has no TF2 form here; the other bindings keep `first` alive
    assert "# first = sess.run(self._step) + 1" in source
    assert "for step in range(first, steps):" in source
    assert "loss_value = self.train_step(input_x=batch_x, input_y=batch_y)" in source
    manifest = json.loads((tmp_path / "out" / "tfmigrate.json").read_text())
    assert "`first` is bound again at line" in json.dumps(manifest)
    compile(source, "train.py", "exec")
