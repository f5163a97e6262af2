"""Migrated side of verify: ``python -m tfmigrate.verify.migrated_boot --script train.py --out DIR ...``.

The script runs as its user runs it, instrumented from outside (as_written.py): its main block with
its own argv, every MirroredStrategy it creates on verify's N logical CPU devices (or GPUs); as one
worker of a cluster with ``--strategy multi-worker`` (multi_worker_runtime.WorkerAsWritten);
saving its state after step K for ``--roundtrip`` (roundtrip_boot.SavingRun); restored by its own
code from a converted checkpoint for ``convert-checkpoint --check`` (``--restore``). A script that
defines a function named ``tfmigrate_program`` (an entry point of older tfmigrate versions) is run
as written too; the function is ignored.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from tfmigrate.verify import as_written
from tfmigrate.verify.manifest import RESOLVED_MAPPING
from tfmigrate.verify.record import (
    CRASHED,
    ERROR,
    OK,
    RunRecord,
)

CONVERSION_JSON = "conversion.json"  # convert-checkpoint's report, in the folder it writes
# TensorFlow's error when a MultiWorkerMirroredStrategy comes after the first op
COLLECTIVES_TOO_LATE = "Collective ops must be configured at program startup"


class SetupProblem(Exception):
    """verify could not run the program (no such devices, a converted folder it cannot use, ...)."""


def place_converted(folder: Path, cwd: Path) -> None:
    """convert-checkpoint --check: put the converted checkpoint where the program's own
    CheckpointManager looks for it (conversion.json says where that was, relative to the working
    directory), so that the program's own restore code loads it."""
    report = folder / CONVERSION_JSON
    where = json.loads(report.read_text()).get("restore_folder") if report.exists() else None
    if where is None:
        raise SetupProblem(
            "--check: the program keeps no tf.train.CheckpointManager, so where its own restore "
            "reads from is not known; restore it from the converted folder yourself and compare"
        )
    target = Path(where) if Path(where).is_absolute() else cwd / where
    if target.resolve() == folder.resolve():
        return
    if Path(where).is_absolute():
        raise SetupProblem(
            f"--check: the program restores from {where}, not from the converted folder; give it "
            "the flag that names its checkpoint folder (after --) pointing at --out"
        )
    shutil.copytree(folder, target, dirs_exist_ok=True)


def configure_devices(tf: Any, replicas: int, device: str) -> list[str]:
    if device == "gpu":
        gpus = tf.config.list_logical_devices("GPU")
        if len(gpus) < replicas:
            raise SetupProblem(
                f"--device gpu: {len(gpus)} GPU(s) visible, {replicas} replicas requested"
            )
        return [d.name for d in gpus[:replicas]]
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * replicas
    )
    return [f"/cpu:{i}" for i in range(replicas)]


def user_traceback(exc: BaseException) -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    te = traceback.TracebackException.from_exception(exc)
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if not f.filename.startswith(here)]
    )
    return "".join(te.format())


def _peak_memory(tf: Any, devices: list[str]) -> tuple[int, str]:
    if devices and "gpu" in devices[0].lower():
        try:
            return max(
                tf.config.experimental.get_memory_info(d)["peak"] for d in devices
            ), "GPU peak"
        except Exception:  # noqa: BLE001
            pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "process peak RSS (CPU)"


