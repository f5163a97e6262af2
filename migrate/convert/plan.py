"""The plan stage: what happens to each statement of the function that builds and runs the
towers, decided from the IR's tower core and the code around it.

A tower core converts when its loop, its gradient call, the combination and the update are found
in one function that also runs the training step (``Session.run`` of the update), or in one method
of a class whose other method runs it (the two read as one body, ``self.x`` keyed like a name). Every other
statement of that function gets a phase -- set-up (kept where it is: it runs once), step (moved
into the ``@tf.function`` train step: it read a per-step input or a value the towers fill), or
gone (the session, initializers, the combination) -- or, when it has no TF2 form, a TODO. The plan
only decides; ``emit`` writes.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar, cast

import libcst as cst

from tfmigrate import tree
from tfmigrate.convert import ir, per_gpu
from tfmigrate.convert.class_runner import ForeignRunner, JoinedSource, foreign_runner
from tfmigrate.convert.project import Project, SourceFile, method_of
from tfmigrate.convert.recognize._code import Code, callee, reading, statement_of
from tfmigrate.convert.todo import Leftover, Todo
from tfmigrate.names import dotted
from tfmigrate.rules._towers import bound_names as _bound_plain
from tfmigrate.rules._towers import free_names as _free_plain
from tfmigrate.rules._towers import get_arg, method_name

Statement = cst.SimpleStatementLine | cst.BaseCompoundStatement

_PLACEHOLDERS = frozenset({"tensorflow.placeholder", "tensorflow.placeholder_with_default"})
_VARIABLES = frozenset(
    {
        "tensorflow.Variable",
        "tensorflow.train.get_or_create_global_step",
        "tensorflow.train.create_global_step",
    }
)
_INITIALIZERS = frozenset(
    {
        "tensorflow.global_variables_initializer",
        "tensorflow.local_variables_initializer",
        "tensorflow.initialize_all_variables",
        "tensorflow.initialize_local_variables",
        "tensorflow.tables_initializer",
        "tensorflow.variables_initializer",
    }
)
_SESSIONS = frozenset({"tensorflow.Session", "tensorflow.InteractiveSession"})
_SUPERVISOR = "tensorflow.train.Supervisor"
# what a Supervisor did that the converted loop does not (its TODO names them)
_SUPERVISOR_WORK = frozenset(
    {"logdir", "summary_op", "saver", "save_summaries_secs", "save_model_secs", "init_op"}
)
MONITORED_GOES = "the monitored session goes: the loop does what it did"
_GLOBAL_STEPS = frozenset(
    {"tensorflow.train.get_or_create_global_step", "tensorflow.train.create_global_step"}
)
_MONITORED = frozenset(
    {"tensorflow.train.MonitoredTrainingSession", "tensorflow.train.MonitoredSession",
     "tensorflow.train.SingularMonitoredSession"}
)  # fmt: skip
# what a monitored session's keywords do that the converted loop needs nothing for
_MONITORED_QUIET = frozenset({"hooks", "config", "is_chief", "master"})
_QUEUE_PLUMBING = frozenset(
    {"tensorflow.train.Coordinator", "tensorflow.train.start_queue_runners"}
)
_ONE_SHOT = frozenset(
    {"tensorflow.data.make_one_shot_iterator", "tensorflow.data.make_initializable_iterator"}
)
_ITERATOR_METHODS = frozenset({"make_one_shot_iterator", "make_initializable_iterator"})
_SCHEDULES = frozenset(
    f"tensorflow.train.{name}"
    for name in (
        "exponential_decay", "piecewise_constant", "polynomial_decay", "natural_exp_decay",
        "inverse_time_decay", "cosine_decay", "cosine_decay_restarts", "linear_cosine_decay",
        "noisy_linear_cosine_decay",
    )
)  # fmt: skip
_VARIABLE_MAKERS = frozenset(
    {
        "tensorflow.Variable", "tensorflow.get_variable",
        "tensorflow.train.get_or_create_global_step", "tensorflow.train.create_global_step",
    }
)  # fmt: skip
# the FileWriter arguments tf.summary.create_file_writer keeps (the graph goes)
_WRITER_KEYWORDS = frozenset({"logdir", "max_queue", "filename_suffix"})
_AVERAGES = "tensorflow.train.ExponentialMovingAverage"
_WRAPPERS = frozenset({"tensorflow.Graph", "tensorflow.device", "tensorflow.variable_scope"})
_TF1_ONLY = (
    ("tensorflow.train.Saver", Leftover.CHECKPOINT, "tf.train.Saver needs a session: save and "
     "restore with tf.train.Checkpoint / CheckpointManager"),
    ("tensorflow.summary.", Leftover.SUMMARY, "TF1 summaries are ops run by a session: write "
     "them with tf.summary under a tf.summary.create_file_writer"),
    ("tensorflow.get_collection", Leftover.GRAPH, "graph collections do not exist in TF2"),
    ("tensorflow.add_to_collection", Leftover.GRAPH, "graph collections do not exist in TF2"),
    ("tensorflow.get_default_graph", Leftover.GRAPH, "there is no default graph in TF2"),
    ("tensorflow.train.ExponentialMovingAverage", Leftover.GRAPH, "the EMA's apply op ran in "
     "every step: apply it inside the train step"),
    ("tensorflow.Print", Leftover.GRAPH, "tf.Print is gone: use tf.print"),
    ("tensorflow.moving_average_variables", Leftover.GRAPH, "graph collections do not exist in TF2"),
    ("tensorflow.global_variables", Leftover.GRAPH, "graph collections do not exist in TF2: "
     "the model's variables are tf1_variables.variables"),
    ("tensorflow.local_variables", Leftover.GRAPH, "graph collections do not exist in TF2"),
    ("tensorflow.model_variables", Leftover.GRAPH, "graph collections do not exist in TF2"),
    ("tensorflow.all_variables", Leftover.GRAPH, "graph collections do not exist in TF2"),
)  # fmt: skip


# A class-based trainer keeps its values on the object: ``self.x`` is keyed like a name, so a
# placeholder, a loss or the update made in one method is followed into the method that runs it.
RECEIVER = "self"
# A model object run from outside its class (``model = Model(...)`` then
# ``sess.run(model.train_op)`` in a function of the module): while its core is planned and
# emitted, ``model.x`` is keyed as ``self.x`` so the runner's fetches and feeds meet the values
# the building method made.
_OUTSIDE: ContextVar[str | None] = ContextVar("outside_receiver", default=None)
_DEFS = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


def attribute_key(node: cst.CSTNode) -> str | None:
    """``self.x`` (or the outside runner's ``model.x``) -> ``"self.x"``; None for anything
    else."""
    if (
        isinstance(node, cst.Attribute)
        and isinstance(node.value, cst.Name)
        and node.value.value in (RECEIVER, _OUTSIDE.get())
    ):
        return f"{RECEIVER}.{node.attr.value}"
    return None


def _key(node: cst.CSTNode) -> str | None:
    """A name's value, or a ``self.x`` attribute's key."""
    return node.value if isinstance(node, cst.Name) else attribute_key(node)


def _attribute_keys(node: cst.CSTNode) -> set[str]:
    return {key for n in tree.walk(node, _DEFS) if (key := attribute_key(n)) is not None}


def free_names(node: cst.CSTNode) -> set[str]:
    """The names ``node`` reads, with the ``self.x`` attributes it spells."""
    return _free_plain(node) | _attribute_keys(node)


def bound_names(node: cst.CSTNode) -> set[str]:
    """The names ``node`` binds, with the ``self.x`` attributes it assigns."""
    found = _bound_plain(node)
    for current in tree.walk(node, _DEFS):
        if isinstance(current, cst.AssignTarget):
            target = current.target
            parts = target.elements if isinstance(target, cst.Tuple | cst.List) else [target]
            for part in parts:
                key = attribute_key(part.value if isinstance(part, cst.Element) else part)
                if key is not None:
                    found.add(key)
    return found


class Action(Enum):
    KEEP = "kept"  # set-up: runs once, where it was
    DROP = "dropped"  # no TF2 counterpart needed (session, initializer, combination, ...)
    STEP = "moved into the train step"  # before the replicas run
    POST = "moved into the train step, after the replicas"
    TRAIN_STEP = "the tower loop: becomes the train step"
    UPDATE = "moved into the replica function"
    STEP_RUN = "the training step's Session.run: calls the train step"
    ITERATOR = "iterator: iter(dataset)"
    NEXT = "a batch fetched by the session: next(iterator)"
    UNWRAP = "with-statement replaced by its body"
    SCOPE = "graph wrapper: strategy.scope()"
    TODO = "left to the user"
    CHECKPOINT = "tf.train.Saver -> tf.train.Checkpoint"
    FED_VARIABLE = "a placeholder the optimizer reads -> a variable the step assigns"
    SAVER_CALL = "saver.save/restore -> checkpoint.write/restore"
    READ = "a variable fetched by the session: its value, read eagerly"
    STOP_LOOP = "while not sess.should_stop(): the StopAtStepHook's bound"
    SUMMARY_WRITER = "tf.summary.FileWriter -> tf.summary.create_file_writer"
    SUMMARY_WRITE = "writer.add_summary -> tf.summary.scalar under the writer"
    FEED_LISTS = "a feed dict of per-GPU placeholders -> a list per placeholder list"
    FEED_APPEND = "feed[L[i]] = value -> L.append(value)"


@dataclass(frozen=True)
class Scalar:
    """A TF1 scalar summary the converted loop writes: its tag as written and its value as
    the write site reads it (a value the train step returned, or one made once)."""

    tag: cst.BaseExpression
    value: cst.BaseExpression
    # a tower's summary: (index, value) names the write binds over every tower's value,
    # and the name of those values at the call
    towers: tuple[str, str, str] | None = None
    kind: str = "scalar"  # the tf.summary function: `histogram` of each trainable variable


@dataclass(frozen=True)
class StepRun:
    """The ``Session.run`` of the update: what the train step returns and is called with."""

    values: tuple[cst.BaseExpression, ...]  # fetched values, in order
    run_only: tuple[int, ...]  # positions of the fetches that only ran (the update)
    arguments: tuple[tuple[str, cst.BaseExpression], ...]  # parameter -> value at the call
    target: cst.BaseAssignTargetExpression | None
    single: bool  # the fetches were one expression, not a list


@dataclass(frozen=True)
class Decision:
    action: Action
    why: str = ""
    todo: Todo | None = None
    step_run: StepRun | None = None
    dataset: cst.BaseExpression | None = None  # ITERATOR: what iter() takes
    iterator: str | None = None  # NEXT: the iterator
    variable: str | None = None  # READ: the variable read
    # SUMMARY_WRITE: the writer, the step written at and the scalars of the merged summary
    writer: str | None = None
    step: cst.BaseExpression | None = None
    scalars: tuple[Scalar, ...] = ()
    # FEED_LISTS: the lists it makes instead of the feed; FEED_APPEND: the list appended to
    fed_lists: tuple[str, ...] = ()


@dataclass(frozen=True)
class GradientHelper:
    """A function (or method) the towers call that takes the tower's gradients itself
    (``loss, grads = self._compute_net_gradients(x, y, opt)``): its gradient call, the
    statement of its body holding it, and the name the tower binds the gradients to. The
    helper gets the tape; the tower calls it as before."""

    function: cst.FunctionDef
    call: cst.Call
    statement: cst.BaseStatement  # the helper body's top-level statement holding the call
    grads: str  # the tower's name for the helper's gradients
    # the helper's file when it is not the loop's (``function_builder.single_core_graph``
    # calling the module's own ``loss_and_gradients``): that module gets the tape
    source: SourceFile | None = None
    # the loss it differentiates is made from one it is given (``self._backward(loss)``): the
    # forward pass ran in the tower, so the tower's tape is handed to it (``tape=tape``)
    handed: bool = False


@dataclass(frozen=True)
class Gradient:
    """The tower's gradient call and how the replica function takes it."""

    call: cst.Call
    statement: cst.BaseStatement
    loss: cst.BaseExpression
    variables: cst.BaseExpression | None  # var_list / params as written (None: all trainables)
    pairs: bool  # compute_gradients (grads and variables) vs tf.gradients (grads only)
    helper: GradientHelper | None = None  # taken in a function the tower calls


@dataclass(frozen=True)
class Chain:
    """One gradient call of the towers and where its gradients go: the list it is appended to,
    the combination after the loop (``combined`` names its result), the update (and what the
    program did to the combined gradients before it, ``between``)."""

    gradient: Gradient
    append: cst.SimpleStatementLine
    appended: cst.BaseExpression
    combined: str
    update: Statement
    update_call: cst.Call
    between: tuple[Statement, ...]
    averaged: bool  # the replicas' losses are scaled: apply_gradients sums their gradients
    # A hand-written update function (``adam(params, grads, lr)``): the train step reduces the
    # replicas' gradients (``mean``: averaged, else summed) and calls it with them.
    hand_written: bool = False
    mean: bool = False
    # the statements of the towers binding the variables the hand-written update reads
    # (``params = tf.trainable_variables()``): the train step binds them again
    rebound: tuple[cst.SimpleStatementLine, ...] = ()
    # An optimizer update of combined gradients the program changed first (``between``:
    # clipping by their global norm): each replica all-reduces its gradients to the towers'
    # combination and runs ``between`` on it before the update.
    all_reduced: bool = False
    # the update is a repo function taking the gradients (``get_train_op(FLAGS, grads)``):
    # which of its arguments they are; the call keeps what it binds
    update_function: int | None = None


@dataclass(frozen=True)
class Colocated:
    """Towers that only compute losses, collected in ``losses`` and combined after the loop by
    ``combine`` (``loss = value``), which one gradient call (``minimize`` or
    ``compute_gradients``, colocating the gradients with the towers) differentiates. Each
    replica computes ``value`` over its own towers' losses; ``averaged`` when ``value`` is a
    mean over the list (divided by the replica count then: the strategy sums gradients)."""

    losses: str
    combine: cst.SimpleStatementLine
    loss: str
    value: cst.BaseExpression
    averaged: bool
    minimize: bool  # the gradient call is the update


_MEANS = frozenset({"tensorflow.reduce_mean"})
_SUMS = frozenset({"tensorflow.reduce_sum", "tensorflow.add_n", "tensorflow.accumulate_n"})
_COLOCATED_KEYWORDS = frozenset(
    {"colocate_gradients_with_ops", "gate_gradients", "aggregation_method", "name"}
)


_D = TypeVar("_D")


class Decisions(Generic[_D]):
    """What a plan decided for each statement, by the statement's identity (both plans)."""

    decisions: dict[int, _D]

    def decide(self, statement: cst.CSTNode, decision: _D) -> None:
        self.decisions[id(statement)] = decision

    def decision(self, statement: cst.CSTNode) -> _D | None:
        return self.decisions.get(id(statement))


@dataclass
class Plan(Decisions[Decision]):
    source: SourceFile
    scope: cst.FunctionDef | cst.Module
    loop: cst.For
    index: str  # the tower index's name in the replica function
    enumerated: tuple[str, cst.BaseExpression] | None  # `for i, d in enumerate(X)`: (d, X)
    averaged: bool
    gradient: Gradient
    append: cst.SimpleStatementLine  # the statement putting the tower's gradients in the list
    appended: cst.BaseExpression  # what it appends
    combined: str  # the name the combination's result had
    update: Statement  # the update statement (or its control_dependencies block)
    update_call: cst.Call
    between: list[Statement]  # statements between the combination and the update
    inputs: list[str]  # train step parameters, in order
    chains: list[Chain] = field(default_factory=list)  # the first is the fields above
    step_before: list[Statement] = field(default_factory=list)
    step_after: list[Statement] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)  # tower names the replicas return
    # outputs the legacy bound under `if i == K:` (tower K only): name -> K; those ifs run on
    # every replica now (their ids), and tower K's value is read
    first_tower: dict[str, int] = field(default_factory=dict)
    hoisted: set[int] = field(default_factory=set)
    # tower outputs the step returns for every tower (a summary per tower): output -> the
    # step's name for its per-replica values; `towers_only`: outputs returned only for that
    per_tower: dict[str, str] = field(default_factory=dict)
    towers_only: set[str] = field(default_factory=set)
    tower_summaries: set[int] = field(default_factory=set)  # the towers' scalars: they go
    # `total += tower_value` in the towers: (total, tower_value), summed over the replicas
    sums: list[tuple[str, cst.BaseExpression]] = field(default_factory=list)
    accumulating: list[cst.SimpleStatementLine] = field(default_factory=list)
    # sums into a value made once (a variable): the train step's name for value + sum
    totals: dict[str, str] = field(default_factory=dict)
    decisions: dict[int, Decision] = field(default_factory=dict)
    wrapper: cst.With | None = None  # the outermost graph wrapper (-> strategy.scope())
    input_lines: set[int] = field(default_factory=set)  # queue inputs: TODO(tfmigrate) TFM311
    # iterators made from a fed string handle inside the step: their get_next() is next()
    step_iterators: set[str] = field(default_factory=set)
    before_loop: set[str] = field(default_factory=set)  # bound beside the loop, before it
    placeholder_helpers: set[str] = field(default_factory=set)  # functions making the inputs
    iterator_helpers: set[str] = field(default_factory=set)  # functions making the iterator
    # placeholders an optimizer or schedule read (a learning rate fed per step): now variables
    # the train step assigns from its parameter -> that parameter's name
    fed_variables: dict[str, str] = field(default_factory=dict)
    combination_helpers: set[str] = field(default_factory=set)  # average_gradients & co.
    # what an update function returns besides the op (``lr, gnorm``), now made per replica
    update_values: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    # `op = ema.apply(tf.trainable_variables())` grouped with the update: the replica function
    # applies it after each update
    averages: list[cst.SimpleStatementLine] = field(default_factory=list)
    colocated: Colocated | None = None  # one loss over the towers, differentiated once
    # a class-based trainer: the method that runs the step (``scope`` is the building one)
    runner: cst.FunctionDef | None = None
    # what the runner calls the object: ``self``, or the name a function outside the class
    # bound the object to
    receiver: str = RECEIVER
    # the module of a runner outside the towers' module (``class_runner``): it gets the call
    runner_source: SourceFile | None = None
    # what ended a `while not sess.should_stop():` loop the converted loop cannot bound
    stopped_by: str = "the monitored session's hooks"

    @property
    def todos(self) -> list[Todo]:
        return [d.todo for d in self.decisions.values() if d.todo is not None]
    # a monitored session's StopAtStepHook(last_step=...) and the global step it counts
    last_step: cst.BaseExpression | None = None
    global_step: str | None = None
    # what a monitored session did that the converted loop does not (its TODO)
    session_todo: Todo | None = None
    # per-GPU placeholder lists (as written: `points_phs`, `model.inputs_pl_list`) -> the train
    # step's parameter holding every tower's value; the tower statements that made them (gone)
    per_gpu: dict[str, str] = field(default_factory=dict)
    per_gpu_makers: set[int] = field(default_factory=set)
    # each such parameter's placeholder dtypes as `tf.x` (three for a SparseTensor's; none when
    # not known) and the parameters whose placeholders made a SparseTensor
    per_gpu_dtypes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    per_gpu_sparse: set[str] = field(default_factory=set)
    # each such parameter -> the replica function's name for its own value (its argument),
    # and the function giving replica i the i-th of a list's values (a distributed value)
    per_gpu_locals: dict[str, str] = field(default_factory=dict)
    per_replica: str = "per_replica"
    per_gpu_dynamic: bool = False  # one of them changes shape from step to step


class NotPlanned(Exception):
    """The core cannot be converted by this plan; the reason names what and where."""


