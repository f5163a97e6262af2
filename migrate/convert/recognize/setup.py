"""What runs once around the training loop: variable initializers, a restore at start, savers,
summary writers, queue runners, iterator initializers, Horovod's broadcast and session hooks."""

from __future__ import annotations

import libcst as cst

from tfmigrate.convert import ir
from tfmigrate.convert.recognize._code import Code, body_nodes, call_name
from tfmigrate.rules._towers import method_name

_CALLS = {
    "tensorflow.global_variables_initializer": ir.SetUpKind.INITIALIZER,
    "tensorflow.initialize_all_variables": ir.SetUpKind.INITIALIZER,
    "tensorflow.local_variables_initializer": ir.SetUpKind.INITIALIZER,
    "tensorflow.variables_initializer": ir.SetUpKind.INITIALIZER,
    "tensorflow.tables_initializer": ir.SetUpKind.INITIALIZER,
    "tensorflow.train.Saver": ir.SetUpKind.SAVER,
    "tensorflow.train.init_from_checkpoint": ir.SetUpKind.RESTORE,
    "tensorflow.summary.FileWriter": ir.SetUpKind.SUMMARIES,
    "tensorflow.train.SummaryWriter": ir.SetUpKind.SUMMARIES,
    "tensorflow.summary.merge_all": ir.SetUpKind.SUMMARIES,
    "tensorflow.merge_all_summaries": ir.SetUpKind.SUMMARIES,
    "tensorflow.train.start_queue_runners": ir.SetUpKind.QUEUE_RUNNERS,
    "tensorflow.train.StopAtStepHook": ir.SetUpKind.HOOKS,
    "tensorflow.train.LoggingTensorHook": ir.SetUpKind.HOOKS,
    "tensorflow.train.CheckpointSaverHook": ir.SetUpKind.HOOKS,
}
_HOROVOD = ("broadcast_global_variables", "BroadcastGlobalVariablesHook", "broadcast_variables")


def find_setup(region: list[Code]) -> tuple[ir.SetUp, ...]:
    """Each set-up part found in ``region``, once per kind and spelling, in region order."""
    found: dict[tuple[ir.SetUpKind, str], ir.SetUp] = {}
    for code in region:
        source = code.source
        for node in body_nodes(code):
            if not isinstance(node, cst.Call):
                continue
            kind = _kind(code, node)
            if kind is None:
                continue
            detail = source.src(node.func, 60)
            found.setdefault(
                (kind, detail), ir.SetUp(kind, source.where(node), source.src(node, 70))
            )
    return tuple(found.values())


def _kind(code: Code, call: cst.Call) -> ir.SetUpKind | None:
    name = call_name(code.source, call) or ""
    if name in _CALLS:
        return _CALLS[name]
    if name.startswith("horovod.") and name.endswith(_HOROVOD):
        return ir.SetUpKind.BROADCAST
    method = method_name(call)
    if method == "restore" and call.args:
        return ir.SetUpKind.RESTORE
    if method == "run" and call.args:
        fetched = call.args[0].value
        if isinstance(fetched, cst.Attribute) and fetched.attr.value == "initializer":
            return ir.SetUpKind.ITERATOR_INIT
    return None
