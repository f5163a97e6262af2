"""The whole-program converter's reading stage: a project's entry programs, read with the
repo modules they import into a typed IR (``tfmigrate.convert.ir``) of their tower cores,
input, session and device settings -- or a refusal naming the line where no core could be
identified."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

import libcst as cst

from tfmigrate.convert import ir
from tfmigrate.convert.emit import Emitted, emit
from tfmigrate.convert.inline import builders_inlined
from tfmigrate.convert.plan import NotPlanned, plan_core
from tfmigrate.convert.project import Project, SourceFile
from tfmigrate.convert.recognize import (
    ProgramReading,
    may_hold_core,
    reaches_core,
    read_program,
    reading,
)
from tfmigrate.rule import RuleContext
from tfmigrate.rules._device_config import DeviceConfig

__all__ = ["ProgramReading", "Project", "convert_module", "ir", "read_project"]

_TOWER_TEXT = (b"tf.device(", b"horovod", b".device(", b"multi_gpu_model")


def read_project(path: Path) -> list[ProgramReading]:
    """Every entry program under ``path`` (a file or a repo folder) that reaches a tower core,
    read into the IR (or refused with file, line and reason)."""
    path = Path(path)
    project = Project.for_path(path)
    readings: list[ProgramReading] = []
    covered: set[Path] = set()
    for candidate in project.candidate_entries(path):
        source = project.load(candidate)
        if source is None:
            reading_of_broken = _unparsable(project, candidate)
            if reading_of_broken is not None:
                readings.append(reading_of_broken)
            continue
        if not reaches_core(project, source):
            continue
        readings.append(read_program(project, source))
        covered |= {s.path for s in project.closure(source)}
    if path.is_dir():
        readings.extend(_library_programs(project, covered))
    return readings


def _unparsable(project: Project, path: Path) -> ProgramReading | None:
    """An entry libcst cannot parse (Python 2, syntax errors) that builds towers: refused."""
    raw = path.read_bytes()
    if not any(marker in raw for marker in _TOWER_TEXT):
        return None
    line, message = project.errors.get(path.resolve(), (1, "cannot parse"))
    refusal = ir.Refusal(project.rel(path), line, f"cannot parse: {message}")
    return ProgramReading(path.resolve(), None, refusal)


def _library_programs(project: Project, covered: set[Path]) -> list[ProgramReading]:
    """Tower cores no entry reaches (driven from notebooks or an outer launcher): read from the
    modules that reach them and that no other repo module imports. Importers are looked for
    among the files that spell the imported module's name."""
    files = project.python_files()
    raw = {f.resolve(): f.read_bytes() for f in files}
    holders = []
    for path, text in raw.items():
        if path in covered or not any(marker in text for marker in _TOWER_TEXT):
            continue
        source = project.load(path)
        if source is not None and may_hold_core(source) and reading(source).towers:
            holders.append(path)
    roots: list[Path] = []
    seen: set[Path] = set()
    pending = list(holders)
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        name = _module_name(path).encode()
        importers = []
        for other, text in raw.items():
            if other == path or name not in text:
                continue
            source = project.load(other)
            if source is not None and any(t.file == path for t in source.imports.values()):
                importers.append(other)
            elif source is not None and path in source.star_imports:
                importers.append(other)
        if importers:
            pending.extend(importers)
        elif path not in covered:
            roots.append(path)
    readings = []
    for path in sorted(roots):
        source = project.load(path)
        if source is not None and reaches_core(project, source):
            readings.append(read_program(project, source))
    return readings


def _module_name(path: Path) -> str:
    return path.parent.name if path.name == "__init__.py" else path.stem


def convert_module(context: RuleContext) -> tuple[Emitted, ir.Program] | str:
    """The staged conversion of the tower program in the file ``context`` holds: read (with the
    repo modules it imports, from disk), plan, emit. A string says why it was not converted."""
    unsupported = _unsupported_options(context.options)
    if unsupported:
        return unsupported
    converted = _converted(read_staged(context))
    if not isinstance(converted, str):
        return converted
    # A function building the towers returns them to the one function that combines, applies
    # and runs them: read with its body in place of its call.
    inlined = _builder_inlined(context)
    if inlined is None:
        return converted
    again = _converted(read_staged(inlined[0]))
    if isinstance(again, str):
        return f"{converted}; with `{inlined[1]}` read inside `{inlined[2]}`: {again}"
    return again


def _converted(
    read: tuple[SourceFile, ir.Program] | str,
) -> tuple[Emitted, ir.Program] | str:
    if isinstance(read, str):
        return read
    source, program = read
    cores = [c for c in program.cores if c.towers is not None and c.towers.where.file == source.rel]
    emitted = first_converted(
        cores, lambda core: emit(plan_core(source, program, core)), "no tower core in this file"
    )
    return emitted if isinstance(emitted, str) else (emitted, program)


def _builder_inlined(context: RuleContext) -> tuple[RuleContext, str, str] | None:
    """The file with a tower-building function inlined into its one caller (``inline``), as a
    context of its own, with the two functions' names."""
    path = Path(str(context.path))
    project = Project.for_path(path)
    source = project.adopt(path, context)
    found = builders_inlined(source, [t.replicator for t in reading(source).towers])
    if found is None:
        return None
    inlined = RuleContext(context.path, context.resolver, found.module, context.options)
    return inlined, found.builder, found.caller


def first_converted(
    cores: list[ir.TowerCore], convert: Callable[[ir.TowerCore], Emitted], none: str
) -> Emitted | str:
    """The first of ``cores`` that plans and emits; else why each did not, or ``none`` when
    there is none."""
    reasons = []
    for core in cores:
        try:
            return convert(core)
        except NotPlanned as refused:
            reasons.append(str(refused))
    return "; ".join(reasons) or none


def read_staged(context: RuleContext) -> tuple[SourceFile, ir.Program] | str:
    """The file ``context`` holds, with its sessions' device settings moved first, read with
    the repo modules it imports (from disk) into the IR; a string says why it was not."""
    path = Path(str(context.path))
    project = Project.for_path(path)
    source = project.adopt(path, _device_settings_first(context))
    reading_ = read_program(project, source)
    if reading_.program is None:
        return str(reading_.refusal)
    return source, reading_.program


def _device_settings_first(context: RuleContext) -> RuleContext:
    """The file with its sessions' device settings already moved to tf.config (TFM105's
    rewrite): the conversion then drops sessions that carry no settings."""
    module = context.module
    tf = context.resolver.local_name_for("tensorflow") or "tf"
    for _ in range(8):
        current = RuleContext(context.path, context.resolver, module, context.options)

        def line(node: cst.CSTNode, current: RuleContext = current) -> int:
            return current.position_of(node).start.line

        config = DeviceConfig(module, current.resolver, current.parent_of, line, tf)
        fixable = [g for g in config.groups if g.consumers and config.why_not(g) is None]
        if not fixable:
            return current
        block, replacement = config.rewrite(fixable[0])
        replaced = module.deep_replace(block, cast(cst.Module, replacement))
        assert isinstance(replaced, cst.Module)
        module = replaced
    return RuleContext(context.path, context.resolver, module, context.options)


def _unsupported_options(options: dict[str, object]) -> str | None:
    """Conversion options the staged converter does not implement yet: refused, never
    silently ignored."""
    if options.get("batch-norm") == "sync":
        return "--batch-norm sync needs the model as Keras layers"
    if options.get("jit") in ("on", True):
        return "--jit is not supported for TF1 model code kept on tf.compat.v1"
    if options.get("strategy") == "multi-worker":
        return "--strategy multi-worker is not supported here yet"
    return None
