from __future__ import annotations

import libcst as cst

from tfmigrate.names import dotted
from tfmigrate.rule import Example, FixSafety, Rule
from tfmigrate.rules._keras2 import is_used

# Keras 2 modules that Keras 3 folded into a public package (None: nothing left to import).
MODULES: dict[str, str | None] = {
    "keras.backend.tensorflow_backend": "keras.backend",
    "keras.utils.training_utils": None,
    "keras.utils.multi_gpu_utils": None,
    "keras.utils.np_utils": "keras.utils",
    "keras.utils.generic_utils": "keras.utils",
    "keras.layers.core": "keras.layers",
    "keras.layers.convolutional": "keras.layers",
    "keras.layers.pooling": "keras.layers",
    "keras.layers.normalization": "keras.layers",
    "keras.layers.merge": "keras.layers",
    "keras.layers.recurrent": "keras.layers",
    # Keras 2's engine: its Layer, Input, InputSpec are keras.layers', its Model keras.models'
    "keras.engine": "keras.layers",
    "keras.engine.topology": "keras.layers",
    "keras.engine.base_layer": "keras.layers",
    "keras.engine.input_layer": "keras.layers",
    "keras.engine.training": "keras.models",
}
# Names that Keras 3 (and `tf.keras` in TF 2.16+) no longer has anywhere.
GONE = frozenset({"multi_gpu_model", "set_session", "get_session"})
_GONE_FROM = ("keras.", "tensorflow.keras.", "tensorflow.python.keras.", "tensorflow.contrib.keras.")


def _module_expr(name: str) -> cst.Attribute | cst.Name:
    expression = cst.parse_expression(name)
    assert isinstance(expression, cst.Attribute | cst.Name)
    return expression


