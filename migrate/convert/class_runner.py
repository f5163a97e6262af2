"""A class-based tower trainer whose object is made and run in another module: the towers are
built in ``__init__`` of a model class, and a function of another repo module (the entry script,
or a module it imports) makes the object (``model = Model(hps)``) and runs its update in a
session (``sess.run([model.train_op, model.loss], feed)``). That function is the trainer's loop:
the planner reads it after the building method, as it reads a method of the class that runs the
step, and each module gets its part -- the class its train step, the function the call of it.

``JoinedSource`` is the towers' module read together with the running function's module: the
planner asks one source for lines, parents and qualified names, and nodes of the running module
answer from that module."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import libcst as cst

from tfmigrate import tree
from tfmigrate.convert.ir import Where
from tfmigrate.convert.project import Project, SourceFile
from tfmigrate.names import dotted
from tfmigrate.rules._towers import get_arg, method_name


@dataclass(frozen=True)
class ForeignRunner:
    """The function of another module that makes the object and runs its update, and its name
    for the object."""

    source: SourceFile
    function: cst.FunctionDef
    receiver: str


@dataclass(eq=False)
class JoinedSource(SourceFile):
    """The towers' module (its own fields) with the module of the function running them
    (``guest``): a node of the guest is placed, parented and qualified by the guest."""

    guest: SourceFile | None = None

    @classmethod
    def of(cls, host: SourceFile, guest: SourceFile) -> JoinedSource:
        return cls(
            host.path,
            host.rel,
            host.module,
            host.context,
            host.raw,
            host.imports,
            host.star_imports,
            host.extra_paths,
            host.shared,
            guest=guest,
        )

    def _guest_of(self, node: cst.CSTNode) -> SourceFile | None:
        guest = self.guest
        if guest is None or self.context.parent_of(node) is not None or node is self.module:
            return None
        return guest if guest.context.parent_of(node) is not None else None

    def is_guest(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` is in the running function's module."""
        return self._guest_of(node) is not None

    def qualify(self, node: cst.BaseExpression) -> str | None:
        guest = self._guest_of(node)
        return guest.qualify(node) if guest is not None else super().qualify(node)

    def line(self, node: cst.CSTNode) -> int:
        guest = self._guest_of(node)
        return guest.line(node) if guest is not None else super().line(node)

    def where(self, node: cst.CSTNode) -> Where:
        guest = self._guest_of(node)
        return guest.where(node) if guest is not None else super().where(node)

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        found = self.context.parent_of(node)
        if found is None and self.guest is not None:
            found = self.guest.context.parent_of(node)
        return found


def foreign_runner(
    source: SourceFile, cls: cst.ClassDef, assigned: set[str], updates: set[str]
) -> ForeignRunner | None:
    """The module-level function of another module of the project that binds
    ``name = Cls(...)`` (the class of ``source`` it imports) and whose ``Session.run`` fetches
    ``name.x`` for a ``self.x`` of ``assigned`` -- one fetching an attribute of ``updates``
    (the update's) first."""
    project = source.shared.get("project")
    if not isinstance(project, Project):
        return None
    spelled = cls.name.value.encode()
    found: list[tuple[bool, ForeignRunner]] = []
    for path in project.python_files():
        if path.resolve() == source.path.resolve():
            continue
        try:
            raw = path.read_bytes()
        except OSError:
            continue
        if spelled not in raw or b".run(" not in raw:
            continue
        other = project.load(path)
        if other is None:
            continue
        for function, receiver, keys in _runs_of(project, other, source, cls):
            fetched = {f"self.{key}" for key in keys}
            if fetched & assigned:
                found.append((bool(fetched & updates), ForeignRunner(other, function, receiver)))
    found.sort(key=lambda item: not item[0])  # stable: the update's runner first
    if not found:
        return None
    return _with_device_settings(project, found[0][1], source, cls)


