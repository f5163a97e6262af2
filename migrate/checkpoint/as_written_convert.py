"""convert-checkpoint: the migrated program run as written, up to its first step (imports TF).

The migrated script's main block runs unmodified (its own argv, a scratch working directory) under
verify's as-written instrumentation (tfmigrate.verify.as_written): every MirroredStrategy gets the
requested devices, the variables are found through creator scopes and the Keras constructors.
Captured besides, as they are constructed: the program's ``tf.train.Checkpoint`` and
``tf.train.CheckpointManager`` objects, and each Keras model whose ``fit`` runs. Where the first
training step is about to execute (as_written's start) the program is stopped (StopProgram)
before it trains. Then, the program's objects still alive, each variable gets its legacy value
(the manifest's or --mapping's pairs, the others by name and shape, as verify matches them), a kept
``tf.compat.v1.train`` optimizer its slots (slots.py), and the program's own checkpoint is written
into the output folder as its CheckpointManager names it, so that the program's own restore code
reads it; a ``fit`` program without a checkpoint gets its model's weights file instead.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from tfmigrate.checkpoint.convert_boot import (
    WEIGHTS_FILE,
    ConversionError,
    read_specs,
    read_values,
    report,
    resolve_prefix,
    step_number,
)
from tfmigrate.checkpoint.plan import (
    EMA_SUFFIX,
    Plan,
    Spec,
    is_optimizer_state,
    is_shadow,
    plan_conversion,
)
from tfmigrate.checkpoint.slots import is_v1_optimizer, spec_of, v1_optimizer_state
from tfmigrate.verify import as_written
from tfmigrate.verify.manifest import SAME_NAMES
from tfmigrate.verify.migrated_boot import configure_devices

PROGRAM_SOURCE = "the program creates before its first training step"
# the checkpoint name without a CheckpointManager of the program's: tf.train.latest_checkpoint finds it
CHECKPOINT_NAME = "ckpt"
Shapes = dict[str, tuple[tuple[int, ...], np.dtype]]


class CheckpointCapture(as_written.AsWritten):
    """as_written's instrumentation, plus the program's checkpoints and fitted Keras models; stops
    the program where its first training step is about to execute."""

    stop_before_training = True

    def __init__(self, tf: Any, devices: list[str], scratch: Path) -> None:
        super().__init__(
            tf,
            devices,
            scratch,
            steps=1,
            init=scratch / "unused.npz",
            mapping={},
            wait=0.0,
            replay=None,
        )
        self.checkpoints: list[Any] = []
        self.managers: list[Any] = []
        self.fitted: list[Any] = []

    def install(self) -> None:
        super().install()
        from tensorflow.python.checkpoint import checkpoint, checkpoint_management

        _record_instances(checkpoint.Checkpoint, self.checkpoints)
        _record_instances(checkpoint_management.CheckpointManager, self.managers)
        try:
            import keras
        except ImportError:
            return
        orig_fit, fitted = keras.Model.fit, self.fitted

        @functools.wraps(orig_fit)
        def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
            fitted.append(model)
            return orig_fit(model, *args, **kwargs)

        keras.Model.fit = fit

    def start(self) -> None:
        """The variables exist and the first step is about to execute: only name them here (maybe
        in a replica's thread, inside a trace); the values go in once the program has stopped."""
        self.started = True
        self.collect()


def tf_variable(var: Any) -> Any:
    """Keras 3 variables wrap the tf.Variable (a MirroredVariable under a strategy) in ``.value``."""
    return var.value if type(var).__module__.startswith("keras") else var


def _record_instances(cls: Any, seen: list[Any]) -> None:
    """Every instance of ``cls`` the program constructs, appended to ``seen``."""
    orig = cls.__init__

    @functools.wraps(orig)
    def init(obj: Any, *args: Any, **kwargs: Any) -> None:
        orig(obj, *args, **kwargs)
        seen.append(obj)

    cls.__init__ = init


def convert(tf: Any, ns: argparse.Namespace, script_args: list[str]) -> dict[str, Any]:
    prefix = resolve_prefix(tf, ns.checkpoint)
    reader, specs = read_specs(tf, prefix)
    request: dict[str, str] = json.loads(ns.mapping.read_text())
    explicit = {} if request == SAME_NAMES else dict(request)

    devices = configure_devices(tf, ns.replicas, ns.device)
    scratch = ns.result.parent / "as-written"
    scratch.mkdir(exist_ok=True)
    runner = CheckpointCapture(tf, devices, scratch)
    _check_run(runner, as_written.run_program(tf, runner, ns.script.resolve(), script_args))
    variables = _program_variables(runner)
    mapping, notes = _match(tf, runner, specs, explicit, variables, ns.ema_name)
    strategy = runner.strategies[-1] if runner.strategies else tf.distribute.get_strategy()
    state, optimizer, optimizer_notes = _optimizer_state(tf, strategy, runner, mapping, variables)
    plan = plan_conversion(
        specs,
        # the mapped variables and every weight: an unmapped weight is a problem of the plan
        {
            name: spec_of(tf, var)
            for name, var in variables.items()
            if name in mapping.values() or runner.kinds.get(name) == "weight"
        },
        mapping,
        slots={legacy: (label, spec_of(tf, var)) for legacy, (label, var) in state.items()},
        use_ema=ns.use_ema,
        ema_suffix=ns.ema_name,
        program_source=PROGRAM_SOURCE,
    )
    plan.notes[:0] = runner.record.notes + notes + optimizer_notes
    if not plan.ok:
        raise ConversionError("the checkpoint does not fit the program", plan.problems)
    checkpoint, name, model, layout, manager_dir = _destination(
        tf, runner, plan, variables, optimizer
    )

    values = read_values(reader, plan, prefix)
    slots = {label: var for label, var in state.values()}
    for a in plan.assignments:
        if a.target in slots:
            with strategy.scope():
                slots[a.target].assign(values[a.source])  # cross-replica: every replica gets it
        else:
            runner._assign(variables[a.target], values[a.source])

    saved = WEIGHTS_FILE
    if checkpoint is not None:
        manager = tf.train.CheckpointManager(
            checkpoint, str(ns.out), max_to_keep=1, checkpoint_name=name
        )
        saved = Path(manager.save(checkpoint_number=step_number(prefix))).name
    files = sorted(p.name for p in ns.out.iterdir())
    if model is not None:
        model.save_weights(str(ns.out / WEIGHTS_FILE))
        files.append(WEIGHTS_FILE)
    result = report(prefix, ns, plan, layout, saved, files)
    result["mapping"] = mapping
    # where the program's own restore reads from (--check puts the converted files there)
    result["restore_folder"] = _relative_to_cwd(manager_dir) if manager_dir is not None else None
    return result


def _relative_to_cwd(folder: str) -> str:
    """The folder relative to the working directory the program ran in, else absolute."""
    path = Path(os.path.abspath(folder))
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _check_run(runner: CheckpointCapture, ended: BaseException | None) -> None:
    """The program stopped where its first step was about to run, or the reason it did not."""
    if runner.problem is not None or isinstance(ended, as_written.Problem):
        raise ConversionError(runner.problem or str(ended))
    if isinstance(ended, SystemExit):
        raise ConversionError(
            f"the program exited with status {ended.code} before its first training step"
        )
    if ended is not None:
        raise ended  # the user's own crash: shown with its traceback
    if not runner.started:
        raise ConversionError(
            "the program ended without a training step tfmigrate can see (Keras "
            "Optimizer.apply_gradients/apply, tf.compat.v1.train.Optimizer, in a tf.function or "
            "eagerly): its variables were never all created, nothing was converted"
        )
    if runner.trained_before_stop:
        raise ConversionError(
            "the program's first training step ran before it could be stopped "
            "(its step function did not trace on its own): nothing was converted"
        )


def _program_variables(runner: CheckpointCapture) -> dict[str, Any]:
    """The program's variables as verify names them, without its checkpoints' save counters."""
    counters = {
        id(c._save_counter)
        for c in runner.checkpoints
        if getattr(c, "_save_counter", None) is not None
    }
    return {name: var for name, var in runner.variables.items() if id(var) not in counters}


def _bookkeeping(name: str, ema_suffix: str) -> bool:
    """Legacy entries a program need not have (the plan notes them when nothing takes them)."""
    return is_shadow(name, ema_suffix) or name.rsplit("/", 1)[-1] == "global_step"


def _np_dtype(tf: Any, name: str) -> np.dtype:
    return np.dtype(tf.as_dtype(name).as_numpy_dtype)


def _match(
    tf: Any,
    runner: CheckpointCapture,
    specs: dict[str, Spec],
    explicit: dict[str, str],
    variables: dict[str, Any],
    ema_suffix: str = EMA_SUFFIX,
) -> tuple[dict[str, str], list[str]]:
    """legacy -> migrated names: the explicit pairs, then every other checkpoint entry but the
    optimizer's by name and shape (verify's match_by_name). Without explicit pairs, a legacy entry
    or a trainable program variable left without a counterpart is an error, listed by name and
    shape on both sides; with them, the plan names each (an unknown checkpoint entry, a weight
    missing in the mapping)."""
    legacy: Shapes = {
        name: (spec.shape, _np_dtype(tf, spec.dtype))
        for name, spec in specs.items()
        if name not in explicit and not is_optimizer_state(name)
    }
    rest: Shapes = {
        name: (spec_of(tf, var).shape, _np_dtype(tf, spec_of(tf, var).dtype))
        for name, var in variables.items()
        if name not in explicit.values()
    }
    by_name, ambiguous = as_written.match_by_name(legacy, rest)
    lines, legacy_left, migrated_left = as_written.unmatched(by_name, ambiguous, legacy, rest)
    needed = [n for n in [*legacy_left, *ambiguous] if not _bookkeeping(n, ema_suffix)]
    needed += [n for n in migrated_left if runner.kinds.get(n) == "weight"]
    if needed and not explicit:
        raise ConversionError(
            "variables could not be matched by name and shape (give --mapping): " + "; ".join(lines)
        )
    notes = []
    migrated_left = [n for n in migrated_left if runner.kinds.get(n) != "weight"]
    if migrated_left:
        notes.append(
            "the program's variables without a legacy counterpart keep their initial "
            "values (not trainable): " + ", ".join(migrated_left)
        )
    if by_name:
        notes.append(f"{len(by_name)} variables matched by name and shape")
    return dict(sorted({**explicit, **by_name}.items())), notes


def _optimizer_state(
    tf: Any,
    strategy: Any,
    runner: CheckpointCapture,
    mapping: dict[str, str],
    variables: dict[str, Any],
) -> tuple[dict[str, tuple[str, Any]], Any, list[str]]:
    """A kept tf.compat.v1.train optimizer's slots (slots.py); a note for any other optimizer."""
    notes = [
        f"the program's optimizer ({type(o).__name__}) is not a tf.compat.v1.train "
        "optimizer: its state is not converted"
        for o in runner.optimizers
        if not is_v1_optimizer(tf, o)
    ]
    kept = [o for o in runner.optimizers if is_v1_optimizer(tf, o)]
    if len(kept) != 1:
        if kept:
            notes.append(
                f"{len(kept)} tf.compat.v1.train optimizers: which variables each trains is "
                "not known before the first step, their state is not converted"
            )
        return {}, None, notes
    # a tf.compat.v1.train optimizer trains the tf.Variable inside a Keras 3 variable
    trained = {
        legacy: (new, tf_variable(variables[new]))
        for legacy, new in mapping.items()
        if new in variables and getattr(variables[new], "trainable", False)
    }
    return v1_optimizer_state(tf, strategy, kept[0], trained), kept[0], notes


def _reachable(tf: Any, root: Any) -> set[int]:
    return {id(obj) for obj in tf.train.TrackableView(root).descendants()}


def _held(var: Any, ids: set[int]) -> bool:
    inner = var.value if type(var).__module__.startswith("keras") else var
    return id(var) in ids or id(inner) in ids


def _destination(
    tf: Any, runner: CheckpointCapture, plan: Plan, variables: dict[str, Any], optimizer: Any
) -> tuple[Any, str, Any, str, str | None]:
    """(checkpoint, its checkpoint name, Keras model, layout text, its CheckpointManager's folder):
    the program's own Checkpoint that holds the converted variables (one its CheckpointManager
    saves first), and the Keras model a fit trained or that checkpoint holds (its weights file),
    either of them maybe None but not both; the folder None without a CheckpointManager."""
    targets = sorted({a.target for a in plan.assignments if a.target in variables})
    model = runner.fitted[-1] if runner.fitted else None
    managed = {id(m._checkpoint): m for m in runner.managers}
    candidates = list(
        {
            id(c): c for c in [*(m._checkpoint for m in runner.managers), *runner.checkpoints]
        }.values()
    )
    if not candidates:
        if model is None:
            raise ConversionError(
                "the program makes no tf.train.Checkpoint (and trains no Keras model with fit): "
                "there is no object of its own to write the converted values through, that its "
                "restore code would read. Nothing was written"
            )
        missing = [t for t in targets if not _held(variables[t], {id(w) for w in model.weights})]
        if missing:
            raise ConversionError(
                "the fitted Keras model does not hold these converted variables, "
                "its weights file would lose them: " + ", ".join(missing)
            )
        return (
            None,
            CHECKPOINT_NAME,
            model,
            (
                "the Keras model's weights (model.save_weights; the program makes no tf.train.Checkpoint)"
            ),
            None,
        )
    reach = [_reachable(tf, c) for c in candidates]
    held = [sum(_held(variables[t], ids) for t in targets) for ids in reach]
    best = held.index(max(held))  # the first of the best: a managed one
    checkpoint = candidates[best]
    missing = [t for t in targets if not _held(variables[t], reach[best])]
    if missing:
        raise ConversionError(
            "the program's tf.train.Checkpoint does not hold these converted variables, its restore "
            "would leave them at their initial values: " + ", ".join(missing)
        )
    if optimizer is not None and id(optimizer) not in reach[best]:
        plan.notes.append(
            "the program's checkpoint does not hold its optimizer: the converted "
            "optimizer state is not written"
        )
    if model is None:
        model = _held_model(tf, checkpoint, [variables[t] for t in targets])
    manager = managed.get(id(checkpoint))
    if manager is None:
        return (
            checkpoint,
            CHECKPOINT_NAME,
            model,
            (
                "the program's own tf.train.Checkpoint (it makes no CheckpointManager), saved as "
                f"'{CHECKPOINT_NAME}-N' with a 'checkpoint' file"
            ),
            None,
        )
    name = os.path.basename(manager._checkpoint_prefix)
    return (
        checkpoint,
        name,
        model,
        (f"the program's own tf.train.Checkpoint, as its CheckpointManager saves it ('{name}-N')"),
        manager.directory,
    )


def _held_model(tf: Any, checkpoint: Any, targets: list[Any]) -> Any:
    """The first Keras model the checkpoint reaches that holds every converted variable, else
    None: its weights file is written too."""
    try:
        import keras
    except ImportError:
        return None
    models = [
        obj
        for obj in tf.train.TrackableView(checkpoint).descendants()
        if isinstance(obj, keras.Model)
    ]
    holding = [
        m
        for m in models
        if all(
            _held(t, {id(w) for w in m.weights} | {id(w.value) for w in m.weights}) for t in targets
        )
    ]
    return holding[0] if holding else None  # the outermost (a Sequential wraps a Functional)
