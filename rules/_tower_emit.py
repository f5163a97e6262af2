"""Writing the TF2 program for a :class:`~tfmigrate.rules._tower_program.Program` (TFM303).

Not a rule module. The new code is written as text from templates (4-space indents, turned into
the file's own indent unit), parsed, and the user's statements are then put in as CST nodes, so
their comments and formatting survive untouched.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import libcst as cst

from tfmigrate.rules._tower_program import Blocked, Program
from tfmigrate.rules._towers import bound_names, free_names, get_arg, walk

if TYPE_CHECKING:
    from tfmigrate.rules._keras_model_plan import KerasPlan

    _Statement = cst.SimpleStatementLine | cst.BaseCompoundStatement  # what a Module holds

# Emitted into the migrated program: it must not import tfmigrate. Lines tagged `[moving]`
# or `[regularization]` are kept only when the program needs them (see store_source).
STORE = """
class TF1Variables:
    \"\"\"Owns the variables that TF1 model code creates with tf.compat.v1.get_variable.

    Used as a custom getter: the first request of a name creates the variable -- eagerly, under
    the strategy (so it is mirrored on every replica), with its legacy name; every later request,
    from any replica, gets that same variable back.
    \"\"\"

    def __init__(self, strategy):
        self.strategy = strategy
        self.variables = {}  # legacy name -> variable, in creation order
        self.trainable = []
        self.moving_averages = []  # made for tf.GraphKeys.MOVING_AVERAGE_VARIABLES  [moving]
        self.regularizers = []  # (variable, regularizer), in creation order  [regularization]

    def getter(self, getter, name, *args, **kwargs):
        variable = self.variables.get(name)
        if variable is None:
            regularizer = kwargs.pop("regularizer", None)  [regularization]
[regularization]
            def create(strategy):
                # name_scope(None): the legacy name alone (the variable scope's name scope,
                # still open here, would prefix it again: model/model/w)
                with tf.init_scope(), tf.compat.v1.name_scope(None), strategy.scope():
                    return getter(name, *args, **kwargs)

            context = tf.distribute.get_replica_context()
            if context is not None and tf.distribute.has_strategy():
                # Inside strategy.run every replica asks; merge_call creates it once.
                variable = context.merge_call(create)
            else:
                variable = create(self.strategy)
            if name in self.variables:  # another replica's request created it
                return self.variables[name]
            self.variables[name] = variable
            if variable.trainable:
                self.trainable.append(variable)
            collections = kwargs.get("collections") or ()  [moving]
            if tf.compat.v1.GraphKeys.MOVING_AVERAGE_VARIABLES in collections:  [moving]
                self.moving_averages.append(variable)  [moving]
            if regularizer is not None:  [regularization]
                self.regularizers.append((variable, regularizer))  [regularization]
        return variable
