"""tf.get_variable model functions -> Keras models that own their variables (TFM303).

Not a rule module. The CIFAR-10 tutorial style of model code has no layers to map: variables
come from ``tf.get_variable`` (directly or through helpers such as
``_variable_with_weight_decay``, which may also put ``wd * l2_loss(var)`` in a ``'losses'``
collection) inside ``with tf.variable_scope('conv1'):`` blocks, and the computation is plain
``tf.nn`` / ``tf.matmul``. :func:`plan_weights` turns such a function into a ``keras.Model``
whose ``build()`` creates every variable with ``add_weight`` (one plain Keras layer per legacy
variable scope owns its weights, so that ``conv1/weights`` becomes the weight path
``<model>/conv1/weights``), and whose ``call()`` keeps the TF1 computation over those weights.
The weight decay becomes a Keras regularizer read through ``model.losses`` where the legacy code
read its collection. Anything it does not know returns the reason the TF1 code stays.

No TensorFlow import here (the rewrite path must not need it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import cast

import libcst as cst

from tfmigrate.names import NameResolver
from tfmigrate.rules._imported_model import ImportedModel, module_names, renamed_module
from tfmigrate.rules._keras_model_emit import KerasModel, NotConvertible, Qualify, _camel, _Reader
from tfmigrate.rules._keras_model_plan import KerasPlan, _call_scopes, _line, _unscoped
from tfmigrate.rules._tower_program import Program
from tfmigrate.rules._towers import (
    bind_arguments,
    bound_names,
    free_names,
    get_arg,
    walk,
)
from tfmigrate.rules._variable_names import VariableNames

_GET_VARIABLE = "tensorflow.get_variable"
_VARIABLE_SCOPE = "tensorflow.variable_scope"
_ADD = "tensorflow.add_to_collection"
_GET = "tensorflow.get_collection"
# Calls that must not stay in call(): they make or find TF1 variables, scopes or collections.
_TF1_STATE = (
    _GET_VARIABLE, _VARIABLE_SCOPE, _ADD, _GET, "tensorflow.get_variable_scope",
    "tensorflow.Variable", "tensorflow.make_template", "tensorflow.add_to_collections",
)  # fmt: skip
# Attribute names a keras.Model already has.
_RESERVED = frozenset(
    {"build", "call", "layers", "weights", "losses", "name", "trainable", "variables", "input",
     "output", "dtype", "path", "built", "metrics", "optimizer", "loss"}
)  # fmt: skip


@dataclass
class Weight:
    scope: str | None  # the legacy variable scope (and the Keras layer owning the weight)
    name: str  # the legacy variable name inside it (and the Keras weight name)
    shape: cst.BaseExpression
    initializer: str  # Keras spelling
    trainable: bool = True
    decay: cst.BaseExpression | None = None  # wd in `wd * tf.nn.l2_loss(var)`
    collection: str | None = None  # where the legacy code put that decay
    attribute: str = ""

    @property
    def legacy(self) -> str:
        return f"{self.scope}/{self.name}" if self.scope else self.name


class _Helpers:
    """Evaluates calls of the module's variable helpers (`_variable_on_cpu`, ...) for one
    call site: arguments bound to parameters, the helper's statements read in order."""

    # reader None: a probe that only tells helpers apart (it reads no initializer)
    def __init__(
        self, functions: dict[str, cst.FunctionDef], qualify: Qualify, reader: _Reader | None
    ):
        self.functions, self.qualify, self.reader = functions, qualify, reader
        self.used: set[str] = set()

    def creates(self, function: cst.FunctionDef) -> bool:
        return any(
            isinstance(n, cst.Call)
            and (
                self.qualify(n.func) == _GET_VARIABLE
                or (
                    isinstance(n.func, cst.Name)
                    and n.func.value in self.functions
                    and self.functions[n.func.value] is not function
                    and self.creates(self.functions[n.func.value])
                )
            )
            for n in walk(function)
        )

    def variable(
        self, call: cst.Call, scope: str | None, env: dict[str, cst.BaseExpression]
    ) -> Weight:
        """The weight a `get_variable(...)` or helper call creates (its arguments under `env`)."""
        call = cast(cst.Call, _substitute(call, env))  # a call whose names are swapped
        if self.qualify(call.func) == _GET_VARIABLE:
            return self._get_variable(call, scope)
        if not (isinstance(call.func, cst.Name) and call.func.value in self.functions):
            raise NotConvertible(call, "a variable made by a call this conversion does not read")
        function = self.functions[call.func.value]
        self.used.add(function.name.value)
        return self._helper(function, call, scope)

    def _get_variable(self, call: cst.Call, scope: str | None) -> Weight:
        known = {"name", "shape", "initializer", "dtype", "trainable"}
        for index, arg in enumerate(call.args):
            if arg.star or (arg.keyword is None and index > 1):
                raise NotConvertible(call, "get_variable with arguments beyond name and shape")
            if arg.keyword is not None and arg.keyword.value not in known:
                raise NotConvertible(
                    call, f"get_variable's `{arg.keyword.value}=` has no checked Keras mapping"
                )
        name = get_arg(call, 0, "name")
        if not (
            isinstance(name, cst.SimpleString)
            and isinstance(name.evaluated_value, str)
            and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name.evaluated_value)
        ):
            raise NotConvertible(call, "a variable whose name is not a literal identifier")
        shape = get_arg(call, 1, "shape")
        if shape is None:
            raise NotConvertible(call, "a variable without a shape")
        dtype = get_arg(call, None, "dtype")
        if dtype is not None and not (self.qualify(dtype) or "").endswith("float32"):
            raise NotConvertible(call, "a variable of another dtype than float32")
        trainable = get_arg(call, None, "trainable")
        if trainable is not None and not (
            isinstance(trainable, cst.Name) and trainable.value in ("True", "False")
        ):
            raise NotConvertible(call, "a variable whose `trainable` is not a literal")
        # get_variable's default initializer for float variables is glorot_uniform.
        assert self.reader is not None
        initializer = self.reader._initializer(
            get_arg(call, None, "initializer"), '"glorot_uniform"'
        )
        return Weight(
            scope,
            name.evaluated_value,
            shape,
            initializer or '"glorot_uniform"',
            trainable=not (isinstance(trainable, cst.Name) and trainable.value == "False"),
        )

    def _helper(self, function: cst.FunctionDef, call: cst.Call, scope: str | None) -> Weight:
        params = function.params.params
        env = bind_arguments(
            call, function, lambda what: NotConvertible(call, f"a variable helper {what}")
        )
        for param in params:
            if param.name.value not in env and param.default is not None:
                env[param.name.value] = param.default
        if function.params.star_arg not in (None, cst.MaybeSentinel.DEFAULT) or any(
            p.name.value not in env for p in params
        ):
            raise NotConvertible(
                call, f"`{function.name.value}` is called without all its arguments"
            )
        made: dict[str, Weight] = {}
        result = self._statements(_body(function), scope, env, made)
        if result is None:
            raise NotConvertible(function, f"`{function.name.value}` does not return its variable")
        return result

    def _statements(self, statements, scope, env, made) -> Weight | None:
        for statement in statements:
            if isinstance(statement, cst.With):
                # `with tf.device('/cpu:0'):` (variables pinned to the CPU): placement only,
                # which MirroredStrategy decides now.
                if not all(
                    isinstance(i.item, cst.Call)
                    and self.qualify(i.item.func) == "tensorflow.device"
                    for i in statement.items
                ):
                    raise NotConvertible(
                        statement, "a `with` in a variable helper other than tf.device"
                    )
                found = self._statements(statement.body.body, scope, env, made)
                if found is not None:
                    return found
                continue
            if isinstance(statement, cst.If):
                branch = self._branch(statement, env)
                if branch is not None:
                    found = self._statements(branch, scope, env, made)
                    if found is not None:
                        return found
                continue
            if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
                raise NotConvertible(statement, "a variable helper that is not straight-line code")
            small = statement.body[0]
            if isinstance(small, cst.Return):
                if isinstance(small.value, cst.Name) and small.value.value in made:
                    return made[small.value.value]
                raise NotConvertible(statement, "a variable helper returning something else")
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                if self.qualify(small.value.func) == _ADD:
                    self._decay_added(small.value, env, made)
                    continue
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)
                and isinstance(small.value, cst.Call)
            ):
                target = small.targets[0].target.value
                value = small.value
                if self.qualify(value.func) == _GET_VARIABLE or (
                    isinstance(value.func, cst.Name) and value.func.value in self.functions
                ):
                    made[target] = self.variable(value, scope, env)
                    continue
                decayed = self._decay(value, env, made)
                if decayed is not None:
                    env[target] = value  # what `tf.add_to_collection(key, target)` adds
                    continue
            if isinstance(small, cst.Assign) and isinstance(small.value, cst.IfExp):
                # The tutorial's `dtype = tf.float16 if FLAGS.use_fp16 else tf.float32`.
                branches = (small.value.body, small.value.orelse)
                if all((self.qualify(b) or "").startswith("tensorflow.") for b in branches):
                    raise NotConvertible(
                        statement,
                        "a variable dtype chosen at run time (a float16 switch): only float32 "
                        "variables convert to Keras weights",
                    )
            raise NotConvertible(
                statement, "a statement in a variable helper this conversion does not read"
            )
        return None

    def _branch(self, statement: cst.If, env) -> list[cst.CSTNode] | None:
        """`if wd is not None:` on a literal argument: the branch taken, or None."""
        test = statement.test
        if (
            isinstance(test, cst.Comparison)
            and len(test.comparisons) == 1
            and isinstance(test.left, cst.Name)
            and isinstance(test.comparisons[0].comparator, cst.Name)
            and test.comparisons[0].comparator.value == "None"
            and isinstance(test.comparisons[0].operator, cst.IsNot | cst.Is)
        ):
            value = env.get(test.left.value)
            if value is None:
                raise NotConvertible(statement, "a variable helper tests a value it was not given")
            is_none = isinstance(value, cst.Name) and value.value == "None"
            taken = is_none != isinstance(test.comparisons[0].operator, cst.IsNot)
            if taken:
                return list(statement.body.body)
            orelse = statement.orelse
            if orelse is None:
                return None
            if isinstance(orelse, cst.Else):
                return list(orelse.body.body)
        raise NotConvertible(
            statement, "a variable helper branches on something other than `x is None`"
        )

    def _decay(self, value: cst.Call, env, made) -> tuple[Weight, cst.BaseExpression] | None:
        """`tf.multiply(tf.nn.l2_loss(var), wd[, name=...])` / `tf.nn.l2_loss(var) * wd`."""
        if self.qualify(value.func) != "tensorflow.multiply":
            return None
        positional = [a.value for a in value.args if a.keyword is None]
        if len(positional) != 2:
            return None
        loss, decay = positional
        if not (isinstance(loss, cst.Call) and self.qualify(loss.func) == "tensorflow.nn.l2_loss"):
            return None
        var = loss.args[0].value if len(loss.args) == 1 else None
        if not (isinstance(var, cst.Name) and var.value in made):
            return None
        return made[var.value], cast(cst.BaseExpression, _substitute(decay, env))

    def _decay_added(self, call: cst.Call, env, made) -> None:
        key, value = get_arg(call, 0, "name"), get_arg(call, 1, "value")
        if isinstance(value, cst.Name) and value.value in env:
            value = env[value.value]
        decayed = self._decay(value, env, made) if isinstance(value, cst.Call) else None
        if not (isinstance(key, cst.SimpleString) and decayed is not None):
            raise NotConvertible(call, "a variable helper adds something else to a collection")
        weight, decay = decayed
        if weight.decay is not None:
            raise NotConvertible(call, "a variable's weight decay added twice")
        weight.decay, weight.collection = decay, str(key.evaluated_value)


