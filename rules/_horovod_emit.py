"""Writing the MultiWorkerMirroredStrategy program for a Horovod script (TFM401's conversion; not a
rule module).

The program is a plain TF2 program like TFM303's output (the variables, the distributed
dataset and one ``tf.function`` train step made in the training function, the legacy loop calling
it, the legacy main block kept) and reuses TFM303's pieces: the ``TF1Variables`` store that keeps the TF1 model code with mirrored
variables under their legacy names, the ``tf_keras`` import of ``tf.compat.v1.layers``, and the
multi-worker checkpoints (every worker saves, the chief into the real folder). Horovod's pieces:

- ``hvd.size()`` (processes = GPUs) -> ``strategy.num_replicas_in_sync``;
- ``hvd.rank()`` in the input -> the rank of the replica the dataset is for: each worker builds one
  dataset per local replica with the statements Horovod process ``rank`` ran
  (``distribute_datasets_from_function``), so global replica r trains on rank r's rows;
  elsewhere -> ``first_rank(strategy)``, the rank of the worker's first replica;
- ``hvd.DistributedOptimizer`` AVERAGED the processes' gradients; ``apply_gradients`` under the
  strategy SUMS the replicas': each replica's loss is divided by ``num_replicas_in_sync``
  (``op=hvd.Sum``: not divided);
- the broadcast, ``hvd.init()``, the session config and GPU pinning go;
- checkpoints from rank 0 only -> every worker saves, the chief into the folder.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import cast

import libcst as cst

from tfmigrate.rules import _multi_worker_emit as multi_worker
from tfmigrate.rules._horovod_program import HorovodProgram, code, horovod_api
from tfmigrate.rules._tower_emit import _indent, store_source
from tfmigrate.rules._tower_program import Blocked
from tfmigrate.rules._towers import bound_names, free_names

Qualify = Callable[[cst.BaseExpression], "str | None"]

_HELPERS = '''
def first_rank(strategy):
    """hvd.rank() of this worker's first replica: Horovod ran one process per replica."""
    resolver = getattr(strategy, "cluster_resolver", None)
    task = resolver.task_id if resolver is not None and resolver.task_type else 0
    return (task or 0) * len(strategy.extended.worker_devices)


def first_replica(strategy, value):
    """This worker's first replica's value (the process of rank first_rank(strategy))."""
    return strategy.experimental_local_results(value)[0].numpy()
