from __future__ import annotations

import re

import libcst as cst

from tfmigrate.names import dotted
from tfmigrate.rule import Example, FixSafety, Import, Rule
from tfmigrate.rules._distribution import ModuleFacts, analyze, keyword, walk

REDUCE_MEAN = frozenset({"tensorflow.reduce_mean", "tensorflow.math.reduce_mean"})
# Reductions that, over some axis other than 0, leave one value per example.
_AXIS_REDUCTIONS = frozenset({"reduce_mean", "reduce_sum", "reduce_max", "reduce_min"})
_PER_EXAMPLE_NAME = re.compile(r"per_?(example|sample)", re.I)
_DEPTH = 3  # names and helpers followed to see that a loss has one value per example
# Parents that bind tighter than `/` or take an operand: the divided mean is parenthesized.
_BINDING_TIGHTER = (
    cst.BinaryOperation, cst.UnaryOperation, cst.Attribute, cst.Subscript, cst.Await
)  # fmt: skip
_GLOBAL_BATCH = re.compile(r"global_?batch", re.I)
# Keras 3 loss objects with their default reduction divide by the replica count themselves.
_LOSS_PREFIXES = ("keras.losses.", "tensorflow.keras.losses.")


def _is_mean(op: cst.BaseExpression) -> bool:
    """``"MEAN"`` or ``tf.distribute.ReduceOp.MEAN``."""
    if isinstance(op, cst.SimpleString):
        return op.evaluated_value == "MEAN"
    return (dotted(op) or "").endswith("ReduceOp.MEAN")


