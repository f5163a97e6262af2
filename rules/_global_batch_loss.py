"""`global_batch_loss(loss)`: a Keras loss computed once on the global batch under a strategy.

Emitted into a program by TFM207 (a whole-batch loss given to `fit` under a strategy) and by
TFM107 (a `multi_gpu_model` program, whose loss was computed on the concatenated batch). Each
replica gathers every replica's `y_true`/`y_pred` (`ReplicaContext.all_gather`, whose gradient
sums the replicas' output gradients and keeps this replica's rows) and evaluates the loss on
the whole batch. A scalar is divided by the replica count, because Keras returns a scalar loss
untouched and the strategy sums the replicas' gradients; a per-sample result keeps this
replica's rows, which Keras averages over the global batch as it does for any per-sample loss.
The summed gradient is then the one-device gradient of the loss on the whole batch.
"""

from __future__ import annotations

from typing import cast

import libcst as cst

HELPER = "global_batch_loss"
MARK = "(TFM207)"  # in the helper's docstring: a definition tfmigrate wrote

# `{tf}`: the module's own name for tensorflow (no import inside: the name resolver would take
# a nested import for a module-level one).
TEMPLATE = f'''
def {HELPER}(loss):
    """`loss` computed on the global batch under a tf.distribute strategy {MARK}.

    Each replica gathers all replicas' targets and predictions, so the strategy's summed
    gradient is the gradient of the loss on the whole batch, as on one device."""

    def on_global_batch(y_true, y_pred):
        context = {{tf}}.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return loss(y_true, y_pred)
        value = loss(context.all_gather(y_true, axis=0), context.all_gather(y_pred, axis=0))
        if value.shape.rank == 0:
            # Keras keeps a scalar loss as it is and the strategy sums the replicas' gradients
            return value / context.num_replicas_in_sync
        # one loss per sample of the global batch: this replica's rows, averaged by Keras
        sizes = context.all_gather({{tf}}.shape(y_pred)[:1], axis=0)
        replica = context.replica_id_in_sync_group
        start = {{tf}}.reduce_sum(sizes[:replica])
        return value[start : start + sizes[replica]]

    on_global_batch.__name__ = getattr(loss, "__name__", type(loss).__name__)
    return on_global_batch
'''


def source(tf: str = "tf") -> str:
    """The helper's code, with ``tf`` as the name of the tensorflow module."""
    return TEMPLATE.replace("{tf}", tf)


def helper_definition(tf: str) -> cst.FunctionDef:
    statement = cst.parse_module(source(tf).lstrip("\n")).body[0]
    assert isinstance(statement, cst.FunctionDef)
    return statement


def defines_helper(module: cst.Module) -> bool:
    """Whether the module already has the helper (a second rewrite adds nothing)."""
    return any(isinstance(s, cst.FunctionDef) and s.name.value == HELPER for s in module.body)


def wrapped(loss: cst.BaseExpression) -> cst.Call:
    """``global_batch_loss(<loss>)``."""
    return cst.Call(func=cst.Name(HELPER), args=[cst.Arg(loss)])


def is_wrapped(node: cst.BaseExpression) -> bool:
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Name)
        and (node.func.value == HELPER)
    )


def insert_helper(body: list[cst.BaseStatement], before: int, tf: str) -> list[cst.BaseStatement]:
    """``body`` with the helper definition (two blank lines around it) at index ``before``."""
    helper = helper_definition(tf).with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    following = body[before:]
    if following:
        # every statement kind has leading_lines; libcst's BaseStatement does not declare them
        first = cast("cst.SimpleStatementLine | cst.BaseCompoundStatement", following[0])
        lead = list(first.leading_lines)
        while lead and lead[0].comment is None:
            lead.pop(0)
        following = [
            following[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(), *lead]),
            *following[1:],
        ]
    return [*body[:before], helper, *following]


def first_code_index(module: cst.Module) -> int:
    """Where module-level code starts: after the docstring, imports and `__future__`."""
    for index, statement in enumerate(module.body):
        if isinstance(statement, cst.SimpleStatementLine) and all(
            isinstance(s, cst.Import | cst.ImportFrom)
            or (isinstance(s, cst.Expr) and isinstance(s.value, cst.SimpleString))
            for s in statement.body
        ):
            continue
        return index
    return len(module.body)