'''

_RESERVED = frozenset(
    {
        "TF1Variables", "replica_index", "first_rank", "first_replica", "is_chief",
        "WorkerCheckpoints", "strategy", "batches", "outputs", "train_step", "step_fn",
        "model_fn", "create_variables", "rank_input",
        "worker_input", "tf1_variables", "variables", "checkpoint", "manager", "rank",
        "context", "local", "fetches", "batch", "spec", "j",
    }
)  # fmt: skip


class _HorovodCalls(cst.CSTTransformer):
    """``hvd.size()`` -> ``strategy.num_replicas_in_sync``; ``hvd.rank()`` -> ``rank``."""

    def __init__(self, qualify: Qualify, rank: str) -> None:
        super().__init__()
        self.qualify, self.rank = qualify, rank

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        api = horovod_api(self.qualify(original.func))
        if api == "size" and not updated.args:
            return cst.parse_expression("strategy.num_replicas_in_sync")
        if api == "rank" and not updated.args:
            return cst.parse_expression(self.rank)
        if api is not None:
            raise Blocked(original, f"`hvd.{api}()` here is not converted")
        return updated


def _statements(statements: list[cst.BaseStatement], qualify: Qualify, rank: str, unit: str) -> str:
    """The user's statements, Horovod calls replaced (the slot's indent is added later)."""
    if not statements:
        return "pass\n"
    module = cst.Module(body=[], default_indent=unit)
    text = ""
    for index, statement in enumerate(statements):
        # _HorovodCalls swaps expressions: a statement stays a statement (so below)
        converted = cast(cst.BaseStatement, statement.visit(_HorovodCalls(qualify, rank)))
        if index == 0:
            converted = converted.with_changes(leading_lines=[])
        for line in module.code_for_node(converted).splitlines():
            text += (line if line.strip() else "") + "\n"
    return text


def _minimize(program: HorovodProgram, qualify: Qualify) -> str:
    """``train_op = opt.minimize(loss, ...)`` with the loss scaled for the SUM all-reduce and the
    store's trainable variables."""
    statement = cast(
        cst.SimpleStatementLine,
        program.minimize.visit(_HorovodCalls(qualify, "first_rank(strategy)")),
    )
    small = statement.body[0]
    assert isinstance(small, cst.Assign) and isinstance(small.value, cst.Call)
    call = small.value
    loss_arg = call.args[0]
    loss = loss_arg.value
    if program.averaged:
        divided = cst.parse_expression(f"({code(loss)}) / strategy.num_replicas_in_sync")
        if isinstance(loss, cst.Name | cst.Attribute | cst.Call):
            divided = cst.parse_expression(f"{code(loss)} / strategy.num_replicas_in_sync")
        loss_arg = loss_arg.with_changes(value=divided)
    var_list = cst.Arg(
        keyword=cst.Name("var_list"),
        value=cst.parse_expression("tf1_variables.trainable"),
        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
    )
    args = [loss_arg, *call.args[1:]]
    args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    new = statement.with_changes(
        body=[small.with_changes(value=call.with_changes(args=[*args, var_list]))],
        leading_lines=[],
    )
    how = (
        "# hvd.DistributedOptimizer AVERAGED the processes' gradients; apply_gradients SUMS the\n"
        "# replicas': each replica's loss is divided by all replicas of all workers."
        if program.averaged
        else "# hvd.DistributedOptimizer(op=hvd.Sum) SUMMED the processes' gradients, as\n"
        "# apply_gradients does: the loss is not rescaled."
    )
    return "".join(f"{line}\n" for line in [*how.splitlines(), code(new).strip()])


def emit(
    module: cst.Module, program: HorovodProgram, qualify: Qualify
) -> tuple[cst.Module, list[str]]:
    """The converted module (before the multi-worker pass) and its notes."""
    unit = module.default_indent
    used = set().union(*(_module_level_names(s, program) for s in module.body))
    clash = sorted(used & _RESERVED)
    if clash:
        raise Blocked(program.function, f"the program already uses the name `{clash[0]}`")
    flags, gs = program.flags, program.global_step
    model_names = set().union(set(), *(_bound(s) for s in program.model))
    loss_needs = sorted(free_names(program.minimize) & model_names)
    returned: list[str] = []
    for name in loss_needs + [f for _, f in program.fetched]:
        if name in model_names and name not in returned:
            returned.append(name)
    for _, fetched in program.fetched:
        if fetched not in model_names and fetched not in (gs, program.train_op):
            raise Blocked(program.run, f"the loop fetches `{fetched}`, not made by the model code")
    inputs = ", ".join(program.inputs)
    returns = ", ".join(returned)
    items = [f"'{n}': {n}" for n in returned if n in {f for _, f in program.fetched}]
    if gs in [f for _, f in program.fetched]:
        items.append(f"'{gs}': {gs}.read_value()")
    fetch_items = ", ".join(items)
    element = "batch" if len(program.inputs) > 1 else "(batch,)"
    first = "first_rank(strategy)"
    gone = "".join(
        f"    # {line}\n"
        for item in ["Gone with Horovod (see the manifest's notes):", *program.dropped]
        for line in textwrap.wrap(item, 90)
    )
    doc = program.function.get_docstring(clean=False)
    doc_line = f'    """{doc}"""\n' if doc is not None else ""
    checkpoint_prelude = checkpoint_end = trace = ""
    if program.checkpoint_dir is not None:
        folder = code(program.checkpoint_dir)
        # The checkpoint lists the variables: they are made before the first step for it.
        trace = """
    @tf.function
    def create_variables(*batch):
        strategy.run(model_fn, args=batch)

    # The TF1 model code makes its variables on first use: a trace of one replica step
    # (nothing runs) makes them now, mirrored, for the checkpoint.
    create_variables.get_concrete_function(*[
        tf.TensorSpec([None, *spec.shape[1:]], spec.dtype)
        for spec in tf.nest.flatten(rank_input(0).element_spec)])
"""
        checkpoint_prelude = (
            "    checkpoint = tf.train.Checkpoint(\n"
            f"        variables=tf1_variables.variables, optimizer={program.optimizer})\n"
            "    # MonitoredTrainingSession(checkpoint_dir=...) on rank 0: every worker saves,\n"
            "    # the chief into that folder; all resume from its latest checkpoint.\n"
            f"    manager = tf.train.CheckpointManager(checkpoint, {folder}, max_to_keep=5)\n"
            "    manager.restore_or_initialize()\n"
        )
        checkpoint_end = f"    manager.save(checkpoint_number=int({gs}.numpy()))\n"
    unpack = ""
    for target, fetched in program.fetched:
        if fetched == program.train_op:
            if target != "_":
                unpack += f"        {target} = None\n"
            continue
        unpack += f"        {target} = first_replica(strategy, outputs['{fetched}'])\n"
    if program.loop is not None:  # a plain Session's `for` loop keeps its header
        header = program.loop.with_changes(body=cst.IndentedBlock([]), leading_lines=[])
        header = cast(cst.For, header.visit(_HorovodCalls(qualify, first)))
        loop_line = code(header).split("\n", 1)[0].rstrip()
    else:
        assert program.last_step is not None
        last = code(
            cast(cst.BaseExpression, program.last_step.visit(_HorovodCalls(qualify, first)))
        )
        loop_line = f"while int({gs}.numpy()) < {last}:  # StopAtStepHook(last_step=...)"
    text = _indent(
        f'''
