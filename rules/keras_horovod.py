from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import libcst as cst

from tfmigrate.names import dotted
from tfmigrate.rule import Example, FixSafety, Rule
from tfmigrate.rules._towers import bound_names
from tfmigrate.rules.keras_session_handling import KerasSessionHandling, _Sessions
from tfmigrate.rules.session_device_config import device_config, tf_imports, tf_module
from tfmigrate.syntax import carried_lines, unindented, walk
from tfmigrate.verify.manifest import SAME_NAMES

# Horovod's Keras front ends (standalone Keras 2 and tf.keras)
_KERAS_HOROVOD = ("horovod.keras.", "horovod.tensorflow.keras.")
# callbacks with nothing to do under MultiWorkerMirroredStrategy: variables start equal on every
# worker, and Keras aggregates metrics over the replicas itself
_DROPPED_CALLBACKS = frozenset({"BroadcastGlobalVariablesCallback", "MetricAverageCallback"})
_WARMUP = "LearningRateWarmupCallback"
_HANDLED = frozenset({"init", "size", "rank", "local_rank", "DistributedOptimizer", _WARMUP})


class _Blocked(Exception):
    """The script uses Horovod in a way this conversion does not follow."""


def _api(name: str | None) -> str | None:
    """`horovod.keras.callbacks.MetricAverageCallback` -> `MetricAverageCallback`."""
    if name is None or not name.startswith(_KERAS_HOROVOD):
        return None
    return name.rsplit(".", 1)[1]


def _small(statement: cst.CSTNode) -> cst.BaseSmallStatement | None:
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        return statement.body[0]
    return None


@dataclass
class _Plan:
    block: cst.Module | cst.IndentedBlock
    init: cst.SimpleStatementLine
    first: int  # the statements [first, last] of block go into strategy.scope()
    last: int
    fit: cst.Call
    sessions: _Sessions | None
    drop: set[int] = field(default_factory=set)  # statements that go (callbacks.append(...))
    warmup: bool = False


