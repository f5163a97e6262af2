"""verify: train the legacy and the migrated program side by side and compare (docs/verify.md).

Modules (only the boot modules, run as subprocesses, import TensorFlow):
  command        the typer command ``tfmigrate verify``
  verifier       options -> manifest -> both sides -> comparison (an Outcome)
  sides          subprocess orchestration: scratch folders, concurrency, timeouts
  legacy_boot    legacy runtime: runs an unmodified TF1 script, instruments Session.run
  tf1_compat     the TF1 world on TF 2.21: tensorflow -> compat.v1, tf.contrib shims, keras -> tf_keras
  migrated_boot  migrated runtime: runs the TF2 script as written (as_written.py), instrumented
  as_written     the instrumentation: devices, steps, losses, variables, start and stop
  roundtrip_boot --roundtrip: a fresh run of the program resumed from the state saved after step K
  workers        --workers W: the migrated side as W MultiWorkerMirroredStrategy processes
  multi_worker_runtime  inside a worker: its strategy, replicas' values gathered
  record         what a side writes (record.json, init/final/trace .npz)
  fingerprint    split-invariant input fingerprints
  tower_names    tower scopes in TF1 names
  manifest       what verify reads from tfmigrate.json / a mapping file
  compare        tolerances, per-step and variable comparison, first divergence
  report         rich table, report.json, report.md, loss.png
"""
