"""Shared reading of TF1 tower code for the TFM1xx tower rules (TFM101-103, TFM110, TFM111).

Not a rule module: the leading underscore keeps the registry from loading it. Everything here is
syntactic and flow-insensitive on purpose: tower scripts are flat, and a rule that needs more
than "which loop, which scope, which name" is guessing anyway.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeGuard

import libcst as cst
from libcst.metadata import PositionProvider

from tfmigrate.rule import Rule
from tfmigrate.rules import _keras_parallel as keras_parallel
from tfmigrate.syntax import DEFINITIONS, walk  # noqa: F401 (re-exported for rules)

LOOP = (cst.For, cst.While)
COMPREHENSION = (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)
# A new Python scope: a loop or binding outside it is no longer "the same code".
BOUNDARY = DEFINITIONS

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


def _callee(call: cst.Call) -> str | None:
    """The called name, whatever the receiver: ``tower_fn(...)``, ``self.tower_fn(...)``."""
    if isinstance(call.func, cst.Name):
        return call.func.value
    if isinstance(call.func, cst.Attribute):
        return call.func.attr.value
    return None


def _varying(node: cst.CSTNode) -> set[str]:
    """What changes between iterations: the loop target and whatever the body (re)binds --
    ``device = '/gpu:%d' % i``, or ``i += 1`` in a while loop; a comprehension's targets."""
    if isinstance(node, cst.For):
        return bound_names(node.body) | _target_names(node.target)
    if isinstance(node, cst.While):
        return bound_names(node.body)
    if isinstance(node, COMPREHENSION):
        return bound_names(node.for_in)
    return set()


def _params(function: cst.FunctionDef) -> set[str]:
    params = function.params
    every = [*params.posonly_params, *params.params, *params.kwonly_params]
    return {p.name.value for p in every}


_BUILTINS = frozenset(dir(builtins))
# Methods of lists, dicts, strings, sessions and loggers: calling them builds no model.
_PLAIN_METHODS = frozenset(
    {
        "append", "extend", "insert", "pop", "remove", "index", "count", "copy", "clear",
        "get", "items", "keys", "values", "update", "setdefault", "add", "discard",
        "format", "join", "split", "strip", "replace", "startswith", "endswith", "lower",
        "upper", "run", "info", "debug", "warning", "write", "flush", "print",
    }
)  # fmt: skip
# TF namespaces whose calls create variables or layers: evidence of a model per device.
_MODEL_PREFIXES = (
    "tensorflow.layers.",
    "tensorflow.contrib.layers.",
    "tensorflow.contrib.slim.",
    "tensorflow.keras.",
    "keras.",
    "tensorflow.get_variable",
    "tensorflow.Variable",
    "tensorflow.gradients",
    "tensorflow.make_template",
    "tensorflow.nn.conv",
    "tensorflow.nn.rnn",
    "tensorflow.nn.dynamic_rnn",
    "tensorflow.losses.",
)


@dataclass
class Towers:
    """One place where the model is replicated per device, and what it says about sharing."""

    replicator: cst.CSTNode  # the for/while loop or the comprehension
    device: cst.Call
    tower_fn: cst.FunctionDef | None  # the function holding `tf.device`, when called per tower
    scopes: list[str] = field(default_factory=list)
    sharing: list[str] = field(default_factory=list)


