"""The protocol a migrated TF2 program follows so that verify can drive it (no TensorFlow here).

A migrated script stays an ordinary program (``python train.py`` trains) and does not import
tfmigrate. It additionally defines, at module level::

    def tfmigrate_program(strategy: tf.distribute.Strategy, argv: list[str]) -> dict:
        # build model, optimizer, variables inside strategy.scope(); parse argv like main() does
        return {
            "variables": {name: tf.Variable, ...},   # every variable verify may load or compare
            "train_step": train_step,                 # distributed batch -> {key: PerReplica|Tensor}
            "batches": dist_dataset,                  # iterable of distributed batches, in step order
        }

- ``variables``: created (built) before returning — Keras models built, EMA shadows created. Keys
  are the migrated names the manifest's variable mapping points to (for Keras 3 use ``v.path``).
  Optimizer slots are not needed: verify never loads them, so a wrong slot initialisation shows.
- ``train_step(batch)``: one training step, usually ``strategy.run(step_fn, args=...)`` inside a
  ``@tf.function``. Returns a mapping of the values the legacy loop fetched: a per-replica value
  (``PerReplica``, what ``strategy.run`` returns) is compared tower i against replica i; a plain
  tensor (e.g. ``strategy.reduce(...)``) is compared against a legacy value not tied to a tower.
- ``batches``: what the program's own loop iterates (e.g. ``strategy.experimental_distribute_dataset``),
  yielding exactly what ``train_step`` takes. verify fingerprints each batch (per replica, in replica
  order) to make sure both sides saw the same data.

Optional key for speed, used by verify when present::

    "train_steps":    train_steps(iterator, count, watch=None) -> [one entry per step run]

- ``train_steps``: up to ``count`` training steps in one call, taking their batches from
  ``iterator`` (an iterator over ``batches``), fewer when the batches end, none when they have
  ended. A tf.function call and a distributed iterator's ``next`` cost a fixed time each, more than
  a small model's whole step: a program that runs several steps per call pays it once per call
  (Keras' ``steps_per_execution``). With ``watch`` (a list of variables, possibly empty) each entry
  is ``{"outputs": {key: [replica 0's part, ...]}, "per_replica": [keys], "watched": [each watched
  variable's replica 0 value after the step], "inputs": [[replica 0's part, ...] for each batch
  array]}`` (numpy): what verify records of a step when it drives ``train_step`` one batch at a
  time. ``outputs`` holds what ``train_step`` returns for that batch, each value as its
  ``strategy.experimental_local_results`` (one part for a value not per replica); ``per_replica``
  names the values that were per-replica (compared tower i against replica i).

Optional keys for ``--roundtrip`` (save in-strategy, reload in a fresh process without a strategy,
compare predictions)::

    "save":           save(folder: str)     # the way the program saves its model (weights/checkpoint)
    "restore":        restore(folder: str)  # what a user's evaluation script does to load it
    "predict":        predict(inputs) -> predictions (inference mode)
    "predict_inputs": a batch (array or tensor) to predict on
"""

from __future__ import annotations

ENTRY_POINT = "tfmigrate_program"
KEY_VARIABLES = "variables"
KEY_TRAIN_STEP = "train_step"
KEY_BATCHES = "batches"
REQUIRED_KEYS = (KEY_VARIABLES, KEY_TRAIN_STEP, KEY_BATCHES)
KEY_TRAIN_STEPS = "train_steps"
STEPS_PER_CALL = 20  # verify's calls of train_steps, after a first call of one step (tracing)
WATCHED_VALUES_PER_CALL = 4_000_000  # fewer steps per call when the traced variables are large
ROUNDTRIP_KEYS = ("save", "restore", "predict", "predict_inputs")
ROUNDTRIP_BEFORE = "roundtrip_before.npz"
ROUNDTRIP_AFTER = "roundtrip_after.npz"
