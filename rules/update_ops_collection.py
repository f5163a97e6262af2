from __future__ import annotations

import ast
import re
from pathlib import PurePosixPath

import libcst as cst

from tfmigrate.prefilter import CodeFacts, argument
from tfmigrate.rule import Example, FixSafety
from tfmigrate.rules._tower_program import _scope_name
from tfmigrate.rules._towers import (
    DEVICE,
    LOOP,
    SCOPES,
    TOWERISH,
    TowerRule,
    Towers,
    get_arg,
    identifiers,
    int_value,
    walk,
)

# The value of tf.GraphKeys.UPDATE_OPS, and old slim's own collection ('_update_ops_').
_UPDATE_OPS_STRINGS = frozenset({"update_ops", "_update_ops_"})
_FIRST_SCOPE = re.compile(r"_0/?$|^0$")
_CONSUMERS = {
    "tensorflow.control_dependencies": "tf.control_dependencies",
    "tensorflow.group": "tf.group",
    "tensorflow.tuple": "tf.tuple",
}
_TF2 = (
    ". TF2: Keras BatchNormalization under MirroredStrategy updates its moving statistics on "
    "every replica from its own sub-batch and saves replica 0's (synchronized=True uses "
    "global-batch statistics instead); no mode equals this exactly"
)