class KerasHorovod(Rule):
    """
    ## What it does
    Converts a Keras `fit` script that trains with Horovod (`import horovod.keras as hvd` or
    `horovod.tensorflow.keras`: `hvd.init()`, `hvd.DistributedOptimizer(keras optimizer)`,
    Horovod's Keras callbacks, checkpoints only on rank 0) to
    `tf.distribute.MultiWorkerMirroredStrategy` and `fit`.

    ## Why is this bad?
    Horovod runs one process per GPU under `horovodrun`/MPI and averages the gradients of the
    processes in its `DistributedOptimizer`; TensorFlow 2's own engine for this is
    `MultiWorkerMirroredStrategy`: one process per machine using all its GPUs, the cluster from
    `TF_CONFIG`, and Keras' `fit` splitting each global batch over the replicas and averaging
    their gradients itself. Each Horovod piece has its counterpart there:
    - `hvd.init()` is the strategy: `strategy = tf.distribute.MultiWorkerMirroredStrategy()`,
      created after the device settings (memory growth cannot change once it initialized the
      GPUs); the model and optimizer are built and compiled in `strategy.scope()`.
    - `hvd.DistributedOptimizer(opt)` is `opt`: `fit` under the strategy averages gradients as
      Horovod's default `op=hvd.Average` did.
    - `hvd.size()` (processes, one per GPU) is `strategy.num_replicas_in_sync`, and
      `fit(batch_size=b)`, Horovod's batch of each process, becomes the global batch
      `b * strategy.num_replicas_in_sync`.
    - `hvd.rank() == 0` (the process that logs and saves) is `strategy.extended.should_checkpoint`
      (the chief; True on a single worker), any other `hvd.rank()` is the worker's index
      `strategy.cluster_resolver.task_id or 0`.
    - `BroadcastGlobalVariablesCallback` and `MetricAverageCallback` go: the strategy creates
      every variable with the same value on all workers, and Keras reduces metrics over the
      replicas. GPU pinning (`visible_device_list = str(hvd.local_rank())`) goes: the strategy
      uses every GPU of its machine; the session's other settings become `tf.config` calls.

    ## Example
    ```python
    import horovod.keras as hvd
    hvd.init()
    model = build_model()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adadelta(1.0 * hvd.size()))
    model.compile(loss='categorical_crossentropy', optimizer=opt)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    if hvd.rank() == 0:
        callbacks.append(keras.callbacks.ModelCheckpoint('./checkpoint-{epoch}.h5'))
    model.fit(x, y, batch_size=128, callbacks=callbacks)
    ```
    Use instead:
    ```python
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build_model()
        opt = keras.optimizers.Adadelta(1.0 * strategy.num_replicas_in_sync)
        model.compile(loss='categorical_crossentropy', optimizer=opt)
    callbacks = []
    if strategy.extended.should_checkpoint:
        callbacks.append(keras.callbacks.ModelCheckpoint('./checkpoint-{epoch}.h5'))
    model.fit(x, y, batch_size=128 * strategy.num_replicas_in_sync, callbacks=callbacks)
    ```

    Measured on CPU (tests/test_keras2_parallel.py): the converted fixture trains with `fit` as
    one worker; started as two workers (`TF_CONFIG` on localhost), Keras 3.15's `fit` under
    `MultiWorkerMirroredStrategy` stops at its first step with `ValueError: Attempt to convert a
    value (PerReplica:...)`, as a minimal two-layer program does (a known Keras 3 limitation,
    keras-team/keras#20585; Keras 2 ran it). Until Keras fixes it, a converted program trains on
    several machines only with `tf_keras` (`TF_USE_LEGACY_KERAS=1`); on one machine it runs as
    one worker over that machine's GPUs.

    ## Fix safety
    Unsafe: the program then trains differently where Horovod's semantics and the strategy's
    differ. An epoch is one pass over the data by all workers together (numpy input is split
    over the replicas), where each Horovod process made its own pass, so an epoch has
    `num_replicas_in_sync` times fewer steps (scripts that divided the epochs by `hvd.size()`
    now train that many times fewer steps); `LearningRateWarmupCallback` has no Keras
    counterpart and goes with a `# TODO(tfmigrate): TFM402` comment (a warm-up schedule is a
    `keras.optimizers.schedules.LearningRateSchedule` of your choice); only the chief saving
    checkpoints is kept as it was written. Not fixed (the `hvd.init()` finding says why):
    Horovod calls other than those above (`allreduce`, `broadcast`, `local_rank()` outside the
    GPU pinning), `DistributedOptimizer` with arguments other than the optimizer, no `compile`
    and `fit` in the block of `hvd.init()`, or a model built before `hvd.init()`.
    """

    code = "TFM402"
    name = "keras-horovod"
    summary = "Keras Horovod (hvd.DistributedOptimizer, Horovod callbacks): use MultiWorkerMirroredStrategy"
    fix_safety = FixSafety.UNSAFE
    triggers = (("horovod*", "compile"),)

    valid = (
        # TF1 Horovod: TFM401's.
        """import tensorflow as tf
import horovod.tensorflow as hvd
hvd.init()
opt = hvd.DistributedOptimizer(tf.train.AdamOptimizer(0.001))
""",
        """import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = build_model()
    model.compile(optimizer='adam', loss='mse')
model.fit(x, y, batch_size=64 * strategy.num_replicas_in_sync)
""",
    )
    invalid = (
        Example(
            """
            import keras
            import tensorflow as tf
            import horovod.keras as hvd
            from keras import backend as K

            hvd.init()
            config = tf.ConfigProto()
            config.gpu_options.allow_growth = True
            config.gpu_options.visible_device_list = str(hvd.local_rank())
            K.set_session(tf.Session(config=config))

            epochs = max(1, 12 // hvd.size())
            model = build_model()
            opt = keras.optimizers.Adadelta(1.0 * hvd.size())
            opt = hvd.DistributedOptimizer(opt)
            model.compile(loss='categorical_crossentropy', optimizer=opt)
            callbacks = [
                hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                hvd.callbacks.MetricAverageCallback(),
            ]
            if hvd.rank() == 0:
                callbacks.append(keras.callbacks.ModelCheckpoint('./checkpoint-{epoch}.h5'))
            model.fit(x, y, batch_size=128, epochs=epochs, callbacks=callbacks,
                      verbose=1 if hvd.rank() == 0 else 0)
            """,
            fixed="""
            import keras
            import tensorflow as tf
            from keras import backend as K

            for gpu in tf.config.list_physical_devices('GPU'):
                tf.config.experimental.set_memory_growth(gpu, True)
            strategy = tf.distribute.MultiWorkerMirroredStrategy()

            epochs = max(1, 12 // strategy.num_replicas_in_sync)
            with strategy.scope():
                model = build_model()
                opt = keras.optimizers.Adadelta(1.0 * strategy.num_replicas_in_sync)
                model.compile(loss='categorical_crossentropy', optimizer=opt)
            callbacks = []
            if strategy.extended.should_checkpoint:
                callbacks.append(keras.callbacks.ModelCheckpoint('./checkpoint-{epoch}.h5'))
            model.fit(x, y, batch_size=128 * strategy.num_replicas_in_sync, epochs=epochs, callbacks=callbacks,
                      verbose=1 if strategy.extended.should_checkpoint else 0)
            """,
            message="MultiWorkerMirroredStrategy",
        ),
        # tf.keras Horovod in a function, the optimizer wrapped inline, a warm-up callback.
        Example(
            """
            import tensorflow as tf
            import horovod.tensorflow.keras as hvd

            def main(x, y):
                hvd.init()
                model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
                model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)),
                              loss='mse')
                callbacks = [hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1)]
                model.fit(x, y, batch_size=32, callbacks=callbacks)
            """,
            fixed="""
            import tensorflow as tf

            def main(x, y):
                strategy = tf.distribute.MultiWorkerMirroredStrategy()
                with strategy.scope():
                    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
                    model.compile(optimizer=tf.keras.optimizers.SGD(0.1),
                                  loss='mse')
                # TODO(tfmigrate): TFM402 Horovod's LearningRateWarmupCallback is gone: Keras has no warm-up callback; give the optimizer a keras.optimizers.schedules.LearningRateSchedule that warms up
                callbacks = []
                model.fit(x, y, batch_size=32 * strategy.num_replicas_in_sync, callbacks=callbacks)
            """,
        ),
        # A Horovod collective of its own: a person decides.
        Example(
            """
            import keras
            import horovod.keras as hvd
            hvd.init()
            model = build_model()
            model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss='mse')
            total = hvd.allreduce(count)
            model.fit(x, y)
            """,
            message="not converted",
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        if _api(self.call_name(node)) != "init":
            return
        try:
            plan = self._plan(node)
        except _Blocked as why:
            self.report(
                node,
                "Keras Horovod: `hvd.init()` starts one process per GPU; TF2: "
                "`tf.distribute.MultiWorkerMirroredStrategy()` with `fit` (not converted: "
                f"{why})",
            )
            return
        replacement = self._rewrite(plan)
        notes = [
            "TFM402: Horovod replaced by MultiWorkerMirroredStrategy; fit takes the global batch "
            "(Horovod's per-process batch times num_replicas_in_sync)",
            "TFM402: an epoch is one pass over the data by all workers together (each Horovod "
            "process made its own)",
            "TFM402: weights keep their Keras names (layer/weight), so variables are matched by "
            "name",
        ]
        manifest = {
            "keras_horovod": {"notes": notes},
            "variables": dict(SAME_NAMES),
            "fetches": {"loss": "loss"},
            "notes": notes,
        }
        self.report(
            node,
            "Keras Horovod: `hvd.init()` starts one process per GPU, `DistributedOptimizer` "
            "averages their gradients; TF2: `tf.distribute.MultiWorkerMirroredStrategy()` (one "
            "process per machine, the cluster from TF_CONFIG), the model compiled in its scope, "
            "`fit` with the global batch; an epoch is then one pass over the data by all "
            "workers together",
            replacement=replacement,
            target=self.context.module,
            safety=FixSafety.UNSAFE,
            imports=tf_imports(self),
            manifest=manifest,
        )

    # -- analysis -----------------------------------------------------------------------------
    def _plan(self, call: cst.Call) -> _Plan:
        expr = self.parent(call)
        line = self.parent(expr) if expr is not None else None
        block = self.parent(line) if line is not None else None
        if not (
            isinstance(expr, cst.Expr)
            and isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
            and isinstance(block, cst.Module | cst.IndentedBlock)
        ):
            raise _Blocked("`hvd.init()` is not a statement of its own")
        body = list(block.body)
        at = body.index(line)
        compiled = fit = None
        compile_at = -1
        for index in range(at + 1, len(body)):
            for node in walk(body[index], into_defs=False):
                if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
                    continue
                method = node.func.attr.value
                if method == "compile" and compiled is None:
                    compiled, compile_at = node, index
                elif method == "fit" and compiled is not None and fit is None:
                    # `<model>.compile(...)`: a method call (its func an Attribute)
                    if dotted(node.func.value) == dotted(cast(cst.Attribute, compiled.func).value):
                        fit = node
        if compiled is None or fit is None:
            raise _Blocked("no `compile` and `fit` of one model follow `hvd.init()` in its block")
        model = dotted(cast(cst.Attribute, compiled.func).value)
        if model is None or "." in model:
            raise _Blocked("the compiled model is not a plain name")
        names = {model}
        optimizer = next(
            (a.value for a in compiled.args if a.keyword and a.keyword.value == "optimizer"), None
        )
        if isinstance(optimizer, cst.Name):
            names.add(optimizer.value)
        built = [i for i in range(compile_at) if names & bound_names(body[i])]
        models = [i for i in built if model in bound_names(body[i])]
        if not models:
            raise _Blocked(f"`{model}` is not built in the block of `hvd.init()`")
        if models[0] < at:
            raise _Blocked("the model is built before `hvd.init()`")
        first = min(i for i in built if i > at)
        plan = _Plan(block, line, first, compile_at, fit, None)
        self._check_uses(plan)
        plan.sessions = self._sessions()
        return plan

    def _sessions(self) -> _Sessions | None:
        reader = KerasSessionHandling(self.context)
        return reader._sessions()

    def _check_uses(self, plan: _Plan) -> None:
        """Every Horovod name the module uses is one this conversion rewrites."""
        for node in walk(self.context.module):
            if isinstance(node, cst.Import | cst.ImportFrom):
                continue
            if not isinstance(node, cst.Attribute | cst.Name):
                continue
            api = _api(self.qualify(node))
            if api is None:
                continue
            holder = self.parent(node)
            if isinstance(holder, cst.Attribute) and holder.value is node:
                continue  # `hvd.callbacks` of `hvd.callbacks.X`: X is checked
            call = holder if isinstance(holder, cst.Call) and holder.func is node else None
            if call is None:
                raise _Blocked(f"`{self.context.module.code_for_node(node)}` is used as a value")
            if api in _DROPPED_CALLBACKS or api == _WARMUP:
                self._callback(call, api, plan)
            elif api == "DistributedOptimizer":
                given = call.args[0] if len(call.args) == 1 else None
                if given is None or (given.keyword and given.keyword.value != "optimizer"):
                    raise _Blocked("`DistributedOptimizer` is given more than the optimizer")
            elif api == "local_rank":
                if not self._pins_gpu(call):
                    raise _Blocked("`hvd.local_rank()` is used beyond pinning the GPU")
            elif api not in _HANDLED:
                raise _Blocked(f"`hvd.{api}` has no conversion here")

    def _callback(self, call: cst.Call, api: str, plan: _Plan) -> None:
        """A Horovod callback in a list literal, or in `callbacks.append(...)` as a line."""
        holder = self.parent(call)
        if isinstance(holder, cst.Element) and isinstance(self.parent(holder), cst.List):
            plan.warmup |= api == _WARMUP
            return
        arg = holder if isinstance(holder, cst.Arg) else None
        append = self.parent(arg) if arg is not None else None
        line = self.enclosing_statement(call)
        if (
            isinstance(append, cst.Call)
            and isinstance(append.func, cst.Attribute)
            and append.func.attr.value == "append"
            and isinstance(small := _small(line), cst.Expr)
            and small.value is append
        ):
            plan.drop.add(id(line))
            plan.warmup |= api == _WARMUP
            return
        raise _Blocked(f"Horovod's `{api}` is not in a list of callbacks")

    def _pins_gpu(self, call: cst.Call) -> bool:
        """`config.gpu_options.visible_device_list = str(hvd.local_rank())` (or in GPUOptions)."""
        for ancestor in self.ancestors(call):
            if isinstance(ancestor, cst.Assign):
                return any(
                    (dotted(t.target) or "").endswith("visible_device_list")
                    for t in ancestor.targets
                )
            if isinstance(ancestor, cst.Arg) and ancestor.keyword is not None:
                return ancestor.keyword.value == "visible_device_list"
            if isinstance(ancestor, cst.BaseStatement):
                return False
        return False

    # -- the rewrite --------------------------------------------------------------------------
    def _rewrite(self, plan: _Plan) -> cst.Module:
        tf = tf_module(self) or "tf"
        strategy = "strategy"
        while strategy in self.context.resolver.bindings or any(
            strategy in bound_names(s) for s in self.context.module.body
        ):
            strategy = "multi_worker_" + strategy
        create = cst.parse_statement(
            f"{strategy} = {tf}.distribute.MultiWorkerMirroredStrategy()\n"
        )
        sessions = plan.sessions
        config_code: list[str] = []
        if sessions is not None:
            device = device_config(self)
            reader = KerasSessionHandling(self.context)
            for setting in sessions.settings:
                if reader.reads_horovod(setting.value):
                    continue  # the GPU pinning goes: the strategy uses every GPU of its machine
                lines = device._statements_for(setting, 1)
                if lines is None:
                    raise _Blocked(f"the session's `{setting.field}` has no tf.config equivalent")
                config_code.extend(lines)
        config: list[cst.BaseStatement] = (
            list(cst.parse_module("\n".join(config_code) + "\n").body) if config_code else []
        )
        module = self.context.module.visit(_Convert(self, plan, strategy, create, config))
        return _drop_horovod_import(module)

    def _line(self, node: cst.CSTNode) -> int:
        return self.position(node).start.line


class _Convert(cst.CSTTransformer):
    """Horovod's calls as the strategy's (size, rank, the optimizer wrapper, the callbacks), the
    session's settings as tf.config calls before the strategy, the model in its scope."""

    def __init__(
        self,
        rule: KerasHorovod,
        plan: _Plan,
        strategy: str,
        create: cst.BaseStatement,
        config: list[cst.BaseStatement],
    ) -> None:
        super().__init__()
        self.rule, self.plan, self.strategy = rule, plan, strategy
        self.create, self.config = create, config
        sessions = plan.sessions
        self.first_session = id(sessions.calls[0]) if sessions else None
        # the strategy is made after the device settings: memory growth cannot change later
        self.after_session = sessions is not None and rule._line(sessions.calls[0]) > rule._line(
            plan.init
        )
        self.gone = set(plan.drop)
        if sessions is not None:
            self.gone |= sessions.drop | {id(c) for c in sessions.calls[1:]}
        if self.after_session:
            self.gone.add(id(plan.init))
        self.warmup_done = False

    def _api(self, node: cst.BaseExpression) -> str | None:
        return _api(self.rule.qualify(node))

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        api = self._api(original.func)
        if api == "size":
            return cst.parse_expression(f"{self.strategy}.num_replicas_in_sync")
        if api == "rank":
            index = f"{self.strategy}.cluster_resolver.task_id or 0"
            bare = isinstance(self.rule.parent(original), cst.Arg)  # f(rank): no parentheses
            return cst.parse_expression(index if bare else f"({index})")
        if api == "DistributedOptimizer":
            return updated.args[0].value
        if original is self.plan.fit:
            args = []
            for arg in updated.args:
                if arg.keyword is not None and arg.keyword.value == "batch_size":
                    shown = cst.Module([]).code_for_node(arg.value)
                    value = cst.parse_expression(f"{shown} * {self.strategy}.num_replicas_in_sync")
                    arg = arg.with_changes(value=value)
                args.append(arg)
            return updated.with_changes(args=args)
        return updated

    def leave_Comparison(
        self, original: cst.Comparison, updated: cst.Comparison
    ) -> cst.BaseExpression:
        # `hvd.rank() == 0`: the process that logs and saves, the chief
        if (
            isinstance(original.left, cst.Call)
            and self._api(original.left.func) == "rank"
            and len(original.comparisons) == 1
            and isinstance(original.comparisons[0].operator, cst.Equal)
            and isinstance(original.comparisons[0].comparator, cst.Integer)
            and original.comparisons[0].comparator.value == "0"
        ):
            return cst.parse_expression(f"{self.strategy}.extended.should_checkpoint")
        return updated

    def leave_Element(self, original, updated):
        value = original.value
        if isinstance(value, cst.Call) and self._api(value.func) in (*_DROPPED_CALLBACKS, _WARMUP):
            return cst.RemoveFromParent()
        return updated

    def leave_List(self, original: cst.List, updated: cst.List) -> cst.List:
        if original.elements and not updated.elements:
            return cst.List([])  # no whitespace of the removed elements left inside
        if len(updated.elements) != len(original.elements) and updated.elements:
            last = updated.elements[-1]
            if original.elements[-1].comma is cst.MaybeSentinel.DEFAULT:
                elements = [
                    *updated.elements[:-1],
                    last.with_changes(comma=cst.MaybeSentinel.DEFAULT),
                ]
                updated = updated.with_changes(elements=elements)
        return updated

    def leave_SimpleStatementLine(self, original, updated):
        small = _small(updated)
        if (
            isinstance(small, cst.Assign)
            and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Name)
            and isinstance(small.value, cst.Name)
            and small.targets[0].target.value == small.value.value
        ):
            self.gone.add(id(original))  # `opt = hvd.DistributedOptimizer(opt)` became `opt = opt`
        if self.plan.warmup and not self.warmup_done and self._holds_warmup(original):
            self.warmup_done = True
            todo = cst.EmptyLine(
                comment=cst.Comment(
                    "# TODO(tfmigrate): TFM402 Horovod's LearningRateWarmupCallback is gone: "
                    "Keras has no warm-up callback; give the optimizer a "
                    "keras.optimizers.schedules.LearningRateSchedule that warms up"
                )
            )
            return updated.with_changes(leading_lines=[*updated.leading_lines, todo])
        return updated

    def _holds_warmup(self, statement: cst.CSTNode) -> bool:
        return any(
            isinstance(n, cst.Call) and self._api(n.func) == _WARMUP for n in walk(statement)
        )

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        body, left = self._body(original, original.body, updated.body)
        return updated.with_changes(body=body, footer=[*left, *updated.footer])

    def leave_IndentedBlock(
        self, original: cst.IndentedBlock, updated: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        body, left = self._body(original, original.body, updated.body)
        if not body:
            return updated.with_changes(body=[cst.SimpleStatementLine([cst.Pass()], left)])
        return updated.with_changes(body=body, footer=[*left, *updated.footer])

    def _body(self, block, originals, updated):
        """The block's new statements (the scope's among them) and comments left at its end."""
        out: list[tuple[int, cst.BaseStatement]] = []  # (index of the original, statement)
        carried: list[cst.EmptyLine] = []
        for index, (old, new) in enumerate(zip(originals, updated, strict=True)):
            replaced: list[cst.BaseStatement] | None = None
            if old is self.plan.init and not self.after_session:
                replaced = [self.create]
            elif id(old) == self.first_session:
                replaced = [*self.config, *([self.create] if self.after_session else [])]
            elif id(old) in self.gone:
                replaced = []
            if replaced is not None:
                own = list(new.leading_lines)
                carried += own if not carried else [line for line in own if line.comment]
                if not replaced:
                    continue
                new, rest = replaced[0], replaced[1:]
                new = new.with_changes(leading_lines=carried)
                carried = []
                out.append((index, new))
                out.extend((index, r) for r in rest)
                continue
            if carried:
                new = new.with_changes(leading_lines=carried_lines(carried, new.leading_lines))
                carried = []
            out.append((index, new))
        if block is self.plan.block:
            out = self._scoped(out)
        return [s for _, s in out], [line for line in carried if line.comment]

    def _scoped(self, out):
        inside = [s for i, s in out if self.plan.first <= i <= self.plan.last]
        if not inside:
            return out
        at = next(k for k, (i, _) in enumerate(out) if self.plan.first <= i <= self.plan.last)
        head = inside[0]
        inside = [s.with_changes(leading_lines=unindented(s.leading_lines)) for s in inside]
        inside[0] = inside[0].with_changes(leading_lines=[])
        scope = cst.With(
            items=[cst.WithItem(cst.parse_expression(f"{self.strategy}.scope()"))],
            body=cst.IndentedBlock(body=inside),
            leading_lines=head.leading_lines,
        )
        after = [(i, s) for i, s in out if i > self.plan.last]
        return [*out[:at], (self.plan.first, scope), *after]


def _drop_horovod_import(module: cst.Module) -> cst.Module:
    """``module`` without `import horovod.keras as hvd` once nothing reads `hvd`."""
    from tfmigrate.rules._keras2 import is_used

    body = []
    for statement in module.body:
        small = _small(statement)
        if isinstance(small, cst.Import) and len(small.names) == 1:
            alias = small.names[0]
            name = cst.Module([]).code_for_node(alias.name)
            # an import's `as` names a Name (libcst's AsName also serves `with`)
            bound = cast(cst.Name, alias.asname.name).value if alias.asname else name.split(".")[0]
            if name.startswith("horovod") and not is_used(module, bound):
                continue
        body.append(statement)
    return module.with_changes(body=body)
