from __future__ import annotations

import ast
import re
from pathlib import PurePosixPath

import libcst as cst

from tfmigrate.prefilter import AST_DEFS, CodeFacts, Trigger
from tfmigrate.rule import Example, FixSafety
from tfmigrate.rules._towers import TowerRule, get_arg, walk

_SETTERS = {
    "tensorflow.train.replica_device_setter": "replica_device_setter",
    "tensorflow.contrib.framework.VariableDeviceChooser": "VariableDeviceChooser",
    "tensorflow.contrib.slim.VariableDeviceChooser": "VariableDeviceChooser",
}
# Op types of variables in TF1 graphs: what a PS_OPS list names.
_VARIABLE_OPS = frozenset(
    {"Variable", "VariableV2", "AutoReloadVariable", "VarHandleOp", "MutableHashTable"}
)
_VARIABLE_FACTORIES = frozenset(
    {
        "tensorflow.get_variable",
        "tensorflow.Variable",
        "tensorflow.contrib.framework.variable",
        "tensorflow.contrib.framework.model_variable",
        "tensorflow.contrib.slim.variable",
        "tensorflow.contrib.slim.model_variable",
    }
)
_HOST_DEVICE = re.compile(r"cpu|/job:ps|ps_device|ps", re.I)
# What reports by name: a setter, or a variable factory (pinned under `with tf.device(...)`).
_NAMED: tuple[Trigger, ...] = (
    *_SETTERS,
    *(("tensorflow.device", factory) for factory in sorted(_VARIABLE_FACTORIES)),
)


def _lists_variable_ops(node: ast.AST) -> bool:
    """A list, tuple or set literal with a variable op's name among its items."""
    return isinstance(node, ast.List | ast.Tuple | ast.Set) and any(
        type(item) is ast.Constant and item.value in _VARIABLE_OPS for item in node.elts
    )


