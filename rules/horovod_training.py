from __future__ import annotations

import os
import re
from pathlib import Path

import libcst as cst

from tfmigrate.convert.horovod_emit import convert_horovod_module
from tfmigrate.convert.horovod_modules import (
    convert_entry,
    convert_helpers,
    convert_step_module,
    other_importers,
    step_program,
)
from tfmigrate.names import NameResolver, dotted
from tfmigrate.rule import Example, FixSafety, Rule, RuleContext
from tfmigrate.rules import _horovod_program_example as example
from tfmigrate.rules._horovod_emit import emit
from tfmigrate.rules._horovod_program import Reader
from tfmigrate.rules._tower_program import Blocked
from tfmigrate.syntax import walk

# Horovod's TensorFlow front ends; the Keras ones share the API this rule looks at.
_HOROVOD = ("horovod.tensorflow.", "horovod.keras.", "horovod.tensorflow.keras.", "horovod._keras.")
_KERAS_HOROVOD_INIT = ("horovod.keras.init", "horovod.tensorflow.keras.init")
_SAVING = re.compile(r"checkpoint|saver|save|model_dir|train_dir", re.I)
_DEVICE = re.compile(r"visible_device|set_visible_devices|device|gpu", re.I)


def _horovod_api(name: str | None) -> str | None:
    """``horovod.tensorflow.keras.callbacks.BroadcastGlobalVariablesCallback`` -> the last part."""
    if name is None or not name.startswith(_HOROVOD):
        return None
    return name.rsplit(".", 1)[1]


def _imports_horovod(statement: cst.CSTNode) -> bool:
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
    if isinstance(small, cst.Import):
        return any(_text(a.name).startswith("horovod") for a in small.names)
    return (
        isinstance(small, cst.ImportFrom)
        and small.module is not None
        and _text(small.module).startswith("horovod")
    )


