"""The emit stage: a plan written into the module -- the tower loop as one ``@tf.function`` train
step whose replica function takes its gradients with a ``GradientTape`` and applies them, the
session's step run as a call of it, and every statement left to the user under its TODO.

Emission never refuses: everything it needs was decided by the plan."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import libcst as cst
from libcst.helpers import parse_template_expression, parse_template_statement

from tfmigrate import tree
from tfmigrate.convert import per_gpu_emit
from tfmigrate.convert.class_runner import JoinedSource
from tfmigrate.convert.helper_tape import taped_helpers
from tfmigrate.convert.plan import (
    MONITORED_GOES,
    RECEIVER,
    Action,
    Chain,
    GradientHelper,
    Plan,
    _body,
    _calls,
    _list_extension,
    _targets,
    attribute_key,
    reading_gradients,
    receiver_alias,
)
from tfmigrate.convert.todo import Leftover, Todo
from tfmigrate.convert.undefined import undefined_out
from tfmigrate.convert.unread_collections import DropUnread
from tfmigrate.rules._towers import bound_names, free_names, get_arg, method_name

if TYPE_CHECKING:
    from tfmigrate.convert.project import Project, SourceFile

# The one helper a converted program gains: TF1 model code keeps making its variables with
# tf.compat.v1.get_variable (tf_slim and tf.compat.v1.layers do too); this store makes each one
# once, mirrored, and gives every replica and every step the same variable.
STORE = '''
class TF1Variables(tf.Module):
    """The variables TF1 model code makes with tf.compat.v1.get_variable, each made once."""

    # A custom getter: the first request of a name makes the variable outside the train step,
    # under the strategy (mirrored on every replica); later requests get the same variable.
    def __init__(self, strategy):
        super().__init__()
        self.strategy = strategy
        self.by_name = {}  # legacy name -> variable

    def getter(self, getter, name, *args, **kwargs):
        if name not in self.by_name:
            # TF1's RNNs set a caching device (it only placed reads), which eager creation refuses
            if kwargs.pop("caching_device", None) is not None:
                tf.compat.v1.get_variable_scope().set_caching_device(None)
            def create(strategy):
                with tf.init_scope(), strategy.scope():
                    return self.by_name.get(name) or getter(name, *args, **kwargs)

            context = tf.distribute.get_replica_context()
            if context is not None and tf.distribute.has_strategy():
                variable = context.merge_call(create)  # every replica asks; one makes it
            else:
                variable = create(self.strategy)
            if name not in self.by_name:  # tracked (checkpointed) only when set through []
                self.by_name[name] = variable
        return self.by_name[name]

    def scope(self):
        return tf.compat.v1.variable_scope("", custom_getter=self.getter)
'''

# A program that updates its variables with its own function (a hand-written Adam) gains this
# too: the function makes its slot variables each time it is called, and tf.function may trace
# the train step more than once, but TF2 variables must be made once.
UPDATE_STATE = '''

class UpdateState(tf.Module):
    """The variables the hand-written update makes (its slots, its step count), made once."""

    # A variable creator: the update's first trace makes its variables (mirrored, under the
    # strategy; outside the traced step when their initial values are constants); every later
    # trace gets the same ones, in the order the update asks for them.
    def __init__(self):
        super().__init__()
        self.made = []
        self.count = 0

    def creator(self, next_creator, **kwargs):
        if self.count == len(self.made):
            initial = kwargs.get("initial_value")
            constant = tf.get_static_value(initial) if tf.is_tensor(initial) else initial
            if constant is not None:
                with tf.init_scope():
                    self.made.append(next_creator(**{**kwargs, "initial_value": constant}))
            else:
                self.made.append(next_creator(**kwargs))
        self.count += 1
        return self.made[self.count - 1]

    def scope(self):
        self.count = 0
        return tf.variable_creator_scope(self.creator)
'''


_REPLICA_NAMES = frozenset({"tape", "variables", "replica_loss"})
_STEP_NAMES = frozenset({"replica_step"})
_SCOPE_NAMES = frozenset(
    {"strategy", "tf1_variables", "train_step", "TF1Variables", "update_state", "UpdateState"}
)
_TODO_NAME = "__tfmigrate_todo__"
_OUT_OF_RANGE = ("tensorflow.errors.OutOfRangeError", "tensorflow.compat.v1.errors.OutOfRangeError")
_FROM_HANDLE = (
    "tensorflow.data.Iterator.from_string_handle",
    "tensorflow.compat.v1.data.Iterator.from_string_handle",
)
_TRAINABLES = ("tensorflow.trainable_variables", "tensorflow.compat.v1.trainable_variables")


@dataclass(frozen=True)
class Emitted:
    module: cst.Module
    todos: list[Todo]
    notes: list[str]
    # a runner of another module (``class_runner``): that module as converted, and its TODOs
    runner_module: cst.Module | None = None
    runner_todos: list[Todo] = field(default_factory=list)

    def todo_summary(self) -> str:
        """What a finding's summary adds about the TODOs (nothing when there are none)."""
        if not self.todos:
            return ""
        codes = sorted({t.kind.code for t in self.todos})
        commented = sum(1 for t in self.todos if t.commented)
        return (
            f" with {len(self.todos)} TODO(tfmigrate) marker(s) ({', '.join(codes)}); "
            f"{commented} statement(s) commented out"
        )

    def manifest_notes(self, rule: str) -> list[str]:
        """The manifest's notes: each TODO's code and why, then the conversion's notes."""
        return [f"{rule}: {t.kind.code} {t.why}" for t in self.todos] + [
            f"{rule}: {note}" for note in self.notes
        ]


def emit_file_program(project: Project, source: SourceFile) -> tuple[Plan, Emitted] | None:
    """The program read from ``source`` with the project's modules, planned and emitted for the
    first of its tower cores built in that file that plans; None if there is none."""
    from tfmigrate.convert.plan import NotPlanned, plan_core
    from tfmigrate.convert.recognize import read_program

    program = read_program(project, source).program
    if program is None:
        return None
    for core in program.cores:
        if core.towers is None or core.towers.where.file != source.rel:
            continue
        try:
            plan = plan_core(source, program, core)
            return plan, emit(plan)
        except NotPlanned:
            continue
    return None


def emit(plan: Plan) -> Emitted:
    outside = plan.receiver if plan.receiver != RECEIVER else None
    with receiver_alias(outside):
        return _emit(plan)


def _emit(plan: Plan) -> Emitted:
    module = plan.source.module
    clash = _clashes(plan)
    if clash:
        from tfmigrate.convert.plan import NotPlanned

        raise NotPlanned(f"the tower function already uses `{sorted(clash)[0]}`")
    writer = _Writer(plan)
    scope = plan.scope.visit(writer) if isinstance(plan.scope, cst.FunctionDef) else None
    runner_module: cst.Module | None = None
    runner_todos: list[Todo] = []
    if isinstance(scope, cst.FunctionDef):
        replaced: dict[int, cst.CSTNode] = {id(plan.scope): scope}
        if plan.runner is not None and plan.runner_source is not None:
            runner_module, runner_todos = _foreign_runner(plan, writer)
        elif plan.runner is not None:
            replaced[id(plan.runner)] = cast(cst.FunctionDef, plan.runner.visit(writer))
        module = module.visit(_Replace(replaced))
    else:
        module = module.visit(writer)
    assert isinstance(module, cst.Module)
    module = taped_helpers(module, plan, writer.todos)
    module = _with_store(module, _hand_written(plan))
    module = _placeholder_helpers_out(module, plan, writer)
    module = _combination_helpers_out(module, plan, writer)
    marker = _MarkCollections(plan.source.qualify, writer.todos)
    module = module.visit(marker)
    if plan.wrapper is None:
        module = module.visit(_StrategyFirst(plan))
    module = _device_settings_first(module, plan)
    module = _undefined_out(module, writer.todos)
    module = module.visit(_Commented())
    notes = list(plan.notes) + writer.notes
    return Emitted(module, writer.todos, notes, runner_module, runner_todos)


def _foreign_runner(plan: Plan, writer: _Writer) -> tuple[cst.Module, list[Todo]]:
    """The module of a function outside the towers' module that makes the object and runs
    it (``class_runner``), with that function calling the object's train step; its leftovers
    marked as the towers' module's are. Its TODOs are its own (that module's finding)."""
    guest = plan.runner_source
    assert guest is not None and plan.runner is not None
    todos = writer.todos
    writer.todos, writer.module = [], guest.module
    try:
        runner = cast(cst.FunctionDef, plan.runner.visit(writer))
        own = writer.todos
    finally:
        writer.todos, writer.module = todos, plan.source.module
    runner = _settings_before_object(runner, plan.receiver, guest.qualify)
    module = guest.module.visit(_Replace({id(plan.runner): runner}))
    module = module.visit(_MarkCollections(guest.qualify, own))
    module = undefined_out(
        module,
        own,
        lambda node, todo: _commented(node, todo, guest.module),
        ignore=frozenset({_TODO_NAME}),
    )
    return module.visit(_Commented()), own


_DEVICE_SETTINGS = ("tensorflow.config.", "tensorflow.debugging.set_log_device_placement")


def _settings_before_object(
    runner: cst.FunctionDef, receiver: str, qualify: Callable[[cst.BaseExpression], str | None]
) -> cst.FunctionDef:
    """The session's device settings (tf.config calls where the ConfigProto was) before the
    statement making the object: its strategy initializes the devices, which cannot be
    configured after."""
    if not isinstance(runner.body, cst.IndentedBlock):
        return runner
    body = list(runner.body.body)
    making = next((k for k, s in enumerate(body) if receiver in bound_names(s)), None)
    if making is None:
        return runner
    bound_after: set[str] = set()
    moved: list[cst.BaseStatement] = []
    kept: list[cst.BaseStatement] = []
    for statement in body[making:]:
        calls = [qualify(c.func) or "" for c in _calls(statement)]
        setting = (
            isinstance(statement, cst.SimpleStatementLine)
            and calls
            and all(name.startswith(_DEVICE_SETTINGS) for name in calls)
        )
        if setting and not free_names(statement) & bound_after:
            moved.append(statement)
            continue
        bound_after |= bound_names(statement)
        kept.append(statement)
    if not moved:
        return runner
    first = body[making]
    moved[0] = moved[0].with_changes(
        leading_lines=[
            *getattr(first, "leading_lines", ()),
            cst.EmptyLine(
                comment=cst.Comment(
                    "# The legacy session's device settings, before the model's strategy uses the devices."
                )
            ),
        ]
    )
    kept[0] = kept[0].with_changes(leading_lines=[])
    new_body = [*body[:making], *moved, *kept]
    return runner.with_changes(body=runner.body.with_changes(body=new_body))


