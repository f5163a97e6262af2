"""Tower loops: where the model is replicated per device (the TFM101 reading), the code each
tower runs across functions and modules, its per-tower loss and the lists its gradients go to."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from tfmigrate import tree
from tfmigrate.convert import ir
from tfmigrate.convert.project import Project, SourceFile
from tfmigrate.convert.recognize._code import (
    Code,
    assigned_names,
    callee,
    callers_of,
    calls_in,
    enclosing_code,
    is_gradient_call,
    reachable,
    reading,
    replicating,
)
from tfmigrate.rules._towers import GRADISH, LOOP, Towers, identifiers, method_name

_LOSSISH = ("loss", "cost")


@dataclass(eq=False)
class TowerSite:
    """One tower loop and what its towers compute."""

    source: SourceFile
    towers: Towers
    function: Code  # the function (or module) holding the loop
    tower_code: list[Code] = field(default_factory=list)  # per-tower functions it calls
    gradient_calls: list[tuple[SourceFile, cst.Call]] = field(default_factory=list)
    gradient_lists: set[str] = field(default_factory=set)
    loss_lists: set[str] = field(default_factory=set)
    loss: ir.Loss | None = None
    body_source: SourceFile | None = None  # the tower function's file, when not the loop's

    @property
    def loop(self) -> cst.CSTNode:
        return self.towers.replicator

    @property
    def where(self) -> ir.Where:
        return self.source.where(self.loop)

    def loop_nodes(self) -> list[cst.CSTNode]:
        root = self.loop.body if isinstance(self.loop, LOOP) else self.loop
        return list(tree.walk(root, (cst.FunctionDef, cst.ClassDef, cst.Lambda)))

    def describe(self) -> ir.Towers:
        source = self.source
        loop = self.loop
        if isinstance(loop, cst.For):
            count = source.src(loop.iter, 60)
        elif isinstance(loop, cst.While):
            count = f"while {source.src(loop.test, 50)}"
        elif isinstance(loop, cst.ListComp | cst.GeneratorExp | cst.SetComp | cst.DictComp):
            count = source.src(loop.for_in.iter, 60)
        else:
            count = source.src(loop, 60)
        device = self.towers.device
        holder = self.body_source or source
        devices = holder.src(device.args[0].value, 60) if device.args else ""
        body = self.towers.tower_fn.name.value if self.towers.tower_fn is not None else None
        return ir.Towers(self.where, source.qualname(self.function.node), body, devices, count)


def find_tower_sites(
    project: Project, files: list[SourceFile], program: list[SourceFile]
) -> list[TowerSite]:
    """Every tower loop of ``files``: the TFM101 reading of each file, and tower functions of
    one module called once per device from another module of the ``program``."""
    sites = []
    for source in files:
        for towers in reading(source).towers:
            site = TowerSite(source, towers, enclosing_code(source, towers.replicator))
            _read_site(project, site)
            sites.append(site)
    for source in files:
        for device, function in reading(source).keyed:
            for caller, call in callers_of(project, program, Code(source, function)):
                loop = replicating(caller.source, call)
                if loop is None or caller.source is source:
                    continue
                towers = Towers(loop, device, function)
                site = TowerSite(caller.source, towers, caller, body_source=source)
                _read_site(project, site)
                sites.append(site)
    return sites


def _read_site(project: Project, site: TowerSite) -> None:
    source = site.source
    loop_nodes = site.loop_nodes()
    direct: list[Code] = []
    if site.towers.tower_fn is not None:
        direct.append(Code(site.body_source or source, site.towers.tower_fn))
    for node in loop_nodes:
        if isinstance(node, cst.Call):
            target = callee(project, site.function, node)
            if target is not None and target.node is not site.function.node:
                direct.append(target)
    site.tower_code = reachable(project, direct, depth=3) if direct else []
    # Gradients: taken in the loop itself or in a function the towers call.
    gradient_bearing: set[int] = set()
    for code in site.tower_code:
        for call in calls_in(code):
            if is_gradient_call(code.source, call):
                site.gradient_calls.append((code.source, call))
                gradient_bearing.add(id(code.node))
    bound: set[str] = set()
    for node in loop_nodes:
        if not isinstance(node, cst.Call):
            continue
        if is_gradient_call(source, node):
            site.gradient_calls.insert(0, (source, node))
            bound |= assigned_names(source, node)
        else:
            target = callee(project, site.function, node)
            if target is not None and _reaches(project, target, gradient_bearing):
                bound |= assigned_names(source, node)
    for node in loop_nodes:
        collected = _collected(node)
        if collected is None:
            continue
        receiver, value = collected
        named = " ".join(receiver | identifiers(value))
        carries = bool(identifiers(value) & bound) or any(
            isinstance(n, cst.Call) and is_gradient_call(source, n) for n in tree.walk(value)
        )
        if carries or (GRADISH.search(named) and not any(w in named.lower() for w in _LOSSISH)):
            site.gradient_lists |= receiver
        elif any(w in named.lower() for w in _LOSSISH):
            site.loss_lists |= receiver
    if isinstance(site.loop, cst.ListComp | cst.GeneratorExp) and gradient_bearing:
        # `tower_grads = [tower(i) for i in range(n)]`: the comprehension is the list.
        site.gradient_lists |= assigned_names(source, site.loop) - {"self"}
    site.loss = _loss(site, loop_nodes)


def _branch_in(source: SourceFile, node: cst.CSTNode, loop: cst.CSTNode) -> cst.If | None:
    """The innermost ``if`` holding ``node`` inside ``loop`` (None if it is not in one)."""
    for ancestor in source.ancestors(node):
        if ancestor is loop:
            return None
        if isinstance(ancestor, cst.If):
            return ancestor
    return None


def _collected(node: cst.CSTNode) -> tuple[set[str], cst.BaseExpression] | None:
    """``grads.append(x)``, ``grads.extend(x)``, ``grads += [x]``: the list's names and x."""
    if isinstance(node, cst.Call) and method_name(node) in ("append", "extend") and node.args:
        if isinstance(node.func, cst.Attribute):
            return identifiers(node.func.value) - {"self"}, node.args[0].value
    if isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.AddAssign):
        if isinstance(node.value, cst.List):
            return identifiers(node.target) - {"self"}, node.value
    return None


