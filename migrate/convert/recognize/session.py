"""How the graph is run: ``tf.Session``, ``Supervisor`` or ``MonitoredTrainingSession``, and
the ``run`` calls that fetch the update (the step)."""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from tfmigrate import tree
from tfmigrate.convert import ir
from tfmigrate.convert.project import Project
from tfmigrate.convert.recognize._code import (
    Code,
    assigned_names,
    body_nodes,
    call_name,
    callee,
    calls_in,
    keyword,
)
from tfmigrate.rules._towers import identifiers, method_name

_SESSIONS = {
    "tensorflow.Session": ir.SessionKind.SESSION,
    "tensorflow.InteractiveSession": ir.SessionKind.SESSION,
    "tensorflow.train.Supervisor": ir.SessionKind.SUPERVISOR,
    "tensorflow.train.MonitoredTrainingSession": ir.SessionKind.MONITORED,
    "tensorflow.train.MonitoredSession": ir.SessionKind.MONITORED,
    "tensorflow.train.SingularMonitoredSession": ir.SessionKind.MONITORED,
    "tensorflow.estimator.Estimator": ir.SessionKind.ESTIMATOR,
    "tensorflow.contrib.tpu.TPUEstimator": ir.SessionKind.ESTIMATOR,
}
_GROUPS = frozenset({"tensorflow.group", "tensorflow.tuple", "tensorflow.identity"})


_CARRIERS = (cst.Name, cst.Attribute, cst.IfExp, cst.List, cst.Tuple, cst.Dict, cst.BinaryOperation)


def _groups(name: str | None) -> bool:
    """Calls whose result runs their inputs: ``tf.group``, ``with_dependencies``."""
    return name is not None and (name in _GROUPS or name.endswith(".with_dependencies"))


def find_session(
    project: Project,
    region: list[Code],
    update_names: set[str],
    seeds: list[cst.Call],
    updaters: Sequence[Code] = (),
) -> ir.Session | None:
    """The first session construction in ``region`` and the ``run`` calls whose fetches hold
    an update (``update_names``, widened through ``tf.group``/``control_dependencies``)."""
    names = _widened(project, region, update_names, seeds, list(updaters))
    session: tuple[ir.SessionKind, ir.Where] | None = None
    steps: list[ir.Fetch] = []
    loop: ir.Loop | None = None
    for code in region:
        for node in body_nodes(code):
            if not isinstance(node, cst.Call):
                continue
            kind = _SESSIONS.get(call_name(code.source, node) or "")
            if kind is not None and session is None:
                session = (kind, code.source.where(node))
            elif (call_name(code.source, node) or "").endswith("EstimatorSpec"):
                # A model_fn's step is the train_op it hands the Estimator.
                train_op = keyword(node, "train_op")
                if train_op is not None and identifiers(train_op) & names:
                    steps.append(ir.Fetch(code.source.where(node), code.source.src(train_op, 80)))
            elif method_name(node) == "run" and node.args:
                fetched = node.args[0].value
                if identifiers(fetched) & names or any(
                    id(n) in {id(c) for c in seeds} for n in tree.walk(fetched)
                ):
                    steps.append(ir.Fetch(code.source.where(node), code.source.src(fetched, 80)))
                    loop = loop or _loop_of(code, node)
    if session is None:
        return None
    return ir.Session(session[0], session[1], tuple(dict.fromkeys(steps)), loop)


def _loop_of(code: Code, run: cst.Call) -> ir.Loop | None:
    """The innermost loop around a step run, in its function."""
    for ancestor in code.source.ancestors(run):
        if isinstance(ancestor, cst.FunctionDef):
            return None
        if isinstance(ancestor, cst.For):
            header = f"for {code.source.src(ancestor.target, 30)} in {code.source.src(ancestor.iter, 50)}"
            return ir.Loop(code.source.where(ancestor), header)
        if isinstance(ancestor, cst.While):
            return ir.Loop(
                code.source.where(ancestor), f"while {code.source.src(ancestor.test, 60)}"
            )
    return None


def _widened(
    project: Project,
    region: list[Code],
    names: set[str],
    seeds: list[cst.Call],
    updaters: list[Code],
) -> set[str]:
    """Names that run the update too: ``train_op = tf.group(apply_op, ema_op)``, ``with
    control_dependencies([apply_op]): train_op = ...``, ``train_op = apply_op if training
    else []``, ``train_ops.append(apply_op)``, and what callers call a function's returned
    update (``train_ops, ... = model.build_train_ops()``). ``seeds`` are the update calls,
    ``updaters`` hand-written update functions whose result is the update."""
    found = set(names)
    seed_ids = {id(call) for call in seeds}

    def runs_update(node: cst.CSTNode) -> bool:
        if identifiers(node) & found:
            return True
        return bool(seed_ids) and any(id(n) in seed_ids for n in tree.walk(node))

    returning: list[Code] = list(updaters)
    for _ in range(6):
        before = (len(found), len(seed_ids), len(returning))
        for code in region:
            source = code.source
            for node in body_nodes(code):
                if isinstance(node, cst.Assign):
                    # Renamed or selected (`op = apply_op if training else []`), or grouped;
                    # other calls on the update (`sess.run(op)`, `f(op)`) compute something else.
                    value = node.value
                    carried = isinstance(value, _CARRIERS) or (
                        isinstance(value, cst.Call) and _groups(call_name(source, value))
                    )
                    if carried and runs_update(value):
                        found |= assigned_names(source, node) - {"self"}
                elif isinstance(node, cst.With) and runs_update(node.items[0].item):
                    for inner in tree.walk(node.body):
                        if isinstance(inner, cst.Assign):
                            found |= assigned_names(source, inner) - {"self"}
                elif isinstance(node, cst.Call) and method_name(node) in ("append", "extend"):
                    if node.args and isinstance(node.func, cst.Attribute):
                        if runs_update(node.args[0].value):
                            found |= identifiers(node.func.value) - {"self"}
                elif isinstance(node, cst.Return) and node.value is not None:
                    if isinstance(code.node, cst.FunctionDef) and runs_update(node.value):
                        if code not in returning:
                            returning.append(code)
        # Callers of a function that returns the update bind it (or append it) in turn.
        for code in region:
            for call in calls_in(code):
                target = callee(project, code, call)
                if target is None or not any(target.node is r.node for r in returning):
                    continue
                found |= assigned_names(code.source, call) - {"self"}
                seed_ids.add(id(call))
        if (len(found), len(seed_ids), len(returning)) == before:
            break
    return found
