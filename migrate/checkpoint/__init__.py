"""convert-checkpoint: a trained TF1 checkpoint into the migrated program's variables (docs/checkpoints.md).

Modules (only the boot module and what it imports, run as a subprocess, import TensorFlow):
  command        the typer command ``tfmigrate convert-checkpoint``
  plan           which checkpoint entry goes into which migrated variable; problems and notes
  convert_boot   the conversion's process: reads the checkpoint, reports
  as_written_convert  runs the program as written to its first step, assigns, saves through its
                 own tf.train.Checkpoint
  slots          tf.compat.v1.train optimizer slots: their legacy names and migrated variables
  check          both programs restored from their checkpoints (the migrated one by its own
                 restore code), one step each, compared
"""
