"""The plan stage for Horovod TF1 programs: what happens to each statement of the code that
builds and runs the per-process step, decided from the IR's Horovod core (``towers is None``)
and the code around it.

A Horovod core converts when its update (``opt.minimize``, or ``opt.compute_gradients`` then
``opt.apply_gradients``, of a ``hvd.DistributedOptimizer``) is found in one function -- or at
module level -- that also runs it (``Session.run`` / ``MonitoredTrainingSession.run`` of the
update). The per-step graph (from the per-step inputs, placeholders fed per step and tf.data
``get_next()`` batches, to the loss) moves into the replica function of one
``@tf.function`` train step; Horovod's own calls become the strategy's (``hvd.init()`` makes it,
``hvd.size()`` is ``num_replicas_in_sync``, ``hvd.rank()`` the worker's task id), its broadcast,
device pinning and session go, the session hooks become the loop's bound, a print, a
CheckpointManager; what has no TF2 form is a TODO. The plan only decides; ``horovod_emit``
writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from enum import Enum

import libcst as cst

from tfmigrate import tree
from tfmigrate.convert import graph_function, ir
from tfmigrate.convert.plan import (
    _INITIALIZERS,
    _PLACEHOLDERS,
    _SESSIONS,
    Decisions,
    NotPlanned,
    Statement,
    _blocks,
    _body,
    _calls,
    _header,
    _subscript_reads,
    _target_name,
    _targets,
    _value,
    feed_items,
    gone_reads,
    method_receiver,
    qualify,
    reads_todo,
    receiver_call,
    saver_action,
    session_method,
    session_run_todo,
    simple_line,
    tf1_only,
    with_names,
)
from tfmigrate.convert.project import SourceFile
from tfmigrate.convert.todo import Leftover, Todo
from tfmigrate.rules._towers import bound_names, free_names, get_arg, method_name

_MONITORED = frozenset(
    {"tensorflow.train.MonitoredTrainingSession", "tensorflow.train.MonitoredSession",
     "tensorflow.train.SingularMonitoredSession"}
)  # fmt: skip
_GLOBAL_STEP = frozenset(
    {"tensorflow.train.get_or_create_global_step", "tensorflow.train.create_global_step"}
)
_TRAINABLES = frozenset({"tensorflow.trainable_variables"})
_GRAPH_MODE = frozenset(
    {"tensorflow.disable_v2_behavior", "tensorflow.disable_eager_execution",
     "tensorflow.disable_resource_variables"}
)  # fmt: skip
# Horovod calls the converted program spells with the strategy (horovod_emit rewrites them).
_TASK_ID = "(strategy.cluster_resolver.task_id or 0)"  # None without TF_CONFIG: one worker
MAPPED = {
    "size": "strategy.num_replicas_in_sync",
    "rank": _TASK_ID,
    "local_rank": _TASK_ID,
    "local_size": "len(strategy.extended.worker_devices)",
    # whether the all-reduce can go through NCCL (CUDA): the strategy's collectives use NCCL on
    # GPUs whenever TensorFlow was built with CUDA
    "nccl_built": "tf.test.is_built_with_cuda()",
    "cuda_built": "tf.test.is_built_with_cuda()",
    "rocm_built": "tf.test.is_built_with_rocm()",
}
_BROADCASTS = frozenset({"broadcast_global_variables", "broadcast_variables"})
# Arguments of minimize that apply_gradients takes too.
_APPLY_KEYWORDS = ("global_step", "name")


class Action(Enum):
    KEEP = "kept"  # set-up: runs once, where it was
    DROP = "dropped"  # no TF2 counterpart needed (session, initializer, broadcast, pinning...)
    INIT = "hvd.init() -> the strategy"
    STEP = "moved into the replica function"
    TRAIN_STEP = "the update: becomes the train step"
    OPTIMIZER = "hvd.DistributedOptimizer(opt) -> opt"
    STEP_RUN = "the training step's run: calls the train step"
    TODO = "left to the user"
    CHECKPOINT = "tf.train.Saver -> tf.train.Checkpoint"
    SAVER_CALL = "saver.save/restore -> checkpoint.write/restore"
    UNWRAP = "session with-statement replaced by its body"
    MONITORED = "MonitoredTrainingSession -> its body, with a CheckpointManager"
    STOP_LOOP = "while not sess.should_stop() -> the StopAtStepHook's bound"
    STORE_SCOPE = "made through the TF1Variables store"
    ITERATOR = "a tf.data iterator: iter(dataset)"
    SAVE_AT_CLOSE = "a MonitoredTrainingSession's close: the chief's last checkpoint"
    GRAPH_FUNCTION = "a graph the session ran apart from the step: a tf.function of its feed"
    GRAPH_CALL = "a Session.run of such a graph: a call of its tf.function"


@dataclass(frozen=True)
class StepRun:
    """A run of the update: the values it fetched besides the update, its feed and target."""

    elements: tuple[cst.BaseExpression | None, ...]  # None: the update's place in the fetches
    single: bool  # the fetches were one expression, not a list or tuple
    arguments: tuple[tuple[str, cst.BaseExpression], ...]  # placeholder -> fed value
    target: cst.BaseAssignTargetExpression | None
    returned: bool = False  # `return sess.run(...)[i]`: the call's value is returned


@dataclass(frozen=True)
class Decision:
    action: Action
    why: str = ""
    todo: Todo | None = None
    run: StepRun | None = None
    value: cst.BaseExpression | None = (
        None  # OPTIMIZER: the wrapped optimizer; ITERATOR: the dataset
    )
    name: str = ""  # ITERATOR: the iterator's name


@dataclass(frozen=True)
class Logging:
    """A LoggingTensorHook: the logged dict (as written) and how often."""

    tensors: cst.BaseExpression
    every: cst.BaseExpression


@dataclass
class HorovodPlan(Decisions[Decision]):
    source: SourceFile
    scope: cst.FunctionDef | cst.Module
    update: cst.SimpleStatementLine  # `train_op = opt.minimize(loss, ...)`
    update_call: cst.Call
    loss: cst.BaseExpression
    variables: cst.BaseExpression | None  # var_list as written (None: all trainables)
    averaged: bool
    strategy_at_module: bool  # the strategy is made at module level (Horovod is used outside)
    # `gv = opt.compute_gradients(loss)` when the update is an apply_gradients (else None)
    # (for a hand-written update: its `grads = tf.gradients(loss, params)`, or an if/else of it)
    gradient: cst.SimpleStatementLine | cst.If | None = None
    between: list[Statement] = field(default_factory=list)  # from the gradients to the update
    inputs: list[str] = field(default_factory=list)  # train step parameters, in order
    # the placeholders' (dtype, shape) as written: the train step's input signature
    specs: dict[str, tuple[cst.BaseExpression, cst.BaseExpression | None]] = field(
        default_factory=dict
    )
    # batches of tf.data iterators: (the get_next target, the iterator), next() before each run
    batches: list[tuple[cst.BaseAssignTargetExpression, str]] = field(default_factory=list)
    step: list[Statement] = field(default_factory=list)  # the replica function's statements
    step_names: set[str] = field(default_factory=set)  # names bound in the replica function
    last_step: cst.BaseExpression | None = None  # StopAtStepHook(last_step=...)
    logging: Logging | None = None
    checkpoint_dir: cst.BaseExpression | None = None
    session_todo: Todo | None = None  # what the MonitoredTrainingSession did that is not converted
    decisions: dict[int, Decision] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # The update is a function of the program's own (``optim.adam(params, grads, ...)``) that
    # all-reduces the gradients itself: the replica calls it after the tape, with no loss scaling.
    hand_written: bool = False
    # hvd.init() is in another module (the entry), which makes the strategy: this module's step
    # takes it from tf.distribute.get_strategy() where it is built.
    strategy_from_entry: bool = False
    # graphs the session ran apart from the train step, fed the step's placeholders: by name
    functions: dict[str, graph_function.GraphFunction] = field(default_factory=dict)

    @property
    def global_step(self) -> cst.BaseExpression | None:
        return get_arg(self.update_call, None, "global_step")

    @property
    def optimizer(self) -> cst.BaseExpression:
        func = self.update_call.func
        assert isinstance(func, cst.Attribute)
        return func.value


def plan_horovod(source: SourceFile, program: ir.Program, core: ir.TowerCore) -> HorovodPlan:
    """The plan for ``core``'s Horovod step in ``source``, or NotPlanned with the reason."""
    return _Planner(source, program, core).plan()


