"""Shared by the rules that check names against TensorFlow's data files (TFM301, TFM302, TFM205).

They need what the canonical names hide: the spelling as *imported* (``tf.Session`` under
``import tensorflow as tf`` needs a rename, under ``import tensorflow.compat.v1 as tf`` it does
not), and whether a file is TF1 or TF2 code, which decides which of the rules speaks.
"""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst

from tfmigrate import tfapi
from tfmigrate.names import dotted
from tfmigrate.rule import Rule

COMPAT_V1 = "tensorflow.compat.v1"
# Graph-mode TF1 entry points: a file using them through tf.compat.v1 is still TF1 code.
_GRAPH_MODE = ("disable_v2_behavior", "disable_eager_execution", "Session", "placeholder")
_KERAS2 = ("keras.backend.tensorflow_backend", "tensorflow.keras.backend.set_session")
_TF2_PREFIXES = ("tf.distribute", "tf.keras", "tf.function")


def raw_name(resolver, node: cst.BaseExpression) -> tuple[str, str] | None:
    """(imported spelling, local binding path) of a Name/Attribute chain, not canonicalized:
    ``tf.Session`` -> ("tensorflow.Session", "tensorflow")."""
    name = dotted(node)
    resolved = resolver.resolve_dotted(name)
    if resolved is None or name is None:
        return None
    return resolved, resolver.bindings[name.partition(".")[0]]


def tf1_symbol(name: str) -> str | None:
    """The prefix of a tf-spelled name that TF 2.x no longer has but TF1 had."""
    found = tfapi.tf2_rename(name)
    if found is not None and tfapi.exists(found[0]) is False:
        return found[0]
    return None


def classify(raw_names: Iterable[str], imported: Iterable[str]) -> str | None:
    """ "tf1", "tf2" or None (neither). TF1 wins: a file that still opens a Session or uses
    renamed TF1 symbols is migrated by TFM1xx/TFM301, not linted as TF2 code."""
    tf1 = tf2 = False
    for module in imported:
        if module.startswith(COMPAT_V1) or module.startswith(_KERAS2):
            tf1 = True
        elif module == "keras" or module.startswith("keras."):
            tf2 = True
        elif tfapi.tf_spelling(module).startswith(_TF2_PREFIXES):
            tf2 = True
    for raw in raw_names:
        if raw.startswith(COMPAT_V1):
            tf1 = tf1 or raw.rsplit(".", 1)[-1] in _GRAPH_MODE
        elif raw.startswith(_KERAS2) or raw.endswith("multi_gpu_model"):
            tf1 = True
        elif raw.startswith("tensorflow."):
            name = tfapi.tf_spelling(raw)
            if not name.startswith("tf.contrib") and tf1_symbol(name):
                tf1 = True
            tf2 = tf2 or name.startswith(_TF2_PREFIXES)
        elif raw.startswith("keras."):
            tf2 = True
    if tf1:
        return "tf1"
    return "tf2" if tf2 else None


_NOT_A_USE = (cst.ImportAlias, cst.ImportFrom, cst.AsName)


def build_chain(name: str) -> cst.BaseExpression:
    parts = name.split(".")
    node: cst.BaseExpression = cst.Name(parts[0])
    for part in parts[1:]:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


class ApiNameRule(Rule):
    """Collects every maximal name chain bound to an import, then lets the subclass decide in
    :meth:`finish` once the whole file (and so its TF1/TF2 kind) is known."""

    def __init__(self, context) -> None:
        super().__init__(context)
        self.chains: list[tuple[cst.BaseExpression, str, str]] = []  # node, raw, binding
        self.imports: list[tuple[cst.CSTNode, str]] = []  # node, imported raw name

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            name = dotted(alias.name)
            if name is not None:
                self.imports.append((alias, name))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = dotted(node.module) if node.module is not None and not node.relative else None
        if module is not None and not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                name = dotted(alias.name)
                if name is not None:
                    self.imports.append((alias, f"{module}.{name}"))

    # Batched visitors cannot prune subtrees (visit_* return values are ignored): names inside
    # import statements are skipped by their parent's type instead.
    def visit_Attribute(self, node: cst.Attribute) -> None:
        parent = self.parent(node)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            return  # part of a longer chain
        if isinstance(parent, _NOT_A_USE):
            return
        self._collect(node)

    def visit_Name(self, node: cst.Name) -> None:
        parent = self.parent(node)
        if isinstance(parent, cst.Attribute | cst.Param | cst.FunctionDef | cst.ClassDef):
            return
        if isinstance(parent, _NOT_A_USE):
            return
        if isinstance(parent, cst.Arg) and parent.keyword is node:
            return
        self._collect(node)

    def _collect(self, node: cst.BaseExpression) -> None:
        found = raw_name(self.context.resolver, node)
        if found is not None and found[0].split(".")[0] in ("tensorflow", "keras"):
            self.chains.append((node, found[0], found[1]))

    def leave_Module(self, original_node: cst.Module) -> None:
        kind = classify(
            [raw for _, raw, _ in self.chains],
            [name for _, name in self.imports],
        )
        self.finish(kind)

    def finish(self, kind: str | None) -> None:
        raise NotImplementedError


def contrib_advice(name: str) -> str:
    """What TF's tables (or the tf_slim package) say about a ``tf.contrib`` symbol."""
    note = tfapi.warning(name)
    if note:
        return note.removeprefix("(Manual edit required) ")
    slim = tfapi.tf_slim_name(name)
    if slim is not None:
        return f"`{slim}` carries it (pip install tf-slim), or rewrite it with Keras"
    deprecation = tfapi.module_deprecation(name)
    if deprecation is not None and deprecation[0] != "tf.contrib":
        return deprecation[1].removeprefix("(Manual edit required) ")
    return "use a TF2 or Keras equivalent, TensorFlow Addons, or a copy of the code"


def strip_compat_v1(raw: str) -> str:
    return "tensorflow" + raw[len(COMPAT_V1) :] if raw.startswith(COMPAT_V1) else raw
