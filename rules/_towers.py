"""Shared reading of TF1 tower code for the TFM1xx tower rules (TFM101-103, TFM110, TFM111).

Not a rule module: the leading underscore keeps the registry from loading it. Everything here is
syntactic and flow-insensitive on purpose: tower scripts are flat, and a rule that needs more
than "which loop, which scope, which name" is guessing anyway.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst
from libcst.metadata import PositionProvider
from tfmigrate.rule import Rule

LOOP = (cst.For, cst.While)
# A new Python scope: a loop or binding outside it is no longer "the same code".
BOUNDARY = (cst.FunctionDef, cst.ClassDef, cst.Lambda)

DEVICE = "tensorflow.device"
SCOPES = frozenset(
    {
        "tensorflow.name_scope",
        "tensorflow.variable_scope",
        "tensorflow.op_scope",
        "tensorflow.variable_op_scope",
    }
)
CONCAT = frozenset({"tensorflow.concat", "tensorflow.concat_v2"})
STACK = frozenset({"tensorflow.stack", "tensorflow.pack"})
ADD_N = frozenset({"tensorflow.add_n", "tensorflow.accumulate_n"})
DIVIDE = frozenset(
    {"tensorflow.div", "tensorflow.divide", "tensorflow.truediv", "tensorflow.realdiv"}
)
MULTIPLY = frozenset({"tensorflow.multiply", "tensorflow.mul", "tensorflow.scalar_mul"})

# Names that say "one of several towers" in legacy scripts.
TOWERISH = re.compile(r"tower|clone|gpu|replica|device|split|shard|worker", re.I)
GRADISH = re.compile(r"grad", re.I)


def short_tf(name: str | None) -> str | None:
    """``tensorflow.math.add_n`` and ``tensorflow.add_n`` are one function to these rules."""
    if name is not None and name.startswith("tensorflow.math."):
        return "tensorflow." + name[len("tensorflow.math.") :]
    return name


def walk(node: cst.CSTNode, *, into_defs: bool = True) -> Iterator[cst.CSTNode]:
    """Pre-order, source-order walk; optionally not into nested functions/classes/lambdas."""
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        yield current
        if not into_defs and current is not node and isinstance(current, BOUNDARY):
            continue
        stack.extend(reversed(current.children))


def free_names(node: cst.CSTNode) -> set[str]:
    """Variables an expression reads: ``'/gpu:%d' % FLAGS.n`` -> {'FLAGS'}; not attrs, keywords."""
    found: set[str] = set()

    def visit(current: cst.CSTNode) -> None:
        if isinstance(current, cst.Name):
            found.add(current.value)
        elif isinstance(current, cst.Attribute):
            visit(current.value)
        elif isinstance(current, cst.Arg):
            visit(current.value)
        else:
            for child in current.children:
                visit(child)

    visit(node)
    return found


def identifiers(node: cst.CSTNode) -> set[str]:
    """Every identifier spelled in ``node``, attributes included (``self.tower_grads``)."""
    return {n.value for n in walk(node) if isinstance(n, cst.Name)}


def bound_names(node: cst.CSTNode) -> set[str]:
    """Names a block binds: assignments, loop targets, ``with ... as``, walrus."""
    found: set[str] = set()
    for current in walk(node, into_defs=False):
        if isinstance(current, cst.AssignTarget):
            found |= _target_names(current.target)
        elif isinstance(current, cst.AugAssign | cst.AnnAssign):
            found |= _target_names(current.target)
        elif isinstance(current, cst.For | cst.CompFor):
            found |= _target_names(current.target)
        elif isinstance(current, cst.AsName):
            found |= _target_names(current.name)
        elif isinstance(current, cst.NamedExpr):
            found |= _target_names(current.target)
    return found


def _target_names(target: cst.CSTNode) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, cst.Tuple | cst.List):
        return set().union(*(_target_names(e.value) for e in target.elements))
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return set()


def get_arg(call: cst.Call, index: int | None, keyword: str) -> cst.BaseExpression | None:
    """An argument given by keyword or at a positional index."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg.value
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if index is not None and index < len(positional):
        return positional[index].value
    return None


