"""Keras 2's ``multi_gpu_model`` (Keras' own or a repo's vendored copy) as a tower core: Keras
replicates the template model per GPU and merges the replicas' outputs, so one loss over the
global batch is differentiated; the update is the optimizer given to ``compile`` and ``fit``
runs the steps."""

from __future__ import annotations

import libcst as cst

from tfmigrate import tree
from tfmigrate.convert import ir
from tfmigrate.convert.project import Project, SourceFile
from tfmigrate.convert.recognize._code import Code, assigned_names, calls_in, keyword, mentions
from tfmigrate.convert.recognize.update import optimizer_construction
from tfmigrate.names import dotted
from tfmigrate.rules._towers import get_arg, method_name

_FITS = ("fit", "fit_generator", "train_on_batch")


def keras_cores(
    project: Project, files: list[SourceFile]
) -> tuple[list[ir.TowerCore], list[ir.Note], list[ir.Session], list[ir.Input]]:
    """The ``multi_gpu_model`` cores of ``files``, what could not be told about them, and the
    ``fit`` that runs them."""
    cores: list[ir.TowerCore] = []
    notes: list[ir.Note] = []
    sessions: list[ir.Session] = []
    inputs: list[ir.Input] = []
    for source in files:
        if b"multi_gpu_model" not in source.raw:
            continue
        functions = [
            source.module,
            *(n for n in tree.walk(source.module) if isinstance(n, cst.FunctionDef)),
        ]
        for node in functions:
            code = Code(source, node)
            for call in calls_in(code):
                if not (dotted(call.func) or "").endswith("multi_gpu_model"):
                    continue
                found = _core(project, code, call)
                if isinstance(found, str):
                    notes.append(ir.Note(source.where(call), found))
                    continue
                core, fit = found
                cores.append(core)
                if fit is not None:
                    sessions.append(
                        ir.Session(
                            ir.SessionKind.KERAS,
                            source.where(fit),
                            (ir.Fetch(source.where(fit), source.src(fit, 80)),),
                        )
                    )
                    inputs.append(
                        ir.Input(
                            ir.InputKind.KERAS_FIT,
                            source.where(fit),
                            source.src(fit.args[0].value, 60) if fit.args else source.src(fit, 60),
                        )
                    )
    return cores, notes, sessions, inputs


def _core(
    project: Project, code: Code, call: cst.Call
) -> tuple[ir.TowerCore, cst.Call | None] | str:
    source = code.source
    template = get_arg(call, 0, "model")
    gpus = get_arg(call, 1, "gpus")
    towers = ir.Towers(
        source.where(call),
        source.qualname(code.node),
        source.src(template, 40) if template is not None else None,
        f"gpus={source.src(gpus, 40)}" if gpus is not None else "all GPUs",
        source.src(gpus, 40) if gpus is not None else "",
    )
    parallel = assigned_names(source, call) - {"self"}
    if not parallel:
        return "multi_gpu_model's result is not bound to a name"
    compiled = None
    fit = None
    for inner in calls_in(code):
        if not isinstance(inner.func, cst.Attribute) or not mentions(inner.func.value, parallel):
            continue
        if method_name(inner) == "compile" and compiled is None:
            compiled = inner
        elif method_name(inner) in _FITS and fit is None:
            fit = inner
    if compiled is None:
        return f"the replicated model ({', '.join(sorted(parallel))}) is never compiled here"
    combination = ir.Combination(
        ir.CombineKind.MERGED_OUTPUTS, "multi_gpu_model", source.where(call)
    )
    loss_arg = keyword(compiled, "loss")
    loss = (
        ir.Loss(source.where(compiled), source.src(loss_arg, 60)) if loss_arg is not None else None
    )
    optimizer = keyword(compiled, "optimizer") or (
        compiled.args[0].value if compiled.args and compiled.args[0].keyword is None else None
    )
    if optimizer is None:
        return "compile is given no optimizer"
    built = (
        optimizer_construction(project, code, optimizer, compiled)
        if isinstance(optimizer, cst.Name)
        else (source, optimizer)
    )
    if built is None:
        update = ir.Update(
            ir.UpdateKind.KERAS_COMPILE, source.where(compiled), source.src(optimizer, 60)
        )
    else:
        update = ir.Update(
            ir.UpdateKind.KERAS_COMPILE,
            source.where(compiled),
            built[0].src(built[1], 80),
            built[0].where(built[1]),
        )
    return ir.TowerCore(towers, loss, combination, update), fit
