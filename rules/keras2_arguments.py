from __future__ import annotations

import libcst as cst

from tfmigrate.rule import Example, FixSafety, Rule
from tfmigrate.rules._distribution import keyword

_OPTIMIZERS = frozenset(
    {"SGD", "Adam", "RMSprop", "Adagrad", "Adadelta", "Adamax", "Nadam", "Ftrl"}
)
_OPTIMIZER_MODULES = ("keras.optimizers.", "tensorflow.keras.optimizers.")
# Keras 2's `*_generator` methods; Keras 3 takes generators in the plain methods.
_GENERATOR_METHODS = {
    "fit_generator": "fit",
    "evaluate_generator": "evaluate",
    "predict_generator": "predict",
}
# Keras 2 arguments that Keras 3's fit/evaluate/predict no longer take.
_DROPPED = ("workers", "use_multiprocessing", "max_queue_size")


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
    `lr=` (Keras 3: `learning_rate=`) and `decay=`, `fit(nb_epoch=...)` (Keras 1/2: `epochs=`),
    and `fit_generator`/`evaluate_generator`/`predict_generator`.

    ## Why is this bad?
    Keras 3 optimizers raise `ValueError: Argument(s) not recognized: {'lr': ...}` and Keras 3
    models have no `fit_generator` (`AttributeError`), so a Keras 2 script stops before its first
    step. `decay=` is worse: Keras 3 accepts and ignores it (a warning), so the learning rate
    silently stops decaying. Keras 2 used `lr / (1 + decay * iterations)`, which is
    `keras.optimizers.schedules.InverseTimeDecay(lr, decay_steps=1, decay_rate=decay)` — up to
    whether the step count is read before or after the update, which is why this is left to a
    person. These are separate from TFM107 because they occur in every Keras 2 script, with or
    without `multi_gpu_model`.

    ## Example
    ```python
    model.compile(optimizer=Adam(lr=1e-3), loss='mse')
    model.fit_generator(batches, steps_per_epoch=100, nb_epoch=10)
    ```
    Use instead:
    ```python
    model.compile(optimizer=Adam(learning_rate=1e-3), loss='mse')
    model.fit(batches, steps_per_epoch=100, epochs=10)
    ```

    ## Fix safety
    Safe: `lr` → `learning_rate`, `nb_epoch` → `epochs` and `fit_generator(gen, ...)` →
    `fit(gen, ...)` name the same thing. A `*_generator` call with more than one positional
    argument (Keras 3's second positional is `y`), or with `workers`/`use_multiprocessing`/
    `max_queue_size` (Keras 3 moved them to `keras.utils.PyDataset`), and every `decay=`, are
    reported only.
    """

    code = "TFM112"
    triggers = (*(m.rstrip(".") for m in _OPTIMIZER_MODULES), "nb_epoch", "_generator")
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
            opt = keras.optimizers.SGD(learning_rate=0.01, momentum=0.9, decay=1e-6)
            """,
            message="InverseTimeDecay",
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
        # Worker arguments moved to PyDataset: a person decides.
        Example(
            """
            import keras
            model.fit_generator(gen, 100, workers=4, use_multiprocessing=True)
            """,
            message="PyDataset",
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        name = self.call_name(node) or ""
        if name.startswith(_OPTIMIZER_MODULES) and name.rsplit(".", 1)[1] in _OPTIMIZERS:
            self._optimizer(node)
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

    def _optimizer(self, node: cst.Call) -> None:
        decay = keyword(node, "decay")
        if decay is not None:
            value = self.context.module.code_for_node(decay.value)
            self.report(
                decay,
                f"`decay={value}`: Keras 3 optimizers ignore it (a warning only), so the "
                "learning rate stops decaying; Keras 2 used `lr / (1 + decay * iterations)`: "
                "pass `learning_rate=keras.optimizers.schedules.InverseTimeDecay(lr, "
                f"decay_steps=1, decay_rate={value})` instead",
            )
        if keyword(node, "lr") is not None:
            self.report(
                node,
                "Keras 3 optimizers take `learning_rate=`, not Keras 2's `lr=` (ValueError)",
                replacement=_rename_keyword(node, "lr", "learning_rate"),
            )

    def _generator(self, node: cst.Call, method: str) -> None:
        new = _GENERATOR_METHODS[method]
        message = f"`{method}` is gone in Keras 3: `{new}` takes generators and datasets"
        dropped = [a.keyword.value for a in node.args if a.keyword and a.keyword.value in _DROPPED]
        positional = [a for a in node.args if a.keyword is None]
        if dropped:
            self.report(
                node,
                f"{message} (not fixed: Keras 3 has no {', '.join(dropped)}; set them on a "
                "`keras.utils.PyDataset`)",
            )
            return
        if len(positional) > 1:
            self.report(node, f"{message} (not fixed: pass the arguments after the data by name)")
            return
        fixed = node
        if keyword(node, "nb_epoch") is not None:
            fixed = _rename_keyword(node, "nb_epoch", "epochs")
        assert isinstance(fixed.func, cst.Attribute)
        fixed = fixed.with_changes(func=fixed.func.with_changes(attr=cst.Name(new)))
        self.report(node, message, replacement=fixed)
