"""Second half of ``--roundtrip``: ``python -m tfmigrate.verify.roundtrip_boot --script S --dir D``.

The program runs as written (as_written.py) and is checked on what resuming its training needs.
The trained run (``SavingRun``, in the migrated side) saves the training state after step K —
through every ``tf.train.Checkpoint`` the program built, else every variable verify found and
the optimizers' variables — then trains ``CONTINUE_STEPS`` more steps on the batches of its steps
1, 2, ... again and records each step's fetches and variables. This process (``ResumedRun``) runs
the program as written once more, on the same devices, restores the saved state before its first
step executes (its variables as the program created them otherwise) and trains as many steps on
its own first batches: the restored variables and both runs' steps must agree. A checkpoint that
reaches no optimizer is one for inference: only the restored model variables are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from tfmigrate.verify import as_written
from tfmigrate.verify.migrated_boot import (
    SetupProblem,
    configure_devices,
    user_traceback,
)
from tfmigrate.verify.record import (
    CRASHED,
    ERROR,
    ROUNDTRIP_AFTER,
    ROUNDTRIP_BEFORE,
    Fetch,
    RunRecord,
    load_arrays,
    save_arrays,
)

CONTINUE_STEPS = 3  # steps trained after the saved state, on both sides of the round trip
PLAN_JSON = "roundtrip.json"  # what the trained run saved and how it ran, for the resumed run
STATE = "state"  # folder of the saved training state
VARIABLES_NPZ = "variables.npz"  # the state when the program builds no tf.train.Checkpoint
MODE_CHECKPOINT, MODE_VARIABLES = "checkpoint", "variables"
# what the round trip compares: the restored model, and the steps after it when the state saved
# holds the optimizers too (else only the restored model: a checkpoint for inference)
COMPARE_CONTINUED, COMPARE_MODEL = "continued", "model"


def _checkpoint_class() -> Any:
    from tensorflow.python.checkpoint import checkpoint

    return checkpoint.Checkpoint


class _Resuming(as_written.AsWritten):
    """What both halves of the round trip share: the program's checkpoints, its training state,
    and each continued step's values as one flat vector."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.checkpoints: list[Any] = []
        self.early_checkpoints = 0  # those built before the first step: the ones both runs have
        self.continued: list[np.ndarray] = []
        self.function_step = False  # the step being ended is a tf.function call's

    def install(self) -> None:
        super().install()
        cls = _checkpoint_class()
        orig = cls.__init__
        me = self

        def checkpoint_init(ckpt: Any, *args: Any, **kwargs: Any) -> None:
            orig(ckpt, *args, **kwargs)
            me.checkpoints.append(ckpt)

        cls.__init__ = checkpoint_init

    def start(self) -> None:
        super().start()
        self.early_checkpoints = len(self.checkpoints)

    def call_function(self, orig_call: Any, fn: Any, args: tuple, kwargs: dict) -> Any:
        self.function_step = True
        try:
            return super().call_function(orig_call, fn, args, kwargs)
        finally:
            self.function_step = False

    def optimizer_variables(self) -> list[Any]:
        found = []
        for opt in self.optimizers:
            found += list(opt.variables() if callable(opt.variables) else opt.variables)
        return found

    def state(self) -> dict[str, Any]:
        """The training state by name: the compared variables, then the optimizers' in order."""
        named = dict(self.variables)
        named.update(
            {f"optimizer variable {i}": v for i, v in enumerate(self.optimizer_variables())}
        )
        return named

    def model_vector(self) -> np.ndarray:
        """Every compared variable's value (the model's state, no optimizer's), in name order."""
        return np.concatenate(
            [np.zeros(0)]
            + [
                self._parts(self.variables[n])[0].astype(np.float64).ravel()
                for n in sorted(self.variables)
            ]
        )

    def step_vector(self, returned: list[Fetch] | None) -> np.ndarray:
        """This step's fetches (differentiated, returned, summaries) and every state value."""
        values = [v for _, v in sorted(self.targets.items())]
        values += [f.value for f in returned or []]
        values += [v for _, v in sorted(self.summaries.items(), key=repr)]
        self.targets.clear()
        self.summaries.clear()
        self.eager_counts.clear()
        state = self.state()
        parts = [np.asarray(values, np.float64)]
        parts += [self._parts(state[n])[0].astype(np.float64).ravel() for n in sorted(state)]
        return np.concatenate(parts)


