from __future__ import annotations

import libcst as cst

from tfmigrate import tfapi
from tfmigrate.names import dotted
from tfmigrate.rule import Example, FixSafety

from ._tf_api import ApiNameRule, contrib_advice

# Names other rules own: Keras 2 multi-GPU and session plumbing (TFM107, TFM108).
_COVERED = ("multi_gpu_model", "set_session", "get_session")
# Functions that return a Keras model (the data has no return types).
_MODEL_FACTORIES = (
    "keras.models.load_model",
    "keras.saving.load_model",
    "keras.models.clone_model",
    "keras.models.model_from_json",
    "keras.applications.",
)
_STRATEGY_FACTORIES = ("tf.distribute.get_strategy",)
# The famous answers that name APIs which never existed, with what to do instead.
_ALTERNATIVES = {
    "unwrap_model": "the model built inside `strategy.scope()` is the model: save, load and "
    "call it directly",
    "experimental_run_v2": "use `strategy.run`",
    "training": "`predict`/`evaluate` always run in inference mode; for an explicit mode call "
    "the model: `model(x, training=False)`",
    "workers": "Keras 3 dropped it: parallelize the input with `tf.data` or a "
    "`keras.utils.PyDataset(workers=...)`",
    "use_multiprocessing": "Keras 3 dropped it: use `keras.utils.PyDataset(use_multiprocessing=...)`",
    "max_queue_size": "Keras 3 dropped it: use `keras.utils.PyDataset(max_queue_size=...)`",
}
_MODEL_METHODS = ("predict", "predict_on_batch", "evaluate")
# Strategy methods TF renamed without changing what they do: the fix is the new name.
_RENAMED_STRATEGY_METHODS = {"experimental_run_v2": "run"}


def _keras(name: str) -> str:
    """``tf.keras.X`` and ``keras.X`` are the same Keras 3 API."""
    return "keras." + name[len("tf.keras.") :] if name.startswith("tf.keras.") else name


def _checked_class(name: str) -> bool:
    """Classes whose methods are checked: strategies, Keras models and optimizers. Other
    classes often get instance attributes that ``dir(class)`` does not list."""
    members = tfapi.class_members(name)
    return (
        name.startswith(("tf.distribute.", "keras.optimizers."))
        or {"fit", "predict", "compile"} <= members
    )