def {program.function.name.value}({flags or ""}):
{doc_line}{gone}    strategy = tf.distribute.MirroredStrategy()
    __slot_setup__
    tf1_variables = TF1Variables(strategy)

    def rank_input(rank):
        """The dataset Horovod process `rank` read."""
        __slot_rank_input__

    def worker_input(context):
        """One dataset per replica of this worker, in replica order: replica r reads rank r's."""
        local = context.num_replicas_in_sync // context.num_input_pipelines
        ranks = [rank_input(context.input_pipeline_id * local + j) for j in range(local)]
        if local == 1:
            return ranks[0]
        # distribute_datasets_from_function hands the elements to the replicas in turn
        return tf.data.Dataset.choose_from_datasets(ranks, tf.data.Dataset.range(local).repeat())

    batches = iter(strategy.distribute_datasets_from_function(worker_input))
    with strategy.scope(), tf1_variables.scope():
        __slot_build__

    def model_fn({inputs}):
        """What each Horovod process built: now one replica."""
        with tf1_variables.scope():
            __slot_model__
        return {returns}
{trace}
    def step_fn({inputs}):
        {returns} = model_fn({inputs})
        fetches = {{{fetch_items}}}  # read before the update, as the legacy fetches were
        __slot_minimize__
        return fetches

    @tf.function
    def train_step(batch):
        return strategy.run(step_fn, args={element})

