"""Settings from ``[tool.tfmigrate]`` in the target repo's pyproject.toml, merged with the CLI."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

KNOWN_KEYS = {"select", "ignore", "exclude", "extend-exclude", "unsafe-fixes", "options"}


class ConfigError(Exception):
    pass


@dataclass
class FileConfig:
    path: Path | None = None
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    unsafe_fixes: bool = False
    options: dict[str, object] = field(default_factory=dict)


def find_pyproject(start: Path) -> Path | None:
    """The nearest pyproject.toml with a [tool.tfmigrate] table, from ``start`` upwards."""
    start = start.resolve()
    for directory in [start, *start.parents] if start.is_dir() else start.parents:
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            try:
                data = tomllib.loads(candidate.read_text(encoding="utf-8"))
            except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError):
                continue
            if "tfmigrate" in data.get("tool", {}):
                return candidate
    return None


def load_config(path: Path | None) -> FileConfig:
    if path is None:
        return FileConfig()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    table = data.get("tool", {}).get("tfmigrate", {})
    unknown = set(table) - KNOWN_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown [tool.tfmigrate] keys: {', '.join(sorted(unknown))}")

    def strings(key: str) -> list[str]:
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{path}: [tool.tfmigrate] {key} must be a list of strings")
        return value

    options = table.get("options", {})
    if not isinstance(options, dict):
        raise ConfigError(f"{path}: [tool.tfmigrate] options must be a table")
    return FileConfig(
        path=path,
        select=strings("select"),
        ignore=strings("ignore"),
        exclude=strings("exclude") + strings("extend-exclude"),
        unsafe_fixes=bool(table.get("unsafe-fixes", False)),
        options=dict(options),
    )
