from __future__ import annotations

import libcst as cst

from tfmigrate import tree
from tfmigrate.rule import Example, FixSafety, Rule
from tfmigrate.syntax import walk

EMA = "tensorflow.train.ExponentialMovingAverage"


class _Bindings(cst.CSTVisitor):
    """Names assigned exactly once in the module, with the value they were given."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, cst.BaseExpression] = {}
        self.counts: dict[str, int] = {}

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if isinstance(target.target, cst.Name):
                name = target.target.value
                self.counts[name] = self.counts.get(name, 0) + 1
                self.values[name] = node.value


class EmaOverMovingStatistics(Rule):
    """
    ## What it does
    Flags `ExponentialMovingAverage(...).apply(var_list)` where the list includes
    `tf.moving_average_variables()` (or the `MOVING_AVERAGE_VARIABLES` collection), directly or
    through a variable such as `variables_to_average = tf.trainable_variables() +
    tf.moving_average_variables()`.

    ## Why is this bad?
    Slim/contrib `batch_norm` registers its moving mean and variance in
    `MOVING_AVERAGE_VARIABLES`. Those statistics are already exponential moving averages of the
    batch statistics (decay 0.999 by default), so averaging them again smooths twice: the shadow
    statistics restored for evaluation lag the real ones by a further ~1/(1-decay) steps. TF2
    has no equivalent to migrate to: Keras' `use_ema` averages trainable weights only (and
    without TF1's `num_updates` warm-up), so a migrated program cannot reproduce this double
    average without custom code.

    ## Example
    ```python
    ema = tf.train.ExponentialMovingAverage(0.9999, global_step)
    variables_to_average = tf.trainable_variables() + tf.moving_average_variables()
    ema_op = ema.apply(variables_to_average)
    ```
    Use instead (opt-in fix):
    ```python
    ema = tf.train.ExponentialMovingAverage(0.9999, global_step)
    variables_to_average = tf.trainable_variables()
    ema_op = ema.apply(variables_to_average)
    ```

    ## Fix safety
    Unsafe: evaluation then uses the batch norm's own moving statistics instead of their
    average, which changes the evaluated model (usually for the better). Applied only with
    `--unsafe-fixes`, so `verify` can first prove the faithful migration. No fix is offered when
    the list holds only the moving-average variables.
    """

    code = "TFM106"
    triggers = ("moving_average_variables", "MOVING_AVERAGE_VARIABLES")
    name = "ema-over-moving-statistics"
    summary = "EMA applied to moving_average_variables(): batch-norm statistics averaged twice"
    fix_safety = FixSafety.UNSAFE

    valid = (
        """import tensorflow as tf
ema = tf.train.ExponentialMovingAverage(0.999)
ema_op = ema.apply(tf.trainable_variables())
""",
        # moving_average_variables() used for something else (restoring), not averaged again.
        """import tensorflow as tf
ema = tf.train.ExponentialMovingAverage(0.999)
train_op = ema.apply(tf.trainable_variables())
saver = tf.train.Saver(tf.moving_average_variables())
""",
        # A user's own EMA class.
        """import tensorflow as tf
from myproject.ema import ExponentialMovingAverage
ema = ExponentialMovingAverage(0.99)
ema.apply(tf.trainable_variables() + tf.moving_average_variables())
""",
        # Keras 3 EMA of weights.
        """import tensorflow as tf