class SavingRun(_Resuming):
    """The trained run: after step K, save the state and train on the first steps' batches again."""

    def __init__(
        self,
        *args: Any,
        roundtrip: Path,
        replicas: int,
        device: str,
        seed: int,
        script_args: list[str],
    ) -> None:
        super().__init__(*args)
        self.folder = roundtrip
        self.plan: dict[str, Any] = {
            "replicas": replicas,
            "device": device,
            "seed": seed,
            "steps": self.max_steps,
            "continue": min(CONTINUE_STEPS, self.max_steps),
            "script_args": script_args,
        }
        self.batches: list[tuple[Any, dict]] = []  # the arguments of steps 1..continue
        self.fingerprints: list[list[str] | None] = []
        self.saved = False
        self.model_at_save = np.zeros(0)
        self.unreplayable: str | None = None  # why the first steps' batches cannot be fed again

    def call_function(self, orig_call: Any, fn: Any, args: tuple, kwargs: dict) -> Any:
        known = self.step_functions.get(id(fn))
        if (
            self.saved
            and known is not None
            and known[1]
            and len(self.continued) < len(self.batches)
        ):
            args, kwargs = self.batches[len(self.continued)]  # the batch of step 1, 2, ...
        return super().call_function(orig_call, fn, args, kwargs)

    def end_step(self, inputs: Any, returned: list[Fetch] | None, seconds: float) -> None:
        if self.saved:
            self.continued.append(self.step_vector(returned))
            if len(self.continued) >= self.plan["continue"]:
                raise as_written.StopProgram()
            return
        if len(self.record.steps) < self.plan["continue"]:
            self.keep_batch(inputs)
        try:
            super().end_step(inputs, returned, seconds)
        except as_written.StopProgram:
            # step K: what verify compares with the legacy run is final now; save and go on
            as_written.AsWritten.finish(self)
            self.save_state()
            if self.plan["compare"] == COMPARE_MODEL:
                raise

    def keep_batch(self, inputs: Any) -> None:
        tf = self.tf
        leaves = tf.nest.flatten(inputs) if inputs is not None else []
        odd = [
            type(leaf).__name__
            for leaf in leaves
            if not isinstance(
                leaf, (tf.Tensor, tf.distribute.DistributedValues, np.ndarray, int, float, bool)
            )
        ]
        if not self.function_step or odd or not self._data_leaves(inputs):
            what = f"takes {', '.join(sorted(set(odd)))}" if odd else "takes no batch as arguments"
            self.unreplayable = (
                "--roundtrip: verify trains the steps after the saved state on the batches of the "
                "first steps again, which needs a tf.function step that takes its batch as "
                f"arguments; this program's step {what if self.function_step else 'runs eagerly'}"
            )
            return
        self.batches.append(inputs)
        self.fingerprints.append(self._fingerprint(inputs)[0])

    def save_state(self) -> None:
        folder = self.folder / STATE
        folder.mkdir(parents=True, exist_ok=True)
        checkpoints = self.checkpoints[: self.early_checkpoints]
        if checkpoints:
            for i, ckpt in enumerate(checkpoints):
                ckpt.write(str(folder / f"checkpoint-{i}"))
            how = (
                "through the program's tf.train.Checkpoint"
                if len(checkpoints) == 1
                else f"through the program's {len(checkpoints)} tf.train.Checkpoint objects"
            )
        else:
            save_arrays(
                folder / VARIABLES_NPZ, {n: self._parts(v)[0] for n, v in self.state().items()}
            )
            how = (
                "as every variable verify found and the optimizers' variables (the program "
                "builds no tf.train.Checkpoint)"
            )
        resumable = not checkpoints or self.covers_optimizers(checkpoints)
        self.plan.update(
            mode=MODE_CHECKPOINT if checkpoints else MODE_VARIABLES,
            checkpoints=len(checkpoints),
            fingerprints=self.fingerprints,
            compare=COMPARE_CONTINUED if resumable else COMPARE_MODEL,
        )
        self.saved = True
        self.model_at_save = self.model_vector()
        if resumable and self.unreplayable:
            raise self.fail(self.unreplayable)
        if resumable:
            self.record.notes.append(
                f"--roundtrip: the training state after step {self.max_steps} was saved {how}; "
                f"the program then trained {self.plan['continue']} more steps on the batches of "
                f"steps 1-{self.plan['continue']}, and a fresh run of it, restored from that state "
                "before its first step, trained on its own first batches: the round trip row "
                "compares the restored variables and those steps' fetches and variables"
            )
        else:
            self.record.notes.append(
                f"--roundtrip: the state after step {self.max_steps} was saved {how}, which holds "
                "no optimizer: training resumed from it starts its optimizer over (slots, "
                "iteration counter). The round trip row compares the model variables a fresh run "
                "of the program restored from it with the trained ones"
            )

    def covers_optimizers(self, checkpoints: list[Any]) -> bool:
        """Whether the checkpoints reach an optimizer that trained (a model-only checkpoint,
        for inference, does not)."""
        tf = self.tf
        reached = {
            id(d) for ckpt in checkpoints for d in tf.train.TrackableView(ckpt).descendants()
        }
        return any(id(opt) in reached for opt in self.optimizers)

    def finish(self) -> None:
        """The compared values were written at step K; here the continued steps' values."""
        if not self.saved:
            super().finish()
            return
        self.plan["continue"] = len(self.continued)
        (self.folder / PLAN_JSON).write_text(json.dumps(self.plan, indent=1))
        compared = [self.model_at_save]
        if self.plan["compare"] == COMPARE_CONTINUED:
            compared += self.continued
        save_arrays(self.folder / ROUNDTRIP_BEFORE, {"predictions": np.concatenate(compared)})


