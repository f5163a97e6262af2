"""Whether a tower program's model becomes a Keras model, and the tower code that calls it.

Not a rule module. :func:`plan` finds the module-level function the towers call for their
model (directly under ``variable_scope(...)``, or through ``tf.make_template``), converts it
with :mod:`._keras_model_emit`, and rewrites the tower code around the call: the variable
scopes that only named and shared the model's variables go, the call passes Keras'
``training=``, and the model instance is made once in ``strategy.scope()``. Anything else
returns the reason the TF1 model code stays (on tf.compat.v1, with mirrored variables).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from tfmigrate.rules._keras_model_emit import KerasModel, NotConvertible, convert
from tfmigrate.rules._tower_program import Program
from tfmigrate.rules._towers import bound_names, free_names, get_arg, identifiers, walk
from tfmigrate.rules._variable_names import VariableNames

_VARIABLE_SCOPE = "tensorflow.variable_scope"


@dataclass
class KerasPlan:
    model: KerasModel
    instance: str  # the model object's name in build_program
    model_name: str  # its Keras name (the legacy scope)
    tower_body: list[cst.BaseStatement]
    graph_setup: list[cst.BaseStatement]
    variables: dict[str, str]  # legacy variable name -> Keras weight path
    notes: list[str] = field(default_factory=list)
    global_step: str | None = None  # `global_step = get_or_create_global_step()`: its name

    @property
    def trainable(self) -> str:
        return f"[weight.value for weight in {self.instance}.trainable_weights]"

    @property
    def regularized(self) -> bool:
        return "kernel_regularizer=" in self.model.source or "bias_regularizer" in self.model.source


def plan(program: Program, module: cst.Module, qualify) -> KerasPlan | str:  # type: ignore[no-untyped-def]
    """The Keras plan, or why the model code stays on tf.compat.v1."""
    functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
    layered = [
        f
        for f in functions.values()
        if f is not program.function
        and any(isinstance(n, cst.Call) and _is_tf1_model_call(qualify(n.func)) for n in walk(f))
    ]
    if not layered:
        return "the model is not built by a function of this module from TF1 layers"
    if len(layered) > 1:
        return f"the model code is spread over {len(layered)} functions"
    function = layered[0]
    if "arg_scope" in identifiers(module):  # it changes slim layers' defaults from outside
        return "slim arg_scope sets layer defaults the model function does not show"
    legacy = function.name.value
    uses = sum(1 for n in walk(module) if isinstance(n, cst.Name) and n.value == legacy)
    template, instance, template_scope = _template(program, legacy, qualify)
    if uses != 2:
        return f"`{legacy}` is used elsewhere than once by the towers"
    try:
        model = convert(function, qualify, module)
    except NotConvertible as exc:
        return f"{exc.reason} (line {_line(module, exc.node)})"
    if model.class_name in identifiers(module):
        return f"the module already uses the name `{model.class_name}`"
    calls = [
        n
        for s in program.tower_body
        for n in walk(s)
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == instance
    ]
    if len(calls) != 1:
        return f"`{instance}` is called {len(calls)} times in the tower"
    call = calls[0]
    try:
        inputs, training, init = _bind(call, function, model)
    except NotConvertible as exc:
        return exc.reason
    tower_made = set().union(set(), *(bound_names(s) for s in program.tower_body))
    tower_made.add(program.tower_index)
    for expression in init.values():
        if free_names(expression) & tower_made:
            return "the model is configured by a value of the tower"
    scopes = _call_scopes(program.tower_body, call, qualify)
    if scopes is None:
        return "the model call is not under literal variable scopes"
    prefix = [*scopes, *([template_scope] if template_scope else [])]
    components = [*prefix, *([model.scope] if model.scope else [])]
    if len(components) > 1:
        return f"nested variable scopes `{'/'.join(components)}`"
    model_name = components[0] if components else legacy
    arguments = "".join(f"{module.code_for_node(v)}, " for v in init.values())
    constructor = f'{instance} = {model.class_name}({arguments}name="{model_name}")'
    new_call = cst.Call(
        cst.Name(instance),
        [cst.Arg(inputs)]
        + (
            [
                cst.Arg(
                    training,
                    keyword=cst.Name("training"),
                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
                )
            ]
            if model.training_param
            else []
        ),
    )
    tower_body = _unscoped(program.tower_body, qualify, call, new_call)
    if template is not None:
        graph_setup = [
            cst.parse_statement(constructor) if s is template else s for s in program.graph_setup
        ]
    else:
        graph_setup = [*program.graph_setup, cst.parse_statement(constructor)]
    # Nothing in the tower may still create a TF1 variable: all of them are the model's now.
    reader = VariableNames(module, qualify)
    del reader.functions[legacy]  # the model's calls now build Keras layers
    left = reader.run(tower_body)
    if left is None or left:
        return "the tower creates variables besides the model's"
    variables = model.variables("/".join(prefix), model_name)
    legacy_names = VariableNames(module, qualify).run([*program.graph_setup, *program.tower_body])
    if legacy_names is None or set(legacy_names) - {"global_step"} != set(variables):
        return "the model's legacy variable names could not be matched one to one"
    global_step = None
    if "global_step" in legacy_names:  # a TF1 variable of its own, listed with the model's
        global_step = next(
            (
                s.body[0].targets[0].target.value  # type: ignore[attr-defined]
                for s in program.graph_setup
                if isinstance(s, cst.SimpleStatementLine)
                and isinstance(s.body[0], cst.Assign)
                and isinstance(s.body[0].targets[0].target, cst.Name)
                and qualify(
                    s.body[0].value.func
                    if isinstance(s.body[0].value, cst.Call)
                    else s.body[0].value
                )
                in (
                    "tensorflow.train.get_or_create_global_step",
                    "tensorflow.train.create_global_step",
                )
            ),
            None,
        )
        if global_step is None:
            return "the global step is not made by get_or_create_global_step() before the towers"
    return KerasPlan(
        model, instance, model_name, tower_body, graph_setup, variables, model.notes, global_step
    )


def _is_tf1_model_call(name: str | None) -> bool:
    if name is None:
        return False
    return name == "tensorflow.get_variable" or name.startswith(
        ("tensorflow.layers.", "tensorflow.contrib.", "tf_slim.")
    )


def _line(module: cst.Module, node: cst.CSTNode) -> str:
    code = module.code
    text = module.code_for_node(node).strip().splitlines()[0]
    for number, line in enumerate(code.splitlines(), 1):
        if text and text in line:
            return str(number)
    return "?"


def _template(program: Program, legacy: str, qualify):  # type: ignore[no-untyped-def]
    """(`net = tf.make_template('net', legacy)` statement or None, the name the towers call,
    the template's scope)."""
    for statement in program.graph_setup:
        for node in walk(statement):
            if (
                isinstance(node, cst.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0].target, cst.Name)
                and isinstance(node.value, cst.Call)
                and qualify(node.value.func) == "tensorflow.make_template"
            ):
                name = get_arg(node.value, 0, "name_")
                function = get_arg(node.value, 1, "func_")
                if (
                    isinstance(function, cst.Name)
                    and function.value == legacy
                    and isinstance(name, cst.SimpleString)
                    and len(node.value.args) == 2
                    and isinstance(statement, cst.SimpleStatementLine)
                ):
                    return statement, node.targets[0].target.value, name.evaluated_value
    return None, legacy, None


