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
    reads = _Reads(name)
    tree.visit(module, reads)
    return reads.count > 0
