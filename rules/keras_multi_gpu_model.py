from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import libcst as cst

from tfmigrate import tree
from tfmigrate.names import dotted
from tfmigrate.prefilter import CodeFacts
from tfmigrate.rule import Example, FixSafety, Rule
from tfmigrate.rules import _global_batch_loss as global_batch
from tfmigrate.rules import _keras_copy_removal as copy_removal
from tfmigrate.rules import _keras_parallel as parallel_copy
from tfmigrate.rules._distribution import keyword
from tfmigrate.rules._keras2 import RMSPROP_NOTE, is_used, plain_rmsprop
from tfmigrate.rules._keras_fit import FIT_METHODS, calls_fit
from tfmigrate.rules._towers import bound_names
from tfmigrate.rules.session_device_config import tf_imports, tf_module
from tfmigrate.syntax import unindented, walk
from tfmigrate.verify.manifest import SAME_NAMES

# Where Keras 2 / tf.keras 1.x kept it (canonical spellings; `tensorflow.python.keras` and
# `keras.backend.tensorflow_backend` are folded by the name resolver).
MULTI_GPU_MODEL = frozenset(
    {
        "keras.utils.multi_gpu_model",
        "keras.utils.training_utils.multi_gpu_model",
        "keras.utils.multi_gpu_utils.multi_gpu_model",
        "tensorflow.keras.utils.multi_gpu_model",
        "tensorflow.keras.utils.multi_gpu_utils.multi_gpu_model",
        "tensorflow.contrib.keras.utils.multi_gpu_model",
        "tensorflow.contrib.keras.api.keras.utils.multi_gpu_model",
    }
)

# Built-in losses that are a mean over samples: the mean of equal-sized sub-batch means (what
# `fit` under MirroredStrategy optimizes) equals the mean over the concatenated batch (what the
# multi_gpu_model wrapper optimized). A custom loss may reduce over the whole batch (dice, IoU).
PER_SAMPLE_LOSSES = frozenset(
    {
        "mse", "mae", "mape", "msle", "mean_squared_error", "mean_absolute_error",
        "mean_absolute_percentage_error", "mean_squared_logarithmic_error",
        "binary_crossentropy", "categorical_crossentropy", "sparse_categorical_crossentropy",
        "hinge", "squared_hinge", "categorical_hinge", "kld", "kullback_leibler_divergence",
        "poisson", "logcosh", "log_cosh", "huber", "cosine_similarity",
    }
)  # fmt: skip
_KERAS_LOSSES = ("keras.losses.", "tensorflow.keras.losses.")
_KERAS_LAYERS = ("keras.layers.", "tensorflow.keras.layers.")
_RANDOM_LAYERS = ("Dropout", "Dropout1D", "Dropout2D", "Dropout3D", "GaussianNoise")


@dataclass
class _Plan:
    """The pieces of one `parallel = multi_gpu_model(template, ...)` conversion."""

    block: cst.Module | cst.IndentedBlock
    first: int  # index in block.body of the first statement moved into strategy.scope()
    last: int  # ... and of the last
    wrapper: cst.BaseStatement  # the `parallel = multi_gpu_model(...)` line (or its `if`)
    parallel: str
    template: str | None  # None: the template is an expression inside the call
    template_expr: cst.BaseExpression
    compile_call: cst.Call


def _binds(node: cst.CSTNode, name: str) -> int:
    """How often ``name`` is bound directly in the scope of ``node`` (nested defs excluded)."""
    count = 0
    stack = list(node.children)
    while stack:
        current = stack.pop()
        if isinstance(current, cst.FunctionDef | cst.ClassDef):
            count += current.name.value == name
            continue
        if isinstance(current, cst.Lambda | cst.ListComp | cst.SetComp | cst.DictComp):
            continue
        if isinstance(current, cst.AssignTarget | cst.AugAssign | cst.AnnAssign):
            target = current.target
            count += sum(isinstance(n, cst.Name) and n.value == name for n in _targets(target))
        elif isinstance(current, cst.For | cst.AsName):
            target = current.target if isinstance(current, cst.For) else current.name
            count += sum(isinstance(n, cst.Name) and n.value == name for n in _targets(target))
        elif isinstance(current, cst.ImportAlias):
            bound = current.asname.name if current.asname else current.name
            count += isinstance(bound, cst.Name) and bound.value == name
        elif isinstance(current, cst.Global | cst.Nonlocal):
            count += 2  # another scope writes it: do not touch
        stack.extend(current.children)
    return count


def _targets(node: cst.CSTNode) -> list[cst.CSTNode]:
    if isinstance(node, cst.Tuple | cst.List):
        return [n for e in node.elements for n in _targets(e.value)]
    if isinstance(node, cst.StarredElement):
        return _targets(node.value)
    return [node]


def _local_names(function: cst.FunctionDef | cst.Lambda) -> set[str]:
    params = function.params
    every = [*params.posonly_params, *params.params, *params.kwonly_params]
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            every.append(star)
    names = {p.name.value for p in every}
    if isinstance(function, cst.FunctionDef):
        names |= {n for n in _assigned(function.body)}
    return names


def _assigned(node: cst.CSTNode) -> set[str]:
    found: set[str] = set()
    stack = list(node.children)
    while stack:
        current = stack.pop()
        if isinstance(current, cst.FunctionDef | cst.ClassDef | cst.Lambda):
            continue
        if isinstance(current, cst.AssignTarget | cst.AugAssign | cst.AnnAssign | cst.For):
            found |= {n.value for n in _targets(current.target) if isinstance(n, cst.Name)}
        stack.extend(current.children)
    return found


class _Redirect(cst.CSTTransformer):
    """Every read of the wrapper's name reads the template instead (scopes that rebind the
    name locally are left alone)."""

    def __init__(self, old: str, new: str) -> None:
        super().__init__()
        self.old, self.new = old, new

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return self.old not in _local_names(node)

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return self.old not in _local_names(node)

    def visit_Import(self, node: cst.Import) -> bool:
        return False  # module names, not reads

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.Attribute:
        # Only the object is a name read; `.attr` is not.
        return updated_node.with_changes(attr=original_node.attr)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        return updated_node.with_changes(keyword=original_node.keyword)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        if original_node.value == self.old:
            return updated_node.with_changes(value=self.new)
        return updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        # `parallel.fit(a,\n             b)`: keep continuation lines aligned under the paren.
        func = original_node.func
        if isinstance(func, cst.Attribute) and dotted(func.value) == self.old:
            shifted = updated_node.visit(_Shift(len(self.new) - len(self.old)))
            assert isinstance(shifted, cst.Call)
            return shifted
        return updated_node


class _Shift(cst.CSTTransformer):
    def __init__(self, delta: int) -> None:
        super().__init__()
        self.delta = delta

    def leave_ParenthesizedWhitespace(
        self, original_node: cst.ParenthesizedWhitespace, updated_node: cst.ParenthesizedWhitespace
    ) -> cst.ParenthesizedWhitespace:
        spaces = updated_node.last_line.value
        if self.delta < 0 and len(spaces) + self.delta < 0:
            return updated_node
        spaces = spaces + " " * self.delta if self.delta >= 0 else spaces[: self.delta]
        return updated_node.with_changes(last_line=cst.SimpleWhitespace(spaces))


_Statement = cst.SimpleStatementLine | cst.BaseCompoundStatement


def _statements(block: cst.CSTNode) -> list[_Statement]:
    """The statements of a module or block (every statement is one of the two kinds)."""
    body = getattr(block, "body", ())
    return [s for s in body if isinstance(s, cst.SimpleStatementLine | cst.BaseCompoundStatement)]


def _small(statement: cst.CSTNode) -> cst.BaseSmallStatement | None:
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        return statement.body[0]
    return None


def _is_call_line(statement: cst.CSTNode) -> bool:
    """`print(...)`, `logger.info(...)`: a message, not part of the program's state."""
    small = _small(statement)
    return isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)


def _is_pass(statement: cst.CSTNode) -> bool:
    return isinstance(_small(statement), cst.Pass)


def _is_assign(statement: cst.CSTNode, target: str, value: str) -> bool:
    small = _small(statement)
    return (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and dotted(small.targets[0].target) == target
        and dotted(small.value) == value
    )


def _wrap_compile(call: cst.Call, losses: list[cst.BaseExpression]) -> cst.Call:
    """``call`` (a `compile`) with its `loss` values equal to ``losses`` in
    `global_batch_loss(...)`."""
    loss = keyword(call, "loss", 1)
    if loss is None:
        return call

    def wrap(node: cst.BaseExpression) -> cst.BaseExpression:
        equal = any(node.deep_equals(other) for other in losses)
        return global_batch.wrapped(node) if equal else node

    value = loss.value
    if isinstance(value, cst.List | cst.Tuple):
        elements = [e.with_changes(value=wrap(e.value)) for e in value.elements]
        new_value: cst.BaseExpression = value.with_changes(elements=elements)
    else:
        new_value = wrap(value)
    args = [a.with_changes(value=new_value) if a is loss else a for a in call.args]
    return call.with_changes(args=args)