def _body(function: cst.FunctionDef) -> list[cst.CSTNode]:
    """The function's statements after its docstring (a one-line body's small statements)."""
    body: list[cst.CSTNode] = list(function.body.body)
    return body[1:] if function.get_docstring(clean=False) is not None else body


class _Substitute(cst.CSTTransformer):
    def __init__(self, env: dict[str, cst.BaseExpression]) -> None:
        super().__init__()
        self.env = env

    def leave_Attribute(self, original, updated):
        return updated.with_changes(attr=original.attr)  # `x.name`: only the base is a name

    def leave_Arg(self, original, updated):
        return updated.with_changes(keyword=original.keyword)

    def leave_Name(self, original, updated):
        return self.env.get(updated.value, updated)


def _substitute(node: cst.CSTNode, env: dict[str, cst.BaseExpression]) -> cst.CSTNode:
    # _Substitute swaps names for expressions: no node is removed
    return cast(cst.CSTNode, node.visit(_Substitute(env))) if env else node


@dataclass
class _Model:
    function: cst.FunctionDef
    weights: list[Weight]
    call_body: list[cst.BaseStatement]  # the legacy statements, weights read from self
    helpers: set[str]
    # Some shape is read from the computation (`dim = reshape.get_shape()[1]`): the weights
    # are made where the computation reaches them, in a trace of call() that build() runs.
    dynamic: list[str] = field(default_factory=list)