def mark_leftovers(
    module: cst.Module,
    qualify: Callable[[cst.BaseExpression], str | None],
    unread: frozenset[str] = frozenset(),
    notes: list[str] | None = None,
) -> tuple[cst.Module, list[Todo]]:
    """A module of the program the conversion keeps on TF1 code (a model module): its
    sessions, placeholders and graph collections marked TODO on their lines; what it adds to
    the ``unread`` collections (nothing in the program reads them) goes, a comment in its place
    (said in ``notes``)."""
    todos: list[Todo] = []
    if unread:
        module = module.visit(DropUnread(qualify, unread, [] if notes is None else notes))
    module = _undefined_out(module.visit(_MarkCollections(qualify, todos)), todos)
    return module.visit(_Commented()), todos


def _undefined_out(module: cst.Module, todos: list[Todo]) -> cst.Module:
    """The legacy program's lines that read names nothing defines, commented out."""
    return undefined_out(
        module,
        todos,
        lambda node, todo: _commented(node, todo, module),
        ignore=frozenset({_TODO_NAME}),
    )


def _device_settings_first(module: cst.Module, plan: Plan) -> cst.Module:
    """The session's device settings (now tf.config calls, where the ConfigProto was) go before
    the strategy is made: GPUs cannot be configured once the strategy has initialized them."""
    qualify = plan.source.qualify
    strategy: cst.SimpleStatementLine | None = None
    moved: list[cst.BaseStatement] = []
    bound_before: set[str] = set()

    for statement in _in_order(module.body):
        if isinstance(statement, cst.FunctionDef | cst.ClassDef):
            continue
        if strategy is None:
            if (
                isinstance(statement, cst.SimpleStatementLine)
                and isinstance(statement.body[0], cst.Assign)
                and module.code_for_node(statement.body[0].value).strip()
                == "tf.distribute.MirroredStrategy()"
            ):
                strategy = statement
            continue
        if not isinstance(statement, cst.SimpleStatementLine | cst.For):
            bound_before |= (
                bound_names(statement) if isinstance(statement, cst.SimpleStatementLine) else set()
            )
            continue
        calls = [qualify(c.func) or "" for c in _calls(statement)]
        setting = calls and all(
            name.startswith(_DEVICE_SETTINGS) or name == "tensorflow.config.list_physical_devices"
            for name in calls
        )
        reads = free_names(statement) - bound_names(statement)
        if setting and not reads & _locals(plan) and reads <= _module_names_before(module, strategy):
            moved.append(statement)
    # a moved `for gpu in ...: set_memory_growth(gpu, True)` takes its body along
    inside = {
        id(inner)
        for loop in moved
        if isinstance(loop, cst.For)
        for block in _inner_blocks(loop)
        for inner in _in_order(block)
    }
    moved = [s for s in moved if id(s) not in inside]
    if strategy is None or not moved:
        return module
    ids = {id(s) for s in moved}
    target = strategy

    class _Move(cst.CSTTransformer):
        def on_leave(self, original_node, updated_node):
            if id(original_node) in ids:
                return cst.RemoveFromParent()
            if original_node is target:
                first = moved[0]
                lines = [
                    cst.EmptyLine(
                        comment=cst.Comment(
                            "# The legacy session's device settings, before the strategy uses the devices."
                        )
                    )
                ]
                return cst.FlattenSentinel(
                    [
                        _prepend_lines(first.with_changes(leading_lines=[]), lines),
                        *(m.with_changes(leading_lines=[]) for m in moved[1:]),
                        updated_node,
                    ]
                )
            return updated_node

    del bound_before
    return module.visit(_Move())


def _module_names_before(module: cst.Module, statement: cst.CSTNode) -> set[str]:
    """The names a module has bound when ``statement`` (a top-level one) runs, builtins too: a
    setting that reads another (``args.log_device_mapping`` of flags parsed in the main block)
    stays where it was."""
    from tfmigrate.rules._towers import bound_names

    names = set(dir(builtins))
    for top in module.body:
        if top is statement:
            break
        if isinstance(top, cst.FunctionDef | cst.ClassDef):
            names.add(top.name.value)
        elif not isinstance(top, cst.If | cst.For | cst.While | cst.Try | cst.With):
            names |= bound_names(top)
    return names


def _in_order(body: Sequence[cst.BaseStatement]) -> Iterator[cst.BaseStatement]:
    """Every statement, in source order, into function bodies too."""
    for statement in body:
        yield statement
        inner = getattr(statement, "body", None)
        if isinstance(statement, cst.FunctionDef) and isinstance(inner, cst.IndentedBlock):
            yield from _in_order(inner.body)
            continue
        for block in _inner_blocks(statement):
            yield from _in_order(block)


def _locals(plan: Plan) -> set[str]:
    """Names the tower function binds (its parameters are there from the start)."""
    from tfmigrate.rules._towers import bound_names

    if isinstance(plan.scope, cst.FunctionDef):
        return bound_names(plan.scope)
    return set()


def _clashes(plan: Plan) -> set[str]:
    """New names that would clash: the replica function's with the tower loop's names, the
    train step's with what the loop reads from outside, the tower function's with its own."""
    from tfmigrate.rules._towers import bound_names

    scope = plan.scope
    in_loop = bound_names(plan.loop) | free_names(plan.loop)
    from_outside = free_names(plan.loop) - bound_names(plan.loop)
    in_scope = bound_names(scope) - bound_names(plan.loop) | from_outside
    if isinstance(scope, cst.FunctionDef):
        in_scope |= {p.name.value for p in scope.params.params}
    return set(
        (_REPLICA_NAMES & in_loop)
        | (_STEP_NAMES & (from_outside | in_scope))
        | (_SCOPE_NAMES & (in_scope | in_loop))
    )


def _outputs_name(plan: Plan) -> str:
    """The train step's name for what the replicas return: ``outputs``, unless the program
    already uses it."""
    from tfmigrate.rules._towers import bound_names

    taken = bound_names(plan.scope) | free_names(plan.loop)
    name, count = "outputs", 1
    while name in taken:
        name = "replica_outputs" if count == 1 else f"replica_outputs_{count}"
        count += 1
    return name


# -- pieces of new code ---------------------------------------------------------------------------
def _statement(code: str, **values: cst.CSTNode) -> cst.BaseStatement:
    if values:
        return parse_template_statement(code, **values)  # type: ignore[arg-type]  # template values are libcst nodes
    return cst.parse_statement(code)


def _strategy_lines(plan: Plan) -> list[cst.BaseStatement]:
    lines = [
        _statement("strategy = tf.distribute.MirroredStrategy()"),
        _statement("tf1_variables = TF1Variables(strategy)"),
    ]
    if _hand_written(plan):
        lines.append(_statement("update_state = UpdateState()"))
    return lines


def _hand_written(plan: Plan) -> bool:
    return any(chain.hand_written for chain in plan.chains)


def _with_store(module: cst.Module, hand_written: bool = False) -> cst.Module:
    """TF1Variables (and UpdateState for a ``hand_written`` update) after the imports (and the
    module docstring): after the last import before the first compound statement
    (``mpl.use('Agg')`` may sit between imports)."""
    body = list(module.body)
    at = 0
    for position, statement in enumerate(body):
        if not isinstance(statement, cst.SimpleStatementLine):
            break
        small = statement.body[0]
        if isinstance(small, cst.Import | cst.ImportFrom) or (
            position == 0
            and isinstance(small, cst.Expr)
            and isinstance(small.value, cst.SimpleString)
        ):
            at = position + 1
    store = cst.parse_module(STORE.lstrip("\n") + (UPDATE_STATE if hand_written else "")).body
    first = store[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    return module.with_changes(body=[*body[:at], first, *store[1:], *body[at:]])


def _commented(node: cst.CSTNode, todo: Todo, module: cst.Module) -> cst.SimpleStatementLine:
    """A placeholder statement the block pass turns into the TODO and the code commented out."""
    code = module.code_for_node(node.with_changes(leading_lines=()))
    lines = [todo.marker()] + [
        "# " + line if line.strip() else "#" for line in code.rstrip("\n").splitlines()
    ]
    return cst.SimpleStatementLine(
        body=[cst.Expr(cst.Name(_TODO_NAME))],
        leading_lines=[
            *getattr(node, "leading_lines", ()),
            *[cst.EmptyLine(comment=cst.Comment(_strip_indent(line))) for line in lines],
        ],
    )


def _prepend_lines(
    statement: cst.BaseStatement, lines: Sequence[cst.EmptyLine]
) -> cst.BaseStatement:
    """``statement`` with ``lines`` (comments, blank lines) before its own."""
    own = getattr(statement, "leading_lines", ())
    return statement.with_changes(leading_lines=[*lines, *own])


def _strip_indent(line: str) -> str:
    return line if line.startswith("#") else "# " + line


def _left(
    original: cst.CSTNode,
    updated: cst.BaseStatement,
    todo: Todo,
    todos: list[Todo],
    module: cst.Module,
) -> cst.BaseStatement:
    """A statement left to the user (``todo`` joins ``todos``): commented out, or kept with
    the marker at the end of its line."""
    todos.append(todo)
    if todo.commented:
        return _commented(original, todo, module)
    return _trailing(updated, todo)


def _marked(
    statement: cst.BaseStatement, kind: Leftover, why: str, todos: list[Todo]
) -> cst.BaseStatement:
    """A statement kept live with a new TODO (it joins ``todos``) at the end of its line."""
    todo = Todo(kind, why, commented=False)
    todos.append(todo)
    return _trailing(statement, todo)


def _trailing(statement: cst.BaseStatement, todo: Todo) -> cst.BaseStatement:
    """A kept statement with its TODO at the end of its (first) line."""
    comment = cst.Comment(todo.marker())
    if isinstance(statement, cst.SimpleStatementLine):
        return statement.with_changes(
            trailing_whitespace=cst.TrailingWhitespace(
                whitespace=cst.SimpleWhitespace("  "), comment=comment
            )
        )
    body = getattr(statement, "body", None)
    if isinstance(body, cst.IndentedBlock):
        return statement.with_changes(
            body=body.with_changes(
                header=cst.TrailingWhitespace(
                    whitespace=cst.SimpleWhitespace("  "), comment=comment
                )
            )
        )
    return statement


class _BlockPass(cst.CSTTransformer):
    """A pass over every statement list of a module: ``_fold`` gives each its new body."""

    def _fold(self, body: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        raise NotImplementedError

    def leave_IndentedBlock(self, original_node, updated_node):
        return updated_node.with_changes(body=self._fold(updated_node.body))

    def leave_Module(self, original_node, updated_node):
        return updated_node.with_changes(body=self._fold(updated_node.body))


class _Commented(_BlockPass):
    """Placeholders of commented-out statements become comment lines of the next statement in
    their block (or of a ``pass`` when nothing follows)."""

    def _fold(self, body: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        pending: list[cst.EmptyLine] = []
        for statement in body:
            if _is_placeholder(statement):
                assert isinstance(statement, cst.SimpleStatementLine)
                pending.extend(statement.leading_lines)
                continue
            if pending:
                statement = _prepend_lines(statement, pending)
                pending = []
            out.append(statement)
        if pending:
            out.append(cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=pending))
        return out


def _is_placeholder(statement: cst.CSTNode) -> bool:
    return _is_named(statement, _TODO_NAME)


def _is_named(statement: cst.CSTNode, name: str) -> bool:
    """``name`` alone on a line: the placeholder a pass left for a later one."""
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, cst.Name)
        and statement.body[0].value.value == name
    )