class NonexistentTf2Api(ApiNameRule):
    """
    ## What it does
    In TF2 code (files that use `tf.distribute`, `tf.keras` or Keras 3 and no TF1 session
    code), flags names that do not exist in TensorFlow 2.x: attributes of `tf.`/`keras.` that
    the API does not have (`tf.contrib`, `tf.Session`, removed Keras modules), methods that a
    strategy, Keras model or optimizer does not have (`strategy.unwrap_model`), and keyword
    arguments that a TF/Keras function does not take (`model.predict(x, training=False)`,
    `fit(workers=4)`). The check uses a data file generated from TensorFlow's public API, so it
    does not depend on what is installed where the tool runs.

    ## Why is this bad?
    These spellings circulate in answers and old tutorials; they fail at run time
    (`AttributeError`, `TypeError: unexpected keyword argument`), often only after a long
    start-up, or on the one code path that was not tested. The message names the real
    alternative where there is one.

    ## Example
    ```python
    import tensorflow as tf
    strategy = tf.distribute.MirroredStrategy()
    model = strategy.unwrap_model(parallel_model)
    y = model.predict(x, training=False)
    ```
    Use instead:
    ```python
    import tensorflow as tf
    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = build_model()
    y = model.predict(x)
    ```

    ## Fix safety
    Manual: what to call instead depends on what the code meant. One exception is safe: a
    strategy's `experimental_run_v2`, which TF 2.2 renamed `run` (same arguments and
    behaviour; TF 2.4 removed the old name), becomes `run`. Methods are checked on
    variables assigned from a TF/Keras constructor (or a Keras model factory) in the same file;
    `predict`/`evaluate` with `training=` are flagged on any receiver.
    """

    code = "TFM205"
    # Reports only in TF2 code (_tf_api.classify): names under these prefixes make a file TF2.
    triggers = ("tensorflow.distribute*", "tensorflow.keras*", "tensorflow.function*", "keras*")
    name = "nonexistent-tf2-api"
    summary = "TF/Keras name, method or keyword that does not exist in TensorFlow 2.x"
    fix_safety = FixSafety.MANUAL

    valid = (
        "import tensorflow as tf\nstrategy = tf.distribute.MirroredStrategy()\n"
        "with strategy.scope():\n    model = tf.keras.Sequential()\n"
        "strategy.run(step, args=(x,))\ny = model.predict(x, batch_size=8)\n",
        # TF1 code: TFM301/TFM302 speak there.
        "import tensorflow as tf\nsess = tf.Session()\nm = tf.keras.models.load_model(p)\n"
        "y = m.predict(x, training=False)\n",
        # A user's own class may define what Keras lacks.
        "import keras\nclass Net(keras.Model):\n    def unwrap_model(self):\n        return self\n"
        "net = Net()\nnet.unwrap_model()\n",
        # Not a TF object: other libraries have unwrap_model.
        "import tensorflow as tf\nimport accelerate\nacc = accelerate.Accelerator()\n"
        "s = tf.distribute.MirroredStrategy()\nm = acc.unwrap_model(model)\n",
        "import keras\nfrom keras.utils import multi_gpu_model\np = multi_gpu_model(m, gpus=2)\n",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy()
            losses = strategy.experimental_run_v2(step_fn, args=(batch,))
            """,
            fixed="""
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy()
            losses = strategy.run(step_fn, args=(batch,))
            """,
            message="has no method `experimental_run_v2`",
        ),
        Example(
            """
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy()
            model = strategy.unwrap_model(parallel_model)
            """,
            message="`tf.distribute.MirroredStrategy` has no method `unwrap_model`",
        ),
        Example(
            """
            import tensorflow as tf
            model = tf.keras.models.load_model('m.keras')
            y = model.predict(x, training=False)
            """,
            message="`keras.Model.predict` has no argument `training`",
        ),
        Example(
            """
            from tensorflow import keras
            y = net.predict(images, training=False)
            """,
            message="if `net` is a Keras model",
        ),
        Example(
            """
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy()
            init = tf.contrib.layers.xavier_initializer()
            """,
            message="`tf.contrib` does not exist",
        ),
        Example(
            """
            import keras
            model = keras.Sequential([keras.layers.Dense(1)])
            model.fit(x, y, workers=4, use_multiprocessing=True)
            from keras.layers.experimental import preprocessing
            """,
            message="`keras.layers.experimental` does not exist",
        ),
        Example(
            """
            import tensorflow as tf
            s = tf.distribute.MirroredStrategy(devices=['/gpu:0'])
            m = tf.reduce_mean(x, keep_dims=True)
            """,
            message="`keep_dims` (TF2 calls it `keepdims`)",
        ),
    )

    def __init__(self, context) -> None:
        super().__init__(context)
        self.calls: list[cst.Call] = []
        self.types: dict[str, set[str | None]] = {}
        self.user_classes: dict[str, tuple[str, frozenset[str]]] = {}

    # -- collection ---------------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        for base in node.bases:
            qualified = self.qualify(base.value)
            if qualified is None:
                continue
            name = _keras(tfapi.tf_spelling(qualified))
            if tfapi.lookup(name) is not None:
                body = node.body.body if isinstance(node.body, cst.IndentedBlock) else ()
                defined = frozenset(s.name.value for s in body if isinstance(s, cst.FunctionDef))
                self.user_classes[node.name.value] = (name, defined)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            key = dotted(target.target)
            if key is not None:
                self.types.setdefault(key, set()).add(self._type_of(node.value))

    def _type_of(self, value: cst.BaseExpression) -> str | None:
        if not isinstance(value, cst.Call):
            return None
        if isinstance(value.func, cst.Name) and value.func.value in self.user_classes:
            return "user:" + value.func.value
        qualified = self.call_name(value)
        if qualified is None:
            return None
        name = _keras(tfapi.tf_spelling(qualified))
        if name.startswith(_MODEL_FACTORIES):
            return "keras.Model"
        if name in _STRATEGY_FACTORIES:
            return "tf.distribute.Strategy"
        entry = tfapi.lookup(name)
        return name if entry is not None and entry.kind == tfapi.CLASS else None

    # -- checks -------------------------------------------------------------------------------
    def finish(self, kind: str | None) -> None:
        if kind != "tf2":
            return
        for alias, raw in self.imports:
            self._check_exists(alias, tfapi.tf_spelling(raw), written_from=1)
        for node, raw, binding in self.chains:
            written_from = len(tfapi.tf_spelling(binding).split("."))
            self._check_exists(node, tfapi.tf_spelling(raw), written_from)
        for call in self.calls:
            self._check_call(call)

    def _check_exists(self, node: cst.CSTNode, name: str, written_from: int) -> None:
        if name.rsplit(".", 1)[-1] in _COVERED or tfapi.exists(name) is not False:
            return
        head, _, last = name.rpartition(".")
        if head in ("keras.backend", "tf.keras.backend"):
            return  # Keras 2 backend functions: TFM113 speaks
        parts = name.split(".")
        missing = name
        for end in range(2, len(parts) + 1):
            missing = ".".join(parts[:end])
            if tfapi.exists(missing) is False:
                break
        if end <= written_from:
            return  # the binding itself is missing: reported where it was bound
        self.report(
            node,
            f"`{missing}` does not exist in TensorFlow {tfapi.versions()['tensorflow']}"
            f"{self._alternative(missing, name)}",
        )

    def _alternative(self, name: str, full: str) -> str:
        if name == "tf.contrib" or name.startswith("tf.contrib."):
            return f" (`{full}`): {contrib_advice(full)}"
        found = tfapi.tf2_rename(name)
        if found is not None and found[0] == name:
            return f"; TF1's API has it as `{found[1]}` (TF's upgrade table)"
        return ""

    def _check_call(self, call: cst.Call) -> None:
        keywords = [a for a in call.args if a.keyword is not None]
        qualified = self.call_name(call)
        if qualified is not None:
            name = tfapi.tf_spelling(qualified)
            entry = tfapi.lookup(name)
            if entry is not None and entry.kind in (tfapi.FUNCTION, tfapi.CLASS):
                self._check_keywords(call, name, entry.params, keywords)
            return
        if not isinstance(call.func, cst.Attribute):
            return
        receiver = dotted(call.func.value)
        method = call.func.attr.value
        types = self.types.get(receiver or "", set())
        if receiver is None or len(types) != 1 or None in types:
            self._check_untyped(call, receiver, method, keywords)
            return
        (cls,) = types
        assert cls is not None  # excluded above
        if cls.startswith("user:"):
            cls, defined = self.user_classes[cls[5:]]
            if method in defined:
                return
        if not _checked_class(cls):
            return
        entry = tfapi.lookup(f"{cls}.{method}")
        if entry is None:
            if tfapi.exists(cls):
                hint = _ALTERNATIVES.get(method, "")
                renamed = _RENAMED_STRATEGY_METHODS.get(method)
                fix = None
                if renamed and cls.startswith("tf.distribute.") and tfapi.lookup(f"{cls}.{renamed}"):
                    fix = call.with_changes(func=call.func.with_changes(attr=cst.Name(renamed)))
                self.report(
                    call,
                    f"`{receiver}.{method}`: `{cls}` has no method `{method}` in TensorFlow "
                    f"{tfapi.versions()['tensorflow']}" + (f"; {hint}" if hint else ""),
                    replacement=fix,
                    safety=FixSafety.SAFE if fix is not None else None,
                )
            return
        self._check_keywords(call, f"{cls}.{method}", entry.params, keywords)

    def _check_untyped(
        self, call: cst.Call, receiver: str | None, method: str, keywords: list[cst.Arg]
    ) -> None:
        """`x.predict(..., training=...)` is wrong for any Keras model; say so conditionally."""
        if method not in _MODEL_METHODS or receiver is None:
            return
        params = tfapi.lookup(f"keras.Model.{method}")
        for arg in keywords:
            if arg.keyword is None:  # keywords only
                continue
            if arg.keyword.value == "training" and not tfapi.accepts_keyword(
                params.params if params else None, "training"
            ):
                self.report(
                    call,
                    f"if `{receiver}` is a Keras model: `{method}` has no argument `training`; "
                    + _ALTERNATIVES["training"],
                )

    def _check_keywords(
        self, call: cst.Call, name: str, params: tuple[str, ...] | None, keywords: list[cst.Arg]
    ) -> None:
        # One finding per call (the engine keeps one per position and code).
        problems = []
        for arg in keywords:
            if arg.keyword is None:  # keywords only
                continue
            keyword = arg.keyword.value
            if tfapi.accepts_keyword(params, keyword) is not False:
                continue
            old = tfapi.keyword_renames(name).get(keyword)
            hint = _ALTERNATIVES.get(keyword) or (f"TF2 calls it `{old}`" if old else "")
            problems.append(f"`{keyword}`" + (f" ({hint})" if hint else ""))
        if problems:
            noun = "argument" if len(problems) == 1 else "arguments"
            self.report(
                call,
                f"`{name}` has no {noun} {', '.join(problems)} in TensorFlow "
                f"{tfapi.versions()['tensorflow']}",
            )