def _bind(
    call: cst.Call, function: cst.FunctionDef, model: KerasModel
) -> tuple[cst.BaseExpression, cst.BaseExpression, dict[str, cst.BaseExpression]]:
    """The call's input, training flag and constructor arguments (by legacy parameter)."""
    params = function.params.params
    given: dict[str, cst.BaseExpression] = {}
    for index, arg in enumerate(call.args):
        if arg.star:
            raise NotConvertible(call, "the model is called with *args / **kwargs")
        if arg.keyword is None:
            if index >= len(params):
                raise NotConvertible(call, "the model call has too many arguments")
            given[params[index].name.value] = arg.value
        else:
            given[arg.keyword.value] = arg.value
    for param in params:
        if param.name.value not in given and param.default is not None:
            given[param.name.value] = param.default
    missing = [p.name.value for p in params if p.name.value not in given]
    if missing:
        raise NotConvertible(call, f"the model call does not give `{missing[0]}`")
    training = given.get(model.training_param or "", cst.Name("False"))
    init = {p: given[p] for p in model.init_params}
    return given[model.input_param], training, init


def _call_scopes(statements, call: cst.Call, qualify) -> list[str] | None:  # type: ignore[no-untyped-def]
    """The literal variable scopes around the model call (get_variable_scope() adds none)."""
    for statement in statements:
        if not any(n is call for n in walk(statement)):
            continue
        if isinstance(statement, cst.With):
            names = []
            for item in statement.items:
                if isinstance(item.item, cst.Call) and qualify(item.item.func) == _VARIABLE_SCOPE:
                    scope = get_arg(item.item, 0, "name_or_scope")
                    if isinstance(scope, cst.SimpleString):
                        names.append(str(scope.evaluated_value))
                    elif not (
                        isinstance(scope, cst.Call)
                        and qualify(scope.func) == "tensorflow.get_variable_scope"
                    ):
                        return None
            inner = _call_scopes(statement.body.body, call, qualify)
            return None if inner is None else names + inner
        if isinstance(statement, cst.SimpleStatementLine):
            return []
        body = getattr(statement, "body", None)
        if isinstance(body, cst.BaseSuite):
            return _call_scopes(body.body, call, qualify)
        return None
    return None


