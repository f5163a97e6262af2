"""Class-based trainers in the staged conversion: the towers built in one method of a class and
the step run by another (fixtures/towers/trainer_class is verified in test_staged_conversion.py).
Here the variants: a session kept on the object, batches from a one-shot iterator on the object,
and the object made and run by a function of the module outside its class (converted; an
object nothing in the project runs is refused, with the reason; one run from another module:
test_class_run_elsewhere.py)."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

from conftest import run_cli

HEAD = """\
import numpy as np
import tensorflow as tf


def net(x):
    w = tf.get_variable('w', [4, 2])
    return tf.matmul(x, w)


def average_gradients(tower_grads):
    averaged = []
    for grad_and_vars in zip(*tower_grads):
        grad = tf.reduce_mean(tf.stack([g for g, _ in grad_and_vars]), 0)
        averaged.append((grad, grad_and_vars[0][1]))
    return averaged
"""

SESSION_ON_THE_OBJECT = (
    HEAD
    + """

class Trainer(object):
    def __init__(self, num_gpus):
        data = np.ones([64, 4], np.float32)
        dataset = tf.data.Dataset.from_tensor_slices((data, data)).repeat().batch(8)
        self._x, self._y = dataset.make_one_shot_iterator().get_next()
        splits = tf.split(self._x * self._y, num_gpus)
        opt = tf.train.GradientDescentOptimizer(0.1)
        tower_grads = []
        losses = []
        for i in range(num_gpus):
            with tf.device('/gpu:%d' % i):
                with tf.variable_scope(tf.get_variable_scope(), reuse=i > 0):
                    loss = tf.reduce_mean(net(splits[i]))
                    losses.append(loss)
                    tower_grads.append(opt.compute_gradients(loss))
        self.loss = tf.add_n(losses) / num_gpus
        self._train_op = opt.apply_gradients(average_gradients(tower_grads))
        self._sess = tf.Session(config=tf.ConfigProto(allow_soft_placement=True))
        self._sess.run(tf.global_variables_initializer())

    def train(self, steps):
        for step in range(steps):
            _, value = self._sess.run([self._train_op, self.loss])
            print(step, value)
        self._sess.close()


if __name__ == '__main__':
    Trainer(2).train(3)
"""
)

RUN_FROM_OUTSIDE = (
    HEAD
    + """

class Model(object):
    def __init__(self, num_gpus):
        self.x = tf.placeholder(tf.float32, [8, 4])
        splits = tf.split(self.x, num_gpus)
        opt = tf.train.GradientDescentOptimizer(0.1)
        tower_grads = []
        for i in range(num_gpus):
            with tf.device('/gpu:%d' % i):
                with tf.variable_scope(tf.get_variable_scope(), reuse=i > 0):
                    loss = tf.reduce_mean(net(splits[i]))
                    tower_grads.append(opt.compute_gradients(loss))
        self.train_op = opt.apply_gradients(average_gradients(tower_grads))


def main():
    model = Model(2)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(3):
            sess.run(model.train_op, feed_dict={model.x: np.ones([8, 4], np.float32)})


if __name__ == '__main__':
    main()
"""
)

# the update reaches the running method through a list another method makes
FETCHES_LIST = RUN_FROM_OUTSIDE.replace(
    """        self.train_op = opt.apply_gradients(average_gradients(tower_grads))
""",
    """        self.train_op = opt.apply_gradients(average_gradients(tower_grads))

    def set_outputs(self):
        self.outputs = [self.train_op]

    def train(self, sess):
        sess.run(self.outputs, feed_dict={self.x: np.ones([8, 4], np.float32)})
""",
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


def test_a_session_and_an_iterator_kept_on_the_object(tmp_path):
    finding, source = _rewrite(tmp_path, SESSION_ON_THE_OBJECT)
    assert finding["applied"] and "TODO" not in finding["message"], finding["message"]
    tree = ast.parse(source)
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer"]
    init, train = (n for n in cls.body if isinstance(n, ast.FunctionDef))
    # the train step is made once in the building method and kept on the object
    (step,) = [n for n in ast.walk(init) if isinstance(n, ast.FunctionDef) and n.decorator_list]
    assert [ast.unparse(a) for a in step.args.args] == ["batch"]
    # the attributes the step filled are its locals: the batch's parts, the lists, self.loss
    assert [ast.unparse(s) for s in step.body[:3]] == [
        "x, y = batch",
        "splits = tf.split(x * y, num_gpus)",
        "losses = []",
    ]
    assert ast.unparse(step.body[-1]) == "return loss"
    scoped = [ast.unparse(s) for s in init.body[-1].body]  # under strategy.scope()
    assert "losses = []" not in scoped and "tower_grads = []" not in scoped
    assert "self.train_step = train_step" in ast.unparse(init)
    assert "self._iterator = iter(dataset)" in ast.unparse(init)
    # the running method calls it with the next batch; the session and its close are gone
    assert (
        ast.unparse(train.body[0].body[0]) == "value = self.train_step(batch=next(self._iterator))"
    )
    assert "Session" not in source and "_sess" not in source


def test_an_object_run_by_a_function_outside_its_class_converts(tmp_path):
    finding, source = _rewrite(tmp_path, RUN_FROM_OUTSIDE)
    assert finding["applied"] and "TODO" not in finding["message"], finding["message"]
    tree = ast.parse(source)
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"]
    (init,) = cls.body
    (step,) = [n for n in ast.walk(init) if isinstance(n, ast.FunctionDef) and n.decorator_list]
    assert [ast.unparse(a) for a in step.args.args] == ["x"]
    assert ast.unparse(init.body[-1].body[-1]) == "self.train_step = train_step"
    # the function that made the object calls the step on it, fed what it fed the placeholder
    (main,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    assert [ast.unparse(s) for s in main.body] == [
        "model = Model(2)",
        "for _ in range(3):\n    model.train_step(x=np.ones([8, 4], np.float32))",
    ]
    assert "Session" not in source and "placeholder" not in source


def test_an_object_run_from_another_module_is_refused_naming_why(tmp_path):
    library = RUN_FROM_OUTSIDE[: RUN_FROM_OUTSIDE.index("\n\ndef main")] + "\n"
    finding, _ = _rewrite(tmp_path, library)
    assert not finding["applied"]
    message = finding["message"]
    assert "no other method of its class runs the update" in message, message
    assert "no function of the project makes the object and runs it" in message, message


def test_a_step_fetched_through_another_attribute_is_refused_naming_it(tmp_path):
    finding, _ = _rewrite(tmp_path, FETCHES_LIST)
    assert not finding["applied"]
    assert "`train` runs `self.outputs`, which that method does not assign" in finding["message"]
