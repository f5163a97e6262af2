"""Migrated side of verify: ``python -m tfmigrate.verify.migrated_boot --script train.py --out DIR ...``.

A script that does not define ``tfmigrate_program`` runs as its user runs it, instrumented from
outside (as_written.py): as one worker of a cluster with ``--strategy multi-worker``
(multi_worker_runtime.WorkerAsWritten), saving its state after step K for ``--roundtrip``
(roundtrip_boot.SavingRun). A script that still defines it is driven through it, as below.

Imports the TF2 script as a module (its ``__main__`` block does not run), calls its
``tfmigrate_program(strategy, argv)`` (protocol.py) with a MirroredStrategy over N logical CPU
devices, waits for the legacy side's initial variables, loads them through the name mapping, then
drives ``train_step`` for K batches, recording what the legacy side records (record.py). A program
that also offers ``one_step`` (the step before tf.function) has it run several steps per call
instead (watched_steps.py), with the same record: each step's fetches, input fingerprint and
traced variables.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from tfmigrate.verify import as_written, fingerprint, protocol
from tfmigrate.verify.manifest import RESOLVED_MAPPING, SAME_NAMES
from tfmigrate.verify.record import (
    CRASHED,
    ERROR,
    FINAL_NPZ,
    INIT_NPZ,
    TRACE_NPZ,
    TRACED_JSON,
    Fetch,
    RunRecord,
    Step,
    load_arrays,
    save_arrays,
)


class SetupProblem(Exception):
    """verify could not run the program (protocol not followed, mapping does not fit, ...)."""


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


def load_program_module(script: Path) -> Any:
    spec = importlib.util.spec_from_file_location("tfmigrate_migrated_program", script)
    if spec is None or spec.loader is None:
        raise SetupProblem(f"cannot import {script}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def wait_for(path: Path, timeout: float) -> None:
    """The legacy side writes its initial variables while it trains; start as soon as they exist."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SetupProblem(f"timed out waiting for the legacy initial variables ({path})")
        time.sleep(0.05)


def local_values(strategy: Any, value: Any) -> list[np.ndarray]:
    return [np.asarray(v) for v in strategy.experimental_local_results(value)]


def tf_variable(var: Any) -> Any:
    """Keras 3 variables wrap the tf.Variable (a MirroredVariable under a strategy) in ``.value``."""
    return var.value if type(var).__module__.startswith("keras") else var


def is_distributed(tf: Any, value: Any) -> bool:
    return isinstance(value, tf.distribute.DistributedValues)


