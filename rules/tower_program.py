from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import cast

import libcst as cst

from tfmigrate import tfapi, tree
from tfmigrate.convert import convert_module, unread_collections
from tfmigrate.convert.emit import mark_leftovers
from tfmigrate.convert.helper_tape import module_helpers, program_running, with_helpers
from tfmigrate.convert.libraries import programs_with_cores
from tfmigrate.convert.runner_module import may_run_a_tower_class, runner_conversion
from tfmigrate.names import NameResolver, dotted
from tfmigrate.prefilter import CodeFacts
from tfmigrate.rule import Example, FixSafety, RuleContext
from tfmigrate.rules import _batch_norm_sync as batch_norm_sync
from tfmigrate.rules import _imported_model as imported_model
from tfmigrate.rules import _multi_worker_emit as multi_worker
from tfmigrate.rules import _tower_model_module as model_code
from tfmigrate.rules import _tower_program_example as example
from tfmigrate.rules._absl_flags import (
    to_absl_flags,
    to_compat_v1_flags,
    uses_tf_flags,
    without_flags_alias,
)
from tfmigrate.rules._keras_model_emit import DROPOUT_NOTE
from tfmigrate.rules._keras_model_plan import KerasPlan
from tfmigrate.rules._keras_model_plan import plan as plan_keras_model
from tfmigrate.rules._keras_weights_emit import _dimension_value
from tfmigrate.rules._tower_emit import JIT_NOTE, Emitter, _indent, store_source
from tfmigrate.rules._tower_model_module import MODEL_TRIGGERS
from tfmigrate.rules._tower_program import (
    DEVICE_SETTINGS,
    Blocked,
    Program,
    ProgramReader,
    _assign,
)
from tfmigrate.rules._towers import (
    TowerRule,
    bound_names,
    free_names,
    get_arg,
    identifiers,
    walk,
)
from tfmigrate.rules._variable_names import VariableNames

_Statement = cst.SimpleStatementLine | cst.BaseCompoundStatement  # what a module's body holds

# Names the converted program defines; a module already using them is not converted.
_RESERVED_TOP = frozenset({"TF1Variables", "replica_index"})
_RESERVED_LOCAL = frozenset(
    {
        "strategy", "batches", "outputs", "train_step", "step_fn", "tower_fn",
        "fed_batches", "create_variables", "fetches", "tf1_variables", "variables", "legacy_name",
        "checkpoint", "manager", "average", "summary_tag", "summary_value", "scalar_metadata",
        "input_dataset", "weight_path", "compiled_tower", "tape", "replica_loss",
        "variables_to_train",
    }
)  # fmt: skip


# The session of a function running a tower class's object made in another module.
_RUNNER_TRIGGER = "tensorflow.Session"

# TF1's assignment functions (tf.compat.v1 in TF2), as a hand-written update function uses them.
_UPDATE_ASSIGNS = ("tensorflow.assign", "tensorflow.assign_sub", "tensorflow.assign_add")


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
    - `tf.placeholder` + `tf.split` + `feed_dict` (or per-tower placeholders fed in a loop)
      become a `tf.data` dataset of the same global batches (made by the loop's own feed code),
      distributed so replica *i* gets tower *i*'s slice; a one-shot `tf.data` iterator split
      per tower becomes the distributed dataset itself; `tf.Session` (or a
      `MonitoredTrainingSession` with a `StopAtStepHook`, whose checkpoints become a
      `CheckpointManager`), the initializer and `sess.run` become an eager loop that logs what
      the old loop logged, from the same tower (the last tower's tensors -> the last replica's;
      a cross-tower `tf.add_n` -> the SUM over replicas);
    - an `ExponentialMovingAverage` applied after the update keeps its TF1 semantics, its
      shadows listed for verify; `tf.contrib.slim`/`tf.contrib.layers` come from `tf_slim`,
      `tf.compat.v1.layers` from `tf_keras`; batch-norm UPDATE_OPS (one tower's, the last
      tower's after the loop, or every tower's) are dropped and the difference in the moving
      statistics is written into the program and announced to verify;
    - regularization losses are added where the legacy added them (slim: the first clone's loss
      only); an ordered queue input becomes a `tf.data` pipeline of the same batches (towers
      that each dequeued their own: num_replicas consecutive batches per step); a
      `tf.train.Saver` in the loop becomes a `CheckpointManager`, summaries a TF2 summary writer;
    - a model module the program imports (`import model`) is converted with it (tf.layers
      from tf_keras, tf.contrib from tf_slim), and only then; an EMA grouped with the update
      in no order runs first in the step, its shadows announced as a possible difference;
      the towers' mean loss and whole-batch metrics become MEAN reductions; the session's
      ConfigProto becomes tf.config calls at the start of main(); `MaxBytesInUse` fetched in
      the loop is asked of tf.config (never compared by verify); `tf.app.flags` /
      `tf.app.run` become absl's (in the model module too; a `main(argv=None)` that only
      calls `train()` is kept); argparse flags keep the legacy parsing code where it was (a
      module-level `FLAGS`, a parser built at module level or in the main block, a launcher
      `def main():` ending `train(parser.parse_args())`, a training function parsing its own
      flags); plain arithmetic
      (`global_batch = args.batch_size * args.num_gpus`) between apply_gradients and the
      Session is computed before the graph;
    - `--batch-norm sync` (option `batch-norm`) gives every batch norm of a model converted to
      Keras layers `synchronized=True` (statistics over the global batch, the same moving
      statistics on every replica; the manifest announces that losses and weights then differ
      from the legacy run's); it is refused for TF1 batch norm kept on compat.v1, which has no
      cross-replica mode on `tf.compat.v1`;
    - `--jit` (option `jit = "on"`) compiles each replica's forward and backward pass with XLA
      (`compiled_tower`); the update and the all-reduce stay outside; the manifest says so;
    - a model function of TF1 layer calls with literal names (tf.layers, slim / contrib.layers,
      tf.nn activations between them) becomes a `keras.Model` subclass, each legacy API's
      defaults spelled out, built once in `strategy.scope()` and called by every replica with
      `training=True`; TF1's fused batch norm keeps its kernel and its unbiased moving
      variance (`TF1BatchNorm`); the manifest maps legacy variable names to Keras weight paths; slim's
      `normalizer_fn`/`normalizer_params` (a frozen `trainable: False` batch norm included),
      `arg_scope`s (literal, nested, or returned by an arg-scope function), `slim.repeat` and
      `slim.dropout` are read as slim applies them; a model function of an imported module
      becomes a Keras class in that module, which the script builds;
    - a model function of `tf.get_variable` calls in literal variable scopes (directly or through
      helpers like `_variable_with_weight_decay`) with `tf.nn` / `tf.matmul` computation between
      them becomes a `keras.Model` that owns every variable (`add_weight`, one plain layer per
      scope, initializers mapped) and keeps that computation in `call()`; the weight decay of a
      `'losses'` collection becomes a Keras L2 regularizer read through `model.losses` where the
      tower read the collection;
    - other TF1 model code is kept: its `get_variable` calls go through a small `TF1Variables`
      store (emitted into the program) that creates every variable once, mirrored, under its
      legacy name, and hands the same variable to every replica (the manifest says why it was
      not converted to Keras layers);
    - the training function builds the variables, the distributed dataset and ONE
      `@tf.function` train step, and its legacy loop calls it; a `tf.train.Checkpoint` is made
      only where the program saves or restores; the manifest carries what verify needs: the
      variable mapping, the semantic notes;
    - with the option `strategy = "multi-worker"` (`rewrite --strategy multi-worker`) the program
      targets `MultiWorkerMirroredStrategy` instead: the cluster from `TF_CONFIG`, each worker
      keeping its replicas' slices of the global batch, every worker saving checkpoints (the
      chief into the real folder).

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
        with tf1_variables.scope(), tf.name_scope('tower_%d' % i) as scope, \\
                tf.GradientTape() as tape:
            loss = tower_loss(scope, images, labels)
            replica_loss = loss / strategy.num_replicas_in_sync
        variables_to_train = tf1_variables.trainable
        grads = list(zip(
            tape.gradient(replica_loss, variables_to_train), variables_to_train))
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
    # The conversion starts from a tower loop's tf.device; the model modules it imports use TF1
    # layers (or make their variables with tf.get_variable, as a Horovod program's model does).
    # tf.gradients / compute_gradients: a module holding the towers' gradient helper
    triggers = (
        "tensorflow.device", *MODEL_TRIGGERS, *_UPDATE_ASSIGNS, "tensorflow.gradients",
        "compute_gradients",
        # the model (tf.get_variable) and update (tf.train) code such a helper's program runs
        "tensorflow.get_variable", "tensorflow.train*",
        _RUNNER_TRIGGER,
    )  # fmt: skip
    option_choices = {
        "strategy": ("mirrored", "multi-worker"),
        "batch-norm": ("faithful", "sync"),
        "jit": ("off", "on"),  # rewrite --jit
    }
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
        Example(example.LEGACY, fixed=example.CONVERTED, message="the tower program `train`"),
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

    @classmethod
    def may_report(cls, path: PurePosixPath, facts: CodeFacts) -> bool:
        # Without a tf.device there is no tower loop: only a model module can report, when a
        # neighbour that may be a tower program imports it.
        if facts.matches("tensorflow.device"):
            return True
        if (
            facts.matches(_RUNNER_TRIGGER) or facts.matches("tensorflow.train*")
        ) and may_run_a_tower_class(Path(path)):
            # a function running the object of a tower class another module defines
            return True
        return model_code.may_have_importing_program(
            path, (*(t for t in cls.triggers if t != _RUNNER_TRIGGER), "horovod")
        ) or model_code.may_have_importing_helper(path)

    def leave_Module(self, original_node: cst.Module) -> None:
        towers = self.tower_loops()
        if not towers:
            if self.context.options.get("_tfm303_inner"):
                return
            if not self._runner_module() and not self._helper_module():
                self._model_module(original_node)
            return
        if self.context.options.get("_tfm303_inner"):
            return
        if len(towers) > 1:
            self._staged(towers[0].replicator, "more than one tower loop")
            return
        loop = towers[0].replicator
        if not isinstance(loop, cst.For) or towers[0].tower_fn is not None:
            self._staged(
                loop, "only a `for` tower loop building the towers inline is converted so far"
            )
            return
        try:
            analysed = _analyse(self, loop)
        except Blocked as blocked:
            self._staged(self._in_module(blocked.node, loop), blocked.reason)
            return
        if not self.context.fixing:
            # scan: building the whole new program costs most of a scan's time; say what
            # rewrite will do (and anything that still blocks it, rewrite names then).
            program = analysed[0]
            self.report(
                loop,
                f"convertible: `rewrite` converts the tower program `{program.function.name.value}`"
                f" to MirroredStrategy ({'averaged' if program.averaged else 'summed'} gradients)",
                replacement=original_node,
                target=original_node,
            )
            return
        try:
            module, manifest, summary = _convert(self.context, analysed)
        except Blocked as blocked:
            self._staged(loop, blocked.reason)
            return
        self.report(
            loop, summary, replacement=module, target=self.context.module, manifest=manifest
        )

    def _in_module(self, node: cst.CSTNode, fallback: cst.CSTNode) -> cst.CSTNode:
        """``node`` when it is one of the module's own (the reader may block on a statement it
        rewrote first: a copy), else ``fallback``."""
        try:
            self.context.position_of(node)
        except KeyError:
            return fallback
        return node

    def _staged(self, node: cst.CSTNode, reason: str) -> None:
        """The staged converter (read -> plan -> emit) on a program the whole-program reader
        refuses: it keeps what it cannot convert under TODO(tfmigrate) markers."""
        converted = convert_module(self.context)
        if isinstance(converted, str):
            path = Path(str(self.context.path))
            if ": no tower core: " in converted and programs_with_cores(path):
                # per-device loops of a program's library (layer-wise towers, a helper taking
                # each tower's gradients): the program that imports it holds the core
                return
            self.report(
                node,
                f"not converted: {reason} (staged converter: {converted}); the program is left "
                "as it was",
            )
            return
        emitted, _program = converted
        module = _tf2_spellings(emitted.module, self.context)
        broken = [t for t in emitted.todos if t.unsafe]
        summary = "converted to MirroredStrategy (a tf.function train step, GradientTape replicas)"
        notes = emitted.manifest_notes("TFM303")
        self.report(
            node,
            summary + emitted.todo_summary(),
            replacement=module,
            target=self.context.module,
            safety=FixSafety.UNSAFE if broken else FixSafety.SAFE,
            manifest={"notes": notes} if notes else None,
        )

    def _runner_module(self) -> bool:
        """A module whose function makes the object of a tower class of another module and
        runs its update (``class_runner``): that function calls the object's train step, as
        the class's conversion makes it; the two modules are one fix."""
        converted = runner_conversion(Path(str(self.context.path)), self.context.module.code)
        if converted is None:
            return False
        function = next(
            (
                n
                for n in self.context.module.body
                if isinstance(n, cst.FunctionDef) and n.name.value == converted.function
            ),
            None,
        )
        if function is None:
            return False
        owner = f"`{converted.owner}` of `{converted.towers}`"
        if not self.context.fixing:
            self.report(
                function,
                f"convertible: `rewrite` converts `{converted.function}` with the tower class "
                f"{owner} (it makes the object and runs its update)",
                replacement=self.context.module,
                target=self.context.module,
            )
            return True
        module = _tf2_spellings(converted.module, self.context)
        todos = converted.todos
        summary = ""
        if todos:
            codes = sorted({t.kind.code for t in todos})
            commented = sum(1 for t in todos if t.commented)
            summary = (
                f" with {len(todos)} TODO(tfmigrate) marker(s) ({', '.join(codes)}); "
                f"{commented} statement(s) commented out"
            )
        notes = [f"TFM303: {t.kind.code} {t.why}" for t in todos]
        self.report(
            function,
            f"converted with the tower class {owner}: `{converted.function}` makes the object "
            "and calls its train step where it ran the update in a session" + summary,
            replacement=module,
            target=self.context.module,
            safety=FixSafety.UNSAFE if converted.unsafe else FixSafety.SAFE,
            manifest={"notes": notes} if notes else None,
        )
        return True

    def _helper_module(self) -> bool:
        """A module holding the function a converted tower program's towers call to take
        their gradients (``function_builder.loss_and_gradients``): that function takes them
        with the program's GradientTape. Other importers of the module see the change, so the
        fix is unsafe when there are any (the finding names them)."""
        helpers = module_helpers(Path(str(self.context.path)), self.context.module)
        if helpers is None:
            return False
        names = ", ".join(f"`{where[-1]}`" for where, _ in helpers.taped)
        first = next(
            n
            for n in walk(self.context.module)
            if isinstance(n, cst.FunctionDef) and n.name.value == helpers.taped[0][0][0]
        )
        if not self.context.fixing:
            self.report(
                first,
                f"convertible: `rewrite` gives {names} the GradientTape of the tower program "
                f"`{helpers.program}` (its towers take their gradients there)",
                replacement=self.context.module,
                target=self.context.module,
            )
            return True
        module = _tf2_spellings(with_helpers(self.context.module, helpers), self.context)
        others = (
            "; the module is imported by "
            + ", ".join(f"`{o}`" for o in helpers.others)
            + " as well, which call it as changed"
            if helpers.others
            else ""
        )
        self.report(
            first,
            f"converted with the tower program `{helpers.program}`: {names} takes the tower's "
            f"gradients with a GradientTape (tape.gradient) where it called tf.gradients / "
            f"compute_gradients{others}",
            replacement=module,
            target=self.context.module,
            safety=FixSafety.UNSAFE if helpers.others or helpers.unsafe else FixSafety.SAFE,
        )
        return True

    def _model_module(self, original_node: cst.Module) -> None:
        """A module of TF1 model code that a convertible tower program imports: its layers
        need tf_keras / tf_slim under TF2, converted with the program (or not at all)."""
        first = model_code.first_tf1_layer(self) or _first_tf1_model_state(self)
        importer = (
            model_code.importing_program(PurePosixPath(self.context.path), type(self))
            if first is not None
            else None
        )
        unsafe = False
        if importer is None:
            # the towers' helper or the update function of a converted program runs this
            # module's code (its model, its optimizer and schedule): changed with the program
            running = program_running(Path(str(self.context.path)))
            importer, unsafe = running if running is not None else (None, False)
            first = first or _first_tf1_name(self)
        if first is None or importer is None:
            return
        if not self.context.fixing:
            self.report(
                first,
                f"convertible: `rewrite` converts this model module with the tower program "
                f"`{importer}` (its model function to the Keras class the program builds when "
                "it converts, else TF1 layers kept on tf.compat.v1, from tf_keras / tf_slim)",
                replacement=original_node,
                target=original_node,
            )
            return
        # The program builds a Keras model of this module's model function: the class goes here.
        keras_module = imported_model.keras_model_module(self.context, importer, type(self))
        try:
            module = keras_module[0] if keras_module else _renamed(self.context)
            module = _contrib_hparams(module)
            module = _contrib_to_tf_slim(module, original_node)
            module = _v1_layers_to_tf_keras(module)
            module = _model_module_flags(module)
            module = _dimension_values(module)
        except Blocked as blocked:
            self.report(first, f"not converted: {blocked.reason}; the module is left as it was")
            return
        leftovers: list[str] = []
        if not keras_module:
            # TF1 code kept: its sessions, placeholders and collections are marked TODO (what
            # goes into a collection nothing in the program reads goes, said in the notes)
            gone: list[str] = []
            unread = unread_collections.unread(Path(str(self.context.path)), importer)
            module, todos = mark_leftovers(module, self.context.resolver.qualify, unread, gone)
            leftovers = [f"TFM303: {t.kind.code} {t.why}" for t in todos]
            leftovers += [f"TFM303: {note}" for note in gone]
        self.report(
            first,
            f"converted with the tower program `{importer}`: "
            + (
                "its model function becomes the Keras model class the program builds"
                if keras_module
                else "the TF1 model code stays on tf.compat.v1, its layers from tf_keras "
                "(tf.layers) / tf_slim (tf.contrib)"
            ),
            replacement=module,
            target=self.context.module,
            safety=FixSafety.UNSAFE if unsafe else FixSafety.SAFE,
            manifest={
                "notes": [
                    keras_module[1]
                    if keras_module
                    else f"TFM303: model module of the tower program `{importer}`: TF1 symbols "
                    "on their tf.compat.v1 spellings, tf.layers from tf_keras, tf.contrib.slim / "
                    "contrib.layers from tf_slim; its variables are the program's (mapped there)",
                    *leftovers,
                ]
            },
        )


