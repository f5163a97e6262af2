"""Legacy side of verify: ``python -m tfmigrate.verify.legacy_boot --script train.py --out DIR ...``.

Runs an unmodified TF1 tower script on TF 2.21 (see tf1_compat) and instruments it from outside:
- device ``/gpu:i`` becomes logical ``CPU:i+1`` (``CPU:0`` stays the host the script calls /cpu:0),
  so an op's device tells its tower; sessions get the CPU devices via ``device_count``;
- ``Optimizer.apply_gradients`` (hence ``minimize``) marks its op as a train op; a ``Session.run``
  whose fetches depend on a train op, or on an assignment of ``tf.gradients``' values to a
  trainable variable (a hand-written update), is a training step; so is a call of a Keras backend function
  (Keras 2 ``fit``: one per batch) whose outputs/updates depend on one marked by tf_keras's
  ``OptimizerV2.apply_gradients``;
- per training step: every fetched scalar (with its tower), an input fingerprint (fed arrays, or the
  outputs of in-graph dequeue/iterator ops the step consumed), the wall time;
- before step 1: every global variable (init.npz, written at once so the migrated side can start);
- after every step: the traced variables; after step K: every global variable, then a private
  exception unwinds the user's loop;
- with ``--restore-checkpoint``, every global variable starts from a TF1 checkpoint (by name, as a
  Saver restores); with ``--save-checkpoint``, the variables after step K are saved as one.
Writes a record (record.py) and exits 0 even when the user code crashed: the record says so.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import runpy
import sys
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from tfmigrate.verify import fingerprint, tf1_compat, tower_names
from tfmigrate.verify.record import (
    CRASHED,
    ERROR,
    FINAL_NPZ,
    INIT_NPZ,
    INPUTS_NPZ,
    LEGACY_VARIABLES_JSON,
    TRACE_NPZ,
    TRACED_JSON,
    Fetch,
    RunRecord,
    Step,
    save_arrays,
    save_step_inputs,
    write_json_atomic,
)

PIPELINE_OP_TYPES = {
    "IteratorGetNext",
    "IteratorGetNextSync",
    "QueueDequeueV2",
    "QueueDequeueManyV2",
    "QueueDequeueUpToV2",
    "QueueDequeue",
    "QueueDequeueMany",
    "QueueDequeueUpTo",
}
SLOT_HINTS = ("/Momentum", "/RMSProp", "/Adam", "/Adagrad", "/Ftrl", "/Adadelta", "beta1_power", "beta2_power")
AUTO_TRACE_LIMIT = 2_000_000  # elements; above it only the final values are kept
REPLAY_LIMIT_BYTES = 512 * 2**20  # input batches kept for --replay-inputs, all steps together


class StopTraining(BaseException):
    """Raised out of Session.run after step K. BaseException so ``except Exception`` in user loops
    does not swallow it."""


class LegacyRecorder:
    def __init__(self, out: Path, steps: int, towers: int, trace: list[str] | None, device: str = "cpu") -> None:
        self.out, self.max_steps, self.towers, self.device = out, steps, towers, device
        self.restore_from: str | None = None  # TF1 checkpoint prefix the variables start from
        self.restore_ema: str | None = None  # load `<var>/<restore_ema>` shadows into the variables
        self.save_to: str | None = None  # TF1 checkpoint prefix written after step K
        self.nudge_seed: int | None = None  # move each trainable float one ulp (verify's noise floor)
        self.trace_request = trace
        self.record = RunRecord(side="legacy")
        self.train_op_names: set[str] = set()
        self.optimizers: list[Any] = []
        self.towers_seen: set[int] = set()
        self.steps_done = 0
        self.finalized = False
        self.trace_values: dict[str, list[np.ndarray]] = {}
        self.step_inputs: list[list[tuple[str, list[Any]]]] | None = []  # for --replay-inputs
        self._plans: dict[tuple[int, tuple[str, ...]], tuple[bool, list[Any]]] = {}
        self._inside = False

    # -- patches ---------------------------------------------------------------------------------
    def install(self, tf: Any) -> None:
        from tensorflow.python.client import session as session_lib
        from tensorflow.python.framework import device_spec, ops
        from tensorflow.python.training import optimizer as optimizer_lib

        rec = self
        spec_types = (device_spec.DeviceSpecV1, device_spec.DeviceSpecV2)

        def translate(dev: Any) -> Any:
            if dev is None or (callable(dev) and not isinstance(dev, spec_types)):
                if dev is None:
                    return None
                return lambda op: translate(dev(op))
            text = dev.to_string() if isinstance(dev, spec_types) else str(dev)
            spec = device_spec.DeviceSpecV2.from_string(text)
            if (spec.device_type or "").upper() == "GPU":
                index = spec.device_index or 0
                rec.towers_seen.add(index)
                if rec.device == "gpu":  # real GPUs: keep the script's placement
                    return dev
                return spec.replace(device_type="CPU", device_index=index + 1).to_string()
            if (spec.device_type or "").upper() == "CPU" and rec.device == "cpu":
                return spec.replace(device_index=0).to_string()
            return dev

        orig_device = ops.Graph.device

        def device(graph: Any, device_name_or_function: Any) -> Any:
            return orig_device(graph, translate(device_name_or_function))

        ops.Graph.device = device

        orig_init = session_lib.BaseSession.__init__

        def session_init(sess: Any, target: str = "", graph: Any = None, config: Any = None) -> None:
            config = tf.ConfigProto() if config is None else _copy_proto(config)
            if rec.device == "cpu":
                config.device_count["CPU"] = rec.towers + 1  # host CPU:0 + one device per tower
                config.device_count["GPU"] = 0
            config.log_device_placement = False
            config.allow_soft_placement = True
            orig_init(sess, target, graph, config)

        session_lib.BaseSession.__init__ = session_init

        orig_apply = optimizer_lib.Optimizer.apply_gradients

        def apply_gradients(opt: Any, *args: Any, **kwargs: Any) -> Any:
            op = orig_apply(opt, *args, **kwargs)
            rec.train_op_names.add(op.name)
            rec.optimizers.append(opt)
            return op

        optimizer_lib.Optimizer.apply_gradients = apply_gradients

        orig_run = session_lib.BaseSession.run
        self._orig_run = orig_run

        def run(sess: Any, fetches: Any, feed_dict: Any = None, options: Any = None, run_metadata: Any = None) -> Any:
            if rec._inside or rec.finalized:
                if rec.finalized and rec.steps_done >= rec.max_steps:
                    raise StopTraining()
                return orig_run(sess, fetches, feed_dict, options, run_metadata)
            rec._inside = True
            try:
                return rec.run(sess, fetches, feed_dict, options, run_metadata)
            finally:
                rec._inside = False

        session_lib.BaseSession.run = run

        orig_close = session_lib.BaseSession.close

        def close(sess: Any) -> None:
            if rec.steps_done and not rec.finalized and not getattr(sess, "_closed", False):
                try:
                    rec.finalize(sess)
                except Exception as exc:  # noqa: BLE001  closing must not fail because of us
                    rec.record.notes.append(f"final variables not captured at session close: {exc}")
            orig_close(sess)

        session_lib.BaseSession.close = close
        self._watch_queue_runners()
        self._order_tower_dequeues()
        self._install_keras()

    def _install_keras(self) -> None:
        """Keras 2-era ``fit``: tf_keras's graph-mode optimizers are not ``tf.train.Optimizer`` and
        each batch runs through a ``GraphExecutionFunction`` (a Session callable, not Session.run)."""
        try:
            from tf_keras.src import backend as keras_backend
            from tf_keras.src.engine import training_v1
            from tf_keras.src.optimizers.legacy import optimizer_v2
        except ImportError:  # no tf_keras: TF1 scripts without Keras still run
            return
        rec = self

        orig_apply = optimizer_v2.OptimizerV2.apply_gradients

        def apply_gradients(opt: Any, *args: Any, **kwargs: Any) -> Any:
            result = orig_apply(opt, *args, **kwargs)
            op = getattr(result, "op", result)
            if getattr(op, "graph", None) is not None and not getattr(op.graph, "_building_function", False):
                rec.train_op_names.add(op.name)  # graph mode only: eager updates have no op to fetch
                rec.optimizers.append(opt)
            return result

        optimizer_v2.OptimizerV2.apply_gradients = apply_gradients

        orig_make = training_v1.Model._make_train_function

        def make_train_function(model: Any) -> None:
            orig_make(model)
            if getattr(model, "train_function", None) is not None:
                # outputs are [total loss, *metrics]: record them under Keras' own names
                model.train_function._tfmigrate_names = list(model.metrics_names)

        training_v1.Model._make_train_function = make_train_function

        orig_call = keras_backend.GraphExecutionFunction.__call__

        def call(fn: Any, inputs: Any) -> Any:
            if rec._inside or rec.finalized:
                if rec.finalized and rec.steps_done >= rec.max_steps:
                    raise StopTraining()
                return orig_call(fn, inputs)
            rec._inside = True
            try:
                return rec.run_keras_function(fn, inputs, orig_call, keras_backend)
            finally:
                rec._inside = False

        keras_backend.GraphExecutionFunction.__call__ = call

    def _watch_queue_runners(self) -> None:
        """A queue runner that fails (missing data files, ...) leaves the training loop blocked in a
        dequeue forever: report it as the user's crash and end the process."""
        from tensorflow.python.framework import errors
        from tensorflow.python.training import queue_runner_impl

        orig = queue_runner_impl.QueueRunner._run
        rec = self

        def run(runner: Any, sess: Any, enqueue_op: Any, coord: Any = None) -> None:
            try:
                orig(runner, sess, enqueue_op, coord)
            except (errors.OutOfRangeError, errors.CancelledError):
                raise
            except Exception as exc:
                if not rec.finalized and coord is None:
                    rec.record.status = CRASHED
                    rec.record.message = f"input queue runner failed: {type(exc).__name__}: {exc}".strip()
                    rec.record.traceback = _user_traceback(exc)
                    rec.exit()
                raise

        queue_runner_impl.QueueRunner._run = run

    def _order_tower_dequeues(self) -> None:
        """Towers that each dequeue from one queue take the step's batches in no fixed order:
        measured on TF 2.21's compat layer with op determinism, 2 towers took them in reverse
        order in nearly every step but not all, 4 towers in a few different orders. The migrated
        program gives replica i the i-th batch, one of the orders TF1 allows; tower i's dequeue
        here runs after tower i-1's (a control dependency), so the legacy run takes that order
        too, every step, and each tower's batch is fingerprinted as before."""
        from tensorflow.python.ops import data_flow_ops
        from tensorflow.python.util import nest

        orig = data_flow_ops.QueueBase.dequeue
        rec = self

        def dequeue(queue: Any, name: Any = None) -> Any:
            out = orig(queue, name)
            op = nest.flatten(out)[0].op
            tower = _tower_of_device(op.device)
            previous = getattr(queue, "_tfmigrate_last_dequeue", None)
            if (
                previous is not None
                and tower is not None
                and previous[0].graph is op.graph
                and previous[1] == tower - 1
            ):
                op._add_control_input(previous[0])
                note = (
                    "the legacy towers dequeue their own batches from one queue, in no fixed "
                    "order in TF1: verify ran tower i's dequeue after tower i-1's, so tower i "
                    "took the i-th batch of each step, as replica i does"
                )
                if note not in rec.record.notes:
                    rec.record.notes.append(note)
            queue._tfmigrate_last_dequeue = (op, tower)
            return out

        data_flow_ops.QueueBase.dequeue = dequeue

    def exit(self) -> None:
        """Write the record and end the process (threads of the script must not keep it alive)."""
        self.record.peak_memory_bytes = tf1_compat.peak_rss_bytes()
        self.record.memory_source = "process peak RSS (CPU)" if self.device == "cpu" else "process peak RSS"
        self.record.save(self.out)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    # -- one Session.run ---------------------------------------------------------------------------
    def run(self, sess: Any, fetches: Any, feed_dict: Any, options: Any, run_metadata: Any) -> Any:
        graph = sess.graph
        leaves = _leaves(fetches)
        elements = [_graph_element(graph, leaf) for leaf in leaves]
        is_train, pipeline = self._plan(graph, elements)
        if not is_train:
            return self._orig_run(sess, fetches, feed_dict, options, run_metadata)
        if self.steps_done == 0:
            self._check_towers()
            self.capture_initial(sess)
        extra = [t for op in pipeline for t in op.outputs] if not _has_data_feed(feed_dict) else []
        start = time.perf_counter()
        results, extra_values = self._orig_run(sess, (fetches, extra), feed_dict, options, run_metadata)
        seconds = time.perf_counter() - start
        self.steps_done += 1
        step = Step(step=self.steps_done, seconds=seconds)
        caller = _caller_part(fetches)  # a MonitoredSession's hooks add fetches the loop never saw
        if caller is None:
            step.fetches = self._scalars(elements, _leaves(results, like=fetches))
        else:
            step.fetches = self._scalars([_graph_element(graph, leaf) for leaf in _leaves(fetches["caller"])],
                                         _leaves(results["caller"], like=fetches["caller"]))
        step.inputs, step.samples = self._fingerprint(graph, feed_dict, extra, extra_values)
        self.record.steps.append(step)
        self._trace(sess)
        if self.steps_done >= self.max_steps:
            self.finalize(sess)
            raise StopTraining()
        return results

    def run_keras_function(self, fn: Any, inputs: Any, orig_call: Any, keras_backend: Any) -> Any:
        """One call of a Keras backend function (``fit`` runs one per batch)."""
        graph = fn.outputs[0].graph if fn.outputs else fn.updates_op.graph
        is_train, _ = self._plan(graph, [*fn.outputs, fn.updates_op])
        if not is_train:
            return orig_call(fn, inputs)
        from tensorflow.python.util import nest

        flat = nest.flatten(inputs, expand_composites=True)
        sess = keras_backend.get_session(flat)  # also initializes the variables Keras created
        if self.steps_done == 0:
            self._check_towers()
            self.capture_initial(sess)
        start = time.perf_counter()
        results = orig_call(fn, inputs)
        seconds = time.perf_counter() - start
        self.steps_done += 1
        step = Step(step=self.steps_done, seconds=seconds)
        values = nest.flatten(results)
        names = getattr(fn, "_tfmigrate_names", None)
        if names and len(names) == len(values):
            # a compiled model: [total loss of this (global) batch, *metrics]. They are reductions
            # (no tower). tf_keras's metrics are stateful running means since the epoch started
            # (measured), unlike the loss: named apart so a per-batch value never matches them.
            step.fetches = [
                Fetch(name=n if i == 0 else f"{n}/epoch_mean", base=n if i == 0 else f"{n}/epoch_mean",
                      tower=None, value=float(np.asarray(v).reshape(())))
                for i, (n, v) in enumerate(zip(names, values, strict=True)) if np.asarray(v).size == 1
            ]
        else:
            step.fetches = self._scalars(list(fn.outputs), values)
        streams: dict[str, dict[int, Any]] = {}
        for tensor, value in zip(fn.inputs, flat, strict=False):
            # Keras feeds all-ones sample weights the program never wrote: not part of the data
            if value is None or hasattr(value, "graph") or tensor.op.name.endswith("_sample_weights"):
                continue
            arr = np.asarray(value, dtype=tensor.dtype.as_numpy_dtype)
            if fingerprint.is_data(arr):
                self._add_stream(streams, tensor, arr)
        step.inputs, step.samples = self._keep_inputs(streams)
        self.record.steps.append(step)
        self._trace(sess)
        if self.steps_done >= self.max_steps:
            self.finalize(sess)
            raise StopTraining()
        return results

    def _plan(self, graph: Any, elements: list[Any]) -> tuple[bool, list[Any]]:
        """Is this run a training step, and which input-pipeline ops does it consume? (cached)"""
        ops_ = [getattr(e, "op", e) for e in elements if e is not None]
        key = (id(graph), tuple(sorted(op.name for op in ops_)))
        if key in self._plans:
            return self._plans[key]
        trainables = _trainable_handles(graph)
        if not self.train_op_names and not trainables:
            self._plans[key] = (False, [])
            return self._plans[key]
        seen: set[str] = set()
        queue = deque(ops_)
        is_train, pipeline = False, []
        while queue:
            op = queue.popleft()
            if op.name in seen:
                continue
            seen.add(op.name)
            if op.name in self.train_op_names or _hand_written_update(op, trainables):
                is_train = True
            if op.type in PIPELINE_OP_TYPES:
                pipeline.append(op)
            queue.extend(t.op for t in op.inputs)
            queue.extend(op.control_inputs)
        pipeline.sort(key=lambda op: op.name)
        self._plans[key] = (is_train, pipeline if is_train else [])
        return self._plans[key]

    def _check_towers(self) -> None:
        if self.towers_seen and max(self.towers_seen) + 1 != self.towers:
            raise _RuntimeProblem(
                f"the legacy script built {max(self.towers_seen) + 1} tower(s) on /gpu:0..."
                f"{max(self.towers_seen)} but verify runs {self.towers} replica(s): pass the "
                "script's own tower-count flag after `--`, or change --replicas"
            )
        if not self.towers_seen:
            self.record.notes.append(
                "the legacy script placed nothing on /gpu:i; towers were recognised by scope name only"
            )
        self.record.devices = max(self.towers_seen) + 1 if self.towers_seen else self.towers

    def _scalars(self, elements: list[Any], values: list[Any]) -> list[Fetch]:
        out: list[Fetch] = []
        seen: set[str] = set()
        for element, value in zip(elements, values, strict=False):
            if element is None or not hasattr(element, "op") or value is None or element.name in seen:
                continue
            seen.add(element.name)  # hooks of a MonitoredSession fetch the same tensor repeatedly
            arr = np.asarray(value)
            if arr.size != 1 or arr.dtype.kind not in "fiub":
                continue
            name = tower_names.strip_output_index(element.name)
            if tf1_compat.MEMORY_STATS_SCOPE in name:
                continue
            base, tower = tower_names.split_tower(name, _tower_of_device(element.op.device))
            out.append(Fetch(name=name, base=base, tower=tower, value=float(arr.reshape(()))))
        return out

    def _fingerprint(self, graph: Any, feed_dict: Any, extra: list[Any],
                     extra_values: list[Any]) -> tuple[list[str] | None, int | None]:
        streams: dict[str, dict[int, Any]] = {}
        if _has_data_feed(feed_dict):
            for key, value in feed_dict.items():
                element = _graph_element(graph, key)
                if element is None or not fingerprint.is_data(value):
                    continue
                arr = np.asarray(value, dtype=element.dtype.as_numpy_dtype) if hasattr(element, "dtype") else value
                self._add_stream(streams, element, arr)
        else:
            for tensor, value in zip(extra, extra_values, strict=False):
                if fingerprint.is_data(value):
                    self._add_stream(streams, tensor, value)
        return self._keep_inputs(streams)

    @staticmethod
    def _add_stream(streams: dict[str, dict[int, Any]], tensor: Any, value: Any) -> None:
        # per-tower feeds (tower_0/x, tower_1/x) form one stream, concatenated in tower order
        name = tower_names.strip_output_index(tensor.name)
        base, tower = tower_names.split_tower(name, _tower_of_device(tensor.op.device))
        streams.setdefault(base, {})[tower if tower is not None else 0] = value

    # -- variables -------------------------------------------------------------------------------
    def _global_variables(self, sess: Any) -> list[Any]:
        return list(sess.graph.get_collection("variables"))

    def _read(self, sess: Any, variables: list[Any]) -> dict[str, np.ndarray]:
        values = self._orig_run(sess, [v.value() if hasattr(v, "value") else v for v in variables])
        return {v.op.name: np.asarray(x) for v, x in zip(variables, values, strict=True)}

    def capture_initial(self, sess: Any) -> None:
        variables = self._global_variables(sess)
        trainable = {v.op.name for v in sess.graph.get_collection("trainable_variables")}
        averaged = {v.op.name for v in sess.graph.get_collection("moving_average_variables")}
        slots = self._slot_names()
        if self.restore_from:
            self._restore(sess, variables)
        values = self._read(sess, variables)
        for v in variables:
            name = v.op.name
            self.record.variables[name] = {
                "shape": list(values[name].shape),
                "dtype": str(values[name].dtype),
                "kind": _kind(name, name in trainable, name in slots),
                "trainable": name in trainable,
                "moving_average": name in averaged,
            }
        if self.trace_request is None:
            candidates = [n for n, meta in self.record.variables.items() if meta["kind"] in _TRACED_KINDS]
        else:
            missing = [n for n in self.trace_request if n not in values]
            if missing:
                self.record.notes.append(f"mapped legacy variables not in the graph: {missing}")
            candidates = [n for n in self.trace_request if n in values]
        size = sum(int(values[n].size) for n in candidates)
        if size > AUTO_TRACE_LIMIT:  # big model: per-step trace of the small state only
            candidates = [n for n in candidates if self.record.variables[n]["kind"] == "bn_stat"]
            self.record.notes.append(
                f"mapped variables hold {size} values: per-step comparison limited to batch-norm "
                "statistics; all mapped variables are still compared at the end")
        self.trace_names = candidates
        # the migrated side reads which variables to trace, then waits for init.npz (written last)
        write_json_atomic(self.out / LEGACY_VARIABLES_JSON, self.record.variables)
        write_json_atomic(self.out / TRACED_JSON, self.trace_names)
        save_arrays(self.out / INIT_NPZ, values)
        if self.nudge_seed is not None:
            self._nudge(sess, [v for v in variables if v.op.name in trainable], values)
        by_name = {v.op.name: v for v in variables}
        self._trace_vars = [by_name[n] for n in self.trace_names]

    def _nudge(self, sess: Any, variables: list[Any], values: dict[str, np.ndarray]) -> None:
        """Start from weights one float step away, up or down at random: the same program a
        rounding apart, to measure how far training carries a rounding difference."""
        rng = np.random.default_rng(self.nudge_seed)
        for v in variables:
            value = values[v.op.name]
            if not np.issubdtype(value.dtype, np.floating):
                continue
            direction = np.where(rng.random(value.shape) < 0.5, -np.inf, np.inf).astype(value.dtype)
            v.load(np.nextafter(value, direction), sess)

    def _slot_names(self) -> set[str]:
        names = set()
        for opt in self.optimizers:
            for slot in opt.get_slot_names():
                for var in list(getattr(opt, "_slots", {}).get(slot, {}).values()):
                    names.add(var.op.name)
            for extra in getattr(opt, "_non_slot_dict", {}).values():
                names.add(extra.op.name)
            if hasattr(opt, "_hyper"):  # tf_keras OptimizerV2: iterations, hyperparameters, slots
                names.update(v.op.name for v in opt.weights)
                names.update(h.op.name for h in opt._hyper.values() if hasattr(h, "op"))
        return names

    def _trace(self, sess: Any) -> None:
        if not self._trace_vars:
            return
        for name, value in self._read(sess, self._trace_vars).items():
            self.trace_values.setdefault(name, []).append(value)

    def finalize(self, sess: Any) -> None:
        if self.finalized:
            return
        self.finalized = True
        final = self._read(sess, self._global_variables(sess))
        save_arrays(self.out / FINAL_NPZ, final)
        self.flush_trace()
        if self.save_to:
            self._save(final)

    def _restore(self, sess: Any, variables: list[Any]) -> None:
        """Name-based, as tf.train.Saver restores (shadows into their variables as
        ExponentialMovingAverage.variables_to_restore does); adds no op to the user's graph."""
        from tensorflow.python.training import checkpoint_utils

        reader = checkpoint_utils.load_checkpoint(self.restore_from)
        have = reader.get_variable_to_shape_map()
        missing = []
        for v in variables:
            name = source = v.op.name
            shadow = f"{name}/{self.restore_ema}"
            if self.restore_ema and not name.endswith("/" + self.restore_ema) and shadow in have:
                source = shadow
            if source not in have:
                missing.append(name)
                continue
            v.load(reader.get_tensor(source), sess)
        if missing:
            raise _RuntimeProblem(f"checkpoint {self.restore_from} lacks the legacy variables {missing}")

    def _save(self, values: dict[str, np.ndarray]) -> None:
        """A TF1 checkpoint of every global variable, as a Saver in the script writes it (V2 bundle +
        'checkpoint' state file), without a session: no op is added to the user's graph."""
        from tensorflow.python.checkpoint import checkpoint_management
        from tensorflow.python.eager import context
        from tensorflow.python.ops import gen_io_ops

        assert self.save_to is not None  # called only when asked to save
        prefix = os.path.abspath(self.save_to)
        os.makedirs(os.path.dirname(prefix), exist_ok=True)
        names = sorted(values)
        with context.eager_mode():
            gen_io_ops.save_v2(prefix, names, [""] * len(names), [values[n] for n in names])
        checkpoint_management.update_checkpoint_state_internal(
            os.path.dirname(prefix), prefix, [prefix], save_relative_paths=True)

    def flush_trace(self) -> None:
        if self.trace_values:
            save_arrays(self.out / TRACE_NPZ, {n: np.stack(v) for n, v in self.trace_values.items()})
        if self.step_inputs:
            save_step_inputs(self.out / INPUTS_NPZ, self.step_inputs)

    def _keep_inputs(self, streams: dict[str, dict[int, Any]]) -> tuple[list[str] | None, int | None]:
        """The step's fingerprint; its batches are kept for verify --replay-inputs while small."""
        if self.step_inputs is not None:
            self.step_inputs.append([(name, [np.asarray(parts[i]) for i in sorted(parts)])
                                     for name, parts in streams.items()])
            if sum(a.nbytes for s in self.step_inputs for _, ps in s for a in ps) > REPLAY_LIMIT_BYTES:
                self.step_inputs = None
                self.record.notes.append("the input batches are too large to keep for --replay-inputs")
        return _describe(streams)


