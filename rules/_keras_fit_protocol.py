"""The verify protocol for a converted Keras `fit` program (TFM107).

A program that trains with `model.fit` gets `tfmigrate_program(strategy, argv)`: it runs the
script itself (as `__main__`) up to its `fit`, with `strategy` standing in for
`tf.distribute.MirroredStrategy()`, and hands verify the compiled model and one `fit` step per
global batch. The script's own code stays the one description of the program; nothing is copied.
`fit` may take arrays, a `tf.data.Dataset`, a Python generator of global batches (Keras 2's
`fit_generator(gen, steps_per_epoch=...)` after TFM112: `steps_per_epoch * epochs` batches of one
generator) or a `keras.utils.PyDataset`/`Sequence` (read as Keras 3's fit reads it, including
the `on_epoch_end` it calls before the first step); the batches are replayed in order, and
`LearningRateScheduler` callbacks given to `fit` set the rate at each epoch's first batch, as in
`fit`. A model compiled for several steps per call (`steps_per_execution`) has `fit`'s own
function for them run once on one batch (every variable restored after it): verify steps the
model in a loop of its own, and that function is another graph, which can fail where verify's
loop does not (Keras 3.15 on several replicas).
Module-level training code goes under `if __name__ == "__main__":` first, so that importing the
script (as verify does) does not train.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from tfmigrate.names import dotted

ENTRY_POINT = "tfmigrate_program"
STOP = "_StopAtFit"
FIT_METHODS = frozenset({"fit", "fit_generator"})

# Emitted as is: imports are local so that the script's own aliases do not matter.
PROTOCOL = f'''
class {STOP}(Exception):
    """Raised in place of `Model.fit` while tfmigrate verify sets this program up."""


def {ENTRY_POINT}(strategy, argv):
    """tfmigrate's verify protocol: this script up to its `fit`, with `strategy` as its
    MirroredStrategy; then one `fit` step per global batch (the batches of `shuffle=False`)."""
    import itertools
    import runpy
    import sys

    import keras
    import tensorflow as tf

    found = {{}}

    def stop_at_fit(model, x=None, y=None, batch_size=None, epochs=1, **kwargs):
        found.update(model=model, x=x, y=y, batch_size=batch_size or 32, epochs=epochs,
                     split=kwargs.get("validation_split") or 0.0,
                     steps=kwargs.get("steps_per_epoch"), callbacks=kwargs.get("callbacks") or [])
        raise {STOP}

    def batches_of(source, steps, epochs):
        # A generator yields global batches and goes on across epochs (steps_per_epoch each); a
        # keras.utils.PyDataset (Sequence) gives batch i as source[i] and starts again each epoch
        if hasattr(source, "__next__"):
            return itertools.islice(source, steps * epochs if steps else None)
        def each_epoch():
            # as Keras 3's fit: it reads the first two batches for their shapes and ends an
            # epoch (on_epoch_end, where a Sequence may reshuffle) before the first step
            for index in range(min(2, len(source))):
                source[index]
            source.on_epoch_end()
            for _ in range(epochs):
                source.on_epoch_begin()
                for index in range(steps or len(source)):
                    yield source[index]
                source.on_epoch_end()
        return each_epoch()

    def spec_of(value):
        value = tf.convert_to_tensor(value)
        return tf.TensorSpec((None, *value.shape[1:]), value.dtype)

    saved = tf.distribute.MirroredStrategy, keras.Model.fit, sys.argv
    tf.distribute.MirroredStrategy = lambda *args, **kwargs: strategy
    keras.Model.fit, sys.argv = stop_at_fit, [__file__, *argv]
    try:
        runpy.run_path(__file__, run_name="__main__")
    except {STOP}:
        pass
    finally:
        tf.distribute.MirroredStrategy, keras.Model.fit, sys.argv = saved
    if not found:
        raise RuntimeError("the script ended without calling Model.fit")
    model, x, y = found["model"], found["x"], found["y"]
    probe = None
    per_epoch = found["steps"]  # batches in an epoch, where fit knows it
    if isinstance(x, tf.data.Dataset):
        dataset = x.repeat(found["epochs"])
        per_epoch = per_epoch or max(int(x.cardinality()), 0)
    elif hasattr(x, "__next__") or isinstance(x, keras.utils.PyDataset):
        if not hasattr(x, "__next__"):
            per_epoch = per_epoch or len(x)
        items = batches_of(x, found["steps"], found["epochs"])
        first = next(items)
        first = tuple(first) if isinstance(first, list) else first
        signature = tf.nest.map_structure(spec_of, first)
        rest = itertools.chain([first], (tuple(b) if isinstance(b, list) else b for b in items))
        dataset = tf.data.Dataset.from_generator(lambda: rest, output_signature=signature)
        probe = tf.data.Dataset.from_tensors(first)  # the generator is read once, by training
    elif isinstance(x, (list, tuple)) or hasattr(x, "shape"):
        data = x if y is None else (x, y)
        if found["split"]:  # fit trains on the first (1 - validation_split) of the samples
            rows = len(tf.nest.flatten(x)[0])
            keep = int(rows * (1.0 - found["split"]))
            data = tf.nest.map_structure(lambda a: a[:keep], data)
        rows = len(tf.nest.flatten(data)[0])
        per_epoch = per_epoch or -(-rows // found["batch_size"])
        dataset = tf.data.Dataset.from_tensor_slices(data)
        dataset = dataset.batch(found["batch_size"]).repeat(found["epochs"])
    else:
        raise TypeError(f"verify drives fit on arrays, a tf.data.Dataset, a generator or a "
                        f"keras.utils.PyDataset, not {{type(x)}}")
    # fit builds the compiled loss and metrics before its first step (their variables cannot be
    # created inside the step function); evaluate does the same and leaves the weights alone
    model.evaluate(probe if probe is not None else dataset.take(1), verbose=0)
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    model.make_train_function()
    if model.steps_per_execution > 1:
        # verify steps the model in a loop of its own, so fit's function for several steps per
        # call (another graph, which Keras 3.15 cannot run on several replicas) runs once here,
        # on one batch; every variable it moved is put back
        state = [(v, v.numpy()) for v in [*model.variables, *model.optimizer.variables]]
        one = strategy.experimental_distribute_dataset(probe if probe is not None else dataset.take(1))
        try:
            model.train_function(iter(one))  # tfmigrate: ignore[TFM205] (made above)
        except Exception as error:
            raise RuntimeError(
                f"the program's fit cannot run steps_per_execution={{model.steps_per_execution}} "
                f"steps per call on {{strategy.num_replicas_in_sync}} replicas "
                f"({{type(error).__name__}}, above)"
            ) from error
        finally:
            for variable, value in state:
                variable.assign(value)
            model.reset_metrics()
    # fit's learning-rate schedule callbacks set the rate at the start of each epoch
    schedules = [c for c in found["callbacks"] if isinstance(c, keras.callbacks.LearningRateScheduler)]
    for callback in schedules:
        callback.set_model(model)
    done = []

    def train_step(batch):
        if schedules and per_epoch and len(done) % per_epoch == 0:
            for callback in schedules:
                callback.on_epoch_begin(len(done) // per_epoch)
        done.append(1)
        model.reset_metrics()  # fit logs running means over the epoch: verify compares each step
        return model.train_function(iter([batch]))  # tfmigrate: ignore[TFM205] (made above)

    def one_step(batch):
        # fit's step as train_function runs it, with the metrics reset in the same call (an
        # eager reset cost more than the step) and the replicas' values averaged as fit's are
        model.reset_metrics()
        outputs = strategy.run(model.train_step, args=(batch,))
        local = strategy.experimental_local_results
        return tf.nest.map_structure(lambda value: tf.reduce_mean(local(value), axis=0), outputs)

    program = {{
        "variables": {{v.path: v for v in model.weights}},
        "train_step": train_step,
        "batches": strategy.experimental_distribute_dataset(dataset),
        "model": model,
    }}
    if not schedules:  # (schedule callbacks run in Python between steps)
        # verify runs the steps as fit does: steps_per_execution to a call, batches taken inside
        program.update(one_step=one_step, steps_per_call=model.steps_per_execution)
    return program
'''


def calls_fit(block: cst.CSTNode) -> bool:
    """Whether ``block`` calls `X.fit(...)` or Keras 2's `X.fit_generator(...)`."""
    stack: list[cst.CSTNode] = [block]
    while stack:
        node = stack.pop()
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value in FIT_METHODS
        ):
            return True
        stack.extend(node.children)
    return False


