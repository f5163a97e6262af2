"""Reading a whole TF1 tower training function into the parts the conversion rebuilds (TFM303).

Not a rule module. :func:`read_program` either returns a :class:`Program` -- every statement of
the training function assigned to a role -- or raises :class:`Blocked` naming the first
statement it cannot place. Nothing is guessed: a statement whose role is unclear blocks the
conversion, and the rule reports it instead of producing code that trains differently.

The shapes read here: one module-level training function (taking the parsed flags, or
parsing them itself first with argparse), holding, possibly inside graph-only ``with`` blocks
(``tf.Graph().as_default()``, a fixed ``tf.device``, ``tf.variable_scope(tf.get_variable_scope())``):
the input -- placeholders of the global batch split with ``tf.split``, placeholders made per
tower and collected for a per-tower feed loop, a one-shot ``tf.data`` iterator or an ordered
queue (``slice_input_producer`` + ``tf.train.batch``) split with ``tf.split`` or behind a
``prefetch_queue`` each tower dequeues from; a ``for`` tower loop (``range(n)`` or ``enumerate(devices)``) whose body builds one
tower, appends ``opt.compute_gradients(loss)`` to a list, may collect a tower tensor
(``losses.append(loss)``) and may select one tower's UPDATE_OPS; cross-tower ``tf.add_n`` sums;
the aggregation (a TFM102 helper, or an inline ``zip(*tower_grads)`` loop); ``apply_gradients``,
optionally grouped with the UPDATE_OPS (one tower's, the last tower's, or every tower's: through
``tf.group``, ``control_dependencies`` or ``with_dependencies``) or followed by an
``ExponentialMovingAverage`` applied under its control dependency; summaries and a ``Saver``; a ``tf.Session`` (plain or ``with``) with its initializer, or a
``MonitoredTrainingSession`` with a ``StopAtStepHook``; one step loop that feeds and fetches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TypeGuard, TypeVar, cast

import libcst as cst

from tfmigrate.rules._towers import TowerRule, bound_names, free_names, get_arg, walk

GRAPH_CONTEXTS = frozenset({"tensorflow.Graph.as_default", "tensorflow.device"})
SESSIONS = frozenset({"tensorflow.Session", "tensorflow.InteractiveSession"})
MONITORED = "tensorflow.train.MonitoredTrainingSession"
INITIALIZERS = frozenset(
    {
        "tensorflow.global_variables_initializer",
        "tensorflow.initialize_all_variables",
        "tensorflow.local_variables_initializer",
    }
)


# Python 2's lazy range, as legacy scripts import it (None: the Python 2 builtin).
_XRANGE = frozenset({"six.moves.xrange", None})


class Blocked(Exception):
    """The program has a shape the conversion does not handle (yet)."""

    def __init__(self, node: cst.CSTNode, reason: str) -> None:
        super().__init__(reason)
        self.node = node
        self.reason = reason


def _block(node: cst.For | cst.With, what: str) -> list[cst.BaseStatement]:
    """The statements of ``node``'s indented block; a one-line body (`for i in x: f(i)`),
    whose small statements are no lines to move, is refused."""
    if not isinstance(node.body, cst.IndentedBlock):
        raise Blocked(node, f"{what} written on one line")
    return list(node.body.body)


NodeT = TypeVar("NodeT", bound=cst.CSTNode)


def _put(template: NodeT, value: cst.BaseExpression, **others: cst.BaseExpression) -> NodeT:
    """``template`` with ``__value__`` (and ``__<name>__`` for each other) put in: only names
    change, so a statement stays a statement and an expression an expression."""
    return cast(NodeT, template.visit(_Put(value, **others)))


@dataclass
class Placeholder:
    name: str
    dtype: cst.BaseExpression | None  # None: an output of a tf.data iterator
    shape: cst.BaseExpression | None


@dataclass
class Fetch:
    target: str | None  # the loop's variable receiving the value (None for `_`)
    tensor: str  # the tower-body name that was fetched
    tower: int | None = None  # `losses[0]`: tensor is the per-tower list, this the literal index


@dataclass
class Parser:
    """The argparse parser the training function builds itself (``def main():``)."""

    statements: list[cst.BaseStatement]  # building it, without the parse
    name: str  # the parser's variable
    parse: cst.SimpleStatementLine  # `args, _ = parser.parse_known_args()`
    flags: str  # `args`
    function: cst.FunctionDef | None = None  # `def parse_args():` that built it (dropped)


@dataclass
class UpdateOps:
    """``if <tower test>: ops = tf.get_collection(UPDATE_OPS, scope)`` in the tower body."""

    name: str
    test: str  # the source of the tower test (kind "last": the scope's name), for the notes
    kind: str = "selected"  # or "global" (every tower's, in turn) or "last" (after the loop)


@dataclass
class TowerFeed:
    """A per-tower feed loop: ``for i, (x, y) in enumerate(feeds): feed[x] = ...``."""

    index: str
    statements: list[
        cst.BaseStatement
    ]  # the body, `feed[x] = value` became `x_parts.append(value)`
    replaced: list[cst.CSTNode] = field(default_factory=list)  # `feed = {}` and the loop


@dataclass
class Logging:
    """What the legacy program wrote besides training: summaries and checkpoints."""

    # (tag, tensor, tower): tower is the literal index of `losses[0]` (tensor the list), or None
    scalars: list[tuple[cst.BaseExpression, str, int | None]] = field(default_factory=list)
    summary_op: str | None = None  # `summary_op = tf.summary.merge_all()`
    writer: tuple[str, cst.BaseExpression] | None = None  # `w = tf.summary.FileWriter(dir)`
    saver: tuple[str, cst.BaseExpression | None] | None = None  # (saver, max_to_keep)
    queue_runners: bool = False  # `tf.train.start_queue_runners(sess=sess)` was dropped
    # `writer.flush()` / `writer.close()` after the loop: the TF2 writer has both, kept as they are
    closing: list[cst.BaseStatement] = field(default_factory=list)


# The dataset a queue input function returns now (a name the training function keeps free).
QUEUE_DATASET = "input_dataset"
# A queue of the input's batches that each tower dequeues from (the CIFAR-10 tutorial's)
PREFETCH_QUEUES = {
    "tensorflow.contrib.slim.prefetch_queue.prefetch_queue",
    "tf_slim.prefetch_queue.prefetch_queue",
}


@dataclass
class QueueInput:
    """A module function whose queue pipeline yields batches in a fixed order:
    ``a, b = tf.train.slice_input_producer([x, y], shuffle=False)`` then
    ``return tf.train.batch([a, b], batch_size=n, num_threads=1)``."""

    function: cst.FunctionDef
    tensors: cst.BaseExpression  # `[x, y]`, the arrays sliced
    batch_size: cst.BaseExpression
    # `q = prefetch_queue([a, b])` + `a_i, b_i = q.dequeue()` in each tower: the queue's name
    # (its batches are one tower's; the step takes num_replicas consecutive ones)
    dequeued_from: str | None = None


@dataclass
class Program:
    function: cst.FunctionDef
    python_setup: list[cst.BaseStatement]  # before the graph: plain Python, kept as is
    graph_setup: list[cst.BaseStatement]  # graph-building statements outside the towers
    placeholders: list[Placeholder]
    splits: dict[str, str]  # per-tower list name -> placeholder name
    tower_loop: cst.For
    tower_index: str
    tower_count: cst.BaseExpression
    tower_body: list[cst.BaseStatement]  # with the `grads` append already rewritten
    tower_withs: list[cst.WithItem]  # per-tower scopes kept around the body (name_scope)
    loss: cst.BaseExpression  # what the tower differentiated
    optimizer: str
    grads_name: str  # the aggregated gradients' name, now one replica's gradients
    averaged: bool
    apply: list[cst.BaseStatement]  # apply_gradients and what follows it before the session
    train_op: str
    step_loop: cst.For
    feed_statements: list[cst.BaseStatement]
    feed_values: dict[str, cst.BaseExpression]  # placeholder -> fed value
    run_statement: cst.SimpleStatementLine
    fetches: list[Fetch]
    helper: cst.FunctionDef | None  # the aggregation helper, dropped if nothing else uses it
    aggregation: list[cst.BaseStatement] = field(default_factory=list)  # inline, dropped
    parser: Parser | None = None
    per_tower_inputs: bool = False  # placeholders made in the tower body (one per tower)
    collected: dict[str, str] = field(default_factory=dict)  # per-tower list -> tower tensor
    update_ops: UpdateOps | None = None
    tower_feed: TowerFeed | None = None
    session_prelude: list[cst.BaseStatement] = field(default_factory=list)
    run_fetches_list: str | None = None  # `results = sess.run([train_op] + losses)` -> 'losses'
    dataset: str | None = None  # tf.data input: the dataset the iterator read
    queue: QueueInput | None = None  # queue input: the function that becomes a dataset
    logging: Logging = field(default_factory=Logging)
    # `keep_prob = tf.placeholder_with_default(1.0, [])` fed one value all along: now that value
    fed_defaults: tuple[str, ...] = ()
    reductions: dict[str, str] = field(default_factory=dict)  # `total = tf.add_n(losses)`
    reduction_calls: dict[str, cst.Call] = field(default_factory=dict)  # those add_n calls
    # `train_tensor = with_dependencies([update], total_loss, name='train_op')`: what fetching
    # the train op fetched, and the op's name -> ('total_loss', 'train_op')
    train_value: tuple[str, str] | None = None
    ema: tuple[str, cst.BaseStatement] | None = None  # (name, `ema = ...MovingAverage(...)`)
    monitored: cst.BaseExpression | None = None  # StopAtStepHook's last_step
    checkpoint_dir: cst.BaseExpression | None = None
    notes: list[str] = field(default_factory=list)
    # `ema_op = ema.apply(...)` grouped with the update without an order (see ORDERLESS_EMA)
    ema_orderless: bool = False
    reduction_ops: dict[str, str] = field(default_factory=dict)  # reduced name -> SUM | MEAN
    fetch_names: dict[str, str] = field(default_factory=dict)  # tensor -> legacy op name
    # tensor -> (op type, tail ops of that type before it), numbered after the aggregation's
    # one-per-variable ops of the same type (see tower_program._number_after_variables)
    per_variable_names: dict[str, tuple[str, int]] = field(default_factory=dict)
    device_settings: list[tuple[str, cst.BaseExpression]] = field(default_factory=list)
    config_calls: list[cst.BaseStatement] = field(default_factory=list)  # tf.config, as written
    final_save: cst.BaseExpression | None = None  # `Saver().save(sess, path)` after the loop
    memory_fetches: dict[str, str] = field(default_factory=dict)  # tensor -> memory_stats op


def _simple(statement: cst.CSTNode) -> cst.BaseSmallStatement | None:
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        return statement.body[0]
    return None


def _is_dequeue(value: cst.BaseExpression, queue: str) -> bool:
    """``queue.dequeue()``."""
    call = _call_of(value)
    return (
        call is not None
        and not call.args
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "dequeue"
        and isinstance(call.func.value, cst.Name)
        and call.func.value.value == queue
    )


# Calls that make a variable (the global step among them).
_VARIABLE_CALLS = (
    ".get_variable", ".Variable", ".get_or_create_global_step", ".create_global_step",
    ".get_global_step",
)  # fmt: skip
# Calls of plain Python values that give the same result wherever they run.
_ARITHMETIC_CALLS = frozenset({"len", "int", "float", "min", "max", "abs", "round"})


def _plain_arithmetic(statement: cst.BaseStatement) -> bool:
    """``name = <arithmetic of names, attributes and literals>``: no TF, no side effect."""
    assigned = _assign(statement)
    if assigned is None or len(assigned[0]) != 1:
        return False
    for node in walk(assigned[1]):
        if isinstance(node, cst.Subscript | cst.Lambda | cst.Await | cst.Yield):
            return False
        if isinstance(node, cst.Call) and not (
            isinstance(node.func, cst.Name) and node.func.value in _ARITHMETIC_CALLS
        ):
            return False
    return True


def _assign(statement: cst.CSTNode) -> tuple[list[str], cst.BaseExpression] | None:
    """``a = value`` / ``a, b = value`` -> (names, value)."""
    small = _simple(statement)
    if not isinstance(small, cst.Assign) or len(small.targets) != 1:
        return None
    target = small.targets[0].target
    if isinstance(target, cst.Name):
        return [target.value], small.value
    if isinstance(target, cst.Tuple) and all(
        isinstance(e.value, cst.Name) for e in target.elements
    ):
        names = [cast(cst.Name, e.value).value for e in target.elements]  # all Names
        return names, small.value
    return None


def _empty_lists(value: cst.BaseExpression, count: int) -> bool:
    """``[]``, or ``[], [], []`` for as many names."""
    if isinstance(value, cst.List):
        return count == 1 and not value.elements
    return (
        isinstance(value, cst.Tuple)
        and len(value.elements) == count
        and all(isinstance(e.value, cst.List) and not e.value.elements for e in value.elements)
    )


def _call_of(expr: cst.BaseExpression | None) -> cst.Call | None:
    return expr if isinstance(expr, cst.Call) else None


def _fold_gradients_append(
    body: list[cst.BaseStatement], lists: set[str]
) -> list[cst.BaseStatement]:
    """``grads = opt.compute_gradients(loss)`` directly followed by ``tower_grads.append(grads)``
    (the TF CIFAR-10 tutorial's spelling), `grads` read nowhere else in the tower: read as the
    one statement ``tower_grads.append(opt.compute_gradients(loss))``."""
    out: list[cst.BaseStatement] = []
    skip = False
    for position, statement in enumerate(body):
        if skip:
            skip = False
            continue
        assigned = _assign(statement)
        call = _call_of(assigned[1]) if assigned and len(assigned[0]) == 1 else None
        following = _simple(body[position + 1]) if position + 1 < len(body) else None
        appended = following.value if isinstance(following, cst.Expr) else None
        if not (
            call is not None
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "compute_gradients"
            and isinstance(appended, cst.Call)
            and isinstance(appended.func, cst.Attribute)
            and appended.func.attr.value == "append"
            and isinstance(appended.func.value, cst.Name)
            and appended.func.value.value in lists
            and len(appended.args) == 1
            and isinstance(appended.args[0].value, cst.Name)
        ):
            out.append(statement)
            continue
        assert assigned is not None  # `call` is its value
        name = assigned[0][0]
        uses = sum(
            1
            for other in body
            for node in walk(other)
            if isinstance(node, cst.Name) and node.value == name
        )
        if appended.args[0].value.value != name or uses != 2:  # its assignment and the append
            out.append(statement)
            continue
        folded = appended.with_changes(args=[appended.args[0].with_changes(value=call)])
        out.append(statement.with_changes(body=[cst.Expr(folded)]))
        skip = True
    return out


class _Put(cst.CSTTransformer):
    """Puts an expression where a template says ``__value__`` (and others where it says the
    other names given)."""

    def __init__(self, value: cst.BaseExpression, **others: cst.BaseExpression) -> None:
        super().__init__()
        self.values = {"__value__": value, **{f"__{k}__": v for k, v in others.items()}}

    def leave_Name(self, original, updated):
        return self.values.get(updated.value, updated)


CONFIG_PROTO = "tensorflow.ConfigProto"
GPU_OPTIONS = "tensorflow.GPUOptions"
# Session settings -> the TF2 statement (`{v}`: the value); memory_fraction has none.
DEVICE_SETTINGS = {
    "allow_soft_placement": "tf.config.set_soft_device_placement({v})",
    "log_device_placement": "tf.debugging.set_log_device_placement({v})",
    "inter_op_parallelism_threads": "tf.config.threading.set_inter_op_parallelism_threads({v})",
    "intra_op_parallelism_threads": "tf.config.threading.set_intra_op_parallelism_threads({v})",
    "gpu_options.allow_growth": (
        'for gpu in tf.config.list_physical_devices("GPU"):\n'
        "    tf.config.experimental.set_memory_growth(gpu, {v})"
    ),
    "gpu_options.per_process_gpu_memory_fraction": (
        "# per_process_gpu_memory_fraction:\n"
        "#     {v}\n"
        "# TF2 has no memory fraction, only an absolute limit in MB\n"
        "# (tf.config.set_logical_device_configuration): memory growth instead, so the process\n"
        "# takes only what it uses.\n"
        'for gpu in tf.config.list_physical_devices("GPU"):\n'
        "    tf.config.experimental.set_memory_growth(gpu, True)"
    ),
}
# tf.contrib.memory_stats ops -> the key of tf.config.experimental.get_memory_info.
MEMORY_STATS = {"MaxBytesInUse": "peak"}


_CLIPPING = frozenset(
    {"tensorflow.clip_by_global_norm", "tensorflow.clip_by_norm", "tensorflow.clip_by_value"}
)


class _Tail:
    """What the reader learns between the tower loop and the Session: values computed from
    every tower, the session's device settings, memory-stats ops."""

    def __init__(self, tower: dict, split_inputs: set[str]) -> None:
        self.tower = tower
        self.split_inputs = split_inputs  # placeholders tf.split gave the towers
        self.aliases: dict[str, str] = {}  # `all_logits = tf.concat(0, tower_logits)` -> 'logits'
        self.reductions: dict[str, tuple[str, str]] = {}  # name -> (tower list, SUM | MEAN)
        self.calls: dict[str, cst.Call] = {}
        self.ops: dict[str, str] = {}
        self.names: dict[str, str] = {}  # fetched value -> the legacy op's name
        self.replica_values: list[cst.BaseStatement] = []  # computed by each replica now
        self.replica_lists: dict[str, str] = {}
        self.settings: list[tuple[str, cst.BaseExpression]] = []
        self.configs: set[str] = set()  # names of the ConfigProto / GPUOptions
        # tf.config calls already written (by TFM105's fix, or by hand), moved into main()
        self.config_calls: list[cst.BaseStatement] = []
        self.memory: dict[str, str] = {}
        self.root_counts: dict[str, int] = {}
        # op type -> how many unnamed ops of it the aggregation writes (each made once per
        # variable at the graph's root, which numbers the tail's ops after them)
        self.unknown: dict[str, int] = {}
        self.per_variable: dict[str, tuple[str, int]] = {}  # name -> (op type, seen before)

    def reduce(self, name: str, listed: str, op: str, call: cst.Call) -> None:
        self.reductions[name] = (listed, op)
        self.calls[name] = call

    def root_op(self, name: str, call: cst.BaseExpression) -> None:
        """The name TF1 gave the op that computed ``name`` at the graph's root: its literal
        `name=`, else its type's default, numbered as the graph numbered repeats."""
        literal = get_arg(call, None, "name") if isinstance(call, cst.Call) else None
        given = literal.evaluated_value if isinstance(literal, cst.SimpleString) else None
        if isinstance(given, str):
            self.names[name] = given
            return
        default = None
        if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute):
            default = {"reduce_mean": "Mean", "reduce_sum": "Sum", "add_n": "AddN"}.get(
                call.func.attr.value
            )
        if default is None or default in self.unknown:
            self.names[name] = name  # no name to predict: the Python name keeps keys apart
            if default is not None and self.unknown[default] == 1:
                # once per variable: numbered after them, once their count is known
                seen = self.root_counts.get(default, 0)
                self.root_counts[default] = seen + 1
                self.per_variable[name] = (default, seen)
            return
        seen = self.root_counts.get(default, 0)
        self.root_counts[default] = seen + 1
        self.names[name] = default if seen == 0 else f"{default}_{seen}"

    def divided(self, name: str) -> None:
        """``name`` is its root op divided by a number: TF1 named the division `truediv`."""
        if "truediv" in self.unknown:
            self.names[name] = name
            return
        seen = self.root_counts.get("truediv", 0)
        self.root_counts["truediv"] = seen + 1
        self.names[name] = "truediv" if seen == 0 else f"truediv_{seen}"

    def setting(self, key: str, value: cst.BaseExpression, node: cst.CSTNode) -> None:
        if key not in DEVICE_SETTINGS:
            raise Blocked(node, f"the session setting `{key}` has no tf.config counterpart here")
        self.settings.append((key, value))