def plan_core(source: SourceFile, program: ir.Program, core: ir.TowerCore) -> Plan:
    """The plan for ``core``'s tower loop in ``source``, or NotPlanned with the reason."""
    planner = _Planner(source, program, core)
    outside = planner.outside_runner()
    with receiver_alias(outside[1] if outside else None):
        return planner.plan()


@contextmanager
def receiver_alias(name: str | None) -> Iterator[None]:
    """``name.x`` keyed as ``self.x`` while the block runs (a model object run from outside
    its class)."""
    token = _OUTSIDE.set(name)
    try:
        yield
    finally:
        _OUTSIDE.reset(token)


# -- reading helpers ------------------------------------------------------------------------------
def _simple(statement: cst.CSTNode) -> cst.BaseSmallStatement | None:
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        return statement.body[0]
    return None


def _value(statement: cst.CSTNode) -> cst.BaseExpression | None:
    small = _simple(statement)
    if isinstance(small, cst.Assign | cst.Expr):
        return small.value
    return None


def _targets(statement: cst.CSTNode) -> list[cst.BaseAssignTargetExpression]:
    small = _simple(statement)
    if isinstance(small, cst.Assign):
        return [t.target for t in small.targets]
    return []


def _target_name(statement: cst.CSTNode) -> str | None:
    targets = _targets(statement)
    if len(targets) == 1 and isinstance(targets[0], cst.Name):
        return targets[0].value
    return attribute_key(targets[0]) if len(targets) == 1 else None


def _run_fetches(node: cst.CSTNode) -> Iterator[cst.BaseExpression]:
    """What each ``x.run(fetches, ...)`` in ``node`` fetches."""
    for call in _calls(node):
        fetches = get_arg(call, 0, "fetches") if method_name(call) == "run" else None
        if fetches is not None:
            yield fetches


def _target_name_node(statement: cst.CSTNode) -> cst.BaseAssignTargetExpression | None:
    targets = _targets(statement)
    return targets[0] if len(targets) == 1 else None


def _calls(node: cst.CSTNode) -> Iterator[cst.Call]:
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Call):
            yield current
        if isinstance(current, cst.FunctionDef | cst.ClassDef | cst.Lambda) and current is not node:
            continue
        stack.extend(reversed(current.children))


def _blocks(statement: cst.CSTNode) -> list[Sequence[cst.BaseStatement]]:
    """The statement lists directly inside a compound statement."""
    found: list[Sequence[cst.BaseStatement]] = []
    for name in ("body", "orelse", "finalbody"):
        part = getattr(statement, name, None)
        if isinstance(part, cst.IndentedBlock):
            found.append(part.body)
        elif isinstance(part, cst.Else | cst.Finally):
            found.extend(_blocks(part))
    for handler in getattr(statement, "handlers", ()):
        found.extend(_blocks(handler))
    if isinstance(statement, cst.If) and isinstance(statement.orelse, cst.If):
        found.extend(_blocks(statement.orelse))
    return found


def _body(
    node: cst.FunctionDef | cst.Module | cst.BaseCompoundStatement,
) -> Sequence[cst.BaseStatement]:
    if isinstance(node, cst.Module):
        return node.body
    body = node.body
    if isinstance(body, cst.IndentedBlock):
        return body.body
    return []


def statements_in(block: Iterable[cst.BaseStatement]) -> Iterator[cst.BaseStatement]:
    """Every statement of a block, nested ones included, not into nested defs."""
    for statement in block:
        yield statement
        if isinstance(statement, cst.FunctionDef | cst.ClassDef):
            continue
        for inner in _blocks(statement):
            yield from statements_in(inner)


def with_closures(body: list[cst.BaseStatement], updates: set[str]) -> list[cst.BaseStatement]:
    """``body`` with the statements of the functions it defines after each, in order, when
    one of them runs one of ``updates`` (``sess.run([train_op, loss], feed_dict=...)``): the
    functions beside it that run the session too (an evaluation) are read with it."""
    defined = [s for s in body if isinstance(s, cst.FunctionDef)]
    if not any(free_names(fetches) & updates for d in defined for fetches in _run_fetches(d.body)):
        return body
    out: list[cst.BaseStatement] = []
    for statement in body:
        out.append(statement)
        if isinstance(statement, cst.FunctionDef) and any(_run_fetches(statement.body)):
            out += statements_in(_body(statement))
    return out


# -- what both planners read the same way (the tower one here, horovod_plan's too) ---------------
def qualify(source: SourceFile, node: cst.BaseExpression) -> str | None:
    """The qualified name ``node`` spells, ``tf.compat.v1.`` read as ``tf.``."""
    name = source.qualify(node)
    if name is not None and name.startswith("tensorflow.compat.v1."):
        name = "tensorflow." + name[len("tensorflow.compat.v1.") :]
    return name


def tf1_only(called: Iterable[str | None]) -> Todo | None:
    """The TODO of the first TF1-only API among the qualified names of a statement's calls."""
    for name in called:
        for prefix, kind, why in _TF1_ONLY:
            if name is not None and (
                name == prefix or (prefix.endswith(".") and name.startswith(prefix))
            ):
                return Todo(kind, why)
    return None


def gone_reads(reads: set[str], sessions: set[str], gone: dict[str, Todo]) -> Todo | None:
    """Why a statement reading ``reads`` goes under a TODO: it uses a TF1 session, or a name
    whose definition went under one."""
    for name in sorted(reads):
        if name in sessions:
            return Todo(Leftover.SESSION, f"uses the TF1 session `{name}`")
        if name in gone:
            return Todo(Leftover.CASCADE, f"uses `{name}`, left under a TODO above")
    return None


def simple_line(
    statement: cst.BaseStatement,
    with_: Callable[[cst.With], None],
    compound: Callable[[cst.BaseStatement], None],
) -> cst.SimpleStatementLine | None:
    """A simple statement line, for the caller to decide; a with-statement or another compound
    statement goes to its own planner (None)."""
    if isinstance(statement, cst.With):
        with_(statement)
        return None
    if not isinstance(statement, cst.SimpleStatementLine):
        compound(statement)
        return None
    return statement


def reads_todo(names: set[str], why: str) -> Todo:
    """The TODO of a statement reading ``names`` (the first named), values that moved with the
    step: ``why`` says where they live now."""
    return Todo(Leftover.TOWER_VALUE, f"reads `{sorted(names)[0]}`, {why}")


def method_receiver(node: cst.CSTNode | None, method: str, receivers: Container[str]) -> str | None:
    """``r`` when ``node`` is the call ``r.method(...)`` with ``r`` one of ``receivers``."""
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == method
        and (receiver := _key(node.func.value)) in receivers
    ):
        return receiver
    return None


def receiver_call(
    statement: cst.CSTNode, receivers: set[str], methods: Iterable[str] | None = None
) -> cst.Call | None:
    """The first call ``r.method(...)`` in ``statement`` with ``r`` one of ``receivers`` (and
    the method one of ``methods``, when given)."""
    for call in _calls(statement):
        func = call.func
        if (
            isinstance(func, cst.Attribute)
            and _key(func.value) in receivers
            and (methods is None or func.attr.value in methods)
        ):
            return call
    return None


def saver_action(
    statement: cst.CSTNode, called: str | None, name: str | None, savers: set[str]
) -> str | Todo | None:
    """What becomes of a statement about a tf.train.Saver, as the name of both plans' action:
    ``CHECKPOINT`` for ``saver = tf.train.Saver(...)`` (``saver`` joins ``savers``),
    ``SAVER_CALL`` for ``saver.save(sess, path[, global_step=n])`` / ``saver.restore(sess,
    path)``; the TODO of any other method; None when the statement is about no saver."""
    if called == "tensorflow.train.Saver" and name is not None:
        savers.add(name)
        return "CHECKPOINT"
    call = receiver_call(statement, savers)
    if call is None:
        return None
    assert isinstance(call.func, cst.Attribute)
    method = call.func.attr.value
    if method in ("save", "restore") and len(call.args) >= 2:
        return "SAVER_CALL"
    return Todo(Leftover.CHECKPOINT, f"`{method}` of a tf.train.Saver")


def session_run_todo(run: bool = False) -> Todo:
    """A Session.run that stays (``run``: one with no fetches named)."""
    if run:
        return Todo(Leftover.SESSION, "a Session.run")
    return Todo(
        Leftover.SESSION, "runs graph ops in the TF1 session: call them eagerly or in a tf.function"
    )


def feed_items(feed: cst.Dict) -> list[tuple[str, cst.BaseExpression]] | None:
    """A feed_dict's (placeholder, fed value) pairs; None unless every key is a name (or a
    ``self.x`` attribute)."""
    items = []
    for element in feed.elements:
        if not isinstance(element, cst.DictElement):
            return None
        key = _key(element.key)
        if key is None:
            return None
        items.append((key, element.value))
    return items


def session_method(value: cst.BaseExpression | None, sessions: set[str]) -> bool:
    """``sess.close()``, ``sess.request_stop()``, ``sess.join()``, ``sess.graph.finalize()``."""
    if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Attribute):
        return False
    receiver = value.func.value
    if isinstance(receiver, cst.Attribute) and receiver.attr.value == "graph":
        return _key(receiver.value) in sessions
    return _key(receiver) in sessions and value.func.attr.value in (
        "close",
        "request_stop",
        "join",
        "stop",  # a Supervisor's
    )


def with_names(statement: cst.With) -> set[str]:
    """The names a with-statement binds with ``as``."""
    return {
        item.asname.name.value
        for item in statement.items
        if item.asname is not None and isinstance(item.asname.name, cst.Name)
    }


def _header(statement: cst.BaseStatement) -> list[cst.CSTNode]:
    if isinstance(statement, cst.For):
        return [statement.iter]
    if isinstance(statement, cst.While):
        return [statement.test]
    if isinstance(statement, cst.If):
        # an `elif` test is read before its branch runs, as the `if`'s is
        tests: list[cst.CSTNode] = [statement.test]
        branch = statement.orelse
        while isinstance(branch, cst.If):
            tests.append(branch.test)
            branch = branch.orelse
        return tests
    if isinstance(statement, cst.With):
        return [item.item for item in statement.items]
    return []


def _subscript_reads(statement: cst.CSTNode) -> set[str]:
    found: set[str] = set()
    for target in _targets(statement):
        if isinstance(target, cst.Subscript | cst.Attribute):
            found |= free_names(target)
    return found