def _is_main_guard(statement: cst.CSTNode) -> bool:
    if not isinstance(statement, cst.If) or not isinstance(statement.test, cst.Comparison):
        return False
    test = statement.test
    if len(test.comparisons) != 1 or not isinstance(test.comparisons[0].operator, cst.Equal):
        return False
    sides = [test.left, test.comparisons[0].comparator]
    names = [s for s in sides if isinstance(s, cst.Name)]
    strings = [s for s in sides if isinstance(s, cst.SimpleString)]
    return (
        len(names) == 1
        and names[0].value == "__name__"
        and len(strings) == 1
        and strings[0].evaluated_value == "__main__"
    )


def main_guard(module: cst.Module) -> int | None:
    """Index of the module's `if __name__ == "__main__":` statement."""
    return next((i for i, s in enumerate(module.body) if _is_main_guard(s)), None)


def defines(module: cst.Module, name: str) -> bool:
    return any(
        isinstance(s, cst.FunctionDef | cst.ClassDef) and s.name.value == name for s in module.body
    )


def _is_setup(statement: cst.BaseStatement) -> bool:
    """Imports, the docstring, and UPPER_CASE constants: what may stay above the guard."""
    if isinstance(statement, cst.FunctionDef | cst.ClassDef):
        return True
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    for small in statement.body:
        if isinstance(small, cst.Import | cst.ImportFrom):
            continue
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.SimpleString):
            continue
        if isinstance(small, cst.Assign) and all(
            isinstance(t.target, cst.Name) and t.target.value.isupper() for t in small.targets
        ):
            continue
        return False
    return True