def _first_tf1_name(rule: TowerRule) -> cst.CSTNode | None:
    """The first TF1 symbol of the module that TF 2 spells otherwise (``tf.train.AdamOptimizer``
    -> ``tf.compat.v1.train.AdamOptimizer``)."""
    for node in walk(rule.context.module):
        if isinstance(node, cst.Attribute) and not isinstance(rule.parent(node), cst.Attribute):
            name = rule.qualify(node)
            if name is not None and name.startswith("tensorflow.") and tfapi.tf2_rename(tfapi.tf_spelling(name)):
                return node
    return None


def _first_tf1_model_state(rule: TowerRule) -> cst.CSTNode | None:
    """A model module without TF1 layers: its first tf.get_variable or tf.app.flags (the
    tutorial's ``cifar10.py``), or the first tf.assign of a hand-written update function,
    which TF 2 no longer has under those names."""
    for node in walk(rule.context.module):
        if isinstance(node, cst.Attribute) and not isinstance(rule.parent(node), cst.Attribute):
            name = rule.qualify(node) or ""
            if name in ("tensorflow.get_variable", *_UPDATE_ASSIGNS) or name.startswith(
                ("tensorflow.app.flags.", "tensorflow.flags.")
            ):
                return node
    return None


def _model_module_flags(module: cst.Module) -> cst.Module:
    """The model module's own ``tf.app.flags`` (``FLAGS.batch_size`` defined next to the
    model) -> absl's flags: the same registry the program parses."""
    if not uses_tf_flags(module):
        return module
    module, aliased = without_flags_alias(module)
    if not aliased and "flags" in _names_used(module):
        raise Blocked(module, "the module already uses `flags` (absl's name for tf.app.flags)")
    return _add_imports(to_absl_flags(module), ["from absl import flags"])


def _aggregations(rule: TowerRule) -> dict[int, bool]:
    from tfmigrate.rules.manual_gradient_aggregation import aggregations_for

    # TFM102 run on the same tree in the same visit has read it already: its analysis is reused.
    return aggregations_for(rule.context)


@dataclass
class AbslMain:
    """``tf.app.flags`` definitions at module level, ``def main(_)`` run by ``tf.app.run()``."""

    main: cst.If  # `if __name__ == '__main__': tf.app.run()`
    values: str  # `FLAGS`
    alias: cst.BaseStatement | None  # `flags = tf.app.flags` (becomes `from absl import flags`)
    # `def main(argv=None): train()` run by app.run, calling the training function (kept)
    launcher: cst.FunctionDef | None = None

    @property
    def runs(self) -> str | None:
        return self.launcher.name.value if self.launcher is not None else None


def _name_main(module: cst.Module) -> cst.If | None:
    """The module's ``if __name__ == '__main__':`` block."""
    for statement in module.body:
        if (
            isinstance(statement, cst.If)
            and isinstance(statement.test, cst.Comparison)
            and isinstance(statement.test.left, cst.Name)
            and statement.test.left.value == "__name__"
        ):
            return statement
    return None