def _with_tf_import(module: cst.Module) -> cst.Module:
    """``module`` with `import tensorflow as tf` after its imports."""
    at = global_batch.first_code_index(module)
    body = list(module.body)
    line = cst.parse_statement("import tensorflow as tf\n")
    return module.with_changes(body=[*body[:at], line, *body[at:]])


def _calls(node: cst.CSTNode) -> list[cst.Call]:
    found: list[cst.Call] = []
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Call):
            found.append(current)
        stack.extend(current.children)
    return found


class _ReplaceNode(cst.CSTTransformer):
    def __init__(self, old: cst.CSTNode, new: cst.CSTNode) -> None:
        super().__init__()
        self.old, self.new = old, new

    def on_leave(self, original_node, updated_node):
        return self.new if original_node is self.old else updated_node


# `_plan`'s refusals that no other shape of the program changes.
_NOT_NESTED = frozenset(
    {
        "the wrapper is not a plain `name = multi_gpu_model(...)` statement",
        "no template model argument",
    }
)


@dataclass
class _Nested:
    """The wrappers of one function (or module) made in branches, `try`s or `with` blocks: the
    statements from the templates' construction to the `compile` go into one
    `strategy.scope()`, each wrapper line becomes `parallel = template` (or goes)."""

    block: cst.Module | cst.IndentedBlock
    first: int
    last: int
    wrappers: dict[int, tuple[str, str]]  # id(wrapper line) -> (parallel, template)
    templates: set[str]
    compile_call: cst.Call
    copies: set[str]  # local names of the multi_gpu_model copies called
    # a template name the program never defines -> the one model built before its wrapper
    stand_ins: dict[str, str] = field(default_factory=dict)


def _bound_anywhere(module: cst.Module, name: str) -> bool:
    """Whether any statement of ``module`` (at any depth) may bind ``name``; a star import
    may bind anything."""
    for node in walk(module):
        if isinstance(node, cst.ImportStar):
            return True
        bound: list[cst.CSTNode]
        if isinstance(node, cst.FunctionDef | cst.ClassDef | cst.Param):
            bound = [node.name]
        elif isinstance(node, cst.AssignTarget | cst.AugAssign | cst.AnnAssign | cst.For):
            bound = _targets(node.target)
        elif isinstance(node, cst.CompFor):
            bound = _targets(node.target)
        elif isinstance(node, cst.AsName):
            bound = _targets(node.name)
        elif isinstance(node, cst.ImportAlias) and node.asname is None:
            bound = [cst.Name((dotted(node.name) or "").split(".")[0])]
        elif isinstance(node, cst.Global | cst.Nonlocal):
            bound = [n.name for n in node.names]
        else:
            continue
        if any(isinstance(n, cst.Name) and n.value == name for n in bound):
            return True
    return False


def _drop_unused_copy(module: cst.Module, name: str) -> cst.Module:
    """``module`` without the def of the multi_gpu_model copy ``name`` (or its import) when
    nothing reads the name any more."""
    without = [
        s for s in module.body if not (isinstance(s, cst.FunctionDef) and s.name.value == name)
    ]
    if is_used(module.with_changes(body=without), name):
        # still read somewhere: only the imports of it inside blocks no read sees go
        return copy_removal.drop_dead_imports(module, name)
    body: list[cst.BaseStatement] = []
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
            continue
        small = _small(statement)
        if isinstance(small, cst.ImportFrom) and isinstance(small.names, list | tuple):
            kept = [a for a in small.names if dotted(a.asname.name if a.asname else a.name) != name]
            if not kept:
                continue
            if len(kept) != len(small.names):
                kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                statement = statement.with_changes(body=[small.with_changes(names=kept)])
        body.append(statement)
    return copy_removal.drop_dead_imports(module.with_changes(body=body), name)


def _bound_except(node: cst.CSTNode, skip: set[int]) -> set[str]:
    """Names ``node`` binds outside the statements whose ids are in ``skip``."""
    if id(node) in skip:
        return set()
    if isinstance(node, cst.SimpleStatementLine | cst.FunctionDef | cst.ClassDef):
        return bound_names(node) | (
            {node.name.value} if isinstance(node, cst.FunctionDef | cst.ClassDef) else set()
        )
    found: set[str] = set()
    if isinstance(node, cst.For):
        found |= {n.value for n in _targets(node.target) if isinstance(n, cst.Name)}
    if isinstance(node, cst.WithItem) and node.asname is not None:
        found |= {n.value for n in _targets(node.asname.name) if isinstance(n, cst.Name)}
    for child in node.children:
        found |= _bound_except(child, skip)
    return found


def _same_code(a: list[cst.BaseStatement], b: list[cst.BaseStatement]) -> bool:
    """Whether two statement lists read the same, whitespace and comments aside."""

    def text(statements: list[cst.BaseStatement]) -> list[str]:
        code = cst.Module(body=[])
        return [
            " ".join(code.code_for_node(s.with_changes(leading_lines=[])).split("#")[0].split())
            for s in statements
        ]

    return text(a) == text(b)


class _Unwrap(cst.CSTTransformer):
    """Inside the statements moved into `strategy.scope()`: wrapper lines become `parallel =
    template` (gone when both are one name), the `tf.device` blocks that build a template lose
    their device, and the single-device fallbacks around the wrappers collapse."""

    def __init__(self, rule: KerasMultiGpuModel, plan: _Nested) -> None:
        super().__init__()
        self.rule, self.plan = rule, plan
        self.removed: set[int] = set()  # ids of blocks that lost a wrapper line

    def leave_SimpleStatementLine(self, original, updated):
        pair = self.plan.wrappers.get(id(original))
        if pair is None:
            return updated
        parallel, template = pair
        if parallel == template:
            return cst.RemoveFromParent()
        assign = cst.Assign(
            targets=[cst.AssignTarget(cst.Name(parallel))], value=cst.Name(template)
        )
        return updated.with_changes(body=[assign])

    def leave_IndentedBlock(self, original, updated):
        if not updated.body:
            self.removed.add(id(original))
            return updated.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
        return updated

    def leave_With(self, original, updated):
        device = self.rule._device_block(original)
        if device is None or not (bound_names(original.body) & self.plan.templates):
            return updated
        inner = list(updated.body.body)
        inner[0] = inner[0].with_changes(
            leading_lines=[*updated.leading_lines, *inner[0].leading_lines]
        )
        return cst.FlattenSentinel(inner)

    def leave_If(self, original, updated):
        if id(original.body) in self.removed and updated.orelse is None:
            return cst.RemoveFromParent()  # `if gpus > 1: model = multi_gpu_model(model)`
        other = updated.orelse
        if (
            isinstance(other, cst.Else)
            and isinstance(other.body, cst.IndentedBlock)
            and isinstance(updated.body, cst.IndentedBlock)
            and (id(original.body) in self.removed or self._holds_wrapper(original.body))
            and _same_code(list(other.body.body), list(updated.body.body))
        ):
            # both branches now do the same: `if gpus > 1: p = m  else: p = m`
            inner = list(updated.body.body)
            inner[0] = inner[0].with_changes(leading_lines=updated.leading_lines)
            return cst.FlattenSentinel(inner)
        return updated

    def leave_Try(self, original, updated):
        if not self._holds_wrapper(original.body) or original.orelse or original.finalbody:
            return updated
        pairs = [p for i, p in self.plan.wrappers.items() if self._contains(original.body, i)]
        for handler in original.handlers:
            for item in handler.body.body:
                if not (
                    _is_call_line(item)
                    or _is_pass(item)
                    or any(_is_assign(item, p, t) for p, t in pairs)
                ):
                    return updated
        inner = [s for s in updated.body.body if not _is_call_line(s)] or [
            cst.SimpleStatementLine([cst.Pass()])
        ]
        if all(_is_pass(s) for s in inner):
            return cst.RemoveFromParent()
        inner[0] = inner[0].with_changes(leading_lines=updated.leading_lines)
        return cst.FlattenSentinel(inner)

    def _holds_wrapper(self, block: cst.CSTNode) -> bool:
        return any(self._contains(block, i) for i in self.plan.wrappers)

    @staticmethod
    def _contains(block: cst.CSTNode, wanted: int) -> bool:
        return any(id(n) == wanted for n in walk(block))


