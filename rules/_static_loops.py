"""``for`` loops over literal iterables, unrolled statically (TFM303's model conversion).

Not a rule module. A model function that builds its layers in a loop over a literal list
(``for k, filters in enumerate([32, 64]): conv2d(..., filters, name='conv%d' % (k + 1))``)
makes the same variables as the straight-line code with each iteration written out. This
writes it out: every iteration's copy of the body with the loop variables replaced by their
values, and the expressions made of those values and literals (``'conv%d' % (k + 1)``,
f-strings, ``'{}'.format(k)``, ``filters * 2``) folded into literals, so that the layer names
are literal names again. ``if`` statements whose test folds to a literal keep their taken
branch. Anything not known statically raises :class:`NotStatic` with the reason: the caller
then keeps the loop (and its own behaviour for loops).

No TensorFlow import here (the rewrite path must not need it).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, cast

import libcst as cst

from tfmigrate.syntax import walk

# Enough for any layer stack; bounds what a `range(10**9)` could cost.
MAX_ITERATIONS = 64
_MAX_TEXT = 1000  # longest string a fold may make ('x' * 10**9 is not a layer name)


class NotStatic(Exception):
    def __init__(self, node: cst.CSTNode, reason: str) -> None:
        super().__init__(reason)
        self.node = node
        self.reason = reason


class _NotLiteral(Exception):
    pass


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    cst.Add: operator.add,
    cst.Subtract: operator.sub,
    cst.Multiply: operator.mul,
    cst.Divide: operator.truediv,
    cst.FloorDivide: operator.floordiv,
    cst.Modulo: operator.mod,
}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    cst.Equal: operator.eq,
    cst.NotEqual: operator.ne,
    cst.LessThan: operator.lt,
    cst.LessThanEqual: operator.le,
    cst.GreaterThan: operator.gt,
    cst.GreaterThanEqual: operator.ge,
}
_SCALARS = (bool, int, float, str, type(None))


def _checked(value: Any) -> Any:
    if isinstance(value, str) and len(value) > _MAX_TEXT:
        raise _NotLiteral
    if isinstance(value, tuple | list):
        for item in value:
            _checked(item)
    elif not isinstance(value, _SCALARS):
        raise _NotLiteral
    return value


def value_of(node: cst.BaseExpression) -> Any:
    """The Python value of an expression made of literals only; _NotLiteral otherwise."""
    if isinstance(node, cst.Integer | cst.Float | cst.SimpleString):
        value = node.evaluated_value
        if isinstance(value, bytes):
            raise _NotLiteral
        return value
    if isinstance(node, cst.ConcatenatedString):
        return _checked(value_of(node.left) + value_of(node.right))
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[node.value]
    if isinstance(node, cst.UnaryOperation):
        operand = value_of(node.expression)
        if isinstance(node.operator, cst.Minus) and isinstance(operand, int | float):
            return -operand
        if isinstance(node.operator, cst.Plus) and isinstance(operand, int | float):
            return operand
        if isinstance(node.operator, cst.Not):
            return not operand
        raise _NotLiteral
    if isinstance(node, cst.BinaryOperation) and type(node.operator) in _BINARY:
        left, right = value_of(node.left), value_of(node.right)
        if isinstance(node.operator, cst.Multiply) and not (
            isinstance(left, int | float) and isinstance(right, int | float)
        ):
            raise _NotLiteral  # sequence repetition: not a layer argument
        try:
            return _checked(_BINARY[type(node.operator)](left, right))
        except (TypeError, ValueError, ZeroDivisionError) as exc:
            raise _NotLiteral from exc
    if isinstance(node, cst.Comparison):
        left = value_of(node.left)
        for target in node.comparisons:
            compare = _COMPARE.get(type(target.operator))
            if compare is None:
                raise _NotLiteral
            right = value_of(target.comparator)
            try:
                if not compare(left, right):
                    return False
            except TypeError as exc:
                raise _NotLiteral from exc
            left = right
        return True
    if isinstance(node, cst.BooleanOperation):
        left = value_of(node.left)
        if isinstance(node.operator, cst.And):
            return value_of(node.right) if left else left
        return left if left else value_of(node.right)
    if isinstance(node, cst.Tuple | cst.List):
        if any(not isinstance(e, cst.Element) for e in node.elements):
            raise _NotLiteral  # *starred
        items = [value_of(e.value) for e in node.elements]
        return tuple(items) if isinstance(node, cst.Tuple) else items
    if isinstance(node, cst.FormattedString):
        return _checked("".join(_formatted_part(part) for part in node.parts))
    if isinstance(node, cst.Call):
        return _call_value(node)
    raise _NotLiteral


def _formatted_part(part: cst.BaseFormattedStringContent) -> str:
    if isinstance(part, cst.FormattedStringText):
        return part.value.replace("{{", "{").replace("}}", "}")
    if not isinstance(part, cst.FormattedStringExpression) or part.equal is not None:
        raise _NotLiteral  # f'{k=}' spells its source: not folded
    value = value_of(part.expression)
    if part.conversion == "r":
        value = repr(value)
    elif part.conversion in ("s", "a"):
        value = str(value) if part.conversion == "s" else ascii(value)
    spec = "".join(_formatted_part(p) for p in part.format_spec or ())
    try:
        return format(value, spec)
    except (TypeError, ValueError) as exc:
        raise _NotLiteral from exc


def _call_value(node: cst.Call) -> Any:
    """``'conv{}'.format(k)``, ``str(k)``, ``int(x)``, ``len([...])`` of literals."""
    if any(a.star for a in node.args):
        raise _NotLiteral
    positional = [value_of(a.value) for a in node.args if a.keyword is None]
    keywords = {a.keyword.value: value_of(a.value) for a in node.args if a.keyword is not None}
    func = node.func
    try:
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value == "format"
            and isinstance(func.value, cst.SimpleString | cst.ConcatenatedString)
        ):
            template = value_of(func.value)
            if not isinstance(template, str):
                raise _NotLiteral
            return _checked(template.format(*positional, **keywords))
        if isinstance(func, cst.Name) and func.value in ("str", "int", "float", "len"):
            if keywords or len(positional) != 1:
                raise _NotLiteral
            functions: dict[str, Callable[[Any], Any]] = {
                "str": str,
                "int": int,
                "float": float,
                "len": len,
            }
            builtin = functions[func.value]
            return _checked(builtin(positional[0]))
    except (TypeError, ValueError, IndexError, KeyError) as exc:
        raise _NotLiteral from exc
    raise _NotLiteral


def literal_node(value: Any) -> cst.BaseExpression:
    """The source spelling of a folded value."""
    if value is None or isinstance(value, bool):
        return cst.Name(str(value))
    if isinstance(value, int | float):
        if value != value or value in (float("inf"), float("-inf")):
            raise _NotLiteral
        number = cst.Integer(str(abs(value))) if isinstance(value, int) else cst.Float(repr(abs(value)))  # fmt: skip
        return cst.UnaryOperation(cst.Minus(), number) if value < 0 else number
    if isinstance(value, str):
        return cst.SimpleString(repr(value))
    if isinstance(value, tuple | list):
        elements = [cst.Element(literal_node(v)) for v in value]
        if isinstance(value, list):
            return cst.List(elements)
        if len(elements) == 1:
            elements[0] = elements[0].with_changes(comma=cst.Comma())
        return cst.Tuple(elements)
    raise _NotLiteral


def _values(node: cst.BaseExpression) -> list[Any]:
    """The values a literal iterable yields: a list/tuple of literals, range(), and
    enumerate()/zip() of those."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
        name = node.func.value
        if any(a.star for a in node.args):
            raise _NotLiteral
        if name == "range":
            bounds = [value_of(a.value) for a in node.args if a.keyword is None]
            if len(bounds) != len(node.args) or not 1 <= len(bounds) <= 3:
                raise _NotLiteral
            if not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds):
                raise _NotLiteral
            if len(range(*bounds)) > MAX_ITERATIONS:
                raise _NotLiteral
            return list(range(*bounds))
        if name == "enumerate":
            start = 0
            for arg in node.args[1:]:
                if arg.keyword is not None and arg.keyword.value != "start":
                    raise _NotLiteral
                start = value_of(arg.value)
            if not node.args or node.args[0].keyword is not None or not isinstance(start, int):
                raise _NotLiteral
            return list(enumerate(_values(node.args[0].value), start))
        if name == "zip":
            if not node.args or any(a.keyword is not None for a in node.args):
                raise _NotLiteral
            return list(zip(*(_values(a.value) for a in node.args), strict=False))
        raise _NotLiteral
    value = value_of(node)
    if not isinstance(value, tuple | list | str):
        raise _NotLiteral
    return list(value)


