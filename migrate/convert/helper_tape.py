"""A tower whose gradients are taken in a function it calls (``loss, grads =
self._compute_net_gradients(x, y, opt)``): that function gets the ``GradientTape``. Its
forward pass runs under the tape, its gradient call becomes ``tape.gradient``, and it still
returns what it returned, so the tower calls it as before."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import libcst as cst
from libcst.helpers import parse_template_expression, parse_template_statement

from tfmigrate.convert.plan import GradientHelper, Plan, bound_names, free_names
from tfmigrate.convert.project import ENTRY_BYTES, Project, SourceFile
from tfmigrate.convert.todo import Leftover, Todo
from tfmigrate.names import dotted
from tfmigrate.tree import walk

_TRAINABLES = frozenset(
    {"tensorflow.trainable_variables", "tensorflow.compat.v1.trainable_variables"}
)


def taped_helpers(module: cst.Module, plan: Plan, todos: list[Todo] | None = None) -> cst.Module:
    """``module`` with each gradient helper of ``plan`` in it replaced by its taped version
    (a helper of another module is taped there: ``module_helpers``); the TODOs it marks join
    ``todos``."""
    for chain in plan.chains:
        helper = chain.gradient.helper
        if helper is None or helper.source is not None:
            continue
        taped = _taped(plan.source, helper, chain.averaged, todos)
        module = module.visit(_ReplaceDef(_path(plan.source, helper.function), taped))
    return module


@dataclass(frozen=True)
class ModuleHelpers:
    """The gradient helpers a converted tower program ``program`` calls in another module,
    each taped there; ``others`` are the module's other importers (they see the change)."""

    program: str
    taped: tuple[tuple[tuple[str, ...], cst.FunctionDef], ...]
    others: tuple[str, ...]
    unsafe: bool  # the program's conversion is an unsafe fix


def module_helpers(path: Path, module: cst.Module) -> ModuleHelpers | None:
    """``module`` (the file at ``path``) as a tower program that imports it needs it: the
    gradient helpers the program's towers call in it, taped. None when no converted program of
    the repo calls a helper here."""
    path = path.resolve()
    for program, plan, importers, unsafe in converted_programs(path):
        taped = [
            (
                _path(helper.source, helper.function),
                _taped(helper.source, helper, chain.averaged),
            )
            for chain in plan.chains
            if (helper := chain.gradient.helper) is not None
            and helper.source is not None
            and helper.source.path == path
        ]
        if taped:
            others = tuple(i for i in importers if i != program)
            return ModuleHelpers(program, tuple(taped), others, unsafe)
    return None


def converted_programs(path: Path) -> Iterator[tuple[str, Plan, list[str], bool]]:
    """The tower programs of the repo that run code of the module at ``path`` (it is in the
    modules they import, directly or not) and that the staged converter converts: each
    program's name relative to the module's folder, its plan, the module's direct importers
    (likewise named), and whether the program's conversion is an unsafe fix (its modules'
    changes are then unsafe too: they apply with it or not at all)."""
    path = path.resolve()
    if not path.is_file():  # source text with no file (a rule's example): no program imports it
        return
    project, programs = _converted(Project.for_path(path).root, path, _signature(path))

    def named(other: Path) -> str:
        return Path(os.path.relpath(other.resolve(), path.parent)).as_posix()

    importers = [
        named(s.path)
        for s in project.loaded()
        if s.path != path and any(t.file == path for t in s.imports.values())
    ]
    for source, plan, unsafe in programs:
        if any(s.path == path for s in project.closure(source)):
            yield named(source.path), plan, importers, unsafe


def _signature(path: Path) -> tuple[tuple[str, int], ...]:
    """The project's Python files with their modification times: a cached reading holds
    while they are unchanged."""
    project = Project.for_path(path)
    return tuple(
        (str(f), f.stat().st_mtime_ns) for f in sorted(project.python_files()) if f.exists()
    )


Converted = tuple[SourceFile, Plan, bool]


@lru_cache(maxsize=8)
def _project(
    root: Path, _files: tuple[tuple[str, int], ...]
) -> tuple[Project, dict[Path, Converted | None]]:
    """The project at ``root`` and the programs converted in it so far (once per process while
    its files are unchanged: each of a program's modules asks)."""
    return Project(root), {}


def _converted(
    root: Path, module: Path, files: tuple[tuple[str, int], ...]
) -> tuple[Project, list[Converted]]:
    """Every entry program of the project at ``root`` that runs code of ``module`` and that the
    staged converter converts, with its plan. Programs that do not import the module are not
    converted for it: a repo holds many entry programs, and converting each costs seconds."""
    project, done = _project(root, files)
    programs: list[Converted] = []
    # a file can only import the module if it names it (`__init__.py`: its package)
    name = (module.parent.name if module.name == "__init__.py" else module.stem).encode()
    for candidate in project.python_files():
        data = candidate.read_bytes()
        if name in data:
            project.load(candidate)  # the module's importers
        if b"device" not in data or not ENTRY_BYTES.search(data):
            continue
        source = project.load(candidate)
        if source is None or not source.is_entry():
            continue
        if not any(s.path == module for s in project.closure(source)):
            continue
        if source.path not in done:
            done[source.path] = _converted_program(project, source)
        converted = done[source.path]
        if converted is not None:
            programs.append(converted)
    return project, programs


