"""Static legacy variable names of TF1 model code, for the manifest's ``variables`` mapping.

Not a rule module. The migrated program creates its variables under the legacy names (see
TFM303), so the mapping is the identity -- but verify needs the names listed, and the rewrite
path must not import TensorFlow. This follows ``tf.variable_scope('literal')`` and
``tf.get_variable('literal', ...)`` through the user's own module-level functions (binding
literal string arguments to parameters), and the layers whose variable names are fixed by a
literal ``name=``/``scope=``. Anything else makes the answer unknown (None): a wrong list would
make verify compare the wrong things.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import libcst as cst

from tfmigrate.rules._towers import get_arg, walk


class Unknown(Exception):
    pass


def _flag(call: cst.Call, keyword: str, default: bool) -> bool:
    value = get_arg(call, None, keyword)
    if value is None:
        return default
    if isinstance(value, cst.Name) and value.value in ("True", "False"):
        return value.value == "True"
    raise Unknown


def _fully_connected(call: cst.Call) -> list[str]:
    # A normalizer_fn or another biases_initializer changes which variables exist.
    if get_arg(call, None, "normalizer_fn") is not None:
        raise Unknown
    if get_arg(call, None, "biases_initializer") is not None:
        raise Unknown
    return ["weights", "biases"]


def _batch_norm(call: cst.Call) -> list[str]:
    # slim / contrib batch_norm defaults: center=True, scale=False.
    names = ["beta"] if _flag(call, "center", True) else []
    names += ["gamma"] if _flag(call, "scale", False) else []
    return [*names, "moving_mean", "moving_variance"]


def _dense(call: cst.Call) -> list[str]:
    return ["kernel", "bias"] if _flag(call, "use_bias", True) else ["kernel"]


def _batch_normalization(call: cst.Call) -> list[str]:
    # tf.layers.batch_normalization defaults: center=True, scale=True.
    names = ["gamma"] if _flag(call, "scale", True) else []
    names += ["beta"] if _flag(call, "center", True) else []
    return [*names, "moving_mean", "moving_variance"]


# tf.layers functions: variables `<name>/<suffix>` (the scope from `name=`).
_LAYERS: dict[str, Callable[[cst.Call], list[str]]] = {
    "tensorflow.layers.dense": _dense,
    "tensorflow.layers.batch_normalization": _batch_normalization,
}

# tf.contrib.layers / slim layers (tf_slim today): variables `<scope>/<name>`, scope by keyword.
_SLIM: dict[str, Callable[[cst.Call], list[str]]] = {
    "fully_connected": _fully_connected,
    "batch_norm": _batch_norm,
}


def _slim_layer(name: str) -> str | None:
    for prefix in ("tensorflow.contrib.slim.", "tensorflow.contrib.layers.", "tf_slim."):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return None


# Imports that never hold the project's model code.
_LIBRARIES = frozenset({"tensorflow", "numpy", "six", "tf_slim", "keras", "tf_keras", "__future__"})


def _user_imports(module: cst.Module) -> set[str]:
    """Names bound by imports of the project's own modules (``import model``)."""
    code = module.code_for_node
    found: set[str] = set()
    for statement in module.body:
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if isinstance(small, cst.Import):
            for alias in small.names:
                dotted = code(alias.name)
                if not _is_library(dotted):
                    found.add(alias.asname.name.value if alias.asname else dotted.split(".")[0])  # type: ignore[union-attr]
        elif isinstance(small, cst.ImportFrom) and isinstance(small.names, list | tuple):
            dotted = code(small.module) if small.module is not None else ""
            if small.relative or not _is_library(dotted):
                for alias in small.names:
                    bound = alias.asname.name if alias.asname else alias.name  # type: ignore[union-attr]
                    found.add(code(bound))
    return found


def _is_library(dotted: str) -> bool:
    root = dotted.split(".")[0]
    return root in _LIBRARIES or root in sys.stdlib_module_names


def _root_name(node: cst.BaseExpression) -> str | None:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else None


