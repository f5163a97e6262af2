from __future__ import annotations

import libcst as cst

from tfmigrate.names import dotted
from tfmigrate.rule import Example, FixSafety, Rule
from tfmigrate.rules._distribution import ModuleFacts, analyze, keyword, scope_strategy

# Reductions that collapse a tensor to one number when called without an axis.
_REDUCTIONS = frozenset(
    {
        "sum", "mean", "reduce_sum", "reduce_mean", "count_nonzero", "reduce_prod", "prod",
        "max", "min", "reduce_max", "reduce_min",
    }
)  # fmt: skip
_MODULES = ("tensorflow.", "keras.", "numpy.")
_AXIS_KEYWORDS = frozenset({"axis", "reduction_indices", "keepdims", "keep_dims"})
_DEPTH = 3  # how many same-module helpers deep a loss is followed (dice_loss -> dice_coef)


class ScalarLossUnderStrategy(Rule):
    """
    ## What it does
    Flags a custom loss function given to `model.compile(loss=...)` inside
    `strategy.scope()` when it reduces the whole batch to one number (a `sum`/`mean` over every
    axis, batch included) instead of returning one loss per sample — for example a dice loss
    `1 - (2*sum(y*p) + s) / (sum(y) + sum(p) + s)`. The function is followed through the
    module's own helpers (`dice_loss` calling `dice_coef`).

    ## Why is this bad?
    Under `MirroredStrategy`, `fit` calls the loss on each replica's slice of the global batch.
    A per-sample loss vector is averaged over the *global* batch (each replica's sum divided by
    the global batch size), so the replicas' gradients add up to the one-device gradient. A
    scalar comes back as it is: Keras 3 does not divide it by the number of replicas, the
    gradient all-reduce sums the replicas' gradients, and every step grows with the replica
    count. The logged loss is the sum of the replicas' losses too.

    Measured (tests/test_scalar_loss_evidence.py, 2 logical CPUs, a sigmoid layer with 4
    outputs, SGD 0.5, one `fit` step on a global batch of 8): with the scalar dice loss the
    weights moved 1.94 times as far as on one device with the same batch, and the logged loss
    was 1.93 times one device's; with the loss divided by `num_replicas_in_sync` the step was
    0.97 of one device's (the mean of two half-batch dice losses is not the whole batch's); with
    a per-sample dice (sums over the non-batch axes) the weights matched one device to 1e-9.
    The same pitfall is why TFM107's conversion of a `multi_gpu_model` program is unsafe for
    such a loss: the wrapper computed it once on the concatenated batch.

    ## Example
    ```python
    def dice_loss(y_true, y_pred, smooth=1.0):
        intersection = keras.ops.sum(y_true * y_pred)
        return 1 - (2 * intersection + smooth) / (
            keras.ops.sum(y_true) + keras.ops.sum(y_pred) + smooth)

    with strategy.scope():
        model = build_unet()
        model.compile(optimizer='adam', loss=dice_loss)
    model.fit(images, masks, batch_size=32)
    ```
    Use instead (one dice loss per image; Keras averages them over the global batch):
    ```python
    def dice_loss(y_true, y_pred, smooth=1.0):
        axes = [1, 2, 3]
        intersection = keras.ops.sum(y_true * y_pred, axis=axes)
        return 1 - (2 * intersection + smooth) / (
            keras.ops.sum(y_true, axis=axes) + keras.ops.sum(y_pred, axis=axes) + smooth)
    ```
    or keep the whole-batch loss and divide it by `strategy.num_replicas_in_sync` (the step
    size is then right; the value is the mean of the replicas' slice losses).

    ## Fix safety
    Reported only: a per-sample dice and a whole-batch dice are different objectives (small
    objects weigh differently), and which one the model should learn is a modelling decision.
    Not detected: losses defined in another module (`from losses import dice_loss`),
    `keras.losses.Loss` subclasses, losses built by a factory function, and custom training
    loops (TFM202 covers `strategy.run` step functions).
    """

    code = "TFM207"
    triggers = ("compile",)
    name = "scalar-loss-under-strategy"
    summary = "custom loss reduced over the whole batch in fit under a strategy: summed per replica"
    fix_safety = FixSafety.MANUAL

    valid = (
        # A per-sample loss: reduced over the non-batch axes only.
        """import keras
import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
def dice_loss(y_true, y_pred):
    intersection = keras.ops.sum(y_true * y_pred, axis=[1, 2, 3])
    return 1 - 2 * intersection / (keras.ops.sum(y_true + y_pred, axis=[1, 2, 3]) + 1)
with strategy.scope():
    model = build_model()
    model.compile(optimizer='adam', loss=dice_loss)
""",
        # Already divided by the replica count.
        """import keras
import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
def dice_loss(y_true, y_pred):
    return (1 - 2 * keras.ops.sum(y_true * y_pred) / keras.ops.sum(y_true + y_pred)) / (
        strategy.num_replicas_in_sync)
with strategy.scope():
    model = build_model()
    model.compile(optimizer='adam', loss=dice_loss)
""",
        # No strategy: one device, a scalar loss is fine.
        """import keras
def dice_loss(y_true, y_pred):
    return 1 - 2 * keras.ops.sum(y_true * y_pred) / keras.ops.sum(y_true + y_pred)
model = build_model()
model.compile(optimizer='adam', loss=dice_loss)
""",
        # Built-in losses are per-sample.
        """import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = build_model()
    model.compile(optimizer='adam', loss='binary_crossentropy')
""",
    )
    invalid = (
        Example(
            """
            import keras
            import tensorflow as tf
            from keras import backend as K

            def dice_coef(y_true, y_pred, smooth=1.0):
                y_true_f = keras.ops.reshape(y_true, [-1])
                y_pred_f = keras.ops.reshape(y_pred, [-1])
                intersection = keras.ops.sum(y_true_f * y_pred_f)
                return (2. * intersection + smooth) / (
                    keras.ops.sum(y_true_f) + keras.ops.sum(y_pred_f) + smooth)

            def dice_loss(y_true, y_pred):
                return 1. - dice_coef(y_true, y_pred)

            strategy = tf.distribute.MirroredStrategy()
            with strategy.scope():
                model = build_unet()
                model.compile(optimizer='adam', loss=dice_loss, metrics=[dice_coef])
            """,
            message="num_replicas_in_sync",
        ),
        # A scalar mean, positionally, in a function-level scope; one of a list of losses.
        Example(
            """
            import tensorflow as tf

            def mse_all(y_true, y_pred):
                return tf.reduce_mean(tf.square(y_true - y_pred))

            def train(strategy, x, y):
                with strategy.scope():
                    model = build()
                    model.compile('sgd', ['mse', mse_all])
                model.fit(x, y, batch_size=64)
            """,
            message="whole batch",
        ),
    )

    def visit_Module(self, node: cst.Module) -> None:
        facts = self.context.shared(
            "distribution-facts", lambda: analyze(node, self.context.resolver)
        )
        for call in facts.calls:
            if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "compile"):
                continue
            loss = keyword(call, "loss", 1)
            if loss is None:
                continue
            values = (
                [e.value for e in loss.value.elements]
                if isinstance(loss.value, cst.List | cst.Tuple)
                else [loss.value]
            )
            for value in values:
                if isinstance(value, cst.Name) and self._scalar_loss(value.value, facts, _DEPTH):
                    strategy = self._strategy(call, facts)
                    if strategy is not None:
                        self._flag(value, strategy)

    def _strategy(self, call: cst.Call, facts: ModuleFacts) -> str | None:
        return next(
            (s for s in (scope_strategy(a, facts) for a in self.ancestors(call)) if s), None
        )

    def _flag(self, value: cst.Name, strategy: str) -> None:
        self.report(
            value,
            f"`{value.value}` reduces the whole batch to one number: under `{strategy}` fit "
            "computes it on each replica's slice and Keras 3 does not divide a scalar loss by "
            "the replicas, so the summed gradient grows with the replica count; return one "
            "loss per sample (reduce over the non-batch axes only) or divide it by "
            f"`{strategy}.num_replicas_in_sync`",
        )

    def _scalar_loss(self, name: str, facts: ModuleFacts, depth: int) -> bool:
        function = facts.function(name)
        if function is None or depth == 0:
            return False
        returns = [n for n in _walk_own(function) if isinstance(n, cst.Return)]
        if not returns or any(r.value is None for r in returns):
            return False
        return all(self._scalar(r.value, function, facts, depth) for r in returns)  # type: ignore[arg-type]

    def _scalar(
        self, node: cst.BaseExpression, function: cst.FunctionDef, facts: ModuleFacts, depth: int
    ) -> bool:
        """Whether ``node`` holds a whole-batch reduction and nothing per-sample or rescaled."""
        full = False
        stack: list[cst.CSTNode] = [node]
        seen: set[str] = set()
        while stack:
            current = stack.pop()
            if isinstance(current, cst.Attribute) and current.attr.value == "num_replicas_in_sync":
                return False
            if isinstance(current, cst.Call):
                kind = self._reduction(current)
                if kind == "axis":
                    return False
                if kind == "full":
                    full = True
                    continue
                callee = dotted(current.func)
                if callee is not None and "." not in callee and facts.function(callee):
                    if self._scalar_loss(callee, facts, depth - 1):
                        full = True
                        continue
            if isinstance(current, cst.Name) and current.value not in seen:
                seen.add(current.value)
                stack.extend(_local_values(function, current.value))
            stack.extend(current.children)
        return full

    def _reduction(self, call: cst.Call) -> str | None:
        """'full' for a reduction over every axis, 'axis' for one over some axes, else None."""
        qualified = self.call_name(call) or ""
        if not qualified.startswith(_MODULES) or qualified.rsplit(".", 1)[-1] not in _REDUCTIONS:
            return None
        if any(a.keyword is not None and a.keyword.value in _AXIS_KEYWORDS for a in call.args):
            return "axis"
        positional = [a for a in call.args if a.keyword is None and not a.star]
        return "axis" if len(positional) > 1 else "full"


def _walk_own(function: cst.FunctionDef) -> list[cst.CSTNode]:
    """The nodes of ``function``'s body, nested functions and lambdas left out."""
    found: list[cst.CSTNode] = []
    stack: list[cst.CSTNode] = list(function.body.children)
    while stack:
        current = stack.pop()
        if isinstance(current, cst.FunctionDef | cst.Lambda | cst.ClassDef):
            continue
        found.append(current)
        stack.extend(current.children)
    return found


def _local_values(function: cst.FunctionDef, name: str) -> list[cst.BaseExpression]:
    """What ``name`` is assigned inside ``function`` (`name = value`)."""
    return [
        node.value
        for node in _walk_own(function)
        if isinstance(node, cst.Assign)
        and any(isinstance(t.target, cst.Name) and t.target.value == name for t in node.targets)
    ]