def _converted_program(project: Project, source: SourceFile) -> Converted | None:
    """The entry program's plan if the staged converter converts it, and whether its fix is
    unsafe (as TFM303 judges it: code commented out or changed to per replica)."""
    from tfmigrate.convert.emit import emit_file_program

    converted = emit_file_program(project, source)
    if converted is None:
        return None
    plan, emitted = converted
    return source, plan, any(t.unsafe for t in emitted.todos)


def program_running(path: Path) -> tuple[str, bool] | None:
    """The converted tower program whose towers or update run this module's TF1 code (the
    module holds, or is imported directly or not by the module holding, the towers' gradient
    helper or the update function the program calls in another module), and whether the
    program's conversion is an unsafe fix."""
    path = path.resolve()
    for program, plan, _importers, unsafe in converted_programs(path):
        project = plan.source.shared.get("project")
        if not isinstance(project, Project):
            continue
        holders: list[SourceFile] = []
        for chain in plan.chains:
            helper = chain.gradient.helper
            if helper is not None and helper.source is not None:
                holders.append(helper.source)
            name = dotted(chain.update_call.func)
            if chain.update_function is not None and name is not None:
                defined = project.definition(plan.source, name)
                if defined is not None and defined[0] is not plan.source:
                    holders.append(defined[0])
        if any(s.path == path for holder in holders for s in project.closure(holder)):
            return program, unsafe
    return None


def with_helpers(module: cst.Module, helpers: ModuleHelpers) -> cst.Module:
    for where, taped in helpers.taped:
        module = module.visit(_ReplaceDef(where, taped))
    return module


def _path(source: SourceFile, function: cst.FunctionDef) -> tuple[str, ...]:
    """The names of the classes and functions holding ``function``, outermost first, and its own."""
    holders = [
        node.name.value
        for node in source.ancestors(function)
        if isinstance(node, cst.ClassDef | cst.FunctionDef)
    ]
    return (*reversed(holders), function.name.value)


def _taped(
    source: SourceFile, helper: GradientHelper, averaged: bool, todos: list[Todo] | None = None
) -> cst.FunctionDef:
    if helper.handed:
        return _handed(source, helper, averaged, [] if todos is None else todos)
    function = helper.function
    assert isinstance(function.body, cst.IndentedBlock)
    body: Sequence[cst.BaseStatement] = function.body.body
    at = list(body).index(helper.statement)
    first = 1 if body and _is_docstring(body[0]) else 0
    taken = bound_names(function) | free_names(function)
    tape = next(n for n in ("tape", "grad_tape", "gradient_tape") if n not in taken)
    loss = helper.call.args[0].value
    variables = _variables(helper.call)
    replaced: dict[int, cst.CSTNode] = {
        id(helper.call): _gradient(helper.call, tape, averaged, variables)
    }
    forward = [s.visit(_Trainables(source, tape, replaced)) for s in body[first:at]]
    if averaged:
        scaled = parse_template_statement(
            "replica_loss = {loss} / tf.distribute.get_replica_context().num_replicas_in_sync",
            loss=loss,
        ).with_changes(
            leading_lines=[
                cst.EmptyLine(
                    comment=cst.Comment(
                        "# The towers averaged their gradients; apply_gradients sums the replicas'."
                    )
                )
            ]
        )
        forward.append(scaled)
    taped = cst.With(
        items=[
            cst.WithItem(
                cst.parse_expression("tf.GradientTape()"), asname=cst.AsName(cst.Name(tape))
            )
        ],
        body=cst.IndentedBlock(body=forward or [cst.SimpleStatementLine([cst.Pass()])]),  # type: ignore[arg-type]  # visited statements stay statements
    )
    rest = [s.visit(_Trainables(source, tape, replaced)) for s in body[at:]]
    return function.with_changes(
        body=function.body.with_changes(body=[*body[:first], taped, *rest])
    )


_CLIPS = frozenset(
    {"tensorflow.clip_by_global_norm", "tensorflow.clip_by_norm", "tensorflow.clip_by_average_norm"}
)


