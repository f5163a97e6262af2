"""Horovod programs whose step is built in another module than the entry's ``hvd.init()``: the
entry script calls a repo module that builds the per-process step and its update (a
hand-written update of the program's own, which all-reduces the gradients through a helper
module). Each module of the program is converted from its own side, from one reading of the
program (the entry and the repo modules it imports, each parsed once):

- the module that builds and runs the step gets the train step (``horovod_emit``), the strategy
  taken from ``tf.distribute.get_strategy()``;
- the entry makes the MultiWorkerMirroredStrategy where the program starts and sets it as the
  program's strategy; its session goes;
- a module whose helpers call Horovod (``hvd.mpi_ops._allreduce``, ``hvd.size()``) gets their
  strategy counterparts: the replica context's ``all_reduce``, the strategy's replica count.

A module is converted only when its program's step plans; a module other scripts of the repo
import too is named so in the finding (they get the converted module as well)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from tfmigrate.convert import ir
from tfmigrate.convert.emit import Emitted, _left
from tfmigrate.convert.horovod_plan import HorovodPlan, horovod_api, plan_horovod
from tfmigrate.convert.plan import _SESSIONS, NotPlanned, _target_name, _value
from tfmigrate.convert.project import Project, SourceFile
from tfmigrate.convert.recognize import read_program
from tfmigrate.convert.todo import Leftover, Todo
from tfmigrate.rule import RuleContext

# Horovod calls outside the step module, spelled with the program's strategy.
_SIZE = "tf.distribute.get_strategy().num_replicas_in_sync"
_TASK = "(tf.distribute.get_strategy().cluster_resolver.task_id or 0)"
_HELPER_MAPPED = {"size": _SIZE, "rank": _TASK, "local_rank": _TASK}
# hvd.allreduce averages by default; the private _allreduce sums.
_ALLREDUCE = {"_allreduce": "SUM", "allreduce": "MEAN"}


@dataclass(frozen=True)
class StepProgram:
    """A Horovod program whose step another module than the entry builds."""

    entry: SourceFile
    step: SourceFile
    core: ir.TowerCore
    program: ir.Program
    modules: list[SourceFile]  # the entry and the repo modules it imports


def step_program(path: Path) -> StepProgram | str | None:
    """The program ``path`` belongs to when its step is built in a module other than the
    entry's, or why it does not plan (None: not such a program)."""
    path = path.resolve()
    if not path.is_file():  # source text with no file (a rule's example): no program around it
        return None
    project = Project.for_path(path)
    for entry_path in _entries(project, path):
        entry = project.load(entry_path)
        if entry is None:
            continue
        reading = read_program(project, entry)
        if reading.program is None:
            continue
        modules = project.closure(entry)
        cores = [
            c
            for c in reading.program.cores
            if c.towers is None
            and c.combination.kind is ir.CombineKind.HOROVOD
            and c.update.kind is ir.UpdateKind.HAND_WRITTEN
        ]
        reasons = []
        for core in cores:
            for module in modules:
                if module is entry:
                    continue
                try:
                    plan_horovod(module, reading.program, core)
                except NotPlanned as refused:
                    if "in another module" not in str(refused):
                        reasons.append(f"{module.rel}: {refused}")
                    continue
                return StepProgram(entry, module, core, reading.program, modules)
        if reasons:
            return "; ".join(reasons)
    return None


def _entries(project: Project, path: Path) -> list[Path]:
    """Files calling ``hvd.init()`` whose program holds ``path`` (``path`` first)."""
    found = []
    for candidate in project.python_files():
        raw = candidate.read_bytes()
        if b"horovod" not in raw or b".init(" not in raw:
            continue
        source = project.load(candidate)
        if source is None or not any(
            isinstance(n, cst.Call) and horovod_api(source, n) == "init"
            for n in _walk(source.module)
        ):
            continue
        if candidate.resolve() == path or path in {s.path for s in project.closure(source)}:
            found.append(candidate.resolve())
    return sorted(found, key=lambda p: p != path)


def other_importers(program: StepProgram, path: Path) -> list[str]:
    """Scripts of the repo outside the program that import the module at ``path``."""
    project = Project.for_path(program.entry.path)
    inside = {s.path for s in program.modules}
    found = []
    for candidate in project.python_files():
        candidate = candidate.resolve()
        if candidate in inside or path.stem.encode() not in candidate.read_bytes():
            continue
        source = project.load(candidate)
        if source is not None and any(t.file == path for t in source.imports.values()):
            found.append(os.path.relpath(candidate, path.parent))
    return found


# -- the module that builds the step ---------------------------------------------------------------
def convert_step_module(context: RuleContext, program: StepProgram) -> Emitted | str:
    """The step module: the train step, as horovod_emit writes it."""
    from tfmigrate.convert import read_staged
    from tfmigrate.convert.horovod_emit import _tf2_spellings, emit_horovod

    read = read_staged(context)
    if isinstance(read, str):
        return read
    source, whole = read
    try:
        plan: HorovodPlan = plan_horovod(source, whole, program.core)
        emitted = emit_horovod(plan)
    except NotPlanned as refused:
        return str(refused)
    return Emitted(_tf2_spellings(context, emitted.module), emitted.todos, emitted.notes)