def _text(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


class HorovodTraining(Rule):
    """
    ## What it does
    Flags TF1 (and Keras 2) Horovod training code, one finding per piece that changes in TF2:
    `hvd.init()`, `hvd.DistributedOptimizer(...)` (or `DistributedGradientTape`), the initial
    broadcast (`hvd.broadcast_global_variables(0)`, `BroadcastGlobalVariablesHook`,
    `BroadcastGlobalVariablesCallback`), checkpoints written only `if hvd.rank() == 0`, GPUs
    pinned with `hvd.local_rank()`, and learning rates scaled by `hvd.size()`. A Keras script's
    `hvd.init()` is TFM402's, which converts Keras `fit` programs.

    With `--unsafe-fixes` it converts the common Horovod TF1 training script -- `hvd.init()` in a
    module-level training function, a `tf.data` input sharded by `hvd.rank()` and read through a
    one-shot iterator, the model and loss, `hvd.DistributedOptimizer(opt)` +
    `opt.minimize(loss, global_step=...)`, a `MonitoredTrainingSession` with
    `StopAtStepHook` (and `BroadcastGlobalVariablesHook`), checkpoints from rank 0, or a plain
    `tf.Session` that runs the initializer and `hvd.broadcast_global_variables(0)` before its
    `for` loop -- into a
    plain `tf.distribute.MultiWorkerMirroredStrategy` program (one `tf.function` train step
    made in the training function, the legacy loop calling it, the main block kept): the TF1
    model code is kept (its variables mirrored under their legacy names, as
    TFM303 does), `hvd.size()` becomes `strategy.num_replicas_in_sync`, each worker builds the
    dataset of each of its replicas with the statements Horovod process `rank` ran
    (`distribute_datasets_from_function`), the averaging of `DistributedOptimizer` becomes the
    loss divided by `num_replicas_in_sync`, the broadcast, GPU pinning and session config go,
    and every worker saves checkpoints (the chief into the real folder). A script of another
    shape is left as it is; the `hvd.init()` finding names the line that blocked it and why.
    When the entry's `hvd.init()` drives a step built in a repo module it imports (the per-step
    graph and a hand-written update of the program's own that all-reduces the gradients through
    a helper), each module converts from its side: the entry makes the strategy and sets it as
    the program's, the step module gets the train step, the helpers the replica context's
    `all_reduce`; a finding names the other scripts that import a converted module.

    ## Why is this bad?
    Horovod is a separate MPI/Gloo runtime, and its TF1 API (session hooks, wrapped `tf.train`
    optimizers) only exists for TF1 graph code. TensorFlow 2's own engine for the same job is
    `tf.distribute.MultiWorkerMirroredStrategy` (collective all-reduce, the cluster from the
    `TF_CONFIG` environment variable instead of `horovodrun`), and each piece has a different
    counterpart there:
    - `DistributedOptimizer` AVERAGES the workers' gradients (its default `op=hvd.Average`);
      `apply_gradients` under the strategy SUMS the replicas' gradients, so each replica's loss
      must be divided by `strategy.num_replicas_in_sync` (the global batch) to keep the average.
      With `op=hvd.Sum` it must not.
    - The broadcast goes away: the strategy creates every variable with the same initial value on
      all workers.
    - Checkpointing only on rank 0 hangs or fails under the strategy, where saving may need
      collectives: every worker saves, the chief to the real folder, the others to temporary
      folders (the pattern of TF's multi-worker guide).
    - Horovod runs one process per GPU (`visible_device_list = str(hvd.local_rank())`); the
      strategy runs one process per machine and uses all of its GPUs: the pinning must go.
    - `hvd.size()` (processes = GPUs) becomes `strategy.num_replicas_in_sync`.

    ## Example
    ```python
    import horovod.tensorflow as hvd
    hvd.init()
    config.gpu_options.visible_device_list = str(hvd.local_rank())
    opt = hvd.DistributedOptimizer(tf.train.MomentumOptimizer(0.01 * hvd.size(), 0.9))
    hooks = [hvd.BroadcastGlobalVariablesHook(0)]
    checkpoint_dir = './checkpoints' if hvd.rank() == 0 else None
    ```
    Use instead:
    ```python
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # cluster from TF_CONFIG
    with strategy.scope():
        model = build_model()
        optimizer = keras.optimizers.SGD(0.01 * strategy.num_replicas_in_sync, momentum=0.9)
    # in the replica step: loss = per_example_loss_sum / global_batch_size
    # every worker saves: the chief to checkpoint_dir, the others to a temporary folder
    ```

    ## Fix safety
    Unsafe: the conversion changes how the program is launched (one process per machine with
    `TF_CONFIG` instead of `horovodrun`, every worker running the same script), and where a
    Horovod process had one GPU a worker now drives all of its machine's GPUs. What each replica
    computes is kept -- `tfmigrate verify TOWERS CONVERTED --workers W` checks it against the
    equivalent tower program (tower i = rank i) -- and the manifest's notes say what went away.
    The other findings (one per Horovod piece) are explanations only.
    """

    code = "TFM401"
    triggers = ("horovod",)
    name = "horovod-training"
    summary = "Horovod training code: move to MultiWorkerMirroredStrategy (TF_CONFIG)"
    fix_safety = FixSafety.UNSAFE

    valid = (
        # TF2 multi-worker code.
        """import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = build_model()
""",
        # Names that only look like Horovod's.
        """import mylib as hvd
hvd.init()
opt = hvd.DistributedOptimizer(opt)
""",
        # Importing Horovod without using the training API (e.g. a version check).
        """import horovod
print(horovod.__version__)
""",
        # rank() gating a log line, not a checkpoint.
        """import horovod.tensorflow as hvd
if hvd.rank() == 0:
    print('loss', loss_value)
""",
    )
    invalid = (
        Example(
            example.LEGACY, fixed=example.CONVERTED, message="convertible: `rewrite --unsafe-fixes`"
        ),
        Example(
            """
            import tensorflow as tf
            import horovod.tensorflow as hvd
            hvd.init()
            """,
            message="MultiWorkerMirroredStrategy",
        ),
        Example(
            """
            import argparse
            import tensorflow as tf
            import horovod.tensorflow as hvd

            def train(flags):
                hvd.init()
                dataset = make_dataset().shard(hvd.size(), hvd.rank()).batch(32)
                images, labels = dataset.make_one_shot_iterator().get_next()
                loss = model_loss(images, labels)
                opt = hvd.DistributedOptimizer(tf.train.AdamOptimizer(0.001))
                grads = opt.compute_gradients(loss)

            if __name__ == '__main__':
                parser = argparse.ArgumentParser()
                train(parser.parse_args())
            """,
            message="the script is not converted (line 11): `compute_gradients`",
        ),
        Example(
            """
            import tensorflow as tf
            import horovod.tensorflow as hvd
            opt = tf.train.AdamOptimizer(0.001 * hvd.size())
            opt = hvd.DistributedOptimizer(opt)
            """,
            message="AVERAGES",
        ),
        Example(
            """
            import horovod.tensorflow as hvd
            opt = hvd.DistributedOptimizer(opt, op=hvd.Sum)
            """,
            message="SUMS the workers' gradients, as apply_gradients does",
        ),
        Example(
            """
            import horovod.tensorflow as hvd
            opt = tf.train.AdamOptimizer(0.001 * hvd.size())
            """,
            message="num_replicas_in_sync",
        ),
        Example(
            """
            from horovod import tensorflow as hvd
            bcast = hvd.broadcast_global_variables(0)
            """,
            message="broadcast",
        ),
        Example(
            """
            import horovod.tensorflow as hvd
            hooks = [hvd.BroadcastGlobalVariablesHook(0), tf.train.StopAtStepHook(last_step=100)]
            """,
            message="BroadcastGlobalVariablesHook",
        ),
        Example(
            """
            import horovod.keras as hvd
            callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
            """,
            message="BroadcastGlobalVariablesCallback",
        ),
        Example(
            """
            import horovod.tensorflow as hvd
            checkpoint_dir = './checkpoints' if hvd.rank() == 0 else None
            """,
            message="every worker saves",
        ),
        Example(
            """
            import horovod.tensorflow as hvd
            with tf.train.MonitoredTrainingSession(
                    checkpoint_dir=FLAGS.train_dir if hvd.rank() == 0 else None) as sess:
                pass
            """,
            message="every worker saves",
        ),
        Example(
            """
            import horovod.tensorflow as hvd
            dataset = dataset.shard(hvd.size(), hvd.rank())
            """,
            message="InputContext",
        ),
        Example(
            """
            import horovod.tensorflow.keras as hvd
            if hvd.rank() == 0:
                callbacks.append(keras.callbacks.ModelCheckpoint('./checkpoint-{epoch}.h5'))
            """,
            message="every worker saves",
        ),
        Example(
            """
            import tensorflow as tf
            import horovod.tensorflow as hvd
            config = tf.ConfigProto()
            config.gpu_options.visible_device_list = str(hvd.local_rank())
            """,
            message="one process per machine",
        ),
    )

    def __init__(self, context) -> None:
        super().__init__(context)
        self._reported: set[int] = set()
        self._init: cst.Call | None = None

    def leave_Module(self, original_node: cst.Module) -> None:
        init = self._init
        if init is None:
            self._module_of_program(original_node)
            return
        if (self.call_name(init) or "").startswith(_KERAS_HOROVOD_INIT):
            return  # Keras Horovod: TFM402 converts the fit program
        start = (
            "Horovod: `hvd.init()` starts one process per GPU under horovodrun/MPI. TF2: "
            "`tf.distribute.MultiWorkerMirroredStrategy()`, one process per machine, the "
            "cluster from TF_CONFIG"
        )
        try:
            program = Reader(original_node, self.qualify).read()
            # writing the program is cheap and finds what blocks it there too (scan says so)
            emit(original_node, program, self.qualify)
        except Blocked as blocked:
            node = init if blocked.node is original_node else blocked.node
            where = "" if node is init else f" (line {self.position(node).start.line})"
            self._staged(init, start, f"the script is not converted{where}: {blocked.reason}")
            return
        name = program.function.name.value
        if not self.context.fixing:
            self.report(
                init,
                f"{start}; convertible: `rewrite --unsafe-fixes` converts the training function "
                f"`{name}` to a MultiWorkerMirroredStrategy program",
                replacement=original_node,
                target=original_node,
            )
            return
        try:
            module, manifest = _convert(self.context)
        except Blocked as blocked:
            self._staged(init, start, f"the script is not converted: {blocked.reason}")
            return
        self.report(
            init,
            f"{start}; converted the training function `{name}` to a MultiWorkerMirroredStrategy "
            "program (gradients "
            f"{'averaged' if program.averaged else 'summed'} over all workers' replicas, input "
            f"per rank{', checkpoints from every worker' if program.checkpoint_dir else ''})",
            replacement=module,
            target=self.context.module,
            manifest=manifest,
        )

    def _staged(self, init: cst.Call, start: str, refusal: str) -> None:
        """The staged converter (read -> plan -> emit) on a script the whole-program reader
        refuses: it keeps what it cannot convert under TODO(tfmigrate) markers."""
        converted = convert_horovod_module(self.context)
        summary = (
            f"{start}; converted to a MultiWorkerMirroredStrategy program (a tf.function train "
            "step, GradientTape replica)"
        )
        if isinstance(converted, str) and "in another module" in converted:
            program = step_program(Path(str(self.context.path)))
            if isinstance(program, str):
                converted = f"the step module does not convert: {program}"
            elif (
                program is not None and program.entry.path == Path(str(self.context.path)).resolve()
            ):
                converted = convert_entry(self.context)
                step = os.path.relpath(program.step.path, program.entry.path.parent)
                summary = (
                    f"{start}; converted to a MultiWorkerMirroredStrategy program whose train "
                    f"step (a tf.function, GradientTape replica) is built in `{step}`"
                )
        if isinstance(converted, str):
            self.report(init, f"{start}; {refusal} (staged converter: {converted})")
            return
        self.report(
            init,
            summary + converted.todo_summary(),
            replacement=converted.module,
            target=self.context.module,
            manifest={"notes": converted.manifest_notes("TFM401")},
        )

    def _module_of_program(self, module: cst.Module) -> None:
        """A module of a Horovod program whose entry (its ``hvd.init()``) is another script:
        the module that builds the train step, or helpers calling Horovod."""
        uses = [
            n
            for n in walk(module)
            if isinstance(n, cst.Call) and _horovod_api(self.call_name(n)) is not None
        ]
        path = Path(str(self.context.path)).resolve()
        program = step_program(path)
        if program is None or isinstance(program, str):
            return
        entry = os.path.relpath(program.entry.path, path.parent)
        if program.step.path == path:
            converted = convert_step_module(self.context, program)
            what = (
                f"the train step of the Horovod program `{entry}` is built here: converted to a "
                "tf.function train step (GradientTape replica) under the "
                "MultiWorkerMirroredStrategy the entry makes"
            )
        elif uses:
            converted = convert_helpers(self.context)
            what = (
                f"Horovod helpers of the program `{entry}`: its allreduce became the replica "
                "context's all_reduce, hvd.size()/rank() the strategy's"
            )
        else:
            return
        # the finding sits on the Horovod import: the Horovod calls carry their own findings
        node = next((s for s in module.body if _imports_horovod(s)), module)
        if isinstance(converted, str):
            self.report(node, f"Horovod: {what.split(':')[0]}; not converted: {converted}")
            return
        importers = other_importers(program, path)
        if importers:
            what += (
                f"; other scripts import this module too ({', '.join(importers)}): they get the "
                "converted module"
            )
        self.report(
            node,
            what + converted.todo_summary(),
            replacement=converted.module,
            target=self.context.module,
            manifest={"notes": converted.manifest_notes("TFM401")},
        )

    def _report_once(self, node: cst.CSTNode, message: str) -> None:
        if id(node) not in self._reported:
            self._reported.add(id(node))
            self.report(node, message)

    def visit_Call(self, node: cst.Call) -> None:
        api = _horovod_api(self.call_name(node))
        if api == "init":
            if self._init is None:
                self._init = node  # reported in leave_Module, with the conversion's outcome
        elif api in ("DistributedOptimizer", "DistributedGradientTape"):
            self._distributed_optimizer(node, api)
        elif api in (
            "broadcast_global_variables",
            "broadcast_variables",
            "BroadcastGlobalVariablesHook",
            "BroadcastGlobalVariablesCallback",
        ):
            self._report_once(
                node,
                f"Horovod `{api}`: the initial broadcast from rank 0. TF2: drop it; "
                "MultiWorkerMirroredStrategy creates every variable with the same initial value "
                "on all workers",
            )
        elif api == "size":
            self._report_once(
                node,
                "`hvd.size()` counts the processes (one per GPU). TF2: "
                "`strategy.num_replicas_in_sync` (all replicas of all workers)",
            )
        elif api == "rank":
            self._rank_gate(node)
        elif api == "local_rank":
            self._device_pinning(node)

    def _distributed_optimizer(self, node: cst.Call, api: str) -> None:
        op = next(
            (a.value for a in node.args if a.keyword and a.keyword.value == "op"),
            None,
        )
        op_name = _horovod_api(self.qualify(op)) if op is not None else "Average"
        if op_name == "Sum":
            how = (
                "SUMS the workers' gradients, as apply_gradients does under the strategy: do not "
                "divide the replicas' losses"
            )
        elif op_name == "Average":
            how = (
                "AVERAGES the workers' gradients; apply_gradients under the strategy SUMS them: "
                "divide each replica's loss by `strategy.num_replicas_in_sync` (the global batch)"
            )
        else:
            how = (
                f"reduces the workers' gradients with `{_text(op) if op is not None else op_name}`"
            )
        self._report_once(
            node,
            f"Horovod `{api}` {how}. TF2: a MultiWorkerMirroredStrategy step "
            "(`strategy.run`) with a plain optimizer",
        )

    def _rank_gate(self, call: cst.Call) -> None:
        """``if hvd.rank() == 0: save...``, ``ckpt_dir = ... if hvd.rank() == 0 else None``, or
        ``dataset.shard(hvd.size(), hvd.rank())``."""
        parent = self.parent(call)
        owner = self.parent(parent) if isinstance(parent, cst.Arg) else None
        if isinstance(owner, cst.Call) and (dotted(owner.func) or "").endswith("shard"):
            self._report_once(
                call,
                "Horovod: each process reads its own shard (`shard(hvd.size(), hvd.rank())`). "
                "TF2: the strategy distributes the input: experimental_distribute_dataset over "
                "the global batch, or distribute_datasets_from_function with the InputContext",
            )
            return
        for ancestor in self.ancestors(call):
            if isinstance(ancestor, cst.If | cst.IfExp) and self._in_test(call, ancestor):
                branches: list[cst.CSTNode | None] = [ancestor.body]
                if isinstance(ancestor, cst.IfExp):
                    # the value names what is gated: `checkpoint_dir = ... if rank == 0 else None`
                    branches = [ancestor.orelse, self.enclosing_statement(ancestor)]
                if any(_SAVING.search(_text(b)) for b in branches if b is not None):
                    self._report_once(
                        call,
                        "Horovod: only rank 0 writes checkpoints. TF2: under "
                        "MultiWorkerMirroredStrategy every worker saves (saving may need "
                        "collectives): the chief to the real folder, the others to a temporary "
                        "one they delete",
                    )
                return
            if isinstance(ancestor, cst.BaseCompoundStatement | cst.FunctionDef):
                return

    def _in_test(self, call: cst.Call, branch: cst.If | cst.IfExp) -> bool:
        return any(node is call for node in walk(branch.test))

    def _device_pinning(self, call: cst.Call) -> None:
        statement = self.enclosing_statement(call)
        if _DEVICE.search(_text(statement)):
            self._report_once(
                call,
                "Horovod pins one GPU per process with `hvd.local_rank()`. TF2: "
                "MultiWorkerMirroredStrategy runs one process per machine and uses all of its "
                "GPUs: drop the pinning",
            )


def _convert(context: RuleContext) -> tuple[cst.Module, dict[str, object]]:
    """The converted module and its manifest entry: TF1 names on tf.compat.v1 first (as TFM303
    does), then the program read again and written for MultiWorkerMirroredStrategy."""
    from tfmigrate.rules import tower_program
    from tfmigrate.rules._horovod_emit import convert

    renamed = tower_program._renamed(context)
    program = Reader(renamed, NameResolver.for_module(renamed).qualify).read()
    converted, notes = convert(renamed, program, NameResolver.for_module(renamed).qualify)
    converted = tower_program._v1_layers_to_tf_keras(converted)
    # every legacy variable maps to the store's variable of the same (legacy) name
    return converted, {"variables": {"*": "*"}, "notes": notes}