_TRACED_KINDS = {"weight", "ema", "bn_stat", "other"}


class _RuntimeProblem(Exception):
    """A problem verify must report as 'could not run' (not a crash of user code)."""


def _kind(name: str, trainable: bool, slot: bool) -> str:
    if slot or any(h in name for h in SLOT_HINTS):
        return "optimizer"
    if name.endswith("ExponentialMovingAverage") or "/ExponentialMovingAverage" in name:
        return "ema"
    if "moving_mean" in name or "moving_variance" in name:
        return "bn_stat"
    if name.split("/")[-1] in ("global_step",):
        return "step"
    return "weight" if trainable else "other"


def _tower_of_device(device: str) -> int | None:
    """Tower i runs on GPU:i (--device gpu) or, as mapped by us, on CPU:i+1."""
    if not device:
        return None
    low = device.lower()
    for marker, offset in (("gpu:", 0), ("cpu:", 1)):
        if marker in low:
            try:
                index = int(low.rsplit(marker, 1)[-1].split("/")[0])
            except ValueError:
                return None
            return index - offset if index >= offset else None
    return None


def _caller_part(fetches: Any) -> Any:
    if isinstance(fetches, dict) and "caller" in fetches and len(fetches) > 1:
        from tensorflow.python.training.session_run_hook import SessionRunHook

        if all(isinstance(k, SessionRunHook) for k in fetches if k != "caller"):
            return fetches["caller"]
    return None