class ResumedRun(_Resuming):
    """The fresh run: the saved state restored before its first step executes, then its steps."""

    def __init__(self, *args: Any, folder: Path, plan: dict[str, Any]) -> None:
        super().__init__(*args)
        self.folder, self.plan = folder, plan
        self.restored = False
        self.restore_lock = threading.Lock()
        self.restored_model = np.zeros(0)

    def start(self) -> None:
        """No legacy values: the program's own, then the saved state (see restore)."""
        self.started = True
        self.collect()
        self.early_checkpoints = len(self.checkpoints)

    def _update_hook(self, orig: Any) -> Any:
        update = super()._update_hook(orig)
        me, tf = self, self.tf

        def resumed(opt: Any, *args: Any, **kwargs: Any) -> Any:
            result = update(opt, *args, **kwargs)
            if not tf.executing_eagerly():  # traced: the optimizer's variables exist now
                with me.restore_lock:
                    if not me.restored:
                        me.restored = True
                        me.restore_eagerly()
            return result

        return resumed

    def restore_eagerly(self) -> None:
        """Restore in a thread of its own: eager and in no replica's context (an assignment in a
        replica's trace would wait for the other replicas, which wait for this one)."""
        failed: list[BaseException] = []

        def restore() -> None:
            try:
                self.restore()
            except BaseException as exc:  # noqa: BLE001  raised again in the program's thread
                failed.append(exc)

        worker = threading.Thread(target=restore, name="tfmigrate-roundtrip-restore")
        worker.start()
        worker.join()
        if failed:
            raise failed[0]

    def restore(self) -> None:
        folder = self.folder / STATE
        if self.plan["mode"] == MODE_CHECKPOINT:
            if self.early_checkpoints != self.plan["checkpoints"]:
                raise self.fail(
                    f"--roundtrip: the trained run built {self.plan['checkpoints']} "
                    f"tf.train.Checkpoint(s) before its first step, the fresh run "
                    f"{self.early_checkpoints}"
                )
            for i, ckpt in enumerate(self.checkpoints[: self.early_checkpoints]):
                ckpt.read(str(folder / f"checkpoint-{i}")).expect_partial()
            self.restored_model = self.model_vector()
            return
        if not (folder / VARIABLES_NPZ).exists():
            raise self.fail(f"--roundtrip: the trained run saved no state ({VARIABLES_NPZ})")
        saved = load_arrays(folder / VARIABLES_NPZ)
        state = self.state()
        if sorted(saved) != sorted(state):
            raise self.fail(
                "--roundtrip: the fresh run's variables are not the trained run's: "
                f"{sorted(set(saved) ^ set(state))[:5]}"
            )
        for name, var in state.items():
            self._assign(var, saved[name])
        self.restored_model = self.model_vector()

    def end_step(self, inputs: Any, returned: list[Fetch] | None, seconds: float) -> None:
        if self.plan["compare"] == COMPARE_MODEL:
            raise as_written.StopProgram()  # restored before this step: nothing more to see
        index = len(self.continued)
        expected = (
            self.plan["fingerprints"][index] if index < len(self.plan["fingerprints"]) else None
        )
        mine = self._fingerprint(inputs)[0] if inputs is not None else None
        if expected is not None and mine != expected:
            raise self.fail(
                f"--roundtrip: the fresh run's batch of step {index + 1} is not the "
                "trained run's (the input pipeline is not deterministic)"
            )
        self.continued.append(self.step_vector(returned))
        if len(self.continued) >= self.plan["continue"]:
            raise as_written.StopProgram()