def run_as_written(tf: Any, ns: argparse.Namespace, script_args: list[str]) -> int:
    """The program's main block, unmodified, instrumented from outside (as_written.py)."""
    record = RunRecord(side="migrated")
    devices: list[str] = []
    runner = None
    multi_worker = ns.strategy == "multi-worker"
    try:
        # a worker's devices are the cluster's (TF_CONFIG; on cpu one per worker)
        devices = [] if multi_worker else configure_devices(tf, ns.replicas, ns.device)
        tf.random.set_seed(ns.seed)
        tf.config.experimental.enable_op_determinism()
        if ns.restore is not None:
            place_converted(ns.restore, Path.cwd())
        mapping = json.loads(ns.mapping.read_text())
        runner, ended = _run_instrumented(tf, ns, script_args, devices, mapping)
        record = runner.record
        record.devices = runner.replicas
        if as_written.defines_function(ns.script, as_written.OLD_ENTRY_POINT):
            record.notes.append(
                f"the script defines {as_written.OLD_ENTRY_POINT}(), an entry point of older "
                "tfmigrate versions: it is ignored, the program ran as written"
            )
        if runner.problem is not None or isinstance(ended, as_written.Problem):
            record.status, record.message = ERROR, runner.problem or str(ended)
        elif isinstance(ended, SystemExit):
            record.status = CRASHED
            record.message = f"the migrated script exited with status {ended.code}"
        elif ended is not None:
            record.status = CRASHED
            record.message = f"{type(ended).__name__}: {ended}".strip()
            record.traceback = user_traceback(ended)
            if multi_worker and COLLECTIVES_TOO_LATE in str(ended):
                record.message += (
                    " (the program ran TensorFlow ops before it created its "
                    "MultiWorkerMirroredStrategy: create the strategy first, as on a real cluster)"
                )
        elif not record.steps:
            record.status = ERROR
            record.message = (
                "no training step recognised: the program ended without an optimizer update verify "
                "can see (Keras Optimizer.apply_gradients/apply, tf.compat.v1.train.Optimizer) "
                "in a tf.function or eagerly"
            )
        elif len(record.steps) < ns.steps:
            record.notes.append(
                f"the migrated program ended after {len(record.steps)} of {ns.steps} steps"
            )
        if record.status != ERROR and runner.started:
            runner.finish()
            (ns.out / RESOLVED_MAPPING).write_text(json.dumps(runner.mapping, indent=2))
        if not runner.strategies and multi_worker and record.status == OK:
            record.status = ERROR
            record.message = (
                "--workers: the program created no tf.distribute.MultiWorkerMirroredStrategy"
            )
        elif not runner.strategies and not multi_worker:
            record.notes.append("the program created no MirroredStrategy: it trained on one device")
    except SetupProblem as exc:
        record.status, record.message = ERROR, str(exc)
    except Exception as exc:  # noqa: BLE001
        record.status, record.message = ERROR, f"verify's migrated runner failed: {exc!r}"
        record.traceback = traceback.format_exc()
    _finish(record, tf, devices, ns.out)


def _run_instrumented(
    tf: Any,
    ns: argparse.Namespace,
    script_args: list[str],
    devices: list[str],
    mapping: dict[str, str],
) -> tuple[as_written.AsWritten, BaseException | None]:
    """The program as written under the runner its mode needs: one worker of a cluster
    (--workers), one that also saves and continues for --roundtrip, or the plain one (which, with
    --restore, keeps the values the program's own restore loaded)."""
    script = ns.script.resolve()
    args = (tf, devices, ns.out, ns.steps, ns.init, mapping, ns.wait, ns.replay_inputs)
    runner: as_written.AsWritten
    if ns.strategy == "multi-worker":
        from tfmigrate.verify.multi_worker_runtime import WorkerAsWritten

        runner = WorkerAsWritten(*args)
    elif ns.roundtrip is not None:
        from tfmigrate.verify.roundtrip_boot import SavingRun

        runner = SavingRun(
            *args,
            roundtrip=ns.roundtrip,
            replicas=ns.replicas,
            device=ns.device,
            seed=ns.seed,
            script_args=script_args,
        )
    else:
        runner = as_written.AsWritten(*args)
    runner.keep_values = ns.restore is not None
    if ns.mapping_source:
        runner.mapping_source = f"the variable mapping of {ns.mapping_source}"
    if ns.replay_inputs is not None:
        runner.record.notes.append(
            "--replay-inputs: the migrated replicas trained on the legacy towers' batches; the "
            "input pipeline itself was not compared"
        )
    return runner, as_written.run_program(tf, runner, script, script_args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfmigrate.verify.migrated_boot")
    parser.add_argument("--script", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument(
        "--init", type=Path, required=True, help="legacy side's init.npz (waited for)"
    )
    parser.add_argument(
        "--mapping", type=Path, required=True, help="JSON {legacy name: migrated name}"
    )
    parser.add_argument(
        "--mapping-source", default="", help="where the mapping came from (for its messages)"
    )
    parser.add_argument("--wait", type=float, default=600.0)
    parser.add_argument(
        "--roundtrip", type=Path, help="save here and record in-strategy predictions"
    )
    parser.add_argument(
        "--restore",
        type=Path,
        help="a converted checkpoint folder: the program's own restore loads it (no legacy values)",
    )
    parser.add_argument(
        "--strategy",
        choices=("mirrored", "multi-worker"),
        default="mirrored",
        help="multi-worker: one worker of a cluster described by TF_CONFIG",
    )
    parser.add_argument(
        "--replay-inputs", type=Path, help="the legacy run's inputs.npz: train on its batches"
    )
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    script_args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    ns.out.mkdir(parents=True, exist_ok=True)
    os.environ.pop("TF_USE_LEGACY_KERAS", None)  # the migrated side is Keras 3
    random.seed(ns.seed)
    np.random.seed(ns.seed)
    import tensorflow as tf

    return run_as_written(tf, ns, script_args)


def _finish(record: RunRecord, tf: Any, devices: list[str], out: Path) -> NoReturn:
    """Write the record and leave at once: TF's threads and the program's own need no shutdown."""
    record.peak_memory_bytes, record.memory_source = _peak_memory(tf, devices)
    record.save(out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