def _leaves(structure: Any, like: Any = None) -> list[Any]:
    """Leaves of a Session.run fetch structure in a stable order; with ``like`` (the fetches), walk
    the results the same way. Not tf.nest: MonitoredSession keys its dicts by hook objects,
    which nest.flatten tries to sort."""
    like = structure if like is None else like
    if isinstance(like, dict):
        return [leaf for key in like for leaf in _leaves(structure[key], like[key])]
    if isinstance(like, (list, tuple)):
        return [leaf for s, f in zip(structure, like, strict=False) for leaf in _leaves(s, f)]
    return [structure]


def _graph_element(graph: Any, leaf: Any) -> Any:
    try:
        return graph.as_graph_element(leaf, allow_tensor=True, allow_operation=True)
    except Exception:  # noqa: BLE001  e.g. a SparseTensor or a callable fetch: not a scalar anyway
        return None


def _describe(streams: dict[str, dict[int, Any]]) -> tuple[list[str] | None, int | None]:
    """(fingerprint, samples) of a step's input streams; tower parts in tower order."""
    if not streams:
        return None, None
    ordered = [[parts[i] for i in sorted(parts)] for parts in streams.values()]
    return fingerprint.step_fingerprint(ordered), fingerprint.step_samples(ordered)


def _has_data_feed(feed_dict: Any) -> bool:
    return bool(feed_dict) and any(fingerprint.is_data(v) for v in feed_dict.values())