def _placeholder_helpers_out(module: cst.Module, plan: Plan, writer: _Writer) -> cst.Module:
    """A function that only made the step's placeholders, now called by nothing here: under a
    TODO, commented out (another script may still import it)."""
    helpers = plan.placeholder_helpers | plan.iterator_helpers
    if not helpers:
        return module
    body: list[cst.BaseStatement] = []
    for statement in module.body:
        if (
            isinstance(statement, cst.FunctionDef)
            and statement.name.value in helpers
            and sum(1 for n in _all_names(module) if n.value == statement.name.value) == 1
        ):
            made = (
                "placeholders"
                if statement.name.value in plan.placeholder_helpers
                else "a TF1 iterator of the dataset (the program iterates the dataset itself now)"
            )
            todo = Todo(
                Leftover.SESSION,
                f"`{statement.name.value}` made {made}: the train step takes these values as "
                "arguments now",
            )
            writer.todos.append(todo)
            body.append(_commented(statement, todo, module))
        else:
            body.append(statement)
    return module.with_changes(body=body)


def _combination_helpers_out(module: cst.Module, plan: Plan, writer: _Writer) -> cst.Module:
    """The towers' gradient-averaging helper, called by nothing now, goes -- in an entry script
    (a module with a main block; a library module's helper may have other importers)."""
    if not plan.combination_helpers or not any(_is_main_block(s) for s in module.body):
        return module
    counts: dict[str, int] = {}
    for name in _all_names(module):
        counts[name.value] = counts.get(name.value, 0) + 1
    body = []
    for statement in module.body:
        if (
            isinstance(statement, cst.FunctionDef)
            and statement.name.value in plan.combination_helpers
            and counts.get(statement.name.value) == 1
        ):
            writer.notes.append(
                f"`{statement.name.value}` combined the towers' gradients: the strategy does it "
                "now, the function went"
            )
            continue
        body.append(statement)
    return module.with_changes(body=body)


def _is_main_block(statement: cst.CSTNode) -> bool:
    return (
        isinstance(statement, cst.If)
        and isinstance(statement.test, cst.Comparison)
        and isinstance(statement.test.left, cst.Name)
        and statement.test.left.value == "__name__"
    )


def _all_names(node: cst.CSTNode) -> list[cst.Name]:
    found = []
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Name):
            found.append(current)
        stack.extend(current.children)
    return found


_COLLECTIONS = frozenset({"tensorflow.get_collection", "tensorflow.add_to_collection",
                          "tensorflow.get_collection_ref"})  # fmt: skip
_SESSION_CALLS = frozenset({"tensorflow.Session", "tensorflow.InteractiveSession",
                            "tensorflow.train.MonitoredTrainingSession"})  # fmt: skip
_PLACEHOLDER_CALLS = frozenset({"tensorflow.placeholder", "tensorflow.placeholder_with_default"})


class _MarkCollections(cst.CSTTransformer):
    """What the conversion did not reach and TF2 does not have, kept live and marked: graph
    collections in the functions the towers call (they still work inside the train step's
    graph), sessions and placeholders in code the converted training does not run (an eval
    function, a model class's own placeholders)."""

    def __init__(
        self, qualify: Callable[[cst.BaseExpression], str | None], todos: list[Todo]
    ) -> None:
        self.qualify = qualify
        self.todos = todos
        self.depth = 0

    def visit_FunctionDef(self, node):
        self.depth += 1
        return True

    def leave_FunctionDef(self, original_node, updated_node):
        self.depth -= 1
        return updated_node

    def _todo(self, node: cst.CSTNode) -> Todo | None:
        names = set()
        for call in _calls(node):
            name = self.qualify(call.func)
            if name is not None:
                names.add(name.replace("tensorflow.compat.v1.", "tensorflow."))
        if names & _SESSION_CALLS:
            why = "a TF1 session in code the converted training does not run: run its ops eagerly or in a tf.function"
            return Todo(Leftover.SESSION, why, commented=False)
        if names & _PLACEHOLDER_CALLS:
            why = "a placeholder: TF2 has none; pass the value to this code as an argument"
            return Todo(Leftover.SESSION, why, commented=False)
        if names & _COLLECTIONS and self.depth:
            why = "a graph collection: it now lives in the train step's graph; return the values instead"
            return Todo(Leftover.GRAPH, why, commented=False)
        return None

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if _is_placeholder(updated_node) or updated_node.trailing_whitespace.comment is not None:
            return updated_node
        todo = self._todo(updated_node)
        if todo is None:
            return updated_node
        self.todos.append(todo)
        return _trailing(updated_node, todo)

    def leave_With(self, original_node, updated_node):
        body = updated_node.body
        if not isinstance(body, cst.IndentedBlock) or body.header.comment is not None:
            return updated_node
        todo = None
        for item in updated_node.items:
            todo = todo or self._todo(item.item)
        if todo is None or todo.kind is not Leftover.SESSION:
            return updated_node
        self.todos.append(todo)
        return _trailing(updated_node, todo)


class _Replace(cst.CSTTransformer):
    """Nodes replaced by their identity: ``{id(old): new}``."""

    def __init__(self, new: dict[int, cst.CSTNode]) -> None:
        self.new = new

    def on_leave(self, original_node, updated_node):
        return self.new.get(id(original_node), updated_node)


class _StrategyFirst(cst.CSTTransformer):
    """Without a graph wrapper to become ``strategy.scope()``, the strategy is made at the start
    of the tower function (or of the main block holding a script's towers) and the rest of it
    runs in ``with strategy.scope():``."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.done = False
        self.classes: list[str] = []  # the classes around the function visited
        scope = plan.scope
        owner = plan.source.enclosing_class(scope) if isinstance(scope, cst.FunctionDef) else None
        self.owner = [owner.name.value] if owner is not None else []

    def visit_ClassDef(self, node):
        self.classes.append(node.name.value)

    def leave_ClassDef(self, original_node, updated_node):
        self.classes.pop()
        return updated_node

    def leave_FunctionDef(self, original_node, updated_node):
        scope = self.plan.scope
        if self.done or not isinstance(scope, cst.FunctionDef):
            return updated_node
        if updated_node.name.value != scope.name.value or self.classes != self.owner:
            return updated_node
        self.done = True
        return updated_node.with_changes(body=_scoped(updated_node.body, self.plan))

    def leave_If(self, original_node, updated_node):
        # a script's towers in `if __name__ == "__main__":`
        if (
            self.done
            or not isinstance(self.plan.scope, cst.Module)
            or not _is_main_block(updated_node)
        ):
            return updated_node
        if not any(n is self.plan.loop for n in _walk_statements(original_node)):
            return updated_node
        self.done = True
        return updated_node.with_changes(body=_scoped(updated_node.body, self.plan))

    def leave_Module(self, original_node, updated_node):
        if self.done or not isinstance(self.plan.scope, cst.Module):
            return updated_node
        body = list(updated_node.body)
        first = _first_code(self.plan, body)
        scope = cst.With(
            items=[cst.WithItem(cst.parse_expression("strategy.scope()"))],
            body=cst.IndentedBlock(body=body[first:]),
        )
        return updated_node.with_changes(body=[*body[:first], *_strategy_lines(self.plan), scope])


def _scoped(block: cst.BaseSuite, plan: Plan) -> cst.BaseSuite:
    """A block's statements (after its docstring) under ``with strategy.scope():``, the
    strategy made just before."""
    if not isinstance(block, cst.IndentedBlock):
        return block
    body = list(block.body)
    at = 1 if body and _is_docstring(body[0]) else 0
    if at < len(body):
        first = body[at]
        lines = getattr(first, "leading_lines", ())
        body[at] = first.with_changes(leading_lines=[])
    else:
        lines = ()
    strategy = _strategy_lines(plan)
    strategy[0] = strategy[0].with_changes(leading_lines=list(lines))
    scope = cst.With(
        items=[cst.WithItem(cst.parse_expression("strategy.scope()"))],
        body=cst.IndentedBlock(body=body[at:] or [cst.SimpleStatementLine([cst.Pass()])]),
    )
    return block.with_changes(body=[*body[:at], *strategy, scope])


def _is_docstring(statement: cst.CSTNode) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, cst.SimpleString | cst.ConcatenatedString)
    )


def _first_code(plan: Plan, body: list[cst.BaseStatement]) -> int:
    """A module-level script: the strategy comes before the statement that held the loop's
    first ancestor (the main block) -- or before the loop's own top-level statement."""
    for position, statement in enumerate(body):
        if isinstance(statement, cst.If | cst.For | cst.While | cst.With | cst.Try):
            return position
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if small is not None and not isinstance(small, cst.Import | cst.ImportFrom | cst.Expr):
            if not isinstance(small, cst.Assign) or "tf" in free_names(small.value):
                return position
    return len(body)


