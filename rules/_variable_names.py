"""Static legacy variable names of TF1 model code, for the manifest's ``variables`` mapping.

Not a rule module. The migrated program creates its variables under the legacy names (see
TFM303), so the mapping is the identity -- but verify needs the names listed, and the rewrite
path must not import TensorFlow. This follows ``tf.variable_scope('literal')`` and
``tf.get_variable('literal', ...)`` through the user's own module-level functions (binding
literal string arguments to parameters), slim ``arg_scope``s, and the layers whose variable
names are fixed by a literal ``name=``/``scope=``: which variables a layer call creates comes
from the Keras conversion's own mapping (:func:`._keras_model_emit.layer_variables`, one
table). Anything else makes the answer unknown (None): a wrong list would make verify compare
the wrong things.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import cast

import libcst as cst

from tfmigrate.rules._keras_model_emit import LAYER_KINDS, layer_variables
from tfmigrate.rules._slim_arg_scope import (
    ArgScope,
    NotConvertible,
    Qualify,
    is_arg_scope,
    scopes_of,
)
from tfmigrate.rules._slim_arg_scope import short_name as _short
from tfmigrate.rules._static_loops import NotStatic, unroll
from tfmigrate.rules._towers import get_arg


class Unknown(Exception):
    pass


# Imports that never hold the project's model code.
_LIBRARIES = frozenset({"tensorflow", "numpy", "six", "tf_slim", "keras", "tf_keras", "__future__"})


def _text(node: cst.SimpleString) -> str:
    """A string literal's value; a bytes literal names no variable scope."""
    value = node.evaluated_value
    if not isinstance(value, str):
        raise Unknown
    return value


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
                    # `import m as n`: libcst's AsName also serves `with` and `except`, whose
                    # targets may be tuples; an import's is a Name
                    alias_name = cast(cst.Name, alias.asname.name) if alias.asname else None
                    found.add(alias_name.value if alias_name else dotted.split(".")[0])
        elif isinstance(small, cst.ImportFrom) and isinstance(small.names, list | tuple):
            dotted = code(small.module) if small.module is not None else ""
            if small.relative or not _is_library(dotted):
                for alias in small.names:
                    bound = alias.asname.name if alias.asname else alias.name
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
        self.module = module
        self.qualify = qualify
        # slim arg_scopes change layer defaults (and so which variables a layer makes).
        self.arg_scopes: list[ArgScope] = []
        # functions of a model module, by the script's spelling (`small_net.small_net`)
        self.imported: dict[str, tuple[cst.FunctionDef, VariableNames]] = {}
        self.user_modules = _user_imports(module)
        self.names: list[str] = []
        self.non_trainable: set[str] = set()
        self.templates: dict[str, tuple[list[str], cst.FunctionDef]] = {}
        self._depth = 0

    def import_functions(self, module: cst.Module, qualify: Qualify, access: str) -> None:
        """Follow calls of `module`'s functions made as ``<access>.<name>(...)``."""
        reader = VariableNames(module, qualify)
        for name, function in reader.functions.items():
            self.imported[f"{access}.{name}"] = (function, reader)

    def run(self, statements: list[cst.BaseStatement]) -> list[str] | None:
        try:
            self._block(statements, [], {})
        except (Unknown, RecursionError):
            return None
        return list(dict.fromkeys(self.names))

    def _block(self, statements, scopes: list[str], env: dict[str, str]) -> None:
        for statement in statements:
            self._statement(statement, scopes, env)

    def _statement(self, node: cst.CSTNode, scopes: list[str], env: dict[str, str]) -> None:
        if isinstance(node, cst.With):
            inner = list(scopes)
            outer_arg_scopes = self.arg_scopes
            for item in node.items:
                self._expr(item.item, scopes, env)
                if isinstance(item.item, cst.Call):
                    name = self.qualify(item.item.func)
                    if name == "tensorflow.variable_scope":
                        inner += self._scope_name(item.item, env)
                    elif is_arg_scope(item.item, self.qualify):
                        functions: dict[str, cst.FunctionDef | tuple[cst.FunctionDef, Qualify]]
                        functions = {
                            **self.functions,
                            **{k: (f, r.qualify) for k, (f, r) in self.imported.items()},
                        }
                        try:
                            entries = scopes_of(item.item, self.qualify, functions)
                        except NotConvertible as exc:
                            raise Unknown from exc
                        self.arg_scopes = [*self.arg_scopes, *entries]
            try:
                self._block(node.body.body, inner, env)
            finally:
                self.arg_scopes = outer_arg_scopes
            return
        if isinstance(node, cst.FunctionDef | cst.ClassDef):
            raise Unknown  # a nested definition may create variables when called later
        if isinstance(node, cst.For):
            try:  # a loop over a literal list: each iteration's names (as the conversion does)
                self._block(unroll(node), scopes, env)
                return
            except NotStatic:
                pass  # read once, as before: its layer names are not literal, so unknown
        if isinstance(node, cst.SimpleStatementLine):
            for small in node.body:
                if not self._template(small, scopes):
                    self._expr(small, scopes, env)
            return
        for child in node.children:
            if isinstance(child, cst.BaseSuite):
                self._block(child.body, scopes, env)
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
        target = small.targets[0].target.value
        self.templates[target] = ([*scopes, _text(name)], self.functions[function.value])
        return True

    def _scope_name(self, call: cst.Call, env: dict[str, str]) -> list[str]:
        arg = get_arg(call, 0, "name_or_scope")
        if isinstance(arg, cst.Call) and self.qualify(arg.func) == "tensorflow.get_variable_scope":
            return []
        return [self._string(arg, env)]

    def _string(self, node: cst.BaseExpression | None, env: dict[str, str]) -> str:
        if isinstance(node, cst.SimpleString):
            return _text(node)
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
        elif _short(name) in LAYER_KINDS:
            try:
                made = layer_variables(node, self.qualify, self.module, env, self.arg_scopes)
            except NotConvertible as exc:
                raise Unknown from exc
            for variable, is_trainable in made:
                self._add(scopes, variable)
                if not is_trainable:
                    self.non_trainable.add("/".join([*scopes, variable]))
        elif _short(name) == "slim.arg_scope":
            return  # read with its `with` statement
        elif name is not None and name.endswith(("_regularizer", "_initializer")):
            return  # makes a function (for get_variable), no variable
        elif name is not None and name.startswith(("tensorflow.contrib.", "tensorflow.layers.")):
            raise Unknown  # creates variables under names this reader does not model yet
        elif name == "tensorflow.make_template":
            raise Unknown
        elif isinstance(node.func, cst.Name) and node.func.value in self.functions:
            self._call(self.functions[node.func.value], node, scopes, env)
        elif self.module.code_for_node(node.func) in self.imported:
            function, reader = self.imported[self.module.code_for_node(node.func)]
            # the model module's own reader, collecting into this one
            reader.names, reader.non_trainable = self.names, self.non_trainable
            reader.arg_scopes, reader._depth = self.arg_scopes, self._depth
            reader._call(function, node, scopes, {})
        elif _root_name(node.func) in self.user_modules:
            raise Unknown  # the project's own module (`model.build(...)`): not read from here

    def _call(self, function: cst.FunctionDef, call: cst.Call, scopes, env) -> None:
        self._depth += 1
        if self._depth > 20:
            raise Unknown
        params = [p.name.value for p in function.params.params]
        bound: dict[str, str] = {}
        positional = [a for a in call.args if a.keyword is None]
        if any(a.star for a in call.args):
            raise Unknown
        for param_name, arg in zip(params, positional, strict=False):
            if isinstance(arg.value, cst.SimpleString | cst.Name):
                try:
                    bound[param_name] = self._string(arg.value, env)
                except Unknown:
                    pass
        for arg in call.args:
            if arg.keyword is not None and isinstance(arg.value, cst.SimpleString):
                bound[arg.keyword.value] = _text(arg.value)
        for param in function.params.params:
            if param.name.value not in bound and isinstance(param.default, cst.SimpleString):
                bound[param.name.value] = _text(param.default)
        self._block(function.body.body, scopes, bound)
        self._depth -= 1

    def _add(self, scopes: list[str], name: str) -> None:
        self.names.append("/".join([*scopes, name]))
