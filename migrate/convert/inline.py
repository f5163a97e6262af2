"""A tower builder called once, inlined into its caller: the function that builds the towers
returns what they made (``return tower_grads, mean_loss``) and the function calling it combines,
applies and runs them (``grads, loss = get_tower_results(...)`` then ``average_gradients(grads)``,
``apply_gradients``, ``Session.run``). With the builder's body in place of the call, the caller
holds the whole core and converts as a tower function does.

The names cross over so that the caller keeps its own where it can: what the builder returned
under a name of its own takes the caller's name, unless the builder already uses that name
(its towers' ``loss``), where the caller's later reads take the builder's name instead."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import libcst as cst

from tfmigrate import tree
from tfmigrate.convert.project import SourceFile
from tfmigrate.rules._towers import bound_names

_DEFS = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


@dataclass(frozen=True)
class Inlined:
    """The module with ``builder`` inlined into ``caller`` (both as the module spells them)."""

    module: cst.Module
    builder: str
    caller: str


def builders_inlined(source: SourceFile, loops: Sequence[cst.CSTNode]) -> Inlined | None:
    """``source``'s module with the first function holding one of the tower ``loops`` that
    returns to its one caller inlined there; None when no builder can be."""
    seen: set[int] = set()
    for loop in loops:
        builder = source.enclosing_def(loop)
        if builder is None or id(builder) in seen:
            continue
        seen.add(id(builder))
        inlined = _inline(source, builder)
        if inlined is not None:
            return inlined
    return None


def _inline(source: SourceFile, builder: cst.FunctionDef) -> Inlined | None:
    if source.parent(builder) is not source.module or builder.decorators:
        return None
    body = _statements(builder)
    if body is None or not _plain(builder, body):
        return None
    returned = _returned(body)
    if returned is None:
        return None
    call = _only_call(source, builder)
    if call is None:
        return None
    statement = _statement_of(source, call)
    if statement is None:
        return None
    caller = _scope(source, statement)
    if caller is builder or builder in source.ancestors(statement):
        return None
    bindings = _arguments(builder, call)
    if bindings is None:
        return None
    own = bound_names(builder.body) | set(_param_names(builder))
    defaults = [p.default for p in _all_params(builder.params) if p.default is not None]
    read = _names(builder.body) | {n for d in defaults for n in _names(d)}
    caller_locals = _locals(caller)
    if (read - own) & caller_locals:
        return None  # a global the builder reads is a local of the caller
    crossing = _crossing(source, caller, builder, statement, returned, own)
    if crossing is None:
        return None
    builder_renames, caller_renames, aliases = crossing
    inner = (own - set(builder_renames)) | set(builder_renames.values())
    # The caller's names the builder's body would overwrite: none may be read again.
    after = _names_after(source, caller, statement, caller_renames)
    targets = _assigned(statement)
    params_as_passed = {
        name for name, value in bindings if isinstance(value, cst.Name) and value.value == name
    }
    handed = set(caller_renames.values())
    if (inner - targets - params_as_passed - handed) & after:
        return None
    renamer = _Renamer(builder_renames)
    new: list[cst.BaseStatement] = []
    for name, value in bindings:
        if name not in params_as_passed:
            new.append(_assign(cst.Name(builder_renames.get(name, name)), value))
    first_body = 1 if _is_docstring(body[0]) else 0
    for kept in body[first_body:-1]:
        visited = kept.visit(renamer)
        assert isinstance(visited, cst.BaseStatement)
        new.append(visited)
    tail = _tail(statement, returned, aliases, renamer)
    new.extend(tail)
    if not new:
        return None
    new[0] = new[0].with_changes(leading_lines=statement.leading_lines)
    rename_ids = _caller_name_ids(source, caller, statement, caller_renames)
    module = source.module.visit(_Splice(builder, statement, new, rename_ids))
    assert isinstance(module, cst.Module)
    return Inlined(cst.parse_module(module.code), builder.name.value, source.qualname(caller))


# -- the builder ---------------------------------------------------------------------------------
def _statements(function: cst.FunctionDef) -> Sequence[cst.BaseStatement] | None:
    body = function.body
    return body.body if isinstance(body, cst.IndentedBlock) and body.body else None


def _plain(function: cst.FunctionDef, body: Sequence[cst.BaseStatement]) -> bool:
    """No ``*args``/``**kwargs``, ``global``, ``nonlocal``, ``yield``, and one ``return``: its
    last statement. Nested functions and lambdas bind none of the builder's names."""
    params = function.params
    if isinstance(params.star_arg, cst.Param) or params.star_kwarg is not None:
        return False
    returns = 0
    own = bound_names(function.body) | set(_param_names(function))
    for node in tree.walk(function.body, _DEFS):
        if isinstance(node, cst.Global | cst.Nonlocal | cst.Yield | cst.Await):
            return False
        if isinstance(node, cst.Return):
            returns += 1
        if isinstance(node, cst.FunctionDef | cst.Lambda) and node is not function:
            inner = _defined_names(node)
            if inner & own:
                return False
    last = body[-1]
    return (
        returns == 1
        and isinstance(last, cst.SimpleStatementLine)
        and len(last.body) == 1
        and isinstance(last.body[0], cst.Return)
    )