{checkpoint_prelude}    {loop_line}
        outputs = train_step(next(batches))
{unpack}        __slot_loop__
{checkpoint_end}''',
        unit,
    )
    slots = {
        "__slot_rank_input__": _statements(program.rank_input, qualify, "rank", unit)
        + f"return {program.dataset}\n",
        "__slot_setup__": _statements(program.setup, qualify, first, unit) if program.setup else "",
        "__slot_build__": _statements(program.build, qualify, first, unit),
        "__slot_model__": _statements(program.model, qualify, first, unit),
        "__slot_minimize__": _minimize(program, qualify),
        "__slot_loop__": _statements(program.loop_rest, qualify, first, unit)
        if program.loop_rest
        else "",
    }
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped in slots:
            indent = line[: len(line) - len(line.lstrip())]
            lines += [indent + inner if inner else "" for inner in slots[stripped].splitlines()]
        else:
            lines.append(line)
    text = "\n".join(lines) + "\n"
    generated = cst.parse_module(text)
    generated = generated.with_changes(default_indent=unit)
    return generated, _notes(program)


def _module_level_names(statement: cst.BaseStatement, program: HorovodProgram) -> set[str]:
    """Names that could clash with the emitted code: every name of the training function and
    the main block (their code moves next to the emitted names), only the defined name of any
    other function or class (its parameters and locals stay its own)."""
    if statement is not program.function and isinstance(statement, cst.FunctionDef | cst.ClassDef):
        return {statement.name.value}
    return free_names(statement) | _bound(statement)


def _bound(statement: cst.CSTNode) -> set[str]:
    return bound_names(statement)


def _notes(program: HorovodProgram) -> list[str]:
    scaling = (
        "hvd.DistributedOptimizer AVERAGED the processes' gradients; apply_gradients SUMS the "
        "replicas': each replica's loss is divided by num_replicas_in_sync (all workers' "
        "replicas)"
        if program.averaged
        else "hvd.DistributedOptimizer(op=hvd.Sum) SUMMED the processes' gradients, as "
        "apply_gradients does: the loss is not rescaled"
    )
    return [
        "TFM401: Horovod (one process per GPU, horovodrun) -> MultiWorkerMirroredStrategy (one "
        "process per machine, the cluster from TF_CONFIG); hvd.size() -> "
        "strategy.num_replicas_in_sync, one Horovod process = one replica",
        "TFM401: the input: each worker builds, for each of its replicas, the dataset Horovod "
        "process `rank` built (distribute_datasets_from_function): global replica r reads rank "
        "r's rows; hvd.rank() elsewhere -> first_rank(strategy), the rank of the worker's first "
        "replica",
        f"TFM401: {scaling}",
        "TFM401: the TF1 model code is kept on tf.compat.v1; its variables are owned by "
        "TF1Variables, mirrored, under their legacy names; the strategy creates them with the "
        "same initial values on every worker (no broadcast)",
        f"TFM401: `{program.optimizer}` stays a tf.compat.v1.train optimizer: under the strategy "
        "it applies exactly the TF1 update",
        "TFM401: MonitoredTrainingSession -> an eager loop that stops when the global step "
        "reaches StopAtStepHook's last_step; checkpoints (rank 0's) -> every worker saves, the "
        "chief into the checkpoint folder, the others into temporary folders they delete",
        *(f"TFM401: {d}" for d in program.dropped),
    ]


def convert(
    module: cst.Module, program: HorovodProgram, qualify: Qualify
) -> tuple[cst.Module, list[str]]:
    """The whole converted module: the training function and main block replaced, Horovod's
    import gone, the helpers in, the strategy made multi-worker."""
    generated, notes = emit(module, program, qualify)
    generated, _ = multi_worker.to_multi_worker(generated)
    helpers = [
        h
        for h in cst.parse_module(_indent(_HELPERS, module.default_indent)).body
        if isinstance(h, cst.FunctionDef) and f"{h.name.value}(" in generated.code
    ]
    # the store without replica_index(): no tower index here
    store_text = store_source(False, False).split("\n\n\ndef replica_index")[0]
    store = cst.parse_module(_indent(store_text, module.default_indent)).body
    two = [cst.EmptyLine(), cst.EmptyLine()]
    body: list[cst.BaseStatement] = []
    carried: list[cst.EmptyLine] = []  # a removed import's blank lines go to the next statement
    for statement in module.body:
        if carried and statement is not program.function:
            statement = statement.with_changes(leading_lines=[*carried, *statement.leading_lines])
            carried = []
        if statement is program.main:  # its parser's defaults may read hvd.size()
            main = statement.visit(_HorovodCalls(qualify, "0"))
            body.append(cast(cst.BaseStatement, main).with_changes(leading_lines=two))
            continue
        if statement is program.function:
            for extra in [*store, *helpers, *generated.body]:
                body.append(extra.with_changes(leading_lines=two))
            continue
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if (
            isinstance(small, cst.Import)
            and all(code(a.name).startswith("horovod") for a in small.names)
        ) or (
            isinstance(small, cst.ImportFrom)
            and small.module is not None
            and code(small.module).startswith("horovod")
        ):
            carried = list(statement.leading_lines)
            continue
        body.append(statement)
    return module.with_changes(body=body), notes
