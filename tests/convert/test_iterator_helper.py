"""An input helper that makes the TF1 iterator: ``features, iterator = first_batch(dataset)``,
the helper calling ``dataset.make_initializable_iterator()`` (inside a try, as Estimator-era
input code did) and returning ``iterator.get_next()`` with the iterator. The converted program
iterates the dataset itself and passes each batch to the train step."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import run_cli

PROGRAM = """\
import numpy as np
import tensorflow as tf


def make_dataset(batch_size):
    data = np.arange(64 * 4, dtype=np.float32).reshape([64, 4]) / 256.0
    return tf.data.Dataset.from_tensor_slices({'x': data}).repeat().batch(batch_size)


def first_batch(dataset):
    # a Dataset, or something that already is a batch
    try:
        iterator = dataset.make_initializable_iterator()
    except AttributeError:
        pass
    else:
        dataset = iterator.get_next()
    return dataset, iterator


def average_gradients(tower_grads):
    averaged = []
    for grad_and_vars in zip(*tower_grads):
        grad = tf.reduce_mean(tf.stack([g for g, _ in grad_and_vars]), 0)
        averaged.append((grad, grad_and_vars[0][1]))
    return averaged


def main():
    num_gpus = 2
    features, iterator = first_batch(make_dataset(8 * num_gpus))
    splits = tf.split(features['x'], num_gpus, axis=0)
    opt = tf.train.GradientDescentOptimizer(0.1)
    tower_grads = []
    for i in range(num_gpus):
        with tf.device('/gpu:%d' % i):
            with tf.variable_scope('net', reuse=i > 0):
                w = tf.get_variable('w', [4, 1])
                loss = tf.reduce_mean(tf.square(tf.matmul(splits[i], w) - 1.0))
                tower_grads.append(opt.compute_gradients(loss))
    train_op = opt.apply_gradients(average_gradients(tower_grads))
    with tf.Session(config=tf.ConfigProto(allow_soft_placement=True)) as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(iterator.initializer)
        for step in range(3):
            _, value = sess.run([train_op, loss])
            print('step', step, 'loss', float(value))


if __name__ == '__main__':
    main()
"""


def _rewrite(tmp_path: Path) -> tuple[dict, Path]:
    folder = tmp_path / "program"
    folder.mkdir()
    (folder / "train.py").write_text(PROGRAM)
    out = tmp_path / "out"
    result = run_cli("rewrite", "--unsafe-fixes", "--out", out, "--format", "json", folder)
    (finding,) = [f for f in json.loads(result.stdout)["findings"] if f["code"] == "TFM303"]
    return finding, out / "train.py"


def test_the_batch_of_an_iterator_helper_is_the_train_steps_argument(tmp_path):
    finding, written = _rewrite(tmp_path)
    assert finding["applied"], finding["message"]
    source = written.read_text()
    tree = ast.parse(source)
    (main,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    (step,) = [n for n in ast.walk(main) if isinstance(n, ast.FunctionDef) and n.decorator_list]
    assert [a.arg for a in step.args.args] == ["features"]
    # what read the batch before the towers reads it in the step
    assert "splits = tf.split(features['x'], num_gpus, axis=0)" in ast.unparse(step)
    code = ast.unparse(main)
    assert "iterator = iter(make_dataset(8 * num_gpus))" in code
    assert "train_step(features=next(iterator))" in code
    # the helper that made the TF1 iterator is called by nothing now: commented out, named
    assert "make_initializable_iterator" not in ast.unparse(tree)
    assert "`first_batch` made a TF1 iterator of the dataset" in source
    assert "Session" not in code


def test_the_converted_program_trains_on_the_datasets_batches(tmp_path):
    _, written = _rewrite(tmp_path)
    proc = subprocess.run(
        [sys.executable, str(written)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    losses = [float(line.split()[-1]) for line in proc.stdout.splitlines() if "loss" in line]
    assert len(losses) == 3
    assert losses[0] != losses[1]  # each step reads another batch and updates the weights


def test_a_helper_that_returns_something_else_is_not_read_as_an_iterator(tmp_path):
    # returns the dataset itself when it has no iterator method: not an iterator helper
    program = textwrap.dedent(PROGRAM).replace(
        "    return dataset, iterator\n", "    return dataset, None\n"
    )
    folder = tmp_path / "program"
    folder.mkdir()
    (folder / "train.py").write_text(program)
    out = tmp_path / "out"
    run_cli("rewrite", "--unsafe-fixes", "--out", out, folder)
    written = out / "train.py"
    assert written.exists()
    assert "first_batch(" in written.read_text()
