"""How a tower loop's contributions are combined: averaged or summed gradients (TFM102's
reading of helpers and inline code), or one loss over the towers differentiated once with
``colocate_gradients_with_ops`` (TFM307's reading)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import libcst as cst

from tfmigrate import tree
from tfmigrate.convert import ir
from tfmigrate.convert.project import Project, SourceFile
from tfmigrate.convert.recognize._code import (
    AggregationSite,
    Code,
    assigned_names,
    call_name,
    callee,
    callers_of,
    calls_in,
    class_methods,
    end_line,
    is_gradient_call,
    keyword,
    mentions,
    reachable,
    reading,
    returns_any,
    statement_of,
)
from tfmigrate.convert.recognize.towers import TowerSite
from tfmigrate.rules._towers import identifiers, is_true

_AVERAGE_NAME = re.compile(r"averag|mean", re.I)
_SUM_NAME = re.compile(r"sum|add|total|combine|aggregat|reduce|allreduce", re.I)


@dataclass(frozen=True)
class Combined:
    """A combination and what the code after it calls its result (for finding the update)."""

    combination: ir.Combination
    source: SourceFile
    statement: cst.CSTNode  # the call or statement that combines
    results: frozenset[str]
    loss_call: cst.Call | None = None  # the one gradient call of a colocated loss
    loss: ir.Loss | None = None  # the towers' losses, when a helper differentiates them


def _spelling(hows: list[str], function: cst.CSTNode | None) -> str:
    text = "; ".join(dict.fromkeys(hows))
    if "Python loop" in text:
        sparse = function is not None and "IndexedSlices" in identifiers(function)
        return "python-sum with IndexedSlices" if sparse else "python-sum"
    if "concat" in text:
        return "expand_dims/concat/reduce_mean" if "mean" in text else "concat/reduce_sum"
    if "list" in text:
        return "reduce_mean over a list" if "mean" in text else "reduce_sum over a list"
    if "add_n" in text:
        return "add_n / len" if any(c in text for c in "/*") or "through" in text else "add_n"
    return text


def _sites_in(code: Code) -> list[AggregationSite]:
    """TFM102's sites anchored at ``code``'s def or at a statement inside it."""
    found = []
    start, end = code.source.line(code.node), end_line(code.source, code.node)
    for site in reading(code.source).sites.values():
        anchor = site.anchor
        if anchor is code.node or (
            not isinstance(code.node, cst.Module) and start <= code.source.line(anchor) <= end
        ):
            found.append(site)
    return found


def _kind(sites: list[AggregationSite]) -> ir.CombineKind:
    averages = any(s.averages for s in sites)
    return ir.CombineKind.AVERAGED if averages else ir.CombineKind.SUMMED


def _hows(sites: list[AggregationSite]) -> list[str]:
    return [h for s in sites for h in (*s.averages, *s.sums)]


def combine(project: Project, site: TowerSite, files: list[SourceFile]) -> list[Combined] | str:
    """The combinations of ``site``'s towers (one per gradient list or per optimizer), or why
    none was found."""
    start = (site.function, end_line(site.source, site.loop))
    if site.gradient_lists:
        found = _combinations(project, files, start, site.gradient_lists, need_gradients=False)
        if found:
            return found
    if site.loss_lists and not site.gradient_calls:
        # Losses collected per tower, differentiated tower by tower in a helper after the loop.
        found = _combinations(project, files, start, site.loss_lists, need_gradients=True)
        if found:
            return found
    found = _colocated(project, site)
    if found:
        return found
    if site.gradient_lists:
        names = ", ".join(sorted(site.gradient_lists))
        return (
            f"the towers' gradients ({names}) are collected but no averaging or summing of "
            "them was found after the loop"
        )
    if site.gradient_calls:
        return "the towers take gradients but do not collect them in a list"
    return (
        "the towers compute no gradients and no loss over the towers is differentiated with "
        "colocate_gradients_with_ops=True"
    )


def _combinations(
    project: Project,
    files: list[SourceFile],
    start: tuple[Code, int],
    names: set[str],
    *,
    need_gradients: bool,
    depth: int = 0,
) -> list[Combined]:
    """The calls after ``start`` that combine what is collected under ``names``: a TFM102
    helper or inline site, or a helper named for it. Names bound from other calls on them
    (``split_grad_list(tower_grads)``) are followed; a function returning them is followed
    into its callers."""
    holder, after = start
    tracked = set(names)
    found: list[Combined] = []
    consumed: set[int] = set()
    for code in [holder, *class_methods(holder)]:
        same = code.node is holder.node
        for call in calls_in(code):
            if same and code.source.line(call) <= after:
                continue
            if not any(mentions(arg.value, tracked) for arg in call.args):
                continue
            statement = id(statement_of(code.source, call))
            if statement in consumed:
                continue
            combined = _combination_at(project, code, call, need_gradients)
            if combined is not None:
                found.append(combined)
                consumed.add(statement)
                consumed.add(id(statement_of(code.source, combined.statement)))
            else:
                tracked |= assigned_names(code.source, call) - {"self"}
    if found or depth > 1:
        return found
    returned = returns_any(holder, tracked)
    if not returned or isinstance(holder.node, cst.Module):
        return found
    for caller, call in callers_of(project, files, holder):
        results = assigned_names(caller.source, call) - {"self"}
        if results:
            found.extend(
                _combinations(
                    project,
                    files,
                    (caller, caller.source.line(call)),
                    results,
                    need_gradients=need_gradients,
                    depth=depth + 1,
                )
            )
    return found


def _combination_at(
    project: Project, code: Code, call: cst.Call, need_gradients: bool
) -> Combined | None:
    target = callee(project, code, call)
    if target is None:
        if need_gradients:
            return None
        return _inline(code, call) or _inline_loop(code, call)
    chain = reachable(project, [target], depth=1)
    if need_gradients and not any(
        is_gradient_call(c.source, inner) for c in chain for inner in calls_in(c)
    ):
        return None
    for holder in chain:
        sites = _sites_in(holder)
        if sites:
            name = holder.source.qualname(holder.node)
            spelling = f"{name}(): {_spelling(_hows(sites), holder.node)}"
            combination = ir.Combination(_kind(sites), spelling, holder.source.where(holder.node))
            return Combined(
                combination,
                code.source,
                call,
                frozenset(assigned_names(code.source, call)),
                loss=_losses(code, call) if need_gradients else None,
            )
    found = _by_name(code, call, target)
    if found is not None and need_gradients:
        return replace(found, loss=_losses(code, call))
    return found


def _losses(code: Code, call: cst.Call) -> ir.Loss:
    """The towers' losses handed to a helper that differentiates them one by one."""
    for arg in call.args:
        if arg.keyword is None and not isinstance(arg.value, cst.Name | cst.Attribute):
            continue
        if "loss" in code.source.src(arg.value).lower():
            return ir.Loss(code.source.where(call), code.source.src(arg.value, 70))
    return ir.Loss(code.source.where(call), code.source.src(call, 70))