# -- the tower function ---------------------------------------------------------------------------
class _Writer(cst.CSTTransformer):
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.module = plan.source.module
        self.todos: list[Todo] = []
        self.notes: list[str] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        decision = self.plan.decision(node)
        if decision is not None and decision.action in (Action.TRAIN_STEP, Action.TODO):
            return decision.action is Action.TODO and not decision.todo.commented  # type: ignore[union-attr]  # a TODO decision always carries its Todo
        return True

    def on_leave(self, original_node, updated_node):
        decision = self.plan.decision(original_node)
        if decision is None:
            return self._expression(original_node, updated_node)
        action = decision.action
        if action in (Action.DROP, Action.STEP, Action.POST, Action.UPDATE):
            return cst.RemoveFromParent()
        if action is Action.TODO:
            assert decision.todo is not None
            return _left(original_node, updated_node, decision.todo, self.todos, self.module)
        if action is Action.UNWRAP:
            body = _dedented_body(updated_node, original_node)
            todo = self.plan.session_todo
            if decision.why == MONITORED_GOES and todo is not None and body:
                self.todos.append(todo)
                # on its own line: the loop below may carry a TODO of its own
                line = cst.EmptyLine(comment=cst.Comment(todo.marker()))
                first = body[0]
                lines = getattr(first, "leading_lines", ())
                body[0] = first.with_changes(leading_lines=[*lines, line])
            return cst.FlattenSentinel(body)
        if action is Action.STOP_LOOP:
            return self._stop_loop(updated_node)
        if action is Action.SCOPE:
            scoped = updated_node.with_changes(
                items=[cst.WithItem(cst.parse_expression("strategy.scope()"))]
            )
            return cst.FlattenSentinel([*_strategy_lines(self.plan), scoped])
        if action is Action.ITERATOR:
            return self._iterator(original_node, decision)
        if action is Action.NEXT:
            if decision.why == "handle":
                return _replace_run(updated_node, cst.Name(decision.iterator or "iterator"))
            return _replace_run(updated_node, cst.parse_expression(f"next({decision.iterator})"))
        if action is Action.READ:
            read = parse_template_expression(
                "{v}.numpy()", v=cst.parse_expression(decision.variable or "")
            )
            return _replace_run(updated_node, read)
        if action is Action.STEP_RUN:
            call = self._step_call(updated_node, decision)
            if decision.todo is not None:
                self.todos.append(decision.todo)
                return _trailing(call, decision.todo)
            return call
        if action is Action.CHECKPOINT:
            return self._checkpoint(updated_node)
        if action is Action.FED_VARIABLE:
            return self._fed_variable(updated_node)
        if action is Action.SAVER_CALL:
            return updated_node.visit(_SaverCall(self.plan.global_step))
        if action is Action.SUMMARY_WRITER:
            return self._summary_writer(updated_node)
        if action is Action.SUMMARY_WRITE:
            return _summary_write(updated_node, decision)
        if action is Action.FEED_LISTS:
            return per_gpu_emit.feed_lists(updated_node, decision.fed_lists)
        if action is Action.FEED_APPEND:
            return per_gpu_emit.feed_append(updated_node, decision.fed_lists[0])
        if action is Action.TRAIN_STEP:
            return cst.FlattenSentinel(self._train_step())
        return updated_node

    def _expression(self, original_node, updated_node):
        qualify = self.plan.source.qualify
        if isinstance(updated_node, cst.ExceptHandler) and updated_node.type is not None:
            if qualify(updated_node.type) in _OUT_OF_RANGE:
                return updated_node.with_changes(type=cst.Name("StopIteration"))
        if (
            isinstance(updated_node, cst.Call)
            and qualify(updated_node.func) in _TRAINABLES
            and not (isinstance(self.plan.source, JoinedSource) and self.plan.source.is_guest(original_node))
        ):
            return cst.parse_expression("tf1_variables.trainable_variables")
        return updated_node

    def _checkpoint(self, updated_node):
        """The Saver becomes a tf.train.Checkpoint of the model's variables and the optimizer
        (its slots), with the global step the update counts."""
        plan = self.plan
        parts = ["model=tf1_variables"]
        values: dict[str, cst.CSTNode] = {}
        for index, chain in enumerate(plan.chains):
            if chain.update_function is not None:
                continue  # its optimizer is made inside the update function (TFM316 there)
            optimizer = chain.update_call.func
            assert isinstance(optimizer, cst.Attribute)
            key = "optimizer" if not index else f"optimizer_{index + 1}"
            parts.append(f"{key}={{{key}}}")
            values[key] = optimizer.value
            for arg in chain.update_call.args:
                if (
                    arg.keyword is not None
                    and arg.keyword.value == "global_step"
                    and "step" not in values
                ):
                    parts.append("global_step={step}")
                    values["step"] = arg.value
        small = updated_node.body[0]
        value = parse_template_expression(
            f"tf.train.Checkpoint({', '.join(parts)})",
            **values,  # type: ignore[arg-type]  # template values: expressions
        )
        if not any("TF1 checkpoints" in note for note in self.notes):
            self.notes.append(
                "tf.train.Saver became tf.train.Checkpoint (object-based: a TF1 checkpoint is "
                "read after `tfmigrate convert-checkpoint`)"
            )
        return updated_node.with_changes(body=[small.with_changes(value=value)])

    def _summary_writer(self, updated_node):
        """``tf.summary.FileWriter(logdir, sess.graph)``: a TF2 file writer of the same folder
        (TF2 writes no graph with it)."""
        small = updated_node.body[0]
        call = small.value
        args = [
            a.with_changes(comma=cst.MaybeSentinel.DEFAULT)
            for k, a in enumerate(call.args)
            if (k == 0 and a.keyword is None)
            or (
                a.keyword is not None
                and a.keyword.value in ("logdir", "max_queue", "filename_suffix")
            )
        ]
        value = cst.Call(cst.parse_expression("tf.summary.create_file_writer"), args)
        return updated_node.with_changes(body=[small.with_changes(value=value)])

    def _fed_variable(self, updated_node):
        """``lr = tf.placeholder(tf.float32, [])`` that the optimizer reads: a variable made
        once, which the train step assigns the fed value to."""
        call = updated_node.body[0].value
        dtype = get_arg(call, 0, "dtype") or cst.parse_expression("tf.float32")
        shape = get_arg(call, 1, "shape")
        name = get_arg(call, 2, "name")
        scalar = shape is None or (isinstance(shape, cst.List | cst.Tuple) and not shape.elements)
        if scalar or shape is None:
            initial = parse_template_expression("tf.constant(0, {dtype})", dtype=dtype)
        else:
            initial = parse_template_expression(
                "tf.zeros({shape}, {dtype})", shape=shape, dtype=dtype
            )
        args = [
            cst.Arg(initial),
            cst.Arg(cst.Name("False"), keyword=cst.Name("trainable"), equal=_equal()),
        ]
        if name is not None:
            args.append(cst.Arg(name, keyword=cst.Name("name"), equal=_equal()))
        value = cst.Call(cst.parse_expression("tf.Variable"), args)
        small = updated_node.body[0]
        return updated_node.with_changes(body=[small.with_changes(value=value)])

    def _stop_loop(self, updated_node):
        """``while not sess.should_stop():`` -> the bound its StopAtStepHook set."""
        plan = self.plan
        if plan.last_step is None or plan.global_step is None:
            why = f"{plan.stopped_by} ended this loop: bound it"
            unbound = updated_node.with_changes(test=cst.Name("True"))
            return _marked(unbound, Leftover.SESSION, why, self.todos)
        test = parse_template_expression(
            "{step} < {last}", step=cst.Name(plan.global_step), last=plan.last_step
        )
        return updated_node.with_changes(test=test)

    def _iterator(self, original_node, decision):
        assert decision.dataset is not None
        targets = _targets(original_node)
        name = cst.parse_expression(decision.iterator) if decision.iterator else targets[0]
        return _statement(
            "{name} = iter({dataset})", name=name, dataset=decision.dataset
        ).with_changes(leading_lines=original_node.leading_lines)

    def _step_call(self, updated_node, decision):
        run = decision.step_run
        assert run is not None
        step: cst.BaseExpression = cst.Name("train_step")
        if self.plan.runner is not None:
            step = cst.Attribute(cst.Name(self.plan.receiver), cst.Name("train_step"))
        # a value fed to a variable the step assigns (a learning rate) goes in as a tensor: a
        # Python number would make tf.function trace the step again for each new value
        fed = {param: variable for variable, param in self.plan.fed_variables.items()}
        args = []
        for name, value in run.arguments:
            if name in fed:
                value = parse_template_expression(
                    "tf.constant({value}, {variable}.dtype)", value=value, variable=cst.Name(fed[name])
                )
            value = per_gpu_emit.distributed(self.plan, name, value)
            args.append(cst.Arg(value, keyword=cst.Name(step_local(name)), equal=_equal()))
        call = cst.Call(step, args)
        target = run.target
        if not run.values:
            return updated_node.with_changes(body=[cst.Expr(call)])
        if target is None:
            return updated_node.with_changes(body=[cst.Expr(call)])
        if not run.single and isinstance(target, cst.Tuple | cst.List):
            kept = [e for position, e in enumerate(target.elements) if position not in run.run_only]
            self.return_nones = [
                position
                for position, e in enumerate(target.elements)
                if position in run.run_only
                and not (isinstance(e.value, cst.Name) and e.value.value == "_")
            ]
            if self.return_nones:
                kept = list(target.elements)
            kept = [e.with_changes(comma=cst.MaybeSentinel.DEFAULT) for e in kept]
            only = kept[0].value
            new_target: cst.BaseAssignTargetExpression = (
                only
                if len(kept) == 1
                and not self.return_nones
                and isinstance(only, cst.BaseAssignTargetExpression)
                else target.with_changes(elements=kept)
            )
        else:
            new_target = target
        small = updated_node.body[0]
        if isinstance(small, cst.Expr):  # `sess.run(train_op)`: the step returns values now
            return updated_node.with_changes(
                body=[cst.Assign(targets=[cst.AssignTarget(new_target)], value=call)]
            )
        return updated_node.with_changes(
            body=[small.with_changes(targets=[cst.AssignTarget(new_target)], value=call)]
        )

    # -- the train step ---------------------------------------------------------------------------
    def _train_step(self) -> list[cst.BaseStatement]:
        plan = self.plan
        replicas = _Replica(plan, self)
        replica = replicas.body()
        returned = [cst.Name(name) for name in plan.outputs] + [e for _, e in plan.sums]
        reduced_at = len(returned)
        returned += [grads for _, grads in replicas.reduced]
        one_loss = self._reduced_loss()
        if one_loss is not None:
            returned.append(cst.Name("replica_loss"))
        if returned:
            value = (
                returned[0] if len(returned) == 1 else cst.Tuple([cst.Element(e) for e in returned])
            )
            replica.append(cst.SimpleStatementLine([cst.Return(value)]))
        replica_def = cst.FunctionDef(
            name=cst.Name("replica_step"),
            params=per_gpu_emit.replica_params(plan),
            body=cst.IndentedBlock(body=replica),
            leading_lines=[],
        )
        outputs = _outputs_name(plan)
        step: list[cst.BaseStatement] = [
            _statement(f"{name}.assign({param})") for name, param in plan.fed_variables.items()
        ]
        step += [s.visit(_Expressions(plan)) for s in plan.step_before]  # type: ignore[misc]  # visit() may return a sentinel; a statement stays a statement here
        step.append(replica_def)
        if not returned:
            step.append(_statement(per_gpu_emit.run_replicas(plan)))
        else:
            step.append(_statement(f"{outputs} = {per_gpu_emit.run_replicas(plan)}"))
        summed_once = set().union(
            *(bound_names(s) for c in plan.chains if c.all_reduced for s in c.between)
        )
        for position, name in enumerate([*plan.outputs, *(n for n, _ in plan.sums)]):
            each = outputs if len(returned) == 1 else f"{outputs}[{position}]"
            if position < len(plan.outputs) and name in plan.per_tower:
                step.append(
                    _statement(
                        f"{plan.per_tower[name]} = strategy.experimental_local_results({each})"
                    ).with_changes(
                        leading_lines=[
                            cst.EmptyLine(
                                comment=cst.Comment(
                                    "# Every tower's value: the towers wrote a summary of each."
                                )
                            )
                        ]
                    )
                )
                if name in plan.towers_only:
                    continue
            if position < len(plan.outputs) and name in plan.first_tower:
                tower = plan.first_tower[name]
                line = f"{name} = strategy.experimental_local_results({each})[{tower}]"
                comment = f"# The loop read tower {tower}'s value (every replica computes it now)."
            elif position < len(plan.outputs) and name in summed_once:
                line = f"{name} = strategy.experimental_local_results({each})[0]"
                comment = "# Every replica computed it from the gradients' sum."
            elif position < len(plan.outputs) and name in plan.update_values:
                line = f"{name} = strategy.experimental_local_results({each})[-1]"
                comment = "# The update made it once; each replica makes its own now: the last's."
            elif position < len(plan.outputs):
                line = f"{name} = strategy.experimental_local_results({each})[-1]"
                comment = "# The loop read the last tower's value."
            elif name in plan.totals:
                line = f'{plan.totals[name]} = {name} + strategy.reduce("SUM", {each}, axis=None)'
                comment = "# The towers added their values to it."
            else:
                line = f'{name} += strategy.reduce("SUM", {each}, axis=None)'
                comment = "# The towers added their values up."
            step.append(
                _statement(line).with_changes(
                    leading_lines=[cst.EmptyLine(comment=cst.Comment(comment))]
                )
            )
        if one_loss is not None:
            each = outputs if len(returned) == 1 else f"{outputs}[{len(returned) - 1}]"
            comment = (
                f"# `{one_loss}` combined the towers' losses: the sum of the replicas' shares."
            )
            step.append(
                _statement(f'{one_loss} = strategy.reduce("SUM", {each}, axis=None)').with_changes(
                    leading_lines=[cst.EmptyLine(comment=cst.Comment(comment))]
                )
            )
        for offset, (chain, _) in enumerate(replicas.reduced):
            each = outputs if len(returned) == 1 else f"{outputs}[{reduced_at + offset}]"
            step.extend(self._hand_written_update(chain, each))
        step.extend(s.visit(_Expressions(plan)) for s in plan.step_after)  # type: ignore[misc]  # visit() may return a sentinel; a statement stays a statement here
        values = self._returned_values()
        if values is not None and plan.totals:
            values = values.visit(_Renamed(plan.totals))  # type: ignore[assignment]  # visit() may return a sentinel; a statement stays a statement here
        if values is not None:
            step.append(cst.SimpleStatementLine([cst.Return(values)]))
        params = cst.Parameters(
            params=[cst.Param(cst.Name(step_local(name))) for name in plan.inputs]
        )
        decorator = cst.Decorator(cst.parse_expression(per_gpu_emit.decorator(plan)))
        train_step = cst.FunctionDef(
            name=cst.Name("train_step"),
            params=params,
            body=cst.IndentedBlock(body=step),
            decorators=[decorator],
            leading_lines=plan.loop.leading_lines,
        )
        if plan.runner is None:
            return [train_step, *per_gpu_emit.per_replica_helper(plan)]
        # A class-based trainer: the step's inputs and the values it fills were attributes; in
        # the train step they are its parameters and locals, and the method that ran the step
        # calls it on the object.
        # Attributes the step neither takes nor fills (the model, a method the towers call, a
        # list of per-GPU inputs made once) stay the object's.
        local = set(plan.inputs) | _assigned_attributes(train_step)
        train_step = cast(cst.FunctionDef, train_step.visit(_AttributesLocal(local)))
        return [train_step, _statement(f"{RECEIVER}.train_step = train_step")]

    def _reduced_loss(self) -> str | None:
        """The towers' combined loss, when the train step returns it or computes from it:
        each replica returns its share and the step sums them."""
        colocated = self.plan.colocated
        if colocated is None:
            return None
        values = self._returned_values()
        reads = free_names(values) if values is not None else set()
        for statement in self.plan.step_after:
            reads |= free_names(statement)
        return colocated.loss if colocated.loss in reads else None

    def _hand_written_update(self, chain: Chain, each: str) -> list[cst.BaseStatement]:
        """The program's own update function, called in cross-replica context with the
        replicas' gradients reduced as the towers combined them: assigning a mirrored variable
        there updates every copy. The variables it makes are made once (``update_state``)."""
        plan = self.plan
        reduction, how = ("MEAN", "averaged") if chain.mean else ("SUM", "summed")
        combined = chain.combined or "grads"
        reduce = _statement(
            f'{combined} = [strategy.reduce("{reduction}", g, axis=None) for g in {each}]'
        ).with_changes(
            leading_lines=[
                cst.EmptyLine(
                    comment=cst.Comment(
                        f"# The towers {how} their gradients; the update gets the replicas' "
                        f"{'mean' if chain.mean else 'sum'}."
                    )
                )
            ]
        )
        out: list[cst.BaseStatement] = [reduce]
        out += [s.visit(_Expressions(plan)) for s in (*chain.rebound, *chain.between)]  # type: ignore[misc]  # visit() may return a sentinel; a statement stays a statement here
        update = chain.update.visit(_Expressions(plan))
        scope = cst.With(
            items=[cst.WithItem(cst.parse_expression("update_state.scope()"))],
            body=cst.IndentedBlock(body=[update.with_changes(leading_lines=[])]),  # type: ignore[union-attr]  # the update is a statement
        )
        out.append(scope)
        return out

    def _returned_values(self) -> cst.BaseExpression | None:
        runs = [d.step_run for d in self.plan.decisions.values() if d.step_run is not None]
        run = runs[0]
        if not run.values:
            return None
        if run.single:
            return run.values[0]
        values = list(run.values)
        nones = getattr(self, "return_nones", [])
        elements: list[cst.BaseExpression] = []
        taken = iter(values)
        total = len(values) + len(run.run_only)
        for position in range(total):
            if position in run.run_only:
                if position in nones:
                    elements.append(cst.Name("None"))
            else:
                elements.append(next(taken))
        if len(elements) == 1:
            return elements[0]
        return cst.Tuple([cst.Element(e) for e in elements])


