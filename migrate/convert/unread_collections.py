"""Graph collections a program fills and never reads: ``tf.add_to_collection('name', value)``
in model code where no module of the program asks for ``'name'`` (a collection kept for a tool
the program does not use, such as gradient checkpointing's). TF1 only stored the tensor in the
graph; the program computed nothing from it. TF2 has no graph collections: the statement goes,
a comment in its place saying what it did (and, for an ``if`` that only guarded it, when)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import libcst as cst

from tfmigrate import tree
from tfmigrate.rules._towers import get_arg

_GONE = "__tfmigrate_gone_collection__"  # a gone statement, until its block is folded
_READ = frozenset({"tensorflow.get_collection", "tensorflow.get_collection_ref"})
# Expressions an `if` may test with no effect of its own (no call, no subscript of a mapping).
_PURE = (
    cst.Name, cst.Attribute, cst.Integer, cst.Float, cst.SimpleString, cst.Comparison,
    cst.ComparisonTarget, cst.BooleanOperation, cst.UnaryOperation, cst.BaseCompOp,
    cst.BaseBooleanOp, cst.BaseUnaryOp, cst.LeftParen, cst.RightParen, cst.BaseParenthesizableWhitespace,
)  # fmt: skip


def _gone(statement: cst.BaseStatement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, cst.Name)
        and statement.body[0].value.value == _GONE
    )


def _v1(name: str | None) -> str | None:
    if name is not None and name.startswith("tensorflow.compat.v1."):
        return "tensorflow." + name[len("tensorflow.compat.v1.") :]
    return name


def _key(call: cst.Call, index: int, keyword: str) -> str | None:
    """The collection's name when the call spells it as one string literal."""
    key = get_arg(call, index, keyword)
    if isinstance(key, cst.SimpleString):
        value = key.evaluated_value
        return value if isinstance(value, str) else None
    return None


def unread(model: Path, importer: str) -> frozenset[str]:
    """The literal collection names that ``model`` (a model module of the program whose entry
    is ``importer``, relative to the model's folder) fills and no module of that program reads;
    empty when any module reads a collection by a name that is not a literal."""
    from tfmigrate.convert.project import Project

    project = Project.for_path(model)
    entry = project.load(model.parent / importer)
    source = project.load(model)
    if entry is None or source is None:
        return frozenset()
    files = project.closure(entry)
    if not any(f.path == source.path for f in files):
        files.append(source)
    filled: set[str] = set()
    read: set[str] = set()
    for file in files:
        for node in tree.walk(file.module):
            if not isinstance(node, cst.Call):
                continue
            name = _v1(file.qualify(node.func))
            if name in _READ:
                key = _key(node, 0, "key")
                if key is None:
                    return frozenset()  # read by a name computed at run time: any may be read
                read.add(key)
            elif name == "tensorflow.add_to_collection" and file.path == source.path:
                key = _key(node, 0, "name")
                if key is not None:
                    filled.add(key)
    return frozenset(filled - read)


class DropUnread(cst.CSTTransformer):
    """``tf.add_to_collection('name', value)`` of a collection nothing reads -> a comment (an
    ``if`` with no ``else`` that guards only such statements, on a test with no effect, goes with
    them): comment lines of the next statement of the block, or of the block's end."""

    def __init__(
        self,
        qualify: Callable[[cst.BaseExpression], str | None],
        names: frozenset[str],
        notes: list[str],
    ) -> None:
        self.qualify = qualify
        self.names = names
        self.notes = notes

    def _added(self, statement: cst.CSTNode) -> tuple[str, str] | None:
        """(collection, value as written) when ``statement`` only adds to an unread one."""
        if not (
            isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Expr)
            and isinstance(call := statement.body[0].value, cst.Call)
            and _v1(self.qualify(call.func)) == "tensorflow.add_to_collection"
        ):
            return None
        key = _key(call, 0, "name")
        value = get_arg(call, 1, "value")
        if key is None or key not in self.names or value is None:
            return None
        return key, cst.Module([]).code_for_node(value)

    def _placeholder(
        self, statement: cst.BaseStatement, added: list[tuple[str, str]], when: str | None
    ) -> cst.SimpleStatementLine:
        values = ", ".join(f"`{v}`" for _, v in added)
        keys = ", ".join(sorted({f"'{k}'" for k, _ in added}))
        guard = f" (when `{when}`)" if when else ""
        comments = [
            f"# TF1 added {values} to the graph collection {keys} here{guard};",
            "# nothing in the program reads it, and TF2 has no graph collections.",
        ]
        self.notes.append(
            f"{values} went into the graph collection {keys}, which nothing in the program "
            "reads: TF2 has no graph collections, the statement went (a comment says what it did)"
        )
        lines = [
            *getattr(statement, "leading_lines", ()),
            *(cst.EmptyLine(comment=cst.Comment(c)) for c in comments),
        ]
        return cst.SimpleStatementLine(body=[cst.Expr(cst.Name(_GONE))], leading_lines=lines)

    def _fold(
        self, body: Sequence[cst.BaseStatement]
    ) -> tuple[list[cst.BaseStatement], list[cst.EmptyLine]]:
        """The block's statements with the comments of the gone ones moved onto the next; the
        comments left at its end."""
        out: list[cst.BaseStatement] = []
        pending: list[cst.EmptyLine] = []
        for statement in body:
            if _gone(statement):
                pending.extend(statement.leading_lines)  # type: ignore[attr-defined]  # the gone statement is a SimpleStatementLine
                continue
            if pending:
                own = list(getattr(statement, "leading_lines", ()))
                statement = statement.with_changes(leading_lines=[*pending, *own])
                pending = []
            out.append(statement)
        return out, pending

    def leave_IndentedBlock(self, original_node, updated_node):
        body, pending = self._fold(updated_node.body)
        if not body:
            return updated_node.with_changes(
                body=[cst.SimpleStatementLine([cst.Pass()], leading_lines=pending)]
            )
        return updated_node.with_changes(body=body, footer=[*pending, *updated_node.footer])

    def leave_Module(self, original_node, updated_node):
        body, pending = self._fold(updated_node.body)
        return updated_node.with_changes(body=body, footer=[*pending, *updated_node.footer])

    def leave_SimpleStatementLine(self, original_node, updated_node):
        added = self._added(original_node)
        if added is None:
            return updated_node
        return self._placeholder(updated_node, [added], None)

    def on_visit(self, node: cst.CSTNode) -> bool:
        return not (isinstance(node, cst.If) and self._guard(node) is not None)

    def on_leave(self, original_node, updated_node):
        if isinstance(original_node, cst.If):
            guarded = self._guard(original_node)
            if guarded is not None:
                when = cst.Module([]).code_for_node(original_node.test)
                return self._placeholder(original_node, guarded, when)
        return super().on_leave(original_node, updated_node)

    def _guard(self, node: cst.If) -> list[tuple[str, str]] | None:
        if node.orelse is not None or not isinstance(node.body, cst.IndentedBlock):
            return None
        if not all(isinstance(n, _PURE) for n in tree.walk(node.test)):
            return None
        added = [self._added(s) for s in node.body.body]
        if not added or any(a is None for a in added):
            return None
        return [a for a in added if a is not None]