def _inline(code: Code, call: cst.Call) -> Combined | None:
    """An aggregation written in the function itself (``zip(*tower_grads)`` loop)."""
    sites = [
        s
        for s in _sites_in(code)
        if code.source.line(s.anchor) >= code.source.line(call) and s.anchor is not code.node
    ]
    if not sites:
        return None
    first = sites[0].anchor
    results: set[str] = set()
    for s in sites:
        results |= _appended_or_assigned(code.source, s.anchor)
    combination = ir.Combination(
        _kind(sites), f"inline: {_spelling(_hows(sites), code.node)}", code.source.where(first)
    )
    return Combined(combination, code.source, first, frozenset(results))


def _inline_loop(code: Code, call: cst.Call) -> Combined | None:
    """``for pairs in zip(*tower_grads):`` adding the towers' gradients up in the loop body
    (``total = total + g``, ``add_n``), divided by the tower count or not: a spelling TFM102
    does not read."""
    source = code.source
    loop = source.parent(call)
    if not _is_zip_star(call):
        return None
    if isinstance(loop, cst.For) and loop.iter is call:
        body: cst.CSTNode = loop.body
    elif isinstance(loop, cst.CompFor) and loop.iter is call:
        # `[(tf.add_n([g for g, _ in gv]) / n, gv[0][1]) for gv in zip(*tower_grads)]`
        comprehension = source.parent(loop)
        if not isinstance(comprehension, cst.ListComp | cst.GeneratorExp):
            return None
        loop, body = comprehension, comprehension.elt
    else:
        return None
    nodes = list(tree.walk(body))
    names = {call_name(source, n) for n in nodes if isinstance(n, cst.Call)}
    python_sum = (
        any(
            (isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Add))
            or (isinstance(n, cst.AugAssign) and isinstance(n.operator, cst.AddAssign))
            for n in nodes
        )
        or "tensorflow.add" in names
    )
    add_n = bool(names & {"tensorflow.add_n", "tensorflow.accumulate_n"})
    if not (python_sum or add_n):
        return None
    divides = any(
        isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Divide) for n in nodes
    ) or bool(names & {"tensorflow.div", "tensorflow.divide", "tensorflow.truediv"})
    kind = ir.CombineKind.AVERAGED if divides else ir.CombineKind.SUMMED
    if add_n and not python_sum:
        how = "add_n / len" if divides else "add_n"
    else:
        how = "python-sum / N" if divides else "python-sum"
    combination = ir.Combination(kind, f"inline: {how}", source.where(loop))
    # Handed straight to apply_gradients, the comprehension has no name of its own.
    passed = isinstance(source.parent(loop), cst.Arg)
    results = frozenset() if passed else frozenset(_appended_or_assigned(source, loop))
    return Combined(combination, source, loop, results)


