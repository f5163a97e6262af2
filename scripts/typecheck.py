"""Type-check the package's sources under their import names; `make lint` runs this.

pyproject maps `tfmigrate` to migrate/ and `tfmigrate.rules` to rules/ (setuptools package-dir).
An editable install serves that mapping through an import hook, which mypy cannot follow, and
mypy given the directories names their modules `migrate.*` and `rules.*`, so every
`from tfmigrate... import` would resolve to nothing. This script hands each source file to mypy
under the module name it is imported by, so those imports are checked against our own code.

Options come from [tool.mypy] in pyproject.toml; extra arguments are passed to mypy
(e.g. `--no-incremental`). Exit status is mypy's: 0 clean, 1 errors, 2 blocking errors.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.fscache import FileSystemCache
from mypy.main import process_options
from mypy.modulefinder import BuildSource

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def package_dirs(pyproject: Path) -> dict[str, Path]:
    """The import name -> source directory mapping setuptools installs from."""
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    mapping = config["tool"]["setuptools"]["package-dir"]
    return {name: ROOT / directory for name, directory in mapping.items()}


def module_sources(mapping: dict[str, Path]) -> list[BuildSource]:
    """Every module of every mapped package, named as it is imported.

    Sub-directories count as packages when they have an __init__.py (data/ does not); a
    directory that is itself mapped (rules/ as tfmigrate.rules) is taken from its own entry.
    """
    mapped = {directory.resolve() for directory in mapping.values()}
    sources: list[BuildSource] = []

    def walk(directory: Path, module: str) -> None:
        for path in sorted(directory.iterdir()):
            if path.is_dir():
                if (path / "__init__.py").is_file() and path.resolve() not in mapped:
                    walk(path, f"{module}.{path.name}")
            elif path.suffix == ".py":
                name = module if path.stem == "__init__" else f"{module}.{path.stem}"
                sources.append(BuildSource(str(path.relative_to(ROOT)), name))

    for name, directory in sorted(mapping.items()):
        walk(directory, name)
    return sources


def typecheck(
    sources: list[BuildSource], argv: Sequence[str] = (), echo: bool = False
) -> tuple[list[str], bool]:
    """mypy's messages on ``sources`` with the project's options (and ``argv``), and whether
    an error blocked the check (a syntax error); ``echo`` prints them as they come."""
    fscache = FileSystemCache()
    _, options = process_options(
        ["--config-file", str(ROOT / "pyproject.toml"), *argv],
        require_targets=False,
        fscache=fscache,
    )
    messages: list[str] = []

    def flush_errors(filename: str | None, new_messages: list[str], serious: bool) -> None:
        messages.extend(new_messages)
        for message in new_messages if echo else ():
            print(message, file=sys.stderr if serious else sys.stdout)

    try:
        build.build(sources, options, flush_errors=flush_errors, fscache=fscache)
    except CompileError as error:
        if not messages:  # a blocking error that was not flushed
            messages.extend(error.messages)
            for message in error.messages if echo else ():
                print(message, file=sys.stderr)
        return messages, True
    return messages, False


def main(argv: list[str]) -> int:
    sources = module_sources(package_dirs(ROOT / "pyproject.toml"))
    messages, blocking = typecheck(sources, argv, echo=True)
    errors = [m for m in messages if ": error:" in m]
    files = {m.split(":", 1)[0] for m in errors}
    if errors:
        print(f"Found {len(errors)} errors in {len(files)} files (checked {len(sources)} modules)")
        return 2 if blocking else 1
    print(f"Success: no issues found in {len(sources)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