class _CallBody(cst.CSTTransformer):
    """Variable creations -> `self.<attribute>`; `with tf.variable_scope('s') as scope:` ->
    `with tf.name_scope('s'):` (it named ops only, now) and that block's `scope.name` -> 's'."""

    def __init__(
        self,
        created: dict[int, Weight],
        scope_calls: dict[int, str],
        dynamic: cst.Module | None = None,
    ) -> None:
        """`dynamic` (the module): weights made in call(), by `self.weight(...)`."""
        super().__init__()
        self.created, self.scope_calls, self.dynamic = created, scope_calls, dynamic
        self.scopes: list[dict[str, str]] = [{}]  # `as` name -> scope, per open block

    def visit_With(self, node: cst.With) -> bool:
        bound = {}
        for item in node.items:
            if id(item.item) in self.scope_calls and item.asname is not None:
                # reading the model refused a scope bound to anything but a name
                bound[cast(cst.Name, item.asname.name).value] = self.scope_calls[id(item.item)]
        self.scopes.append({**self.scopes[-1], **bound})
        return True

    def leave_With(self, original, updated):
        self.scopes.pop()
        return updated

    def leave_WithItem(self, original, updated):
        if id(original.item) in self.scope_calls:
            name = self.scope_calls[id(original.item)]
            return cst.WithItem(cst.parse_expression(f"tf.name_scope({name!r})"))
        return updated

    def leave_Call(self, original, updated):
        weight = self.created.get(id(original))
        if weight is None:
            return updated
        if self.dynamic is None:
            return cst.parse_expression(f"self.{weight.attribute}")
        arguments = [f'"{weight.scope or ""}"', *_weight_arguments(weight, self.dynamic)]
        text = f"self.weight({', '.join(arguments)})"
        unit = self.dynamic.default_indent
        depth = 3 if weight.scope else 2  # its statement's depth in the class
        if len(unit) * depth + len(weight.name) + 10 + len(text) > 100:
            # one argument a line, one indent deeper than the statement (libcst adds the
            # statement's own indentation to each line)
            indent = "\n" + unit
            text = f"self.weight({indent}{(',' + indent).join(arguments)})"
        return cst.parse_expression(text)

    def leave_Attribute(self, original, updated):
        updated = _dimension_value(updated)
        if not isinstance(updated, cst.Attribute):
            return updated
        return self._scope_name(updated)

    def _scope_name(self, updated: cst.Attribute) -> cst.BaseExpression:
        scopes = self.scopes[-1]
        if (
            isinstance(updated.value, cst.Name)
            and updated.value.value in scopes
            and updated.attr.value == "name"
        ):
            return cst.SimpleString(repr(scopes[updated.value.value]))
        return updated


def _read_model(
    function: cst.FunctionDef, helpers: _Helpers, qualify: Qualify, module: cst.Module
) -> _Model:
    params = function.params
    if params.star_arg not in (None, cst.MaybeSentinel.DEFAULT) or params.star_kwarg or params.kwonly_params or params.posonly_params:  # fmt: skip
        raise NotConvertible(
            function, "a model function with *args / **kwargs / keyword-only parameters"
        )
    if len(params.params) != 1:
        raise NotConvertible(
            function, "a get_variable model function with parameters besides its input"
        )
    if function.decorators:
        raise NotConvertible(function, "a decorated model function")
    input_param = params.params[0].name.value
    weights: list[Weight] = []
    created: dict[int, Weight] = {}
    scopes: dict[str, str] = {}  # `as scope` name -> the scope's name
    scope_calls: dict[int, str] = {}
    locals_: set[str] = {input_param}
    dynamic: list[str] = []  # names of the computation that weight shapes read

    def statement_line(statement: cst.CSTNode, scope: str | None) -> None:
        if not isinstance(statement, cst.SimpleStatementLine):
            raise NotConvertible(
                statement, "a get_variable model function that is not straight-line code"
            )
        for small in statement.body:
            if isinstance(small, cst.Assign) and isinstance(small.value, cst.Call):
                value = small.value
                if qualify(value.func) == _GET_VARIABLE or (
                    isinstance(value.func, cst.Name)
                    and value.func.value in helpers.functions
                    and helpers.creates(helpers.functions[value.func.value])
                ):
                    weight = helpers.variable(value, scope, {})
                    dynamic.extend(sorted(free_names(weight.shape) & locals_))
                    weights.append(weight)
                    created[id(value)] = weight
                    locals_.update(t for t in free_names(small.targets[0].target))
                    continue
            for node in walk(small):
                if isinstance(node, cst.Call):
                    name = qualify(node.func)
                    if name in _TF1_STATE:
                        raise NotConvertible(
                            node, f"`{module.code_for_node(node.func)}` in the model computation"
                        )
                    if module.code_for_node(node.func).startswith("tf.compat.v1."):
                        raise NotConvertible(
                            node,
                            f"`{module.code_for_node(node.func)}` (TF1 only) in the model "
                            "computation",
                        )
                    if name is not None and name.startswith(
                        (
                            "tensorflow.layers.",
                            "tensorflow.contrib.",
                            "tf_slim.",
                            "tensorflow.compat.v1.",
                        )
                    ):
                        raise NotConvertible(
                            node,
                            f"`{module.code_for_node(node.func)}` mixed with get_variable code",
                        )
                    if isinstance(node.func, cst.Name) and node.func.value in helpers.functions:
                        raise NotConvertible(
                            node, f"a call of `{node.func.value}` in the model computation"
                        )
                if isinstance(node, cst.Name) and node.value in helpers.functions:
                    raise NotConvertible(node, f"`{node.value}` used in the model computation")
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    locals_.update(free_names(target.target))

    for statement in _body(function):
        if isinstance(statement, cst.With):
            item = statement.items[0]
            call = item.item
            if len(statement.items) != 1 or not isinstance(call, cst.Call):
                raise NotConvertible(
                    statement, "a `with` in the model function other than one variable_scope"
                )
            name = get_arg(call, 0, "name_or_scope")
            if (
                qualify(call.func) != _VARIABLE_SCOPE
                or len(call.args) != 1
                or not (
                    isinstance(name, cst.SimpleString)
                    and isinstance(name.evaluated_value, str)
                    and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name.evaluated_value)
                )
            ):
                raise NotConvertible(
                    statement, "a `with` in the model function other than variable_scope('name')"
                )
            scope = name.evaluated_value
            scope_calls[id(call)] = scope
            if item.asname is not None:
                if not isinstance(item.asname.name, cst.Name):
                    raise NotConvertible(
                        statement, "a variable scope bound to something other than a name"
                    )
                scopes[item.asname.name.value] = scope
            for inner in statement.body.body:
                statement_line(inner, scope)
        else:
            statement_line(statement, None)
    if not weights:
        raise NotConvertible(function, "no variable in the model function")
    for scope_name in scopes:
        uses = [
            n for n in walk(function)
            if isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value == scope_name
        ]  # fmt: skip
        if any(n.attr.value != "name" for n in uses):
            raise NotConvertible(
                function, f"the variable scope `{scope_name}` is used beyond its name"
            )
    legacy = [w.legacy for w in weights]
    if len(legacy) != len(set(legacy)):
        raise NotConvertible(function, "a variable created twice under one name (TF1 reuse)")
    taken: set[str] = set()
    for weight in weights:
        attribute = "_".join(filter(None, [weight.scope, weight.name]))
        if attribute in _RESERVED or attribute in taken:
            attribute += "_weight"
        taken.add(attribute)
        weight.attribute = attribute
    dynamic = list(dict.fromkeys(dynamic))
    transformer = _CallBody(created, scope_calls, module if dynamic else None)
    # statement_line refused anything but lines and `with` blocks of lines, and _CallBody
    # rewrites inside statements, removing none
    body = [cast(cst.BaseStatement, s.visit(transformer)) for s in _body(function)]
    return _Model(function, weights, body, helpers.used, dynamic)


