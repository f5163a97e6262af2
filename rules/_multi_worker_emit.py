"""TFM303 with ``strategy = "multi-worker"``: turn the generated MirroredStrategy program into a
MultiWorkerMirroredStrategy one (not a rule module: the leading underscore keeps the registry
from loading it).

What changes is small because the generated program builds everything under the one strategy it
makes and divides each replica's loss by ``num_replicas_in_sync``, which under
MultiWorkerMirroredStrategy counts the replicas of every worker:

- ``main`` builds ``tf.distribute.MultiWorkerMirroredStrategy()``: the cluster comes from
  ``TF_CONFIG``;
- the input: every worker builds the same global batches; ``experimental_distribute_dataset``
  cuts each into per-replica slices and, with
  ``AutoShardPolicy.DATA``, each worker keeps its own replicas' slices, so global replica r
  trains on legacy tower r's rows (what AUTO falls back to for a generator dataset anyway, said
  explicitly);
- checkpoints: every worker saves (saving may need collectives), the chief into the real
  folder, the others into temporary folders they delete; every worker resumes from the chief's.
"""

from __future__ import annotations

import libcst as cst

from tfmigrate.names import dotted

OPTION = "strategy"
MULTI_WORKER = "multi-worker"
CHOICES = ("mirrored", MULTI_WORKER)

_SHARDING = '''
def split_over_workers(dataset):
    """Each worker keeps its own replicas' slices of every global batch (replica r: tower r)."""
    # Every worker reads the whole input; experimental_distribute_dataset cuts each global
    # batch into per-replica slices, and DATA sharding hands each worker its replicas' ones.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)
'''

_CHECKPOINTS = '''
def is_chief(strategy):
    """The chief writes the real checkpoints: the "chief" task, else worker 0."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:  # one machine
        return True
    if resolver.task_type == "chief":
        return True
    return (resolver.task_type == "worker" and resolver.task_id == 0
            and "chief" not in resolver.cluster_spec().jobs)


class WorkerCheckpoints:
    """tf.train.CheckpointManager for a cluster: every worker resumes from the chief's."""

    # Every worker saves (saving may need collectives): the chief into `directory`, the others
    # into temporary folders they delete again.

    def __init__(self, strategy, checkpoint, directory, **kwargs):
        self.checkpoint = checkpoint
        self.directory = directory
        self.chief = is_chief(strategy)
        folder = directory
        if not self.chief:
            folder = "%s/worker_tmp_%d" % (directory, strategy.cluster_resolver.task_id)
        self.manager = tf.train.CheckpointManager(checkpoint, folder, **kwargs)

    def restore_or_initialize(self):
        latest = tf.train.latest_checkpoint(self.directory)
        if latest:
            self.checkpoint.restore(latest)
        return latest

    def save(self, *args, **kwargs):
        path = self.manager.save(*args, **kwargs)
        if not self.chief:
            tf.io.gfile.rmtree(self.manager.directory)
        return path
'''

NOTES = (
    "TFM303: --strategy multi-worker: main() builds a MultiWorkerMirroredStrategy whose cluster "
    "comes from TF_CONFIG (one process per machine, every machine runs the same script; "
    "without GPUs each worker has one CPU replica)",
    "TFM303: every worker builds the same global batches; experimental_distribute_dataset cuts "
    "each into per-replica slices and each worker keeps its own replicas' (AutoShardPolicy.DATA), "
    "so global replica r trains on legacy tower r's rows",
    "TFM303: num_replicas_in_sync counts the replicas of every worker: the loss scaling and "
    "global batch are the cluster's",
)
CHECKPOINT_NOTE = (
    "TFM303: checkpoints under several workers: every worker saves, the chief into the "
    "checkpoint folder, the others into temporary folders they delete (WorkerCheckpoints); "
    "every worker resumes from the chief's latest checkpoint"
)


class _ToMultiWorker(cst.CSTTransformer):
    def __init__(self) -> None:
        super().__init__()
        self.distributed = self.checkpoints = False

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name = dotted(updated.func) or ""
        if name.endswith("distribute.MirroredStrategy") and not updated.args:
            attr = updated.func
            assert isinstance(attr, cst.Attribute)
            return updated.with_changes(
                func=attr.with_changes(attr=cst.Name("MultiWorkerMirroredStrategy"))
            )
        if name.endswith(".experimental_distribute_dataset") and len(updated.args) == 1:
            self.distributed = True
            wrapped = cst.Call(cst.Name("split_over_workers"), [updated.args[0]])
            return updated.with_changes(args=[updated.args[0].with_changes(value=wrapped)])
        if name.endswith("train.CheckpointManager"):
            self.checkpoints = True
            strategy = cst.Arg(cst.Name("strategy"))
            return cst.Call(cst.Name("WorkerCheckpoints"), [strategy, *updated.args])
        return updated


def to_multi_worker(
    generated: cst.Module, training: str | None = None
) -> tuple[cst.Module, list[str]]:
    """The generated program for MultiWorkerMirroredStrategy, and the manifest notes saying so.
    The helpers go right before the function named `training` (else first)."""
    transformer = _ToMultiWorker()
    module = generated.visit(transformer)
    helpers = (_SHARDING if transformer.distributed else "") + (
        _CHECKPOINTS if transformer.checkpoints else ""
    )
    body = list(module.body)
    if helpers:
        # right before the training function: after the emitted store class, before its user
        at = next(
            (
                i
                for i, s in enumerate(body)
                if isinstance(s, cst.FunctionDef) and s.name.value == training
            ),
            0,
        )
        two_lines = [cst.EmptyLine(), cst.EmptyLine()]
        parsed = [s.with_changes(leading_lines=two_lines) for s in cst.parse_module(helpers).body]
        body[at:at] = parsed
        if at < len(body) - len(parsed):
            body[at + len(parsed)] = body[at + len(parsed)].with_changes(leading_lines=two_lines)
    notes = list(NOTES) + ([CHECKPOINT_NOTE] if transformer.checkpoints else [])
    return module.with_changes(body=body), notes
