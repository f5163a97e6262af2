from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import libcst as cst

from tfmigrate import tree
from tfmigrate.prefilter import AST_DEFS, CodeFacts, argument, names_in
from tfmigrate.rule import Example, FixSafety, RuleContext
from tfmigrate.rules._towers import (
    ADD_N,
    CONCAT,
    DIVIDE,
    GRADISH,
    MULTIPLY,
    STACK,
    TOWERISH,
    TowerRule,
    get_arg,
    identifiers,
    int_value,
    short_tf,
    walk,
)

_HELPER_NAME = re.compile(r"grad|averag|mean|sum|aggregat|reduce|combine", re.I)
_LOSSISH = re.compile(r"loss", re.I)
_COUNTISH = re.compile(r"num|clone|tower|gpu|replica|devices|len|count|^n$", re.I)


@dataclass
class _Site:
    anchor: cst.CSTNode
    helper: str | None  # the helper function's name, when anchored at its def
    averages: list[str] = field(default_factory=list)
    sums: list[str] = field(default_factory=list)


SITES_KEY = "gradient-aggregation-sites"


def aggregations_for(context: RuleContext) -> dict[int, bool]:
    """``ManualGradientAggregation.aggregations`` for the tree of ``context``: from the rule's
    visit in the same batch when it ran (TFM303 asks in its leave_Module), else from a visit of
    its own."""
    fresh = ManualGradientAggregation(context)  # registers its sites only if none are
    sites = context.shared(SITES_KEY, lambda: fresh._sites)
    if sites is fresh._sites:
        tree.visit_batched(context.module, [fresh])
    return _aggregations(sites)


def _aggregations(sites: dict[int, _Site]) -> dict[int, bool]:
    return {anchor: bool(site.averages) for anchor, site in sites.items()}