# -- the planner ----------------------------------------------------------------------------------
class _Planner:
    def __init__(self, source: SourceFile, program: ir.Program, core: ir.TowerCore) -> None:
        self.source = source
        self.program = program
        self.core = core
        # a function of another module running the object (looked for once)
        self.foreign: ForeignRunner | None = None
        self.foreign_searched = False

    def q(self, node: cst.BaseExpression) -> str | None:
        return qualify(self.source, node)

    def call_q(self, node: cst.CSTNode | None) -> str | None:
        return self.q(node.func) if isinstance(node, cst.Call) else None

    def line(self, node: cst.CSTNode) -> int:
        return self.source.line(node)

    def qualified_calls(self, node: cst.CSTNode) -> list[str]:
        return [name for call in _calls(node) if (name := self.call_q(call)) is not None]

    # -- finding the core's pieces ---------------------------------------------------------------
    def plan(self) -> Plan:
        core = self.core
        if core.towers is None:
            raise NotPlanned("no tower loop (Horovod's per-process step)")
        colocated = core.combination.kind is ir.CombineKind.COLOCATED_LOSS
        if core.combination.kind not in (ir.CombineKind.AVERAGED, ir.CombineKind.SUMMED) and (
            not colocated
        ):
            raise NotPlanned(f"combination {core.combination.kind.value}")
        if core.update.kind not in (
            ir.UpdateKind.APPLY_GRADIENTS,
            ir.UpdateKind.HAND_WRITTEN,
        ) and not (colocated and core.update.kind is ir.UpdateKind.MINIMIZE):
            raise NotPlanned(f"update by {core.update.kind.value}")
        if core.towers.where.file != self.source.rel:
            raise NotPlanned("the towers are in another module")
        loop = self._loop(core.towers.where.line)
        scope = self.source.enclosing_def(loop) or self.source.module
        runner, receiver = None, RECEIVER
        if isinstance(scope, cst.FunctionDef) and self.source.enclosing_class(loop) is not None:
            runner, receiver = self._runner(scope)
        self.scope = scope
        self.loop = loop
        self.body = list(statements_in(_body(scope)))
        if runner is not None:
            # the method that runs the step continues the building one: its statements are
            # decided after them, the values the step fills read as ``self.x``
            self.body += statements_in(_body(runner))
        self._layer_wise_before(loop)
        index, enumerated = self._index(loop)
        self.index = index
        chains: list[Chain] = []
        self.plan_inits: list[str] = []  # lists an inline combination loop fills
        drops: list[tuple[Statement | None, str]] = []
        one_loss = self._colocated(loop) if colocated else None
        if one_loss is not None:
            chains.append(one_loss[0])
            drops.append((None, one_loss[1].losses))
        for gradient in self._gradients(loop) if one_loss is None else []:
            append, appended, tower_list = self._append(loop, gradient)
            combination, combined = self._combination(tower_list, None)
            inline = self._inline_update(combination, tower_list)
            if inline is not None:
                # `opt.apply_gradients(average_gradients(tower_grads))`: combined in the call
                update, update_call = self._holder(combination), inline
                combined, between = "", []
            else:
                update, update_call = self._update_of(combination, combined)
                between = self._between(combination, update)
            hand_written = self._hand_written(update_call)
            averaged = self._averaged(update)
            all_reduced = any(reading_gradients(between, combined)) and not hand_written
            chains.append(
                Chain(
                    gradient,
                    append,
                    appended,
                    combined,
                    update,
                    update_call,
                    tuple(between),
                    averaged and not hand_written,
                    hand_written,
                    averaged,
                    self._rebound(update, between, gradient, combined) if hand_written else (),
                    all_reduced,
                    self._update_function(update_call, {combined}) if combined else None,
                )  # fmt: skip
            )
            drops.append((combination if inline is None else None, tower_list))
        first = chains[0]
        gradient, append, appended, combined = (
            first.gradient,
            first.append,
            first.appended,
            first.combined,
        )
        update, update_call, between = first.update, first.update_call, list(first.between)
        plan = Plan(
            source=self.source,
            scope=scope,
            loop=loop,
            index=index,
            enumerated=enumerated,
            averaged=core.combination.kind is ir.CombineKind.AVERAGED,
            gradient=gradient,
            append=append,
            appended=appended,
            combined=combined,
            update=update,
            update_call=update_call,
            between=between,
            inputs=[],
            chains=chains,
            runner=runner,
            receiver=receiver,
            runner_source=self.foreign.source if self.foreign is not None else None,
        )
        self.plan_ = plan
        plan.decide(loop, Decision(Action.TRAIN_STEP))
        if one_loss is not None:
            self._decide_colocated(*one_loss)
        for chain, (dropped, tower_list) in zip(chains, drops, strict=True):
            if dropped is not None:
                plan.decide(dropped, Decision(Action.DROP, "the strategy combines the replicas"))
            for call in _calls(chain.update if dropped is None else dropped):
                if isinstance(call.func, cst.Name) and self.source.top_level(call.func.value):
                    plan.combination_helpers.add(call.func.value)
            plan.decide(chain.update, Decision(Action.UPDATE))
            for statement in chain.between:
                plan.decide(statement, Decision(Action.UPDATE))
            self._tower_list_init(tower_list)
        for combined_list in self.plan_inits:
            self._tower_list_init(combined_list)
        # the step run in a function nested in the tower function (`def train_one_epoch():`
        # beside the graph it closes over): its statements are decided with the function's
        updates = set().union(*(_targets_names(c.update) or _update_op_name(c) for c in chains))
        self.body = with_closures(self.body, updates)
        self._phases()
        return plan

    def _layer_wise_before(self, loop: cst.For) -> None:
        """A value the towers read, made before their loop by a function that loops over the
        devices itself (layer-wise towers: each layer takes every GPU's tensor): its layers
        would run outside the replicas, untaped."""
        project = self.source.shared.get("project")
        if not isinstance(project, Project):
            return
        holder = Code(self.source, self.scope)
        read = free_names(loop)
        for statement in self.body:
            if statement is loop:
                return
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            made = bound_names(statement) & read
            if not made:
                continue
            for call in _calls(statement):
                target = callee(project, holder, call)
                if target is None or not isinstance(target.node, cst.FunctionDef):
                    continue
                if any(
                    target.source.enclosing_def(t.replicator) is target.node
                    for t in reading(target.source).towers
                ):
                    raise NotPlanned(
                        f"the towers read `{sorted(made)[0]}`, made before their loop by "
                        f"`{self.source.src(call.func, 40)}`, which loops over the devices "
                        "itself (layer-wise towers): its layers would run outside the "
                        "replicas and get no gradients"
                    )

    # -- one loss over the towers ---------------------------------------------------------------
    def _after_loop(self) -> list[cst.SimpleStatementLine]:
        """The simple statements after the tower loop, not inside it."""
        start = self.body.index(self.loop)
        return [
            s
            for s in self.body[start + 1 :]
            if isinstance(s, cst.SimpleStatementLine) and self.loop not in self.source.ancestors(s)
        ]

    def _colocated(self, loop: cst.For) -> tuple[Chain, Colocated]:
        """The chain of a loss combined over the towers after the loop and differentiated once:
        the gradient call at the combination's line, the statement combining the towers'
        losses into what it differentiates, and the update."""
        line = self.core.combination.where.line
        found = [
            (call, s)
            for s in self._after_loop()
            for call in _calls(s)
            if self.line(call) == line
            and (
                method_name(call) in ("minimize", "compute_gradients")
                or self.call_q(call) == "tensorflow.gradients"
            )
        ]
        if not found:
            raise NotPlanned("the one gradient call of the towers' loss is not after the loop")
        call, statement = found[0]
        minimize = method_name(call) == "minimize"
        pairs = method_name(call) == "compute_gradients"
        loss = get_arg(call, 0, "ys" if self.call_q(call) == "tensorflow.gradients" else "loss")
        variables = (
            get_arg(call, 2, "var_list")
            if minimize
            else get_arg(call, 1, "var_list" if pairs else "xs")
        )
        if minimize and get_arg(call, 7, "grad_loss") is not None:
            raise NotPlanned("minimize is given grad_loss")
        if not isinstance(loss, cst.Name):
            raise NotPlanned("the loss differentiated after the loop is not a name")
        combine, losses, averaged = self._combined_loss(loss.value, statement)
        value = _value(combine)
        assert value is not None
        colocated = Colocated(losses, combine, loss.value, value, averaged, minimize)
        gradient = Gradient(call, statement, cst.Name("replica_loss"), variables, pairs)
        if minimize:
            update, update_call = self._holder(statement), self._minimize_update(call)
            combined, between = "", []
        else:
            combined = _target_name(statement) or ""
            if not combined:
                raise NotPlanned("the gradients of the towers' loss are not assigned to a name")
            update, update_call = self._update_of(statement, combined)
            between = self._between(statement, update)
        chain = Chain(
            gradient, combine, value, combined, update, update_call, tuple(between), averaged
        )
        return chain, colocated

    def _minimize_update(self, call: cst.Call) -> cst.Call:
        """``opt.minimize(loss, global_step, ...)`` as the update it makes:
        ``opt.apply_gradients(grads, global_step=...)`` (the emitter gives the gradients)."""
        assert isinstance(call.func, cst.Attribute)
        args = [cst.Arg(cst.Name("grads"))]
        step = get_arg(call, 1, "global_step")
        for keyword, value in (("global_step", step), ("name", get_arg(call, 6, "name"))):
            if value is not None:
                args.append(cst.Arg(value, keyword=cst.Name(keyword), equal=_no_spaces()))
        positional = [a for a in call.args if a.keyword is None]
        others = [a for a in call.args if a.keyword is not None]
        if len(positional) > 3 or any(
            a.keyword.value not in _COLOCATED_KEYWORDS | {"loss", "global_step", "var_list"}
            for a in others
            if a.keyword is not None
        ):
            raise NotPlanned("minimize is given arguments apply_gradients has no place for")
        return cst.Call(call.func.with_changes(attr=cst.Name("apply_gradients")), args)

    def _combined_loss(
        self, name: str, gradient: cst.SimpleStatementLine
    ) -> tuple[cst.SimpleStatementLine, str, bool]:
        """The statement after the loop (before ``gradient``) binding ``name`` from the
        towers' loss list: the statement, the list and whether it averages over the list."""
        binding = None
        for statement in self._after_loop():
            if statement is gradient:
                break
            if _target_name(statement) == name:
                binding = statement
        value = _value(binding) if binding is not None else None
        if binding is None or value is None:
            raise NotPlanned(
                f"no statement after the loop combines the towers' losses into `{name}`"
            )
        read = self._over_list(value)
        if read is None:
            raise NotPlanned(
                f"`{self.source.src(value, 50)}` is not a mean or sum over a list of the towers' "
                "losses (scaled by a constant)"
            )
        losses, averaged = read
        filled = self._tower_containers()
        initialized = any(
            _target_name(s) == losses and isinstance(_value(s), cst.List) and not _value(s).elements  # type: ignore[union-attr]  # _value is a List here
            for s in self.body[: self.body.index(self.loop)]
        )
        if losses not in filled or not initialized:
            raise NotPlanned(f"`{losses}` is not a list the towers append their losses to")
        return binding, losses, averaged

    def _over_list(self, value: cst.BaseExpression) -> tuple[str, bool] | None:
        """``tf.reduce_mean(L)``, ``tf.reduce_sum(L)``, ``tf.add_n(L)``, ``sum(L)``, over
        ``L`` or ``tf.stack(L)``, divided or multiplied by a constant or divided by
        ``len(L)``: (L, whether it averages over L)."""
        if isinstance(value, cst.BinaryOperation) and isinstance(
            value.operator, cst.Divide | cst.Multiply
        ):
            divides = isinstance(value.operator, cst.Divide)
            for inner, factor in [(value.left, value.right)] + (
                [] if divides else [(value.right, value.left)]
            ):
                read = self._over_list(inner)
                if read is None:
                    continue
                losses, averaged = read
                if divides and _is_len_of(factor, losses) and not averaged:
                    return losses, True
                if losses not in free_names(factor):
                    return read
            return None
        if not isinstance(value, cst.Call) or len(value.args) != 1 or value.args[0].keyword:
            return None
        called = self.call_q(value)
        builtin_sum = (
            isinstance(value.func, cst.Name)
            and value.func.value == "sum"
            and self.source.top_level("sum") is None
        )
        if called not in _MEANS | _SUMS and not builtin_sum:
            return None
        listed = value.args[0].value
        if (
            isinstance(listed, cst.Call)
            and self.call_q(listed) == "tensorflow.stack"
            and len(listed.args) == 1
        ):
            listed = listed.args[0].value
        if not isinstance(listed, cst.Name):
            return None
        return listed.value, called in _MEANS

    def _decide_colocated(self, chain: Chain, colocated: Colocated) -> None:
        """The combination and the gradient call move into the replica function; the
        manifest says what the combination became."""
        plan = self.plan_
        plan.colocated = colocated
        plan.decide(colocated.combine, Decision(Action.UPDATE))
        plan.decide(chain.gradient.statement, Decision(Action.UPDATE))
        spelled = self.source.src(colocated.value, 60)
        share = (
            "its own towers' mean divided by the replica count"
            if colocated.averaged
            else "its own towers' part of the sum"
        )
        update = (
            "minimize became a GradientTape and apply_gradients; " if colocated.minimize else ""
        )
        plan.notes.append(
            f"the towers' losses were combined into `{colocated.loss}` (`{spelled}`) and "
            f"differentiated once with colocate_gradients_with_ops: {update}each replica "
            f"differentiates {share}, MirroredStrategy sums the replicas' gradients, and the "
            f"train step's `{colocated.loss}` is the sum of the replicas' losses (the legacy value)"
        )

    def outside_runner(self) -> tuple[cst.FunctionDef, str] | None:
        """A function outside the class whose tower-building method it calls, that makes the
        object and runs its update: (the function, its name for the object)."""
        towers = self.core.towers
        if towers is None or towers.where.file != self.source.rel:
            return None
        try:
            loop = self._loop(towers.where.line)
            method = self.source.enclosing_def(loop)
            if method is None or self.source.enclosing_class(loop) is None:
                return None
            runner, receiver = self._runner(method)
        except NotPlanned:
            return None
        return (runner, receiver) if receiver != RECEIVER else None

    def _runner(self, method: cst.FunctionDef) -> tuple[cst.FunctionDef, str]:
        """The method of ``method``'s class that runs the update it builds (a ``Session.run``
        fetching an attribute the building method assigns), or else a module-level function
        that makes the object and runs it: the function and its name for the object."""
        params = method.params.params
        if not params or params[0].name.value != RECEIVER:
            raise NotPlanned(f"the towers are built in a method whose object is not `{RECEIVER}`")
        cls = self.source.enclosing_class(method)
        assert cls is not None
        assigned = {key for key in bound_names(method) if key.startswith(f"{RECEIVER}.")}
        other_runs: list[tuple[str, str]] = []  # (method, attribute fetched)
        for statement in _body(cls):
            if not isinstance(statement, cst.FunctionDef) or statement is method:
                continue
            for fetches in _run_fetches(statement):
                if free_names(fetches) & assigned:
                    return statement, RECEIVER
                parts = fetches.elements if isinstance(fetches, cst.List | cst.Tuple) else [fetches]
                for part in parts:
                    key = attribute_key(part.value if isinstance(part, cst.Element) else part)
                    if key is not None:
                        other_runs.append((statement.name.value, key))
        if other_runs:
            runner, key = other_runs[0]
            raise NotPlanned(
                f"the towers are built in a method; `{runner}` runs `{key}`, which that method "
                "does not assign (the update reaches it through another attribute)"
            )
        if method.name.value == "__init__":
            outside = self._outside_runner(cls, assigned)
            if outside is not None:
                return outside
            elsewhere = self._foreign_runner(method, cls, assigned)
            if elsewhere is not None:
                return elsewhere
        raise NotPlanned(
            "the towers are built in a method and no other method of its class runs the update "
            "(the object is run from outside the class, and no function of the project makes "
            "the object and runs it)"
        )

    def _foreign_runner(
        self, method: cst.FunctionDef, cls: cst.ClassDef, assigned: set[str]
    ) -> tuple[cst.FunctionDef, str] | None:
        """A function of another module that makes the object and runs its update
        (``class_runner``): the planner reads the two modules as one source from then on."""
        if not self.foreign_searched:
            self.foreign_searched = True
            line = self.core.update.where.line
            updates = {
                key
                for statement in statements_in(_body(method))
                if isinstance(statement, cst.SimpleStatementLine)
                and any(self.line(call) == line for call in _calls(statement))
                for key in bound_names(statement)
                if key.startswith(f"{RECEIVER}.")
            }
            self.foreign = foreign_runner(self.source, cls, assigned, updates)
        if self.foreign is None:
            return None
        if not isinstance(self.source, JoinedSource):
            self.source = JoinedSource.of(self.source, self.foreign.source)
        return self.foreign.function, self.foreign.receiver

    def _outside_runner(
        self, cls: cst.ClassDef, assigned: set[str]
    ) -> tuple[cst.FunctionDef, str] | None:
        """A module-level function binding ``name = Cls(...)`` whose ``Session.run`` fetches
        ``name.x`` for an ``self.x`` that ``__init__`` assigns."""
        for function in self.source.module.body:
            if not isinstance(function, cst.FunctionDef):
                continue
            objects = {
                target.value
                for statement in statements_in(_body(function))
                if isinstance(value := _value(statement), cst.Call)
                and isinstance(value.func, cst.Name)
                and value.func.value == cls.name.value
                and isinstance(target := _target_name_node(statement), cst.Name)
            }
            for fetches in _run_fetches(function):
                for node in tree.walk(fetches, _DEFS):
                    if (
                        isinstance(node, cst.Attribute)
                        and isinstance(node.value, cst.Name)
                        and node.value.value in objects
                        and f"{RECEIVER}.{node.attr.value}" in assigned
                    ):
                        return function, node.value.value
        return None

    def _averaged(self, update: Statement) -> bool:
        """Whether the core whose update this is averaged its towers' gradients."""
        line = self.line(update if not isinstance(update, cst.With) else _body(update)[0])
        for core in self.program.cores:
            if core.update.where.line == line and core.update.where.file == self.source.rel:
                return core.combination.kind is ir.CombineKind.AVERAGED
        return self.core.combination.kind is ir.CombineKind.AVERAGED

    def _loop(self, line: int) -> cst.For:
        for node in tree.walk(self.source.module):
            if isinstance(node, cst.For) and self.line(node) == line:
                return node
        raise NotPlanned("the tower loop is not a `for` statement")

    def _index(self, loop: cst.For) -> tuple[str, tuple[str, cst.BaseExpression] | None]:
        target = loop.target
        if isinstance(target, cst.Name):
            return target.value, None
        call = loop.iter
        if (
            isinstance(target, cst.Tuple)
            and len(target.elements) == 2
            and all(isinstance(e.value, cst.Name) for e in target.elements)
            and isinstance(call, cst.Call)
            and isinstance(call.func, cst.Name)
            and call.func.value == "enumerate"
            and len(call.args) == 1
        ):
            first, second = (e.value for e in target.elements)
            assert isinstance(first, cst.Name) and isinstance(second, cst.Name)
            return first.value, (second.value, call.args[0].value)
        raise NotPlanned("the tower loop's target is not an index or `i, x in enumerate(...)`")

    def _gradients(self, loop: cst.For) -> list[Gradient]:
        found: list[tuple[cst.Call, cst.BaseStatement]] = []
        for statement in statements_in(_body(loop)):
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for call in _calls(statement):
                name = self.call_q(call)
                if name == "tensorflow.gradients" or (
                    name is None and method_name(call) == "compute_gradients"
                ):
                    found.append((call, statement))
        if not found:
            return [self._helper_gradient(loop)]
        blocks = {id(self.source.parent(statement)) for _, statement in found}
        if len(blocks) > 1:
            raise NotPlanned("the tower loop's gradient calls are in different blocks")
        gradients = []
        for call, statement in found:
            pairs = self.call_q(call) != "tensorflow.gradients"
            loss = get_arg(call, 0, "loss" if pairs else "ys")
            if loss is None:
                raise NotPlanned("the gradient call names no loss")
            variables = get_arg(call, 1, "var_list" if pairs else "xs")
            gradients.append(Gradient(call, statement, loss, variables, pairs))
        return gradients

    def _helper_gradient(self, loop: cst.For) -> Gradient:
        """The gradients of a tower taken in a function that the tower calls and that returns
        them: a function of this file, a method of the loop's class, or a function of an
        imported repo module (which may hand the call on to another function of its module
        and return what it returns): the helper's one gradient call, with the name the tower
        binds its result to."""
        found: list[Gradient] = []
        for statement in statements_in(_body(loop)):
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            value = _value(statement)
            if not isinstance(value, cst.Call):
                continue
            called = self._called_function(value, loop)
            if called is None:
                continue
            gradient = self._gradient_in(*called, statement)
            if gradient is not None:
                found.append(gradient)
        if len(found) != 1:
            raise NotPlanned(
                "no gradient call in the tower loop"
                + (" (several functions it calls take gradients)" if found else "")
            )
        return found[0]

    def _called_function(
        self, call: cst.Call, loop: cst.For
    ) -> tuple[SourceFile, cst.FunctionDef] | None:
        """``helper(...)`` of this file, ``self.helper(...)`` of the loop's class or
        ``module.helper(...)`` of a repo module, called from nowhere else in this file (its
        new tape is the towers')."""
        func = call.func
        source = self.source
        if isinstance(func, cst.Name):
            name = func.value
            found = self.source.top_level(name)
        elif attribute_key(func) is not None:
            assert isinstance(func, cst.Attribute)
            name = func.attr.value
            cls = self.source.enclosing_class(loop)
            found = method_of(cls, name) if cls is not None else None
        elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
            name = func.attr.value
            found = None
            project = self.source.shared.get("project")
            target = self.source.imports.get(func.value.value)
            if isinstance(project, Project) and target is not None and target.attr is None:
                defined = project.definition(self.source, f"{func.value.value}.{name}")
                if defined is not None and defined[0] is not self.source:
                    source, found = defined
        else:
            return None
        if not isinstance(found, cst.FunctionDef):
            return None
        own = {id(found.name), id(func)} | {id(n) for n in tree.walk(func)}
        elsewhere = [
            n
            for n in tree.walk(self.source.module)
            if isinstance(n, cst.Name) and n.value == name and id(n) not in own
        ]
        return None if elsewhere else (source, found)

    def _gradient_in(
        self,
        source: SourceFile,
        function: cst.FunctionDef,
        statement: cst.SimpleStatementLine,
        depth: int = 0,
    ) -> Gradient | None:
        """The helper's one gradient call whose result it returns (or a value made from it,
        ``list(zip(grads, params))``), read as the tower's. A function of another module
        without one that returns what a function of its module returns: that function's."""
        calls = [
            (call, inner)
            for inner in statements_in(_body(function))
            if isinstance(inner, cst.SimpleStatementLine)
            for call in _calls(inner)
            if qualify(source, call.func) == "tensorflow.gradients"
            or (qualify(source, call.func) is None and method_name(call) == "compute_gradients")
        ]
        if not calls and depth < 2:
            handed = _handed_on(source, function)
            if handed is None:
                return None
            return self._gradient_in(source, handed, statement, depth + 1)
        if len(calls) != 1:
            return None
        call, inner = calls[0]
        grads = _target_name(inner)
        returned = _returned(function)
        if returned is None:
            # `return list(zip(grads, params))`: one value, made from the gradients or not
            returned = _returned_value(function)
        if grads is None or returned is None:
            return None
        made = {grads}
        for later in statements_in(_body(function)):
            if source.line(later) > source.line(inner) and free_names(later) & made:
                made |= bound_names(later)
        if returned == [_RETURNED]:
            value = _returned_expression(function)
            returned = [_RETURNED if value is not None and free_names(value) & made else ""]
            made.add(_RETURNED)
        positions = [i for i, name in enumerate(returned) if name in made]
        if len(positions) != 1:
            return None
        position = positions[0]
        targets = _targets(statement)
        if len(targets) != 1:
            return None
        target = targets[0]
        if len(returned) == 1:
            bound = _key(target)
        elif isinstance(target, cst.Tuple | cst.List) and len(target.elements) == len(returned):
            bound = _key(target.elements[position].value)
        else:
            bound = None
        if bound is None:
            return None
        top: cst.BaseStatement = inner
        for ancestor in source.ancestors(inner):
            if ancestor is function:
                break
            if isinstance(ancestor, cst.BaseStatement):
                top = ancestor
        pairs = qualify(source, call.func) != "tensorflow.gradients"
        loss = get_arg(call, 0, "loss" if pairs else "ys")
        if loss is None or (top is not inner and free_names(loss) & bound_names(top)):
            # the tape covers the statements before `top`: the loss must be made there
            return None
        variables = get_arg(call, 1, "var_list" if pairs else "xs")
        helper = GradientHelper(
            function,
            call,
            top,
            bound,
            source if source is not self.source else None,
            _handed(function, inner, loss, source),
        )
        # the tower's statement is the gradient statement; the helper's locals stay its own
        return Gradient(call, statement, loss, variables, pairs, helper)

    def _append(
        self, loop: cst.For, gradient: Gradient
    ) -> tuple[cst.SimpleStatementLine, cst.BaseExpression, str]:
        """``tower_grads.append(grads)``: the statement, what it appends, the list's name."""
        grads = (
            gradient.helper.grads
            if gradient.helper is not None
            else _target_name(gradient.statement)
        )
        for statement in statements_in(_body(loop)):
            value = _value(statement)
            if (
                isinstance(statement, cst.SimpleStatementLine)
                and isinstance(value, cst.Call)
                and isinstance(value.func, cst.Attribute)
                and value.func.attr.value == "append"
                and isinstance(value.func.value, cst.Name)
                and len(value.args) == 1
            ):
                appended = value.args[0].value
                if appended is gradient.call or (
                    isinstance(appended, cst.Name) and appended.value == grads
                ):
                    return statement, appended, value.func.value.value
            extended = _list_extension(statement)
            if extended is not None:
                # `tower_grads += [grads]`
                listed, appended = extended
                if appended is gradient.call or (
                    isinstance(appended, cst.Name) and appended.value == grads
                ):
                    assert isinstance(statement, cst.SimpleStatementLine)
                    return statement, appended, listed
        raise NotPlanned("the towers' gradients are not appended to a list in the loop")

    def _update_of(self, combination: Statement, combined: str) -> tuple[Statement, cst.Call]:
        """The first ``opt.apply_gradients(...)`` after the combination that reads its result
        (or a value made from it)."""
        derived = {combined}
        after = False
        for statement in self.body:
            if statement is combination:
                after = True
                continue
            if not after or not isinstance(statement, cst.SimpleStatementLine):
                continue
            value = _value(statement)
            reads = free_names(value) if value is not None else set()
            if isinstance(value, cst.Call) and self._update_function(value, derived) is not None:
                # `train_op, lr, gnorm = model_utils.get_train_op(FLAGS, grads_and_vars)`
                return self._holder(statement), value
            if not (
                isinstance(value, cst.Call)
                and method_name(value) == "apply_gradients"
                and value.args
                and free_names(value.args[0].value) & derived
            ) and not (
                isinstance(value, cst.Call)
                and self._hand_written(value)
                and _gradients_argument(value, derived) is not None
            ):
                if reads & derived:
                    derived |= bound_names(statement)
                continue
            return self._holder(statement), value
        raise NotPlanned(f"no apply_gradients after the loop reads `{combined}`")

    def _update_function(self, call: cst.Call, derived: set[str]) -> int | None:
        """A repo function the combined gradients are passed to that applies them (the core's
        update is in its body, ``optimizer.apply_gradients(...)``): the position of the
        gradients among the call's arguments. The call moves into the replica function."""
        update = self.core.update
        project = self.source.shared.get("project")
        name = dotted(call.func)
        if not isinstance(project, Project) or name is None or update.kind is not (
            ir.UpdateKind.APPLY_GRADIENTS
        ):
            return None
        defined = project.definition(self.source, name)
        if defined is None or not isinstance(defined[1], cst.FunctionDef):
            return None
        holder, function = defined
        if holder.rel != update.where.file or not any(
            method_name(c) == "apply_gradients" and holder.line(c) == update.where.line
            for c in _calls(function)
        ):
            return None
        positions = [
            i
            for i, arg in enumerate(call.args)
            if free_names(arg.value) & derived
        ]
        return positions[0] if len(positions) == 1 else None

    def _hand_written(self, call: cst.Call) -> bool:
        """Whether ``call`` is the core's hand-written update (the IR found it on its line)."""
        update = self.core.update
        return (
            update.kind is ir.UpdateKind.HAND_WRITTEN
            and update.where.file == self.source.rel
            and update.where.line == self.line(call)
            and method_name(call) != "apply_gradients"
        )

    def _rebound(
        self, update: Statement, between: list[Statement], gradient: Gradient, combined: str
    ) -> tuple[cst.SimpleStatementLine, ...]:
        """The tower statements binding what the hand-written update reads besides the
        gradients (the variables: ``params = tf.trainable_variables()``); each must read nothing
        the towers compute, so that the train step can bind it again after the replicas."""
        in_loop = bound_names(self.loop) - {self.index}
        reads = free_names(update).union(*(free_names(s) for s in between))
        reads -= set().union({combined}, *(bound_names(s) for s in between))
        found: list[cst.SimpleStatementLine] = []
        for name in sorted(reads & in_loop):
            binding = [
                s
                for s in statements_in(_body(self.loop))
                if isinstance(s, cst.SimpleStatementLine) and name in bound_names(s)
            ]
            value = _value(binding[0]) if len(binding) == 1 else None
            if (
                value is None
                or _target_name(binding[0]) != name
                or free_names(value) & in_loop
                or binding[0] is gradient.statement
            ):
                raise NotPlanned(
                    f"the hand-written update reads `{name}`, a value each tower computes"
                )
            found.append(binding[0])
        return tuple(found)

    def _inline_update(self, statement: Statement, tower_list: str) -> cst.Call | None:
        """The combination written inside the update call, if it is."""
        value = _value(statement)
        if (
            isinstance(value, cst.Call)
            and method_name(value) == "apply_gradients"
            and value.args
            and tower_list in free_names(value.args[0].value)
        ):
            return value
        return None

    def _holder(self, statement: Statement) -> Statement:
        """The update statement, or the ``with tf.control_dependencies(...)`` block that holds
        only it."""
        parent = self.source.parent(statement)
        block = self.source.parent(parent) if parent is not None else None
        if (
            isinstance(block, cst.With)
            and len(_body(block)) == 1
            and all(
                self.call_q(item.item) == "tensorflow.control_dependencies" for item in block.items
            )
        ):
            return block
        return statement

    def _combination(self, tower_list: str, update: Statement | None) -> tuple[Statement, str]:
        after = False
        for statement in self.body:
            if statement is self.loop:
                after = True
                continue
            if statement is update:
                break
            if after and isinstance(statement, cst.SimpleStatementLine):
                if tower_list not in free_names(statement):
                    continue
                if (name := _target_name(statement)) is not None:
                    return statement, name
                if self._inline_update(statement, tower_list) is not None:
                    return statement, ""
            if (
                after
                and isinstance(statement, cst.For)
                and tower_list in free_names(statement.iter)
            ):
                # `for pairs in zip(*tower_grads): ... averaged.append((g, v))`
                filled = {
                    call.func.value.value
                    for inner in statements_in(_body(statement))
                    for call in _calls(inner)
                    if isinstance(call.func, cst.Attribute)
                    and call.func.attr.value == "append"
                    and isinstance(call.func.value, cst.Name)
                }
                outside = filled - bound_names(statement)
                if len(outside) == 1:
                    combined = outside.pop()
                    self.plan_inits.append(combined)
                    return statement, combined
        raise NotPlanned(f"no statement after the loop combines `{tower_list}`")

    def _between(self, combination: Statement, update: Statement) -> list[Statement]:
        """Statements of the update's block, after the combination, whose values the update
        reads (clipping the combined gradients): they move with the update."""
        block = self.source.parent(update)
        siblings = list(getattr(block, "body", ()))
        if combination not in siblings or update not in siblings:
            return []
        between = siblings[siblings.index(combination) + 1 : siblings.index(update)]
        # what is made from the combined gradients (not the optimizer built between them)
        derived = bound_names(combination)
        for statement in between:
            if free_names(statement) & derived:
                derived |= bound_names(statement)
        needed = free_names(self.update_call_of(update))
        found: list[Statement] = []
        for statement in reversed(between):
            if (
                isinstance(statement, cst.SimpleStatementLine)
                and bound_names(statement) & needed
                and free_names(statement) & derived
            ):
                found.insert(0, statement)
                needed |= free_names(statement)
        # what makes state once (`global_step = tf.train.get_or_create_global_step()`) and
        # reads no gradients stays where it is, made before the first step
        reads = reading_gradients(found, _target_name(combination) or "")
        return [
            statement
            for statement, changes in zip(found, reads, strict=True)
            if changes or not _builds_state(self.call_q(_value(statement)) or "")
        ]

    def update_call_of(self, update: Statement) -> cst.CSTNode:
        if isinstance(update, cst.With):
            return _body(update)[0]
        return update

    def _tower_list_init(self, tower_list: str) -> None:
        for statement in self.body:
            value = _value(statement)
            if (
                _target_name(statement) == tower_list
                and isinstance(value, cst.List)
                and not value.elements
            ):
                self.plan_.decide(statement, Decision(Action.DROP, "the replicas keep their own"))

    # -- phases ------------------------------------------------------------------------------------
    def _phases(self) -> None:
        """Decide every statement of the tower function, in order."""
        plan = self.plan_
        self.step_names: set[str] = set()  # names bound in the train step, before the replicas
        self.gone: dict[str, Todo] = {}  # names whose definition went under a TODO
        self.sessions: set[str] = set()
        self.initializers: set[str] = set()
        self.iterators: dict[str, cst.BaseExpression] = {}  # iterator -> dataset
        self.hook_lists: dict[str, cst.List | cst.Tuple] = {}  # hooks list -> its value
        # initializable iterator -> the statement that made it: TF1 could read it only after
        # running its initializer, which becomes the `iter(dataset)`, so the first goes
        self.initializable: dict[str, cst.BaseStatement] = {}
        self.batches: dict[str, str] = {}  # get_next result name -> iterator
        self.fetch_lists: dict[str, cst.BaseStatement] = {}
        self.updates: set[str] = set().union(
            *(_targets_names(c.update) or _update_op_name(c) for c in plan.chains)
        )
        self.schedules: set[str] = set()
        self.feeds: dict[str, cst.Dict] = {}
        loop_bound = bound_names(self.loop) - {plan.index}
        self.tower_names = loop_bound
        self.containers = self._tower_containers()
        self._accumulators()
        self.after_loop = False
        self.loop_blocks = {id(a) for a in self.source.ancestors(self.loop)}
        combined_todo = reads_todo(
            {plan.combined}, "the combined gradients: each replica has its own now"
        )
        self.combined_names = {c.combined for c in plan.chains}
        self.combined_todo = combined_todo
        self.input_lines = {
            i.where.line
            for i in self.program.inputs
            if i.where.file == self.source.rel
            and i.kind
            in (ir.InputKind.QUEUE, ir.InputKind.PREFETCH_QUEUE, ir.InputKind.PY_FUNC_SPLIT)
        }
        plan.input_lines = self.input_lines
        self.savers: set[str] = set()
        self._outer_wrapper(self.scope)
        plan.before_loop = self._bound_before_loop_beside()
        self.fetch_extensions: dict[str, list[cst.SimpleStatementLine]] = {}
        self.regrouped: set[str] = set()  # the update grouped with what went under a TODO
        self.supervisors: set[str] = set()  # tf.train.Supervisor objects
        step_runs = self._step_runs()
        if not step_runs:
            raise NotPlanned("no Session.run of the update in the tower function")
        self.step_runs = step_runs
        self._per_gpu_inputs()
        self._summaries()
        for statement in self.body:
            if statement is self.loop:
                self.after_loop = True
                for name in self.combined_names:
                    self.gone.setdefault(name, self.combined_todo)
                if plan.colocated is not None:
                    # the train step reduces the replicas' losses to the combined one
                    self.step_names.add(plan.colocated.loss)
                for chain in plan.chains:
                    if chain.all_reduced:
                        continue  # every replica computes them on the sum: returned like a tower's
                    for moved in chain.between:
                        for name in bound_names(moved) - self.combined_names:
                            self.gone.setdefault(
                                name, reads_todo({name}, "which each replica computes now")
                            )
                continue
            if self._inside_decided(statement):
                continue
            self._decide(statement)
        if not any(d.action is Action.STEP_RUN for d in plan.decisions.values()):
            raise NotPlanned("the training step's Session.run could not be converted")
        for chain in plan.chains:
            # the optimizer, the global step, the variables differentiated -- not the gradients
            call = chain.update_call
            taken = _gradients_argument(call, {chain.combined}) if chain.hand_written else 0
            if chain.update_function is not None:
                taken = chain.update_function
            needed = free_names(call.func).union(
                *(free_names(a.value) for k, a in enumerate(call.args) if k != taken)
            )
            needed -= set().union(*(bound_names(s) for s in chain.rebound))
            # made beside the update, in the replica, from what it reads
            needed -= set().union(set(), *(bound_names(s) for s in chain.between))
            if chain.gradient.variables is not None and chain.gradient.helper is None:
                needed |= free_names(chain.gradient.variables)
            lost = sorted(needed & set(self.gone))
            if lost:
                raise NotPlanned(
                    f"the update reads `{lost[0]}`, which has no TF2 form here "
                    f"({self.gone[lost[0]].why})"
                )
        self._fold_commented()

    def _fold_commented(self) -> None:
        """A kept for/while/if/with whose every statement went under a TODO goes under the
        first one's TODO as a whole."""
        plan = self.plan_
        for statement in reversed(self.body):
            decision = plan.decision(statement)
            if decision is None or decision.action is not Action.KEEP:
                continue
            if not isinstance(statement, cst.For | cst.While | cst.If | cst.With):
                continue
            if isinstance(statement, cst.If) and statement.orelse is not None:
                continue
            if isinstance(statement, cst.For | cst.While) and statement.orelse is not None:
                continue
            children = list(_body(statement))
            todos = [plan.decision(child) for child in children]
            if children and all(
                d is not None
                and d.action is Action.TODO
                and d.todo is not None
                and d.todo.commented
                for d in todos
            ):
                first = todos[0]
                assert first is not None
                plan.decide(statement, Decision(Action.TODO, todo=first.todo))
                for child in children:
                    plan.decisions.pop(id(child), None)

    def _inside_decided(self, statement: cst.CSTNode) -> bool:
        """Statements inside the loop, the update block or a statement already decided as a
        whole (moved or commented out) are not decided again."""
        for ancestor in self.source.ancestors(statement):
            if ancestor is self.scope:
                return False
            decision = self.plan_.decision(ancestor)
            if ancestor is self.loop or (
                decision is not None
                and decision.action not in (Action.KEEP, Action.UNWRAP, Action.SCOPE, Action.STOP_LOOP)
            ):
                return True
        return False

    def _outer_wrapper(self, scope: cst.CSTNode) -> None:
        """`with tf.Graph().as_default(), tf.device('/cpu:0'):` around the loop: the outermost
        becomes `strategy.scope()`, inner ones go."""
        outer: cst.With | None = None
        for ancestor in self.source.ancestors(self.loop):
            if ancestor is scope:
                break
            if isinstance(ancestor, cst.With) and self._is_wrapper(ancestor):
                if outer is not None:
                    self.plan_.decide(outer, Decision(Action.UNWRAP))
                outer = ancestor
        if outer is not None and self._variables_before(outer):
            # a variable made before the wrapper (a global step) must be made in the strategy's
            # scope too: the strategy goes at the start of the function instead
            self.plan_.decide(outer, Decision(Action.UNWRAP))
        elif outer is not None:
            self.plan_.decide(outer, Decision(Action.SCOPE))
            self.plan_.wrapper = outer

    def _variables_before(self, statement: cst.BaseStatement) -> bool:
        """Whether a statement before ``statement`` in its block makes a variable."""
        siblings = list(getattr(self.source.parent(statement), "body", ()))
        if statement not in siblings:
            return False
        return any(
            self.call_q(call) in _VARIABLE_MAKERS
            for before in siblings[: siblings.index(statement)]
            for call in _calls(before)
        )

    def _is_wrapper(self, statement: cst.With) -> bool:
        for item in statement.items:
            node = item.item
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
                if node.func.attr.value == "as_default":
                    continue
            name = self.call_q(node)
            if name not in _WRAPPERS:
                return False
            if name == "tensorflow.variable_scope":
                assert isinstance(node, cst.Call)
                first = node.args[0].value if node.args else None
                if not (
                    isinstance(first, cst.Call)
                    and self.call_q(first) == "tensorflow.get_variable_scope"
                ):
                    return False
        return True

    def _tower_containers(self) -> set[str]:
        """Lists and dicts made before the loop that the towers fill: the train step makes them."""
        filled: set[str] = set()
        for statement in statements_in(_body(self.loop)):
            for call in _calls(statement):
                if (
                    isinstance(call.func, cst.Attribute)
                    and call.func.attr.value in ("append", "extend", "update")
                    and isinstance(call.func.value, cst.Name)
                ):
                    filled.add(call.func.value.value)
            small = _simple(statement)
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    node = target.target
                    if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name):
                        filled.add(node.value.value)
            extended = _list_extension(statement)
            if extended is not None:
                filled.add(extended[0])
        return filled

    def _accumulators(self) -> None:
        """``total += loss`` in the towers, ``total`` made before the loop from a constant: the
        replicas return their values and the train step sums them (the constant moves in)."""
        plan = self.plan_
        outside = {
            name: statement
            for statement in self.body
            if statement is not self.loop
            and self.loop not in self.source.ancestors(statement)
            and isinstance(statement, cst.SimpleStatementLine)
            for name in bound_names(statement)
        }
        for statement in statements_in(_body(self.loop)):
            small = _simple(statement)
            if _list_extension(statement) is not None:
                continue  # `losses += [loss]`: a list the towers fill
            if not (
                isinstance(small, cst.AugAssign)
                and isinstance(small.operator, cst.AddAssign)
                and isinstance(small.target, cst.Name)
                and small.target.value in outside
            ):
                continue
            init = _value(outside[small.target.value])
            assert isinstance(statement, cst.SimpleStatementLine)
            plan.sums.append((small.target.value, small.value))
            plan.accumulating.append(statement)
            if isinstance(init, cst.Integer | cst.Float):
                self.containers.add(small.target.value)  # the constant moves into the step
            else:
                # a variable (or tensor) made once: the step adds the replicas' sum to it
                plan.totals[small.target.value] = f"{small.target.value}_total"

    def _step_runs(self) -> list[cst.Call]:
        """``Session.run`` calls of this function whose fetches name the update (or a
        ``tf.group`` of it)."""
        for statement in self.body:
            value = _value(statement)
            name = _target_name(statement)
            if self.call_q(value) == "tensorflow.group" and name is not None:
                assert isinstance(value, cst.Call)
                if self._groups_update(value):
                    self.updates.add(name)
        runs = []
        for statement in self.body:
            if isinstance(statement, cst.SimpleStatementLine):
                for call in _calls(statement):
                    if method_name(call) == "run" and self._runs_update(call):
                        runs.append(call)
        self.fetched: set[str] = set()
        self.fed: set[str] = set()
        literals = {
            _target_name(s): _value(s) for s in self.body if isinstance(_value(s), cst.Dict)
        }
        placeholders = {
            name
            for s in self.body
            if (name := _target_name(s)) is not None and self.call_q(_value(s)) in _PLACEHOLDERS
        }
        self.fed_state: set[str] = set()
        optimizers = {
            call.func.value.value
            for chain in self.plan_.chains
            if isinstance((call := chain.update_call).func, cst.Attribute)
            and isinstance(call.func.value, cst.Name)
        }
        for statement in self.body:
            if statement is self.loop:
                break
            value = _value(statement)
            called = self.call_q(value)
            # an optimizer built by the program's own factory (`set_optimizer(name, lr)`) too
            factory = isinstance(value, cst.Call) and _target_name(statement) in optimizers
            if value is not None and (
                factory
                or (called is not None and (called.endswith("Optimizer") or called in _SCHEDULES))
            ):
                self.fed_state |= free_names(value) & placeholders
        self.built_feeds = self._built_feeds(runs)
        literals.update(self.built_feeds)
        for run in runs:
            self.fetched |= free_names(self._fetch_list(get_arg(run, 0, "fetches")) or run)
            feed = get_arg(run, 1, "feed_dict")
            if isinstance(feed, cst.Name):
                feed = literals.get(feed.value)
            if isinstance(feed, cst.Dict):
                self.fed |= {
                    key
                    for e in feed.elements
                    if isinstance(e, cst.DictElement) and (key := _key(e.key))
                }
        return runs

    def _per_gpu_inputs(self) -> None:
        """Placeholder lists the towers fill once per GPU and the step run feeds (at constant
        indices, or in a loop over the GPUs): train step parameters holding every tower's
        value. ``per_gpu_built`` holds the feeds built in loops, by the feed's name."""
        plan = self.plan_
        self.per_gpu_built: dict[str, per_gpu.BuiltFeed] = {}
        self.per_gpu_appends: dict[int, str] = {}  # `feed[L[i]] = v` -> L's parameter
        self.per_gpu_direct: set[int] = set()  # `feed[x] = v` beside those loops
        self.per_gpu_lists: dict[int, per_gpu.BuiltFeed] = {}  # `feed = {...}` -> its build
        self.per_gpu_inits: dict[int, cst.SimpleStatementLine | None] = {}
        found = per_gpu.tower_lists(self.source, list(statements_in(_body(self.loop))), self.q)
        if not found.params:
            return
        fed: set[str] = set()
        for run in self.step_runs:
            feed = get_arg(run, 1, "feed_dict")
            name = feed.value if isinstance(feed, cst.Name) else None
            where = self.source.enclosing_def(run)
            literals = {
                _target_name(s): _value(s)
                for s in self.body
                if isinstance(_value(s), cst.Dict) and self.source.enclosing_def(s) is where
            }
            if name is not None and isinstance(literals.get(name), cst.Dict):
                feed = literals[name]
            if isinstance(feed, cst.Dict):
                split = per_gpu.literal_lists(feed, found.params)
                if split is not None and split[1]:
                    fed |= set(split[1])
                    continue
            if name is None:
                continue
            statement = statement_of(self.source, run)
            block = list(getattr(self.source.parent(statement), "body", ()))
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            built = per_gpu.built_feed(block, statement, name, found.params)
            if built is not None:
                self.per_gpu_built[name] = built
                fed |= set(built.lists)
        if not fed:
            return
        tower = list(statements_in(_body(self.loop)))
        taken = bound_names(self.source.module) | bound_names(self.scope) | free_names(self.loop)
        for listed, param in found.params.items():
            if listed not in fed or not per_gpu.read_as_own(tower, listed, plan.index, found):
                continue
            if "." in listed and param in taken:
                param = self._fresh(param)
            plan.per_gpu[listed] = param
            plan.inputs.append(param)
            plan.per_gpu_dtypes[param] = found.dtypes.get(listed, ())
            plan.per_gpu_sparse |= {param} if listed in found.sparse else set()
            plan.per_gpu_dynamic |= listed in found.dynamic
            local = per_gpu.singular(param)
            while local in taken or local in plan.per_gpu_locals.values():
                local += "_"
            plan.per_gpu_locals[param] = local
        if not plan.per_gpu:
            return
        plan.per_replica = self._fresh("per_replica")
        plan.per_gpu_makers = found.makers
        for built in self.per_gpu_built.values():
            self.per_gpu_lists[id(built.made)] = built
            self.per_gpu_direct |= {id(s) for s in built.direct}
            for appended, listed in built.appends.items():
                self.per_gpu_appends[appended] = plan.per_gpu[listed]
        self.step_names |= {p for w, p in plan.per_gpu.items() if "." not in w}

    def _per_gpu_statement(self, statement: cst.SimpleStatementLine) -> Decision | None:
        """What becomes of the statements about per-GPU placeholder lists: their (empty) lists
        made before the towers go (the step takes them), a feed built for them in loops over
        the GPUs makes a list per placeholder list and appends each tower's value to it."""
        plan = self.plan_
        if not plan.per_gpu:
            return None
        built = self.per_gpu_lists.get(id(statement))
        if built is not None:
            self.feeds[built.name] = cst.Dict(built.elements)
            return Decision(
                Action.FEED_LISTS,
                "each placeholder list's values, tower by tower",
                fed_lists=tuple(plan.per_gpu[listed] for listed in built.lists),
            )
        if id(statement) in self.per_gpu_appends:
            return Decision(Action.FEED_APPEND, fed_lists=(self.per_gpu_appends[id(statement)],))
        if id(statement) in self.per_gpu_direct:
            return Decision(Action.DROP, "the feed becomes the train step's arguments")
        lists = {w for w in plan.per_gpu if "." not in w}
        targets = _target_tuple(statement)
        value = _value(statement)
        if self.after_loop or not targets or not set(targets) & lists or value is None:
            return None
        values = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
        if len(values) != len(targets) or not all(
            isinstance(v, cst.List) and not v.elements for v in values
        ):
            return None
        kept = [(t, v) for t, v in zip(targets, values, strict=True) if t not in lists]
        if not kept:
            return Decision(Action.DROP, "a train step parameter now: every tower's values")
        # `points_phs, labels_phs, tower_grads = [], [], []`: the step makes the others
        assign = cst.Assign(
            targets=[
                cst.AssignTarget(
                    cst.Tuple([cst.Element(cst.Name(t)) for t, _ in kept])
                    if len(kept) > 1
                    else cst.Name(kept[0][0])
                )
            ],
            value=(
                cst.Tuple([cst.Element(v) for _, v in kept], lpar=[], rpar=[])
                if len(kept) > 1
                else kept[0][1]
            ),
        )
        rewritten = statement.with_changes(body=[assign])
        plan.step_before.append(rewritten)
        self.step_names |= {t for t, _ in kept}
        return Decision(Action.DROP, "the train step makes the towers' lists")

    def _built_feeds(self, runs: list[cst.Call]) -> dict[str, cst.Dict]:
        """Feed dicts built key by key (``feed = {}`` then ``feed[x] = value`` beside it, before
        the step run): the dict they make, by name. ``self.feed_keys`` holds the statements
        that set the keys: they go with the feed."""
        self.feed_keys: set[int] = set()
        built: dict[str, cst.Dict] = {}
        for run in runs:
            feed = get_arg(run, 1, "feed_dict")
            if not isinstance(feed, cst.Name):
                continue
            statement = statement_of(self.source, run)
            block = list(getattr(self.source.parent(statement), "body", ()))
            if statement not in block:
                continue
            keys: list[cst.SimpleStatementLine] = []
            for sibling in reversed(block[: block.index(statement)]):
                key = _keyed(sibling, feed.value)
                if key is not None:
                    keys.insert(0, sibling)
                    continue
                value = _value(sibling)
                if (
                    _target_name(sibling) == feed.value
                    and isinstance(value, cst.Dict)
                    and not value.elements
                    and keys
                ):
                    elements = []
                    for keyed in keys:
                        assign = keyed.body[0]
                        assert isinstance(assign, cst.Assign)
                        target = assign.targets[0].target
                        assert isinstance(target, cst.Subscript)
                        index = target.slice[0].slice
                        assert isinstance(index, cst.Index)
                        elements.append(cst.DictElement(index.value, assign.value))
                    built[feed.value] = value.with_changes(elements=elements)
                    self.feed_keys |= {id(k) for k in keys}
                break
        return built

    def _runs_update(self, call: cst.Call) -> bool:
        fetches = self._fetch_list(get_arg(call, 0, "fetches"))
        return fetches is not None and bool(free_names(fetches) & self.updates)

    def _fetch_list(self, fetches: cst.BaseExpression | None) -> cst.BaseExpression | None:
        """The fetches, or the list literal a name bound once in this function holds
        (``fetches = [loss, train_op]`` then ``sess.run(fetches)``)."""
        if not isinstance(fetches, cst.Name):
            return fetches
        bindings = [
            s
            for s in self.body
            if isinstance(s, cst.SimpleStatementLine) and fetches.value in bound_names(s)
        ]
        # `fetches += [summary_op]` on some steps: fetched beside the listed values
        extensions = [s for s in bindings[1:] if _list_extension(s) is not None]
        if extensions and len(extensions) == len(bindings) - 1:
            self.fetch_extensions[fetches.value] = extensions
            bindings = bindings[:1]
        value = _value(bindings[0]) if len(bindings) == 1 else None
        if (
            isinstance(value, cst.List | cst.Tuple)
            and _target_name(bindings[0]) == fetches.value
            and self.source.enclosing_def(bindings[0]) is self.source.enclosing_def(fetches)
        ):
            self.fetch_lists[fetches.value] = bindings[0]
            return value
        return fetches

    # -- one statement -----------------------------------------------------------------------------
    def _decide(self, statement: cst.BaseStatement) -> None:
        plan = self.plan_
        if plan.decision(statement) is not None:
            return
        if isinstance(statement, cst.FunctionDef | cst.ClassDef):
            plan.decide(statement, Decision(Action.KEEP))
            return
        if id(statement) in self.histogram_defs:
            plan.decide(statement, Decision(Action.DROP, "written where add_summary wrote it"))
            return
        line = simple_line(statement, self._with, self._compound)
        if line is None:
            return
        decision = self._simple_statement(line)
        plan.decide(statement, decision)
        if decision.todo is not None and decision.todo.commented:
            for name in bound_names(statement) - self.regrouped:
                self.gone.setdefault(name, decision.todo)
        elif decision.action is Action.KEEP:
            # A later binding that stays (`else: start = 1` after a restore under a TODO) gives
            # the name a value again: what reads it stays, and the path through the TODO is
            # named in the notes.
            for name in sorted(bound_names(statement) & set(self.gone)):
                todo = self.gone.pop(name)
                if todo.kind is not Leftover.TOWER_VALUE:
                    plan.notes.append(
                        f"`{name}` is bound again at line {self.line(statement)} after its "
                        f"binding went under a TODO ({todo.why}): the path through that TODO "
                        "leaves it unbound until the TODO is done"
                    )
        if decision.action is Action.STEP:
            plan.step_before.append(line)
            self.step_names |= bound_names(statement)
        elif decision.action is Action.POST:
            plan.step_after.append(line)
            self.step_names |= bound_names(statement)

    def _with(self, statement: cst.With) -> None:
        plan = self.plan_
        if all(self.call_q(item.item) in _SESSIONS for item in statement.items):
            self.sessions |= with_names(statement)
            plan.decide(statement, Decision(Action.UNWRAP, "the session goes"))
            return
        if self._managed_session(statement):
            self.sessions |= with_names(statement)
            plan.decide(statement, Decision(Action.UNWRAP, "the session goes"))
            return
        if len(statement.items) == 1 and self.call_q(statement.items[0].item) in _MONITORED:
            self.sessions |= with_names(statement)
            self._monitored(statement.items[0].item)
            plan.decide(statement, Decision(Action.UNWRAP, MONITORED_GOES))
            return
        if self._is_wrapper(statement) and plan.decision(statement) is None:
            plan.decide(statement, Decision(Action.UNWRAP))
            return
        if all(
            isinstance(item.item, cst.Call)
            and self.call_q(item.item) == "tensorflow.control_dependencies"
            and set().union(*(free_names(a.value) for a in item.item.args))
            <= self.initializers | self.updates | bound_names(self.loop) | self._update_ops_names()
            for item in statement.items
        ):
            plan.decide(
                statement, Decision(Action.UNWRAP, "batch-norm updates run with the layers")
            )
            return
        self._compound(statement)

    def _supervisor_todo(self, call: cst.BaseExpression | None) -> Todo:
        """What a ``tf.train.Supervisor`` did besides giving the session: restoring and saving
        checkpoints in its logdir, running its summary op."""
        assert isinstance(call, cst.Call)
        done = [
            f"{arg.keyword.value}={self.source.src(arg.value, 30)}"
            for arg in call.args
            if arg.keyword is not None and arg.keyword.value in _SUPERVISOR_WORK
        ]
        return Todo(
            Leftover.SESSION,
            "a tf.train.Supervisor initialized or restored the variables and saved checkpoints "
            f"and summaries ({', '.join(done) or 'its defaults'}): TF2 has no supervisor; make "
            "the variables' tf.train.CheckpointManager and write tf.summary in the loop",
        )

    def _managed_session(self, statement: cst.With) -> bool:
        """``with sv.managed_session(...) as sess:`` of a Supervisor: the session goes."""
        if len(statement.items) != 1:
            return False
        call = statement.items[0].item
        return (
            isinstance(call, cst.Call)
            and method_name(call) in ("managed_session", "prepare_or_wait_for_session")
            and isinstance(call.func, cst.Attribute)
            and _key(call.func.value) in self.supervisors
        )

    def _monitored(self, call: cst.BaseExpression) -> None:
        """A monitored session: its variables are initialized when made, its StopAtStepHook
        bounds the loop; what else it did (checkpoints, summaries, other hooks) is the TODO of
        its loop."""
        assert isinstance(call, cst.Call)
        left = []
        hooks = get_arg(call, None, "hooks")
        if isinstance(hooks, cst.Name) and hooks.value in self.hook_lists:
            hooks = self.hook_lists[hooks.value]
        if isinstance(hooks, cst.List | cst.Tuple):
            left += self._hooks(hooks)
        elif hooks is not None:
            left.append(f"hooks={self.source.src(hooks, 30)}")
        for arg in call.args:
            keyword = arg.keyword.value if arg.keyword is not None else None
            if keyword not in _MONITORED_QUIET:
                left.append(f"{keyword or 'master'}={self.source.src(arg.value, 30)}")
        if left:
            self.plan_.session_todo = Todo(
                Leftover.SESSION,
                f"the monitored session's {', '.join(left)}: no TF2 form here, do it in the "
                "loop (tf.train.CheckpointManager, tf.summary)",
                commented=False,
            )

    def _hooks(self, hooks: cst.List | cst.Tuple) -> list[str]:
        """The hooks the loop cannot do (StopAtStepHook(last_step=...) bounds it)."""
        unknown = []
        for element in hooks.elements:
            hook = element.value
            last = (
                get_arg(hook, 1, "last_step")
                if isinstance(hook, cst.Call)
                and self.call_q(hook) == "tensorflow.train.StopAtStepHook"
                else None
            )
            if last is not None and self.plan_.global_step is not None:
                self.plan_.last_step = last
            else:
                unknown.append(self.source.src(hook, 40))
        return unknown

    def _should_stop(self, statement: cst.BaseStatement) -> bool:
        test = statement.test if isinstance(statement, cst.While) else None
        return (
            isinstance(test, cst.UnaryOperation)
            and isinstance(test.operator, cst.Not)
            and method_receiver(test.expression, "should_stop", self.sessions) is not None
        )

    def _compound(self, statement: cst.BaseStatement) -> None:
        """A for/while/if/try/with: its header is read like a statement; its body is decided
        statement by statement (in ``_phases``' walk)."""
        plan = self.plan_
        if self._should_stop(statement):
            plan.decide(statement, Decision(Action.STOP_LOOP))
            assert isinstance(statement, cst.While)
            test = statement.test
            assert isinstance(test, cst.UnaryOperation)
            if method_receiver(test.expression, "should_stop", self.supervisors) is not None:
                plan.stopped_by = "the Supervisor (its should_stop())"
            return
        if self._combining_branch(statement):
            assert isinstance(statement, cst.If)
            plan.decide(statement, Decision(Action.UNWRAP, "the towers' combination"))
            if statement.orelse is not None:
                plan.decide(
                    statement.orelse,
                    Decision(Action.DROP, "one tower: the combination over one replica"),
                )
            return
        header = _header(statement)
        reads = set().union(*(free_names(node) for node in header)) if header else set()
        gone = gone_reads(reads, self.sessions, self.gone)
        inside = reads & (self.containers | self.step_names | self._tower_only())
        if gone is None and self.after_loop and inside:
            gone = reads_todo(inside, "which the train step computes now")
        if gone is None and isinstance(statement, cst.For | cst.While | cst.If):
            gone = self._tf1_header(header)
        if gone is not None:
            plan.decide(statement, Decision(Action.TODO, todo=gone))
            for name in bound_names(statement):
                self.gone.setdefault(name, gone)
            return
        if self._splits_batch(statement):
            # `if n > 1: ... examples[d][key] = tf.split(example[key], n)[d]`, `else: examples
            # = [example]`: the towers' shares of the batch, made in the step from its input
            assert isinstance(statement, cst.If | cst.For)
            plan.decide(statement, Decision(Action.STEP, "the towers' shares of the batch"))
            plan.step_before.append(statement)
            self.step_names |= bound_names(statement)
            return
        plan.decide(statement, Decision(Action.KEEP))

    def _combining_branch(self, statement: cst.BaseStatement) -> bool:
        """``if len(tower_losses) > 1:`` (or ``num_gpus > 1``) after the loop around the
        combination, whose ``else`` takes the one tower's values (``grads = tower_grads[0]``):
        the first branch is the combination over any number of replicas, one included."""
        if not (self.after_loop and isinstance(statement, cst.If)):
            return False
        body = _body(statement)
        if not any(
            (d := self.plan_.decision(s)) is not None
            and d.action is Action.DROP
            and d.why == "the strategy combines the replicas"
            for s in body
        ):
            return False
        test = statement.test
        if not (
            isinstance(test, cst.Comparison)
            and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.GreaterThan)
            and isinstance(test.comparisons[0].comparator, cst.Integer)
            and test.comparisons[0].comparator.value == "1"
        ):
            return False
        orelse = statement.orelse
        if orelse is None:
            return True
        if not isinstance(orelse, cst.Else):
            return False
        made = set().union(*(bound_names(s) for s in body))
        return all(
            isinstance(s, cst.SimpleStatementLine)
            and bound_names(s) <= made
            and isinstance(_value(s), cst.Subscript)
            for s in _else_body(orelse)
        )

    def _splits_batch(self, statement: cst.BaseStatement) -> bool:
        """A for/if beside the tower loop, before it, that makes what the towers read from the
        batch the step takes (and nothing the session or a TF1-only call needs)."""
        if self.after_loop or not isinstance(statement, cst.If | cst.For):
            return False
        if id(self.source.parent(statement)) not in self.loop_blocks:
            return False
        batches = set(self.batches)
        inner = list(statements_in(_body(statement)))
        if isinstance(statement, cst.If) and isinstance(statement.orelse, cst.Else):
            inner += statements_in(_else_body(statement.orelse))
        reads = set().union(*(free_names(s) for s in inner)) if inner else set()
        made = bound_names(statement)
        return bool(
            reads & batches
            and made & free_names(self.loop)
            and not any(
                self._tf1_only(s) is not None
                for s in inner
                if isinstance(s, cst.SimpleStatementLine)
            )
        )

    def _simple_statement(self, statement: cst.SimpleStatementLine) -> Decision:
        value = _value(statement)
        name = _target_name(statement)
        called = self.call_q(value)
        if name is not None and (called in _GLOBAL_STEPS or name == "global_step"):
            self.plan_.global_step = name
        if (
            name is not None
            and isinstance(value, cst.List | cst.Tuple)
            and value.elements
            and all(
                isinstance(e.value, cst.Call) and (self.call_q(e.value) or "").endswith("Hook")
                for e in value.elements
            )
        ):
            # session hooks: what they did is read where the monitored session takes them
            self.hook_lists[name] = value
            return Decision(Action.DROP, "session hooks: the loop does what they did")
        reads = (
            free_names(statement) - bound_names(statement)
            if _simple(statement)
            else free_names(statement)
        )
        if isinstance(_simple(statement), cst.Assign):
            reads = free_names(_value(statement) or statement) | _subscript_reads(statement)
        summary = self._summary_statement(statement)
        if summary is not None:
            return summary
        fed = self._per_gpu_statement(statement)
        if fed is not None:
            return fed
        # inputs
        made = self._placeholders_made_by(value)
        if made is not None:
            names = _target_tuple(statement)
            if (
                names is not None
                and len(names) == made
                and set(names) <= self.fed
                and not self.after_loop
            ):
                self.plan_.inputs.extend(names)
                self.step_names |= set(names)
                assert isinstance(value, cst.Call) and isinstance(value.func, cst.Name)
                self.plan_.placeholder_helpers.add(value.func.value)
                return Decision(Action.DROP, "train step parameters (placeholders of a helper)")
        if called in _PLACEHOLDERS and name is not None and name in self.fed_state:
            # read by the optimizer or a schedule made once: a variable the step assigns
            param = f"{name}_value"
            self.plan_.inputs.append(param)
            self.plan_.fed_variables[name] = param
            return Decision(Action.FED_VARIABLE)
        if called in _PLACEHOLDERS and name is not None:
            if name in self.fed and not self.after_loop:
                self.plan_.inputs.append(name)
                self.step_names.add(name)
                return Decision(Action.DROP, "a train step parameter")
            return Decision(
                Action.TODO,
                todo=Todo(
                    Leftover.SESSION,
                    "a placeholder the training step does not feed (other Session.runs fed "
                    "it): pass the value to the code that uses it",
                ),
            )
        if isinstance(value, cst.Call) and method_name(value) == "get_next":
            batch = self._batch(statement, value, name)
            if batch is not None:
                return batch
        helped = self._helper_batch(statement, value)
        if helped is not None:
            return helped
        if isinstance(value, cst.Call) and name is not None:
            dataset = self._iterator_dataset(value)
            if dataset is not None:
                self.iterators[name] = dataset
                if method_name(value) == "make_initializable_iterator" or (
                    called == "tensorflow.data.make_initializable_iterator"
                ):
                    self.initializable[name] = statement
                return Decision(Action.ITERATOR, dataset=dataset)
        # session and initializers
        if called == "tensorflow.data.Iterator.from_string_handle" and name is not None:
            self.plan_.step_iterators.add(name)
        if called in _SESSIONS and name is not None:
            self.sessions.add(name)
            return Decision(Action.DROP, "TF2 runs eagerly: no session")
        if called == _SUPERVISOR and name is not None:
            self.sessions.add(name)
            self.supervisors.add(name)
            return Decision(Action.TODO, todo=self._supervisor_todo(value))
        if called in _INITIALIZERS or (
            called == "tensorflow.group" and self._all_initializers(value)
        ):
            return self._dropped(self.initializers, name, "variables are initialized when made")
        if called in _QUEUE_PLUMBING:
            return self._dropped(self.sessions, name, "no queue runners in TF2")
        if self._is_reuse(value):
            return Decision(Action.DROP, "variables are made once")
        if called == "tensorflow.get_collection" and self._update_ops(value):
            # control_dependencies([]) reads it: dropped too
            self._note_update_ops(statement)
            return self._dropped(
                self.initializers, name, "batch-norm updates run where the layers run"
            )
        if called in _SCHEDULES and name is not None:
            self.schedules.add(name)
        averages = self._moving_averages(statement, called, name, value)
        if averages is not None:
            return averages
        session_call = receiver_call(statement, self.sessions, ("run",))
        if session_call is not None:
            return self._session_statement(statement, session_call)
        if self._session_method(statement):
            return Decision(Action.DROP, "the session goes")
        if called == "tensorflow.group" and self._groups_update(value):
            lost = gone_reads(reads - self.updates, self.sessions, self.gone)
            if lost is not None and name is not None:
                # `train_op = tf.group(train_op, ema.apply(...))` with the EMA under a TODO: the
                # train step runs the update; what was grouped with it is the TODO's
                self.updates.add(name)
                self.regrouped.add(name)
                return Decision(
                    Action.TODO,
                    todo=Todo(
                        lost.kind,
                        f"grouped with the update: {lost.why}; the train step runs the update "
                        "without it (run it in the train step)",
                    ),
                )
            return self._dropped(self.updates, name, "the update runs in the train step")
        if self.line(statement) in self.input_lines:
            return Decision(
                Action.TODO,
                todo=Todo(
                    Leftover.INPUT,
                    "a TF1 queue input: feed the train step from a tf.data "
                    "pipeline that gives replica i what tower i dequeued",
                    commented=False,
                ),
            )
        saver = saver_action(statement, called, name, self.savers)
        if isinstance(saver, Todo):
            return Decision(Action.TODO, todo=saver)
        if saver is not None:
            return Decision(Action[saver])
        # values for the train step
        if isinstance(value, cst.Dict) and name is not None and self._is_feed(name, statement):
            self.feeds[name] = self.built_feeds.get(name, value)
            return Decision(Action.DROP, "the feed becomes the train step's arguments")
        if id(statement) in self.feed_keys:
            return Decision(Action.DROP, "the feed becomes the train step's arguments")
        fed_names = sorted(reads & set(getattr(self, "per_gpu_built", {})))
        if fed_names and id(statement) not in getattr(self, "per_gpu_appends", {}):
            return Decision(
                Action.TODO,
                todo=Todo(
                    Leftover.SESSION,
                    f"reads `{fed_names[0]}`, the training step's feed: the train step takes "
                    "its values as arguments now",
                ),
            )
        todo = self._tf1_only(statement) or gone_reads(reads, self.sessions, self.gone)
        if todo is not None:
            return Decision(Action.TODO, todo=todo)
        if not self.after_loop:
            beside = id(self.source.parent(statement)) in self.loop_blocks
            if not beside and reads & self.step_names:
                return self._reads(
                    reads & self.step_names, "which only the train step has (an input of each step)"
                )
            if name in self.fetched and called is not None and not _builds_state(called) and beside:
                return Decision(Action.STEP, "an op the step ran")
            if reads & self.step_names or (
                name in self.containers
                and isinstance(value, cst.List | cst.Dict | cst.Integer | cst.Float)
            ):
                return Decision(Action.STEP)
            if self._makes_containers(statement):
                return Decision(Action.STEP)
            return Decision(Action.KEEP)
        if reads & (self.containers | self.step_names) and not reads & self._tower_only():
            if name is not None and name in self.fetched and not self.sessions:
                return Decision(Action.POST)
            return self._reads(
                reads & (self.containers | self.step_names), "which the train step computes now"
            )
        tower = reads & self._tower_only()
        if tower:
            return self._reads(tower, "a value of the tower loop: it now lives in a replica")
        return Decision(Action.KEEP)

    # -- TF1 summaries -> tf.summary under a file writer -----------------------------------------
    def _summaries(self) -> None:
        """Find the TF1 summaries the training loop writes: scalar summaries made around the
        towers (``tf.summary.scalar(tag, value)``), merged (``merge_all``/``merge``), fetched
        with the update (or run alone at the write, on the step's feed) and written by a
        ``FileWriter``'s ``add_summary``. Each write becomes ``tf.summary.scalar(tag, value,
        step=step)`` under the writer, of the values the train step returns (it returns those
        it did not already)."""
        self.writers: set[str] = set()  # FileWriters made in this function
        self.scalar_defs: dict[int, tuple[cst.BaseExpression, str]] = {}  # id -> (tag, value)
        self.merges: dict[str, list[int]] = {}  # merged summary op -> its scalars' ids
        self.merge_statements: dict[int, str] = {}
        self.summary_results: dict[str, str] = {}  # fetched summary -> its op
        self.summary_runs: set[int] = set()  # `s = sess.run(op)` beside the write: they go
        self.summary_positions: dict[int, str] = {}  # the step run's fetches of a summary op
        self.summary_writes: dict[int, tuple[str, str, cst.BaseExpression]] = {}
        self.summary_extras: list[str] = []  # values the train step returns for a write
        self.summary_returns: dict[str, str] = {}  # such a value -> its name at the call
        self.summary_fetched: dict[str, str] = {}  # value fetched by the step -> its name
        self.summary_ok: set[int] = set()  # scalars whose value the write can read
        self.tower_extras: list[str] = []  # tower values written for every tower
        self.summary_towers: dict[str, str] = {}  # such a value -> its towers' name at the call
        self.writers_ok: set[str] = set()
        self.tower_tags: dict[int, cst.BaseExpression] = {}  # a tower's scalar -> its index
        # `for v in tf.trainable_variables(): [l.append(]tf.summary.histogram(tag, v)[)]`:
        # id -> (the tag, reading the variable's legacy name, the loop's name for the variable)
        self.histogram_defs: dict[int, tuple[cst.BaseExpression, str, str]] = {}
        if len(self.step_runs) != 1:
            return
        run = self.step_runs[0]
        run_statement = statement_of(self.source, run)
        session_loop = next(
            (a for a in self.source.ancestors(run_statement) if isinstance(a, cst.For | cst.While)),
            None,
        )
        assert session_loop is None or isinstance(session_loop, cst.For | cst.While)
        if session_loop is None:
            return
        in_tower = {id(s) for s in statements_in(_body(self.loop))}
        lists: dict[str, list[int]] = {}
        bound: dict[str, int] = {}
        for statement in self.body:
            if isinstance(statement, cst.For) and id(statement) not in in_tower:
                histogram = self._variable_histograms(statement)
                if histogram is not None:
                    self.histogram_defs[id(statement)] = histogram[:3]
                    if histogram[3] is not None:
                        lists.setdefault(histogram[3], []).append(id(statement))
                continue
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            if id(statement) in in_tower:
                tagged = self._tower_scalar(statement)
                if tagged is not None:
                    self.scalar_defs[id(statement)] = tagged
                continue
            small = _simple(statement)
            value = _value(statement)
            name = _target_name(statement)
            called = self.call_q(value)
            if called == "tensorflow.summary.FileWriter" and name is not None:
                self.writers.add(name)
            elif called == "tensorflow.summary.merge_all" and name is not None:
                self.merges[name] = [*self.scalar_defs, *self.histogram_defs]
                self.merge_statements[id(statement)] = name
            elif called == "tensorflow.summary.merge" and name is not None:
                assert isinstance(value, cst.Call)
                merged = get_arg(value, 0, "inputs")
                if isinstance(merged, cst.Name) and merged.value in lists:
                    members = lists[merged.value]
                elif isinstance(merged, cst.List | cst.Tuple) and all(
                    isinstance(e.value, cst.Name) for e in merged.elements
                ):
                    members = [
                        bound[e.value.value]  # type: ignore[attr-defined]  # checked: names
                        for e in merged.elements
                        if e.value.value in bound  # type: ignore[attr-defined]  # checked: names
                    ]
                else:
                    continue
                self.merges[name] = members
                self.merge_statements[id(statement)] = name
            scalar = self._scalar_call(statement, small)
            if scalar is None:
                continue
            call, listed = scalar
            tag = get_arg(call, 0, "name")
            tensor = get_arg(call, 1, "tensor")
            if tag is None or not isinstance(tensor, cst.Name) or self._name_scoped(statement):
                continue
            self.scalar_defs[id(statement)] = (tag, tensor.value)
            if listed is not None:
                lists.setdefault(listed, []).append(id(statement))
            if name is not None:
                bound[name] = id(statement)
                self.merges[name] = [id(statement)]  # a scalar's op, run on its own
        if self.writers:
            self._summary_writes(run, run_statement, session_loop)
        self._written_summaries()

    def _summary_writes(
        self, run: cst.Call, run_statement: cst.CSTNode, session_loop: cst.For | cst.While
    ) -> None:
        """Where the loop fetches each summary op and which ``add_summary`` writes it."""
        feed = get_arg(run, 1, "feed_dict")
        fetches = get_arg(run, 0, "fetches")
        targets = _targets(run_statement)
        target = targets[0] if len(targets) == 1 else None
        if isinstance(fetches, cst.List | cst.Tuple):
            names = (
                [e.value for e in target.elements]
                if isinstance(target, cst.List | cst.Tuple)
                and len(target.elements) == len(fetches.elements)
                else None
            )
            for position, element in enumerate(fetches.elements):
                key = _key(element.value)
                if names is not None and (held := _key(names[position])) is not None:
                    if key in self.merges:
                        self.summary_results[held] = key
                        self.summary_positions[position] = key
                    elif isinstance(element.value, cst.Name):
                        self.summary_fetched[element.value.value] = held
        elif isinstance(target, cst.Name) and isinstance(fetches, cst.Name):
            self.summary_fetched[fetches.value] = target.value
        inside = {id(s) for s in statements_in(_body(session_loop))}
        code = self.source.module.code_for_node
        same_feed = code(feed) if feed is not None else None

        def summary_run(node: cst.CSTNode | None) -> str | None:
            """The op of ``sess.run(op)`` on the step's feed (or none)."""
            if not isinstance(node, cst.Call) or method_name(node) != "run" or node is run:
                return None
            op = _key(get_arg(node, 0, "fetches") or node)
            fed = get_arg(node, 1, "feed_dict")
            if len(node.args) > 2 or op not in self.merges:
                return None
            if fed is not None and code(fed) != same_feed:
                return None
            return op

        for statement in self.body:
            if id(statement) not in inside or not isinstance(statement, cst.SimpleStatementLine):
                continue
            value = _value(statement)
            name = _target_name(statement)
            op = summary_run(value)
            if op is not None and name is not None and isinstance(_simple(statement), cst.Assign):
                self.summary_results[name] = op
                self.summary_runs.add(id(statement))
                continue
            if not (
                isinstance(value, cst.Call)
                and method_name(value) == "add_summary"
                and isinstance(value.func, cst.Attribute)
                and _key(value.func.value) in self.writers
                and isinstance(_simple(statement), cst.Expr)
                and isinstance(self.source.parent(statement), cst.IndentedBlock)
                and self.line(statement) > self.line(run_statement)
            ):
                continue
            written = get_arg(value, 0, "summary")
            step = get_arg(value, 1, "global_step")
            op = summary_run(written)
            held = _key(written) if written is not None else None
            if op is None and held is not None:
                op = self.summary_results.get(held)
            if op is None or step is None:
                continue
            writer = _key(value.func.value)
            assert writer is not None
            self.summary_writes[id(statement)] = (writer, op, step)
            if op not in self.summary_positions.values():
                self._note_rerun(statement, fed=same_feed is not None)

    def _written_summaries(self) -> None:
        """Keep the summaries a write reads (the others stay as they were, under their TODO)
        and find the values the train step must return for them."""
        # a fetched summary read by anything but its writes (printed, kept) stays as it was
        for held, op in list(self.summary_results.items()):
            for statement in self.body:
                if (
                    isinstance(statement, cst.SimpleStatementLine)
                    and id(statement) not in self.summary_writes
                    and id(statement) not in self.summary_runs
                    and held in free_names(statement) - bound_names(statement)
                    and statement is not statement_of(self.source, self.step_runs[0])
                ):
                    self.summary_writes = {
                        k: w for k, w in self.summary_writes.items() if w[1] != op
                    }
        written_ops = {op for _, op, _ in self.summary_writes.values()}
        written = {i for op in written_ops for i in self.merges[op]}
        self.scalar_defs = {i: d for i, d in self.scalar_defs.items() if i in written}
        self.histogram_defs = {i: d for i, d in self.histogram_defs.items() if i in written}
        if self.histogram_defs:
            self.plan_.notes.append(
                "the histograms of the trainable variables are written after the train step, of "
                "the updated variables, under their legacy names"
            )
        self.tower_extras = [
            value for i, (_, value) in self.scalar_defs.items() if i in self.tower_tags
        ]
        self.plan_.tower_summaries = {i for i in self.scalar_defs if i in self.tower_tags}
        if self.plan_.tower_summaries:
            self.plan_.notes.append(
                "the towers' summaries are written after the train step, of every replica's "
                "value under its tower's legacy tag: TF2 records summaries in replica 0 only"
            )
        self.merge_statements = {
            i: op for i, op in self.merge_statements.items() if op in written_ops
        }
        self.summary_results = {
            s: op for s, op in self.summary_results.items() if op in written_ops
        }
        self.summary_positions = {
            p: op for p, op in self.summary_positions.items() if op in written_ops
        }
        setup = self._bound_before_loop_beside() - bound_names(self.loop)
        for key, (_, value_name) in self.scalar_defs.items():
            if key in self.tower_tags:
                continue
            if value_name in self.summary_fetched or value_name in setup:
                continue
            if value_name not in self.summary_extras:
                self.summary_extras.append(value_name)
                self.fetched.add(value_name)
        if any(op in written_ops for op in self.merges if self._merges_all(op)):
            self._note_unseen_summaries()

    def _note_rerun(self, statement: cst.CSTNode, fed: bool) -> None:
        """A summary op the legacy ran on its own at the write: TF1 ran the towers again."""
        again = "on the step's feed, after the update" if fed else "on the next batch of its input"
        self.plan_.notes.append(
            f"the summary written at line {self.line(statement)} was run on its own, which ran "
            f"the towers again {again}: the write takes the values of the train step instead"
        )

    def _merges_all(self, op: str) -> bool:
        return any(
            self.merge_statements.get(id(s)) == op
            and self.call_q(_value(s)) == "tensorflow.summary.merge_all"
            for s in self.body
        )

    def _note_unseen_summaries(self) -> None:
        """``merge_all`` also took the summaries the towers and the model code made: say that
        only the scalars around the towers are written."""
        seen = set(self.scalar_defs)
        for key in self.histogram_defs:
            loop = next(s for s in self.body if id(s) == key)
            assert isinstance(loop, cst.For)
            seen |= {id(s) for s in statements_in(_body(loop))}
        for node in tree.walk(self.source.module):
            if not isinstance(node, cst.Call):
                continue
            called = self.call_q(node)
            if called is None or not called.startswith("tensorflow.summary."):
                continue
            if called.rsplit(".", 1)[1] in ("FileWriter", "merge_all", "merge"):
                continue
            statement = statement_of(self.source, node)
            if id(statement) not in seen:
                self.plan_.notes.append(
                    "`tf.summary.merge_all()` also collected the summaries made in the towers "
                    "and the model code (e.g. line "
                    f"{self.line(node)}): the converted loop writes the scalar summaries made "
                    "around the towers; write the others with tf.summary where they are computed"
                )
                return

    def _scalar_call(
        self, statement: cst.SimpleStatementLine, small: cst.BaseSmallStatement | None
    ) -> tuple[cst.Call, str | None] | None:
        """``tf.summary.scalar(tag, value)`` as a statement, bound to a name, or appended to a
        list: (the call, the list's name)."""
        value = small.value if isinstance(small, cst.Expr | cst.Assign) else None
        listed = None
        if (
            isinstance(small, cst.Expr)
            and isinstance(value, cst.Call)
            and method_name(value) == "append"
            and isinstance(value.func, cst.Attribute)
            and isinstance(value.func.value, cst.Name)
            and len(value.args) == 1
        ):
            listed = value.func.value.value
            value = value.args[0].value
        if not isinstance(value, cst.Call) or self.call_q(value) != "tensorflow.summary.scalar":
            return None
        if len(value.args) != 2 or any(
            a.keyword is not None and a.keyword.value not in ("name", "tensor") for a in value.args
        ):
            return None  # collections=, family= change where or under which tag it is kept
        return value, listed

    def _tower_scalar(
        self, statement: cst.SimpleStatementLine
    ) -> tuple[cst.BaseExpression, str] | None:
        """A tower's ``tf.summary.scalar(tag, value)`` under the tower's ``tf.name_scope``: its
        TF1 tag (the scope's name, then the tag) and the value's name."""
        scalar = self._scalar_call(statement, _simple(statement))
        if scalar is None or scalar[1] is not None or _target_name(statement) is not None:
            return None
        call = scalar[0]
        tag = get_arg(call, 0, "name")
        tensor = get_arg(call, 1, "tensor")
        index = self.loop.target
        if tag is None or not isinstance(tensor, cst.Name) or not isinstance(index, cst.Name):
            return None
        if tensor.value not in bound_names(self.loop) or tensor.value == index.value:
            return None
        if index.value in bound_names(self.scope) - bound_names(self.loop):
            return None  # the write binds the tower index: it must not hide another name
        prefixes: list[cst.BaseExpression] = []
        for ancestor in self.source.ancestors(statement):
            if ancestor is self.loop:
                break
            if not isinstance(ancestor, cst.With):
                continue
            for item in ancestor.items:
                called = self.call_q(item.item)
                if called == "tensorflow.variable_scope":
                    return None  # a reused variable scope's name scope is uniquified
                if called == "tensorflow.name_scope":
                    assert isinstance(item.item, cst.Call)
                    scope = get_arg(item.item, 0, "name")
                    if scope is None or free_names(scope) - {index.value}:
                        return None
                    prefixes.insert(0, scope)
        if not prefixes or self._name_scoped(self.loop):
            return None
        self.tower_tags[id(statement)] = index
        return _joined_tag([*prefixes, tag]), tensor.value

    def _variable_histograms(
        self, statement: cst.For
    ) -> tuple[cst.BaseExpression, str, str, str | None] | None:
        """``for v in tf.trainable_variables():`` whose one statement is
        ``[l.append(]tf.summary.histogram(tag, v)[)]``: the tag (``v.op.name`` read as the
        variable's legacy name), the loop's names for the variable and that name, and the
        list's name."""
        body = _body(statement)
        each = statement.target
        if (
            self.call_q(statement.iter) != "tensorflow.trainable_variables"
            or statement.orelse is not None
            or len(body) != 1
            or not isinstance(body[0], cst.SimpleStatementLine)
            or not isinstance(each, cst.Name)
            or self._name_scoped(statement)
        ):
            return None
        small = _simple(body[0])
        call = small.value if isinstance(small, cst.Expr) else None
        listed = None
        if isinstance(call, cst.Call) and method_name(call) == "append" and len(call.args) == 1:
            assert isinstance(call.func, cst.Attribute)
            listed = _key(call.func.value)
            call = call.args[0].value
        if not isinstance(call, cst.Call) or self.call_q(call) != "tensorflow.summary.histogram":
            return None
        tag = get_arg(call, 0, "name")
        values = get_arg(call, 1, "values")
        if len(call.args) != 2 or tag is None or not _is_name(values, each.value):
            return None
        legacy = self._fresh(f"{each.value}_name")
        tag = cast_expression(tag.visit(_OpName(each.value, legacy)))
        if free_names(tag) - {legacy}:
            return None  # the tag reads the TF2 variable, whose name is not the legacy one
        return tag, each.value, legacy, listed

    def _name_scoped(self, statement: cst.CSTNode) -> bool:
        """Under a ``tf.name_scope``/``tf.variable_scope`` of its own: TF1 prefixed the tag."""
        for ancestor in self.source.ancestors(statement):
            if ancestor is self.scope:
                return False
            if isinstance(ancestor, cst.With) and not self._is_wrapper(ancestor):
                for item in ancestor.items:
                    called = self.call_q(item.item)
                    if called in ("tensorflow.name_scope", "tensorflow.variable_scope"):
                        return True
        return False

    def _summary_statement(self, statement: cst.SimpleStatementLine) -> Decision | None:
        """The decision for a statement of the summaries the loop writes (None: another)."""
        key = id(statement)
        value = _value(statement)
        if key in self.scalar_defs:
            read = self.scalar_defs[key][1]
            gone = gone_reads({read}, self.sessions, self.gone)
            if gone is not None:
                return Decision(Action.TODO, todo=gone)
            self.summary_ok.add(key)
            return Decision(Action.DROP, "written where the writer's add_summary wrote it")
        if key in self.merge_statements or key in self.summary_runs:
            return Decision(Action.DROP, "the write reads the train step's values")
        name = _target_name(statement)
        if self.call_q(value) == "tensorflow.summary.FileWriter" and name in self.writers:
            assert isinstance(value, cst.Call)
            reads = set().union(
                *(
                    free_names(a.value)
                    for k, a in enumerate(value.args)
                    if k != 1 and (a.keyword is None or a.keyword.value in _WRITER_KEYWORDS)
                )
            )
            gone = gone_reads(reads, self.sessions, self.gone)
            if gone is not None:
                return Decision(Action.TODO, todo=gone)
            self.writers_ok.add(name)
            return Decision(Action.SUMMARY_WRITER)
        if key in self.summary_writes:
            writer, op, step = self.summary_writes[key]
            scalars = []
            for member in self.merges[op]:
                if member in self.histogram_defs:
                    tag, each, legacy = self.histogram_defs[member]
                    loop = (each, legacy, "tf1_variables.by_name.items()")
                    scalars.append(Scalar(tag, cst.Name(each), loop, kind="histogram"))
                    continue
                if member not in self.summary_ok and member not in self.tower_tags:
                    continue
                tag, read = self.scalar_defs[member]
                if member in self.tower_tags:
                    if read in self.summary_towers:
                        index = self.tower_tags[member]
                        assert isinstance(index, cst.Name)
                        each = self._fresh(f"{read}_tower")
                        towers = (index.value, each, self.summary_towers[read])
                        scalars.append(Scalar(tag, cst.Name(each), towers))
                    continue
                if read in self.summary_fetched:
                    scalars.append(Scalar(tag, cst.Name(self.summary_fetched[read])))
                elif read in self.summary_returns:
                    scalars.append(Scalar(tag, cst.Name(self.summary_returns[read])))
                elif read not in self.summary_extras:
                    made = cst.Name(read)
                    scalars.append(Scalar(tag, cst.Call(made) if self._schedule(read) else made))
            if gone_reads(free_names(step), self.sessions, self.gone) is not None:
                return None  # the step written at has no TF2 form here: the write stays
            if writer in self.writers_ok and scalars:
                return Decision(
                    Action.SUMMARY_WRITE, writer=writer, step=step, scalars=tuple(scalars)
                )
            return None
        writer_call = receiver_call(statement, self.writers_ok)
        if writer_call is not None:
            assert isinstance(writer_call.func, cst.Attribute)
            method = writer_call.func.attr.value
            reads = free_names(statement) - {_key(writer_call.func.value)}
            if method not in ("flush", "close", "as_default", "set_as_default") and not (
                gone_reads(reads, self.sessions, self.gone)  # its own TODO says why
            ):
                return Decision(
                    Action.TODO,
                    todo=Todo(
                        Leftover.SUMMARY,
                        f"`{method}` of a TF1 FileWriter: a tf.summary writer writes with "
                        "tf.summary calls under `writer.as_default()`",
                    ),
                )
        return None

    def _schedule(self, name: str) -> bool:
        """``name`` is a TF1 learning-rate schedule made once: in TF2 a callable."""
        for statement in self.body:
            if _target_name(statement) == name and self.call_q(_value(statement)) in _SCHEDULES:
                self._note_schedule(name)
                return True
        return False

    def _note_schedule(self, name: str) -> None:
        note = (
            f"the summary of the schedule `{name}` reads it after the train step (`{name}()`), "
            "once the global step moved: TF1 read it in the step, before the update"
        )
        if note not in self.plan_.notes:
            self.plan_.notes.append(note)

    def _makes_containers(self, statement: cst.SimpleStatementLine) -> bool:
        """``grads, losses = [], []`` where the towers fill one of them: the step makes all."""
        names = _target_tuple(statement)
        value = _value(statement)
        return (
            names is not None
            and len(names) > 1
            and bool(set(names) & self.containers)
            and isinstance(value, cst.Tuple)
            and len(value.elements) == len(names)
            and all(
                isinstance(e.value, cst.List | cst.Dict | cst.Integer | cst.Float)
                for e in value.elements
            )
        )

    def _reads(self, names: set[str], why: str) -> Decision:
        return Decision(Action.TODO, todo=reads_todo(names, why))

    def _run_loop_names(self, run_statement: cst.CSTNode) -> set[str]:
        """Names the loops around the step run bind (``step``): the train step cannot read
        them."""
        found: set[str] = set()
        for ancestor in self.source.ancestors(run_statement):
            if ancestor is self.scope:
                break
            if isinstance(ancestor, cst.For):
                found |= free_names(ancestor.target)
        return found

    def _note_update_ops(self, statement: cst.CSTNode) -> None:
        """UPDATE_OPS go: an announced difference, never a silent one."""
        note = (
            f"line {self.line(statement)}: the legacy ran the batch-norm updates its UPDATE_OPS "
            "collection held (`" + self.source.src(statement, 70) + "`); TF2 layers update "
            "their statistics where they run, in every replica, so the moving statistics can "
            "differ from the legacy run's"
        )
        if note not in self.plan_.notes:
            self.plan_.notes.append(note)

    def _dropped(self, names: set[str], name: str | None, why: str) -> Decision:
        """A dropped statement; its name (when it binds one) joins ``names``."""
        if name is not None:
            names.add(name)
        return Decision(Action.DROP, why)

    def _batch(
        self, statement: cst.SimpleStatementLine, value: cst.Call, name: str | None
    ) -> Decision | None:
        """``x = it.get_next()`` (also ``a, b = ds.make_one_shot_iterator().get_next()``): the
        batch is the train step's argument, ``next(it)`` at the call."""
        receiver = value.func.value if isinstance(value.func, cst.Attribute) else None
        iterator = receiver.value if isinstance(receiver, cst.Name) else None
        chained = None
        if iterator not in self.iterators and isinstance(receiver, cst.Call):
            chained = self._iterator_dataset(receiver)
            if chained is None:
                return None
            iterator = self._fresh("iterator")
            if self.plan_.runner is not None:
                iterator = f"{RECEIVER}._{iterator}"  # the method running the step reads it
            self.iterators[iterator] = chained
        if iterator is None or iterator not in self.iterators:
            return None
        if name is None:
            small = statement.body[0]
            param = self._fresh("batch")
            self.batches[param] = iterator
            self.plan_.step_before.append(
                statement.with_changes(body=[small.with_changes(value=cst.Name(param))])
            )
            self.step_names |= bound_names(statement)
        else:
            self.batches[name] = iterator
        if chained is not None:
            return Decision(Action.ITERATOR, dataset=chained, iterator=iterator)
        return Decision(Action.DROP, "a batch: next(iterator) at the train step's call")

    def _fresh(self, base: str) -> str:
        taken = bound_names(self.source.module) | bound_names(self.scope) | set(self.iterators)
        taken |= set(self.batches)
        name, count = base, 1
        while name in taken:
            count += 1
            name = f"{base}_{count}"
        return name

    def _tower_only(self) -> set[str]:
        outside = set()
        for statement in self.body:
            if statement is self.loop or self.loop in self.source.ancestors(statement):
                continue
            if isinstance(statement, cst.SimpleStatementLine):
                outside |= bound_names(statement)
        return self.tower_names - outside

    def _iterator_dataset(self, value: cst.Call) -> cst.BaseExpression | None:
        called = self.call_q(value)
        if called in _ONE_SHOT and value.args:
            return value.args[0].value
        if (
            called is None
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in _ITERATOR_METHODS
            and not value.args
        ):
            return value.func.value
        return None

    def _all_initializers(self, call: cst.BaseExpression | None) -> bool:
        return (
            isinstance(call, cst.Call)
            and bool(call.args)
            and all(
                self.call_q(arg.value) in _INITIALIZERS
                or (isinstance(arg.value, cst.Name) and arg.value.value in self.initializers)
                for arg in call.args
            )
        )

    def _is_reuse(self, value: cst.BaseExpression | None) -> bool:
        return isinstance(value, cst.Call) and method_name(value) == "reuse_variables"

    def _update_ops(self, call: cst.BaseExpression | None) -> bool:
        if not isinstance(call, cst.Call):
            return False
        first = call.args[0].value if call.args else None
        return first is not None and (
            self.q(first) == "tensorflow.GraphKeys.UPDATE_OPS"
            or (isinstance(first, cst.SimpleString) and "update_ops" in first.value)
        )

    # -- tf.train.ExponentialMovingAverage applied with the update -> after it, in the replicas --
    def _moving_averages(
        self,
        statement: cst.SimpleStatementLine,
        called: str | None,
        name: str | None,
        value: cst.BaseExpression | None,
    ) -> Decision | None:
        """``ema = tf.train.ExponentialMovingAverage(decay, global_step)`` stays where it was
        (TF2 has the class) and ``op = ema.apply(tf.trainable_variables())``, which the train op
        groups with the update (``tf.group(apply_op, op)``), goes: the replica function applies
        the averages after each update, as running the grouped op did."""
        if name is None:
            return None
        if called == _AVERAGES:
            if self._averages_applied(name) is not None:
                return Decision(Action.KEEP)
            return None
        func = value.func if isinstance(value, cst.Call) else None
        receiver = func.value if isinstance(func, cst.Attribute) else None
        if isinstance(receiver, cst.Name) and self._averages_applied(receiver.value) is statement:
            self.updates.add(name)
            self.plan_.averages.append(statement)
            return Decision(Action.DROP, "the replica function applies the averages")
        return None

    def _averages_applied(self, ema: str) -> cst.SimpleStatementLine | None:
        """The statement ``op = ema.apply(tf.trainable_variables())`` of the EMA ``ema``, when
        it is the only use of ``ema`` after it is made and the train op groups ``op`` with the
        update; the update must be the optimizer's own (a hand-written one makes its state
        apart from the store)."""
        if not self.plan_.chains or any(c.hand_written for c in self.plan_.chains):
            return None
        made = [s for s in self.body if _target_name(s) == ema and self.call_q(_value(s)) == _AVERAGES]
        if len(made) != 1 or self.body.index(made[0]) < self.body.index(self.loop):
            return None
        readers = [
            s
            for s in self.body
            if isinstance(s, cst.SimpleStatementLine) and ema in free_names(s) and s is not made[0]
        ]
        if len(readers) != 1:
            return None
        apply = readers[0]
        call = _value(apply)
        op = _target_name(apply)
        if (
            op is None
            or not isinstance(call, cst.Call)
            or method_name(call) != "apply"
            or len(call.args) != 1
            or call.args[0].keyword is not None
            or not isinstance(call.args[0].value, cst.Call)
            or self.call_q(call.args[0].value) != "tensorflow.trainable_variables"
        ):
            return None
        for s in self.body:
            group = _value(s)
            if self.call_q(group) == "tensorflow.group" and isinstance(group, cst.Call):
                names = {a.value.value for a in group.args if isinstance(a.value, cst.Name)}
                if op in names and names & self.updates:
                    return apply
        return None

    def _groups_update(self, call: cst.BaseExpression | None) -> bool:
        if not isinstance(call, cst.Call):
            return False
        names = set()
        for arg in call.args:
            # `tf.group(train_op, ema_op)`, `tf.group(*[self.train_op, ema_op])`
            parts = (
                [e.value for e in arg.value.elements]
                if arg.star == "*" and isinstance(arg.value, cst.List | cst.Tuple)
                else [arg.value]
            )
            names |= {key for part in parts if (key := _key(part)) is not None}
        return bool(names & self.updates)

    def _is_feed(self, name: str, statement: cst.CSTNode | None = None) -> bool:
        """Whether ``name`` is what a step run feeds (bound by ``statement``, in the run's
        function: a function beside it may use the name for a feed of its own)."""
        for run in self.step_runs:
            feed = get_arg(run, 1, "feed_dict")
            if isinstance(feed, cst.Name) and feed.value == name:
                if statement is None or self.source.enclosing_def(
                    statement
                ) is self.source.enclosing_def(run):
                    return True
        return False

    def _tf1_only(self, statement: cst.SimpleStatementLine) -> Todo | None:
        todo = tf1_only(self.qualified_calls(statement)) or self._guest_trainables(statement)
        if todo is not None:
            return todo
        for call in _calls(statement):
            if method_name(call) == "apply" and isinstance(call.func, cst.Attribute):
                receiver = call.func.value
                if isinstance(receiver, cst.Name) and receiver.value in self.gone:
                    return Todo(
                        Leftover.CASCADE, f"uses `{receiver.value}`, left under a TODO above"
                    )
        return None

    def _guest_trainables(self, node: cst.CSTNode) -> Todo | None:
        """``tf.trainable_variables()`` in a function of another module running the object:
        the model's variables are its store's there, made by its first train step."""
        source = self.source
        if not (isinstance(source, JoinedSource) and source.is_guest(node)):
            return None
        if "tensorflow.trainable_variables" not in self.qualified_calls(node):
            return None
        return Todo(
            Leftover.GRAPH,
            "graph collections do not exist in TF2: the model's variables are made by its "
            "first train step (the TF1Variables store of the object's class)",
        )

    def _tf1_header(self, header: list[cst.CSTNode]) -> Todo | None:
        """The TODO of a compound statement whose header calls a TF1-only API
        (``for v in tf.all_variables():``)."""
        for node in header:
            todo = tf1_only(self.qualified_calls(node)) or self._guest_trainables(node)
            if todo is not None:
                return todo
        return None

    def _helper_batch(
        self, statement: cst.SimpleStatementLine, value: cst.BaseExpression | None
    ) -> Decision | None:
        """``features, iterator = input_helper(dataset)``: a function of this file that makes
        an iterator of its argument and returns its batch (and the iterator). As if the
        iterator were made here: the batch is the train step's argument."""
        made = self._iterator_helper(value)
        names = _target_tuple(statement)
        if made is None or names is None or len(names) != len(made[1]):
            return None
        assert isinstance(value, cst.Call) and isinstance(value.func, cst.Name)
        dataset, returned = made
        iterator = next((n for n, r in zip(names, returned, strict=True) if r == "iterator"), None)
        iterator = iterator or self._fresh("iterator")
        self.iterators[iterator] = dataset
        for name, role in zip(names, returned, strict=True):
            if role == "batch":
                self.batches[name] = iterator
                self.step_names.add(name)  # what reads the batch runs in the step
        self.plan_.iterator_helpers.add(value.func.value)
        return Decision(Action.ITERATOR, dataset=dataset, iterator=iterator)

    def _iterator_helper(
        self, value: cst.BaseExpression | None
    ) -> tuple[cst.BaseExpression, list[str]] | None:
        """(the dataset argument, what each returned value is: 'batch' or 'iterator') of a call
        to a function of this file whose only return gives ``it.get_next()`` (and ``it``), where
        ``it`` is an iterator it makes of one of its parameters."""
        if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name):
            return None
        function = self.source.top_level(value.func.value)
        if not isinstance(function, cst.FunctionDef):
            return None
        params = [p.name.value for p in function.params.params]
        statements = list(statements_in(_body(function)))
        iterators: dict[str, int] = {}  # iterator -> the parameter it iterates
        batches: dict[str, str] = {}  # batch -> its iterator
        for statement in statements:
            made, target = _value(statement), _target_name(statement)
            if not isinstance(made, cst.Call) or target is None:
                continue
            dataset = self._iterator_dataset(made)
            if isinstance(dataset, cst.Name) and dataset.value in params:
                iterators[target] = params.index(dataset.value)
            receiver = made.func.value if isinstance(made.func, cst.Attribute) else None
            if (
                method_name(made) == "get_next"
                and isinstance(receiver, cst.Name)
                and receiver.value in iterators
            ):
                batches[target] = receiver.value
        returns = [
            s.body[0].value
            for s in statements
            if isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Return)
        ]
        if len(returns) != 1 or returns[0] is None or len(set(iterators.values())) != 1:
            return None
        returned = returns[0]
        elements = (
            [e.value for e in returned.elements] if isinstance(returned, cst.Tuple) else [returned]
        )
        roles = []
        for element in elements:
            if isinstance(element, cst.Name) and element.value in batches:
                roles.append("batch")
            elif isinstance(element, cst.Name) and element.value in iterators:
                roles.append("iterator")
            else:
                return None
        position = next(iter(iterators.values()))
        args = [a for a in value.args if a.keyword is None and not a.star]
        if "batch" not in roles or position >= len(args):
            return None
        return args[position].value, roles

    def _placeholders_made_by(self, value: cst.BaseExpression | None) -> int | None:
        """``x, y = placeholder_inputs(...)``: a function of this file that returns only
        placeholders it makes; how many."""
        if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name):
            return None
        function = self.source.top_level(value.func.value)
        if not isinstance(function, cst.FunctionDef):
            return None
        made = {
            _target_name(s)
            for s in statements_in(_body(function))
            if self.call_q(_value(s)) in _PLACEHOLDERS
        }
        returns = [
            s.body[0].value
            for s in statements_in(_body(function))
            if isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Return)
        ]
        if len(returns) != 1 or returns[0] is None:
            return None
        returned = returns[0]
        elements = (
            [e.value for e in returned.elements] if isinstance(returned, cst.Tuple) else [returned]
        )
        if all(isinstance(e, cst.Name) and e.value in made for e in elements):
            return len(elements)
        return None

    def _update_ops_names(self) -> set[str]:
        """Names bound anywhere in the function to UPDATE_OPS collections."""
        found = set()
        for statement in self.body:
            value = _value(statement)
            name = _target_name(statement)
            if (
                name
                and isinstance(value, cst.Call)
                and self.call_q(value) == "tensorflow.get_collection"
            ):
                if self._update_ops(value):
                    found.add(name)
        return found

    def _bound_before_loop_beside(self) -> set[str]:
        """Names bound before the loop in the blocks that hold it (their values reach the
        loop, and the towers may update them: accumulators, containers)."""
        found: set[str] = set()
        for statement in self.body:
            if statement is self.loop:
                break
            if id(self.source.parent(statement)) in self.loop_blocks and isinstance(
                statement, cst.SimpleStatementLine
            ):
                found |= bound_names(statement)
        return found

    def _session_method(self, statement: cst.SimpleStatementLine) -> bool:
        value = _value(statement)
        if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Attribute):
            return False
        receiver = value.func.value
        if (
            isinstance(receiver, cst.Name)
            and receiver.value in self.initializers
            and value.func.attr.value == "run"
        ):
            return True  # init.run()
        return session_method(value, self.sessions)

    def _session_statement(self, statement: cst.SimpleStatementLine, run: cst.Call) -> Decision:
        fetches = get_arg(run, 0, "fetches")
        if fetches is None:
            return Decision(Action.TODO, todo=session_run_todo(run=True))
        names = free_names(fetches)
        if run in self.step_runs and _value(statement) is run:
            listed = self._fetch_list(fetches)
            if listed is not fetches and isinstance(fetches, cst.Name):
                fetch_list = self.fetch_lists[fetches.value]
                self.plan_.decide(fetch_list, Decision(Action.DROP, "the train step returns them"))
                for extension in self.fetch_extensions.get(fetches.value, ()):
                    todo = Todo(
                        Leftover.SESSION,
                        f"adds a fetch to the step's Session.run on some steps "
                        f"(`{self.source.src(extension, 50)}`): the train step returns the "
                        f"values `{fetches.value}` listed; return this one from it too",
                    )
                    self.plan_.decide(extension, Decision(Action.TODO, todo=todo))
                    self.gone.setdefault(fetches.value, todo)
            return self._step_run(statement, run, listed or fetches)
        if names and names <= self.initializers or self.call_q(fetches) in _INITIALIZERS:
            return Decision(Action.DROP, "variables are initialized when made")
        if (
            isinstance(fetches, cst.Attribute)
            and fetches.attr.value == "initializer"
            and isinstance(fetches.value, cst.Name)
            and fetches.value.value in self.iterators
            and _value(statement) is run
        ):
            iterator = fetches.value.value
            made = self.initializable.pop(iterator, None)
            if made is not None:
                self.plan_.decide(
                    made, Decision(Action.DROP, "the iterator is made where it was initialized")
                )
            return Decision(Action.ITERATOR, dataset=self.iterators[iterator], iterator=iterator)
        handled = method_receiver(fetches, "string_handle", self.iterators)
        if handled is not None and _value(statement) is run:
            # the handle of an iterator fed to the step: the iterator itself, which a
            # tf.function takes as an argument
            return Decision(Action.NEXT, iterator=handled, why="handle")
        if (
            isinstance(fetches, cst.Name)
            and fetches.value in self.batches
            and _value(statement) is run
        ):
            return Decision(Action.NEXT, iterator=self.batches[fetches.value])
        read = _key(fetches) if isinstance(fetches, cst.Name | cst.Attribute) else None
        if (
            read is not None
            and read in self._variables()
            and get_arg(run, 1, "feed_dict") is None
            and (_value(statement) is run or self._wraps_run(statement, run))
        ):
            # `initial_step = sess.run(global_step)`, `int(sess.run(model.global_step))`: TF2
            # reads the variable eagerly
            variable = self.source.module.code_for_node(fetches)
            return Decision(Action.READ, variable=variable)
        return Decision(Action.TODO, todo=session_run_todo())

    def _variables(self) -> set[str]:
        """Names this function binds to a variable it makes (``tf.Variable``, the global
        step, a ``tf.get_variable`` made beside the loop, not by the towers)."""
        return {
            name
            for statement in self.body
            if (name := _target_name(statement)) is not None
            and (
                self.call_q(_value(statement)) in _VARIABLES
                or (
                    self.call_q(_value(statement)) == "tensorflow.get_variable"
                    and self.loop not in self.source.ancestors(statement)
                )
            )
        }

    def _wraps_run(self, statement: cst.SimpleStatementLine, run: cst.Call) -> bool:
        """``x = int(sess.run(v))``: the run is the one argument of a builtin conversion."""
        value = _value(statement)
        return (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Name)
            and value.func.value in ("int", "float")
            and self.source.top_level(value.func.value) is None
            and len(value.args) == 1
            and value.args[0].value is run
        )

    def _step_run(
        self, statement: cst.SimpleStatementLine, run: cst.Call, fetches: cst.BaseExpression
    ) -> Decision:
        plan = self.plan_
        single = not isinstance(fetches, cst.List | cst.Tuple)
        elements = (
            [e.value for e in fetches.elements]
            if isinstance(fetches, cst.List | cst.Tuple)
            else [fetches]
        )
        targets = _targets(statement)
        target = targets[0] if len(targets) == 1 else None
        if self.summary_positions and isinstance(target, cst.List | cst.Tuple):
            # a merged summary fetched with the update: the write reads the values instead
            elements = [e for k, e in enumerate(elements) if k not in self.summary_positions]
            target = target.with_changes(
                elements=[
                    e for k, e in enumerate(target.elements) if k not in self.summary_positions
                ]
            )
        extras = [name for name in self.summary_extras if name not in self.gone]
        towers = [name for name in dict.fromkeys(self.tower_extras) if name not in self.gone]
        tower_names = {name: self._fresh(f"{name}_towers") for name in towers}
        if towers and (single or isinstance(target, cst.List | cst.Tuple)):
            for name in towers:
                if name not in plan.outputs:
                    plan.outputs.append(name)
                    plan.towers_only.add(name)
                plan.per_tower[name] = tower_names[name]
            self.summary_towers = tower_names
        if extras or towers:
            # values a summary write reads that the step did not return: it returns them too
            if single:
                first = target if target is not None else cst.Name("_")
                target = cst.Tuple([cst.Element(first)])
                single = False
            if isinstance(target, cst.List | cst.Tuple):
                returned = [self._fresh(f"{name}_value") for name in extras]
                self.summary_returns = dict(zip(extras, returned, strict=True))
                elements += [cst.Name(name) for name in extras]
                elements += [cst.Name(tower_names[name]) for name in towers]
                returned += [tower_names[name] for name in towers]
                target = target.with_changes(
                    elements=[*target.elements, *(cst.Element(cst.Name(n)) for n in returned)]
                )
        values: list[cst.BaseExpression] = []
        run_only: list[int] = []
        missing: list[str] = []
        # A fetched name the loop binds: the loop's value reaches the run (a binding in another
        # branch, e.g. a one-device path, does not).
        tower_only = bound_names(self.loop) - {plan.index} - self._bound_before_loop_beside()
        for chain in plan.chains:
            if chain.all_reduced:
                tower_only |= set().union(*(bound_names(s) for s in chain.between))
        # what an update function returns besides the op (the learning rate, the gradients'
        # norm): each replica computes it now
        plan.update_values = set().union(
            *(
                set(_target_tuple(c.update) or ()) - self.updates
                for c in plan.chains
                if c.update_function is not None
            )
        )
        tower_only |= plan.update_values
        for position, element in enumerate(elements):
            names = free_names(element)
            if _key(element) in self.updates:
                run_only.append(position)
                continue
            if names & tower_only:
                for name in sorted(names & tower_only):
                    if name in plan.outputs:
                        continue
                    only = self._only_in_tower_if(name)
                    if only is not None:
                        node, tower = only
                        plan.first_tower[name] = tower
                        plan.hoisted.add(id(node))
                    plan.outputs.append(name)
            if isinstance(element, cst.Name) and element.value in self.schedules:
                element = cst.Call(element)
            loop_values = names & self._run_loop_names(statement)
            if loop_values:
                raise NotPlanned(
                    f"the step fetches `{self.source.src(element, 40)}`, which reads "
                    f"`{sorted(loop_values)[0]}`, a value of the training loop"
                )
            lost = sorted(names & set(self.gone))
            if lost:
                # a fetch whose definition went under a TODO (a TF1 summary): None now
                missing.append(lost[0])
                element = cst.Name("None")
            values.append(element)
        arguments = self._arguments(run)
        if arguments is None:
            raise NotPlanned("the training step's feed is not a dict of its placeholders")
        todo = None
        if missing:
            todo = Todo(
                Leftover.CASCADE,
                f"fetched `{missing[0]}`, left under a TODO above: the train step returns None "
                "in its place",
                commented=False,
            )
        traced = [
            arg.keyword.value
            for arg in run.args
            if arg.keyword is not None and arg.keyword.value in ("options", "run_metadata")
        ]
        if todo is None and traced:
            todo = Todo(
                Leftover.SESSION,
                f"the Session.run was given {' and '.join(traced)} (a trace of the step): "
                "profile the train step with tf.profiler.experimental instead",
                commented=False,
            )
        return Decision(
            Action.STEP_RUN,
            todo=todo,
            step_run=StepRun(tuple(values), tuple(run_only), tuple(arguments), target, single),
        )

    def _only_in_tower_if(self, name: str) -> tuple[cst.If, int] | None:
        """``if i == K:`` blocks of the tower body that bind ``name`` while nothing else in the
        body does: (the if, K)."""
        index = self.plan_.index
        found: tuple[cst.If, int] | None = None
        for statement in statements_in(_body(self.loop)):
            if not isinstance(statement, cst.SimpleStatementLine) or name not in bound_names(
                statement
            ):
                continue
            holder = next(
                (
                    a
                    for a in self.source.ancestors(statement)
                    if isinstance(a, cst.If) or a is self.loop
                ),
                None,
            )
            if not isinstance(holder, cst.If):
                return None
            test = holder.test
            if not (
                isinstance(test, cst.Comparison)
                and isinstance(test.left, cst.Name)
                and test.left.value == index
                and len(test.comparisons) == 1
                and isinstance(test.comparisons[0].operator, cst.Equal)
                and isinstance(test.comparisons[0].comparator, cst.Integer)
            ):
                return None
            found = (holder, int(test.comparisons[0].comparator.value))
        return found

    def _arguments(self, run: cst.Call) -> list[tuple[str, cst.BaseExpression]] | None:
        feed = get_arg(run, 1, "feed_dict")
        given: dict[str, cst.BaseExpression] = {}
        if isinstance(feed, cst.Name):
            built = getattr(self, "per_gpu_built", {}).get(feed.value)
            if built is not None:
                # the lists the loops over the GPUs filled, under the parameters' names
                for listed in built.lists:
                    param = self.plan_.per_gpu[listed]
                    given[param] = cst.Name(param)
            feed = self.feeds.get(feed.value)
        if isinstance(feed, cst.Dict) and self.plan_.per_gpu:
            split = per_gpu.literal_lists(feed, self.plan_.per_gpu)
            if split is None:
                return None
            for listed, values in split[1].items():
                given[self.plan_.per_gpu[listed]] = values
            feed = feed.with_changes(elements=split[0])
        if isinstance(feed, cst.Dict):
            items = feed_items(feed)
            if items is None:
                return None
            for placeholder, fed in items:
                key = self.plan_.fed_variables.get(placeholder, placeholder)
                if key not in self.plan_.inputs:
                    return None
                given[key] = fed
        elif feed is not None:
            return None
        for batch, iterator in self.batches.items():
            if batch in self._graph_reads():
                if batch not in self.plan_.inputs:
                    self.plan_.inputs.append(batch)
                given[batch] = cst.Call(cst.Name("next"), [cst.Arg(cst.parse_expression(iterator))])
        if set(given) != set(self.plan_.inputs):
            return None
        return [(name, given[name]) for name in self.plan_.inputs]

    def _graph_reads(self) -> set[str]:
        reads: set[str] = set()
        for statement in statements_in(_body(self.loop)):
            reads |= free_names(statement)
        for statement in self.plan_.step_before:
            reads |= free_names(statement)
        return reads


