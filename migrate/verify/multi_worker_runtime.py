"""The migrated side as one worker of a MultiWorkerMirroredStrategy cluster (runs in the worker).

Imported by migrated_boot (``--strategy multi-worker``) after TensorFlow: the cluster comes from
``TF_CONFIG``, set by workers.py. Every worker runs the same steps; collectives keep them in lock
step. A worker only holds its own replicas' values, so each step's per-replica fetches and input
slices are gathered from all workers (collectives too: every worker calls them in the same order)
and every worker's record describes the whole cluster, in global replica order (WorkerAsWritten: the
program run as written as one worker).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tfmigrate.verify.as_written import SOURCE_RETURNED, AsWritten, _flat_names
from tfmigrate.verify.record import Fetch


class WorkerAsWritten(AsWritten):
    """A program run as written (as_written.py) as one worker of the cluster in ``TF_CONFIG``.

    Every ``tf.distribute.MultiWorkerMirroredStrategy`` the program creates gets the cluster of
    ``TF_CONFIG`` and the default communication; a
    ``MirroredStrategy`` is refused: it trains on one machine. After each step this worker's
    replicas' values (losses, returned and summary scalars, input slices) are gathered from every
    worker, in the same order on every worker (collectives), so the record describes the whole
    cluster in global replica order.
    """

    def install(self) -> None:
        super().install()
        from tensorflow.python.distribute import collective_all_reduce_strategy, mirrored_strategy

        me = self

        def mirrored_init(strategy: Any, *args: Any, **kwargs: Any) -> None:
            raise me.fail(
                "--workers: the program creates a tf.distribute.MirroredStrategy, which trains on "
                "one machine: it is not a multi-worker program (verify it without --workers, or "
                "create a tf.distribute.MultiWorkerMirroredStrategy)"
            )

        mirrored_strategy.MirroredStrategy.__init__ = mirrored_init
        cls = collective_all_reduce_strategy.CollectiveAllReduceStrategy
        orig = cls.__init__

        def multi_worker_init(
            strategy: Any, cluster_resolver: Any = None, communication_options: Any = None
        ) -> None:
            if cluster_resolver is not None:
                me.record.notes.append(
                    "the program's MultiWorkerMirroredStrategy named its own cluster resolver; "
                    "verify gave it the cluster of TF_CONFIG"
                )
            orig(strategy)
            me.strategies.append(strategy)
            me.record.notes.append(
                f"multi-worker: {strategy.num_replicas_in_sync} replicas over "
                f"{strategy.extended._num_workers} workers; per-step times include gathering the "
                "replicas' fetches and inputs from every worker"
            )

        cls.__init__ = multi_worker_init

    # -- gathering (collectives: every worker calls them in the same order) ---------------------
    @property
    def strategy(self) -> Any:
        if not self.strategies:
            raise self.fail(
                "--workers: the program created no tf.distribute.MultiWorkerMirroredStrategy"
            )
        return self.strategies[-1]

    @property
    def local_replicas(self) -> int:
        return len(self.strategy.extended.worker_devices)

    def gather(self, local: list[np.ndarray]) -> list[np.ndarray]:
        """One array per local replica (in local order) -> one per replica of the cluster."""
        tf, strategy = self.tf, self.strategy
        kind = local[0].dtype
        sendable = [p.astype(np.uint8) if kind == np.bool_ else p for p in local]

        def per_replica(arrays: list[np.ndarray]) -> Any:
            parts = iter(arrays)
            return strategy.experimental_distribute_values_from_function(
                lambda _ctx: tf.constant(next(parts))
            )

        self.calling += 1  # verify's own functions: not the program's steps
        try:
            rows = strategy.gather(per_replica([np.array([len(p)], np.int64) for p in sendable]), 0)
            whole = np.asarray(strategy.gather(per_replica(sendable), axis=0))
        finally:
            self.calling -= 1
        return [p.astype(kind) for p in np.split(whole, np.cumsum(np.asarray(rows))[:-1])]

    def gather_scalars(self, values: dict[tuple[Any, Any], float]) -> dict[tuple[Any, Any], float]:
        """{(key, local global-replica id): value} -> the same for every replica of the cluster;
        every replica holds the same keys."""
        if not values:
            return values
        replicas = sorted({r for _, r in values})
        keys = sorted({k for k, _ in values}, key=repr)
        local = [np.array([[values[k, r] for k in keys]], np.float64) for r in replicas]
        rows = self.gather(local)
        return {(k, r): float(row[0][j]) for r, row in enumerate(rows) for j, k in enumerate(keys)}

    def end_step(self, inputs: Any, returned: list[Fetch] | None, seconds: float) -> None:
        self.targets = self.gather_scalars(self.targets)
        reduced = {k: v for k, v in self.summaries.items() if k[1] is None}
        mine = {(name, r): v for (name, r), v in self.summaries.items() if r is not None}
        self.summaries = {**reduced, **self.gather_scalars(mine)}
        super().end_step(inputs, returned, seconds)

    def _returned(self, result: Any) -> list[Fetch]:
        tf = self.tf
        one = self.local_replicas == 1
        scalars: list[tuple[str, bool, list[float]]] = []  # name, a reduction?, local values
        for name, leaf in _flat_names(result, tf):
            distributed = isinstance(leaf, tf.distribute.DistributedValues)
            try:
                parts = [np.asarray(p) for p in leaf.values] if distributed else [np.asarray(leaf)]
            except Exception:  # noqa: BLE001  not a value (an op, a dataset)
                continue
            if parts[0].size == 1 and parts[0].dtype.kind in "fiub":
                scalars.append((name, not distributed, [float(p.reshape(())) for p in parts]))
        fetches = [
            Fetch(n, n, None, vs[0], source=SOURCE_RETURNED)
            for n, reduced, vs in scalars
            if reduced and not one
        ]
        # with one replica per worker strategy.run returns plain tensors: this replica's values
        spread = [(n, reduced, vs) for n, reduced, vs in scalars if one or not reduced]
        if not spread:
            return fetches
        rows = self.gather(
            [np.array([vs[i] for _, _, vs in spread], np.float64) for i in range(len(spread[0][2]))]
        )
        for j, (name, reduced, _) in enumerate(spread):
            values = [float(row[j]) for row in rows]
            fetches += [
                Fetch(f"{name}[{i}]", name, i, v, source=SOURCE_RETURNED)
                for i, v in enumerate(values)
            ]
            if reduced and len(set(values)) == 1:
                # equal on every replica it may also have been a reduction: recorded both ways
                fetches.append(Fetch(name, name, None, values[0], source=SOURCE_RETURNED))
        return fetches

    def _data_leaves(self, inputs: Any) -> list[tuple[str, list[np.ndarray]]]:
        return [(path, self.gather(parts)) for path, parts in super()._data_leaves(inputs)]