def _summary_write(updated_node: cst.SimpleStatementLine, decision) -> cst.With:
    """``writer.add_summary(summary, step)``: the merged scalars, written under the writer
    with their legacy tags."""
    lines = []
    for scalar in decision.scalars:
        call = cst.Call(
            cst.parse_expression(f"tf.summary.{scalar.kind}"),
            [
                cst.Arg(scalar.tag),
                cst.Arg(scalar.value),
                cst.Arg(decision.step, keyword=cst.Name("step"), equal=_equal()),
            ],
        )
        line: cst.BaseStatement = cst.SimpleStatementLine([cst.Expr(call)])
        if scalar.kind == "histogram" and scalar.towers is not None:
            # every trainable variable, by its legacy name (the TF2 variable's differs)
            each, legacy, variables = scalar.towers
            trainable = cst.If(
                test=cst.parse_expression(f"{each}.trainable"), body=cst.IndentedBlock([line])
            )
            line = cst.For(
                target=cst.Tuple(
                    [cst.Element(cst.Name(legacy)), cst.Element(cst.Name(each))], lpar=[], rpar=[]
                ),
                iter=cst.parse_expression(variables),
                body=cst.IndentedBlock([trainable]),
            )
        elif scalar.towers is not None:
            index, each, towers = scalar.towers
            line = cst.For(
                target=cst.Tuple(
                    [cst.Element(cst.Name(index)), cst.Element(cst.Name(each))], lpar=[], rpar=[]
                ),
                iter=parse_template_expression("enumerate({t})", t=cst.Name(towers)),
                body=cst.IndentedBlock([line]),
            )
        lines.append(line)
    writer = parse_template_expression("{w}.as_default()", w=cst.parse_expression(decision.writer))
    return cst.With(
        items=[cst.WithItem(writer)],
        body=cst.IndentedBlock(lines),
        leading_lines=updated_node.leading_lines,
    )


