from __future__ import annotations

import libcst as cst

from tfmigrate.names import dotted
from tfmigrate.rule import Example, FixSafety, Rule
from tfmigrate.rules._distribution import analyze, is_true, keyword

WEIGHTS = ".weights.h5"
_H5 = (".h5", ".hdf5")
# Files that still run on Keras 2 (or tf_keras), where `.h5` weights are right: the Keras 2
# conversion rules go first, and this rule fires on their output.
_KERAS2_MARKERS = (
    "multi_gpu_model",
    "keras.backend.set_session",
    "keras.backend.get_session",
    "tensorflow.Session",
    "tensorflow.contrib",
    "tf_keras",
)


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


def _renamed(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """The literal with its `.h5`/`.hdf5` suffix replaced by `.weights.h5`."""
    text = _literal_text(node)
    if text is None or not text.lower().endswith(_H5):
        return None
    if isinstance(node, cst.SimpleString):
        raw = node.value
        quote_end = len(raw) - len(node.quote)
        body = raw[:quote_end]
        for suffix in _H5:
            if body.lower().endswith(suffix):
                return node.with_changes(
                    value=body[: -len(suffix)] + WEIGHTS + raw[quote_end:]
                )
        return None
    assert isinstance(node, cst.FormattedString)
    last = node.parts[-1]
    assert isinstance(last, cst.FormattedStringText)
    for suffix in _H5:
        if last.value.lower().endswith(suffix):
            new_last = last.with_changes(value=last.value[: -len(suffix)] + WEIGHTS)
            return node.with_changes(parts=[*node.parts[:-1], new_last])
    return None


class KerasWeightsFilename(Rule):
    """
    ## What it does
    Flags weight files Keras 3 rejects: `save_weights(...)` with a literal name that does not
    end in `.weights.h5`, `ModelCheckpoint(..., save_weights_only=True)` with such a name, and
    `load_weights` of a literal name the same file saves with one of those. Files that still
    use Keras 2 only APIs (`multi_gpu_model`, sessions, `tf_keras`) are left to the Keras 2
    conversion rules.

    ## Why is this bad?
    Keras 3 `save_weights` raises `ValueError: The filename must end in .weights.h5`, and
    `ModelCheckpoint(save_weights_only=True)` raises the same at construction, so a training
    script moved from Keras 2 stops at its first save. `load_weights('model.h5')` still reads a
    legacy HDF5 file, so a load is only renamed together with the save that writes it.

    ## Example
    ```python
    model.save_weights('unet.h5')
    checkpoint = ModelCheckpoint('ckpt/epoch_{epoch:02d}.h5', save_weights_only=True)
    ```
    Use instead:
    ```python
    model.save_weights('unet.weights.h5')
    checkpoint = ModelCheckpoint('ckpt/epoch_{epoch:02d}.weights.h5', save_weights_only=True)
    ```

    ## Fix safety
    Safe: the `.h5`/`.hdf5` suffix of the literal becomes `.weights.h5` (the format stays HDF5).
    Names without that suffix (TF checkpoint prefixes such as `ckpt/model`) are reported
    without a fix: the right replacement (`.weights.h5` or `tf.train.Checkpoint`) depends on the
    files that already exist. A load with `by_name=True` is not renamed (Keras 3 reads `by_name`
    only from legacy files).
    """

    code = "TFM206"
    triggers = ('save_weights', 'load_weights', 'ModelCheckpoint')
    name = "keras-weights-filename"
    summary = "Keras 3 weight files must end in .weights.h5"
    fix_safety = FixSafety.SAFE

    valid = (
        "import keras\nmodel.save_weights('model.weights.h5')\n",
        # A full-model checkpoint may be .h5 or .keras.
        """import tensorflow as tf
cb = tf.keras.callbacks.ModelCheckpoint('best.h5', save_best_only=True)
""",
        # Loading a legacy HDF5 file this script does not write.
        "import keras\nmodel.load_weights('pretrained_imagenet.h5')\n",
        # Keras 2 code: the Keras 2 conversion comes first.
        """import keras
from keras.utils import multi_gpu_model
parallel = multi_gpu_model(model, gpus=2)
model.save_weights('model.h5')
""",
        # Not a literal: cannot know.
        "import keras\nmodel.save_weights(path)\n",
    )
    invalid = (
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
        if any(
            marker in (self.call_name(c) or "") for c in facts.calls for marker in _KERAS2_MARKERS
        ):
            return
        saved: set[str] = set()
        loads: list[tuple[cst.Call, cst.Arg]] = []
        for call in facts.calls:
            method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
            if method == "save_weights":
                arg = keyword(call, "filepath", 0)
                if arg is not None and self._check(arg, "`save_weights`"):
                    saved.add(_literal_text(_file_literal(arg.value)) or "")
            elif method == "load_weights":
                arg = keyword(call, "filepath", 0)
                if arg is not None and keyword(call, "by_name") is None:
                    loads.append((call, arg))
            elif (self.call_name(call) or "").endswith("callbacks.ModelCheckpoint"):
                only = keyword(call, "save_weights_only", 2)
                arg = keyword(call, "filepath", 0)
                if only is not None and is_true(only.value) and arg is not None:
                    if self._check(arg, "`ModelCheckpoint(save_weights_only=True)`"):
                        saved.add(_literal_text(_file_literal(arg.value)) or "")
        for _, arg in loads:
            literal = _file_literal(arg.value)
            text = _literal_text(literal)
            if text in saved and text.lower().endswith(_H5):
                self.report(
                    literal,
                    "`load_weights` reads the file this script saves: rename it with the save "
                    f"(Keras 3 weight files end in `{WEIGHTS}`)",
                    replacement=_renamed(literal),
                )

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