def _absl_main(rule: TowerRule, function: cst.FunctionDef) -> AbslMain | None:
    module = rule.context.module
    main = _name_main(module)
    if main is None:
        return None
    body = main.body.body
    small = (
        body[0].body[0] if len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine) else None
    )
    call = small.value if isinstance(small, cst.Expr) else None
    if not isinstance(call, cst.Call) or rule.qualify(call.func) != "tensorflow.app.run":
        return None
    runs = get_arg(call, 0, "main")
    run_name = runs.value if isinstance(runs, cst.Name) else "main" if runs is None else None
    launcher = None
    if run_name != function.name.value:
        launcher = _launcher(module, run_name, function)
        if launcher is None:
            raise Blocked(
                main,
                f"`tf.app.run` does not run the training function `{function.name.value}`, "
                f"nor a `{run_name or 'main'}(argv)` that only calls `{function.name.value}()`",
            )
    run = launcher if launcher is not None else function
    if len(run.params.params) != 1 or main.orelse is not None:
        raise Blocked(run, "a function run by tf.app.run that does not take argv alone")
    values = alias = None
    for statement in module.body:
        assigned = _assign(statement)
        if assigned is None or len(assigned[0]) != 1:
            continue
        name = rule.qualify(assigned[1])
        if name in ("tensorflow.app.flags.FLAGS", "tensorflow.flags.FLAGS"):
            values = assigned[0][0]
        elif name in ("tensorflow.app.flags", "tensorflow.flags"):
            if assigned[0][0] != "flags":
                raise Blocked(statement, "tf.app.flags bound to a name other than `flags`")
            alias = statement
    if values is None:
        raise Blocked(main, "tf.app.run without `FLAGS = tf.app.flags.FLAGS` at module level")
    used = _names_used(module)
    if "app" in used or (alias is None and "flags" in used):
        raise Blocked(main, "the module already uses `app` / `flags` (absl's names)")
    return AbslMain(main, values, alias, launcher)


def _launcher(
    module: cst.Module, name: str | None, function: cst.FunctionDef
) -> cst.FunctionDef | None:
    """The TF tutorials' ``def main(argv=None): train()``: the function tf.app.run runs, doing
    nothing but calling the training function (which takes no parameters) last; kept as it is."""
    launcher = _module_function(module, name)
    if (
        launcher is None
        or function.params.params
        or not isinstance(launcher.body, cst.IndentedBlock)
    ):
        return None
    body = _launch_body(launcher)
    last = _simple_call(body[-1]) if body else None
    if not (
        len(body) == 1
        and last is not None
        and isinstance(last.func, cst.Name)
        and last.func.value == function.name.value
        and not last.args
    ):
        return None
    return launcher


def _module_function(module: cst.Module, name: str | None) -> cst.FunctionDef | None:
    """The module-level ``def`` of that name (a launcher the main block calls)."""
    return next(
        (s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == name), None
    )


def _simple_call(statement: cst.CSTNode) -> cst.Call | None:
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
    value = small.value if isinstance(small, cst.Expr) else None
    return value if isinstance(value, cst.Call) else None


def _analyse(
    rule: TowerRule, loop: cst.For
) -> tuple[Program, cst.If | cst.FunctionDef, cst.Call | None, AbslMain | GlobalFlags | None]:
    program = ProgramReader(rule, _aggregations(rule)).read(loop)
    module = rule.context.module
    names = identifiers(module)
    clash = sorted(names & _RESERVED_TOP)
    if clash:
        raise Blocked(program.function, f"the module already uses the name `{clash[0]}`")
    reserved = _RESERVED_LOCAL if program.dataset is not None else _RESERVED_LOCAL | {"dataset"}
    attributes = {id(n.attr) for n in walk(program.function) if isinstance(n, cst.Attribute)}
    names = {
        n.value
        for n in walk(program.function)
        if isinstance(n, cst.Name) and id(n) not in attributes  # `model.build` is no clash
    }
    clash = sorted(names & reserved)
    if clash:
        raise Blocked(program.function, f"the training function already uses `{clash[0]}`")
    _check_regularizers(rule, program)
    _check_batch_norm_mode(rule)
    absl = _absl_main(rule, program.function) if program.parser is None else None
    if absl is not None:
        return program, absl.main, None, absl
    parsed = _global_flags(rule, program.function) if program.parser is None else None
    if parsed is not None:
        return program, parsed.main, None, parsed
    main, call = _main_block(module, program.function, program.parser is not None)
    return program, main, call, None


@dataclass
class GlobalFlags:
    """argparse flags parsed into a module-level name that the training function (taking no
    parameters) reads: ``FLAGS = parser.parse_args()`` / ``FLAGS, unparsed =
    parser.parse_known_args()`` at module level after the parser is built there, or first in
    the main block (``FLAGS = None`` at module level)."""

    values: str  # `FLAGS`
    parser: str  # `parser`
    statements: list[cst.BaseStatement]  # building the parser, without the parse
    parse: cst.SimpleStatementLine  # the parse (moves into the main block)
    main: cst.If  # the main block, kept after the parse
    at_module_level: bool


_PARSES = ("parse_args", "parse_known_args")


def _global_flags(rule: TowerRule, function: cst.FunctionDef) -> GlobalFlags | None:
    module = rule.context.module
    main = _name_main(module)
    if main is None or function.params.params or main.orelse is not None:
        return None
    for at_module_level, statements in ((True, list(module.body)), (False, list(main.body.body))):
        for position, statement in enumerate(statements):
            assigned = _assign(statement)
            value = assigned[1] if assigned else None
            if not (
                isinstance(value, cst.Call)
                and not value.args
                and isinstance(value.func, cst.Attribute)
                and value.func.attr.value in _PARSES
                and isinstance(value.func.value, cst.Name)
            ):
                continue
            assert assigned is not None  # `value` is its value
            parser, values = value.func.value.value, assigned[0][0]
            start = position
            while start > 0 and _builds_parser(rule, statements[start - 1], parser):
                start -= 1
            first = _assign(statements[start]) if start < position else None
            if first is None or not _argparse_call(rule, first[1]):
                raise Blocked(
                    statement,
                    f"`{values}` parsed from `{parser}`, which is not built by "
                    "`argparse.ArgumentParser()` and `add_argument` calls just before",
                )
            if len(assigned[0]) > 1 and value.func.attr.value != "parse_known_args":
                return None
            uses = _names_used(module)
            if uses.get(parser, 0) != position - start + 1:
                raise Blocked(statement, f"`{parser}` is used besides building and parsing")
            rest = assigned[0][1:]
            if at_module_level and any(uses.get(n, 0) > 1 for n in rest):
                raise Blocked(statement, "the unparsed arguments of a module-level parse are used")
            # an assignment and the parser-building lines before it (_assign and
            # _builds_parser read only lines)
            return GlobalFlags(
                values,
                parser,
                cast("list[cst.BaseStatement]", statements[start:position]),
                cast(cst.SimpleStatementLine, statement),
                main,
                at_module_level,
            )
    return None


def _argparse_call(rule: TowerRule, value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Call) and rule.qualify(value.func) == "argparse.ArgumentParser"


def _builds_parser(rule: TowerRule, statement: cst.CSTNode, parser: str) -> bool:
    """``parser = argparse.ArgumentParser(...)`` or ``parser.add_argument(...)``."""
    assigned = _assign(statement)
    if assigned is not None:
        return assigned[0] == [parser] and _argparse_call(rule, assigned[1])
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
    call = small.value if isinstance(small, cst.Expr) else None
    return (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "add_argument"
        and isinstance(call.func.value, cst.Name)
        and call.func.value.value == parser
    )


def _check_batch_norm_mode(rule: TowerRule) -> None:
    mode = batch_norm_sync.mode(rule.context.options)
    if mode not in batch_norm_sync.MODES:
        raise Blocked(rule.context.module, f"unknown batch-norm option {mode!r} (faithful, sync)")


def _check_batch_norm_sync(rule: TowerRule, keras: KerasPlan | None) -> None:
    """``--batch-norm sync`` asks for statistics over the global batch. The batch norms of a
    model converted to Keras layers get them (synchronized=True); TF1 batch norm kept on
    tf.compat.v1 (a model kept as TF1 code, or outside the model function) normalizes each
    replica's own sub-batch and has no cross-replica mode: such a program is refused, not
    converted to something else than was asked."""
    converted = keras.model.function if keras is not None and keras.model.layers else None
    inside = {id(n) for n in walk(converted)} if converted is not None else set()
    for node in walk(rule.context.module):
        if (
            isinstance(node, cst.Attribute | cst.Name)
            and not isinstance(rule.parent(node), cst.Attribute)
            and id(node) not in inside
        ):
            name = rule.qualify(node) or ""
            if name.startswith(("tensorflow.", "tf_slim")) and name.endswith(
                (".batch_norm", ".batch_normalization", ".BatchNormalization")
            ):
                raise Blocked(
                    node,
                    f"--batch-norm sync: `{rule.src(node, 40)}` (line {rule.line(node)}) is TF1 "
                    "batch norm, "
                    "kept on tf.compat.v1, where it normalizes each replica's own "
                    "sub-batch and has no cross-replica mode; convert with "
                    "--batch-norm faithful (per-replica statistics, as the towers had)",
                )


# Keras-style layers (tf.layers) add these losses their own way, not through get_variable.
_LAYER_REGULARIZERS = frozenset(
    {"kernel_regularizer", "bias_regularizer", "activity_regularizer", "beta_regularizer",
     "gamma_regularizer"}
)  # fmt: skip
# Reads of REGULARIZATION_LOSSES the store answers (see TF1Variables.regularization_losses).
REGULARIZATION_READS = frozenset(
    {"tensorflow.losses.get_regularization_losses", "tensorflow.losses.get_regularization_loss"}
)


def _check_regularizers(rule: TowerRule, program: Program) -> None:
    """TF1 adds a variable's regularization loss to REGULARIZATION_LOSSES when get_variable
    creates it; the store creates each variable once, outside the train step, so it keeps the
    regularizers and the towers' reads of that collection are answered by the store, in the
    reading replica. Only reads inside the tower loop can reach the store."""
    tower = {id(n) for n in walk(program.tower_loop)}
    for node in walk(rule.context.module):
        if (
            isinstance(node, cst.Arg)
            and node.keyword is not None
            and (node.keyword.value in _LAYER_REGULARIZERS)
        ):
            if not (isinstance(node.value, cst.Name) and node.value.value == "None"):
                raise Blocked(
                    node,
                    f"`{node.keyword.value}=`: a layer regularizer (added by "
                    "the layer, not by get_variable) is not converted yet",
                )
        if isinstance(node, cst.Call) and _regularization_read(rule, node):
            if id(node) not in tower:
                raise Blocked(
                    node,
                    "REGULARIZATION_LOSSES read outside the tower loop: only "
                    "the towers' reads are answered by the migrated variable store",
                )
            if node.args and rule.qualify(node.func) in REGULARIZATION_READS:
                raise Blocked(node, "REGULARIZATION_LOSSES read with a scope filter")
        if (
            isinstance(node, cst.Attribute)
            and node.attr.value == "REGULARIZATION_LOSSES"
            and (id(node) not in tower)
        ):
            raise Blocked(node, "REGULARIZATION_LOSSES used outside the tower loop")