def _handed(
    source: SourceFile, helper: GradientHelper, averaged: bool, todos: list[Todo]
) -> cst.FunctionDef:
    """A helper differentiating the loss the tower hands it (``self._backward(loss)``): the
    forward pass ran under the tower's tape, which the tower hands it too (``tape=tape``, a
    keyword-only parameter); its gradient call becomes ``tape.gradient``, of its loss divided
    by the replica count when the towers averaged. A clip of the gradients after that sees
    the replica's share (TODO: the tower's whole gradient was clipped)."""
    function = helper.function
    assert isinstance(function.body, cst.IndentedBlock)
    body = list(function.body.body)
    at = body.index(helper.statement)
    loss = helper.call.args[0].value
    replaced: dict[int, cst.CSTNode] = {
        id(helper.call): _gradient(helper.call, "tape", averaged, _variables(helper.call))
    }
    before = [s.visit(_Trainables(source, "tape", replaced)) for s in body[:at]]
    rest = [s.visit(_Trainables(source, "tape", replaced)) for s in body[at:]]
    if averaged:
        scaled = parse_template_statement(
            "replica_loss = {loss} / tf.distribute.get_replica_context().num_replicas_in_sync",
            loss=loss,
        ).with_changes(
            leading_lines=[
                *getattr(body[at], "leading_lines", ()),
                cst.EmptyLine(
                    comment=cst.Comment(
                        "# The towers averaged their gradients; apply_gradients sums the replicas'."
                    )
                ),
            ]
        )
        rest[0] = rest[0].with_changes(leading_lines=[])  # type: ignore[union-attr]  # statements
        rest.insert(0, scaled)
        rest = [_clip_marked(source, s, todos) for s in rest]  # type: ignore[arg-type]  # visited statements stay statements
    params = function.params
    star = (
        params.star_arg if not isinstance(params.star_arg, cst.MaybeSentinel) else cst.ParamStar()
    )
    params = params.with_changes(
        star_arg=star, kwonly_params=[*params.kwonly_params, cst.Param(cst.Name("tape"))]
    )
    return function.with_changes(
        params=params, body=function.body.with_changes(body=[*before, *rest])
    )


def _clip_marked(source: SourceFile, statement: cst.BaseStatement, todos: list[Todo]):
    """A statement clipping the gradients by a norm, with its TODO at the end of its line."""
    if not isinstance(statement, cst.SimpleStatementLine) or statement.trailing_whitespace.comment:
        return statement
    calls = [
        n for n in walk(statement) if isinstance(n, cst.Call) and source.qualify(n.func) in _CLIPS
    ]
    if not calls:
        return statement
    todo = Todo(
        Leftover.PER_REPLICA,
        "clips the replica's share of the tower's gradients (its loss divided by the replica "
        "count): the tower clipped its whole gradients; divide the clip norm by "
        "the replica count to clip as it did",
        commented=False,
    )
    todos.append(todo)
    return statement.with_changes(
        trailing_whitespace=cst.TrailingWhitespace(
            whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(todo.marker())
        )
    )


def _variables(call: cst.Call) -> cst.BaseExpression | None:
    for position, arg in enumerate(call.args):
        if (arg.keyword is None and position == 1) or (
            arg.keyword is not None and arg.keyword.value in ("var_list", "xs")
        ):
            return arg.value
    return None


def _gradient(
    call: cst.Call, tape: str, averaged: bool, variables: cst.BaseExpression | None
) -> cst.BaseExpression:
    """``opt.compute_gradients(loss[, var_list])`` as (gradient, variable) pairs of the tape,
    ``tf.gradients(ys, xs)`` as its gradients; no variables named: the ones the tape saw."""
    loss = cst.Name("replica_loss") if averaged else call.args[0].value
    listed = (
        variables if variables is not None else cst.parse_expression(f"{tape}.watched_variables()")
    )
    taped = cst.Name(tape)
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "compute_gradients":
        return parse_template_expression(
            "list(zip({tape}.gradient({loss}, {listed}), {listed}))",
            tape=taped,
            loss=loss,
            listed=listed,
        )
    return parse_template_expression(
        "{tape}.gradient({loss}, {listed})", tape=taped, loss=loss, listed=listed
    )


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, cst.SimpleString | cst.ConcatenatedString)
    )


class _Trainables(cst.CSTTransformer):
    """The gradient call replaced; all trainables (a TF1 graph collection) read as the
    variables the tape saw the forward pass use."""

    def __init__(self, source: SourceFile, tape: str, replaced: dict[int, cst.CSTNode]) -> None:
        self.source, self.tape, self.replaced = source, tape, replaced

    def leave_Call(self, original_node, updated_node):
        if id(original_node) in self.replaced:
            return self.replaced[id(original_node)]
        if self.source.qualify(original_node.func) in _TRAINABLES:
            return cst.parse_expression(f"{self.tape}.watched_variables()")
        return updated_node


class _ReplaceDef(cst.CSTTransformer):
    """The function at ``path`` (holders' names, then its own) replaced by ``new``."""

    def __init__(self, path: tuple[str, ...], new: cst.FunctionDef) -> None:
        self.path, self.new = path, new
        self.stack: list[str] = []

    def visit_ClassDef(self, node):
        self.stack.append(node.name.value)

    def leave_ClassDef(self, original_node, updated_node):
        self.stack.pop()
        return updated_node

    def visit_FunctionDef(self, node):
        self.stack.append(node.name.value)

    def leave_FunctionDef(self, original_node, updated_node):
        here = tuple(self.stack)
        self.stack.pop()
        return self.new if here == self.path else updated_node
