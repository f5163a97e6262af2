"""Names a converted module uses but nothing defines: the legacy program's own bugs (an import
its author removed, a variable from a deleted branch), which fail with NameError when the line
runs, before and after the conversion. Each such statement is commented out under a TODO that
names what is missing; a statement that then reads a name it bound is marked the same way."""

from __future__ import annotations

import builtins
import textwrap
from collections.abc import Callable

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, ScopeProvider

from tfmigrate import tree
from tfmigrate.convert.todo import Leftover, Todo
from tfmigrate.rules._towers import bound_names

_BUILTINS = frozenset(dir(builtins)) | {"__file__", "__name__", "__doc__", "__spec__"}
_MARKER = "# TODO(tfmigrate):"
_ROUNDS = 8  # each round comments out what the previous round's statements bound

Comment = Callable[[cst.CSTNode, Todo], cst.BaseStatement]


def undefined_out(
    module: cst.Module, todos: list[Todo], comment: Comment, ignore: frozenset[str] = frozenset()
) -> cst.Module:
    """``module`` with every statement that reads an undefined name commented out by
    ``comment`` under a TODO (each joins ``todos``). A module with a star import, or one that
    writes ``globals()``, may define anything: it is left as it is."""
    if _defines_names_dynamically(module):
        return module
    gone = _bound_under_todos(module, ignore)  # names bound by statements commented out
    for _ in range(_ROUNDS):
        statements = _reading_undefined(module, ignore)
        if not statements:
            break
        replacements: dict[cst.CSTNode, cst.CSTNode] = {}
        for statement, names in statements.items():
            listed = ", ".join(f"`{n}`" for n in sorted(names))
            if names <= gone:
                todo = Todo(Leftover.CASCADE, f"uses {listed}, left under a TODO above")
            else:
                todo = Todo(
                    Leftover.UNDEFINED,
                    f"{listed} {'is' if len(names) == 1 else 'are'} defined nowhere in the "
                    "program: the legacy code fails here with NameError too",
                )
            todos.append(todo)
            gone |= bound_names(statement)
            replacements[statement] = comment(statement, todo)
        module = module.visit(_Replacing(replacements))
    return module


def _bound_under_todos(module: cst.Module, placeholders: frozenset[str]) -> set[str]:
    """The names bound by the statements already commented out under a TODO: each is a
    placeholder statement (a bare name of ``placeholders``) whose leading comment lines are
    the marker and then the statement's code. A statement reading one of them is a cascade of
    that TODO, not the legacy program's own NameError."""
    bound: set[str] = set()
    for node in tree.walk(module):
        if not (
            isinstance(node, cst.SimpleStatementLine)
            and len(node.body) == 1
            and isinstance(node.body[0], cst.Expr)
            and isinstance(node.body[0].value, cst.Name)
            and node.body[0].value.value in placeholders
        ):
            continue
        comments = [line.comment.value for line in node.leading_lines if line.comment]
        starts = [i for i, c in enumerate(comments) if c.startswith(_MARKER)]
        if not starts:
            continue
        code = "\n".join(c[2:] if c.startswith("# ") else c[1:] for c in comments[starts[0] + 1 :])
        try:
            statements = cst.parse_module(textwrap.dedent(code) + "\n").body
        except cst.ParserSyntaxError:
            continue
        for statement in statements:
            bound |= bound_names(statement)
    return bound


def _defines_names_dynamically(module: cst.Module) -> bool:
    for node in tree.walk(module):
        if isinstance(node, cst.ImportFrom) and isinstance(node.names, cst.ImportStar):
            return True
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Name)
            and node.func.value in ("globals", "locals", "exec", "vars")
        ):
            return True
    return False


def _reading_undefined(
    module: cst.Module, ignore: frozenset[str]
) -> dict[cst.BaseStatement, set[str]]:
    """Statement -> the undefined names it reads (the innermost simple statement, or the
    compound statement whose header reads them)."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    scopes = wrapper.resolve(ScopeProvider)
    parents = wrapper.resolve(ParentNodeProvider)
    found: dict[cst.BaseStatement, set[str]] = {}
    for scope in {s for s in scopes.values() if s is not None}:
        for access in scope.accesses:
            name = access.node
            if not isinstance(name, cst.Name) or access.referents:
                continue
            if name.value in _BUILTINS or name.value in ignore:
                continue
            statement = _statement_of(name, parents)
            if statement is not None:
                found.setdefault(statement, set()).add(name.value)
    return found


def _statement_of(node: cst.CSTNode, parents) -> cst.BaseStatement | None:
    current: cst.CSTNode | None = node
    while current is not None:
        parent = parents.get(current)
        if isinstance(current, cst.SimpleStatementLine):
            return current
        if isinstance(current, cst.BaseCompoundStatement) and not isinstance(
            current, cst.FunctionDef | cst.ClassDef
        ):
            return current  # the name is in its header (a body's statement returned first)
        if isinstance(current, cst.FunctionDef | cst.ClassDef):
            return None  # a decorator, default or annotation: left as it is
        current = parent
    return None


class _Replacing(cst.CSTTransformer):
    def __init__(self, replacements: dict[cst.CSTNode, cst.CSTNode]) -> None:
        self.replacements = replacements

    def on_leave(self, original_node, updated_node):
        return self.replacements.get(original_node, updated_node)