def _dimension_value(node: cst.Attribute) -> cst.BaseExpression:
    """TF1's `x.get_shape()[1].value` (a Dimension) -> `x.get_shape()[1]`: TF2 shapes hold ints."""
    if (
        node.attr.value == "value"
        and isinstance(node.value, cst.Subscript)
        and (
            (
                isinstance(node.value.value, cst.Call)
                and isinstance(node.value.value.func, cst.Attribute)
                and node.value.value.func.attr.value == "get_shape"
            )
            or (
                isinstance(node.value.value, cst.Attribute)
                and node.value.value.attr.value == "shape"
            )
        )
    ):
        return node.value
    return node


class _DimensionValues(cst.CSTTransformer):
    def leave_Attribute(self, original, updated):
        return _dimension_value(updated)


def _weight_arguments(weight: Weight, module: cst.Module) -> list[str]:
    """add_weight's arguments for `weight` (after the owner)."""
    arguments = [
        f'name="{weight.name}"',
        # _DimensionValues folds dimensions: an expression stays an expression
        f"shape={module.code_for_node(cast(cst.BaseExpression, weight.shape.visit(_DimensionValues())))}",
        f"initializer={weight.initializer}",
    ]
    if weight.decay is not None:
        # TF1: wd * tf.nn.l2_loss(w) = wd * sum(w**2) / 2; Keras L2(l2): l2 * sum(w**2).
        arguments.append(
            f"regularizer=keras.regularizers.L2(0.5 * {module.code_for_node(weight.decay)})"
        )
    if not weight.trainable:
        arguments.append("trainable=False")
    return arguments


def _class_source(model: _Model, class_name: str, unit: str, module: cst.Module) -> str:
    """The Keras model class, in the module's indent `unit`."""
    function = model.function
    doc = function.get_docstring(clean=False)
    doc = (
        doc.strip()
        if doc
        else f"The TF1 model function `{function.name.value}`: its variables are Keras weights."
    )
    lines = [
        f"class {class_name}(keras.Model):",
        f'{unit}"""{doc}"""',
        "",
    ]
    if model.dynamic:
        names = ", ".join(f"`{n}`" for n in model.dynamic)
        lines += [
            f"{unit}def build(self, input_shape):",
            f"{unit * 2}# Some weight shapes are read from the computation ({names}): call() runs",
            f"{unit * 2}# once, traced on a symbolic input of this shape, and self.weight() makes",
            f"{unit * 2}# each weight where TF1 made its variable.",
            f"{unit * 2}self.made = {{}}",
            f"{unit * 2}tf.function(self.call).get_concrete_function(",
            f"{unit * 3}tf.TensorSpec(input_shape, self.compute_dtype))",
            "",
            f"{unit}def weight(self, scope, name, **kwargs):",
            f'{unit * 2}"""The weight `scope/name`: made on first use, outside any trace, by a plain',
            f"{unit * 2}layer per TF1 variable scope (the weight path keeps the legacy name:",
            f'{unit * 2}conv1/weights -> <model>/conv1/weights)."""',
            f'{unit * 2}key = f"{{scope}}/{{name}}"',
            f"{unit * 2}if key not in self.made:",
            f"{unit * 3}with tf.init_scope():  # created eagerly, mirrored under a strategy",
            f"{unit * 4}owner = self",
            f"{unit * 4}if scope:",
            f"{unit * 5}if scope not in self.made:",
            f"{unit * 6}self.made[scope] = keras.layers.Layer(name=scope)",
            f"{unit * 5}owner = self.made[scope]",
            f"{unit * 4}self.made[key] = owner.add_weight(name=name, **kwargs)",
            f"{unit * 2}return self.made[key]",
        ]
    else:
        lines += [
            f"{unit}def __init__(self, **kwargs):",
            f"{unit * 2}super().__init__(**kwargs)",
            f"{unit * 2}# No weight shape depends on the input: they are made now, where the model is.",
            f"{unit * 2}self.build(None)",
            "",
            f"{unit}def build(self, input_shape):",
            f"{unit * 2}# One plain layer per TF1 variable scope owns that scope's variables (add_weight):",
            f"{unit * 2}# the weight paths keep the legacy names (conv1/weights -> <model>/conv1/weights).",
        ]
    owners: dict[str | None, str] = {}
    for weight in [] if model.dynamic else model.weights:
        if weight.scope not in owners:
            owner = "self" if weight.scope is None else f"{weight.scope}_scope"
            owners[weight.scope] = owner
            if weight.scope is not None:
                lines.append(f'{unit * 2}{owner} = keras.layers.Layer(name="{weight.scope}")')
        arguments = _weight_arguments(weight, module)
        lines.append(f"{unit * 2}self.{weight.attribute} = {owners[weight.scope]}.add_weight(")
        lines.extend(f"{unit * 3}{argument}," for argument in arguments[:-1])
        lines.append(f"{unit * 3}{arguments[-1]})")
    # call() is the legacy function one level deeper: every line (continuations included)
    # moves by one indent.
    call = function.with_changes(
        name=cst.Name("call"),
        params=function.params.with_changes(
            params=[cst.Param(cst.Name("self")), *function.params.params]
        ),
        body=function.body.with_changes(body=model.call_body),
        decorators=(),
        leading_lines=(),
        returns=None,
    )
    lines.append("")
    for line in cst.Module(body=[call], default_indent=unit).code.rstrip("\n").split("\n"):
        lines.append(f"{unit}{line}" if line.strip() else "")
    return "\n".join(lines) + "\n"


def _returns_variable(function: cst.FunctionDef, helpers: _Helpers) -> bool:
    """A variable helper: it ends by returning what get_variable (or another helper) made."""
    body = _body(function)
    last = body[-1] if body else None
    if not (
        isinstance(last, cst.SimpleStatementLine)
        and isinstance(last.body[0], cst.Return)
        and isinstance(last.body[0].value, cst.Name)
    ):
        return False
    returned = last.body[0].value.value
    return any(
        isinstance(n, cst.Assign)
        and any(isinstance(t.target, cst.Name) and t.target.value == returned for t in n.targets)
        and isinstance(n.value, cst.Call)
        and (
            helpers.qualify(n.value.func) == _GET_VARIABLE
            or (isinstance(n.value.func, cst.Name) and n.value.func.value in helpers.functions)
        )
        for n in walk(function)
    )