def _defined_names(node: cst.FunctionDef | cst.Lambda) -> set[str]:
    found = {p.name.value for p in _all_params(node.params)}
    if isinstance(node, cst.FunctionDef):
        found |= bound_names(node.body)
    return found


def _returned(body: Sequence[cst.BaseStatement]) -> cst.BaseExpression | None:
    last = body[-1]
    assert isinstance(last, cst.SimpleStatementLine)
    value = last.body[0]
    assert isinstance(value, cst.Return)
    return value.value if value.value is not None else cst.Name("None")


def _all_params(params: cst.Parameters) -> list[cst.Param]:
    every = [*params.posonly_params, *params.params, *params.kwonly_params]
    if isinstance(params.star_arg, cst.Param):
        every.append(params.star_arg)
    if params.star_kwarg is not None:
        every.append(params.star_kwarg)
    return every


def _param_names(function: cst.FunctionDef) -> list[str]:
    return [p.name.value for p in _all_params(function.params)]


def _only_call(source: SourceFile, builder: cst.FunctionDef) -> cst.Call | None:
    """The one call of ``builder`` by its name: no other mention of the name anywhere."""
    name = builder.name.value
    calls: list[cst.Call] = []
    mentions = 0
    for node in tree.walk(source.module):
        if isinstance(node, cst.Name) and node.value == name and node is not builder.name:
            parent = source.parent(node)
            if isinstance(parent, cst.Attribute) and parent.attr is node:
                continue
            if isinstance(parent, cst.Arg) and parent.keyword is node:
                continue
            mentions += 1
            if isinstance(parent, cst.Call) and parent.func is node:
                calls.append(parent)
    return calls[0] if mentions == 1 and len(calls) == 1 else None


def _statement_of(source: SourceFile, call: cst.Call) -> cst.SimpleStatementLine | None:
    """The statement ``targets = builder(...)`` or ``builder(...)`` the call is all of."""
    small = source.parent(call)
    line = source.parent(small) if small is not None else None
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None
    if isinstance(small, cst.Expr) and small.value is call:
        return line
    if isinstance(small, cst.Assign) and small.value is call and len(small.targets) == 1:
        return line
    return None


def _scope(source: SourceFile, node: cst.CSTNode) -> cst.FunctionDef | cst.Module:
    function = source.enclosing_def(node)
    return function if function is not None else source.module


def _arguments(
    builder: cst.FunctionDef, call: cst.Call
) -> list[tuple[str, cst.BaseExpression]] | None:
    """Each parameter with what the call gives it (its default when not given), in order."""
    params = builder.params
    positional = [*params.posonly_params, *params.params]
    keyword_only = list(params.kwonly_params)
    given: dict[str, cst.BaseExpression] = {}
    index = 0
    for arg in call.args:
        if arg.star:
            return None
        if arg.keyword is None:
            if index >= len(positional):
                return None
            given[positional[index].name.value] = arg.value
            index += 1
        else:
            given[arg.keyword.value] = arg.value
    found = []
    for param in [*positional, *keyword_only]:
        name = param.name.value
        value = given.pop(name, None) or param.default
        if value is None:
            return None
        found.append((name, value))
    return None if given else found


