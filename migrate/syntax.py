"""Small libcst tree helpers shared by rules."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import libcst as cst

from tfmigrate import tree

# Nodes that open a new function/class body: a walk can stop at them.
DEFINITIONS = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


def walk(node: cst.CSTNode, *, into_defs: bool = True) -> Iterator[cst.CSTNode]:
    """Pre-order, source-order walk of ``node`` (itself included); optionally not into nested
    functions, classes and lambdas."""
    return tree.walk(node, () if into_defs else DEFINITIONS)


def carried_lines(
    carried: Sequence[cst.EmptyLine], own: Sequence[cst.EmptyLine]
) -> list[cst.EmptyLine]:
    """The leading lines of a statement that takes the place of removed ones: theirs before its
    own -- only their comments when it has spacing of its own."""
    if own:
        carried = [line for line in carried if line.comment]
    return [*carried, *own]


def unindented(lines: Sequence[cst.EmptyLine]) -> list[cst.EmptyLine]:
    """Leading lines moved into a deeper block: the blank ones must not gain its indentation."""
    return [line.with_changes(indent=False) if line.comment is None else line for line in lines]
