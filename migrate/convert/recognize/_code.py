"""What every recognizer needs: the per-file tower reading (the TFM1xx rules' own), the code a
tower core spans across functions, methods and modules, and lookups of calls and bindings in it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import libcst as cst

from tfmigrate import tree
from tfmigrate.convert.project import Project, SourceFile, method_of
from tfmigrate.names import dotted
from tfmigrate.rules._towers import (
    TowerRule,
    Towers,
    free_names,
    identifiers,
    method_name,
    short_tf,
)
from tfmigrate.rules._towers import _params as parameters  # the tower rules' own reading
from tfmigrate.rules._towers import _varying as varying
from tfmigrate.rules.colocated_averaged_loss import ColocatedAveragedLoss
from tfmigrate.rules.manual_gradient_aggregation import (
    SITES_KEY,
    ManualGradientAggregation,
)

DEFS = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
GRADIENT_FUNCTIONS = frozenset({"tensorflow.gradients"})
GRADIENT_METHODS = frozenset({"compute_gradients", "gradients"})


class _TowerScan(TowerRule):
    """The tower rules' shared reading of one file (device calls, calls by name)."""

    code = "TFM000"
    name = "tower-scan"
    summary = "tower reading for the whole-program converter"


class AggregationSite(Protocol):
    """TFM102's reading of one place that combines the towers' gradients."""

    anchor: cst.CSTNode  # the helper's def, or the aggregating statement
    averages: list[str]  # how it averages, when it does
    sums: list[str]  # how it sums, when it does


@dataclass(eq=False)
class FileReading:
    """The one-file facts of ``source``: its tower loops, gradient-combination sites (TFM102's
    reading) and one-loss-over-towers calls (TFM307's reading)."""

    towers: list[Towers]
    sites: dict[int, AggregationSite]
    colocated: list[cst.Call]
    # `tf.device` keyed on a parameter of a function no loop of this file calls: a tower
    # function other modules may call once per device.
    keyed: list[tuple[cst.Call, cst.FunctionDef]]


def reading(source: SourceFile) -> FileReading:
    """Computed once per file: one batched visit of the rules whose knowledge the converter
    reuses."""
    cached = source.shared.get("reading")
    if isinstance(cached, FileReading):
        return cached
    context = source.context
    scan = _TowerScan(context)
    aggregation = ManualGradientAggregation(context)
    colocated = ColocatedAveragedLoss(context)
    tree.visit_batched(source.module, [scan, aggregation, colocated])
    sites: dict[int, AggregationSite] = context.shared(SITES_KEY, dict)
    calls = [r.node for r in colocated.reports if isinstance(r.node, cst.Call)]
    towers = scan.tower_loops()
    replicated = {id(t.device) for t in towers}
    keyed = []
    for call in scan.device_calls:
        if id(call) in replicated or not call.args or scan.loops_of(call):
            continue
        function = scan.enclosing_def(call)
        if function is not None and free_names(call.args[0].value) & parameters(function):
            keyed.append((call, function))
    result = FileReading(towers, sites, calls, keyed)
    source.shared["reading"] = result
    return result


# -- code regions -------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Code:
    """A function (or a module's top level) of one file."""

    source: SourceFile
    node: cst.CSTNode  # FunctionDef or Module

    def __repr__(self) -> str:
        return f"Code({self.name})"

    @property
    def name(self) -> str:
        if isinstance(self.node, cst.Module):
            return f"{self.source.rel}:<module>"
        return f"{self.source.rel}:{self.source.qualname(self.node)}"


def replicating(source: SourceFile, call: cst.Call) -> cst.CSTNode | None:
    """The loop or comprehension around ``call`` (in its function) whose iteration variables
    the call's arguments read: what calls a tower function once per device."""
    used = free_names(call)
    for ancestor in source.ancestors(call):
        if isinstance(ancestor, cst.FunctionDef | cst.ClassDef | cst.Lambda):
            return None
        if isinstance(ancestor, cst.For | cst.While | cst.ListComp | cst.GeneratorExp):
            if used & varying(ancestor):
                return ancestor
    return None


def body_nodes(code: Code) -> list[cst.CSTNode]:
    """The nodes of ``code``'s own body (nested functions and classes not entered, except
    closures defined in a function, which run as part of it); computed once per function."""
    cache = code.source.shared.setdefault("nodes", {})
    assert isinstance(cache, dict)
    found = cache.get(id(code.node))
    if found is None:
        stop = (
            (cst.FunctionDef, cst.ClassDef)
            if isinstance(code.node, cst.Module)
            else (cst.ClassDef, cst.Lambda)
        )
        found = list(tree.walk(code.node, stop))
        cache[id(code.node)] = found
    return found


def calls_in(code: Code) -> list[cst.Call]:
    """The calls of ``code``'s body, in source order (computed once per function)."""
    cache = code.source.shared.setdefault("calls", {})
    assert isinstance(cache, dict)
    found = cache.get(id(code.node))
    if found is None:
        found = [node for node in body_nodes(code) if isinstance(node, cst.Call)]
        cache[id(code.node)] = found
    return found


