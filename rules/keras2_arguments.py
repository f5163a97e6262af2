from __future__ import annotations

import libcst as cst

from tfmigrate.rule import Example, FixSafety, Import, Rule
from tfmigrate.rules._device_config import drop_kwarg
from tfmigrate.rules._distribution import analyze, keyword
from tfmigrate.rules._keras2 import RMSPROP_NOTE, plain_rmsprop

_OPTIMIZERS = frozenset(
    {"SGD", "Adam", "RMSprop", "Adagrad", "Adadelta", "Adamax", "Nadam", "Ftrl"}
)
_OPTIMIZER_MODULES = ("keras.optimizers.", "tensorflow.keras.optimizers.")
# Keras 2's lower-case aliases of its optimizer classes (`keras.optimizers.rmsprop = RMSprop`);
# Keras 3 has only the classes (AttributeError at start-up).
_OPTIMIZER_ALIASES = {name.lower(): name for name in _OPTIMIZERS - {"Ftrl"}}
_CALLBACK_MODULES = ("keras.callbacks.", "tensorflow.keras.callbacks.")
# Keras 2's `*_generator` methods; Keras 3 takes generators in the plain methods.
_GENERATOR_METHODS = {
    "fit_generator": "fit",
    "evaluate_generator": "evaluate",
    "predict_generator": "predict",
}
# Keras 2 arguments that Keras 3's fit/evaluate/predict no longer take.
_DROPPED = ("workers", "use_multiprocessing", "max_queue_size")
# Keras 2's positional order of the *_generator methods (after the generator)
_POSITIONAL = {
    "fit_generator": (
        "steps_per_epoch", "epochs", "verbose", "callbacks", "validation_data",
        "validation_steps", "class_weight", "max_queue_size", "workers", "use_multiprocessing",
        "shuffle", "initial_epoch",
    ),
    "evaluate_generator": ("steps", "max_queue_size", "workers", "use_multiprocessing", "verbose"),
    "predict_generator": ("steps", "max_queue_size", "workers", "use_multiprocessing", "verbose"),
}  # fmt: skip


def _is_noop(arg: cst.Arg) -> bool:
    """`decay=0` / `decay=0.0` (no decay) or `epsilon=None` (Keras 2: the backend's 1e-7)."""
    name = arg.keyword.value if arg.keyword is not None else None
    value = arg.value
    if name == "decay":
        return isinstance(value, cst.Integer | cst.Float) and value.evaluated_value == 0
    return name == "epsilon" and isinstance(value, cst.Name) and value.value == "None"


def _rename_keyword(call: cst.Call, old: str, new: str) -> cst.Call:
    args = [
        a.with_changes(keyword=cst.Name(new)) if a.keyword and a.keyword.value == old else a
        for a in call.args
    ]
    return call.with_changes(args=args)


