"""Small libcst tree helpers shared by rules."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from tfmigrate import tree

# Nodes that open a new function/class body: a walk can stop at them.
DEFINITIONS = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


def walk(node: cst.CSTNode, *, into_defs: bool = True) -> Iterator[cst.CSTNode]:
    """Pre-order, source-order walk of ``node`` (itself included); optionally not into nested
    functions, classes and lambdas."""
    return tree.walk(node, () if into_defs else DEFINITIONS)