class MigratedRunner:
    def __init__(self, tf: Any, strategy: Any, program: dict[str, Any], out: Path) -> None:
        self.tf, self.strategy, self.out = tf, strategy, out
        missing = [k for k in protocol.REQUIRED_KEYS if k not in program]
        if missing:
            raise SetupProblem(f"{protocol.ENTRY_POINT}() must return the keys {missing}")
        self.variables: dict[str, Any] = dict(program[protocol.KEY_VARIABLES])
        self.train_step = program[protocol.KEY_TRAIN_STEP]
        self.batches = program[protocol.KEY_BATCHES]
        self.one_step = program.get(protocol.KEY_ONE_STEP)
        # the program's own loop may run fewer steps per call than verify would (Keras' fit)
        self.steps_per_call = int(
            program.get(protocol.KEY_STEPS_PER_CALL) or protocol.STEPS_PER_CALL
        )
        self.record = RunRecord(side="migrated", devices=strategy.num_replicas_in_sync)
        self.trace: dict[str, list[np.ndarray]] = {}

    def load_initial(self, init: dict[str, np.ndarray], mapping: dict[str, str]) -> None:
        problems = []
        for legacy_name, new_name in mapping.items():
            if legacy_name not in init:
                problems.append(
                    f"legacy variable {legacy_name!r} (mapped to {new_name!r}) does not exist"
                )
                continue
            var = self.variables.get(new_name)
            if var is None:
                problems.append(
                    f"migrated variable {new_name!r} (mapped from {legacy_name!r}) is not in "
                    f"the program's variables"
                )
                continue
            value = init[legacy_name]
            if tuple(var.shape) != value.shape:
                problems.append(
                    f"{legacy_name} {value.shape} -> {new_name} {tuple(var.shape)}: shapes differ"
                )
                continue
            var.assign(value.astype(self.tf.as_dtype(var.dtype).as_numpy_dtype))
        if problems:
            raise SetupProblem("the variable mapping does not fit:\n  " + "\n  ".join(problems))

    def describe_variables(self, mapped: set[str]) -> None:
        for name, var in self.variables.items():
            self.record.variables[name] = {
                "shape": list(var.shape),
                "dtype": self.tf.as_dtype(var.dtype).name,
                "trainable": bool(getattr(var, "trainable", False)),
                "mapped": name in mapped,
            }

    def replica_values(self, value: Any) -> list[np.ndarray]:
        """Every replica's part of a distributed value, in replica order (here: this process's)."""
        return local_values(self.strategy, value)

    def read(self, names: list[str]) -> dict[str, np.ndarray]:
        return {n: local_values(self.strategy, tf_variable(self.variables[n]))[0] for n in names}

    def run(self, steps: int, trace_names: list[str]) -> None:
        if self.one_step is not None:
            self.run_several(steps, trace_names)
            return
        iterator = iter(self.batches)
        for index in range(1, steps + 1):
            # Timed like the legacy Session.run, which feeds its batch or runs its input pipeline:
            # taking the next distributed batch is part of the step.
            start = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                self.record.notes.append(
                    f"the migrated program's batches ended after {index - 1} steps"
                )
                break
            out = self.train_step(batch)
            fetches = self.fetches(out)  # converting to numpy waits for the step to finish
            seconds = time.perf_counter() - start
            inputs, samples = self.fingerprint(batch)
            self.record.steps.append(
                Step(step=index, seconds=seconds, fetches=fetches, inputs=inputs, samples=samples)
            )
            for name, value in self.read(trace_names).items():
                self.trace.setdefault(name, []).append(value)

    def watched_steps(self, watch: list[Any]) -> Any:
        """``one_step`` several to a call, recording each step (watched_steps.WatchedSteps)."""
        from tfmigrate.verify.watched_steps import WatchedSteps

        assert self.one_step is not None  # run() takes this way only with one_step
        return WatchedSteps(self.strategy, self.one_step, watch)

    def run_several(self, steps: int, trace_names: list[str]) -> None:
        """``one_step`` in verify's own loop: a first call of two steps, then several per call. The
        loop's first step and its body are two call sites of the step: the first call runs both,
        so that tracing and compiling (XLA compiles each site when it first runs) stay in the
        warm-up steps. A step's time is its call's time over the steps the call ran (what a program
        whose loop runs several steps per call pays per step); its batch is taken inside the
        call, so it is part of the step, as above."""
        iterator = iter(self.batches)
        watch = [tf_variable(self.variables[n]) for n in trace_names]
        train_steps = self.watched_steps(watch)
        size = sum(int(np.prod(v.shape)) for v in watch)
        per_call = max(
            1, min(self.steps_per_call, protocol.WATCHED_VALUES_PER_CALL // max(size, 1))
        )
        count = 2
        while len(self.record.steps) < steps:
            count = min(count, steps - len(self.record.steps))
            start = time.perf_counter()
            done = train_steps(iterator, count)
            seconds = (time.perf_counter() - start) / max(len(done), 1)
            for values in done:
                fetches = self.fetches(values["outputs"], per_replica=values["per_replica"])
                streams = [
                    parts
                    for parts in values["inputs"]
                    if all(fingerprint.is_data(p) for p in parts)
                ]
                inputs = fingerprint.step_fingerprint(streams) if streams else None
                samples = fingerprint.step_samples(streams) if streams else None
                self.record.steps.append(
                    Step(
                        step=len(self.record.steps) + 1,
                        seconds=seconds,
                        fetches=fetches,
                        inputs=inputs,
                        samples=samples,
                    )
                )
                for name, value in zip(trace_names, values["watched"], strict=True):
                    self.trace.setdefault(name, []).append(np.asarray(value))
            if len(done) < count:
                self.record.notes.append(
                    f"the migrated program's batches ended after {len(self.record.steps)} steps"
                )
                break
            count = per_call

    def fetches(self, out: Any, per_replica: list[str] | None = None) -> list[Fetch]:
        """The scalars of one step's values: train_step's tensors and distributed values, or
        (``per_replica`` given) numpy parts from verify's loop, each key's a list of its
        replicas'."""
        if not hasattr(out, "items"):
            raise SetupProblem(
                "train_step must return a mapping {name: per-replica value or tensor}"
            )
        result = []
        host = per_replica is not None
        for key, value in out.items():
            if key in per_replica if per_replica is not None else is_distributed(self.tf, value):
                parts = [np.asarray(v) for v in value] if host else self.replica_values(value)
                for i, v in enumerate(parts):
                    if v.size == 1:
                        result.append(
                            Fetch(name=f"{key}[{i}]", base=key, tower=i, value=float(v.reshape(())))
                        )
            else:
                v = np.asarray(value[0] if host else value)
                if v.size == 1:
                    result.append(Fetch(name=key, base=key, tower=None, value=float(v.reshape(()))))
        return result

    def fingerprint(self, batch: Any) -> tuple[list[str] | None, int | None]:
        streams = []
        for leaf in self.tf.nest.flatten(batch):
            parts = (
                self.replica_values(leaf) if is_distributed(self.tf, leaf) else [np.asarray(leaf)]
            )
            if parts and all(fingerprint.is_data(p) for p in parts):
                streams.append(parts)
        if not streams:
            return None, None
        return fingerprint.step_fingerprint(streams), fingerprint.step_samples(streams)

    def finish(self) -> None:
        names = list(self.variables)
        save_arrays(self.out / FINAL_NPZ, self.read(names))
        for name in names:
            parts = local_values(self.strategy, tf_variable(self.variables[name]))
            spread = max(
                (float(np.max(np.abs(p - parts[0]))) for p in parts[1:] if p.size), default=0.0
            )
            if spread > 0:
                self.record.replica_spread[name] = spread
        if self.trace:
            save_arrays(self.out / TRACE_NPZ, {n: np.stack(v) for n, v in self.trace.items()})


def resolve_by_name(init: dict[str, np.ndarray], variables: dict[str, Any]) -> dict[str, str]:
    """The manifest's by-name mapping: every legacy variable the program has under the same name,
    else the one program variable whose name differs only by leading scopes (Keras 3 puts a
    Sequential model's name in front: `sequential/conv2d/kernel` for tf_keras's `conv2d/kernel`)."""
    mapping = {name: name for name in init if name in variables}
    for name in init:
        if name not in mapping:
            found = [k for k in variables if k.endswith("/" + name) or name.endswith("/" + k)]
            if len(found) == 1 and found[0] not in mapping.values():
                mapping[name] = found[0]
    if not mapping:
        raise SetupProblem(
            "the manifest maps variables by name, but no migrated variable has a legacy variable's "
            f"name (legacy: {sorted(init)[:5]}..., migrated: {sorted(variables)[:5]}...); give "
            "verify an explicit mapping (--mapping)"
        )
    return mapping


def roundtrip_parts(program: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    missing = [k for k in protocol.ROUNDTRIP_KEYS if k not in program]
    if missing:
        raise SetupProblem(
            f"--roundtrip needs {protocol.ENTRY_POINT}() to return {missing} as well "
            "(see docs/verify.md)"
        )
    return tuple(program[k] for k in protocol.ROUNDTRIP_KEYS)


def save_for_roundtrip(program: dict[str, Any], folder: Path) -> None:
    """Predictions of the trained in-strategy model, then the program's own save."""
    save, _restore, predict, inputs = roundtrip_parts(program)
    folder.mkdir(parents=True, exist_ok=True)
    save_arrays(folder / protocol.ROUNDTRIP_BEFORE, {"predictions": np.asarray(predict(inputs))})
    save(str(folder / "saved"))


def user_traceback(exc: BaseException) -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    te = traceback.TracebackException.from_exception(exc)
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if not f.filename.startswith(here)]
    )
    return "".join(te.format())


