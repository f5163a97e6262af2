from __future__ import annotations

import libcst as cst

from tfmigrate.rule import Example, FixSafety, Rule, RuleContext

# set algebra that keeps a set of the operands' elements
_SET_OPERATORS = (cst.Subtract, cst.BitOr, cst.BitAnd, cst.BitXor)
# the methods whose argument at this position (or keyword) is a list of variables
_VARIABLE_ARGS = {
    "compute_gradients": (1, "var_list"),
    "minimize": (2, "var_list"),
    "gradients": (1, "xs"),  # tf.gradients
    "gradient": (1, "sources"),  # GradientTape.gradient
}


def _set_call(node: cst.BaseExpression) -> bool:
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Name)
        and node.func.value == "set"
        and len(node.args) == 1
        and node.args[0].keyword is None
        and not node.args[0].star
    )


def _set_algebra(node: cst.BaseExpression) -> bool:
    """``set(a)``, or ``set(a) - set(b)`` (``|``, ``&``, ``^``) of those."""
    if _set_call(node):
        return True
    return (
        isinstance(node, cst.BinaryOperation)
        and isinstance(node.operator, _SET_OPERATORS)
        and _set_algebra(node.left)
        and _set_algebra(node.right)
    )


def _set_of_variables(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """The set algebra a bound value is made of: the value itself, or ``list(...)`` of it."""
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Name)
        and node.func.value == "list"
        and len(node.args) == 1
        and node.args[0].keyword is None
    ):
        node = node.args[0].value
    return node if _set_algebra(node) else None


class _KeyedOnRefs(cst.CSTTransformer):
    """Each ``set(x)`` becomes ``{v.ref() for v in x}``."""

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not _set_call(original_node):
            return updated_node
        ref = cst.Call(func=cst.Attribute(cst.Name("v"), cst.Name("ref")))
        loop = cst.CompFor(target=cst.Name("v"), iter=updated_node.args[0].value)
        return cst.SetComp(elt=ref, for_in=loop)


def _by_refs(algebra: cst.BaseExpression) -> cst.ListComp:
    keyed = algebra.visit(_KeyedOnRefs())
    assert isinstance(keyed, cst.BaseExpression)
    deref = cst.Call(func=cst.Attribute(cst.Name("ref"), cst.Name("deref")))
    return cst.ListComp(elt=deref, for_in=cst.CompFor(target=cst.Name("ref"), iter=keyed))


class _Scope:
    """One function's (or the module's) names bound to set algebra, and the names it passes to
    a gradient call as the variables."""

    def __init__(self) -> None:
        self.sets: dict[str, list[tuple[cst.BaseExpression, cst.BaseExpression]]] = {}
        self.variables: set[str] = set()


class VariablesInASet(Rule):
    """
    ## What it does
    Flags a list of variables made with Python `set` algebra (`list(set(all_vars) -
    set(frozen))`) that the same function passes to a gradient call as its variables
    (`compute_gradients(loss, var_list)`, `minimize(var_list=...)`, `tf.gradients(loss, xs)`,
    `tape.gradient(loss, sources)`), and keys the sets on `v.ref()`.

    ## Why is this bad?
    TF1 graph variables were hashable; TF2 variables are not (`==` compares values
    elementwise), so `set(variables)` raises `TypeError: Variable is unhashable. Instead, use
    variable.ref() as the key.` Fine-tuning scripts often split their variables into two lists
    for two optimizers this way.

    ## Example
    ```python
    import tensorflow as tf
    head = [weights['out'], biases['out']]
    body = list(set(list(weights.values()) + list(biases.values())) - set(head))
    grads = opt.compute_gradients(loss, body)
    ```
    Use instead:
    ```python
    import tensorflow as tf
    head = [weights['out'], biases['out']]
    body = [ref.deref() for ref in {v.ref() for v in list(weights.values()) + list(biases.values())} - {v.ref() for v in head}]
    grads = opt.compute_gradients(loss, body)
    ```

    ## Fix safety
    Safe: the same set of variables, deduplicated as `set` did; their order was the set's
    arbitrary one before and still is. The name holds a list of the variables instead of a set.
    """

    code = "TFM116"
    triggers = ("set",)
    name = "variables-in-a-set"
    summary = "a Python set of variables: TF2 variables are unhashable, key the set on v.ref()"
    fix_safety = FixSafety.SAFE

    valid = (
        # not passed to a gradient call: no sign the elements are variables
        "import tensorflow as tf\nnames = list(set(a) - set(b))\nprint(names)\n",
        "import tensorflow as tf\nbody = [v for v in all_vars if v is not w]\n"
        "grads = opt.compute_gradients(loss, body)\n",
        # bound in another function
        "import tensorflow as tf\n\ndef a():\n    body = list(set(x))\n    return body\n\n"
        "def b(body):\n    return tf.gradients(loss, body)\n",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            head = [weights['out'], biases['out']]
            body = list(set(list(weights.values()) + list(biases.values())) - set(head))
            grads = opt.compute_gradients(loss, body)
            """,
            fixed="""
            import tensorflow as tf
            head = [weights['out'], biases['out']]
            body = [ref.deref() for ref in {v.ref() for v in list(weights.values()) + list(biases.values())} - {v.ref() for v in head}]
            grads = opt.compute_gradients(loss, body)
            """,
            message="unhashable",
        ),
        Example(
            """
            import tensorflow as tf

            def step(tape, loss):
                trained = set(tf.trainable_variables()) | set(extra)
                return tape.gradient(loss, sources=trained)
            """,
            fixed="""
            import tensorflow as tf

            def step(tape, loss):
                trained = [ref.deref() for ref in {v.ref() for v in tf.trainable_variables()} | {v.ref() for v in extra}]
                return tape.gradient(loss, sources=trained)
            """,
        ),
    )

    def __init__(self, context: RuleContext) -> None:
        super().__init__(context)
        self._scopes: list[_Scope] = [_Scope()]

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scopes.append(_Scope())

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._report(self._scopes.pop())

    def leave_Module(self, original_node: cst.Module) -> None:
        self._report(self._scopes[0])

    def visit_Assign(self, node: cst.Assign) -> None:
        algebra = _set_of_variables(node.value)
        if algebra is None or len(node.targets) != 1:
            return
        target = node.targets[0].target
        if isinstance(target, cst.Name) and "set" not in self.context.resolver.bindings:
            self._scopes[-1].sets.setdefault(target.value, []).append((node.value, algebra))

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute) or func.attr.value not in _VARIABLE_ARGS:
            return
        position, keyword = _VARIABLE_ARGS[func.attr.value]
        positional = [a for a in node.args if a.keyword is None and not a.star]
        named = [a for a in node.args if a.keyword is not None and a.keyword.value == keyword]
        arg = named[0] if named else positional[position] if len(positional) > position else None
        if arg is not None and isinstance(arg.value, cst.Name):
            self._scopes[-1].variables.add(arg.value.value)

    def _report(self, scope: _Scope) -> None:
        for name, bound in scope.sets.items():
            if name not in scope.variables:
                continue
            for value, algebra in bound:
                self.report(
                    value,
                    f"`{name}` is a set of the variables it differentiates: TF2 variables are "
                    "unhashable (TypeError: Variable is unhashable); key the set on `v.ref()` "
                    "and take the variables back with `deref()`",
                    replacement=_by_refs(algebra),
                )