def _names_in(nodes: list[cst.CSTNode]) -> set[str]:
    found: set[str] = set()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Name):
            found.add(node.value)
        stack.extend(node.children)
    return found


def _header(statement: cst.FunctionDef | cst.ClassDef) -> list[cst.CSTNode]:
    """What runs when the def/class statement itself runs (not its body)."""
    parts: list[cst.CSTNode] = [d.decorator for d in statement.decorators]
    if isinstance(statement, cst.ClassDef):
        return [*parts, *(a.value for a in statement.bases), *(a.value for a in statement.keywords)]
    params = statement.params
    every = [*params.posonly_params, *params.params, *params.kwonly_params]
    parts += [p.default for p in every if p.default is not None]
    parts += [p.annotation for p in every if p.annotation is not None]
    return parts


def _bound(statements: list[cst.BaseStatement]) -> set[str]:
    found: set[str] = set()
    for statement in statements:
        stack: list[cst.CSTNode] = [statement]
        while stack:
            node = stack.pop()
            if isinstance(node, cst.FunctionDef | cst.ClassDef):
                found.add(node.name.value)
                continue
            if isinstance(node, cst.AssignTarget | cst.AnnAssign | cst.AugAssign | cst.For):
                found |= _names_in([node.target])
            elif isinstance(node, cst.ImportAlias):
                bound = node.asname.name if node.asname else node.name
                found.add((dotted(bound) or "").split(".")[0])
                continue
            elif isinstance(node, cst.AsName):  # with ... as x, except ... as e
                found |= _names_in([node.name])
            stack.extend(node.children)
    return found


def guard_module_code(module: cst.Module) -> cst.Module | None:
    """The module with its training code under `if __name__ == "__main__":`; defs and classes
    among it stay at module level (moved above the guard) when their headers do not read a name
    that code binds. None when the module has no such code or already has a guard."""
    if main_guard(module) is not None:
        return None
    body = list(module.body)
    start = next((i for i, s in enumerate(body) if not _is_setup(s)), None)
    if start is None:
        return None
    tail = body[start:]
    code_bound = _bound([s for s in tail if not isinstance(s, cst.FunctionDef | cst.ClassDef)])
    hoisted: list[cst.BaseStatement] = []
    guarded: list[cst.BaseStatement] = []
    for statement in tail:
        if isinstance(statement, cst.FunctionDef | cst.ClassDef) and not (
            _names_in(_header(statement)) & code_bound
        ):
            hoisted.append(statement)
        else:
            guarded.append(statement)
    if not guarded:
        return None
    # Blank lines above the first guarded statement go; its comments move in with it. Blank
    # lines stay empty (an indented EmptyLine would print the new indentation).
    lead = list(guarded[0].leading_lines)
    while lead and lead[0].comment is None:
        lead.pop(0)
    guarded[0] = guarded[0].with_changes(leading_lines=lead)
    guarded = [s.with_changes(leading_lines=_one_blank(s.leading_lines)) for s in guarded]
    guard = cst.parse_statement('if __name__ == "__main__":\n    pass\n')
    assert isinstance(guard, cst.If)
    guard = guard.with_changes(
        body=cst.IndentedBlock(body=guarded),
        leading_lines=[cst.EmptyLine(), cst.EmptyLine()],
    )
    return module.with_changes(body=[*body[:start], *hoisted, guard])


def _one_blank(lines: Sequence[cst.EmptyLine]) -> list[cst.EmptyLine]:
    """At most one blank line in a row (two separated module-level defs), never indented."""
    kept: list[cst.EmptyLine] = []
    for line in lines:
        if line.comment is not None:
            kept.append(line)
        elif not kept or kept[-1].comment is not None:
            kept.append(line.with_changes(indent=False))
    return kept


def add_protocol(module: cst.Module) -> cst.Module:
    """The module with the protocol inserted before its `if __name__ == "__main__":` block."""
    index = main_guard(module)
    assert index is not None
    added = list(cst.parse_module(PROTOCOL.lstrip("\n")).body)
    added[0] = added[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    body = list(module.body)
    guard = body[index].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    return module.with_changes(body=[*body[:index], *added, guard, *body[index + 1 :]])
