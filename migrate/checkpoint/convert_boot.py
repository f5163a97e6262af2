"""The conversion, in its own process: ``python -m tfmigrate.checkpoint.convert_boot ...``.

Reads the legacy checkpoint with ``tf.train.load_checkpoint`` (the legacy graph never runs). A
script that defines ``tfmigrate_program`` is built through the verify protocol under a
MirroredStrategy (as verify's migrated side does), each variable gets its legacy value by the
manifest's mapping, and the result is saved into ``--out`` (a scratch folder the command renames
into place). Any other script runs as written, up to its first training step
(as_written_convert.py). Writes ``--result`` (JSON) in every case, problems listed by name.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from tfmigrate.checkpoint.layout import CHECKPOINT_NAME, checkpoint_for
from tfmigrate.checkpoint.plan import EMA_SUFFIX, Plan, Spec, plan_conversion
from tfmigrate.checkpoint.slots import find_optimizer, is_v1_optimizer, spec_of, v1_optimizer_state
from tfmigrate.verify import protocol
from tfmigrate.verify.as_written import defines_protocol
from tfmigrate.verify.migrated_boot import (
    SetupProblem,
    configure_devices,
    load_program_module,
    user_traceback,
)

WEIGHTS_FILE = "model.weights.h5"
REPORT_FILE = "conversion.json"


class ConversionError(Exception):
    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


def resolve_prefix(tf: Any, path: Path) -> str:
    """A checkpoint prefix (``model.ckpt-1000``), or a folder holding a ``checkpoint`` file."""
    if path.is_dir():
        prefix = tf.train.latest_checkpoint(str(path))
        if prefix is None:
            raise ConversionError(
                f"no TF checkpoint in folder {path} (no 'checkpoint' file naming one)"
            )
        return prefix
    if not Path(str(path) + ".index").exists():
        raise ConversionError(f"checkpoint {path} not found ({path}.index does not exist)")
    return str(path)


def read_specs(tf: Any, prefix: str) -> tuple[Any, dict[str, Spec]]:
    try:
        reader = tf.train.load_checkpoint(prefix)
        shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    except Exception as exc:  # noqa: BLE001  TF raises several error types for a damaged bundle
        raise ConversionError(
            f"cannot read checkpoint {prefix}: {type(exc).__name__}: {exc}"
        ) from exc
    specs = {
        name: Spec(tuple(int(d) for d in shapes[name]), tf.as_dtype(dtypes[name]).name)
        for name in shapes
    }
    return reader, specs


def step_number(prefix: str) -> int | None:
    match = re.search(r"-(\d+)$", prefix)
    return int(match.group(1)) if match else None


def read_values(reader: Any, plan: Plan, prefix: str) -> dict[str, Any]:
    """Every value the plan assigns, read from the checkpoint; each unreadable one named."""
    values, unreadable = {}, []
    for a in plan.assignments:
        try:
            values[a.source] = reader.get_tensor(a.source)
        except Exception as exc:  # noqa: BLE001  a damaged data file shows here
            unreadable.append(
                f"cannot read {a.source!r} from the checkpoint: {type(exc).__name__}: {exc}"
            )
    if unreadable:
        raise ConversionError(f"checkpoint {prefix} is damaged", unreadable)
    return values


def convert(tf: Any, ns: argparse.Namespace, script_args: list[str]) -> dict[str, Any]:
    if not defines_protocol(ns.script, protocol.ENTRY_POINT):
        from tfmigrate.checkpoint import as_written_convert

        return as_written_convert.convert(tf, ns, script_args)
    prefix = resolve_prefix(tf, ns.checkpoint)
    reader, specs = read_specs(tf, prefix)
    mapping: dict[str, str] = json.loads(ns.mapping.read_text())

    devices = configure_devices(tf, ns.replicas, ns.device)
    strategy = tf.distribute.MirroredStrategy(devices=devices)
    script = ns.script.resolve()
    sys.argv = [str(script), *script_args]
    sys.path.insert(0, str(script.parent))
    module = load_program_module(script)
    entry = getattr(module, protocol.ENTRY_POINT, None)
    if entry is None:
        raise ConversionError(
            f"{script.name} defines no {protocol.ENTRY_POINT}(strategy, argv); see docs/verify.md"
        )
    program = entry(strategy, list(script_args))
    variables: dict[str, Any] = dict(program[protocol.KEY_VARIABLES])
    if mapping == {"*": "*"}:  # the manifest maps by name (docs/verify.md)
        mapping = {name: name for name in specs if name in variables}

    optimizer = find_optimizer(program)
    state: dict[str, tuple[str, Any]] = {}
    if optimizer is not None and is_v1_optimizer(tf, optimizer):
        trained = {
            legacy: (new, variables[new])
            for legacy, new in mapping.items()
            if new in variables and getattr(variables[new], "trainable", False)
        }
        state = v1_optimizer_state(tf, strategy, optimizer, trained)
    plan = plan_conversion(
        specs,
        {name: spec_of(tf, v) for name, v in variables.items()},
        mapping,
        slots={legacy: (label, spec_of(tf, var)) for legacy, (label, var) in state.items()},
        use_ema=ns.use_ema,
        ema_suffix=ns.ema_name,
    )
    if optimizer is not None and not is_v1_optimizer(tf, optimizer):
        plan.notes.append(
            f"the program's optimizer ({type(optimizer).__name__}) is not a "
            "tf.compat.v1.train optimizer: its state is not converted"
        )
    if not plan.ok:
        raise ConversionError("the checkpoint does not fit the program", plan.problems)

    targets = {**variables, **{label: var for label, var in state.values()}}
    values = read_values(reader, plan, prefix)
    with strategy.scope():
        for a in plan.assignments:
            targets[a.target].assign(values[a.source])  # cross-replica: every replica gets it

    checkpoint, layout = checkpoint_for(tf, program)
    manager = tf.train.CheckpointManager(
        checkpoint, str(ns.out), max_to_keep=1, checkpoint_name=CHECKPOINT_NAME
    )
    saved = manager.save(checkpoint_number=step_number(prefix))
    files = sorted(p.name for p in ns.out.iterdir())
    model = program.get("model")
    if model is not None and hasattr(model, "save_weights"):
        model.save_weights(str(ns.out / WEIGHTS_FILE))
        files.append(WEIGHTS_FILE)
    return report(prefix, ns, plan, layout, Path(saved).name, files)


def report(
    prefix: str, ns: argparse.Namespace, plan: Plan, layout: str, saved: str, files: list[str]
) -> dict[str, Any]:
    return {
        "status": "ok",
        "legacy_checkpoint": prefix,
        "script": str(ns.script),
        "use_ema": ns.use_ema,
        "checkpoint": saved,
        "layout": layout,
        "files": files,
        "converted": [vars(a) for a in plan.assignments],
        "notes": plan.notes,
        "optimizer_state_dropped": plan.dropped_state,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfmigrate.checkpoint.convert_boot")
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--script", type=Path, required=True)
    parser.add_argument(
        "--mapping", type=Path, required=True, help="JSON {legacy name: migrated name}"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--use-ema", action="store_true")
    parser.add_argument("--ema-name", default=EMA_SUFFIX)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    script_args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    os.environ.pop("TF_USE_LEGACY_KERAS", None)  # the migrated program is Keras 3
    ns.out.mkdir(parents=True, exist_ok=True)
    import tensorflow as tf

    try:
        result = convert(tf, ns, script_args)
        (ns.out / REPORT_FILE).write_text(json.dumps(result, indent=2) + "\n")
    except ConversionError as exc:
        result = {"status": "error", "message": str(exc), "problems": exc.problems}
    except SetupProblem as exc:  # e.g. fewer GPUs than replicas
        result = {"status": "error", "message": str(exc), "problems": []}
    except Exception as exc:  # noqa: BLE001  the user's program failed to build
        result = {
            "status": "crashed",
            "message": f"{type(exc).__name__}: {exc}".strip(),
            "traceback": user_traceback(exc),
        }
    ns.result.write_text(json.dumps(result, indent=2))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