class ParameterServerPlacement(TowerRule):
    """
    ## What it does
    Flags TF1 variable placement that keeps the parameters away from the towers:
    `tf.train.replica_device_setter(...)` and `VariableDeviceChooser`, "PS_OPS" device
    functions that look at `op.type` (or `op.node_def.op`) and send variable ops to the CPU or
    a parameter server while everything else goes to the tower's GPU, and variable factories
    that wrap `tf.get_variable` in `tf.device('/cpu:0')` (cifar10's `_variable_on_cpu`).

    ## Why is this bad?
    The towers read one shared copy of each variable from the host (or a PS task) and the
    averaged update is applied there. TF2 has no device functions: `MirroredStrategy` keeps a
    mirrored copy of every variable on every GPU and all-reduces the gradients, and
    `ParameterServerStrategy` is a different, multi-worker program. The numbers stay the same
    (one update applied to identical copies), but the placement code must go: a device function
    or `/cpu:0` pin left inside a strategy scope fights the strategy's placement.

    ## Example
    ```python
    PS_OPS = ['Variable', 'VariableV2', 'AutoReloadVariable']

    def assign_to_device(device, ps_device='/cpu:0'):
        def _assign(op):
            node_def = op if isinstance(op, tf.NodeDef) else op.node_def
            return ps_device if node_def.op in PS_OPS else device
        return _assign

    with tf.device(assign_to_device('/gpu:%d' % i)):
        ...
    ```
    Use instead: create the model under `tf.distribute.MirroredStrategy().scope()` and drop the
    device function.

    ## Fix safety
    Manual: the placement goes away with the tower loop in the whole-script conversion.
    """

    code = "TFM111"
    # A setter, a factory under tf.device, or a comparison with a string naming a variable op.
    triggers = (*_NAMED, *(f"'{op}'" for op in sorted(_VARIABLE_OPS)))
    name = "parameter-server-placement"
    summary = "variables pinned to the CPU or a parameter server by hand"
    fix_safety = FixSafety.MANUAL

    valid = (
        # Checks variable op types but places nothing (no device returned).
        """import tensorflow as tf
def _verify(self):
    for op in self.ops:
        if op.type in ['Variable', 'VariableV2']:
            raise ValueError('no variables here')
""",
        # A device function that places nothing by op type.
        """import tensorflow as tf
def pick(op):
    return '/gpu:0'
with tf.device(pick):
    y = f(x)
""",
        # Checks op types, but not variable ones.
        """import tensorflow as tf
def on_gpu(op):
    if op.type in ['MatMul', 'Conv2D']:
        return '/gpu:0'
    return '/cpu:0'
""",
        # Input pipeline on the CPU is ordinary.
        """import tensorflow as tf
with tf.device('/cpu:0'):
    images, labels = inputs()
""",
        # A variable created on the CPU but no factory returning it.
        """import tensorflow as tf
def train():
    with tf.Graph().as_default(), tf.device('/cpu:0'):
        global_step = tf.get_variable('global_step', [], trainable=False)
        run(global_step)
""",
        # Not TensorFlow's replica_device_setter.
        """import tensorflow as tf
from mycluster import replica_device_setter
setter = replica_device_setter(2)
""",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            with tf.device(tf.train.replica_device_setter(worker_device='/gpu:%d' % i,
                                                          ps_device='/cpu:0', ps_tasks=1)):
                loss = tower_loss(i)
            """,
            message="replica_device_setter",
        ),
        Example(
            """
            import tensorflow as tf
            PS_OPS = ['Variable', 'VariableV2', 'AutoReloadVariable']

            def assign_to_device(device, ps_device='/cpu:0'):
                def _assign(op):
                    node_def = op if isinstance(op, tf.NodeDef) else op.node_def
                    if node_def.op in PS_OPS:
                        return '/' + ps_device
                    else:
                        return device
                return _assign
            """,
            message="`assign_to_device`",
        ),
        Example(
            """
            import tensorflow as tf
            def variables_on_cpu(op):
                if op.type in ('Variable', 'VariableV2', 'VarHandleOp'):
                    return '/cpu:0'
                return '/gpu:%d' % FLAGS.gpu
            """,
            message="`variables_on_cpu`",
        ),
        Example(
            """
            import tensorflow as tf
            def _variable_on_cpu(name, shape, initializer):
                with tf.device('/cpu:0'):
                    var = tf.get_variable(name, shape, initializer=initializer)
                return var
            """,
            message="/cpu:0",
        ),
        Example(
            """
            import tensorflow.compat.v1 as tf
            slim = tf.contrib.slim
            chooser = slim.VariableDeviceChooser(num_tasks=2, device_type='CPU')
            """,
        ),
        # The op list is a module constant defined after the device function.
        Example(
            """
            import tensorflow as tf
            def pin_variables(op):
                if op.type in VARIABLE_OPS:
                    return '/cpu:0'
                return '/gpu:0'
            VARIABLE_OPS = {'VariableV2', 'VarHandleOp'}
            """,
            message="`pin_variables`",
        ),
    )

    @classmethod
    def may_report(cls, path: PurePosixPath, facts: CodeFacts) -> bool:
        """A variable op's name counts only in an ``in`` test against a literal list holding
        one (or a name, while some literal holds one) in a function that returns a device
        (``visit_Comparison``): TF's own sources spell op names everywhere else."""
        if any(facts.matches(trigger) for trigger in _NAMED):
            return True
        bound: set[str] = set()  # names assigned such a literal (``PS_OPS = [...]``)
        named: list[tuple[str, ast.Compare]] = []
        for node in facts.nodes:
            if type(node) is ast.Compare:
                for op, right in zip(node.ops, node.comparators, strict=True):
                    if type(op) is not ast.In:
                        continue
                    if _lists_variable_ops(right):
                        if _in_device_function(node, facts):
                            return True
                    elif type(right) is ast.Name:
                        named.append((right.id, node))
            elif type(node) is ast.Assign and _lists_variable_ops(node.value):
                for target in node.targets:
                    bound.update(n.id for n in ast.walk(target) if type(n) is ast.Name)
            elif type(node) is ast.withitem and _lists_variable_ops(node.context_expr):
                bound.update(n.id for n in ast.walk(node) if type(n) is ast.Name)
        return any(name in bound and _in_device_function(node, facts) for name, node in named)

    def __init__(self, context) -> None:
        super().__init__(context)
        self._reported: set[int] = set()

    def on_call(self, node: cst.Call) -> None:
        name = self.call_name(node)
        if name in _VARIABLE_FACTORIES:
            self._check_pinned_factory(node)
            return
        label = _SETTERS.get(name or "")
        if label is None:
            return
        ps = get_arg(node, None, "ps_device") or get_arg(node, None, "cluster")
        where = f" (parameters on `{self.src(ps, 30)}`)" if ps is not None else ""
        self.report(
            node,
            f"`{label}` places the variables on a parameter server{where}, the compute on the "
            "towers. TF2: MirroredStrategy mirrors variables on every GPU; drop the device "
            "function (ParameterServerStrategy is a multi-worker rewrite)",
        )

    # -- PS_OPS device functions --------------------------------------------------------------
    def visit_Comparison(self, node: cst.Comparison) -> None:
        """``op.type in PS_OPS`` (or a literal list of variable op types) in a function."""
        if not any(
            isinstance(t.operator, cst.In) and self._names_variable_ops(t.comparator)
            for t in node.comparisons
        ):
            return
        function = self.enclosing_def(node)
        if function is None or not _returns_device(function):
            return  # e.g. a check that variables were given, not a placement function
        anchor = self._factory_of(function) or function
        self._report_once(
            anchor,
            f"`{anchor.name.value}` is a PS_OPS-style device function: variable ops go to "
            "the CPU/parameter server, everything else to the tower's device. TF2: "
            "MirroredStrategy mirrors variables on every GPU; drop the device function",
        )

    def _report_once(self, node: cst.FunctionDef, message: str) -> None:
        if id(node) not in self._reported:
            self._reported.add(id(node))
            self.report(node, message)

    def _names_variable_ops(self, node: cst.BaseExpression) -> bool:
        if isinstance(node, cst.Name):
            binding = self.last_binding_before(node.value, node)
            if binding is None:
                # A module-level constant defined after the function.
                for found, value in self.bindings(node.value, self.context.module):
                    binding = (found, value)
            if binding is None or not isinstance(binding[1], cst.BaseExpression):
                return False
            node = binding[1]
        if not isinstance(node, cst.List | cst.Tuple | cst.Set):
            return False
        values = {
            e.value.evaluated_value for e in node.elements if isinstance(e.value, cst.SimpleString)
        }
        return bool(values & _VARIABLE_OPS)

    def _factory_of(self, function: cst.FunctionDef) -> cst.FunctionDef | None:
        """``def assign_to_device(...): def _assign(op): ...; return _assign``: report the
        factory users call, not the closure."""
        outer = self.enclosing_def(function)
        if outer is None:
            return None
        for node in walk(outer.body, into_defs=False):
            if (
                isinstance(node, cst.Return)
                and isinstance(node.value, cst.Name)
                and node.value.value == function.name.value
            ):
                return outer
        return None

    # -- `_variable_on_cpu` factories ---------------------------------------------------------
    def _check_pinned_factory(self, call: cst.Call) -> None:
        """``with tf.device('/cpu:0'): var = tf.get_variable(...)`` ... ``return var``."""
        statement = self.parent(call)
        if isinstance(statement, cst.Return):
            returned_name = None
        elif (
            isinstance(statement, cst.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0].target, cst.Name)
        ):
            returned_name = statement.targets[0].target.value
        else:
            return
        host = self._host_device(call)
        function = self.enclosing_def(call)
        if host is None or function is None:
            return
        if returned_name is not None and not any(
            isinstance(n, cst.Return)
            and isinstance(n.value, cst.Name)
            and n.value.value == returned_name
            for n in walk(function.body, into_defs=False)
        ):
            return
        self._report_once(
            function,
            f"`{function.name.value}` creates variables under `tf.device({host})`: one copy "
            "on the host, read by every tower. TF2: MirroredStrategy mirrors variables on "
            "every GPU; drop the pin",
        )

    def _host_device(self, node: cst.CSTNode) -> str | None:
        """The CPU/PS device of an enclosing ``with tf.device(...)`` in the same function."""
        for ancestor in self.upto_boundary(node):
            if not isinstance(ancestor, cst.With):
                continue
            for item in ancestor.items:
                device = item.item
                if self.is_device_call(device) and device.args:
                    spelled = self.src(device.args[0].value, 30)
                    if _HOST_DEVICE.search(spelled):
                        return spelled
        return None