class KerasMultiGpuModel(Rule):
    """
    ## What it does
    Flags calls to Keras 2's `multi_gpu_model` (`keras.utils`, `keras.utils.training_utils`,
    `tf.keras.utils`, `tf.contrib.keras`) or to a user's copy of it (vendored, or a
    hand-written `make_parallel`), and converts the program to
    `tf.distribute.MirroredStrategy`; flags the copy's definition too.

    ## Why is this bad?
    `multi_gpu_model` was removed in TensorFlow 2.4 and does not exist in Keras 3. It copied the
    model onto each GPU, split every batch, ran the template on each slice and concatenated the
    outputs on the CPU; the loss was then computed once over the concatenated (global) batch.
    Its replacement is `tf.distribute.MirroredStrategy`: build *and compile* the template model
    inside `strategy.scope()`, then call `fit` on that one model with the same global
    `batch_size` (Keras splits each batch across the replicas and divides each replica's loss
    by the number of replicas). Callbacks such as `ModelCheckpoint`, `save` and `load_weights`
    then work on that model directly — no more saving the template instead of the wrapper.

    Measured on 2 logical CPUs (tests/test_keras2_conversion.py, seeded: the migrated fixture
    against multi_gpu_model's computation rebuilt on one device from the same weights and
    batches; UNet with batch norm, SGD 0.1, 2 steps). With a loss that is a mean over samples
    (`binary_crossentropy`) the conversion is exact: per-step losses 0.913705 and 0.786087 in
    both (difference below 2e-7), trainable weights within 1.3e-7; batch norm normalizes each
    replica's sub-batch as it normalized each GPU's slice (one device on the whole batch ends
    0.04 away). A loss that reduces the whole batch to a scalar (the fixture's dice loss)
    would be computed per replica, and Keras 3 does not divide a scalar loss by the number of
    replicas (`reduce_values` returns scalars untouched), so the gradient would be the *sum* of
    the replicas' gradients: logged loss 1.0444 against 0.5223, steps 1.45 times as large,
    weights 0.026 apart after 2 steps. So a custom loss function is computed on the global
    batch: `loss=global_batch_loss(dice_loss)`, a helper the fix writes into the file (see
    TFM207), gathers every replica's `y_true`/`y_pred` and evaluates the loss once on the
    whole batch, as the wrapper did; then the dice run matches too (same test), and `tfmigrate
    verify` finds the rewritten fixture (trained with SGD 0.01) equivalent to the Keras 2
    script: loss within 6e-8 over 4 steps, all 42 weights within 1.5e-8. With the fixture's
    Adam at 1e-3 the loss matches as well but 3 kernels end 1.2e-6 to 2.0e-6 apart: Adam's
    first step, lr * g / (|g| + 3.16e-6) (epsilon 1e-7 bias-corrected), magnifies the ~3.5e-9
    float differences of near-zero gradient entries about 316 times, and on near-zero weights
    that exceeds atol 1e-6 (with epsilon 1e-3 verify finds it equivalent, weights within
    1.2e-7; with `--weights-atol 3e-6` too). The legacy script against itself with its dice
    sums reordered ends 5.7e-7 apart the same way: float order, not the migration. Batch-norm moving statistics end 0.04 apart in every case: the rebuilt wrapper
    updates them once per slice, the migrated model keeps replica 0's.

    Two differences no Keras 3 setting removes are announced to verify in the manifest: random
    layers (`Dropout`, `GaussianNoise`, ...: Keras 3 draws other random numbers, so the logged
    loss differs from the first step), and an `RMSprop` without momentum (Keras 2 stepped
    `lr * g / (sqrt(ms) + epsilon)`, Keras 3 steps `lr * g / sqrt(ms + epsilon)`). Measured
    with `tfmigrate verify` on a Keras 2 classifier (conv, dense, RMSprop lr 1e-3, 2 replicas,
    4 steps): without dropout the loss is equal at step 1 and 2.3e-3 apart at step 2, weights
    up to 6.1e-3 apart; the same script with SGD is equivalent (weights within 3e-8).

    ## Example
    ```python
    with tf.device('/cpu:0'):
        model = build_model()
    parallel_model = multi_gpu_model(model, gpus=2)
    parallel_model.compile(optimizer='adam', loss='mse')
    parallel_model.fit(x, y, batch_size=64)
    ```
    Use instead:
    ```python
    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = build_model()
        model.compile(optimizer='adam', loss='mse')
    model.fit(x, y, batch_size=64)
    ```

    ## Fix safety
    The fix moves the template's construction (without its `tf.device('/cpu:0')` wrapper), the
    statements up to the `compile` and the optimizer it uses into one
    `with strategy.scope():`, deletes the `multi_gpu_model` line and points every later use of
    the wrapper (`fit`, `compile`, `save`, `evaluate`, `predict`, callbacks) at the template.
    `fit(batch_size=...)` is kept: it was already the global batch. Safe when `compile` is given
    a built-in loss that averages over samples (`'mse'`, `'binary_crossentropy'`,
    `keras.losses.*`), or loss functions named by a name (`dice_loss`, `losses.dice`), which
    are wrapped in `global_batch_loss(...)` (defined in the file by the fix) so that they see
    the whole batch; unsafe when such a loss meets `sample_weight`/`class_weight` in `fit` (a
    scalar loss is then weighted per replica) and for any other loss (a loss object such as
    `DiceLoss()`: the per-replica loss may differ from the whole-batch loss). `MirroredStrategy()`
    uses every visible GPU: batch statistics per slice stay the same only with as many GPUs
    as `gpus=` said. `if gpus > 1: p = multi_gpu_model(m) else: p = m` becomes the one
    strategy (on one device it is one replica, the else branch); so does Keras 2's fallback
    `try: p = multi_gpu_model(m) except: p = m` (or `pass`; `print` lines in it go too). The
    script keeps its own entry point (`tfmigrate verify` runs it as written), and the manifest
    entry of a script that trains with `fit` tells verify to match variables by name, to compare
    `loss`, and which differences to expect (batch-norm moving statistics; everything, for a
    loss left per replica).

    Real programs spell the wrapper other ways, converted too. A user's own copy of
    multi_gpu_model -- vendored (`from utils.multi_gpu_model import multi_gpu_model`) or
    hand-written (`make_parallel`): a function that loops over devices, calls the model it was
    given under `tf.device` on slices of the inputs (`Lambda`, `tf.slice`, `tf.split`) and
    concatenates the outputs into a returned `Model` -- is recognized by that shape, in the
    file or in a project module it imports (looked up from the script's folder and the folders
    above it); its callers convert as above and their import of it goes once nothing reads it
    (inside a branch too). Where it is defined, the def is deleted with the imports only it
    read when no file of the project calls it after the conversion (each file that imports
    it is converted by this rule alone to see what is left; the deletion is unsafe when one
    of those conversions is); one still called somewhere gets one
    `# TODO(tfmigrate): TFM107` at its def (the tower rules no longer report its loop as TF1
    towers). A wrapper of a template the program never defines (`make_parallel(tower, ...)`
    where no `tower` exists: a NameError when the legacy program runs) trains the one model
    its block built just before it, as an unsafe fix whose message names both. Wrappers made in branches
    (`if gpus > 1:` without `else`, `elif method == 'keras':`), in `try` fallbacks or
    `with` blocks, with the template built in branches under `tf.device` (`create_models`
    building the model with `batch_size // gpus` per GPU), convert as one
    `with strategy.scope():` over the statements of the function (or module) from the
    template's construction to the `compile`: each wrapper line becomes `parallel = template`
    (or goes when both are one name), `tf.device` blocks that build the template lose their
    device, a branch left equal to its `else` collapses, and a named loss over the whole batch
    is computed by `global_batch_loss` as above, with the same manifest entry.
    Not fixed (reported only): a wrapper made in a loop or a class body, a template that is a
    parameter of the function or not built before the wrapper, or no `compile` of the model
    after it.

    The converted `compile` keeps Keras' one training step per `tf.function` call. Several
    steps per call (`steps_per_execution=32`) would make a small model's `fit` faster (verify's
    own loop, which runs the steps without `fit`'s function, trained the keras2_fit tower
    fixture at 291 steps/s with 32 steps per call against 98 with one), but with Keras 3.15
    and TensorFlow 2.21 `fit` with `steps_per_execution` above 1 fails at its first
    step under a `MirroredStrategy` of two replicas (`InvalidArgumentError: You must feed a
    value for placeholder tensor`; one replica works; measured on 2 logical CPUs,
    tests/test_steps_per_execution_evidence.py). Where it works it would still change training
    unless the program's `fit` calls allow it: a `steps_per_epoch` that is not a multiple of N
    runs whole executions past it (6 steps an epoch became 8 with N=4), and per-batch callbacks
    (`TerminateOnNaN`, an integer `save_freq` or `update_freq`, a custom `Callback`) run once
    per N steps.
    """

    code = "TFM107"
    # Keras' own by name; a user's copy in a Keras program that compiles (may_report checks it)
    triggers = (
        "multi_gpu_model",
        ("keras*", "compile"),
        ("tensorflow.keras", "compile"),
        ("tensorflow.device", "oncat", "Model"),  # a copy's own module
    )
    name = "keras-multi-gpu-model"
    summary = "multi_gpu_model (removed in TF 2.4): use MirroredStrategy"
    fix_safety = FixSafety.UNSAFE

    valid = (
        """import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = build_model()
    model.compile(optimizer='adam', loss='mse')
""",
        # The user's own helper of the same name.
        """import keras
def multi_gpu_model(model, gpus):
    return model
parallel = multi_gpu_model(keras.models.Sequential(), gpus=2)
""",
        # Importing is not calling (the call, if any, is what gets flagged).
        "from keras.utils import multi_gpu_model\n",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            from keras.utils import multi_gpu_model

            x, y = load_data()
            # Weights on the CPU, one replica per GPU.
            with tf.device('/cpu:0'):
                model = build_model()
            parallel_model = multi_gpu_model(model, gpus=4)
            parallel_model.compile(optimizer='adam', loss='binary_crossentropy')
            parallel_model.fit(x, y, batch_size=256, callbacks=[checkpoint])
            model.save('model.keras')
            """,
            # A script: the wrapper goes, the template trains under the strategy.
            fixed="""
import tensorflow as tf
from keras.utils import multi_gpu_model

x, y = load_data()
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    # Weights on the CPU, one replica per GPU.
    model = build_model()
    model.compile(optimizer='adam', loss='binary_crossentropy')
model.fit(x, y, batch_size=256, callbacks=[checkpoint])
model.save('model.keras')
""",
            message="MirroredStrategy",
        ),
        # The wrapper reuses the template's name; the optimizer is built before; custom loss.
        Example(
            """
            import keras
            from keras.utils.training_utils import multi_gpu_model

            def train(x, y):
                model = build_model()
                opt = keras.optimizers.SGD(0.01)
                model = multi_gpu_model(model, 2)
                model.compile(opt, loss=dice_loss)
                return model.fit(x, y, batch_size=32)
            """,
            # The custom loss is computed on the global batch, as the wrapper computed it.
            fixed="import keras\nfrom keras.utils.training_utils import multi_gpu_model\n"
            "import tensorflow as tf\n\n"
            + global_batch.source()
            + """

def train(x, y):
    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = build_model()
        opt = keras.optimizers.SGD(0.01)
        model.compile(opt, loss=global_batch_loss(dice_loss))
    return model.fit(x, y, batch_size=32)
""",
            message="computed on the global batch by `global_batch_loss`",
        ),
        # The template built inside the call; a later function reads the global wrapper.
        Example(
            """
            import tensorflow as tf
            parallel = tf.keras.utils.multi_gpu_model(build_model(), gpus=2, cpu_merge=False)
            parallel.compile(optimizer='adam', loss=tf.keras.losses.MeanSquaredError())

            def evaluate(x, y):
                return parallel.evaluate(x, y)
            """,
            fixed="""
            import tensorflow as tf
            strategy = tf.distribute.MirroredStrategy()
            with strategy.scope():
                parallel = build_model()
                parallel.compile(optimizer='adam', loss=tf.keras.losses.MeanSquaredError())

            def evaluate(x, y):
                return parallel.evaluate(x, y)
            """,
        ),
        # A wrapper only with several GPUs: MirroredStrategy covers both branches.
        Example(
            """
            import tensorflow as tf

            def train(x, y, gpus):
                model = build_model()
                if gpus > 1:
                    parallel_model = tf.contrib.keras.utils.multi_gpu_model(model, gpus=gpus)
                else:
                    parallel_model = model
                parallel_model.compile('adam', loss='mse')
                parallel_model.fit(x, y, batch_size=64)
            """,
            fixed="""
            import tensorflow as tf

            def train(x, y, gpus):
                strategy = tf.distribute.MirroredStrategy()
                with strategy.scope():
                    model = build_model()
                    model.compile('adam', loss='mse')
                model.fit(x, y, batch_size=64)
            """,
        ),
        # Keras 2's single-GPU fallback as a `try`: the strategy covers both cases.
        Example(
            """
            from keras.utils import multi_gpu_model

            def train(x, y, gpus):
                model = build_model()
                try:
                    model = multi_gpu_model(model, gpus=gpus)
                except:
                    pass
                model.compile(optimizer='adam', loss='mse')
                model.fit(x, y, batch_size=64)
            """,
            fixed="""
            from keras.utils import multi_gpu_model
            import tensorflow as tf

            def train(x, y, gpus):
                strategy = tf.distribute.MirroredStrategy()
                with strategy.scope():
                    model = build_model()
                    model.compile(optimizer='adam', loss='mse')
                model.fit(x, y, batch_size=64)
            """,
        ),
        Example(
            """
            from keras.utils import multi_gpu_model

            def train(x, y):
                model = build_model()
                try:
                    parallel_model = multi_gpu_model(model, cpu_merge=False)
                    print("Training using multiple GPUs..")
                except ValueError:
                    parallel_model = model
                    print("Training using single GPU or CPU..")
                parallel_model.compile(loss='categorical_crossentropy', optimizer='adam')
                parallel_model.fit(x, y, batch_size=64)
                return model
            """,
            fixed="""
            from keras.utils import multi_gpu_model
            import tensorflow as tf

            def train(x, y):
                strategy = tf.distribute.MirroredStrategy()
                with strategy.scope():
                    model = build_model()
                    model.compile(loss='categorical_crossentropy', optimizer='adam')
                model.fit(x, y, batch_size=64)
                return model
            """,
        ),
        # A `try` that does more than fall back: a person decides.
        Example(
            """
            from keras.utils import multi_gpu_model
            def train(model):
                try:
                    parallel_model = multi_gpu_model(model, gpus=2)
                except ValueError:
                    parallel_model = build_smaller_model()
                parallel_model.compile('adam', 'mse')
            """,
            message="not fixed",
        ),
        # One wrapper per loop iteration: a person decides.
        Example(
            """
            from keras.utils import multi_gpu_model
            model = build_model()
            for gpus in (2, 4):
                parallel_model = multi_gpu_model(model, gpus=gpus)
                parallel_model.compile('adam', loss='mse')
            """,
            message="not fixed",
        ),
        # A hand-written copy (slices per device, the model under tf.device, concatenated):
        # a multi_gpu_model, converted the same way; the copy goes once nothing calls it.
        Example(
            """
            import tensorflow as tf
            from keras.layers import Lambda, concatenate
            from keras.models import Model

            def make_parallel(model, gpu_count):
                outputs = []
                for i in range(gpu_count):
                    with tf.device('/gpu:%d' % i):
                        part = Lambda(lambda x: tf.split(x, gpu_count)[i])(model.inputs[0])
                        outputs.append(model(part))
                return Model(model.inputs, concatenate(outputs, axis=0))

            def train(x, y):
                model = build_model()
                model = make_parallel(model, 2)
                model.compile(optimizer='sgd', loss='mse')
                model.fit(x, y, batch_size=64)
            """,
            fixed="""
            import tensorflow as tf
            from keras.layers import Lambda, concatenate
            from keras.models import Model

            def train(x, y):
                strategy = tf.distribute.MirroredStrategy()
                with strategy.scope():
                    model = build_model()
                    model.compile(optimizer='sgd', loss='mse')
                model.fit(x, y, batch_size=64)
            """,
            message="a copy of Keras 2's multi_gpu_model",
        ),
        # The template built in branches (under tf.device), the wrapper behind a flag with no
        # else: one scope from the template's construction to the compile.
        Example(
            """
            import tensorflow as tf
            from keras.utils import multi_gpu_model

            def create_models(gpus, batch_size):
                if gpus > 1:
                    with tf.device('/cpu:0'):
                        model = build_model(batch_size // gpus)
                else:
                    model = build_model(batch_size)
                model.load_weights('backend.h5', by_name=True)
                if gpus > 1:
                    model = multi_gpu_model(model, gpus=gpus)
                model.compile(optimizer='adam', loss='mse')
                return model
            """,
            fixed="""
            import tensorflow as tf
            from keras.utils import multi_gpu_model

            def create_models(gpus, batch_size):
                strategy = tf.distribute.MirroredStrategy()
                with strategy.scope():
                    if gpus > 1:
                        model = build_model(batch_size // gpus)
                    else:
                        model = build_model(batch_size)
                    model.load_weights('backend.h5', by_name=True)
                    model.compile(optimizer='adam', loss='mse')
                return model
            """,
        ),
        # Behind a flag, a loss over the whole batch: computed on the global batch.
        Example(
            """
            import tensorflow as tf
            from keras.utils import multi_gpu_model

            def main(gpus):
                model = build_model()
                if gpus > 1:
                    model = multi_gpu_model(model, gpus=gpus)
                model.compile(optimizer='adam', loss=detection_loss)
                return model
            """,
            fixed="import tensorflow as tf\nfrom keras.utils import multi_gpu_model\n\n"
            + global_batch.source()
            + """

def main(gpus):
    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = build_model()
        model.compile(optimizer='adam', loss=global_batch_loss(detection_loss))
    return model
""",
            message="computed on the global batch",
        ),
        # Wrapped in one branch of several, the wrapper named apart: `parallel = template`.
        Example(
            """
            import tensorflow as tf
            from keras.utils import multi_gpu_model

            def train(x, y, gpus, method):
                if gpus > 1:
                    with tf.device('/cpu:0'):
                        serial = build_model()
                    if method == 'keras':
                        model = multi_gpu_model(serial, gpus=gpus)
                    elif method == 'custom':
                        model = custom_parallel(serial, gpus)
                else:
                    model = serial = build_model()
                model.compile(optimizer='sgd', loss='mse')
                model.fit(x, y, batch_size=64)
            """,
            fixed="""
            import tensorflow as tf
            from keras.utils import multi_gpu_model

            def train(x, y, gpus, method):
                strategy = tf.distribute.MirroredStrategy()
                with strategy.scope():
                    if gpus > 1:
                        serial = build_model()
                        if method == 'keras':
                            model = serial
                        elif method == 'custom':
                            model = custom_parallel(serial, gpus)
                    else:
                        model = serial = build_model()
                    model.compile(optimizer='sgd', loss='mse')
                model.fit(x, y, batch_size=64)
            """,
        ),
        # The template is a parameter: built somewhere else, outside any scope here.
        Example(
            """
            from tensorflow.python.keras.utils import multi_gpu_utils
            def wrap(model):
                parallel_model = multi_gpu_utils.multi_gpu_model(model, gpus=[0, 1])
                parallel_model.compile('adam', 'mse')
                return parallel_model
            """,
        ),
    )

    @classmethod
    def may_report(cls, path: PurePosixPath, facts: CodeFacts) -> bool:
        # Keras' own multi_gpu_model by name; a copy of it by its shape, here or imported.
        return "multi_gpu_model" in facts.words or parallel_copy.may_call_copy(
            path, facts.bindings, facts.words
        )

    def _copy_of(self, node: cst.Call) -> str | None:
        """Where the called function is defined when it is a user's copy of multi_gpu_model
        (this file, or a project module it imports); None for any other call."""
        if isinstance(node.func, cst.Name):
            local = self._local_import(node, node.func.value)
            if local is not None:  # `from pkg.kuza55 import make_parallel` in this branch
                return parallel_copy.imported_copy(self.context.path, local)
            copies = self.context.shared(
                "tfm107:copies",
                lambda: parallel_copy.local_copies(self.context.module, self.qualify),
            )
            if node.func.value in copies and node.func.value not in self.context.resolver.bindings:
                return "this file"
        return parallel_copy.imported_copy(self.context.path, self.call_name(node))

    def _local_import(self, node: cst.CSTNode, name: str) -> str | None:
        """The qualified name ``name`` gets from a `from ... import` earlier in the block of the
        statement holding ``node`` (inside a function or branch), else None."""
        statement = self.enclosing_statement(node)
        block = self.parent(statement)
        if not isinstance(block, cst.IndentedBlock):
            return None
        found = None
        for earlier in block.body:
            if earlier is statement:
                break
            small = _small(earlier)
            if (
                isinstance(small, cst.ImportFrom)
                and not small.relative
                and small.module is not None
                and isinstance(small.names, list | tuple)
            ):
                for alias in small.names:
                    bound = alias.asname.name if alias.asname else alias.name
                    if isinstance(bound, cst.Name) and bound.value == name:
                        found = f"{dotted(small.module)}.{dotted(alias.name)}"
        return found

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if self.parent(node) is not self.context.module:
            return
        copies = self.context.shared(
            "tfm107:copies", lambda: parallel_copy.local_copies(self.context.module, self.qualify)
        )
        if copies.get(node.name.value) is not node:
            return
        if self._delete_copy(node):
            return
        message = (
            f"`{node.name.value}` is a copy of Keras 2's multi_gpu_model: under MirroredStrategy, "
            "which its callers get instead (TFM107), Keras splits each batch over the replicas "
            "itself; delete it once nothing calls it"
        )
        todo = f"# TODO(tfmigrate): TFM107 {message}"
        if any(
            line.comment is not None and "TFM107" in line.comment.value
            for line in node.leading_lines
        ):
            self.report(node.name, message)
            return
        comment = cst.EmptyLine(comment=cst.Comment(todo))
        self.report(
            node.name,
            message,
            replacement=node.with_changes(leading_lines=[*node.leading_lines, comment]),
            target=node,
            safety=FixSafety.SAFE,
        )

    def _delete_copy(self, node: cst.FunctionDef) -> bool:
        """Report the deletion of the copy ``node`` when its callers elsewhere in the project
        are all converted (none reads it afterwards) and this module does not call it."""
        if copy_removal.simulating() or not self.context.path.name.endswith(".py"):
            return False
        name = node.name.value
        module = copy_removal.without_copy(self.context.module, name)
        if module is None:
            return False
        found = copy_removal.callers_left(Path(self.context.path), name, _CONVERT)
        if found is None:
            return False
        _, safety = found
        self.report(
            node.name,
            f"`{name}` is a copy of Keras 2's multi_gpu_model and nothing calls it once its "
            "callers build their model in a MirroredStrategy scope (TFM107): deleted, with the "
            "imports only it used",
            replacement=module,
            target=self.context.module,
            safety=safety,
        )
        return True

    def visit_Call(self, node: cst.Call) -> None:
        copy = None
        if self.call_name(node) not in MULTI_GPU_MODEL:
            copy = self._copy_of(node)
            if copy is None:
                return
        gpus = keyword(node, "gpus", 1)
        shown = f"gpus={self.context.module.code_for_node(gpus.value)}" if gpus else "..."
        called = "multi_gpu_model"
        if copy is not None:
            called = self.context.module.code_for_node(node.func)
        message = (
            f"`{called}(model, {shown})` was removed in TF 2.4: build and compile the "
            "template model inside `tf.distribute.MirroredStrategy().scope()`, train that model "
            "with the same global batch size in `fit`, and attach checkpoints to it"
        )
        if copy is not None:
            message = (
                f"`{called}(model, {shown})` is a copy of Keras 2's multi_gpu_model (defined "
                f"in {copy}: it slices each batch per device, runs the model on each slice under "
                "`tf.device` and concatenates the outputs): build and compile the template model "
                "inside `tf.distribute.MirroredStrategy().scope()` and train that model with the "
                "same global batch size in `fit`"
            )
        plan, reason = self._plan(node)
        if plan is None and reason not in _NOT_NESTED:
            nested, nested_reason = self._nested(node)
            if nested is not None:
                self._report_nested(node, message, nested)
                return
            reason = nested_reason or reason
        if plan is None:
            self.report(node, f"{message} (not fixed: {reason})")
            return
        safety, note = self._loss_safety(plan.compile_call)
        wrap = self._custom_losses(plan.compile_call) if safety is FixSafety.UNSAFE else None
        if wrap:
            safety, note = self._wrapped_safety(wrap)
        notes = [
            "TFM107: multi_gpu_model replaced by MirroredStrategy over every visible GPU; fit "
            "keeps the global batch size",
            f"TFM107: {note}",
        ]
        manifest: dict[str, object] = {
            "keras_multi_gpu_model": {"model": plan.template or plan.parallel, "notes": notes}
        }
        target: cst.CSTNode = plan.block
        replacement: cst.CSTNode = self._rewrite(plan)
        if calls_fit(self.context.module):  # verify runs the script as written: its fit
            manifest.update(self._verify_entry(plan, safety, note, notes, announce_loss=not wrap))
        if wrap:
            module = replacement if isinstance(replacement, cst.Module) else None
            if module is None:
                module = self.context.module.visit(_ReplaceNode(plan.block, replacement))
            target, replacement = (
                self.context.module,
                self._wrap_losses(module, {plan.parallel, plan.template}, wrap),
            )
        if copy is not None and isinstance(node.func, cst.Name):
            module = replacement if isinstance(replacement, cst.Module) else None
            if module is None:
                module = self.context.module.visit(_ReplaceNode(target, replacement))
            target, replacement = self.context.module, _drop_unused_copy(module, node.func.value)
        if isinstance(replacement, cst.Module) and tf_module(self) is None:
            # a whole-module replacement: the engine's import adder does not see it
            replacement = _with_tf_import(replacement)
        self.report(
            node,
            f"{message}; {note}",
            replacement=replacement,
            target=target,
            safety=safety,
            imports=tf_imports(self),
            manifest=manifest,
        )

    def _verify_entry(
        self,
        plan: _Plan | _Nested,
        safety: FixSafety,
        note: str,
        notes: list[str],
        announce_loss: bool = True,
    ) -> dict[str, object]:
        """What verify reads from the manifest for the converted program."""
        notes.append(
            "TFM107: weights keep their Keras 2 names (layer/weight), so verify matches the "
            "variables by name"
        )
        announced = [
            {
                "match": ["*/moving_mean", "*/moving_variance"],
                "code": "TFM107",
                "reason": "multi_gpu_model updated the template's batch-norm statistics once per "
                "GPU slice, one after another; Keras 3 updates each replica's copy from its own "
                "slice and keeps replica 0's",
            }
        ]
        if safety is FixSafety.UNSAFE and announce_loss:
            announced.append({"match": ["*"], "code": "TFM107", "reason": note})
        if self._random_layers():
            reason = (
                "the model has random layers (dropout, noise): Keras 3 draws other random "
                "numbers than Keras 2, so the runs differ from the first step"
            )
            notes.append(f"TFM107: {reason}")
            announced.append({"match": ["*"], "code": "TFM107", "reason": reason})
        if self._plain_rmsprop(plan):
            notes.append(f"TFM107: {RMSPROP_NOTE}")
            announced.append({"match": ["*"], "code": "TFM107", "reason": RMSPROP_NOTE})
        return {
            "variables": dict(SAME_NAMES),
            "fetches": {"loss": "loss"},
            "announced": announced,
            "notes": notes,
        }

    def _random_layers(self) -> bool:
        """Whether this file makes a Keras layer that draws random numbers in training (an
        imported but unused `Dropout` does not count)."""
        for node in tree.walk(self.context.module):
            if isinstance(node, cst.Call):
                name = self.qualify(node.func) or ""
                if name.startswith(_KERAS_LAYERS) and name.endswith(_RANDOM_LAYERS):
                    return True
        return False

    def _plain_rmsprop(self, plan: _Plan | _Nested) -> bool:
        """Whether the compile's optimizer is a Keras 2 RMSprop without momentum (given in the
        call, or a name bound to one in the same block)."""
        optimizer = keyword(plan.compile_call, "optimizer", 0)
        value = optimizer.value if optimizer is not None else None
        if isinstance(value, cst.Name):
            bound = [
                small.value
                for statement in plan.block.body
                if (small := _small(statement)) is not None
                and isinstance(small, cst.Assign)
                and any(dotted(t.target) == value.value for t in small.targets)
            ]
            value = bound[-1] if len(bound) == 1 else None
        if value is None:
            return False
        return plain_rmsprop(value, self.call_name(value) if isinstance(value, cst.Call) else None)

    # -- wrappers in branches, `try`s and `with` blocks ---------------------------------------
    def _owner(self, node: cst.CSTNode) -> cst.Module | cst.FunctionDef | None:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef):
                return ancestor
            if isinstance(ancestor, cst.ClassDef | cst.Lambda):
                return None
        return self.context.module

    def _wrapper_line(self, call: cst.Call) -> tuple[cst.SimpleStatementLine, str, str] | None:
        """(line, parallel, template) of `parallel = wrapper(template, ...)`, else None."""
        assign = self.parent(call)
        line = self.parent(assign) if assign is not None else None
        arg = keyword(call, "model", 0)
        if not (
            isinstance(assign, cst.Assign)
            and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)
            and isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
            and arg is not None
            and isinstance(arg.value, cst.Name)
        ):
            return None
        return line, assign.targets[0].target.value, arg.value.value

    def _is_wrapper(self, call: cst.Call) -> bool:
        return self.call_name(call) in MULTI_GPU_MODEL or self._copy_of(call) is not None

    def _nested(self, call: cst.Call) -> tuple[_Nested | None, str]:
        owner = self._owner(call)
        if owner is None:
            return None, "the wrapper is made in a class body or lambda"
        return self.context.shared(f"tfm107:nested:{id(owner)}", lambda: self._nested_plan(owner))

    def _nested_plan(self, owner: cst.Module | cst.FunctionDef) -> tuple[_Nested | None, str]:
        block = owner if isinstance(owner, cst.Module) else owner.body
        if not isinstance(block, cst.Module | cst.IndentedBlock):
            return None, "the wrapper is made in a one-line function"
        body = list(block.body)
        tops = {id(s): i for i, s in enumerate(body)}

        def top_index(node: cst.CSTNode) -> int:
            current: cst.CSTNode | None = node
            while current is not None and id(current) not in tops:
                current = self.parent(current)
            assert current is not None
            return tops[id(current)]

        wrappers: dict[int, tuple[str, str]] = {}
        at: list[int] = []
        copies: set[str] = set()
        stand_ins: dict[str, str] = {}
        for node in walk(block, into_defs=False):
            if not isinstance(node, cst.Call) or not self._is_wrapper(node):
                continue
            found = self._wrapper_line(node)
            if found is None:
                return None, "a wrapper is not a plain `name = multi_gpu_model(model, ...)` line"
            line, parallel, template = found
            if any(isinstance(a, cst.For | cst.While) for a in self._between(line, owner)):
                return None, "the wrapper is made inside a loop"
            stand_in = self._stand_in(line, template)
            if stand_in is not None:
                stand_ins[template] = stand_in
                template = stand_in
            wrappers[id(line)] = (parallel, template)
            at.append(top_index(line))
            if self.call_name(node) not in MULTI_GPU_MODEL and isinstance(node.func, cst.Name):
                copies.add(node.func.value)
        templates = {t for _, t in wrappers.values()}
        names = templates | {p for p, _ in wrappers.values()}
        compile_at, compile_call = -1, None
        for index in range(min(at), len(body)):
            for node in walk(body[index], into_defs=False):
                if (
                    isinstance(node, cst.Call)
                    and isinstance(node.func, cst.Attribute)
                    and node.func.attr.value == "compile"
                    and dotted(node.func.value) in names
                ):
                    compile_at, compile_call = index, node
                    break
            if compile_call is not None:
                break
        if compile_call is None:
            return None, "no `compile` of the model follows in the same function"
        if isinstance(owner, cst.FunctionDef) and templates & _local_names(owner) - _assigned(
            owner.body
        ):
            return None, "the template model is a parameter, built outside this function"
        first = min(at)
        skip = set(wrappers)
        for template in templates:
            built = [i for i in range(max(at) + 1) if template in _bound_except(body[i], skip)]
            if not built:
                return None, f"the template `{template}` is not built earlier in this function"
            first = min(first, built[-1])
        optimizer = keyword(compile_call, "optimizer", 0)
        if optimizer is not None and isinstance(optimizer.value, cst.Name):
            built = [
                i for i in range(compile_at + 1) if optimizer.value.value in bound_names(body[i])
            ]
            if built:
                first = min(first, built[-1])
        last = max(max(at), compile_at)
        return (
            _Nested(block, first, last, wrappers, templates, compile_call, copies, stand_ins),
            "",
        )

    def _stand_in(self, line: cst.CSTNode, template: str) -> str | None:
        """For a wrapper of a template the module never binds (a NameError when the legacy
        program runs): the one name its block assigns a model to before the wrapper, else
        None."""
        if (
            template in self.context.resolver.bindings
            or template in dir(builtins)
            or _bound_anywhere(self.context.module, template)
        ):
            return None
        block = self.parent(line)
        if not isinstance(block, cst.IndentedBlock | cst.Module):
            return None
        built = []
        for statement in block.body:
            if statement is line:
                break
            small = _small(statement)
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)
                and isinstance(small.value, cst.Call)
                and self._builds_model(small.value)
            ):
                built.append(small.targets[0].target.value)
        return built[0] if len(set(built)) == 1 else None

    def _builds_model(self, call: cst.Call) -> bool:
        """`Model(...)`/`Sequential(...)`, or a call of a function of this module that returns
        one (directly or through the name it assigns it to)."""
        name = self.call_name(call) or ""
        if name.endswith((".Model", ".Sequential")):
            return True
        if not isinstance(call.func, cst.Name):
            return False
        function = next(
            (
                s
                for s in self.context.module.body
                if isinstance(s, cst.FunctionDef) and s.name.value == call.func.value
            ),
            None,
        )
        if function is None:
            return False
        models = {
            t.target.value
            for node in walk(function.body, into_defs=False)
            if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call)
            and (self.call_name(node.value) or "").endswith((".Model", ".Sequential"))
            for t in node.targets
            if isinstance(t.target, cst.Name)
        }  # fmt: skip
        for node in walk(function.body, into_defs=False):
            if isinstance(node, cst.Return) and node.value is not None:
                value = node.value
                if isinstance(value, cst.Name) and value.value in models:
                    return True
                if isinstance(value, cst.Call) and (self.call_name(value) or "").endswith(
                    (".Model", ".Sequential")
                ):
                    return True
        return False

    def _between(self, node: cst.CSTNode, owner: cst.CSTNode) -> list[cst.CSTNode]:
        found = []
        for ancestor in self.ancestors(node):
            if ancestor is owner:
                break
            found.append(ancestor)
        return found

    def _report_nested(self, node: cst.Call, message: str, plan: _Nested) -> None:
        safety, note = self._loss_safety(plan.compile_call)
        wrap = self._custom_losses(plan.compile_call) if safety is FixSafety.UNSAFE else None
        if wrap:
            safety, note = self._wrapped_safety(wrap)
        for missing, model in sorted(plan.stand_ins.items()):
            # a legacy bug fixed: only on request
            safety = FixSafety.UNSAFE
            note += (
                f"; the legacy call passes `{missing}`, which the program never defines (a "
                f"NameError when it runs): the model built just before it, `{model}`, is the "
                "one trained"
            )
        notes = [
            "TFM107: multi_gpu_model replaced by MirroredStrategy over every visible GPU; fit "
            "keeps the global batch size",
            f"TFM107: {note}",
        ]
        manifest: dict[str, object] = {
            "keras_multi_gpu_model": {"model": sorted(plan.templates)[0], "notes": notes}
        }
        # what verify reads: weights keep their Keras 2 names, the loss is fit's
        entry = self._verify_entry(plan, safety, note, notes, announce_loss=not wrap)
        notes.append(
            "TFM107: weights keep their Keras 2 names (layer/weight), so variables are matched "
            "by name"
        )
        manifest.update(entry)
        replacement = self.context.shared(
            f"tfm107:nested-fix:{id(plan)}", lambda: self._rewrite_nested(plan, wrap or [])
        )
        self.report(
            node,
            f"{message}; {note}",
            replacement=replacement,
            target=self.context.module,
            safety=safety,
            imports=tf_imports(self),
            manifest=manifest,
        )

    def _rewrite_nested(self, plan: _Nested, losses: list[cst.BaseExpression]) -> cst.Module:
        tf = tf_module(self) or "tf"
        strategy = "strategy"
        while strategy in self.context.resolver.bindings or _binds(self.context.module, strategy):
            strategy = "mirrored_" + strategy
        body = list(plan.block.body)
        holder = cst.IndentedBlock(body=body[plan.first : plan.last + 1])
        unwrapped = holder.visit(_Unwrap(self, plan))
        assert isinstance(unwrapped, cst.IndentedBlock)
        # (every statement is one of the two kinds; the filter tells the type checker)
        kinds = (cst.SimpleStatementLine, cst.BaseCompoundStatement)
        moved = [s for s in unwrapped.body if isinstance(s, kinds)]
        moved = [s.with_changes(leading_lines=unindented(s.leading_lines)) for s in moved]
        # Blank lines before the block stay before it; comments move in with the statements.
        opening = list(moved[0].leading_lines)
        blank = []
        for line in opening:
            if line.comment is not None:
                break
            blank.append(line)
        moved[0] = moved[0].with_changes(leading_lines=opening[len(blank) :])
        create = cst.parse_statement(f"{strategy} = {tf}.distribute.MirroredStrategy()\n")
        create = create.with_changes(leading_lines=blank)
        scope = cst.With(
            items=[cst.WithItem(cst.parse_expression(f"{strategy}.scope()"))],
            body=cst.IndentedBlock(body=moved),
        )
        new_body = [*body[: plan.first], create, scope, *body[plan.last + 1 :]]
        block = plan.block.with_changes(body=new_body)
        module = self.context.module
        if isinstance(block, cst.Module):
            module = block
        else:
            module = module.visit(_ReplaceNode(plan.block, block))
        for name in sorted(plan.copies):
            module = _drop_unused_copy(module, name)
        if losses:  # a loss over the whole batch sees the global batch, as the wrapper's did
            names = plan.templates | {p for p, _ in plan.wrappers.values()}
            module = self._wrap_losses(module, set(names), losses)
        if tf_module(self) is None:
            module = _with_tf_import(module)
        return module

    # -- analysis -----------------------------------------------------------------------------
    def _plan(self, call: cst.Call) -> tuple[_Plan | None, str]:
        assign = self.parent(call)
        line = self.parent(assign) if assign is not None else None
        block = self.parent(line) if line is not None else None
        if not (
            isinstance(assign, cst.Assign)
            and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)
            and isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
            and isinstance(block, cst.Module | cst.IndentedBlock)
        ):
            return None, "the wrapper is not a plain `name = multi_gpu_model(...)` statement"
        parallel = assign.targets[0].target.value
        arg = keyword(call, "model", 0)
        if arg is None:
            return None, "no template model argument"
        template = dotted(arg.value)
        wrappers = 1
        branch = self._single_device_branch(block, parallel, template)
        if branch is not None:
            # `if gpus > 1: p = multi_gpu_model(m) else: p = m`: MirroredStrategy over one
            # device is that else branch, so the whole `if` goes.
            line, block, wrappers = branch, self.parent(branch), 2
        fallback = self._single_device_try(block, line, parallel, template)
        if fallback is not None:
            # `try: p = multi_gpu_model(m) except: p = m` (or `pass`): the same, as a `try`.
            statement, wrappers = fallback
            line, block = statement, self.parent(statement)
        owner = block if isinstance(block, cst.Module) or block is None else self.parent(block)
        if not isinstance(block, cst.Module | cst.IndentedBlock) or not isinstance(
            owner, cst.Module | cst.FunctionDef
        ):
            return None, "the wrapper is made inside a branch, loop or `try`"
        body = list(block.body)
        index = body.index(line)
        first = index
        if template is not None:
            if "." in template:
                return None, f"the template `{template}` is an attribute"
            found = self._template_binding(body[:index], template)
            if found is None:
                return None, f"the template `{template}` is not built earlier in the same block"
            first = found
            allowed = 2 if template == parallel else 1
            if _binds(owner, template) != allowed:
                return None, f"`{template}` is assigned more than once"
        elif _binds(owner, parallel) != wrappers:
            return None, f"`{parallel}` is assigned more than once"
        if template != parallel and _binds(owner, parallel) != wrappers:
            return None, f"`{parallel}` is assigned more than once"
        compile_at, compile_call = self._compile(body, index, {parallel, template})
        if compile_call is None:
            return None, f"no `{parallel}.compile(...)` follows in the same block"
        last = max(index, compile_at)
        optimizer = keyword(compile_call, "optimizer", 0)
        if optimizer is not None and isinstance(optimizer.value, cst.Name):
            found = self._template_binding(body[:last], optimizer.value.value, devices=False)
            if found is not None:
                first = min(first, found)
        return (
            _Plan(block, first, last, line, parallel, template, arg.value, compile_call),
            "",
        )

    def _single_device_branch(
        self, block: cst.CSTNode | None, parallel: str, template: str | None
    ) -> cst.If | None:
        """The `if` whose one branch is the wrapper line and whose other is `parallel =
        template`, when ``block`` is one of its branches."""
        if template is None or template == parallel or not isinstance(block, cst.IndentedBlock):
            return None
        holder = self.parent(block)
        statement = self.parent(holder) if isinstance(holder, cst.Else) else holder
        if not isinstance(statement, cst.If) or not isinstance(statement.orelse, cst.Else):
            return None
        other = statement.orelse.body if holder is statement else statement.body
        if len(block.body) != 1 or not isinstance(other, cst.IndentedBlock):
            return None
        if len(other.body) != 1 or not isinstance(other.body[0], cst.SimpleStatementLine):
            return None
        small = other.body[0].body
        if not (
            len(small) == 1
            and isinstance(small[0], cst.Assign)
            and len(small[0].targets) == 1
            and dotted(small[0].targets[0].target) == parallel
            and dotted(small[0].value) == template
        ):
            return None
        return statement

    def _single_device_try(
        self, block: cst.CSTNode | None, line: cst.CSTNode, parallel: str, template: str | None
    ) -> tuple[cst.Try, int] | None:
        """The `try` whose body is the wrapper line (and prints) and whose handlers fall back to
        the template (`pass`, `parallel = template`, prints), with how often it binds
        ``parallel``; None for any other shape."""
        statement = self.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if template is None or not isinstance(statement, cst.Try) or statement.body is not block:
            return None
        if statement.orelse is not None or statement.finalbody is not None:
            return None
        if not all(s is line or _is_call_line(s) for s in block.body):
            return None
        binds = 1
        for handler in statement.handlers:
            for item in handler.body.body:
                if _is_call_line(item) or _is_pass(item):
                    continue
                if _is_assign(item, parallel, template):
                    binds = 2 if parallel != template else binds
                    continue
                return None
        return statement, binds

    def _template_binding(
        self, statements: list[cst.BaseStatement], name: str, devices: bool = True
    ) -> int | None:
        """Index of the last statement binding ``name`` (inside a `tf.device` block counts)."""
        for position in range(len(statements) - 1, -1, -1):
            statement = statements[position]
            device = self._device_block(statement) if devices else None
            if device is not None:
                if any(self._assigns(s, name) for s in _statements(device.body)):
                    return position
            elif self._assigns(statement, name):
                return position
        return None

    def _assigns(self, statement: cst.CSTNode, name: str) -> bool:
        if not isinstance(statement, cst.SimpleStatementLine):
            return False
        return any(
            isinstance(small, cst.Assign)
            and any(
                isinstance(n, cst.Name) and n.value == name
                for t in small.targets
                for n in _targets(t.target)
            )
            for small in statement.body
        )

    def _device_block(self, statement: cst.CSTNode) -> cst.With | None:
        """A `with tf.device(...):` statement (only device items), else None."""
        if not isinstance(statement, cst.With) or not isinstance(statement.body, cst.IndentedBlock):
            return None
        for item in statement.items:
            if item.asname is not None or not isinstance(item.item, cst.Call):
                return None
            if not (self.call_name(item.item) or "").endswith(".device"):
                return None
        return statement

    def _compile(
        self, body: list[cst.BaseStatement], index: int, names: set[str | None]
    ) -> tuple[int, cst.Call | None]:
        for position in range(index + 1, len(body)):
            statement = body[position]
            if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
                continue
            small = statement.body[0]
            call = small.value if isinstance(small, cst.Expr) else None
            if (
                isinstance(call, cst.Call)
                and isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "compile"
                and dotted(call.func.value) in names
            ):
                return position, call
        return -1, None

    def _loss_safety(self, compile_call: cst.Call) -> tuple[FixSafety, str]:
        loss = keyword(compile_call, "loss", 1)
        if loss is not None:
            values = (
                [e.value for e in loss.value.elements]
                if isinstance(loss.value, cst.List | cst.Tuple)
                else [loss.value]
            )
            if all(self._per_sample(v) for v in values):
                return FixSafety.SAFE, (
                    "the loss is a mean over samples, so the replica-averaged loss equals the "
                    "loss of the whole batch; batch normalization sees each replica's "
                    "sub-batch as it saw each GPU's slice"
                )
        shown = self.context.module.code_for_node(loss.value) if loss is not None else "none"
        return FixSafety.UNSAFE, (
            f"the loss `{shown}` may reduce over the whole batch: Keras computes it on each "
            "replica's sub-batch, where multi_gpu_model computed it once on the concatenated "
            "batch (equal only for a mean over samples), and a loss that returns a scalar is "
            "not divided by the replica count (the gradient is summed over replicas)"
        )

    def _custom_losses(self, compile_call: cst.Call) -> list[cst.BaseExpression] | None:
        """The loss functions (names) to compute on the global batch, when every loss that is
        not a built-in per-sample one is such a name; else None."""
        loss = keyword(compile_call, "loss", 1)
        if loss is None:
            return None
        values = (
            [e.value for e in loss.value.elements]
            if isinstance(loss.value, cst.List | cst.Tuple)
            else [loss.value]
        )
        custom = [v for v in values if not self._per_sample(v)]
        if not custom or not all(isinstance(v, cst.Name | cst.Attribute) for v in custom):
            return None
        return custom

    def _wrapped_safety(self, losses: list[cst.BaseExpression]) -> tuple[FixSafety, str]:
        shown = ", ".join(f"`{self.context.module.code_for_node(v)}`" for v in losses)
        note = (
            f"the loss {shown} is computed on the global batch by `{global_batch.HELPER}` "
            "(every replica's rows gathered), as multi_gpu_model computed it once on the "
            "concatenated batch"
        )
        weighted = any(
            keyword(c, k) is not None
            for c in _calls(self.context.module)
            if isinstance(c.func, cst.Attribute) and c.func.attr.value in FIT_METHODS
            for k in ("sample_weight", "class_weight")
        )
        if weighted:
            return FixSafety.UNSAFE, note + (
                "; with sample or class weights a whole-batch (scalar) loss is weighted per "
                "replica, which differs"
            )
        return FixSafety.SAFE, note

    def _wrap_losses(
        self, module: cst.Module, owners: set[str | None], losses: list[cst.BaseExpression]
    ) -> cst.Module:
        """``module`` with the custom losses of the compiles of ``owners`` (the model names)
        wrapped and the helper defined."""

        class Wrap(cst.CSTTransformer):
            def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
                if not (
                    isinstance(updated.func, cst.Attribute)
                    and updated.func.attr.value == "compile"
                    and dotted(updated.func.value) in owners
                ):
                    return updated
                return _wrap_compile(updated, losses)

        wrapped = module.visit(Wrap())
        if global_batch.defines_helper(wrapped):
            return wrapped
        at = global_batch.first_code_index(wrapped)
        tf = tf_module(self) or "tf"
        return wrapped.with_changes(body=global_batch.insert_helper(list(wrapped.body), at, tf))

    def _per_sample(self, node: cst.BaseExpression) -> bool:
        if isinstance(node, cst.SimpleString):
            return str(node.evaluated_value) in PER_SAMPLE_LOSSES
        target = node.func if isinstance(node, cst.Call) else node
        name = self.qualify(target) or ""
        return name.startswith(_KERAS_LOSSES)

    # -- the rewrite --------------------------------------------------------------------------
    def _rewrite(self, plan: _Plan) -> cst.Module | cst.IndentedBlock:
        tf = tf_module(self) or "tf"
        strategy = "strategy"
        while strategy in self.context.resolver.bindings or _binds(self.context.module, strategy):
            strategy = "mirrored_" + strategy
        body = _statements(plan.block)
        moved: list[_Statement] = []
        carried: list[cst.EmptyLine] = []  # comments of removed statements
        for statement in body[plan.first : plan.last + 1]:
            if statement is plan.wrapper:
                if plan.template is None:
                    assign = cst.Assign(
                        targets=[cst.AssignTarget(cst.Name(plan.parallel))],
                        value=plan.template_expr,
                    )
                    moved.append(statement.with_changes(body=[assign]))
                else:
                    carried.extend(statement.leading_lines)
                continue
            device = self._device_block(statement)
            inner = _statements(device.body) if device is not None else [statement]
            if device is not None:
                carried.extend(device.leading_lines)
            for item in inner:
                if carried:
                    lines = [*unindented(carried), *item.leading_lines]
                    item = item.with_changes(leading_lines=lines)
                    carried = []
                moved.append(item)
        if carried and plan.last + 1 < len(body):
            after = body[plan.last + 1]
            body[plan.last + 1] = after.with_changes(leading_lines=[*carried, *after.leading_lines])
        head = moved[0]
        opening = list(body[plan.first].leading_lines)
        if body[plan.first] is not head and self._device_block(body[plan.first]) is None:
            opening = []
        # Blank lines before the block stay before it; comments move in with the statements.
        blank = []
        for line in opening:
            if line.comment is not None:
                break
            blank.append(line)
        moved[0] = head.with_changes(leading_lines=list(head.leading_lines)[len(blank) :])
        create = cst.parse_statement(f"{strategy} = {tf}.distribute.MirroredStrategy()\n")
        create = create.with_changes(leading_lines=blank)
        scope = cst.With(
            items=[cst.WithItem(cst.parse_expression(f"{strategy}.scope()"))],
            body=cst.IndentedBlock(body=moved),
        )
        new_body = [*body[: plan.first], create, scope, *body[plan.last + 1 :]]
        block = plan.block.with_changes(body=new_body)
        if plan.template is not None and plan.template != plan.parallel:
            redirected = block.visit(_Redirect(plan.parallel, plan.template))
            assert isinstance(redirected, cst.Module | cst.IndentedBlock)
            block = redirected
        return block


class _ConvertCaller(copy_removal.ConvertOne):
    """A caller of a copy converted by this rule alone, unsafe fixes included: its new text
    (None on an error) and whether an unsafe fix of this rule was applied."""

    def __call__(self, path: Path, text: str) -> tuple[str | None, bool]:
        from tfmigrate.engine import Settings, process_source  # the engine imports the rules

        settings = Settings(rules=(KerasMultiGpuModel,), fix=True, unsafe_fixes=True)
        result = process_source(text, str(path), settings)
        if result.error is not None:
            return None, False
        unsafe = any(
            f.applied and f.code == KerasMultiGpuModel.code and f.safety is FixSafety.UNSAFE
            for f in result.findings
        )
        return (result.new_code if result.new_code is not None else text), unsafe


_CONVERT = _ConvertCaller()
