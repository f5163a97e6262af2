"""`rewrite --batch-norm sync`: the batch norms of a converted Keras model compute their statistics
over the global batch (Keras `synchronized=True`) instead of each replica's own sub-batch.

Not a rule module (the leading underscore keeps the registry from loading it): TFM303 applies it
to the Keras plan of a converted model, in the tower script and in a model module it imports.
"""

from __future__ import annotations

import dataclasses

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from tfmigrate.rules._keras_model_emit import TF1_BATCH_NORM
from tfmigrate.rules._keras_model_plan import KerasPlan
from tfmigrate.syntax import walk

OPTION = "batch-norm"  # faithful (default) | sync
MODES = ("faithful", "sync")
# The constructors the Keras conversion writes for a batch norm.
_CONSTRUCTORS = ("TF1BatchNorm", "keras.layers.BatchNormalization")
_SYNCHRONIZED = "synchronized=True"

# Manifest and program comment: what the migrated step does with the statistics.
STATISTICS = (
    "under MirroredStrategy with rewrite --batch-norm sync, every batch-norm layer normalizes "
    "with the statistics of the GLOBAL batch (synchronized=True: each replica's sums are "
    "all-reduced, cross-replica statistics) and updates its moving statistics from them, the "
    "same on every replica (the copies stay equal): moving_mean/moving_variance differ from the "
    "legacy values"
)
# Announced for everything: each legacy tower normalized its own sub-batch, so the forward pass
# itself changed -- the losses and the weights move away from the legacy run's by design.
FORWARD = (
    "rewrite --batch-norm sync: batch norm now normalizes with cross-replica statistics "
    "(synchronized=True) where each legacy tower used its own sub-batch's, so the training "
    "losses and the weights differ from the legacy run's by design; verify measures by how much"
)

# With synchronized=True TF1BatchNorm leaves the fused kernel (it sees one replica's sub-batch) for
# statistics of its own over every replica's sub-batch, and counts the global batch for the
# unbiased variance (n/(n-1) of the global batch, as one TF1 device given the whole batch would).
_LOCAL_MOMENTS = "            mean, variance = tf.nn.moments(inputs, axes)\n"
_SYNC_MOMENTS = (
    "            mean, variance = keras.ops.moments(inputs, axes, synchronized=self.synchronized)\n"
)
_LOCAL_COUNT = "                count = tf.cast(tf.size(inputs) // tf.size(mean), inputs.dtype)\n"
_SYNC_COUNT = _LOCAL_COUNT + (
    "                if self.synchronized:  # the global batch: every replica's sub-batch\n"
    '                    count = tf.distribute.get_replica_context().all_reduce("sum", count)\n'
)


def mode(options: dict[str, object]) -> str:
    return str(options.get(OPTION, "faithful"))


def synchronized_plan(plan: KerasPlan) -> KerasPlan:
    """``plan`` with ``synchronized=True`` on every batch norm its model class builds."""
    source = _synchronized_source(plan.model.source)
    if source == plan.model.source:
        return plan
    return dataclasses.replace(plan, model=dataclasses.replace(plan.model, source=source))


def is_synchronized(source: str) -> bool:
    return _SYNCHRONIZED in source


def tf1_batch_norm_class(model_source: str) -> str:
    """The TF1BatchNorm class text a model class needs: the cross-replica one when one of its
    batch norms is synchronized."""
    if not is_synchronized(model_source):
        return TF1_BATCH_NORM
    if TF1_BATCH_NORM.count(_LOCAL_MOMENTS) != 1 or TF1_BATCH_NORM.count(_LOCAL_COUNT) != 1:
        raise ValueError("TF1BatchNorm changed: its cross-replica variant needs updating")
    return TF1_BATCH_NORM.replace(_LOCAL_MOMENTS, _SYNC_MOMENTS).replace(_LOCAL_COUNT, _SYNC_COUNT)


def _synchronized_source(source: str, width: int = 100) -> str:
    """Each ``self.x = <batch norm>(..., name=...)`` statement of ``source`` with
    ``synchronized=True`` before its name, laid out as the conversion lays out its layers."""
    wrapper = MetadataWrapper(cst.parse_module(source))
    module = wrapper.module
    positions = wrapper.resolve(PositionProvider)
    unit = module.default_indent
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for node in walk(module):
        if not (isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1):
            continue
        assign = node.body[0]
        call = assign.value if isinstance(assign, cst.Assign) else None
        if not (
            isinstance(assign, cst.Assign)
            and isinstance(call, cst.Call)
            and module.code_for_node(call.func) in _CONSTRUCTORS
            and not any(
                a.keyword is not None and a.keyword.value == "synchronized" for a in call.args
            )
        ):
            continue
        args = [
            module.code_for_node(a.with_changes(comma=cst.MaybeSentinel.DEFAULT)) for a in call.args
        ]
        named = [i for i, a in enumerate(call.args) if a.keyword and a.keyword.value == "name"]
        args.insert(named[0] if named else len(args), _SYNCHRONIZED)
        head = (
            f"{module.code_for_node(assign.targets[0].target)} = {module.code_for_node(call.func)}("
        )
        where = positions[node]
        first = lines[where.start.line - 1]
        indent = first[: len(first) - len(first.lstrip())]
        edits.append((where.start.line, where.end.line, _layout(indent, head, args, unit, width)))
    for start, end, text in sorted(edits, reverse=True):
        lines[start - 1 : end] = [text]
    return "".join(lines)


def _layout(indent: str, head: str, args: list[str], unit: str, width: int) -> str:
    """``head(args)`` on one line if it fits, else the arguments on the next lines, indented."""
    one = f"{indent}{head}{', '.join(args)})"
    if len(one) <= width:
        return one + "\n"
    inner = indent + unit
    rows, row = [], ""
    for arg in args:
        candidate = f"{row}, {arg}" if row else arg
        if row and len(inner) + len(candidate) + 2 > width:
            rows.append(row + ",")
            row = arg
        else:
            row = candidate
    rows.append(row + ")")
    return f"{indent}{head}\n" + "".join(f"{inner}{r}\n" for r in rows)