def _bind(target: cst.BaseExpression, value: Any, env: dict[str, Any]) -> None:
    if isinstance(target, cst.Name):
        env[target.value] = value
        return
    if isinstance(target, cst.Tuple | cst.List):
        elements = target.elements
        if any(not isinstance(e, cst.Element) for e in elements):
            raise _NotLiteral
        if not isinstance(value, tuple | list) or len(value) != len(elements):
            raise _NotLiteral
        for element, item in zip(elements, value, strict=True):
            _bind(element.value, item, env)
        return
    raise _NotLiteral


def _bound_here(node: cst.CSTNode) -> set[str]:
    """Names a statement binds anywhere in it (assignments, loops, with ... as, lambdas...)."""
    found: set[str] = set()
    for n in walk(node):
        targets: list[cst.CSTNode] = []
        if isinstance(n, cst.AssignTarget | cst.AugAssign | cst.AnnAssign | cst.NamedExpr):
            targets = [n.target]
        elif isinstance(n, cst.For | cst.CompFor):
            targets = [n.target]
        elif isinstance(n, cst.AsName):
            targets = [n.name]
        elif isinstance(n, cst.Param):
            targets = [n.name]
        for target in targets:
            found |= {t.value for t in walk(target) if isinstance(t, cst.Name)}
    return found


