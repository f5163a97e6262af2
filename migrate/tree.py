"""Read-only traversal of libcst trees, several times cheaper than libcst's own.

libcst visits a tree through ``_visit_and_replace_children``, which rebuilds (and re-validates)
every node it passes, even for a visitor that changes nothing; ``node.children`` does the same
for one level. Rules only read the tree, so here each node class's child fields are read
directly, in the order libcst visits them. That order is taken from libcst's own
``_visit_and_replace_children`` (the keyword order of the node it rebuilds), so it follows the
installed libcst; each class is checked against ``node.children`` the first time it is seen
and falls back to it on any difference. Visitors see exactly the nodes, in exactly the order,
that libcst's ``visit`` / ``visit_batched`` would give them.
"""

from __future__ import annotations

import ast
import inspect
import operator
import re
import textwrap
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, cast

import libcst as cst

_ATTRIBUTE_HOOK = re.compile(r"^(?:visit|leave)_[A-Z][A-Za-z]*_\w+$")


def _visited_fields(cls: type[cst.CSTNode]) -> tuple[str, ...] | None:
    """The fields ``cls._visit_and_replace_children`` visits, in order (None if unreadable)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls._visit_and_replace_children))
        function = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    rebuilt = [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        and node.keywords
        and not (isinstance(node.func, ast.Name) and node.func.id.startswith("visit_"))
    ]
    if not rebuilt:
        return ()  # a leaf: ``return self``
    return tuple(
        keyword.arg
        for keyword in rebuilt[0].keywords
        if keyword.arg is not None
        and any(
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id.startswith("visit_")
            for call in ast.walk(keyword.value)
        )
    )


# Classes of field values that are nodes (anything else a visited field holds is None, a
# MaybeSentinel or a sequence of nodes); a dict lookup is far cheaper than an ABC isinstance.
_NODE_CLASSES: dict[type, bool] = {}


# ``getter`` is an operator.attrgetter: one field's value, or a tuple of several fields' values.
def _values(
    node: cst.CSTNode, getter: Callable[[cst.CSTNode], Any], single: bool
) -> list[cst.CSTNode]:
    values = (getter(node),) if single else getter(node)
    found: list[cst.CSTNode] = []
    for value in values:
        kind = type(value)
        if kind is tuple or kind is list:
            found.extend(value)  # libcst visits every item of a sequence field
            continue
        is_node = _NODE_CLASSES.get(kind)
        if is_node is None:
            is_node = _NODE_CLASSES[kind] = issubclass(kind, cst.CSTNode)
        if is_node:
            found.append(value)
    return found


# Node class -> its children reader; None: libcst's ``children`` for that class.
_READERS: dict[type, Callable[[cst.CSTNode], Sequence[cst.CSTNode]] | None] = {}


def _learn(node: cst.CSTNode) -> Callable[[cst.CSTNode], Sequence[cst.CSTNode]] | None:
    reader: Callable[[cst.CSTNode], Sequence[cst.CSTNode]] | None = _compiled_reader(type(node))
    if reader is None or not _same_children(node, reader(node)):
        reader = None
        fields = _visited_fields(type(node))
        if fields is not None:
            getter = operator.attrgetter(*fields) if fields else _none
            single = len(fields) <= 1

            def generic(node: cst.CSTNode) -> Sequence[cst.CSTNode]:
                return _values(node, getter, single)

            if _same_children(node, generic(node)):
                reader = generic
    _READERS[type(node)] = reader
    return reader


def _same_children(node: cst.CSTNode, got: Sequence[cst.CSTNode]) -> bool:
    expected = node.children
    return len(got) == len(expected) and all(a is b for a, b in zip(got, expected, strict=True))


def _visit_calls(cls: type[cst.CSTNode]) -> list[tuple[str, str]] | None:
    """``(visit function, field)`` for each child field ``cls._visit_and_replace_children``
    visits, in order, when each is a plain ``visit_x(self, "f", self.f, visitor)``; else None."""
    try:
        source = textwrap.dedent(inspect.getsource(cls._visit_and_replace_children))
        function = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    if not isinstance(function, ast.FunctionDef) or len(function.body) != 1:
        return None
    statement = function.body[0]
    if not isinstance(statement, ast.Return):
        return None
    if statement.value is None or (
        isinstance(statement.value, ast.Name) and statement.value.id == "self"
    ):
        return []  # a leaf
    rebuilt = statement.value
    if not isinstance(rebuilt, ast.Call) or rebuilt.args:
        return None
    calls: list[tuple[str, str]] = []
    for keyword in rebuilt.keywords:
        value = keyword.value
        if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)):
            if any(
                isinstance(inner, ast.Name) and inner.id.startswith("visit_")
                for inner in ast.walk(value)
            ):
                return None  # a visit inside an expression: not a plain field
            continue  # a field copied as it is (a string value, an operator kind)
        kind = value.func.id
        if kind not in _FIELD_READS:
            return None
        read = value.args[2] if len(value.args) == 4 else None
        if not (
            isinstance(read, ast.Attribute)
            and isinstance(read.value, ast.Name)
            and read.value.id == "self"
            and keyword.arg == read.attr
        ):
            return None
        calls.append((kind, read.attr))
    return calls


# How each of libcst's visit helpers reads its field, as code appending to ``found``.
_FIELD_READS = {
    "visit_required": "found.append(node.{0})",
    "visit_optional": "value = node.{0}\n    if value is not None:\n        found.append(value)",
    "visit_sentinel": (
        "value = node.{0}\n    if value is not _SENTINEL:\n        found.append(value)"
    ),
    "visit_sequence": "found.extend(node.{0})",
    "visit_body_sequence": "found.extend(node.{0})",
    "visit_iterable": "found.extend(node.{0})",
}


def _compiled_reader(cls: type[cst.CSTNode]) -> Callable[[cst.CSTNode], list[cst.CSTNode]] | None:
    """A function that lists a ``cls`` node's children field by field, written for ``cls`` from
    its ``_visit_and_replace_children``: no per-value type tests, a third of the generic cost."""
    calls = _visit_calls(cls)
    if calls is None:
        return None
    lines = ["def read(node):", "    found = []"]
    lines += ["    " + _FIELD_READS[kind].format(field) for kind, field in calls]
    lines.append("    return found")
    namespace: dict[str, object] = {"_SENTINEL": cst.MaybeSentinel.DEFAULT}
    exec("\n".join(lines), namespace)  # noqa: S102 - code built from field names only
    return cast("Callable[[cst.CSTNode], list[cst.CSTNode]]", namespace["read"])


def _none(node: cst.CSTNode) -> None:
    return None


def children(node: cst.CSTNode) -> Sequence[cst.CSTNode]:
    """``node.children`` (same nodes, same order) without rebuilding ``node``."""
    try:
        reader = _READERS[type(node)]
    except KeyError:
        reader = _learn(node)
    if reader is None:
        return node.children
    return reader(node)


def walk(node: cst.CSTNode, stop: tuple[type, ...] = ()) -> Iterator[cst.CSTNode]:
    """Pre-order, source-order walk of ``node`` (itself included); nodes of a ``stop`` type
    other than ``node`` are yielded but not entered."""
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        yield current
        if stop and current is not node and isinstance(current, stop):
            continue
        stack.extend(reversed(children(current)))


def parents(module: cst.CSTNode) -> dict[int, cst.CSTNode]:
    """id(node) -> parent for every node below ``module`` (a node that a fix placed twice in a
    tree gets one of its parents)."""
    found: dict[int, cst.CSTNode] = {}
    stack: list[cst.CSTNode] = [module]
    while stack:
        current = stack.pop()
        below = children(current)
        for child in below:
            found[id(child)] = current
        stack.extend(below)
    return found


_NEEDS_LIBCST: dict[type, bool] = {}


def _needs_libcst(cls: type) -> bool:
    """Transformers, and visitors with per-attribute callbacks (``visit_Call_func``), take
    libcst's own traversal."""
    needs = _NEEDS_LIBCST.get(cls)
    if needs is None:
        needs = (
            not issubclass(cls, cst.CSTVisitor)
            or cls.on_visit_attribute is not cst.CSTVisitor.on_visit_attribute
            or cls.on_leave_attribute is not cst.CSTVisitor.on_leave_attribute
            or any(
                _ATTRIBUTE_HOOK.match(name) and not getattr(getattr(cls, name), "_is_no_op", False)
                for name in dir(cls)
                if name.startswith(("visit_", "leave_"))
            )
        )
        _NEEDS_LIBCST[cls] = needs
    return needs


