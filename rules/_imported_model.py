"""A tower program's model function in a module of its own (``from nets import small_net``).

Not a rule module. TFM303 converts the towers' model to a Keras model on both sides of the
import, consistently: the training script builds ``small_net.SmallNet(...)`` and the model
module defines that class where the function was. Both sides ask :func:`find` (the script
while it converts, the model module through :func:`keras_plan_of_importer`), so both make the
same decision from the same two files.

No TensorFlow import here (the rewrite path must not need it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import libcst as cst

from tfmigrate.names import NameResolver
from tfmigrate.rules._slim_arg_scope import Qualify
from tfmigrate.rules._towers import walk


@dataclass
class ImportedModel:
    path: Path  # the model module's file
    access: str  # how the script names that module (`small_net`)
    function: cst.FunctionDef
    call: cst.Call | None  # the towers' call of it (None: they call it more than once)
    module: cst.Module  # the model module, TF1 names on their tf.compat.v1 spellings
    qualify: Qualify
    # its functions by the script's spelling (`small_net.small_net_arg_scope`), each with the
    # model module's qualify (arg_scope functions the towers call)
    functions: dict[str, tuple[cst.FunctionDef, Qualify]] = field(default_factory=dict)
    arg_scope_functions: set[str] = field(default_factory=set)  # those the towers used
    # variable helpers of a get_variable model that only it used (they go with it)
    dropped: set[str] = field(default_factory=set)
    # other functions of the model module rewritten with it (name -> the new function)
    rewritten: dict[str, cst.FunctionDef] = field(default_factory=dict)


def _module_names(module: cst.Module) -> dict[str, str]:
    """Names bound by ``import a.b as x`` / ``import a`` / ``from p import m`` -> dotted path."""
    code = module.code_for_node
    found: dict[str, str] = {}
    for statement in module.body:
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if isinstance(small, cst.Import):
            for alias in small.names:
                dotted = code(alias.name)
                if alias.asname is not None:
                    found[code(alias.asname.name)] = dotted
                elif "." not in dotted:
                    found[dotted] = dotted
        elif isinstance(small, cst.ImportFrom) and isinstance(small.names, list | tuple):
            base = code(small.module) if small.module is not None else ""
            for alias in small.names:
                name = code(alias.name)
                bound = code(alias.asname.name) if alias.asname else name
                found[bound] = f"{base}.{name}" if base else name
    return found


def _renamed(text: str, name: str) -> cst.Module:
    """The module as TFM303 converts it: TF1 symbols on their tf.compat.v1 spellings."""
    from tfmigrate.engine import Settings, process_source
    from tfmigrate.rules.tf1_api_to_compat_v1 import Tf1ApiToCompatV1

    result = process_source(text, name, Settings(rules=(Tf1ApiToCompatV1,), fix=True))
    return cst.parse_module(result.new_code or text)


def _is_model_code(function: cst.FunctionDef, qualify: Qualify) -> bool:
    for node in walk(function):
        if isinstance(node, cst.Call):
            name = qualify(node.func) or ""
            if name.startswith(("tensorflow.layers.", "tensorflow.compat.v1.layers.")) or (
                name.startswith(("tensorflow.contrib.", "tf_slim."))
                # what configures layers (an arg-scope function) is not model code
                and not name.endswith(("arg_scope", "_initializer", "_regularizer"))
            ):
                return True
    return False


def find(
    tower_body: list[cst.BaseStatement], module: cst.Module, path: PurePosixPath | None
) -> ImportedModel | str | None:
    """The model function the towers call from a module of the project (``access.fn(...)``),
    or why it cannot be used, or None when the towers call none."""
    if path is None:
        return None
    names = _module_names(module)
    folder = Path(path).parent
    found: list[ImportedModel] = []
    for statement in tower_body:
        for node in walk(statement):
            if not (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and isinstance(node.func.value, cst.Name)
                and node.func.value.value in names
            ):
                continue
            access = node.func.value.value
            file = folder / (names[access].replace(".", "/") + ".py")
            try:
                text = file.read_text(encoding="utf-8")
                model_module = _renamed(text, file.name)
            except (OSError, UnicodeDecodeError, cst.ParserSyntaxError):
                continue
            qualify = NameResolver.for_module(model_module).qualify
            functions = {
                s.name.value: s for s in model_module.body if isinstance(s, cst.FunctionDef)
            }
            function = functions.get(node.func.attr.value)
            if function is None or not _is_model_code(function, qualify):
                continue
            found.append(
                ImportedModel(
                    file,
                    access,
                    function,
                    node,
                    model_module,
                    qualify,
                    {
                        f"{access}.{n}": (f, qualify)
                        for n, f in functions.items()
                        if f is not function
                    },
                )
            )
    if not found:
        return None
    if len(found) > 1:
        return f"the towers call {len(found)} model functions of other modules"
    model = found[0]
    for statement in tower_body:  # the arg-scope functions the towers use
        for node in walk(statement):
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
                key = module.code_for_node(node.func)
                if key in model.functions:
                    model.arg_scope_functions.add(node.func.attr.value)
    return model


def keras_plan_of_importer(importer: Path, options: dict, rule: type):
    """The Keras plan TFM303 makes for the tower program `importer` (None if none): what its
    model module must define for the two to stay consistent."""
    from tfmigrate import tree
    from tfmigrate.rule import RuleContext
    from tfmigrate.rules import _batch_norm_sync as batch_norm_sync
    from tfmigrate.rules import tower_program
    from tfmigrate.rules._keras_model_plan import KerasPlan, plan
    from tfmigrate.rules._tower_program import Blocked

    try:
        text = importer.read_text(encoding="utf-8")
        module = _renamed(text, importer.name)
    except (OSError, UnicodeDecodeError, cst.ParserSyntaxError):
        return None
    context = RuleContext(
        PurePosixPath(importer),
        NameResolver.for_module(module),
        module,
        {**options, "_tfm303_inner": True},
    )
    reader = rule(context)
    tree.visit_batched(module, [reader])
    loops = reader.tower_loops()
    if len(loops) != 1 or not isinstance(loops[0].replicator, cst.For):
        return None
    try:
        program = tower_program._analyse(reader, loops[0].replicator)[0]
    except Blocked:
        return None
    result = plan(program, module, reader.qualify, PurePosixPath(importer))
    if not (isinstance(result, KerasPlan) and result.imported is not None):
        return None
    if batch_norm_sync.mode(options) == "sync":  # as the program's own conversion decides
        try:
            tower_program._check_batch_norm_sync(reader, result)
        except Blocked:
            return None
        result = batch_norm_sync.synchronized_plan(result)
    return result


def keras_model_module(context, importer_name: str, rule: type) -> tuple[cst.Module, str] | None:
    """The model module at ``context.path`` with its model function turned into the Keras class
    the tower program `importer_name` (relative to the module's folder) builds -- the arg-scope
    functions only the towers used go with it -- and the manifest note; None when the program
    keeps its TF1 model code."""
    from tfmigrate.rules import tower_program

    here = Path(context.path)
    keras = keras_plan_of_importer(here.parent / importer_name, context.options, rule)
    if keras is None or keras.imported.path.resolve() != here.resolve():
        return None
    imported: ImportedModel = keras.imported
    module = imported.module
    used = tower_program._names_used(module)
    dropped = {
        name
        for name in imported.arg_scope_functions
        if used.get(name, 0) == 1  # its def: the towers were its only users
    } | imported.dropped
    unit = module.default_indent
    body: list[cst.BaseStatement] = []
    for statement in module.body:
        if statement is imported.function:
            body.extend(tower_program._keras_classes(keras, statement, unit))
        elif isinstance(statement, cst.FunctionDef) and statement.name.value in imported.rewritten:
            body.append(imported.rewritten[statement.name.value])
        elif not (isinstance(statement, cst.FunctionDef) and statement.name.value in dropped):
            body.append(statement)
    new = tower_program._drop_dead_aliases(module.with_changes(body=body))
    new = tower_program._drop_dead_imports(module, new)
    new = tower_program._add_imports(new, ["import keras"])
    model = keras.model
    note = (
        f"TFM303: model module of the tower program `{importer_name}`: the model function "
        f"`{model.function.name.value}` -> the Keras model class `{model.class_name}`, which "
        "the program builds (the variable mapping is the program's)"
        + (f"; {', '.join(sorted(dropped))} removed: only the towers used it" if dropped else "")
    )
    return new, note


# For the get_variable model of an imported module (see _keras_weights_emit).
module_names = _module_names
renamed_module = _renamed