class UnscaledReplicaLoss(Rule):
    """
    ## What it does
    Flags a loss that the step function passed to `strategy.run` averages over its own replica's
    examples with `tf.reduce_mean` (no `axis`) and then differentiates, instead of scaling it to
    the global batch with `tf.nn.compute_average_loss`. It follows the loss into a helper
    function (`loss = compute_loss(y, p)` that returns `tf.reduce_mean(...)`). It also flags
    `strategy.reduce(SUM, ...)` of what such a step function returns.

    ## Why is this bad?
    Under `MirroredStrategy`, `optimizer.apply_gradients` all-reduces the replicas' gradients with
    SUM. With a per-replica mean, every replica's gradient already has the size of a whole-batch
    gradient, so N replicas take an N times larger step than one device on the same global batch.
    Measured (tests/test_distribution_evidence.py, 2 logical CPUs, SGD lr 0.1, one step on a global
    batch of 8): the weight moved by 0.0827 with the per-replica `reduce_mean` and by 0.0414 on one
    device (ratio 2.000); with the fix, `tf.nn.compute_average_loss`, it moved by 0.0414
    (difference 4e-9 from one device). `strategy.reduce(SUM, ...)` of the per-replica means then
    reports N times the loss (0.887 instead of 0.444 in the same test). `model.fit` and Keras 3
    loss objects with their default reduction scale by the replica count themselves (unlike
    tf.keras 2) and are not flagged.

    ## Example
    ```python
    def step_fn(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    losses = strategy.run(step_fn, args=(x, y))
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)
    ```
    Use instead (one loss per example, averaged over the global batch):
    ```python
            per_example = loss_fn(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH_SIZE)
    ```
    or, for a loss of any shape (per pixel, per timestep), the replica's mean over the replicas:
    ```python
            loss = tf.reduce_mean(per_pixel) / tf.distribute.get_replica_context().num_replicas_in_sync
    ```

    ## Fix safety
    Unsafe: it changes the size of every update (back to what one device would do), so learning
    rates tuned on the unscaled loss change meaning. `compute_average_loss` sums *all* elements
    and divides by the global batch, so the fix uses it only where the code shows one value per
    example: a reduction over non-batch axes (`reduce_mean(x, axis=[1, 2])`), a name assigned
    only such values or named `per_example`/`per_sample`, or a helper returning them. Otherwise
    the shape is unknown and the fix divides the replica's mean by the replica count, exact for
    any shape when the replicas get equal batches. Measured (tests/test_replica_loss_shapes.py,
    2 logical CPUs, a per-pixel weighted cross-entropy on 16x16 masks, SGD 0.5, one step on a
    global batch of 8): the weights moved 2.0 times as far as on one device unscaled, 256.0
    times as far with `compute_average_loss` on the per-pixel losses, and matched one device
    (within 4e-7) with the division the fix writes. `global_batch_size=` is filled in from a
    module-level name like `GLOBAL_BATCH_SIZE`; without one, TensorFlow uses the per-replica batch
    times the replica count. The `strategy.reduce(SUM, ...)` finding has no fix of its own: once the
    loss is scaled, SUM is the right reduction.
    """

    code = "TFM202"
    triggers = tuple(sorted(REDUCE_MEAN))  # every report starts from such a call
    name = "unscaled-replica-loss"
    summary = "per-replica reduce_mean loss in strategy.run: gradients summed N times too large"
    fix_safety = FixSafety.UNSAFE

    valid = (
        # The tutorial form: scaled to the global batch.
        """import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
GLOBAL_BATCH_SIZE = 64
def step_fn(x, y):
    with tf.GradientTape() as tape:
        per_example = loss_fn(y, model(x, training=True))
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH_SIZE)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss
per_replica = strategy.run(step_fn, args=(x, y))
total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
""",
        # Divided by the replica count by hand.
        """import tensorflow as tf
def step_fn(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y)) / strategy.num_replicas_in_sync
    grads = tape.gradient(loss, model.trainable_variables)
    return loss
strategy.run(step_fn, args=(x, y))
""",
        # A Keras 3 loss object with its default reduction scales by the replica count itself.
        """import tensorflow as tf
loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
def step_fn(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(loss_object(y, model(x)))
    grads = tape.gradient(loss, model.trainable_variables)
strategy.run(step_fn, args=(x, y))
""",
        # reduce_mean over an axis is part of the per-example loss, not the batch mean.
        """import tensorflow as tf
def step_fn(x, y):
    with tf.GradientTape() as tape:
        per_example = tf.reduce_mean(tf.square(model(x) - y), axis=-1)
        loss = tf.nn.compute_average_loss(per_example)
    grads = tape.gradient(loss, model.trainable_variables)
strategy.run(step_fn, args=(x, y))
""",
        # Not run by a strategy: one device, a mean is right.
        """import tensorflow as tf
@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    grads = tape.gradient(loss, model.trainable_variables)
    return loss
""",
        # Reporting means averaged with MEAN is right.
        """import tensorflow as tf
def step_fn(x, y):
    return tf.reduce_mean(tf.square(model(x) - y))
per_replica = strategy.run(step_fn, args=(x, y))
mean = strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)
""",
        # Gradients returned and averaged with MEAN by the caller, which applies them itself.
        """import tensorflow as tf
@tf.function
def train_step(x, y):
    def step_fn():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        return tape.gradient(loss, model.trainable_variables)
    grads = [strategy.reduce("MEAN", g, axis=None) for g in strategy.run(step_fn)]
    update(model.trainable_variables, grads)
""",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy()
            GLOBAL_BATCH_SIZE = 64

            def step_fn(x, y):
                with tf.GradientTape() as tape:
                    per_example = loss_fn(y, model(x, training=True))
                    loss = tf.reduce_mean(per_example)
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                return loss

            @tf.function
            def train_step(x, y):
                per_replica = strategy.run(step_fn, args=(x, y))
                return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
            """,
            fixed="""
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy()
            GLOBAL_BATCH_SIZE = 64

            def step_fn(x, y):
                with tf.GradientTape() as tape:
                    per_example = loss_fn(y, model(x, training=True))
                    loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH_SIZE)
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                return loss

            @tf.function
            def train_step(x, y):
                per_replica = strategy.run(step_fn, args=(x, y))
                return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
            """,
            message="compute_average_loss",
        ),
        # Through a helper, with a regularizer added; no global batch name in sight.
        Example(
            """
            import tensorflow as tf

            def compute_loss(labels, logits):
                return tf.math.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))

            def replica_step(images, labels):
                with tf.GradientTape() as tape:
                    loss = compute_loss(labels, net(images)) + 1e-4 * l2
                grads = tape.gradient(loss, net.trainable_variables)
                opt.apply_gradients(zip(grads, net.trainable_variables))

            mirrored_strategy.run(replica_step, args=batch)
            """,
            fixed="""
            import tensorflow as tf

            def compute_loss(labels, logits):
                return tf.math.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)) / tf.distribute.get_replica_context().num_replicas_in_sync

            def replica_step(images, labels):
                with tf.GradientTape() as tape:
                    loss = compute_loss(labels, net(images)) + 1e-4 * l2
                grads = tape.gradient(loss, net.trainable_variables)
                opt.apply_gradients(zip(grads, net.trainable_variables))

            mirrored_strategy.run(replica_step, args=batch)
            """,
        ),
        # Step functions nested in tf.functions (same name twice) and a trainer method.
        Example(
            """
            import tensorflow as tf

            @tf.function
            def train(x, y):
                def step_fn(x, y):
                    with tf.GradientTape() as tape:
                        loss = tf.reduce_mean(tf.square(model(x) - y))
                    opt.apply_gradients(zip(tape.gradient(loss, model.weights), model.weights))
                strategy.run(step_fn, args=(x, y))

            @tf.function
            def test(x, y):
                def step_fn(x, y):
                    return tf.reduce_mean(tf.square(model(x) - y))
                return strategy.run(step_fn, args=(x, y))

            class Trainer:
                def replica_step(self, batch):
                    with tf.GradientTape() as tape:
                        loss = tf.reduce_mean(self.loss(batch))
                    return tape.gradient(loss, self.model.trainable_variables)

                def step(self, batch):
                    return self.strategy.run(self.replica_step, args=(batch,))
            """,
            fixed="""
            import tensorflow as tf

            @tf.function
            def train(x, y):
                def step_fn(x, y):
                    with tf.GradientTape() as tape:
                        loss = tf.reduce_mean(tf.square(model(x) - y)) / tf.distribute.get_replica_context().num_replicas_in_sync
                    opt.apply_gradients(zip(tape.gradient(loss, model.weights), model.weights))
                strategy.run(step_fn, args=(x, y))

            @tf.function
            def test(x, y):
                def step_fn(x, y):
                    return tf.reduce_mean(tf.square(model(x) - y))
                return strategy.run(step_fn, args=(x, y))

            class Trainer:
                def replica_step(self, batch):
                    with tf.GradientTape() as tape:
                        loss = tf.reduce_mean(self.loss(batch)) / tf.distribute.get_replica_context().num_replicas_in_sync
                    return tape.gradient(loss, self.model.trainable_variables)

                def step(self, batch):
                    return self.strategy.run(self.replica_step, args=(batch,))
            """,
        ),
        # The reduce of the means, reported on its own line (no fix of its own).
        Example(
            """
            import tensorflow as tf
            def step(x, y):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.abs(model(x) - y))
                tape_grads = tape.gradient(loss, model.trainable_variables)
                return loss
            total = strategy.reduce("SUM", strategy.run(step, args=(x, y)), axis=None)
            """,
            fixed="""
            import tensorflow as tf
            def step(x, y):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.abs(model(x) - y)) / tf.distribute.get_replica_context().num_replicas_in_sync
                tape_grads = tape.gradient(loss, model.trainable_variables)
                return loss
            total = strategy.reduce("SUM", strategy.run(step, args=(x, y)), axis=None)
            """,
            message="times the mean loss",
        ),
        # Per-pixel losses (shape unknown here): compute_average_loss would sum over the pixels.
        Example(
            """
            import tensorflow as tf
            GLOBAL_BATCH = 8

            def weighted_loss(labels, logits):
                per_pixel = ce(labels, logits) * tf.gather(weights, labels)
                return 1.0 + tf.math.reduce_mean(per_pixel)

            def step_fn(images, labels):
                with tf.GradientTape() as tape:
                    loss = weighted_loss(labels, net(images, training=True))
                opt.apply_gradients(zip(tape.gradient(loss, net.weights), net.weights))

            strategy.run(tf.function(step_fn), args=(images, labels))
            """,
            fixed="""
            import tensorflow as tf
            GLOBAL_BATCH = 8

            def weighted_loss(labels, logits):
                per_pixel = ce(labels, logits) * tf.gather(weights, labels)
                return 1.0 + (tf.math.reduce_mean(per_pixel) / tf.distribute.get_replica_context().num_replicas_in_sync)

            def step_fn(images, labels):
                with tf.GradientTape() as tape:
                    loss = weighted_loss(labels, net(images, training=True))
                opt.apply_gradients(zip(tape.gradient(loss, net.weights), net.weights))

            strategy.run(tf.function(step_fn), args=(images, labels))
            """,
            message="exact for any shape",
        ),
        # One loss per example by construction: the tutorial's compute_average_loss.
        Example(
            """
            import tensorflow as tf
            GLOBAL_BATCH = 8

            def step_fn(images, masks):
                with tf.GradientTape() as tape:
                    per_image = tf.reduce_mean(tf.square(net(images) - masks), axis=[1, 2, 3])
                    loss = tf.reduce_mean(per_image)
                opt.apply_gradients(zip(tape.gradient(loss, net.weights), net.weights))

            strategy.run(step_fn, args=(images, masks))
            """,
            fixed="""
            import tensorflow as tf
            GLOBAL_BATCH = 8

            def step_fn(images, masks):
                with tf.GradientTape() as tape:
                    per_image = tf.reduce_mean(tf.square(net(images) - masks), axis=[1, 2, 3])
                    loss = tf.nn.compute_average_loss(per_image, global_batch_size=GLOBAL_BATCH)
                opt.apply_gradients(zip(tape.gradient(loss, net.weights), net.weights))

            strategy.run(step_fn, args=(images, masks))
            """,
        ),
    )

    def visit_Module(self, node: cst.Module) -> None:
        facts = self.context.shared(
            "distribution-facts", lambda: analyze(node, self.context.resolver)
        )
        self._facts = facts
        self._scaled_loss_objects = self._default_reduction_losses(facts)
        self._steps: dict[int, list[cst.Call]] = {}  # id(FunctionDef) -> flagged reduce_means
        global_batch = [
            name for name in facts.assignments if "." not in name and _GLOBAL_BATCH.search(name)
        ]
        self._global_batch = global_batch[0] if len(global_batch) == 1 else None
        reported: set[int] = set()
        for call in facts.calls:
            step = self._run_step(call)
            if step is None or self._gradients_averaged(call, step):
                continue
            for mean in self._unscaled_means(step):
                if id(mean) not in reported:
                    reported.add(id(mean))
                    self._report_mean(mean)
        for call in facts.calls:
            self._check_reduce(call)

    # -- strategy.run(step_fn, ...) -------------------------------------------------------
    def _run_step(self, call: cst.Call) -> cst.FunctionDef | None:
        func = call.func
        if not (
            isinstance(func, cst.Attribute)
            and func.attr.value == "run"
            and self._facts.is_strategy(func.value)
            and call.args
        ):
            return None
        target = call.args[0].value
        if isinstance(target, cst.Call) and self.call_name(target) == "tensorflow.function":
            target = target.args[0].value if target.args else target  # run(tf.function(step))
        if isinstance(target, cst.Attribute) and dotted(target.value) == "self":
            name = target.attr.value  # a method of the trainer class
        elif isinstance(target, cst.Name):
            name = target.value
        else:
            return None
        candidates = self._facts.functions.get(name, [])
        if len(candidates) > 1:
            # `def step_fn` nested in several tf.functions: take the one beside this call.
            enclosing = next(
                (a for a in self.ancestors(call) if isinstance(a, cst.FunctionDef)), None
            )
            if enclosing is not None:
                candidates = [c for c in candidates if c in enclosing.body.body]
        return candidates[0] if len(candidates) == 1 else None

    def _gradients_averaged(self, run: cst.Call, step: cst.FunctionDef) -> bool:
        """The step applies no gradients and the function around ``strategy.run`` reduces what
        it returns with MEAN only (a hand-written update applies the mean): nothing is summed."""
        if any(
            isinstance(n, cst.Call)
            and isinstance(n.func, cst.Attribute)
            and n.func.attr.value == "apply_gradients"
            for n in walk(step.body)
        ):
            return False
        if self._own_update(step):
            return True  # an update of the program's own takes them: the strategy sums none
        caller = next((a for a in self.ancestors(run) if isinstance(a, cst.FunctionDef)), None)
        if caller is None:
            return False
        reductions = [
            n.args[0].value
            for n in walk(caller.body)
            if isinstance(n, cst.Call)
            and isinstance(n.func, cst.Attribute)
            and n.func.attr.value == "reduce"
            and self._facts.is_strategy(n.func.value)
            and n.args
        ]
        return bool(reductions) and all(_is_mean(r) for r in reductions)

    def _own_update(self, step: cst.FunctionDef) -> bool:
        """The tape's gradients (``grads = tape.gradient(...)``) are passed to a call in the
        step (``adam(params, grads, ...)``, which reduces them itself) and not returned."""
        names: set[str] = set()
        for node in walk(step.body):
            if (
                isinstance(node, cst.Assign)
                and isinstance(node.value, cst.Call)
                and isinstance(node.value.func, cst.Attribute)
                and node.value.func.attr.value == "gradient"
            ):
                if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Name):
                    return False
                names.add(node.targets[0].target.value)
        passed = {
            a.value.value
            for c in walk(step.body)
            if isinstance(c, cst.Call)
            for a in c.args
            if isinstance(a.value, cst.Name)
        }
        returned = {
            n.value
            for r in walk(step.body)
            if isinstance(r, cst.Return) and r.value is not None
            for n in walk(r.value)
            if isinstance(n, cst.Name)
        }
        return bool(names) and names <= passed and not names & returned

    def _unscaled_means(self, step: cst.FunctionDef) -> list[cst.Call]:
        if id(step) in self._steps:
            return self._steps[id(step)]
        means: list[cst.Call] = []
        for node in walk(step.body):
            if not (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and node.func.attr.value == "gradient"
                and node.args
            ):
                continue
            target = node.args[0].value
            if isinstance(target, cst.Name):
                for assign in self._assignments_in(step, target.value):
                    means.extend(self._means_in(assign.value, follow=True))
        self._steps[id(step)] = means
        return means

    def _assignments_in(self, function: cst.FunctionDef, name: str) -> list[cst.Assign]:
        return [
            n
            for n in walk(function.body)
            if isinstance(n, cst.Assign)
            and len(n.targets) == 1
            and isinstance(n.targets[0].target, cst.Name)
            and n.targets[0].target.value == name
        ]

    def _means_in(self, expr: cst.BaseExpression, *, follow: bool) -> list[cst.Call]:
        """The unscaled batch means that make up ``expr`` (sums, products, one helper deep)."""
        if isinstance(expr, cst.BinaryOperation):
            if isinstance(expr.operator, cst.Divide | cst.Multiply) and any(
                _mentions_replicas(side) for side in (expr.left, expr.right)
            ):
                return []  # already divided by the replica count
            return self._means_in(expr.left, follow=follow) + self._means_in(
                expr.right, follow=follow
            )
        if not isinstance(expr, cst.Call):
            return []
        if self.call_name(expr) in REDUCE_MEAN:
            axis = keyword(expr, "axis", 1)
            if axis is None and not self._is_scaled_loss(expr.args[0].value if expr.args else None):
                return [expr]
            return []
        if follow and isinstance(expr.func, cst.Name):
            helper = self._facts.function(expr.func.value)
            if helper is not None:
                found: list[cst.Call] = []
                for node in walk(helper.body):
                    if isinstance(node, cst.Return) and node.value is not None:
                        found.extend(self._means_in(node.value, follow=False))
                return found
        return []

    def _is_scaled_loss(self, expr: cst.BaseExpression | None) -> bool:
        if isinstance(expr, cst.Call):
            callee = dotted(expr.func)
            if callee in self._scaled_loss_objects:
                return True
            # `tf.keras.losses.MeanSquaredError()(y, p)` inline
            if isinstance(expr.func, cst.Call) and self._is_default_loss_class(expr.func):
                return True
        return False

    def _is_default_loss_class(self, call: cst.Call) -> bool:
        name = self.call_name(call)
        if not name or not name.startswith(_LOSS_PREFIXES):
            return False
        if not name.rsplit(".", 1)[1][:1].isupper():
            return False  # a loss function (per example), not a class
        reduction = keyword(call, "reduction")
        if reduction is None:
            return True
        text = self.context.module.code_for_node(reduction.value).lower()
        return "none" not in text and "sum" != text.strip("'\"")

    def _default_reduction_losses(self, facts: ModuleFacts) -> set[str]:
        return {
            name
            for name, assigns in facts.assignments.items()
            if all(
                isinstance(a.value, cst.Call) and self._is_default_loss_class(a.value)
                for a in assigns
            )
        }

    def _report_mean(self, mean: cst.Call) -> None:
        tf = self.context.resolver.local_name_for("tensorflow")
        imports: tuple[Import, ...] = ()
        if tf is None:
            tf, imports = "tf", (Import("tensorflow", asname="tf"),)
        message = (
            "loss averaged per replica with `reduce_mean` inside `strategy.run`: replica "
            "gradients are summed, so each step is num_replicas times too large; scale to the "
            "global batch with `tf.nn.compute_average_loss` on per-example losses"
        )
        if not self._per_example(mean.args[0].value, mean, _DEPTH):
            # compute_average_loss sums every element: a per-pixel loss would grow by the
            # pixels per example. The replica's mean over the replica count is exact whatever
            # the loss's shape (replicas with equal batches).
            count = cst.parse_expression(
                f"{tf}.distribute.get_replica_context().num_replicas_in_sync"
            )
            divided = cst.BinaryOperation(
                left=mean,
                operator=cst.Divide(
                    whitespace_before=cst.SimpleWhitespace(" "),
                    whitespace_after=cst.SimpleWhitespace(" "),
                ),
                right=count,
            )
            parent = self.parent(mean)
            if isinstance(parent, _BINDING_TIGHTER):
                divided = divided.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            self.report(
                mean,
                f"{message}; its shape is not known here (a per-pixel loss would be summed over "
                "its pixels), so the fix divides the replica's mean by the replica count, exact "
                "for any shape",
                replacement=divided,
                imports=imports,
            )
            return
        per_example = mean.args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        args = [per_example]
        if self._global_batch is not None:
            args = [
                per_example.with_changes(
                    comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                ),
                cst.Arg(
                    keyword=cst.Name("global_batch_size"),
                    value=cst.Name(self._global_batch),
                    equal=cst.AssignEqual(
                        whitespace_before=cst.SimpleWhitespace(""),
                        whitespace_after=cst.SimpleWhitespace(""),
                    ),
                ),
            ]
        if mean.args[-1].comma is not cst.MaybeSentinel.DEFAULT:
            args[-1] = args[-1].with_changes(comma=mean.args[-1].comma)
        replacement = mean.with_changes(
            func=cst.parse_expression(f"{tf}.nn.compute_average_loss"), args=args
        )
        self.report(mean, message, replacement=replacement, imports=imports)

    def _per_example(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int) -> bool:
        """Whether ``expr`` visibly holds one loss per example: a reduction over an axis other
        than the batch's, a name assigned only such values in the same function, or a call to a
        helper of the module that returns only such values."""
        if depth == 0:
            return False
        if isinstance(expr, cst.Call):
            name = self.call_name(expr) or ""
            if name.startswith("tensorflow.") and name.rsplit(".", 1)[-1] in _AXIS_REDUCTIONS:
                axis = keyword(expr, "axis", 1)
                return axis is not None and not _is_batch_axis(axis.value)
            if isinstance(expr.func, cst.Name):
                helper = self._facts.function(expr.func.value)
                returns = [
                    n.value
                    for n in walk(helper.body)
                    if isinstance(n, cst.Return) and n.value is not None
                ] if helper is not None else []  # fmt: skip
                return bool(returns) and all(self._per_example(r, r, depth - 1) for r in returns)
            return False
        if isinstance(expr, cst.Name):
            if _PER_EXAMPLE_NAME.search(expr.value):
                return True  # the author's own word for it, as in TF's tutorials
            function = next((a for a in self.ancestors(at) if isinstance(a, cst.FunctionDef)), None)
            if function is None:
                return False
            values = [a.value for a in self._assignments_in(function, expr.value)]
            return bool(values) and all(self._per_example(v, v, depth - 1) for v in values)
        return False

    # -- strategy.reduce(SUM, per_replica_means) ------------------------------------------
    def _check_reduce(self, call: cst.Call) -> None:
        func = call.func
        if not (
            isinstance(func, cst.Attribute)
            and func.attr.value == "reduce"
            and self._facts.is_strategy(func.value)
            and len(call.args) >= 2
        ):
            return
        op = call.args[0].value
        is_sum = (isinstance(op, cst.SimpleString) and op.evaluated_value.upper() == "SUM") or (
            self.qualify(op) or ""
        ).endswith("ReduceOp.SUM")
        if not is_sum:
            return
        value = call.args[1].value
        runs: list[cst.BaseExpression] = [value]
        if isinstance(value, cst.Name):
            runs = self._facts.values_of(value.value)
        for run in runs:
            step = self._run_step(run) if isinstance(run, cst.Call) else None
            if step is not None and self._returns_mean(step):
                self.report(
                    call,
                    "`strategy.reduce(SUM, ...)` of per-replica `reduce_mean` losses reports "
                    "num_replicas times the mean loss; scale the loss with "
                    "`tf.nn.compute_average_loss` (then SUM is right) or reduce with MEAN",
                )
                return

    def _returns_mean(self, step: cst.FunctionDef) -> bool:
        if not self._unscaled_means(step):
            return False
        names = {
            node.targets[0].target.value
            for node in walk(step.body)
            if isinstance(node, cst.Assign)
            and isinstance(node.targets[0].target, cst.Name)
            and self._means_in(node.value, follow=True)
        }
        for node in walk(step.body):
            if isinstance(node, cst.Return) and node.value is not None:
                returned = node.value
                items = (
                    [e.value for e in returned.elements]
                    if isinstance(returned, cst.Tuple)
                    else [returned]
                )
                for item in items:
                    if isinstance(item, cst.Name) and item.value in names:
                        return True
                    if self._means_in(item, follow=True):
                        return True
        return False


def _is_batch_axis(node: cst.BaseExpression) -> bool:
    """`0`, `[0]`, `(0, 1)`: an axis list that includes the batch axis."""
    if isinstance(node, cst.Integer):
        return node.evaluated_value == 0
    if isinstance(node, cst.List | cst.Tuple):
        return any(_is_batch_axis(e.value) for e in node.elements)
    return False


def _mentions_replicas(node: cst.CSTNode) -> bool:
    return any(
        isinstance(n, cst.Name) and n.value == "num_replicas_in_sync" for n in walk(node)
    ) or any(
        isinstance(n, cst.Attribute) and n.attr.value == "num_replicas_in_sync" for n in walk(node)
    )