class Keras2Imports(Rule):
    """
    ## What it does
    Flags imports that fail on Keras 3: Keras 2 modules that no longer exist
    (`keras.backend.tensorflow_backend`, `keras.utils.training_utils`, `keras.utils.np_utils`,
    `keras.layers.merge`, ...) and imported names that are gone (`multi_gpu_model`,
    `set_session`, `get_session`) once nothing uses them.

    ## Why is this bad?
    The import is the first line that runs: `ModuleNotFoundError: No module named
    'keras.backend.tensorflow_backend'` stops a script that no longer calls anything from it.
    Once TFM107 and TFM108 have converted `multi_gpu_model` and `set_session`, their imports are
    dead and break the program. A rule of its own because it must run after the others: it
    only removes what nothing uses any more.

    ## Example
    ```python
    import keras.backend.tensorflow_backend as KTF
    from keras.utils import multi_gpu_model
    from keras.layers.merge import concatenate
    ```
    Use instead:
    ```python
    from keras.layers import concatenate
    ```

    ## Fix safety
    Safe: a moved module is imported from its Keras 3 package under the same local name; an
    import whose names nothing reads is deleted. A used name that Keras 3 lacks (a remaining
    `set_session(...)`) keeps its import: the call is reported by its own rule.
    """

    code = "TFM114"
    # Reports only imports of Keras 2 modules, or of a gone name from a Keras package.
    triggers = ("keras*", *((f"{p[:-1]}*", g) for p in _GONE_FROM[1:] for g in sorted(GONE)))
    name = "keras2-imports"
    summary = "Keras 2 modules and names Keras 3 removed (keras.backend.tensorflow_backend, ...)"
    fix_safety = FixSafety.SAFE

    valid = (
        "from keras import backend as K\nfrom keras.layers import concatenate\n",
        # Still called: TFM107 reports the call; the import stays until it is converted.
        "from keras.utils import multi_gpu_model\nparallel = multi_gpu_model(model, gpus=2)\n",
        # A user's own module with a Keras-like path.
        "import keras\nfrom myproject.keras.utils.np_utils import to_categorical\n",
    )
    invalid = (
        # Keras 2's engine modules: a custom layer's base class.
        Example(
            """
            from keras.engine.topology import Layer
            from keras.engine.training import Model
            class YoloLayer(Layer):
                pass
            """,
            fixed="""
            from keras.layers import Layer
            from keras.models import Model
            class YoloLayer(Layer):
                pass
            """,
        ),
        Example(
            """
            import tensorflow as tf
            import keras.backend.tensorflow_backend as KTF
            from keras.utils import multi_gpu_model, to_categorical
            from keras.layers.merge import concatenate
            y = concatenate([a, to_categorical(b)])
            """,
            fixed="""
            import tensorflow as tf
            from keras.utils import to_categorical
            from keras.layers import concatenate
            y = concatenate([a, to_categorical(b)])
            """,
            message="ModuleNotFoundError",
        ),
        Example(
            """
            import keras.backend.tensorflow_backend as KTF
            from keras.utils.training_utils import multi_gpu_model
            KTF.clear_session()
            """,
            fixed="""
            import keras.backend as KTF
            KTF.clear_session()
            """,
        ),
        Example(
            """
            from keras.backend.tensorflow_backend import set_session
            from keras.utils.np_utils import to_categorical
            set_session(session)
            """,
            fixed="""
            from keras.backend import set_session
            from keras.utils import to_categorical
            set_session(session)
            """,
        ),
    )

    def visit_Import(self, node: cst.Import) -> None:
        names = []
        changed = False
        for alias in node.names:
            full = dotted(alias.name) or ""
            if full not in MODULES:
                names.append(alias)
                continue
            changed = True
            local = alias.asname.name.value if alias.asname and isinstance(
                alias.asname.name, cst.Name) else None
            new = MODULES[full]
            if local is None or new is None or not is_used(self.context.module, local):
                continue  # `import a.b.c` binds `a`, which other imports may bind too
            names.append(alias.with_changes(name=_module_expr(new)))
        if changed:
            self._fix(node, names, "an import of a Keras 2 module")

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = dotted(node.module) or ""
        moved = module in MODULES
        keep = []
        for alias in node.names:
            name = alias.name.value if isinstance(alias.name, cst.Name) else ""
            local = (
                alias.asname.name.value
                if alias.asname and isinstance(alias.asname.name, cst.Name)
                else name
            )
            gone = name in GONE and module.startswith(_GONE_FROM)
            if (gone or (moved and MODULES[module] is None)) and not is_used(
                self.context.module, local
            ):
                continue
            keep.append(alias)
        if len(keep) == len(node.names) and not moved:
            return
        new_module = MODULES.get(module) or module
        self._fix(
            node,
            keep,
            f"`from {module} import ...`",
            module=_module_expr(new_module) if new_module != module else None,
        )

    def _fix(
        self,
        node: cst.Import | cst.ImportFrom,
        names: list[cst.ImportAlias],
        what: str,
        module: cst.Attribute | cst.Name | None = None,
    ) -> None:
        message = (
            f"{what}: Keras 3 has no such module or name (ModuleNotFoundError/ImportError "
            "at start-up); import from its Keras 3 package, or drop it once nothing uses it"
        )
        line = self.parent(node)
        if not isinstance(line, cst.SimpleStatementLine):
            self.report(node, message)
            return
        if names:
            names = [*names[:-1], names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)]
            changes: dict[str, object] = {"names": names}
            if module is not None:
                changes["module"] = module
            if isinstance(node, cst.ImportFrom) and node.rpar is not None and len(names) < 2:
                changes["lpar"] = changes["rpar"] = None
            self.report(node, message, replacement=node.with_changes(**changes))
            return
        block = self.parent(line)
        if len(line.body) == 1 and isinstance(block, cst.IndentedBlock) and len(block.body) == 1:
            # The only statement of a block (`try:` around an import): keep the block valid.
            pass_line = line.with_changes(body=[cst.Pass()])
            self.report(node, message, replacement=pass_line, target=line)
        elif len(line.body) == 1:
            self.report(node, message, replacement=cst.RemoveFromParent(), target=line)
        else:
            self.report(node, message, replacement=cst.RemoveFromParent())