class ManualGradientAggregation(TowerRule):
    """
    ## What it does
    Flags hand-written combination of the towers' gradients: an `average_gradients(tower_grads)`
    helper (`expand_dims` → `concat` → `reduce_mean`, with any of the three `tf.concat`
    spellings), `reduce_mean` over a stacked list, `add_n(grads) / len(grads)`,
    `multiply(add_n(grads), 1. / len(grads))`, a plain `add_n` (the slim "clones" style, which
    scales each clone's loss by 1/num_clones instead), `reduce_sum` over towers, or a Python loop
    that adds the towers' gradients up. The finding sits on the helper's `def` (or on the
    aggregating statement) and says whether the towers' gradients are AVERAGED or SUMMED.

    ## Why is this bad?
    TF2's `optimizer.apply_gradients` under `MirroredStrategy` combines the replicas' gradients
    itself, always with a SUM all-reduce. Keeping the helper would aggregate twice; dropping it
    without care changes the update size by the number of replicas:
    - towers that AVERAGED need each replica's loss divided by the number of replicas
      (`tf.nn.compute_average_loss(per_example, global_batch_size=...)`), as `model.fit` does;
    - towers that SUMMED must not be rescaled (keep any 1/num_clones loss scaling they had).
    A wrong choice trains with an N-times larger or smaller learning rate, which `verify` shows
    as diverging losses.

    ## Example
    ```python
    def average_gradients(tower_grads):
        average_grads = []
        for grad_and_vars in zip(*tower_grads):
            grads = [tf.expand_dims(g, 0) for g, _ in grad_and_vars]
            grad = tf.reduce_mean(tf.concat(axis=0, values=grads), 0)
            average_grads.append((grad, grad_and_vars[0][1]))
        return average_grads
    ```
    Use instead: no helper; the per-replica loss carries the 1/N:
    ```python
    loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))  # SUM all-reduce
    ```

    ## Fix safety
    Manual. Whether the migrated loss must be scaled depends on this finding; the whole-script
    tower conversion makes that choice and names it in its report.
    """

    code = "TFM102"
    # Findings come from these calls, or from `+=` on the towers' gradients in a loop; always
    # next to a name that says gradients (``_about_tower_gradients``).
    triggers = (
        *(
            (f"tensorflow.{m}{f}", GRADISH)
            for m in ("", "math.")
            for f in ("reduce_mean", "reduce_sum", "add_n", "accumulate_n")
        ),
        ("+=", GRADISH),
    )
    name = "manual-gradient-aggregation"
    summary = "tower gradients averaged or summed by hand"
    fix_safety = FixSafety.MANUAL

    valid = (
        # A function of the same name that is not TensorFlow.
        """import tensorflow as tf
import numpy as np
def average_gradients(tower_grads):
    return np.mean(np.stack(tower_grads), axis=0)
""",
        # Averaging the towers' losses for a summary is not gradient aggregation.
        """import tensorflow as tf
total_loss = tf.reduce_mean(tf.stack(tower_losses), 0)
tf.summary.scalar('loss', total_loss)
""",
        # Summing a regularization collection.
        """import tensorflow as tf
reg = tf.add_n(tf.get_collection(tf.GraphKeys.REGULARIZATION_LOSSES))
""",
        # Two loss terms' gradients of one model, not towers.
        """import tensorflow as tf
g1 = tf.gradients(loss1, params)
g2 = tf.gradients(loss2, params)
grads = [tf.add_n([a, b]) for a, b in zip(g1, g2)]
""",
        # Single-device script.
        """import tensorflow as tf
grads = opt.compute_gradients(loss)
train_op = opt.apply_gradients(grads)
""",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            def average_gradients(tower_grads):
                average_grads = []
                for grad_and_vars in zip(*tower_grads):
                    grads = []
                    for g, _ in grad_and_vars:
                        expanded_g = tf.expand_dims(g, 0)
                        grads.append(expanded_g)
                    grad = tf.concat(axis=0, values=grads)
                    grad = tf.reduce_mean(grad, 0)
                    average_grads.append((grad, grad_and_vars[0][1]))
                return average_grads
            """,
            message="AVERAGES",
        ),
        Example(
            """
            import tensorflow as tf
            def average_gradients(tower_grads):
                out = []
                for gv in zip(*tower_grads):
                    grads = [tf.expand_dims(g, 0) for g, _ in gv]
                    out.append((tf.reduce_mean(tf.concat(0, grads), 0), gv[0][1]))
                return out
            """,
            message="TF 0.x",
        ),
        Example(
            """
            import tensorflow.compat.v1 as tf
            def avg_grads(tower_grads):
                res = []
                for gv in zip(*tower_grads):
                    grad = tf.reduce_mean(tf.concat([tf.expand_dims(g, 0) for g, _ in gv], 0), axis=0)
                    res.append((grad, gv[0][1]))
                return res
            """,
            message="AVERAGES",
        ),
        Example(
            """
            import tensorflow as tf
            for grads_and_vars in zip(*tower_grads):
                grad = tf.reduce_mean(tf.stack([g for g, _ in grads_and_vars]), axis=0)
                averaged.append((grad, grads_and_vars[0][1]))
            """,
            message="AVERAGES",
        ),
        Example(
            """
            import tensorflow as tf
            for gv in zip(*tower_grads):
                grads = [g for g, _ in gv]
                final.append((tf.add_n(grads) / len(grads), gv[0][1]))
            """,
            message="AVERAGES",
        ),
        Example(
            """
            import tensorflow as tf
            def combine_gradients(tower_grads):
                return [(tf.multiply(tf.add_n([g for g, _ in gv]), 1. / len(gv)), gv[0][1])
                        for gv in zip(*tower_grads)]
            """,
            message="AVERAGES",
        ),
        Example(
            """
            import tensorflow as tf
            slim = tf.contrib.slim
            def _sum_clones_gradients(clone_grads):
                sum_grads = []
                for grad_and_vars in zip(*clone_grads):
                    grads = [g for g, v in grad_and_vars if g is not None]
                    sum_grads.append((tf.add_n(grads, name='sum_grads'), grad_and_vars[0][1]))
                return sum_grads
            clone_loss = tf.div(loss, 1.0 * num_clones)
            """,
            message="scaled by 1/N",
        ),
        Example(
            """
            import tensorflow as tf
            grads = [g for g, _ in tower_grads[0]]
            for i in range(1, num_gpus):
                for j, (g, _) in enumerate(tower_grads[i]):
                    grads[j] += g
            """,
            message="SUMS",
        ),
        Example(
            """
            import tensorflow as tf
            def mean_tower_grads(tower_grads):
                total = [g for g, _ in tower_grads[0]]
                for tower in tower_grads[1:]:
                    for k, (g, _) in enumerate(tower):
                        total[k] += g
                return [t / len(tower_grads) for t in total]
            """,
            message="AVERAGES",
        ),
    )

    @classmethod
    def may_report(cls, path: PurePosixPath, facts: CodeFacts) -> bool:
        """``on_call``/``visit_AugAssign`` and ``_about_tower_gradients`` on the ``ast`` tree,
        erring towards True (the reduction's input and the helper's name are not read)."""
        for node in facts.nodes:
            if type(node) is ast.Call:
                call = node
                name = short_tf(facts.qualify(call.func))
                if name in ("tensorflow.reduce_mean", "tensorflow.reduce_sum"):
                    axis = argument(call, 1, "axis") or argument(call, None, "reduction_indices")
                    if _ast_int(axis) != 0:
                        continue
                elif name not in ADD_N:
                    continue
                if _may_be_about_tower_gradients(node, facts):
                    return True
            elif type(node) is ast.AugAssign and type(node.op) is ast.Add:
                if _may_be_about_tower_gradients(node, facts, summed=True):
                    return True
        return False

    def __init__(self, context) -> None:
        super().__init__(context)
        self._sites: dict[int, _Site] = {}
        # The first instance's sites are the ones the tower conversion (TFM303) reads: run in
        # the same batched visit, they are complete when TFM303's leave_Module asks. (The dict,
        # not the rule: a rule in its own context would be a cycle keeping the tree alive.)
        context.shared(SITES_KEY, lambda: self._sites)

    # -- collection ---------------------------------------------------------------------------
    def on_call(self, node: cst.Call) -> None:
        name = short_tf(self.call_name(node))
        if name in ("tensorflow.reduce_mean", "tensorflow.reduce_sum"):
            how = self._reduce_over_towers(node)
            if how is not None:
                self._add(node, averages=name.endswith("mean"), how=f"{name[11:]} over {how}")
        elif name in ADD_N:
            scaled = self._scaled_by(node)
            if scaled is not None:
                self._add(node, averages=True, how=f"add_n(...) {scaled}")
            else:
                self._add(node, averages=False, how="add_n(...)")

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        # `grads[j] += g` inside a loop over the towers: summing by hand.
        if not isinstance(node.operator, cst.AddAssign) or not self.loops_of(node):
            return
        # What is added must be the loop's element (`g` of `for g, _ in tower`), not a counter.
        elements: set[str] = set()
        for loop in self.loops_of(node):
            if isinstance(loop, cst.For):
                elements |= identifiers(loop.target)
        if not identifiers(node.value) & elements:
            return
        # Averaged if a later statement divides what was accumulated.
        totals = identifiers(node.target) - {"self"}
        averages = any(
            isinstance(n, cst.BinaryOperation)
            and isinstance(n.operator, cst.Divide)
            and self.line(n) > self.line(node)
            and totals & identifiers(self.enclosing_statement(n))
            for n in walk(self.scope_of(node), into_defs=False)
        )
        self._add(node, averages=averages, how="a Python loop adding them up")

    # -- classification -----------------------------------------------------------------------
    def _reduce_over_towers(self, call: cst.Call) -> str | None:
        """What a ``reduce_mean``/``reduce_sum`` over axis 0 reduces, if it is the towers."""
        axis = get_arg(call, 1, "axis") or get_arg(call, None, "reduction_indices")
        if int_value(axis) != 0:
            return None
        value = get_arg(call, 0, "input_tensor") or get_arg(call, 0, "input")
        if isinstance(value, cst.Name):
            assigned = self._assigned_value(value.value, call)
            value = assigned if isinstance(assigned, cst.Call) else value
        if isinstance(value, cst.Call):
            inner = short_tf(self.call_name(value))
            if inner in CONCAT:
                first = value.args[0].value if value.args else None
                old = first is not None and int_value(first) == 0 and value.args[0].keyword is None
                return "a concat of the towers' gradients" + (
                    " (TF 0.x `concat(dim, values)` argument order)" if old else ""
                )
            if inner in STACK:
                return "a stacked list of the towers' gradients"
            return None
        if isinstance(value, cst.Name | cst.List | cst.ListComp):
            return "a list of the towers' gradients"
        return None

    def _assigned_value(self, name: str, at: cst.CSTNode) -> cst.CSTNode | None:
        binding = self.last_binding_before(name, at)
        return binding[1] if binding is not None else None

    def _scaled_by(self, add_n: cst.Call) -> str | None:
        """How an ``add_n`` result is turned into a mean: ``/ len(grads)``, ``multiply(., 1/n)``."""
        parent = self.parent(add_n)
        if isinstance(parent, cst.BinaryOperation) and parent.left is add_n:
            if isinstance(parent.operator, cst.Divide):
                return f"/ {self.src(parent.right, 30)}"
            if isinstance(parent.operator, cst.Multiply):
                return f"* {self.src(parent.right, 30)}"
        if isinstance(parent, cst.BinaryOperation) and parent.right is add_n:
            if isinstance(parent.operator, cst.Multiply):
                return f"* {self.src(parent.left, 30)}"
        if isinstance(parent, cst.Arg):
            outer = self.parent(parent)
            if isinstance(outer, cst.Call):
                name = short_tf(self.call_name(outer))
                if name in DIVIDE or name in MULTIPLY:
                    return f"through `{name[11:]}`"
        if isinstance(parent, cst.Assign) and isinstance(parent.targets[0].target, cst.Name):
            return self._scaled_later(parent.targets[0].target.value, add_n)
        return None

    def _scaled_later(self, total: str, after: cst.CSTNode) -> str | None:
        """``grad = tf.add_n(grads)`` then ``grad = grad / n`` or ``tf.div(grad, n)``."""
        for node in walk(self.scope_of(after), into_defs=False):
            if self.line(node) <= self.line(after):
                continue
            if (
                isinstance(node, cst.BinaryOperation)
                and isinstance(node.operator, cst.Divide | cst.Multiply)
                and isinstance(node.left, cst.Name)
                and node.left.value == total
            ):
                return f"then `{self.src(node, 40)}`"
            if isinstance(node, cst.Call) and short_tf(self.call_name(node)) in DIVIDE | MULTIPLY:
                first = get_arg(node, 0, "x")
                if isinstance(first, cst.Name) and first.value == total:
                    return f"then `{self.src(node, 40)}`"
        return None

    def _add(self, node: cst.CSTNode, *, averages: bool, how: str) -> None:
        if not self._about_tower_gradients(node):
            return
        helper = self._helper(node)
        anchor: cst.CSTNode = helper or self.enclosing_statement(node)
        site = self._sites.setdefault(
            id(anchor), _Site(anchor, helper.name.value if helper else None)
        )
        (site.averages if averages else site.sums).append(how)

    def _about_tower_gradients(self, node: cst.CSTNode) -> bool:
        """Gradients AND towers must both be named around the expression: the expression, the
        loops/comprehensions it sits in, and its function's name and parameters."""
        context: set[str] = set(identifiers(node))
        transposed = False
        for ancestor in self.upto_boundary(node):
            if isinstance(ancestor, cst.For | cst.CompFor):
                context |= identifiers(ancestor.iter) | identifiers(ancestor.target)
                transposed |= _is_zip_star(ancestor.iter)
            elif isinstance(ancestor, cst.FunctionDef):
                context |= identifiers(ancestor.name) | identifiers(ancestor.params)
        text = " ".join(context)
        return bool(GRADISH.search(text)) and (transposed or bool(TOWERISH.search(text)))

    def _helper(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        """The enclosing function if it is an aggregation helper, not a whole training script."""
        function = self.enclosing_def(node)
        if function is None:
            return None
        names = " ".join(identifiers(function.name) | identifiers(function.params))
        return function if _HELPER_NAME.search(names) else None

    def aggregations(self) -> dict[int, bool]:
        """id(helper def or aggregating statement) -> True if it AVERAGES, False if it SUMS.
        Complete after the module was visited; the tower conversion (TFM303) reads it."""
        return _aggregations(self._sites)

    # -- reporting ----------------------------------------------------------------------------
    def leave_Module(self, original_node: cst.Module) -> None:
        # A walk of the whole module: only when a SUM needs explaining.
        scaled = any(not s.averages for s in self._sites.values()) and (
            self._losses_scaled_per_tower()
        )
        for site in self._sites.values():
            where = f"`{site.helper}`" if site.helper else "this statement"
            if site.averages:
                how = "; ".join(dict.fromkeys(site.averages))
                message = (
                    f"{where} AVERAGES the towers' gradients ({how}). TF2's apply_gradients under "
                    "MirroredStrategy SUMs them: divide each replica's loss by the number of "
                    "replicas (tf.nn.compute_average_loss) to keep the average"
                )
            else:
                how = "; ".join(dict.fromkeys(site.sums))
                message = f"{where} SUMS the towers' gradients ({how})"
                if scaled:
                    message += (
                        " after each tower's loss was scaled by 1/N, so the result is the mean "
                        "of the towers' gradients"
                    )
                message += (
                    ". TF2's apply_gradients under MirroredStrategy SUMs too: keep the "
                    "per-replica loss scaling as it was"
                )
            self.report(site.anchor, message)

    def _losses_scaled_per_tower(self) -> bool:
        """``loss / num_clones``, ``tf.div(loss, 1.0 * num_clones)``: the slim clones style."""
        for node in walk(self.context.module):
            left = right = None
            if isinstance(node, cst.BinaryOperation) and isinstance(
                node.operator, cst.Divide | cst.Multiply
            ):
                left, right = node.left, node.right
            elif isinstance(node, cst.Call) and short_tf(self.call_name(node)) in DIVIDE:
                left, right = get_arg(node, 0, "x"), get_arg(node, 1, "y")
            if left is None or right is None:
                continue
            if _LOSSISH.search(" ".join(identifiers(left))) and _COUNTISH.search(
                " ".join(identifiers(right))
            ):
                return True
        return False


_AST_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def _ast_int(node: ast.AST | None) -> int | None:
    """``int_value`` on an ``ast`` expression."""
    if type(node) is ast.Constant and type(node.value) is int:
        return node.value
    if type(node) is ast.UnaryOp and type(node.op) is ast.USub:
        inner = node.operand
        if type(inner) is ast.Constant and type(inner.value) is int:
            return -inner.value
    if (type(node) is ast.List or type(node) is ast.Tuple) and len(node.elts) == 1:
        return _ast_int(node.elts[0])
    return None


def _may_be_about_tower_gradients(node: ast.AST, facts: CodeFacts, *, summed: bool = False) -> bool:
    """``_about_tower_gradients`` on the ``ast`` tree, reading at least the same names (all of
    a comprehension's loops); with ``summed``, also ``visit_AugAssign``'s loop test."""
    context = names_in(node)
    loop_targets: set[str] = set()
    in_loop = transposed = False
    iterated: list[ast.For | ast.AsyncFor | ast.comprehension] = []
    ancestor = facts.parent(node)
    while ancestor is not None:
        if isinstance(ancestor, ast.For | ast.AsyncFor):
            iterated.append(ancestor)
            loop_targets |= names_in(ancestor.target)
            in_loop = True
        elif isinstance(ancestor, ast.While):
            in_loop = True
        elif isinstance(ancestor, _AST_COMPREHENSIONS):
            iterated.extend(ancestor.generators)
        elif isinstance(ancestor, ast.FunctionDef | ast.AsyncFunctionDef):
            context.add(ancestor.name)
            context |= names_in(ancestor.args)
        if isinstance(ancestor, AST_DEFS):
            break
        ancestor = facts.parent(ancestor)
    for loop in iterated:
        context |= names_in(loop.iter) | names_in(loop.target)
        transposed = transposed or any(
            type(n) is ast.Call
            and type(n.func) is ast.Name
            and n.func.id == "zip"
            and any(type(a) is ast.Starred for a in n.args)
            for n in ast.walk(loop.iter)
        )
    if summed and not (
        # summed: ``node`` is the AugAssign
        in_loop and isinstance(node, ast.AugAssign) and names_in(node.value) & loop_targets
    ):
        return False
    text = " ".join(context)
    return bool(GRADISH.search(text)) and (transposed or bool(TOWERISH.search(text)))


def _is_zip_star(node: cst.BaseExpression) -> bool:
    """``zip(*tower_grads)``: the transpose from per-tower lists to per-variable tuples."""
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Name)
        and node.func.value == "zip"
        and len(node.args) == 1
        and node.args[0].star == "*"
    )