# -- names ---------------------------------------------------------------------------------------
def _names(node: cst.CSTNode) -> set[str]:
    """Every variable name spelled in ``node`` (not attributes or keywords)."""
    found: set[str] = set()
    for current in _variable_names(node):
        found.add(current.value)
    return found


def _variable_names(node: cst.CSTNode) -> Iterator[cst.Name]:
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Name):
            yield current
            continue
        if isinstance(current, cst.Attribute):
            stack.append(current.value)
            continue
        if isinstance(current, cst.Arg):
            stack.append(current.value)
            continue
        stack.extend(reversed(tree.children(current)))


def _locals(scope: cst.FunctionDef | cst.Module) -> set[str]:
    if isinstance(scope, cst.Module):
        found: set[str] = set()
        for statement in scope.body:
            found |= bound_names(statement)
            if isinstance(statement, cst.FunctionDef | cst.ClassDef):
                found.add(statement.name.value)
        return found
    return bound_names(scope.body) | set(_param_names(scope)) | _nested_def_names(scope)


def _nested_def_names(scope: cst.FunctionDef) -> set[str]:
    return {
        node.name.value
        for node in tree.walk(scope.body, _DEFS)
        if isinstance(node, cst.FunctionDef | cst.ClassDef)
    }


def _assigned(statement: cst.SimpleStatementLine) -> set[str]:
    return bound_names(statement)


def _later_statements(
    source: SourceFile, scope: cst.FunctionDef | cst.Module, statement: cst.CSTNode
) -> list[cst.CSTNode]:
    """The statements of ``scope`` that may run after ``statement``: those after it in its
    block and in each enclosing block up to the scope, and a loop body's earlier ones (they
    run again)."""
    found: list[cst.CSTNode] = []
    current: cst.CSTNode = statement
    for ancestor in source.ancestors(statement):
        if isinstance(ancestor, cst.IndentedBlock | cst.Module):
            block: list[cst.CSTNode] = list(ancestor.body)
            at = next((k for k, s in enumerate(block) if s is current), None)
            if at is not None:
                found.extend(block[at + 1 :])
                owner = source.parent(ancestor)
                if isinstance(owner, cst.For | cst.While) and owner.body is ancestor:
                    found.extend(block[:at])
        if ancestor is scope:
            break
        current = ancestor
    return found


def _names_after(
    source: SourceFile,
    scope: cst.FunctionDef | cst.Module,
    statement: cst.CSTNode,
    renames: dict[str, str],
) -> set[str]:
    """The caller's names read after ``statement`` (the caller's renames applied), and the
    names its nested functions read from it: they may run later."""
    found: set[str] = set()
    for node in _later_statements(source, scope, statement):
        found |= {renames.get(n, n) for n in _names(node)}
    for node in tree.walk(scope):
        if isinstance(node, cst.FunctionDef | cst.Lambda) and node is not scope:
            free = _names(node) - _defined_names(node)
            found |= {renames.get(n, n) for n in free}
    return found


def _crossing(
    source: SourceFile,
    caller: cst.FunctionDef | cst.Module,
    builder: cst.FunctionDef,
    statement: cst.SimpleStatementLine,
    returned: cst.BaseExpression,
    own: set[str],
) -> (
    tuple[
        dict[str, str],
        dict[str, str],
        list[tuple[cst.BaseAssignTargetExpression, cst.BaseExpression]],
    ]
    | None
):
    """How the returned values reach the caller's targets: builder names renamed to the
    caller's, caller names renamed to the builder's (in what runs after the call), and
    assignments left for the rest."""
    small = statement.body[0]
    if isinstance(small, cst.Expr):
        return {}, {}, []
    assert isinstance(small, cst.Assign)
    target = small.targets[0].target
    pairs: list[tuple[cst.BaseAssignTargetExpression, cst.BaseExpression]]
    if (
        isinstance(target, cst.Tuple | cst.List)
        and isinstance(returned, cst.Tuple)
        and len(target.elements) == len(returned.elements)
        and not any(isinstance(e, cst.StarredElement) for e in target.elements)
        and not any(isinstance(e, cst.StarredElement) for e in returned.elements)
    ):
        pairs = [
            (t.value, v.value)  # type: ignore[misc]  # elements of an assignment target
            for t, v in zip(target.elements, returned.elements, strict=True)
        ]
    else:
        pairs = [(target, returned)]
    builder_renames: dict[str, str] = {}
    caller_renames: dict[str, str] = {}
    aliases: list[tuple[cst.BaseAssignTargetExpression, cst.BaseExpression]] = []
    later = _later_statements(source, caller, statement)
    rebound_later = set().union(set(), *(bound_names(n) for n in later))
    caller_names = _names(caller) if not isinstance(caller, cst.Module) else _locals(caller)
    returned_names = [v.value for _, v in pairs if isinstance(v, cst.Name)]
    for t, v in pairs:
        if not (isinstance(t, cst.Name) and isinstance(v, cst.Name) and v.value in own):
            aliases.append((t, v))
            continue
        if t.value == v.value:
            continue
        if returned_names.count(v.value) > 1:
            aliases.append((t, v))
        elif t.value not in own and t.value not in builder_renames.values():
            builder_renames[v.value] = t.value
        elif (
            t.value not in rebound_later
            and v.value not in caller_names
            and not _rebinds_in_nested(caller, t.value)
        ):
            caller_renames[t.value] = v.value
        else:
            aliases.append((t, v))
    return builder_renames, caller_renames, aliases


