"""slim ``arg_scope`` read statically, for TFM303's Keras conversion of slim model functions.

Not a rule module. ``with slim.arg_scope([slim.conv2d, ...], k=v):`` changes the defaults of the
listed layer functions for the calls made under it; ``net_arg_scope(...)`` functions build such
scopes and return the innermost one (``as sc: return sc``). This reads both into a list of
(layer kinds, defaults) entries, outermost first, with the arg-scope function's parameters
replaced by the call's literal arguments or the function's defaults. What slim does with them
(checked on TF 2.21's compat layer with tf_slim): inner scopes override outer ones key by key,
an explicit argument of the layer call wins, and a dict argument such as ``normalizer_params``
is replaced whole, never merged. Anything not literal enough raises NotConvertible.

No TensorFlow import here (the rewrite path must not need it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard, cast

import libcst as cst

Qualify = Callable[[cst.BaseExpression], "str | None"]

# Layer functions that are one function under two names in slim.
_ALIASES = {"slim.convolution2d": "slim.conv2d"}


class NotConvertible(Exception):
    def __init__(self, node: cst.CSTNode, reason: str) -> None:
        super().__init__(reason)
        self.node = node
        self.reason = reason


def short_name(name: str | None) -> str | None:
    """``tensorflow.compat.v1.layers.dense`` -> ``layers.dense``; slim -> ``slim.<layer>``."""
    if name is None:
        return None
    for prefix in (
        "tensorflow.contrib.slim.layers.",
        "tensorflow.contrib.slim.",
        "tensorflow.contrib.layers.",
        "tf_slim.layers.",
        "tf_slim.",
    ):
        if name.startswith(prefix):
            short = "slim." + name[len(prefix) :]
            return _ALIASES.get(short, short)
    for prefix in ("tensorflow.compat.v1.", "tensorflow.compat.v2.", "tensorflow."):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return None


@dataclass(frozen=True)
class ArgScope:
    kinds: frozenset[str]  # short layer names (`slim.conv2d`)
    defaults: dict[str, cst.BaseExpression]


def defaults_for(kind: str, scopes: Iterable[ArgScope]) -> dict[str, cst.BaseExpression]:
    """The defaults the scopes give a `kind` layer call (inner scopes win, key by key)."""
    out: dict[str, cst.BaseExpression] = {}
    for scope in scopes:
        if kind in scope.kinds:
            out.update(scope.defaults)
    return out


def is_arg_scope(call: cst.BaseExpression, qualify: Qualify) -> TypeGuard[cst.Call]:
    return isinstance(call, cst.Call) and short_name(qualify(call.func)) == "slim.arg_scope"


class _Substitute(cst.CSTTransformer):
    """Names bound in `env` -> their expressions (not keywords, attribute names or dict keys)."""

    def __init__(self, env: dict[str, cst.BaseExpression]) -> None:
        super().__init__()
        self.env = env

    def leave_Name(self, original, updated):
        return self.env.get(updated.value, updated)

    def leave_Arg(self, original, updated):
        return updated.with_changes(keyword=original.keyword)

    def leave_Attribute(self, original, updated):
        return updated.with_changes(attr=original.attr)


def substitute(node: cst.BaseExpression, env: dict[str, cst.BaseExpression]) -> cst.BaseExpression:
    # _Substitute swaps names for expressions: an expression stays an expression
    return cast(cst.BaseExpression, node.visit(_Substitute(env))) if env else node


def _literal(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Integer | cst.Float | cst.SimpleString):
        return True
    if isinstance(node, cst.Name):
        return node.value in ("True", "False", "None")
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        return isinstance(node.expression, cst.Integer | cst.Float)
    return False


def entry(call: cst.Call, qualify: Qualify, env: dict[str, cst.BaseExpression]) -> ArgScope:
    """``slim.arg_scope([slim.conv2d, ...], k=v)`` -> its entry (values with `env` put in)."""
    if not call.args or call.args[0].keyword is not None:
        raise NotConvertible(call, "an arg_scope without its list of layer functions")
    ops = call.args[0].value
    if not isinstance(ops, cst.List | cst.Tuple):
        raise NotConvertible(call, "an arg_scope over something other than a literal list")
    kinds = set()
    for element in ops.elements:
        kind = short_name(qualify(element.value))
        if kind is None or not kind.startswith("slim."):
            raise NotConvertible(call, "an arg_scope over a function that is not a slim layer")
        kinds.add(kind)
    defaults = {}
    for arg in call.args[1:]:
        if arg.keyword is None or arg.star:
            raise NotConvertible(call, "an arg_scope argument that is not a keyword")
        defaults[arg.keyword.value] = substitute(arg.value, env)
    return ArgScope(frozenset(kinds), defaults)


def scopes_of(
    call: cst.Call,
    qualify: Qualify,
    functions: Mapping[str, cst.FunctionDef | tuple[cst.FunctionDef, Qualify]],
    env: dict[str, cst.BaseExpression] | None = None,
) -> list[ArgScope]:
    """The entries a ``slim.arg_scope(...)`` item opens: one for a literal list, the whole
    stack an arg-scope function returns for ``slim.arg_scope(net_arg_scope(...))``.
    `functions`: the arg-scope functions by the name the call uses; one of another module
    (``small_net.x_arg_scope``) comes with that module's qualify."""
    env = env or {}
    if len(call.args) == 1 and isinstance(call.args[0].value, cst.Call):
        inner = call.args[0].value
        key = cst.Module([]).code_for_node(inner.func)
        function = functions.get(key)
        if function is None:
            raise NotConvertible(call, f"an arg_scope from `{key}`, not a function read here")
        if isinstance(function, tuple):
            function, qualify = function
        return _evaluate(function, inner, qualify)
    return [entry(call, qualify, env)]


