from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from tfmigrate.names import NameResolver, dotted
from tfmigrate.rule import Example, FixSafety, Import, Rule
from tfmigrate.rules import _global_batch_loss as global_batch
from tfmigrate.rules._distribution import ModuleFacts, analyze, keyword, scope_strategy

# Reductions that collapse a tensor to one number when called without an axis.
_REDUCTIONS = frozenset(
    {
        "sum", "mean", "reduce_sum", "reduce_mean", "count_nonzero", "reduce_prod", "prod",
        "max", "min", "reduce_max", "reduce_min",
    }
)  # fmt: skip
_MODULES = ("tensorflow.", "keras.", "numpy.")
_LIBRARIES = (*_MODULES, "tf_keras.", "torch.", "jax.")  # not the repo's own modules
_AXIS_KEYWORDS = frozenset({"axis", "reduction_indices", "keepdims", "keep_dims"})
_TF = Import("tensorflow", asname="tf")  # what the helper needs when the file has no such import
_DEPTH = 3  # how many same-module helpers deep a loss is followed (dice_loss -> dice_coef)


@dataclass(frozen=True)
class _Source:
    """A module a loss is looked up in: the file itself or a module of the repo it imports."""

    module: cst.Module
    facts: ModuleFacts
    qualify: Callable[[cst.BaseExpression], str | None]


def _fixed(imports: str, rest: str) -> str:
    """An example's fixed code: its imports, the emitted helper, the rest with losses wrapped."""
    imports, rest = textwrap.dedent(imports).strip("\n"), textwrap.dedent(rest).strip("\n")
    return f"{imports}\n\n{global_batch.source().rstrip()}\n\n\n{rest}\n"


