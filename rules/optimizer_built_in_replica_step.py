from __future__ import annotations

import libcst as cst

from tfmigrate.names import dotted
from tfmigrate.rule import Example, FixSafety, Rule
from tfmigrate.rules._distribution import ModuleFacts, analyze, keyword, walk

_OPTIMIZER_MODULES = ("keras.optimizers.", "tensorflow.keras.optimizers.")
# Keras 3 optimizers that create slot variables on their first `apply_gradients`.
_WITH_SLOTS = frozenset(
    {"Adam", "AdamW", "Adamax", "Nadam", "RMSprop", "Adagrad", "Adadelta", "Ftrl", "Lion",
     "Adafactor", "Lamb", "Muon"}
)  # fmt: skip
_VARIABLES = ("trainable_variables", "trainable_weights")


class OptimizerBuiltInReplicaStep(Rule):
    """
    ## What it does
    Flags `opt.apply_gradients(...)` inside a step function that `strategy.run` runs in a
    `tf.function`, when `opt` is a Keras optimizer with slot variables (Adam, RMSprop, Adagrad,
    SGD with momentum, ...) created in the file and never built (`opt.build(...)`) before.

    ## Why is this bad?
    A Keras 3 optimizer creates its slot variables (momentum, velocity) on its first
    `apply_gradients`. In a custom training loop that call happens inside the traced replica
    function, and with more than one replica the first step fails. Measured on TF 2.21 /
    Keras 3.15 with 2 logical CPUs (a Dense model, optimizer created in `strategy.scope()`,
    `@tf.function` around `strategy.run(step_fn)`): Adam, RMSprop and SGD(momentum=0.9) fail with
    `InvalidArgumentError: You must feed a value for placeholder tensor`; plain SGD (no slots),
    one replica, or the same loop without `tf.function` run; so does Adam once
    `opt.build(model.trainable_variables)` was called inside the scope. Scripts written for
    tf.keras 2, whose optimizers created their slots differently, stop here on Keras 3.

    ## Example
    ```python
    with strategy.scope():
        model = build_model()
        opt = tf.keras.optimizers.Adam(1e-3)

    @tf.function
    def train_step(batch):
        def step_fn(x, y):
            ...
            opt.apply_gradients(zip(grads, model.trainable_variables))
        return strategy.run(step_fn, args=batch)
    ```
    Use instead:
    ```python
    with strategy.scope():
        model = build_model()
        opt = tf.keras.optimizers.Adam(1e-3)
        opt.build(model.trainable_variables)
    ```

    ## Fix safety
    Unsafe: the fix adds `opt.build(<the variables apply_gradients updates>)` after the
    optimizer's creation when it sits in a `with strategy.scope():` block that creates the model
    before it. A model that creates its weights on its first call (no input shape) has none to
    build yet: build the model first (`model.build(shape)`). Otherwise reported only.
    """

    code = "TFM208"
    triggers = ("apply_gradients",)
    name = "optimizer-built-in-replica-step"
    summary = "Keras 3 optimizer first used inside strategy.run in a tf.function: build it first"
    fix_safety = FixSafety.UNSAFE

    valid = (
        # Built inside the scope.
        """import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = build()
    opt = tf.keras.optimizers.Adam(1e-3)
    opt.build(model.trainable_variables)
@tf.function
def train_step(x, y):
    def step_fn(x, y):
        opt.apply_gradients(zip(grads(x, y), model.trainable_variables))
    strategy.run(step_fn, args=(x, y))
""",
        # Plain SGD has no slots.
        """import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = build()
    opt = tf.keras.optimizers.SGD(0.1)
@tf.function
def train_step(x, y):
    def step_fn(x, y):
        opt.apply_gradients(zip(grads(x, y), model.trainable_variables))
    strategy.run(step_fn, args=(x, y))
""",
        # Not traced: eager steps create the slots without trouble.
        """import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = build()
    opt = tf.keras.optimizers.Adam(1e-3)
def train_step(x, y):
    def step_fn(x, y):
        opt.apply_gradients(zip(grads(x, y), model.trainable_variables))
    strategy.run(step_fn, args=(x, y))
""",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy()
            with strategy.scope():
                net = build()
                opt = tf.keras.optimizers.Adam(1e-3)

            @tf.function
            def train_step(batch):
                def step_fn(images, labels):
                    with tf.GradientTape() as tape:
                        loss = loss_fn(labels, net(images, training=True))
                    grads = tape.gradient(loss, net.trainable_variables)
                    opt.apply_gradients(zip(grads, net.trainable_variables))
                    return loss
                return strategy.run(step_fn, args=batch)
            """,
            fixed="""
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy()
            with strategy.scope():
                net = build()
                opt = tf.keras.optimizers.Adam(1e-3)
                opt.build(net.trainable_variables)

            @tf.function
            def train_step(batch):
                def step_fn(images, labels):
                    with tf.GradientTape() as tape:
                        loss = loss_fn(labels, net(images, training=True))
                    grads = tape.gradient(loss, net.trainable_variables)
                    opt.apply_gradients(zip(grads, net.trainable_variables))
                    return loss
                return strategy.run(step_fn, args=batch)
            """,
            message="You must feed a value for placeholder tensor",
        ),
        # SGD with momentum; the step wrapped by tf.function in place; no scope block: reported.
        Example(
            """
            import keras
            import tensorflow as tf
            optimizer = keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)

            def step_fn(x, y):
                optimizer.apply_gradients(zip(grads(x, y), model.trainable_variables))

            def train(strategy, batches):
                for batch in batches:
                    strategy.run(tf.function(step_fn), args=batch)
            """,
            message="`optimizer.build(model.trainable_variables)`",
        ),
    )

    def visit_Module(self, node: cst.Module) -> None:
        facts = self.context.shared(
            "distribution-facts", lambda: analyze(node, self.context.resolver)
        )
        built = {
            dotted(c.func.value)
            for c in facts.calls
            if isinstance(c.func, cst.Attribute) and c.func.attr.value == "build"
        }
        reported: set[int] = set()
        for call in facts.calls:
            step = self._traced_step(call, facts)
            if step is None:
                continue
            for apply in walk(step.body):
                if not (
                    isinstance(apply, cst.Call)
                    and isinstance(apply.func, cst.Attribute)
                    and apply.func.attr.value == "apply_gradients"
                    and isinstance(apply.func.value, cst.Name)
                ):
                    continue
                name = apply.func.value.value
                if name in built or id(apply) in reported:
                    continue
                kind = self._slotted_optimizer(name, facts)
                if kind is not None:
                    reported.add(id(apply))
                    self._flag(apply, name, kind, facts)

    def _traced_step(self, call: cst.Call, facts: ModuleFacts) -> cst.FunctionDef | None:
        """The step function of `strategy.run(step, ...)` when the run is traced: inside a
        `@tf.function`, or `run(tf.function(step), ...)`."""
        func = call.func
        if not (
            isinstance(func, cst.Attribute)
            and func.attr.value == "run"
            and facts.is_strategy(func.value)
            and call.args
        ):
            return None
        target = call.args[0].value
        traced = False
        if isinstance(target, cst.Call) and self.call_name(target) == "tensorflow.function":
            traced, target = True, target.args[0].value if target.args else target
        if not isinstance(target, cst.Name):
            return None
        traced = traced or any(
            isinstance(a, cst.FunctionDef) and self._is_tf_function(a) for a in self.ancestors(call)
        )
        candidates = facts.functions.get(target.value, [])
        return candidates[0] if traced and len(candidates) == 1 else None

    def _is_tf_function(self, function: cst.FunctionDef) -> bool:
        for decorator in function.decorators:
            expr = decorator.decorator
            expr = expr.func if isinstance(expr, cst.Call) else expr
            if self.qualify(expr) == "tensorflow.function":
                return True
        return False

    def _slotted_optimizer(self, name: str, facts: ModuleFacts) -> str | None:
        """The class name when ``name`` is bound once to a Keras optimizer with slots."""
        values = facts.values_of(name)
        if len(values) != 1 or not isinstance(values[0], cst.Call):
            return None
        qualified = self.call_name(values[0]) or ""
        if not qualified.startswith(_OPTIMIZER_MODULES):
            return None
        kind = qualified.rsplit(".", 1)[-1]
        if kind == "SGD":
            momentum = keyword(values[0], "momentum", 1)
            if momentum is None or (
                isinstance(momentum.value, cst.Integer | cst.Float)
                and momentum.value.evaluated_value == 0
            ):
                return None
            return "SGD with momentum"
        return kind if kind in _WITH_SLOTS else None

    def _flag(self, apply: cst.Call, name: str, kind: str, facts: ModuleFacts) -> None:
        variables = self._variables(apply)
        shown = self.context.module.code_for_node(variables) if variables is not None else "..."
        message = (
            f"`{name}` ({kind}) creates its slot variables on its first `apply_gradients`, here "
            "inside `strategy.run` in a tf.function: with more than one replica Keras 3 fails at "
            "the first step (`InvalidArgumentError: You must feed a value for placeholder "
            f"tensor`); build it inside `strategy.scope()`: `{name}.build({shown})`"
        )
        fix = self._fix(name, variables, facts)
        if fix is None:
            self.report(
                apply,
                f"{message} (not fixed: it is not created in a `with strategy.scope():` block after the model)",
            )
            return
        target, replacement = fix
        self.report(apply, message, target=target, replacement=replacement)

    def _variables(self, apply: cst.Call) -> cst.BaseExpression | None:
        """`model.trainable_variables` of `apply_gradients(zip(grads, model.trainable_variables))`."""
        pairs = keyword(apply, "grads_and_vars", 0)
        if (
            pairs is None
            or not isinstance(pairs.value, cst.Call)
            or dotted(pairs.value.func) != "zip"
        ):
            return None
        args = pairs.value.args
        if len(args) != 2:
            return None
        value = args[1].value
        if isinstance(value, cst.Attribute) and value.attr.value in _VARIABLES:
            return value
        return None

    def _fix(
        self, name: str, variables: cst.BaseExpression | None, facts: ModuleFacts
    ) -> tuple[cst.IndentedBlock, cst.IndentedBlock] | None:
        if variables is None or not isinstance(variables, cst.Attribute):
            return None
        model = dotted(variables.value)
        assign = facts.assignments.get(name, [None])[0]
        line = self.parent(assign) if assign is not None else None
        block = self.parent(line) if line is not None else None
        scope = self.parent(block) if block is not None else None
        if not (
            isinstance(block, cst.IndentedBlock)
            and isinstance(line, cst.BaseStatement)
            and isinstance(scope, cst.With)
            and any(
                isinstance(i.item, cst.Call)
                and isinstance(i.item.func, cst.Attribute)
                and i.item.func.attr.value == "scope"
                for i in scope.items
            )
        ):
            return None
        body = list(block.body)
        index = body.index(line)
        if not any(
            isinstance(s, cst.SimpleStatementLine)
            and any(
                isinstance(small, cst.Assign)
                and any(dotted(t.target) == model for t in small.targets)
                for small in s.body
            )
            for s in body[:index]
        ):
            return None
        code = self.context.module.code_for_node(variables)
        build = cst.parse_statement(f"{name}.build({code})\n")
        return block, block.with_changes(body=[*body[: index + 1], build, *body[index + 1 :]])
