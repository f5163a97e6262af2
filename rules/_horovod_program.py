"""Reading a Horovod TF1 training script (TFM401's conversion; not a rule module).

The common shape, one process per GPU under ``horovodrun``::

    def main(flags):
        hvd.init()
        ...numpy setup...
        dataset = ...; dataset = dataset.shard(hvd.size(), hvd.rank()); ...
        features, labels = dataset.make_one_shot_iterator().get_next()
        ...model and loss...
        global_step = tf.train.get_or_create_global_step()
        opt = tf.train.XOptimizer(lr * hvd.size(), ...)
        opt = hvd.DistributedOptimizer(opt)
        train_op = opt.minimize(loss, global_step=global_step)
        hooks = [hvd.BroadcastGlobalVariablesHook(0), tf.train.StopAtStepHook(last_step=...)]
        config = tf.ConfigProto(); config.gpu_options.visible_device_list = str(hvd.local_rank())
        checkpoint_dir = flags.train_dir if hvd.rank() == 0 else None
        with tf.train.MonitoredTrainingSession(checkpoint_dir=..., config=..., hooks=...) as sess:
            while not sess.should_stop():
                _, loss_value = sess.run([train_op, loss])
                ...logging...

    if __name__ == '__main__':
        parser = argparse.ArgumentParser(); ...
        main(parser.parse_args())

or a training function without parameters, called alone: ``main()``.

Anything else raises :class:`Blocked` naming the statement and why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import libcst as cst

from tfmigrate.rules._tower_program import Blocked
from tfmigrate.rules._towers import bound_names, free_names, get_arg, walk

Qualify = Callable[[cst.BaseExpression], "str | None"]

_HOROVOD = ("horovod.tensorflow.", "horovod.keras.", "horovod.tensorflow.keras.")
_BROADCASTS = ("broadcast_global_variables", "BroadcastGlobalVariablesHook")
# MonitoredTrainingSession arguments that only concern one process's session
_SESSION_ONLY = frozenset({"config", "is_chief", "hooks", "checkpoint_dir"})
_INITIALIZERS = (
    "tensorflow.global_variables_initializer",
    "tensorflow.initialize_all_variables",
)


def horovod_api(name: str | None) -> str | None:
    """``horovod.tensorflow.rank`` -> 'rank'; None for anything else."""
    if name is None or not name.startswith(_HOROVOD):
        return None
    return name.rsplit(".", 1)[1]


def _tf(name: str | None) -> str:
    """Qualified TF1 names with or without ``compat.v1`` (before and after renaming)."""
    if name is None:
        return ""
    return name.replace("tensorflow.compat.v1.", "tensorflow.")


def code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


@dataclass
class HorovodProgram:
    function: cst.FunctionDef
    flags: str | None  # the training function's parameter (parsed flags), if it takes one
    main: cst.If  # `if __name__ == '__main__':`
    parser: str | None  # the argparse parser the main block builds (with flags)
    parser_statements: list[cst.BaseStatement]
    setup: list[cst.BaseStatement]  # before the input: kept in the training function
    rank_input: list[cst.BaseStatement]  # what one process ran to build its dataset
    dataset: str
    inputs: list[str]  # what get_next() gave: the replica function's parameters
    model: list[cst.BaseStatement]  # the replica's model and loss
    build: list[cst.BaseStatement]  # global step, optimizer: created once in strategy.scope()
    global_step: str | None
    optimizer: str
    averaged: bool
    minimize: cst.SimpleStatementLine  # `train_op = opt.minimize(loss, ...)`
    train_op: str
    last_step: cst.BaseExpression | None  # StopAtStepHook's (a MonitoredTrainingSession)
    loop: cst.For | None  # or the `for` loop of a plain Session
    checkpoint_dir: cst.BaseExpression | None
    run: cst.SimpleStatementLine  # `_, loss_value = sess.run([train_op, loss])`
    fetched: list[tuple[str, str]]  # (target, fetched name), the train op's target included
    loop_rest: list[cst.BaseStatement]  # the loop body after the run
    dropped: list[str] = field(default_factory=list)  # notes on what went away


class Reader:
    """Classifies the statements of a Horovod training function (see the module docstring)."""

    def __init__(self, module: cst.Module, qualify: Qualify) -> None:
        self.module = module
        self.qualify = qualify

    def hvd(self, node: cst.CSTNode) -> str | None:
        if isinstance(node, cst.Call):
            return horovod_api(self.qualify(node.func))
        return None

    def calls(self, node: cst.CSTNode) -> list[tuple[cst.Call, str]]:
        found = []
        for current in walk(node):
            api = self.hvd(current)
            if api is not None:
                assert isinstance(current, cst.Call)
                found.append((current, api))
        return found

    # -- the whole module ---------------------------------------------------------------------
    def read(self) -> HorovodProgram:
        init = next((c for c, api in self.calls(self.module) if api == "init"), None)
        if init is None:
            raise Blocked(self.module, "no `hvd.init()`: not a Horovod training script")
        function = self._training_function(init)
        main, parser, parser_statements = self._main_block(function)
        if len(function.params.params) != (1 if parser else 0):
            raise Blocked(
                function,
                "the training function takes other parameters than the parsed flags"
                if parser
                else "the training function takes parameters but is called without arguments",
            )
        for statement in self.module.body:
            if statement is not function and not self._is_horovod_import(statement):
                for call, api in self.calls(statement):
                    if statement is not main:
                        raise Blocked(
                            call, f"`hvd.{api}()` outside the training function is not converted"
                        )
        return self._function(function, main, parser, parser_statements)

    def _is_horovod_import(self, statement: cst.BaseStatement) -> bool:
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if isinstance(small, cst.Import):
            return any(code(a.name).startswith("horovod") for a in small.names)
        if isinstance(small, cst.ImportFrom) and small.module is not None:
            return code(small.module).startswith("horovod")
        return False

    def _training_function(self, init: cst.Call) -> cst.FunctionDef:
        for statement in self.module.body:
            if isinstance(statement, cst.FunctionDef) and any(n is init for n in walk(statement)):
                if not any(
                    isinstance(s, cst.SimpleStatementLine) and any(n is init for n in walk(s))
                    for s in statement.body.body
                ):
                    raise Blocked(init, "`hvd.init()` is not a statement of the training function")
                return statement
        raise Blocked(init, "`hvd.init()` is not inside a module-level training function")

    def _main_block(
        self, function: cst.FunctionDef
    ) -> tuple[cst.If, str | None, list[cst.BaseStatement]]:
        name = function.name.value
        for statement in self.module.body:
            if (
                isinstance(statement, cst.If)
                and isinstance(statement.test, cst.Comparison)
                and isinstance(statement.test.left, cst.Name)
                and statement.test.left.value == "__name__"
            ):
                found = _main_call(statement, name)
                if found is not None:
                    return found
                raise Blocked(
                    statement,
                    f"the main block is not `{name}(parser.parse_args())` (or `args = "
                    f"parser.parse_args()` then `{name}(args)`) after building the parser, nor "
                    f"`{name}()` alone",
                )
        raise Blocked(function, f"no `if __name__ == '__main__':` block calling `{name}`")

    # -- the training function ----------------------------------------------------------------
    def _function(
        self,
        function: cst.FunctionDef,
        main: cst.If,
        parser: str | None,
        parser_statements: list[cst.BaseStatement],
    ) -> HorovodProgram:
        # _training_function found `hvd.init()` on a line of it: an indented block
        statements = list(cast(cst.IndentedBlock, function.body).body)
        if function.get_docstring() is not None:
            statements = statements[1:]
        dropped: list[str] = []
        iterator = next((i for i, s in enumerate(statements) if self._get_next(s)), None)
        if iterator is None:
            raise Blocked(
                function,
                "no `features, labels = dataset.make_one_shot_iterator().get_next()`: only "
                "tf.data input read through a one-shot iterator is converted",
            )
        found = self._get_next(statements[iterator])
        assert found is not None  # how `iterator` was found
        source, inputs = found
        made_here: cst.BaseStatement | None = None
        if isinstance(source, str):
            dataset = source
        else:  # `input_fn(hvd.rank(), ...).make_one_shot_iterator()`: name the dataset
            taken = {n.value for n in walk(function) if isinstance(n, cst.Name)}
            dataset = next(
                n for n in ("dataset", "rank_dataset", "input_dataset_") if n not in taken
            )
            made_here = cst.parse_statement(f"{dataset} = {code(source)}")
        setup: list[cst.BaseStatement] = []
        rank_input: list[cst.BaseStatement] = []
        configs: set[str] = set()  # ConfigProto objects: they go with the session
        for statement in statements[:iterator]:
            apis = [api for _, api in self.calls(statement)]
            if apis == ["init"] and _is_expression(statement):
                dropped.append("`hvd.init()` goes: the cluster comes from TF_CONFIG")
                continue
            if self._session_config(statement, configs, dropped):
                continue
            if dataset in bound_names(statement) or "rank" in apis:
                rank_input.append(statement)
            else:
                setup.append(statement)
        if made_here is not None:
            rank_input.append(made_here)
        made = set().union(set(), *(bound_names(s) for s in rank_input)) - {dataset}
        later = set().union(set(), *(free_names(s) for s in statements[iterator + 1 :]))
        if made & later:
            raise Blocked(
                rank_input[0],
                f"`{sorted(made & later)[0]}` is made with the input per process and used after it",
            )
        rest = statements[iterator + 1 :]
        session = next(
            (i for i, s in enumerate(rest) if isinstance(s, cst.With)),
            None,
        )
        graph = rest[:session] if session is not None else rest
        model: list[cst.BaseStatement] = []
        build: list[cst.BaseStatement] = []
        global_step = optimizer = None
        averaged = True
        minimize: cst.SimpleStatementLine | None = None
        train_op = ""
        hooks: dict[str, cst.BaseExpression] = {}
        gated: dict[str, cst.BaseExpression] = {}
        session_ops: set[str] = set()  # `init = ...initializer()`, `bcast = hvd.broadcast...`
        for statement in graph:
            names, value = _assign(statement)
            call = value if isinstance(value, cst.Call) else None
            callee = _tf(self.qualify(call.func)) if call is not None else ""
            api = self.hvd(call) if call is not None else None
            if minimize is not None:
                if names and isinstance(value, cst.List):
                    hooks[names[0]] = value
                elif self._session_config(statement, configs, dropped):
                    pass
                elif len(names) == 1 and (api in _BROADCASTS or callee in _INITIALIZERS):
                    session_ops.add(names[0])
                elif names and isinstance(value, cst.IfExp) and self._rank_zero(value.test):
                    gated[names[0]] = value.body
                else:
                    raise Blocked(
                        statement,
                        "not converted: a statement between the optimizer "
                        "and the training session that is neither hooks, session "
                        "config nor a rank-0 checkpoint folder",
                    )
                continue
            if self._session_config(statement, configs, dropped):
                continue
            if names == [] and api in _BROADCASTS:
                dropped.append(
                    "the initial broadcast goes: every worker starts from the same initial values"
                )
                continue
            if (
                call is not None
                and callee
                in (
                    "tensorflow.train.get_or_create_global_step",
                    "tensorflow.train.get_global_step",
                    "tensorflow.train.create_global_step",
                )
                and len(names) == 1
            ):
                global_step = names[0]
                build.append(statement)
            elif (
                call is not None
                and callee.startswith("tensorflow.train.")
                and callee.endswith("Optimizer")
                and len(names) == 1
            ):
                optimizer = names[0]
                build.append(statement)
            elif api in ("DistributedOptimizer",) and len(names) == 1:
                assert call is not None
                averaged = self._averaged(call)
                inner = get_arg(call, 0, "optimizer")
                if isinstance(inner, cst.Name) and inner.value == optimizer == names[0]:
                    pass
                elif isinstance(inner, cst.Call) and _tf(self.qualify(inner.func)).startswith(
                    "tensorflow.train."
                ):
                    optimizer = names[0]
                    build.append(_with_value(statement, inner))
                else:
                    raise Blocked(
                        statement,
                        "`hvd.DistributedOptimizer` does not wrap the optimizer made "
                        "right before it (`opt = hvd.DistributedOptimizer(opt)`)",
                    )
            elif (
                call is not None
                and isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "minimize"
                and isinstance(call.func.value, cst.Name)
                and call.func.value.value == optimizer
                and len(names) == 1
            ):
                if get_arg(call, 2, "var_list") is not None:
                    raise Blocked(statement, "`minimize(var_list=...)` is not converted yet")
                assert isinstance(statement, cst.SimpleStatementLine)
                minimize, train_op = statement, names[0]
            elif (
                call is not None
                and isinstance(call.func, cst.Attribute)
                and call.func.attr.value in ("compute_gradients", "apply_gradients")
            ):
                raise Blocked(
                    statement,
                    "`compute_gradients`/`apply_gradients` with Horovod: only "
                    "`opt.minimize(loss, global_step=...)` is converted so far",
                )
            else:
                for node, name in self.calls(statement):
                    raise Blocked(node, f"`hvd.{name}()` in the model code is not converted")
                model.append(statement)
        if minimize is None or optimizer is None:
            raise Blocked(
                function, "no `train_op = opt.minimize(loss, ...)` on a tf.train optimizer"
            )
        if session is None:
            raise Blocked(
                function,
                "no `with tf.train.MonitoredTrainingSession(...) as sess:` or "
                "`with tf.Session(...) as sess:`",
            )
        if rest[session + 1 :]:
            raise Blocked(
                rest[session + 1], "statements after the training session are not converted"
            )
        with_statement = rest[session]
        assert isinstance(with_statement, cst.With)
        for_loop = self._plain_session(with_statement, session_ops, dropped)
        last_step = checkpoint_dir = None
        loop: cst.While | cst.For
        if for_loop is not None:
            loop = for_loop
        else:
            if global_step is None:
                raise Blocked(minimize, "no global step: StopAtStepHook counts it")
            last_step, checkpoint_dir, loop = self._session(
                with_statement, hooks, configs, gated, dropped
            )
        run, fetched, loop_rest = self._loop(loop, train_op)
        return HorovodProgram(
            function=function,
            flags=function.params.params[0].name.value if function.params.params else None,
            main=main,
            parser=parser,
            parser_statements=parser_statements,
            setup=setup,
            rank_input=rank_input,
            dataset=dataset,
            inputs=inputs,
            model=model,
            build=build,
            global_step=global_step,
            optimizer=optimizer,
            averaged=averaged,
            minimize=minimize,
            train_op=train_op,
            last_step=last_step,
            loop=for_loop,
            checkpoint_dir=checkpoint_dir,
            run=run,
            fetched=fetched,
            loop_rest=loop_rest,
            dropped=dropped,
        )

    def _get_next(self, statement: cst.BaseStatement) -> tuple[str | cst.Call, list[str]] | None:
        """``a, b = dataset.make_one_shot_iterator().get_next()`` (also
        ``tf.data.make_one_shot_iterator(dataset)``) -> ('dataset', ['a', 'b']); the dataset
        made by a call in place (``input_fn(...).make_one_shot_iterator()``) -> (the call, ...)."""
        names, value = _assign(statement)
        if not names or not isinstance(value, cst.Call) or value.args:
            return None
        func = value.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "get_next"):
            return None
        maker = func.value
        if not isinstance(maker, cst.Call):
            return None
        if (
            isinstance(maker.func, cst.Attribute)
            and maker.func.attr.value == "make_one_shot_iterator"
            and isinstance(maker.func.value, cst.Name | cst.Call)
            and not maker.args
        ):
            source = maker.func.value
            return (source.value if isinstance(source, cst.Name) else source), names
        if _tf(self.qualify(maker.func)) == "tensorflow.data.make_one_shot_iterator":
            dataset = get_arg(maker, 0, "dataset")
            if isinstance(dataset, cst.Name):
                return dataset.value, names
            if isinstance(dataset, cst.Call):
                return dataset, names
        return None

    def _averaged(self, call: cst.Call) -> bool:
        op = get_arg(call, 99, "op")
        if op is None:
            return True
        name = horovod_api(self.qualify(op))
        if name in ("Average", "Sum"):
            return name == "Average"
        raise Blocked(op, f"`op={code(op)}`: only hvd.Average and hvd.Sum are converted")

    def _rank_zero(self, test: cst.BaseExpression) -> bool:
        return (
            isinstance(test, cst.Comparison)
            and self.hvd(test.left) == "rank"
            and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.Equal)
            and isinstance(test.comparisons[0].comparator, cst.Integer)
            and test.comparisons[0].comparator.value == "0"
        )

    def _session_config(
        self, statement: cst.BaseStatement, configs: set[str], dropped: list[str]
    ) -> bool:
        """``config = tf.ConfigProto(...)`` and ``config.gpu_options.x = ...``: noted, dropped."""
        names, value = _assign(statement)
        if len(names) == 1 and isinstance(value, cst.Call):
            if _tf(self.qualify(value.func)).endswith(("ConfigProto", "GPUOptions")):
                configs.add(names[0])
                dropped.append(
                    f"`{code(statement).strip()}`: the session config goes (TF2 has no "
                    "sessions); GPU memory growth is tf.config.experimental.set_memory_growth"
                )
                return True
        if self._config_setting(statement, configs):
            dropped.append(f"`{code(statement).strip()}`: dropped with the session config")
            return True
        return False

    def _config_setting(self, statement: cst.BaseStatement, configs: set[str]) -> bool:
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if not isinstance(small, cst.Assign) or len(small.targets) != 1:
            return False
        target = small.targets[0].target
        root: cst.BaseExpression = target
        while isinstance(root, cst.Attribute):
            root = root.value
        return isinstance(root, cst.Name) and root.value in configs and root is not target

    def _plain_session(
        self, statement: cst.With, session_ops: set[str], dropped: list[str]
    ) -> cst.For | None:
        """``with tf.Session(...) as sess:`` running the initializer and the broadcast, then one
        ``for`` loop -> that loop; None for another kind of session."""
        item = statement.items[0] if len(statement.items) == 1 else None
        call = item.item if item is not None else None
        if not (
            isinstance(call, cst.Call)
            and _tf(self.qualify(call.func)) == "tensorflow.Session"
            and item is not None
            and item.asname is not None
            and isinstance(item.asname.name, cst.Name)
        ):
            return None
        sess = item.asname.name.value
        body = list(statement.body.body)
        loops = [s for s in body if isinstance(s, cst.For)]
        if len(loops) != 1 or body[-1] is not loops[0] or loops[0].orelse is not None:
            raise Blocked(statement, f"the `{sess}` block does not end with its one `for` loop")
        for prelude in body[:-1]:
            names, value = _assign(prelude)
            run = value if isinstance(value, cst.Call) and not names else None
            fetched = get_arg(run, 0, "fetches") if run is not None else None
            if (
                run is None
                or code(run.func) != f"{sess}.run"
                or len(run.args) != 1
                or fetched is None
                or not (
                    (isinstance(fetched, cst.Name) and fetched.value in session_ops)
                    or (
                        isinstance(fetched, cst.Call)
                        and (
                            self.hvd(fetched) in _BROADCASTS
                            or _tf(self.qualify(fetched.func)) in _INITIALIZERS
                        )
                    )
                )
            ):
                raise Blocked(
                    prelude,
                    f"before its loop the `{sess}` block only runs the initializer and the "
                    "broadcast",
                )
            if "broadcast" in code(fetched) or (
                isinstance(fetched, cst.Name) and self._broadcast_name(fetched.value)
            ):
                dropped.append(
                    f"`{code(prelude).strip()}` goes: every worker starts from the same "
                    "initial values"
                )
            else:
                dropped.append(
                    f"`{code(prelude).strip()}` goes: the variables are created initialised"
                )
        return loops[0]

    def _broadcast_name(self, name: str) -> bool:
        return any(
            _assign(s)[0] == [name] and self.hvd(_assign(s)[1] or cst.Name("_")) in _BROADCASTS
            for s in walk(self.module)
            if isinstance(s, cst.SimpleStatementLine)
        )

    def _session(
        self,
        statement: cst.With,
        hooks: dict[str, cst.BaseExpression],
        configs: set[str],
        gated: dict[str, cst.BaseExpression],
        dropped: list[str],
    ) -> tuple[cst.BaseExpression, cst.BaseExpression | None, cst.While]:
        item = statement.items[0] if len(statement.items) == 1 else None
        call = item.item if item is not None else None
        if (
            not isinstance(call, cst.Call)
            or _tf(self.qualify(call.func)) != "tensorflow.train.MonitoredTrainingSession"
            or item is None
            or item.asname is None
            or not isinstance(item.asname.name, cst.Name)
        ):
            raise Blocked(
                statement,
                "only `with tf.train.MonitoredTrainingSession(...) as sess:` is converted",
            )
        for arg in call.args:
            if arg.keyword is None or arg.keyword.value not in _SESSION_ONLY:
                spelled = code(arg.value)
                if arg.keyword is not None:
                    spelled = f"{arg.keyword.value}={spelled}"
                raise Blocked(
                    arg,
                    f"MonitoredTrainingSession argument `{spelled}` is not converted "
                    "(only checkpoint_dir, hooks, config, is_chief)",
                )
        hook_list = get_arg(call, None, "hooks")
        if isinstance(hook_list, cst.Name):
            hook_list = hooks.get(hook_list.value)
        last_step = None
        if isinstance(hook_list, cst.List):
            for element in hook_list.elements:
                hook = element.value
                api = self.hvd(hook)
                if api == "BroadcastGlobalVariablesHook":
                    dropped.append(
                        "`hvd.BroadcastGlobalVariablesHook` goes: every worker starts "
                        "from the same initial values"
                    )
                elif isinstance(hook, cst.Call) and _tf(self.qualify(hook.func)) == (
                    "tensorflow.train.StopAtStepHook"
                ):
                    last_step = get_arg(hook, 1, "last_step")
                else:
                    raise Blocked(hook, "a session hook that is not converted")
        if last_step is None:
            raise Blocked(call, "no `StopAtStepHook(last_step=...)`: the loop's end is not known")
        folder = get_arg(call, None, "checkpoint_dir")
        if isinstance(folder, cst.Name) and folder.value in gated:
            folder = gated[folder.value]
        elif isinstance(folder, cst.IfExp) and self._rank_zero(folder.test):
            folder = folder.body
        elif isinstance(folder, cst.Name) and folder.value == "None":
            folder = None
        if folder is not None and any(True for _ in self.calls(folder)):
            raise Blocked(folder, "a checkpoint folder that depends on Horovod is not converted")
        body = statement.body.body
        loop = body[0] if len(body) == 1 else None
        sess = item.asname.name.value
        if not (
            isinstance(loop, cst.While)
            and isinstance(loop.test, cst.UnaryOperation)
            and isinstance(loop.test.operator, cst.Not)
            and code(loop.test.expression) == f"{sess}.should_stop()"
            and loop.orelse is None
        ):
            raise Blocked(
                statement, f"the session block is not one `while not {sess}.should_stop():`"
            )
        return last_step, folder, loop

    def _loop(
        self, loop: cst.While | cst.For, train_op: str
    ) -> tuple[cst.SimpleStatementLine, list[tuple[str, str]], list[cst.BaseStatement]]:
        body = list(loop.body.body)
        first = body[0] if body else None
        names, value = _assign(first) if first is not None else ([], None)
        run = value if isinstance(value, cst.Call) else None
        fetches = get_arg(run, 0, "fetches") if run is not None else None
        if not names and isinstance(fetches, cst.Name) and fetches.value == train_op:
            # `sess.run(train_op)` alone: a step that fetches nothing else
            fetches, names = cst.List([cst.Element(fetches)]), ["_"]
        if (
            run is None
            or not isinstance(run.func, cst.Attribute)
            or run.func.attr.value != "run"
            or len(run.args) != 1
            or not isinstance(fetches, cst.List)
            or not all(isinstance(e.value, cst.Name) for e in fetches.elements)
            or len(fetches.elements) != len(names)
        ):
            raise Blocked(
                first or loop,
                "the loop does not start with `a, b = sess.run([train_op, b_tensor])` or "
                "`sess.run(train_op)`",
            )
        # every fetch is a Name (checked above); `first` is a line, so the body is a block
        fetched = [
            (t, cast(cst.Name, e.value).value)
            for t, e in zip(names, fetches.elements, strict=True)
        ]
        assert isinstance(first, cst.SimpleStatementLine)
        if train_op not in [f for _, f in fetched]:
            raise Blocked(first, f"the loop's `run` does not fetch `{train_op}`")
        for statement in body[1:]:
            if "run" in {n.attr.value for n in walk(statement) if isinstance(n, cst.Attribute)}:
                raise Blocked(statement, "a second `sess.run` in the loop is not converted")
            for call, api in self.calls(statement):
                if api not in ("rank", "size"):
                    raise Blocked(call, f"`hvd.{api}()` in the loop is not converted")
        return first, fetched, cast("list[cst.BaseStatement]", body[1:])


def _is_expression(statement: cst.BaseStatement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
    )


def _assign(statement: cst.CSTNode) -> tuple[list[str], cst.BaseExpression | None]:
    """``a = value`` / ``a, b = value`` -> (names, value); an expression statement -> ([], it)."""
    small = (
        statement.body[0]
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
        else None
    )
    if isinstance(small, cst.Expr):
        return [], small.value
    if not isinstance(small, cst.Assign) or len(small.targets) != 1:
        return [], None
    target = small.targets[0].target
    if isinstance(target, cst.Name):
        return [target.value], small.value
    if isinstance(target, cst.Tuple | cst.List) and all(
        isinstance(e.value, cst.Name) for e in target.elements
    ):
        names = [cast(cst.Name, e.value).value for e in target.elements]  # all Names
        return names, small.value
    return [], None


def _with_value(statement: cst.BaseStatement, value: cst.BaseExpression) -> cst.BaseStatement:
    assert isinstance(statement, cst.SimpleStatementLine)
    small = statement.body[0]
    assert isinstance(small, cst.Assign)
    return statement.with_changes(body=[small.with_changes(value=value)])


def _main_call(
    block: cst.If, name: str
) -> tuple[cst.If, str | None, list[cst.BaseStatement]] | None:
    """The main block's call of the training function ``name``: ``name(parser.parse_args())``
    or ``flags = parser.parse_args()`` then ``name(flags)`` last, after the statements that build
    the parser (and whatever else the script sets up first); or ``name()`` alone."""
    if block.orelse is not None:
        return None
    body = list(block.body.body)
    calls = [_expression_call(s) for s in body]
    call = calls[-1] if calls else None
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name)):
        return None
    if call.func.value != name:
        return None
    if not call.args:
        return (block, None, []) if len(body) == 1 else None
    if len(call.args) != 1 or call.args[0].keyword is not None:
        return None
    argument = call.args[0].value
    if isinstance(argument, cst.Call):
        parser = _parse_args_receiver(argument)
        if parser is None:
            return None
        # its last item is a line (`main(parser.parse_args())`): an indented block's
        return block, parser, cast("list[cst.BaseStatement]", body[:-1])
    if not isinstance(argument, cst.Name) or len(body) < 2:
        return None
    parsed = body[-2]
    small = parsed.body[0] if isinstance(parsed, cst.SimpleStatementLine) else None
    if not (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name)
        and small.targets[0].target.value == argument.value
        and isinstance(small.value, cst.Call)
    ):
        return None
    parser = _parse_args_receiver(small.value)
    if parser is None:
        return None
    return block, parser, cast("list[cst.BaseStatement]", body[:-2])


def _expression_call(statement: cst.CSTNode) -> cst.BaseExpression | None:
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
    return small.value if isinstance(small, cst.Expr) else None


def _parse_args_receiver(call: cst.Call) -> str | None:
    """``parser.parse_args()`` -> 'parser'."""
    func = call.func
    if (
        isinstance(func, cst.Attribute)
        and func.attr.value == "parse_args"
        and isinstance(func.value, cst.Name)
    ):
        return func.value.value
    return None