def _joined_tag(parts: list[cst.BaseExpression]) -> cst.BaseExpression:
    """The TF1 tag of a summary under name scopes: ``'tower_%d' % i`` and ``'loss'`` ->
    ``'tower_%d/loss' % i``; other spellings joined with ``+ '/' +``."""
    head, *rest = parts
    for part in rest:
        text = _text(part)
        if text is not None and _text(head) is not None:
            head = cst.SimpleString(repr(f"{_text(head)}/{text}"))
        elif (
            text is not None
            and "%" not in text
            and isinstance(head, cst.BinaryOperation)
            and isinstance(head.operator, cst.Modulo)
            and (format_ := _text(head.left)) is not None
        ):
            head = head.with_changes(left=cst.SimpleString(repr(f"{format_}/{text}")))
        else:
            slash = cst.BinaryOperation(_parenthesized(head), cst.Add(), cst.SimpleString("'/'"))
            head = cst.BinaryOperation(slash, cst.Add(), _parenthesized(part))
    return head


def _is_name(node: cst.CSTNode | None, name: str) -> bool:
    return isinstance(node, cst.Name) and node.value == name


def cast_expression(
    node: cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel,
) -> cst.BaseExpression:
    assert isinstance(node, cst.BaseExpression)
    return node


class _OpName(cst.CSTTransformer):
    """``v.op.name`` (a graph op's name, which an eager variable has not): the variable's
    legacy name, which the write reads from the variables' store."""

    def __init__(self, variable: str, legacy: str) -> None:
        self.variable = variable
        self.legacy = legacy

    def leave_Attribute(self, original_node, updated_node):
        value = original_node.value
        if (
            original_node.attr.value == "name"
            and isinstance(value, cst.Attribute)
            and value.attr.value == "op"
            and _is_name(value.value, self.variable)
        ):
            return cst.Name(self.legacy)
        return updated_node