optimizer = tf.keras.optimizers.SGD(0.1, use_ema=True, ema_momentum=0.999)
""",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            variable_averages = tf.train.ExponentialMovingAverage(MOVING_AVERAGE_DECAY, global_step)
            variables_to_average = (tf.trainable_variables() +
                                    tf.moving_average_variables())
            variables_averages_op = variable_averages.apply(variables_to_average)
            """,
            fixed="""
            import tensorflow as tf
            variable_averages = tf.train.ExponentialMovingAverage(MOVING_AVERAGE_DECAY, global_step)
            variables_to_average = tf.trainable_variables()
            variables_averages_op = variable_averages.apply(variables_to_average)
            """,
            message="averaged twice",
        ),
        Example(
            """
            import tensorflow.compat.v1 as tf
            ema_op = tf.train.ExponentialMovingAverage(0.999).apply(
                var_list=tf.moving_average_variables() + tf.trainable_variables())
            """,
            fixed="""
            import tensorflow.compat.v1 as tf
            ema_op = tf.train.ExponentialMovingAverage(0.999).apply(
                var_list=tf.trainable_variables())
            """,
        ),
        Example(
            """
            import tensorflow as tf
            ema = tf.train.ExponentialMovingAverage(decay=0.9999)
            to_average = list(set(tf.trainable_variables() +
                                  tf.get_collection(tf.GraphKeys.MOVING_AVERAGE_VARIABLES)))
            with tf.control_dependencies([train_step]):
                train_op = ema.apply(to_average)
            """,
            fixed="""
            import tensorflow as tf
            ema = tf.train.ExponentialMovingAverage(decay=0.9999)
            to_average = list(set(tf.trainable_variables()))
            with tf.control_dependencies([train_step]):
                train_op = ema.apply(to_average)
            """,
        ),
        # Only the moving statistics: reported, nothing to keep.
        Example(
            """
            import tensorflow as tf
            ema = tf.train.ExponentialMovingAverage(0.99)
            update = ema.apply(tf.moving_average_variables())
            """,
        ),
    )

    def visit_Module(self, node: cst.Module) -> None:
        bindings = _Bindings()
        tree.visit(node, bindings)
        self._bindings = bindings

    def _is_ema(self, node: cst.BaseExpression) -> bool:
        if isinstance(node, cst.Call):
            return self.call_name(node) == EMA
        if isinstance(node, cst.Name) and self._bindings.counts.get(node.value) == 1:
            value = self._bindings.values[node.value]
            return isinstance(value, cst.Call) and self.call_name(value) == EMA
        return False

    def _is_moving_averages(self, node: cst.BaseExpression) -> bool:
        if not isinstance(node, cst.Call):
            return False
        name = self.call_name(node)
        if name == "tensorflow.moving_average_variables":
            return True
        return (
            name == "tensorflow.get_collection"
            and len(node.args) >= 1
            and self.qualify(node.args[0].value) == "tensorflow.GraphKeys.MOVING_AVERAGE_VARIABLES"
        )

    def visit_Call(self, node: cst.Call) -> None:
        if not (
            isinstance(node.func, cst.Attribute) and node.func.attr.value == "apply" and node.args
        ):
            return
        assert isinstance(node.func, cst.Attribute)
        if not self._is_ema(node.func.value):
            return
        arg = next((a for a in node.args if a.keyword and a.keyword.value == "var_list"), None)
        if arg is None and node.args[0].keyword is None:
            arg = node.args[0]
        if arg is None:
            return
        value = arg.value
        if isinstance(value, cst.Name) and self._bindings.counts.get(value.value) == 1:
            value = self._bindings.values[value.value]
        if self._is_moving_averages(value):
            self.report(
                node,
                "EMA over `moving_average_variables()` only: batch-norm moving statistics "
                "are already averages, so they are averaged twice and lag (fix by hand)",
            )
            return
        for binop in walk(value):
            if not (isinstance(binop, cst.BinaryOperation) and isinstance(binop.operator, cst.Add)):
                continue
            if self._is_moving_averages(binop.right):
                kept = binop.left
            elif self._is_moving_averages(binop.left):
                kept = binop.right
            else:
                continue
            self.report(
                node,
                "EMA over trainable variables + `moving_average_variables()`: batch-norm "
                "moving statistics are already moving averages, so they are averaged twice "
                "and lag; TF2/Keras `use_ema` averages trainables only",
                replacement=kept,
                target=binop,
            )
            return
