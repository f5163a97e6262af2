"""Second half of ``--roundtrip``: ``python -m tfmigrate.verify.roundtrip_boot --script S --dir D``.

A fresh process with one device and NO distribution strategy (what a user's evaluation or serving
script has): build the program with the default strategy, ``restore`` what the trained run saved,
predict on the same inputs and store the predictions for the comparison.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from tfmigrate.verify import protocol
from tfmigrate.verify.migrated_boot import (
    SetupProblem,
    load_program_module,
    roundtrip_parts,
    user_traceback,
)
from tfmigrate.verify.record import CRASHED, ERROR, RunRecord, save_arrays


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfmigrate.verify.roundtrip_boot")
    parser.add_argument("--script", type=Path, required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    script_args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    record = RunRecord(side="roundtrip")
    os.environ.pop("TF_USE_LEGACY_KERAS", None)
    import tensorflow as tf

    try:
        tf.random.set_seed(ns.seed)
        script = ns.script.resolve()
        sys.argv = [str(script), *script_args]
        sys.path.insert(0, str(script.parent))
        module = load_program_module(script)
        entry = getattr(module, protocol.ENTRY_POINT, None)
        if entry is None:
            raise SetupProblem(f"{script.name} defines no {protocol.ENTRY_POINT}(strategy, argv)")
        program = entry(tf.distribute.get_strategy(), list(script_args))
        _save, restore, predict, inputs = roundtrip_parts(program)
        restore(str(ns.dir / "saved"))
        save_arrays(ns.dir / protocol.ROUNDTRIP_AFTER, {"predictions": np.asarray(predict(inputs))})
    except SetupProblem as exc:
        record.status, record.message = ERROR, str(exc)
    except Exception as exc:  # noqa: BLE001  the program's own build/restore/predict failed
        record.status = CRASHED
        record.message = f"{type(exc).__name__}: {exc}".strip()
        record.traceback = user_traceback(exc)
    record.save(ns.dir)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