def _copy_proto(config: Any) -> Any:
    copy = type(config)()
    copy.CopyFrom(config)
    return copy


def _user_traceback(exc: BaseException) -> str:
    """The user's traceback without tfmigrate's own frames (boot, patches, runpy)."""
    here = os.path.dirname(os.path.abspath(__file__))
    te = traceback.TracebackException.from_exception(exc)
    for chained in _chain(te):
        chained.stack = traceback.StackSummary.from_list(
            [f for f in chained.stack if not (f.filename.startswith(here) or "runpy" in f.filename)]
        )
    return "".join(te.format())


def _raised_by_us(exc: BaseException) -> bool:
    """Innermost frame outside TensorFlow/site-packages decides whose bug it is."""
    here = os.path.dirname(os.path.abspath(__file__))
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if "site-packages" in frame.filename or frame.filename.startswith("<frozen"):
            continue
        return frame.filename.startswith(here)
    return False


def _chain(te: traceback.TracebackException) -> list[traceback.TracebackException]:
    out: list[traceback.TracebackException] = []
    cur: traceback.TracebackException | None = te
    while cur is not None and cur not in out:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


# Ops writing a variable: a hand-written update (``tf.assign_sub(p, lr * g)``) is one of these.
_ASSIGN_OP_TYPES = frozenset({"Assign", "AssignSub", "AssignAdd", "AssignVariableOp",
                              "AssignSubVariableOp", "AssignAddVariableOp"})


