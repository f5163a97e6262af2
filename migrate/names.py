"""Resolve local spellings (``tf.contrib.slim``, ``K``, ``slim``) to canonical qualified names.

libcst's scope analysis is precise but costly and does not follow simple module aliases such as
``slim = tf.contrib.slim``. Legacy training scripts bind TensorFlow names in a handful of flat
ways, so one light, flow-insensitive pass over imports and dotted-name assignments is enough and
much cheaper.
"""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst

from tfmigrate import tree

# Spellings that name the same API. TF1 code reached the same symbol through several packages;
# rules match the canonical form on the right.
_CANONICAL_PREFIXES: tuple[tuple[str, str], ...] = (
    ("tensorflow.compat.v1.", "tensorflow."),
    ("tensorflow.compat.v1", "tensorflow"),
    ("tf_slim.", "tensorflow.contrib.slim."),
    ("tf_slim", "tensorflow.contrib.slim"),
    ("tensorflow.contrib.slim.layers.", "tensorflow.contrib.layers."),
    ("tensorflow.contrib.framework.python.ops.", "tensorflow.contrib.framework."),
    ("tensorflow.python.keras.", "tensorflow.keras."),
    ("keras.backend.tensorflow_backend.", "keras.backend."),
)

# Roots whose names rules care about. Aliases to anything else are ignored.
_TRACKED_ROOTS = ("tensorflow", "tf_slim", "keras", "horovod", "numpy")


def canonical(name: str) -> str:
    """Map an equivalent spelling of a TF/Keras name to the canonical one rules match on."""
    for prefix, replacement in _CANONICAL_PREFIXES:
        if name == prefix.rstrip("."):
            name = replacement.rstrip(".")
        elif name.startswith(prefix):
            name = replacement + name[len(prefix) :]
    return name


def dotted(node: cst.BaseExpression) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


def _module_name(node: cst.BaseExpression | None) -> str | None:
    return dotted(node) if node is not None else None


class NameResolver(cst.CSTVisitor):
    """Collects the bindings of one module: local name -> fully qualified name."""

    def __init__(self) -> None:
        super().__init__()
        self.bindings: dict[str, str] = {}
        self.imported_modules: set[str] = set()

    @classmethod
    def for_module(
        cls, module: cst.Module, inherited: dict[str, str] | None = None
    ) -> NameResolver:
        resolver = cls()
        if inherited:
            resolver.bindings.update(inherited)
            resolver.imported_modules.update(inherited.values())
        tree.visit(module, resolver)
        return resolver

    # -- collection ---------------------------------------------------------------------------
    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = _module_name(alias.name)
            if full is None:
                continue
            self.imported_modules.add(full)
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self.bindings[alias.asname.name.value] = full
            else:
                # `import a.b.c` binds `a`; `a.b.c` then resolves through it.
                head = full.split(".")[0]
                self.bindings.setdefault(head, head)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None:
            return  # relative imports name the user's own modules
        module = _module_name(node.module)
        if module is None or isinstance(node.names, cst.ImportStar):
            if module is not None:
                self.imported_modules.add(module)
            return
        self.imported_modules.add(module)
        for alias in node.names:
            name = _module_name(alias.name)
            if name is None:
                continue
            local = name
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
            self.bindings[local] = f"{module}.{name}"

    def visit_Assign(self, node: cst.Assign) -> None:
        # `slim = tf.contrib.slim`, `layers = tf.contrib.layers`: plain module/function aliases.
        if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Name):
            return
        target = node.targets[0].target.value
        resolved = self.resolve_dotted(dotted(node.value))
        if resolved is not None and resolved.split(".")[0] in _TRACKED_ROOTS:
            self.bindings.setdefault(target, resolved)

    # -- queries ------------------------------------------------------------------------------
    def resolve_dotted(self, name: str | None) -> str | None:
        """``tf.contrib.slim`` -> ``tensorflow.contrib.slim`` (as imported, not canonicalized)."""
        if name is None:
            return None
        head, _, rest = name.partition(".")
        bound = self.bindings.get(head)
        if bound is None:
            return None
        return f"{bound}.{rest}" if rest else bound

    def qualify(self, node: cst.BaseExpression) -> str | None:
        """Canonical qualified name of a Name/Attribute chain bound to an import, else None."""
        resolved = self.resolve_dotted(dotted(node))
        return canonical(resolved) if resolved is not None else None

    def uses_any(self, roots: Iterable[str]) -> bool:
        roots = tuple(roots)
        return any(canonical(m).startswith(roots) for m in self.imported_modules)

    def local_name_for(self, qualified: str) -> str | None:
        """The local spelling of a module, e.g. ``tf`` for ``tensorflow`` (None if not bound)."""
        for local, bound in self.bindings.items():
            if canonical(bound) == qualified:
                return local
        return None
