from __future__ import annotations

import ast
from pathlib import PurePosixPath

import libcst as cst

from tfmigrate.prefilter import CodeFacts, argument
from tfmigrate.rule import Example, FixSafety
from tfmigrate.rules._towers import (
    ADD_N,
    DIVIDE,
    STACK,
    TOWERISH,
    TowerRule,
    get_arg,
    identifiers,
    is_true,
    method_name,
    short_tf,
    walk,
)

_GRADIENT_METHODS = ("compute_gradients", "minimize")
_MEANS = frozenset({"tensorflow.reduce_mean"}) | DIVIDE


class ColocatedAveragedLoss(TowerRule):
    """
    ## What it does
    Flags the variant of tower code that builds the towers' forward passes, averages their
    losses into ONE loss, and differentiates it once with
    `compute_gradients(..., colocate_gradients_with_ops=True)` (or `minimize(...)`,
    `tf.gradients(...)`), so that each tower's backward pass is still placed on its own GPU.

    ## Why is this bad?
    The gradient of the mean of the towers' losses is the mean of the towers' gradients, and TF1
    added the towers' contributions up inside one graph. TF2 has no cross-device graph to
    differentiate: under `tf.distribute.MirroredStrategy` every replica takes the gradient of
    its own loss and `apply_gradients` all-reduces them with SUM. To keep the same update the
    per-replica loss must be divided by the number of replicas
    (`tf.nn.compute_average_loss(per_example, global_batch_size=...)`); the
    `colocate_gradients_with_ops` flag itself no longer exists (TF2 always colocates).

    ## Example
    ```python
    tower_losses = []
    for i in range(num_gpus):
        with tf.device('/gpu:%d' % i):
            tower_losses.append(model_loss(images[i], labels[i]))
    loss = tf.reduce_mean(tf.stack(tower_losses))
    grads = opt.compute_gradients(loss, colocate_gradients_with_ops=True)
    ```
    Use instead:
    ```python
    def replica_step(images, labels):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(per_example_loss(images, labels),
                                              global_batch_size=GLOBAL_BATCH)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    strategy.run(replica_step, args=(images, labels))
    ```

    ## Fix safety
    Manual: the loss scaling belongs to the whole-script tower conversion.
    """

    code = "TFM110"
    triggers = ("colocate_gradients_with_ops=True",)  # what every candidate call passes
    name = "colocated-averaged-loss"
    summary = "one loss averaged over towers, differentiated once with colocated gradients"
    fix_safety = FixSafety.MANUAL

    valid = (
        # Single-device model that colocates gradients: no towers.
        """import tensorflow as tf
loss = tf.reduce_mean(xent)
grads = opt.compute_gradients(loss, colocate_gradients_with_ops=True)
""",
        # Per-tower gradients inside the tower loop are TFM101/TFM102's business.
        """import tensorflow as tf
for i in range(2):
    with tf.device('/gpu:%d' % i), tf.name_scope('tower_%d' % i):
        loss = tower_loss(i)
        tower_grads.append(opt.compute_gradients(loss, colocate_gradients_with_ops=True))
""",
        # Averaged tower losses without colocation.
        """import tensorflow as tf
loss = tf.reduce_mean(tf.stack(tower_losses))
grads = opt.compute_gradients(loss)
""",
        """import tensorflow as tf
loss = tf.add_n(tower_losses) / num_gpus
grads = opt.compute_gradients(loss, colocate_gradients_with_ops=False)
""",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            tower_losses = []
            for i in range(num_gpus):
                with tf.device('/gpu:%d' % i):
                    with tf.variable_scope('model', reuse=i > 0):
                        tower_losses.append(model_loss(images[i], labels[i]))
            loss = tf.reduce_mean(tf.stack(tower_losses))
            grads = opt.compute_gradients(loss, colocate_gradients_with_ops=True)
            """,
            message="averaged over the towers",
        ),
        Example(
            """
            import tensorflow.compat.v1 as tf
            total = tf.add_n(tower_losses) / FLAGS.num_gpus
            grads = tf.gradients(total, params, colocate_gradients_with_ops=True)
            """,
        ),
        Example(
            """
            import tensorflow as tf
            for k, dev in enumerate(devices):
                with tf.device(dev):
                    losses.append(build(k))
            train_op = opt.minimize(tf.reduce_mean(losses), global_step=step,
                                    colocate_gradients_with_ops=True)
            """,
        ),
        Example(
            """
            import tensorflow as tf
            total_loss = tf.add_n(tower_losses) / num_gpus
            train_op = opt.minimize(total_loss, colocate_gradients_with_ops = True)
            """,
            message="`total_loss` is one loss averaged over the towers",
        ),
    )

    @classmethod
    def may_report(cls, path: PurePosixPath, facts: CodeFacts) -> bool:
        """``on_call``'s candidates on the ``ast`` tree: TF's own code passes the flag on to
        its own `gradients`, which is no candidate."""
        for node in facts.nodes:
            if type(node) is not ast.Call:
                continue
            flag = argument(node, None, "colocate_gradients_with_ops")
            if not (type(flag) is ast.Constant and flag.value is True):
                continue
            func = node.func
            name = facts.qualify(func)
            if name == "tensorflow.gradients" or (
                name is None and type(func) is ast.Attribute and func.attr in _GRADIENT_METHODS
            ):
                return True
        return False

    def __init__(self, context) -> None:
        super().__init__(context)
        self._candidates: list[cst.Call] = []

    def on_call(self, node: cst.Call) -> None:
        name = self.call_name(node)
        method = method_name(node)
        if name != "tensorflow.gradients" and (name is not None or method not in _GRADIENT_METHODS):
            return
        if is_true(get_arg(node, None, "colocate_gradients_with_ops")):
            self._candidates.append(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        for node in self._candidates:
            self._check(node)

    def _check(self, node: cst.Call) -> None:
        # Inside a tower loop the call differentiates one tower: not this pattern.
        loops = {id(loop) for loop in self.loops_of(node)}
        if any(id(a) in loops for call in self.device_calls for a in self.ancestors(call)):
            return
        loss = get_arg(node, 0, "loss") or get_arg(node, 0, "ys")
        averaged = loss is not None and self._averaged_over_towers(loss, node)
        if not averaged and not self.has_device_loop():
            return
        what = f"`{self.src(loss, 40)}`" if loss is not None else "the loss"
        self.report(
            node,
            f"{what} is one loss averaged over the towers, differentiated once with "
            "colocate_gradients_with_ops=True (the gradient of the mean = the mean of the towers' "
            "gradients). TF2 differentiates per replica and SUMs: scale each replica's loss by "
            "1/num_replicas (tf.nn.compute_average_loss)",
        )

    def _averaged_over_towers(self, loss: cst.BaseExpression, at: cst.CSTNode) -> bool:
        if isinstance(loss, cst.Name):
            binding = self.last_binding_before(loss.value, at)
            if binding is None or not isinstance(binding[1], cst.BaseExpression):
                return False
            loss = binding[1]
        for node in walk(loss):
            averaging = (
                isinstance(node, cst.Call) and short_tf(self.call_name(node)) in _MEANS | ADD_N
            ) or (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide))
            if averaging and TOWERISH.search(" ".join(identifiers(node))):
                return True
            if isinstance(node, cst.Call) and short_tf(self.call_name(node)) in STACK:
                if TOWERISH.search(" ".join(identifiers(node))):
                    return True
        return False