def _calls_of(name: str, nodes) -> list[cst.Call]:
    return [
        n
        for node in nodes
        for n in walk(node)
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == name
    ]


def _with_first_arg(call: cst.Call, name: str) -> cst.Call:
    return call.with_changes(args=[cst.Arg(cst.Name(name)), *call.args])


def _collection_key(call: cst.Call) -> str | None:
    key = get_arg(call, 0, "name" if call.args and call.args[0].keyword else "key")
    if key is None and call.args:
        key = call.args[0].value
    return str(key.evaluated_value) if isinstance(key, cst.SimpleString) else None


def _collection_losses(
    imported: ImportedModel, key: str, block: Sequence[cst.CSTNode], script: cst.Module
) -> dict[str, cst.FunctionDef] | str:
    """The model module's functions the towers call for their effect on the `key` collection
    (``_ = model.loss(logits, labels)``), each rewritten to return the value it added: name ->
    the new function. The reason when such a function is used otherwise."""
    functions = {s.name.value: s for s in imported.module.body if isinstance(s, cst.FunctionDef)}
    found: dict[str, cst.FunctionDef] = {}
    calls = [
        (n, n.func.attr.value, statement) for statement in block for n in walk(statement)
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)
        and isinstance(n.func.value, cst.Name) and n.func.value.value == imported.access
        and n.func.attr.value in functions
    ]  # fmt: skip
    for call, name, statement in calls:
        rewritten = _returning_added(functions[name], key, imported.qualify)
        if rewritten is None:
            continue
        if isinstance(rewritten, str):
            return f"`{imported.access}.{name}`: {rewritten}"
        if _discarded_call(statement) is not call:
            return (
                f"the towers use the value of `{imported.access}.{name}`, the sum of the "
                f"unscoped `{key}` collection (in tower i>0 every tower's losses so far)"
            )
        uses = [
            n for n in walk(script)
            if isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name)
            and n.value.value == imported.access and n.attr.value == name
        ]  # fmt: skip
        if len(uses) != 1 or any(
            isinstance(n, cst.Name) and n.value == name
            for s in imported.module.body
            if s is not functions[name]
            for n in walk(s)
        ):
            return (
                f"`{imported.access}.{name}` (which sums the unscoped `{key}` collection) is "
                "used besides the towers' discarded call"
            )
        found[name] = rewritten
    return found