def int_value(node: cst.BaseExpression | None) -> int | None:
    """``0``, ``-1``, ``[0]`` -> the int; anything else -> None."""
    if isinstance(node, cst.Integer):
        return int(node.value, 0)
    if (
        isinstance(node, cst.UnaryOperation)
        and isinstance(node.operator, cst.Minus)
        and isinstance(node.expression, cst.Integer)
    ):
        return -int(node.expression.value, 0)
    if isinstance(node, cst.List | cst.Tuple) and len(node.elements) == 1:
        return int_value(node.elements[0].value)
    return None


def is_true(node: cst.BaseExpression | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


def method_name(call: cst.Call) -> str | None:
    """``opt.compute_gradients(...)`` -> 'compute_gradients' (any receiver)."""
    return call.func.attr.value if isinstance(call.func, cst.Attribute) else None


class TowerRule(Rule):
    """Helpers over the parent/position metadata that all tower rules need."""

    def src(self, node: cst.CSTNode, limit: int = 70) -> str:
        text = " ".join(self.context.module.code_for_node(node).split())
        return text if len(text) <= limit else text[: limit - 1] + "…"

    def line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def upto_boundary(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """Ancestors of ``node`` inside its own function (or module)."""
        for ancestor in self.ancestors(node):
            yield ancestor
            if isinstance(ancestor, BOUNDARY):
                return

    def enclosing_def(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef):
                return ancestor
            if isinstance(ancestor, cst.ClassDef | cst.Lambda):
                return None
        return None

    def scope_of(self, node: cst.CSTNode) -> cst.CSTNode:
        return self.enclosing_def(node) or self.context.module

    def loops_of(self, node: cst.CSTNode) -> list[cst.For | cst.While]:
        """Enclosing loops, innermost first, within the same function."""
        return [a for a in self.upto_boundary(node) if isinstance(a, LOOP)]

    def is_device_call(self, node: cst.CSTNode) -> bool:
        return isinstance(node, cst.Call) and self.call_name(node) == DEVICE

    def device_loop(self, device_call: cst.Call) -> cst.For | cst.While | None:
        """The loop that replicates this ``tf.device`` block: the innermost enclosing loop, if
        the device depends on what that loop binds (``'/gpu:%d' % i``, ``devices[i]``, ``d``)."""
        loops = self.loops_of(device_call)
        if not loops:
            return None
        loop = loops[0]
        # What changes from one iteration to the next: the loop target, and whatever the body
        # (re)binds -- `device = '/gpu:%d' % i`, or `i += 1` in a while loop.
        varying = bound_names(loop.body)
        if isinstance(loop, cst.For):
            varying |= _target_names(loop.target)
        if device_call.args and free_names(device_call.args[0].value) & varying:
            return loop
        return None

    def has_device_loop(self) -> bool:
        return any(
            self.is_device_call(n) and self.device_loop(n) is not None  # type: ignore[arg-type]
            for n in walk(self.context.module)
        )

    def bindings(self, name: str, scope: cst.CSTNode) -> list[tuple[cst.CSTNode, cst.CSTNode]]:
        """(binding node, bound value) for ``name`` in ``scope``, in source order. The value of a
        loop target is the loop itself."""
        found: list[tuple[cst.CSTNode, cst.CSTNode]] = []
        for node in walk(scope, into_defs=False):
            if isinstance(node, cst.Assign) and any(
                name in _target_names(t.target) for t in node.targets
            ):
                found.append((node, node.value))
            elif isinstance(node, cst.WithItem) and node.asname is not None:
                if name in _target_names(node.asname.name):
                    found.append((node, node.item))
            elif isinstance(node, cst.For) and name in _target_names(node.target):
                found.append((node, node))
        return found

    def last_binding_before(
        self, name: str, node: cst.CSTNode
    ) -> tuple[cst.CSTNode, cst.CSTNode] | None:
        at = self.line(node)
        # `grad = tf.reduce_mean(grad, 0)` reads the previous `grad`, not itself.
        inside = {id(a) for a in self.ancestors(node) if isinstance(a, cst.Assign)}
        before = [
            b
            for b in self.bindings(name, self.scope_of(node))
            if self.line(b[0]) <= at and id(b[0]) not in inside
        ]
        return before[-1] if before else None
