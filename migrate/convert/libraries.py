"""Modules of a tower program that hold per-device loops of their own without being one: a
layer library whose every layer loops over the GPUs' tensors, a helper that differentiates each
tower's loss on its device. Read alone they have no tower core; the program that imports them
has, and its conversion (or its refusal) is where they are dealt with."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from tfmigrate.convert.project import Project


def programs_with_cores(path: Path) -> list[str]:
    """The entry programs of the repo whose reading finds a tower core and that run the module
    at ``path`` (it is among the modules they import, directly or not), named relative to the
    module's folder; the module itself excluded."""
    path = path.resolve()
    if not path.is_file():  # source text with no file (a rule's example): nothing imports it
        return []
    root = Project.for_path(path).root
    # with no project marker above it, a package's module is imported from the package's folder
    package = path.parent
    while (package / "__init__.py").exists() and package.parent != package:
        package = package.parent
    if package in root.parents:
        root = package
    signature = tuple(
        (str(f), f.stat().st_mtime_ns) for f in sorted(Project(root).python_files()) if f.exists()
    )
    return [
        Path(os.path.relpath(program, path.parent)).as_posix()
        for program, closure in _reading(root, signature)
        if program != path and path in closure
    ]


@lru_cache(maxsize=8)
def _reading(
    root: Path, _files: tuple[tuple[str, int], ...]
) -> tuple[tuple[Path, frozenset[Path]], ...]:
    """Each entry program of the project at ``root`` whose reading finds a tower core, with
    the files it runs (read once per process while the files are unchanged)."""
    from tfmigrate.convert.recognize import reaches_core, read_program

    project = Project(root)
    found = []
    for candidate in project.candidate_entries(root):
        source = project.load(candidate)
        if source is None or not reaches_core(project, source):
            continue
        reading = read_program(project, source)
        if reading.program is None or not reading.program.cores:
            continue
        found.append((source.path, frozenset(s.path for s in project.closure(source))))
    return tuple(found)