def _reaches(project: Project, code: Code, bearing: set[int]) -> bool:
    return any(id(c.node) in bearing for c in reachable(project, [code], depth=2))


def _loss(site: TowerSite, loop_nodes: list[cst.CSTNode]) -> ir.Loss | None:
    """The loss each tower differentiates: the first argument of its gradient call, else the
    loss the loop collects."""
    for source, call in site.gradient_calls:
        if call.args:
            value = call.args[0].value
            if isinstance(value, cst.Name) and source is site.source:
                # `loss = model_fn(x) / n` in the loop: the expression says what is scaled
                # (its last binding before the gradient call).
                bindings = [
                    node
                    for node in loop_nodes
                    if isinstance(node, cst.Assign)
                    and source.line(node) <= source.line(call)
                    and any(
                        isinstance(t.target, cst.Name) and t.target.value == value.value
                        for t in node.targets
                    )
                ]
                if bindings:
                    last = bindings[-1]
                    # `if coef: loss = a + b` / `else: loss = a`: both branches, in order.
                    branch = _branch_in(source, last, site.loop)
                    inside = {id(n) for n in tree.walk(branch)} if branch is not None else set()
                    chosen = [b for b in bindings if id(b) in inside] or [last]
                    text = " | ".join(source.src(b.value, 70) for b in chosen)
                    return ir.Loss(source.where(chosen[0]), text)
            return ir.Loss(source.where(call), source.src(value, 70))
    for node in loop_nodes:
        if isinstance(node, cst.Call) and method_name(node) == "append" and node.args:
            if isinstance(node.func, cst.Attribute) and identifiers(node.func.value) & (
                site.loss_lists
            ):
                return ir.Loss(site.source.where(node), site.source.src(node.args[0].value, 70))
    for node in loop_nodes:
        if isinstance(node, cst.Assign):
            names = " ".join(
                n for t in node.targets for n in identifiers(t.target) if n != "self"
            ).lower()
            if any(w in names for w in _LOSSISH):
                return ir.Loss(site.source.where(node), site.source.src(node.value, 70))
    return None