def _evaluate(function: cst.FunctionDef, call: cst.Call, qualify: Qualify) -> list[ArgScope]:
    """What ``net_arg_scope(...)`` returns, with the call's literal arguments."""
    params = function.params
    if params.star_kwarg or params.kwonly_params or isinstance(params.star_arg, cst.Param):
        raise NotConvertible(call, "an arg-scope function with *args / **kwargs")
    names = [p.name.value for p in params.params]
    env: dict[str, cst.BaseExpression] = {}
    for index, arg in enumerate(call.args):
        if arg.star or (arg.keyword is None and index >= len(names)):
            raise NotConvertible(call, "an arg-scope function call with *args / extra arguments")
        env[arg.keyword.value if arg.keyword else names[index]] = arg.value
    for param in params.params:
        if param.name.value not in env and param.default is not None:
            env[param.name.value] = param.default
    for name in names:
        value = env.get(name)
        if value is None or not _literal(value):
            raise NotConvertible(
                call, f"the arg-scope function's `{name}` is not given a literal value"
            )
    body = list(function.body.body)
    if function.get_docstring(clean=False) is not None:
        body = body[1:]
    found = _block(body, qualify, env, [])
    if found is None:
        raise NotConvertible(function, "an arg-scope function that does not return its scope")
    return found


def _block(
    body: Sequence[cst.CSTNode],  # a block's statements, or a one-line suite's small ones
    qualify: Qualify,
    env: dict[str, cst.BaseExpression],
    stack: list[ArgScope],
    returns: str | None = None,
) -> list[ArgScope] | None:
    for statement in body:
        if isinstance(statement, cst.With):
            inner, target = list(stack), None
            for item in statement.items:
                if not is_arg_scope(item.item, qualify):
                    raise NotConvertible(statement, "a `with` other than slim.arg_scope")
                inner.append(entry(item.item, qualify, env))
                if item.asname is not None and isinstance(item.asname.name, cst.Name):
                    target = item.asname.name.value
            found = _block(statement.body.body, qualify, env, inner, target or returns)
            if found is not None:
                return found
            continue
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if (
            isinstance(small, cst.Assign)
            and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Name)
        ):
            env[small.targets[0].target.value] = substitute(small.value, env)
            continue
        if isinstance(small, cst.Return) and isinstance(small.value, cst.Name):
            if small.value.value == returns:
                return stack
        raise NotConvertible(statement, "an arg-scope function with other statements")
    return None