def horovod_api(source: SourceFile, call: cst.Call) -> str | None:
    """``hvd.size()`` -> 'size' (any Horovod TensorFlow front end), else None."""
    name = source.qualify(call.func)
    if name is None or not name.startswith("horovod."):
        return None
    return name.rsplit(".", 1)[1]


def walk_statements(block: list[cst.BaseStatement], into_defs: bool) -> Iterator[cst.BaseStatement]:
    """Every statement of a block in order, nested blocks included (nested defs' bodies when
    ``into_defs``; never classes)."""
    for statement in block:
        yield statement
        if isinstance(statement, cst.ClassDef):
            continue
        if isinstance(statement, cst.FunctionDef) and not into_defs:
            continue
        for inner in _blocks(statement):
            yield from walk_statements(list(inner), into_defs)


# -- the planner ----------------------------------------------------------------------------------
class _Planner:
    def __init__(self, source: SourceFile, program: ir.Program, core: ir.TowerCore) -> None:
        self.source = source
        self.program = program
        self.core = core
        self.sessions: set[str] = set()
        self.gone: dict[str, Todo] = {}  # names whose only definition went under a TODO
        self.dropped: set[str] = set()  # names of dropped statements (broadcast op, hooks...)
        self.live: set[str] = set()  # names bound by kept statements so far
        self.savers: set[str] = set()
        self.monitored: set[str] = set()  # MonitoredTrainingSessions made by assignment
        self.iterators: dict[str, cst.SimpleStatementLine] = {}  # iterator -> where it is made

    def q(self, node: cst.BaseExpression) -> str | None:
        return qualify(self.source, node)

    def call_q(self, node: cst.CSTNode | None) -> str | None:
        return self.q(node.func) if isinstance(node, cst.Call) else None

    def hvd(self, call: cst.Call) -> str | None:
        return horovod_api(self.source, call)

    # -- the core's pieces -----------------------------------------------------------------------
    def plan(self) -> HorovodPlan:
        core = self.core
        if core.towers is not None or core.combination.kind is not ir.CombineKind.HOROVOD:
            raise NotPlanned("not a Horovod core")
        hand_written = core.update.kind is ir.UpdateKind.HAND_WRITTEN
        if hand_written:
            found = self._hand_written_call()
            if found is None:
                raise NotPlanned("the Horovod update is in another module")
            update, call, gradient, gradient_call = found
            kind = "hand_written"
        elif core.update.where.file != self.source.rel:
            raise NotPlanned("the Horovod update is in another module")
        elif core.update.kind not in (ir.UpdateKind.MINIMIZE, ir.UpdateKind.APPLY_GRADIENTS):
            raise NotPlanned(f"update by {core.update.kind.value} (minimize is converted)")
        else:
            kind = "minimize" if core.update.kind is ir.UpdateKind.MINIMIZE else "apply_gradients"
            update, call = self._update(core.update.where.line, kind)
            gradient, gradient_call = update, call
        if kind == "apply_gradients":
            if core.loss is None:
                raise NotPlanned("apply_gradients with no compute_gradients found")
            gradient, gradient_call = self._update(core.loss.where.line, "compute_gradients")
        scope = self.source.enclosing_def(update) or self.source.module
        if self.source.enclosing_class(update) is not None:
            raise NotPlanned("the Horovod step is built in a method")
        if (self.source.enclosing_def(gradient) or self.source.module) is not scope:
            raise NotPlanned("compute_gradients and apply_gradients are in different functions")
        loss = get_arg(gradient_call, 0, "ys" if hand_written else "loss")
        if loss is None:
            raise NotPlanned(f"{method_name(gradient_call)} names no loss")
        self.scope = scope
        self.statements = list(
            walk_statements(list(_body(scope)), isinstance(scope, cst.FunctionDef))
        )
        plan = HorovodPlan(
            source=self.source,
            scope=scope,
            update=update,
            update_call=call,
            loss=loss,
            variables=get_arg(gradient_call, 1, "xs" if hand_written else "var_list"),
            averaged=not hand_written,  # the hand-written update all-reduces the gradients
            strategy_at_module=self._strategy_at_module(scope),
            gradient=gradient if gradient is not update else None,
            hand_written=hand_written,
            strategy_from_entry=not any(
                isinstance(n, cst.Call) and self.hvd(n) == "init"
                for n in tree.walk(self.source.module)
            ),
        )
        self.plan_ = plan
        self.update_names = bound_names(update)
        self.sessions |= self._session_parameters(scope)
        plan.decide(update, Decision(Action.TRAIN_STEP))
        if plan.gradient is not None:
            self._between(plan.gradient, update)
        self._distributed_optimizer()
        self.runs = self._step_runs()
        if not self.runs:
            raise NotPlanned("no Session.run of the Horovod update where it is built")
        self._step_graph()
        for statement in self.statements:
            if not self._inside_decided(statement):
                self._decide(statement)
        if not any(d.action is Action.STEP_RUN for d in plan.decisions.values()):
            raise NotPlanned("the training step's run could not be converted")
        self._module_level_horovod()
        return plan

    def _hand_written_call(
        self,
    ) -> (
        tuple[cst.SimpleStatementLine, cst.Call, cst.SimpleStatementLine | cst.If, cst.Call] | None
    ):
        """The call of the program's hand-written update in this module (``train_op =
        optim.adam(params, grads, ...)``, or through a dict of update functions chosen by a
        flag) given the gradients of a ``grads = tf.gradients(loss, params)`` of its block."""
        names = {
            part.strip().rstrip("()").rsplit(".", 1)[-1]
            for part in self.core.update.optimizer.split("|")
        }
        for node in tree.walk(self.source.module):
            if not isinstance(node, cst.SimpleStatementLine):
                continue
            value = _value(node)
            if not isinstance(value, cst.Call) or not isinstance(node.body[0], cst.Assign):
                continue
            block = list(getattr(self.source.parent(node), "body", ()))
            if node not in block:
                continue
            gradients: dict[str, tuple[cst.BaseStatement, cst.Call]] = {}
            for statement in block[: block.index(node)]:
                found = self._gradients_statement(statement)
                if found is not None:
                    gradients[found[0]] = (statement, found[1])
            given = [
                gradients[a.value.value]
                for a in value.args
                if isinstance(a.value, cst.Name) and a.value.value in gradients
            ]
            if given and self._names_update(value.func, block[: block.index(node)], names):
                gradient, gradient_call = given[0]
                assert isinstance(gradient, cst.SimpleStatementLine | cst.If)
                return node, value, gradient, gradient_call
        return None

    def _gradients_statement(self, statement: cst.BaseStatement) -> tuple[str, cst.Call] | None:
        """``grads = tf.gradients(loss, params)`` -> ('grads', the call); an if/else binding the
        same name with tf.gradients in one branch counts too (the other may use a drop-in)."""
        if isinstance(statement, cst.SimpleStatementLine):
            made = _value(statement)
            name = _target_name(statement)
            if isinstance(made, cst.Call) and self.call_q(made) == "tensorflow.gradients" and name:
                return name, made
            return None
        if isinstance(statement, cst.If) and isinstance(statement.orelse, cst.Else):
            for branch in (statement.body, statement.orelse.body):
                for inner in getattr(branch, "body", ()):
                    found = self._gradients_statement(inner)
                    if found is not None:
                        return found
        return None

    def _names_update(
        self, func: cst.BaseExpression, before: list[cst.BaseStatement], names: set[str]
    ) -> bool:
        """``func`` spells one of the update functions, or is a name bound before to an
        expression that does (``optimizer = {'adam': optim.adam, ...}[hps.optimizer]``)."""
        spelled = {n.value for n in tree.walk(func) if isinstance(n, cst.Name)}
        if spelled & names:
            return True
        if isinstance(func, cst.Name):
            for statement in before:
                if (
                    isinstance(statement, cst.SimpleStatementLine)
                    and _target_name(statement) == func.value
                ):
                    value = _value(statement)
                    if (
                        value is not None
                        and {n.value for n in tree.walk(value) if isinstance(n, cst.Name)} & names
                    ):
                        return True
        return False

    def _session_parameters(self, scope: cst.CSTNode) -> set[str]:
        """The scope's parameters whose ``.run(...)`` it calls: the session its caller made."""
        if not isinstance(scope, cst.FunctionDef):
            return set()
        params = {p.name.value for p in scope.params.params}
        found = set()
        for node in tree.walk(scope):
            if (
                isinstance(node, cst.Call)
                and method_name(node) == "run"
                and isinstance(node.func, cst.Attribute)
                and isinstance(node.func.value, cst.Name)
                and node.func.value.value in params
            ):
                found.add(node.func.value.value)
        return found

    def _update(self, line: int, method: str) -> tuple[cst.SimpleStatementLine, cst.Call]:
        for node in tree.walk(self.source.module):
            if isinstance(node, cst.SimpleStatementLine) and self.source.line(node) == line:
                value = _value(node)
                if isinstance(value, cst.Call) and method_name(value) == method:
                    return node, value
        raise NotPlanned(f"the update is not `x = opt.{method}(...)` on its own line")

    def _between(
        self, gradient: cst.SimpleStatementLine | cst.If, update: cst.SimpleStatementLine
    ) -> None:
        """Statements of the update's block between compute_gradients and apply_gradients whose
        values the update reads (clipping): they move into the replica function with it."""
        plan = self.plan_
        block = list(getattr(self.source.parent(update), "body", ()))
        if gradient not in block:
            raise NotPlanned("compute_gradients is not in the block of apply_gradients")
        between = block[block.index(gradient) + 1 : block.index(update)]
        needed = free_names(plan.update_call)
        if plan.hand_written:  # the update's own set-up (`optimizer = {...}[flag]`) stays put
            needed &= bound_names(gradient)
        for statement in reversed(between):
            if isinstance(statement, cst.SimpleStatementLine) and bound_names(statement) & needed:
                plan.between.insert(0, statement)
                needed |= free_names(statement)
        plan.decide(gradient, Decision(Action.STEP, "the replica's gradients"))
        plan.step_names |= bound_names(gradient)
        for statement in plan.between:
            plan.decide(statement, Decision(Action.STEP, "moved with the update"))
            plan.step_names |= bound_names(statement)

    def _strategy_at_module(self, scope: cst.CSTNode) -> bool:
        """The strategy is made at module level when ``hvd.init()`` is there or Horovod is used
        in functions other than the one that builds the step."""
        for node in tree.walk(self.source.module):
            if isinstance(node, cst.Call) and self.hvd(node) is not None:
                owner = self.source.enclosing_def(node)
                while owner is not None and owner is not scope:
                    owner = self.source.enclosing_def(owner)
                if owner is not scope:
                    return True
        return isinstance(scope, cst.Module)

    def _distributed_optimizer(self) -> None:
        """``opt = hvd.DistributedOptimizer(opt)`` goes; ``hvd.DistributedOptimizer(inner)``
        becomes ``inner``. ``op=hvd.Sum`` keeps the replicas' losses as they are."""
        for statement in self.statements:
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            value = _value(statement)
            if not (isinstance(value, cst.Call) and self.hvd(value) == "DistributedOptimizer"):
                continue
            inner = get_arg(value, 0, "optimizer")
            if inner is None:
                raise NotPlanned("hvd.DistributedOptimizer wraps no optimizer")
            op = get_arg(value, None, "op")
            if op is not None:
                self._reduction(op, statement)
            name = _target_name(statement)
            if isinstance(inner, cst.Name) and inner.value == name:
                self.plan_.decide(statement, Decision(Action.DROP, "the strategy all-reduces"))
            else:
                self.plan_.decide(statement, Decision(Action.OPTIMIZER, value=inner))

    def _reduction(self, op: cst.BaseExpression, statement: cst.SimpleStatementLine) -> None:
        ops = {self.q(n) for n in tree.walk(op) if isinstance(n, cst.Attribute | cst.Name)}
        names = {n.rsplit(".", 1)[1] for n in ops if n is not None and n.startswith("horovod.")}
        if names == {"Sum"}:
            self.plan_.averaged = False
        elif names - {"Average"}:
            self.plan_.notes.append(
                f"line {self.source.line(statement)}: Horovod's "
                f"{' / '.join(sorted(names - {'Average'}))} reduction has no strategy counterpart: "
                "the converted step averages the replicas' gradients (hvd.Average)"
            )

    def _step_runs(self) -> list[cst.Call]:
        runs = []
        for statement in self.statements:
            if isinstance(statement, cst.SimpleStatementLine):
                for call in _calls(statement):
                    fetches = get_arg(call, 0, "fetches")
                    if (
                        method_name(call) == "run"
                        and fetches is not None
                        and free_names(fetches) & self.update_names
                    ):
                        runs.append(call)
        return runs

    def _step_graph(self) -> None:
        """The per-step graph: statements before the update that read the per-step inputs (or
        the trainable variables, for the update's var_list) -- those the loss needs move into
        the replica function; the others have no TF2 place and go under a TODO."""
        plan = self.plan_
        before = self.statements[: self._index(plan.gradient or plan.update)]
        names: set[str] = set()
        candidates: list[cst.SimpleStatementLine] = []
        placeholders: list[str] = []
        for statement in before:
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            value = _value(statement)
            name = _target_name(statement)
            if self._batch(statement, names):
                continue
            if self.call_q(value) in _PLACEHOLDERS and name is not None:
                if not self._movable(statement):
                    raise NotPlanned(f"the placeholder `{name}` is made inside a block")
                plan.inputs.append(name)
                placeholders.append(name)
                names.add(name)
                dtype = get_arg(value, 0, "dtype")  # type: ignore[arg-type]  # the placeholder call is a cst.Call here
                if self.call_q(value) == "tensorflow.placeholder" and dtype is not None:
                    plan.specs[name] = (dtype, get_arg(value, 1, "shape"))  # type: ignore[arg-type]  # the placeholder call is a cst.Call here
                plan.decide(statement, Decision(Action.DROP, "a train step parameter"))
                continue
            reads = free_names(statement) - (
                bound_names(statement) - self._reads_of_value(statement)
            )
            if reads & names or self._reads_trainables(statement):
                candidates.append(statement)
                names |= bound_names(statement)
        needed = free_names(plan.loss) | (free_names(plan.variables) if plan.variables else set())
        needed |= self._read_after_step()
        chosen: list[cst.SimpleStatementLine] = []
        for statement in reversed(candidates):
            if bound_names(statement) & needed and self._movable(statement):
                chosen.insert(0, statement)
                needed |= free_names(statement)
        for statement in candidates:
            if statement in chosen:
                plan.decide(statement, Decision(Action.STEP))
                plan.step.append(statement)
                plan.step_names |= bound_names(statement)
            elif self._reads_trainables(statement) and not free_names(statement) & names:
                continue  # reads the variables at set-up: decided with the rest
            elif (
                function := graph_function.find(
                    statement,
                    candidates[: candidates.index(statement)],
                    lambda s: s in chosen,
                    placeholders,
                    self.scope,
                )
            ) is not None and self._movable(statement):
                plan.functions[function.name] = function
                plan.decide(statement, Decision(Action.GRAPH_FUNCTION))
            else:
                todo = self._tf1_only(statement) or Todo(
                    Leftover.SESSION,
                    "a graph of the per-step inputs the session ran apart from the train step: "
                    "make it a tf.function of its inputs",
                )
                plan.decide(statement, Decision(Action.TODO, todo=todo))
                for bound in bound_names(statement):
                    self.gone.setdefault(bound, todo)
        plan.step_names |= set(plan.inputs)

    def _batch(self, statement: cst.SimpleStatementLine, names: set[str]) -> bool:
        """``x, y = dataset.make_one_shot_iterator().get_next()`` (or through an iterator made on
        the line before): a per-step input the train step is called with, from ``next()``."""
        plan = self.plan_
        value = _value(statement)
        targets = _targets(statement)
        if len(targets) == 1 and isinstance(value, cst.Call) and self._iterator_dataset(value):
            name = _target_name(statement)
            if name is not None:
                self.iterators[name] = statement
            return False
        if not (
            isinstance(value, cst.Call) and method_name(value) == "get_next" and len(targets) == 1
        ):
            return False
        receiver = value.func.value  # type: ignore[attr-defined]  # value is a method call here (checked above)
        if isinstance(receiver, cst.Name) and receiver.value in self.iterators:
            made = self.iterators[receiver.value]
            dataset = self._iterator_dataset(_value(made))
            plan.decide(made, Decision(Action.ITERATOR, value=dataset, name=receiver.value))
            plan.decide(statement, Decision(Action.DROP, "a batch: next(iterator)"))
            iterator = receiver.value
        else:
            dataset = self._iterator_dataset(receiver)
            if dataset is None:
                return False
            iterator = "dataset_iterator"
            plan.decide(statement, Decision(Action.ITERATOR, value=dataset, name=iterator))
        if not self._movable(statement):
            raise NotPlanned("the batch is taken inside a block")
        bound = sorted(free_names(targets[0]))
        plan.inputs.extend(bound)
        names.update(bound)
        plan.batches.append((targets[0], iterator))
        return True

    def _iterator_dataset(self, value: cst.BaseExpression | None) -> cst.BaseExpression | None:
        """The dataset of ``dataset.make_one_shot_iterator()`` /
        ``tf.data.make_one_shot_iterator(dataset)``."""
        if not isinstance(value, cst.Call):
            return None
        if self.call_q(value) == "tensorflow.data.make_one_shot_iterator" and value.args:
            return value.args[0].value
        if method_name(value) == "make_one_shot_iterator" and not value.args:
            return value.func.value  # type: ignore[attr-defined]  # value is a method call here (checked above)
        return None

    def _read_after_step(self) -> set[str]:
        """Names the step's runs fetch and the LoggingTensorHooks log: the train step returns
        them."""
        found: set[str] = set()
        for run in self.runs:
            fetches = get_arg(run, 0, "fetches")
            if fetches is not None:
                found |= free_names(fetches)
        for statement in self.statements:
            for call in _calls(statement):
                if self.call_q(call) == "tensorflow.train.LoggingTensorHook":
                    tensors = get_arg(call, 0, "tensors")
                    if tensors is not None:
                        found |= free_names(tensors)
        return found

    def _tf1_only(self, statement: cst.CSTNode) -> Todo | None:
        return tf1_only(self.call_q(c) for c in _calls(statement))

    def _reads_of_value(self, statement: cst.SimpleStatementLine) -> set[str]:
        value = _value(statement)
        return free_names(value) if value is not None else set()

    def _reads_trainables(self, statement: cst.CSTNode) -> bool:
        return any(self.call_q(c) in _TRAINABLES for c in _calls(statement))

    def _movable(self, statement: cst.CSTNode) -> bool:
        """Only with-blocks (scopes) and the ``__main__`` block lie between the statement and
        the scope: moving it into the replica function changes no control flow."""
        for ancestor in self.source.ancestors(statement):
            if ancestor is self.scope:
                return True
            if isinstance(ancestor, cst.If) and "__main__" not in self.source.module.code_for_node(
                ancestor.test
            ):
                return False
            if isinstance(ancestor, cst.For | cst.While | cst.Try | cst.FunctionDef):
                return False
        return True

    def _index(self, statement: cst.CSTNode) -> int:
        for position, candidate in enumerate(self.statements):
            if candidate is statement:
                return position
        raise NotPlanned("the update is not in the function that builds the step")

    def _inside_decided(self, statement: cst.CSTNode) -> bool:
        for ancestor in self.source.ancestors(statement):
            if ancestor is self.scope:
                return False
            decision = self.plan_.decision(ancestor)
            if decision is not None and decision.action not in (
                Action.KEEP, Action.UNWRAP, Action.MONITORED, Action.STOP_LOOP
            ):  # fmt: skip
                return True
        return False

    def _module_level_horovod(self) -> None:
        """Horovod used in the module's other functions, or at module level outside the scope:
        calls with no strategy counterpart go under a TODO."""
        plan = self.plan_
        for statement in walk_statements(list(self.source.module.body), into_defs=True):
            if plan.decision(statement) is not None or self._in_scope(statement):
                continue
            if self._decided_above(statement):
                continue
            if not isinstance(statement, cst.SimpleStatementLine):
                header = _header_calls(statement)
                todo = self._horovod_todo(header)
                if todo is not None:
                    plan.decide(statement, Decision(Action.TODO, todo=todo))
                continue
            value = _value(statement)
            if isinstance(value, cst.Call) and self.hvd(value) == "init":
                plan.decide(statement, Decision(Action.INIT))
                continue
            todo = self._horovod_todo(list(_calls(statement)))
            if todo is not None:
                plan.decide(statement, Decision(Action.TODO, todo=todo))

    def _in_scope(self, statement: cst.CSTNode) -> bool:
        return (
            self.scope is not self.source.module
            and (statement is self.scope or self.scope in self.source.ancestors(statement))
            or (self.scope is self.source.module and any(s is statement for s in self.statements))
        )

    def _decided_above(self, statement: cst.CSTNode) -> bool:
        return any(
            (d := self.plan_.decision(a)) is not None and d.action is not Action.KEEP
            for a in self.source.ancestors(statement)
        )

    def _horovod_todo(self, calls: list[cst.Call]) -> Todo | None:
        for call in calls:
            api = self.hvd(call)
            if api is not None and api not in MAPPED:
                return Todo(
                    Leftover.GRAPH, f"Horovod `{api}` has no MultiWorkerMirroredStrategy form"
                )
        return None

    # -- one statement -----------------------------------------------------------------------------
    def _decide(self, statement: cst.BaseStatement) -> None:
        plan = self.plan_
        decision = plan.decision(statement)
        if decision is not None:
            if (
                decision.action is Action.TODO
                and decision.todo is not None
                and decision.todo.commented
            ):
                self._gone(statement, decision.todo)
            return
        if isinstance(statement, cst.FunctionDef | cst.ClassDef):
            plan.decide(statement, Decision(Action.KEEP))
            self.live |= {statement.name.value}
            return
        line = simple_line(statement, self._with, self._compound)
        if line is None:
            return
        decision = self._simple(line)
        plan.decide(statement, decision)
        if decision.action is Action.TODO and decision.todo is not None and decision.todo.commented:
            self._gone(statement, decision.todo)
        elif decision.action is Action.DROP:
            self.dropped |= bound_names(statement)
        elif (
            decision.action is not Action.TODO
            or decision.todo is None
            or not decision.todo.commented
        ):
            self.live |= bound_names(statement)

    def _gone(self, statement: cst.CSTNode, todo: Todo) -> None:
        for name in bound_names(statement):
            if name not in self.live:  # another definition stays live
                self.gone.setdefault(name, todo)

    def _with(self, statement: cst.With) -> None:
        plan = self.plan_
        items = [item.item for item in statement.items]
        if all(self.call_q(item) in _SESSIONS for item in items):
            self.sessions |= with_names(statement)
            plan.decide(statement, Decision(Action.UNWRAP, "the session goes"))
            return
        if len(items) == 1 and self.call_q(items[0]) in _MONITORED:
            self.sessions |= with_names(statement)
            self._monitored(statement, items[0])
            return
        if all(self._graph_wrapper(item) for item in items):
            plan.decide(
                statement, Decision(Action.UNWRAP, "TF2 runs eagerly: no graph to build in")
            )
            return
        body = list(_body(statement))
        inner = list(walk_statements(body, into_defs=False))
        if (
            inner
            and all(
                (d := plan.decision(s)) is not None and d.action in (Action.DROP, Action.STEP)
                for s in inner
                if isinstance(s, cst.SimpleStatementLine)
            )
            and all(isinstance(s, cst.SimpleStatementLine) for s in inner)
        ):
            plan.decide(statement, Decision(Action.DROP, "its statements moved or went"))
            return
        self._compound(statement)

    def _graph_wrapper(self, item: cst.BaseExpression) -> bool:
        """``tf.Graph().as_default()``, ``graph.as_default()``, ``tf.device(...)``: the strategy
        places the replicas (a device Horovod pinned per process goes, with a note)."""
        if not isinstance(item, cst.Call):
            return False
        if method_name(item) == "as_default" and not item.args:
            return True
        if self.call_q(item) != "tensorflow.device":
            return False
        if any(self.hvd(c) == "local_rank" for c in _calls(item)):
            self.plan_.notes.append(
                f"line {self.source.line(item)}: the device pinned with hvd.local_rank() went: "
                "the strategy places each replica"
            )
        return True

    def _monitored(self, statement: cst.CSTNode, call: cst.BaseExpression) -> None:
        plan = self.plan_
        assert isinstance(call, cst.Call)
        plan.decide(statement, Decision(Action.MONITORED))
        directory = get_arg(call, None, "checkpoint_dir")
        if directory is not None and not (
            isinstance(directory, cst.Name) and directory.value == "None"
        ):
            plan.checkpoint_dir = directory
        hooks = get_arg(call, None, "hooks")
        left = self._hooks(hooks) if isinstance(hooks, cst.List | cst.Tuple) else []
        for arg in call.args:
            keyword = arg.keyword.value if arg.keyword is not None else None
            if keyword not in (None, "checkpoint_dir", "hooks", "config", "is_chief", "master"):
                left.append(f"{keyword}={self.source.src(arg.value, 30)}")
        if left:
            plan.session_todo = Todo(
                Leftover.SESSION,
                f"MonitoredTrainingSession's {', '.join(left)}: no TF2 form here, do it in the loop",
                commented=False,
            )

    def _hooks(self, hooks: cst.List | cst.Tuple) -> list[str]:
        """The hooks the loop does itself: the broadcast goes, StopAtStepHook bounds the loop,
        LoggingTensorHook prints. The names of the others are returned."""
        plan = self.plan_
        unknown = []
        for element in hooks.elements:
            hook = element.value
            if not isinstance(hook, cst.Call):
                unknown.append(self.source.src(hook, 40))
                continue
            api = self.hvd(hook)
            name = self.call_q(hook)
            if api == "BroadcastGlobalVariablesHook":
                continue
            if name == "tensorflow.train.StopAtStepHook":
                last = get_arg(hook, 1, "last_step")
                if last is None or plan.global_step is None:
                    unknown.append(
                        "StopAtStepHook(num_steps=...)"
                        if last is None
                        else "StopAtStepHook without a global step"
                    )
                else:
                    plan.last_step = last
                continue
            if name == "tensorflow.train.LoggingTensorHook":
                tensors = get_arg(hook, 0, "tensors")
                every = get_arg(hook, 1, "every_n_iter")
                if isinstance(tensors, cst.Dict) and every is not None:
                    plan.logging = Logging(tensors, every)
                    continue
            unknown.append(self.source.src(hook.func, 40))
        return unknown

    def _compound(self, statement: cst.BaseStatement) -> None:
        plan = self.plan_
        header = _header(statement)
        reads = set().union(*(free_names(node) for node in header)) if header else set()
        if isinstance(statement, cst.While) and self._should_stop(statement.test):
            plan.decide(statement, Decision(Action.STOP_LOOP))
            return
        gone = gone_reads(reads, self.sessions, self.gone)
        if gone is None:
            gone = self._horovod_todo([c for node in header for c in _calls(node)])
        if gone is not None:
            plan.decide(statement, Decision(Action.TODO, todo=gone))
            self._gone(statement, gone)
            return
        plan.decide(statement, Decision(Action.KEEP))
        self.live |= _loop_targets(statement)

    def _should_stop(self, test: cst.BaseExpression) -> bool:
        if not isinstance(test, cst.UnaryOperation) or not isinstance(test.operator, cst.Not):
            return False
        return method_receiver(test.expression, "should_stop", self.sessions) is not None

    def _simple(self, statement: cst.SimpleStatementLine) -> Decision:
        plan = self.plan_
        value = _value(statement)
        name = _target_name(statement)
        called = self.call_q(value)
        api = self.hvd(value) if isinstance(value, cst.Call) else None
        reads = free_names(value) if value is not None else free_names(statement)
        if isinstance(statement.body[0], cst.Assign):
            reads |= _subscript_reads(statement)
        if api == "init":
            return Decision(Action.INIT)
        if api in _BROADCASTS:
            return Decision(Action.DROP, "the strategy makes every worker's variables the same")
        if self._pinning(statement):
            plan.notes.append(
                f"line {self.source.line(statement)}: the GPU pinning with hvd.local_rank() went: "
                "a MultiWorkerMirroredStrategy worker uses the GPUs it sees (one per worker "
                "process, as Horovod had, when each worker process sees one)"
            )
            return Decision(Action.DROP, "Horovod's GPU pinning")
        if called in _SESSIONS and name is not None:
            self.sessions.add(name)
            return Decision(Action.DROP, "TF2 runs eagerly: no session")
        if called in _MONITORED and name is not None and value is not None:
            self.sessions.add(name)
            self.monitored.add(name)
            self._monitored(statement, value)
            return Decision(Action.MONITORED)
        if method_receiver(_value(statement), "close", self.monitored) is not None:
            return Decision(Action.SAVE_AT_CLOSE)
        if called in _GRAPH_MODE:
            return Decision(Action.DROP, "the converted program runs eagerly, as TF2 does")
        if called in _INITIALIZERS:
            if name is not None:
                self.dropped.add(name)
            return Decision(Action.DROP, "variables are initialized when made")
        if called in _GLOBAL_STEP:
            return Decision(Action.STORE_SCOPE)
        unknown = self._hooks_list(statement)
        if unknown == []:
            return Decision(Action.DROP, "the loop does what the hooks did")
        if unknown:
            return Decision(Action.TODO, todo=Todo(
                Leftover.SESSION, f"session hooks with no TF2 form ({', '.join(unknown)}): do "
                "what they did in the loop (the broadcast, StopAtStepHook and LoggingTensorHook "
                "are converted)"))  # fmt: skip
        run = receiver_call(statement, self.sessions | self.dropped, ("run",))
        if run is not None:
            return self._run(statement, run)
        if session_method(_value(statement), self.sessions):
            return Decision(Action.DROP, "the session goes")
        saver = saver_action(statement, called, name, self.savers)
        if isinstance(saver, Todo):
            return Decision(Action.TODO, todo=saver)
        if saver is not None:
            return Decision(Action[saver])
        if reads & self.dropped and not reads - self.dropped - self.live - _BUILTINS:
            return Decision(Action.DROP, "uses only what went")
        todo = self._tf1_only(statement) or gone_reads(reads, self.sessions, self.gone)
        if todo is not None:
            return Decision(Action.TODO, todo=todo)
        horovod = self._horovod_todo(list(_calls(statement)))
        if horovod is not None:
            return Decision(Action.TODO, todo=horovod)
        step = reads & plan.step_names
        if step:
            why = "a value of the per-step graph: it now lives in the train step"
            return Decision(Action.TODO, todo=reads_todo(step, why))
        return Decision(Action.KEEP)

    def _pinning(self, statement: cst.SimpleStatementLine) -> bool:
        small = statement.body[0]
        if not isinstance(small, cst.Assign):
            return False
        target = small.targets[0].target
        text = self.source.module.code_for_node(target)
        return "visible_device_list" in text and any(
            self.hvd(c) == "local_rank" for c in _calls(small.value)
        )

    def _hooks_list(self, statement: cst.SimpleStatementLine) -> list[str] | None:
        """A list of session hooks: the hooks the loop cannot do (None: not a hooks list)."""
        value = _value(statement)
        if not isinstance(value, cst.List | cst.Tuple) or _target_name(statement) is None:
            return None
        hooks = [e.value for e in value.elements]
        if not hooks or not all(
            isinstance(h, cst.Call)
            and (
                self.hvd(h) == "BroadcastGlobalVariablesHook"
                or (self.call_q(h) or "").endswith("Hook")
            )
            for h in hooks
        ):
            return None
        return self._hooks(value)

    def _run(self, statement: cst.SimpleStatementLine, run: cst.Call) -> Decision:
        func = run.func
        assert isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)
        if func.value.value in self.dropped:  # bcast.run()
            return Decision(Action.DROP, "the broadcast goes")
        fetches = get_arg(run, 0, "fetches")
        if fetches is None:
            return Decision(Action.TODO, todo=session_run_todo(run=True))
        names = free_names(fetches)
        if run in self.runs and _value(statement) is run:
            return self._step_run(statement, run, fetches)
        picked = _picked_fetch(statement, run)
        if run in self.runs and picked is not None and isinstance(fetches, cst.List | cst.Tuple):
            # `return sess.run([train_op, loss], feed)[1]`: the train step returns that fetch
            if not 0 <= picked < len(fetches.elements):
                raise NotPlanned("the training step's run picks a fetch it does not make")
            element = fetches.elements[picked].value
            decision = self._step_run(statement, run, element)
            assert decision.run is not None
            returned = isinstance(statement.body[0], cst.Return)
            return replace(decision, run=replace(decision.run, returned=returned))
        if (
            (names and names <= self.dropped)
            or any(
                self.call_q(c) in _INITIALIZERS or self.hvd(c) in _BROADCASTS
                for c in _calls(fetches)
            )
            or self.call_q(fetches) in _INITIALIZERS
        ):
            return Decision(Action.DROP, "initializers and the broadcast go")
        function = (
            self.plan_.functions.get(fetches.value) if isinstance(fetches, cst.Name) else None
        )
        if function is not None and graph_function.run_feed(run) == set(function.params):
            return Decision(Action.GRAPH_CALL)
        return Decision(Action.TODO, todo=session_run_todo())

    def _step_run(
        self, statement: cst.SimpleStatementLine, run: cst.Call, fetches: cst.BaseExpression
    ) -> Decision:
        single = not isinstance(fetches, cst.List | cst.Tuple)
        elements = [fetches] if single else [e.value for e in fetches.elements]  # type: ignore[attr-defined]  # fetches is a list or tuple when not single
        kept: list[cst.BaseExpression | None] = []
        gone: list[str] = []
        for element in elements:
            names = free_names(element)
            if isinstance(element, cst.Name) and element.value in self.update_names:
                kept.append(None)
                continue
            if names & set(self.gone) or names & self.dropped:
                # its definition went under a TODO: the train step gives None in its place
                gone.append(sorted(names & (set(self.gone) | self.dropped))[0])
                kept.append(None)
                continue
            kept.append(element)
        arguments = self._arguments(run)
        if arguments is None:
            raise NotPlanned(
                "the training step's feed is not a dict of its placeholders" + self._foreign(run)
            )
        targets = _targets(statement)
        todo = None
        if gone:
            todo = Todo(
                Leftover.CASCADE,
                f"fetched {', '.join(f'`{n}`' for n in gone)}, left under a TODO above: None now",
                commented=False,
            )
        return Decision(
            Action.STEP_RUN,
            todo=todo,
            run=StepRun(
                tuple(kept), single, tuple(arguments), targets[0] if len(targets) == 1 else None
            ),
        )

    def _foreign(self, run: cst.Call) -> str:
        """The fed keys that are no placeholder made where the step is built, named."""
        feed = get_arg(run, 1, "feed_dict")
        items = feed_items(feed) if isinstance(feed, cst.Dict) else None
        if isinstance(feed, cst.Dict) and items is None:
            keys = [
                self.source.src(e.key, 30) for e in feed.elements if isinstance(e, cst.DictElement)
            ]
        else:
            keys = [key for key, _ in items or [] if key not in self.plan_.inputs]
        if not keys:
            return ""
        return (
            f" ({', '.join(f'`{k}`' for k in keys)}: made by the caller of the function that "
            "builds the step, not converted yet)"
        )

    def _arguments(self, run: cst.Call) -> list[tuple[str, cst.BaseExpression]] | None:
        feed = get_arg(run, 1, "feed_dict")
        given: dict[str, cst.BaseExpression] = {}
        if isinstance(feed, cst.Dict):
            items = feed_items(feed)
            if items is None or any(key not in self.plan_.inputs for key, _ in items):
                return None
            given.update(items)
        elif feed is not None:
            return None
        batched = {n for target, _ in self.plan_.batches for n in free_names(target)}
        if set(given) | batched != set(self.plan_.inputs) or set(given) & batched:
            return None
        return [(name, given[name]) for name in self.plan_.inputs if name in given]


_BUILTINS = frozenset({"None", "True", "False", "str", "int", "float", "len", "print"})


def _header_calls(statement: cst.BaseStatement) -> list[cst.Call]:
    return [c for node in _header(statement) for c in _calls(node)]


def _loop_targets(statement: cst.BaseStatement) -> set[str]:
    if isinstance(statement, cst.For):
        return free_names(statement.target)
    if isinstance(statement, cst.With):
        return {
            n
            for item in statement.items
            if item.asname is not None
            for n in free_names(item.asname.name)
        }
    return set()


def _picked_fetch(statement: cst.SimpleStatementLine, run: cst.Call) -> int | None:
    """``i`` when the statement is ``return run[i]`` / ``x = run[i]`` (one constant index)."""
    small = statement.body[0]
    value = small.value if isinstance(small, cst.Return | cst.Assign | cst.Expr) else None
    if not (isinstance(value, cst.Subscript) and value.value is run and len(value.slice) == 1):
        return None
    index = value.slice[0].slice
    if isinstance(index, cst.Index) and isinstance(index.value, cst.Integer):
        return int(index.value.value)
    return None