def _text(node: cst.BaseExpression) -> str | None:
    """The text of a plain string literal (None for anything else)."""
    if isinstance(node, cst.SimpleString) and isinstance(node.evaluated_value, str):
        return node.evaluated_value
    return None


def _parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(node, cst.BinaryOperation | cst.BooleanOperation):
        return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return node


def _keyed(statement: cst.CSTNode, feed: str) -> str | None:
    """``feed[x] = value`` (one key, a name or ``self.x``): the key's name."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    assign = statement.body[0]
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return None
    target = assign.targets[0].target
    if not (
        isinstance(target, cst.Subscript)
        and isinstance(target.value, cst.Name)
        and target.value.value == feed
        and len(target.slice) == 1
        and isinstance(target.slice[0].slice, cst.Index)
    ):
        return None
    return _key(target.slice[0].slice.value)


def _gradients_argument(call: cst.Call, gradients: set[str]) -> int | None:
    """The position of the first argument of ``call`` that reads one of ``gradients``."""
    for position, arg in enumerate(call.args):
        if free_names(arg.value) & gradients:
            return position
    return None


def _builds_state(called: str) -> bool:
    """Calls that make state once (variables, optimizers, schedules, datasets): set-up even
    when the step fetches their result."""
    return (
        called.endswith(("Optimizer", ".Variable", ".get_variable", "global_step"))
        or called in _SCHEDULES
        or called.startswith("tensorflow.data.")
    )


def _target_tuple(statement: cst.CSTNode) -> list[str] | None:
    targets = _targets(statement)
    if len(targets) != 1:
        return None
    target = targets[0]
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, cst.Tuple) and all(
        isinstance(e.value, cst.Name) for e in target.elements
    ):
        return [e.value.value for e in target.elements if isinstance(e.value, cst.Name)]
    return None


_RETURNED = "<returned>"  # a helper's one returned value that is no name


def _returned_expression(function: cst.FunctionDef) -> cst.BaseExpression | None:
    returns = [
        n for n in tree.walk(function.body, (cst.FunctionDef, cst.ClassDef, cst.Lambda))
        if isinstance(n, cst.Return)
    ]  # fmt: skip
    return returns[0].value if len(returns) == 1 else None


def _returned_value(function: cst.FunctionDef) -> list[str] | None:
    """``[_RETURNED]`` when ``function``'s one ``return`` gives back one value that is not a
    name or a tuple (``return list(zip(grads, params))``)."""
    value = _returned_expression(function)
    if value is None or isinstance(value, cst.Tuple | cst.Name):
        return None
    return [_RETURNED]


def _handed(
    function: cst.FunctionDef,
    statement: cst.BaseStatement,
    loss: cst.BaseExpression,
    source: SourceFile,
) -> bool:
    """Whether the loss ``function`` differentiates at ``statement`` is one of its
    parameters, or made from one by TensorFlow arithmetic alone (the tower's loss handed to it:
    ``loss = loss * num_steps``) -- not by a model it calls (``self._model.loss(features)``)."""
    params = function.params
    given = {
        p.name.value
        for p in [*params.posonly_params, *params.params, *params.kwonly_params]
        if p.name.value != RECEIVER
    }
    at = source.line(statement)
    for inner in statements_in(_body(function)):
        if source.line(inner) >= at:
            break
        if not isinstance(inner, cst.SimpleStatementLine) or not free_names(inner) & given:
            continue
        made = bound_names(inner)
        arithmetic = all(
            (qualify(source, call.func) or "").startswith("tensorflow.") for call in _calls(inner)
        )
        if arithmetic:
            given |= made
        else:
            given -= made
    return bool(free_names(loss) & given)


def _list_extension(statement: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    """``L += [x]`` (a list of one element added to the list ``L``): (L, x)."""
    small = _simple(statement)
    if (
        isinstance(small, cst.AugAssign)
        and isinstance(small.operator, cst.AddAssign)
        and isinstance(small.target, cst.Name)
        and isinstance(small.value, cst.List)
        and len(small.value.elements) == 1
        and isinstance(small.value.elements[0], cst.Element)
    ):
        return small.target.value, small.value.elements[0].value
    return None


def _returned(function: cst.FunctionDef) -> list[str] | None:
    """The names ``function``'s one ``return`` gives back (``return loss, grads``)."""
    returns = [
        n for n in tree.walk(function.body, (cst.FunctionDef, cst.ClassDef, cst.Lambda))
        if isinstance(n, cst.Return)
    ]  # fmt: skip
    if len(returns) != 1 or returns[0].value is None:
        return None
    value = returns[0].value
    parts = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
    names = [p.value for p in parts if isinstance(p, cst.Name)]
    return names if len(names) == len(parts) else None