class _Unscope(cst.CSTTransformer):
    """Drops the variable scopes (their with-items; a `with` left empty gives its body to its
    block) and `get_variable_scope().reuse_variables()`; replaces the model call."""

    def __init__(self, qualify, call: cst.Call, new_call: cst.Call) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.qualify, self.call, self.new_call = qualify, call, new_call

    def leave_Call(self, original, updated):  # type: ignore[no-untyped-def]
        return self.new_call if original is self.call else updated

    def leave_With(self, original, updated):  # type: ignore[no-untyped-def]
        items = [
            item
            for item in updated.items
            if not (
                isinstance(item.item, cst.Call) and self.qualify(item.item.func) == _VARIABLE_SCOPE
            )
        ]
        if len(items) == len(updated.items):
            return updated
        if items:
            items[-1] = items[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return updated.with_changes(items=items)
        body = list(updated.body.body)
        if body and original.leading_lines:
            body[0] = body[0].with_changes(
                leading_lines=[*original.leading_lines, *body[0].leading_lines]
            )
        return cst.FlattenSentinel(body)

    def leave_SimpleStatementLine(self, original, updated):  # type: ignore[no-untyped-def]
        if len(updated.body) == 1 and isinstance(updated.body[0], cst.Expr):
            value = updated.body[0].value
            if (
                isinstance(value, cst.Call)
                and isinstance(value.func, cst.Attribute)
                and value.func.attr.value == "reuse_variables"
            ):
                return cst.RemoveFromParent()
        return updated


def _unscoped(statements, qualify, call: cst.Call, new_call: cst.Call) -> list[cst.BaseStatement]:  # type: ignore[no-untyped-def]
    transformer = _Unscope(qualify, call, new_call)
    out: list[cst.BaseStatement] = []
    for statement in statements:
        new = statement.visit(transformer)
        if isinstance(new, cst.FlattenSentinel):
            out.extend(new.nodes)
        elif not isinstance(new, cst.RemovalSentinel):
            out.append(new)
    return out
