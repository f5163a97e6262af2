"""Horovod's per-process step as a tower core: ``hvd.DistributedOptimizer`` around an
optimizer (its ``minimize`` or ``compute_gradients``/``apply_gradients``), or gradients passed
through Horovod's allreduce (public or private API) into an update function."""

from __future__ import annotations

import re

import libcst as cst

from tfmigrate import tree
from tfmigrate.convert import ir
from tfmigrate.convert.project import Project, SourceFile
from tfmigrate.convert.recognize._code import (
    Code,
    assigned_names,
    callee,
    calls_in,
    enclosing_code,
    is_gradient_call,
    keyword,
    mentions,
    reachable,
)
from tfmigrate.convert.recognize.update import find_update
from tfmigrate.rules._towers import method_name


def _horovod(source: SourceFile, call: cst.Call) -> str | None:
    """The Horovod function a call names (``DistributedOptimizer``, ``allreduce``,
    ``_allreduce``), else None."""
    name = source.qualify(call.func)
    if name is None or not name.startswith("horovod."):
        return None
    return name.rsplit(".", 1)[1]


def horovod_cores(
    project: Project, files: list[SourceFile]
) -> tuple[list[ir.TowerCore], list[ir.Note]]:
    cores: list[ir.TowerCore] = []
    notes: list[ir.Note] = []
    allreduce_wrappers: set[int] = set()
    seen: set[int] = set()  # a closure's calls are also its enclosing function's
    for source in files:
        if not any(b.startswith("horovod") for b in source.resolver.bindings.values()):
            continue
        for node in _functions(source):
            code = Code(source, node)
            for call in calls_in(code):
                if id(call) in seen:
                    continue
                seen.add(id(call))
                what = _horovod(source, call)
                if what == "DistributedOptimizer":
                    found = _distributed_optimizer(project, files, code, call)
                    if isinstance(found, str):
                        notes.append(ir.Note(source.where(call), found))
                    else:
                        cores.append(found)
                elif what in ("allreduce", "_allreduce", "grouped_allreduce"):
                    allreduce_wrappers.add(id(node))
    if cores or not allreduce_wrappers:
        return cores, notes
    # Private or public allreduce inside a helper (`allreduce_mean`): the update functions
    # calling it on gradients and assigning to variables, one core for those the program
    # names elsewhere (a dict of optimizers chosen by a flag).
    candidates: list[tuple[Code, cst.Call, cst.Call]] = []
    for source in files:
        for node in _functions(source):
            code = Code(source, node)
            if id(node) in allreduce_wrappers or not isinstance(node, cst.FunctionDef):
                continue
            reduced = [
                c
                for c in calls_in(code)
                if (t := callee(project, code, c)) is not None
                and any(id(r.node) in allreduce_wrappers for r in reachable(project, [t], 1))
            ]
            gradients = [c for c in calls_in(code) if is_gradient_call(source, c)]
            if reduced and gradients and _assigns_variables(code):
                candidates.append((code, reduced[0], gradients[0]))
    named = [c for c in candidates if _named_elsewhere(c[0], files)] or candidates
    if named:
        code, first_reduce, gradient = named[0]
        source = code.source
        combination = ir.Combination(
            ir.CombineKind.HOROVOD,
            f"allreduce via {source.src(first_reduce.func, 40)}",
            source.where(first_reduce),
        )
        functions = " | ".join(dict.fromkeys(f"{c.source.qualname(c.node)}()" for c, _, _ in named))
        update = ir.Update(
            ir.UpdateKind.HAND_WRITTEN, source.where(code.node), functions, source.where(code.node)
        )
        loss = (
            ir.Loss(source.where(gradient), source.src(gradient.args[0].value, 60))
            if gradient.args
            else None
        )
        cores.append(ir.TowerCore(None, loss, combination, update))
    return cores, notes


def _named_elsewhere(code: Code, files: list[SourceFile]) -> bool:
    """The function's name is spelled in another module of the program (``optim.adam``)."""
    assert isinstance(code.node, cst.FunctionDef)
    name = code.node.name.value.encode()
    return any(f is not code.source and re.search(rb"\b%s\b" % name, f.raw) for f in files)


def _functions(source: SourceFile) -> list[cst.CSTNode]:
    """The module and every function and method of ``source``."""
    return [source.module] + [n for n in tree.walk(source.module) if isinstance(n, cst.FunctionDef)]


def _assigns_variables(code: Code) -> bool:
    return any(
        method_name(c) in ("assign", "assign_sub", "assign_add")
        or ((code.source.qualify(c.func) or "").endswith((".assign", ".assign_sub", ".assign_add")))
        for c in calls_in(code)
    )


def _distributed_optimizer(
    project: Project, files: list[SourceFile], code: Code, call: cst.Call
) -> ir.TowerCore | str:
    source = code.source
    op = keyword(call, "op")
    spelling = "DistributedOptimizer" + (f"(op={source.src(op, 50)})" if op is not None else "")
    combination = ir.Combination(ir.CombineKind.HOROVOD, spelling, source.where(call))
    names = frozenset(assigned_names(source, call))
    loss = None
    for candidate in [code, *reachable(project, [code], depth=1)[1:]]:
        for inner in calls_in(candidate):
            if (
                method_name(inner) in ("minimize", "compute_gradients")
                and isinstance(inner.func, cst.Attribute)
                and mentions(inner.func.value, set(names))
            ):
                if inner.args:
                    loss = ir.Loss(
                        candidate.source.where(inner), candidate.source.src(inner.args[0].value, 60)
                    )
                if method_name(inner) == "minimize":
                    update = find_update(
                        project, files, candidate, inner, frozenset(), own_call=inner
                    )
                else:
                    update = find_update(
                        project,
                        files,
                        candidate,
                        inner,
                        frozenset(assigned_names(candidate.source, inner)),
                    )
                if isinstance(update, str):
                    return f"{spelling}: {update}"
                return ir.TowerCore(None, loss, combination, update)
    where = enclosing_code(source, call).name
    return f"{spelling} is built but its minimize/compute_gradients was not found in {where}"
