"""convert-checkpoint: a trained TF1 checkpoint into the migrated program's variables (docs/checkpoints.md).

Modules (only the boot module and what it imports, run as a subprocess, import TensorFlow):
  command        the typer command ``tfmigrate convert-checkpoint``
  plan           which checkpoint entry goes into which migrated variable; problems and notes
  convert_boot   the conversion itself: reads the checkpoint, builds the program, assigns, saves
  as_written_convert  the same for a program run as written, stopped before its first step
  slots          tf.compat.v1.train optimizer slots: their legacy names and migrated variables
  layout         the checkpoint object a converted folder holds, and how a program restores it
  check          both programs restored from their checkpoints, one step each, compared
"""