def allow_xla(record: RunRecord) -> None:
    """Op determinism off for a step compiled with XLA (protocol.KEY_JIT_COMPILE), said in the
    report: XLA refuses to compile some gradients (MaxPool's) deterministically."""
    from tensorflow.python.framework import config  # no public way back exists

    config.disable_op_determinism()
    record.notes.append(
        "the migrated program compiles its step with XLA (jit_compile): it ran without "
        "TensorFlow's op determinism, which XLA cannot honour for every gradient"
    )


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
            raise SetupProblem(
                "convert-checkpoint's check needs a program that defines "
                f"{protocol.ENTRY_POINT}(); a program run as written does not support it yet"
            )
        mapping = json.loads(ns.mapping.read_text())
        runner, ended = _run_instrumented(tf, ns, script_args, devices, mapping)
        record = runner.record
        record.devices = runner.replicas
        if runner.problem is not None or isinstance(ended, as_written.Problem):
            record.status, record.message = ERROR, runner.problem or str(ended)
        elif isinstance(ended, SystemExit):
            record.status = CRASHED
            record.message = f"the migrated script exited with status {ended.code}"
        elif ended is not None:
            record.status = CRASHED
            record.message = f"{type(ended).__name__}: {ended}".strip()
            record.traceback = user_traceback(ended)
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
        if not runner.strategies and multi_worker and record.status != ERROR:
            record.status = ERROR
            record.message = (
                "--workers: the program created no tf.distribute.MultiWorkerMirroredStrategy"
            )
        elif not runner.strategies and not multi_worker:
            record.notes.append(
                "the program created no MirroredStrategy: it trained on one device"
            )
    except SetupProblem as exc:
        record.status, record.message = ERROR, str(exc)
    except Exception as exc:  # noqa: BLE001
        record.status, record.message = ERROR, f"verify's migrated runner failed: {exc!r}"
        record.traceback = traceback.format_exc()
    _finish(record, tf, devices, ns.out)


