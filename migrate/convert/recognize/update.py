"""The update after the combination: ``apply_gradients``/``minimize`` of an optimizer (and where
that optimizer was built, through Horovod or loss-scaling wrappers), or a hand-written update
function that assigns to the variables."""

from __future__ import annotations

import libcst as cst

from tfmigrate import tree
from tfmigrate.convert import ir
from tfmigrate.convert.project import Project, SourceFile
from tfmigrate.convert.recognize._code import (
    Code,
    assigned_names,
    call_name,
    callee,
    callers_of,
    calls_in,
    class_methods,
    enclosing_code,
    mentions,
    reachable,
    returns_any,
    statement_of,
)
from tfmigrate.names import dotted
from tfmigrate.rules._towers import method_name

_APPLY = ("apply_gradients", "minimize")
_ASSIGNS = frozenset({"assign", "assign_sub", "assign_add", "scatter_sub", "scatter_update"})
# Wrappers whose first argument is the optimizer that does the update.
_WRAPPERS = (
    "DistributedOptimizer",
    "SyncReplicasOptimizer",
    "LossScaleOptimizer",
    "CrossShardOptimizer",
    "enable_mixed_precision_graph_rewrite",
)


def find_update(
    project: Project,
    files: list[SourceFile],
    holder: Code,
    after: cst.CSTNode,
    results: frozenset[str],
    own_call: cst.Call | None = None,
    depth: int = 0,
) -> ir.Update | str:
    """The update of the gradients called ``results`` computed at ``after`` in ``holder``;
    ``own_call`` is a ``minimize`` that already is the update. Gradients a tower builder
    returns are followed into its callers."""
    if own_call is not None and method_name(own_call) == "minimize":
        return _optimizer_update(project, holder, own_call, ir.UpdateKind.MINIMIZE)
    start = holder.source.line(statement_of(holder.source, after))
    roots = [holder, *class_methods(holder)]
    fallback: tuple[Code, cst.Call] | None = None
    for code in roots:
        same = code.node is holder.node
        for call in calls_in(code):
            if same and code.source.line(call) < start:
                continue
            if method_name(call) == "apply_gradients":
                if not results or any(mentions(a.value, set(results)) for a in call.args):
                    return _optimizer_update(project, code, call, ir.UpdateKind.APPLY_GRADIENTS)
                if fallback is None and same:
                    fallback = (code, call)
            elif results and any(mentions(a.value, set(results)) for a in call.args):
                written = _hand_written(project, code, call)
                if written is not None:
                    return written
    # Names change between the combination and the update (clipping): the next
    # apply_gradients in the same function.
    if fallback is not None:
        return _optimizer_update(project, fallback[0], fallback[1], ir.UpdateKind.APPLY_GRADIENTS)
    if depth < 2 and results and returns_any(holder, set(results)):
        for caller, call in callers_of(project, files, holder):
            names = frozenset(assigned_names(caller.source, call) - {"self"})
            found = find_update(project, files, caller, call, names, depth=depth + 1)
            if not isinstance(found, str):
                return found
    for code in reachable(project, roots, depth=2)[len(roots) :]:
        for call in calls_in(code):
            if method_name(call) == "apply_gradients":
                return _optimizer_update(project, code, call, ir.UpdateKind.APPLY_GRADIENTS)
    return "no apply_gradients, minimize or hand-written update of the combined gradients found"


def _hand_written(project: Project, code: Code, call: cst.Call) -> ir.Update | None:
    """A repo function given the combined gradients that assigns to variables (hand-written
    Adam); a dict of such functions indexed by a flag (``opt_fns[name](...)``) counts too."""
    targets: list[Code] = []
    target = callee(project, code, call)
    if target is not None:
        targets.append(target)
    elif isinstance(call.func, cst.Subscript):
        targets.extend(_dict_functions(project, code, call.func.value))
    for target in targets:
        for inner in reachable(project, [target], depth=1):
            # A factory that builds an optimizer and applies it (`get_train_op`).
            for applied in calls_in(inner):
                if method_name(applied) == "apply_gradients":
                    return _optimizer_update(project, inner, applied, ir.UpdateKind.APPLY_GRADIENTS)
        for inner in reachable(project, [target], depth=1):
            if any(_assigns(inner.source, c) for c in calls_in(inner)):
                name = target.source.qualname(target.node)
                if len(targets) > 1:
                    name = " | ".join(t.source.qualname(t.node) for t in targets)
                return ir.Update(
                    ir.UpdateKind.HAND_WRITTEN,
                    code.source.where(call),
                    f"{name}()",
                    target.source.where(target.node),
                )
    return None


def _assigns(source: SourceFile, call: cst.Call) -> bool:
    name = call_name(source, call)
    if name is not None:
        return name.rsplit(".", 1)[-1] in _ASSIGNS and name.startswith("tensorflow.")
    return method_name(call) in _ASSIGNS


