from __future__ import annotations

import libcst as cst

from tfmigrate.names import dotted
from tfmigrate.rule import Example, FixSafety, Rule
from tfmigrate.rules._distribution import ModuleFacts, analyze, keyword, scope_strategy, walk

LOAD_MODEL = frozenset(
    {
        "keras.models.load_model",
        "keras.saving.load_model",
        "tensorflow.keras.models.load_model",
        "tensorflow.keras.saving.load_model",
    }
)
CHECKPOINT = frozenset({"tensorflow.train.Checkpoint", "tensorflow.train.CheckpointManager"})
_TRAINING_METHODS = frozenset({"fit", "train_on_batch"})
_OPTIMIZER_PREFIXES = ("keras.optimizers.", "tensorflow.keras.optimizers.")


class RestoreOutsideStrategyScope(Rule):
    """
    ## What it does
    In a file that creates a `tf.distribute` strategy, flags
    - `load_model(...)` outside `strategy.scope()` when the loaded model is trained again
      (`fit`, `train_on_batch`);
    - `tf.train.Checkpoint(optimizer=opt, ...)` where `opt` is a Keras optimizer created outside
      `strategy.scope()`;
    - saving a `multi_gpu_model` wrapper instead of the model it wraps: `parallel.save_weights`,
      `parallel.save`, and `ModelCheckpoint` callbacks passed to `parallel.fit` or
      `parallel.fit_generator` (in the call, bound to a name, or in a `callbacks = [...]` list,
      `callbacks.append(...)` included).

    ## Why is this bad?
    Variables belong to the strategy that is current when they are created. Measured on
    TF 2.21/Keras 3 with 2 logical CPUs (tests/test_distribution_evidence.py): a compiled model
    loaded outside the scope has plain `ResourceVariable` weights and optimizer slots and
    `model.distribute_strategy` is the default strategy, so `fit` silently trains on one
    device; calling its `fit` inside the scope fails (AssertionError). A Keras optimizer created
    outside the scope restores `iterations` but its slots (momentum, velocity) are created on first
    use: inside `strategy.run` that fails with "Mixing different tf.distribute.Strategy objects";
    built outside, they are plain single-device variables. Created inside the scope, the
    restored Adam moments continued exactly where training stopped (same values after one more
    step, difference 0.0).
    A `multi_gpu_model` wrapper saves a file laid out for the wrapper (one nested model
    layer), which the template model cannot load; its variables are the template's, so save
    the template.

    ## Example
    ```python
    strategy = tf.distribute.MirroredStrategy()
    model = keras.models.load_model('unet.keras')
    model.fit(dataset, epochs=5)
    ```
    Use instead:
    ```python
    with strategy.scope():
        model = keras.models.load_model('unet.keras')
    model.fit(dataset, epochs=5)
    ```

    ## Fix safety
    Safe where unambiguous: a `load_model` assignment is wrapped in `with strategy.scope():` when
    the file binds exactly one strategy before it; `parallel.save_weights(...)` becomes
    `template.save_weights(...)` (same variables, loadable file). The optimizer and
    `ModelCheckpoint` cases are reported only: moving an optimizer's creation, or replacing a
    callback, needs a person.
    """

    code = "TFM201"
    # A tf.distribute strategy, or a multi_gpu_model wrapper that is saved.
    triggers = ("tensorflow.distribute", "multi_gpu_model")
    name = "restore-outside-strategy-scope"
    summary = "model/optimizer restored outside strategy.scope(), or a wrapper model saved"
    fix_safety = FixSafety.SAFE

    valid = (
        """import keras
import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = keras.models.load_model('unet.keras')
model.fit(ds, epochs=2)
""",
        # Loaded for inference only: no training state matters.
        """import keras
import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
model = keras.models.load_model('unet.keras')
masks = model.predict(images)
""",
        # Optimizer created in the scope; the checkpoint object may be made anywhere.
        """import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = build()
    optimizer = tf.keras.optimizers.Adam(1e-3)
ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer)
ckpt.restore(tf.train.latest_checkpoint('ckpt'))
""",
        # No strategy in the file.
        """import tensorflow as tf
optimizer = tf.keras.optimizers.Adam()
ckpt = tf.train.Checkpoint(optimizer=optimizer)
""",
        # The template is saved.
        """from keras.utils import multi_gpu_model
parallel = multi_gpu_model(model, gpus=2)
parallel.fit(x, y)
model.save_weights('model.weights.h5')
""",
    )
    invalid = (
        Example(
            """
            import keras
            import tensorflow as tf

            strategy = tf.distribute.MirroredStrategy()
            model = keras.models.load_model('unet.keras')
            model.fit(ds, epochs=5)
            """,
            fixed="""
            import keras
            import tensorflow as tf

            strategy = tf.distribute.MirroredStrategy()
            with strategy.scope():
                model = keras.models.load_model('unet.keras')
            model.fit(ds, epochs=5)
            """,
            message="one device",
        ),
        Example(
            """
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy()
            with strategy.scope():
                model = build_unet()
            optimizer = tf.keras.optimizers.Adam(1e-3)
            checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
            checkpoint.restore(tf.train.latest_checkpoint(ckpt_dir))
            """,
            message="outside `strategy.scope()`",
        ),
        Example(
            """
            import keras
            from keras.utils import multi_gpu_model
            parallel_model = multi_gpu_model(template, gpus=2)
            parallel_model.fit(x, y, callbacks=[keras.callbacks.ModelCheckpoint('best.h5')])
            parallel_model.save_weights('final.h5')
            """,
            fixed="""
            import keras
            from keras.utils import multi_gpu_model
            parallel_model = multi_gpu_model(template, gpus=2)
            parallel_model.fit(x, y, callbacks=[keras.callbacks.ModelCheckpoint('best.h5')])
            template.save_weights('final.h5')
            """,
            message="wrapper",
        ),
        # The callback bound to a name first (the usual Keras 2 script).
        Example(
            """
            from keras.callbacks import ModelCheckpoint
            from keras.utils import multi_gpu_model
            model = multi_gpu_model(template, gpus=2)
            checkpoint = ModelCheckpoint('unet.h5', save_weights_only=True)
            model.fit(x, y, callbacks=[checkpoint, logger])
            """,
            message="`ModelCheckpoint` on the multi_gpu_model wrapper `model`",
        ),
        # The callbacks collected in a list variable first, one of them appended later.
        Example(
            """
            import keras
            from keras.utils import multi_gpu_model
            parallel = multi_gpu_model(unet, gpus=4)
            callbacks = [keras.callbacks.TensorBoard('logs')]
            callbacks.append(keras.callbacks.ModelCheckpoint('best.h5', save_best_only=True))
            parallel.fit(x, y, callbacks=callbacks)
            """,
            message="`ModelCheckpoint` on the multi_gpu_model wrapper `parallel`",
        ),
        Example(
            """
            from keras.callbacks import ModelCheckpoint
            from keras.utils import multi_gpu_model
            model = multi_gpu_model(template, gpus=2)
            checkpoint = ModelCheckpoint('unet.h5', save_weights_only=True)
            callbacks = [checkpoint, logger]
            model.fit(x, y, callbacks=callbacks)
            """,
            message="`ModelCheckpoint` on the multi_gpu_model wrapper `model`",
        ),
        # Keras 2's fit_generator, the checkpoint made inside the list.
        Example(
            """
            from keras.callbacks import ModelCheckpoint
            from keras.utils import multi_gpu_model
            parallel_model = multi_gpu_model(base_model, gpus=2, cpu_relocation=False)
            callbacks = [ModelCheckpoint('weights.{epoch:02d}.h5', save_weights_only=True)]
            parallel_model.fit_generator(batches, steps_per_epoch=100, callbacks=callbacks)
            """,
            message="`ModelCheckpoint` on the multi_gpu_model wrapper `parallel_model`",
        ),
        # Two strategies in the file: which scope is ambiguous, so no fix.
        Example(
            """
            import tensorflow as tf
            a_strategy = tf.distribute.MirroredStrategy()
            b_strategy = tf.distribute.OneDeviceStrategy('/gpu:0')
            model = tf.keras.models.load_model('m.keras')
            model.train_on_batch(x, y)
            """,
        ),
    )

    def visit_Module(self, node: cst.Module) -> None:
        facts = self.context.shared(
            "distribution-facts", lambda: analyze(node, self.context.resolver)
        )
        self._check_wrappers(facts)
        if not facts.strategies:
            return
        trained = {
            dotted(c.func.value)
            for c in facts.calls
            if isinstance(c.func, cst.Attribute) and c.func.attr.value in _TRAINING_METHODS
        }
        for call in facts.calls:
            name = self.call_name(call)
            if name in LOAD_MODEL:
                self._check_load(call, facts, trained)
            elif name in CHECKPOINT:
                self._check_checkpoint(call, facts)

    def _in_scope(self, node: cst.CSTNode, facts: ModuleFacts) -> bool:
        return any(scope_strategy(a, facts) for a in self.ancestors(node))

    def _check_load(self, call: cst.Call, facts: ModuleFacts, trained: set[str | None]) -> None:
        if self._in_scope(call, facts):
            return
        statement = self.enclosing_statement(call)
        parent = self.parent(call)
        if not (isinstance(parent, cst.Assign) and len(parent.targets) == 1):
            return
        target = dotted(parent.targets[0].target)
        if target is None or target not in trained:
            return
        replacement = None
        if len(facts.strategies) == 1 and isinstance(statement, cst.SimpleStatementLine):
            strategy = next(iter(facts.strategies))
            if self._bound_before(strategy, facts, statement):
                replacement = cst.With(
                    items=[cst.WithItem(cst.parse_expression(f"{strategy}.scope()"))],
                    body=cst.IndentedBlock(body=[statement.with_changes(leading_lines=[])]),
                    leading_lines=statement.leading_lines,
                )
        self.report(
            call,
            "`load_model` outside `strategy.scope()` of a model that is trained again: its "
            "weights and optimizer state are created for the default strategy, so it trains on "
            "one device (and `fit` inside the scope fails); load it inside `strategy.scope()`",
            replacement=replacement,
            target=statement if replacement is not None else None,
        )

    def _bound_before(self, name: str, facts: ModuleFacts, statement: cst.CSTNode) -> bool:
        """The strategy binding precedes ``statement`` in the same block."""
        block = self.parent(statement)
        if block is None or not hasattr(block, "body"):
            return False
        body = list(block.body)
        if statement not in body:
            return False
        before = body[: body.index(statement)]
        assigns = {id(a) for a in facts.assignments.get(name, [])}
        return any(id(n) in assigns for stmt in before for n in walk(stmt))

    def _check_checkpoint(self, call: cst.Call, facts: ModuleFacts) -> None:
        arg = keyword(call, "optimizer")
        if arg is None or not isinstance(arg.value, cst.Name):
            return
        for assign in facts.assignments.get(arg.value.value, []):
            value = assign.value
            if not isinstance(value, cst.Call):
                continue
            name = self.call_name(value) or ""
            if name.startswith(_OPTIMIZER_PREFIXES) and not self._in_scope(assign, facts):
                self.report(
                    arg.value,
                    f"optimizer `{arg.value.value}` is created outside `strategy.scope()`: its "
                    "restored slots (momentum, Adam moments) are created on first use, which "
                    "fails inside `strategy.run` or makes single-device variables; create the "
                    "optimizer inside the scope",
                )
                return

    # -- multi_gpu_model wrappers -------------------------------------------------------------
    def _check_wrappers(self, facts: ModuleFacts) -> None:
        wrappers: dict[str, str] = {}
        for name, assigns in facts.assignments.items():
            for assign in assigns:
                value = assign.value
                if (
                    isinstance(value, cst.Call)
                    and (self.call_name(value) or "").endswith(".multi_gpu_model")
                    and value.args
                ):
                    template = dotted(value.args[0].value)
                    if template is not None:
                        wrappers[name] = template
        if not wrappers:
            return
        for call in facts.calls:
            if not isinstance(call.func, cst.Attribute):
                continue
            owner = dotted(call.func.value)
            if owner not in wrappers:
                continue
            method = call.func.attr.value
            template = wrappers[owner]
            if method in {"save_weights", "save"}:
                self.report(
                    call,
                    f"`{owner}.{method}` saves the multi_gpu_model wrapper: the file has the "
                    f"wrapper's layout and does not load into `{template}`; save `{template}` "
                    "(same variables)",
                    replacement=call.with_changes(
                        func=call.func.with_changes(value=cst.parse_expression(template))
                    ),
                    target=None,
                )
            elif method in {"fit", "fit_generator"}:
                callbacks = keyword(call, "callbacks")
                if callbacks is None:
                    continue
                for node in self._callback_calls(callbacks.value, facts):
                    if (self.call_name(node) or "").endswith("ModelCheckpoint"):
                        self.report(
                            node,
                            f"`ModelCheckpoint` on the multi_gpu_model wrapper `{owner}` saves "
                            f"the wrapper, not `{template}`: its files do not load into the "
                            "template; save the template (a callback that calls "
                            f"`{template}.save_weights`, or MirroredStrategy, TFM107)",
                        )

    def _callback_calls(
        self, value: cst.BaseExpression, facts: ModuleFacts, depth: int = 3
    ) -> list[cst.Call]:
        """Calls in a ``callbacks=`` expression, following names bound once to a call or to a
        list (`callbacks = [checkpoint, logger]`, also what `callbacks.append(...)` adds)."""
        found: list[cst.Call] = []
        for node in walk(value):
            if isinstance(node, cst.Call):
                found.append(node)
            elif isinstance(node, cst.Name) and depth > 0:
                values = facts.values_of(node.value)
                if len(values) != 1:
                    continue
                if isinstance(values[0], cst.Call):
                    found.append(values[0])
                elif isinstance(values[0], cst.List | cst.Tuple):
                    found += self._callback_calls(values[0], facts, depth - 1)
                    for added in _appended(node.value, facts):
                        found += self._callback_calls(added, facts, depth - 1)
        return found


def _appended(name: str, facts: ModuleFacts) -> list[cst.BaseExpression]:
    """What `name.append(x)` / `name.extend(x)` add to a list variable."""
    return [
        call.args[0].value
        for call in facts.calls
        if isinstance(call.func, cst.Attribute)
        and call.func.attr.value in {"append", "extend"}
        and dotted(call.func.value) == name
        and call.args
    ]