def _discarded_call(statement: cst.CSTNode) -> cst.Call | None:
    """The call of `f(...)` or `_ = f(...)`: its value is not used."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return None
    small = statement.body[0]
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        return small.value
    if (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name)
        and small.targets[0].target.value == "_"
        and isinstance(small.value, cst.Call)
    ):
        return small.value
    return None


def _returning_added(
    function: cst.FunctionDef, key: str, qualify: Qualify
) -> cst.FunctionDef | str | None:
    """`function` rewritten to return what it adds to the `key` collection, when it adds one
    value (`tf.add_to_collection(key, x)`, a statement) and ends by returning the sum of the
    unscoped collection (`return tf.add_n(tf.get_collection(key)[, name=...])`); None when it
    does not touch the collection, else why it cannot be rewritten."""
    uses = [
        n for n in walk(function)
        if isinstance(n, cst.Call) and qualify(n.func) in (_ADD, _GET) and _collection_key(n) == key
    ]  # fmt: skip
    if not uses:
        return None
    body = _body(function)
    last = body[-1]
    total = (
        last.body[0].value
        if isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[0], cst.Return)
        else None
    )
    read = get_arg(total, 0, "inputs") if isinstance(total, cst.Call) else None
    if not (
        isinstance(total, cst.Call)
        and qualify(total.func) == "tensorflow.add_n"
        and isinstance(read, cst.Call)
        and qualify(read.func) == _GET
        and len(read.args) == 1
        and all(a.keyword is None or a.keyword.value == "name" for a in total.args[1:])
    ):
        return f"it uses the `{key}` collection otherwise than returning the sum of all of it"
    adds = [
        (index, s.body[0].value)
        for index, s in enumerate(body)
        if isinstance(s, cst.SimpleStatementLine)
        and isinstance(s.body[0], cst.Expr)
        and isinstance(s.body[0].value, cst.Call)
        and qualify(s.body[0].value.func) == _ADD
    ]
    if len(adds) != 1 or len(uses) != 2 or len(adds[0][1].args) != 2:
        return f"it adds to the `{key}` collection otherwise than once, in a statement"
    index, add = adds[0]
    value = add.args[1].value
    if free_names(value) & set().union(set(), *(bound_names(s) for s in body[index + 1 : -1])):
        return f"the value it adds to the `{key}` collection changes before it returns"
    # The sum's comment described the TF1 total: it goes with it.
    returned = last.with_changes(
        body=[cst.Return(value.deep_clone())],
        leading_lines=[
            cst.EmptyLine(comment=cst.Comment(c))
            for c in (
                f"# TF2 has no `{key}` collection: this returns what TF1 added to it, not the",
                "# collection's sum; the caller adds the model's weight decay (its `losses`).",
            )
        ],
    )
    kept = [s for i, s in enumerate(body) if i != index][:-1]
    docstring = list(function.body.body)[: len(function.body.body) - len(body)]
    return function.with_changes(
        body=function.body.with_changes(body=[*docstring, *kept, returned])
    )


def _read_losses(
    block: Sequence[cst.CSTNode],  # statements (a one-line function's are small ones)
    key: str,
    instance: str,
    qualify: Qualify,
    call: cst.Call,
    adders: AbstractSet[str] = frozenset(),
) -> list[cst.CSTNode] | str:
    """The statements that read the model's weight decay from the `key` collection, reading
    `<instance>.losses` instead: `tf.add_to_collection(key, x)` ... `tf.get_collection(key,
    scope)` -> `[*<instance>.losses, x, ...]` (the decay first: the model call added it first).
    `adders`: functions (`model.loss`) whose discarded call adds the value it now returns."""
    added: list[tuple[int, cst.BaseExpression]] = []
    reads: list[tuple[int, cst.Call]] = []
    for index, statement in enumerate(block):
        adder = _discarded_call(statement)
        if adder is not None and cst.Module([]).code_for_node(adder.func) in adders:
            added.append((index, adder))
            continue
        for node in walk(statement):
            if isinstance(node, cst.Call) and qualify(node.func) in (_ADD, _GET):
                if _collection_key(node) != key:
                    continue
                if qualify(node.func) == _GET:
                    reads.append((index, node))
                elif (
                    isinstance(statement, cst.SimpleStatementLine)
                    and isinstance(statement.body[0], cst.Expr)
                    and statement.body[0].value is node
                    and len(node.args) == 2
                ):
                    added.append((index, node.args[1].value))
                else:
                    return f"`{key}` collection added to inside an expression"
    if len(reads) != 1:
        return f"the weight decay's `{key}` collection is read {len(reads)} times where the model is called"
    read_at, read = reads[0]
    if len(read.args) != 2:
        return (
            f"the `{key}` collection is read without the tower's scope "
            "(it would hold every tower's losses so far)"
        )
    if any(index > read_at for index, _ in added):
        return f"something is added to the `{key}` collection after it is read"
    call_at = next(i for i, s in enumerate(block) if any(n is call for n in walk(s)))
    if any(index < call_at for index, _ in added) or read_at < call_at:
        return f"the `{key}` collection is used before the model adds its weight decay to it"
    for index, value in added:
        between = block[index + 1 : read_at]
        rebound = set().union(set(), *(bound_names(s) for s in between))
        if free_names(value) & rebound:
            return f"a value added to the `{key}` collection changes before the collection is read"
    items: list[cst.BaseElement] = [
        cst.StarredElement(cst.parse_expression(f"{instance}.losses")),
        *(cst.Element(v) for _, v in added),
    ]
    space = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    items = [item.with_changes(comma=space) for item in items[:-1]] + items[-1:]
    replacement = cst.List(items)
    drop = {index for index, _ in added}

    class _Replace(cst.CSTTransformer):
        def leave_Call(self, original, updated):
            return replacement if original is read else updated

    out: list[cst.CSTNode] = []
    for index, statement in enumerate(block):
        if index in drop:
            continue
        # _Replace swaps one call for a list: the statement stays
        out.append(cast(cst.CSTNode, statement.visit(_Replace())) if index == read_at else statement)
    return out


@dataclass
class WeightsModel:
    """A get_variable model function as a Keras model class."""

    class_name: str
    source: str  # the class, in the module's indent
    model: _Model

    def variables(self, model_name: str) -> dict[str, str]:
        """Legacy variable name -> Keras weight path, for an instance named `model_name`."""
        return {w.legacy: f"{model_name}/{w.legacy}" for w in self.model.weights}


def _helper_names(functions: dict[str, cst.FunctionDef], qualify: Qualify) -> set[str]:
    probe = _Helpers(functions, qualify, None)
    return {name for name, f in functions.items() if _returns_variable(f, probe)}


def _is_model(function: cst.FunctionDef, helper_defs: set[str], qualify: Qualify) -> bool:
    """It makes variables itself (get_variable or a helper) and is not a helper."""
    return function.name.value not in helper_defs and any(
        isinstance(n, cst.Call)
        and (
            qualify(n.func) == _GET_VARIABLE
            or (isinstance(n.func, cst.Name) and n.func.value in helper_defs)
        )
        for n in walk(function)
    )


def convert_weights(
    function: cst.FunctionDef, module: cst.Module, qualify: Qualify
) -> WeightsModel:
    """The Keras model class for the get_variable model function `function` of `module`
    (its variable helpers are the module's other functions that return a variable), or
    NotConvertible with the reason."""
    functions = {
        s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef) and s is not function
    }
    helper_defs = _helper_names(functions, qualify)
    reader = _Reader(function, qualify, module)
    helpers = _Helpers({n: functions[n] for n in helper_defs}, qualify, reader)
    model = _read_model(function, helpers, qualify, module)
    if reader.init_uses:
        raise NotConvertible(function, "a variable configured by a parameter of the model function")
    class_name = _camel(function.name.value)
    source = _class_source(model, class_name, module.default_indent, module)
    return WeightsModel(class_name, source, model)


def _imported_model(
    program: Program, module: cst.Module, path: PurePosixPath | None
) -> ImportedModel | str | None:
    """The get_variable model function of a module of the project the script imports (the
    tutorial's ``cifar10.inference(images)``, called in the towers or in the function they
    call), or why it cannot be used, or None when the script calls none."""
    if path is None:
        return None
    names = module_names(module)
    folder = Path(path).parent
    found: dict[tuple[str, str], ImportedModel] = {}
    for statement in module.body:
        searched: cst.CSTNode = statement
        if statement is program.function:
            searched = cst.IndentedBlock(list(program.tower_body))
        for node in walk(searched):
            if not (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and isinstance(node.func.value, cst.Name)
                and node.func.value.value in names
            ):
                continue
            access, called = node.func.value.value, node.func.attr.value
            if (access, called) in found:
                found[(access, called)].call = None  # called twice
                continue
            file = folder / (names[access].replace(".", "/") + ".py")
            try:
                model_module = renamed_module(file.read_text(encoding="utf-8"), file.name)
            except (OSError, UnicodeDecodeError, cst.ParserSyntaxError):
                continue
            model_qualify = NameResolver.for_module(model_module).qualify
            functions = {
                s.name.value: s for s in model_module.body if isinstance(s, cst.FunctionDef)
            }
            helper_defs = _helper_names(functions, model_qualify)
            function = functions.get(called)
            if function is not None and _is_model(function, helper_defs, model_qualify):
                found[(access, called)] = ImportedModel(
                    file, access, function, node, model_module, model_qualify
                )
    if not found:
        return None
    if len(found) > 1:
        return f"the program calls {len(found)} get_variable model functions of other modules"
    imported = next(iter(found.values()))
    if imported.call is None:
        return f"`{imported.access}.{imported.function.name.value}` is called more than once"
    return imported


def plan_weights(
    program: Program, module: cst.Module, qualify: Qualify, path: PurePosixPath | None = None
) -> KerasPlan | str | None:
    """The Keras plan for a tower program whose model function makes its variables with
    tf.get_variable -- in the script, or in a module of the project it imports (`path`: the
    script's file; the class then goes in that module); None when there is no such function
    (another conversion may apply); otherwise the reason the model code stays on
    tf.compat.v1."""
    functions = {
        s.name.value: s
        for s in module.body
        if isinstance(s, cst.FunctionDef) and s is not program.function
    }
    imported: ImportedModel | None = None
    if not any(
        isinstance(n, cst.Call) and qualify(n.func) == _GET_VARIABLE
        for f in functions.values()
        for n in walk(f)
    ):
        found = _imported_model(program, module, path)
        if not isinstance(found, ImportedModel):
            return found
        imported = found
    model_module = imported.module if imported is not None else module
    model_qualify = imported.qualify if imported is not None else qualify
    model_functions = {
        s.name.value: s
        for s in model_module.body
        if isinstance(s, cst.FunctionDef) and s is not program.function
    }
    helper_defs = _helper_names(model_functions, model_qualify)
    models = [f for f in model_functions.values() if _is_model(f, helper_defs, model_qualify)]
    if imported is not None:
        models = [imported.function]
        where = f" ({imported.path.name})"
    elif len(models) != 1:
        return (
            f"{len(models)} functions make tf.get_variable variables "
            "(besides helpers that return one)"
        )
    else:
        where = ""
    function = models[0]
    legacy = function.name.value
    try:
        converted = convert_weights(function, model_module, model_qualify)
    except NotConvertible as exc:
        return f"{exc.reason} ({where.strip(' ()') + ', ' if where else ''}line {_line(model_module, exc.node)})"
    model, class_name = converted.model, converted.class_name
    if class_name in {n.value for n in walk(model_module) if isinstance(n, cst.Name)}:
        return f"the module{where} already uses the name `{class_name}`"
    # The model object takes the function's name where it was called.
    instance = legacy
    if imported is not None:
        attributes = {id(n.attr) for n in walk(module) if isinstance(n, cst.Attribute)}
        if any(
            isinstance(n, cst.Name) and n.value == legacy and id(n) not in attributes
            for n in walk(module)
        ):
            return f"the script already uses the name `{legacy}` (the model object's)"
        if _calls_of(legacy, model_module.body):
            return f"`{legacy}` is called in its own module{where}"
        helper_defs = set()  # the script's: its own functions make no variables

    def model_calls(nodes) -> list[cst.Call]:
        if imported is None:
            return _calls_of(legacy, nodes)
        return [n for node in nodes for n in walk(node) if n is imported.call]

    # Where the model is called: in the tower, or in one function the tower calls once.
    module_calls = model_calls(module.body)
    if len(module_calls) != 1:
        return f"`{legacy}` is called {len(module_calls)} times"
    tower_calls = model_calls(program.tower_body)
    caller: cst.FunctionDef | None = None
    if tower_calls:
        call = tower_calls[0]
        block: list[cst.CSTNode] = list(program.tower_body)
    else:
        callers = [f for f in functions.values() if model_calls([f])]
        caller = callers[0] if callers else None
        if caller is None or caller is function or caller.name.value in helper_defs:
            return f"`{legacy}` is not called by the towers"
        if (
            len(_calls_of(caller.name.value, module.body)) != 1
            or len(_calls_of(caller.name.value, program.tower_body)) != 1
        ):
            return f"`{caller.name.value}`, which calls the model, is not called once by the towers"
        if any(
            isinstance(n, cst.Call) and qualify(n.func) in (_VARIABLE_SCOPE, _GET_VARIABLE)
            for n in walk(caller)
        ):
            return f"`{caller.name.value}` makes variables or scopes around the model call"
        call = model_calls([caller])[0]
        block = _body(caller)
    if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
        return f"`{legacy}` is not called with its input alone"
    loss_notes: list[str] = []
    keys = {w.collection for w in model.weights if w.collection}
    if len(keys) > 1:
        return "the weight decay goes to several collections"
    if keys and any(
        (qualify(n.func) or "").endswith(("get_regularization_loss", "get_regularization_losses"))
        or "REGULARIZATION_LOSSES" in module.code_for_node(n)
        for n in walk(module)
        if isinstance(n, cst.Call)
    ):
        # model.losses would answer both: the collection's decay and TF1's (empty) regularizers
        return "the program reads TF1's regularization losses besides the decay's collection"
    if keys:
        key = keys.pop()
        outside = [
            n
            for s in module.body
            if s is not function
            and s is not caller
            and (not isinstance(s, cst.FunctionDef) or s.name.value not in helper_defs)
            for n in walk(s)
            if isinstance(n, cst.Call)
            and qualify(n.func) in (_ADD, _GET)
            and _collection_key(n) == key
        ]
        adders: dict[str, cst.FunctionDef] = {}  # model functions rewritten to return their loss
        if imported is not None:
            # The tutorial's `loss()`: it adds its cross entropy to the collection and returns
            # the sum of the whole (unscoped) collection, which the towers discard.
            losses = _collection_losses(imported, key, block, module)
            if isinstance(losses, str):
                return losses
            adders = losses
            outside += [
                n
                for s in model_module.body
                if s is not function
                and not (isinstance(s, cst.FunctionDef) and s.name.value in model.helpers)
                and not (isinstance(s, cst.FunctionDef) and s.name.value in adders)
                for n in walk(s)
                if isinstance(n, cst.Call)
                and model_qualify(n.func) in (_ADD, _GET)
                and _collection_key(n) == key
            ]
        if outside or (
            caller is None
            and program.graph_setup
            and any(
                isinstance(n, cst.Call) and qualify(n.func) == _GET
                for s in program.graph_setup
                for n in walk(s)
            )
        ):
            return f"the `{key}` collection is used outside the function that calls the model"
        read = _read_losses(
            block, key, instance, qualify, call,
            {f"{imported.access}.{n}" for n in adders} if imported is not None else set(),
        )  # fmt: skip
        if isinstance(read, str):
            return read
        block = read
        if imported is not None and adders:
            imported.rewritten.update(adders)
            loss_notes = [
                f"`{imported.access}.{n}` added its value to the `{key}` collection and "
                f"returned the sum of the whole collection (in tower i>0 every tower's losses "
                "so far), which the towers discarded: it returns the value it added, which "
                f"the tower sums with the model's weight decay as it summed its scope's `{key}`"
                for n in sorted(adders)
            ]
    if imported is not None:  # `model.inference(images)` -> the instance's call
        # _CallInstance renames a call's function: each statement stays
        block = [cast(cst.CSTNode, s.visit(_CallInstance(imported.access, legacy))) for s in block]
        call = next(
            n
            for s in block
            for n in walk(s)
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == legacy
        )

    if caller is None:
        scopes = _call_scopes(block, call, qualify)
        new_call: cst.Call = call
        target_call = call
    else:
        target_call = _calls_of(caller.name.value, program.tower_body)[0]
        scopes = _call_scopes(program.tower_body, target_call, qualify)
        new_call = _with_first_arg(target_call, instance)
    if scopes is None:
        return "the model call is not under literal variable scopes"
    if scopes:
        return f"variable scopes `{'/'.join(scopes)}` around the model call"
    tower_source = block if caller is None else list(program.tower_body)
    tower_body = _unscoped(tower_source, qualify, target_call, new_call)
    rewritten: dict[str, cst.BaseStatement | None] = {}
    if caller is not None:
        params = caller.params.with_changes(
            params=[
                cst.Param(
                    cst.Name(instance), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                ),
                *caller.params.params,
            ]
        )
        rewritten[caller.name.value] = caller.with_changes(
            params=params, body=caller.body.with_changes(body=[*_docstring(caller), *block])
        )
    others = [
        s for s in model_module.body
        if s is not function and not (isinstance(s, cst.FunctionDef) and s.name.value in model.helpers)
    ]  # fmt: skip
    for name in model.helpers:
        if _calls_of(name, others) or any(
            isinstance(n, cst.Name) and n.value == name for s in others for n in walk(s)
        ):
            return f"the variable helper `{name}` is used outside the model function"
        if imported is not None:
            if any(
                isinstance(n, cst.Attribute)
                and isinstance(n.value, cst.Name)
                and n.value.value == imported.access
                and n.attr.value == name
                for n in walk(module)
            ):
                return f"the variable helper `{name}` is used by the script"
            imported.dropped.add(name)  # the model module drops it
        else:
            rewritten[name] = None

    access = f"{imported.access}." if imported is not None else ""
    constructor = f'{instance} = {access}{class_name}(name="{legacy}")'
    graph_setup = [*program.graph_setup, cst.parse_statement(constructor)]
    reader = VariableNames(module, qualify)
    reader.functions.pop(legacy, None)
    if imported is not None:  # the tower calls the rewritten caller, which calls the instance
        reader.functions.update(
            {k: v for k, v in rewritten.items() if isinstance(v, cst.FunctionDef)}
        )
        reader.import_functions(model_module, model_qualify, imported.access)  # `model.loss`
    left = reader.run(tower_body)
    if left is None or left:
        return "the tower creates variables besides the model's"
    variables = converted.variables(legacy)
    legacy_reader = VariableNames(module, qualify)
    if imported is not None:
        legacy_reader.import_functions(model_module, model_qualify, imported.access)
    legacy_names = legacy_reader.run([*program.graph_setup, *program.tower_body])
    if legacy_names is None or set(legacy_names) - {"global_step"} != set(variables):
        return "the model's legacy variable names could not be matched one to one"
    global_step = None
    if "global_step" in legacy_names:
        step = _global_step(program, qualify, module)
        if step is None:
            return "the global step is not made before the towers by get_or_create_global_step() or get_variable('global_step')"
        global_step, replacement = step
        if replacement is not None:
            graph_setup = [
                replacement if s is _statement_of(program.graph_setup, global_step) else s
                for s in graph_setup
            ]
    notes = [
        f"the model function `{legacy}` made its variables with tf.get_variable: the Keras model "
        f"`{class_name}` owns them (add_weight in build(), one layer per variable scope) and its "
        "call() keeps the TF1 computation"
    ]
    if keys or any(w.decay is not None for w in model.weights):
        notes.append(
            "the weight decay the legacy code put in a collection is a Keras L2 regularizer on "
            "each weight, read through the model's `losses` where the collection was read"
        )
    notes += loss_notes
    keras_model = KerasModel(
        function=function,
        class_name=class_name,
        input_param=function.params.params[0].name.value,
        training_param=None,
        training_default="False",
        init_params=[],
        scope=None,
        layers=[],
        source=converted.source,
        notes=notes,
    )
    return KerasPlan(
        keras_model, instance, legacy, tower_body, graph_setup, variables, notes, global_step,
        rewritten=rewritten, imported=imported,
    )  # fmt: skip


class _CallInstance(cst.CSTTransformer):
    """``<access>.<name>(...)`` -> ``<name>(...)``: the model object the caller now takes."""

    def __init__(self, access: str, name: str) -> None:
        super().__init__()
        self.access, self.name = access, name

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        func = updated_node.func
        if (
            isinstance(func, cst.Attribute)
            and isinstance(func.value, cst.Name)
            and func.value.value == self.access
            and func.attr.value == self.name
        ):
            return updated_node.with_changes(func=cst.Name(self.name))
        return updated_node


def _docstring(function: cst.FunctionDef) -> list[cst.CSTNode]:
    body: list[cst.CSTNode] = list(function.body.body)
    return body[:1] if function.get_docstring(clean=False) is not None else []


def _global_step(
    program: Program, qualify: Qualify, module: cst.Module
) -> tuple[str, cst.SimpleStatementLine | None] | None:
    """The name of `global_step = get_or_create_global_step()` / `get_variable('global_step',
    [], ...)` in the setup before the towers, and for the latter the `tf.Variable` statement
    that replaces it (the same dtype and initial value; None: the statement stays)."""
    for statement in program.graph_setup:
        if not (
            isinstance(statement, cst.SimpleStatementLine)
            and isinstance(statement.body[0], cst.Assign)
            and len(statement.body[0].targets) == 1
            and isinstance(statement.body[0].targets[0].target, cst.Name)
            and isinstance(statement.body[0].value, cst.Call)
        ):
            continue
        target = statement.body[0].targets[0].target.value
        value = statement.body[0].value
        name = qualify(value.func)
        if name in (
            "tensorflow.train.get_or_create_global_step",
            "tensorflow.train.create_global_step",
        ):
            return target, None
        first = get_arg(value, 0, "name")
        if not (
            name == _GET_VARIABLE
            and isinstance(first, cst.SimpleString)
            and first.evaluated_value == "global_step"
        ):
            continue
        shape = get_arg(value, 1, "shape")
        initializer = get_arg(value, None, "initializer")
        dtype = get_arg(value, None, "dtype")
        trainable = get_arg(value, None, "trainable")
        start = None
        if isinstance(initializer, cst.Call):
            short = (qualify(initializer.func) or "").rsplit(".", 1)[-1]
            if short == "zeros_initializer" and not initializer.args:
                start = "0"
            elif short == "constant_initializer" and len(initializer.args) == 1:
                literal = initializer.args[0].value
                if isinstance(literal, cst.Integer | cst.Float):
                    start = literal.value
        known = {"name", "shape", "initializer", "dtype", "trainable"}
        if (
            start is None
            or not (isinstance(shape, cst.List | cst.Tuple) and not shape.elements)
            or not (isinstance(trainable, cst.Name) and trainable.value == "False")
            or any(a.keyword is not None and a.keyword.value not in known for a in value.args)
        ):
            return target, None  # kept as it was (tf.compat.v1.get_variable runs eagerly)
        # get_variable's default dtype is float32.
        dtype_code = module.code_for_node(dtype) if dtype is not None else "tf.float32"
        replacement = cst.parse_statement(
            f"{target} = tf.Variable({start}, dtype={dtype_code}, trainable=False, "
            "name='global_step')"
        )
        return target, statement.with_changes(body=replacement.body)
    return None


def _statement_of(statements: list[cst.BaseStatement], target: str) -> cst.BaseStatement | None:
    """The first `target = ...` statement."""
    for statement in statements:
        if (
            isinstance(statement, cst.SimpleStatementLine)
            and isinstance(statement.body[0], cst.Assign)
            and isinstance(statement.body[0].targets[0].target, cst.Name)
            and statement.body[0].targets[0].target.value == target
        ):
            return statement
    return None