def _handed_on(source: SourceFile, function: cst.FunctionDef) -> cst.FunctionDef | None:
    """The function of ``source`` whose result ``function`` returns as it is, if that is all
    it does: ``return loss_and_gradients(FLAGS, x)``, ``ret = f(x)`` then ``return ret``, or a
    function a factory of the module returns (``model_fn = get_model_fn()``, then
    ``ret = model_fn(x)`` and ``return ret``)."""
    body = [s for s in _body(function) if not _is_docstring_line(s)]
    if not body or not all(isinstance(s, cst.SimpleStatementLine) for s in body):
        return None
    last = cast(cst.SimpleStatementLine, body[-1]).body[0]
    if not isinstance(last, cst.Return) or last.value is None:
        return None
    returned: cst.BaseExpression | None = last.value
    if isinstance(returned, cst.Name) and len(body) >= 2:
        if _target_name(body[-2]) != returned.value:
            return None
        returned = _value(body[-2])
        rest = body[:-2]
    else:
        rest = body[:-1]
    if not isinstance(returned, cst.Call) or not isinstance(returned.func, cst.Name):
        return None
    name = returned.func.value
    if not rest:
        found = source.top_level(name)
        return found if isinstance(found, cst.FunctionDef) and found is not function else None
    made = _value(rest[0])
    if len(rest) != 1 or _target_name(rest[0]) != name or not isinstance(made, cst.Call):
        return None
    factory = source.top_level(made.func.value) if isinstance(made.func, cst.Name) else None
    if not isinstance(factory, cst.FunctionDef):
        return None
    inner = [s for s in _body(factory) if isinstance(s, cst.FunctionDef)]
    made_name = _returned(factory)
    if len(inner) != 1 or made_name != [inner[0].name.value]:
        return None
    return inner[0]