def _with_device_settings(
    project: Project, runner: ForeignRunner, source: SourceFile, cls: cst.ClassDef
) -> ForeignRunner:
    """The runner read from its module with the sessions' device settings already moved to
    tf.config (TFM105's rewrite, as the towers' module gets it): the conversion then drops a
    session that carries no settings."""
    from tfmigrate.convert import _device_settings_first

    moved = project.adopt(runner.source.path, _device_settings_first(runner.source.context))
    name = runner.function.name.value
    for function, receiver, _keys in _runs_of(project, moved, source, cls):
        if function.name.value == name and receiver == runner.receiver:
            return ForeignRunner(moved, function, receiver)
    return runner


def _runs_of(
    project: Project, other: SourceFile, source: SourceFile, cls: cst.ClassDef
) -> Iterator[tuple[cst.FunctionDef, str, set[str]]]:
    """(function, object name, attributes of it fetched) for each module-level function of
    ``other`` binding an object of ``cls`` and running it."""
    for function in other.module.body:
        if not isinstance(function, cst.FunctionDef):
            continue
        body = function.body
        statements = list(_statements(body.body if isinstance(body, cst.IndentedBlock) else []))
        objects = {
            target.value
            for statement in statements
            if (made := _assigned(statement)) is not None
            and isinstance(target := made[0], cst.Name)
            and isinstance(made[1], cst.Call)
            and _is_class(project, other, made[1].func, source, cls)
        }
        if not objects:
            continue
        for receiver in sorted(objects):
            keys = set()
            for fetches in _fetches(function, statements):
                for node in tree.walk(fetches):
                    if (
                        isinstance(node, cst.Attribute)
                        and isinstance(node.value, cst.Name)
                        and node.value.value == receiver
                    ):
                        keys.add(node.attr.value)
            if keys:
                yield function, receiver, keys


def _is_class(
    project: Project,
    other: SourceFile,
    func: cst.BaseExpression,
    source: SourceFile,
    cls: cst.ClassDef,
) -> bool:
    name = dotted(func)
    if name is None:
        return False
    defined = project.definition(other, name)
    return (
        defined is not None
        and defined[0].path.resolve() == source.path.resolve()
        and isinstance(defined[1], cst.ClassDef)
        and defined[1].name.value == cls.name.value
    )


def _fetches(
    function: cst.FunctionDef, statements: list[cst.BaseStatement]
) -> Iterator[cst.BaseExpression]:
    """What each ``x.run(fetches, ...)`` of ``function`` fetches; a fetched name bound in the
    function (``fetches = [model.loss, model.train_op]``) gives what it is bound to."""
    bound: dict[str, list[cst.BaseExpression]] = {}
    for statement in statements:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)
            ):
                bound.setdefault(small.targets[0].target.value, []).append(small.value)
            elif isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name):
                bound.setdefault(small.target.value, []).append(small.value)
    for node in tree.walk(function):
        if not isinstance(node, cst.Call) or method_name(node) != "run":
            continue
        fetches = get_arg(node, 0, "fetches")
        if fetches is None:
            continue
        yield fetches
        if isinstance(fetches, cst.Name):
            yield from bound.get(fetches.value, ())


def _assigned(statement: cst.BaseStatement) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        return small.targets[0].target, small.value
    return None


def _statements(block: Iterable[cst.BaseStatement]) -> Iterator[cst.BaseStatement]:
    """Every statement of a block, nested ones included, not into nested defs."""
    for statement in block:
        yield statement
        if isinstance(statement, cst.FunctionDef | cst.ClassDef):
            continue
        for name in ("body", "orelse", "finalbody"):
            part = getattr(statement, name, None)
            if isinstance(part, cst.Else | cst.Finally):
                part = part.body
            if isinstance(part, cst.If):
                yield from _statements([part])
            elif isinstance(part, cst.IndentedBlock):
                yield from _statements(part.body)
        for handler in getattr(statement, "handlers", ()):
            if isinstance(handler.body, cst.IndentedBlock):
                yield from _statements(handler.body.body)