def visit(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """``node.visit(visitor)`` for a read-only visitor: ``visit_X`` returning False skips the
    children, ``leave_X`` is called for every node."""
    cls = type(visitor)
    if _needs_libcst(cls):
        node.visit(visitor)
        return
    custom = (
        cls.on_visit is not cst.CSTVisitor.on_visit or cls.on_leave is not cst.CSTVisitor.on_leave
    )
    on_visit: Callable[[cst.CSTNode], bool]
    on_leave: Callable[[cst.CSTNode], None]
    if custom or any(k.startswith(("visit_", "leave_")) for k in getattr(visitor, "__dict__", ())):
        on_visit, on_leave = visitor.on_visit, visitor.on_leave
    else:
        on_visit, on_leave = _class_dispatch(cls, visitor)
    stack: list[tuple[cst.CSTNode, bool]] = [(node, False)]
    while stack:
        current, leaving = stack.pop()
        if leaving:
            on_leave(current)
            continue
        enter = on_visit(current)
        stack.append((current, True))
        if enter:
            stack.extend((child, False) for child in reversed(children(current)))


_Hook = Callable[[cst.CSTVisitor, cst.CSTNode], object]
_HOOKS: dict[type, tuple[dict[type, _Hook | None], dict[type, _Hook | None]]] = {}


def _hook(cls: type, prefix: str, kind: type) -> _Hook | None:
    name = prefix + kind.__name__
    method = getattr(cls, name, None)
    if method is None or getattr(method, "_is_no_op", False):
        return None  # libcst's generated stubs return None and do nothing
    if inspect.isfunction(method) and not isinstance(
        inspect.getattr_static(cls, name), staticmethod
    ):
        return method
    return lambda visitor, node: getattr(visitor, name)(node)


def _class_dispatch(
    cls: type, visitor: cst.CSTVisitor
) -> tuple[Callable[[cst.CSTNode], bool], Callable[[cst.CSTNode], None]]:
    """CSTVisitor.on_visit / on_leave with the method lookups cached per visitor class."""
    visits, leaves = _HOOKS.setdefault(cls, ({}, {}))

    def on_visit(node: cst.CSTNode) -> bool:
        kind = type(node)
        try:
            method = visits[kind]
        except KeyError:
            method = visits[kind] = _hook(cls, "visit_", kind)
        return method is None or method(visitor, node) is not False

    def on_leave(node: cst.CSTNode) -> None:
        kind = type(node)
        try:
            method = leaves[kind]
        except KeyError:
            method = leaves[kind] = _hook(cls, "leave_", kind)
        if method is not None:
            method(visitor, node)

    return on_visit, on_leave


_BATCH_METHODS: dict[type, tuple[str, ...]] = {}


def _batch_method_names(cls: type) -> tuple[str, ...]:
    names = _BATCH_METHODS.get(cls)
    if names is None:
        names = tuple(
            name
            for name in sorted(dir(cls))
            if name.startswith(("visit_", "leave_"))
            and not getattr(getattr(cls, name, None), "_is_no_op", False)
        )
        _BATCH_METHODS[cls] = names
    return names


def visit_batched(node: cst.CSTNode, visitors: Iterable[cst.BatchableCSTVisitor]) -> None:
    """``libcst.visit_batched`` for read-only visitors: every visitor's ``visit_X`` on the way
    down and ``leave_X`` on the way up, in the visitors' order."""
    visitors = list(visitors)
    visits: dict[str, list[Callable[[cst.CSTNode], object]]] = {}
    leaves: dict[str, list[Callable[[cst.CSTNode], object]]] = {}
    for visitor in visitors:
        for name in _batch_method_names(type(visitor)):
            method = getattr(visitor, name)
            if not inspect.ismethod(method) or getattr(method, "_is_no_op", False):
                continue
            if _ATTRIBUTE_HOOK.match(name):
                cst.visit_batched(node, visitors)  # per-attribute hooks: libcst's traversal
                return
            prefix, _, kind = name.partition("_")
            (visits if prefix == "visit" else leaves).setdefault(kind, []).append(method)
    stack: list[tuple[cst.CSTNode, bool]] = [(node, False)]
    while stack:
        current, leaving = stack.pop()
        kind = type(current).__name__
        if leaving:
            for method in leaves.get(kind, ()):
                method(current)
            continue
        for method in visits.get(kind, ()):
            method(current)
        stack.append((current, True))
        stack.extend((child, False) for child in reversed(children(current)))


def parse_module(source: str | bytes) -> cst.Module:
    """``cst.parse_module`` without re-validating each node the parser builds: the parser only
    builds valid nodes (libcst's own comment on ``CSTNode.__post_init__`` suggests as much),
    and the checks were a fifth of the parse. Nodes built later (fixes) are validated."""
    validate = cst.CSTNode.__post_init__
    # mypy refuses any assignment to a method, and reads a plain function put on the class as
    # one taking ``self`` twice.
    cst.CSTNode.__post_init__ = _unchecked  # type: ignore[method-assign, assignment]
    try:
        return cst.parse_module(source)
    finally:
        cst.CSTNode.__post_init__ = validate  # type: ignore[method-assign]  # as above


def _unchecked(node: cst.CSTNode) -> None:
    return None