class _Substitute(cst.CSTTransformer):
    """The loop variables -> their values; expressions over them folded into literals."""

    def __init__(self, env: dict[str, Any]) -> None:
        super().__init__()
        self.env = env

    def _mentions(self, node: cst.CSTNode) -> bool:
        return any(isinstance(n, cst.Name) and n.value in self.env for n in walk(node))

    def leave_Name(self, original, updated):
        if updated.value in self.env:
            return literal_node(self.env[updated.value])
        return updated

    # Names that are not loads of a variable stay as they are.
    def leave_Arg(self, original, updated):
        return updated.with_changes(keyword=original.keyword)

    def leave_Attribute(self, original, updated):
        updated = updated.with_changes(attr=original.attr)
        return self._fold(original, updated)

    def on_leave(self, original, updated):
        result = super().on_leave(original, updated)
        if isinstance(original, cst.Attribute) or not isinstance(
            original,
            cst.BinaryOperation
            | cst.UnaryOperation
            | cst.Comparison
            | cst.BooleanOperation
            | cst.FormattedString
            | cst.Call
            | cst.ConcatenatedString,
        ):
            return result
        return self._fold(original, result)

    def _fold(self, original, updated):
        if not isinstance(updated, cst.BaseExpression) or not self._mentions(original):
            return updated
        try:
            return literal_node(value_of(updated))
        except _NotLiteral:
            return updated


def _taken(statement: cst.If) -> list[cst.CSTNode] | None:
    """The statements of the branch an `if` with literal tests takes; None: not literal."""
    try:
        taken = bool(value_of(statement.test))
    except _NotLiteral:
        return None
    if taken:
        return list(statement.body.body)
    orelse = statement.orelse
    if orelse is None:
        return []
    if isinstance(orelse, cst.If):
        return _taken(orelse)
    return list(orelse.body.body)


# Statements come from blocks, or from one-line suites (`for i in x: y = i`) as small statements.
def _pruned(statements: Sequence[cst.CSTNode]) -> list[cst.CSTNode]:
    out: list[cst.CSTNode] = []
    for statement in statements:
        branch = _taken(statement) if isinstance(statement, cst.If) else None
        if branch is None:
            out.append(statement)
        else:
            out += _pruned(branch)
    return out


def unroll(loop: cst.For, scope: cst.CSTNode | None = None) -> list[cst.CSTNode]:
    """The loop's body written out once per iteration, with the loop variables' values put
    in. `scope`: the function the loop is in; a loop variable read there after the loop (it
    keeps its last value in Python) is refused."""
    if loop.asynchronous is not None or loop.orelse is not None:
        raise NotStatic(loop, "a `for` loop with `else` / `async for`")
    try:
        values = _values(loop.iter)
    except _NotLiteral:
        raise NotStatic(loop, "a `for` loop over something other than a literal list") from None
    if len(values) > MAX_ITERATIONS:
        raise NotStatic(loop, f"a `for` loop of more than {MAX_ITERATIONS} iterations")
    names = {n.value for n in walk(loop.target) if isinstance(n, cst.Name)}
    body = list(loop.body.body)
    for node in walk(loop.body):
        if isinstance(node, cst.Break | cst.Continue | cst.Return | cst.Yield | cst.Global | cst.Nonlocal):  # fmt: skip
            raise NotStatic(node, "a `for` loop with break / continue / return / yield")
    if names & _bound_here(loop.body):
        raise NotStatic(loop, "a `for` loop whose body assigns its loop variable")
    if scope is not None:
        outside = sum(1 for n in walk(scope) if isinstance(n, cst.Name) and n.value in names) - sum(
            1 for n in walk(loop) if isinstance(n, cst.Name) and n.value in names
        )
        if outside:
            raise NotStatic(loop, "a loop variable used outside its `for` loop")
    out: list[cst.CSTNode] = []
    for index, value in enumerate(values):
        env: dict[str, Any] = {}
        try:
            _bind(loop.target, value, env)
        except _NotLiteral:
            raise NotStatic(loop, "a `for` loop whose target does not unpack its items") from None
        # _Substitute rewrites expressions: each statement stays, none is removed
        copy = _pruned([cast(cst.CSTNode, s.visit(_Substitute(env))) for s in body])
        first = copy[0] if copy else None
        if (
            index == 0
            and isinstance(first, cst.SimpleStatementLine | cst.BaseCompoundStatement)
            and loop.leading_lines
        ):  # the loop's comments stay with it (a one-line suite's statements have none)
            copy[0] = first.with_changes(leading_lines=[*loop.leading_lines, *first.leading_lines])
        out += copy
    return out
