"""The emit stage for Horovod TF1 programs: a HorovodPlan written into the module -- the strategy
where ``hvd.init()`` was, the per-step graph as the replica function of one ``@tf.function``
train step (a ``GradientTape``, ``apply_gradients`` of the unwrapped optimizer), the step's run
as a call of it, the session hooks as the loop's bound, a print and a CheckpointManager, and
every statement left to the user under its TODO.

Emission never refuses: everything it needs was decided by the plan."""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst
from libcst.helpers import parse_template_expression, parse_template_statement

from tfmigrate.convert import graph_function, ir
from tfmigrate.convert.emit import (
    _TODO_NAME,
    Emitted,
    _BlockPass,
    _Commented,
    _dedented_body,
    _is_named,
    _left,
    _marked,
    _SaverCall,
    _trailing,
    _with_store,
)
from tfmigrate.convert.horovod_plan import MAPPED, Action, HorovodPlan, horovod_api, plan_horovod
from tfmigrate.convert.plan import NotPlanned
from tfmigrate.convert.project import SourceFile
from tfmigrate.convert.todo import Leftover, Todo
from tfmigrate.names import NameResolver
from tfmigrate.rule import RuleContext
from tfmigrate.rules._towers import bound_names, free_names

_RESERVED = frozenset(
    {"strategy", "tf1_variables", "train_step", "replica_step", "outputs", "tape", "variables",
     "gradients", "replica_loss", "TF1Variables", "checkpoint", "checkpoint_manager",
     "logged_tensors", "logging_iteration", "update_state", "UpdateState"}
)  # fmt: skip
_TRAINABLES = ("tensorflow.trainable_variables", "tensorflow.compat.v1.trainable_variables")


_PINNING = (
    "the GPU pinning with hvd.local_rank() went: a MultiWorkerMirroredStrategy worker uses the "
    "GPUs it sees (one per worker process, as Horovod had, when each worker process sees one)"
)


def convert_horovod_module(context: RuleContext) -> Emitted | str:
    """The staged conversion of the Horovod TF1 program in the file ``context`` holds: read
    (with the repo modules it imports, from disk), plan, emit. A string says why not."""
    from tfmigrate.convert import first_converted, read_staged

    unpinned = _unpinned(context)
    read = read_staged(unpinned)
    if isinstance(read, str):
        return read
    source, program = read
    cores = [
        c
        for c in program.cores
        if c.towers is None and c.combination.kind is ir.CombineKind.HOROVOD
    ]
    emitted = first_converted(
        cores,
        lambda core: emit_horovod(plan_horovod(source, program, core)),
        "no Horovod core in this file",
    )
    if isinstance(emitted, str):
        return emitted
    notes = emitted.notes
    if unpinned is not context:
        notes = [_PINNING, *notes]
    return Emitted(_tf2_spellings(context, emitted.module), emitted.todos, notes)


def _tf2_spellings(context: RuleContext, module: cst.Module) -> cst.Module:
    """TF1 names on tf.compat.v1 (TFM301's fixes), tf.compat.v1.layers from tf_keras: what the
    whole-program rewrites do to the code they keep."""
    from tfmigrate.rules import tower_program

    module = module.visit(_Tf2Import())
    renamed = tower_program._renamed(
        RuleContext(context.path, NameResolver.for_module(module), module, context.options)
    )
    return tower_program._v1_layers_to_tf_keras(renamed)


class _Tf2Import(cst.CSTTransformer):
    """``import tensorflow.compat.v1 as tf`` -> ``import tensorflow as tf``: the new code is TF2's;
    the TF1 code it keeps is then spelled on tf.compat.v1 name by name (TFM301)."""

    def leave_Import(self, original_node, updated_node):
        names = [
            alias.with_changes(name=cst.Name("tensorflow"))
            if _dotted(alias.name) == "tensorflow.compat.v1" and alias.asname is not None
            else alias
            for alias in updated_node.names
        ]
        return updated_node.with_changes(names=names)


def _unpinned(context: RuleContext) -> RuleContext:
    """The file without Horovod's GPU pinning (``visible_device_list = str(hvd.local_rank())``):
    the session's other device settings then move to tf.config (TFM105's rewrite)."""

    class _Unpin(cst.CSTTransformer):
        def leave_SimpleStatementLine(self, original_node, updated_node):
            small = original_node.body[0]
            if isinstance(small, cst.Assign) and "visible_device_list" in cst.Module(
                []
            ).code_for_node(small.targets[0].target):
                calls = [n for n in _walk(small.value) if isinstance(n, cst.Call)]
                if any(
                    (context.resolver.qualify(c.func) or "").endswith(".local_rank") for c in calls
                ):
                    return cst.RemoveFromParent()
            return updated_node

    module = context.module.visit(_Unpin())
    if module.deep_equals(context.module):
        return context
    return RuleContext(context.path, context.resolver, module, context.options)


