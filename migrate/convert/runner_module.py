"""The module of a function that makes a tower class's object and runs its update (a class
trainer run from another module, ``class_runner``), converted from its own side: the towers'
module of the project is planned (as TFM303 converts it there), and this module gets what the
plan made of the function -- its session gone, the step run a call of the object's train step.

A module is converted only when the towers' module converts; the two are one fix."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import libcst as cst

from tfmigrate.convert.todo import Todo

# `import model` / `from model import X` / `from pkg.model import X` at the start of a line
_IMPORTED = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\b|import\s+([\w.]+))", re.M)


@dataclass(frozen=True)
class RunnerConversion:
    """This module as the tower class's conversion makes it."""

    module: cst.Module
    todos: list[Todo]
    function: str  # the function that runs the object
    towers: str  # the towers' module, relative to this module's folder
    owner: str  # the class building the towers
    unsafe: bool  # the conversion (of either module) is an unsafe fix
    notes: list[str]


def may_run_a_tower_class(path: Path) -> bool:
    """From the texts alone: the module at ``path`` runs something (``.run(``) and imports a
    module of its folder (or a parent's) that spells ``device`` and defines a class."""
    text = _text(path)
    if text is None or ".run(" not in text:
        return False
    for match in _IMPORTED.finditer(text):
        name = match.group(1) or match.group(2)
        for folder in (path.parent, *list(path.parent.parents)[:2]):
            candidate = folder.joinpath(*name.lstrip(".").split(".")).with_suffix(".py")
            held = _text(candidate)
            if held is not None and "device" in held and "class " in held:
                return True
    return False


def runner_conversion(path: Path, code: str) -> RunnerConversion | None:
    """This module (the file at ``path``, whose text is ``code``) as a tower class's
    conversion makes it, when a function of it runs such an object; None otherwise, and for
    text that is no longer the file's (a later fix pass sees the converted module)."""
    path = path.resolve()
    if not path.is_file() or _text(path) != code:
        return None
    from tfmigrate.convert.helper_tape import _signature
    from tfmigrate.convert.project import Project

    root = Project.for_path(path).root
    return _conversions(root, _signature(path)).get(path)


@lru_cache(maxsize=8)
def _conversions(root: Path, _files: tuple[tuple[str, int], ...]) -> dict[Path, RunnerConversion]:
    """Every module of the project at ``root`` whose function runs a tower class's object, as
    the class's conversion makes it (read once per process while the files are unchanged)."""
    from tfmigrate.convert import _device_settings_first
    from tfmigrate.convert.emit import emit_file_program
    from tfmigrate.convert.project import Project
    from tfmigrate.convert.recognize import reading

    project = Project(root)
    found: dict[Path, RunnerConversion] = {}
    for candidate in project.python_files():
        raw = candidate.read_bytes()
        if b"device" not in raw or b"class " not in raw:
            continue
        loaded = project.load(candidate)
        if loaded is None or not any(
            loaded.enclosing_class(t.replicator) is not None for t in reading(loaded).towers
        ):
            continue
        source = project.adopt(candidate, _device_settings_first(loaded.context))
        converted = emit_file_program(project, source)
        if converted is None:
            continue
        plan, emitted = converted
        guest = plan.runner_source
        if guest is None or emitted.runner_module is None or plan.runner is None:
            continue
        todos = emitted.todos + emitted.runner_todos
        owner = source.enclosing_class(plan.scope)
        found[guest.path.resolve()] = RunnerConversion(
            emitted.runner_module,
            emitted.runner_todos,
            plan.runner.name.value,
            Path(os.path.relpath(source.path, guest.path.parent)).as_posix(),
            owner.name.value if owner is not None else "",
            any(t.unsafe for t in todos),
            emitted.notes,
        )
    return found


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
