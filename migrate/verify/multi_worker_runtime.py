"""The migrated side as one worker of a MultiWorkerMirroredStrategy cluster (runs in the worker).

Imported by migrated_boot (``--strategy multi-worker``) after TensorFlow: the cluster comes from
``TF_CONFIG``, set by workers.py. Every worker runs the same steps; collectives keep them in lock
step. A worker only holds its own replicas' values, so each step's per-replica fetches and input
slices are gathered from all workers (collectives too: every worker calls them in the same order)
and every worker's record describes the whole cluster, in global replica order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tfmigrate.verify import fingerprint
from tfmigrate.verify.migrated_boot import MigratedRunner, is_distributed
from tfmigrate.verify.record import Fetch


def make_strategy(tf: Any, device: str) -> tuple[Any, list[str]]:
    """The cluster's strategy. Without GPUs a worker has exactly one CPU device (one replica)."""
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    return strategy, [str(d) for d in strategy.extended.worker_devices]


class WorkerRunner(MigratedRunner):
    """Records like MigratedRunner, with per-replica values gathered from every worker."""

    def __init__(self, tf: Any, strategy: Any, program: dict[str, Any], out: Any) -> None:
        super().__init__(tf, strategy, program, out)
        self.local_replicas = len(strategy.extended.worker_devices)
        self.record.notes.append(
            f"multi-worker: {strategy.num_replicas_in_sync} replicas over "
            f"{strategy.num_replicas_in_sync // self.local_replicas} workers; per-step times include "
            "gathering the replicas' fetches and inputs from every worker"
        )

    def replica_values(self, value: Any) -> list[np.ndarray]:
        tf, strategy = self.tf, self.strategy
        local = super().replica_values(value)
        if local[0].ndim == 0:
            # gather wants an axis: each replica contributes a [1] vector
            ones = strategy.run(lambda v: tf.reshape(v, [1]), args=(value,))
            return list(np.asarray(strategy.gather(ones, axis=0)))
        rows = np.asarray(
            strategy.gather(strategy.run(lambda v: tf.shape(v)[:1], args=(value,)), axis=0)
        )
        whole = np.asarray(strategy.gather(value, axis=0))
        return np.split(whole, np.cumsum(rows)[:-1])

    def is_per_replica(self, value: Any) -> bool:
        # With one replica per worker, strategy.run returns (and a distributed dataset yields) plain
        # tensors, not PerReplica values: treat every value as this worker's replica's.
        return self.local_replicas == 1 or is_distributed(self.tf, value)

    def fetches(self, out: Any, per_replica: list[str] | None = None) -> list[Fetch]:
        if not hasattr(out, "items") or per_replica is not None:  # verify's loop: numpy parts
            return super().fetches(out, per_replica)
        result = []
        for (
            key,
            value,
        ) in out.items():  # the same order on every worker: the gathers are collectives
            if not self.is_per_replica(value):
                result += super().fetches({key: value})
                continue
            if super().replica_values(value)[0].size != 1:
                continue  # non-scalars are not compared
            values = [float(v.reshape(())) for v in self.replica_values(value)]
            result += [
                Fetch(name=f"{key}[{i}]", base=key, tower=i, value=v) for i, v in enumerate(values)
            ]
            if not is_distributed(self.tf, value) and len(set(values)) == 1:
                # equal on every replica it may also have been a reduction (strategy.reduce):
                # recorded both ways, with the same numbers
                result.append(Fetch(name=key, base=key, tower=None, value=values[0]))
        return result

    def fingerprint(self, batch: Any) -> tuple[list[str] | None, int | None]:
        streams = []
        for leaf in self.tf.nest.flatten(batch):
            parts = self.replica_values(leaf) if self.is_per_replica(leaf) else [np.asarray(leaf)]
            if parts and all(fingerprint.is_data(p) for p in parts):
                streams.append(parts)
        if not streams:
            return None, None
        return fingerprint.step_fingerprint(streams), fingerprint.step_samples(streams)