def _regularization_read(rule: TowerRule, call: cst.Call) -> bool:
    name = rule.qualify(call.func)
    if name in REGULARIZATION_READS:
        return True
    return (
        name == "tensorflow.get_collection"
        and len(call.args) == 1
        and rule.qualify(call.args[0].value) == "tensorflow.GraphKeys.REGULARIZATION_LOSSES"
    )


def _main_block(
    module: cst.Module, function: cst.FunctionDef, own_parser: bool
) -> tuple[cst.If | cst.FunctionDef, cst.Call]:
    """``if __name__ == '__main__':`` building an argparse parser and calling
    ``train(parser.parse_args())`` last, or a launcher function doing that which the block calls
    last (``main()``) -- or, when the training function parses its own flags, calling ``main()``
    (that block is kept as it is)."""
    statement = _name_main(module)
    if statement is not None:
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
        if not own_parser and statement.orelse is None:
            # _launch and _argparse_launcher accept only a call as the last line
            called = call if isinstance(call, cst.Call) else None
            if _launch(list(body), function) is not None and called is not None:
                return statement, called
            launcher = _argparse_launcher(module, function, called)
            if launcher is not None and called is not None:
                return launcher, called
        call_text = "()" if own_parser else "(parser.parse_args())"
        parsed = _module_level_parse(module)
        raise Blocked(
            statement,
            f"the main block does not end with `{function.name.value}{call_text}`"
            + (
                f" (the flags are parsed at module level, `{parsed}`: build the parser and "
                f"pass `parser.parse_args()` to `{function.name.value}` in the main block)"
                if parsed and not own_parser
                else ""
            ),
        )
    raise Blocked(function, "no `if __name__ == '__main__':` block calling the training function")


@dataclass
class Launch:
    """How the flags reach the training function: statements building the parser, then
    ``train(parser.parse_args())`` or ``args = parser.parse_args()`` and ``train(args)``."""

    # before the parse; a one-line main block's are small statements
    statements: list[cst.CSTNode]
    parser: str


def _launch(body: Sequence[cst.CSTNode], function: cst.FunctionDef) -> Launch | None:
    call = _simple_call(body[-1]) if body else None
    if not (
        call is not None
        and isinstance(call.func, cst.Name)
        and call.func.value == function.name.value
        and len(call.args) == 1
        and call.args[0].keyword is None
        and not call.args[0].star
        and len(function.params.params) == 1
    ):
        return None
    value = call.args[0].value
    parser = _parse_call(value)
    if parser is not None:
        return Launch(list(body[:-1]), parser)
    assigned = _assign(body[-2]) if len(body) > 1 else None
    if isinstance(value, cst.Name) and assigned is not None and assigned[0] == [value.value]:
        parser = _parse_call(assigned[1])
        if parser is not None:
            return Launch(list(body[:-2]), parser)
    return None


def _launch_body(main: cst.If | cst.FunctionDef) -> list[cst.CSTNode]:
    """The main block's statements, or the launcher function's without its docstring (a
    one-line block's small statements)."""
    body: list[cst.CSTNode] = list(main.body.body)
    if isinstance(main, cst.FunctionDef) and main.get_docstring(clean=False) is not None:
        body = body[1:]
    return body


def _argparse_launcher(
    module: cst.Module, function: cst.FunctionDef, call: cst.Call | None
) -> cst.FunctionDef | None:
    """``def main():`` building an argparse parser and calling ``train(parser.parse_args())``
    last, which the main block calls last (``main()``): kept as it is (a setup.py entry point
    may name it)."""
    if call is None or call.args or not isinstance(call.func, cst.Name):
        return None
    name = call.func.value
    launcher = _module_function(module, name)
    if launcher is None or name == function.name.value:
        return None
    train = function.name.value
    if _names_used(cst.Module(body=[launcher])).get(train, 0) == 0:
        return None  # not the launcher of the training function
    if (
        launcher.params.params
        or launcher.params.star_arg is not cst.MaybeSentinel.DEFAULT
        or launcher.params.kwonly_params
        or launcher.params.star_kwarg is not None
        or launcher.decorators
        or not isinstance(launcher.body, cst.IndentedBlock)
    ):
        raise Blocked(
            launcher,
            f"`{name}`, which the main block calls to run `{train}`, takes parameters or is "
            "decorated (only a plain `def main():` launcher is converted)",
        )
    if _launch(_launch_body(launcher), function) is None:
        raise Blocked(
            launcher,
            f"`{name}()`, which the main block calls, does not end with "
            f"`{train}(parser.parse_args())` or `args = parser.parse_args()` then "
            f"`{train}(args)` after building the parser (other code in it is not converted)",
        )
    return launcher


def _module_level_parse(module: cst.Module) -> str | None:
    """``FLAGS = parser.parse_args()`` at module level: its source."""
    for statement in module.body:
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if isinstance(small, cst.Assign) and _parse_call(small.value) is not None:
            return module.code_for_node(small)
    return None


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


def _tf2_spellings(module: cst.Module, context: RuleContext) -> cst.Module:
    """A staged conversion's module with the TF1 code it keeps on tf.compat.v1 (TFM301), its
    tf.contrib layers from tf_slim and tf.compat.v1.layers from tf_keras, and its
    ``tf.app.flags`` on tf.compat.v1 (TF1's flags, parsed on first read), as TF2 runs them."""
    renamed = _renamed(dataclasses.replace(context, module=module))
    renamed = to_compat_v1_flags(renamed, context.resolver.local_name_for("tensorflow") or "tf")
    try:
        return _v1_layers_to_tf_keras(_contrib_to_tf_slim(renamed, renamed))
    except Blocked:
        return renamed


def _renamed(context: RuleContext) -> cst.Module:
    """The module with TF1 symbols on their TF2 / tf.compat.v1 spellings (TFM301's fixes)."""
    from tfmigrate.engine import Settings, process_source
    from tfmigrate.rules.tf1_api_to_compat_v1 import Tf1ApiToCompatV1

    code = context.module.code
    result = process_source(code, str(context.path), Settings(rules=(Tf1ApiToCompatV1,), fix=True))
    return cst.parse_module(result.new_code or code)