class UpdateOpsCollection(TowerRule):
    """
    ## What it does
    Flags `tf.get_collection(tf.GraphKeys.UPDATE_OPS, scope)` (also old slim's
    `UPDATE_OPS_COLLECTION` and the bare string) in tower code and says whose batch-norm updates
    actually run: the first tower's (a scope fixed to tower 0, or set inside the loop at
    `i == 0`), the last tower's (the loop's `scope` variable keeps its last value after the loop,
    or a per-tower list is overwritten each iteration), or all towers', one after another (no
    scope). A literal scope (`'tower0'`) is read against the tower loop's own name scope
    (`'tower%d' % i`, `f'gpu{i}'`, `'replica_{}'.format(i)`): the finding names the tower that
    takes it (first, last of a literal `range(n)`, or tower k), or all towers when every tower's
    scope starts with it (get_collection matches a prefix). It also says how the list is
    consumed: `tf.control_dependencies`, `tf.group` or `with_dependencies`, or not at all.

    ## Why is this bad?
    In TF1 graphs, batch-norm moving averages only move if their update ops are run. Tower code
    chose, often by accident, which towers' updates run: only one tower's sub-batch statistics,
    or every tower's updates in sequence, each pulling the same moving mean toward its own
    sub-batch. TF2 has no update collection: Keras `BatchNormalization` under `MirroredStrategy`
    updates per replica and keeps replica 0's values when saving, and `synchronized=True`
    normalizes with global-batch statistics. None of these equals the TF1 choice exactly, so the
    migration must announce the difference and `verify` must measure it.

    ## Example
    ```python
    for i in range(num_gpus):
        with tf.device('/gpu:%d' % i), tf.name_scope('tower_%d' % i) as scope:
            loss = tower_loss(scope)
    update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS, scope)  # last tower only
    with tf.control_dependencies(update_ops):
        train_op = opt.apply_gradients(grads)
    ```
    Use instead: Keras layers, whose updates run inside `model(x, training=True)`:
    ```python
    bn = tf.keras.layers.BatchNormalization(momentum=0.999, epsilon=1e-3, center=True,
                                            scale=False)  # slim's defaults
    ```

    ## Fix safety
    Manual. Which replica's statistics survive changes the trained model; the tower conversion
    reports the difference and `verify` measures it.
    """

    code = "TFM103"
    # A get_collection call whose key is UPDATE_OPS (GraphKeys', slim's) or its string value.
    triggers = tuple(
        ("get_collection", key) for key in ("UPDATE_OPS", "'update_ops'", "'_update_ops_'")
    )
    name = "update-ops-collection"
    summary = "UPDATE_OPS taken from one tower or all towers: which batch-norm updates run"
    fix_safety = FixSafety.MANUAL

    valid = (
        """import tensorflow as tf
losses = tf.get_collection(tf.GraphKeys.LOSSES, scope)
""",
        """import tensorflow as tf
reg = tf.get_collection(tf.GraphKeys.REGULARIZATION_LOSSES)
""",
        # Not TensorFlow's get_collection.
        """import tensorflow as tf
from registry import get_collection
ops = get_collection('update_ops')
""",
        """import tensorflow as tf
summaries = tf.get_collection(tf.GraphKeys.SUMMARIES, 'tower_0')
""",
        # The ordinary single-device batch-norm idiom: no towers.
        """import tensorflow as tf
update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
with tf.control_dependencies(update_ops):
    train_op = opt.minimize(loss)
""",
        # Per-device ops without a model are no towers.
        """import tensorflow as tf
for d in ['/gpu:0', '/gpu:1']:
    with tf.device(d):
        products.append(tf.matmul(a, b))
update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
""",
        # A GAN's sub-network scope, not a tower.
        """import tensorflow as tf
d_updates = tf.get_collection(tf.GraphKeys.UPDATE_OPS, 'discriminator')
""",
        # No tower loop, a literal scope that names no tower: the single-device idiom.
        """import tensorflow as tf
with tf.name_scope('block0'):
    net = block(images)
updates = tf.get_collection(tf.GraphKeys.UPDATE_OPS, 'block0')
""",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            for i in range(num_gpus):
                with tf.device('/gpu:%d' % i):
                    with tf.name_scope('tower_%d' % i) as scope:
                        loss = tower_loss(scope)
                        if i == 0:
                            update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS, scope)
            with tf.control_dependencies(update_ops):
                train_op = opt.apply_gradients(grads)
            """,
            message="first tower",
        ),
        Example(
            """
            import tensorflow as tf
            for i in range(num_clones):
                with tf.name_scope('clone_%d' % i) as scope:
                    loss = clone_loss(i)
            update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS, scope)
            train_op = control_flow_ops.with_dependencies(update_ops, total_loss)
            """,
            message="last tower",
        ),
        Example(
            """
            import tensorflow.compat.v1 as tf
            for i, device in enumerate(['/gpu:0', '/gpu:1']):
                with tf.device(device), tf.variable_scope('net', reuse=i > 0):
                    tower_grads.append(opt.compute_gradients(model_loss(images[i])))
            update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
            update_op = tf.group(*update_ops)
            train_op = tf.group(apply_op, update_op)
            """,
            message="all towers",
        ),
        Example(
            """
            import tensorflow as tf
            with tf.control_dependencies(tf.get_collection('update_ops', 'tower_0')):
                train_op = opt.minimize(loss)
            """,
            message="tf.control_dependencies",
        ),
        Example(
            """
            import tensorflow as tf
            from inception.slim import slim
            for i in range(FLAGS.num_gpus):
                with tf.device('/gpu:%d' % i):
                    with tf.name_scope('%s_%d' % (TOWER_NAME, i)) as scope:
                        loss = tower_loss(scope)
                        batchnorm_updates = tf.get_collection(slim.ops.UPDATE_OPS_COLLECTION, scope)
            batchnorm_updates_op = tf.group(*batchnorm_updates)
            """,
            message="overwritten",
        ),
        Example(
            """
            import tensorflow as tf
            update_ops = []
            for i in range(n):
                with tf.name_scope('tower_%d' % i) as scope:
                    update_ops.extend(tf.get_collection(tf.GraphKeys.UPDATE_OPS, scope))
            """,
            message="not consumed",
        ),
        Example(
            """
            import tensorflow as tf
            first_clone_scope = clones[0].scope
            update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS, first_clone_scope)
            """,
            message="first tower",
        ),
        # A literal scope is read against the towers' own name scope: 'tower0' is tower 0's.
        Example(
            """
            import tensorflow as tf
            for i in range(num_gpus):
                with tf.device('/gpu:%d' % i), tf.name_scope('tower%d' % i):
                    tower_grads.append(opt.compute_gradients(tower_loss(i)))
            update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS, scope='tower0')
            """,
            message="first tower only: just tower 0's sub-batch updates the moving statistics "
            "(the towers' name scope `'tower%d' % i` at i == 0)",
        ),
        Example(
            """
            import tensorflow as tf
            for i in range(2):
                with tf.device('/gpu:%d' % i), tf.name_scope(f'gpu{i}'):
                    tower_grads.append(opt.compute_gradients(tower_loss(i)))
            update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS, 'gpu1')
            """,
            message="last tower only: just the last tower's (tower 1 of 2)",
        ),
        Example(
            """
            import tensorflow as tf
            for i, d in enumerate(['/gpu:0', '/gpu:1', '/gpu:2']):
                with tf.device(d), tf.name_scope('replica_{}'.format(i)):
                    tower_grads.append(opt.compute_gradients(tower_loss(i)))
            update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS, 'replica_1')
            """,
            message="tower 1 only: just tower 1's sub-batch",
        ),
        # get_collection matches the scope as a prefix: 'tower' selects every 'tower%d'.
        Example(
            """
            import tensorflow as tf
            for i in range(2):
                with tf.device('/gpu:%d' % i), tf.name_scope('tower%d' % i):
                    tower_grads.append(opt.compute_gradients(tower_loss(i)))
            update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS, 'tower')
            """,
            message="all towers: every tower's name scope starts with it",
        ),
        # Key and scope by keyword, on a graph's own collection.
        Example(
            """
            import tensorflow as tf
            graph = tf.get_default_graph()
            updates = graph.get_collection_ref(key=tf.GraphKeys.UPDATE_OPS, scope='tower_0')
            with tf.control_dependencies(updates):
                train_op = opt.minimize(loss)
            """,
            message="first tower only",
        ),
    )

    @classmethod
    def may_report(cls, path: PurePosixPath, facts: CodeFacts) -> bool:
        """``on_call`` and ``_in_tower_code`` on the ``ast`` tree, erring towards True: some
        get_collection call with an UPDATE_OPS key, and a `tf.device` in the file or a scope
        given to the call."""
        device = facts.has_name(DEVICE)
        for node in facts.nodes:
            if type(node) is not ast.Call or not _may_get_collection(node, facts):
                continue
            key = argument(node, 0, "key")
            if key is None or not _may_be_update_ops(key, facts):
                continue
            if device or argument(node, 1, "scope") is not None:
                return True
        return False

    def __init__(self, context) -> None:
        super().__init__(context)
        self._candidates: list[cst.Call] = []

    def on_call(self, node: cst.Call) -> None:
        if self._is_get_collection(node):
            key = get_arg(node, 0, "key")
            if key is not None and self._is_update_ops(key):
                self._candidates.append(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        for node in self._candidates:
            self._check(node)

    def _check(self, node: cst.Call) -> None:
        scope = get_arg(node, 1, "scope")
        if not self._in_tower_code(scope):
            return  # the ordinary single-device batch-norm idiom, or a GAN's sub-network
        whose = "all towers" if scope is None else self._whose(scope, node)
        if scope is None:
            message = (
                "UPDATE_OPS gathered globally: all towers' batch-norm updates run, one after "
                "another on the same moving statistics"
            )
        else:
            message = f"UPDATE_OPS from scope `{self.src(scope, 40)}`: {whose}"
        self.report(node, f"{message}; {self._consumed(node)}{_TF2}")

    # -- what is collected --------------------------------------------------------------------
    def _is_get_collection(self, call: cst.Call) -> bool:
        name = self.call_name(call)
        if name is not None:
            return name.startswith("tensorflow.") and name.endswith(
                (".get_collection", ".get_collection_ref")
            )
        # `tf.get_default_graph().get_collection(...)`, `graph.get_collection(...)`.
        return isinstance(call.func, cst.Attribute) and call.func.attr.value in (
            "get_collection",
            "get_collection_ref",
        )

    def _is_update_ops(self, key: cst.BaseExpression) -> bool:
        if isinstance(key, cst.SimpleString):
            return key.evaluated_value in _UPDATE_OPS_STRINGS
        qualified = self.qualify(key)
        if qualified is not None and qualified.endswith("GraphKeys.UPDATE_OPS"):
            return True
        # Old slim (inception's own `slim` package) named its collection UPDATE_OPS_COLLECTION.
        return isinstance(key, cst.Attribute) and key.attr.value == "UPDATE_OPS_COLLECTION"

    def _in_tower_code(self, scope: cst.BaseExpression | None) -> bool:
        if self.has_device_loop():
            return True
        if scope is None:
            return False
        spelled = self.src(scope)
        if isinstance(scope, cst.Name):
            binding = self.last_binding_before(scope.value, scope)
            if binding is not None:
                spelled += " " + self.src(binding[1])
        return bool(TOWERISH.search(spelled))

    # -- whose updates ------------------------------------------------------------------------
    def _whose(self, scope: cst.BaseExpression, call: cst.Call, depth: int = 0) -> str:
        first = "first tower only: just tower 0's sub-batch updates the moving statistics"
        last = "last tower only: just the last tower's sub-batch updates the moving statistics"
        if isinstance(scope, cst.SimpleString) and isinstance(scope.evaluated_value, str):
            taken = self._literal_tower(scope.evaluated_value)
            if taken is not None:
                return taken
        literal = _first_or_last(scope)
        if literal == 0:
            return first
        if literal == -1:
            return last
        if not isinstance(scope, cst.Name) or depth > 2:
            return f"only the towers under that scope ({_words(scope)})"
        binding = self.last_binding_before(scope.value, call)
        if binding is None:
            return "only the towers under that scope"
        node, value = binding
        loops = self.loops_of(node)
        if loops:
            loop = loops[0]
            if not any(a is loop for a in self.ancestors(call)):
                return (
                    f"last tower only: `{scope.value}` keeps its value from the loop's last "
                    "iteration, so just the last tower's sub-batch updates the moving statistics"
                )
            return self._inside_loop(call, loop, first, last)
        if isinstance(value, cst.BaseExpression):
            return self._whose(value, call, depth + 1)
        return "only the towers under that scope"

    def _literal_tower(self, literal: str) -> str | None:
        """Which tower a literal scope names, read from the tower loop's own name scope
        (``'tower%d' % i`` takes 'tower0' at i == 0). get_collection matches the scope as a
        prefix, so a literal every tower's scope starts with selects them all."""
        wanted = literal.rstrip("/")
        for towers in self.tower_loops():
            count = _tower_count(towers)
            for index, spelling in _tower_scopes(towers, self.call_name):
                names = [_scope_name(spelling, index, k) for k in range(count or 64)]
                where = f"the towers' name scope `{self.src(spelling, 30)}`"
                if wanted in names:
                    k = names.index(wanted)
                    if k == 0:
                        who = "first tower only: just tower 0's"
                    elif count is not None and k == count - 1:
                        who = f"last tower only: just the last tower's (tower {k} of {count})"
                    else:
                        who = f"tower {k} only: just tower {k}'s"
                    return (
                        f"{who} sub-batch updates the moving statistics ({where} at {index} == {k})"
                    )
                if count is not None and all((n or "").startswith(literal) for n in names[:count]):
                    return (
                        f"all towers: every tower's name scope starts with it ({where}; "
                        "get_collection matches the scope as a prefix), so every tower's "
                        "update runs, one after another"
                    )
        return None

    def _inside_loop(self, call: cst.Call, loop: cst.CSTNode, first: str, last: str) -> str:
        """Collected once per tower: an ``if i == 0`` guard, a list built up, or overwritten."""
        for ancestor in self.upto_boundary(call):
            if ancestor is loop:
                break
            if isinstance(ancestor, cst.If):
                guard = _index_guard(ancestor.test)
                if guard == 0:
                    return first + " (collected at `" + self.src(ancestor.test, 30) + "`)"
                if guard == -1:
                    return last + " (collected at `" + self.src(ancestor.test, 30) + "`)"
        statement = self.enclosing_statement(call)
        plain_assign = isinstance(statement, cst.SimpleStatementLine) and any(
            isinstance(s, cst.Assign) and s.value is call for s in statement.body
        )
        if plain_assign:
            return (
                "last tower only: the list is overwritten in every iteration of the tower loop, "
                "so just the last tower's sub-batch updates the moving statistics"
            )
        return (
            "all towers: each tower's own updates are collected (every tower's update, one "
            "after another)"
        )

    # -- how it is consumed -------------------------------------------------------------------
    def _consumed(self, call: cst.Call) -> str:
        consumer = self._consumer_of(call)
        if consumer is not None:
            return f"consumed through `{consumer}`"
        statement = self.enclosing_statement(call)
        names: set[str] = set()
        for node in walk(statement):
            if isinstance(node, cst.AssignTarget) and isinstance(node.target, cst.Name):
                names.add(node.target.value)
            elif isinstance(node, cst.Call) and node is not call:
                # `update_ops.extend(get_collection(...))`
                if isinstance(node.func, cst.Attribute) and isinstance(node.func.value, cst.Name):
                    names.add(node.func.value.value)
        for _ in range(3):  # `ops -> tf.group(*ops) -> tf.group(train, op)`: follow a few hops
            found, names = self._consumers_of_names(names, self.scope_of(call))
            if found:
                return f"consumed through `{found}`"
            if not names:
                break
        return "not consumed in this function: these updates may never run"

    def _consumer_of(self, node: cst.CSTNode) -> str | None:
        for ancestor in self.upto_boundary(node):
            if isinstance(ancestor, cst.Call):
                label = self._consumer_label(ancestor)
                if label is not None:
                    return label
            if isinstance(ancestor, cst.BaseSmallStatement | cst.BaseCompoundStatement):
                return None
        return None

    def _consumer_label(self, call: cst.Call) -> str | None:
        name = self.call_name(call)
        if name in _CONSUMERS:
            return _CONSUMERS[name]
        method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
        bare = call.func.value if isinstance(call.func, cst.Name) else None
        if "with_dependencies" in (method, bare):
            return "with_dependencies"
        if method == "control_dependencies":
            return "control_dependencies"
        if get_arg(call, None, "update_ops") is not None:  # slim's create_train_op(update_ops=)
            return f"{(method or bare or 'create_train_op')}(update_ops=...)"
        return None

    def _consumers_of_names(
        self, names: set[str], scope: cst.CSTNode
    ) -> tuple[str | None, set[str]]:
        """A consumer call reading one of ``names``; else the names assigned from them."""
        derived: set[str] = set()
        for node in walk(scope, into_defs=False):
            if isinstance(node, cst.Call):
                label = self._consumer_label(node)
                if label is not None and identifiers(node) & names:
                    return label, set()
            elif isinstance(node, cst.Assign) and identifiers(node.value) & names:
                for target in node.targets:
                    if isinstance(target.target, cst.Name):
                        derived.add(target.target.value)
        return None, derived - names


