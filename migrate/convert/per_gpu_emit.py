"""Writing the per-GPU placeholder lists (``per_gpu``): the feed built tower by tower becomes
a list per placeholder list, which the train step is given as a distributed value (replica i
gets what tower i was fed: ``strategy.experimental_distribute_values_from_function``); the
replica function takes its own value as an argument, where the tower read its placeholder."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import libcst as cst

from tfmigrate.convert.per_gpu import written

if TYPE_CHECKING:
    from tfmigrate.convert.plan import Plan


def feed_lists(
    statement: cst.SimpleStatementLine, names: Sequence[str]
) -> cst.SimpleStatementLine:
    """``feed = {is_training: True}`` -> ``points_phs, labels_phs = [], []``: the lists the
    loop over the GPUs fills (the dict's other values go to the train step's call)."""
    if len(names) == 1:
        target: cst.BaseAssignTargetExpression = cst.Name(names[0])
        value: cst.BaseExpression = cst.List([])
    else:
        target = cst.Tuple([cst.Element(cst.Name(n)) for n in names], lpar=[], rpar=[])
        value = cst.Tuple([cst.Element(cst.List([])) for _ in names], lpar=[], rpar=[])
    return statement.with_changes(body=[cst.Assign([cst.AssignTarget(target)], value)])


def feed_append(statement: cst.SimpleStatementLine, name: str) -> cst.SimpleStatementLine:
    """``feed[points_phs[i]] = value`` -> ``points_phs.append(value)``."""
    small = statement.body[0]
    assert isinstance(small, cst.Assign)
    call = cst.Call(cst.Attribute(cst.Name(name), cst.Name("append")), [cst.Arg(small.value)])
    return statement.with_changes(body=[cst.Expr(call)])


def distributed(plan: Plan, param: str, value: cst.BaseExpression) -> cst.BaseExpression:
    """The train step's argument for ``param``: a per-GPU list's values in tower order, given
    to the replicas one each."""
    if param not in plan.per_gpu.values():
        return value
    return cst.Call(cst.Name(plan.per_replica), [cst.Arg(value)])


def per_replica_helper(plan: Plan) -> list[cst.BaseStatement]:
    """``per_replica(values)``: a distributed value giving replica i ``values[i]``."""
    if not plan.per_gpu:
        return []
    helper = cst.parse_statement(
        f"def {plan.per_replica}(values):\n"
        '    """Replica i\'s value: what tower i was fed (``values`` in tower order)."""\n'
        "    return strategy.experimental_distribute_values_from_function(\n"
        "        lambda context: values[context.replica_id_in_sync_group])\n"
    )
    return [helper.with_changes(leading_lines=[cst.EmptyLine(indent=False)])]


def replica_params(plan: Plan) -> cst.Parameters:
    """The replica function's parameters: its own value of each per-GPU list."""
    return cst.Parameters(params=[cst.Param(cst.Name(plan.per_gpu_locals[p])) for p in _params(plan)])


def run_replicas(plan: Plan) -> str:
    """``strategy.run(replica_step)``, with the per-GPU lists as its arguments."""
    params = _params(plan)
    if not params:
        return "strategy.run(replica_step)"
    listed = ", ".join(params) + ("," if len(params) == 1 else "")
    return f"strategy.run(replica_step, args=({listed}))"


def _params(plan: Plan) -> list[str]:
    return [p for p in plan.inputs if p in plan.per_gpu_locals]


def replica_inputs(plan: Plan) -> list[cst.BaseStatement]:
    """The replica's first lines for its per-GPU values: each as its placeholder's dtype (the
    session converted what it was fed), and the (indices, values, shape) fed to a
    ``tf.SparseTensor`` of placeholders as that SparseTensor."""
    lines: list[cst.BaseStatement] = []
    for param in _params(plan):
        local = plan.per_gpu_locals[param]
        dtypes = plan.per_gpu_dtypes.get(param, ())
        if param in plan.per_gpu_sparse and len(dtypes) == 3:
            code = (
                f"{local} = tf.SparseTensor(tf.cast({local}[0], {dtypes[0]}), "
                f"tf.cast({local}[1], {dtypes[1]}), tf.cast({local}[2], {dtypes[2]}))"
            )
        elif param in plan.per_gpu_sparse:
            code = f"{local} = tf.SparseTensor(*{local})"
        elif dtypes:
            code = f"{local} = tf.cast({local}, {dtypes[0]})"
        else:
            continue
        lines.append(cst.parse_statement(code))
    if lines:
        comment = cst.EmptyLine(
            comment=cst.Comment(
                "# This tower's values as its placeholders took them (the session converted "
                "what it was fed)."
            )
        )
        lines[0] = lines[0].with_changes(leading_lines=[comment])
    return lines


def tower_read(
    plan: Plan, original: cst.Subscript, updated: cst.Subscript
) -> cst.BaseExpression:
    """A tower's read of its placeholder in a per-GPU list (``points_phs[-1]`` just after the
    append, ``points_phs[i]``, ``model.inputs_pl_list[i]``): the replica's own value."""
    if not plan.per_gpu or len(original.slice) != 1:
        return updated
    listed = written(original.value)
    if listed is None or listed not in plan.per_gpu:
        return updated
    return cst.Name(plan.per_gpu_locals[plan.per_gpu[listed]])


def decorator(plan: Plan) -> str:
    """``tf.function``; with ``reduce_retracing`` when a per-GPU input changes shape from step
    to step (a placeholder with ``None`` in its shape, sparse values): TF1 fed any shape its
    placeholder allowed into one graph, a tf.function would trace each new shape again."""
    return "tf.function(reduce_retracing=True)" if plan.per_gpu_dynamic else "tf.function"
