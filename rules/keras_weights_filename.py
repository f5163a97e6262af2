from __future__ import annotations

import libcst as cst

from tfmigrate.names import dotted
from tfmigrate.rule import Example, FixSafety, Rule
from tfmigrate.rules._distribution import analyze, is_false, is_true, keyword

WEIGHTS = ".weights.h5"
MODEL = ".keras"
_H5 = (".h5", ".hdf5")
_HDF5 = (".hdf5",)
_LOAD_MODEL = ("keras.models.load_model", "keras.saving.load_model")
# Files that still run on Keras 2 (or tf_keras), where `.h5` weights are right: the Keras 2
# conversion rules go first, and this rule fires on their output.
_KERAS2_MARKERS = ("multi_gpu_model", "tf_keras")
# TF1 sessions mark a Keras 2 file too, unless it already trains under a tf.distribute strategy
# (TFM107's output keeps a `set_session` that TFM108 leaves to a person).
_SESSION_MARKERS = (
    "keras.backend.set_session",
    "keras.backend.get_session",
    "tensorflow.Session",
    "tensorflow.contrib",
)
_DISTRIBUTE = "tensorflow.distribute."


def _file_literal(node: cst.BaseExpression) -> cst.BaseExpression:
    """The literal that ends the file name: ``node`` or the last part of ``os.path.join``."""
    if (
        isinstance(node, cst.Call)
        and node.args
        and dotted(node.func) in {"os.path.join", "path.join"}
        and node.args[-1].keyword is None
    ):
        return node.args[-1].value
    return node


def _literal_text(node: cst.BaseExpression) -> str | None:
    """The text of a string literal (the literal tail of an f-string), else None."""
    if isinstance(node, cst.SimpleString) and "b" not in node.prefix.lower():
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    if isinstance(node, cst.FormattedString) and node.parts:
        last = node.parts[-1]
        return last.value if isinstance(last, cst.FormattedStringText) else None
    return None


def _renamed(
    node: cst.BaseExpression, new: str = WEIGHTS, old: tuple[str, ...] = _H5
) -> cst.BaseExpression | None:
    """The literal with its ``old`` suffix (`.h5`/`.hdf5`) replaced by ``new``."""
    text = _literal_text(node)
    if text is None or not text.lower().endswith(old):
        return None
    if isinstance(node, cst.SimpleString):
        raw = node.value
        quote_end = len(raw) - len(node.quote)
        body = raw[:quote_end]
        for suffix in old:
            if body.lower().endswith(suffix):
                return node.with_changes(value=body[: -len(suffix)] + new + raw[quote_end:])
        return None
    assert isinstance(node, cst.FormattedString)
    last = node.parts[-1]
    assert isinstance(last, cst.FormattedStringText)
    for suffix in old:
        if last.value.lower().endswith(suffix):
            new_last = last.with_changes(value=last.value[: -len(suffix)] + new)
            return node.with_changes(parts=[*node.parts[:-1], new_last])
    return None


class _Swap(cst.CSTTransformer):
    def __init__(self, old: cst.CSTNode, new: cst.CSTNode | None) -> None:
        super().__init__()
        self.old, self.new = old, new

    def on_leave(self, original_node, updated_node):
        return self.new if original_node is self.old and self.new is not None else updated_node