def _op_types(nodes: list) -> dict[str, int]:
    """The default op names of the unnamed reductions these statements write, with how many
    times each is written (the aggregation runs them once per variable)."""
    names = {"reduce_mean": "Mean", "reduce_sum": "Sum", "add_n": "AddN"}
    found: dict[str, int] = {}
    for node in nodes:
        for n in walk(node):
            if (
                isinstance(n, cst.Call)
                and isinstance(n.func, cst.Attribute)
                and n.func.attr.value in names
                and get_arg(n, None, "name") is None
            ):
                op = names[n.func.attr.value]
                found[op] = found.get(op, 0) + 1
    return found


class _Aliases(cst.CSTTransformer):
    """The towers' concatenated tensors -> this replica's own."""

    def __init__(self, aliases: dict[str, str]) -> None:
        super().__init__()
        self.aliases = aliases

    def leave_Name(self, original, updated):
        return cst.Name(self.aliases[updated.value]) if updated.value in self.aliases else updated


class ProgramReader:
    """Classifies the statements of the function that holds the tower loop."""

    def __init__(self, rule: TowerRule, aggregation: dict[int, bool]) -> None:
        self._log = Logging()
        self._tower_feeds: tuple[str, list[str]] | None = None
        self._with_default: dict[str, cst.BaseStatement] = {}  # placeholder_with_default
        self._hook_list: tuple[str, cst.BaseExpression] | None = None  # (hooks, last_step)
        self._dataset_input = False
        self._monitored: tuple[cst.BaseExpression, cst.BaseExpression | None] | None = None
        self._final_save: cst.BaseExpression | None = None
        self.rule = rule
        # id(helper def or aggregating statement) -> averaged?  (what TFM102 found)
        self.aggregation = aggregation

    def q(self, node: cst.BaseExpression) -> str | None:
        return self.rule.qualify(node)

    def calls_to(self, node: cst.BaseExpression | None, *names: str) -> TypeGuard[cst.Call]:
        """``call_q(node)`` is one of ``names`` (so ``node`` is a call)."""
        return self.call_q(node) in names

    def call_q(self, node: cst.BaseExpression | None) -> str | None:
        call = _call_of(node)
        if call is None:
            return None
        if isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Call):
            # `tf.Graph().as_default()`
            inner = self.q(call.func.value.func)
            if inner is not None:
                return f"{inner}.{call.func.attr.value}"
        return self.q(call.func)

    # -- the function -------------------------------------------------------------------------
    def read(self, loop: cst.For) -> Program:
        function = self.rule.enclosing_def(loop)
        if function is None or self.rule.enclosing_def(function) is not None:
            raise Blocked(loop, "the tower loop is not inside a module-level training function")
        if self.rule.parent(function) is not self._module_body_parent(function):
            parent = self.rule.parent(function)
            holder = self.rule.parent(parent) if parent is not None else None
            if isinstance(holder, cst.ClassDef):
                raise Blocked(
                    function,
                    f"the towers are built in the method `{holder.name.value}."
                    f"{function.name.value}`: a class-based trainer (graph built by one method, "
                    "run by another) is not converted yet; the training function must be "
                    "defined at module level",
                )
            raise Blocked(function, "the training function is not defined at module level")
        python_setup: list[cst.BaseStatement] = []
        graph: list[cst.BaseStatement] = []
        in_graph = False
        # it holds the tower loop, a compound statement: its body is an indented block
        statements = list(cast(cst.IndentedBlock, function.body).body)
        if function.get_docstring() is not None:
            statements = statements[1:]  # the new training function keeps it
        parser = None
        if not function.params.params:
            parser, statements = self._parser(function, statements)
        for statement in statements:
            flattened = self._flatten_graph_with(statement)
            if flattened is not None:
                in_graph = True
                graph.extend(flattened)
            elif in_graph:
                graph.append(statement)
            else:
                python_setup.append(statement)
        if not in_graph:
            # No graph block: every statement is graph-building code.
            graph, python_setup = python_setup, []
        program = self._read_graph(function, loop, python_setup, graph)
        program.parser = parser
        return program

    def _parser(
        self, function: cst.FunctionDef, statements: list[cst.BaseStatement]
    ) -> tuple[Parser | None, list[cst.BaseStatement]]:
        """``def main():`` that starts by building and parsing its own argparse parser."""
        first = _assign(statements[0]) if statements else None
        if first is not None and len(first[0]) == 1:
            helper = self._parse_helper(first[1])
            if helper is not None:
                # `args = parse_args()`: that function builds the parser and parses.
                function, built, name, method = helper
                parse = cst.parse_statement(f"{first[0][0]} = {name}.{method}()")
                assert isinstance(parse, cst.SimpleStatementLine)  # an assignment
                parser = Parser(built, name, parse, first[0][0], function)
                return parser, statements[1:]
        if (
            first is None
            or len(first[0]) != 1
            or self.call_q(first[1]) != "argparse.ArgumentParser"
        ):
            return None, statements  # where its flags come from is asked later (the main block)
        name = first[0][0]
        for position, statement in enumerate(statements[1:], start=1):
            small = _simple(statement)
            if (
                isinstance(small, cst.Expr)
                and isinstance(small.value, cst.Call)
                and (self._is_method(small.value, name, "add_argument"))
            ):
                continue
            assigned = _assign(statement)
            call = _call_of(assigned[1]) if assigned else None
            if (
                assigned is not None
                and call is not None
                and not call.args
                and (
                    (self._is_method(call, name, "parse_known_args") and len(assigned[0]) == 2)
                    or (self._is_method(call, name, "parse_args") and len(assigned[0]) == 1)
                )
            ):
                # an assignment (_assign read it): a statement line
                line = cast(cst.SimpleStatementLine, statement)
                parser = Parser(list(statements[:position]), name, line, assigned[0][0])
                return parser, statements[position + 1 :]
            break
        raise Blocked(
            function,
            f"`{name}` is not followed by add_argument calls and "
            "`args = parser.parse_args()` / `parse_known_args()`",
        )

    def _parse_helper(
        self, value: cst.BaseExpression
    ) -> tuple[cst.FunctionDef, list[cst.BaseStatement], str, str] | None:
        """``parse_args()`` calling a module function that builds an argparse parser and returns
        ``parser.parse_args()`` -> (that function, the building statements, parser, method)."""
        call = _call_of(value)
        if call is None or call.args or not isinstance(call.func, cst.Name):
            return None
        function = self._helper_def(call.func.value)
        if function is None or function.params.params:
            return None
        body = list(function.body.body)
        if function.get_docstring() is not None:
            body = body[1:]
        first = _assign(body[0]) if body else None
        if (
            first is None
            or len(first[0]) != 1
            or (self.call_q(first[1]) != "argparse.ArgumentParser")
        ):
            return None
        name = first[0][0]
        for statement in body[1:-1]:
            small = _simple(statement)
            if not (
                isinstance(small, cst.Expr)
                and isinstance(small.value, cst.Call)
                and self._is_method(small.value, name, "add_argument")
            ):
                return None
        last = _simple(body[-1])
        returned = _call_of(last.value) if isinstance(last, cst.Return) else None
        if returned is None or returned.args or not self._is_method(returned, name, "parse_args"):
            return None
        # its first line builds the parser: the body is an indented block's statements
        return function, cast("list[cst.BaseStatement]", body[:-1]), name, "parse_args"

    def _module_body_parent(self, function: cst.FunctionDef) -> cst.CSTNode:
        return self.rule.context.module

    def _flatten_graph_with(self, statement: cst.CSTNode) -> list[cst.BaseStatement] | None:
        """The body of a ``with`` that only sets up a graph (nested ones flattened), else None."""
        if not isinstance(statement, cst.With):
            return None
        for item in statement.items:
            name = self.call_q(item.item)
            if name not in GRAPH_CONTEXTS or item.asname is not None:
                return None
            if name == "tensorflow.device" and free_names(item.item) - {"tf", "tensorflow"}:
                return None  # a device that depends on something: not a fixed placement
        if not isinstance(statement.body, cst.IndentedBlock):
            return None  # `with g.as_default(): x = f()`: a statement of its own
        body: list[cst.BaseStatement] = []
        for inner in statement.body.body:
            nested = self._flatten_graph_with(inner)
            body.extend(nested if nested is not None else [inner])
        return body

    def _read_graph(
        self,
        function: cst.FunctionDef,
        loop: cst.For,
        python_setup: list[cst.BaseStatement],
        graph: list[cst.BaseStatement],
    ) -> Program:
        placeholders: list[Placeholder] = []
        splits: dict[str, str] = {}
        setup: list[cst.BaseStatement] = []
        lists: set[str] = set()
        split_counts: list[tuple[cst.CSTNode, cst.BaseExpression | None]] = []
        dataset: str | None = None
        queue: QueueInput | None = None
        queue_call: cst.Call | None = None  # the call of the queue input function
        prefetch_at = -1  # the prefetch_queue statement's place in `setup`
        index = 0
        tower_statement = None
        while index < len(graph):
            statement = graph[index]
            if self._contains(statement, loop):
                tower_statement = statement
                break
            assigned = _assign(statement)
            name = self.call_q(assigned[1]) if assigned else None
            if assigned and name == "tensorflow.placeholder":
                placeholders.append(self._placeholder(statement, assigned))
            elif assigned and name == "tensorflow.placeholder_with_default":
                if len(assigned[0]) == 1:
                    self._with_default[assigned[0][0]] = statement
                setup.append(statement)
            elif assigned and self._iterator_dataset(assigned[1]) is not None:
                if placeholders or dataset is not None:
                    raise Blocked(statement, "more than one input (placeholders or iterators)")
                dataset = self._iterator_dataset(assigned[1])
                placeholders.extend(Placeholder(n, None, None) for n in assigned[0])
            elif assigned and self._queue_input(statement, assigned[1]) is not None:
                # `images, labels = input_batches(x, y, n)`: a queue pipeline, read as a dataset
                if placeholders or dataset is not None:
                    raise Blocked(statement, "more than one input (placeholders or iterators)")
                queue = self._queue_input(statement, assigned[1])
                dataset = QUEUE_DATASET
                placeholders.extend(Placeholder(n, None, None) for n in assigned[0])
                setup.append(_put(cst.parse_statement(f"{QUEUE_DATASET} = __value__"), assigned[1]))
                queue_call = _call_of(assigned[1])
            elif assigned and queue is not None and name in PREFETCH_QUEUES:
                # `batch_queue = prefetch_queue([images, labels], ...)`: the towers dequeue
                queue.dequeued_from = self._prefetch_queue(statement, assigned, placeholders)
                prefetch_at = len(setup)
                setup.append(statement)  # becomes the step's rebatching once the towers are read
            elif assigned and name == "tensorflow.split":
                split = cast(cst.Call, assigned[1])  # call_q named it
                source = get_arg(split, 0, "value")
                if not isinstance(source, cst.Name) or source.value not in {
                    p.name for p in placeholders
                }:
                    raise Blocked(
                        statement,
                        "the split input is not a placeholder or a "
                        "one-shot tf.data iterator's output: only those inputs are "
                        "converted so far (queues: later)",
                    )
                if len(assigned[0]) != 1:
                    raise Blocked(statement, "tf.split unpacked into names")
                splits[assigned[0][0]] = source.value
                split_counts.append((statement, get_arg(split, 1, "num_or_size_splits")))
            elif assigned and _empty_lists(assigned[1], len(assigned[0])):
                lists.update(assigned[0])  # `tower_grads = []`: kept unless it held the grads
                setup.append(statement)
            else:
                self._check_setup(statement, placeholders)
                setup.append(statement)
            index += 1
        if tower_statement is None:
            raise Blocked(
                loop, "the tower loop is nested in a statement the conversion cannot read"
            )
        per_tower = any(
            isinstance(n, cst.Call) and self.call_q(n) == "tensorflow.placeholder"
            for n in walk(loop)
        )
        if not placeholders and not per_tower:
            for node in walk(loop):
                if (
                    isinstance(node, cst.Call)
                    and isinstance(node.func, cst.Attribute)
                    and node.func.attr.value in ("dequeue", "dequeue_many")
                ):
                    raise Blocked(
                        node,
                        f"each tower dequeues its own batch "
                        f"(`{self.rule.src(node, 40)}`): the towers took batches from "
                        "the queue in no fixed order, so which replica gets which batch "
                        "cannot be reproduced, and verify compares each step's input "
                        "(not converted; an ordered queue split with tf.split is)",
                    )
            raise Blocked(
                loop,
                "the input is neither a tf.placeholder fed with feed_dict, a "
                "one-shot tf.data iterator, nor an ordered queue (slice_input_producer "
                "+ tf.train.batch) split with tf.split",
            )
        if placeholders and per_tower:
            raise Blocked(loop, "placeholders both for the global batch and per tower")
        if tower_statement is not loop and not self._is_reuse_scope(tower_statement, loop):
            raise Blocked(tower_statement, "the tower loop sits inside an unsupported block")
        tower = self._read_tower(
            loop, splits, lists, setup, queue.dequeued_from if queue is not None else None
        )
        if queue is not None and queue.dequeued_from is not None:
            placeholders = [Placeholder(n, None, None) for n in tower["dequeued"]]
            setup[prefetch_at] = self._consecutive_batches(
                setup[prefetch_at], queue, queue_call, tower["count"]
            )
        for split_at, count in split_counts:
            # Replica i gets the i-th of num_replicas equal slices: only that split matches.
            if count is None or not count.deep_equals(tower["count"]):
                raise Blocked(split_at, "tf.split into a number of pieces other than the tower count")
        if per_tower:
            placeholders = tower["placeholders"]
        consumed = {tower["list"], *tower["collected"], *tower["dropped_setup"]}
        if tower["feeds"] is not None:
            consumed.add(tower["feeds"][0])
        if tower["update_ops"] is not None:
            consumed.add(tower["update_ops"].name)
        kept_setup = []
        for statement in setup:
            assigned = _assign(statement)
            if assigned is not None and set(assigned[0]) & consumed:
                if not set(assigned[0]) <= consumed:
                    raise Blocked(
                        statement,
                        "a statement creates both lists the conversion replaces and lists it keeps",
                    )
                continue
            kept_setup.append(statement)
        setup = kept_setup
        for statement in tower["body"]:
            for node in walk(statement):
                if (
                    isinstance(node, cst.Call)
                    and isinstance(node.func, cst.Attribute)
                    and isinstance(node.func.value, cst.Name)
                    and node.func.value.value in lists
                ):
                    raise Blocked(
                        statement,
                        f"the towers also collect `{node.func.value.value}`"
                        " (only the gradient list is converted so far)",
                    )
        rest = graph[index + 1 :]
        program = self._read_tail(
            function, loop, python_setup, setup, placeholders, splits, tower, rest
        )
        program.per_tower_inputs = per_tower
        program.dataset = dataset
        program.queue = queue
        if dataset is not None and program.feed_values:
            raise Blocked(program.run_statement, "tf.data input and a feed_dict")
        program.collected = tower["collected"]
        return program

    def _queue_input(self, statement: cst.CSTNode, value: cst.BaseExpression) -> QueueInput | None:
        """A call of a module function that builds an ordered queue pipeline (see QueueInput);
        a queue that shuffles or batches on several threads blocks: tf.data cannot give the
        same batches in the same order, and verify compares the inputs step by step."""
        call = _call_of(value)
        if call is None or not isinstance(call.func, cst.Name):
            return None
        function = self._helper_def(call.func.value)
        if function is None:
            return None
        body = list(function.body.body)
        if function.get_docstring() is not None:
            body = body[1:]
        calls = {
            self.call_q(n): n
            for s in body
            for n in walk(s)
            if isinstance(n, cst.Call) and (self.call_q(n) or "").startswith("tensorflow.train.")
        }
        if not calls:
            return None
        shuffled = {"tensorflow.train.shuffle_batch", "tensorflow.train.shuffle_batch_join"}
        if shuffled & set(calls):
            raise Blocked(
                statement,
                f"queue input through `{call.func.value}` shuffles "
                "(tf.train.shuffle_batch): tf.data cannot reproduce the queue's "
                "order, and verify compares each step's input (not converted)",
            )
        producer = calls.get("tensorflow.train.slice_input_producer")
        batch = calls.get("tensorflow.train.batch")
        first = _assign(body[0]) if len(body) == 2 else None
        last = _simple(body[-1])
        if (
            producer is None
            or batch is None
            or set(calls) != {"tensorflow.train.slice_input_producer", "tensorflow.train.batch"}
            or first is None
            or first[1] is not producer
            or not isinstance(last, cst.Return)
            or last.value is not batch
        ):
            raise Blocked(
                statement,
                f"queue input through `{call.func.value}` other than "
                "`a, b = tf.train.slice_input_producer([x, y], shuffle=False)` + "
                "`return tf.train.batch([a, b], batch_size=n, num_threads=1)`",
            )
        shuffle = get_arg(producer, 2, "shuffle")
        threads = get_arg(batch, 2, "num_threads")
        producer_keywords = {a.keyword.value for a in producer.args if a.keyword is not None}
        batch_keywords = {a.keyword.value for a in batch.args if a.keyword is not None}
        if not (isinstance(shuffle, cst.Name) and shuffle.value == "False") or (
            producer_keywords - {"shuffle", "capacity"}
        ):
            raise Blocked(
                statement,
                "slice_input_producer that shuffles (its default) or "
                "limits epochs: tf.data cannot reproduce the queue's order, and verify "
                "compares each step's input (not converted)",
            )
        if (
            threads is not None and not (isinstance(threads, cst.Integer) and threads.value == "1")
        ) or batch_keywords - {"batch_size", "num_threads", "capacity"}:
            raise Blocked(
                statement,
                "tf.train.batch on several threads (or with other "
                "options): its batches' order is not fixed (not converted)",
            )
        tensors = get_arg(producer, 0, "tensor_list")
        batch_size = get_arg(batch, 1, "batch_size")
        listed = get_arg(batch, 0, "tensors")
        if (
            not isinstance(tensors, cst.List)
            or batch_size is None
            or not isinstance(listed, cst.List)
            or [getattr(e.value, "value", None) for e in listed.elements] != first[0]
        ):
            raise Blocked(statement, "tf.train.batch of something other than the producer's slices")
        return QueueInput(function, tensors, batch_size)

    def _prefetch_queue(
        self,
        statement: cst.CSTNode,
        assigned: tuple[list[str], cst.BaseExpression],
        placeholders: list[Placeholder],
    ) -> str:
        """``q = prefetch_queue([images, labels], capacity=...)`` over the queue input's
        batches, in their order -> 'q'. Its capacity and threads only decide how far ahead
        batches are made, not which ones the towers get."""
        call = _call_of(assigned[1])
        listed = get_arg(call, 0, "tensors") if call is not None else None
        if (
            len(assigned[0]) != 1
            or not isinstance(listed, cst.List)
            or [getattr(e.value, "value", None) for e in listed.elements]
            != [p.name for p in placeholders]
        ):
            raise Blocked(
                statement,
                "a prefetch queue of something other than the queue input's batch, in order",
            )
        return assigned[0][0]

    def _consecutive_batches(
        self,
        statement: cst.BaseStatement,
        queue: QueueInput,
        call: cst.Call | None,
        count: cst.BaseExpression,
    ) -> cst.BaseStatement:
        """The prefetch queue -> the dataset's step batches: tower i dequeued the i-th of the
        step's batches (verify runs the legacy dequeues in tower order, see the note), so one
        step takes num_replicas consecutive batches as one global batch, which
        experimental_distribute_dataset splits in order."""
        per_tower: cst.BaseExpression | None = queue.batch_size
        params = [p.name.value for p in queue.function.params.params]
        if isinstance(per_tower, cst.Name) and per_tower.value in params and call is not None:
            position = params.index(per_tower.value)
            per_tower = get_arg(call, position, per_tower.value)
        if per_tower is None:  # the call (in the same setup) spells the batch size it passed
            raise Blocked(statement, "the queue's batch size is not readable at the prefetch queue")
        code = self.rule.context.module.code_for_node
        size = code(per_tower)
        if not isinstance(per_tower, cst.Name | cst.Attribute | cst.Integer):
            size = f"({size})"
        text = (
            "# TFM303: each tower dequeued its own batch -> replica i takes the i-th of the\n"
            "# step's consecutive batches (one global batch, split in order).\n"
            f"{QUEUE_DATASET} = {QUEUE_DATASET}.unbatch().batch({size} * {code(count)})\n"
        )
        return cst.parse_statement(text)

    def _iterator_dataset(self, value: cst.BaseExpression) -> str | None:
        """``ds.make_one_shot_iterator().get_next()`` (or the compat.v1 function) -> 'ds'."""
        call = _call_of(value)
        if call is None or call.args or not isinstance(call.func, cst.Attribute):
            return None
        if call.func.attr.value != "get_next":
            return None
        inner = _call_of(call.func.value)
        if inner is None:
            return None
        if (
            isinstance(inner.func, cst.Attribute)
            and inner.func.attr.value == "make_one_shot_iterator"
            and isinstance(inner.func.value, cst.Name)
            and not inner.args
        ):
            return inner.func.value.value
        if (
            (self.q(inner.func) or "").endswith("data.make_one_shot_iterator")
            and len(inner.args) == 1
            and isinstance(inner.args[0].value, cst.Name)
        ):
            return inner.args[0].value.value
        return None

    def _contains(self, statement: cst.CSTNode, node: cst.CSTNode) -> bool:
        return statement is node or any(a is statement for a in self.rule.ancestors(node))

    def _reuse_current_scope(self, call: cst.BaseExpression) -> bool:
        """``tf.variable_scope(tf.get_variable_scope(), reuse=<anything>)``."""
        if not isinstance(call, cst.Call) or not call.args:
            return False
        if self.call_q(call.args[0].value) != "tensorflow.get_variable_scope":
            return False
        rest = call.args[1:]
        return (
            call.args[0].keyword is None
            and all(a.keyword is not None and a.keyword.value == "reuse" for a in rest)
            and len(rest) <= 1
        )

    def _is_reuse_scope(self, statement: cst.CSTNode, loop: cst.For) -> bool:
        """``with tf.variable_scope(tf.get_variable_scope()):`` directly around the loop."""
        if not isinstance(statement, cst.With) or len(statement.items) != 1:
            return False
        call = _call_of(statement.items[0].item)
        if self.call_q(call) != "tensorflow.variable_scope" or call is None or len(call.args) != 1:
            return False
        if self.call_q(call.args[0].value) != "tensorflow.get_variable_scope":
            return False
        body = statement.body.body
        return len(body) == 1 and body[0] is loop

    def _placeholder(
        self,
        statement: cst.CSTNode,
        assigned: tuple[list[str], cst.BaseExpression],
        per_tower: bool = False,
    ) -> Placeholder:
        call = assigned[1]
        assert isinstance(call, cst.Call)
        dtype = get_arg(call, 0, "dtype")
        shape = get_arg(call, 1, "shape")
        if len(assigned[0]) != 1 or dtype is None or shape is None:
            raise Blocked(statement, "a placeholder without a dtype and a shape")
        # A `None` dimension is fine: the dataset's TensorSpec keeps it open, and tf.split of a
        # batch whose size the towers did not fix is the strategy's split of the global batch.
        return Placeholder(assigned[0][0], dtype, shape)

    def _check_setup(self, statement: cst.CSTNode, placeholders: list[Placeholder]) -> None:
        used = free_names(statement) & {p.name for p in placeholders}
        if used:
            raise Blocked(
                statement,
                f"graph code reads the placeholder `{sorted(used)[0]}` outside the towers",
            )
        for node in walk(statement):
            if isinstance(node, cst.Call) and self.call_q(node) in SESSIONS:
                raise Blocked(statement, "a Session opened before the towers are built")

    # -- the tower loop -----------------------------------------------------------------------
    def _read_tower(
        self,
        loop: cst.For,
        splits: dict[str, str],
        lists: set[str],
        setup: list,
        dequeued_from: str | None = None,
    ) -> dict:
        if loop.orelse is not None:
            raise Blocked(loop, "a tower loop with an `else` block")
        dropped_setup: list[str] = []
        if isinstance(loop.target, cst.Name):
            count = self._range_count(loop.iter)
            if count is None:
                raise Blocked(loop, "the tower loop is not `for i in range(num_towers)`")
            index = loop.target.value
        else:
            # `for i, dev in enumerate(devices)` over `devices = ['/gpu:%d' % i for i in range(n)]`
            index, count, devices = self._enumerated_devices(loop, setup)
            dropped_setup.append(devices)
        withs: list[cst.WithItem] = []
        scopes: list[cst.With] = []  # `with tf.variable_scope('net', reuse=i > 0):`, put back
        body = _block(loop, "a tower loop")
        # Peel `with tf.device(...)`, `with tf.name_scope(...) as scope` wrappers.
        while len(body) == 1 and isinstance(body[0], cst.With):
            for item in body[0].items:
                name = self.call_q(item.item)
                if name == "tensorflow.device":
                    continue
                if name in ("tensorflow.name_scope",):
                    withs.append(item)
                    continue
                if name == "tensorflow.variable_scope" and self._reuse_current_scope(item.item):
                    continue  # `variable_scope(get_variable_scope(), reuse=...)`: the store shares
                if name == "tensorflow.variable_scope" and item.asname is None:
                    # A named scope around the whole tower: its variables' names start with it,
                    # and the tower body stays inside it (the store shares the variables).
                    scopes.append(
                        body[0].with_changes(
                            items=[item.with_changes(comma=cst.MaybeSentinel.DEFAULT)]
                        )
                    )
                    continue

                raise Blocked(
                    body[0],
                    f"an unsupported `with {self.rule.src(item.item, 40)}` around the tower",
                )
            body = _block(body[0], "a `with` around the tower")
        kept: list[cst.BaseStatement] = []
        grads = None
        placeholders: list[Placeholder] = []
        feeds: tuple[str, list[str]] | None = None
        collected: dict[str, str] = {}
        update_ops: UpdateOps | None = None
        dequeued: list[str] | None = None  # `a, b = batch_queue.dequeue()`: the tower's batch
        for statement in _fold_gradients_append(body, lists):
            small = _simple(statement)
            assigned = _assign(statement)
            if dequeued_from is not None and assigned and _is_dequeue(assigned[1], dequeued_from):
                if dequeued is not None:
                    raise Blocked(statement, "a tower dequeues twice")
                dequeued = assigned[0]
                continue
            if assigned and self.call_q(assigned[1]) == "tensorflow.placeholder":
                placeholders.append(self._placeholder(statement, assigned, per_tower=True))
                continue
            selected = self._update_ops(statement)
            if selected is not None:
                if update_ops is not None:
                    raise Blocked(statement, "the towers select UPDATE_OPS twice")
                update_ops = selected
                continue
            appended = self._append(small, lists)
            if appended is not None:
                target, value = appended
                names = {p.name for p in placeholders}
                if isinstance(value, cst.Tuple | cst.List) and all(
                    isinstance(e.value, cst.Name) and e.value.value in names for e in value.elements
                ):
                    # each a placeholder's Name (checked above)
                    feeds = (target, [cast(cst.Name, e.value).value for e in value.elements])
                    continue
                if isinstance(value, cst.Name) and target not in collected:
                    collected[target] = value.value
                    continue
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                call = small.value
                func = call.func
                if (
                    isinstance(func, cst.Attribute)
                    and func.attr.value == "reuse_variables"
                    and self.call_q(func.value) == "tensorflow.get_variable_scope"
                ):
                    continue  # the variable store shares the variables now
                if (
                    isinstance(func, cst.Attribute)
                    and func.attr.value == "append"
                    and isinstance(func.value, cst.Name)
                    and func.value.value in lists
                    and call.args
                ):
                    grads_call = _call_of(call.args[0].value)
                    if (
                        grads_call is not None
                        and isinstance(grads_call.func, cst.Attribute)
                        and grads_call.func.attr.value == "compute_gradients"
                    ):
                        if grads is not None:
                            raise Blocked(statement, "a tower computes gradients twice")
                        grads = (func.value.value, grads_call, statement)
                        continue
            for node in walk(statement):
                if isinstance(node, cst.Call) and self.call_q(node) == "tensorflow.device":
                    raise Blocked(statement, "a nested tf.device inside the tower body")
            kept.append(statement)
        if grads is None:
            raise Blocked(
                loop,
                "the tower body does not append `opt.compute_gradients(loss)` to a per-tower list",
            )
        if dequeued_from is not None and dequeued is None:
            raise Blocked(loop, f"the towers do not unpack `{dequeued_from}.dequeue()` first")
        list_name, grads_call, _ = grads
        loss = get_arg(grads_call, 0, "loss")
        if loss is None or len(grads_call.args) != 1:
            raise Blocked(grads_call, "compute_gradients with arguments other than the loss")
        optimizer = cast(cst.Attribute, grads_call.func).value  # `opt.compute_gradients`
        if not isinstance(optimizer, cst.Name):
            raise Blocked(grads_call, "compute_gradients on something other than a named optimizer")
        # `image_splits[i]` -> the replica's own input.
        kept = [self._unsplit(s, splits, index) for s in kept]
        loss = self._unsplit(loss, splits, index)
        for statement in kept:
            for node in walk(statement):
                if isinstance(node, cst.Name) and node.value in splits:
                    raise Blocked(
                        statement, f"`{node.value}` is used other than as `{node.value}[{index}]`"
                    )
        for scope in reversed(scopes):
            kept = [scope.with_changes(body=scope.body.with_changes(body=kept))]
        if placeholders:
            fed = feeds[1] if feeds is not None else []
            if sorted(fed) != sorted(p.name for p in placeholders):
                raise Blocked(
                    loop,
                    "the per-tower placeholders are not all collected with "
                    "`feeds.append((x, y))` for the feed loop",
                )
            placeholders = [next(p for p in placeholders if p.name == n) for n in fed]
        return {
            "index": index,
            "count": count,
            "withs": withs,
            "body": kept,
            "list": list_name,
            "loss": loss,
            "optimizer": optimizer.value,
            "placeholders": placeholders,
            "feeds": feeds,
            "collected": collected,
            "update_ops": update_ops,
            "dropped_setup": dropped_setup,
            "dequeued": dequeued,
        }

    def _append(
        self, small: cst.BaseSmallStatement | None, lists: set[str]
    ) -> tuple[str, cst.BaseExpression] | None:
        """``some_list.append(value)`` on one of the function's lists -> (list, value)."""
        if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
            return None
        func = small.value.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value == "append"
            and isinstance(func.value, cst.Name)
            and func.value.value in lists
            and len(small.value.args) == 1
        ):
            value = small.value.args[0].value
            if (
                isinstance(value, cst.Call)
                and isinstance(value.func, cst.Attribute)
                and (
                    value.func.attr.value == "compute_gradients"
                )
            ):
                return None  # the gradients: read below
            return func.value.value, value
        return None

    def _update_ops(self, statement: cst.CSTNode) -> UpdateOps | None:
        """``if <test>: ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS, scope)``."""
        if not isinstance(statement, cst.If) or statement.orelse is not None:
            return None
        body = statement.body.body
        collected = self._update_ops_assignment(body[0]) if len(body) == 1 else None
        if collected is None:
            return None
        test = self.rule.context.module.code_for_node(statement.test)
        return UpdateOps(collected[0], re.sub(r"([([])\s+", r"\1", " ".join(test.split())))

    def _enumerated_devices(
        self, loop: cst.For, setup: list
    ) -> tuple[str, cst.BaseExpression, str]:
        target = loop.target
        call = _call_of(loop.iter)
        if not (
            isinstance(target, cst.Tuple)
            and len(target.elements) == 2
            and all(isinstance(e.value, cst.Name) for e in target.elements)
            and call is not None
            and isinstance(call.func, cst.Name)
            and call.func.value == "enumerate"
            and len(call.args) == 1
            and isinstance(call.args[0].value, cst.Name)
        ):
            raise Blocked(
                loop,
                "the tower loop is not `for i in range(n)` or "
                "`for i, device in enumerate(devices)`",
            )
        # Names, checked above
        index, device = (cast(cst.Name, e.value).value for e in target.elements)
        devices = call.args[0].value.value
        for statement in setup:
            assigned = _assign(statement)
            if assigned is None or assigned[0] != [devices]:
                continue
            comp = assigned[1]
            if isinstance(comp, cst.ListComp) and isinstance(comp.for_in.target, cst.Name):
                count = self._range_count(comp.for_in.iter)
                if count is not None and comp.for_in.inner_for_in is None and not comp.for_in.ifs:
                    uses = [
                        n
                        # read() found the loop in a function
                        for n in walk(cast(cst.FunctionDef, self.rule.enclosing_def(loop)))
                        if isinstance(n, cst.Name) and n.value in (devices, device)
                    ]
                    if len(uses) != 4:  # both bound once, each used once (enumerate, tf.device)
                        raise Blocked(
                            loop,
                            f"`{devices}` / `{device}` are used for more than placing the towers",
                        )
                    return index, count, devices
        raise Blocked(
            loop, f"`{devices}` is not a list of device strings built over `range(num_towers)`"
        )

    def _range_count(self, node: cst.BaseExpression) -> cst.BaseExpression | None:
        call = _call_of(node)
        if call is None or not isinstance(call.func, cst.Name):
            return None
        if call.func.value != "range" and not (
            call.func.value == "xrange" and self.q(call.func) in _XRANGE
        ):
            return None
        if len(call.args) == 1:
            return call.args[0].value
        return None

    def _unsplit(self, node, splits: dict[str, str], index: str):
        class Unsplit(cst.CSTTransformer):
            def leave_Subscript(self, original, updated):
                if (
                    isinstance(updated.value, cst.Name)
                    and updated.value.value in splits
                    and len(updated.slice) == 1
                    and isinstance(updated.slice[0].slice, cst.Index)
                    and isinstance(updated.slice[0].slice.value, cst.Name)
                    and updated.slice[0].slice.value.value == index
                ):
                    return cst.Name(splits[updated.value.value])
                return updated

        return node.visit(Unsplit())

    # -- after the towers ---------------------------------------------------------------------
    def _read_tail(self, function, loop, python_setup, setup, placeholders, splits, tower, rest):
        tower_list = tower["list"]
        self._tower_feeds = tower["feeds"]
        self._dataset_input = any(p.dtype is None for p in placeholders)
        aggregate = None
        helper = None
        apply: list[cst.BaseStatement] = []
        train_op = None
        session = None
        step_loop = None
        inline: list[cst.BaseStatement] = []
        grouped = False
        update_ops: UpdateOps | None = tower["update_ops"]
        reductions: dict[str, str] = {}
        reduction_calls: dict[str, cst.Call] = {}
        ema: tuple[str, cst.BaseStatement] | None = None
        consumed = False  # the selected UPDATE_OPS run with the train op
        appended = False  # slim: the update appended to them
        train_value: tuple[str, str] | None = None  # (tensor, op name) with_dependencies returns
        orderless: tuple[str, cst.BaseStatement] | None = None  # `ema_op = ema.apply(...)`
        tail = _Tail(tower, {p.name for p in placeholders if p.name in splits.values()})
        scope_names = [
            item.asname.name.value
            for item in tower["withs"]
            if item.asname is not None and isinstance(item.asname.name, cst.Name)
        ]
        scope_formats = [
            item.item.args[0].value
            for item in tower["withs"]
            if isinstance(item.item, cst.Call) and item.item.args
        ]
        for position, statement in enumerate(rest):
            assigned = _assign(statement)
            collected_ops = self._collected_update_ops(
                statement, scope_names, scope_formats, tower["index"]
            )
            if collected_ops is not None and session is None:
                if update_ops is not None:
                    raise Blocked(statement, "UPDATE_OPS are selected twice")
                update_ops = collected_ops
                continue
            if (
                update_ops is not None
                and not consumed
                and train_op is None
                and aggregate is not None
                and self._under_update_ops(statement, update_ops.name) is not None
            ):
                # `with tf.control_dependencies(update_ops): train_op = opt.apply_gradients(...)`
                # not None: tested above
                statement = cast(
                    cst.BaseStatement, self._under_update_ops(statement, update_ops.name)
                )
                assigned = _assign(statement)
                consumed = True
            add_n = _call_of(assigned[1]) if assigned is not None else None
            summed = get_arg(add_n, 0, "inputs") if add_n is not None else None
            if (
                assigned is not None
                and len(assigned[0]) == 1
                and session is None
                and self.call_q(add_n) == "tensorflow.add_n"
                and add_n is not None
                and isinstance(summed, cst.Name)
                and summed.value in tower["collected"]
            ):
                # `total_loss = tf.add_n(clone_losses)`: the SUM over the replicas.
                reductions[assigned[0][0]] = summed.value
                reduction_calls[assigned[0][0]] = add_n
                tail.root_op(assigned[0][0], assigned[1])
                continue
            if session is None and assigned is not None and len(assigned[0]) == 1:
                if self._tail_value(tail, assigned[0][0], assigned[1]):
                    continue
            if aggregate is None and not inline and self._inline_start(rest, position, tower_list):
                inline = [statement, rest[position + 1]]
                continue
            if aggregate is None and inline:
                started = _assign(inline[0])
                assert started is not None  # _inline_start read it
                aggregate = (started[0][0], self._inline_averaged(inline[1]))
                tail.unknown.update(_op_types(inline))
                continue  # the aggregation loop itself
            inline_call = self._aggregated_inline(assigned, tower_list) if not aggregate else None
            if inline_call is not None:
                # `train_op = opt.apply_gradients(average_gradients(tower_grads), ...)`: read as
                # `grads = average_gradients(tower_grads)` then the apply on `grads`
                # _aggregated_inline found `helper(tower_grads)`: a call of a name
                helper = self._helper_def(cast(cst.Name, inline_call.func).value)
                if helper is not None and id(helper) in self.aggregation:
                    name = f"{tower_list}_aggregated"
                    aggregate = (name, self.aggregation[id(helper)])
                    tail.unknown.update(_op_types([helper]))
                    statement = statement.deep_replace(inline_call, cst.Name(name))
                    assigned = _assign(statement)
            if aggregate is None:
                if assigned is None or len(assigned[0]) != 1:
                    raise Blocked(
                        statement,
                        "expected the towers' gradients to be aggregated "
                        "right after the tower loop",
                    )
                call = _call_of(assigned[1])
                if (
                    call is None
                    or not isinstance(call.func, cst.Name)
                    or free_names(call) != {call.func.value, tower_list}
                ):
                    raise Blocked(
                        statement,
                        "expected the towers' gradients to be aggregated "
                        "here (`grads = average_gradients(tower_grads)` or `grads = []` "
                        "+ `for gv in zip(*tower_grads): ...`); other graph code between "
                        "the tower loop and the aggregation is not converted yet",
                    )
                helper = self._helper_def(call.func.value)
                if helper is None or id(helper) not in self.aggregation:
                    raise Blocked(
                        statement,
                        f"`{call.func.value}` is not an aggregation helper "
                        "TFM102 recognises (averaged or summed)",
                    )
                aggregate = (assigned[0][0], self.aggregation[id(helper)])
                tail.unknown.update(_op_types([helper]))
                continue
            if train_op is None:
                call = _call_of(assigned[1]) if assigned else None
                if (
                    assigned is None
                    or len(assigned[0]) != 1
                    or call is None
                    or not isinstance(call.func, cst.Attribute)
                    or call.func.attr.value != "apply_gradients"
                ):
                    for node in walk(statement):
                        clip = self.call_q(node) if isinstance(node, cst.Call) else None
                        if clip in _CLIPPING and aggregate[0] in free_names(statement):
                            raise Blocked(
                                statement,
                                f"`{clip.replace('tensorflow.', 'tf.')}` clips the aggregated "
                                "gradients before apply_gradients: under MirroredStrategy the "
                                "replicas' gradients are only summed inside apply_gradients, so "
                                "clipping their mean needs an explicit all-reduce first (not "
                                "converted yet)",
                            )
                    raise Blocked(
                        statement,
                        "expected `train_op = opt.apply_gradients(grads...)` after the aggregation",
                    )
                train_op = assigned[0][0]
                apply.append(statement)
                continue
            call = _call_of(assigned[1]) if assigned else None
            if (
                ema is None
                and assigned is not None
                and len(assigned[0]) == 1
                and self.call_q(call) == "tensorflow.train.ExponentialMovingAverage"
            ):
                ema = (assigned[0][0], statement)
                continue
            if ema is not None and not grouped and self._ema_apply(statement, ema[0], train_op):
                # `with tf.control_dependencies([apply_op]): train_op = ema.apply(...)`
                apply.append(statement)
                applied = _assign(statement.body.body[0])
                assert applied is not None  # _ema_apply read it
                train_op, grouped = applied[0][0], True
                continue
            if (
                update_ops is not None
                and not consumed
                and assigned is not None
                and len(assigned[0]) == 1
                and self.calls_to(call, "tensorflow.group")
                and self._groups(call, train_op, update_ops.name)
            ):
                # `train_op = tf.group(apply_op, *update_ops)`: the replicas update their batch
                # statistics themselves now (see the notes).
                train_op, consumed = assigned[0][0], True
                continue
            if (
                update_ops is not None
                and not consumed
                and not appended
                and self._is_method_statement(statement, update_ops.name, "append", train_op)
            ):
                # slim: `update_ops.append(grad_updates)` then `update_op = tf.group(*update_ops)`
                appended = True
                continue
            if (
                appended
                and not consumed
                and assigned is not None
                and len(assigned[0]) == 1
                and self.calls_to(call, "tensorflow.group")
                and len(call.args) == 1
                and call.args[0].star == "*"
                and isinstance(call.args[0].value, cst.Name)
                and update_ops is not None
                and call.args[0].value.value == update_ops.name
            ):
                train_op, consumed = assigned[0][0], True
                continue
            dependent = self._with_dependencies(assigned, train_op)
            if dependent is not None and train_value is None:
                # `train_tensor = with_dependencies([update_op], total_loss)`: running it runs
                # the update; its value is total_loss.
                assert assigned is not None  # what _with_dependencies read
                train_op, train_value = assigned[0][0], dependent
                continue
            if statement is not rest[-1] and self._hooks(statement, rest[position + 1]):
                continue
            if train_op is not None and session is None and self._logging(statement, assigned):
                continue  # summaries and the Saver: the eager loop writes them its own way
            session = self._session(statement)
            if session is not None:
                self._session_config(statement, tail)
                statements = rest[position:]
                if isinstance(statement, cst.With):
                    if position != len(rest) - 1:
                        raise Blocked(rest[-1], "code after the `with tf.Session()` block")
                    statements = [statement, *statement.body.body]
                step_loop = self._read_session(statements, session, train_op)
                break
            if (
                ema is not None
                and not grouped
                and orderless is None
                and self._ema_apply_call(statement, ema[0])
                and assigned is not None
                and len(assigned[0]) == 1
                # _ema_apply_call found `ema.apply(...)`: a call
                and self._ema_variables(cast(cst.Call, assigned[1]).args[0].value)
            ):
                orderless = (assigned[0][0], statement)
                continue
            if (
                orderless is not None
                and not grouped
                and assigned is not None
                and len(assigned[0]) == 1
                and self.calls_to(call, "tensorflow.group")
                and self._groups_orderless(
                    call,
                    train_op,
                    orderless[0],
                    update_ops.name if update_ops is not None and not consumed else None,
                )
            ):
                # `train_op = tf.group(apply_op, ema_op[, *update_ops])`: no order between the
                # update and the EMA (see ORDERLESS_EMA); the migrated step applies the EMA first.
                apply.insert(0, orderless[1])
                train_op, grouped = assigned[0][0], True
                consumed = consumed or update_ops is not None
                continue
            if session is None and self._device_config(statement, tail):
                continue
            if ema is not None and self._ema_apply_call(statement, ema[0]):
                raise Blocked(
                    statement,
                    f"`{ema[0]}.apply(...)` does not run after the update "
                    f"(no `with tf.control_dependencies([{train_op}]):`): TF1 ran it in "
                    "no fixed order against the update, so its shadows read the "
                    "weights before or after it (not converted)",
                )
            memory = self._memory_stats(assigned)
            if memory is not None and session is None:
                assert assigned is not None  # what _memory_stats read
                tail.memory[assigned[0][0]] = memory
                continue
            for node in walk(statement):
                called = self.call_q(node) if isinstance(node, cst.Call) else None
                if called is not None and called.startswith("tensorflow.contrib.memory_stats."):
                    raise Blocked(
                        node,
                        f"`{self.rule.src(node, 50)}` is fetched in the loop: "
                        "a graph op reporting GPU memory, which the eager loop cannot "
                        "fetch (TFM109 names the TF2 call; not converted)",
                    )
            if session is None and _plain_arithmetic(statement):
                # Reading nothing the function binds besides its plain set-up (the target
                # itself is bound in the graph block holding it).
                kept = {id(s) for s in python_setup}
                others = [s for s in function.body.body if id(s) not in kept]
                graph_made = set().union(set(), *(bound_names(s) for s in others))
                arithmetic = _assign(statement)
                assert arithmetic is not None  # _plain_arithmetic read it
                if not free_names(arithmetic[1]) & graph_made:
                    # `global_batch = args.batch_size * args.num_gpus`: plain Python on what
                    # the graph does not make, computed with the set-up before the graph.
                    python_setup.append(statement)
                    continue
            shown = (
                statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else statement
            )
            raise Blocked(
                statement,
                f"`{self.rule.src(shown, 50)}`: graph code between "
                "apply_gradients and the Session that is not an EMA, a summary, a "
                "Saver or the UPDATE_OPS plumbing (not converted yet)",
            )
        if session is None or step_loop is None:
            raise Blocked(loop, "no `tf.Session` training loop found after the towers")
        # the first statement after the towers set the aggregation, and the loop's run was
        # read as running train_op
        assert aggregate is not None and train_op is not None
        if ema is not None and not grouped:
            raise Blocked(
                ema[1],
                f"`{ema[0]}` is not applied as `with tf.control_dependencies("
                f"[{train_op}]): train_op = {ema[0]}.apply(tf.trainable_variables())`",
            )
        if update_ops is not None and not consumed:
            raise Blocked(
                rest[0] if rest else loop,
                f"the selected UPDATE_OPS `{update_ops.name}` "
                "are not run through `tf.group(train_op, *update_ops)`",
            )
        if orderless is not None and not grouped:
            raise Blocked(
                orderless[1],
                f"`{orderless[0]}` is not grouped with the update as "
                f"`tf.group({train_op}, {orderless[0]})`",
            )
        feed_statements, feed_values, run_statement, fetches = step_loop[1:5]
        fetches = self._summary_fetches(fetches, run_statement)
        for name, (source, op) in tail.reductions.items():
            reductions[name] = source
            reduction_calls[name] = tail.calls[name]
            tail.ops[name] = op
        if tail.replica_values:
            tower["body"] = [*tower["body"], *tail.replica_values]
            tower["collected"] = {**tower["collected"], **tail.replica_lists}
        if train_value is not None:
            # Fetching the with_dependencies tensor fetched its value after the update.
            fetches = [Fetch(None, train_op)] + [
                Fetch(f.target, train_value[0]) if f.tensor == train_op else f
                for f in fetches
                if f.tensor != train_op or f.target is not None
            ]
        tower_names = bound_names(cst.IndentedBlock(body=tower["body"])) | {tower["index"]}
        setup_names = set().union(set(), *(bound_names(s) for s in setup))
        for fetch in fetches:
            if fetch.tower is not None and fetch.tensor not in tower["collected"]:
                raise Blocked(
                    run_statement,
                    f"the loop fetches `{fetch.tensor}[{fetch.tower}]`, and `{fetch.tensor}` is "
                    "not a list the towers append their tensors to",
                )
            if fetch.tensor == train_op or fetch.tensor in tower["collected"]:
                continue
            if fetch.tensor in reductions or fetch.tensor == self._log.summary_op:
                continue
            if fetch.tensor in tail.memory:
                continue  # the loop asks tf.config for it (see the notes)
            if fetch.tensor in setup_names and (
                self._monitored is not None or fetch.tensor not in self._setup_variables(setup)
            ):
                # e.g. the learning rate: read in the step, before the update, as TF1 computed
                # it for the update. (A variable fetched next to its own update was read in no
                # fixed order against it: left to the refusal below.)
                continue
            if fetch.tensor not in tower_names:
                raise Blocked(
                    run_statement,
                    f"the loop fetches `{fetch.tensor}`, which is not "
                    "a tower tensor (only tower tensors are converted so far)",
                )
        for placeholder in placeholders:
            if placeholder.dtype is not None and placeholder.name not in feed_values:
                raise Blocked(run_statement, f"the placeholder `{placeholder.name}` is not fed")
        fed_defaults = self._fed_defaults(setup, feed_values, step_loop[0], step_loop[6])
        for name in feed_values:
            if name not in {p.name for p in placeholders}:
                raise Blocked(run_statement, f"the loop feeds `{name}`, which is not a placeholder")
        return Program(
            function=function,
            python_setup=python_setup,
            graph_setup=setup,
            placeholders=placeholders,
            splits=splits,
            tower_loop=loop,
            tower_index=tower["index"],
            tower_count=tower["count"],
            tower_body=tower["body"],
            tower_withs=tower["withs"],
            loss=tower["loss"],
            optimizer=tower["optimizer"],
            grads_name=aggregate[0],
            averaged=aggregate[1],
            apply=apply,
            train_op=train_op,
            step_loop=step_loop[0],
            feed_statements=feed_statements,
            feed_values=feed_values,
            fed_defaults=fed_defaults,
            run_statement=run_statement,
            fetches=fetches,
            helper=helper,
            aggregation=inline,
            tower_feed=step_loop[5],
            session_prelude=step_loop[6],
            run_fetches_list=step_loop[7],
            reductions=reductions,
            reduction_calls=reduction_calls,
            train_value=train_value,
            update_ops=update_ops,
            ema=ema,
            logging=self._log,
            monitored=self._monitored[0] if self._monitored else None,
            checkpoint_dir=self._monitored[1] if self._monitored else None,
            ema_orderless=orderless is not None,
            reduction_ops=tail.ops,
            fetch_names=tail.names,
            per_variable_names=tail.per_variable,
            device_settings=tail.settings,
            config_calls=tail.config_calls,
            final_save=self._final_save,
            memory_fetches={
                f.tensor: MEMORY_STATS[tail.memory[f.tensor]]
                for f in fetches
                if f.tensor in tail.memory
            },
        )

    def _logging(
        self, statement: cst.CSTNode, assigned: tuple[list[str], cst.BaseExpression] | None
    ) -> bool:
        """``tf.summary.scalar('tag', t)``, ``s = tf.summary.merge_all()``, ``saver =
        tf.train.Saver(tf.global_variables(), max_to_keep=n)`` between the update and the
        Session: recorded for the eager loop."""
        small = _simple(statement)
        call = _call_of(small.value) if isinstance(small, cst.Expr) else None
        if call is not None and self.call_q(call) == "tensorflow.summary.scalar":
            tag, tensor = get_arg(call, 0, "name"), get_arg(call, 1, "tensor")
            fetched = _fetched_name(tensor) if tensor is not None else None
            if len(call.args) == 2 and isinstance(tensor, cst.Subscript) and fetched is None:
                raise Blocked(
                    statement,
                    f"tf.summary.scalar of `{self.rule.src(tensor, 40)}`: only an integer "
                    "literal index into a per-tower list (`losses[0]`, `losses[-1]`) says "
                    "which replica's value to log",
                )
            if len(call.args) != 2 or fetched is None or tag is None:
                raise Blocked(
                    statement,
                    "a summary other than tf.summary.scalar(tag, tensor) or "
                    "tf.summary.scalar(tag, per_tower_list[<integer literal>])",
                )
            self._log.scalars.append((tag, *fetched))
            return True
        if assigned is None or len(assigned[0]) != 1:
            return False
        name = self.call_q(assigned[1])
        call = _call_of(assigned[1])
        if name == "tensorflow.summary.merge_all" and call is not None and not call.args:
            self._log.summary_op = assigned[0][0]
            return True
        if name == "tensorflow.train.Saver" and call is not None:
            var_list = get_arg(call, 0, "var_list")
            keywords = {a.keyword.value for a in call.args if a.keyword is not None}
            if (
                (
                    var_list is not None
                    and self.call_q(var_list)
                    not in ("tensorflow.global_variables", "tensorflow.all_variables")
                )
                or keywords - {"var_list", "max_to_keep"}
                or len(call.args) > 2
            ):
                raise Blocked(
                    statement,
                    "a Saver of other than all variables (or with options other than max_to_keep)",
                )
            self._log.saver = (assigned[0][0], get_arg(call, None, "max_to_keep"))
            return True
        return False

    def _aggregated_inline(
        self, assigned: tuple[list[str], cst.BaseExpression] | None, tower_list: str
    ) -> cst.Call | None:
        """``helper(tower_grads)`` given straight to ``opt.apply_gradients``."""
        call = _call_of(assigned[1]) if assigned is not None and len(assigned[0]) == 1 else None
        if not (
            call is not None
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "apply_gradients"
        ):
            return None
        inner = _call_of(get_arg(call, 0, "grads_and_vars"))
        if (
            inner is not None
            and isinstance(inner.func, cst.Name)
            and free_names(inner) == {inner.func.value, tower_list}
        ):
            return inner
        return None

    @staticmethod
    def _writer_call(statement: cst.CSTNode | None) -> str | None:
        """``w.close()`` or ``w.flush()``: the name ``w``."""
        small = _simple(statement) if statement is not None else None
        call = small.value if isinstance(small, cst.Expr) else None
        if (
            isinstance(call, cst.Call)
            and not call.args
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value in ("close", "flush")
            and isinstance(call.func.value, cst.Name)
        ):
            return call.func.value.value
        return None

    def _setup_variables(self, setup: list[cst.BaseStatement]) -> set[str]:
        """Names the set-up binds to a variable (``global_step = tf.train.get_or_create_...``)."""
        made = set()
        for statement in setup:
            for node in walk(statement):
                assigned = _assign(node) if isinstance(node, cst.SimpleStatementLine) else None
                if assigned is not None and (self.call_q(assigned[1]) or "").endswith(
                    _VARIABLE_CALLS
                ):
                    made.update(assigned[0])
        return made

    def _file_writer(self, statement: cst.CSTNode | None) -> bool:
        assigned = _assign(statement) if statement is not None else None
        return (
            assigned is not None
            and len(assigned[0]) == 1
            and self.call_q(assigned[1]) == "tensorflow.summary.FileWriter"
        )

    def _session_logging(self, statement: cst.CSTNode, session: str) -> bool:
        """``tf.train.start_queue_runners(sess=sess)`` and ``w = tf.summary.FileWriter(dir,
        sess.graph)`` in the session block: no queue runners in TF2, a summary writer instead."""
        small = _simple(statement)
        call = _call_of(small.value) if isinstance(small, cst.Expr) else None
        if call is not None and self.call_q(call) == "tensorflow.train.start_queue_runners":
            if free_names(call) - {session} - {"tf", "tensorflow"}:
                raise Blocked(statement, "queue runners with a Coordinator (not converted yet)")
            self._log.queue_runners = True
            return True
        assigned = _assign(statement)
        if (
            assigned is not None
            and len(assigned[0]) == 1
            and self.call_q(assigned[1]) == "tensorflow.summary.FileWriter"
        ):
            logdir = get_arg(cast(cst.Call, assigned[1]), 0, "logdir")  # call_q named it
            if logdir is None or session in free_names(logdir):
                raise Blocked(statement, "a FileWriter without a log directory")
            self._log.writer = (assigned[0][0], logdir)
            return True
        return False

    def _summary_fetches(self, fetches: list[Fetch], run_statement: cst.CSTNode) -> list[Fetch]:
        """The merged summary fetched in the loop: its scalars become fetches of their own."""
        log = self._log
        if log.summary_op is None or not any(f.tensor == log.summary_op for f in fetches):
            if log.scalars and log.writer is not None:
                raise Blocked(
                    run_statement,
                    "summaries written without fetching "
                    "tf.summary.merge_all() in the training step",
                )
            return fetches
        if log.writer is None:
            raise Blocked(run_statement, "a merged summary fetched without a FileWriter")
        fetched = {(f.tensor, f.tower) for f in fetches}
        return fetches + [Fetch(None, t, k) for _, t, k in log.scalars if (t, k) not in fetched]

    def _is_method_statement(
        self, statement: cst.CSTNode, receiver: str, method: str, argument: str | None
    ) -> bool:
        """``receiver.method(argument)`` as a statement."""
        small = _simple(statement)
        return (
            isinstance(small, cst.Expr)
            and isinstance(small.value, cst.Call)
            and self._is_method(small.value, receiver, method)
            and len(small.value.args) == 1
            and isinstance(small.value.args[0].value, cst.Name)
            and small.value.args[0].value.value == argument
        )

    def _with_dependencies(
        self, assigned: tuple[list[str], cst.BaseExpression] | None, train_op: str | None
    ) -> tuple[str, str] | None:
        """``t = with_dependencies([train_op], value, name='n')`` -> ('value', 'n')."""
        call = _call_of(assigned[1]) if assigned else None
        if assigned is None or call is None or len(assigned[0]) != 1 or train_op is None:
            return None
        if not (self.q(call.func) or "").endswith(".with_dependencies"):
            return None
        deps = get_arg(call, 0, "dependencies")
        value = get_arg(call, 1, "output_tensor")
        name = get_arg(call, 2, "name")
        if not (
            isinstance(deps, cst.List)
            and [getattr(e.value, "value", None) for e in deps.elements] == [train_op]
            and isinstance(value, cst.Name)
            and (name is None or isinstance(name, cst.SimpleString))
        ):
            return None
        op_name = name.evaluated_value if isinstance(name, cst.SimpleString) else None
        return value.value, op_name if isinstance(op_name, str) and op_name else "control_dependency"

    def _update_ops_assignment(self, statement: cst.CSTNode) -> tuple[str, cst.Call] | None:
        """``ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS, ...)`` -> (ops, the call)."""
        assigned = _assign(statement)
        call = _call_of(assigned[1]) if assigned else None
        if (
            assigned is None
            or call is None
            or len(assigned[0]) != 1
            or self.call_q(call) != "tensorflow.get_collection"
            or not call.args
            or self.q(call.args[0].value) != "tensorflow.GraphKeys.UPDATE_OPS"
        ):
            return None
        return assigned[0][0], call

    def _collected_update_ops(
        self,
        statement: cst.CSTNode,
        scope_names: list[str],
        scope_formats: list[cst.BaseExpression],
        index: str,
    ) -> UpdateOps | None:
        """``ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)`` after the tower loop (every
        tower's), ``(..., scope)`` with the tower loop's last name scope (the last tower's), or
        ``(..., 'tower0')``: the literal name one tower's name scope takes (that tower's)."""
        collected = self._update_ops_assignment(statement)
        if collected is None:
            return None
        call = collected[1]
        scope = get_arg(call, 1, "scope")
        if scope is None:
            return UpdateOps(collected[0], "", "global")
        if isinstance(scope, cst.Name) and scope.value in scope_names:
            return UpdateOps(collected[0], scope.value, "last")
        if isinstance(scope, cst.SimpleString) and index:
            literal = str(scope.evaluated_value).rstrip("/")
            for tower in range(64):
                if any(_scope_name(f, index, tower) == literal for f in scope_formats):
                    return UpdateOps(collected[0], f"{index} == {tower}")
            names = [n for f in scope_formats if (n := _scope_name(f, index, 0)) is not None]
            raise Blocked(
                statement,
                f"UPDATE_OPS of scope {literal!r}, which no tower's name scope takes"
                + (f" (the towers' are {names[0]!r} for tower 0, ...)" if names else ""),
            )
        raise Blocked(statement, "UPDATE_OPS of a scope other than the towers' name scope")

    def _under_update_ops(
        self, statement: cst.CSTNode, update_ops: str
    ) -> cst.BaseStatement | None:
        """``with tf.control_dependencies(update_ops): <one statement>`` -> that statement."""
        if not isinstance(statement, cst.With) or len(statement.items) != 1:
            return None
        if not isinstance(statement.body, cst.IndentedBlock):
            return None  # `with ...: x = f()`: no line to take out
        deps = _call_of(statement.items[0].item)
        body = statement.body.body
        if (
            deps is None
            or self.call_q(deps) != "tensorflow.control_dependencies"
            or len(deps.args) != 1
            or not isinstance(deps.args[0].value, cst.Name)
            or deps.args[0].value.value != update_ops
            or len(body) != 1
        ):
            return None
        return body[0]

    def _inline_start(self, rest: list, position: int, tower_list: str) -> bool:
        """``grads = []`` then ``for gv in zip(*tower_grads): ... grads.append(...)``, one of
        whose statements TFM102 recognised as an aggregation."""
        assigned = _assign(rest[position])
        if (
            assigned is None
            or len(assigned[0]) != 1
            or not _empty_lists(assigned[1], 1)
            or position + 1 >= len(rest)
        ):
            return False
        loop = rest[position + 1]
        if not isinstance(loop, cst.For) or loop.orelse is not None:
            return False
        call = _call_of(loop.iter)
        if not (
            call is not None
            and isinstance(call.func, cst.Name)
            and call.func.value == "zip"
            and len(call.args) == 1
            and call.args[0].star == "*"
            and isinstance(call.args[0].value, cst.Name)
            and call.args[0].value.value == tower_list
        ):
            return False
        last = _simple(loop.body.body[-1])
        appended = self._append(last, {assigned[0][0]})
        return appended is not None and any(id(n) in self.aggregation for n in walk(loop))

    def _inline_averaged(self, loop: cst.CSTNode) -> bool:
        return any(self.aggregation.get(id(n), False) for n in walk(loop))

    def _ema_apply(self, statement: cst.CSTNode, ema: str, train_op: str | None) -> bool:
        if not isinstance(statement, cst.With) or len(statement.items) != 1 or train_op is None:
            return False
        deps = _call_of(statement.items[0].item)
        body = statement.body.body
        assigned = _assign(body[0]) if len(body) == 1 else None
        call = _call_of(assigned[1]) if assigned else None
        if not (
            deps is not None
            and self.call_q(deps) == "tensorflow.control_dependencies"
            and len(deps.args) == 1
            and isinstance(deps.args[0].value, cst.List)
            and [getattr(e.value, "value", None) for e in deps.args[0].value.elements] == [train_op]
            and assigned is not None
            and len(assigned[0]) == 1
            and call is not None
            and self._is_method(call, ema, "apply")
            and len(call.args) == 1
            and self._ema_variables(call.args[0].value)
        ):
            return False
        return True

    def _ema_apply_call(self, statement: cst.CSTNode, ema: str) -> bool:
        """``x = ema.apply(...)`` at the top level (not under the update's dependency)."""
        assigned = _assign(statement)
        call = _call_of(assigned[1]) if assigned else None
        return call is not None and self._is_method(call, ema, "apply")

    def _ema_variables(self, value: cst.BaseExpression) -> bool:
        """``tf.trainable_variables()``, optionally ``+ tf.moving_average_variables()``."""
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add):
            return self.call_q(value.left) == "tensorflow.trainable_variables" and (
                self.call_q(value.right) == "tensorflow.moving_average_variables"
            )
        return self.call_q(value) == "tensorflow.trainable_variables"

    def _hooks(self, statement: cst.CSTNode, following: cst.CSTNode) -> bool:
        """``hooks = [tf.train.StopAtStepHook(last_step=n)]`` for the MonitoredTrainingSession."""
        assigned = _assign(statement)
        if assigned is None or len(assigned[0]) != 1 or not isinstance(assigned[1], cst.List):
            return False
        elements = assigned[1].elements
        hook = _call_of(elements[0].value) if len(elements) == 1 else None
        if hook is None or self.call_q(hook) != "tensorflow.train.StopAtStepHook":
            return False
        last = get_arg(hook, 1, "last_step")
        if last is None or get_arg(hook, 0, "num_steps") is not None:
            return False
        self._hook_list = (assigned[0][0], last)
        return True

    def _groups(self, call: cst.Call, train_op: str, update_ops: str) -> bool:
        """``tf.group(train_op, *update_ops)`` (in either order)."""
        parts = {(a.star, a.value.value) for a in call.args if isinstance(a.value, cst.Name)}
        return len(call.args) == 2 and parts == {("", train_op), ("*", update_ops)}

    def _helper_def(self, name: str) -> cst.FunctionDef | None:
        for statement in self.rule.context.module.body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
                return statement
        return None

    def _session(self, statement: cst.CSTNode) -> str | None:
        """``sess = tf.Session(...)`` or ``with tf.Session(...) as sess:`` -> 'sess'."""
        assigned = _assign(statement)
        if assigned and len(assigned[0]) == 1 and self.call_q(assigned[1]) in SESSIONS:
            return assigned[0][0]
        if (
            isinstance(statement, cst.With)
            and len(statement.items) == 1
            and self.call_q(statement.items[0].item) == MONITORED
            and statement.items[0].asname is not None
            and isinstance(statement.items[0].asname.name, cst.Name)
        ):
            call = cast(cst.Call, statement.items[0].item)  # call_q named it
            hooks = get_arg(call, None, "hooks")
            keywords = {a.keyword.value for a in call.args if a.keyword is not None}
            if (
                self._hook_list is None
                or not isinstance(hooks, cst.Name)
                or hooks.value != self._hook_list[0]
                or keywords - {"checkpoint_dir", "hooks"}
                or len(keywords) != len(call.args)
            ):
                raise Blocked(
                    statement,
                    "a MonitoredTrainingSession other than "
                    "(checkpoint_dir=..., hooks=[tf.train.StopAtStepHook(last_step=n)])",
                )
            self._monitored = (self._hook_list[1], get_arg(call, None, "checkpoint_dir"))
            return statement.items[0].asname.name.value
        if (
            isinstance(statement, cst.With)
            and len(statement.items) == 1
            and self.call_q(statement.items[0].item) in SESSIONS
            and statement.items[0].asname is not None
            and isinstance(statement.items[0].asname.name, cst.Name)
        ):
            return statement.items[0].asname.name.value
        return None

    def _read_session(self, statements, session: str, train_op: str):
        """``sess = tf.Session(...)``, ``sess.run(init)``, then the step loop, then nothing."""
        if self._monitored is not None:
            # MonitoredTrainingSession initialises by itself: a fake initializer slot.
            statements = [statements[0], None, *statements[1:]]
        closing: list[cst.BaseStatement] = []
        for _ in range(3):  # the writer's close/flush and the final save, in any order
            if len(statements) > 3 and self._writer_call(statements[-1]):
                closing.insert(0, statements[-1])
                statements = statements[:-1]
            elif len(statements) > 3 and self._saved_at_end(statements[-1], session):
                statements = statements[:-1]  # `Saver().save(sess, path)`: main() writes it now
        if len(statements) < 3:
            raise Blocked(
                statements[0],
                "the session block is not `sess = tf.Session(...)`, "
                "`sess.run(initializer)`, one step loop",
            )
        while len(statements) > 3 and self._file_writer(statements[1]):
            # `writer = tf.summary.FileWriter(dir, sess.graph)` before the initializer: it
            # only opens the log folder, so it is read as if it came after it.
            self._session_logging(statements[1], session)
            statements = [statements[0], *statements[2:]]
        init = _simple(statements[1]) if statements[1] is not None else None
        if self._monitored is None and not (
            isinstance(init, cst.Expr)
            and isinstance(init.value, cst.Call)
            and self._is_method(init.value, session, "run")
            and init.value.args
            and self.call_q(init.value.args[0].value) in INITIALIZERS
        ):
            raise Blocked(statements[1], "expected `sess.run(tf.global_variables_initializer())`")
        prelude = [s for s in statements[2:-1] if not self._session_logging(s, session)]
        for statement in closing:
            if self._log.writer is None or self._writer_call(statement) != self._log.writer[0]:
                raise Blocked(statement, "code after the step loop other than a final save")
        self._log.closing = closing
        for statement in prelude:
            # Plain Python the loop needs (`global_batch = ...`): no session, no graph.
            if session in free_names(statement) or _assign(statement) is None:
                raise Blocked(
                    statement,
                    "the session block holds more than the initializer, "
                    "plain assignments and one step loop",
                )
        statements = [statements[0], statements[1], statements[-1]]
        step_loop = statements[2]
        if self._monitored is not None:
            if not (
                isinstance(step_loop, cst.While)
                and step_loop.orelse is None
                and isinstance(step_loop.test, cst.UnaryOperation)
                and isinstance(step_loop.test.operator, cst.Not)
                and isinstance(step_loop.test.expression, cst.Call)
                and self._is_method(step_loop.test.expression, session, "should_stop")
            ):
                raise Blocked(step_loop, "the training loop is not `while not sess.should_stop():`")
        elif not isinstance(step_loop, cst.For) or step_loop.orelse is not None:
            raise Blocked(step_loop, "the training loop is not a plain `for` loop")
        run = None
        body = list(step_loop.body.body)
        for statement in body:
            for node in walk(statement):
                if isinstance(node, cst.Call) and self._is_method(node, session, "run"):
                    if run is not None:
                        raise Blocked(node, "more than one sess.run in the training loop")
                    run = (statement, node)
        if run is None:
            raise Blocked(step_loop, "no sess.run in the training loop")
        run_statement, run_call = run
        assigned = _assign(run_statement)
        if assigned is None or assigned[1] is not run_call:
            raise Blocked(run_statement, "sess.run's result is not assigned to names")
        fetched = get_arg(run_call, 0, "fetches")
        feed = get_arg(run_call, 1, "feed_dict")
        listed = self._listed_fetch(fetched, assigned[0])
        if listed is not None:
            # `results = sess.run([train_op] + losses)`: results[0] is None, then every tower's.
            if listed[0] != train_op:
                raise Blocked(run_call, f"sess.run does not run `{train_op}`")
            fetches = [Fetch(None, train_op), Fetch(assigned[0][0], listed[1])]
            if not isinstance(feed, cst.Name):
                raise Blocked(run_call, "feed_dict is not a dict built in the loop")
            feed_statements, feed_values, tower_feed = self._feed(body, feed.value, run_statement)
            return (
                step_loop,
                feed_statements,
                feed_values,
                run_statement,
                fetches,
                tower_feed,
                prelude,
                listed[1],
            )
        if isinstance(fetched, cst.Name) and len(assigned[0]) == 1:
            names: list[tuple[str, int | None]] = [(fetched.value, None)]  # `loss_value = sess.run(train_tensor, ...)`
        elif not isinstance(fetched, cst.List | cst.Tuple) or not all(
            _fetched_name(e.value) for e in fetched.elements
        ):
            for element in fetched.elements if isinstance(fetched, cst.List | cst.Tuple) else []:
                if isinstance(element.value, cst.Subscript) and not _fetched_name(element.value):
                    raise Blocked(
                        run_call,
                        f"sess.run fetches `{self.rule.src(element.value, 40)}`: only an "
                        "integer literal index into a per-tower list (`losses[0]`, "
                        "`losses[-1]`) says which replica's value to log",
                    )
            raise Blocked(
                run_call,
                "sess.run fetches something other than a list of names "
                "(or of per-tower list entries `losses[<integer literal>]`)",
            )
        else:
            names = [n for e in fetched.elements if (n := _fetched_name(e.value)) is not None]
        if len(names) != len(assigned[0]):
            raise Blocked(run_call, "sess.run's fetches and targets differ in length")
        if (train_op, None) not in names:
            raise Blocked(run_call, f"sess.run does not run `{train_op}`")
        fetches = [
            Fetch(None if target == "_" else target, tensor, tower)
            for target, (tensor, tower) in zip(assigned[0], names, strict=True)
        ]
        if self._monitored is not None:
            if feed is not None:
                raise Blocked(
                    run_call,
                    "a MonitoredTrainingSession loop with feed_dict input "
                    "(only tf.data input is converted with it so far)",
                )
            return step_loop, [], {}, run_statement, fetches, None, prelude, None  # tf.data input
        if feed is None and self._dataset_input:
            return step_loop, [], {}, run_statement, fetches, None, prelude, None
        if isinstance(feed, cst.Dict):
            # `sess.run(..., feed_dict={x: xs, y: ys})`: the dict written in the call
            feed_statements, feed_values, tower_feed = self._feed(body, feed, run_statement)
        elif not isinstance(feed, cst.Name):
            raise Blocked(run_call, "feed_dict is not a dict built in the loop")
        else:
            feed_statements, feed_values, tower_feed = self._feed(body, feed.value, run_statement)
        return (
            step_loop,
            feed_statements,
            feed_values,
            run_statement,
            fetches,
            tower_feed,
            prelude,
            None,
        )

    def _listed_fetch(
        self, fetched: cst.BaseExpression | None, targets: list[str]
    ) -> tuple[str, str] | None:
        """``[train_op] + losses`` assigned to one name -> ('train_op', 'losses')."""
        if (
            isinstance(fetched, cst.BinaryOperation)
            and isinstance(fetched.operator, cst.Add)
            and isinstance(fetched.left, cst.List)
            and len(fetched.left.elements) == 1
            and isinstance(fetched.left.elements[0].value, cst.Name)
            and isinstance(fetched.right, cst.Name)
            and len(targets) == 1
        ):
            return fetched.left.elements[0].value.value, fetched.right.value
        return None

    def _fed_defaults(
        self,
        setup: list[cst.BaseStatement],
        feed_values: dict[str, cst.BaseExpression],
        step_loop: cst.For,
        session_prelude: list[cst.BaseStatement],
    ) -> tuple[str, ...]:
        """``keep_prob = tf.placeholder_with_default(1.0, [])`` fed ``args.keep`` at every step:
        the graph now reads that value (each step fed the same one). A fed value that changes
        from step to step, or that the session block computes, is not converted."""
        fed = [name for name in feed_values if name in self._with_default]
        changing = bound_names(step_loop).union(*(bound_names(s) for s in session_prelude))
        for name in fed:
            value = feed_values.pop(name)
            if free_names(value) & changing:
                raise Blocked(
                    self._with_default[name],
                    f"`{name}` (placeholder_with_default) is fed a value made in the session "
                    "block or changing in the loop: not converted",
                )
            statement = self._with_default[name]
            setup[setup.index(statement)] = _put(cst.parse_statement(f"{name} = __value__"), value)
        return tuple(fed)

    def _feed(self, body, feed: str | cst.Dict, run_statement):
        """The loop statements the feed dict needs (and nothing else reads), and its values."""
        values: dict[str, cst.BaseExpression] = {}
        feed_statement = None
        tower_feed = None
        if isinstance(feed, cst.Dict):
            for element in feed.elements:
                if not isinstance(element, cst.DictElement) or not isinstance(
                    element.key, cst.Name
                ):
                    raise Blocked(run_statement, "a feed_dict key that is not a placeholder name")
                values[element.key.value] = element.value
            feed, feed_statement = "", run_statement
        for position, statement in enumerate(body if feed else []):
            assigned = _assign(statement)
            if (
                assigned
                and assigned[0] == [feed]
                and isinstance(assigned[1], cst.Dict)
                and not assigned[1].elements
                and position + 1 < len(body)
            ):
                # `feed = {}` then `for i, (x, y) in enumerate(feeds): feed[x] = ...`
                tower_feed = self._tower_feed(body[position + 1], feed)
                tower_feed.replaced.append(statement)
                feed_statement = statement
                assert self._tower_feeds is not None  # _tower_feed refused it None
                values = dict.fromkeys(self._tower_feeds[1], cst.Name("None"))
                break
            if assigned and assigned[0] == [feed]:
                if not isinstance(assigned[1], cst.Dict):
                    raise Blocked(statement, "feed_dict is not a dict literal")
                for element in assigned[1].elements:
                    if not isinstance(element, cst.DictElement) or not isinstance(
                        element.key, cst.Name
                    ):
                        raise Blocked(statement, "a feed_dict key that is not a placeholder name")
                    values[element.key.value] = element.value
                feed_statement = statement
        if feed_statement is None:
            raise Blocked(run_statement, f"`{feed}` is not built in the training loop")
        needed = set().union(*(free_names(v) for v in values.values()))
        if tower_feed is not None:
            needed = set().union(*(free_names(s) for s in tower_feed.statements))
        feed_statements: list[cst.BaseStatement] = []
        position = body.index(feed_statement)
        for statement in reversed(body[:position]):
            bound = bound_names(statement)
            if bound & needed:
                feed_statements.insert(0, statement)
                needed |= free_names(statement)
        feed_loop = body[position + 1] if tower_feed is not None else None
        others = [
            s
            for s in body
            if s is not feed_statement
            and s is not run_statement
            and s is not feed_loop
            and s not in feed_statements
        ]
        for statement in others:
            shared = free_names(statement) & (
                set().union(*(bound_names(s) for s in feed_statements)) | ({feed} - {""})
            )
            if shared:
                raise Blocked(
                    statement,
                    f"the loop also uses `{sorted(shared)[0]}`, which only "
                    "exists to feed the graph",
                )
        return feed_statements, values, tower_feed

    def _tower_feed(self, statement: cst.CSTNode, feed: str) -> TowerFeed:
        """``for i, (x, y) in enumerate(feeds):`` whose body sets ``feed[x]``, ``feed[y]``."""
        if self._tower_feeds is None:
            raise Blocked(statement, "`feed = {}` without per-tower placeholders")
        feeds, names = self._tower_feeds
        call = _call_of(statement.iter) if isinstance(statement, cst.For) else None
        target = statement.target if isinstance(statement, cst.For) else None
        if not (
            isinstance(statement, cst.For)
            and call is not None
            and isinstance(call.func, cst.Name)
            and call.func.value == "enumerate"
            and len(call.args) == 1
            and isinstance(call.args[0].value, cst.Name)
            and call.args[0].value.value == feeds
            and isinstance(target, cst.Tuple)
            and len(target.elements) == 2
            and isinstance(target.elements[0].value, cst.Name)
            and isinstance(target.elements[1].value, cst.Tuple | cst.List)
            and [getattr(e.value, "value", None) for e in target.elements[1].value.elements]
            == names
            and statement.orelse is None
        ):
            raise Blocked(
                statement,
                f"`{feed}` is not filled by `for i, ({', '.join(names)}) in enumerate({feeds}):`",
            )
        index = target.elements[0].value.value
        kept: list[cst.BaseStatement] = []
        done: set[str] = set()
        for inner in _block(statement, "a per-tower feed loop"):
            small = _simple(inner)
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Subscript)
            ):
                subscript = small.targets[0].target
                key = subscript.slice[0].slice if len(subscript.slice) == 1 else None
                if (
                    isinstance(subscript.value, cst.Name)
                    and subscript.value.value == feed
                    and isinstance(key, cst.Index)
                    and isinstance(key.value, cst.Name)
                    and key.value.value in names
                ):
                    parts = f"{key.value.value}_parts"
                    kept.append(
                        _put(cst.parse_statement(f"{parts}.append(__value__)"), small.value)
                    )
                    done.add(key.value.value)
                    continue
            if set(names) & free_names(inner) or feed in free_names(inner):
                raise Blocked(
                    inner,
                    "the feed loop uses the placeholders other than as "
                    f"`{feed}[placeholder] = value`",
                )
            kept.append(inner)
        if done != set(names):
            raise Blocked(statement, "the feed loop does not feed every placeholder")
        return TowerFeed(index, kept, [statement])

    # -- what the conversion moves out of the graph ------------------------------------------
    def _saved_at_end(self, statement: cst.CSTNode, session: str) -> bool:
        """``tf.train.Saver().save(sess, path)`` (or the recorded Saver's) after the loop."""
        small = _simple(statement)
        call = _call_of(small.value) if isinstance(small, cst.Expr) else None
        if (
            call is None
            or not isinstance(call.func, cst.Attribute)
            or call.func.attr.value != "save"
        ):
            return False
        receiver = call.func.value
        fresh = self.calls_to(receiver, "tensorflow.train.Saver") and not receiver.args
        named = (
            self._log.saver is not None
            and isinstance(receiver, cst.Name)
            and receiver.value == self._log.saver[0]
        )
        sess, path = get_arg(call, 0, "sess"), get_arg(call, 1, "save_path")
        step = get_arg(call, 2, "global_step")
        if not (fresh or named) or path is None or len(call.args) != (2 if step is None else 3):
            return False
        if not (isinstance(sess, cst.Name) and sess.value == session) or session in free_names(
            path
        ):
            return False
        if step is not None:
            # `save(sess, path, global_step=n)` writes `path-n`; n a number or a flag, not a tensor
            if not isinstance(step, cst.Integer | cst.Attribute) or session in free_names(step):
                return False
            path = _put(cst.parse_expression("'%s-%d' % (__value__, __step__)"), path, step=step)
        self._final_save = path
        return True

    def _tail_value(self, tail: _Tail, name: str, value: cst.BaseExpression) -> bool:
        """A value the loop may fetch, computed from every tower's tensors after the loop:
        the mean of the towers' scalars, a concat of their batch-sized tensors (an alias of
        the replica's own), or a mean over the whole batch of an expression of those and of the
        split inputs (each replica computes it on its slice; equal slices: the mean of the
        replicas' means is the mean over the batch)."""
        collected = tail.tower["collected"]
        if (
            isinstance(value, cst.BinaryOperation)
            and isinstance(value.operator, cst.Divide)
            and isinstance(tail.tower["count"], cst.BaseExpression)
            and value.right.deep_equals(tail.tower["count"])
        ):
            # `tf.add_n(tower_losses) / num_gpus`: the mean of the towers' scalars
            total = _call_of(value.left)
            listed = get_arg(total, 0, "inputs") if total is not None else None
            if (
                total is not None
                and self.call_q(total) == "tensorflow.add_n"
                and len(total.args) == 1
                and isinstance(listed, cst.Name)
                and listed.value in collected
            ):
                tail.reduce(name, listed.value, "MEAN", total)
                tail.root_op(name, total)
                tail.divided(name)
                return True
        call = _call_of(value)
        if call is None:
            return False
        q = self.call_q(call)
        if q == "tensorflow.reduce_mean":
            tensor = get_arg(call, 0, "input_tensor")
            axis = get_arg(call, 1, "axis")
            # `tf.reduce_mean(tower_losses)`: TF packs the list of scalars as tf.stack does
            reduced = tensor.value if isinstance(tensor, cst.Name) else self._stacked(tensor)
            whole = axis is None or (isinstance(axis, cst.Integer) and axis.value == "0")
            if reduced is not None and reduced in collected and whole and len(call.args) <= 2:
                tail.reduce(name, reduced, "MEAN", call)
                tail.root_op(name, call)
                return True
            if axis is None and len(call.args) == 1 and tensor is not None and tail.aliases:
                used = free_names(tensor)
                others = {
                    n
                    for n in used - set(tail.aliases) - tail.split_inputs
                    if self.q(cst.Name(n)) != "tensorflow"
                }
                bound = bound_names(cst.IndentedBlock(body=tail.tower["body"]))
                if not others and used & set(tail.aliases) and name not in bound:
                    # _Aliases renames names: the call stays a call
                    per_replica = cast(cst.Call, call.visit(_Aliases(tail.aliases)))
                    statement = _put(cst.parse_statement(f"{name} = __value__"), per_replica)
                    tail.replica_values.append(statement)
                    tail.replica_lists[f"<{name}>"] = name
                    tail.reduce(name, f"<{name}>", "MEAN", call)
                    tail.root_op(name, call)
                    return True
            return False
        if q == "tensorflow.concat":
            listed = self._concat_values(call)
            if isinstance(listed, cst.Name) and listed.value in collected:
                tail.aliases[name] = collected[listed.value]
                return True
        return False

    def _concat_values(self, call: cst.Call) -> cst.BaseExpression | None:
        """The values of ``tf.concat`` along axis 0, in any of its three spellings."""
        first, second = get_arg(call, 0, "values"), get_arg(call, 1, "axis")
        if len(call.args) != 2:
            return None
        if isinstance(first, cst.Integer) and call.args[0].keyword is None:
            first, second = second, first  # TF 0.x: concat(0, values)
        keyed = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        if keyed:
            first, second = (
                keyed.get("values", first),
                keyed.get("axis", keyed.get("concat_dim", second)),
            )
        if not (isinstance(second, cst.Integer) and second.value == "0"):
            return None
        return first

    def _stacked(self, value: cst.BaseExpression | None) -> str | None:
        """``tf.stack(L)`` or ``tf.concat(0, [tf.expand_dims(t, 0) for t in L])`` -> 'L'."""
        call = _call_of(value)
        if call is None:
            return None
        q = self.call_q(call)
        if (
            q == "tensorflow.stack"
            and len(call.args) == 1
            and isinstance(call.args[0].value, cst.Name)
        ):
            return call.args[0].value.value
        if q != "tensorflow.concat":
            return None
        values = self._concat_values(call)
        if not (isinstance(values, cst.ListComp) and isinstance(values.for_in.target, cst.Name)):
            return None
        element = _call_of(values.elt)
        target = values.for_in.target.value
        if (
            element is None
            or self.call_q(element) != "tensorflow.expand_dims"
            or len(element.args) != 2
            or not isinstance(element.args[0].value, cst.Name)
            or element.args[0].value.value != target
            or not (
                isinstance(element.args[1].value, cst.Integer)
                and element.args[1].value.value == "0"
            )
            or values.for_in.ifs
            or values.for_in.inner_for_in is not None
            or not isinstance(values.for_in.iter, cst.Name)
        ):
            return None
        return values.for_in.iter.value

    def _groups_orderless(
        self, call: cst.Call, train_op: str | None, ema_op: str, update_ops: str | None
    ) -> bool:
        """``tf.group(train_op, ema_op)``, ``*update_ops`` too when they are still pending."""
        parts = {(a.star, getattr(a.value, "value", None)) for a in call.args}
        wanted = {("", train_op), ("", ema_op)}
        if update_ops is not None:
            wanted.add(("*", update_ops))
        return (
            len(call.args) == len(wanted)
            and parts == wanted
            and not any(a.keyword is not None for a in call.args)
        )

    def _device_config(self, statement: cst.CSTNode, tail: _Tail) -> bool:
        """``o = tf.GPUOptions(...)``, ``config = tf.ConfigProto(...)``, ``config.x.y = v``:
        session settings, which become tf.config calls before the strategy is made."""
        assigned = _assign(statement)
        if assigned is not None and len(assigned[0]) == 1:
            call = _call_of(assigned[1])
            if self.calls_to(call, CONFIG_PROTO, GPU_OPTIONS):
                self._config_settings(call, tail)
                tail.configs.add(assigned[0][0])
                return True
        small = _simple(statement)
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            path = cst.Module([]).code_for_node(small.targets[0].target).split(".")
            if len(path) > 1 and path[0] in tail.configs:
                tail.setting(".".join(path[1:]), small.value, statement)
                return True
        if self._tf_config_only(statement):
            tail.config_calls.append(statement)
            return True
        return False

    def _tf_config_only(self, statement: cst.CSTNode) -> TypeGuard[cst.For | cst.SimpleStatementLine]:
        """``tf.config.set_soft_device_placement(True)``, or ``for gpu in
        tf.config.list_physical_devices('GPU'): tf.config.experimental.set_memory_growth(gpu,
        True)``: device settings in TF2's own spelling (what TFM105 writes)."""
        if isinstance(statement, cst.For) and not statement.orelse:
            source = _call_of(statement.iter)
            return (
                source is not None
                and (self.call_q(source) or "").startswith("tensorflow.config.")
                and all(self._tf_config_only(s) for s in statement.body.body)
            )
        small = _simple(statement)
        call = _call_of(small.value) if isinstance(small, cst.Expr) else None
        return call is not None and (self.call_q(call) or "").startswith("tensorflow.config.")

    def _config_settings(self, call: cst.Call, tail: _Tail, prefix: str = "") -> None:
        q = self.call_q(call)
        if q == GPU_OPTIONS:
            prefix = "gpu_options."
        for arg in call.args:
            if arg.keyword is None:
                raise Blocked(call, "a session config with positional arguments")
            key = arg.keyword.value
            if q == CONFIG_PROTO and key == "gpu_options":
                inner = _call_of(arg.value)
                if self.calls_to(inner, GPU_OPTIONS):
                    self._config_settings(inner, tail)
                elif not (isinstance(arg.value, cst.Name) and arg.value.value in tail.configs):
                    raise Blocked(call, "GPUOptions the conversion cannot follow")
                continue
            tail.setting(prefix + key, arg.value, call)

    def _session_config(self, statement: cst.CSTNode, tail: _Tail) -> None:
        """The Session's ``config=``: one the tail built, or a ConfigProto written inline."""
        if isinstance(statement, cst.With):
            call = _call_of(statement.items[0].item)
        else:
            assigned = _assign(statement)
            call = _call_of(assigned[1]) if assigned else None
        config = (
            get_arg(call, 0 if self.call_q(call) != MONITORED else None, "config") if call else None
        )
        if config is None:
            return
        if isinstance(config, cst.Name) and config.value in tail.configs:
            return
        inline = _call_of(config)
        if not self.calls_to(inline, CONFIG_PROTO):
            raise Blocked(statement, "a Session config the conversion cannot follow")
        self._config_settings(inline, tail)

    def _memory_stats(self, assigned: tuple[list[str], cst.BaseExpression] | None) -> str | None:
        """``peak = tf.contrib.memory_stats.MaxBytesInUse()`` -> 'MaxBytesInUse'."""
        call = _call_of(assigned[1]) if assigned else None
        q = self.call_q(call) or ""
        op = q.rsplit(".", 1)[-1]
        if (
            assigned is None
            or len(assigned[0]) != 1
            or not q.startswith("tensorflow.contrib.memory_stats.")
            or op not in MEMORY_STATS
            or call is None  # (a memory_stats name is a call's)
            or call.args
        ):
            return None
        return op

    def _is_method(self, call: cst.Call, receiver: str, method: str) -> bool:
        func = call.func
        return (
            isinstance(func, cst.Attribute)
            and func.attr.value == method
            and isinstance(func.value, cst.Name)
            and func.value.value == receiver
        )


