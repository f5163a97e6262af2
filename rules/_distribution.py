"""Shared facts about tf.distribute code for the TFM2xx rules: which names hold a strategy, which
statements run inside ``strategy.scope()``, where functions and assignments are.

One light pass over the module; rules call :func:`analyze` once (from ``visit_Module``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from tfmigrate import tree
from tfmigrate.names import NameResolver, dotted
from tfmigrate.syntax import walk  # noqa: F401 (re-exported for rules)

# Strategies whose replicas each run the step function on their own slice of the batch.
MIRRORED = frozenset(
    {
        "tensorflow.distribute.MirroredStrategy",
        "tensorflow.distribute.MultiWorkerMirroredStrategy",
        "tensorflow.distribute.experimental.MultiWorkerMirroredStrategy",
    }
)


@dataclass
class Strategy:
    local: str  # dotted spelling of the binding, e.g. "strategy" or "self.strategy"
    qualified: str  # e.g. "tensorflow.distribute.MirroredStrategy"
    devices: int | None  # number of devices when given as a literal list


@dataclass
class ModuleFacts:
    strategies: dict[str, Strategy] = field(default_factory=dict)
    functions: dict[str, list[cst.FunctionDef]] = field(default_factory=dict)
    # every `name = value` (single Name target), in source order
    assignments: dict[str, list[cst.Assign]] = field(default_factory=dict)
    calls: list[cst.Call] = field(default_factory=list)
    uses_distribute: bool = False

    def is_strategy(self, node: cst.BaseExpression) -> bool:
        """A known strategy binding, or (function parameters, attributes) a name that says so."""
        name = dotted(node)
        if name is None:
            return False
        return name in self.strategies or "strategy" in name.rsplit(".", 1)[-1].lower()

    def function(self, name: str) -> cst.FunctionDef | None:
        found = self.functions.get(name)
        return found[0] if found and len(found) == 1 else None

    def values_of(self, name: str) -> list[cst.BaseExpression]:
        return [a.value for a in self.assignments.get(name, [])]


class _Collector(cst.CSTVisitor):
    def __init__(self, resolver: NameResolver, facts: ModuleFacts) -> None:
        super().__init__()
        self.resolver = resolver
        self.facts = facts

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.facts.functions.setdefault(node.name.value, []).append(node)

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) != 1:
            return
        target = dotted(node.targets[0].target)
        if target is None:
            return
        self.facts.assignments.setdefault(target, []).append(node)
        if isinstance(node.value, cst.Call):
            name = self.resolver.qualify(node.value.func)
            if name and name.startswith("tensorflow.distribute.") and name.endswith("Strategy"):
                self.facts.strategies[target] = Strategy(target, name, _device_count(node.value))

    def visit_Call(self, node: cst.Call) -> None:
        self.facts.calls.append(node)
        name = self.resolver.qualify(node.func)
        if name and name.startswith(("tensorflow.distribute.", "keras.distribution.")):
            self.facts.uses_distribute = True


def _device_count(call: cst.Call) -> int | None:
    for arg in call.args:
        if (arg.keyword is None or arg.keyword.value == "devices") and isinstance(
            arg.value, cst.List | cst.Tuple
        ):
            return len(arg.value.elements)
        break
    return None


def analyze(module: cst.Module, resolver: NameResolver) -> ModuleFacts:
    facts = ModuleFacts()
    tree.visit(module, _Collector(resolver, facts))
    return facts


def keyword(call: cst.Call, name: str, position: int | None = None) -> cst.Arg | None:
    """The argument passed as ``name=`` or, if ``position`` is given, positionally there."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    if position is not None:
        positional = [a for a in call.args if a.keyword is None and not a.star]
        if len(positional) > position:
            return positional[position]
    return None


def is_true(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


def is_false(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "False"


def add_keyword(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """``call`` with ``name=value`` appended, keeping a trailing comma where there was one."""
    new = cst.Arg(
        keyword=cst.Name(name),
        value=value,
        equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        ),
    )
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    if isinstance(last.comma, cst.Comma):
        new = new.with_changes(comma=last.comma)
    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return call.with_changes(args=[*args, new])


def scope_strategy(with_node: cst.CSTNode, facts: ModuleFacts) -> str | None:
    """The strategy a ``with X.scope():`` statement enters, else None."""
    if not isinstance(with_node, cst.With):
        return None
    for item in with_node.items:
        call = item.item
        if (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "scope"
            and facts.is_strategy(call.func.value)
        ):
            return dotted(call.func.value)
    return None
