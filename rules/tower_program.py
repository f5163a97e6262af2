from __future__ import annotations

from pathlib import PurePosixPath

import libcst as cst

from tfmigrate.names import NameResolver
from tfmigrate.rule import Example, FixSafety, RuleContext
from tfmigrate.rules import _tower_program_example as example
from tfmigrate.rules._tower_emit import STORE, Emitter, _indent
from tfmigrate.rules._tower_program import Blocked, Program, ProgramReader
from tfmigrate.rules._towers import TowerRule, bound_names, identifiers, walk
from tfmigrate.rules._variable_names import VariableNames

# Names the converted program defines; a module already using them is not converted.
_RESERVED_TOP = frozenset(
    {"TF1Variables", "replica_index", "build_program", "make_parser", "tfmigrate_program"}
)
_RESERVED_LOCAL = frozenset(
    {
        "strategy", "program", "batches", "outputs", "train_step", "step_fn", "tower_fn",
        "fed_batches", "build", "dataset", "fetches", "tf1_variables",
    }
)  # fmt: skip


class TowerProgramToMirroredStrategy(TowerRule):
    """
    ## What it does
    Converts a whole TF1 tower training program into a TF2 program that trains the same model
    the same way under `tf.distribute.MirroredStrategy`:

    - the tower loop becomes a replica function run with `strategy.run` inside an
      `@tf.function` train step; the tower index is the replica's index, the tower's name scope
      is kept;
    - the gradient aggregation helper (TFM102) goes away: `apply_gradients` all-reduces the
      replicas' gradients with SUM, so each replica's loss is divided by
      `strategy.num_replicas_in_sync` when the towers AVERAGED, and left as is when they SUMMED;
    - `tf.placeholder` + `tf.split` + `feed_dict` become a `tf.data` dataset of the same global
      batches (made by the loop's own feed code), distributed so replica *i* gets tower *i*'s
      slice; `tf.Session`, the initializer and `sess.run` become an eager loop that logs what
      the old loop logged, from the same tower (the last tower's tensors -> the last replica's);
    - the TF1 model code is kept: its `get_variable` calls go through a small `TF1Variables`
      store (emitted into the program) that creates every variable once, mirrored, under its
      legacy name, and hands the same variable to every replica;
    - the program gains `tfmigrate_program(strategy, argv)` (tfmigrate's verify protocol) and
      the manifest entry verify needs: the variable mapping, the semantic notes.

    ## Why is this bad?
    TF 2 has no sessions, placeholders or graph collections, and building the model once per
    GPU by hand is what `MirroredStrategy` does for you. A rename to `tf.compat.v1` would still
    build a graph and open a Session; this rewrite gives a program that runs eagerly on TF 2.

    ## Example
    ```python
    for i in range(flags.num_gpus):
        with tf.device('/gpu:%d' % i):
            with tf.name_scope('tower_%d' % i) as scope:
                loss = tower_loss(scope, image_splits[i], label_splits[i])
                tf.get_variable_scope().reuse_variables()
                tower_grads.append(opt.compute_gradients(loss))
    grads = average_gradients(tower_grads)
    train_op = opt.apply_gradients(grads, global_step=global_step)
    ```
    Use instead:
    ```python
    def tower_fn(images, labels):
        i = replica_index()
        with tf1_variables.scope(), tf.name_scope('tower_%d' % i) as scope:
            loss = tower_loss(scope, images, labels)
            grads = opt.compute_gradients(loss / strategy.num_replicas_in_sync,
                                          var_list=tf1_variables.trainable)
        return grads, {'total_loss': loss}

    def step_fn(images, labels):
        grads, fetches = tower_fn(images, labels)
        train_op = opt.apply_gradients(grads, global_step=global_step)
        return fetches
    ```

    ## Fix safety
    Safe: the conversion keeps the computation -- the same TF1 ops and initializers, the same
    variable names, the same `tf.compat.v1.train` optimizer update, the same batches per tower,
    the gradient scaling chosen from what TFM102 found -- and `tfmigrate verify` checks it step
    by step. What TF 2 does differently is written in the manifest's notes. Programs of a shape
    it does not handle are left unchanged and get a finding that names the blocking line.
    """

    code = "TFM303"
    name = "tower-program-to-mirrored-strategy"
    summary = "whole TF1 tower training program: converted to a MirroredStrategy program"
    fix_safety = FixSafety.SAFE

    valid = (
        "import tensorflow as tf\nstrategy = tf.distribute.MirroredStrategy()\n",
        # Single-device program: nothing to convert.
        """import tensorflow as tf
loss = model(x)
train_op = tf.train.GradientDescentOptimizer(0.1).minimize(loss)
""",
    )
    invalid = (
        Example(example.LEGACY, fixed=example.CONVERTED, message="converted the tower program"),
        Example(
            """
            import tensorflow as tf
            tower_grads = []
            for i in range(num_gpus):
                with tf.device('/gpu:%d' % i):
                    loss = tower_loss(i)
                    tower_grads.append(opt.compute_gradients(loss))
            """,
            message="not converted: the tower loop is not inside a module-level training function",
        ),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        towers = self.tower_loops()
        if not towers:
            return
        if self.context.options.get("_tfm303_inner"):
            return
        if len(towers) > 1:
            self.report(towers[1].replicator, "not converted: more than one tower loop")
            return
        loop = towers[0].replicator
        if not isinstance(loop, cst.For) or towers[0].tower_fn is not None:
            self.report(loop, "not converted: only a `for` tower loop building the towers "
                        "inline is converted so far")
            return
        try:
            analysed = _analyse(self, loop)
        except Blocked as blocked:
            self.report(blocked.node, f"not converted: {blocked.reason}; the program is left "
                        "as it was")
            return
        try:
            module, manifest, summary = _convert(self.context, analysed)
        except Blocked as blocked:
            self.report(loop, f"not converted: {blocked.reason}; the program is left as it was")
            return
        self.report(loop, summary, replacement=module, target=self.context.module,
                    manifest=manifest)


def _aggregations(rule: TowerRule) -> dict[int, bool]:
    from tfmigrate.rules.manual_gradient_aggregation import ManualGradientAggregation

    aggregation = ManualGradientAggregation(rule.context)
    cst.visit_batched(rule.context.module, [aggregation])
    return aggregation.aggregations()


def _analyse(rule: TowerRule, loop: cst.For) -> tuple[Program, cst.If, cst.Call]:
    program = ProgramReader(rule, _aggregations(rule)).read(loop)
    module = rule.context.module
    names = identifiers(module)
    clash = sorted(names & _RESERVED_TOP)
    if clash:
        raise Blocked(program.function, f"the module already uses the name `{clash[0]}`")
    clash = sorted(identifiers(program.function) & _RESERVED_LOCAL)
    if clash:
        raise Blocked(program.function, f"the training function already uses `{clash[0]}`")
    main, call = _main_block(module, program.function, program.parser is not None)
    return program, main, call


def _main_block(
    module: cst.Module, function: cst.FunctionDef, own_parser: bool
) -> tuple[cst.If, cst.Call]:
    """``if __name__ == '__main__':`` building an argparse parser and calling
    ``train(parser.parse_args())`` last -- or, when the training function parses its own flags,
    calling ``main()`` (that block is kept as it is)."""
    for statement in module.body:
        if (
            isinstance(statement, cst.If)
            and isinstance(statement.test, cst.Comparison)
            and isinstance(statement.test.left, cst.Name)
            and statement.test.left.value == "__name__"
        ):
            body = statement.body.body
            last = body[-1] if body else None
            small = last.body[0] if isinstance(last, cst.SimpleStatementLine) else None
            call = small.value if isinstance(small, cst.Expr) else None
            if (
                own_parser
                and isinstance(call, cst.Call)
                and isinstance(call.func, cst.Name)
                and call.func.value == function.name.value
                and not call.args
            ):
                return statement, call
            if (
                not own_parser
                and isinstance(call, cst.Call)
                and isinstance(call.func, cst.Name)
                and call.func.value == function.name.value
                and len(call.args) == 1
                and len(function.params.params) == 1
                and _parse_call(call.args[0].value) is not None
                and statement.orelse is None
            ):
                return statement, call
            call_text = "()" if own_parser else "(parser.parse_args())"
            raise Blocked(statement, f"the main block does not end with "
                          f"`{function.name.value}{call_text}`")
    raise Blocked(function, "no `if __name__ == '__main__':` block calling the training function")


def _parse_call(node: cst.BaseExpression) -> str | None:
    """``parser.parse_args()`` -> 'parser'."""
    if (
        isinstance(node, cst.Call)
        and not node.args
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "parse_args"
        and isinstance(node.func.value, cst.Name)
    ):
        return node.func.value.value
    return None


def _renamed(context: RuleContext) -> cst.Module:
    """The module with TF1 symbols on their TF2 / tf.compat.v1 spellings (TFM301's fixes)."""
    from tfmigrate.engine import Settings, process_source
    from tfmigrate.rules.tf1_api_to_compat_v1 import Tf1ApiToCompatV1

    code = context.module.code
    result = process_source(code, str(context.path), Settings(rules=(Tf1ApiToCompatV1,), fix=True))
    return cst.parse_module(result.new_code or code)


def _convert(
    context: RuleContext, analysed: tuple[Program, cst.If, cst.Call]
) -> tuple[cst.Module, dict[str, object], str]:
    module = _renamed(context)
    inner_context = RuleContext(
        PurePosixPath(context.path), NameResolver.for_module(module), module,
        {**context.options, "_tfm303_inner": True},
    )
    reader_rule = TowerProgramToMirroredStrategy(inner_context)
    cst.visit_batched(module, [reader_rule])
    loops = reader_rule.tower_loops()
    if len(loops) != 1 or not isinstance(loops[0].replicator, cst.For):
        raise Blocked(context.module, "the tower loop could not be found again after renaming")
    program, main, main_call = _analyse(reader_rule, loops[0].replicator)
    unit = module.default_indent
    emitter = Emitter(module, program)
    keys = emitter.fetch_keys()
    needs = emitter.loop_needs()
    function = program.function
    if program.parser is None:
        params = module.code_for_node(function.params)
        param = function.params.params[0].name.value
        parser_name = _parse_call(main_call.args[0].value)
        assert parser_name is not None
        parser_statements = list(main.body.body[:-1])
        if parser_name not in set().union(*(bound_names(s) for s in parser_statements)):
            raise Blocked(main, f"`{parser_name}` is not built in the main block")
        parse_line = ""
        main_text = f"""

if __name__ == "__main__":
    {function.name.value}(make_parser().parse_args())
"""
    else:
        # `def main():` parsed its own flags: it still does, with the parser made by make_parser.
        params = param = program.parser.flags
        parser_name = program.parser.name
        parser_statements = program.parser.statements
        parse = program.parser.parse.visit(
            _ReplaceName(parser_name, cst.parse_expression("make_parser()"))
        )
        parse_line = f"    {module.code_for_node(parse).strip()}\n"
        main_text = ""
    parser_slot = emitter.slot(parser_statements)
    body_slot = emitter.slot(emitter.loop_body(keys))
    docstring = function.get_docstring(clean=False)
    doc_line = f'    """{docstring}"""\n' if docstring is not None else ""
    unpack = "".join(f'    {name} = program["{name}"]\n' for name in needs)
    signature = module.code_for_node(function.params)
    text = (
        STORE.strip("\n")
        + "\n\n\n"
        + emitter.build_function(params, keys, needs).strip("\n")
        + f"""


def make_parser():
    {parser_slot}
    return {parser_name}


def tfmigrate_program(strategy, argv):
    \"\"\"tfmigrate's verify protocol: the program under `strategy`, flags parsed from `argv`.\"\"\"
    {param}, _ = make_parser().parse_known_args(argv)
    return build_program(strategy, {param})


def {function.name.value}({signature}):
{doc_line}{parse_line}    strategy = tf.distribute.MirroredStrategy()
    program = build_program(strategy, {param})
    train_step = program["train_step"]
    batches = iter(program["batches"])
{unpack}    for {module.code_for_node(program.step_loop.target)} in {emitter.expr(program.step_loop.iter)}:
        {body_slot}
{main_text}"""
    )
    generated = _parse_generated(text, unit, emitter)

    helper = program.helper
    if helper is not None:
        uses = sum(
            1 for n in walk(module) if isinstance(n, cst.Name) and n.value == helper.name.value
        )
        if uses > 2:  # its def and the aggregation call: anything more is another use
            helper = None
    body: list[cst.BaseStatement] = []
    for statement in module.body:
        if statement is helper or (statement is main and program.parser is None):
            continue
        if statement is function:
            two_lines = [cst.EmptyLine(), cst.EmptyLine()]
            body.append(generated.body[0].with_changes(leading_lines=two_lines))
            body.extend(generated.body[1:])
            continue
        body.append(statement)
    new_module = _contrib_to_tf_slim(module.with_changes(body=body), program)
    manifest, summary = _manifest(module, program, keys, reader_rule)
    return new_module, manifest, summary


class _ContribToTfSlim(cst.CSTTransformer):
    """``tf.contrib.slim`` -> ``tf_slim``, ``tf.contrib.layers`` -> ``tf_slim.layers``."""

    def __init__(self, tf: str) -> None:
        super().__init__()
        self.spellings = {f"{tf}.contrib.slim": "tf_slim", f"{tf}.contrib.layers": "tf_slim.layers"}
        self.changed = False

    def leave_Attribute(self, original, updated):  # type: ignore[no-untyped-def]
        new = self.spellings.get(cst.Module([]).code_for_node(updated))
        if new is None:
            return updated
        self.changed = True
        return cst.parse_expression(new)


_TF_SLIM_PATCH = """\
# tf_slim (tf.contrib.slim / tf.contrib.layers on PyPI) still refers to ops.Tensor, which
# TensorFlow 2.21 no longer defines.
if not hasattr(tf_ops, "Tensor"):
    tf_ops.Tensor = tf.Tensor
"""


def _contrib_to_tf_slim(module: cst.Module, program: Program) -> cst.Module:
    """The model code keeps its tf.contrib layers, from tf_slim, which carries them today."""
    tf = None
    tf_import = imports_end = 0
    for position, statement in enumerate(module.body):
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if position == 0 and isinstance(small, cst.Expr):
            continue  # the module docstring
        if not isinstance(small, cst.Import | cst.ImportFrom):
            break
        imports_end = position + 1
        if isinstance(small, cst.Import):
            for alias in small.names:
                if module.code_for_node(alias.name) == "tensorflow":
                    tf = alias.asname.name.value if alias.asname else "tensorflow"  # type: ignore[union-attr]
                    tf_import = position
    if tf is None:
        return module
    renamer = _ContribToTfSlim(tf)
    renamed = module.visit(renamer)
    if not renamer.changed:
        return module
    if any(
        isinstance(node, cst.Attribute) and renamed.code_for_node(node) == f"{tf}.contrib"
        for node in walk(renamed)
    ):
        raise Blocked(program.tower_loop, "tf.contrib APIs other than slim / contrib.layers "
                      "(tf_slim has no replacement for them)")
    body = list(renamed.body)
    patch = cst.parse_module(_indent(_TF_SLIM_PATCH, module.default_indent)).body
    patch = [patch[0].with_changes(leading_lines=[cst.EmptyLine(), *patch[0].leading_lines]),
             *patch[1:]]
    body[imports_end:imports_end] = patch
    body[tf_import + 1 : tf_import + 1] = [
        cst.parse_statement("import tf_slim"),
        cst.parse_statement("from tensorflow.python.framework import ops as tf_ops"),
    ]
    return renamed.with_changes(body=body)


class _ReplaceName(cst.CSTTransformer):
    def __init__(self, name: str, new: cst.BaseExpression) -> None:
        super().__init__()
        self.name, self.new = name, new

    def leave_Name(self, original, updated):  # type: ignore[no-untyped-def]
        return self.new if updated.value == self.name else updated


def _parse_generated(text: str, unit: str, emitter: Emitter) -> cst.Module:
    try:
        module = cst.parse_module(_indent(text, unit))
    except cst.ParserSyntaxError as exc:  # a bug here must not take the whole run down
        raise Blocked(emitter.p.tower_loop, f"internal error writing the program: {exc}") from exc
    return emitter.fill(module)


def _manifest(
    module: cst.Module, program: Program, keys: dict[str, str], rule: TowerRule
) -> tuple[dict[str, object], str]:
    names = VariableNames(module, rule.qualify).run([*program.graph_setup, *program.tower_body])
    how = (
        "the towers AVERAGED their gradients: each replica's loss is divided by "
        "num_replicas_in_sync before compute_gradients, and apply_gradients SUM-all-reduces"
        if program.averaged
        else "the towers SUMMED their gradients, as apply_gradients' SUM all-reduce does: "
        "losses are not rescaled"
    )
    notes = [
        f"TFM303: tower loop -> strategy.run(step_fn) in an @tf.function train step; {how}",
        "TFM303: the TF1 model code is kept on tf.compat.v1 (variable_scope/get_variable); its "
        "variables are owned by TF1Variables, mirrored, under their legacy names (converting "
        "it to Keras layers is a later step)",
        f"TFM303: `{program.optimizer}` stays a tf.compat.v1.train optimizer: under "
        "MirroredStrategy it applies exactly the TF1 update (slots included)",
        "TFM303: placeholders + feed_dict -> a tf.data dataset of the same global batches, "
        "distributed so that replica i gets tower i's slice",
    ]
    for tensor, key in keys.items():
        notes.append(
            f"TFM303: the loop fetched the last tower's `{tensor}`; train_step returns it per "
            f"replica as `{key}` and the loop logs the last replica's"
        )
    manifest: dict[str, object] = {"notes": notes}
    if names is not None:
        manifest["variables"] = {name: name for name in names}
    else:
        notes.append(
            "TFM303: the legacy variable names could not be listed statically: give verify a "
            "--mapping (the migrated names equal the legacy ones)"
        )
    summary = (
        f"converted the tower program `{program.function.name.value}` to MirroredStrategy "
        f"({'averaged' if program.averaged else 'summed'} gradients, feed_dict -> tf.data, "
        "Session loop -> eager loop, TF1 model code kept with mirrored variables)"
    )
    return manifest, summary
