from __future__ import annotations

import weakref

import libcst as cst

from tfmigrate.rule import Example, FixSafety, Import, Rule
from tfmigrate.rules._device_config import EXPLAIN, DeviceConfig


def tf_module(rule: Rule) -> str | None:
    """The local name of `tensorflow` or `tensorflow.compat.v1` (both have `config`, `debugging`).

    Not ``Rule.tf_local()``: `names.canonical("tensorflow.compat.v1")` gives "tensorflow." (the
    exact-match branch keeps the prefix's dot), so a compat.v1 module alias is not found there."""
    for local, bound in rule.context.resolver.bindings.items():
        if bound in ("tensorflow", "tensorflow.compat.v1") and local != "tensorflow":
            return local
    if "tensorflow" in rule.context.resolver.bindings:
        return "tensorflow"
    return None


def tf_imports(rule: Rule) -> tuple[Import, ...]:
    """`import tensorflow as tf` when the file reached TF only through `from ... import`."""
    return () if tf_module(rule) else (Import("tensorflow", asname="tf"),)


def device_config(rule: Rule) -> DeviceConfig:
    """The module's session-config groups, seen through ``rule``'s metadata: one analysis per
    tree, shared by TFM105 and every `set_session` call TFM108 looks at."""
    context = rule.context
    held = weakref.ref(context)  # kept in the context: no cycle that outlives the tree

    # The analysis lives in the context (``shared``): the context is alive while it is used.
    def parent(node: cst.CSTNode) -> cst.CSTNode | None:
        alive = held()
        assert alive is not None
        return alive.parent_of(node)

    def line(node: cst.CSTNode) -> int:
        alive = held()
        assert alive is not None
        return alive.position_of(node).start.line

    return context.shared(
        "device-config",
        lambda: DeviceConfig(
            context.module,
            context.resolver,
            parent,
            line,
            tf_module(rule) or "tf",
            fixing=context.fixing,
        ),
    )