def _rebinds_in_nested(scope: cst.FunctionDef | cst.Module, name: str) -> bool:
    for node in tree.walk(scope):
        if isinstance(node, cst.FunctionDef | cst.Lambda) and node is not scope:
            if name in _defined_names(node):
                return True
    return False


def _caller_name_ids(
    source: SourceFile,
    scope: cst.FunctionDef | cst.Module,
    statement: cst.CSTNode,
    renames: dict[str, str],
) -> dict[int, str]:
    if not renames:
        return {}
    found: dict[int, str] = {}
    for node in _later_statements(source, scope, statement):
        for name in _variable_names(node):
            if name.value in renames:
                found[id(name)] = renames[name.value]
    return found


# -- writing -------------------------------------------------------------------------------------
def _tail(
    statement: cst.SimpleStatementLine,
    returned: cst.BaseExpression,
    aliases: list[tuple[cst.BaseAssignTargetExpression, cst.BaseExpression]],
    renamer: _Renamer,
) -> list[cst.BaseStatement]:
    small = statement.body[0]
    if isinstance(small, cst.Expr):
        has_call = any(isinstance(n, cst.Call) for n in tree.walk(returned))
        if not has_call:
            return []
        value = returned.visit(renamer)
        assert isinstance(value, cst.BaseExpression)
        return [cst.SimpleStatementLine([cst.Expr(value)])]
    found: list[cst.BaseStatement] = []
    for target, value in aliases:
        renamed = value.visit(renamer)
        assert isinstance(renamed, cst.BaseExpression)
        found.append(_assign(target, renamed))
    return found


def _assign(
    target: cst.BaseAssignTargetExpression, value: cst.BaseExpression
) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(target)], value)])


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, cst.SimpleString | cst.ConcatenatedString)
    )


class _Renamer(cst.CSTTransformer):
    """Variable names renamed (attributes and keywords kept)."""

    def __init__(self, renames: dict[str, str]) -> None:
        self.renames = renames

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        new = self.renames.get(original_node.value)
        return updated_node.with_changes(value=new) if new else updated_node

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.Attribute:
        return updated_node.with_changes(attr=original_node.attr)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        return updated_node.with_changes(keyword=original_node.keyword)


class _Splice(cst.CSTTransformer):
    """The builder's def dropped, its call's statement replaced by its body, and the caller's
    names read after the call renamed."""

    def __init__(
        self,
        builder: cst.FunctionDef,
        statement: cst.SimpleStatementLine,
        body: list[cst.BaseStatement],
        renames: dict[int, str],
    ) -> None:
        self.builder = builder
        self.statement = statement
        self.body = body
        self.renames = renames

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef | cst.RemovalSentinel:
        return cst.RemoveFromParent() if original_node is self.builder else updated_node

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        if original_node is self.statement:
            return cst.FlattenSentinel(self.body)
        return updated_node

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        new = self.renames.get(id(original_node))
        return updated_node.with_changes(value=new) if new else updated_node
