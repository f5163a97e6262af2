"""The checkpoint a converted folder holds, and how a migrated program restores it (imports TF).

- The protocol dict carries ``checkpoint`` (a ``tf.train.Checkpoint`` the program saves and
  restores itself): the converted values are written through that object, so the program's own
  restore code reads them.
- Otherwise: ``tf.train.Checkpoint(variables=program["variables"])``, plus
  ``optimizer=<the optimizer>`` when the program hands one over (``optimizer`` key) and it is a
  ``tf.compat.v1.train`` optimizer (its slots are converted).

Either way the folder is a ``tf.train.CheckpointManager`` folder (``ckpt-N`` + ``checkpoint``):
``tf.train.latest_checkpoint(folder)`` finds it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfmigrate.checkpoint.slots import find_optimizer, is_v1_optimizer

CHECKPOINT_NAME = "ckpt"


def checkpoint_for(tf: Any, program: dict[str, Any]) -> tuple[Any, str]:
    """(the checkpoint object, a description of the layout for the report)."""
    own = program.get("checkpoint")
    if own is not None:
        return own, "the program's own tf.train.Checkpoint (protocol key 'checkpoint')"
    optimizer = find_optimizer(program)
    if optimizer is not None and is_v1_optimizer(tf, optimizer):
        return (
            tf.train.Checkpoint(variables=dict(program["variables"]), optimizer=optimizer),
            "tf.train.Checkpoint(variables=program['variables'], optimizer=program['optimizer'])",
        )
    return (
        tf.train.Checkpoint(variables=dict(program["variables"])),
        "tf.train.Checkpoint(variables=program['variables'])",
    )


def restore_program(tf: Any, strategy: Any, program: dict[str, Any], folder: Path) -> str:
    """Restore a converted folder into a freshly built program; returns the checkpoint path.

    Inside ``strategy.scope()``: optimizer slots that exist only in the checkpoint are created by
    the restore itself, and outside the scope they would not be mirrored.
    """
    path = tf.train.latest_checkpoint(str(folder))
    if path is None:
        raise FileNotFoundError(f"no checkpoint in {folder}")
    checkpoint, _ = checkpoint_for(tf, program)
    with strategy.scope():
        checkpoint.restore(path).assert_existing_objects_matched()
    return path