def callee(project: Project, code: Code, call: cst.Call) -> Code | None:
    """The repo function a call runs: a function of this module or an imported one
    (``helpers.average``), a method of this class (``self._build``), a class (its
    ``__init__``), a method of an instance of a repo class. Cached per call."""
    cache = code.source.shared.setdefault("callees", {})
    assert isinstance(cache, dict)
    key = (id(code.node), id(call))
    hit = cache.get(key)
    # The call is kept with its answer, so its id cannot be reused by another node.
    if hit is not None and hit[0] is call:
        return hit[1]
    found = _callee(project, code, call)
    cache[key] = (call, found)
    return found


def _callee(project: Project, code: Code, call: cst.Call) -> Code | None:
    source = code.source
    func = call.func
    name = dotted(func)
    if name is None:
        # `Trainer(args).train()`: a method of the repo class just built.
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Call):
            built = dotted(func.value.func)
            found = project.definition(source, built) if built else None
            if found is not None and isinstance(found[1], cst.ClassDef):
                method = method_of(found[1], func.attr.value)
                if method is not None:
                    return Code(found[0], method)
                return _inherited_method(project, found[0], found[1], func.attr.value)
        return None
    if name.startswith("self.") and name.count(".") == 1:
        cls = source.enclosing_class(code.node)
        if cls is None:
            return None
        method = method_of(cls, name[5:])
        if method is None:
            return _inherited_method(project, source, cls, name[5:])
        return Code(source, method)
    found = project.definition(source, name)
    if found is None:
        return _instance_method(project, code, func) or _chosen_function(project, code, func)
    where, node = found
    if isinstance(node, cst.ClassDef):
        init = method_of(node, "__init__")
        return Code(where, init) if init is not None else None
    return Code(where, node)


def _instance_method(project: Project, code: Code, func: cst.BaseExpression) -> Code | None:
    """``trainer.train()`` / ``self._feeder.next_batch()`` where the receiver was bound to an
    instance of a repo class (``trainer = Trainer(...)``, ``self._feeder = Feeder(...)``)."""
    if not isinstance(func, cst.Attribute):
        return None
    receiver = func.value
    if isinstance(receiver, cst.Name):
        scopes = [code, Code(code.source, code.source.module)]
        key = receiver.value
    elif isinstance(receiver, cst.Attribute) and dotted(receiver.value) == "self":
        scopes = [code, *class_methods(code)]
        key = "self." + receiver.attr.value
    else:
        return None
    for scope in scopes:
        for value in _constructed(scope).get(key, ()):
            name = dotted(value.func)
            found = project.definition(scope.source, name) if name else None
            if found is not None and isinstance(found[1], cst.ClassDef):
                # Bound to several classes (`if flag: r = A() else: r = B()`): the one that
                # has the method.
                method = method_of(found[1], func.attr.value)
                if method is not None:
                    return Code(found[0], method)
                inherited = _inherited_method(project, found[0], found[1], func.attr.value)
                if inherited is not None:
                    return inherited
    return None


def _chosen_function(project: Project, code: Code, func: cst.BaseExpression) -> Code | None:
    """``update = {'adam': optim.adam, 'sgd': optim.sgd}[flag]`` then ``update(...)``: the
    first of the functions the flag chooses from."""
    if not isinstance(func, cst.Name):
        return None
    for node in body_nodes(code):
        if not (isinstance(node, cst.Assign) and isinstance(node.value, cst.Subscript)):
            continue
        if not any(
            isinstance(t.target, cst.Name) and t.target.value == func.value for t in node.targets
        ):
            continue
        table = node.value.value
        if isinstance(table, cst.Dict):
            for element in table.elements:
                name = dotted(element.value) if isinstance(element, cst.DictElement) else None
                found = project.definition(code.source, name) if name else None
                if found is not None and isinstance(found[1], cst.FunctionDef):
                    return Code(found[0], found[1])
    return None


def _constructed(scope: Code) -> dict[str, list[cst.Call]]:
    """``x = Call(...)`` / ``self.x = Call(...)`` in ``scope``: "x" / "self.x" -> the calls
    (computed once per scope)."""
    cache = scope.source.shared.setdefault("constructed", {})
    assert isinstance(cache, dict)
    found = cache.get(id(scope.node))
    if found is not None:
        return found
    found = {}
    for node in tree.walk(
        scope.node,
        (cst.ClassDef, cst.FunctionDef) if isinstance(scope.node, cst.Module) else (cst.ClassDef,),
    ):
        if not isinstance(node, cst.Assign) or not isinstance(node.value, cst.Call):
            continue
        for target in node.targets:
            bound = target.target
            if isinstance(bound, cst.Name):
                found.setdefault(bound.value, []).append(node.value)
            elif isinstance(bound, cst.Attribute) and dotted(bound.value) == "self":
                found.setdefault("self." + bound.attr.value, []).append(node.value)
    cache[id(scope.node)] = found
    return found