def _convert(
    context: RuleContext,
    analysed: tuple[
        Program, cst.If | cst.FunctionDef, cst.Call | None, AbslMain | GlobalFlags | None
    ],
) -> tuple[cst.Module, dict[str, object], str]:
    module = _renamed(context)
    inner_context = RuleContext(
        PurePosixPath(context.path),
        NameResolver.for_module(module),
        module,
        {**context.options, "_tfm303_inner": True},
    )
    reader_rule = TowerProgramToMirroredStrategy(inner_context)
    tree.visit_batched(module, [reader_rule])  # read-only: tfmigrate's faster traversal
    loops = reader_rule.tower_loops()
    if len(loops) != 1 or not isinstance(loops[0].replicator, cst.For):
        raise Blocked(context.module, "the tower loop could not be found again after renaming")
    program, main, main_call, absl = _analyse(reader_rule, loops[0].replicator)
    parsed: GlobalFlags | None = absl if isinstance(absl, GlobalFlags) else None
    absl = absl if isinstance(absl, AbslMain) else None
    unit = module.default_indent
    _number_after_variables(program, module, reader_rule)
    planned = plan_keras_model(program, module, reader_rule.qualify, PurePosixPath(context.path))
    kept_reason = None
    keras: KerasPlan | None = None
    if isinstance(planned, str):
        kept_reason = planned
    else:
        keras = planned
        program = dataclasses.replace(
            program, tower_body=keras.tower_body, graph_setup=keras.graph_setup
        )
    sync = batch_norm_sync.mode(context.options) == "sync"
    if sync:
        _check_batch_norm_sync(reader_rule, keras)
        keras = batch_norm_sync.synchronized_plan(keras) if keras is not None else None
    emitter = Emitter(module, program)
    emitter.keras = keras
    emitter.jit = context.options.get("jit") == "on"
    if keras is not None and batch_norm_sync.is_synchronized(keras.model.source):
        if emitter.jit:  # measured on TF 2.21: merge_call inside the nested tf.function
            raise Blocked(
                context.module,
                "--batch-norm sync with --jit: a synchronized batch norm sums across replicas "
                "inside the XLA-compiled tower_fn, a nested tf.function, which MirroredStrategy "
                "cannot synchronize from (merge_call while defining a function); use one of them",
            )
        emitter.synchronized_statistics = batch_norm_sync.STATISTICS
    keys = emitter.fetch_keys()
    function = program.function
    # The flags reach the training function as they did: the legacy parsing code stays.
    parse_line = main_text = ""
    if absl is not None and absl.launcher is None:
        main_text = f"""

if __name__ == "__main__":
    app.run({function.name.value})
"""
    elif parsed is None and program.parser is not None:
        # `def main():` parsed its own flags: it still does, first thing.
        parsing = [*program.parser.statements, program.parser.parse]
        helper_function = program.parser.function
        if helper_function is not None:  # `args = parse_args()`: the helper stays
            call = f"{program.parser.flags} = {helper_function.name.value}()\n"
            parsing = [cst.parse_statement(call)]
        parse_line = f"    {emitter.slot(parsing)}\n"
    body_slot = emitter.slot(emitter.loop_body(keys))
    loop_prelude = loop_end = loop_comment = ""
    if program.monitored is None:
        target = module.code_for_node(program.step_loop.target)
        loop_header = f"for {target} in {emitter.expr(program.step_loop.iter)}"
    else:
        step = emitter.global_step()
        last = emitter.expr(program.monitored)
        loop_header = f"while int({step}.numpy()) < {last}"
        if program.checkpoint_dir is not None:
            folder = emitter.expr(program.checkpoint_dir)
            loop_prelude = (
                "    # MonitoredTrainingSession(checkpoint_dir=...): resume from the latest\n"
                "    # checkpoint there, save one when the loop ends.\n"
                f"    manager = tf.train.CheckpointManager(checkpoint, {folder}, max_to_keep=5)\n"
                "    manager.restore_or_initialize()\n"
            )
            loop_end = f"    manager.save(checkpoint_number=int({step}.numpy()))\n"
        loop_comment = f"  # StopAtStepHook(last_step={last})"
    loop_prelude += _logging_prelude(emitter, module)
    if program.dataset is not None:
        # No feeding generator: what the session block set up before its loop goes here.
        loop_prelude += f"    {emitter.slot(program.session_prelude)}\n"
    else:
        made = set().union(set(), *(bound_names(s) for s in program.session_prelude))
        used = set().union(set(), *(free_names(s) for s in emitter.loop_body_sources()))
        # The feeding generator runs the session block's set-up; plain values it computed
        # (`batch = args.batch_size * n`, `start = time.time()`) are computed again for the loop.
        plain = [s for s in program.session_prelude if _plain_value(s)]
        while True:  # a plain value computed from one that is not, is not either
            unmade = made - set().union(set(), *(bound_names(s) for s in plain))
            kept = [s for s in plain if not free_names(s) & unmade]
            if len(kept) == len(plain):
                break
            plain = kept
        if made & used & unmade:
            raise Blocked(
                program.step_loop,
                f"the loop uses `{sorted(made & used & unmade)[0]}`, which "
                "the session block set up for feeding the graph too",
            )
        if made & used:
            loop_prelude += f"    {emitter.slot(plain)}\n"
    docstring = function.get_docstring(clean=False)
    doc_line = f'    """{docstring}"""\n' if docstring is not None else ""
    parse_line += _device_settings(emitter)
    if program.final_save is not None:
        loop_end += (
            "    # tf.train.Saver().save(sess, path) -> the same <path>.index/.data files, written\n"
            "    # by tf.train.Checkpoint (object-based: not readable by the legacy Saver).\n"
            f"    checkpoint.write({emitter.expr(program.final_save)})\n"
        )
    for statement in program.logging.closing:  # the summary writer's close()/flush()
        loop_end += f"    {emitter.code(statement).strip()}\n"
    signature = module.code_for_node(function.params)
    checkpointed = (
        program.checkpoint_dir is not None
        or program.final_save is not None
        or emitter.saved_path() is not None
    )
    store = store_source(
        emitter.uses_moving_averages(),
        emitter.uses_regularization(),
        keras is not None,
        emitter.uses_tower_index(),
    )
    text = (
        store
        + (MEMORY_HELPER if program.memory_fetches else "")
        + ("\n\n\n" if store or program.memory_fetches else "")
        + f"""def {function.name.value}({signature}):
{doc_line}{parse_line}    strategy = tf.distribute.MirroredStrategy()
{emitter.training_body(keys, checkpointed).rstrip()}

{loop_prelude}    {loop_header}:{loop_comment}
        {body_slot}
{loop_end}{main_text}"""
    )
    generated = _parse_generated(text, unit, emitter)
    multi_worker_notes: list[str] = []
    if context.options.get(multi_worker.OPTION) == multi_worker.MULTI_WORKER:
        generated, multi_worker_notes = multi_worker.to_multi_worker(generated, function.name.value)

    helper = program.helper
    if helper is not None:
        uses = sum(
            1 for n in walk(module) if isinstance(n, cst.Name) and n.value == helper.name.value
        )
        if uses > 2:  # its def and the aggregation call: anything more is another use
            helper = None
    body: list[cst.BaseStatement] = []
    for statement in module.body:
        if absl is not None and absl.launcher is not None and statement is main:
            run = cst.parse_statement(f'if __name__ == "__main__":\n    app.run({absl.runs})\n')
            body.append(run.with_changes(leading_lines=statement.leading_lines))
            continue
        if (
            statement is helper
            or (absl is not None and statement is main)  # app.run(<training function>) now
            or (absl is not None and statement is absl.alias)
        ):
            continue
        if program.queue is not None and statement is program.queue.function:
            body.append(_queue_function(program, unit))
            continue
        if keras is not None and statement is keras.model.function:
            body.extend(_keras_classes(keras, statement, unit))
            continue
        if (  # get_variable models: their variable helpers go, their caller takes the model
            keras is not None
            and isinstance(statement, cst.FunctionDef)
            and statement.name.value in keras.rewritten
        ):
            new = keras.rewritten[statement.name.value]
            if new is not None:
                body.append(new)
            continue
        if statement is function:
            two_lines = [cst.EmptyLine(), cst.EmptyLine()]
            body.append(generated.body[0].with_changes(leading_lines=two_lines))
            body.extend(generated.body[1:])
            continue
        body.append(statement)
    new_module = module.with_changes(body=body)
    if keras is not None:
        new_module = _drop_dead_aliases(new_module)
    new_module = _contrib_to_tf_slim(new_module, program.tower_loop)
    new_module = _v1_layers_to_tf_keras(new_module)
    new_module = _drop_dead_imports(module, new_module)
    new_module = _drop_dead_definitions(function, new_module)
    if absl is not None:
        new_module = to_absl_flags(new_module)  # `tf.app.flags.DEFINE_*` spelled out
        new_module = _add_imports(new_module, ["from absl import app, flags"])
    if keras is not None and getattr(keras, "imported", None) is None:  # else: in its module
        new_module = _add_imports(new_module, ["import keras"])
    if emitter.saved_path() is not None and "os" not in identifiers(module):
        top = list(new_module.body)  # the CheckpointManager splits the Saver's path with os
        _insert_import(top, cst.parse_statement("import os"))
        new_module = new_module.with_changes(body=top)
    manifest, summary = _manifest(emitter, keys, reader_rule, kept_reason)
    manifest["notes"] = [*_entries(manifest, "notes"), *multi_worker_notes]
    return new_module, manifest, summary


def _keras_classes(keras: KerasPlan, legacy: cst.FunctionDef, unit: str) -> list[_Statement]:
    """The Keras model class where the legacy model function was (TF1BatchNorm before it)."""
    source = keras.model.source
    if keras.model.uses_tf1_batch_norm:
        tf1_batch_norm = batch_norm_sync.tf1_batch_norm_class(source)
        source = _indent(tf1_batch_norm, unit) + "\n\n" + source
    classes = list(cst.parse_module(source).body)
    classes[0] = classes[0].with_changes(leading_lines=legacy.leading_lines)
    for position in range(1, len(classes)):
        classes[position] = classes[position].with_changes(
            leading_lines=[cst.EmptyLine(), cst.EmptyLine()]
        )
    return classes


def _drop_dead_aliases(module: cst.Module) -> cst.Module:
    """`slim = tf.contrib.slim` that only the converted model code used goes with it."""
    used = _names_used(module)
    body = []
    leading: list[cst.EmptyLine] = []  # a dropped alias' blank lines go to the next statement
    for statement in module.body:
        assigned = _assign(statement)
        if (
            assigned is not None
            and len(assigned[0]) == 1
            and used.get(assigned[0][0], 0) == 1
            and isinstance(assigned[1], cst.Attribute)
            and module.code_for_node(assigned[1]).endswith(("contrib.slim", "contrib.layers"))
        ):
            leading = leading or list(statement.leading_lines)
            continue
        if leading and not statement.leading_lines:
            statement = statement.with_changes(leading_lines=leading)
        leading = []
        body.append(statement)
    return module.with_changes(body=body)


MEMORY_HELPER = '''


def memory_bytes(key):
    """tf.contrib.memory_stats.MaxBytesInUse in TF2: the first GPU's memory (`key`: "peak").

    tf.config.experimental.get_memory_info raises on CPU devices: without a GPU, the process'
    peak resident memory instead (what it is on the CPU), not comparable with a GPU's figure."""
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return tf.config.experimental.get_memory_info(gpus[0].name)[key]
    import resource  # Unix

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024'''


def _add_imports(module: cst.Module, lines: list[str]) -> cst.Module:
    """``lines`` after the TensorFlow import and the imports grouped with it."""
    end = 0
    for position, statement in enumerate(module.body):
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if _tensorflow_alias(module, small) is not None:
            end = position + 1
        elif end and position == end and isinstance(small, cst.Import | cst.ImportFrom):
            if any(line.comment is None for line in statement.leading_lines):
                break  # a blank line: the next group
            end = position + 1
    code = module.code
    new = [cst.parse_statement(line) for line in lines if f"\n{line}\n" not in f"\n{code}"]
    if not new:
        return module
    body = list(module.body)
    body[end:end] = new
    return module.with_changes(body=body)


def _device_settings(emitter: Emitter) -> str:
    """The Session's ConfigProto settings as tf.config calls, first thing in main(): they
    must run before anything touches a device."""
    settings = emitter.p.device_settings
    lines = []
    if settings:
        lines.append(
            "# The legacy session config (ConfigProto) -> tf.config, before any device is used."
        )
    for key, value in settings:
        lines.extend(DEVICE_SETTINGS[key].format(v=emitter.expr(value)).splitlines())
    for statement in emitter.p.config_calls:  # tf.config calls the program made: still first
        lines.extend(emitter.code(statement).strip("\n").splitlines())
    return "".join(f"    {line}\n" for line in lines)


# Measured on TF 2.21's compat.v1 (ref variables, 10 runs x 5 steps of a tf.group(apply, ema)):
# the EMA read the weights before the update in about 6 steps of 10, after it in the others,
# and sometimes a mix of both within one variable; it always read global_step before.
ORDERLESS_EMA = (
    "the legacy step grouped the EMA with the update without ordering them (tf.group): TF1 "
    "read the weights for the shadows before the update in some steps, after it in others, "
    "sometimes partly both, and global_step before its increment; the migrated step applies "
    "the EMA first, on the weights the step started from (the most frequent legacy order, "
    "with the same decay): the EMA shadows differ from the legacy values by up to one update's "
    "share (1 - decay) in the steps where the legacy read them after the update"
)


def _conversion_notes(program: Program) -> list[str]:
    notes = []
    if program.device_settings:
        keys = ", ".join(key for key, _ in program.device_settings)
        notes.append(
            f"TFM303: the Session's ConfigProto ({keys}) -> tf.config calls at the start of "
            "main(), before the strategy touches a device (TFM105); "
            "per_process_gpu_memory_fraction has no TF2 counterpart: memory growth instead"
            if "gpu_options.per_process_gpu_memory_fraction" in keys
            else f"TFM303: the Session's ConfigProto ({keys}) -> tf.config calls at the start "
            "of main(), before the strategy touches a device (TFM105)"
        )
    for tensor in program.memory_fetches:
        notes.append(
            f"TFM303: the loop fetched `{tensor}` (tf.contrib.memory_stats.MaxBytesInUse, TFM109):"
            " the loop asks tf.config.experimental.get_memory_info for the first GPU's peak now,"
            " the process' peak resident memory without a GPU; not a training value: train_step"
            " does not return it and verify does not compare it"
        )
    if program.final_save is not None:
        notes.append(
            "TFM303: `Saver().save(sess, path)` after the loop -> tf.train.Checkpoint.write(path)"
            " at the end of main() (same file names, object-based checkpoint)"
        )
    return notes


def _number_after_variables(program: Program, module: cst.Module, rule: TowerRule) -> None:
    """A cross-tower value whose op type the aggregation also wrote, once per trainable
    variable at the graph's root (`tf.reduce_mean(grads, 0)`): TF1 numbered it after those,
    so its legacy name is known once the trainable variables can be counted."""
    if not program.per_variable_names:
        return
    reader = VariableNames(module, rule.qualify)
    names = reader.run([*program.graph_setup, *program.tower_body])
    if names is None:
        return
    trainable = len([n for n in names if n not in reader.non_trainable])
    for name, (op, seen) in program.per_variable_names.items():
        program.fetch_names[name] = f"{op}_{seen + trainable}"


