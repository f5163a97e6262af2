"""Reading a Keras program's `fit` (not a rule module: the leading underscore keeps the registry
from loading it)."""

from __future__ import annotations

import libcst as cst

FIT_METHODS = frozenset({"fit", "fit_generator"})


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
