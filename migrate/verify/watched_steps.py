"""verify's several-steps-per-call driver (imports TensorFlow: load it only in the migrated runner).

A program that offers ``one_step`` (protocol.py) has its training step run here, several times
in one tf.function call, as its own main loop runs it; what verify records of a step is read
inside the call, after that step: the step's values (every replica's part), the watched
variables (replica 0's copy) and the step's batch (every replica's part). The program itself
carries none of this.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf


class WatchedSteps:
    """``self(iterator, count)``: up to ``count`` steps of ``one_step`` in one call (fewer when the
    batches end, none when they have ended), each as ``{"outputs": {key: [replica 0's part,
    ...]}, "per_replica": [keys of per-replica values], "watched": [each watched variable after
    the step], "inputs": [[replica 0's part, ...] for each batch array]}``, as numpy."""

    def __init__(self, strategy: Any, one_step: Callable[[Any], dict], watch: list[Any]) -> None:
        self.strategy = strategy
        self.one_step = one_step
        self.watch = watch
        self.outputs: list[tuple[str, int, bool]] = []  # (key, parts, per replica) of a step
        self.inputs: list[int] = []  # parts of each batch array
        self.call = tf.function(self.run)

    def __call__(self, iterator: Any, count: int) -> list[dict[str, Any]]:
        try:
            done, stacks, inputs, rows = self.call(iterator, tf.constant(count))
        except tf.errors.OutOfRangeError:  # no batch left for the first step
            return []
        stacks = [stack.numpy() for stack in stacks]
        pieces = [
            _split_rows(whole.numpy(), sizes.numpy())
            for whole, sizes in zip(inputs, rows, strict=True)
        ]
        per_replica = [key for key, _, distributed in self.outputs if distributed]
        steps = []
        for index in range(int(done)):
            values = iter([stack[index] for stack in stacks])
            parts = iter([piece[index] for piece in pieces])
            outputs = {key: [next(values) for _ in range(n)] for key, n, _ in self.outputs}
            steps.append(
                {
                    "outputs": outputs,
                    "per_replica": per_replica,
                    "watched": list(values),
                    "inputs": [[next(parts) for _ in range(n)] for n in self.inputs],
                }
            )
        return steps

    def run(self, iterator: Any, count: Any) -> tuple[Any, list[Any], list[Any], list[Any]]:
        """Traced (AutoGraph): the steps, each step's values written to growing TensorArrays."""
        local = self.strategy.experimental_local_results
        graph = tf.compat.v1.get_default_graph()
        collected = {key: graph.get_collection(key) for key in graph.get_all_collection_keys()}

        def step_values(batch: Any) -> list[Any]:
            # TF1 model code collects in the graph as it is traced (regularization losses, ...):
            # every step traced into this one graph starts from what was there before the steps.
            inner = tf.compat.v1.get_default_graph()
            for key in inner.get_all_collection_keys():
                inner.get_collection_ref(key)[:] = collected.get(key, [])
            values: list[Any] = []
            self.outputs.clear()
            for key, value in self.one_step(batch).items():
                parts = local(value)
                values.extend(parts)
                distributed = isinstance(value, tf.distribute.DistributedValues)
                self.outputs.append((key, len(parts), distributed))
            # read after the step's updates (automatic control dependencies)
            values.extend(local(variable)[0].read_value() for variable in self.watch)
            return values

        def batch_parts(batch: Any) -> list[Any]:
            leaves = [local(leaf) for leaf in tf.nest.flatten(batch)]
            leaves = [parts for parts in leaves if parts[0].shape.rank]
            self.inputs.clear()
            self.inputs.extend(len(parts) for parts in leaves)
            return [part for parts in leaves for part in parts]

        def start(value: Any, fixed_shape: bool = True) -> Any:
            array = tf.TensorArray(value.dtype, size=0, dynamic_size=True, infer_shape=fixed_shape)
            return array.write(0, value)

        first = next(iterator)  # raises OutOfRangeError before any step when there is none
        arrays = [start(value) for value in step_values(first)]
        parts = batch_parts(first)
        inputs = [start(part, fixed_shape=False) for part in parts]  # the last batch may be short
        rows = [start(tf.shape(part)[0]) for part in parts]
        done = tf.constant(1)
        for index in tf.range(1, count):
            optional = iterator.get_next_as_optional()
            if not optional.has_value():  # the batches ended: the steps so far are returned
                break
            batch = optional.get_value()
            arrays = [a.write(index, v) for a, v in zip(arrays, step_values(batch), strict=True)]
            more = batch_parts(batch)
            inputs = [a.write(index, part) for a, part in zip(inputs, more, strict=True)]
            rows = [a.write(index, tf.shape(part)[0]) for a, part in zip(rows, more, strict=True)]
            done = index + 1
        return (
            done,
            [a.stack() for a in arrays],
            [a.concat() for a in inputs],
            [a.stack() for a in rows],
        )


def _split_rows(whole: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """The concatenated parts of one batch array back as one part per (step, replica)."""
    bounds = np.cumsum(sizes)[:-1]
    return np.split(whole, bounds) if len(sizes) else []