def _is_zip_star(call: cst.Call) -> bool:
    return (
        isinstance(call.func, cst.Name)
        and call.func.value == "zip"
        and len(call.args) == 1
        and call.args[0].star == "*"
    )


def _appended_or_assigned(source: SourceFile, statement: cst.CSTNode) -> set[str]:
    found: set[str] = set()
    for node in tree.walk(statement):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            if node.func.attr.value == "append":
                found |= identifiers(node.func.value) - {"self"}
    return found | assigned_names(source, statement)


def _by_name(code: Code, call: cst.Call, target: Code) -> Combined | None:
    """A repo helper the reading of TFM102 does not know, named for what it does and reading the
    towers' gradients (``compute_averaged_gradients(tower_grads)``): its name says which."""
    node = target.node
    if not isinstance(node, cst.FunctionDef):
        return None
    name = node.name.value
    if "grad" not in name.lower():
        return None
    if _AVERAGE_NAME.search(name) or _keyword_true(call, "average"):
        kind = ir.CombineKind.AVERAGED
    elif _SUM_NAME.search(name):
        kind = ir.CombineKind.SUMMED
    else:
        return None
    how = _body_spelling(target)
    combination = ir.Combination(
        kind, f"{target.source.qualname(node)}(): {how}", target.source.where(node)
    )
    return Combined(combination, code.source, call, frozenset(assigned_names(code.source, call)))


def _body_spelling(code: Code) -> str:
    """What a helper TFM102 does not recognize does, read from its body."""
    nodes = list(tree.walk(code.node))
    summed = any(
        isinstance(n, cst.AugAssign) and isinstance(n.operator, cst.AddAssign) for n in nodes
    )
    names = {call_name(code.source, n) for n in nodes if isinstance(n, cst.Call)}
    if summed:
        sparse = "IndexedSlices" in identifiers(code.node)
        return "python-sum with IndexedSlices" if sparse else "python-sum"
    if names & {"tensorflow.add_n", "tensorflow.accumulate_n"}:
        return (
            "add_n / len"
            if "tensorflow.multiply" in names
            or any(
                isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Divide)
                for n in nodes
            )
            else "add_n"
        )
    if "tensorflow.reduce_mean" in names:
        return "reduce_mean"
    return "by its name"


def _keyword_true(call: cst.Call, name: str) -> bool:
    return is_true(keyword(call, name))


def _after_loop(site: TowerSite) -> list[Code]:
    """Where a one-loss combination may be: the loop's function and its class's other methods
    (graph built in one method, differentiated in another)."""
    return [site.function, *class_methods(site.function)]


def _colocated(project: Project, site: TowerSite) -> list[Combined]:
    """One loss over the towers differentiated once with colocate_gradients_with_ops=True
    (one per optimizer: a GAN's generator and discriminator)."""
    loop_end = end_line(site.source, site.loop)
    roots = _after_loop(site)
    found: list[Combined] = []
    for code in reachable(project, roots, depth=2):
        same = code.node is site.function.node
        for call in calls_in(code):
            if same and code.source.line(call) <= loop_end:
                continue
            if not is_true(keyword(call, "colocate_gradients_with_ops")):
                continue
            if not (is_gradient_call(code.source, call) or _method(call) == "minimize"):
                continue
            loss = code.source.src(call.args[0].value, 50) if call.args else "the loss"
            combination = ir.Combination(
                ir.CombineKind.COLOCATED_LOSS,
                f"{loss} differentiated once",
                code.source.where(call),
            )
            found.append(
                Combined(
                    combination,
                    code.source,
                    call,
                    frozenset(assigned_names(code.source, call)),
                    loss_call=call,
                )
            )
    return found


def _method(call: cst.Call) -> str | None:
    return call.func.attr.value if isinstance(call.func, cst.Attribute) else None