def _names_used(*roots: cst.CSTNode) -> dict[str, int]:
    """How often each variable name occurs (attribute names like `parser.parse_args` aside)."""
    attributes: set[int] = set()
    counts: dict[str, int] = {}
    for node in (
        n for root in roots for n in walk(root)
    ):  # pre-order: an Attribute, then its `attr`
        if isinstance(node, cst.Attribute):
            attributes.add(id(node.attr))
        elif isinstance(node, cst.Name) and id(node) not in attributes:
            counts[node.value] = counts.get(node.value, 0) + 1
    return counts


def _drop_dead_definitions(function: cst.FunctionDef, new: cst.Module) -> cst.Module:
    """Module-level helpers only the graph code used (a device function for the towers and its
    constants) go with it: a function or constant the legacy training function named, that
    nothing in the new module uses any more (then, in turn, what only those used)."""
    attributes = {id(n.attr) for n in walk(function) if isinstance(n, cst.Attribute)}
    candidates = {
        n.value for n in walk(function) if isinstance(n, cst.Name) and id(n) not in attributes
    }
    while True:
        used = _names_used(new)
        dead = None
        for statement in new.body:
            assigned = _assign(statement)
            if isinstance(statement, cst.FunctionDef):
                name = statement.name.value
            elif assigned is not None and len(assigned[0]) == 1:
                name = assigned[0][0]
            else:
                continue
            if name in candidates and used.get(name, 0) == 1:
                dead = statement
                break
        if dead is None:
            return new
        inner = {id(n.attr) for n in walk(dead) if isinstance(n, cst.Attribute)}
        candidates |= {
            n.value for n in walk(dead) if isinstance(n, cst.Name) and id(n) not in inner
        }
        new = new.with_changes(body=[s for s in new.body if s is not dead])


def _drop_dead_imports(old: cst.Module, new: cst.Module) -> cst.Module:
    """``from ... import name`` that only the replaced graph code used (`control_flow_ops` for
    with_dependencies) goes with it; imports the legacy module did not use stay as they were."""
    before, after = _names_used(old), _names_used(new)
    body: list[cst.BaseStatement] = []
    for statement in new.body:
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if isinstance(small, cst.ImportFrom) and isinstance(small.names, list | tuple):
            kept = [
                alias
                for alias in small.names
                if not isinstance(alias.name, cst.Name)
                or alias.asname is not None
                or after.get(alias.name.value, 0) > 1
                or before.get(alias.name.value, 0) <= 1
            ]
            if not kept:
                continue
            if len(kept) != len(small.names):
                kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                statement = statement.with_changes(body=[small.with_changes(names=kept)])
        body.append(statement)
    return new.with_changes(body=body)


def _logging_prelude(emitter: Emitter, module: cst.Module) -> str:
    """Before the eager loop: the summary writer and the checkpoint manager it uses."""
    log, code = emitter.p.logging, emitter.expr
    text = ""
    if log.writer is not None:
        text += (
            "    # tf.summary.FileWriter -> a TF2 summary writer; the loop writes the scalars\n"
            "    # (tagged for TensorBoard's scalars dashboard, as tf.summary.scalar does).\n"
            f"    {log.writer[0]} = tf.summary.create_file_writer({code(log.writer[1])})\n"
            "    scalar_metadata = tf.compat.v1.SummaryMetadata(\n"
            '        plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars"))\n'
        )
    path = emitter.saved_path()
    if path is not None:
        keep = code(log.saver[1]) if log.saver and log.saver[1] is not None else "5"
        text += (
            "    # tf.train.Saver -> a CheckpointManager writing the same file names\n"
            "    # (<path>-<step>); object-based checkpoints, not readable by the legacy Saver.\n"
            f"    manager = tf.train.CheckpointManager(\n"
            f"        checkpoint, os.path.dirname({code(path)}), max_to_keep={keep},\n"
            f"        checkpoint_name=os.path.basename({code(path)}))\n"
        )
    return text


def _queue_function(program: Program, unit: str) -> cst.FunctionDef:
    """The queue input function, returning the same batches from tf.data."""
    queue = program.queue
    assert queue is not None
    code = cst.Module([]).code_for_node
    tensors = queue.tensors
    assert isinstance(tensors, cst.List)
    sliced = ", ".join(code(e.value) for e in tensors.elements)
    if len(tensors.elements) == 1:
        sliced += ","
    body = _indent(
        "# TFM303: slice_input_producer(shuffle=False) + tf.train.batch on one thread -> the\n"
        "# same batches in the same order from tf.data (TF2 has no queue runners).\n"
        f"dataset = tf.data.Dataset.from_tensor_slices(({sliced}))\n"
        f"return dataset.repeat().batch({code(queue.batch_size)})\n",
        unit,
    )
    statements: list[cst.CSTNode] = list(cst.parse_module(body).body)
    docstring = queue.function.body.body[0] if queue.function.get_docstring() else None
    if docstring is not None:
        statements.insert(0, docstring)
    return queue.function.with_changes(body=queue.function.body.with_changes(body=statements))


def _input_note(program: Program) -> str:
    if program.queue is not None and program.queue.dequeued_from is not None:
        return (
            f"TFM303: queue input (`{program.queue.function.name.value}`: slice_input_producer "
            "in order + tf.train.batch on one thread) behind a queue each tower dequeued its own "
            f"batch from (`{program.queue.dequeued_from}.dequeue()`) -> that function returns a "
            "tf.data dataset of the same batches in the same order, and each step takes "
            "num_replicas consecutive ones as one global batch: replica i gets the i-th. TF1 "
            "fixed no order among the towers' dequeues (measured on TF 2.21's compat layer: "
            "mostly the reverse, sometimes another order), so verify runs the legacy towers' "
            "dequeues in tower order, one of the orders TF1 allows, and compares each "
            "tower's batch with its replica's"
        )
    if program.queue is not None:
        return (
            f"TFM303: queue input (`{program.queue.function.name.value}`: slice_input_producer "
            "in order + tf.train.batch on one thread) + tf.split -> that function returns a "
            "tf.data dataset of the same batches in the same order, distributed so that "
            "replica i gets the i-th slice, as tower i got the i-th split"
        )
    if program.dataset is not None:
        return (
            f"TFM303: the one-shot iterator over `{program.dataset}` + tf.split -> "
            f"strategy.experimental_distribute_dataset(`{program.dataset}`): replica i gets the "
            "i-th slice of each batch, as tower i got the i-th split"
        )
    if program.tower_feed is not None:
        return (
            "TFM303: per-tower placeholders + feed_dict -> a tf.data dataset whose global batch "
            "joins the towers' feeds in tower order, distributed so that replica i gets tower "
            "i's feed"
        )
    return (
        "TFM303: placeholders + feed_dict -> a tf.data dataset of the same global batches, "
        "distributed so that replica i gets tower i's slice"
    )


class _ContribToTfSlim(cst.CSTTransformer):
    """``tf.contrib.slim`` -> ``tf_slim``, ``tf.contrib.layers`` -> ``tf_slim.layers``."""

    def __init__(self, tf: str) -> None:
        super().__init__()
        self.spellings = {f"{tf}.contrib.slim": "tf_slim", f"{tf}.contrib.layers": "tf_slim.layers"}
        self.changed = False

    def leave_Attribute(self, original, updated):
        code = cst.Module([]).code_for_node(updated)
        new = self.spellings.get(code)
        if new is None and code.startswith("tf_slim.layers.") and code.count(".") == 2:
            # contrib.layers' initializers and regularizers are tf_slim's own, not its layers'
            found = tfapi.tf_slim_name("tf.contrib.layers." + code.split(".")[2])
            new = found if found is not None and found != code else None
        if new is None:
            return updated
        self.changed = True
        return cst.parse_expression(new)


_TF_SLIM_COMMENT = (
    "# tf_slim (tf.contrib.slim / tf.contrib.layers on PyPI) still refers to ops.Tensor, which",
    "# TensorFlow 2.21 no longer defines.",
)
_TF_SLIM_PATCH = """\
tf_ops = importlib.import_module("tensorflow.python.framework.ops")
if not hasattr(tf_ops, "Tensor"):
    tf_ops.Tensor = tf.Tensor
"""


def _tensorflow_alias(module: cst.Module, small: cst.BaseSmallStatement | None) -> str | None:
    """The local name ``import tensorflow [as tf]`` binds, if ``small`` is that import."""
    if not isinstance(small, cst.Import):
        return None
    local = None
    for alias in small.names:
        if module.code_for_node(alias.name) == "tensorflow":
            # an import's `as` names a Name (libcst's AsName also serves `with`)
            local = cast(cst.Name, alias.asname.name).value if alias.asname else "tensorflow"
    return local


def _contrib_to_tf_slim(module: cst.Module, blocked_at: cst.CSTNode) -> cst.Module:
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
        local = _tensorflow_alias(module, small)
        if local is not None:
            tf, tf_import = local, position
    if tf is None:
        return module
    renamer = _ContribToTfSlim(tf)
    if not _spells_any(module, renamer.spellings):
        return module  # the transform (libcst's re-validating walk) would change nothing
    renamed = module.visit(renamer)
    if not renamer.changed:
        return module
    if any(
        isinstance(node, cst.Attribute) and renamed.code_for_node(node) == f"{tf}.contrib"
        for node in walk(renamed)
    ):
        raise Blocked(
            blocked_at,
            "tf.contrib APIs other than slim / contrib.layers "
            "(tf_slim has no replacement for them)",
        )
    body = list(renamed.body)
    conv_batch_norm = "batch_norm" in identifiers(renamed)
    patch = cst.parse_module(_indent(_TF_SLIM_PATCH, module.default_indent)).body
    comment = [cst.EmptyLine(comment=cst.Comment(line)) for line in _TF_SLIM_COMMENT]
    patch = [patch[0].with_changes(leading_lines=[cst.EmptyLine(), *comment]), *patch[1:]]
    if conv_batch_norm:
        alias = cst.parse_module(_indent(_TF_SLIM_BATCH_NORM, module.default_indent)).body
        comment = [cst.EmptyLine(comment=cst.Comment(line)) for line in _TF_SLIM_BATCH_NORM_COMMENT]
        patch += [alias[0].with_changes(leading_lines=comment), *alias[1:]]
    body[imports_end:imports_end] = patch
    body[tf_import + 1 : tf_import + 1] = [cst.parse_statement("import tf_slim")]
    if "importlib" not in identifiers(renamed):
        _insert_import(body, cst.parse_statement("import importlib"))
    if conv_batch_norm and "sys" not in identifiers(renamed):
        _insert_import(body, cst.parse_statement("import sys"))
    return renamed.with_changes(body=body)