class VariableNames:
    def __init__(
        self, module: cst.Module, qualify: Callable[[cst.BaseExpression], str | None]
    ) -> None:
        self.functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
        self.qualify = qualify
        # arg_scope can change any slim layer's defaults (and so which variables it makes).
        self.arg_scoped = any(
            isinstance(n, cst.Name) and n.value == "arg_scope" for n in walk(module)
        )
        self.user_modules = _user_imports(module)
        self.names: list[str] = []
        self.non_trainable: set[str] = set()
        self.templates: dict[str, tuple[list[str], cst.FunctionDef]] = {}
        self._depth = 0

    def run(self, statements: list[cst.BaseStatement]) -> list[str] | None:
        try:
            self._block(statements, [], {})
        except (Unknown, RecursionError):
            return None
        return list(dict.fromkeys(self.names))

    def _block(self, statements, scopes: list[str], env: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
        for statement in statements:
            self._statement(statement, scopes, env)

    def _statement(self, node: cst.CSTNode, scopes: list[str], env: dict[str, str]) -> None:
        if isinstance(node, cst.With):
            inner = list(scopes)
            for item in node.items:
                self._expr(item.item, scopes, env)
                if isinstance(item.item, cst.Call):
                    name = self.qualify(item.item.func)
                    if name == "tensorflow.variable_scope":
                        inner += self._scope_name(item.item, env)
            self._block(node.body.body, inner, env)  # type: ignore[union-attr]
            return
        if isinstance(node, cst.FunctionDef | cst.ClassDef):
            raise Unknown  # a nested definition may create variables when called later
        if isinstance(node, cst.SimpleStatementLine):
            for small in node.body:
                if not self._template(small, scopes):
                    self._expr(small, scopes, env)
            return
        for child in node.children:
            if isinstance(child, cst.BaseSuite):
                self._block(child.body, scopes, env)  # type: ignore[arg-type]
            elif isinstance(child, cst.BaseExpression):
                self._expr(child, scopes, env)
            elif isinstance(child, cst.If | cst.Else):
                self._statement(child, scopes, env)

    def _template(self, small: cst.BaseSmallStatement, scopes: list[str]) -> bool:
        """``net = tf.make_template('net', network)``: calls of ``net`` build ``network``
        under ``<scopes at creation>/net`` (the first call creates, later ones reuse)."""
        if not (
            isinstance(small, cst.Assign)
            and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Name)
            and isinstance(small.value, cst.Call)
            and self.qualify(small.value.func) == "tensorflow.make_template"
        ):
            return False
        call = small.value
        name = get_arg(call, 0, "name_")
        function = get_arg(call, 1, "func_")
        if (
            len(call.args) != 2
            or not isinstance(name, cst.SimpleString)
            or not isinstance(function, cst.Name)
            or function.value not in self.functions
        ):
            raise Unknown
        target = small.targets[0].target.value  # type: ignore[union-attr]
        self.templates[target] = ([*scopes, name.evaluated_value], self.functions[function.value])  # type: ignore[list-item]
        return True

    def _scope_name(self, call: cst.Call, env: dict[str, str]) -> list[str]:
        arg = get_arg(call, 0, "name_or_scope")
        if isinstance(arg, cst.Call) and self.qualify(arg.func) == "tensorflow.get_variable_scope":
            return []
        return [self._string(arg, env)]

    def _string(self, node: cst.BaseExpression | None, env: dict[str, str]) -> str:
        if isinstance(node, cst.SimpleString):
            return node.evaluated_value  # type: ignore[return-value]
        if isinstance(node, cst.Name) and node.value in env:
            return env[node.value]
        raise Unknown

    def _expr(self, node: cst.CSTNode, scopes: list[str], env: dict[str, str]) -> None:
        # Arguments first, as Python evaluates them.
        for child in node.children:
            if not isinstance(child, cst.BaseSuite):
                self._expr(child, scopes, env)
        if isinstance(node, cst.Lambda):
            return
        if not isinstance(node, cst.Call):
            return
        name = self.qualify(node.func)
        if name == "tensorflow.get_variable":
            variable = self._string(get_arg(node, 0, "name"), env)
            self._add(scopes, variable)
            trainable = get_arg(node, None, "trainable")
            if isinstance(trainable, cst.Name) and trainable.value == "False":
                self.non_trainable.add("/".join([*scopes, variable]))
            elif trainable is not None and not isinstance(trainable, cst.Name):
                raise Unknown
        elif name in (
            "tensorflow.train.get_or_create_global_step",
            "tensorflow.train.create_global_step",
        ):
            if scopes or node.args:
                raise Unknown
            self._add([], "global_step")
            self.non_trainable.add("global_step")
        elif isinstance(node.func, cst.Name) and node.func.value in self.templates:
            template_scopes, function = self.templates[node.func.value]
            self._call(function, node, template_scopes, env)
        elif name in _LAYERS:
            scope = self._string(get_arg(node, None, "name"), env)
            for suffix in _LAYERS[name](node):
                self._add(scopes, f"{scope}/{suffix}")
                if suffix.startswith("moving_"):
                    self.non_trainable.add("/".join([*scopes, scope, suffix]))
        elif name is not None and _slim_layer(name) in _SLIM:
            if self.arg_scoped:
                raise Unknown
            scope = self._string(get_arg(node, None, "scope"), env)
            for suffix in _SLIM[_slim_layer(name)](node):  # type: ignore[index]
                self._add(scopes, f"{scope}/{suffix}")
                if suffix.startswith("moving_"):
                    self.non_trainable.add("/".join([*scopes, scope, suffix]))
        elif name is not None and name.endswith(("_regularizer", "_initializer")):
            return  # makes a function (for get_variable), no variable
        elif name is not None and name.startswith(("tensorflow.contrib.", "tensorflow.layers.")):
            raise Unknown  # creates variables under names this reader does not model yet
        elif name == "tensorflow.make_template":
            raise Unknown
        elif isinstance(node.func, cst.Name) and node.func.value in self.functions:
            self._call(self.functions[node.func.value], node, scopes, env)
        elif _root_name(node.func) in self.user_modules:
            raise Unknown  # the project's own module (`model.build(...)`): not read from here

    def _call(self, function: cst.FunctionDef, call: cst.Call, scopes, env) -> None:  # type: ignore[no-untyped-def]
        self._depth += 1
        if self._depth > 20:
            raise Unknown
        params = [p.name.value for p in function.params.params]
        bound: dict[str, str] = {}
        positional = [a for a in call.args if a.keyword is None]
        if any(a.star for a in call.args):
            raise Unknown
        for param, arg in zip(params, positional, strict=False):
            if isinstance(arg.value, cst.SimpleString | cst.Name):
                try:
                    bound[param] = self._string(arg.value, env)
                except Unknown:
                    pass
        for arg in call.args:
            if arg.keyword is not None and isinstance(arg.value, cst.SimpleString):
                bound[arg.keyword.value] = arg.value.evaluated_value  # type: ignore[assignment]
        for param in function.params.params:
            if param.name.value not in bound and isinstance(param.default, cst.SimpleString):
                bound[param.name.value] = param.default.evaluated_value  # type: ignore[assignment]
        self._block(function.body.body, scopes, bound)  # type: ignore[arg-type]
        self._depth -= 1

    def _add(self, scopes: list[str], name: str) -> None:
        self.names.append("/".join([*scopes, name]))
