from __future__ import annotations

import libcst as cst

from tfmigrate import tfapi
from tfmigrate.rule import Example, FixSafety

from ._tf_api import ApiNameRule, contrib_advice, strip_compat_v1


class RemovedContribApi(ApiNameRule):
    """
    ## What it does
    Flags `tf.contrib` symbols in TF1 code that TensorFlow's upgrade tables cannot rename
    (those they can rename, TFM301 renames). The message says where the symbol went when TF's
    tables or the `tf_slim` package know: `tf.contrib.layers.layer_norm` became Keras
    `LayerNormalization` (with a different epsilon), `tf.contrib.layers.conv2d` lives on in
    `tf_slim.layers.conv2d`. Reported once per symbol and file.

    ## Why is this bad?
    `tf.contrib` does not exist in TensorFlow 2: the import alone fails. There is no mechanical
    replacement; each use needs a decision (tf_slim, a Keras layer, TensorFlow Addons, or a copy
    of the code), and defaults often differ.

    ## Example
    ```python
    import tensorflow as tf
    y = tf.contrib.layers.layer_norm(x)
    ```
    Use instead:
    ```python
    import tensorflow as tf
    y = tf.keras.layers.LayerNormalization(epsilon=1e-12)(x)
    ```

    ## Fix safety
    Manual: the replacements differ in defaults and variable names.
    """

    code = "TFM302"
    name = "removed-contrib-api"
    summary = "tf.contrib symbol with no TF2 rename: gone in TensorFlow 2"
    fix_safety = FixSafety.MANUAL
    default_enabled = False  # conversion note: opt-in, like TFM301

    valid = (
        "import tensorflow as tf\ncell = tf.contrib.rnn.LSTMCell(10)\n",  # TFM301 renames it
        "import tf_slim as slim\nnet = slim.conv2d(x, 3, [3, 3])\n",
        # TF2 code: TFM205 reports contrib there.
        "import tensorflow as tf\ns = tf.distribute.MirroredStrategy()\nv = tf.contrib.layers.flatten(x)\n",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            y = tf.contrib.layers.layer_norm(x)
            """,
            message="LayerNormalization",
        ),
        Example(
            """
            import tensorflow as tf
            slim = tf.contrib.slim
            net = slim.conv2d(x, 64, [3, 3])
            net = slim.conv2d(net, 64, [3, 3])
            """,
            message="`tf_slim.conv2d`",
        ),
        Example(
            """
            import tensorflow.compat.v1 as tf
            from tensorflow.contrib import seq2seq
            helper = seq2seq.TrainingHelper(x, lengths)
            """,
            message="TensorFlow Addons",
        ),
    )

    def finish(self, kind: str | None) -> None:
        if kind == "tf2":
            return
        seen: set[str] = set()
        found: list[tuple[cst.CSTNode, str]] = []
        found += [(alias, raw) for alias, raw in self.imports]
        found += [(node, raw) for node, raw, _ in self.chains]
        for node, raw in found:
            name = tfapi.tf_spelling(strip_compat_v1(raw))
            if not (name == "tf.contrib" or name.startswith("tf.contrib.")) or name in seen:
                continue
            if tfapi.tf2_rename(name) is not None:
                continue  # TFM301 renames it
            seen.add(name)
            self.report(
                node, f"`{name}`: tf.contrib is gone in TensorFlow 2; {contrib_advice(name)}"
            )
