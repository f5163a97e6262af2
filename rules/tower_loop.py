from __future__ import annotations

import libcst as cst

from tfmigrate.rule import Example, FixSafety
from tfmigrate.rules._towers import TowerRule, Towers


class TowerLoop(TowerRule):
    """
    ## What it does
    Flags the TF1 "tower" loop: a `for` (or `while`) loop over GPUs that opens
    `tf.device(<this iteration's device>)` and builds a copy of the model inside it, usually under
    a per-tower name scope (`tower_%d`, `'%s_%d' % (TOWER_NAME, i)`, `clone_%d`, ...), with the
    variables shared between towers by `tf.get_variable_scope().reuse_variables()`,
    `variable_scope(..., reuse=bool(i))`, `reuse=i > 0`, `tf.AUTO_REUSE` or `tf.make_template`.
    The finding says how the towers are scoped, how their variables are shared, and how the
    device is spelled.

    ## Why is this bad?
    The loop is TF1's hand-made data parallelism. TF2 has no graph to build once per device:
    the equivalent is one replica function run under `tf.distribute.MirroredStrategy`, whose
    variables are mirrored on every device and whose gradients are all-reduced with SUM. What the
    loop did around it decides what the migration must preserve: how gradients were combined
    (TFM102), which tower's batch-norm statistics were kept (TFM103), where the variables lived
    (TFM111). Tower scope names also end up in checkpoint variable names, which the migration
    has to map.

    ## Example
    ```python
    for i in range(FLAGS.num_gpus):
        with tf.device('/gpu:%d' % i):
            with tf.name_scope('tower_%d' % i) as scope:
                loss = tower_loss(scope, images, labels)
                tf.get_variable_scope().reuse_variables()
                tower_grads.append(opt.compute_gradients(loss))
    ```
    Use instead:
    ```python
    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = build_model()
        optimizer = tf.keras.optimizers.SGD(0.1)

    @tf.function
    def train_step(images, labels):
        def replica_step(images, labels):
            with tf.GradientTape() as tape:
                per_example = loss_fn(labels, model(images, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        strategy.run(replica_step, args=(images, labels))
    ```

    ## Fix safety
    Manual. Replacing the loop changes the program's structure; the whole-script tower
    conversion does it, with the equivalence notes of the related findings.
    """

    code = "TFM101"
    triggers = ("tensorflow.device",)  # tower loops are found from tf.device calls
    name = "tower-loop"
    summary = "TF1 tower loop: the model is built once per device by hand"
    fix_safety = FixSafety.MANUAL

    valid = (
        # Devices listed but no model built per device.
        "import tensorflow as tf\nfor d in ['/gpu:0', '/gpu:1']:\n    print(d)\n",
        # The classic multi-device matmul: per-device ops, no model, no variables, no scopes.
        """import tensorflow as tf
c = []
for d in ['/gpu:0', '/gpu:1']:
    with tf.device(d):
        a = tf.constant([1.0, 2.0])
        c.append(tf.matmul(a, a))
""",
        # A fixed device inside a loop is not per-device replication.
        """import tensorflow as tf
for step in range(10):
    with tf.device('/cpu:0'):
        x = build_input(step)
""",
        # Single-device script.
        """import tensorflow as tf
with tf.device('/gpu:0'):
    logits = inference(images)
    loss = tf.losses.softmax_cross_entropy(labels, logits)
""",
        # Not TensorFlow's device().
        """import tensorflow as tf
from mylib import device
for i in range(4):
    with device('/gpu:%d' % i):
        build(i)
""",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            tower_grads = []
            with tf.variable_scope(tf.get_variable_scope()):
                for i in range(FLAGS.num_gpus):
                    with tf.device('/gpu:%d' % i):
                        with tf.name_scope('%s_%d' % (TOWER_NAME, i)) as scope:
                            loss = tower_loss(scope, images, labels)
                            tf.get_variable_scope().reuse_variables()
                            tower_grads.append(opt.compute_gradients(loss))
            """,
            message="reuse_variables()",
        ),
        Example(
            """
            import tensorflow.compat.v1 as tf
            for i, dev in enumerate(devices):
                with tf.device(dev), tf.variable_scope('model', reuse=bool(i)):
                    logits = net(images[i])
            """,
            message="reuse=bool(i)",
        ),
        Example(
            """
            import tensorflow as tf
            slim = tf.contrib.slim
            for i in range(num_clones):
                with tf.name_scope('clone_%d' % i):
                    with tf.device('/gpu:%d' % i):
                        with tf.variable_scope(tf.get_variable_scope(), reuse=i > 0):
                            net = slim.conv2d(images, 32, [3, 3])
            """,
            message="reuse=i > 0",
        ),
        Example(
            """
            import tensorflow as tf
            for k in range(n_gpus):
                with tf.device(tf.DeviceSpec(device_type='GPU', device_index=k)):
                    with tf.variable_scope('shared', reuse=tf.AUTO_REUSE):
                        out = tf.layers.dense(x[k], 10)
            """,
            message="AUTO_REUSE",
        ),
        Example(
            """
            import tensorflow as tf
            net_fn = tf.make_template('net', build_net)
            i = 0
            while i < num_gpus:
                with tf.device('/gpu:{}'.format(i)):
                    logits.append(net_fn(images[i]))
                i += 1
            """,
            message="make_template",
        ),
        Example(
            """
            import tensorflow as tf
            for i in range(2):
                with tf.device(assign_to_device('/gpu:%d' % i, ps_device='/cpu:0')):
                    grads = tf.gradients(model(x[i]), params)
            """,
            message="no variable sharing",
        ),
        Example(
            """
            import tensorflow as tf
            def build_tower(i, images):
                with tf.device('/gpu:%d' % i), tf.variable_scope('tower', reuse=i > 0):
                    return model_fn(images[i])
            tower_logits = [build_tower(i, images) for i in range(FLAGS.num_gpus)]
            """,
            message="through `build_tower`",
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        for towers in self.tower_loops():
            self.report(towers.replicator, self._message(towers))

    def _message(self, towers: Towers) -> str:
        replicator = towers.replicator
        kind = {cst.For: "for", cst.While: "while"}.get(type(replicator), "comprehension")
        via = f" through `{towers.tower_fn.name.value}`" if towers.tower_fn else ""
        parts = [
            f"tower loop (`{kind}`{via}): the model is built once per device, "
            f"`{self.src(towers.device)}`"
        ]
        parts.append(
            "towers scoped by " + ", ".join(f"`{s}`" for s in towers.scopes)
            if towers.scopes
            else "no per-tower scope"
        )
        parts.append(
            "variables shared via " + ", ".join(f"`{s}`" for s in towers.sharing)
            if towers.sharing
            else "no variable sharing in the loop (each tower may create its own variables)"
        )
        return "; ".join(parts) + ". TF2: one replica function under MirroredStrategy replaces it"