def _fetched_name(node: cst.BaseExpression) -> tuple[str, int | None] | None:
    """A fetch the loop can log: ``loss`` -> ('loss', None); one tower's entry of a per-tower
    list, ``losses[0]`` or ``losses[-1]`` -> ('losses', 0) / ('losses', -1). Any other index
    (a variable, a slice) is refused: which replica to log must be known when converting."""
    if isinstance(node, cst.Name):
        return node.value, None
    if not (
        isinstance(node, cst.Subscript)
        and isinstance(node.value, cst.Name)
        and len(node.slice) == 1
        and isinstance(node.slice[0].slice, cst.Index)
    ):
        return None
    index = node.slice[0].slice.value
    sign = 1
    if isinstance(index, cst.UnaryOperation) and isinstance(index.operator, cst.Minus):
        index, sign = index.expression, -1
    if not isinstance(index, cst.Integer):
        return None
    return node.value.value, sign * int(index.evaluated_value)


def _scope_name(expression: cst.BaseExpression, index: str, tower: int) -> str | None:
    """The name scope ``'tower%d' % i``, ``f'tower_{i}'`` or ``'tower{}'.format(i)`` takes for
    ``i == tower``; None for other spellings."""
    if isinstance(expression, cst.SimpleString):
        return str(expression.evaluated_value)
    if (
        isinstance(expression, cst.BinaryOperation)
        and isinstance(expression.operator, cst.Modulo)
        and isinstance(expression.left, cst.SimpleString)
        and isinstance(expression.right, cst.Name)
        and expression.right.value == index
    ):
        try:
            return str(expression.left.evaluated_value) % tower
        except (TypeError, ValueError):
            return None
    if isinstance(expression, cst.FormattedString):
        text = []
        for part in expression.parts:
            if isinstance(part, cst.FormattedStringText):
                text.append(part.value)
            elif (
                isinstance(part, cst.FormattedStringExpression)
                and isinstance(part.expression, cst.Name)
                and part.expression.value == index
                and part.format_spec is None
                and part.conversion is None
            ):
                text.append(str(tower))
            else:
                return None
        return "".join(text)
    if (
        isinstance(expression, cst.Call)
        and isinstance(expression.func, cst.Attribute)
        and expression.func.attr.value == "format"
        and isinstance(expression.func.value, cst.SimpleString)
        and [a.value.value for a in expression.args if isinstance(a.value, cst.Name)] == [index]
        and len(expression.args) == 1
    ):
        try:
            return str(expression.func.value.evaluated_value).format(tower)
        except (IndexError, KeyError, ValueError):
            return None
    return None
