from __future__ import annotations

import libcst as cst

from tfmigrate.rule import Example, FixSafety, Rule
from tfmigrate.rules._device_config import remove_statement
from tfmigrate.rules.session_device_config import device_config, tf_imports

# Canonical spellings: the name resolver folds `keras.backend.tensorflow_backend`,
# `tensorflow.python.keras` and `tensorflow.compat.v1` into these.
SET_SESSION = frozenset({"keras.backend.set_session", "tensorflow.keras.backend.set_session"})
GET_SESSION = frozenset({"keras.backend.get_session", "tensorflow.keras.backend.get_session"})


class KerasSessionHandling(Rule):
    """
    ## What it does
    Flags Keras 2's `set_session` and `get_session` (from `keras.backend`,
    `keras.backend.tensorflow_backend`, `tf.keras.backend`, `tensorflow.python.keras.backend`).

    ## Why is this bad?
    Keras 3 has no TensorFlow session: `keras.backend.set_session` and `get_session` do not
    exist, and TF2 runs eagerly. Keras 2 scripts mostly called `set_session(tf.Session(config=
    config))` only to pass GPU options (memory growth, soft placement); in TF2 these are
    process-wide `tf.config` calls (see TFM105). `get_session().run(tensor)` becomes evaluating
    the value directly (for memory statistics, `tf.config.experimental.get_memory_info`, see
    TFM109).

    ## Example
    ```python
    config = tf.ConfigProto()
    config.gpu_options.allow_growth = True
    KTF.set_session(tf.Session(config=config))
    ```
    Use instead:
    ```python
    for gpu in tf.config.list_physical_devices('GPU'):
        tf.config.experimental.set_memory_growth(gpu, True)
    ```

    ## Fix safety
    Safe where the session only carried device settings that all have `tf.config` equivalents
    (a `tf.Session()` with no argument, or one whose `config` TFM105 can move): the settings
    become `tf.config` calls and the `set_session` statement goes. A session with a graph, a
    target, or a config that is also used elsewhere, and every `get_session`, are left for a
    person (or the whole-program conversion).
    """

    code = "TFM108"
    triggers = tuple(sorted(SET_SESSION | GET_SESSION))  # every report is such a call
    name = "keras-session-handling"
    summary = "Keras 2 set_session/get_session: no sessions in Keras 3"
    fix_safety = FixSafety.SAFE

    valid = (
        # TF2: device settings already through tf.config.
        """import tensorflow as tf
for gpu in tf.config.list_physical_devices('GPU'):
    tf.config.experimental.set_memory_growth(gpu, True)
""",
        # The user's own function of the same name.
        """import tensorflow as tf
def set_session(session):
    global SESSION
    SESSION = session
set_session(tf.Session())
""",
        # clear_session still exists in Keras 3.
        "from keras import backend as K\nK.clear_session()\n",
        # A method called get_session on some other object.
        "import keras\nsession = client.get_session()\n",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            import keras.backend.tensorflow_backend as KTF

            config = tf.ConfigProto()
            config.gpu_options.allow_growth = True
            KTF.set_session(tf.Session(config=config))
            model = build_model()
            """,
            fixed="""
            import tensorflow as tf
            import keras.backend.tensorflow_backend as KTF

            for gpu in tf.config.list_physical_devices('GPU'):
                tf.config.experimental.set_memory_growth(gpu, True)
            model = build_model()
            """,
            message="no TensorFlow session",
        ),
        Example(
            """
            import tensorflow as tf
            from keras.backend.tensorflow_backend import set_session

            def setup():
                # GPU memory on demand, ops without GPU kernels on the CPU.
                set_session(tf.Session(config=tf.ConfigProto(
                    allow_soft_placement=True,
                    gpu_options=tf.GPUOptions(allow_growth=True))))
            """,
            fixed="""
            import tensorflow as tf
            from keras.backend.tensorflow_backend import set_session

            def setup():
                # GPU memory on demand, ops without GPU kernels on the CPU.
                tf.config.set_soft_device_placement(True)
                for gpu in tf.config.list_physical_devices('GPU'):
                    tf.config.experimental.set_memory_growth(gpu, True)
            """,
        ),
        Example(
            """
            import tensorflow as tf
            from tensorflow.keras import backend as K
            if USE_GPU:
                K.set_session(tf.Session())
            """,
            fixed="""
            import tensorflow as tf
            from tensorflow.keras import backend as K
            if USE_GPU:
                pass
            """,
        ),
        # The session is kept and used: a person decides.
        Example(
            """
            import tensorflow as tf
            from keras import backend as K
            sess = tf.Session(graph=graph)
            K.set_session(sess)
            """,
            message="set_session",
        ),
        # The config carries a memory fraction: no tf.config equivalent, no fix.
        Example(
            """
            import tensorflow as tf
            from keras import backend as K
            config = tf.ConfigProto(gpu_options=tf.GPUOptions(per_process_gpu_memory_fraction=0.5))
            K.set_session(tf.Session(config=config))
            """,
        ),
        Example(
            """
            from keras import backend as K
            sess = K.get_session()
            """,
            message="get_session",
        ),
        Example(
            """
            import tensorflow.compat.v1 as tf
            value = tf.keras.backend.get_session().run(loss)
            """,
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        name = self.call_name(node)
        if name in GET_SESSION:
            self.report(
                node,
                "`get_session()`: Keras 3 has no TensorFlow session and TF2 runs eagerly; "
                "evaluate values directly (memory statistics: "
                "`tf.config.experimental.get_memory_info`, TFM109)",
            )
        elif name in SET_SESSION:
            self._set_session(node)

    def _set_session(self, node: cst.Call) -> None:
        message = (
            "`set_session(...)`: Keras 3 has no TensorFlow session; device settings are "
            "`tf.config` calls in TF2"
        )
        config = device_config(self)
        statement = config.statement(node)
        line = self.parent(self.parent(node))
        session = node.args[0].value if len(node.args) == 1 else None
        if (
            statement is None
            or not isinstance(self.parent(node), cst.Expr)
            or line is not statement
            or not isinstance(session, cst.Call)
            or self.call_name(session) != "tensorflow.Session"
        ):
            self.report(node, message + " (not fixed: the session is more than its config)")
            return
        if not session.args:
            target, replacement = remove_statement(config, statement)
            self.report(node, message, replacement=replacement, target=target)
            return
        group = next((g for g in config.groups if any(c is session for c in g.consumers)), None)
        only_config = len(session.args) == 1 and session.args[0].keyword is not None
        only_config = only_config and session.args[0].keyword.value == "config"
        reason = "the session is more than its config" if not only_config else None
        if reason is None:
            reason = config.why_not(group) if group else "the config is not one tfmigrate follows"
        if reason is not None:
            self.report(node, f"{message} (not fixed: {reason})")
            return
        target, replacement = config.rewrite(group, remove=(statement,))
        self.report(node, message, replacement=replacement, target=target, imports=tf_imports(self))
