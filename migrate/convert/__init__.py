"""The whole-program converter's reading stage: a project's entry programs, read with the
repo modules they import into a typed IR (``tfmigrate.convert.ir``) of their tower cores,
input, session and device settings -- or a refusal naming the line where no core could be
identified."""

from __future__ import annotations

from pathlib import Path

from tfmigrate.convert import ir
from tfmigrate.convert.project import Project
from tfmigrate.convert.recognize import (
    ProgramReading,
    may_hold_core,
    reaches_core,
    read_program,
    reading,
)

__all__ = ["ProgramReading", "Project", "ir", "read_project"]

_TOWER_TEXT = (b"tf.device(", b"horovod", b".device(")


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
    modules that reach them and that no other repo module imports."""
    holders = []
    for file in project.python_files():
        if file.resolve() in covered:
            continue
        if not any(marker in file.read_bytes() for marker in _TOWER_TEXT):
            continue
        source = project.load(file)
        if source is not None and may_hold_core(source) and reading(source).towers:
            holders.append(source.path)
    if not holders:
        return []
    sources = [s for s in (project.load(f) for f in project.python_files()) if s is not None]
    imported = {t.file for s in sources for t in s.imports.values()}
    imported |= {f for s in sources for f in s.star_imports}
    readings = []
    reached: set[Path] = set()
    for source in sources:
        if source.path in imported or source.path in covered:
            continue
        closure = {s.path for s in project.closure(source)}
        if closure & set(holders) - reached:
            readings.append(read_program(project, source))
            reached |= closure
    return readings
