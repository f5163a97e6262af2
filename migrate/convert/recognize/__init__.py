"""Recognizers, one per concern, each filling its part of the IR from the parsed project:
towers, their combination, the update, Horovod's per-process step, input, session and loop,
set-up parts, devices."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from tfmigrate import tree
from tfmigrate.convert import ir
from tfmigrate.convert.project import Project, SourceFile
from tfmigrate.convert.recognize._code import (
    Code,
    assigned_names,
    class_hierarchy_methods,
    enclosing_code,
    reachable,
    reading,
)
from tfmigrate.convert.recognize.combine import combine
from tfmigrate.convert.recognize.devices import find_device_config
from tfmigrate.convert.recognize.horovod import horovod_cores
from tfmigrate.convert.recognize.inputs import find_inputs
from tfmigrate.convert.recognize.keras import keras_cores
from tfmigrate.convert.recognize.session import find_session
from tfmigrate.convert.recognize.setup import find_setup
from tfmigrate.convert.recognize.towers import TowerSite, find_tower_sites
from tfmigrate.convert.recognize.update import find_update
from tfmigrate.rules._towers import method_name

_TOWER_BYTES = (b"device", b"horovod", b"multi_gpu_model")


@dataclass(frozen=True)
class ProgramReading:
    """One entry program: its IR, or why no tower core could be identified."""

    entry: Path
    program: ir.Program | None
    refusal: ir.Refusal | None


def may_hold_core(source: SourceFile) -> bool:
    """Cheap: a file that never spells ``device`` or ``horovod`` builds no towers."""
    return any(marker in source.raw for marker in _TOWER_BYTES)


def reaches_core(project: Project, entry: SourceFile) -> bool:
    for source in project.closure(entry):
        if not may_hold_core(source):
            continue
        found = reading(source)
        if found.towers or found.keyed or _uses_horovod(source) or b"multi_gpu_model" in source.raw:
            return True
    return False


def _uses_horovod(source: SourceFile) -> bool:
    return any(bound.startswith("horovod") for bound in source.resolver.bindings.values())


def read_program(project: Project, entry: SourceFile) -> ProgramReading:
    """``entry`` and the repo modules it imports read into the IR: a core per tower loop and
    combination (Horovod's per-process step when no tower loop combines), then the input,
    session, loop, set-up and device settings of the code the program runs."""
    closure = project.closure(entry)
    files = [s for s in closure if may_hold_core(s)]
    sites = find_tower_sites(project, files, closure)
    cores: list[ir.TowerCore] = []
    notes: list[ir.Note] = []
    failures: list[ir.Note] = []
    used: list[TowerSite] = []
    for site in sites:
        combinations = combine(project, site, closure)
        if isinstance(combinations, str):
            failures.append(ir.Note(site.where, combinations))
            continue
        for combined in combinations:
            holder = enclosing_code(combined.source, combined.statement)
            update = find_update(
                project,
                closure,
                holder,
                combined.statement,
                combined.results,
                own_call=combined.loss_call,
            )
            if isinstance(update, str):
                failures.append(ir.Note(combined.combination.where, update))
                continue
            loss = combined.loss or site.loss
            if combined.loss_call is not None and combined.loss_call.args:
                call = combined.loss_call
                loss = ir.Loss(
                    combined.source.where(call), combined.source.src(call.args[0].value, 70)
                )
            cores.append(ir.TowerCore(site.describe(), loss, combined.combination, update))
            if site not in used:
                used.append(site)
    if not cores:
        horovod, horovod_notes = horovod_cores(project, closure)
        cores.extend(horovod)
        failures.extend(horovod_notes)
    keras_sessions: list[ir.Session] = []
    keras_inputs: list[ir.Input] = []
    if not cores:
        keras, keras_notes, keras_sessions, keras_inputs = keras_cores(project, closure)
        cores.extend(keras)
        failures.extend(keras_notes)
    if not cores:
        return ProgramReading(entry.path, None, _refusal(entry, failures))
    # A program's other tower loops that combine nothing (layer-wise helpers called by a core's
    # towers) are noted, not refused.
    notes.extend(_collapsed(failures))
    region = _region(project, entry, used)
    loops = [site.loop for site in used]
    inputs = tuple(keras_inputs) + find_inputs(region, loops)
    updates = [found for core in cores for found in _update_calls(project, core.update)]
    update_names = {name for source, call in updates for name in assigned_names(source, call)}
    seeds = [call for _, call in updates]
    updaters = [u for core in cores for u in _update_function(project, core.update, updates)]
    session = (
        keras_sessions[0]
        if keras_sessions
        else find_session(project, region, update_names, seeds, updaters)
    )
    notes.extend(_unknown_parts(cores[0], entry, inputs, session, update_names))
    program = ir.Program(
        entry=entry.rel,
        cores=tuple(cores),
        inputs=inputs,
        session=session,
        devices=find_device_config(region),
        setup=find_setup(region),
        notes=tuple(notes),
    )
    return ProgramReading(entry.path, program, None)


_NOTHING = "the towers compute no gradients"


def _unknown_parts(
    core: ir.TowerCore,
    entry: SourceFile,
    inputs: tuple[ir.Input, ...],
    session: ir.Session | None,
    update_names: set[str],
) -> list[ir.Note]:
    """Where the input, session or step could not be told, and why."""
    where = core.towers.where if core.towers is not None else core.combination.where
    notes = []
    if not inputs:
        notes.append(
            ir.Note(
                where,
                "input: no placeholder fed per step, queue, py_func split or tf.data iterator "
                "in the code the towers and the entry script run",
            )
        )
    if session is None:
        notes.append(
            ir.Note(
                ir.Where(entry.rel, 1),
                "session: no tf.Session, Supervisor or MonitoredTrainingSession in the code "
                "this entry runs (an outer launcher or notebook may run it)",
            )
        )
    elif not session.steps:
        names = ", ".join(sorted(update_names)) or "the update"
        notes.append(ir.Note(session.where, f"step: no run of the session fetches {names}"))
    return notes


def _collapsed(failures: list[ir.Note]) -> list[ir.Note]:
    """Loops that only run a forward pass per device (layer-wise helpers, eval towers) in a
    program whose core was found: one note for all of them."""
    idle = [n for n in failures if n.text.startswith(_NOTHING)]
    kept = [n for n in failures if not n.text.startswith(_NOTHING)]
    if idle:
        places = ", ".join(str(n.where) for n in idle[:6]) + (", ..." if len(idle) > 6 else "")
        kept.append(
            ir.Note(
                idle[0].where,
                f"{len(idle)} other per-device loop(s) take no gradients of their own "
                f"(forward passes or layer-wise towers): {places}",
            )
        )
    return kept


def _refusal(entry: SourceFile, failures: list[ir.Note]) -> ir.Refusal:
    if failures:
        first = failures[0]
        return ir.Refusal(first.where.file, first.where.line, f"no tower core: {first.text}")
    return ir.Refusal(
        entry.rel,
        1,
        "no tower core: no tower loop (tf.device per GPU building a model) and no Horovod "
        "optimizer or allreduce is reachable from this program",
    )


def _update_function(
    project: Project, update: ir.Update, calls: list[tuple[SourceFile, cst.Call]]
) -> list[Code]:
    """A hand-written update read at its ``def`` (Horovod's allreduce path): the function, whose
    result the step runs."""
    if update.kind is not ir.UpdateKind.HAND_WRITTEN or update.optimizer_where is None:
        return []
    loaded = project.load(project.root / update.optimizer_where.file)
    if loaded is None or any(
        source is loaded and loaded.line(c) == update.where.line for source, c in calls
    ):
        return []
    return [
        Code(loaded, node)
        for node in tree.walk(loaded.module)
        if isinstance(node, cst.FunctionDef) and loaded.line(node) == update.optimizer_where.line
    ]


def _update_calls(project: Project, update: ir.Update) -> list[tuple[SourceFile, cst.Call]]:
    """The calls that run the update (``opt.apply_gradients(...)`` at ``update.where``)."""
    loaded = project.load(project.root / update.where.file)
    if loaded is None:
        return []
    return [
        (loaded, node)
        for node in tree.walk(loaded.module)
        if isinstance(node, cst.Call)
        and loaded.line(node) == update.where.line
        and (
            method_name(node) in ("apply_gradients", "minimize")
            or update.kind is ir.UpdateKind.HAND_WRITTEN
        )
    ]


def _region(project: Project, entry: SourceFile, sites: list[TowerSite]) -> list[Code]:
    """The code the program runs, the towers' first: their functions and classes, then the
    entry script and what it calls."""
    roots: list[Code] = []
    for site in sites:
        roots.extend(site.tower_code)
    for site in sites:
        roots.append(site.function)
        roots.extend(class_hierarchy_methods(project, site.function))
    # The entry's functions run too: `tf.app.run(main)` passes main without calling it.
    roots.append(Code(entry, entry.module))
    roots.extend(
        Code(entry, node)
        for node in tree.walk(entry.module, (cst.ClassDef,))
        if isinstance(node, cst.FunctionDef)
    )
    return reachable(project, roots, depth=3)