# -- the entry ---------------------------------------------------------------------------------------
def convert_entry(context: RuleContext) -> Emitted:
    """The entry: the strategy made first and set as the program's, its session gone (what
    reads it besides passing it on is left under a TODO), Horovod's calls the strategy's."""
    from tfmigrate.convert import _device_settings_first
    from tfmigrate.convert.horovod_emit import _Horovod, _tf2_spellings, _unpinned

    unpinned = _unpinned(context)
    project = Project.for_path(Path(str(context.path)))
    source = project.adopt(Path(str(context.path)), _device_settings_first(unpinned))
    writer = _Entry(source)
    module = source.module.visit(writer)
    module = _strategy_first(module)
    module = module.visit(_Horovod(source))
    notes = [
        "the strategy is made when the program starts and set as its strategy "
        "(tf.distribute.experimental_set_strategy): the module that builds the train step "
        "takes it from tf.distribute.get_strategy()",
        *writer.notes,
    ]
    if unpinned is not context:
        notes.insert(0, "the GPU pinning with hvd.local_rank() went: a MultiWorkerMirroredStrategy "
                     "worker uses the GPUs it sees")  # fmt: skip
    return Emitted(_tf2_spellings(context, module), writer.todos, notes)


class _Entry(cst.CSTTransformer):
    def __init__(self, source: SourceFile) -> None:
        self.source = source
        self.todos: list[Todo] = []
        self.notes: list[str] = []
        self.factories = self._factories()
        self.sessions: set[str] = set()
        for node in _walk(source.module):
            if isinstance(node, cst.SimpleStatementLine) and self._makes_session(node):
                name = _target_name(node)
                if name is not None:
                    self.sessions.add(name)

    def _is_session(self, node: cst.CSTNode | None) -> bool:
        if not isinstance(node, cst.Call):
            return False
        if self.source.qualify(node.func) in _SESSIONS:
            return True
        return isinstance(node.func, cst.Name) and node.func.value in self.factories

    def _makes_session(self, statement: cst.SimpleStatementLine) -> bool:
        return self._is_session(_value(statement))

    def _factories(self) -> set[str]:
        """Module functions returning the session they make (``tensorflow_session()``)."""
        found = set()
        for statement in self.source.module.body:
            if not isinstance(statement, cst.FunctionDef):
                continue
            made = {
                _target_name(s)
                for s in _walk(statement)
                if isinstance(s, cst.SimpleStatementLine)
                and self.source.qualify(getattr(_value(s), "func", cst.Name("x"))) in _SESSIONS
            }
            for node in _walk(statement):
                if isinstance(node, cst.Return) and (
                    (isinstance(node.value, cst.Name) and node.value.value in made)
                    or (
                        isinstance(node.value, cst.Call)
                        and self.source.qualify(node.value.func) in _SESSIONS
                    )
                ):
                    found.add(statement.name.value)
        return found

    def leave_SimpleStatementLine(self, original_node, updated_node):
        small = original_node.body[0]
        value = small.value if isinstance(small, cst.Assign | cst.Expr | cst.Return) else None
        if isinstance(value, cst.Call) and horovod_api(self.source, value) == "init":
            return cst.RemoveFromParent()  # the strategy is made where the program starts
        if isinstance(value, cst.Call) and horovod_api(self.source, value) in (
            "broadcast_global_variables",
        ):
            return cst.RemoveFromParent()
        if (
            isinstance(small, cst.Assign)
            and isinstance(value, cst.Call)
            and isinstance(value.func, cst.Name)
            and value.func.value in self.factories
        ):
            # the factory's other settings (tf.config) still run; its session is gone
            return updated_node.with_changes(body=[cst.Expr(updated_node.body[0].value)])
        if self._is_session(value) or (
            isinstance(small, cst.Return)
            and isinstance(small.value, cst.Name)
            and small.value.value in self.sessions
        ):
            return cst.RemoveFromParent()  # TF2 runs eagerly: no session
        names = {n.value for n in _walk(original_node) if isinstance(n, cst.Name)}
        if names & self.sessions:
            passed = self._passed_on(original_node)
            if not (names & self.sessions) - passed:
                return updated_node.visit(_SessionArgument(self.sessions))
            todo = Todo(
                Leftover.SESSION, f"uses the TF1 session `{sorted(names & self.sessions)[0]}`"
            )
            return _left(original_node, updated_node, todo, self.todos, self.source.module)
        calls = [n for n in _walk(original_node) if isinstance(n, cst.Call)]
        for call in calls:
            api = horovod_api(self.source, call)
            if api is not None and api not in _HELPER_MAPPED:
                todo = Todo(
                    Leftover.GRAPH, f"Horovod `{api}` has no MultiWorkerMirroredStrategy form"
                )
                return _left(original_node, updated_node, todo, self.todos, self.source.module)
        return updated_node

    def leave_IndentedBlock(self, original_node, updated_node):
        if not updated_node.body:
            return updated_node.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
        return updated_node

    def _passed_on(self, statement: cst.CSTNode) -> set[str]:
        """Sessions only passed as a whole argument of a call (to the module that builds the
        step, whose runs are converted there)."""
        passed = set()
        for node in _walk(statement):
            if isinstance(node, cst.Arg) and isinstance(node.value, cst.Name):
                if node.value.value in self.sessions:
                    passed.add(node.value.value)
        others = [
            n for n in _walk(statement) if isinstance(n, cst.Name) and n.value in self.sessions
        ]
        if len(others) != sum(
            1
            for n in _walk(statement)
            if isinstance(n, cst.Arg) and isinstance(n.value, cst.Name) and n.value.value in passed
        ):
            return set()
        if passed:
            self.notes.append(
                f"line {self.source.line(statement)}: the session argument is None: the module "
                "the session was passed to runs no session now"
            )
        return passed