class ScalarLossUnderStrategy(Rule):
    """
    ## What it does
    Flags a custom loss function given to `model.compile(loss=...)` inside
    `strategy.scope()` when it reduces the whole batch to one number (a `sum`/`mean` over every
    axis, batch included) instead of returning one loss per sample — for example a dice loss
    `1 - (2*sum(y*p) + s) / (sum(y) + sum(p) + s)`. The function is followed through the
    module's own helpers (`dice_loss` calling `dice_coef`); a `keras.losses.Loss` subclass of
    the module whose `call` returns such a scalar (`loss=DiceLoss()`) is flagged too. A loss
    imported from a module of the repo (`from losses import dice_loss`, `import losses` then
    `losses.dice_loss`, `from nets.objectives import IoULoss`) is read from that module's file,
    beside the script or one folder up (read only: the module's own findings stay its own).

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
    With the fix below (the code it writes, run by the same test) the weights equalled one
    device's (difference 0.0) and so did the logged loss; the helper on the per-sample dice
    with `sample_weight` matched too (0.0). A `multi_gpu_model` program computed its loss once
    on the concatenated batch: TFM107 emits the same helper.

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
    or keep the whole-batch loss and compute it on the global batch (the fix):
    ```python
    model.compile(optimizer='adam', loss=global_batch_loss(dice_loss))
    ```
    where `global_batch_loss` (written into the file by the fix) gathers every replica's
    `y_true`/`y_pred` with `ReplicaContext.all_gather` (whose gradient hands each replica the
    gradient of its own rows), evaluates the loss on the whole batch, and divides a scalar by
    `num_replicas_in_sync`: the summed gradient is the one-device gradient. Dividing the loss
    by `num_replicas_in_sync` alone gets the step size near (0.97) but not equal.

    ## Fix safety
    Unsafe: it changes what the TF2 program trains (a step half as large on 2 replicas, as one
    device would take) and every replica computes the loss on the whole batch (the loss's cost
    grows with the replicas; metrics such as a dice metric stay per replica). Measured not
    exact: a scalar loss with `sample_weight` (Keras weighs the scalar by the replica's
    weights). A per-sample dice is a different objective (small objects weigh differently), so
    it is named, not applied. Not detected: losses imported relatively (`from .losses import
    x`) or from modules outside those two folders, losses built by a factory function, and
    custom training loops (TFM202 covers `strategy.run` step functions).
    """

    code = "TFM207"
    # Reports a `.compile(...)` inside `with <strategy>.scope():` (a name saying "strategy",
    # or one assigned from a `...Strategy(...)` call).
    triggers = (
        (re.compile(r"\bcompile\b"), re.compile(r"\bscope\b"), re.compile("strategy", re.I)),
    )
    name = "scalar-loss-under-strategy"
    summary = "custom loss reduced over the whole batch in fit under a strategy: summed per replica"
    fix_safety = FixSafety.UNSAFE

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
        # A Loss subclass returning one loss per sample; a loss already on the global batch.
        """import keras
import tensorflow as tf
class PerImageDice(keras.losses.Loss):
    def call(self, y_true, y_pred):
        return 1 - 2 * tf.reduce_sum(y_true * y_pred, axis=[1, 2]) / tf.reduce_sum(
            y_true + y_pred, axis=[1, 2])
def dice_loss(y_true, y_pred):
    return 1 - 2 * keras.ops.sum(y_true * y_pred) / keras.ops.sum(y_true + y_pred)
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = build_model()
    model.compile(optimizer='adam', loss=[PerImageDice(), global_batch_loss(dice_loss)])
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
            fixed=_fixed(
                """
                import keras
                import tensorflow as tf
                from keras import backend as K
                """,
                """
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
                    model.compile(optimizer='adam', loss=global_batch_loss(dice_loss), metrics=[dice_coef])
                """,
            ),
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
            fixed=_fixed(
                "import tensorflow as tf",
                """
                def mse_all(y_true, y_pred):
                    return tf.reduce_mean(tf.square(y_true - y_pred))

                def train(strategy, x, y):
                    with strategy.scope():
                        model = build()
                        model.compile('sgd', ['mse', global_batch_loss(mse_all)])
                    model.fit(x, y, batch_size=64)
                """,
            ),
            message="whole batch",
        ),
        # A keras.losses.Loss subclass whose call returns a scalar (IoU over the batch).
        Example(
            """
            import keras
            import tensorflow as tf

            class SoftIoULoss(keras.losses.Loss):
                def call(self, y_true, y_pred):
                    inter = tf.reduce_sum(y_true * y_pred)
                    union = tf.reduce_sum(y_true + y_pred) - inter
                    return 1.0 - inter / (union + 1e-6)

            strategy = tf.distribute.MirroredStrategy()
            with strategy.scope():
                model = build()
                model.compile(optimizer='adam', loss=SoftIoULoss())
            """,
            fixed=_fixed(
                """
                import keras
                import tensorflow as tf
                """,
                """
                class SoftIoULoss(keras.losses.Loss):
                    def call(self, y_true, y_pred):
                        inter = tf.reduce_sum(y_true * y_pred)
                        union = tf.reduce_sum(y_true + y_pred) - inter
                        return 1.0 - inter / (union + 1e-6)

                strategy = tf.distribute.MirroredStrategy()
                with strategy.scope():
                    model = build()
                    model.compile(optimizer='adam', loss=global_batch_loss(SoftIoULoss()))
                """,
            ),
            message="`SoftIoULoss()` reduces the whole batch",
        ),
    )

    def visit_Module(self, node: cst.Module) -> None:
        facts = self.context.shared(
            "distribution-facts", lambda: analyze(node, self.context.resolver)
        )
        own = _Source(node, facts, self.qualify)
        flagged: list[tuple[cst.BaseExpression, str, str]] = []  # loss, shown name, strategy
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
                shown = self._scalar_value(value, own)
                if shown is not None:
                    strategy = self._strategy(call, facts)
                    if strategy is not None:
                        flagged.append((value, shown, strategy))
        if not flagged:
            return
        fixed = self._with_global_batch_losses(node, [v for v, _, _ in flagged])
        for value, shown, strategy in flagged:
            self._flag(value, shown, strategy, fixed)

    def _scalar_value(self, value: cst.BaseExpression, own: _Source) -> str | None:
        """How to name ``value`` if it is a whole-batch loss: a function or a Loss instance,
        defined in this file or in a module of the repo it imports (`from losses import x`)."""
        shown = self.context.module.code_for_node(value)
        target = value.func if isinstance(value, cst.Call) else value
        name = target.value if isinstance(target, cst.Name) else None
        if name is not None and (own.facts.function(name) or _class(own.module, name)):
            source: _Source | None = own
        else:
            source, name = self._imported(target)
        if source is None or name is None:
            return None
        if isinstance(value, cst.Call):
            method = _loss_subclass_call(source.module, name, source.qualify)
            if method is not None and self._scalar_function(method, source, _DEPTH):
                return shown
            return None
        return shown if self._scalar_loss(name, source, _DEPTH) else None

    def _imported(self, node: cst.BaseExpression) -> tuple[_Source | None, str | None]:
        """The repo module that ``node`` (`dice_loss`, `losses.dice_loss`) is imported from,
        read from disk next to this file or one folder up, and the name in it."""
        qualified = self.qualify(node) if isinstance(node, cst.Name | cst.Attribute) else None
        if qualified is None or qualified.startswith(_LIBRARIES):
            return None, None
        module_name, _, name = qualified.rpartition(".")
        if not module_name:
            return None, None
        source = self.context.shared(
            f"repo-module:{module_name}", lambda: _read_repo_module(self.context.path, module_name)
        )
        return source, name

    def _with_global_batch_losses(
        self, module: cst.Module, losses: list[cst.BaseExpression]
    ) -> cst.Module | None:
        """The module with each loss wrapped in `global_batch_loss(...)`, which it defines."""
        if not self.context.fixing:
            return None
        ids = {id(loss) for loss in losses}

        class Wrap(cst.CSTTransformer):
            def on_leave(self, original, updated):
                if id(original) in ids:
                    return global_batch.wrapped(updated)
                return updated

        fixed = module.visit(Wrap())
        if global_batch.defines_helper(module):
            return fixed
        at = global_batch.first_code_index(fixed)
        body = global_batch.insert_helper(list(fixed.body), at, self.tf_local())
        return fixed.with_changes(body=body)

    def _strategy(self, call: cst.Call, facts: ModuleFacts) -> str | None:
        return next(
            (s for s in (scope_strategy(a, facts) for a in self.ancestors(call)) if s), None
        )

    def _flag(
        self, value: cst.BaseExpression, shown: str, strategy: str, fixed: cst.Module | None
    ) -> None:
        self.report(
            value,
            f"`{shown}` reduces the whole batch to one number: under `{strategy}` fit "
            "computes it on each replica's slice and Keras 3 does not divide a scalar loss by "
            "the replicas, so the summed gradient grows with the replica count; compute it on "
            f"the global batch (unsafe fix: `{global_batch.HELPER}({shown})`, all replicas' "
            "rows gathered), return one loss per sample, or divide it by "
            f"`{strategy}.num_replicas_in_sync` (near, not equal)",
            replacement=fixed,
            target=self.context.module if fixed is not None else None,
            imports=() if self.context.resolver.local_name_for("tensorflow") else (_TF,),
        )

    def _scalar_function(self, function: cst.FunctionDef, source: _Source, depth: int) -> bool:
        returns = [n for n in _walk_own(function) if isinstance(n, cst.Return)]
        if not returns or any(r.value is None for r in returns):
            return False
        return all(
            self._scalar(r.value, function, source, depth) for r in returns if r.value is not None
        )  # (none is None: checked above)

    def _scalar_loss(self, name: str, source: _Source, depth: int) -> bool:
        function = source.facts.function(name)
        if function is None or depth == 0:
            return False
        return self._scalar_function(function, source, depth)

    def _scalar(
        self, node: cst.BaseExpression, function: cst.FunctionDef, source: _Source, depth: int
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
                kind = self._reduction(current, source)
                if kind == "axis":
                    return False
                if kind == "full":
                    full = True
                    continue
                callee = dotted(current.func)
                if callee is not None and "." not in callee and source.facts.function(callee):
                    if self._scalar_loss(callee, source, depth - 1):
                        full = True
                        continue
            if isinstance(current, cst.Name) and current.value not in seen:
                seen.add(current.value)
                stack.extend(_local_values(function, current.value))
            stack.extend(current.children)
        return full

    def _reduction(self, call: cst.Call, source: _Source) -> str | None:
        """'full' for a reduction over every axis, 'axis' for one over some axes, else None."""
        qualified = source.qualify(call.func) or ""
        if not qualified.startswith(_MODULES) or qualified.rsplit(".", 1)[-1] not in _REDUCTIONS:
            return None
        if any(a.keyword is not None and a.keyword.value in _AXIS_KEYWORDS for a in call.args):
            return "axis"
        positional = [a for a in call.args if a.keyword is None and not a.star]
        return "axis" if len(positional) > 1 else "full"


def _loss_subclass_call(
    module: cst.Module, name: str, qualify: Callable[[cst.BaseExpression], str | None]
) -> cst.FunctionDef | None:
    """The `call` method of the module's class ``name`` when it subclasses a Keras `Loss`."""
    for statement in module.body:
        if not (isinstance(statement, cst.ClassDef) and statement.name.value == name):
            continue
        if not any((qualify(base.value) or "").endswith("losses.Loss") for base in statement.bases):
            return None
        body = statement.body.body if isinstance(statement.body, cst.IndentedBlock) else []
        return next(
            (f for f in body if isinstance(f, cst.FunctionDef) and f.name.value == "call"), None
        )
    return None


def _class(module: cst.Module, name: str) -> bool:
    return any(isinstance(s, cst.ClassDef) and s.name.value == name for s in module.body)


def _read_repo_module(path: object, module_name: str) -> _Source | None:
    """``module_name`` (`losses`, `nets.losses`) as a file of the repo: beside the file at
    ``path`` or one folder up, as `losses.py` or `losses/__init__.py`; None when absent or
    unreadable. Read only: its findings are its own file's business."""
    here = Path(str(path)).parent
    relative = Path(*module_name.split("."))
    for folder in (here, here.parent):
        for candidate in (folder / f"{relative}.py", folder / relative / "__init__.py"):
            if not candidate.is_file():
                continue
            try:
                module = cst.parse_module(candidate.read_bytes())
            except (OSError, cst.ParserSyntaxError):
                return None
            resolver = NameResolver.for_module(module)
            return _Source(module, analyze(module, resolver), resolver.qualify)
    return None


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