def _trainable_handles(graph: Any) -> frozenset[str]:
    """The op names of the graph's trainable variables (their handles)."""
    names = set()
    for variable in graph.get_collection("trainable_variables"):
        handle = getattr(variable, "handle", None)
        names.add(handle.op.name if handle is not None else variable.op.name)
    return frozenset(names)


def _hand_written_update(op: Any, trainables: frozenset[str]) -> bool:
    """An assignment to a trainable variable whose value comes from ``tf.gradients`` (ops in a
    ``gradients`` name scope): the program's own update of its weights. Initializers and the
    loading of saved values write variables too, but from no gradient."""
    if op.type not in _ASSIGN_OP_TYPES or len(op.inputs) < 2 or op.inputs[0].op.name not in trainables:
        return False
    seen: set[str] = set()
    queue = deque([op.inputs[1].op])
    while queue:
        current = queue.popleft()
        if current.name in seen:
            continue
        seen.add(current.name)
        if any(part == "gradients" or part.startswith("gradients_") for part in current.name.split("/")):
            return True
        queue.extend(t.op for t in current.inputs)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfmigrate.verify.legacy_boot")
    parser.add_argument("--script", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--towers", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", type=Path, help="JSON list of legacy variable names to trace per step")
    parser.add_argument("--restore-checkpoint", help="TF1 checkpoint prefix every variable starts from")
    parser.add_argument("--restore-ema", help="with --restore-checkpoint: load these EMA shadows into the weights")
    parser.add_argument("--save-checkpoint", help="save a TF1 checkpoint here after the last step")
    parser.add_argument("--nudge-initial", type=int, metavar="SEED",
                        help="move every trainable weight one float step after init.npz (noise floor)")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    script_args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    ns.out.mkdir(parents=True, exist_ok=True)
    trace = json.loads(ns.trace.read_text()) if ns.trace else None
    recorder = LegacyRecorder(ns.out, ns.steps, ns.towers, trace, ns.device)
    recorder.restore_from, recorder.restore_ema = ns.restore_checkpoint, ns.restore_ema
    recorder.save_to = ns.save_checkpoint
    recorder.nudge_seed = ns.nudge_initial
    record = recorder.record

    random.seed(ns.seed)
    np.random.seed(ns.seed)
    try:
        tf = tf1_compat.install(ns.seed)
        recorder.install(tf)
        from tfmigrate.verify import keras2_compat

        keras2_compat.DEFAULT_GPUS = ns.towers  # multi_gpu_model(gpus=None) counted the visible GPUs
    except Exception as exc:  # noqa: BLE001
        record.status, record.message = ERROR, f"legacy runtime could not start: {exc!r}"
        record.traceback = traceback.format_exc()
        record.save(ns.out)
        return 0

    script = ns.script.resolve()
    sys.argv = [str(script), *script_args]
    sys.path.insert(0, str(script.parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except StopTraining:
        pass
    except _RuntimeProblem as exc:
        record.status, record.message = ERROR, str(exc)
    except SystemExit as exc:
        if exc.code not in (None, 0) and recorder.steps_done < ns.steps:
            record.status = CRASHED
            record.message = f"the legacy script exited with status {exc.code}"
    except BaseException as exc:  # noqa: BLE001  user code crashed: report it as theirs
        if _raised_by_us(exc):
            record.status, record.message = ERROR, f"internal error in tfmigrate's legacy runtime: {exc!r}"
            record.traceback = "".join(traceback.format_exception(exc))
        else:
            record.status = CRASHED
            record.message = f"{type(exc).__name__}: {exc}".strip()
            record.traceback = _user_traceback(exc)
    if recorder.steps_done == 0 and record.status not in (CRASHED, ERROR):
        record.status = ERROR
        record.message = (
            "no training step recognised: no Session.run (or Keras fit step) ran an op built by "
            "Optimizer.apply_gradients/minimize or a tf_keras optimizer"
        )
    elif 0 < recorder.steps_done < ns.steps:
        record.notes.append(f"the legacy script ended after {recorder.steps_done} of {ns.steps} steps")
        recorder.flush_trace()
    recorder.exit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
