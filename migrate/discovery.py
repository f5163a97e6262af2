"""Which files a run looks at: Python sources and notebooks under the given paths.

Skips version-control, virtual-environment, build and cache folders, what `.gitignore` files
ignore, and configured excludes. Symlinks that lead out of the tree are not followed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pathspec

SOURCE_SUFFIXES = (".py", ".ipynb")
DEFAULT_EXCLUDED_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", ".venv", "venv", ".env", "env", ".tox", ".nox", "__pycache__",
        ".mypy_cache", ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints", "build", "dist",
        "node_modules", "site-packages", ".eggs",
    }
)  # fmt: skip


class DiscoveryError(Exception):
    pass


@dataclass(frozen=True)
class Discovered:
    path: Path  # as the user can open it
    root: Path  # the input PATH it was found under (its folder, for a file input)

    @property
    def is_source(self) -> bool:
        return self.path.suffix in SOURCE_SUFFIXES


def _is_virtualenv(directory: Path) -> bool:
    return (directory / "pyvenv.cfg").is_file()


def _gitignore(directory: Path) -> pathspec.PathSpec | None:
    ignore = directory / ".gitignore"
    if not ignore.is_file():
        return None
    try:
        lines = ignore.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    return pathspec.GitIgnoreSpec.from_lines(lines)


class Walker:
    def __init__(self, exclude: list[str] | None = None, respect_gitignore: bool = True) -> None:
        self.exclude = pathspec.GitIgnoreSpec.from_lines(exclude or [])
        self.respect_gitignore = respect_gitignore

    def walk(self, inputs: list[Path], include_other_files: bool = False) -> Iterator[Discovered]:
        """Files under ``inputs``. Named files are always taken; folders are searched."""
        for raw in inputs:
            if not raw.exists() and not raw.is_symlink():
                raise DiscoveryError(f"{raw}: no such file or directory")
            if raw.is_file():
                yield Discovered(raw, raw.parent)
            elif raw.is_dir():
                yield from self._walk_dir(raw, include_other_files)
            else:
                raise DiscoveryError(f"{raw}: not a file or directory")

    def _walk_dir(self, top: Path, include_other_files: bool) -> Iterator[Discovered]:
        real_top = top.resolve()
        # Each folder's .gitignore applies to paths relative to that folder.
        specs: list[tuple[Path, pathspec.PathSpec]] = []
        for directory, dirnames, filenames in os.walk(top, followlinks=False):
            here = Path(directory)
            specs = [(base, spec) for base, spec in specs if base == here or base in here.parents]
            if self.respect_gitignore:
                spec = _gitignore(here)
                if spec is not None:
                    specs.append((here, spec))

            def ignored(path: Path, is_dir: bool, specs=tuple(specs)) -> bool:
                rel = path.relative_to(top).as_posix() + ("/" if is_dir else "")
                if self.exclude.match_file(rel):
                    return True
                for base, spec in specs:
                    sub = path.relative_to(base).as_posix() + ("/" if is_dir else "")
                    if spec.match_file(sub):
                        return True
                return False

            kept_dirs = []
            for name in sorted(dirnames):
                child = here / name
                if name in DEFAULT_EXCLUDED_DIRS or name.endswith(".egg-info"):
                    continue
                if child.is_symlink() or _is_virtualenv(child) or ignored(child, True):
                    continue  # symlinked folders are never walked: they may leave the tree
                kept_dirs.append(name)
            dirnames[:] = kept_dirs

            for name in sorted(filenames):
                child = here / name
                if ignored(child, False):
                    continue
                if child.is_symlink() and not _inside(child, real_top):
                    continue
                if not child.is_file():
                    continue
                if child.suffix in SOURCE_SUFFIXES or include_other_files:
                    yield Discovered(child, top)


def _inside(link: Path, real_top: Path) -> bool:
    try:
        link.resolve().relative_to(real_top)
    except (ValueError, OSError):
        return False
    return True
