from __future__ import annotations

import libcst as cst

from tfmigrate.names import dotted
from tfmigrate.rule import Example, FixSafety, Rule
from tfmigrate.rules._distribution import MIRRORED, ModuleFacts, add_keyword, analyze, keyword

DEFAULT_MIN_REPLICA_BATCH = 16
OPTION = "bn-min-replica-batch"
# Replicas assumed when the device list is not written out: a MirroredStrategy has at least two
# devices in the setting this rule is about.
_ASSUMED_REPLICAS = 2
# Batch sizes of these calls do not reach a training step.
_NOT_TRAINING = frozenset({"predict", "evaluate", "predict_on_batch", "test_on_batch"})
_PER_REPLICA_WORDS = ("per_replica", "per_gpu", "per_device", "per_worker")

# (coefficient, power of num_replicas_in_sync): 4 * strategy.num_replicas_in_sync is (4, 1).
_Size = tuple[int, int]


class SmallBatchBatchNorm(Rule):
    """
    ## What it does
    Flags Keras `BatchNormalization` layers (without `synchronized=True`) in a file that trains
    under `MirroredStrategy` with fewer than 16 examples per replica. The per-replica batch is read
    from `.batch(...)` / `batch_size=` arguments and module constants: `BATCH_PER_REPLICA * strategy
    .num_replicas_in_sync` gives it directly; a plain global batch is divided by the length of the
    strategy's device list, or by 2 when the list is not written out. The threshold is the option
    `bn-min-replica-batch` (`[tool.tfmigrate.options]`).

    ## Why is this bad?
    Keras 3 `BatchNormalization` under `MirroredStrategy` normalizes each replica's own sub-batch,
    and its moving mean/variance are mirrored variables that each replica updates from its own
    sub-batch: they drift apart, and reading or saving the layer gives replica 0's values.
    Measured (tests/test_distribution_evidence.py, 2 logical CPUs, 4 examples per replica,
    replica 1's inputs shifted by 5.0, momentum 0.5, one step): replica 0 held moving means
    0.03/-0.04/0.04, replica 1 2.34/2.45/2.33; `save_weights` wrote replica 0's exactly, while one
    device on the global batch gives 1.19/1.20/1.19. So DESIGN.md's description holds on
    TF 2.21/Keras 3. With few examples per replica the batch statistics are also noisy, and
    inference (one replica's moving statistics) disagrees with training. `synchronized=True`
    computes the statistics over the global batch: both replicas then held the one-device values
    (difference 1.2e-7).

    ## Example
    ```python
    strategy = tf.distribute.MirroredStrategy()
    BATCH_PER_REPLICA = 4
    dataset = dataset.batch(BATCH_PER_REPLICA * strategy.num_replicas_in_sync)
    with strategy.scope():
        x = tf.keras.layers.BatchNormalization()(x)
    ```
    Use instead:
    ```python
        x = tf.keras.layers.BatchNormalization(synchronized=True)(x)
    ```

    ## Fix safety
    Unsafe: synchronized statistics change what the layer computes (and add a cross-replica
    all-reduce per layer and step), so a migration that must match TF1 towers, which used
    per-tower statistics, has to stay unsynchronized. No finding when no batch size is found.
    """

    code = "TFM204"
    triggers = ('BatchNormalization',)
    name = "small-batch-batch-norm"
    summary = "BatchNormalization under MirroredStrategy with a small per-replica batch"
    fix_safety = FixSafety.UNSAFE

    valid = (
        # Large per-replica batch.
        """import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
BATCH_PER_REPLICA = 32
ds = ds.batch(BATCH_PER_REPLICA * strategy.num_replicas_in_sync)
with strategy.scope():
    bn = tf.keras.layers.BatchNormalization()
""",
        # Already synchronized.
        """import keras
import tensorflow as tf
strategy = tf.distribute.MirroredStrategy(["/gpu:0", "/gpu:1"])
with strategy.scope():
    bn = keras.layers.BatchNormalization(synchronized=True)
model.fit(x, y, batch_size=8)
""",
        # No strategy: a small batch on one device is the user's choice.
        """import tensorflow as tf
bn = tf.keras.layers.BatchNormalization()
model.fit(x, y, batch_size=4)
""",
        # One device per replica with 16 each (2 devices, global 32).
        """import tensorflow as tf
strategy = tf.distribute.MirroredStrategy(devices=["/gpu:0", "/gpu:1"])
bn = tf.keras.layers.BatchNormalization(axis=-1)
model.fit(x, y, batch_size=32)
""",
        # Only inference runs with a small batch.
        """import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
bn = tf.keras.layers.BatchNormalization()
model.fit(x, y, batch_size=64)
masks = model.predict(images, batch_size=1)
""",
        # Not a batch norm, and a layer the user wrote.
        """import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
ln = tf.keras.layers.LayerNormalization()
bn = BatchNormalization()
ds = ds.batch(4)
""",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy()
            BATCH_PER_REPLICA = 4
            GLOBAL_BATCH = BATCH_PER_REPLICA * strategy.num_replicas_in_sync
            ds = ds.batch(GLOBAL_BATCH)
            with strategy.scope():
                x = tf.keras.layers.BatchNormalization()(x)
            """,
            fixed="""
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy()
            BATCH_PER_REPLICA = 4
            GLOBAL_BATCH = BATCH_PER_REPLICA * strategy.num_replicas_in_sync
            ds = ds.batch(GLOBAL_BATCH)
            with strategy.scope():
                x = tf.keras.layers.BatchNormalization(synchronized=True)(x)
            """,
            message="4 examples per replica",
        ),
        # Global batch over a written-out device list; a multi-line call with a trailing comma.
        Example(
            """
            from keras import layers
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy(["/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3"])
            x = layers.BatchNormalization(
                momentum=0.9,
            )(x)
            model.fit(images, masks, batch_size=32, epochs=10)
            """,
            fixed="""
            from keras import layers
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy(["/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3"])
            x = layers.BatchNormalization(
                momentum=0.9, synchronized=True,
            )(x)
            model.fit(images, masks, batch_size=32, epochs=10)
            """,
            message="8 examples per replica",
        ),
        # Device list not written out: at least 2 replicas assumed.
        Example(
            """
            import tensorflow as tf
            from tensorflow.keras.layers import BatchNormalization
            BATCH_SIZE = 16
            strategy = tf.distribute.MirroredStrategy()
            norm = BatchNormalization(epsilon=1e-5)
            train = dataset.batch(BATCH_SIZE).prefetch(2)
            """,
            fixed="""
            import tensorflow as tf
            from tensorflow.keras.layers import BatchNormalization
            BATCH_SIZE = 16
            strategy = tf.distribute.MirroredStrategy()
            norm = BatchNormalization(epsilon=1e-5, synchronized=True)
            train = dataset.batch(BATCH_SIZE).prefetch(2)
            """,
            message="at most 8",
        ),
    )

    def visit_Module(self, node: cst.Module) -> None:
        facts = self.context.shared(
            "distribution-facts", lambda: analyze(node, self.context.resolver)
        )
        mirrored = [s for s in facts.strategies.values() if s.qualified in MIRRORED]
        if not mirrored:
            return
        devices = mirrored[0].devices if len(mirrored) == 1 else None
        threshold = _threshold(self.context.options)
        smallest: tuple[int, bool] | None = None  # (examples per replica, exact)
        for size in self._batch_sizes(facts):
            per_replica = _per_replica(size, devices)
            if per_replica is not None and (smallest is None or per_replica[0] < smallest[0]):
                smallest = per_replica
        if smallest is None or smallest[0] >= threshold:
            return
        count, exact = smallest
        amount = f"{count} examples per replica" if exact else f"at most {count} examples per replica"
        for call in facts.calls:
            name = self.call_name(call)
            if not name or not name.startswith(("keras.", "tensorflow.keras.")):
                continue
            if not name.endswith(".BatchNormalization"):
                continue
            if keyword(call, "synchronized") is not None:
                continue  # stated either way: the user decided
            self.report(
                call,
                f"`BatchNormalization` under MirroredStrategy with {amount} (< {threshold}): "
                "each replica normalizes its own sub-batch and updates its own moving "
                "statistics, which drift apart; saving keeps replica 0's. "
                "`synchronized=True` uses global-batch statistics",
                replacement=add_keyword(call, "synchronized", cst.Name("True")),
            )

    def _batch_sizes(self, facts: ModuleFacts) -> list[_Size]:
        sizes: list[_Size] = []
        for call in facts.calls:
            arg = None
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "batch":
                arg = keyword(call, "batch_size", 0)
            elif not (
                isinstance(call.func, cst.Attribute) and call.func.attr.value in _NOT_TRAINING
            ):
                arg = keyword(call, "batch_size")
            if arg is not None:
                size = _evaluate(arg.value, facts, 0)
                if size is not None:
                    sizes.append(size)
        for name, values in facts.assignments.items():
            if any(word in name.lower() for word in _PER_REPLICA_WORDS) and len(values) == 1:
                size = _evaluate(values[0].value, facts, 0)
                if size is not None and size[1] == 0:
                    sizes.append((size[0], 1))  # a per-replica count times one replica count
        return sizes


def _threshold(options: dict[str, object]) -> int:
    for key in (OPTION, OPTION.replace("-", "_")):
        value = options.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return DEFAULT_MIN_REPLICA_BATCH


def _per_replica(size: _Size, devices: int | None) -> tuple[int, bool] | None:
    value, power = size
    if power == 1:
        return value, True
    if power == 0:
        replicas = devices or _ASSUMED_REPLICAS
        return value // replicas, devices is not None
    return None


def _evaluate(expr: cst.BaseExpression, facts: ModuleFacts, depth: int) -> _Size | None:
    """An int expression over literals, module constants and ``num_replicas_in_sync``."""
    if depth > 5:
        return None
    if isinstance(expr, cst.Integer):
        return int(expr.value.replace("_", ""), 0), 0
    if isinstance(expr, cst.Attribute) and expr.attr.value == "num_replicas_in_sync":
        return 1, 1
    if isinstance(expr, cst.Name | cst.Attribute):
        name = dotted(expr)
        values = facts.values_of(name) if name else []
        return _evaluate(values[0], facts, depth + 1) if len(values) == 1 else None
    if isinstance(expr, cst.BinaryOperation):
        left = _evaluate(expr.left, facts, depth + 1)
        right = _evaluate(expr.right, facts, depth + 1)
        if left is None or right is None:
            return None
        if isinstance(expr.operator, cst.Multiply):
            return left[0] * right[0], left[1] + right[1]
        if isinstance(expr.operator, cst.FloorDivide | cst.Divide) and right[0]:
            if left[0] % right[0] == 0:
                return left[0] // right[0], left[1] - right[1]
    return None