class Keras2Arguments(Rule):
    """
    ## What it does
    Flags Keras 2 argument and method names that Keras 3 renamed or dropped: an optimizer's
    `lr=` (Keras 3: `learning_rate=`), `decay=` and `epsilon=None`, `fit(nb_epoch=...)`
    (Keras 1/2: `epochs=`), `ModelCheckpoint(period=...)`, and
    `fit_generator`/`evaluate_generator`/`predict_generator`.

    ## Why is this bad?
    Keras 3 optimizers raise `ValueError: Argument(s) not recognized: {'lr': ...}`, Keras 3
    models have no `fit_generator` (`AttributeError`) and Keras 3's `ModelCheckpoint` takes no
    `period` (`TypeError`), so a Keras 2 script stops before its first step. `epsilon=None`
    (Keras 2: the backend's `K.epsilon()`, 1e-7) is accepted and fails at the first update
    (`ValueError`: None cannot become a tensor). `decay=` is worse: Keras 3 accepts and ignores
    it (a warning), so the learning rate silently stops decaying. Keras 2 used
    `lr / (1 + decay * iterations)`, which is
    `keras.optimizers.schedules.InverseTimeDecay(lr, decay_steps=1, decay_rate=decay)`: measured
    on TF 2.21 (SGD, lr 0.5, decay 0.1, momentum 0.9, 5 steps of `fit`), tf.keras 2's legacy
    SGD with `decay` and Keras 3's SGD with that schedule end with weights within 1.5e-7; and
    `tfmigrate verify` of a `tf.keras.utils.multi_gpu_model` script with
    `SGD(lr=0.01, decay=0.1, momentum=0.9)` against its rewrite (2 replicas, 6 steps) finds them
    equivalent with the schedule (weights within 6e-8) and diverging from step 2 with `decay=`
    left in place (weights 0.023 apart after 6 steps).
    A Keras 2 `RMSprop` without momentum (in a call or file that is Keras 2 code) is reported
    too: Keras 2 stepped `lr * g / (sqrt(ms) + epsilon)` and Keras 3 steps
    `lr * g / sqrt(ms + epsilon)`; `tfmigrate verify` of a Keras 2 classifier with
    `RMSprop(lr=0.001)` against its rewrite (2 replicas, 4 steps) measured weights up to 6.1e-3
    apart (equivalent with SGD); `epsilon=1e-14` in Keras 3 narrowed that to 7.9e-4, so no
    setting is offered as a fix. These are separate from TFM107 because they occur in every
    Keras 2 script, with or without `multi_gpu_model`.

    ## Example
    ```python
    model.compile(optimizer=SGD(lr=0.01, decay=1e-4), loss='mse')
    model.fit_generator(batches, steps_per_epoch=100, nb_epoch=10)
    ```
    Use instead:
    ```python
    model.compile(optimizer=SGD(learning_rate=keras.optimizers.schedules.InverseTimeDecay(
        0.01, decay_steps=1, decay_rate=1e-4)), loss='mse')
    model.fit(batches, steps_per_epoch=100, epochs=10)
    ```

    ## Fix safety
    Safe: `lr` → `learning_rate`, `nb_epoch` → `epochs` and `fit_generator(gen, ...)` →
    `fit(gen, ...)` name the same thing; `decay=0`, `epsilon=None` and `period=1` are Keras 3's
    defaults and go. Unsafe: `decay=d` becomes the `InverseTimeDecay` schedule above (equal to
    tf.keras 2; standalone Keras 2 read the step count in the same graph step as its increment,
    with no order between them). A `*_generator` call's arguments after the generator are
    given by their Keras 2 names (Keras 3's second positional is `y`; `generator=` is `x=`);
    its `workers`,
    `use_multiprocessing` and `max_queue_size` (Keras 3 moved them to `keras.utils.PyDataset`'s
    constructor) go, unsafe: the batches are then loaded in the training thread (a `Sequence`
    gives the same batches in the same order, more slowly; a plain generator that Keras 2
    copied into each worker process with `use_multiprocessing` repeated its batches, and no
    longer does). `decay=` without a learning rate given, and `period=` other than 1 (an
    integer `save_freq` counts batches, not epochs), are reported only.
    """

    code = "TFM112"
    triggers = (
        *(m.rstrip(".") for m in _OPTIMIZER_MODULES),
        "nb_epoch",
        *_GENERATOR_METHODS,
        "ModelCheckpoint",
    )
    name = "keras2-arguments"
    summary = (
        "Keras 2 argument/method names Keras 3 renamed or dropped (lr=, decay=, fit_generator)"
    )
    fix_safety = FixSafety.SAFE

    valid = (
        "import keras\nopt = keras.optimizers.Adam(learning_rate=1e-3)\nmodel.fit(x, y, epochs=3)\n",
        # Not a Keras optimizer.
        "import keras\nimport torch\nopt = torch.optim.SGD(params, lr=0.1, weight_decay=1e-4)\n",
        # A user's own optimizer class named like Keras's.
        "import keras\nfrom myproject.optim import Adam\nopt = Adam(lr=0.1, decay=0.9)\n",
    )
    invalid = (
        Example(
            """
            from keras.optimizers import Adam
            model.compile(optimizer=Adam(lr=1e-3), loss='mse')
            model.fit(x, y, nb_epoch=10)
            """,
            fixed="""
            from keras.optimizers import Adam
            model.compile(optimizer=Adam(learning_rate=1e-3), loss='mse')
            model.fit(x, y, epochs=10)
            """,
            message="learning_rate",
        ),
        Example(
            """
            import keras
            opt = keras.optimizers.SGD(lr=0.01, momentum=0.9, decay=1e-6)
            """,
            fixed="""
            import keras
            opt = keras.optimizers.SGD(learning_rate=keras.optimizers.schedules.InverseTimeDecay(0.01, decay_steps=1, decay_rate=1e-6), momentum=0.9)
            """,
            message="InverseTimeDecay",
        ),
        # Imported by name: the schedule needs `keras`; a positional rate stays positional.
        Example(
            """
            from tensorflow.keras.optimizers import Adam
            opt = Adam(3e-4, decay=lr_decay)
            """,
            fixed="""
            from tensorflow.keras.optimizers import Adam
            import keras

            opt = Adam(keras.optimizers.schedules.InverseTimeDecay(3e-4, decay_steps=1, decay_rate=lr_decay))
            """,
        ),
        # Keras 2 no-ops: no decay, the backend's epsilon, a checkpoint every epoch.
        Example(
            """
            from keras.callbacks import ModelCheckpoint
            from keras.optimizers import RMSprop
            opt = RMSprop(lr=0.001, rho=0.9, epsilon=None, decay=0.0)
            checkpoint = ModelCheckpoint('weights.{epoch:02d}.h5', period=1)
            """,
            fixed="""
            from keras.callbacks import ModelCheckpoint
            from keras.optimizers import RMSprop
            opt = RMSprop(learning_rate=0.001, rho=0.9)
            checkpoint = ModelCheckpoint('weights.{epoch:02d}.h5')
            """,
            message="ValueError at the first step",
        ),
        # No learning rate to put in the schedule; a checkpoint every 5 epochs: a person decides.
        Example(
            """
            import keras
            opt = keras.optimizers.Adam(decay=1e-5)
            checkpoint = keras.callbacks.ModelCheckpoint('best.h5', period=5)
            """,
            message="not fixed",
        ),
        # Keras 2's lower-case alias: the class, then its Keras 2 arguments.
        Example(
            """
            import keras
            opt = keras.optimizers.rmsprop(lr=0.0001)
            """,
            fixed="""
            import keras
            opt = keras.optimizers.RMSprop(learning_rate=0.0001)
            """,
            message="alias of `RMSprop`",
        ),
        Example(
            """
            import tensorflow as tf
            history = model.fit_generator(train_gen, steps_per_epoch=50, epochs=2)
            scores = model.evaluate_generator(val_gen, steps=10)
            """,
            fixed="""
            import tensorflow as tf
            history = model.fit(train_gen, steps_per_epoch=50, epochs=2)
            scores = model.evaluate(val_gen, steps=10)
            """,
        ),
        # Worker arguments moved to PyDataset: dropped (unsafe); positional ones get names.
        Example(
            """
            import keras
            model.fit_generator(gen, 100, workers=4, use_multiprocessing=True)
            model.evaluate_generator(generator=val_gen, steps=10, max_queue_size=8)
            """,
            fixed="""
            import keras
            model.fit(gen, steps_per_epoch=100)
            model.evaluate(x=val_gen, steps=10)
            """,
            message="PyDataset",
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        name = self.call_name(node) or ""
        if name.startswith("keras.optimizers.") and name.rsplit(".", 1)[1] in _OPTIMIZER_ALIASES:
            self._alias(node, name.rsplit(".", 1)[1])
        elif name.startswith(_OPTIMIZER_MODULES) and name.rsplit(".", 1)[1] in _OPTIMIZERS:
            self._optimizer(node)
        elif name.startswith(_CALLBACK_MODULES) and name.endswith(".ModelCheckpoint"):
            self._checkpoint(node)
        elif isinstance(node.func, cst.Attribute):
            method = node.func.attr.value
            if method in _GENERATOR_METHODS:
                self._generator(node, method)
            elif method == "fit" and keyword(node, "nb_epoch") is not None:
                self.report(
                    node,
                    "`fit(nb_epoch=...)` is Keras 1/2; Keras 3 calls it `epochs=`",
                    replacement=_rename_keyword(node, "nb_epoch", "epochs"),
                )

    def _alias(self, node: cst.Call, alias: str) -> None:
        """`keras.optimizers.rmsprop(...)` is the class `RMSprop`: renamed (its arguments are
        then read as the class's, in the next pass)."""
        cls = _OPTIMIZER_ALIASES[alias]
        message = f"`optimizers.{alias}` is Keras 2's alias of `{cls}`; Keras 3 has only the class"
        if not isinstance(node.func, cst.Attribute):
            self.report(node, f"{message} (not fixed: imported by its alias name)")
            return
        func = node.func.with_changes(attr=cst.Name(cls))
        self.report(node, message, replacement=node.with_changes(func=func))

    def _optimizer(self, node: cst.Call) -> None:
        # The safe changes to one call make one replacement that their findings share; the
        # decay schedule (unsafe) is reported last, so a pass applies the safe ones first and
        # the next pass finds the decay again on the renamed call.
        decay, epsilon = keyword(node, "decay"), keyword(node, "epsilon")
        dropped = [a for a in (decay, epsilon) if a is not None and _is_noop(a)]
        fixed = node
        for arg in dropped:
            assert arg.keyword is not None
            fixed = drop_kwarg(fixed, arg.keyword.value)
        if keyword(node, "lr") is not None:
            fixed = _rename_keyword(fixed, "lr", "learning_rate")
            self.report(
                node,
                "Keras 3 optimizers take `learning_rate=`, not Keras 2's `lr=` (ValueError)",
                replacement=fixed,
            )
        if epsilon is not None and epsilon in dropped:
            self.report(
                epsilon,
                "`epsilon=None` meant Keras 2's `K.epsilon()` (1e-7); Keras 3 optimizers fail on "
                "None (ValueError at the first step) and default to 1e-7, so it goes",
                replacement=fixed,
                target=node,
            )
        if plain_rmsprop(node, self.call_name(node)) and (dropped or self._keras2(node)):
            # a finding of its own position: one per rule and position is kept
            self.report(node.args[0] if node.args else node, f"{RMSPROP_NOTE} (not fixed)")
        if decay is not None:
            value = self.context.module.code_for_node(decay.value)
            if decay in dropped:
                self.report(
                    decay,
                    f"`decay={value}`: no decay; Keras 3 dropped the argument (it warns and "
                    "ignores it), so it goes",
                    replacement=fixed,
                    target=node,
                )
            else:
                self._decay(node, decay, value)

    def _keras2(self, node: cst.Call) -> bool:
        """Whether ``node`` or its file is Keras 2 code (Keras 2 arguments, multi_gpu_model,
        sessions, `*_generator` methods)."""
        if any(keyword(node, k) is not None for k in ("lr", "decay")):
            return True
        facts = self.context.shared(
            "distribution-facts", lambda: analyze(self.context.module, self.context.resolver)
        )
        for call in facts.calls:
            name = self.call_name(call) or ""
            if name.endswith((".multi_gpu_model", ".set_session", ".get_session")):
                return True
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value in _GENERATOR_METHODS:
                return True
        return False

    def _decay(self, node: cst.Call, decay: cst.Arg, value: str) -> None:
        message = (
            f"`decay={value}`: Keras 3 optimizers ignore it (a warning only), so the learning "
            "rate would stop decaying; Keras 2's `lr / (1 + decay * iterations)` is "
            f"`InverseTimeDecay(lr, decay_steps=1, decay_rate={value})`"
        )
        rate = keyword(node, "lr") or keyword(node, "learning_rate", 0)
        if rate is None or isinstance(rate.value, cst.Call):
            self.report(decay, f"{message} (not fixed: pass the learning rate to the schedule)")
            return
        imports: tuple[Import, ...] = ()
        func = node.func
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Attribute):
            schedule = f"{self.context.module.code_for_node(func.value)}.schedules.InverseTimeDecay"
        else:
            keras = self.context.resolver.local_name_for("keras")
            if keras is None:
                keras, imports = "keras", (Import("keras"),)
            schedule = f"{keras}.optimizers.schedules.InverseTimeDecay"
        call = cst.parse_expression(f"{schedule}(x, decay_steps=1, decay_rate=x)")
        assert isinstance(call, cst.Call)
        call = call.with_changes(
            args=[
                call.args[0].with_changes(value=rate.value),
                call.args[1],
                call.args[2].with_changes(value=decay.value),
            ]
        )
        args = []
        for arg in node.args:
            if arg is decay:
                continue
            if arg is rate:
                keep = rate.keyword is None  # positional: it stays positional
                arg = arg.with_changes(
                    value=call,
                    keyword=None if keep else cst.Name("learning_rate"),
                    equal=cst.MaybeSentinel.DEFAULT if keep else arg.equal,
                )
            args.append(arg)
        # the new last argument must not keep a trailing comma the call did not have
        args[-1] = args[-1].with_changes(comma=node.args[-1].comma)
        self.report(
            decay,
            f"{message}: the schedule replaces it (measured equal to tf.keras 2's decay)",
            replacement=node.with_changes(args=args),
            target=node,
            safety=FixSafety.UNSAFE,
            imports=imports,
        )

    def _checkpoint(self, node: cst.Call) -> None:
        period = keyword(node, "period")
        if period is None:
            return
        value = self.context.module.code_for_node(period.value)
        message = (
            f"`ModelCheckpoint(period={value})` is Keras 2; Keras 3 has no `period` (TypeError) "
            "and saves every epoch with its default `save_freq='epoch'`"
        )
        if isinstance(period.value, cst.Integer) and period.value.evaluated_value == 1:
            self.report(period, f"{message}, which `period=1` meant", replacement=drop_kwarg(
                node, "period"), target=node)  # fmt: skip
            return
        self.report(
            period,
            f"{message} (not fixed: an integer `save_freq` counts batches, so every {value} "
            "epochs is `save_freq=steps_per_epoch * "
            f"{value}`, or a callback that saves on `on_epoch_end`)",
        )

    def _generator(self, node: cst.Call, method: str) -> None:
        new = _GENERATOR_METHODS[method]
        message = f"`{method}` is gone in Keras 3: `{new}` takes generators and datasets"
        names = _POSITIONAL[method]
        args: list[cst.Arg] = []
        for index, arg in enumerate(node.args):
            if arg.star:
                self.report(node, f"{message} (not fixed: called with *args / **kwargs)")
                return
            if arg.keyword is None and index > 0:
                # Keras 3's second positional is `y`: the rest go by their Keras 2 names
                if index - 1 >= len(names):
                    self.report(node, f"{message} (not fixed: too many positional arguments)")
                    return
                arg = arg.with_changes(
                    keyword=cst.Name(names[index - 1]),
                    equal=cst.AssignEqual(
                        whitespace_before=cst.SimpleWhitespace(""),
                        whitespace_after=cst.SimpleWhitespace(""),
                    ),
                )
            args.append(arg)
        dropped = [a for a in args if a.keyword is not None and a.keyword.value in _DROPPED]
        kept = [a for a in args if a not in dropped]
        if dropped:
            kept[-1] = kept[-1].with_changes(comma=args[-1].comma)
        fixed = node.with_changes(args=kept)
        if keyword(fixed, "generator") is not None:  # Keras 3 calls the data `x`
            fixed = _rename_keyword(fixed, "generator", "x")
        if keyword(fixed, "nb_epoch") is not None:
            fixed = _rename_keyword(fixed, "nb_epoch", "epochs")
        assert isinstance(fixed.func, cst.Attribute)
        fixed = fixed.with_changes(func=fixed.func.with_changes(attr=cst.Name(new)))
        if not dropped:
            self.report(node, message, replacement=fixed)
            return
        shown = ", ".join(f"`{a.keyword.value}`" for a in dropped if a.keyword is not None)
        self.report(
            node,
            f"{message}; Keras 3 has no {shown} there (they moved to `keras.utils.PyDataset`'s "
            "constructor): dropped, so the batches are loaded in the training thread -- the "
            "same batches of a `Sequence` in the same order, more slowly; a generator that "
            "`use_multiprocessing` copied into each worker process no longer repeats its batches",
            replacement=fixed,
            safety=FixSafety.UNSAFE,
        )