class _SessionArgument(cst.CSTTransformer):
    def __init__(self, sessions: set[str]) -> None:
        self.sessions = sessions

    def leave_Arg(self, original_node, updated_node):
        if isinstance(original_node.value, cst.Name) and original_node.value.value in self.sessions:
            return updated_node.with_changes(value=cst.Name("None"))
        return updated_node


def _strategy_first(module: cst.Module) -> cst.Module:
    """The strategy after the imports (before any TF op runs, as collectives need), set as the
    program's strategy for the modules that build the step."""
    body = list(module.body)
    at = 0
    for position, statement in enumerate(body):
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if isinstance(small, cst.Import | cst.ImportFrom) or (
            isinstance(small, cst.Expr) and isinstance(small.value, cst.SimpleString)
        ):
            at = position + 1
            continue
        break
    lines = [
        cst.parse_statement("strategy = tf.distribute.MultiWorkerMirroredStrategy()").with_changes(
            leading_lines=[
                cst.EmptyLine(),
                cst.EmptyLine(),
                _comment(
                    "One process per machine (not per GPU): the cluster comes from TF_CONFIG."
                ),
                _comment("The modules that build the train step get it from tf.distribute."),
            ]
        ),
        cst.parse_statement("tf.distribute.experimental_set_strategy(strategy)"),
    ]
    return module.with_changes(body=[*body[:at], *lines, *body[at:]])


# -- modules of helpers calling Horovod ---------------------------------------------------------------
def convert_helpers(context: RuleContext) -> Emitted:
    """``hvd.mpi_ops._allreduce(x)`` -> the replica context's all_reduce (SUM),
    ``hvd.allreduce(x)`` -> its MEAN, ``hvd.size()`` / ``hvd.rank()`` -> the program's
    strategy's; any other Horovod call is left under a TODO."""
    from tfmigrate.convert.horovod_emit import _Horovod, _tf2_spellings

    project = Project.for_path(Path(str(context.path)))
    source = project.adopt(Path(str(context.path)), context)
    helpers = _Helpers(source)
    module = source.module.visit(helpers)
    module = module.visit(_Horovod(source))  # its imports
    notes = [
        "Horovod's allreduce in the helpers became the replica context's all_reduce: the "
        "update calls them inside the train step's replica function"
    ]
    return Emitted(_tf2_spellings(context, module), helpers.todos, notes)


class _Helpers(cst.CSTTransformer):
    def __init__(self, source: SourceFile) -> None:
        self.source = source
        self.todos: list[Todo] = []

    def leave_Call(self, original_node, updated_node):
        api = horovod_api(self.source, original_node)
        if api in _HELPER_MAPPED and not original_node.args:
            return cst.parse_expression(_HELPER_MAPPED[api])
        if api in _ALLREDUCE and len(original_node.args) == 1:
            reduction = cst.parse_expression(f"tf.distribute.ReduceOp.{_ALLREDUCE[api]}")
            return cst.Call(
                cst.parse_expression("tf.distribute.get_replica_context().all_reduce"),
                [
                    cst.Arg(reduction),
                    updated_node.args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT),
                ],
            )
        return updated_node

    def leave_SimpleStatementLine(self, original_node, updated_node):
        for call in (n for n in _walk(original_node) if isinstance(n, cst.Call)):
            api = horovod_api(self.source, call)
            if api is not None and api not in _HELPER_MAPPED and api not in _ALLREDUCE:
                todo = Todo(
                    Leftover.GRAPH, f"Horovod `{api}` has no MultiWorkerMirroredStrategy form"
                )
                return _left(original_node, updated_node, todo, self.todos, self.source.module)
        return updated_node


def _comment(text: str) -> cst.EmptyLine:
    return cst.EmptyLine(comment=cst.Comment(f"# {text}"))


def _walk(node: cst.CSTNode) -> list[cst.CSTNode]:
    found, stack = [], [node]
    while stack:
        current = stack.pop()
        found.append(current)
        stack.extend(current.children)
    return found