def _run_instrumented(
    tf: Any, ns: argparse.Namespace, script_args: list[str], devices: list[str],
    mapping: dict[str, str],
) -> tuple[as_written.AsWritten, BaseException | None]:
    """The program as written under the runner its mode needs: one worker of a cluster
    (--workers), one that also saves and continues for --roundtrip, or the plain one."""
    script = ns.script.resolve()
    args = (tf, devices, ns.out, ns.steps, ns.init, mapping, ns.wait, ns.replay_inputs)
    if ns.strategy != "multi-worker" and ns.roundtrip is None:
        return as_written.run(tf, script, script_args, *args[1:])
    runner: as_written.AsWritten
    if ns.strategy == "multi-worker":
        from tfmigrate.verify.multi_worker_runtime import WorkerAsWritten

        runner = WorkerAsWritten(*args)
    else:
        from tfmigrate.verify.roundtrip_boot import SavingRun

        runner = SavingRun(*args, roundtrip=ns.roundtrip, replicas=ns.replicas, device=ns.device,
                           seed=ns.seed, script_args=script_args)
    if ns.replay_inputs is not None:
        runner.record.notes.append(
            "--replay-inputs: the migrated replicas trained on the legacy towers' batches; the "
            "input pipeline itself was not compared")
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
    parser.add_argument("--wait", type=float, default=600.0)
    parser.add_argument(
        "--roundtrip", type=Path, help="save here and record in-strategy predictions"
    )
    parser.add_argument(
        "--restore", type=Path, help="start from this converted checkpoint folder instead"
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
    record = RunRecord(side="migrated")
    os.environ.pop("TF_USE_LEGACY_KERAS", None)  # the migrated side is Keras 3
    random.seed(ns.seed)
    np.random.seed(ns.seed)
    runner: MigratedRunner | None = None
    import tensorflow as tf

    devices: list[str] = []
    stage = "setup"
    if not as_written.defines_protocol(ns.script, protocol.ENTRY_POINT):
        return run_as_written(tf, ns, script_args)
    try:
        if ns.replay_inputs is not None:
            raise SetupProblem(
                f"--replay-inputs needs a program run as written; {ns.script.name} defines "
                f"{protocol.ENTRY_POINT}(), whose batches verify takes as they are"
            )
        runner_class = MigratedRunner
        if ns.strategy == "multi-worker":
            from tfmigrate.verify import multi_worker_runtime

            strategy, devices = multi_worker_runtime.make_strategy(tf, ns.device)
            runner_class = multi_worker_runtime.WorkerRunner
        else:
            devices = configure_devices(tf, ns.replicas, ns.device)
            strategy = tf.distribute.MirroredStrategy(devices=devices)
        tf.random.set_seed(ns.seed)
        tf.config.experimental.enable_op_determinism()
        script = ns.script.resolve()
        sys.argv = [str(script), *script_args]
        sys.path.insert(0, str(script.parent))
        stage = "user"
        module = load_program_module(script)
        entry = getattr(module, protocol.ENTRY_POINT, None)
        if entry is None:
            raise SetupProblem(
                f"{script.name} defines no {protocol.ENTRY_POINT}(strategy, argv); see docs/verify.md"
            )
        program = entry(strategy, list(script_args))
        stage = "setup"
        runner = runner_class(tf, strategy, program, ns.out)
        if program.get(protocol.KEY_JIT_COMPILE):
            allow_xla(runner.record)
        if ns.strategy == "multi-worker":
            runner.one_step = None  # a worker gathers every step's replica values (collectives)
        record = runner.record
        mapping: dict[str, str] = json.loads(ns.mapping.read_text())
        wait_for(ns.init, ns.wait)
        init = load_arrays(ns.init)
        if mapping == SAME_NAMES:
            mapping = resolve_by_name(init, runner.variables)
            (ns.out / RESOLVED_MAPPING).write_text(json.dumps(mapping, indent=2))
        runner.describe_variables(set(mapping.values()))
        if (
            ns.restore is not None
        ):  # convert-checkpoint's check: the converted folder, as users restore it
            from tfmigrate.checkpoint.layout import restore_program

            restore_program(tf, strategy, program, ns.restore)
        else:
            runner.load_initial(init, mapping)
        save_arrays(ns.out / INIT_NPZ, runner.read(list(runner.variables)))
        stage = "user"
        traced_file = ns.init.parent / TRACED_JSON
        traced = json.loads(traced_file.read_text()) if traced_file.exists() else list(mapping)
        runner.run(ns.steps, [mapping[n] for n in traced if mapping.get(n) in runner.variables])
        stage = "setup"
        runner.finish()
        if ns.roundtrip is not None:
            stage = "user"
            save_for_roundtrip(program, ns.roundtrip)
    except SetupProblem as exc:
        record.status, record.message = ERROR, str(exc)
    except Exception as exc:  # noqa: BLE001
        if stage == "user":
            record.status = CRASHED
            record.message = f"{type(exc).__name__}: {exc}".strip()
            record.traceback = user_traceback(exc)
        else:
            record.status, record.message = ERROR, f"verify's migrated runner failed: {exc!r}"
            record.traceback = traceback.format_exc()
    _finish(record, tf, devices, ns.out)


def _finish(record: RunRecord, tf: Any, devices: list[str], out: Path) -> NoReturn:
    """Write the record and leave at once: TF's threads and the program's own need no shutdown."""
    record.peak_memory_bytes, record.memory_source = _peak_memory(tf, devices)
    record.save(out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