_GET_COLLECTION = (".get_collection", ".get_collection_ref")


def _may_get_collection(call: ast.Call, facts: CodeFacts) -> bool:
    """``_is_get_collection`` on an ``ast`` call (any method of that name counts)."""
    if type(call.func) is ast.Attribute:
        return call.func.attr in ("get_collection", "get_collection_ref")
    name = facts.qualify(call.func)
    return name is not None and name.startswith("tensorflow.") and name.endswith(_GET_COLLECTION)


def _may_be_update_ops(key: ast.expr, facts: CodeFacts) -> bool:
    """``_is_update_ops`` on an ``ast`` expression (any attribute of those names counts)."""
    if type(key) is ast.Constant:
        return key.value in _UPDATE_OPS_STRINGS
    if type(key) is ast.Attribute:
        return key.attr in ("UPDATE_OPS", "UPDATE_OPS_COLLECTION")
    name = facts.qualify(key)
    return name is not None and name.endswith("GraphKeys.UPDATE_OPS")


def _loop_indices(towers: Towers) -> list[str]:
    """The names that hold the tower index: the loop's (``for i, d in enumerate(...)``: ``i``),
    or the parameters of the function the loop calls per tower."""
    names: list[str] = []
    loop = towers.replicator
    if isinstance(loop, cst.For):
        target: cst.BaseExpression = loop.target
        if isinstance(target, cst.Tuple) and target.elements:
            target = target.elements[0].value
        if isinstance(target, cst.Name):
            names.append(target.value)
    if towers.tower_fn is not None:
        names += [p.name.value for p in towers.tower_fn.params.params]
    return names