def resume_as_written(tf: Any, script: Path, folder: Path, record: RunRecord) -> RunRecord:
    """The program as written, restored from the trained run's state; the continued steps' values
    go to ROUNDTRIP_AFTER."""
    plan_file = folder / PLAN_JSON
    if not plan_file.exists():
        raise SetupProblem(
            "--roundtrip: the trained run saved no training state (it ended before "
            "its last compared step)"
        )
    plan = json.loads(plan_file.read_text())
    if plan["compare"] == COMPARE_CONTINUED and not plan["continue"]:
        raise SetupProblem(
            f"--roundtrip: the program ended right after step {plan['steps']}: no step after the "
            "saved state to compare (let it run longer than --steps)"
        )
    devices = configure_devices(tf, plan["replicas"], plan["device"])
    tf.random.set_seed(plan["seed"])
    tf.config.experimental.enable_op_determinism()
    out = folder / "resumed"
    out.mkdir(parents=True, exist_ok=True)
    runner = ResumedRun(
        tf,
        devices,
        out,
        plan["continue"],
        out / "no-legacy-values",
        {},
        60.0,
        None,
        folder=folder,
        plan=plan,
    )
    ended = as_written.run_program(tf, runner, script, list(plan["script_args"]))
    record.notes += runner.record.notes
    if runner.problem is not None or isinstance(ended, as_written.Problem):
        record.status, record.message = ERROR, runner.problem or str(ended)
    elif ended is not None:
        record.status = CRASHED
        record.message = f"{type(ended).__name__}: {ended}".strip()
        record.traceback = user_traceback(ended)
    elif not runner.restored:
        record.status = ERROR
        record.message = (
            "--roundtrip: the fresh run reached no traced optimizer update to restore at"
        )
    elif plan["compare"] == COMPARE_CONTINUED and len(runner.continued) < plan["continue"]:
        record.status = ERROR
        record.message = (
            f"--roundtrip: the fresh run ended after {len(runner.continued)} of "
            f"{plan['continue']} steps"
        )
    else:
        compared = [runner.restored_model]
        if plan["compare"] == COMPARE_CONTINUED:
            compared += runner.continued
        save_arrays(folder / ROUNDTRIP_AFTER, {"predictions": np.concatenate(compared)})
    return record


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
        record = resume_as_written(tf, script, ns.dir, record)
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