class KerasWeightsFilename(Rule):
    """
    ## What it does
    Flags file names Keras 3 rejects: `save_weights(...)` with a literal name that does not
    end in `.weights.h5`, `ModelCheckpoint(..., save_weights_only=True)` with such a name, a
    full-model `ModelCheckpoint` (no `save_weights_only`) named `*.hdf5`, and `load_weights` /
    `load_model` of a literal name the same file saves with one of those. Files that still use
    Keras 2 only APIs (`multi_gpu_model`, sessions, `tf_keras`) are left to the Keras 2
    conversion rules (a TF1 session left in a file that already trains under a `tf.distribute`
    strategy does not count).

    ## Why is this bad?
    Keras 3 `save_weights` raises `ValueError: The filename must end in .weights.h5`, and
    `ModelCheckpoint(save_weights_only=True)` raises the same at construction, so a training
    script moved from Keras 2 stops at its first save. `load_weights('model.h5')` still reads a
    legacy HDF5 file, so a load is only renamed together with the save that writes it.

    A full-model checkpoint, measured on Keras 3.15: `ModelCheckpoint('unet.hdf5')` raises
    `ValueError: The filepath provided must end in .keras` at construction (so does
    `'{epoch:02d}.hdf5'`); `ModelCheckpoint('unet.h5')` is accepted and writes a legacy HDF5
    model, which is not flagged (`model.save('m.h5')` too); `.keras` writes the Keras 3
    format, which `load_model` reads back. Reading such a legacy file back is where it breaks:
    `load_model('m.h5')` of a model compiled with `loss='mse'` raises `ValueError: Could not
    deserialize 'keras.metrics.mse'` on Keras 3.15 (`compile=False` loads it; `.keras` loads
    it compiled). So a script that saves a whole model to a `.h5` name and loads that same name
    with `load_model` (without `compile=False`) is flagged at both calls.

    ## Example
    ```python
    model.save_weights('unet.h5')
    checkpoint = ModelCheckpoint('ckpt/epoch_{epoch:02d}.h5', save_weights_only=True)
    best = ModelCheckpoint('best.hdf5', save_best_only=True)
    ```
    Use instead:
    ```python
    model.save_weights('unet.weights.h5')
    checkpoint = ModelCheckpoint('ckpt/epoch_{epoch:02d}.weights.h5', save_weights_only=True)
    best = ModelCheckpoint('best.keras', save_best_only=True)
    ```

    ## Fix safety
    Safe: the `.h5`/`.hdf5` suffix of the literal becomes `.weights.h5` (the format stays HDF5);
    a full-model checkpoint's `.hdf5` becomes `.keras` (the program could not start; the file
    is then a Keras 3 model archive, and loads of the same literal are renamed with it).
    A `model.save('m.h5')` that the script reloads with `load_model('m.h5')` becomes `.keras` at
    both calls, unsafe: the program then writes another file in another format, which other
    programs that read `m.h5` do not find.
    Names without that suffix (TF checkpoint prefixes such as `ckpt/model`) are reported
    without a fix: the right replacement (`.weights.h5` or `tf.train.Checkpoint`) depends on the
    files that already exist. A `load_weights(..., by_name=True)` of the weights the script saves is
    renamed with the save and loses `by_name`, unsafe: Keras 3 reads `by_name` only from
    legacy files (a `.weights.h5` name raises ValueError) and loads `.weights.h5` by the model's
    structure, so a model built differently from the saved one fails to load where Keras 2
    kept the unmatched layers at their initial values. By name is also what makes a reload
    predict noise on Keras 3: its automatic layer names are counted per process, so a second
    copy of a network built in the same program (`conv2d_4`, ...) matches none of the saved
    names (`conv2d`, ...) and every layer silently keeps its initial weights. A `by_name` load
    of a legacy file the script does not write is reported without a fix, for that reason.
    """

    code = "TFM206"
    triggers = ("save_weights", "load_weights", "ModelCheckpoint", "load_model")
    name = "keras-weights-filename"
    summary = "Keras 3 file names: weights end in .weights.h5, full-model checkpoints in .keras"
    fix_safety = FixSafety.SAFE

    valid = (
        "import keras\nmodel.save_weights('model.weights.h5')\n",
        # A full-model checkpoint may be .h5 (legacy HDF5, accepted) or .keras.
        """import tensorflow as tf
cb = tf.keras.callbacks.ModelCheckpoint('best.h5', save_best_only=True)
cb2 = tf.keras.callbacks.ModelCheckpoint('best.keras', save_weights_only=False)
""",
        # Not known to be a full-model checkpoint.
        "import keras\ncb = keras.callbacks.ModelCheckpoint('m.hdf5', save_weights_only=flag)\n",
        # Loading a legacy HDF5 file this script does not write.
        "import keras\nmodel.load_weights('pretrained_imagenet.h5')\n",
        "import keras\nmodel = keras.models.load_model('pretrained.h5')\n",
        # Saved and loaded without its compile settings: Keras 3 reads it.
        "import keras\nmodel.save('m.h5')\nm = keras.models.load_model('m.h5', compile=False)\n",
        # Keras 2 code: the Keras 2 conversion comes first.
        """import keras
from keras.utils import multi_gpu_model
parallel = multi_gpu_model(model, gpus=2)
model.save_weights('model.h5')
""",
        # Not a literal: cannot know.
        "import keras\nmodel.save_weights(path)\n",
        # A TF1 session: still Keras 2.
        """import tensorflow as tf
from keras import backend as K
K.set_session(tf.Session(config=config))
model.save_weights('model.h5')
""",
    )
    invalid = (
        # A reload by name of the weights this script writes: renamed with the save.
        Example(
            """
            import keras
            template.save_weights('unet_weights.h5')
            reloaded = build_unet()
            reloaded.load_weights('unet_weights.h5', by_name=True)
            """,
            fixed="""
            import keras
            template.save_weights('unet_weights.weights.h5')
            reloaded = build_unet()
            reloaded.load_weights('unet_weights.weights.h5')
            """,
            message="drop `by_name`",
        ),
        # Pretrained weights by layer name: a person checks the names.
        Example(
            """
            import keras
            model.load_weights('backend.h5', by_name=True)
            """,
            message="names unnamed layers its own way",
        ),
        Example(
            """
            import tensorflow as tf
            model.save_weights('model.h5')
            model.load_weights('model.h5')
            """,
            fixed="""
            import tensorflow as tf
            model.save_weights('model.weights.h5')
            model.load_weights('model.weights.h5')
            """,
            message=".weights.h5",
        ),
        Example(
            """
            from keras.callbacks import ModelCheckpoint
            cb = ModelCheckpoint(filepath=f"{out}/unet_{{epoch:02d}}.hdf5", monitor="val_loss",
                                 save_weights_only=True)
            """,
            fixed="""
            from keras.callbacks import ModelCheckpoint
            cb = ModelCheckpoint(filepath=f"{out}/unet_{{epoch:02d}}.weights.h5", monitor="val_loss",
                                 save_weights_only=True)
            """,
        ),
        # The name built with os.path.join; the load is renamed with its save.
        Example(
            """
            import os
            import keras
            model.save_weights(os.path.join(out_dir, "best.hdf5"))
            model.load_weights(os.path.join(out_dir, "best.hdf5"))
            """,
            fixed="""
            import os
            import keras
            model.save_weights(os.path.join(out_dir, "best.weights.h5"))
            model.load_weights(os.path.join(out_dir, "best.weights.h5"))
            """,
        ),
        # A full-model checkpoint named .hdf5: Keras 3 wants .keras; its reload follows.
        Example(
            """
            import keras
            best = keras.callbacks.ModelCheckpoint('out/best.hdf5', monitor='val_loss',
                                                   save_best_only=True)
            model.fit(x, y, callbacks=[best])
            model = keras.models.load_model('out/best.hdf5')
            """,
            fixed="""
            import keras
            best = keras.callbacks.ModelCheckpoint('out/best.keras', monitor='val_loss',
                                                   save_best_only=True)
            model.fit(x, y, callbacks=[best])
            model = keras.models.load_model('out/best.keras')
            """,
            message="must end in `.keras`",
        ),
        # The checkpoint renamed already (a load left behind by an earlier pass).
        Example(
            """
            import keras
            best = keras.callbacks.ModelCheckpoint('out/best.keras', save_best_only=True)
            model.fit(x, y, callbacks=[best])
            model = keras.models.load_model('out/best.hdf5')
            """,
            fixed="""
            import keras
            best = keras.callbacks.ModelCheckpoint('out/best.keras', save_best_only=True)
            model.fit(x, y, callbacks=[best])
            model = keras.models.load_model('out/best.keras')
            """,
        ),
        # Trained under a strategy already (TFM107's output): a session left for a person does
        # not make it Keras 2.
        Example(
            """
            import tensorflow as tf
            from keras import backend as K
            from keras.callbacks import ModelCheckpoint
            K.set_session(tf.Session(config=config))
            strategy = tf.distribute.MirroredStrategy()
            checkpoint = ModelCheckpoint('weights.{epoch:02d}.h5', save_weights_only=True)
            """,
            fixed="""
            import tensorflow as tf
            from keras import backend as K
            from keras.callbacks import ModelCheckpoint
            K.set_session(tf.Session(config=config))
            strategy = tf.distribute.MirroredStrategy()
            checkpoint = ModelCheckpoint('weights.{epoch:02d}.weights.h5', save_weights_only=True)
            """,
        ),
        # A whole model saved as legacy HDF5 and loaded back: Keras 3 fails on the compile config.
        Example(
            """
            import keras
            model.fit(x, y)
            model.save('final_model.h5')
            restored = keras.models.load_model('final_model.h5', custom_objects={'rmse': rmse})
            """,
            fixed="""
            import keras
            model.fit(x, y)
            model.save('final_model.keras')
            restored = keras.models.load_model('final_model.keras', custom_objects={'rmse': rmse})
            """,
            message="Could not deserialize",
        ),
        # A TF checkpoint prefix: reported, not renamed.
        Example(
            """
            import tensorflow as tf
            model.save_weights("checkpoints/ckpt")
            """,
            message="checkpoint",
        ),
    )

    def visit_Module(self, node: cst.Module) -> None:
        resolver = self.context.resolver
        if any(marker in m for m in resolver.imported_modules for marker in _KERAS2_MARKERS):
            return
        facts = self.context.shared("distribution-facts", lambda: analyze(node, resolver))
        names = [self.call_name(c) or "" for c in facts.calls]
        markers: tuple[str, ...] = _KERAS2_MARKERS
        if not any(n.startswith(_DISTRIBUTE) for n in names):
            markers = (*markers, *_SESSION_MARKERS)
            if any(m in imported for imported in resolver.imported_modules for m in markers):
                return
        if any(marker in name for name in names for marker in markers):
            return
        saved = self._renamed_before(facts.calls)
        models: set[str] = set()  # full-model checkpoints renamed to .keras
        loads: list[tuple[cst.Call, cst.Arg]] = []
        by_name: list[tuple[cst.Call, cst.Arg]] = []  # load_weights(..., by_name=...)
        for call in facts.calls:
            method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
            if method == "save_weights":
                arg = keyword(call, "filepath", 0)
                if arg is not None and self._check(arg, "`save_weights`"):
                    saved.add(_literal_text(_file_literal(arg.value)) or "")
            elif method == "load_weights" or self._is_load_model(call):
                arg = keyword(call, "filepath", 0)
                if arg is not None and keyword(call, "by_name") is None:
                    loads.append((call, arg))
                elif arg is not None and method == "load_weights":
                    by_name.append((call, arg))
            elif (self.call_name(call) or "").endswith("callbacks.ModelCheckpoint"):
                only = keyword(call, "save_weights_only", 2)
                arg = keyword(call, "filepath", 0)
                if arg is None:
                    continue
                if only is not None and is_true(only.value):
                    if self._check(arg, "`ModelCheckpoint(save_weights_only=True)`"):
                        saved.add(_literal_text(_file_literal(arg.value)) or "")
                elif only is None or is_false(only.value):
                    models |= self._check_model(arg)
        whole = self._whole_model_saves(facts.calls)
        for call, arg in loads:
            literal = _file_literal(arg.value)
            text = _literal_text(literal)
            if text in whole and keyword(call, "compile", 2) is None and self._is_load_model(call):
                save = whole[text]
                for site in (save, literal):
                    self.report(
                        site,
                        "a whole model saved as legacy HDF5 and read back with `load_model`: "
                        "Keras 3 fails on the compile settings Keras 2 names (`ValueError: Could "
                        f"not deserialize 'keras.metrics.mse'`); save and load `{MODEL}`",
                        replacement=_renamed(site, MODEL),
                        safety=FixSafety.UNSAFE,
                    )
            elif text in models:
                self.report(
                    literal,
                    "this loads the full-model checkpoint the script saves: rename it with the "
                    f"checkpoint (Keras 3 model files end in `{MODEL}`)",
                    replacement=_renamed(literal, MODEL, _HDF5),
                )
            elif not (
                isinstance(call.func, cst.Attribute) and call.func.attr.value == "load_weights"
            ):
                continue  # load_model of a weights file: not this rule's business
            elif text in saved and text.lower().endswith(_H5):
                self.report(
                    literal,
                    "`load_weights` reads the file this script saves: rename it with the save "
                    f"(Keras 3 weight files end in `{WEIGHTS}`)",
                    replacement=_renamed(literal),
                )

        for call, arg in by_name:
            self._by_name(call, arg, saved)

    def _by_name(self, call: cst.Call, arg: cst.Arg, saved: set[str]) -> None:
        """`load_weights(name, by_name=True)`: of a file this script saves (renamed to
        `.weights.h5`, which Keras 3 loads only by structure), or of a legacy file."""
        flag = keyword(call, "by_name")
        if flag is None or not is_true(flag.value):
            return
        literal = _file_literal(arg.value)
        text = _literal_text(literal)
        if text is not None and text in saved and text.lower().endswith(_H5):
            args = [a for a in call.args if a is not flag]
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            renamed = _renamed(literal)
            new_args = [
                a.with_changes(value=a.value.visit(_Swap(literal, renamed))) if a is arg else a
                for a in args
            ]
            self.report(
                literal,
                "`load_weights(..., by_name=True)` reads the weights this script saves: Keras 3 "
                f"writes them as `{WEIGHTS}`, which it loads by the model's structure (`by_name` "
                "raises ValueError there); rename it with the save and drop `by_name` (a model "
                "built differently from the saved one then fails to load instead of keeping "
                "unmatched layers at their initial values)",
                replacement=call.with_changes(args=new_args),
                target=call,
                safety=FixSafety.UNSAFE,
            )
            return
        self.report(
            flag,
            "`load_weights(..., by_name=True)` of a legacy HDF5 file: Keras 3 still matches layers "
            "by name but names unnamed layers its own way (`conv2d`, `conv2d_1`, ... counted per "
            "process, where Keras 2 wrote `conv2d_1`, ...), and layers without a match silently "
            "keep their initial weights: give the layers explicit names, or check that every "
            "layer was loaded",
        )

    def _is_load_model(self, call: cst.Call) -> bool:
        return (self.call_name(call) or "").endswith(_LOAD_MODEL)

    @staticmethod
    def _whole_model_saves(calls: list[cst.Call]) -> dict[str, cst.BaseExpression]:
        """`x.save('name.h5')` calls with a literal HDF5 name: name -> the literal."""
        saves: dict[str, cst.BaseExpression] = {}
        for call in calls:
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "save":
                arg = keyword(call, "filepath", 0)
                literal = _file_literal(arg.value) if arg is not None else None
                text = _literal_text(literal) if literal is not None else None
                if literal is not None and text is not None and text.lower().endswith(_H5):
                    saves[text] = literal
        return saves

    def _renamed_before(self, calls: list[cst.Call]) -> set[str]:
        """The `.h5`/`.hdf5` names of weight saves already named `.weights.h5` (an earlier fix
        pass renamed them; a load inside another fix's statement waits for the next pass)."""
        names: set[str] = set()
        for call in calls:
            method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
            name = self.call_name(call) or ""
            if method == "save_weights" or (
                name.endswith("callbacks.ModelCheckpoint")
                and (only := keyword(call, "save_weights_only", 2)) is not None
                and is_true(only.value)
            ):
                arg = keyword(call, "filepath", 0)
                text = _literal_text(_file_literal(arg.value)) if arg is not None else None
                if text is not None and text.endswith(WEIGHTS):
                    names |= {text[: -len(WEIGHTS)] + suffix for suffix in _H5}
        return names

    def _check_model(self, arg: cst.Arg) -> set[str]:
        """Flags a full-model checkpoint named `.hdf5`; the names it renames."""
        literal = _file_literal(arg.value)
        text = _literal_text(literal)
        if text is not None and text.endswith(MODEL):
            # renamed already (by an earlier fix pass): its loads may still say `.hdf5`
            return {text[: -len(MODEL)] + suffix for suffix in _HDF5}
        if text is None or not text.lower().endswith(_HDF5):
            return set()
        self.report(
            literal,
            "full-model `ModelCheckpoint` with a `.hdf5` name: Keras 3 raises at construction "
            f"(the name must end in `{MODEL}`); `{MODEL}` is the Keras 3 model format "
            "(`save_weights_only=True` with a `.weights.h5` name keeps weights only)",
            replacement=_renamed(literal, MODEL, _HDF5),
        )
        return {text}

    def _check(self, arg: cst.Arg, what: str) -> bool:
        literal = _file_literal(arg.value)
        text = _literal_text(literal)
        if text is None or text.endswith(WEIGHTS):
            return False
        replacement = _renamed(literal)
        if replacement is not None:
            message = f"{what} with a `.h5` name: Keras 3 raises unless it ends in `{WEIGHTS}`"
        else:
            message = (
                f"{what} with a TF checkpoint prefix: Keras 3 raises unless the name ends in "
                f"`{WEIGHTS}`; use a `.weights.h5` file or `tf.train.Checkpoint`"
            )
        self.report(literal, message, replacement=replacement)
        return True
