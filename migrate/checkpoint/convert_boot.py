"""The conversion, in its own process: ``python -m tfmigrate.checkpoint.convert_boot ...``.

Reads the legacy checkpoint with ``tf.train.load_checkpoint`` (the legacy graph never runs). The
migrated script runs as written, up to its first training step (as_written_convert.py), and the
result is saved into ``--out`` (a scratch folder the command renames into place). Writes
``--result`` (JSON) in every case, problems listed by name.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from tfmigrate.checkpoint.plan import EMA_SUFFIX, ConversionError, Plan, Spec
from tfmigrate.verify.migrated_boot import CONVERSION_JSON, SetupProblem, user_traceback

WEIGHTS_FILE = "model.weights.h5"
REPORT_FILE = CONVERSION_JSON


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
        from tfmigrate.checkpoint import as_written_convert

        result = as_written_convert.convert(tf, ns, script_args)
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