def step_local(key: str) -> str:
    """The train step's name for a value the legacy kept on the object (``self._x`` -> ``x``)."""
    if key.startswith(f"{RECEIVER}."):
        return key[len(RECEIVER) + 1 :].lstrip("_") or key[len(RECEIVER) + 1 :]
    return key


def _assigned_attributes(node: cst.CSTNode) -> set[str]:
    """The ``self.x`` keys ``node`` assigns anywhere in it (nested functions included)."""
    found: set[str] = set()
    for current in tree.walk(node):
        if isinstance(current, cst.AssignTarget):
            target = current.target
            parts = target.elements if isinstance(target, cst.Tuple | cst.List) else [target]
            for part in parts:
                key = attribute_key(part.value if isinstance(part, cst.Element) else part)
                if key is not None:
                    found.add(key)
    return found


class _HandedTape(cst.CSTTransformer):
    """The tower's call of a gradient helper given its loss, handing it the tower's tape
    (``self._backward(loss, tape=tape)``)."""

    def __init__(self, helper: GradientHelper) -> None:
        self.name = helper.function.name.value

    def leave_Call(self, original_node, updated_node):
        func = updated_node.func
        called = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)
        if called != self.name:
            return updated_node
        handed = cst.Arg(cst.Name("tape"), keyword=cst.Name("tape"), equal=_equal())
        args = list(updated_node.args)
        if args:
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(args=[*args, handed])


class _AttributesLocal(cst.CSTTransformer):
    """``self.x`` as the local ``x`` for the ``local`` keys (the train step's parameters and
    the values it fills); the others spelled on ``self`` (an outside runner spelled them on
    its name for the object)."""

    def __init__(self, local: set[str]) -> None:
        self.local = local

    def leave_Attribute(self, original_node, updated_node):
        key = attribute_key(original_node)
        if key is None:
            return updated_node
        if key not in self.local:
            # the runner's name for the object (``model.global_step`` fetched): the object's
            return updated_node.with_changes(value=cst.Name(RECEIVER))
        return cst.Name(step_local(key))


class _Renamed(cst.CSTTransformer):
    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def leave_Name(self, original_node, updated_node):
        new = self.names.get(updated_node.value)
        return updated_node.with_changes(value=new) if new else updated_node


class _SaverCall(cst.CSTTransformer):
    """``saver.save(sess, path, global_step=n)`` -> ``saver.write("{}-{}".format(path, n))``
    (the same file names); ``saver.restore(sess, path)`` -> ``saver.restore(path)``. The
    program's global-step variable is read with ``.numpy()``: formatted as it is, a variable
    writes its repr into the file name (and ``int()`` of a mirrored variable raises)."""

    def __init__(self, global_step: str | None = None) -> None:
        self.global_step = global_step

    def leave_Call(self, original_node, updated_node):
        func = updated_node.func
        if not isinstance(func, cst.Attribute) or func.attr.value not in ("save", "restore"):
            return updated_node
        args = [a for a in updated_node.args[1:]]
        path = next(
            (a.value for a in args if a.keyword is None or a.keyword.value == "save_path"), None
        )
        step = next(
            (a.value for a in args if a.keyword is not None and a.keyword.value == "global_step"),
            None,
        )
        if path is None:
            return updated_node
        if func.attr.value == "restore":
            return updated_node.with_changes(args=[cst.Arg(path)])
        if step is not None:
            if self.global_step is not None and cst.Module([]).code_for_node(step) == self.global_step:
                step = parse_template_expression("{step}.numpy()", step=step)
            path = parse_template_expression('"{}-{}".format({path}, {step})', path=path, step=step)
        return updated_node.with_changes(
            func=func.with_changes(attr=cst.Name("write")), args=[cst.Arg(path)]
        )


def _equal() -> cst.AssignEqual:
    return cst.AssignEqual(
        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
    )


def _replace_run(statement: cst.CSTNode, value: cst.BaseExpression) -> cst.CSTNode:
    class _Run(cst.CSTTransformer):
        def leave_Call(self, original_node, updated_node):
            if method_name(original_node) == "run":
                return value
            return updated_node

    return cast(cst.CSTNode, statement.visit(_Run()))


def _dedented_body(updated_node, original_node) -> list[cst.BaseStatement]:
    body = list(updated_node.body.body) if isinstance(updated_node.body, cst.IndentedBlock) else []
    if body:
        body[0] = _prepend_lines(body[0], original_node.leading_lines)
    return body


