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

    "one_step":       one_step                    # what train_step compiles: tf.function(one_step)

- ``one_step``: the training step before ``tf.function`` (``train_step = tf.function(one_step)``).
  A tf.function call and a distributed iterator's ``next`` cost a fixed time each, more than a
  small model's whole step, so a program's own loop may run several steps per call (Keras'
  ``steps_per_execution``; the rewrite's ``StepsInOneCall``). verify then does the same: it
  traces ``one_step`` into a loop of its own, several steps to a call, taking the batches inside
  the call, and reads what it compares of each step (its values, the traced variables, its
  batch) inside the call too, after that step. Without it verify calls ``train_step`` once per
  batch.

With it, optionally::

    "steps_per_call": 1                         # steps per call of the program's own loop

- ``steps_per_call``: how many steps the program's own loop runs per call (without it verify
  runs ``STEPS_PER_CALL``): ``model.fit`` runs ``steps_per_execution``. verify's loop then runs
  as many per call, so that it pays (and times) what the program pays per step.

Optional key for a step compiled with XLA::

    "jit_compile":    True                        # some of the step runs under jit_compile=True

- ``jit_compile``: verify then trains the program without TensorFlow's op determinism (which
  it otherwise enables on both sides): XLA has no deterministic implementation of some gradients
  (MaxPool's) and refuses to compile them under it. The report says so.

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
KEY_ONE_STEP = "one_step"
KEY_JIT_COMPILE = "jit_compile"
KEY_STEPS_PER_CALL = "steps_per_call"
STEPS_PER_CALL = 20  # steps per call of one_step's loop, after a first call of one step (tracing)
WATCHED_VALUES_PER_CALL = 4_000_000  # fewer steps per call when the traced variables are large
ROUNDTRIP_KEYS = ("save", "restore", "predict", "predict_inputs")
ROUNDTRIP_BEFORE = "roundtrip_before.npz"
ROUNDTRIP_AFTER = "roundtrip_after.npz"
