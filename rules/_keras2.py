"""Shared by the Keras 2 → Keras 3 rules (TFM112–TFM114): what a local name is used for."""

from __future__ import annotations

import libcst as cst

from tfmigrate import tree


class _Reads(cst.CSTVisitor):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.count = 0

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        tree.visit(node.value, self)  # `.attr` is not a use of a variable of that name
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        tree.visit(node.value, self)  # `f(name=...)`: the keyword is not a use
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.count += node.value == self.name


def is_used(module: cst.Module, name: str) -> bool:
    """Whether ``name`` is read anywhere outside import statements (flow-insensitive)."""
    return reads(module, name)


def reads(node: cst.CSTNode, name: str) -> bool:
    """Whether ``name`` is read anywhere in ``node`` outside import statements."""
    found = _Reads(name)
    tree.visit(node, found)
    return found.count > 0


# Keras 2's RMSprop (standalone Keras 2, and tf.keras 2 without momentum) stepped
# lr * g / (sqrt(ms) + epsilon); Keras 3 steps lr * g / sqrt(ms + epsilon), at any momentum.
RMSPROP_NOTE = (
    "Keras 2's `RMSprop` without momentum stepped `lr * g / (sqrt(ms) + epsilon)`, Keras 3's "
    "steps `lr * g / sqrt(ms + epsilon)`: the steps differ wherever gradients are small (near "
    "`sqrt(epsilon / (1 - rho))`, 1e-3 at the defaults) and no Keras 3 setting reproduces it "
    "(`epsilon=epsilon**2` narrows the gap)"
)


def plain_rmsprop(node: cst.BaseExpression, qualified: str | None) -> bool:
    """Whether ``node`` (a compile's `optimizer`) is a Keras RMSprop without momentum: the
    string `'rmsprop'` or a `keras.optimizers.RMSprop(...)` call (``qualified``: its name)."""
    if isinstance(node, cst.SimpleString):
        return str(node.evaluated_value).lower() == "rmsprop"
    if not isinstance(node, cst.Call) or not (qualified or "").endswith("optimizers.RMSprop"):
        return False
    for arg in node.args:
        if arg.keyword is not None and arg.keyword.value == "momentum":
            value = arg.value
            return isinstance(value, cst.Integer | cst.Float) and value.evaluated_value == 0
    # tf.keras 2's positional order: learning_rate, rho, momentum
    positional = [a for a in node.args if a.keyword is None]
    return len(positional) < 3