def _dict_functions(project: Project, code: Code, value: cst.BaseExpression) -> list[Code]:
    """The functions listed in the dict literal ``value`` names (module level here or in the
    module it was imported from)."""
    name = dotted(value)
    if name is None:
        return []
    source = code.source
    if "." in name:
        head, _, attr = name.rpartition(".")
        imported = source.imports.get(head)
        if imported is None or imported.attr is not None:
            return []
        loaded = project.load(imported.file)
        if loaded is None:
            return []
        source, name = loaded, attr
    found: list[Code] = []
    for statement in source.module.body:
        for node in tree.walk(statement, (cst.FunctionDef, cst.ClassDef)):
            if (
                isinstance(node, cst.Assign)
                and name in {t.target.value for t in node.targets if isinstance(t.target, cst.Name)}
                and isinstance(node.value, cst.Dict)
            ):
                for element in node.value.elements:
                    if isinstance(element, cst.DictElement):
                        target = callee(
                            project, Code(source, source.module), cst.Call(element.value)
                        )
                        if target is not None:
                            found.append(target)
    return found


def _optimizer_update(
    project: Project, code: Code, call: cst.Call, kind: ir.UpdateKind
) -> ir.Update:
    receiver = call.func.value if isinstance(call.func, cst.Attribute) else call.func
    built = optimizer_construction(project, code, receiver, call)
    if built is None:
        return ir.Update(kind, code.source.where(call), code.source.src(receiver, 60))
    source, value = built
    text = " | ".join(source.src(v, 80) for v in _alternatives(source, value))
    return ir.Update(kind, code.source.where(call), text, source.where(value))


def _alternatives(source: SourceFile, value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """``if flag: opt = A(...) else: opt = B(...)``: every branch's optimizer, in order."""
    assign = source.parent(value)
    if not isinstance(assign, cst.Assign):
        return [value]
    statement = source.parent(assign)
    branch = next((a for a in source.ancestors(assign) if isinstance(a, cst.If)), None)
    if branch is None or statement is None:
        return [value]
    outer = source.parent(branch)
    while isinstance(outer, cst.If):  # `elif` chains hang below the first If
        branch, outer = outer, source.parent(outer)
    targets = {source.src(t.target) for t in assign.targets}
    found = [
        node.value
        for node in tree.walk(branch, (cst.FunctionDef, cst.ClassDef))
        if isinstance(node, cst.Assign)
        and targets & {source.src(t.target) for t in node.targets}
        and not _wraps(node.value)
    ]
    return found or [value]


def _wraps(value: cst.BaseExpression) -> bool:
    """``hvd.DistributedOptimizer(opt)``: a wrapper, not another optimizer."""
    return isinstance(value, cst.Call) and (dotted(value.func) or "").endswith(_WRAPPERS)


def optimizer_construction(
    project: Project, code: Code, receiver: cst.BaseExpression, at: cst.CSTNode, depth: int = 0
) -> tuple[SourceFile, cst.BaseExpression] | None:
    """Where the optimizer ``receiver`` names was built: its last binding before ``at`` in the
    function (``self.x`` anywhere in the class), through wrappers to the wrapped optimizer."""
    if depth > 3:
        return None
    if isinstance(receiver, cst.Subscript):
        receiver = receiver.value
    if isinstance(receiver, cst.Call):
        return code.source, receiver
    leaf = receiver.attr.value if isinstance(receiver, cst.Attribute) else None
    name = receiver.value if isinstance(receiver, cst.Name) else None
    if leaf is None and name is None:
        return None
    scopes = [code]
    if leaf is not None:
        scopes += class_methods(code)
    else:
        scopes.append(Code(code.source, code.source.module))
    at_line = code.source.line(at)
    best: tuple[Code, cst.Assign] | None = None
    for scope in scopes:
        for node in tree.walk(scope.node, (cst.ClassDef,)):
            if not isinstance(node, cst.Assign):
                continue
            if node is at or (scope is code and code.source.line(node) > at_line):
                continue
            targets = set()
            for t in node.targets:
                if leaf is not None and isinstance(t.target, cst.Attribute):
                    targets.add(t.target.attr.value)
                elif name is not None and isinstance(t.target, cst.Name):
                    targets.add(t.target.value)
            if (leaf or name) in targets:
                if best is None or scope is code:
                    best = (scope, node)
        if best is not None and best[0] is code:
            break
    if best is None:
        return None
    scope, assign = best
    value = assign.value
    if isinstance(value, cst.Call):
        func = dotted(value.func) or ""
        first = value.args[0].value if value.args else None
        # `opt = wrap(opt)` wraps whatever it is called; known wrappers under any name.
        rewrapped = isinstance(first, cst.Name) and first.value == (leaf or name)
        if (func.endswith(_WRAPPERS) or rewrapped) and first is not None:
            inner = optimizer_construction(
                project,
                enclosing_code(scope.source, assign),
                value.args[0].value,
                assign,
                depth + 1,
            )
            if inner is not None:
                return inner
    return scope.source, value
