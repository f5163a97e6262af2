"""Whether a tower program's model becomes a Keras model, and the tower code that calls it.

Not a rule module. :func:`plan` finds the module-level function the towers call for their
model (directly under ``variable_scope(...)``, or through ``tf.make_template``), converts it
with :mod:`._keras_model_emit`, and rewrites the tower code around the call: the variable
scopes that only named and shared the model's variables go, the call passes Keras'
``training=``, and the model instance is made once in ``strategy.scope()``. A model function
of a module the script imports (``small_net.small_net(...)``, see :mod:`._imported_model`) is
converted the same way, its class left to that module. The slim arg_scopes around the call
are read into the conversion and dropped from the tower. Anything else returns the reason the
TF1 model code stays (on tf.compat.v1, with mirrored variables).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath

import libcst as cst

from tfmigrate.rules._imported_model import ImportedModel
from tfmigrate.rules._imported_model import find as find_imported
from tfmigrate.rules._keras_model_emit import KerasModel, NotConvertible, convert
from tfmigrate.rules._slim_arg_scope import ArgScope, is_arg_scope, scopes_of
from tfmigrate.rules._tower_program import Program
from tfmigrate.rules._towers import (
    bind_arguments,
    bound_names,
    free_names,
    get_arg,
    identifiers,
    walk,
)
from tfmigrate.rules._variable_names import VariableNames

_VARIABLE_SCOPE = "tensorflow.variable_scope"


@dataclass
class KerasPlan:
    model: KerasModel
    instance: str  # the model object's name in the training function
    model_name: str  # its Keras name (the legacy scope)
    tower_body: list[cst.BaseStatement]
    graph_setup: list[cst.BaseStatement]
    variables: dict[str, str]  # legacy variable name -> Keras weight path
    notes: list[str] = field(default_factory=list)
    global_step: str | None = None  # `global_step = get_or_create_global_step()`: its name
    # Module-level functions the conversion rewrote (None: removed), by name -- the variable
    # helpers and the function calling a get_variable model (see _keras_weights_emit).
    rewritten: dict[str, cst.BaseStatement | None] = field(default_factory=dict)
    imported: ImportedModel | None = None  # the model function lives in this module

    @property
    def trainable(self) -> str:
        return f"[weight.value for weight in {self.instance}.trainable_weights]"

    @property
    def regularized(self) -> bool:
        return "kernel_regularizer=" in self.model.source or "bias_regularizer" in self.model.source


def plan(
    program: Program, module: cst.Module, qualify, path: PurePosixPath | None = None
) -> KerasPlan | str:
    """The Keras plan, or why the model code stays on tf.compat.v1. `path`: the script's file,
    where a model module it imports is looked for."""
    # -- tf.get_variable model functions (CIFAR-10 tutorial style): _keras_weights_emit --
    from tfmigrate.rules._keras_weights_emit import plan_weights  # imports this module

    weights_plan = plan_weights(program, module, qualify, path)
    if weights_plan is not None:
        return weights_plan
    # -- end of the get_variable branch --
    functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
    layered = [
        f
        for f in functions.values()
        if f is not program.function
        and any(isinstance(n, cst.Call) and _is_tf1_model_call(qualify(n.func)) for n in walk(f))
        and not _configures_layers(f, qualify)
    ]
    imported = None if layered else find_imported(program.tower_body, module, path)
    if isinstance(imported, str):
        return imported
    if not layered and imported is None:
        return "the model is not built by a function of this module from TF1 layers"
    if len(layered) > 1:
        return f"the model code is spread over {len(layered)} functions"
    if imported is not None:
        # `small_net.small_net(...)`: the class goes in that module (see _imported_model).
        function, call, template, template_scope = imported.function, imported.call, None, None
        legacy, model_module, model_qualify = function.name.value, imported.module, imported.qualify
        taken = identifiers(module)
        instance = next(n for n in (legacy, "model", f"{legacy}_model") if n not in taken)
        scope_functions = {**functions, **imported.functions}
        calls = [n for s in program.tower_body for n in walk(s) if n is call]
    else:
        function = layered[0]
        legacy, model_module, model_qualify = function.name.value, module, qualify
        uses = sum(1 for n in walk(module) if isinstance(n, cst.Name) and n.value == legacy)
        template, instance, template_scope = _template(program, legacy, qualify)
        if uses != 2:
            return f"`{legacy}` is used elsewhere than once by the towers"
        calls = [
            n
            for s in program.tower_body
            for n in walk(s)
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == instance
        ]
        scope_functions = {name: f for name, f in functions.items() if f is not function}
    if len(calls) != 1:
        return f"`{instance}` is called {len(calls)} times in the tower"
    call = calls[0]
    try:
        arg_scopes = _call_arg_scopes(program.tower_body, call, qualify, scope_functions)
        model = convert(function, model_qualify, model_module, arg_scopes=arg_scopes)
    except NotConvertible as exc:
        where = f"{imported.path.name}, " if imported is not None else ""
        return f"{exc.reason} ({where}line {_line(model_module, exc.node)})"
    if model.class_name in identifiers(model_module):
        return f"the module already uses the name `{model.class_name}`"
    try:
        inputs, training, init = _bind(call, function, model)
        if model.call_site_training and not (
            isinstance(training, cst.Name) and training.value == "True"
        ):
            # the call's own flag is not True: the arg_scope's True stays fixed in call()
            model = convert(
                function, model_qualify, model_module, arg_scopes=arg_scopes,
                call_site_training=False,
            )  # fmt: skip
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
    access = f"{imported.access}." if imported is not None else ""
    constructor = f'{instance} = {access}{model.class_name}({arguments}name="{model_name}")'
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
            if model.takes_training
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
    reader.functions.pop(legacy, None)  # the model's calls now build Keras layers
    left = reader.run(tower_body)
    if left is None or left:
        return "the tower creates variables besides the model's"
    variables = model.variables("/".join(prefix), model_name)
    legacy_reader = VariableNames(module, qualify)
    if imported is not None:
        legacy_reader.import_functions(model_module, model_qualify, imported.access)
    legacy_names = legacy_reader.run([*program.graph_setup, *program.tower_body])
    if legacy_names is None or set(legacy_names) - {"global_step"} != set(variables):
        return "the model's legacy variable names could not be matched one to one"
    global_step = None
    if "global_step" in legacy_names:  # a TF1 variable of its own, listed with the model's
        global_step = next(
            (
                s.body[0].targets[0].target.value
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
    # Arg-scope functions of this module only the towers used go with the model function.
    used = {n.value for s in program.tower_body for n in walk(s) if isinstance(n, cst.Name)}
    dead_scopes = {
        name
        for name, f in functions.items()
        if name in used
        and _configures_layers(f, qualify)
        and sum(1 for n in walk(module) if isinstance(n, cst.Name) and n.value == name) == 2
    }
    return KerasPlan(
        model,
        instance,
        model_name,
        tower_body,
        graph_setup,
        variables,
        model.notes,
        global_step,
        rewritten=dict.fromkeys(dead_scopes),
        imported=imported,
    )


def _configures_layers(function: cst.FunctionDef, qualify) -> bool:
    """An arg-scope function (`with slim.arg_scope(...) as sc: return sc`): no model code."""
    calls = [qualify(n.func) or "" for n in walk(function) if isinstance(n, cst.Call)]
    return any(c.endswith(".arg_scope") for c in calls) and all(
        c.endswith((".arg_scope", "_initializer", "_regularizer"))
        for c in calls
        if _is_tf1_model_call(c)
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


def _template(program: Program, legacy: str, qualify):
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
    given = bind_arguments(call, function, lambda what: NotConvertible(call, f"the model {what}"))
    if model.scope_param is not None and model.scope_param in given:
        raise NotConvertible(call, f"the model call gives its scope (`{model.scope_param}=`)")
    for param in params:
        if param.name.value not in given and param.default is not None:
            given[param.name.value] = param.default
    missing = [p.name.value for p in params if p.name.value not in given]
    if missing:
        raise NotConvertible(call, f"the model call does not give `{missing[0]}`")
    # No flag of its own: the towers' arg_scope trained the model (call_site_training) or not.
    unflagged = cst.Name("True" if model.call_site_training else "False")
    training = given.get(model.training_param or "", unflagged)
    init = {p: given[p] for p in model.init_params}
    return given[model.input_param], training, init


def _call_arg_scopes(statements, call: cst.Call, qualify, functions) -> list[ArgScope]:
    """The slim arg_scopes around the model call in the tower (outermost first)."""
    found: list[ArgScope] = []
    for statement in statements:
        if not any(n is call for n in walk(statement)):
            continue
        if isinstance(statement, cst.With):
            for item in statement.items:
                if is_arg_scope(item.item, qualify):
                    found += scopes_of(item.item, qualify, functions)
        body = getattr(statement, "body", None)
        if isinstance(body, cst.BaseSuite):
            found += _call_arg_scopes(body.body, call, qualify, functions)
    return found


def _call_scopes(statements, call: cst.Call, qualify) -> list[str] | None:
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

    def __init__(self, qualify, call: cst.Call, new_call: cst.Call) -> None:
        super().__init__()
        self.qualify, self.call, self.new_call = qualify, call, new_call

    def leave_Call(self, original, updated):
        return self.new_call if original is self.call else updated

    def leave_With(self, original, updated):
        items = [
            item
            for item in updated.items
            if not (
                isinstance(item.item, cst.Call) and self.qualify(item.item.func) == _VARIABLE_SCOPE
            )
            and not is_arg_scope(item.item, self.qualify)  # they configured the model's layers
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

    def leave_SimpleStatementLine(self, original, updated):
        if len(updated.body) == 1 and isinstance(updated.body[0], cst.Expr):
            value = updated.body[0].value
            if (
                isinstance(value, cst.Call)
                and isinstance(value.func, cst.Attribute)
                and value.func.attr.value == "reuse_variables"
            ):
                return cst.RemoveFromParent()
        return updated


def _unscoped(statements, qualify, call: cst.Call, new_call: cst.Call) -> list[cst.BaseStatement]:
    transformer = _Unscope(qualify, call, new_call)
    out: list[cst.BaseStatement] = []
    for statement in statements:
        new = statement.visit(transformer)
        if isinstance(new, cst.FlattenSentinel):
            out.extend(new.nodes)
        elif not isinstance(new, cst.RemovalSentinel):
            out.append(new)
    return out