_TF_SLIM_BATCH_NORM_COMMENT = (
    "# Its batch_norm (on 4-D inputs) loads tf_keras.legacy_tf_layers, which tf_keras ships",
    "# under tf_keras.src.",
)
_TF_SLIM_BATCH_NORM = """\
for legacy_module in ("legacy_tf_layers", "legacy_tf_layers.normalization"):
    sys.modules.setdefault(
        f"tf_keras.{legacy_module}", importlib.import_module(f"tf_keras.src.{legacy_module}"))
"""


# tf.compat.v1.layers.<name> -> the tf_keras module that defines it (Keras 3 has none of them).
_V1_LAYER_MODULES = {
    "core": ("dense", "dropout", "flatten", "Dense", "Dropout", "Flatten"),
    "convolutional": (
        "conv1d", "conv2d", "conv3d", "conv2d_transpose", "conv3d_transpose", "separable_conv1d",
        "separable_conv2d", "Conv1D", "Conv2D", "Conv3D", "Conv2DTranspose", "SeparableConv2D",
    ),
    "pooling": (
        "average_pooling1d", "average_pooling2d", "average_pooling3d", "max_pooling1d",
        "max_pooling2d", "max_pooling3d", "MaxPooling2D", "AveragePooling2D",
    ),
    "normalization": ("batch_normalization", "BatchNormalization"),
}  # fmt: skip
# tf.compat.v1.nn.rnn_cell needs Keras 2 as well: tf_keras module -> the cells it carries
_V1_RNN_MODULES = {
    "legacy_cells": (
        "BasicLSTMCell", "BasicRNNCell", "GRUCell", "LSTMCell", "LSTMStateTuple", "MultiRNNCell",
        "RNNCell",
    ),
    "legacy_cell_wrappers": ("DeviceWrapper", "DropoutWrapper", "ResidualWrapper"),
}  # fmt: skip


class _V1Layers(cst.CSTTransformer):
    """``tf.compat.v1.layers.X`` and ``tf.compat.v1.nn.rnn_cell.X`` -> tf_keras' module
    holding X; ``used`` collects the imports that needs."""

    def __init__(self, tf: str) -> None:
        super().__init__()
        self.prefix = f"{tf}.compat.v1.layers."
        self.rnn_prefix = f"{tf}.compat.v1.nn.rnn_cell."
        self.used: set[str] = set()

    def leave_Attribute(self, original, updated):
        code = cst.Module([]).code_for_node(updated)
        for prefix, modules, home, alias in (
            (self.prefix, _V1_LAYER_MODULES, "legacy_tf_layers", "tf1_{}_layers"),
            (self.rnn_prefix, _V1_RNN_MODULES, "layers.rnn", "tf1_rnn_{}"),
        ):
            if not code.startswith(prefix) or "." in code[len(prefix) :]:
                continue
            name = code[len(prefix) :]
            for module, names in modules.items():
                if name in names:
                    local = alias.format(module.removeprefix("legacy_"))
                    self.used.add(f"from tf_keras.src.{home} import {module} as {local}")
                    return cst.parse_expression(f"{local}.{name}")
            raise Blocked(original, f"`{code}` has no tf_keras counterpart the conversion knows")
        return updated


_HPARAMS = "tensorflow.contrib.training.HParams"
# What tf.contrib.training.HParams did that model code relies on: named values read as
# attributes, overridden from a dict (a JSON file) by name; unknown names refused.
_HPARAMS_CLASS = '''
class HParams:
    """Named hyperparameters (tf.contrib.training.HParams is gone in TensorFlow 2)."""

    def __init__(self, **values):
        self.__dict__.update(values)

    def values(self):
        return dict(self.__dict__)

    def add_hparam(self, name, value):
        if name in self.__dict__:
            raise ValueError("Hyperparameter name is reserved: %s" % name)
        setattr(self, name, value)

    def set_hparam(self, name, value):
        if name not in self.__dict__:
            raise KeyError(name)
        setattr(self, name, value)

    def override_from_dict(self, values_dict):
        for name, value in values_dict.items():
            self.set_hparam(name, value)
        return self
'''


class _HParamsUses(cst.CSTTransformer):
    """``from tensorflow.contrib.training import HParams`` goes (the class is written in the
    module instead); ``tf.contrib.training.HParams`` becomes ``HParams``."""

    def __init__(self, resolver: NameResolver) -> None:
        super().__init__()
        self.resolver = resolver
        self.changed = False

    def leave_ImportFrom(self, original_node, updated_node):
        if isinstance(updated_node.names, cst.ImportStar) or dotted(updated_node.module) != (
            "tensorflow.contrib.training"
        ):
            return updated_node
        kept = [a for a in updated_node.names if dotted(a.name) != "HParams" or a.asname]
        if len(kept) == len(updated_node.names):
            return updated_node
        self.changed = True
        if not kept:
            return cst.RemoveFromParent()
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(names=kept)

    def leave_SimpleStatementLine(self, original_node, updated_node):
        # the import line lost its only statement
        return cst.RemoveFromParent() if not updated_node.body else updated_node

    def leave_Attribute(self, original_node, updated_node):
        if self.resolver.qualify(original_node) == _HPARAMS:
            self.changed = True
            return cst.Name("HParams")
        return updated_node


def _contrib_hparams(module: cst.Module) -> cst.Module:
    """tf.contrib.training.HParams has no TF2 form: a small class of the same behaviour is
    written in the model module, after its imports."""
    if "HParams" not in module.code:
        return module
    if "HParams" in bound_names(module) or any(
        isinstance(s, cst.ClassDef) and s.name.value == "HParams" for s in module.body
    ):
        return module
    renamer = _HParamsUses(NameResolver.for_module(module))
    renamed = module.visit(renamer)
    if not renamer.changed:
        return module
    body = list(renamed.body)
    end = 0
    for position, statement in enumerate(body):
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if isinstance(small, cst.Import | cst.ImportFrom) or (
            position == 0 and isinstance(small, cst.Expr)
        ):
            end = position + 1
        else:
            break
    [cls] = cst.parse_module(_indent(_HPARAMS_CLASS, module.default_indent)).body
    body.insert(end, cls.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()]))
    return renamed.with_changes(body=body)


class _DimensionValues(cst.CSTTransformer):
    """TF1's ``x.shape[-1].value`` (a Dimension) -> ``x.shape[-1]``: TF2 shapes hold ints."""

    def leave_Attribute(self, original_node, updated_node):
        return _dimension_value(updated_node)


def _dimension_values(module: cst.Module) -> cst.Module:
    if ".value" not in module.code:
        return module
    return module.visit(_DimensionValues())


def _v1_layers_to_tf_keras(module: cst.Module) -> cst.Module:
    """``tf.compat.v1.layers`` needs Keras 2: the model code keeps them, from tf_keras."""
    tf = None
    tf_import = 0
    for position, statement in enumerate(module.body):
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        local = _tensorflow_alias(module, small)
        if local is not None:
            tf, tf_import = local, position
    if tf is None:
        return module
    layers = _V1Layers(tf)
    if not _spells_any(module, (layers.prefix, layers.rnn_prefix), prefix=True):
        return module  # the transform (libcst's re-validating walk) would change nothing
    renamed = module.visit(layers)
    if not layers.used:
        return module
    body = list(renamed.body)
    imports = [cst.parse_statement(line) for line in sorted(layers.used)]
    what = "tf.compat.v1.layers" if any("layers import" in u for u in layers.used) else ""
    if any("rnn import" in u for u in layers.used):
        what = f"{what} and RNN cells" if what else "tf.compat.v1 RNN cells"
    comment = cst.EmptyLine(comment=cst.Comment(f"# {what} need Keras 2: tf_keras carries them."))
    imports[0] = imports[0].with_changes(leading_lines=[comment])
    body[tf_import + 1 : tf_import + 1] = imports
    return renamed.with_changes(body=body)


def _spells_any(module: cst.Module, spellings: Iterable[str], prefix: bool = False) -> bool:
    """Some dotted name in ``module`` is one of ``spellings`` (with ``prefix``, starts with
    one): what a renaming transform matches first, checked with the cheap read-only walk."""
    wanted = tuple(spellings)
    for node in walk(module):
        if isinstance(node, cst.Attribute):
            name = dotted(node)
            if name is not None and (name.startswith(wanted) if prefix else name in wanted):
                return True
    return False


def _entries(manifest: dict[str, object], key: str) -> list[object]:
    """A list the manifest holds under ``key`` (each one this module writes is a list)."""
    return cast("list[object]", manifest.get(key, []))


def _ema_call(program: Program) -> cst.Call:
    """The ``tf.train.ExponentialMovingAverage(...)`` call of the program's ``ema = ...`` (the
    reader took that assignment for the EMA only so)."""
    assert program.ema is not None
    assigned = _assign(program.ema[1])
    assert assigned is not None
    return cast(cst.Call, assigned[1])


def _leading_lines(statement: cst.BaseStatement) -> Sequence[cst.EmptyLine]:
    # Each kind of statement has leading_lines; libcst's BaseStatement does not declare them.
    return cast("cst.SimpleStatementLine | cst.BaseCompoundStatement", statement).leading_lines


def _insert_import(body: list[_Statement], statement: _Statement) -> None:
    """``import x`` in order among the first plain imports; first of its group, it takes the
    blank line that opened the group."""
    position = _first_import(body)
    if position < len(body):
        after = body[position]
        small = after.body[0] if isinstance(after, cst.SimpleStatementLine) else None
        if isinstance(small, cst.Import | cst.ImportFrom):
            if after.leading_lines and not (position and _is_stdlib(body[position - 1])):
                statement = statement.with_changes(leading_lines=after.leading_lines)
                after = after.with_changes(leading_lines=())
            if not _is_stdlib(after):  # the standard library is a group of its own
                after = after.with_changes(leading_lines=[cst.EmptyLine()])
            body[position] = after
    body.insert(position, statement)


def _is_stdlib(statement: cst.BaseStatement) -> bool:
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
    if isinstance(small, cst.Import):
        name = cst.Module([]).code_for_node(small.names[0].name)
    elif isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
        name = cst.Module([]).code_for_node(small.module)
    else:
        return False
    return name.split(".")[0] in sys.stdlib_module_names


def _first_import(body: list[_Statement]) -> int:
    """Where ``import importlib`` goes: in order among the module's first plain imports."""
    first = None
    for position, statement in enumerate(body):
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if not isinstance(small, cst.Import):
            if first is not None:
                return position
            continue
        if first is None:
            first = position
        if cst.Module([]).code_for_node(small.names[0].name) > "importlib":
            return position
        if statement is not body[first] and statement.leading_lines:
            return position  # the next import group
    return first or 0


class _ReplaceName(cst.CSTTransformer):
    def __init__(self, name: str, new: cst.BaseExpression) -> None:
        super().__init__()
        self.name, self.new = name, new

    def leave_Name(self, original, updated):
        return self.new if updated.value == self.name else updated