class TowerRule(Rule):
    """Helpers over the parent/position metadata that all tower rules need.

    Subclasses implement ``on_call`` instead of ``visit_Call``: the base records every
    ``tf.device(...)`` call on the way, so "is this tower code?" needs no second walk of the
    module (libcst's ``children`` is costly on big files). Decisions that need that answer are
    made in ``leave_Module``."""

    def __init__(self, context) -> None:
        super().__init__(context)
        self.device_calls: list[cst.Call] = []
        self.calls_by_name: dict[str, list[cst.Call]] = {}
        self.templates: set[str] = set()
        self._towers: list[Towers] | None = None

    def visit_Call(self, node: cst.Call) -> None:
        if self.call_name(node) == DEVICE:
            self.device_calls.append(node)
        callee = _callee(node)
        if callee is not None:
            self.calls_by_name.setdefault(callee, []).append(node)
        self.on_call(node)

    def on_call(self, node: cst.Call) -> None:
        """Called for every call, after ``tf.device`` calls were recorded."""

    def visit_Assign(self, node: cst.Assign) -> None:
        # `net_fn = tf.make_template(...)`: calling net_fn per tower shares its variables.
        if isinstance(node.value, cst.Call) and self.call_name(node.value) == (
            "tensorflow.make_template"
        ):
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    self.templates.add(target.target.value)
                elif isinstance(target.target, cst.Attribute):
                    self.templates.add(target.target.attr.value)

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

    def is_device_call(self, node: cst.CSTNode) -> TypeGuard[cst.Call]:
        return isinstance(node, cst.Call) and self.call_name(node) == DEVICE

    # -- where towers are replicated ----------------------------------------------------------
    def device_loop(
        self, device_call: cst.Call
    ) -> tuple[cst.CSTNode, cst.FunctionDef | None] | None:
        """What replicates this ``tf.device`` block: its innermost loop, if the device depends on
        what the loop binds (``'/gpu:%d' % i``, ``devices[i]``, ``d``); or, for a ``tf.device``
        keyed on a parameter of its function, a loop/comprehension calling that function with
        the loop's variable (``[tower(i) for i in range(n)]``)."""
        if not device_call.args:
            return None
        device = free_names(device_call.args[0].value)
        loops = self.loops_of(device_call)
        if loops:
            return (loops[0], None) if device & _varying(loops[0]) else None
        function = self.enclosing_def(device_call)
        if function is None or not device & _params(function):
            return None
        for caller in self.calls_by_name.get(function.name.value, []):
            for ancestor in self.upto_boundary(caller):
                if isinstance(ancestor, LOOP + COMPREHENSION):
                    if free_names(caller) & _varying(ancestor):
                        return ancestor, function
                    break
        return None

    def tower_loops(self) -> list[Towers]:
        """Every per-device replication that builds a model. Complete only in leave_Module."""
        if self._towers is None:
            self._towers = []
            seen: set[int] = set()
            for call in self.device_calls:
                found = self.device_loop(call)
                if found is None or id(found[0]) in seen:
                    continue
                # A copy of Keras 2's multi_gpu_model is TFM107's, not a tower core.
                if keras_parallel.inside_copy(self.enclosing_def(found[0]), self.qualify):
                    continue
                seen.add(id(found[0]))
                towers = Towers(found[0], call, found[1])
                if self._read_towers(towers):
                    self._towers.append(towers)
        return self._towers

    def has_device_loop(self) -> bool:
        return bool(self.tower_loops())

    def _read_towers(self, towers: Towers) -> bool:
        """Fill in scopes and sharing; True if the replicated code builds a model at all."""
        replicator = towers.replicator
        roots: list[cst.CSTNode] = [replicator.body if isinstance(replicator, LOOP) else replicator]
        if towers.tower_fn is not None:
            roots.append(towers.tower_fn.body)
        builds = False
        for root in roots:
            for current in walk(root, into_defs=False):
                if isinstance(current, cst.Call):
                    builds |= self._read_call(current, towers)
        towers.scopes = list(dict.fromkeys(towers.scopes))
        towers.sharing = list(dict.fromkeys(towers.sharing))
        return builds or bool(towers.scopes or towers.sharing)

    def _read_call(self, call: cst.Call, towers: Towers) -> bool:
        name = self.call_name(call)
        if name in SCOPES:
            scope = get_arg(call, 0, "name_or_scope") or get_arg(call, 0, "name")
            if scope is not None:
                towers.scopes.append(f"{name.rsplit('.', 1)[1]}({self.src(scope, 45)})")
            reuse = get_arg(call, None, "reuse")
            if reuse is not None:
                if self.qualify(reuse) == "tensorflow.AUTO_REUSE":
                    towers.sharing.append("tf.AUTO_REUSE")
                else:
                    towers.sharing.append(f"reuse={self.src(reuse, 40)}")
            return True
        if method_name(call) == "reuse_variables":
            towers.sharing.append(self.src(call, 50))
            return True
        if name == "tensorflow.make_template" or _callee(call) in self.templates:
            towers.sharing.append("tf.make_template")
            return True
        return self._builds_model(call, name)

    def _builds_model(self, call: cst.Call, name: str | None) -> bool:
        """A layer/variable/gradient call, or a call into the user's own code (``tower_loss``)."""
        if name is not None:
            return name.startswith(_MODEL_PREFIXES)
        method = method_name(call)
        if method is not None:
            return method not in _PLAIN_METHODS
        return isinstance(call.func, cst.Name) and call.func.value not in _BUILTINS

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


def bind_arguments(
    call: cst.Call, function: cst.FunctionDef, problem: Callable[[str], Exception]
) -> dict[str, cst.BaseExpression]:
    """The call's arguments by the function's parameter names (positional ones in order,
    keywords by name); ``problem(what)`` is raised for `*args`/`**kwargs` or too many."""
    params = function.params.params
    given: dict[str, cst.BaseExpression] = {}
    for index, arg in enumerate(call.args):
        if arg.star:
            raise problem("called with *args / **kwargs")
        if arg.keyword is None:
            if index >= len(params):
                raise problem("called with too many arguments")
            given[params[index].name.value] = arg.value
        else:
            given[arg.keyword.value] = arg.value
    return given