class _Expressions(cst.CSTTransformer):
    """Rewrites any converted statement gets: all trainables -> the store's."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def leave_Subscript(self, original_node, updated_node):
        return per_gpu_emit.tower_read(self.plan, original_node, updated_node)

    def leave_Call(self, original_node, updated_node):
        name = self.plan.source.qualify(original_node.func)
        if name in _TRAINABLES:
            return cst.parse_expression("tf1_variables.trainable_variables")
        if name in _FROM_HANDLE and updated_node.args:
            return updated_node.args[0].value  # the iterator the step is given
        func = updated_node.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value == "get_next"
            and isinstance(func.value, cst.Name)
            and func.value.value in self.plan.step_iterators
        ):
            return cst.Call(cst.Name("next"), [cst.Arg(func.value)])
        return updated_node


# -- the replica function -------------------------------------------------------------------------
class _Replica:
    """The tower loop's body as the replica function's."""

    def __init__(self, plan: Plan, writer: _Writer) -> None:
        self.plan = plan
        self.writer = writer
        self.module = plan.source.module
        self.gone: set[str] = set()
        self.getter_placed = False
        self._grads_names: dict[int, str] = {}
        self.deferred: list[cst.BaseStatement] = []  # the updates, after the store's scope
        # hand-written updates: their chains and the gradients the replicas return for them
        self.reduced: list[tuple[Chain, cst.BaseExpression]] = []
        # chain -> the name of its variable list in the replica function
        self.variables_of: dict[int, cst.BaseExpression] = {}

    def body(self) -> list[cst.BaseStatement]:
        plan = self.plan
        self._find_tape_block()
        statements: list[cst.BaseStatement] = [
            _statement(
                f"{plan.index} = int(tf.get_static_value("
                "tf.distribute.get_replica_context().replica_id_in_sync_group))"
            ).with_changes(
                leading_lines=[
                    cst.EmptyLine(
                        comment=cst.Comment(
                            "# The tower index: this replica's number (a Python int)."
                        )
                    )
                ]
            )
        ]
        statements += per_gpu_emit.replica_inputs(plan)
        if plan.enumerated is not None:
            name, items = plan.enumerated
            if name in free_names(plan.loop.body):
                statements.append(
                    _statement(
                        "{name} = {items}[{index}]",
                        name=cst.Name(name),
                        items=items,
                        index=cst.Name(plan.index),
                    )
                )
        body = self._block(list(_body(plan.loop)))
        if not self.getter_placed:
            body = [
                cst.With(
                    items=[cst.WithItem(cst.parse_expression("tf1_variables.scope()"))],
                    body=cst.IndentedBlock(body=body),
                )
            ]
        if plan.colocated is not None:
            body = self._one_loss(body)
        # The updates run outside the store's scope: the optimizer's slots are its own
        # variables, not the model's.
        return statements + body + self.deferred + self._averages()

    def _averages(self) -> list[cst.BaseStatement]:
        """``ema.apply(tf.trainable_variables())``, which the train op grouped with the update,
        after the update: its shadow variables are made by the first step in the store (as TF1
        made them beside the model's, and saved them with it), and applied once per step over
        the replicas."""
        out: list[cst.BaseStatement] = []
        for statement in self.plan.averages:
            small = statement.body[0]
            assert isinstance(small, cst.Assign)
            apply = small.value.visit(_Expressions(self.plan))
            assert isinstance(apply, cst.BaseExpression)
            line = cst.SimpleStatementLine([cst.Expr(apply)])
            out.append(
                cst.With(
                    items=[cst.WithItem(cst.parse_expression("tf1_variables.scope()"))],
                    body=cst.IndentedBlock(body=[line]),
                    leading_lines=[
                        cst.EmptyLine(
                            comment=cst.Comment(
                                "# The moving averages the train op updated with each step."
                            )
                        )
                    ],
                )
            )
        return out

    def _one_loss(self, body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """Towers that computed only losses, combined after the loop and differentiated once:
        the replica runs its tower under the tape, combines its own losses as the legacy
        combined all of them (a mean's share divided by the replica count), takes the
        gradients and updates."""
        plan = self.plan
        colocated = plan.colocated
        assert colocated is not None
        chain = plan.chains[0]
        value = cast(cst.BaseExpression, colocated.value.visit(_Expressions(plan)))
        if colocated.averaged:
            loss = _statement(
                "replica_loss = {value} / strategy.num_replicas_in_sync",
                value=_parenthesized(value),
            )
            why = (
                f"# The towers' losses were averaged into `{colocated.loss}`; apply_gradients "
                "sums the replicas' gradients."
            )
        else:
            loss = _statement("replica_loss = {value}", value=value)
            why = (
                f"# The towers' losses were summed into `{colocated.loss}`; apply_gradients "
                "sums the replicas' gradients too."
            )
        loss = loss.with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(why))])
        tape = cst.With(
            items=[
                cst.WithItem(
                    cst.parse_expression("tf.GradientTape()"), asname=cst.AsName(cst.Name("tape"))
                )
            ],
            body=cst.IndentedBlock(body=[*body, loss]),
        )
        variables = chain.gradient.variables
        listed: cst.BaseExpression = (
            variables.visit(_Expressions(plan))  # type: ignore[assignment]  # visit() returns an expression here
            if variables is not None
            else cst.parse_expression("tf1_variables.trainable_variables")
        )
        out: list[cst.BaseStatement] = [
            _statement(f"{colocated.losses} = []"),
            tape,
            _statement("variables = {value}", value=listed),
        ]
        if colocated.minimize:
            taken = _names_of(plan.loop.body)
            grads = next(n for n in ("grads", "replica_grads") if n not in taken)
            out.append(_statement(f"{grads} = tape.gradient(replica_loss, variables)"))
            call = chain.update_call
            pairs = cst.parse_expression(f"zip({grads}, variables)")
            update = call.with_changes(
                args=[call.args[0].with_changes(value=pairs), *call.args[1:]]
            )
            self.deferred.append(cst.SimpleStatementLine([cst.Expr(update)]))
            return out
        gradient = chain.gradient
        taken_value = (
            "list(zip(tape.gradient(replica_loss, variables), variables))"
            if gradient.pairs
            else "tape.gradient(replica_loss, variables)"
        )
        replaced = gradient.statement.visit(
            _ReplaceNode(gradient.call, cst.parse_expression(taken_value))
        )
        out.append(cast(cst.SimpleStatementLine, replaced).with_changes(leading_lines=[]))
        self._grads_names[id(chain)] = chain.combined
        self._update(chain)
        return out

    def _block(self, statements: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """One block of the tower body. The tape starts in the innermost block on the way to
        the (first) gradient call that has statements (the forward pass) before it."""
        plan = self.plan
        first = plan.chains[0].gradient.statement
        gradients = {id(c.gradient.statement): c for c in plan.chains}
        appends = {id(c.append): c for c in plan.chains}
        path = _path_to(statements, first)
        out: list[cst.BaseStatement] = []
        spans: list[tuple[int, int]] = []
        for statement in statements:
            start = len(out)
            chain = gradients.get(id(statement))
            if chain is not None and chain.gradient.helper is not None:
                # the function the tower calls takes the gradients under its own tape, or
                # under the tower's, handed to it
                written = self._statement(statement) or []
                if chain.gradient.helper.handed:
                    written = [s.visit(_HandedTape(chain.gradient.helper)) for s in written]  # type: ignore[misc]  # visit() returns a statement here
                out.extend(written)
            elif chain is not None:
                if statement is first and not self._tape_here(statements):
                    out.extend(self._scaled_losses())
                out.extend(self._gradient(chain))
            elif id(statement) in appends:
                out.extend(self._update(appends[id(statement)]))
            else:
                out.extend(self._statement(statement) or [])
            spans.append((start, len(out)))
        if path is None or not self._tape_here(statements):
            return out
        position = path[0]
        handed = plan.chains[0].gradient.helper is not None
        if statements[position] is first and handed:
            end = spans[position][1]  # the helper differentiates under the tape
            inside = out[:end]
        elif statements[position] is first:
            end = spans[position][0]
            inside = [*out[:end], *self._scaled_losses()]
        else:
            end = spans[position][1]
            inside = out[:end]
        tape_call = (
            "tf.GradientTape(persistent=True)" if len(plan.chains) > 1 else "tf.GradientTape()"
        )
        tape = cst.With(
            items=[
                cst.WithItem(cst.parse_expression(tape_call), asname=cst.AsName(cst.Name("tape")))
            ],
            body=cst.IndentedBlock(body=inside or [cst.SimpleStatementLine([cst.Pass()])]),
        )
        return [tape, *out[end:]]

    def _tape_here(self, statements: list[cst.BaseStatement]) -> bool:
        """Whether this block is where the tape starts."""
        return self.tape_block is not None and bool(statements) and statements[0] is self.tape_block

    def _find_tape_block(self) -> None:
        """The first statement of the block the tape starts in."""
        helper = self.plan.chains[0].gradient.helper
        if helper is not None and not helper.handed:
            self.tape_block = None  # the helper the tower calls has the tape
            return
        blocks: list[list[cst.BaseStatement]] = [list(_body(self.plan.loop))]
        chosen = blocks[0]
        target = self.plan.chains[0].gradient.statement
        while blocks:
            block = blocks.pop()
            path = _path_to(block, target)
            if path is None:
                continue
            position = path[0]
            if position > 0:
                chosen = block
            if block[position] is target:
                break
            blocks.extend(list(inner) for inner in _inner_blocks(block[position]))
        self.tape_block = chosen[0] if chosen else None

    def _loss_key(self, chain: Chain) -> tuple[str, bool]:
        return self.module.code_for_node(chain.gradient.loss), chain.averaged

    def _loss_names(self) -> dict[tuple[str, bool], cst.BaseExpression]:
        """The loss each gradient call differentiates: ``replica_loss`` (``_2``...) when it is
        scaled or an expression (computed under the tape), else the legacy name."""
        names: dict[tuple[str, bool], cst.BaseExpression] = {}
        for chain in self.plan.chains:
            key = self._loss_key(chain)
            if key in names:
                continue
            if chain.averaged or not isinstance(chain.gradient.loss, cst.Name):
                count = sum(
                    1
                    for n in names.values()
                    if isinstance(n, cst.Name) and n.value.startswith("replica_loss")
                )
                names[key] = cst.Name("replica_loss" if not count else f"replica_loss_{count + 1}")
            else:
                names[key] = chain.gradient.loss
        return names

    def _scaled_losses(self) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        names = self._loss_names()
        done = set()
        for chain in self.plan.chains:
            if chain.gradient.helper is not None:
                continue  # the helper scales the loss it is handed
            key = self._loss_key(chain)
            name = names[key]
            if key in done or not (
                isinstance(name, cst.Name) and name.value.startswith("replica_loss")
            ):
                continue
            done.add(key)
            loss = chain.gradient.loss
            if chain.averaged:
                statement = _statement(
                    "{name} = {loss} / strategy.num_replicas_in_sync",
                    name=name,
                    loss=_parenthesized(loss),
                )
                if not out:
                    statement = statement.with_changes(
                        leading_lines=[
                            cst.EmptyLine(
                                comment=cst.Comment(
                                    "# The towers averaged their gradients; apply_gradients sums "
                                    "the replicas'."
                                )
                            )
                        ]
                    )
                out.append(statement)
            else:
                out.append(_statement("{name} = {loss}", name=name, loss=loss))
        return out

    def _gradient(self, chain: Chain) -> list[cst.BaseStatement]:
        plan = self.plan
        gradient = chain.gradient
        variables = gradient.variables
        variables_value: cst.BaseExpression = (
            variables.visit(_Expressions(plan))  # type: ignore[assignment]  # visit() may return a sentinel; a statement stays a statement here
            if variables is not None
            else cst.parse_expression("tf1_variables.trainable_variables")
        )
        several = len(plan.chains) > 1
        out: list[cst.BaseStatement] = []
        if several and isinstance(variables_value, cst.Name):
            listed: cst.BaseExpression = variables_value
        else:
            index = plan.chains.index(chain)
            listed = cst.Name("variables" if not index else f"variables_{index + 1}")
            out.append(_statement("{name} = {value}", name=listed, value=variables_value))
        self.variables_of[id(chain)] = listed
        loss = self._loss_names()[self._loss_key(chain)]
        if gradient.pairs:
            value = parse_template_expression(
                "list(zip(tape.gradient({loss}, {listed}), {listed}))", loss=loss, listed=listed
            )
        else:
            value = parse_template_expression(
                "tape.gradient({loss}, {listed})", loss=loss, listed=listed
            )
        replaced = gradient.statement.visit(_ReplaceNode(gradient.call, value))
        if gradient.statement is chain.append:
            taken = _names_of(plan.loop.body)
            name = next(
                n for n in (chain.combined, "grads", "replica_grads") if n and n not in taken
            )
            appended = cast(cst.BaseExpression, chain.appended.visit(_ReplaceNode(gradient.call, value)))
            replaced = _statement("{name} = {value}", name=cst.Name(name), value=appended)
            self._grads_names[id(chain)] = name
        out.append(replaced)  # type: ignore[arg-type]  # the emitted statements are SimpleStatementLines
        if gradient.statement is chain.append:
            out.extend(self._update(chain))
        return out

    def _update(self, chain: Chain) -> list[cst.BaseStatement]:
        plan = self.plan
        grads_name = self._grads_names.get(id(chain))
        grads: cst.BaseExpression = cst.Name(grads_name) if grads_name else chain.appended
        if chain.hand_written:
            self.reduced.append((chain, grads))
            return []
        if chain.all_reduced:
            return self._all_reduced_update(chain, grads)
        out: list[cst.BaseStatement] = []
        reads = reading_gradients(chain.between, chain.combined)
        aliased = False
        for statement, changes in zip(chain.between, reads, strict=True):
            if not changes:
                # made for the update (its global step), not from the gradients
                out.append(statement.visit(_Expressions(plan)))  # type: ignore[arg-type]  # a statement stays a statement
                continue
            if isinstance(grads, cst.Name) and grads.value != chain.combined and not aliased:
                aliased = True
                out.append(
                    _statement("{name} = {value}", name=cst.Name(chain.combined), value=grads)
                )
                grads = cst.Name(chain.combined)
            why = (
                "the legacy ran this once on the combined gradients; it now runs on each "
                "replica's, before they are summed"
            )
            visited = statement.visit(_Expressions(plan))
            out.append(_marked(visited, Leftover.PER_REPLICA, why, self.writer.todos))  # type: ignore[arg-type]  # the emitted statements are SimpleStatementLines
        if any(reads):
            grads = cst.Name(chain.combined)
        call = chain.update_call
        args = list(call.args)
        if chain.update_function is not None:
            # a function making the update: it takes the replica's gradients where it took the
            # combined ones, and its results keep their names
            at = chain.update_function
            args[at] = args[at].with_changes(value=grads)
            update = cast(cst.SimpleStatementLine, chain.update).visit(
                _ReplaceNode(call, call.with_changes(args=args))
            )
            why = (
                f"`{plan.source.src(call.func, 40)}` ran once on the combined gradients and "
                "made its optimizer, global step and schedule there; it now runs in each "
                "replica on the replica's own (clipping, norms), and a tf.function needs its "
                "variables made once: build them in strategy.scope() before the train step"
            )
            line = cast(cst.SimpleStatementLine, update).with_changes(leading_lines=[])
            out.append(_marked(line, Leftover.PER_REPLICA, why, self.writer.todos))
            self.deferred.extend(out)
            return []
        args[0] = args[0].with_changes(value=_paired(args[0].value, grads, chain))
        update = cst.SimpleStatementLine([cst.Expr(call.with_changes(args=args))])
        out.append(update)
        self.deferred.extend(out)
        return []

    def _all_reduced_update(
        self, chain: Chain, grads: cst.BaseExpression
    ) -> list[cst.BaseStatement]:
        """What the program did to the combined gradients (clipping them by their global norm)
        sees the combined ones: each replica all-reduces the gradients of its scaled loss, which
        sums them to the towers' combination, runs those statements on the sum, and gives the
        update its share of the result (apply_gradients sums the replicas' gradients again)."""
        plan = self.plan
        variables = self.variables_of[id(chain)]
        name = chain.combined
        if chain.gradient.pairs:
            value = parse_template_expression(
                'list(zip(tf.distribute.get_replica_context().all_reduce("SUM", [g for g, _ in {grads}]), {variables}))',
                grads=grads,
                variables=variables,
            )
        else:
            value = parse_template_expression(
                'tf.distribute.get_replica_context().all_reduce("SUM", {grads})', grads=grads
            )
        how = "averaged" if chain.averaged else "summed"
        out: list[cst.BaseStatement] = [
            _statement("{name} = {value}", name=cst.Name(name), value=value).with_changes(
                leading_lines=[
                    cst.EmptyLine(
                        comment=cst.Comment(
                            f"# The towers {how} their gradients, then changed them: every "
                            "replica changes the replicas' sum."
                        )
                    )
                ]
            )
        ]
        out += [s.visit(_Expressions(plan)) for s in chain.between]  # type: ignore[misc]  # visit() may return a sentinel; a statement stays a statement here
        call = chain.update_call.visit(_Expressions(plan))
        assert isinstance(call, cst.Call)
        args = list(call.args)
        args[0] = args[0].with_changes(value=_shares(args[0].value))
        update = cst.SimpleStatementLine([cst.Expr(call.with_changes(args=args))])
        out.append(
            update.with_changes(
                leading_lines=[
                    cst.EmptyLine(
                        comment=cst.Comment(
                            "# apply_gradients sums the replicas' gradients: each gives its share."
                        )
                    )
                ]
            )
        )
        self.deferred.extend(out)
        return []

    def _statement(self, statement: cst.BaseStatement) -> list[cst.BaseStatement] | None:
        plan = self.plan
        if any(statement is holder for holder in plan.accumulating):
            return []
        if id(statement) in plan.per_gpu_makers:
            return []  # the placeholders of this tower: the step is given their values
        if id(statement) in plan.tower_summaries:
            return []  # written after the step, of every replica's value
        if _is_reuse_flag(statement, plan):
            return []  # `reuse = True` after the first tower: the store shares the variables
        if plan.source.line(statement) in plan.input_lines:
            why = (
                "each tower dequeued its own batch: feed the train step from a tf.data "
                "pipeline that gives replica i what tower i dequeued"
            )
            return [_marked(statement, Leftover.INPUT, why, self.writer.todos)]
        value = (
            statement.body[0].value
            if isinstance(statement, cst.SimpleStatementLine)
            and isinstance(statement.body[0], cst.Expr | cst.Assign)
            else None
        )
        if isinstance(value, cst.Call) and method_name(value) == "reuse_variables":
            return []
        if isinstance(statement, cst.SimpleStatementLine):
            qualified = [plan.source.qualify(c.func) for c in _calls(statement)]
            for name in qualified:
                if name in ("tensorflow.get_collection", "tensorflow.compat.v1.get_collection"):
                    args = [c for c in _calls(statement)][0].args
                    first = args[0].value if args else None
                    if first is not None and "UPDATE_OPS" in self.module.code_for_node(first):
                        self.gone.update(_names_of(statement))
                        self.writer.notes.append(
                            "the towers' UPDATE_OPS go: TF2 layers update their batch-norm "
                            "statistics where they run, in every replica, so the moving "
                            "statistics can differ from the legacy run's"
                        )
                        return []
                    return self._todo(
                        statement, Todo(Leftover.GRAPH, "graph collections do not exist in TF2")
                    )
                if name is not None and name.replace("compat.v1.", "").startswith(
                    "tensorflow.summary."
                ):
                    return self._todo(
                        statement,
                        Todo(
                            Leftover.SUMMARY,
                            "TF1 summaries are ops run by a session: write them with tf.summary in the train step",
                        ),
                    )
            if free_names(statement) & self.gone:
                return self._todo(
                    statement,
                    Todo(
                        Leftover.CASCADE,
                        f"uses `{sorted(free_names(statement) & self.gone)[0]}`, left under a TODO above",
                    ),
                )
            extended = _list_extension(statement)
            if extended is not None:
                # `losses += [loss]` would make the list a local of the replica function
                listed, element = extended
                statement = _statement(
                    "{listed}.append({element})", listed=cst.Name(listed), element=element
                ).with_changes(leading_lines=statement.leading_lines)
            return [statement.visit(_Expressions(plan))]  # type: ignore[list-item]  # visit() may return a sentinel; a statement stays a statement here
        if isinstance(statement, cst.With):
            return self._with(statement)
        if isinstance(statement, cst.If) and id(statement) in plan.hoisted:
            body = (
                self._block(list(statement.body.body))
                if isinstance(statement.body, cst.IndentedBlock)
                else []
            )
            if body:
                body[0] = _prepend_lines(body[0], statement.leading_lines)
            return body
        if isinstance(statement, cst.If | cst.For | cst.While | cst.Try):
            return [self._compound(statement)]
        return [statement]

    def _todo(self, statement: cst.BaseStatement, todo: Todo) -> list[cst.BaseStatement]:
        self.writer.todos.append(todo)
        self.gone.update(_names_of(statement))
        return [_commented(statement, todo, self.module)]

    def _with(self, statement: cst.With) -> list[cst.BaseStatement]:
        plan = self.plan
        items = []
        for item in statement.items:
            name = plan.source.qualify(item.item.func) if isinstance(item.item, cst.Call) else None
            if name in ("tensorflow.device", "tensorflow.compat.v1.device"):
                if not self.getter_placed:
                    items.append(
                        item.with_changes(
                            item=cst.parse_expression("tf1_variables.scope()"), asname=None
                        )
                    )
                    self.getter_placed = True
                continue
            if name in (
                "tensorflow.control_dependencies",
                "tensorflow.compat.v1.control_dependencies",
            ):
                reads = free_names(item.item)
                if reads & self.gone:
                    continue
            items.append(item)
        body = (
            self._block(list(statement.body.body))
            if isinstance(statement.body, cst.IndentedBlock)
            else []
        )
        if not items:
            if body:
                body[0] = _prepend_lines(body[0], statement.leading_lines)
            return body
        items[-1] = items[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return [
            statement.with_changes(
                items=items,
                body=statement.body.with_changes(
                    body=body or [cst.SimpleStatementLine([cst.Pass()])]
                ),
            )
        ]

    def _compound(self, statement: cst.BaseStatement) -> cst.BaseStatement:
        plan = self.plan

        class _Blocks(cst.CSTTransformer):
            def __init__(inner) -> None:  # noqa: N805
                inner.depth = 0

            def visit_IndentedBlock(inner, node):  # noqa: N805
                inner.depth += 1
                return inner.depth == 1

            def leave_IndentedBlock(inner, original_node, updated_node):  # noqa: N805
                inner.depth -= 1
                if inner.depth == 0:
                    body = self._block(list(original_node.body))
                    return updated_node.with_changes(
                        body=body or [cst.SimpleStatementLine([cst.Pass()])]
                    )
                return updated_node

        del plan
        return statement.visit(_Blocks())  # type: ignore[return-value]  # visit() may return a sentinel; a statement stays a statement here


def _is_reuse_flag(statement: cst.CSTNode, plan: Plan) -> bool:
    """``flag = True`` in the tower body for a name set before the loop: the towers' reuse
    switch (a local of the replica function now, read before it is set)."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    small = statement.body[0]
    return (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name)
        and small.targets[0].target.value in plan.before_loop
        and isinstance(small.value, cst.Name)
        and small.value.value in ("True", "False")
    )


def _names_of(statement: cst.CSTNode) -> set[str]:
    from tfmigrate.rules._towers import bound_names

    return bound_names(statement)


def _shares(pairs: cst.BaseExpression) -> cst.BaseExpression:
    """``zip(grads, variables)`` or a list of pairs, each gradient divided by the replicas."""
    if (
        isinstance(pairs, cst.Call)
        and isinstance(pairs.func, cst.Name)
        and pairs.func.value == "zip"
        and len(pairs.args) == 2
    ):
        divided = parse_template_expression(
            "[g / strategy.num_replicas_in_sync for g in {grads}]", grads=pairs.args[0].value
        )
        return pairs.with_changes(args=[pairs.args[0].with_changes(value=divided), pairs.args[1]])
    return parse_template_expression(
        "[(g / strategy.num_replicas_in_sync, v) for g, v in {pairs}]", pairs=pairs
    )


def _paired(
    written: cst.BaseExpression, grads: cst.BaseExpression, chain: Chain
) -> cst.BaseExpression:
    """What the update is given: the replica's gradients, still zipped with the variables
    when the legacy combined bare ``tf.gradients`` inside ``zip(combine(tower_grads), params)``."""
    if (
        not chain.gradient.pairs
        and not chain.combined
        and isinstance(written, cst.Call)
        and isinstance(written.func, cst.Name)
        and written.func.value == "zip"
        and len(written.args) == 2
    ):
        return written.with_changes(
            args=[written.args[0].with_changes(value=grads), written.args[1]]
        )
    return grads


def _parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(node, cst.Name | cst.Call | cst.Attribute | cst.Subscript):
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


class _ReplaceNode(cst.CSTTransformer):
    def __init__(self, old: cst.CSTNode, new: cst.CSTNode) -> None:
        self.old, self.new = old, new

    def on_leave(self, original_node, updated_node):
        return self.new if original_node is self.old else updated_node


def _path_to(statements: Sequence[cst.BaseStatement], target: cst.CSTNode) -> list[int] | None:
    """Indexes from ``statements`` down to ``target`` (first: the index in ``statements``)."""
    for position, statement in enumerate(statements):
        if statement is target:
            return [position]
        for inner in _inner_blocks(statement):
            below = _path_to(inner, target)
            if below is not None:
                return [position, *below]
    return None


def _walk_statements(node: cst.CSTNode):
    stack = list(node.children)
    while stack:
        current = stack.pop()
        if isinstance(current, cst.BaseStatement):
            yield current
        stack.extend(current.children)


def _inner_blocks(statement: cst.CSTNode) -> list[Sequence[cst.BaseStatement]]:
    from tfmigrate.convert.plan import _blocks

    return _blocks(statement)
