from __future__ import annotations

import libcst as cst

from tfmigrate.rule import Example, FixSafety, Rule

# Where Keras 2 / tf.keras 1.x kept it (canonical spellings; `tensorflow.python.keras` and
# `keras.backend.tensorflow_backend` are folded by the name resolver).
MULTI_GPU_MODEL = frozenset(
    {
        "keras.utils.multi_gpu_model",
        "keras.utils.training_utils.multi_gpu_model",
        "keras.utils.multi_gpu_utils.multi_gpu_model",
        "tensorflow.keras.utils.multi_gpu_model",
        "tensorflow.keras.utils.multi_gpu_utils.multi_gpu_model",
        "tensorflow.contrib.keras.utils.multi_gpu_model",
        "tensorflow.contrib.keras.api.keras.utils.multi_gpu_model",
    }
)


class KerasMultiGpuModel(Rule):
    """
    ## What it does
    Flags calls to Keras 2's `multi_gpu_model` (`keras.utils`, `keras.utils.training_utils`,
    `tf.keras.utils`, `tf.contrib.keras`).

    ## Why is this bad?
    `multi_gpu_model` was removed in TensorFlow 2.4 and does not exist in Keras 3. It copied the
    model onto each GPU, split every batch, and merged the outputs on the CPU; its replacement is
    `tf.distribute.MirroredStrategy`: build *and compile* the template model inside
    `strategy.scope()`, then call `fit` on that one model with the same global `batch_size`
    (Keras splits each batch across the replicas and scales the loss itself). Callbacks such as
    `ModelCheckpoint`, `save` and `load_weights` then work on that model directly — no more
    saving the template instead of the parallel wrapper.

    ## Example
    ```python
    with tf.device('/cpu:0'):
        model = build_model()
    parallel_model = multi_gpu_model(model, gpus=2)
    parallel_model.compile(optimizer='adam', loss='mse')
    parallel_model.fit(x, y, batch_size=64)
    ```
    Use instead:
    ```python
    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = build_model()
        model.compile(optimizer='adam', loss='mse')
    model.fit(x, y, batch_size=64)
    ```

    ## Fix safety
    Manual here: the model build, compile, callbacks and saving move together, which the
    whole-program Keras conversion does.
    """

    code = "TFM107"
    triggers = ('multi_gpu_model',)
    name = "keras-multi-gpu-model"
    summary = "multi_gpu_model (removed in TF 2.4): use MirroredStrategy"
    fix_safety = FixSafety.MANUAL

    valid = (
        """import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = build_model()
    model.compile(optimizer='adam', loss='mse')
""",
        # The user's own helper of the same name.
        """import keras
def multi_gpu_model(model, gpus):
    return model
parallel = multi_gpu_model(keras.models.Sequential(), gpus=2)
""",
        # Importing is not calling (the call, if any, is what gets flagged).
        "from keras.utils import multi_gpu_model\n",
    )
    invalid = (
        Example(
            """
            from keras.utils import multi_gpu_model
            parallel_model = multi_gpu_model(model, gpus=4)
            """,
            message="MirroredStrategy",
        ),
        Example(
            """
            from keras.utils.training_utils import multi_gpu_model
            parallel_model = multi_gpu_model(model, 2)
            """,
        ),
        Example(
            """
            import tensorflow as tf
            parallel_model = tf.keras.utils.multi_gpu_model(model, gpus=2, cpu_merge=False)
            """,
        ),
        Example(
            """
            import tensorflow as tf
            parallel_model = tf.contrib.keras.utils.multi_gpu_model(model, gpus=2)
            """,
        ),
        Example(
            """
            from tensorflow.python.keras.utils import multi_gpu_utils
            parallel_model = multi_gpu_utils.multi_gpu_model(model, gpus=[0, 1])
            """,
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.call_name(node) not in MULTI_GPU_MODEL:
            return
        gpus = next((a for a in node.args if a.keyword and a.keyword.value == "gpus"), None)
        if gpus is None and len(node.args) > 1 and node.args[1].keyword is None:
            gpus = node.args[1]
        shown = f"gpus={self.context.module.code_for_node(gpus.value)}" if gpus else "..."
        self.report(
            node,
            f"`multi_gpu_model(model, {shown})` was removed in TF 2.4: build and compile the "
            "template model inside `tf.distribute.MirroredStrategy().scope()`, train that model "
            "with the same global batch size in `fit`, and attach checkpoints to it",
        )