class SessionDeviceConfig(Rule):
    """
    ## What it does
    Flags TF1 session device settings made through `ConfigProto` and `GPUOptions` — memory growth
    (`allow_growth`), `per_process_gpu_memory_fraction`, `allow_soft_placement`,
    `log_device_placement`, `device_count`, `visible_device_list` and the thread-pool sizes —
    at each `ConfigProto(...)`/`GPUOptions(...)` call and each statement that sets a field later
    (`config.gpu_options.allow_growth = True`).

    ## Why is this bad?
    TF2 has no sessions: these settings are process-wide `tf.config` calls made before the
    devices are initialized (`tf.config.experimental.set_memory_growth` per GPU,
    `tf.config.set_soft_device_placement`, `tf.debugging.set_log_device_placement`,
    `tf.config.set_visible_devices`, `tf.config.threading.*`). There is no TF2 "memory fraction":
    `tf.config.set_logical_device_configuration(gpu, [LogicalDeviceConfiguration(memory_limit=MB)])`
    takes an absolute size, which depends on the GPU, so that choice is left to you.

    A half migration is a trap: a `tf.compat.v1.Session` given a `config` uses only that config
    and ignores every `tf.config` setting (it reads the eager context's config only when
    `config` is None). So the settings and the `config=` argument move together.

    ## Example
    ```python
    config = tf.ConfigProto(allow_soft_placement=True)
    config.gpu_options.allow_growth = True
    sess = tf.Session(config=config)
    ```
    Use instead:
    ```python
    tf.config.set_soft_device_placement(True)
    for gpu in tf.config.list_physical_devices('GPU'):
        tf.config.experimental.set_memory_growth(gpu, True)
    sess = tf.Session()
    ```

    ## Fix safety
    Safe, and only offered when every setting of the config has a `tf.config` equivalent and the
    config goes nowhere but `tf.Session(config=...)`/`MonitoredTrainingSession(config=...)`: the
    statements take the place of the settings (so a function that set them still sets them when
    it runs), the config object and the `config=` arguments go. Settings at TF1's default
    (`allow_growth=False`, ...) are dropped. Memory fraction, CPU `device_count`, unordered
    `visible_device_list`, other ConfigProto fields, or a config used elsewhere (returned, given
    to an Estimator `RunConfig` or an `InteractiveSession`) leave the whole config as it is,
    reported. The `tf.config` calls must run before TensorFlow initializes its devices; they do
    wherever the config was built before the first session.
    """

    code = "TFM105"
    # Every finding belongs to a group built from one of these calls (not TF's own config_pb2).
    triggers = ("tensorflow.ConfigProto", "tensorflow.GPUOptions")
    name = "session-device-config"
    summary = "ConfigProto/GPUOptions device settings: move to tf.config"
    fix_safety = FixSafety.SAFE

    valid = (
        # TF2 code already uses tf.config.
        """import tensorflow as tf
gpus = tf.config.list_physical_devices('GPU')
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
tf.config.set_soft_device_placement(True)
""",
        # An empty ConfigProto carries no device setting.
        "import tensorflow as tf\nsess = tf.Session(config=tf.ConfigProto())\n",
        # Graph options are not device settings.
        "import tensorflow as tf\nconfig = tf.ConfigProto(graph_options=opts)\n",
        # A user's own config object with the same field names.
        """import tensorflow as tf
from myproject import ConfigProto
config = ConfigProto(allow_soft_placement=True)
config.gpu_options.allow_growth = True
""",
        # Not TensorFlow at all.
        "import argparse\nconfig = argparse.Namespace(allow_growth=True)\n",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf

            # Do not grab all GPU memory at start.
            config = tf.ConfigProto(allow_soft_placement=True, log_device_placement=False)
            config.gpu_options.allow_growth = True  # grow as needed
            with tf.Session(config=config) as sess:
                sess.run(init_op)
            """,
            fixed="""
            import tensorflow as tf

            # Do not grab all GPU memory at start.
            tf.config.set_soft_device_placement(True)
            for gpu in tf.config.list_physical_devices('GPU'):  # grow as needed
                tf.config.experimental.set_memory_growth(gpu, True)
            with tf.Session() as sess:
                sess.run(init_op)
            """,
            message="set_memory_growth",
        ),
        Example(
            """
            import tensorflow.compat.v1 as tf
            sess = tf.Session(config=tf.ConfigProto(
                allow_soft_placement=True,
                log_device_placement=FLAGS.log_device_placement,
                gpu_options=tf.GPUOptions(allow_growth=True, visible_device_list="0,1")))
            """,
            fixed="""
            import tensorflow.compat.v1 as tf
            tf.config.set_soft_device_placement(True)
            tf.debugging.set_log_device_placement(FLAGS.log_device_placement)
            for gpu in tf.config.list_physical_devices("GPU"):
                tf.config.experimental.set_memory_growth(gpu, True)
            tf.config.set_visible_devices(tf.config.list_physical_devices("GPU")[:2], "GPU")
            sess = tf.Session()
            """,
        ),
        Example(
            """
            import tensorflow as tf

            def train(num_gpus):
                gpu_options = tf.GPUOptions(allow_growth=True)
                config = tf.ConfigProto(gpu_options=gpu_options,
                                        device_count={'GPU': 0})
                if num_gpus > 1:
                    config.allow_soft_placement = True
                sv = tf.train.MonitoredTrainingSession(checkpoint_dir=LOG_DIR, config=config)
                return sv
            """,
            fixed="""
            import tensorflow as tf

            def train(num_gpus):
                for gpu in tf.config.list_physical_devices('GPU'):
                    tf.config.experimental.set_memory_growth(gpu, True)
                tf.config.set_visible_devices([], 'GPU')
                if num_gpus > 1:
                    tf.config.set_soft_device_placement(True)
                sv = tf.train.MonitoredTrainingSession(checkpoint_dir=LOG_DIR)
                return sv
            """,
        ),
        Example(
            """
            from tensorflow import ConfigProto, Session
            config = ConfigProto(intra_op_parallelism_threads=4)
            config.gpu_options.visible_device_list = '1'
            sess = Session(config=config)
            """,
            fixed="""
            from tensorflow import ConfigProto, Session
            import tensorflow as tf

            tf.config.threading.set_intra_op_parallelism_threads(4)
            tf.config.set_visible_devices(tf.config.list_physical_devices('GPU')[1:2], 'GPU')
            sess = Session()
            """,
        ),
        # Memory fraction: a note, and the config stays whole (its other settings too).
        Example(
            """
            import tensorflow as tf
            gpu_options = tf.GPUOptions(per_process_gpu_memory_fraction=0.4)
            config = tf.ConfigProto(gpu_options=gpu_options, allow_soft_placement=True)
            sess = tf.Session(config=config)
            """,
            message="memory_limit=MB",
        ),
        # The config goes somewhere tfmigrate does not follow: findings only.
        Example(
            """
            import tensorflow as tf
            def session_config():
                config = tf.ConfigProto(allow_soft_placement=True)
                config.gpu_options.allow_growth = True
                return config
            """,
            message="not fixed",
        ),
        Example(
            """
            import tensorflow as tf
            config = tf.ConfigProto(allow_soft_placement=True)
            estimator = tf.estimator.Estimator(model_fn, config=tf.estimator.RunConfig(
                session_config=config))
            """,
        ),
        # A module alias of ConfigProto is still TensorFlow's (the trigger is the resolved name).
        Example(
            """
            import tensorflow as tf
            Config = tf.ConfigProto
            config = Config(log_device_placement=True)
            sess = tf.Session(config=config)
            """,
            fixed="""
            import tensorflow as tf
            Config = tf.ConfigProto
            tf.debugging.set_log_device_placement(True)
            sess = tf.Session()
            """,
        ),
    )

    def visit_Module(self, node: cst.Module) -> None:
        config = device_config(self)
        for anchor, group in config.anchors():
            phrases = [EXPLAIN[s.field] for s in anchor.settings if s.field in EXPLAIN]
            message = "TF1 session device settings: " + "; ".join(dict.fromkeys(phrases))
            reason = config.why_not(group)
            if reason is not None:
                self.report(anchor.node, f"{message} (not fixed: {reason})")
                continue
            target, replacement = config.rewrite(group)
            self.report(
                anchor.node,
                message,
                replacement=replacement,
                target=target,
                imports=tf_imports(self),
            )