def class_hierarchy_methods(project: Project, code: Code) -> list[Code]:
    """The methods of ``code``'s class and of its repo base classes."""
    cls = code.source.enclosing_class(code.node)
    if cls is None:
        return []
    found: list[Code] = []
    pending = [(code.source, cls)]
    seen: set[int] = set()
    while pending:
        source, current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        found.extend(Code(source, s) for s in current.body.body if isinstance(s, cst.FunctionDef))
        for base in current.bases:
            name = dotted(base.value)
            target = project.definition(source, name) if name else None
            if target is not None and isinstance(target[1], cst.ClassDef):
                pending.append((target[0], target[1]))
    return found


def _inherited_method(
    project: Project, source: SourceFile, cls: cst.ClassDef, name: str
) -> Code | None:
    for base in cls.bases:
        base_name = dotted(base.value)
        if base_name is None:
            continue
        found = project.definition(source, base_name)
        if found is None or not isinstance(found[1], cst.ClassDef):
            continue
        method = method_of(found[1], name)
        if method is not None:
            return Code(found[0], method)
        deeper = _inherited_method(project, found[0], found[1], name)
        if deeper is not None:
            return deeper
    return None


def reachable(project: Project, roots: list[Code], depth: int = 3) -> list[Code]:
    """``roots`` and the repo functions they call, up to ``depth`` calls away."""
    seen: dict[tuple[int, int], Code] = {}
    frontier = list(roots)
    for _ in range(depth + 1):
        following: list[Code] = []
        for code in frontier:
            key = (id(code.source), id(code.node))
            if key in seen:
                continue
            seen[key] = code
            for call in calls_in(code):
                target = callee(project, code, call)
                if target is not None:
                    following.append(target)
        frontier = following
    return list(seen.values())


def class_methods(code: Code) -> list[Code]:
    """The other methods of the class ``code`` is a method of (graph built in one method, run in
    another)."""
    cls = code.source.enclosing_class(code.node)
    if cls is None:
        return []
    return [
        Code(code.source, s)
        for s in cls.body.body
        if isinstance(s, cst.FunctionDef) and s is not code.node
    ]


def enclosing_code(source: SourceFile, node: cst.CSTNode) -> Code:
    function = source.enclosing_def(node)
    return Code(source, function if function is not None else source.module)


# -- calls and names ----------------------------------------------------------------------------
def call_name(source: SourceFile, call: cst.Call) -> str | None:
    return short_tf(source.qualify(call.func))


def is_gradient_call(source: SourceFile, call: cst.Call) -> bool:
    name = call_name(source, call)
    if name in GRADIENT_FUNCTIONS:
        return True
    return name is None and method_name(call) in GRADIENT_METHODS


def keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    return None


def statement_of(source: SourceFile, node: cst.CSTNode) -> cst.CSTNode:
    current = node
    while not isinstance(current, cst.SimpleStatementLine | cst.BaseCompoundStatement):
        parent = source.parent(current)
        if parent is None:
            return current
        current = parent
    return current


def assigned_names(source: SourceFile, node: cst.CSTNode) -> set[str]:
    """The names (or ``self.x`` attribute names) the statement holding ``node`` binds."""
    statement = statement_of(source, node)
    found: set[str] = set()
    if isinstance(statement, cst.SimpleStatementLine):
        for small in statement.body:
            targets: list[cst.CSTNode] = []
            if isinstance(small, cst.Assign):
                targets = [t.target for t in small.targets]
            elif isinstance(small, cst.AugAssign | cst.AnnAssign):
                targets = [small.target]
            for target in targets:
                found |= _target_leaves(target)
    return found


def _target_leaves(target: cst.CSTNode) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, cst.Attribute):
        return {target.attr.value}
    if isinstance(target, cst.Subscript):
        return _target_leaves(target.value)
    if isinstance(target, cst.Tuple | cst.List):
        return set().union(*(_target_leaves(e.value) for e in target.elements))
    if isinstance(target, cst.StarredElement):
        return _target_leaves(target.value)
    return set()


def mentions(node: cst.CSTNode, names: set[str]) -> bool:
    return bool(identifiers(node) & names)


def end_line(source: SourceFile, node: cst.CSTNode) -> int:
    return source.context.position_of(node).end.line


def returns_any(code: Code, names: set[str]) -> bool:
    """``code`` returns (a value mentioning) one of ``names``."""
    return any(
        isinstance(node, cst.Return) and node.value is not None and mentions(node.value, names)
        for node in body_nodes(code)
    )


def callers_of(
    project: Project, files: list[SourceFile], function: Code
) -> list[tuple[Code, cst.Call]]:
    """Calls of ``function`` in ``files`` (by name first: resolving every call is costly)."""
    if not isinstance(function.node, cst.FunctionDef):
        return []
    name = function.node.name.value
    found = []
    for source in files:
        if name.encode() not in source.raw:
            continue
        for node in tree.walk(source.module):
            if not isinstance(node, cst.Call):
                continue
            func = node.func
            spelled = (
                func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)
            )
            if spelled != name:
                continue
            code = enclosing_code(source, node)
            target = callee(project, code, node)
            if target is not None and target.node is function.node:
                found.append((code, node))
    return found