_BLANK_NAME = "__tfmigrate_blank__"


def _carried(statement: cst.CSTNode) -> cst.CSTNode | cst.RemovalSentinel:
    """A removed statement's blank lines stay (``_Blanks`` gives them to the next statement);
    its comments go with it."""
    blank = [line for line in getattr(statement, "leading_lines", ()) if line.comment is None]
    if not blank:
        return cst.RemoveFromParent()
    return cst.SimpleStatementLine(body=[cst.Expr(cst.Name(_BLANK_NAME))], leading_lines=blank)


class _Blanks(_BlockPass):
    """Blank lines of removed statements before the next statement: as many as the most any
    of them had, not their sum."""

    def _fold(self, body: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        carried = 0
        for statement in body:
            if _is_named(statement, _BLANK_NAME):
                assert isinstance(statement, cst.SimpleStatementLine)
                carried = max(carried, len(statement.leading_lines))
                continue
            if carried:
                lines = list(getattr(statement, "leading_lines", ()))
                own = next(
                    (i for i, line in enumerate(lines) if line.comment is not None), len(lines)
                )
                extra = max(0, carried - own)
                blank = cst.EmptyLine(indent=False)
                statement = statement.with_changes(leading_lines=[*[blank] * extra, *lines])
                carried = 0
            out.append(statement)
        if not out:
            out.append(cst.SimpleStatementLine([cst.Pass()]))
        return out


def _carried_statement(statement: cst.CSTNode) -> cst.BaseStatement:
    """A `pass` holding a removed statement's blank lines (a FlattenSentinel cannot be empty
    where a block would be)."""
    blank = [line for line in getattr(statement, "leading_lines", ()) if line.comment is None]
    return cst.SimpleStatementLine(body=[cst.Expr(cst.Name(_TODO_NAME))], leading_lines=blank)


def _walk(node: cst.CSTNode) -> list[cst.CSTNode]:
    found, stack = [], [node]
    while stack:
        current = stack.pop()
        found.append(current)
        stack.extend(current.children)
    return found


def emit_horovod(plan: HorovodPlan) -> Emitted:
    reserved = _RESERVED - {"gradients", "variables"} if plan.hand_written else _RESERVED
    clash = reserved & _names(plan.scope)
    if clash:
        raise NotPlanned(f"the program already uses `{sorted(clash)[0]}`")
    writer = _Writer(plan)
    module = plan.source.module.visit(writer)
    assert isinstance(module, cst.Module)
    if not writer.strategy_made:
        module = _strategy_at_top(module, plan.hand_written)
    module = module.visit(_Horovod(plan.source))
    module = _with_store(module, plan.hand_written)
    module = module.visit(_Blanks()).visit(_Commented())
    if plan.inputs:
        writer.notes.append(
            "each replica gets the batch its worker feeds the train step, as each Horovod "
            "process fed its own: run one replica per worker (one GPU per worker process)"
        )
    writer.notes.append(
        "hvd.rank() and hvd.local_rank() became the worker's task id (0 without TF_CONFIG; "
        "the chief is task 0), hvd.size() strategy.num_replicas_in_sync"
    )
    built = sorted(
        {
            api
            for n in _walk(plan.source.module)
            if isinstance(n, cst.Call)
            and (api := horovod_api(plan.source, n)) in ("nccl_built", "cuda_built", "rocm_built")
        }
    )
    if built:
        writer.notes.append(
            f"hvd.{'(), hvd.'.join(built)}() (how Horovod was built) became how TensorFlow was "
            "built: the strategy's all-reduce uses NCCL on GPUs when TensorFlow has CUDA"
        )
    return Emitted(module, writer.todos, [*plan.notes, *writer.notes])


def _names(node: cst.CSTNode) -> set[str]:
    """The names ``node`` reads or binds (an attribute's name, ``tf.gradients``, is none)."""
    attributes = {id(n.attr) for n in _walk(node) if isinstance(n, cst.Attribute)}
    names = {n.value for n in _walk(node) if isinstance(n, cst.Name) and id(n) not in attributes}
    return names | bound_names(node)


# -- pieces of new code ---------------------------------------------------------------------------
def _statement(code: str, **values: cst.CSTNode) -> cst.BaseStatement:
    if values:
        return parse_template_statement(code, **values)  # type: ignore[arg-type]  # template values are libcst nodes
    return cst.parse_statement(code)


def _comment(text: str) -> cst.EmptyLine:
    return cst.EmptyLine(comment=cst.Comment(f"# {text}"))


def _strategy_lines(
    leading: list[cst.EmptyLine] | None = None, hand_written: bool = False
) -> list[cst.BaseStatement]:
    first = _statement("strategy = tf.distribute.MultiWorkerMirroredStrategy()")
    first = first.with_changes(
        leading_lines=[
            *(leading or []),
            _comment("One process per machine (not per GPU): the cluster comes from TF_CONFIG."),
        ]
    )
    return [first, *_store_lines(hand_written)]


def _store_lines(hand_written: bool) -> list[cst.BaseStatement]:
    lines = [_statement("tf1_variables = TF1Variables(strategy)")]
    if hand_written:
        lines.append(_statement("update_state = UpdateState()"))
    return lines


def _entry_strategy_lines(hand_written: bool) -> list[cst.BaseStatement]:
    """The step is built in a module the entry calls: the strategy the entry made."""
    first = _statement("strategy = tf.distribute.get_strategy()").with_changes(
        leading_lines=[_comment("The MultiWorkerMirroredStrategy the entry script made.")]
    )
    return [first, *_store_lines(hand_written)]


def _strategy_at_top(module: cst.Module, hand_written: bool = False) -> cst.Module:
    """``hvd.init()`` ran in a function other than the step's, or Horovod is used in several:
    the strategy is made at module level, after the imports and the module's constants."""
    body = list(module.body)
    at = 0
    for position, statement in enumerate(body):
        if isinstance(statement, cst.FunctionDef | cst.ClassDef | cst.If):
            break
        at = position + 1
    lines = _strategy_lines([cst.EmptyLine(), cst.EmptyLine()], hand_written)
    return module.with_changes(body=[*body[:at], *lines, *body[at:]])


class _Horovod(cst.CSTTransformer):
    """Horovod's own calls spelled with the strategy; its imports go."""

    def __init__(self, source: SourceFile) -> None:
        self.source = source

    def leave_Arg(self, original_node, updated_node):
        value = updated_node.value
        if (
            isinstance(value, cst.BooleanOperation)
            and value.lpar
            and _is_mapped(original_node.value, self.source)
        ):
            return updated_node.with_changes(value=value.with_changes(lpar=[], rpar=[]))
        return updated_node

    def leave_Call(self, original_node, updated_node):
        api = horovod_api(self.source, original_node)
        if api in MAPPED and not original_node.args:
            return cst.parse_expression(MAPPED[api])
        return updated_node

    def leave_SimpleStatementLine(self, original_node, updated_node):
        small = original_node.body[0]
        if isinstance(small, cst.Import) and all(
            _dotted(a.name).startswith("horovod") for a in small.names
        ):
            return cst.RemoveFromParent()
        if (
            isinstance(small, cst.ImportFrom)
            and small.module is not None
            and (_dotted(small.module).startswith("horovod"))
        ):
            return cst.RemoveFromParent()
        return updated_node


def _is_mapped(node: cst.CSTNode, source: SourceFile) -> bool:
    return isinstance(node, cst.Call) and horovod_api(source, node) in MAPPED


def _dotted(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


class _StepNumber(cst.CSTTransformer):
    """``saver.save(..., global_step=global_step)``: the file is named by the step's number
    (the variable's value), as the Saver named it."""

    def __init__(self, step: cst.BaseExpression | None) -> None:
        self.step = step

    def leave_Arg(self, original_node, updated_node):
        keyword = updated_node.keyword
        if (
            self.step is not None
            and keyword is not None
            and keyword.value == "global_step"
            and updated_node.value.deep_equals(self.step)
        ):
            number = cst.Call(cst.Attribute(updated_node.value, cst.Name("numpy")))
            return updated_node.with_changes(value=number)
        return updated_node


class _Trainables(cst.CSTTransformer):
    def __init__(self, source: SourceFile, as_list: bool = False) -> None:
        self.source = source
        # a list, as tf.trainable_variables() was: a hand-written update may test for one
        self.as_list = as_list

    def leave_Call(self, original_node, updated_node):
        if self.source.qualify(original_node.func) in _TRAINABLES:
            if self.as_list:
                return cst.parse_expression("list(tf1_variables.trainable_variables)")
            return cst.parse_expression("tf1_variables.trainable_variables")
        return updated_node


# -- the module -----------------------------------------------------------------------------------
class _Writer(cst.CSTTransformer):
    def __init__(self, plan: HorovodPlan) -> None:
        self.plan = plan
        self.source = plan.source
        self.module = plan.source.module
        self.todos: list[Todo] = []
        self.notes: list[str] = []
        self.strategy_made = False
        self.outputs = self._outputs()
        self.logging_loop = self._logging_loop()

    def _logging_loop(self) -> cst.CSTNode | None:
        """The loop around the step's run: LoggingTensorHook's count starts before it."""
        if self.plan.logging is None:
            return None
        for node in _walk(self.plan.scope):
            decision = self.plan.decision(node)
            if decision is not None and decision.action is Action.STEP_RUN:
                for ancestor in self.source.ancestors(node):
                    if isinstance(ancestor, cst.For | cst.While):
                        return ancestor
        return None

    def on_visit(self, node: cst.CSTNode) -> bool:
        decision = self.plan.decision(node)
        if decision is not None and decision.action in (
            Action.TRAIN_STEP,
            Action.TODO,
            Action.STEP,
        ):
            return decision.action is Action.TODO and not decision.todo.commented  # type: ignore[union-attr]  # a TODO decision always carries its Todo
        return True

    def on_leave(self, original_node, updated_node):
        result = self._leave(original_node, updated_node)
        if original_node is self.logging_loop and isinstance(result, cst.CSTNode):
            count = _statement("logging_iteration = 0").with_changes(
                leading_lines=getattr(result, "leading_lines", ())
            )
            return cst.FlattenSentinel([count, result.with_changes(leading_lines=())])
        return result

    def _leave(self, original_node, updated_node):
        if isinstance(updated_node, cst.IndentedBlock) and not updated_node.body:
            return updated_node.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
        if original_node is self.plan.scope:
            updated_node = updated_node.visit(_Trainables(self.source, self.plan.hand_written))
            if self.plan.strategy_from_entry and isinstance(updated_node, cst.FunctionDef):
                self.strategy_made = True
                body = list(updated_node.body.body)
                lines = _entry_strategy_lines(self.plan.hand_written)
                updated_node = updated_node.with_changes(
                    body=updated_node.body.with_changes(body=[*lines, *body])
                )
        decision = self.plan.decision(original_node)
        if decision is None:
            return updated_node
        action = decision.action
        if action in (Action.DROP, Action.STEP):
            return _carried(original_node)
        if action is Action.TODO:
            assert decision.todo is not None
            return _left(original_node, updated_node, decision.todo, self.todos, self.module)
        if action is Action.INIT:
            if (
                self.plan.strategy_at_module
                and self.source.enclosing_def(original_node) is not None
            ):
                return cst.RemoveFromParent()
            self.strategy_made = True
            return cst.FlattenSentinel(
                _strategy_lines(list(original_node.leading_lines), self.plan.hand_written)
            )
        if action is Action.OPTIMIZER:
            assert decision.value is not None
            small = updated_node.body[0]
            return updated_node.with_changes(body=[small.with_changes(value=decision.value)])
        if action is Action.ITERATOR:
            assert decision.value is not None
            return _statement(
                f"{decision.name} = iter({{dataset}})", dataset=decision.value
            ).with_changes(leading_lines=original_node.leading_lines)
        if action is Action.STORE_SCOPE:
            return cst.With(
                items=[cst.WithItem(cst.parse_expression("tf1_variables.scope()"))],
                body=cst.IndentedBlock([updated_node.with_changes(leading_lines=[])]),
                leading_lines=[
                    *original_node.leading_lines,
                    _comment("Made once, mirrored, through the TF1Variables store."),
                ],
            )
        if action is Action.UNWRAP:
            return cst.FlattenSentinel(_dedented_body(updated_node, original_node))
        if action is Action.MONITORED:
            lines = self._monitored(updated_node, original_node)
            todo = self.plan.session_todo
            if todo is not None:
                self.todos.append(todo)
                lines[0] = _trailing(lines[0], todo)
            return cst.FlattenSentinel(lines)
        if action is Action.SAVE_AT_CLOSE:
            if self.plan.checkpoint_dir is None:
                return _carried(original_node)
            return self._final_save().with_changes(leading_lines=original_node.leading_lines)
        if action is Action.STOP_LOOP:
            return self._stop_loop(updated_node)
        if action is Action.CHECKPOINT:
            return self._checkpoint(updated_node)
        if action is Action.SAVER_CALL:
            return updated_node.visit(_StepNumber(self.plan.global_step)).visit(_SaverCall())
        if action is Action.STEP_RUN:
            lines = self._step_call(updated_node, decision)
            if decision.todo is not None:
                self.todos.append(decision.todo)
                position = len(self.plan.batches)  # after the next() of each batch
                lines[position] = _trailing(lines[position], decision.todo)
            return cst.FlattenSentinel(lines)
        if action is Action.TRAIN_STEP:
            return cst.FlattenSentinel(self._train_step(original_node))
        if action is Action.GRAPH_FUNCTION:
            after = cst.SimpleStatementLine(
                body=[cst.Expr(cst.Name(_BLANK_NAME))], leading_lines=[cst.EmptyLine(indent=False)]
            )  # a blank line after the def
            return cst.FlattenSentinel([self._graph_function(original_node), after])
        if action is Action.GRAPH_CALL:
            return updated_node.visit(graph_function.RunCall(self.plan.functions))
        return updated_node

    def _graph_function(self, original_node: cst.CSTNode) -> cst.FunctionDef:
        """A graph the session ran apart from the train step, fed the step's placeholders: a
        tf.function of them (the model code it needs repeated, its variables from the store)."""
        plan = self.plan
        (function,) = [f for f in plan.functions.values() if f.made is original_node]
        trainables = _Trainables(self.source, plan.hand_written)
        self.notes.append(
            f"`{function.name}`, which the session ran apart from the train step, is a "
            "tf.function of the placeholders its runs fed; each run is a call of it"
        )
        return graph_function.function_def(
            function,
            graph_function.signature(function.params, plan.specs),
            lambda s: _visited(s, trainables),
        )

    # -- set-up ------------------------------------------------------------------------------------
    def _checkpoint(self, updated_node):
        small = updated_node.body[0]
        value = parse_template_expression(
            "tf.train.Checkpoint(model=tf1_variables, optimizer={optimizer})",
            optimizer=self.plan.optimizer,
        )
        self.notes.append(
            "tf.train.Saver became tf.train.Checkpoint (object-based: a TF1 checkpoint is read "
            "after `tfmigrate convert-checkpoint`)"
        )
        return updated_node.with_changes(body=[small.with_changes(value=value)])

    def _monitored(self, updated_node, original_node) -> list[cst.BaseStatement]:
        made = isinstance(original_node, cst.SimpleStatementLine)  # `sess = MTS(...)`
        body = [] if made else _dedented_body(updated_node, original_node)
        directory = self.plan.checkpoint_dir
        if directory is None:
            return body or [_carried_statement(original_node)]
        if not made:
            body = list(updated_node.body.body)  # its leading lines go to the checkpoint lines
        before = [
            _statement(
                "checkpoint = tf.train.Checkpoint(model=tf1_variables, optimizer={optimizer})",
                optimizer=self.plan.optimizer,
            ).with_changes(
                leading_lines=[
                    *original_node.leading_lines,
                    _comment("MonitoredTrainingSession(checkpoint_dir=...) restored the latest"),
                    _comment("checkpoint and saved as it trained: the chief's CheckpointManager."),
                ]
            ),
            _statement("checkpoint_manager = None"),
            _statement(
                "if {directory} is not None:\n"
                "    checkpoint_manager = tf.train.CheckpointManager(checkpoint, {directory}, max_to_keep=5)\n"
                "    checkpoint.restore(checkpoint_manager.latest_checkpoint)\n",
                directory=directory,
            ),
        ]
        self.notes.append(
            "the checkpoints MonitoredTrainingSession wrote every 10 minutes are one "
            "CheckpointManager save at the end (only where checkpoint_dir is set: the chief)"
        )
        if made:
            return before
        return [*before, *body, self._final_save()]

    def _final_save(self) -> cst.BaseStatement:
        step = self.plan.global_step
        save = (
            "checkpoint_manager.save()"
            if step is None
            else "checkpoint_manager.save(checkpoint_number={step})"
        )
        return _statement(
            f"if checkpoint_manager is not None:\n    {save}\n",
            **({"step": step} if step is not None else {}),
        )

    def _stop_loop(self, updated_node):
        plan = self.plan
        step = plan.global_step
        if plan.last_step is None or step is None:
            why = "the MonitoredTrainingSession's hooks ended this loop: bound it"
            unbound = updated_node.with_changes(test=cst.Name("True"))
            return _marked(unbound, Leftover.SESSION, why, self.todos)
        test = parse_template_expression("{step}.numpy() < {last}", step=step, last=plan.last_step)
        loop = updated_node.with_changes(test=test)
        return loop

    # -- the step's run ----------------------------------------------------------------------------
    def _step_call(self, updated_node, decision) -> list[cst.BaseStatement]:
        run = decision.run
        assert run is not None
        batched = [
            (name, cst.Name(name))
            for target, _ in self.plan.batches
            for name in sorted(free_names(target))
        ]
        call = cst.Call(
            cst.Name("train_step"),
            [
                cst.Arg(value, keyword=cst.Name(name), equal=_equal())
                for name, value in [*run.arguments, *batched]
            ],
        )
        taken: list[cst.BaseStatement] = [
            _statement("{target} = next({iterator})", target=target, iterator=cst.Name(iterator))
            for target, iterator in self.plan.batches
        ]
        if taken:
            taken[0] = taken[0].with_changes(leading_lines=updated_node.leading_lines)
            updated_node = updated_node.with_changes(leading_lines=[])
        target, positions = self._call_target(run)
        logging = self.plan.logging
        if logging is None and (target is not None or run.returned) and len(positions) == 1:
            # one fetched value: the number sess.run gave
            call = cst.Call(cst.Attribute(call, cst.Name("numpy")))
        if logging is not None:
            target = (
                _tuple([target, cst.Name("logged_tensors")])
                if target is not None
                else cst.Name("logged_tensors")
            )
        if run.returned:
            statement = updated_node.with_changes(body=[cst.Return(call)])
        elif target is None:
            statement = updated_node.with_changes(body=[cst.Expr(call)])
        else:
            statement = updated_node.with_changes(
                body=[cst.Assign([cst.AssignTarget(target)], call)]
            )
        if logging is None:
            return [*taken, statement]
        printed = _statement(
            "if logging_iteration % {every} == 0:\n"
            "    print(', '.join('%s = %s' % (name, value.numpy()) for name, value in logged_tensors.items()))\n",
            every=logging.every,
        ).with_changes(
            leading_lines=[_comment("LoggingTensorHook: the logged values, every n steps.")]
        )
        return [*taken, statement, printed, _statement("logging_iteration += 1")]

    def _call_target(self, run) -> tuple[cst.BaseAssignTargetExpression | None, list[int]]:
        """The call's target and the positions of the fetches the train step returns: the update's
        place goes where its target was `_` (or there was no target)."""
        positions = [i for i, e in enumerate(run.elements) if e is not None]
        target = run.target
        if run.single or target is None:
            return (target if positions else None), positions
        if isinstance(target, cst.Tuple | cst.List) and len(target.elements) == len(run.elements):
            keep = [
                i
                for i, e in enumerate(target.elements)
                if run.elements[i] is not None
                or not (isinstance(e.value, cst.Name) and e.value.value == "_")
            ]
            values = [target.elements[i].value for i in keep]
            if not values:
                return None, []
            new = values[0] if len(values) == 1 else _tuple(values)
            return new, keep  # type: ignore[return-value]  # the pair is built from statements
        return target, list(range(len(run.elements)))

    # -- the train step ----------------------------------------------------------------------------
    def _outputs(self) -> list[str]:
        """Replica names the train step reads after the replicas ran: fetched or logged."""
        plan = self.plan
        names: list[str] = []
        values: list[cst.CSTNode] = []
        for decision in plan.decisions.values():
            if decision.run is not None:
                values.extend(e for e in decision.run.elements if e is not None)
        if plan.logging is not None:
            values.append(plan.logging.tensors)
        for value in values:
            for name in sorted(free_names(value) & plan.step_names):
                if name not in names:
                    names.append(name)
        return names

    def _train_step(self, original_node) -> list[cst.BaseStatement]:
        plan = self.plan
        replica = self._replica_body()
        outputs = self.outputs
        if outputs:
            value = (
                cst.Name(outputs[0])
                if len(outputs) == 1
                else _tuple([cst.Name(n) for n in outputs])
            )
            replica.append(cst.SimpleStatementLine([cst.Return(value)]))
        params = cst.Parameters(params=[cst.Param(cst.Name(name)) for name in plan.inputs])
        replica_def = cst.FunctionDef(
            name=cst.Name("replica_step"),
            params=params,
            body=cst.IndentedBlock(body=replica),
            leading_lines=[],
        )
        args = cst.Tuple([cst.Element(cst.Name(n)) for n in plan.inputs]) if plan.inputs else None
        run = (
            "strategy.run(replica_step, args={args})"
            if args is not None
            else "strategy.run(replica_step)"
        )
        values = {"args": args} if args is not None else {}
        step: list[cst.BaseStatement] = [replica_def]
        if outputs:
            step.append(_statement(f"outputs = {run}", **values))
            for position, name in enumerate(outputs):
                got = "outputs" if len(outputs) == 1 else f"outputs[{position}]"
                line = _statement(f"{name} = strategy.experimental_local_results({got})[0]")
                if position == 0:
                    line = line.with_changes(
                        leading_lines=[
                            _comment("This worker's value, as its Horovod process had it.")
                        ]
                    )
                step.append(line)
        else:
            step.append(_statement(run, **values))
        returned = self._returned()
        if returned is not None:
            step.append(cst.SimpleStatementLine([cst.Return(returned)]))
        leading = [
            *(original_node.leading_lines or [cst.EmptyLine(indent=False)]),
            _comment("The per-step graph of each Horovod process, now one replica's step."),
        ]
        train_step = cst.FunctionDef(
            name=cst.Name("train_step"),
            params=params,
            body=cst.IndentedBlock(body=step),
            decorators=[cst.Decorator(self._decorator())],
            leading_lines=leading,
        )
        return [train_step]

    def _gradient_pairs(
        self, variables: cst.BaseExpression, loss: cst.BaseExpression
    ) -> list[cst.BaseStatement]:
        """compute_gradients -> the tape's (gradient, variable) pairs; what the legacy did to
        the averaged gradients now runs on the replica's, before the strategy sums them; then
        the update as written."""
        plan = self.plan
        assert plan.gradient is not None
        trainables = _Trainables(self.source, self.plan.hand_written)
        pairs = parse_template_expression(
            "list(zip(tape.gradient({loss}, variables), variables))", loss=loss
        )
        assert isinstance(plan.gradient, cst.SimpleStatementLine)  # compute_gradients' line
        small = plan.gradient.body[0]
        assert isinstance(small, cst.Assign)
        out: list[cst.BaseStatement] = [
            _statement("variables = {value}", value=variables),
            plan.gradient.with_changes(body=[small.with_changes(value=pairs)], leading_lines=[]),
        ]
        for statement in plan.between:
            why = (
                "the legacy ran this on the workers' averaged gradients; it now runs on each "
                "replica's, before the strategy sums them"
            )
            out.append(
                _marked(_visited(statement, trainables), Leftover.PER_REPLICA, why, self.todos)
            )
        update = _visited(plan.update, trainables)
        assert isinstance(update, cst.SimpleStatementLine)
        small = update.body[0]
        if isinstance(small, cst.Assign):  # the op has no use in the replica: the call runs it
            update = update.with_changes(body=[cst.Expr(small.value)])
        out.append(update.with_changes(leading_lines=[]))
        return out

    def _hand_written_update(
        self, variables: cst.BaseExpression, loss: cst.BaseExpression
    ) -> list[cst.BaseStatement]:
        """``grads = tf.gradients(loss, params)`` -> the tape's gradients of this replica; then
        the program's own update, as each Horovod process called it: it all-reduces the
        gradients itself (in the replica context), and its variables are made once."""
        plan = self.plan
        assert plan.gradient is not None
        trainables = _Trainables(self.source, self.plan.hand_written)
        gradients = parse_template_expression(
            "tape.gradient({loss}, {variables})", loss=loss, variables=variables
        )
        out: list[cst.BaseStatement] = []
        if isinstance(plan.gradient, cst.If):  # tf.gradients or a drop-in, chosen by a flag
            target = next(
                n.targets[0].target
                for n in _walk(plan.gradient)
                if isinstance(n, cst.Assign) and isinstance(n.targets[0].target, cst.Name)
            )
            line = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(target)], gradients)])
            why = (
                "the legacy chose how to take these gradients (a drop-in for tf.gradients, such "
                "as memory-saving gradients, in one branch): the tape takes plain ones "
                "(tf.recompute_grad is TF2's gradient checkpointing)"
            )
            out.append(_marked(line, Leftover.GRAPH, why, self.todos))
        else:
            small = plan.gradient.body[0]
            assert isinstance(small, cst.Assign)
            out.append(
                plan.gradient.with_changes(
                    body=[small.with_changes(value=gradients)], leading_lines=[]
                )
            )
        out.extend(_visited(s, trainables) for s in plan.between)
        update = _visited(plan.update, trainables)
        assert isinstance(update, cst.SimpleStatementLine)
        small = update.body[0]
        if isinstance(small, cst.Assign) and bound_names(plan.update) <= self._run_only():
            update = update.with_changes(body=[cst.Expr(small.value)])  # the call runs the op
        out.append(
            cst.With(
                items=[cst.WithItem(cst.parse_expression("update_state.scope()"))],
                body=cst.IndentedBlock([update.with_changes(leading_lines=[])]),
                leading_lines=[
                    _comment("The program's own update: it all-reduces the replicas' gradients"),
                    _comment("(Horovod's allreduce, now the replica context's); its variables"),
                    _comment("are made once."),
                ],
            )
        )
        return out

    def _run_only(self) -> set[str]:
        """Names of the update that only the step's runs read (as the op they ran)."""
        names = bound_names(self.plan.update)
        read = set()
        for node in _walk(self.plan.source.module):
            if isinstance(node, cst.SimpleStatementLine) and node is not self.plan.update:
                decision = self.plan.decision(node)
                if decision is not None and decision.action is Action.STEP_RUN:
                    continue
                read |= free_names(node) & names
        return names - read

    def _decorator(self) -> cst.BaseExpression:
        """``tf.function``, with the placeholders' dtypes and shapes as its input signature when
        every input was one (what is fed is converted as feed_dict did, traced once)."""
        plan = self.plan
        if not plan.inputs or set(plan.inputs) != set(plan.specs):
            return cst.parse_expression("tf.function")
        specs = []
        for name in plan.inputs:
            dtype, shape = plan.specs[name]
            specs.append(
                parse_template_expression(
                    "tf.TensorSpec({shape}, {dtype})",
                    shape=shape if shape is not None else cst.Name("None"),
                    dtype=dtype,
                )
            )
        signature = cst.List([cst.Element(spec) for spec in specs])
        return parse_template_expression("tf.function(input_signature={specs})", specs=signature)

    def _returned(self) -> cst.BaseExpression | None:
        runs = [d.run for d in self.plan.decisions.values() if d.run is not None]
        returned: list[cst.BaseExpression] = []
        if runs:
            run = runs[0]
            _, positions = self._call_target(run)
            for position in positions:
                element = run.elements[position]
                returned.append(element if element is not None else cst.Name("None"))
        if self.plan.logging is not None:
            returned.append(self.plan.logging.tensors)
        if not returned:
            return None
        return returned[0] if len(returned) == 1 else _tuple(returned)

    def _replica_body(self) -> list[cst.BaseStatement]:
        plan = self.plan
        trainables = _Trainables(self.source, self.plan.hand_written)
        forward: list[cst.BaseStatement] = [_visited(s, trainables) for s in plan.step]
        if forward:
            forward[0] = forward[0].with_changes(leading_lines=[])
        loss: cst.BaseExpression = plan.loss
        if plan.averaged:
            forward.append(
                _statement(
                    "replica_loss = {loss} / strategy.num_replicas_in_sync",
                    loss=_parenthesized(plan.loss),
                ).with_changes(
                    leading_lines=[
                        _comment("hvd.DistributedOptimizer averaged the workers' gradients;"),
                        _comment("apply_gradients sums the replicas'."),
                    ]
                )
            )
            loss = cst.Name("replica_loss")
        # The model's variables come from the store; the optimizer's slots do not (a slot is
        # no model variable: the checkpoint tracks it through the optimizer).
        tape = cst.With(
            items=[
                cst.WithItem(
                    cst.parse_expression("tf.GradientTape()"),
                    asname=cst.AsName(cst.Name("tape")),
                    comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
                ),
                cst.WithItem(cst.parse_expression("tf1_variables.scope()")),
            ],
            body=cst.IndentedBlock(body=forward),
        )
        variables = (
            plan.variables.visit(trainables)
            if plan.variables is not None
            else cst.parse_expression("tf1_variables.trainable_variables")
        )
        assert isinstance(variables, cst.BaseExpression)
        if plan.hand_written:
            return [tape, *self._hand_written_update(variables, loss)]
        if plan.gradient is not None:
            return [tape, *self._gradient_pairs(variables, loss)]
        call = plan.update_call
        keywords = [
            a.with_changes(comma=cst.MaybeSentinel.DEFAULT)
            for a in call.args
            if a.keyword is not None and a.keyword.value in ("global_step", "name")
        ]
        apply = cst.Call(
            func=call.func.with_changes(attr=cst.Name("apply_gradients")),
            args=[cst.Arg(cst.parse_expression("zip(gradients, variables)")), *keywords],
        )
        # the update's op (`train_op = ...`) has no use in the replica: the call runs it
        update: cst.BaseSmallStatement = cst.Expr(apply)
        inner: list[cst.BaseStatement] = [
            tape,
            _statement("variables = {value}", value=variables),
            _statement("gradients = tape.gradient({loss}, variables)", loss=loss),
            cst.SimpleStatementLine([update]),
        ]
        return inner


def _visited(statement: cst.BaseStatement, transformer: cst.CSTTransformer) -> cst.BaseStatement:
    visited = statement.visit(transformer)
    assert isinstance(visited, cst.BaseStatement)
    return visited


def _tuple(values: list) -> cst.Tuple:
    return cst.Tuple([cst.Element(v) for v in values], lpar=[], rpar=[])


def _parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(node, cst.Name | cst.Call | cst.Attribute | cst.Subscript):
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _equal() -> cst.AssignEqual:
    return cst.AssignEqual(
        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
    )
