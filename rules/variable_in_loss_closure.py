from __future__ import annotations

import libcst as cst

from tfmigrate.rule import Example, FixSafety, Import, Rule
from tfmigrate.rules._distribution import analyze, is_true, keyword, walk

VARIABLE_FACTORIES = frozenset(
    {
        "tensorflow.Variable",
        "keras.backend.variable",
        "tensorflow.keras.backend.variable",
        "keras.Variable",
    }
)
# Arguments of tf.Variable / K.variable that tf.constant also takes (same meaning).
_KEPT = {"initial_value": "value", "value": "value", "dtype": "dtype", "name": "name"}
_LOSS_PARAMS = ({"y_true", "y_pred"}, {"labels", "logits"}, {"labels", "predictions"})
_LOSS_WORDS = ("loss", "entropy", "dice", "focal", "jaccard")


def _is_loss_function(fn: cst.FunctionDef) -> bool:
    params = {p.name.value for p in fn.params.params}
    return any(words <= params for words in _LOSS_PARAMS) or any(
        w in fn.name.value.lower() for w in _LOSS_WORDS
    )


class VariableInLossClosure(Rule):
    """
    ## What it does
    Flags `tf.Variable(...)` (also `K.variable`, `keras.Variable`) holding constant data — class
    weights, a smoothing kernel — inside a loss function, or inside the factory that builds and
    returns one (`def weighted_loss(weights): weights = tf.Variable(weights); def loss(y_true,
    y_pred): ...`), in a file that uses `tf.distribute`. Variables passed `trainable=True` or
    later `.assign`ed are left alone.

    ## Why is this bad?
    Tried on TF 2.21/Keras 3 with 2 logical CPUs under `MirroredStrategy` (`model.fit`; a manual
    check, not part of the test suite): a variable created
    inside the loss function fails in `fit` with "tf.function only supports singleton tf.Variables
    created on the first call"; created by a factory called inside `strategy.scope()` it becomes a
    trainable `MirroredVariable` (a copy per replica, kept in sync, tracked by no model or
    checkpoint); created outside the scope it lives on the first device only and every replica
    reads it across devices each step. Constant data needs none of this: `tf.constant` is
    copied to each replica with the graph.

    ## Example
    ```python
    def weighted_categorical_crossentropy(class_weights):
        class_weights = tf.Variable(class_weights, dtype=tf.float32)
        def loss(y_true, y_pred):
            return -tf.reduce_sum(y_true * tf.math.log(y_pred) * class_weights, axis=-1)
        return loss
    ```
    Use instead:
    ```python
        class_weights = tf.constant(class_weights, dtype=tf.float32)
    ```

    ## Fix safety
    Safe: the value is the same and nothing assigns to it. Arguments `tf.constant` does not take
    (`trainable`, `shape`, `aggregation`, ...) are dropped. `keras.Variable` built from an
    initializer is reported without a fix.
    """

    code = "TFM203"
    triggers = tuple(sorted(VARIABLE_FACTORIES))
    name = "variable-in-loss-closure"
    summary = "tf.Variable for constant data in a loss under a strategy: use tf.constant"
    fix_safety = FixSafety.SAFE

    valid = (
        """import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
def weighted_loss(weights):
    weights = tf.constant(weights, dtype=tf.float32)
    def loss(y_true, y_pred):
        return tf.reduce_sum(y_true * weights, axis=-1)
    return loss
""",
        # A learned temperature is a real variable.
        """import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
def make_loss():
    temperature = tf.Variable(1.0, trainable=True)
    def loss(y_true, y_pred):
        return y_pred / temperature
    return loss
""",
        # Not a loss; and no strategy in the file.
        """import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
def build_counter():
    return tf.Variable(0, trainable=False)
""",
        """import tensorflow as tf
def weighted_loss(weights):
    weights = tf.Variable(weights)
    def loss(y_true, y_pred):
        return y_true * weights
    return loss
""",
        # Assigned later: state, not a constant.
        """import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
def adaptive_loss(y_true, y_pred, scale):
    scale_var = tf.Variable(scale, trainable=False)
    scale_var.assign(scale * 0.9)
    return y_pred * scale_var
""",
    )
    invalid = (
        Example(
            """
            import numpy as np
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy()

            def weighted_categorical_crossentropy(class_weights):
                class_weights = tf.Variable(class_weights, dtype=tf.float32, trainable=False)

                def loss(y_true, y_pred):
                    return -tf.reduce_sum(y_true * tf.math.log(y_pred) * class_weights, axis=-1)
                return loss
            """,
            fixed="""
            import numpy as np
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy()

            def weighted_categorical_crossentropy(class_weights):
                class_weights = tf.constant(class_weights, dtype=tf.float32)

                def loss(y_true, y_pred):
                    return -tf.reduce_sum(y_true * tf.math.log(y_pred) * class_weights, axis=-1)
                return loss
            """,
            message="tf.constant",
        ),
        # Inside the loss itself, Keras backend spelling, keyword initial value.
        Example(
            """
            import tensorflow as tf
            from tensorflow.keras import backend as K
            strategy = tf.distribute.MirroredStrategy()
            def focal_loss(y_true, y_pred):
                alpha = K.variable(value=[0.25, 0.75], name='alpha')
                return K.sum(alpha * y_true * K.log(y_pred))
            """,
            fixed="""
            import tensorflow as tf
            from tensorflow.keras import backend as K
            strategy = tf.distribute.MirroredStrategy()
            def focal_loss(y_true, y_pred):
                alpha = tf.constant(value=[0.25, 0.75], name='alpha')
                return K.sum(alpha * y_true * K.log(y_pred))
            """,
        ),
        # Keras 3 only: tf is imported by the fix.
        Example(
            """
            import keras
            from tensorflow import distribute
            strategy = distribute.MirroredStrategy()
            def dice_loss(y_true, y_pred):
                smooth = keras.Variable(1.0)
                return 1 - (2 * keras.ops.sum(y_true * y_pred) + smooth)
            """,
            fixed="""
            import keras
            from tensorflow import distribute
            import tensorflow as tf

            strategy = distribute.MirroredStrategy()
            def dice_loss(y_true, y_pred):
                smooth = tf.constant(1.0)
                return 1 - (2 * keras.ops.sum(y_true * y_pred) + smooth)
            """,
        ),
    )

    def visit_Module(self, node: cst.Module) -> None:
        facts = self.context.shared(
            "distribution-facts", lambda: analyze(node, self.context.resolver)
        )
        if not (facts.uses_distribute or facts.strategies):
            return
        for functions in facts.functions.values():
            for fn in functions:
                if _is_loss_function(fn) or _returns_loss_closure(fn):
                    self._check(fn)

    def _check(self, fn: cst.FunctionDef) -> None:
        assigned = _assigned_names(fn)
        for stmt in fn.body.body:  # the function's own statements, not nested functions
            for node in walk(stmt):
                if isinstance(node, cst.FunctionDef):
                    break
                if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call):
                    self._check_call(node, node.value, assigned)

    def _check_call(self, assign: cst.Assign, call: cst.Call, assigned: set[str]) -> None:
        name = self.call_name(call)
        if name not in VARIABLE_FACTORIES or not call.args:
            return
        trainable = keyword(call, "trainable")
        if trainable is not None and is_true(trainable.value):
            return
        target = assign.targets[0].target
        if isinstance(target, cst.Name) and target.value in assigned:
            return
        replacement, imports = self._constant(call, name)
        self.report(
            call,
            f"`{name.rsplit('.', 1)[-1]}` holds constant data in a loss used under a "
            "strategy: created inside the loss it breaks tf.function, inside the scope it "
            "becomes a trainable mirrored variable; use `tf.constant`",
            replacement=replacement,
            imports=imports,
        )

    def _constant(self, call: cst.Call, name: str) -> tuple[cst.Call | None, tuple[Import, ...]]:
        first = call.args[0]
        if name == "keras.Variable" and (
            isinstance(first.value, cst.Lambda)
            or (
                isinstance(first.value, cst.Call)
                and "initializers" in (self.call_name(first.value) or "")
            )
        ):
            return None, ()
        args = []
        for index, arg in enumerate(call.args):
            if arg.keyword is None and index == 0:
                args.append(arg)
            elif arg.keyword is not None and arg.keyword.value in _KEPT:
                args.append(arg.with_changes(keyword=cst.Name(_KEPT[arg.keyword.value])))
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        tf = self.context.resolver.local_name_for("tensorflow")
        imports: tuple[Import, ...] = ()
        if tf is None:
            tf, imports = "tf", (Import("tensorflow", asname="tf"),)
        return call.with_changes(func=cst.parse_expression(f"{tf}.constant"), args=args), imports


def _returns_loss_closure(fn: cst.FunctionDef) -> bool:
    inner = {
        s.name.value
        for s in fn.body.body
        if isinstance(s, cst.FunctionDef) and _is_loss_function(s)
    }
    for node in walk(fn.body):
        if isinstance(node, cst.Return) and isinstance(node.value, cst.Name):
            if node.value.value in inner:
                return True
    return False


def _assigned_names(fn: cst.FunctionDef) -> set[str]:
    """Names whose ``.assign*`` method is called anywhere in ``fn`` (nested functions too)."""
    return {
        node.func.value.value
        for node in walk(fn)
        if isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value.startswith("assign")
        and isinstance(node.func.value, cst.Name)
    }