def _else_body(orelse: cst.Else) -> Sequence[cst.BaseStatement]:
    return orelse.body.body if isinstance(orelse.body, cst.IndentedBlock) else []


def _is_docstring_line(statement: cst.BaseStatement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, cst.SimpleString | cst.ConcatenatedString)
    )


def _update_op_name(chain: Chain) -> set[str]:
    """What an update function returns the op under (``train_op, lr, gnorm = f(...)``): the
    name that says so, else the first; the others are values the step computes."""
    names = _target_tuple(chain.update) if chain.update_function is not None else None
    if not names:
        return set()
    named = [n for n in names if n.endswith("_op") or n in ("op", "update", "train")]
    return {named[0] if named else names[0]}


def _targets_names(statement: cst.CSTNode) -> set[str]:
    if isinstance(statement, cst.With):
        body = _body(statement)
        return _targets_names(body[0]) if body else set()
    name = _target_name(statement)
    return {name} if name else set()


def reading_gradients(between: Sequence[Statement], combined: str) -> list[bool]:
    """For each statement moved with the update, whether it reads the combined gradients (or
    a value made from them): clipping does, ``global_step = ...`` does not."""
    derived = {combined}
    found = []
    for statement in between:
        reads = bool(free_names(statement) & derived)
        if reads:
            derived |= bound_names(statement)
        found.append(reads)
    return found


def _is_len_of(node: cst.BaseExpression, name: str) -> bool:
    """``len(name)``."""
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Name)
        and node.func.value == "len"
        and len(node.args) == 1
        and isinstance(node.args[0].value, cst.Name)
        and node.args[0].value.value == name
    )


def _no_spaces() -> cst.AssignEqual:
    return cst.AssignEqual(
        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
    )