def _tower_count(towers: Towers) -> int | None:
    """``for i in range(2)`` or ``enumerate(['/gpu:0', '/gpu:1'])``: 2; None when not literal."""
    loop = towers.replicator
    if not isinstance(loop, cst.For) or not isinstance(loop.iter, cst.Call):
        return None
    func, args = loop.iter.func, loop.iter.args
    if isinstance(func, cst.Name) and func.value == "range" and len(args) == 1:
        return int_value(args[0].value)
    if isinstance(func, cst.Name) and func.value == "enumerate" and len(args) == 1:
        value = args[0].value
        return len(value.elements) if isinstance(value, cst.List | cst.Tuple) else None
    return None


def _tower_scopes(towers: Towers, call_name) -> list[tuple[str, cst.BaseExpression]]:
    """(index name, scope expression) of the per-tower name/variable scopes: those whose name
    changes with the tower index."""
    roots: list[cst.CSTNode] = [
        towers.replicator.body if isinstance(towers.replicator, LOOP) else towers.replicator
    ]
    if towers.tower_fn is not None:
        roots.append(towers.tower_fn.body)
    found = []
    indices = _loop_indices(towers)
    for root in roots:
        for node in walk(root, into_defs=False):
            if not isinstance(node, cst.Call) or call_name(node) not in SCOPES:
                continue
            spelling = get_arg(node, 0, "name_or_scope") or get_arg(node, 0, "name")
            for index in indices:
                if spelling is not None and _scope_name(spelling, index, 0) != _scope_name(
                    spelling, index, 1
                ):
                    found.append((index, spelling))
    return found


