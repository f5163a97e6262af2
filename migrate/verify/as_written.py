"""The migrated side of verify for a program run as its user runs it (imports TensorFlow).

The script's main block runs unmodified (``runpy``, its own argv, verify's scratch folder as
working directory). verify instruments TensorFlow from outside:

- devices: the logical devices are configured before the program starts; every
  ``tf.distribute.MirroredStrategy`` the program creates gets verify's N devices;
- steps: an optimizer update (Keras 3 ``Optimizer.apply_gradients``/``apply``,
  ``tf.compat.v1.train.Optimizer.apply_gradients`` and so ``minimize``), or a hand-written one
  (an assignment to a trainable distributed variable), seen while a ``tf.function`` traces makes that function the program's step function: each top-level call of
  it is one training step. An update run eagerly (no ``tf.function``) is a step by itself;
- losses: every ``tf.GradientTape.gradient`` target is recorded per replica (a
  ``numpy_function`` in the traced step, the replica from the replica context) as the fetch
  ``loss`` (``loss_1``, ... for a step's later gradients); what the step function returns is
  recorded too (a dict by its keys, a tuple as ``output_0``..., one value as ``output``), and
  every scalar the step writes with ``tf.summary`` (``scalar``, ``write``: by its tag);
- variables: found through a variable creator scope and the Keras / distributed variable
  constructors; named by Keras path, else by tf.Variable name without ``:0``; optimizer slots and
  iteration counters are found through the optimizers, Keras metrics' totals through the
  metrics, and neither is compared;
- start: the legacy initial values are assigned when the first step is traced (under
  ``init_scope``, so the assignment runs eagerly before the traced step ever executes) or, for an
  eager program, when its first GradientTape opens (with ``keep_values``, convert-checkpoint
  --check's, none: the values are what the program's own restore loaded);
- stop: after K steps a private BaseException unwinds the program's loop (with
  ``stop_before_training``, convert-checkpoint's, where the first step is about to execute).
"""

from __future__ import annotations

import json
import re
import runpy
import sys
import threading
import time
from difflib import SequenceMatcher
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from tfmigrate.verify import fingerprint
from tfmigrate.verify.manifest import SAME_NAMES
from tfmigrate.verify.record import (
    FINAL_NPZ,
    INIT_NPZ,
    LEGACY_VARIABLES_JSON,
    RECORD_JSON,
    TRACE_NPZ,
    TRACED_JSON,
    Fetch,
    RunRecord,
    Step,
    load_arrays,
    load_step_inputs,
    save_arrays,
    write_json_atomic,
)

_REPLICA_SCOPE = re.compile(r"^replica_\d+/")
PROGRESS_JSON = "progress.json"  # steps done so far: a timed-out run still tells how far it got
TARGET = "loss"  # the fetch name of what a step differentiates (see docs/verify.md)
SOURCE_TARGET, SOURCE_RETURNED, SOURCE_SUMMARY = "differentiated", "returned", "summary"


class StopProgram(BaseException):
    """Raised out of the step after step K: a BaseException, so ``except Exception`` in the
    program's loop does not swallow it."""


class Problem(Exception):
    """verify cannot run or match this program (a one-line reason for the report)."""


OLD_ENTRY_POINT = "tfmigrate_program"  # older tfmigrate versions drove programs through it


def defines_function(script: Path, entry: str) -> bool:
    """Whether the script defines a function of that name at module level (no import)."""
    import ast

    try:
        tree = ast.parse(script.read_text(encoding="utf-8", errors="replace"))
    except SyntaxError:
        return False
    return any(isinstance(n, ast.FunctionDef) and n.name == entry for n in tree.body)


# -- matching variables by name ------------------------------------------------------------------


def _norm(name: str) -> str:
    return name.replace("/", "_").lower()


def _tails(name: str) -> list[str]:
    parts = name.split("/")
    return ["/".join(parts[i:]) for i in range(len(parts))]


def _convertible(value: np.ndarray, dtype: np.dtype) -> bool:
    """A value whose dtype differs converts when it survives the round trip exactly (a float32
    global step of whole numbers into an int64 one)."""
    if value.dtype == dtype:
        return True
    try:
        with np.errstate(all="ignore"):
            back = value.astype(dtype).astype(value.dtype)
    except (TypeError, ValueError):
        return False
    return bool(np.array_equal(back, value))


