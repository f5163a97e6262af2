"""The scan/rewrite flow without any presentation: configure, discover, process."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tfmigrate.config import FileConfig, find_pyproject, load_config
from tfmigrate.discovery import Discovered, Walker
from tfmigrate.engine import Settings
from tfmigrate.processing import FileResult
from tfmigrate.registry import all_rules, select_rules, unknown_selectors
from tfmigrate.runner import run_files


class UsageError(Exception):
    """Bad arguments or configuration: exit status 2."""


@dataclass
class RunOptions:
    paths: list[Path]
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    fix: bool = False
    unsafe_fixes: bool = False
    jobs: int = 1
    config: Path | None = None
    no_config: bool = False
    options: dict[str, object] = field(default_factory=dict)


@dataclass
class RunResult:
    files: list[Discovered]
    results: list[FileResult]
    settings: Settings
    config: FileConfig

    @property
    def sources(self) -> dict[str, Path]:
        """Display path -> path on disk, for every processed source."""
        return {
            r.path: f.path
            for f, r in zip((f for f in self.files if f.is_source), self.results, strict=True)
        }


def display_path(path: Path) -> str:
    """Relative to the working folder when below it, so output is clickable and diffs apply."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return (
            path.as_posix()
            if not path.is_absolute()
            else os.path.normpath(path).replace(os.sep, "/")
        )


def configure(options: RunOptions) -> tuple[Settings, FileConfig]:
    config = FileConfig()
    if not options.no_config:
        pyproject = options.config or find_pyproject(
            options.paths[0] if options.paths else Path.cwd()
        )
        config = load_config(pyproject)
    select = options.select or config.select
    ignore = [*config.ignore, *options.ignore]
    unknown = unknown_selectors([*select, *ignore])
    if unknown:
        raise UsageError(f"unknown rule code(s): {', '.join(unknown)} (see `tfmigrate rules`)")
    rules = select_rules(select or None, ignore or None)
    settings = Settings(
        rules=rules,
        fix=options.fix,
        unsafe_fixes=options.unsafe_fixes or config.unsafe_fixes,
        options={**config.options, **options.options},
    )
    problem = invalid_option(settings.options)
    if problem:
        raise UsageError(problem)
    return settings, config


def invalid_option(options: Mapping[str, object]) -> str | None:
    """The first option whose value no rule declaring it accepts."""
    for rule in all_rules():
        for key, choices in rule.option_choices.items():
            if key in options and options[key] not in choices:
                return (
                    f"option {key} = {options[key]!r} ({rule.code}): expected one of "
                    f"{', '.join(choices)}"
                )
    return None


def discover(
    options: RunOptions, config: FileConfig, include_other_files: bool = False
) -> list[Discovered]:
    walker = Walker(exclude=[*config.exclude, *options.exclude])
    return list(walker.walk(options.paths, include_other_files=include_other_files))


def run(
    options: RunOptions,
    include_other_files: bool = False,
    progress: Callable[[int], Callable[[int], None]] | None = None,
) -> RunResult:
    if not options.paths:
        raise UsageError("no PATH given")
    settings, config = configure(options)
    files = discover(options, config, include_other_files)
    sources = [f for f in files if f.is_source]
    jobs = [(f.path, display_path(f.path)) for f in sources]
    on_done = progress(len(jobs)) if progress else None
    results = run_files(jobs, settings, options.jobs, on_done)
    return RunResult(files, results, settings, config)
