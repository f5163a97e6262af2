"""Optimizer state of a kept ``tf.compat.v1.train`` optimizer (imports TensorFlow; subprocess only).

TFM303 keeps the legacy optimizer object: under MirroredStrategy it creates the same slots, so
TF1's Momentum accumulator, Adam's m/v and beta powers, RMSProp's ms/mom map one to one. Their
legacy names come from the optimizer itself: a copy of it creates its slots in a scratch graph
whose variables carry the legacy names, exactly as the TF1 program did (``var/Momentum``,
``var/RMSProp_1``, ``beta1_power``, ...).
"""

from __future__ import annotations

import copy
from typing import Any

from tfmigrate.checkpoint.plan import Spec


def is_v1_optimizer(tf: Any, optimizer: Any) -> bool:
    return isinstance(optimizer, tf.compat.v1.train.Optimizer)


def spec_of(tf: Any, variable: Any) -> Spec:
    return Spec(tuple(int(d) for d in variable.shape), tf.as_dtype(variable.dtype).base_dtype.name)


def v1_optimizer_state(
    tf: Any, strategy: Any, optimizer: Any, trained: dict[str, tuple[str, Any]]
) -> dict[str, tuple[str, Any]]:
    """legacy state name -> (label, migrated variable) for the variables the optimizer trains.

    ``trained``: legacy name -> (migrated name, migrated variable). Creates the migrated slots now,
    where apply_gradients would (cross-replica, outside any function); the first training step
    then finds and uses them.
    """
    variables = [v for _, v in trained.values()]
    with strategy.scope(), tf.init_scope():
        optimizer._create_slots(variables)
    twin = copy.copy(optimizer)  # same class, name and hyperparameters; its own slot tables
    twin._slots, twin._non_slot_dict, twin._deferred_slot_restorations = {}, {}, {}
    legacy_slots: list[tuple[str, str, str]] = []  # (legacy slot name, legacy variable, slot)
    legacy_extra: list[tuple[str, str]] = []  # (legacy name, non-slot key)
    with tf.Graph().as_default():
        legacy_vars = [
            tf.compat.v1.get_variable(
                name, shape=var.shape, dtype=tf.as_dtype(var.dtype).base_dtype
            )
            for name, (_, var) in trained.items()
        ]
        twin._create_slots(legacy_vars)
        for name, legacy_var in zip(trained, legacy_vars, strict=True):
            for slot in twin.get_slot_names():
                legacy_slot = twin.get_slot(legacy_var, slot)
                if legacy_slot is not None:
                    legacy_slots.append((legacy_slot.op.name, name, slot))
        legacy_extra = [(v.op.name, key) for (key, _graph), v in twin._non_slot_dict.items()]
    state: dict[str, tuple[str, Any]] = {}  # eager again: the migrated optimizer's tables
    for legacy_slot_name, name, slot in legacy_slots:
        migrated_name, var = trained[name]
        migrated_slot = optimizer.get_slot(var, slot)
        if migrated_slot is not None:
            state[legacy_slot_name] = (f"{migrated_name} [slot {slot}]", migrated_slot)
    for legacy_name, key in legacy_extra:
        migrated = optimizer._non_slot_dict.get((key, None))
        if migrated is not None:
            state[legacy_name] = (f"[optimizer {key}]", migrated)
    return state