def _first_or_last(node: cst.BaseExpression) -> int | None:
    """0 for a first-tower spelling ('tower_0', '%s_0' % X, clones[0].scope, clone_scope(0)),
    -1 for a last-tower one ([-1]), else None."""
    for current in walk(node):
        if isinstance(current, cst.SimpleString):
            value = current.evaluated_value
            if isinstance(value, str) and _FIRST_SCOPE.search(value):
                return 0
        elif isinstance(current, cst.Subscript) and len(current.slice) == 1:
            index = current.slice[0].slice
            if isinstance(index, cst.Index):
                found = int_value(index.value)
                if found in (0, -1):
                    return found
        elif isinstance(current, cst.Call) and any(int_value(a.value) == 0 for a in current.args):
            return 0
        elif isinstance(current, cst.Name):
            lowered = current.value.lower()
            if "first" in lowered:
                return 0
            if "last" in lowered:
                return -1
    if (
        isinstance(node, cst.BinaryOperation)
        and isinstance(node.operator, cst.Modulo)
        and (int_value(node.right) == 0 or _last_element_is_zero(node.right))
    ):
        return 0
    return None


def _last_element_is_zero(node: cst.BaseExpression) -> bool:
    return (
        isinstance(node, cst.Tuple)
        and bool(node.elements)
        and int_value(node.elements[-1].value) == 0
    )


def _index_guard(test: cst.BaseExpression) -> int | None:
    """``i == 0`` / ``not i`` -> 0; ``i == num_gpus - 1`` -> -1."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return 0
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        if isinstance(target.operator, cst.Equal):
            if int_value(target.comparator) == 0:
                return 0
            right = target.comparator
            if (
                isinstance(right, cst.BinaryOperation)
                and isinstance(right.operator, cst.Subtract)
                and int_value(right.right) == 1
            ):
                return -1
    return None


def _words(node: cst.CSTNode) -> str:
    return "its name does not say which tower"
