"""Small libcst tree helpers shared by rules."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

# Nodes that open a new function/class body: a walk can stop at them.
DEFINITIONS = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


def walk(node: cst.CSTNode, *, into_defs: bool = True) -> Iterator[cst.CSTNode]:
    """Pre-order, source-order walk of ``node`` (itself included); optionally not into nested
    functions, classes and lambdas."""
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        yield current
        if not into_defs and current is not node and isinstance(current, DEFINITIONS):
            continue
        stack.extend(reversed(current.children))