def match_by_name(
    legacy: dict[str, tuple[tuple[int, ...], np.dtype]],
    migrated: dict[str, tuple[tuple[int, ...], np.dtype]],
) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Legacy→migrated names by name and shape, strongest evidence first: the same name; the same
    name with "/" and "_" (and case) alike; the same after leading scopes are dropped on one side
    (a Keras model's name in front of its weights' paths). At each level a legacy variable takes
    its one candidate of equal shape, unless another legacy variable claims it at that level too.
    Returns the mapping and the ambiguous legacy names with their candidates."""
    levels = [
        lambda n: [n],
        lambda n: [_norm(n)],
        lambda n: [_norm(t) for t in _tails(n)],
    ]
    mapping: dict[str, str] = {}
    ambiguous: dict[str, list[str]] = {}
    for keys in levels:
        left = [n for n in legacy if n not in mapping]
        free = [m for m in migrated if m not in mapping.values()]
        index: dict[str, set[str]] = {}
        for m in free:
            for k in keys(m):
                index.setdefault(k, set()).add(m)
        claims: dict[str, list[str]] = {}
        for n in left:
            lshape = legacy[n][0]
            found = {m for k in keys(n) for m in index.get(k, ()) if migrated[m][0] == lshape}
            if len(found) > 1:
                # prefer the candidates that share the longest tail with the legacy name
                best = max(_shared_tail(n, m) for m in found)
                found = {m for m in found if _shared_tail(n, m) == best}
            if len(found) == 1:
                claims.setdefault(next(iter(found)), []).append(n)
            elif found:
                ambiguous[n] = sorted(found)
        for m, names in claims.items():
            if len(names) == 1:
                mapping[names[0]] = m
                ambiguous.pop(names[0], None)
            else:
                for n in names:
                    ambiguous[n] = [m]
    for n in mapping:
        ambiguous.pop(n, None)
    return mapping, ambiguous


def unmatched(
    mapping: dict[str, str],
    ambiguous: dict[str, list[str]],
    legacy: dict[str, tuple[tuple[int, ...], np.dtype]],
    migrated: dict[str, tuple[tuple[int, ...], np.dtype]],
) -> tuple[list[str], list[str], list[str]]:
    """What match_by_name left: the lines that list it by name and shape on both sides ("legacy
    only: ...", "migrated only: ...", "ambiguous: ..."), the legacy names and the migrated names."""

    legacy_left = [n for n in legacy if n not in mapping and n not in ambiguous]
    used = set(mapping.values())
    migrated_left = [n for n in migrated if n not in used]
    lines = []
    if legacy_left:
        lines.append("legacy only: " + ", ".join(f"{n} {_shape(legacy[n][0])}" for n in legacy_left))
    if migrated_left:
        lines.append(
            "migrated only: " + ", ".join(f"{n} {_shape(migrated[n][0])}" for n in migrated_left)
        )
    for n, found in ambiguous.items():
        lines.append(
            f"ambiguous: legacy {n} {_shape(legacy[n][0])} could be migrated {', '.join(found)}"
        )
    return lines, legacy_left, migrated_left


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _alternatives(
    side: str, wrong: str, shape: tuple[int, ...] | None, free: dict[str, tuple[int, ...]]
) -> str:
    """What a wrong mapping entry could have meant: the side's unmapped variables of that shape,
    the names closest to the wrong one first."""
    if shape is None:
        return ""
    found = sorted(
        (n for n, s in free.items() if s == shape),
        key=lambda n: (-SequenceMatcher(None, wrong, n).ratio(), n),
    )
    if not found:
        return f" (no unmapped {side} variable has its shape {_shape(shape)})"
    return f" (unmapped {side} variables of shape {_shape(shape)}: {', '.join(found[:5])})"


def _shared_tail(a: str, b: str) -> int:
    pa, pb = _norm(a).split("_"), _norm(b).split("_")
    count = 0
    while count < min(len(pa), len(pb)) and pa[-1 - count] == pb[-1 - count]:
        count += 1
    return count


# -- the instrumented run ------------------------------------------------------------------------


def _flat_names(value: Any, tf: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(name, leaf) of what a step returned: dict keys joined by '/', sequence items as output_i."""
    if isinstance(value, dict) or hasattr(value, "items") and not hasattr(value, "shape"):
        out = []
        for key, item in value.items():
            out += _flat_names(item, tf, f"{prefix}{key}/")
        return out
    if isinstance(value, (list, tuple)) and not hasattr(value, "shape"):
        out = []
        for i, item in enumerate(value):
            out += _flat_names(item, tf, f"{prefix}output_{i}/" if not prefix else f"{prefix}{i}/")
        return out
    if value is None:
        return []
    return [(prefix.rstrip("/") or "output", value)]


class AsWritten:
    # convert-checkpoint: stop (StopProgram) where the first step is about to execute, once start()
    # has run; nothing trains
    stop_before_training = False
    # convert-checkpoint --check: the program's own restore loaded its values; start() assigns none
    keep_values = False
    # where the explicit mapping came from (--mapping, the manifest), for the messages about it
    mapping_source = "the variable mapping"

    def __init__(
        self,
        tf: Any,
        devices: list[str],
        out: Path,
        steps: int,
        init: Path,
        mapping: dict[str, str],
        wait: float,
        replay: Path | None,
    ) -> None:
        self.tf, self.devices, self.out, self.max_steps = tf, devices, out, steps
        self.init_path, self.mapping_request, self.wait = init, mapping, wait
        self.replay_path = replay
        self.record = RunRecord(side="migrated", devices=len(devices))
        self.strategies: list[Any] = []
        self.plain: list[Any] = []  # every tf.Variable the creator scope saw (components too)
        self.distributed: list[Any] = []
        self.keras: list[Any] = []
        self.optimizers: list[Any] = []
        self.metrics: list[Any] = []  # Keras metrics (fit's loss tracker): never compared
        self.emas: list[Any] = []  # ExponentialMovingAverage objects: their shadows' names
        self.step_functions: dict[int, tuple[Any, bool]] = {}  # id -> (Function, is a step)
        self.saw_update = False
        self.calling = 0  # depth of top-level tf.function calls (nested ones are not steps)
        self.updating = 0
        self.started = False  # legacy values assigned
        self.trace_counts: dict[tuple[int, int], int] = {}
        self.eager_counts: dict[int, int] = {}
        self.targets: dict[tuple[int, int], float] = {}
        self.summaries: dict[tuple[str, int | None], float] = {}
        self.lock = threading.Lock()
        self.variables: dict[str, Any] = {}  # migrated name -> variable (what is compared)
        self.kinds: dict[str, str] = {}
        self.mapping: dict[str, str] = {}
        self.trace_names: list[str] = []
        self.trace: dict[str, list[np.ndarray]] = {}
        self.replay_steps: list[list[tuple[str, list[np.ndarray]]]] | None = None
        self.eager_step_args: Any = None
        # a step function called without its batch (fit's train function takes an iterator): each
        # replica's inputs, captured where strategy.run hands them over inside the trace
        self.args_without_data = False
        self.replica_inputs: dict[tuple[int, int], np.ndarray] = {}
        self.problem: str | None = None  # the first Problem's own message
        self.xla = False  # a jit_compile function was seen (see allow_xla)
        self.compiling = threading.local()  # .depth: inside a jit_compile function's trace
        self.trained_before_stop = (
            False  # stop_before_training came one step late (see call_function)
        )
        self._write_progress()

    # -- patches -------------------------------------------------------------------------------
    def install(self) -> None:
        tf = self.tf
        from tensorflow.python.distribute import mirrored_strategy, values
        from tensorflow.python.eager import backprop
        from tensorflow.python.eager.polymorphic_function import polymorphic_function
        from tensorflow.python.training import moving_averages
        from tensorflow.python.training import optimizer as v1_optimizer

        me = self
        orig_ema = moving_averages.ExponentialMovingAverage.__init__

        def ema_init(ema: Any, *args: Any, **kwargs: Any) -> None:
            orig_ema(ema, *args, **kwargs)
            me.emas.append(ema)

        moving_averages.ExponentialMovingAverage.__init__ = ema_init
        orig_mirrored = mirrored_strategy.MirroredStrategy.__init__

        def mirrored_init(strategy: Any, devices: Any = None, cross_device_ops: Any = None) -> None:
            if devices is not None and list(devices) != me.devices:
                me.record.notes.append(
                    f"the program's MirroredStrategy asked for devices {list(devices)}; verify gave it "
                    f"{me.devices}"
                )
            orig_mirrored(strategy, devices=me.devices, cross_device_ops=cross_device_ops)
            me.strategies.append(strategy)

        mirrored_strategy.MirroredStrategy.__init__ = mirrored_init

        orig_dv = values.DistributedVariable.__init__

        def dv_init(var: Any, *args: Any, **kwargs: Any) -> None:
            orig_dv(var, *args, **kwargs)
            me.distributed.append(var)

        values.DistributedVariable.__init__ = dv_init

        try:
            from keras.src.backend.tensorflow import core as keras_core
            from keras.src.optimizers import base_optimizer
        except ImportError:
            keras_core = base_optimizer = None
        if keras_core is not None:
            orig_kv = keras_core.Variable.__init__

            def kv_init(var: Any, *args: Any, **kwargs: Any) -> None:
                orig_kv(var, *args, **kwargs)
                me.keras.append(var)

            keras_core.Variable.__init__ = kv_init
            orig_opt = base_optimizer.BaseOptimizer.__init__

            def opt_init(opt: Any, *args: Any, **kwargs: Any) -> None:
                orig_opt(opt, *args, **kwargs)
                me.optimizers.append(opt)  # its iteration counter exists before any update

            base_optimizer.BaseOptimizer.__init__ = opt_init
            from keras.src.metrics import metric as keras_metric

            orig_metric = keras_metric.Metric.__init__

            def metric_init(metric: Any, *args: Any, **kwargs: Any) -> None:
                orig_metric(metric, *args, **kwargs)
                me.metrics.append(metric)  # its running totals are the program's bookkeeping

            keras_metric.Metric.__init__ = metric_init
            for name in ("apply_gradients", "apply"):
                setattr(
                    base_optimizer.BaseOptimizer,
                    name,
                    self._update_hook(getattr(base_optimizer.BaseOptimizer, name)),
                )
        v1_optimizer.Optimizer.apply_gradients = self._update_hook(
            v1_optimizer.Optimizer.apply_gradients
        )

        from tensorflow.python.distribute import distribute_lib

        orig_run = distribute_lib.StrategyBase.run

        def strategy_run(
            strategy: Any, fn: Any, args: Any = (), kwargs: Any = None, options: Any = None
        ) -> Any:
            if tf.executing_eagerly() and not me.calling:  # an eager step's batch: its arguments
                if me.replay_path is not None:
                    args, kwargs, me.eager_step_args = me.replay(tuple(args), dict(kwargs or {}))
                else:
                    me.eager_step_args = (args, kwargs)
            elif me.calling and me.args_without_data and not getattr(me.compiling, "depth", 0):
                fn = me.watch_inputs(fn)
            return orig_run(strategy, fn, args=args, kwargs=kwargs, options=options)

        distribute_lib.StrategyBase.run = strategy_run

        # A hand-written update (no optimizer): a traced write to a trainable distributed
        # variable in cross-replica context, which reaches every copy through extended.update.
        orig_extended_update = distribute_lib.StrategyExtendedV2.update

        def extended_update(extended: Any, var: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
            if not tf.executing_eagerly() and getattr(var, "trainable", False) and not me.updating:
                me.saw_update = True
                if not me.started:
                    with tf.init_scope():  # eagerly, before the traced step first executes
                        me.start()
            return orig_extended_update(extended, var, fn, *args, **kwargs)

        distribute_lib.StrategyExtendedV2.update = extended_update

        # tf.summary.write is what tf.summary.scalar (TensorBoard's) writes through
        orig_write = tf.summary.write

        def write(tag: Any, tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if me.calling or not tf.executing_eagerly():
                me.capture_summary(str(tag), tensor)
            return orig_write(tag, tensor, *args, **kwargs)

        tf.summary.write = write

        orig_gradient = backprop.GradientTape.gradient

        def gradient(tape: Any, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
            me.capture_target(target)
            return orig_gradient(tape, target, sources, *args, **kwargs)

        backprop.GradientTape.gradient = gradient

        orig_enter = backprop.GradientTape.__enter__

        def enter(tape: Any) -> Any:
            if (
                tf.executing_eagerly()
                and not me.calling
                and not me.started
                and me.step_functions_none()
            ):
                me.start()  # an eager program: its first step begins with this tape
                if me.stop_before_training:
                    raise StopProgram()
            return orig_enter(tape)

        backprop.GradientTape.__enter__ = enter

        orig_call = polymorphic_function.Function.__call__

        def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
            if me.calling or not tf.executing_eagerly():
                if not getattr(fn, "_jit_compile", False):
                    return orig_call(fn, *args, **kwargs)
                # a jit_compile function called by the step (rewrite --jit's compiled_tower):
                # XLA compiles no numpy_function, so nothing is captured inside it
                if not me.xla:
                    me.allow_xla()
                me.compiling.depth = getattr(me.compiling, "depth", 0) + 1
                try:
                    return orig_call(fn, *args, **kwargs)
                finally:
                    me.compiling.depth -= 1
            return me.call_function(orig_call, fn, args, kwargs)

        polymorphic_function.Function.__call__ = call

    def fail(self, message: str) -> Problem:
        """The Problem to raise, its message kept: raised inside a traced step it reaches the
        program rewritten by AutoGraph ("in user code: ...")."""
        if self.problem is None:
            self.problem = message
        return Problem(message)

    def allow_xla(self) -> None:
        """A function compiled with XLA: XLA has no deterministic kernel for some gradients and
        cannot run a numpy_function, so determinism goes off and its losses are not captured."""
        from tensorflow.python.framework import config  # no public way back exists

        self.xla = True
        config.disable_op_determinism()
        self.record.notes.append(
            "the program compiles a function with XLA (jit_compile): it ran without TensorFlow's op "
            "determinism, and the losses its steps differentiate are not recorded (only what they return)"
        )

    def step_functions_none(self) -> bool:
        return not any(flag for _, flag in self.step_functions.values())

    def _update_hook(self, orig: Any) -> Any:
        me, tf = self, self.tf

        def update(opt: Any, *args: Any, **kwargs: Any) -> Any:
            if opt not in me.optimizers:
                me.optimizers.append(opt)
            me.saw_update = True
            outer = not me.updating
            eager_step = outer and not me.calling and tf.executing_eagerly()
            if not tf.executing_eagerly() and not me.started:
                with tf.init_scope():  # eagerly, before the traced step first executes
                    me.start()
            if eager_step and me.stop_before_training:
                if not me.started:
                    me.start()
                raise StopProgram()  # before the eager update runs
            me.updating += 1
            try:
                result = orig(opt, *args, **kwargs)
            finally:
                me.updating -= 1
            if eager_step:
                inputs, me.eager_step_args = me.eager_step_args, None
                me.end_step(inputs, None, 0.0)
            return result

        return update

    # -- steps ---------------------------------------------------------------------------------
    def call_function(self, orig_call: Any, fn: Any, args: tuple, kwargs: dict) -> Any:
        known = self.step_functions.get(id(fn))
        self.saw_update = False
        if getattr(fn, "_jit_compile", False) and not self.xla:
            self.allow_xla()
        if known is None or not known[1]:
            self.args_without_data = not any(
                isinstance(leaf, (self.tf.Tensor, self.tf.distribute.DistributedValues, np.ndarray))
                for leaf in self.tf.nest.flatten((args, kwargs))
            )
            # trace now (cached for the call): an update seen while tracing makes it a step
            self.calling += 1
            try:
                fn.get_concrete_function(*args, **kwargs)
            except Exception as exc:
                if isinstance(_cause(exc), Problem):
                    raise _cause(exc) from None
                # the program's own call would trace and fail the same way; calling the
                # function after a failed trace that made variables returns None (TF)
                raise
            finally:
                self.calling -= 1
        is_step = self.saw_update or bool(known and known[1])
        self.step_functions[id(fn)] = (fn, is_step)
        if not is_step:
            self.calling += 1
            try:
                result = orig_call(fn, *args, **kwargs)
            finally:
                self.calling -= 1
                if self.saw_update:  # traced in the call itself
                    self.step_functions[id(fn)] = (fn, True)
            if self.saw_update and self.stop_before_training and self.started:
                self.trained_before_stop = True  # the step ran before it could be stopped
                raise StopProgram()
            return result
        if self.stop_before_training and self.started:
            raise StopProgram()  # traced, not yet executed
        replayed = None
        if self.replay_path is not None:
            args, kwargs, replayed = self.replay(args, kwargs)
        self.targets.clear()
        self.summaries.clear()
        self.eager_counts.clear()
        self.replica_inputs.clear()
        self.calling += 1
        start = time.perf_counter()
        try:
            result = orig_call(fn, *args, **kwargs)
            returned = self._returned(result)  # numpy: waits for the step to finish
        finally:
            self.calling -= 1
        self.end_step(
            (args, kwargs) if replayed is None else replayed, returned, time.perf_counter() - start
        )
        return result

    def watch_inputs(self, fn: Any) -> Any:
        """``fn`` recording, in each replica, every data tensor strategy.run hands it."""
        tf, me = self.tf, self

        def watched(*args: Any, **kwargs: Any) -> Any:
            ctx = tf.distribute.get_replica_context()
            replica = int(getattr(ctx, "_replica_id_in_sync_group", 0) or 0) if ctx else 0
            for i, leaf in enumerate(tf.nest.flatten((args, kwargs))):
                if isinstance(leaf, tf.Tensor) and leaf.shape.rank and leaf.dtype.is_numeric:
                    tf.numpy_function(
                        partial(me._got_input, i, replica), [leaf], tf.int64, stateful=True
                    )
            return fn(*args, **kwargs)

        return watched

    def _got_input(self, index: int, replica: int, value: Any) -> np.int64:
        with self.lock:
            self.replica_inputs[(index, replica)] = np.asarray(value)
        return np.int64(0)

    def _captured_streams(self) -> list[list[np.ndarray]]:
        """The replicas' captured inputs, one stream per argument leaf, in replica order."""
        with self.lock:
            captured, self.replica_inputs = dict(self.replica_inputs), {}
        streams = []
        for index in sorted({i for i, _ in captured}):
            parts = [captured[i, r] for i, r in sorted(captured) if i == index]
            if all(fingerprint.is_data(p) for p in parts):
                streams.append(parts)
        return streams

    def capture_target(self, target: Any) -> None:
        tf = self.tf
        if getattr(self.compiling, "depth", 0):
            return  # inside an XLA-compiled function (see install's call)
        leaves = [t for t in tf.nest.flatten(target) if t is not None]
        floats = [
            tf.cast(tf.reduce_sum(t), tf.float64)
            for t in leaves
            if getattr(t, "dtype", None) is not None and t.dtype.is_floating
        ]
        if not floats:
            return
        total = tf.add_n(floats) if len(floats) > 1 else floats[0]
        ctx = tf.distribute.get_replica_context()
        replica = int(getattr(ctx, "_replica_id_in_sync_group", 0) or 0) if ctx is not None else 0
        if tf.executing_eagerly():
            with self.lock:
                ordinal = self.eager_counts.get(replica, 0)
                self.eager_counts[replica] = ordinal + 1
            self._got(ordinal, replica, total.numpy())
            return
        if self.xla:
            return
        graph = tf.compat.v1.get_default_graph()
        with self.lock:
            key = (id(graph), replica)
            ordinal = self.trace_counts.get(key, 0)
            self.trace_counts[key] = ordinal + 1
        # stateful: a tf.function runs it in every call although nothing consumes its output
        tf.numpy_function(partial(self._got, ordinal, replica), [total], tf.int64, stateful=True)

    def capture_summary(self, name: str, data: Any) -> None:
        """A scalar the step writes with tf.summary: a fetch of that name, per replica when it is
        written in a replica's part of the step."""
        tf = self.tf
        try:
            value = tf.cast(tf.reshape(tf.convert_to_tensor(data), []), tf.float64)
        except (TypeError, ValueError, tf.errors.InvalidArgumentError):
            return  # not a scalar
        ctx = tf.distribute.get_replica_context()
        in_replica = tf.distribute.has_strategy() and ctx is not None
        replica = int(getattr(ctx, "_replica_id_in_sync_group", 0) or 0) if in_replica else None
        name = _REPLICA_SCOPE.sub("", name)  # the name scope a replica's part of the step opens
        if tf.executing_eagerly():
            self._got_summary(name, replica, value.numpy())
            return
        tf.numpy_function(
            partial(self._got_summary, name, replica), [value], tf.int64, stateful=True
        )

    def _got_summary(self, name: str, replica: int | None, value: Any) -> np.int64:
        with self.lock:
            self.summaries[(name, replica)] = float(np.asarray(value))
        return np.int64(0)

    def _got(self, ordinal: int, replica: int, value: Any) -> np.int64:
        with self.lock:
            self.targets[(ordinal, replica)] = float(np.asarray(value))
        return np.int64(0)

    def _returned(self, result: Any) -> list[Fetch]:
        tf = self.tf
        fetches = []
        for name, leaf in _flat_names(result, tf):
            if isinstance(leaf, tf.distribute.DistributedValues):
                parts = [np.asarray(p) for p in leaf.values]
                for i, p in enumerate(parts):
                    if p.size == 1:
                        fetches.append(
                            Fetch(
                                f"{name}[{i}]",
                                name,
                                i,
                                float(p.reshape(())),
                                source=SOURCE_RETURNED,
                            )
                        )
            else:
                try:
                    v = np.asarray(leaf)
                except Exception:  # noqa: BLE001  not a value (an op, a dataset)
                    continue
                if v.size == 1 and v.dtype.kind in "fiub":
                    fetches.append(
                        Fetch(name, name, None, float(v.reshape(())), source=SOURCE_RETURNED)
                    )
        return fetches

    def end_step(self, inputs: Any, returned: list[Fetch] | None, seconds: float) -> None:
        if not self.started:
            self.start()
        index = len(self.record.steps) + 1
        fetches = []
        for (ordinal, replica), value in sorted(self.targets.items()):
            name = TARGET if ordinal == 0 else f"{TARGET}_{ordinal}"
            fetches.append(Fetch(f"{name}[{replica}]", name, replica, value, source=SOURCE_TARGET))
        taken = {f.base for f in fetches}
        fetches += [f for f in returned or [] if f.base not in taken]
        taken = {f.base for f in fetches}
        for (name, at), value in sorted(
            self.summaries.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)
        ):
            if name not in taken:
                label = name if at is None else f"{name}[{at}]"
                fetches.append(Fetch(label, name, at, value, source=SOURCE_SUMMARY))
        self.summaries.clear()
        self.targets.clear()
        self.eager_counts.clear()
        step = Step(step=index, seconds=seconds, fetches=fetches)
        if inputs is not None:
            step.inputs, step.samples = self._fingerprint(inputs)
        self.record.steps.append(step)
        for name, array in self.read(self.trace_names).items():
            self.trace.setdefault(name, []).append(array)
        self._write_progress()
        if index >= self.max_steps:
            raise StopProgram()

    @property
    def replicas(self) -> int:
        return self.strategies[-1].num_replicas_in_sync if self.strategies else 1

    def _fingerprint(self, inputs: Any) -> tuple[list[str] | None, int | None]:
        if isinstance(inputs, list):  # replayed: the legacy streams as the replicas got them
            streams = [parts for _, parts in inputs]
        else:
            streams = [parts for _, parts in self._data_leaves(inputs)]
            if not streams and self.replica_inputs:
                streams = self._captured_streams()
        if not streams:
            return None, None
        return fingerprint.step_fingerprint(streams), fingerprint.step_samples(streams)

    def _data_leaves(self, inputs: Any) -> list[tuple[str, list[np.ndarray]]]:
        """(path, per-replica parts) of each data array among a step call's arguments."""
        tf = self.tf
        found = []
        for i, leaf in enumerate(tf.nest.flatten(inputs)):
            if isinstance(leaf, tf.distribute.DistributedValues):
                parts = [np.asarray(p) for p in leaf.values]
            elif isinstance(leaf, (tf.Tensor, np.ndarray)):
                parts = [np.asarray(leaf)]
            else:
                continue
            if parts and all(fingerprint.is_data(p) for p in parts):
                found.append((f"argument leaf {i}", parts))
        return found

    # -- replay --------------------------------------------------------------------------------
    def replay(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, list]:
        """The step's distributed arguments replaced by the legacy towers' batches of that step:
        matched by position, else by shape and dtype; a mismatch names both structures."""
        tf = self.tf
        if self.replay_steps is None:
            assert self.replay_path is not None
            # the legacy side writes the batches after its last step, its record just after
            deadline = time.monotonic() + self.wait
            while (
                not self.replay_path.exists()
                and not (self.replay_path.parent / RECORD_JSON).exists()
            ):
                if time.monotonic() > deadline:
                    raise self.fail("timed out waiting for the legacy run's input batches")
                time.sleep(0.05)
            if not self.replay_path.exists():
                raise self.fail(
                    "--replay-inputs: the legacy run recorded no input batches (its steps "
                    "fed nothing verify could read, or they were too large to keep)"
                )
            self.replay_steps = load_step_inputs(self.replay_path)
        index = len(self.record.steps)
        if index >= len(self.replay_steps):
            raise self.fail(
                f"--replay-inputs: the legacy run recorded the inputs of {len(self.replay_steps)} "
                f"steps, the migrated program reached step {index + 1}"
            )
        flat = tf.nest.flatten((args, kwargs))
        slots = [
            i
            for i, leaf in enumerate(flat)
            if isinstance(leaf, tf.distribute.DistributedValues)
            and all(fingerprint.is_data(np.asarray(p)) for p in leaf.values)
        ]
        legacy = [(name, self._as_replicas(parts)) for name, parts in self.replay_steps[index]]
        migrated = [[np.asarray(p) for p in flat[i].values] for i in slots]
        pairs = _pair(legacy, migrated)
        if pairs is None:
            raise self.fail(
                "--replay-inputs: the legacy batches do not fit the migrated step's inputs: legacy "
                f"step {index + 1} fed {_describe([p for _, p in legacy], [n for n, _ in legacy])}; "
                f"the migrated step takes {_describe(migrated)}"
            )
        strategy = self.strategies[-1]
        replayed = []
        for slot, (name, parts) in zip(slots, [legacy[j] for j in pairs], strict=True):
            dtype = flat[slot].values[0].dtype
            cast = [np.asarray(p).astype(dtype.as_numpy_dtype) for p in parts]
            flat[slot] = strategy.experimental_distribute_values_from_function(
                lambda ctx, cast=cast: tf.constant(cast[ctx.replica_id_in_sync_group])
            )
            replayed.append((name, cast))
        args, kwargs = tf.nest.pack_sequence_as((args, kwargs), flat)
        return args, kwargs, replayed

    def _as_replicas(self, parts: list[np.ndarray]) -> list[np.ndarray]:
        """A legacy stream as one part per replica: tower parts as they are, a global batch
        split along its rows as tf.split gave it to the towers."""
        n = self.replicas
        if len(parts) == n:
            return parts
        whole = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return list(np.array_split(whole, n))

    # -- variables -----------------------------------------------------------------------------
    def creator(self, next_creator: Any, **kwargs: Any) -> Any:
        var = next_creator(**kwargs)
        self.plain.append(var)
        return var

    def collect(self) -> None:
        """The program's variables by name (Keras path, else tf.Variable name), each with its kind."""
        hidden: set[int] = set()  # ids that are parts of another variable
        slots: set[int] = set()
        for opt in self.optimizers:
            opt_vars = (
                opt.variables if not callable(getattr(opt, "variables", None)) else opt.variables()
            )
            for v in opt_vars:
                slots.add(id(v))
                inner = (
                    getattr(v, "value", None) if type(v).__module__.startswith("keras") else None
                )
                if inner is not None:
                    slots.add(id(inner))
                    slots.update(id(c) for c in getattr(inner, "values", ()) or ())
        for metric in self.metrics:
            slots.update(id(v) for v in metric.variables)
        for kv in self.keras:
            inner = kv.value
            hidden.add(id(inner))
            hidden.update(id(c) for c in getattr(inner, "_values", ()) or ())
        for dv in self.distributed:
            hidden.update(id(c) for c in dv._values)
        named: dict[str, Any] = {}
        kinds: dict[str, str] = {}
        candidates = [(kv.path, kv) for kv in self.keras] + [
            (v.name.split(":")[0], v)
            for v in [*self.distributed, *self.plain]
            if id(v) not in hidden
        ]
        shadows = self._shadow_names(candidates)
        for name, var in candidates:
            name = shadows.get(id(var), name)
            if id(var) in slots or name.endswith("seed_generator_state"):
                continue
            base, n = name, 1
            while name in named and named[name] is not var:
                name = f"{base}_{n}"  # tf.Variable names are not unique in TF2
                n += 1
            named[name] = var
            kinds[name] = "weight" if bool(getattr(var, "trainable", False)) else "other"
        self.variables, self.kinds = named, kinds

    def _shadow_names(self, candidates: list[tuple[str, Any]]) -> dict[int, str]:
        """id -> name of each EMA shadow: ``<its variable's name>/<EMA name>``, as TF1 named it
        (TF2 names it after the variable's tf.Variable name, which for a Keras weight is not
        its path, and repeats across layers)."""
        names = {id(var): name for name, var in candidates}
        for kv in self.keras:  # an EMA of Keras weights averages their tf.Variables
            names.setdefault(id(kv.value), kv.path)
        shadows: dict[int, str] = {}
        for ema in self.emas:
            for key, average in getattr(ema, "_averages", {}).items():
                primary = key.deref() if hasattr(key, "deref") else key
                if id(primary) in names:
                    shadows[id(average)] = f"{names[id(primary)]}/{ema.name}"
        return shadows

    def read(self, names: list[str]) -> dict[str, np.ndarray]:
        return {n: self._parts(self.variables[n])[0] for n in names}

    def _assign(self, var: Any, value: np.ndarray) -> None:
        """Every replica's copy directly: an assignment through the mirrored variable from inside
        a replica's trace would reach one copy only."""
        inner = var.value if type(var).__module__.startswith("keras") else var
        for part in getattr(inner, "_values", None) or [inner]:
            part.assign(value)

    def _parts(self, var: Any) -> list[np.ndarray]:
        inner = var.value if type(var).__module__.startswith("keras") else var
        parts = getattr(inner, "_values", None) or [inner]
        return [np.asarray(p.numpy()) for p in parts]

    def start(self) -> None:
        """Assign the legacy initial values (before the first step executes)."""
        self.started = True
        self.collect()
        deadline = time.monotonic() + self.wait
        while not self.init_path.exists():
            if time.monotonic() > deadline:
                raise self.fail(
                    f"timed out waiting for the legacy initial variables ({self.init_path})"
                )
            time.sleep(0.05)
        init = load_arrays(self.init_path)
        legacy_dir = self.init_path.parent
        meta_file = legacy_dir / LEGACY_VARIABLES_JSON
        meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
        traced_file = legacy_dir / TRACED_JSON
        traced = json.loads(traced_file.read_text()) if traced_file.exists() else sorted(init)
        shapes = {
            n: (tuple(np.asarray(v).shape), np.asarray(v).dtype)
            for n, v in self.variables.items()
            for v in [self._parts(self.variables[n])[0]]
        }
        # the pairs a mapping (--mapping, the manifest) gives, then the others by name and shape
        explicit = {} if self.mapping_request == SAME_NAMES else dict(self.mapping_request)
        self._check_explicit(explicit, init, shapes)
        # every legacy variable but the optimizer's (a big model's legacy run traces fewer per step)
        names = [n for n in init if meta.get(n, {}).get("kind") != "optimizer"] if meta else traced
        comparable = {
            n: (tuple(init[n].shape), init[n].dtype)
            for n in names
            if n in init and n not in explicit
        }
        rest = {n: s for n, s in shapes.items() if n not in explicit.values()}
        by_name, ambiguous = match_by_name(comparable, rest)
        mapping = {**explicit, **by_name}
        self._check_matched(by_name, ambiguous, comparable, rest, meta)
        for legacy_name, name in mapping.items():
            var = self.variables[name]
            target = shapes[name][1]
            value = np.asarray(init[legacy_name])
            if not _convertible(value, target):
                raise self.fail(
                    f"legacy {legacy_name} ({value.dtype}) does not convert exactly to migrated "
                    f"{name} ({target})"
                )
            if not self.keep_values:
                self._assign(var, value.astype(target))
        self.mapping = mapping
        for name, var in self.variables.items():
            self.record.variables[name] = {
                "shape": list(shapes[name][0]),
                "dtype": str(shapes[name][1]),
                "trainable": bool(getattr(var, "trainable", False)),
                "kind": self.kinds[name],
                "mapped": name in mapping.values(),
            }
        self.trace_names = [mapping[n] for n in traced if n in mapping]
        save_arrays(self.out / INIT_NPZ, self.read(list(self.variables)))

    def _check_explicit(
        self,
        mapping: dict[str, str],
        init: dict[str, np.ndarray],
        shapes: dict[str, tuple[tuple[int, ...], np.dtype]],
    ) -> None:
        problems = []
        for legacy_name, name in mapping.items():
            if legacy_name not in init:
                problems.append(
                    f"legacy {legacy_name!r} (mapped to {name!r}) is not a variable of the legacy "
                    "program"
                    + _alternatives(
                        "legacy",
                        legacy_name,
                        shapes[name][0] if name in shapes else None,
                        {n: tuple(v.shape) for n, v in init.items() if n not in mapping},
                    )
                )
            elif name not in shapes:
                problems.append(
                    f"migrated {name!r} (mapped from {legacy_name!r}) is not a variable of the "
                    "migrated program"
                    + _alternatives(
                        "migrated",
                        name,
                        tuple(init[legacy_name].shape),
                        {n: s for n, (s, _) in shapes.items() if n not in mapping.values()},
                    )
                )
            elif tuple(init[legacy_name].shape) != shapes[name][0]:
                problems.append(
                    f"legacy {legacy_name!r} {_shape(tuple(init[legacy_name].shape))} is mapped to "
                    f"migrated {name!r} {_shape(shapes[name][0])}: the shapes differ"
                )
        if problems:
            raise self.fail(f"{self.mapping_source} does not fit: " + "; ".join(problems))

    def _check_matched(
        self,
        mapping: dict[str, str],
        ambiguous: dict[str, list[str]],
        legacy: dict[str, tuple[tuple[int, ...], np.dtype]],
        migrated: dict[str, tuple[tuple[int, ...], np.dtype]],
        meta: dict[str, Any],
    ) -> None:
        lines, legacy_left, migrated_left = unmatched(mapping, ambiguous, legacy, migrated)
        if not lines:
            return
        trainable_legacy = [
            n for n in [*legacy_left, *ambiguous] if meta.get(n, {}).get("trainable", True)
        ]
        trainable_migrated = [n for n in migrated_left if self.kinds.get(n) == "weight"]
        text = "; ".join(lines)
        if trainable_legacy or trainable_migrated:
            raise self.fail(
                "variables could not be matched by name and shape (give --mapping): " + text
            )
        self.record.notes.append("not compared (no counterpart by name and shape): " + text)

    def finish(self) -> None:
        if not self.started:
            return
        names = list(self.variables)
        save_arrays(self.out / FINAL_NPZ, self.read(names))
        for name in names:
            parts = self._parts(self.variables[name])
            spread = max(
                (float(np.max(np.abs(p - parts[0]))) for p in parts[1:] if p.size), default=0.0
            )
            if spread > 0:
                self.record.replica_spread[name] = spread
        if self.trace:
            save_arrays(self.out / TRACE_NPZ, {n: np.stack(v) for n, v in self.trace.items()})

    def _write_progress(self) -> None:
        write_json_atomic(
            self.out / PROGRESS_JSON,
            {"steps": len(self.record.steps), "updates_seen": bool(self.optimizers)},
        )


def _pair(
    legacy: list[tuple[str, list[np.ndarray]]], migrated: list[list[np.ndarray]]
) -> list[int] | None:
    """For each migrated input, the index of its legacy stream: by position when every shape and
    dtype kind agrees, else the one legacy stream of that shape and kind; None when neither works."""

    def sig(parts: list[np.ndarray]) -> tuple:
        return tuple((tuple(np.asarray(p).shape), np.asarray(p).dtype.kind) for p in parts)

    lsig = [sig(parts) for _, parts in legacy]
    msig = [sig(parts) for parts in migrated]
    if len(lsig) == len(msig) and lsig == msig:
        return list(range(len(msig)))
    chosen = []
    for s in msig:
        found = [j for j, t in enumerate(lsig) if t == s and j not in chosen]
        if len(found) != 1 and not (
            found and all(lsig[j] == s for j in found) and msig.count(s) == len(found)
        ):
            return None
        chosen.append(found[0])
    return chosen


def _describe(streams: list[list[np.ndarray]], names: list[str] | None = None) -> str:
    items = []
    for i, parts in enumerate(streams):
        first = np.asarray(parts[0]) if parts else np.zeros(0)
        label = names[i] if names else f"input {i}"
        items.append(f"{label} {first.dtype} {list(first.shape)} x{len(parts)}")
    return "(" + ", ".join(items) + ")" if items else "no data arrays"


def run_program(
    tf: Any, runner: AsWritten, script: Path, script_args: list[str]
) -> BaseException | None:
    """Install ``runner``'s patches and run the script's main block under them; returns what ended
    the program (None: it ended by itself or by StopProgram)."""
    runner.install()
    sys.argv = [str(script), *script_args]
    sys.path.insert(0, str(script.parent))
    ended: BaseException | None = None
    try:
        with tf.variable_creator_scope(runner.creator):
            runpy.run_path(str(script), run_name="__main__")
    except StopProgram:
        pass
    except SystemExit as exc:
        if exc.code not in (None, 0):
            ended = exc
    except BaseException as exc:  # noqa: BLE001  the user's crash (or a Problem of ours)
        ended = exc
    if isinstance(ended, Exception) and isinstance(_cause(ended), Problem):
        ended = _cause(ended)
    return ended


def _cause(exc: BaseException) -> BaseException:
    """A Problem raised while a step traces (in a replica thread, say) may reach the program
    chained to TensorFlow's own error."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, Problem):
            return seen
        seen = seen.__cause__ or seen.__context__
    return exc
