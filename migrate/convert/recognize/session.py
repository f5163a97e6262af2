"""How the graph is run: ``tf.Session``, ``Supervisor`` or ``MonitoredTrainingSession``, and
the ``run`` calls that fetch the update (the step)."""

from __future__ import annotations

import libcst as cst

from tfmigrate import tree
from tfmigrate.convert import ir
from tfmigrate.convert.recognize._code import Code, assigned_names, body_nodes, call_name
from tfmigrate.rules._towers import identifiers, method_name

_SESSIONS = {
    "tensorflow.Session": ir.SessionKind.SESSION,
    "tensorflow.InteractiveSession": ir.SessionKind.SESSION,
    "tensorflow.train.Supervisor": ir.SessionKind.SUPERVISOR,
    "tensorflow.train.MonitoredTrainingSession": ir.SessionKind.MONITORED,
    "tensorflow.train.MonitoredSession": ir.SessionKind.MONITORED,
    "tensorflow.train.SingularMonitoredSession": ir.SessionKind.MONITORED,
}
_GROUPS = frozenset({"tensorflow.group", "tensorflow.tuple", "tensorflow.identity"})


def _groups(name: str | None) -> bool:
    """Calls whose result runs their inputs: ``tf.group``, ``with_dependencies``."""
    return name is not None and (name in _GROUPS or name.endswith(".with_dependencies"))


def find_session(region: list[Code], update_names: set[str]) -> ir.Session | None:
    """The first session construction in ``region`` and the ``run`` calls whose fetches hold
    an update (``update_names``, widened through ``tf.group``/``control_dependencies``)."""
    names = _widened(region, update_names)
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
            elif method_name(node) == "run" and node.args:
                fetched = node.args[0].value
                if identifiers(fetched) & names:
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


def _widened(region: list[Code], names: set[str]) -> set[str]:
    """``train_op = tf.group(apply_op, ema_op)``, ``with control_dependencies([apply_op]):
    train_op = tf.no_op()``: names that run the update too."""
    found = set(names)
    for _ in range(3):
        grown = False
        for code in region:
            for node in body_nodes(code):
                if isinstance(node, cst.Call) and _groups(call_name(code.source, node)):
                    if identifiers(node) & found:
                        new = assigned_names(code.source, node) - found
                        if new:
                            found |= new
                            grown = True
                elif isinstance(node, cst.With) and identifiers(node.items[0].item) & found:
                    for inner in tree.walk(node.body):
                        if isinstance(inner, cst.Assign):
                            new = assigned_names(code.source, inner) - found
                            if new:
                                found |= new
                                grown = True
        if not grown:
            break
    return found
