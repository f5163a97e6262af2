from __future__ import annotations

import libcst as cst

from tfmigrate.rule import Example, FixSafety, Rule, RuleContext

_VIEWS = frozenset({"keys", "values", "items"})
_SHUFFLES = frozenset({"random.shuffle", "numpy.random.shuffle"})
_LIST_MUTATORS = frozenset({"append", "extend", "insert", "remove", "pop", "sort", "reverse"})


def _view(node: cst.BaseExpression) -> bool:
    """``d.keys()`` / ``d.values()`` / ``d.items()``: a list in Python 2, a view in Python 3."""
    return (
        isinstance(node, cst.Call)
        and not node.args
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in _VIEWS
    )


def _list_like(node: cst.BaseExpression) -> bool:
    """An operand that makes ``+`` a list concatenation: a view, a list, ``list(...)``, or a
    concatenation of those."""
    if _view(node) or isinstance(node, cst.List | cst.ListComp):
        return True
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
        return node.func.value in {"list", "sorted"}
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
        return _list_like(node.left) or _list_like(node.right)
    return False


def _listed(node: cst.BaseExpression) -> cst.Call:
    return cst.Call(func=cst.Name("list"), args=[cst.Arg(node)])


class _Scope:
    """One function's (or the module's) ``name = range(...)`` bindings and mutated names."""

    def __init__(self) -> None:
        self.ranges: dict[str, list[cst.Call]] = {}
        self.mutated: set[str] = set()


class Python2ListSemantics(Rule):
    """
    ## What it does
    Flags Python 2 list semantics in code that parses as Python 3: a dict's `keys()`,
    `values()` or `items()` concatenated with `+` to another list, and a name bound to
    `range(...)` that the same function then shuffles (`random.shuffle`, `np.random.shuffle`),
    assigns items of, or changes with a list method (`append`, `sort`, ...).

    ## Why is this bad?
    In Python 2 these calls returned lists; in Python 3 they return views and `range` objects.
    The code still parses, so nothing flags it until it runs: `weights.values() +
    biases.values()` raises `TypeError: unsupported operand type(s) for +: 'dict_values' and
    'dict_values'`, and `random.shuffle(range(n))` raises `TypeError: 'range' object does not
    support item assignment`. TF1 training code from the Python 2 years often reads its
    variable dicts and shuffles its sample indices this way.

    ## Example
    ```python
    import random
    indices = range(len(lines))
    random.shuffle(indices)
    variables = weights.values() + biases.values()
    ```
    Use instead:
    ```python
    import random
    indices = list(range(len(lines)))
    random.shuffle(indices)
    variables = list(weights.values()) + list(biases.values())
    ```

    ## Fix safety
    Safe: `list(...)` builds the list Python 2 returned, with the same elements in the same
    order (dicts keep insertion order in Python 3). Only a `range` whose name is changed in
    place in the same function is wrapped; one that is only iterated stays a `range`.
    """

    code = "TFM115"
    triggers = ("keys", "values", "items", "range")
    name = "python2-list-semantics"
    summary = "Python 2 list semantics (dict views concatenated, a range shuffled): wrap in list()"
    fix_safety = FixSafety.SAFE

    valid = (
        "import tensorflow as tf\nfor i in range(10):\n    print(i)\n",
        "import tensorflow as tf\nnames = list(weights.keys()) + ['out']\n",
        "import random\nimport tensorflow as tf\nindices = list(range(10))\nrandom.shuffle(indices)\n",
        # Only iterated: a range is right.
        "import tensorflow as tf\norder = range(10)\nfor i in order:\n    print(i)\n",
        # A pandas-like `.values()` added to a number is not a list concatenation.
        "import tensorflow as tf\ntotal = table.values() + 1\n",
        # A shuffled range in another function is another name.
        "import random\nimport tensorflow as tf\n\ndef a():\n    order = range(3)\n    return order\n\ndef b(order):\n    random.shuffle(order)\n",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            varlist = list(set(weights.values() + biases.values()) - set(fixed))
            """,
            fixed="""
            import tensorflow as tf
            varlist = list(set(list(weights.values()) + list(biases.values())) - set(fixed))
            """,
            message="dict_values",
        ),
        Example(
            """
            import random
            import tensorflow as tf

            def batches(lines, shuffle):
                if shuffle:
                    order = range(len(lines))
                    random.shuffle(order)
                else:
                    order = range(3, len(lines))
                return order
            """,
            fixed="""
            import random
            import tensorflow as tf

            def batches(lines, shuffle):
                if shuffle:
                    order = list(range(len(lines)))
                    random.shuffle(order)
                else:
                    order = list(range(3, len(lines)))
                return order
            """,
            message="range",
        ),
        Example(
            """
            import numpy as np
            import tensorflow as tf
            keys = d.keys() + ['extra']
            idx = range(100)
            np.random.shuffle(idx)
            """,
            fixed="""
            import numpy as np
            import tensorflow as tf
            keys = list(d.keys()) + ['extra']
            idx = list(range(100))
            np.random.shuffle(idx)
            """,
        ),
    )

    def __init__(self, context: RuleContext) -> None:
        super().__init__(context)
        self._scopes: list[_Scope] = [_Scope()]

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if not isinstance(node.operator, cst.Add):
            return
        for side, other in ((node.left, node.right), (node.right, node.left)):
            if _view(side) and _list_like(other):
                assert isinstance(side, cst.Call) and isinstance(side.func, cst.Attribute)
                method = side.func.attr.value
                self.report(
                    side,
                    f"`.{method}()` is a list in Python 2 but a `dict_{method}` view in Python 3: "
                    f"`+` raises TypeError; wrap it in `list(...)`",
                    replacement=_listed(side),
                )

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scopes.append(_Scope())

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._report_ranges(self._scopes.pop())

    def leave_Module(self, original_node: cst.Module) -> None:
        self._report_ranges(self._scopes[0])

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        for target in node.targets:
            name = target.target
            if isinstance(name, cst.Name) and self._is_range(value):
                assert isinstance(value, cst.Call)
                self._scopes[-1].ranges.setdefault(name.value, []).append(value)
            if isinstance(name, cst.Subscript) and isinstance(name.value, cst.Name):
                self._scopes[-1].mutated.add(name.value.value)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if self.call_name(node) in _SHUFFLES and node.args:
            first = node.args[0].value
            if isinstance(first, cst.Name):
                self._scopes[-1].mutated.add(first.value)
        elif (
            isinstance(func, cst.Attribute)
            and func.attr.value in _LIST_MUTATORS
            and isinstance(func.value, cst.Name)
        ):
            self._scopes[-1].mutated.add(func.value.value)

    def _is_range(self, value: cst.BaseExpression) -> bool:
        # the builtin: no import rebinds the name
        return (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Name)
            and value.func.value == "range"
            and "range" not in self.context.resolver.bindings
        )

    def _report_ranges(self, scope: _Scope) -> None:
        for name, calls in scope.ranges.items():
            if name not in scope.mutated:
                continue
            for call in calls:
                self.report(
                    call,
                    f"`{name}` is changed in place, but `range(...)` is a list only in Python 2: "
                    "in Python 3 it is a range object (TypeError: 'range' object does not "
                    "support item assignment); wrap it in `list(...)`",
                    replacement=_listed(call),
                )