def _parse_generated(text: str, unit: str, emitter: Emitter) -> cst.Module:
    try:
        module = cst.parse_module(_indent(text, unit))
    except cst.ParserSyntaxError as exc:  # a bug here must not take the whole run down
        raise Blocked(emitter.p.tower_loop, f"internal error writing the program: {exc}") from exc
    return emitter.fill(module)


def _manifest(
    emitter: Emitter, keys: dict[str, str], rule: TowerRule, kept_reason: str | None = None
) -> tuple[dict[str, object], str]:
    module, program, keras = emitter.module, emitter.p, emitter.keras
    reader = VariableNames(module, rule.qualify)
    names = reader.run([*program.graph_setup, *program.tower_body])
    if keras is not None:
        names = list(keras.variables)
    if names is not None and program.ema is not None:
        # The EMA's shadows of the trainable variables: `<legacy name>/<ema name>`.
        ema_name = get_arg(_ema_call(program), 3, "name")
        suffix = (
            ema_name.evaluated_value
            if isinstance(ema_name, cst.SimpleString)
            else "ExponentialMovingAverage"
            if ema_name is None
            else None
        )
        if isinstance(suffix, str):
            names += [f"{n}/{suffix}" for n in names if n not in reader.non_trainable]
        else:
            names = None
    how = (
        "the towers AVERAGED their gradients: each replica's loss is divided by "
        "num_replicas_in_sync before compute_gradients, and apply_gradients SUM-all-reduces"
        if program.averaged
        else "the towers SUMMED their gradients, as apply_gradients' SUM all-reduce does: "
        "losses are not rescaled"
    )
    if keras is not None:
        model_note = (
            f"TFM303: the model function `{keras.model.function.name.value}` -> the Keras model "
            f"`{keras.model.class_name}` (named `{keras.model_name}`, built once in "
            "strategy.scope(), called by every replica with training=True): "
            + (
                "the same layers with each legacy API's defaults spelled out"
                if keras.model.layers
                else "its tf.get_variable variables as Keras weights, its computation kept"
            )
            + "; Keras 3 names cannot contain '/', so the variables map legacy scope paths to "
            "Keras weight paths"
        )
        if keras.model.uses_tf1_batch_norm:
            model_note += (
                "; TF1's fused batch norm fed its moving variance with the unbiased batch "
                "variance: TF1BatchNorm keeps that"
            )
    else:
        model_note = (
            "TFM303: the TF1 model code is kept on tf.compat.v1 (variable_scope/get_variable); "
            "its variables are owned by TF1Variables, mirrored, under their legacy names (not "
            f"converted to Keras layers: {kept_reason})"
        )
    notes = [
        f"TFM303: tower loop -> strategy.run(step_fn) in an @tf.function train step; {how}",
        model_note,
        *(f"TFM303: {note}" for note in (keras.notes if keras is not None else [])),
        f"TFM303: `{program.optimizer}` stays a tf.compat.v1.train optimizer: under "
        "MirroredStrategy it applies exactly the TF1 update (slots included)",
        _input_note(program),
    ]
    if program.ema is not None:
        notes.append(
            f"TFM303: `{program.ema[0]}` stays a tf.compat.v1 ExponentialMovingAverage with its "
            "TF1 semantics (num_updates warm-up); its shadow variables are created before the "
            + (
                "first step and applied before every update (see the EMA note below)"
                if program.ema_orderless
                else "first step and applied after every update, as the legacy control "
                "dependency did"
            )
        )
    if program.monitored is not None:
        notes.append(
            "TFM303: MonitoredTrainingSession -> an eager loop that stops when global_step "
            "reaches StopAtStepHook's last_step; its checkpoints -> tf.train.Checkpoint + "
            "CheckpointManager (restored at start, saved at the end; object-based, not "
            "readable by the legacy Saver); its default summaries (global_step/sec) are not "
            "written"
        )
    for tensor, key in keys.items():
        if tensor in program.reductions:
            source = program.collected[program.reductions[tensor]]
            if program.reduction_ops.get(tensor, "SUM") == "SUM":
                notes.append(
                    f"TFM303: the loop fetched `{tensor}` = tf.add_n of every tower's "
                    f"`{source}`; train_step returns the SUM over the replicas as `{key}`"
                )
            elif source == tensor:
                notes.append(
                    f"TFM303: the loop fetched `{tensor}`, a mean over the whole global batch of "
                    "the towers' concatenated tensors: each replica computes it on its own slice "
                    f"and train_step returns the MEAN over the replicas as `{key}` (equal slices: "
                    "the same value)"
                )
            else:
                notes.append(
                    f"TFM303: the loop fetched `{tensor}`, the mean of every tower's `{source}`; "
                    f"train_step returns the MEAN over the replicas as `{key}`"
                )
            continue
        if (
            any(f.tensor == tensor for f in program.fetches)
            and tensor not in {*program.collected.values()}
            and not any(tensor in bound_names(s) for s in program.tower_body)
        ):
            notes.append(
                f"TFM303: the loop fetched `{tensor}` (no tower's); the step reads it before "
                f"the update and train_step returns it as `{key}`"
            )
            continue
        entries = sorted(  # `losses[0]`: one tower's entry of a per-tower list
            {
                (f.tensor, f.tower)
                for f in program.fetches
                if f.tower is not None and program.collected.get(f.tensor) == tensor
            }
        )
        for listed, tower in entries:
            which = "the last tower" if tower == -1 else f"tower {tower}"
            notes.append(
                f"TFM303: the loop fetched {which}'s `{tensor}` (`{listed}[{tower}]`); "
                f"train_step returns it per replica as `{key}` and the loop logs replica "
                f"{tower}'s" + (" (the last)" if tower == -1 else "")
            )
        if entries and not any(f.tensor == tensor for f in program.fetches):
            continue
        if not any(f.tensor == tensor for f in program.fetches) and (
            program.run_fetches_list is None
        ):
            continue  # only an input of a reduction
        if program.run_fetches_list is not None:
            notes.append(
                f"TFM303: the loop fetched every tower's `{tensor}` (`{program.run_fetches_list}`)"
                f"; train_step returns it per replica as `{key}` and the loop lists the replicas'"
            )
            continue
        notes.append(
            f"TFM303: the loop fetched the last tower's `{tensor}`; train_step returns it per "
            f"replica as `{key}` and the loop logs the last replica's"
        )
    notes.extend(_conversion_notes(program))
    if emitter.jit:
        notes.append(f"TFM303: {JIT_NOTE}")
    manifest: dict[str, object] = {"notes": notes}
    announced: list[dict[str, object]] = []
    if program.ema_orderless:
        shadow = "ExponentialMovingAverage"
        ema_name = get_arg(_ema_call(program), 3, "name")
        if isinstance(ema_name, cst.SimpleString):
            shadow = str(ema_name.evaluated_value)
        notes.append(f"TFM303: {ORDERLESS_EMA}")
        announced.append({"match": [f"*/{shadow}"], "code": "TFM303", "reason": ORDERLESS_EMA})
        manifest["announced"] = announced
    statistics = [n for n in names or [] if n.endswith(("/moving_mean", "/moving_variance"))]
    if program.update_ops is not None or statistics:
        reason = emitter.statistics_reason()
        notes.append(f"TFM303: {reason}")
        match = ["*/moving_mean", "*/moving_variance"]
        if program.ema is not None:
            match += ["*/moving_mean/*", "*/moving_variance/*"]  # their EMA shadows
        manifest["announced"] = [
            {"match": match, "code": "TFM303", "reason": reason},
            *announced,
        ]
    if emitter.synchronized_statistics:  # the forward pass changed: everything may differ
        notes.append(f"TFM303: {batch_norm_sync.FORWARD}")
        manifest["announced"] = [
            *_entries(manifest, "announced"),
            {"match": ["*"], "code": "TFM303", "reason": batch_norm_sync.FORWARD},
        ]
    if keras is not None and DROPOUT_NOTE in keras.notes:  # equal runs need the dropout off
        manifest["announced"] = [
            *_entries(manifest, "announced"),
            {"match": ["*"], "code": "TFM303", "reason": DROPOUT_NOTE},
        ]
    if keras is not None:
        mapping = {"global_step": "global_step"} if keras.global_step else {}
        mapping.update(keras.variables)
        if program.ema is not None:
            suffix = names[-1].rsplit("/", 1)[-1] if names else "ExponentialMovingAverage"
            ema_name = get_arg(_ema_call(program), 3, "name")
            suffix = (
                str(ema_name.evaluated_value)
                if isinstance(ema_name, cst.SimpleString)
                else "ExponentialMovingAverage"
            )
            mapping.update(
                {
                    f"{old}/{suffix}": f"{new}/{suffix}"
                    for old, new in keras.variables.items()
                    if not old.endswith(("/moving_mean", "/moving_variance"))
                }
            )
        manifest["variables"] = mapping
    elif names is not None:
        manifest["variables"] = {name: name for name in names}
    else:
        # verify maps by name once both sides have built their variables ({"*": "*"}).
        manifest["variables"] = {"*": "*"}
        notes.append(
            "TFM303: the legacy variable names could not be listed statically (the model is "
            "built in another module, or by a call whose variable names are not read statically, "
            "such as a conv2d layer): the migrated variables keep the legacy names, so they are "
            "mapped by name"
        )
    source = (
        "tf.data iterator -> distributed dataset" if program.dataset else "feed_dict -> tf.data"
    )
    if program.queue is not None:
        source = "queue input -> tf.data"
        if program.queue.dequeued_from is not None:
            source = "queue each tower dequeued from -> tf.data, replica i the step's i-th batch"
    summary = (
        f"converted the tower program `{program.function.name.value}` to MirroredStrategy "
        f"({'averaged' if program.averaged else 'summed'} gradients, {source}, "
        "Session loop -> eager loop, "
        + (
            f"model -> Keras model `{keras.model.class_name}`)"
            if keras is not None
            else "TF1 model code kept with mirrored variables)"
        )
    )
    return manifest, summary


# Calls that read a clock or a size: computing them again in another place changes nothing.
_PLAIN_CALLS = frozenset(
    {"time.time", "time.perf_counter", "time.monotonic", "len", "int", "float"}
)


def _plain_value(statement: cst.BaseStatement) -> bool:
    """``name = <arithmetic of names and literals>``, maybe over a clock: safe to run twice.
    It may read other names the set-up made only if they are plain too (the caller checks)."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return False
    assign = statement.body[0]
    if not (
        isinstance(assign, cst.Assign)
        and all(isinstance(t.target, cst.Name) for t in assign.targets)
    ):
        return False
    for node in walk(assign.value):
        if isinstance(node, cst.Subscript | cst.Lambda):
            return False  # an index into something the session made (fetched values)
        if isinstance(node, cst.Call) and dotted(node.func) not in _PLAIN_CALLS:
            return False
    return True