def _in_device_function(node: ast.AST, facts: CodeFacts) -> bool:
    """``enclosing_def`` and ``_returns_device`` on the ``ast`` tree, erring towards True: a
    return of a string, a name or an operation on anything."""
    function = facts.parent(node)
    while function is not None and not isinstance(function, AST_DEFS):
        function = facts.parent(function)
    if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    pending: list[ast.AST] = list(function.body)
    while pending:
        current = pending.pop()
        if type(current) is ast.Return:
            value = current.value
            kind = type(value)
            if kind in (ast.Name, ast.JoinedStr, ast.BinOp) or (
                type(value) is ast.Constant and isinstance(value.value, str | bytes)
            ):
                return True
        if not isinstance(current, AST_DEFS):
            pending.extend(ast.iter_child_nodes(current))
    return False


def _returns_device(function: cst.FunctionDef) -> bool:
    """A device function returns a device: a string, a device variable, or ``'/' + ps``."""
    for node in walk(function.body, into_defs=False):
        if isinstance(node, cst.Return) and isinstance(
            node.value,
            cst.SimpleString | cst.FormattedString | cst.ConcatenatedString | cst.Name,
        ):
            if not (
                isinstance(node.value, cst.Name) and node.value.value in ("None", "True", "False")
            ):
                return True
        if isinstance(node, cst.Return) and isinstance(node.value, cst.BinaryOperation):
            return any(isinstance(n, cst.SimpleString) for n in walk(node.value))
    return False