[regularization]
    def regularization_losses(self):  [regularization]
        \"\"\"What TF1's REGULARIZATION_LOSSES held: the loss of every regularized variable,  [regularization]
        once, computed in the reading replica (so that its gradient reaches this replica's copy).  [regularization]
  [regularization]
        get_variable(regularizer=...) regularizers are kept here, as the variables are made  [regularization]
        once; layers (tf_slim, tf.compat.v1.layers) add theirs to the graph's collection on  [regularization]
        every call, under the calling replica's name scope: this replica's are the ones.\"\"\"  [regularization]
        losses = [regularizer(variable) for variable, regularizer in self.regularizers]  [regularization]
        replica = replica_index()  [regularization]
        graph = tf.compat.v1.get_default_graph()  [regularization]
        for loss in graph.get_collection(tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES):  [regularization]
            head = loss.name.split("/", 1)[0]  # replica k > 0 works under `replica_k/`  [regularization]
            suffix = head[len("replica_"):] if head.startswith("replica_") else ""  [regularization]
            if (int(suffix) if suffix.isdigit() else 0) == replica:  [regularization]
                losses.append(loss)  [regularization]
        return [loss for loss in losses if loss is not None]  [regularization]
[regularization]
    def regularization_loss(self):  [regularization]
        \"\"\"tf.compat.v1.losses.get_regularization_loss(): their sum, 0.0 without any.\"\"\"  [regularization]
        losses = self.regularization_losses()  [regularization]
        if not losses:  [regularization]
            return tf.constant(0.0)  [regularization]
        return tf.add_n(losses, name="total_regularization_loss")  [regularization]

    def scope(self):
        return tf.compat.v1.variable_scope("", custom_getter=self.getter)


def replica_index():
    \"\"\"This replica's number as a Python int: the legacy tower index.\"\"\"
    context = tf.distribute.get_replica_context()
    return int(tf.get_static_value(context.replica_id_in_sync_group))
"""


def store_source(
    moving: bool, regularization: bool, keras: bool = False, tower_index: bool = True
) -> str:
    """The TF1Variables store with only the parts the program uses (none of it when the model
    became a Keras model: the helpers after it only, replica_index if the tower reads it)."""
    if keras:
        return STORE[STORE.index("def replica_index():") :].strip("\n") if tower_index else ""
    kept = []
    for line in STORE.splitlines():
        tag = re.search(r"\s*\[(moving|regularization)\]$", line)
        if tag is not None:
            if not {"moving": moving, "regularization": regularization}[tag.group(1)]:
                continue
            line = line[: tag.start()]
        kept.append(line)
    return "\n".join(kept).strip("\n")


SLOT = "__tfmigrate_slot_{}__"

# `rewrite --jit`: put before step_fn (4-space indents, formatted once). XLA takes
# the replica's forward and backward pass only: compiling the whole replica step (the update
# and its all-reduce) or the outer tf.function fails under MirroredStrategy on several logical
# CPU devices (every replica's compiled call runs on the first device, away from its variables).
JIT_TOWER = """@tf.function(jit_compile=True)
def compiled_tower({inputs}):
    \"\"\"tower_fn compiled with XLA (rewrite --jit): this replica's forward and backward pass;
    the update and the replicas' all-reduce stay outside it.\"\"\"
    {grads}, fetches = tower_fn({inputs})
    return [gradient for gradient, _ in {grads}], fetches

"""
JIT_NOTE = (
    "rewrite --jit: each replica's forward and backward pass (tower_fn) is compiled with XLA "
    "(`compiled_tower`, jit_compile=True); the optimizer update and the all-reduce are not. XLA "
    "fuses and reorders float operations, so losses and weights can differ from the legacy "
    "program's in the last bits; verify runs such a program without TensorFlow's op determinism "
    "(XLA has no deterministic MaxPool gradient) and compares at its usual tolerances"
)

# TF1's default names of the ops a tower loss usually ends with.
_DEFAULT_OP_NAMES = {"reduce_mean": "Mean", "reduce_sum": "Sum", "add_n": "AddN"}
# tf.losses.* without `scope=` open their own default name scope (TF1's losses_impl) and, with
# the default reduction, return its `value` op: `sparse_softmax_cross_entropy_loss/value`.
_LOSS_SCOPES = {
    "absolute_difference": "absolute_difference", "cosine_distance": "cosine_distance_loss",
    "hinge_loss": "hinge_loss", "huber_loss": "huber_loss", "log_loss": "log_loss",
    "mean_squared_error": "mean_squared_error", "compute_weighted_loss": "weighted_loss",
    "sigmoid_cross_entropy": "sigmoid_cross_entropy_loss",
    "softmax_cross_entropy": "softmax_cross_entropy_loss",
    "sparse_softmax_cross_entropy": "sparse_softmax_cross_entropy_loss",
}  # fmt: skip
_LOSS_MODULES = ("tf.losses", "tf.compat.v1.losses")
# The op a Python operator on tensors adds, named after its type as any unnamed op is.
_OPERATOR_OPS: dict[type, str] = {
    cst.Add: "add",
    cst.Subtract: "sub",
    cst.Multiply: "mul",
    cst.Divide: "truediv",
}


def _unsynchronized_build(tower: str, model: str) -> str:
    """The build trace of a model with synchronized batch norms (rewrite --batch-norm sync) runs
    them unsynchronized: a weight made after a cross-replica sum inside that trace cannot be
    lifted out of it (TF 2.21: UnliftableError on the next layer's kernel)."""
    trace = "create_variables.get_concrete_function(*["
    start = tower.index(trace)
    end = tower.index("\n", tower.index("element_spec])", start)) + 1
    before = (
        f"synchronized_layers = [l for l in {model}.layers if getattr(l, 'synchronized', False)]\n"
        "for synchronized_layer in synchronized_layers:  # synchronized from the first step on\n"
        "    synchronized_layer.synchronized = False\n"
    )
    after = (
        "for synchronized_layer in synchronized_layers:\n"
        "    synchronized_layer.synchronized = True\n"
    )
    return tower[:start] + before + tower[start:end] + after + tower[end:]


class _FillSlots(cst.CSTTransformer):
    """Replaces each ``__tfmigrate_slot_k__`` statement with the statements of slot k."""

    def __init__(self, slots: dict[str, list[cst.CSTNode]]) -> None:
        super().__init__()
        self.slots = slots

    def leave_SimpleStatementLine(self, original, updated):
        if len(updated.body) == 1 and isinstance(updated.body[0], cst.Expr):
            value = updated.body[0].value
            if isinstance(value, cst.Name) and value.value in self.slots:
                statements = self.slots[value.value]
                return cst.FlattenSentinel(statements) if statements else cst.RemoveFromParent()
        return updated


class _Collections(cst.CSTTransformer):
    """``tf.compat.v1.trainable_variables()`` / ``moving_average_variables()`` (graph
    collections) -> the store's lists (or the Keras model's weights)."""

    def __init__(self, keras: KerasPlan | None = None) -> None:
        super().__init__()
        self.trainable = keras.trainable if keras else "tf1_variables.trainable"
        # No layer converted to Keras put a variable in TF1's MOVING_AVERAGE_VARIABLES (batch
        # norm's moving statistics are not in it on TF 2.21's compat layer, measured): empty.
        self.moving = "[]" if keras else "tf1_variables.moving_averages"

    def leave_BinaryOperation(self, original, updated):
        # `trainable + []` (an empty collection, see above) is the trainable list alone
        if isinstance(updated.operator, cst.Add) and isinstance(updated.right, cst.List):
            if not updated.right.elements and self.moving == "[]":
                return updated.left
        return updated

    def leave_Call(self, original, updated):
        code = cst.Module([]).code_for_node(updated.func)
        if code.endswith("trainable_variables") and not updated.args:
            return cst.parse_expression(self.trainable)
        if code.endswith("moving_average_variables") and not updated.args:
            return cst.parse_expression(self.moving)
        return updated


class _RegularizationReads(cst.CSTTransformer):
    """Reads of TF1's REGULARIZATION_LOSSES collection -> the store's answer (or the Keras
    model's losses: its layers' regularizers, computed in the reading replica)."""

    def __init__(self, keras: KerasPlan | None = None) -> None:
        super().__init__()
        self.losses = "tf1_variables.regularization_losses()"
        self.loss = "tf1_variables.regularization_loss()"
        if keras is not None:
            self.losses = f"{keras.instance}.losses"
            self.loss = (
                f"tf.add_n({keras.instance}.losses)" if keras.regularized else "tf.constant(0.0)"
            )

    def leave_Call(self, original, updated):
        code = cst.Module([]).code_for_node(updated.func)
        if code.endswith("losses.get_regularization_losses") and not updated.args:
            return cst.parse_expression(self.losses)
        if code.endswith("losses.get_regularization_loss") and not updated.args:
            return cst.parse_expression(self.loss)
        if (
            code.endswith("get_collection")
            and len(updated.args) == 1
            and cst.Module([])
            .code_for_node(updated.args[0].value)
            .endswith("GraphKeys.REGULARIZATION_LOSSES")
        ):
            return cst.parse_expression(self.losses)
        return updated


def _is_call(call: cst.Call, receiver: str, method: str) -> bool:
    return (
        isinstance(call.func, cst.Attribute)
        and call.func.attr.value == method
        and isinstance(call.func.value, cst.Name)
        and call.func.value.value == receiver
    )


class _LoopLogging(cst.CSTTransformer):
    """``writer.add_summary(summary, step)`` -> tf.summary scalars of the fetched values;
    ``saver.save(sess, path, global_step=step)`` -> ``manager.save(checkpoint_number=step)``."""

    def __init__(self, program: Program, strip: bool = False) -> None:
        super().__init__()
        self.log = program.logging
        self.strip = strip  # drop those statements instead (to check what else is left)

    def leave_SimpleStatementLine(self, original, updated):
        small = updated.body[0] if len(updated.body) == 1 else None
        call = small.value if isinstance(small, cst.Expr) else None
        if not isinstance(call, cst.Call):
            return updated
        if self.log.writer is not None and _is_call(call, self.log.writer[0], "add_summary"):
            summary, step = get_arg(call, 0, "summary"), get_arg(call, 1, "global_step")
            if summary is None or step is None:
                return updated
            if self.strip:
                return cst.parse_statement("pass")
            code = cst.Module([]).code_for_node
            # What tf.summary.scalar writes, without needing TensorBoard installed to write it.
            return cst.parse_statement(
                f"with {self.log.writer[0]}.as_default(step={code(step)}):\n"
                f"    for summary_tag, summary_value in {code(summary)}.items():\n"
                "        tf.summary.write(summary_tag, tf.cast(summary_value, tf.float32),\n"
                "                         metadata=scalar_metadata)\n"
            ).with_changes(leading_lines=updated.leading_lines)
        if self.log.saver is not None and _is_call(call, self.log.saver[0], "save"):
            if self.strip:
                return cst.parse_statement("pass")
            step = get_arg(call, None, "global_step")
            number = f"checkpoint_number={cst.Module([]).code_for_node(step)}" if step else ""
            return cst.parse_statement(f"manager.save({number})").with_changes(
                leading_lines=updated.leading_lines
            )
        return updated


class _Replace(cst.CSTTransformer):
    """Replaces every occurrence of one expression (compared structurally) with another."""

    def __init__(self, old: cst.BaseExpression, new: cst.BaseExpression) -> None:
        super().__init__()
        self.old, self.new = old, new

    def on_leave(self, original, updated):
        if isinstance(original, cst.BaseExpression) and original.deep_equals(self.old):
            return self.new
        return updated


def _indent(text: str, unit: str) -> str:
    """Template text (4-space indents) in the module's own indent unit."""
    text = textwrap.dedent(text).strip("\n") + "\n"
    return re.sub(r"^((?:    )+)", lambda m: unit * (len(m.group(1)) // 4), text, flags=re.M)


class Emitter:
    def __init__(self, module: cst.Module, program: Program) -> None:
        self.module = module
        self.p = program
        self.code = module.code_for_node
        self.slots: dict[str, list[cst.CSTNode]] = {}
        self.strategy_count = cst.parse_expression("strategy.num_replicas_in_sync")
        # Set when the model became a Keras model (see _keras_model_plan).
        self.keras: KerasPlan | None = None
        # `rewrite --jit`: each replica's forward and backward pass compiled with XLA.
        self.jit = False
        # `rewrite --batch-norm sync`: what the synchronized batch norms do with the statistics.
        self.synchronized_statistics = ""

    def slot(self, statements: Sequence[cst.CSTNode]) -> str:
        key = SLOT.format(len(self.slots))
        statements = [self._retarget(s) for s in statements]
        if statements and hasattr(statements[0], "leading_lines"):
            # A blank line that separated it from what came before would open the block now.
            lines = [line for line in statements[0].leading_lines if line.comment is not None]
            statements[0] = statements[0].with_changes(leading_lines=lines)
        self.slots[key] = statements
        return key

    def _retarget(self, node):
        """The legacy tower count (`flags.num_gpus`) is the strategy's replica count now."""
        return node.visit(_Replace(self.p.tower_count, self.strategy_count))

    def expr(self, node: cst.CSTNode) -> str:
        return self.code(self._retarget(node))

    # -- the pieces ---------------------------------------------------------------------------
    def fetch_keys(self) -> dict[str, str]:
        """Tower tensor name -> train_step key: the legacy op's own name when it is a literal
        (`tf.add_n(losses, name='total_loss')`), so that verify matches it by name."""
        keys: dict[str, str] = {}
        for fetch in self.p.fetches:
            if fetch.tensor in (self.p.train_op, self.p.logging.summary_op):
                continue
            if fetch.tensor in self.p.memory_fetches:
                continue  # not a graph value any more: the loop asks tf.config
            tensor = self.p.collected.get(fetch.tensor, fetch.tensor)
            where = self.p.tower_body
            if tensor in self.p.reductions:
                where = self.p.tower_body + self._reduction_statements()
            elif tensor in self.setup_fetches():
                where = self.p.graph_setup
            keys[tensor] = self.p.fetch_names.get(tensor) or self._op_name(tensor, where) or tensor
            if self.p.train_value is not None and tensor == self.p.train_value[0]:
                keys[tensor] = self.p.train_value[1]  # the loop fetched the with_dependencies op
        for source in self.p.reductions.values():
            tensor = self.p.collected[source]
            keys.setdefault(
                tensor,
                self.p.fetch_names.get(tensor)
                or self._op_name(tensor, self.p.tower_body)
                or tensor,
            )
        return keys

    def _reduction_statements(self) -> list[cst.BaseStatement]:
        return [
            cst.SimpleStatementLine(
                [cst.Assign([cst.AssignTarget(cst.Name(name))], self.p.reduction_calls[name])]
            )
            for name in self.p.reductions
        ]

    def _op_name(self, name: str, statements, depth: int = 0) -> str | None:
        value = None
        conditional: set[int] = set()  # assignments some towers skip (`if i == 0: loss = ...`)
        last_conditional = False
        for statement in statements:
            for node in walk(statement):
                if isinstance(node, cst.If):
                    conditional |= {id(n) for n in walk(node)}
                if isinstance(node, cst.Assign) and any(
                    isinstance(t.target, cst.Name) and t.target.value == name for t in node.targets
                ):
                    value, last_conditional = node.value, id(node) in conditional
        if last_conditional and isinstance(value, cst.BinaryOperation):
            return None  # the towers' tensors have different ops: no one name
        return self._name_of(value, depth)

    def _name_of(self, value, depth: int) -> str | None:
        if isinstance(value, cst.BinaryOperation) and type(value.operator) in _OPERATOR_OPS:
            # `tower_loss(...) / num_gpus`: TF1 named the tensor after the operator's op
            return _OPERATOR_OPS[type(value.operator)]
        if not isinstance(value, cst.Call) or depth > 5:
            return None
        literal = get_arg(value, None, "name")
        given = literal.evaluated_value if isinstance(literal, cst.SimpleString) else None
        if isinstance(given, str):
            return given
        scope = get_arg(value, None, "scope")
        scope_name = scope.evaluated_value if isinstance(scope, cst.SimpleString) else None
        if (
            isinstance(scope_name, str)
            and isinstance(value.func, cst.Attribute)
            and isinstance(value.func.value, cst.Attribute)
            and value.func.value.attr.value == "losses"
        ):
            # tf.losses.*(..., scope='xent') returns the tensor `xent/value`.
            return f"{scope_name}/value"
        if (
            scope is None
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in _LOSS_SCOPES
            and cst.Module([]).code_for_node(value.func.value) in _LOSS_MODULES
            and get_arg(value, None, "reduction") is None
            and len(value.args) <= 3  # no positional scope or reduction
        ):
            return f"{_LOSS_SCOPES[value.func.attr.value]}/value"
        if isinstance(value.func, cst.Attribute) and value.func.attr.value in _DEFAULT_OP_NAMES:
            # An unnamed op is named after its type (`tower_1/Mean`): verify strips the tower.
            return _DEFAULT_OP_NAMES[value.func.attr.value]
        if isinstance(value.func, cst.Name):
            for statement in self.module.body:
                if (
                    isinstance(statement, cst.FunctionDef)
                    and statement.name.value == value.func.value
                ):
                    returns = [n for n in walk(statement) if isinstance(n, cst.Return)]
                    if len(returns) == 1 and returns[0].value is not None:
                        ret = returns[0].value
                        if isinstance(ret, cst.Name):
                            return self._op_name(ret.value, statement.body.body, depth + 1)
                        return self._name_of(ret, depth + 1)
        return None

    def training_body(self, keys: dict[str, str], checkpointed: bool) -> str:
        """The training function's set-up: the variables, the input, one tf.function train step
        (and, `checkpointed`, the tf.train.Checkpoint the loop saves or restores) -- at the
        function's indent, 4 spaces.

        One template for both kinds of input; only the input section differs (a generator of
        the fed batches, or the legacy tf.data dataset itself); the strategy's distributed dataset
        cuts either into the replicas' parts."""
        p = self.p
        python_setup = self.slot(p.python_setup)
        graph_setup = self.slot(p.graph_setup)
        if p.dataset is None:
            input_section, spec_source = self._fed_input(), "dataset"
        else:
            given = (
                "the i-th batch of each step, as tower i dequeued"
                if p.queue is not None and p.queue.dequeued_from is not None
                else "the i-th slice of each batch, as tf.split gave tower i"
            )
            input_section = (
                f"# Replica i receives {given}.\n"
                f"batches = iter(strategy.experimental_distribute_dataset({p.dataset}))\n"
            )
            spec_source = p.dataset
        store = (
            "with strategy.scope():"
            if self.keras is not None
            else "tf1_variables = TF1Variables(strategy)\n"
            "            with strategy.scope(), tf1_variables.scope():"
        )
        head = textwrap.dedent(f"""
            {python_setup}
            {store}
                {graph_setup}
            """).strip("\n")
        sections = [input_section, self._tower_section(keys, spec_source, checkpointed)]
        return "\n\n".join(textwrap.indent(s.strip("\n"), "    ") for s in [head, *sections])

    def built_at_construction(self) -> bool:
        """The Keras model makes its weights in its constructor (no shape read from a batch)."""
        return self.keras is not None and "self.build(None)" in self.keras.model.source

    def _fed_input(self) -> str:
        """A generator of what the legacy loop fed (its own feed code), as a dataset."""
        p = self.p
        header = self.code(p.step_loop.target), self.expr(p.step_loop.iter)
        # fed: each a tf.placeholder, read with its dtype and shape
        specs = "".join(
            f"\n        tf.TensorSpec({self._spec_shape(cast(cst.BaseExpression, ph.shape))}, "
            f"{self.code(cast(cst.BaseExpression, ph.dtype))}),"
            for ph in p.placeholders
        )
        prelude = self.slot(p.session_prelude)
        feed = self.slot(p.feed_statements)
        if p.tower_feed is None:
            values = [self.expr(p.feed_values[ph.name]) for ph in p.placeholders]
            yielded = f"({values[0]},)" if len(values) == 1 else ", ".join(values)
            fill = ""
            slicing = "Replica i receives the i-th slice of each global batch, as tower i did."
            doc = "What the legacy loop fed, one global batch per step."
        else:
            np_name = self.numpy_name()
            parts = [f"{ph.name}_parts" for ph in p.placeholders]
            joined = [f"{np_name}.concatenate({part})" for part in parts]
            yielded = f"({joined[0]},)" if len(joined) == 1 else ", ".join(joined)
            lists = (
                ", ".join(parts)
                + (" =" if len(parts) == 1 else " = ")
                + ", ".join("[]" for _ in parts)
            )
            tower_slot = self.slot(p.tower_feed.statements)
            fill = (
                f"\n        {lists}"
                f"\n        for {p.tower_feed.index} in range(strategy.num_replicas_in_sync):"
                f"\n            {tower_slot}"
            )
            slicing = (
                "The towers' feeds, one after another: replica i receives the i-th "
                "slice, as tower i did."
            )
            doc = "What the legacy loop fed the towers, as one global batch per step."
        generator = (
            "\n"
            "def fed_batches():\n"
            f'    """{doc}"""\n'
            f"    {prelude}\n"
            f"    for {header[0]} in {header[1]}:\n"
            f"        {feed}{fill}\n"
            f"        yield {yielded}\n"
        )
        dataset = f"    fed_batches,\n    output_signature=({specs}\n    ),\n)\n"
        return (
            generator + "\n"
            "dataset = tf.data.Dataset.from_generator(\n" + dataset + f"# {slicing}\n"
            "batches = iter(strategy.experimental_distribute_dataset(dataset))\n"
        )

    def _tower_section(self, keys: dict[str, str], spec_source: str, checkpointed: bool) -> str:
        """The replica function, the variable-creating trace (when the variables must exist
        before the first step), the EMA, the train step, the checkpoint."""
        p = self.p
        inputs = ", ".join(ph.name for ph in p.placeholders)
        scale = " / strategy.num_replicas_in_sync" if p.averaged else ""
        scale_note = (
            "# The towers AVERAGED their gradients; apply_gradients SUMS the replicas'."
            if p.averaged
            else "# The towers SUMMED their gradients, as apply_gradients does: not rescaled."
        )
        withs = "".join(f", {self.code(item)}" for item in p.tower_withs)
        setup_fetches = self.setup_fetches()
        sources = {p.collected[source] for source in p.reductions.values()}
        tower_keys = {
            t: k
            for t, k in keys.items()
            if (t not in p.reductions or t in sources) and t not in setup_fetches
        }
        fetched = ", ".join(f"{key!r}: {tensor}" for tensor, key in tower_keys.items())
        keras = self.keras
        # both rewrite expressions inside the statements, removing none
        body = self.slot(
            [cast(cst.BaseStatement, s.visit(_RegularizationReads(keras))) for s in p.tower_body]
        )
        apply = self.slot([cast(cst.BaseStatement, s.visit(_Collections(keras))) for s in p.apply])
        reads = "".join(
            f"\n    fetches[{keys[name]!r}] = {name}() if callable({name}) else {name}"
            for name in setup_fetches
        )
        if reads:
            reads = f"\n    # Read before the update, as the legacy fetch was.{reads}"
        reduced = "".join(
            f"\n    outputs[{keys[name]!r}] = strategy.reduce("
            f"tf.distribute.ReduceOp.{p.reduction_ops.get(name, 'SUM')}, "
            f"outputs[{tower_keys[p.collected[source]]!r}], axis=None)"
            for name, source in p.reductions.items()
        ) + "".join(
            f"\n    outputs[{keys[name]!r}] = strategy.experimental_local_results("
            f"outputs[{keys[name]!r}])[0]  # the same on every replica"
            for name in setup_fetches
        )
        if reduced:
            run = f"outputs = strategy.run(step_fn, args=batch){reduced}\n    return outputs"
        else:
            run = "return strategy.run(step_fn, args=batch)"
        # The variables exist before the first step only where something needs them then:
        # the EMA's shadows, the checkpoint's list of them, a synchronized batch norm (whose
        # weights cannot be made inside a trace that sums across replicas).
        trace = not self.built_at_construction() and bool(
            p.ema is not None or checkpointed or self.synchronized_statistics
        )
        variables = "variables"
        listed = (checkpointed or p.ema is not None) and keras is None
        ema = ""
        if p.ema is not None:
            name = p.ema[0]
            ema_slot = self.slot([p.ema[1]])
            averaged = self.code(
                cast(cst.BaseExpression, self.ema_variables().visit(_Collections(keras)))
            )
            ema = (
                "\n"
                "with strategy.scope():\n"
                f"    {ema_slot}\n"
                "    # Creates the shadow variables now (equal to the weights, as TF1 initialised\n"
                "    # them), outside the train step.\n"
                f"    {name}.apply({averaged})\n"
                "variables = dict(tf1_variables.variables)\n"
                "for legacy_name, variable in tf1_variables.variables.items():\n"
                f"    average = {name}.average(variable)\n"
                "    if average is not None:\n"
                f'        variables[f"{{legacy_name}}/{{{name}.name}}"] = average\n'
            )
            listed = False
            if not checkpointed:  # the shadows are listed for the checkpoint only
                ema = ema[: ema.index("variables = dict(")]
            elif keras is not None:  # the shadows named after the Keras weight paths
                ema = (
                    ema.replace("variables = dict(tf1_variables.variables)\n", "")
                    .replace(
                        "for legacy_name, variable in tf1_variables.variables.items():",
                        "for weight_path, variable in list(variables.items()):",
                    )
                    .replace("{legacy_name}", "{weight_path}")
                )
        loss = self.expr(p.loss)
        tower = textwrap.dedent('''
            def tower_fn({inputs}):
                """One tower of the legacy loop, now one replica."""
                {p.tower_index} = replica_index()
                with tf1_variables.scope(){withs}, tf.GradientTape() as tape:
                    {body}
                    {scale_note}
                    replica_loss = {loss}{scale}
                variables_to_train = {var_list}
                {p.grads_name} = list(zip(
                    tape.gradient(replica_loss, variables_to_train), variables_to_train))
                return {p.grads_name}, {{{fetched}}}
            ''')
        if trace:
            tower += textwrap.dedent("""
                @tf.function
                def create_variables(*batch):
                    strategy.run(tower_fn, args=batch)

                # The model code makes its variables on first use: a trace of one replica step
                # (nothing runs) makes them now, mirrored, before training reads them.
                create_variables.get_concrete_function(*[
                    tf.TensorSpec([None, *spec.shape[1:]], spec.dtype) for spec in {spec_source}.element_spec])
                """)
        if listed:
            tower += "variables = dict(tf1_variables.variables)\n"
        if keras is not None:
            tower = self._keras_tower(tower, withs, keras, checkpointed)
        statistics = ""
        if p.update_ops is not None:
            lines = textwrap.wrap(
                "No UPDATE_OPS to run: the batch-norm layers update themselves in tower_fn. "
                f"TFM303: {self.statistics_reason()}.",
                width=84,
            )
            statistics = "".join(f"\n    # {line}" for line in lines)
        step = textwrap.dedent("""
            {compiled}def step_fn({inputs}):
                {p.grads_name}, fetches = {tower_call}({inputs}){rezip}{reads}
                {apply}{statistics}
                return fetches

            @tf.function
            def train_step(batch):
                {run}
            """)
        if checkpointed:
            step += (
                "\ncheckpoint = tf.train.Checkpoint(variables={variables}, "
                "optimizer={p.optimizer})\n"
            )
        compiled, tower_call, rezip = "", "tower_fn", ""
        if self.jit:
            trainable = keras.trainable if keras is not None else "tf1_variables.trainable"
            compiled = JIT_TOWER.format(grads=p.grads_name, inputs=inputs)
            tower_call = "compiled_tower"
            rezip = f"\n    {p.grads_name} = list(zip({p.grads_name}, {trainable}))"
        values = dict(
            p=p, inputs=inputs, withs=withs, body=body, scale_note=scale_note, loss=loss,
            compiled=compiled, tower_call=tower_call, rezip=rezip,
            scale=scale, fetched=fetched, spec_source=spec_source, reads=reads, apply=apply,
            run=run, variables=variables, statistics=statistics,
            keras_withs=withs[2:] + ", " if withs else "",
            var_list=keras.trainable if keras is not None else "tf1_variables.trainable",
        )  # fmt: skip
        return tower.format(**values) + ema + step.format(**values)

    def _keras_tower(self, tower: str, withs: str, keras: KerasPlan, listed: bool) -> str:
        """The tower template for a Keras model: no variable store; the model's weights are
        what the optimizer updates (and, `listed`, what the checkpoint and the EMA take, by
        Keras weight path)."""
        if self.synchronized_statistics:
            tower = _unsynchronized_build(tower, keras.instance)
        if listed:
            tower += (
                # (doubled braces: the template is formatted after this)
                f"variables = {{{{weight.path: weight.value for weight in {keras.instance}.weights}}}}\n"
            )
            if keras.global_step is not None:  # a TF1 variable the checkpoint keeps too
                tower += f'variables["global_step"] = {keras.global_step}\n'
        if not self.uses_tower_index():  # it only chose the variable scope's reuse
            tower = tower.replace("{p.tower_index} = replica_index()\n    ", "")
        if "get_concrete_function(" in keras.model.source:
            # A get_variable model reads a weight's shape from its computation, as TF1 read it
            # from the tower's static input (`tf.reshape(x, [FLAGS.batch_size, -1])`): the
            # trace that builds it gets each replica's own batch size when the batches have one.
            tower = tower.replace(
                "tf.TensorSpec([None, *spec.shape[1:]], spec.dtype)",
                "tf.TensorSpec([\n        spec.shape[0] // strategy.num_replicas_in_sync if "
                "spec.shape[0] else None,\n        *spec.shape[1:]], spec.dtype)",
            )
        return tower.replace("with tf1_variables.scope(){withs}, ", "with {keras_withs}")

    def uses_tower_index(self) -> bool:
        return any(
            isinstance(n, cst.Name) and n.value == self.p.tower_index
            for s in [*self.p.tower_body, *self.p.tower_withs]
            for n in walk(s)
        )

    def uses_moving_averages(self) -> bool:
        return any(
            isinstance(n, cst.Call) and self.code(n.func).endswith("moving_average_variables")
            for s in self.p.apply
            for n in walk(s)
        )

    def uses_regularization(self) -> bool:
        # a libcst statement is a line or a compound statement; BaseStatement is their base
        module = cst.Module(body=cast("list[_Statement]", list(self.p.tower_body)))
        return module.visit(_RegularizationReads(self.keras)).code != module.code

    def statistics_reason(self) -> str:
        """What the legacy step did with the batch-norm moving statistics, what the migrated
        one does, for the manifest and a comment in the program."""
        ops = self.p.update_ops
        if ops is None:
            legacy = "the legacy step never ran the batch-norm UPDATE_OPS"
        elif ops.kind == "global":
            legacy = (
                "the legacy step ran every tower's batch-norm UPDATE_OPS (all of "
                "tf.GraphKeys.UPDATE_OPS), one tower's after another in no fixed order: the "
                "statistics moved once per tower and step"
            )
        elif ops.kind == "last":
            legacy = (
                "the legacy step ran only the last tower's batch-norm UPDATE_OPS (scope "
                f"`{ops.test}` after the tower loop)"
            )
        else:
            legacy = (
                "the legacy step ran the batch-norm UPDATE_OPS only of the towers selected by "
                f"`{ops.test}`"
            )
        names = {
            n.attr.value if isinstance(n, cst.Attribute) else n.value
            for n in walk(self.module)
            if isinstance(n, cst.Attribute | cst.Name)
        }
        if self.keras is not None:
            how = (
                "each replica's Keras batch-norm layers update their own copy of the moving "
                "statistics from the replica's sub-batch, once per step (the copies drift apart; "
                "replica 0's is what a checkpoint and verify read)"
            )
        elif "batch_norm" in names and "batch_normalization" not in names:
            how = (
                "with the MEAN of the replicas' batch statistics (assign_moving_average "
                "all-reduces them)"
            )
        elif "batch_normalization" in names and "batch_norm" not in names:
            how = (
                "on each replica from its own sub-batch (each replica's copy drifts; replica "
                "0's is what a checkpoint keeps)"
            )
        else:
            how = "per replica or as the replicas' mean, depending on the layer"
        if self.synchronized_statistics:
            return f"{legacy}; {self.synchronized_statistics}"
        if self.keras is not None:
            # Replica 0 updates from tower 0's sub-batch: what a legacy step keeping only the
            # first tower's UPDATE_OPS did, and nothing else (measured by verify).
            return (
                f"{legacy}; under MirroredStrategy {how}: moving_mean/moving_variance equal the "
                "legacy values only where the legacy step kept the FIRST tower's updates, and "
                "differ otherwise; weights and training losses do not depend on them"
            )
        return (
            f"{legacy}; under MirroredStrategy every step updates the moving statistics once (a "
            f"tf.function runs every stateful op), {how}: moving_mean/moving_variance differ "
            "from the legacy values; weights and training losses do not depend on them"
        )

    def ema_variables(self) -> cst.BaseExpression:
        """What the legacy ``ema.apply(...)`` averaged (its argument)."""
        assert self.p.ema is not None
        for statement in self.p.apply:
            for node in walk(statement):
                if (
                    isinstance(node, cst.Call)
                    and isinstance(node.func, cst.Attribute)
                    and node.func.attr.value == "apply"
                    and isinstance(node.func.value, cst.Name)
                    and node.func.value.value == self.p.ema[0]
                    and node.args
                ):
                    return node.args[0].value
        raise Blocked(self.p.tower_loop, f"`{self.p.ema[0]}.apply(...)` not found")

    def setup_fetches(self) -> list[str]:
        """Fetched names the graph setup made (the learning rate): read in the step."""
        made = set().union(set(), *(bound_names(s) for s in self.p.graph_setup))
        return [f.tensor for f in self.p.fetches if f.tensor in made]

    def global_step(self) -> str:
        """The `global_step=` that the legacy apply_gradients advanced (StopAtStepHook's)."""
        for statement in self.p.apply:
            for node in walk(statement):
                if (
                    isinstance(node, cst.Call)
                    and isinstance(node.func, cst.Attribute)
                    and (node.func.attr.value == "apply_gradients")
                ):
                    step = get_arg(node, 2, "global_step")
                    if isinstance(step, cst.Name):
                        return step.value
        raise Blocked(
            self.p.tower_loop,
            "StopAtStepHook counts global_step, which apply_gradients does not advance here",
        )

    def _spec_shape(self, shape: cst.BaseExpression) -> str:
        """A per-tower placeholder's shape with the batch dimension left open (the global
        batch holds every tower's)."""
        if not self.p.per_tower_inputs:
            return self.expr(shape)
        if not isinstance(shape, cst.List | cst.Tuple) or not shape.elements:
            raise Blocked(self.p.tower_loop, "a per-tower placeholder shape that is not a list")
        rest = "".join(f", {self.expr(e.value)}" for e in shape.elements[1:])
        return f"[None{rest}]"

    def numpy_name(self) -> str:
        for statement in self.module.body:
            small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
            if isinstance(small, cst.Import):
                for alias in small.names:
                    if self.code(alias.name) == "numpy":
                        # an import's `as` names a Name (libcst's AsName also serves `with`)
                        return cast(cst.Name, alias.asname.name).value if alias.asname else "numpy"
        raise Blocked(
            self.p.tower_loop,
            "the towers are fed separately and numpy is not imported "
            "(needed to join their feeds into one global batch)",
        )

    def loop_body(self, keys: dict[str, str]) -> list[cst.BaseStatement]:
        p = self.p
        statements: list[cst.BaseStatement] = []
        for statement in p.step_loop.body.body:
            if statement is not p.run_statement and (
                statement in p.feed_statements or self._is_feed(statement)
            ):
                continue
            if statement is p.run_statement:
                statements.append(cst.parse_statement("outputs = train_step(next(batches))"))
                if p.run_fetches_list is not None:
                    # `results = sess.run([train_op] + losses)`: None, then every tower's value.
                    target = p.fetches[1].target
                    key = keys[p.collected[p.fetches[1].tensor]]
                    values = (
                        f"[value.numpy() for value in "
                        f"strategy.experimental_local_results(outputs[{key!r}])]"
                    )
                    statements.append(cst.parse_statement(f"{target} = [None] + {values}"))
                    continue
                for fetch in p.fetches:
                    if fetch.target is None or fetch.tensor == p.train_op:
                        if fetch.target is not None:
                            raise Blocked(p.run_statement, "the loop keeps the train op's value")
                        continue
                    if fetch.tensor in p.memory_fetches:
                        statements.append(
                            cst.parse_statement(
                                f"{fetch.target} = memory_bytes({p.memory_fetches[fetch.tensor]!r})"
                            )
                        )
                        continue
                    if fetch.tensor == p.logging.summary_op:
                        # The merged summary: its scalars' values, by tag, for the writer.
                        values = ", ".join(
                            f"{self.code(tag)}: {self._fetched_value(tensor, keys, tower)}"
                            for tag, tensor, tower in p.logging.scalars
                        )
                        statements.append(cst.parse_statement(f"{fetch.target} = {{{values}}}"))
                        continue
                    value = self._fetched_value(fetch.tensor, keys, fetch.tower) + ".numpy()"
                    statements.append(cst.parse_statement(f"{fetch.target} = {value}"))
                continue
            logging_names = {p.logging.writer[0]} if p.logging.writer else set()
            if p.logging.saver is not None:
                logging_names.add(p.logging.saver[0])
            stripped = cast(cst.CSTNode, statement.visit(_LoopLogging(p, strip=True)))
            left = free_names(stripped) & logging_names
            if left:
                raise Blocked(
                    statement,
                    f"the loop uses `{sorted(left)[0]}` other than to "
                    "write a summary or save a checkpoint",
                )
            statements.append(self._retarget(statement).visit(_LoopLogging(p)))
        return statements

    def _fetched_value(self, tensor: str, keys: dict[str, str], tower: int | None = None) -> str:
        """The loop's value of a fetched tensor: the last tower's, the reduced one, or (`tower`
        given, `tensor` a per-tower list) that tower's entry: the same replica's."""
        replica = -1
        if tower is not None:
            tensor, replica = self.p.collected[tensor], tower
        key = keys[tensor]
        if tensor in self.p.reductions or tensor in self.setup_fetches():
            return f"outputs[{key!r}]"
        return f"strategy.experimental_local_results(outputs[{key!r}])[{replica}]"

    def saved_path(self) -> cst.BaseExpression | None:
        """The path the loop's ``saver.save(sess, path, global_step=...)`` writes to."""
        if self.p.logging.saver is None:
            return None
        paths = [
            get_arg(n, 1, "save_path")
            for s in self.p.step_loop.body.body
            for n in walk(s)
            if isinstance(n, cst.Call) and _is_call(n, self.p.logging.saver[0], "save")
        ]
        if not paths and self.p.final_save is not None:
            return None  # the Saver only writes once, after the loop (main() writes that)
        if len(paths) != 1 or paths[0] is None:
            raise Blocked(self.p.step_loop, "the loop does not save once with the Saver")
        loop_names = bound_names(self.p.step_loop.body) | bound_names(self.p.step_loop.target)
        if free_names(paths[0]) & loop_names:
            raise Blocked(self.p.step_loop, "the checkpoint path changes inside the loop")
        return paths[0]

    def _is_feed(self, statement: cst.CSTNode) -> bool:
        if self.p.tower_feed is not None and any(
            statement is node for node in self.p.tower_feed.replaced
        ):
            return True
        return any(
            isinstance(node, cst.Dict)
            and all(
                isinstance(e, cst.DictElement)
                and isinstance(e.key, cst.Name)
                and e.key.value
                in ({ph.name for ph in self.p.placeholders} | set(self.p.fed_defaults))
                for e in node.elements
            )
            and node.elements
            for node in walk(statement)
        )

    def loop_body_sources(self) -> list[cst.CSTNode]:
        p = self.p
        return [
            s
            for s in p.step_loop.body.body
            if s not in p.feed_statements and s is not p.run_statement and not self._is_feed(s)
        ]

    def fill(self, module: cst.Module) -> cst.Module:
        return module.visit(_FillSlots(self.slots))
