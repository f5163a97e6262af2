"""Keras 2-era names that tf_keras no longer has, for the legacy side of verify (graph mode only).

``multi_gpu_model`` was removed in TF 2.4. The shim does what Keras 2 did: every input batch is cut
into one contiguous sub-batch per GPU (the last GPU takes the remainder), the template model runs
on ``/gpu:i`` for sub-batch i under a ``replica_i`` name scope, and the outputs are concatenated
back on the CPU. The compiled loss therefore is the GLOBAL batch's loss, and the template's weights
are shared by all towers. ``/gpu:i`` lands on verify's tower device i (legacy_boot maps it).
"""

from __future__ import annotations

import sys
import types
from typing import Any

# set by legacy_boot: the tower count verify runs (Keras 2 counted the visible GPUs for gpus=None)
DEFAULT_GPUS = 2


def _slice_for_tower(data: Any, i: int, parts: int) -> Any:
    import tensorflow.compat.v1 as tf

    batch = tf.shape(data)[:1]
    step = batch // parts
    size = batch - step * i if i == parts - 1 else step  # the last tower takes the remainder
    rest = tf.shape(data)[1:]
    return tf.slice(data, tf.concat([step * i, rest * 0], 0), tf.concat([size, rest], 0))


def multi_gpu_model(model: Any, gpus: Any = None, cpu_merge: bool = True, cpu_relocation: bool = False) -> Any:
    """Keras 2's data-parallel wrapper (same signature, same graph semantics)."""
    import tensorflow.compat.v1 as tf
    from tf_keras.layers import Lambda, concatenate
    from tf_keras.models import Model, clone_model

    if gpus is None:
        gpus = DEFAULT_GPUS
    ids = list(gpus) if isinstance(gpus, (list, tuple)) else list(range(int(gpus)))
    if len(ids) <= 1:
        raise ValueError("For multi-gpu usage to be effective, call `multi_gpu_model` with `gpus >= 2`. "
                         f"Received: `gpus={gpus}`")
    if cpu_relocation:  # Keras 2 rebuilt the template under /cpu:0 (fresh weights, same names)
        with tf.device("/cpu:0"):
            model = clone_model(model)

    towers: list[list[Any]] = []
    for i, gpu in enumerate(ids):
        with tf.device(f"/gpu:{gpu}"), tf.name_scope(f"replica_{gpu}"):
            inputs = [
                Lambda(_slice_for_tower, output_shape=tuple(x.shape.as_list()[1:]),
                       arguments={"i": i, "parts": len(ids)})(x)
                for x in model.inputs
            ]
            outputs = model(inputs if len(inputs) > 1 else inputs[0])
            towers.append(list(outputs) if isinstance(outputs, (list, tuple)) else [outputs])
    with tf.device("/cpu:0" if cpu_merge else f"/gpu:{ids[0]}"):
        merged = [concatenate([tower[o] for tower in towers], axis=0, name=name)
                  for o, name in enumerate(model.output_names)]
    return Model(model.inputs, merged)


def install(utils_module: types.ModuleType) -> None:
    """``keras.utils.multi_gpu_model`` and the Keras 2 module paths it lived in."""
    utils_module.__dict__["multi_gpu_model"] = multi_gpu_model
    for name in ("keras.utils.multi_gpu_utils", "keras.utils.training_utils"):
        mod = types.ModuleType(name)
        mod.__dict__["multi_gpu_model"] = multi_gpu_model
        sys.modules[name] = mod
