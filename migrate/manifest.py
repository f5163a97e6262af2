"""``tfmigrate.json``: what a migration did, at the output root, merged across runs.

Keys are POSIX paths relative to the root. A run only replaces the entries of files it changed,
so a later run with nothing to do leaves the manifest as it was (byte for byte).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tfmigrate import __version__
from tfmigrate.processing import FileResult
from tfmigrate.writer import atomic_write

MANIFEST_NAME = "tfmigrate.json"
FORMAT_VERSION = 1


class ManifestError(Exception):
    pass


def load(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"format": FORMAT_VERSION, "files": {}}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: not a tfmigrate manifest ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise ManifestError(f"{path}: not a tfmigrate manifest (no 'files' table)")
    return data


def entry_for(result: FileResult) -> dict[str, Any]:
    applied = [f for f in result.findings if f.applied]
    pending = [f for f in result.findings if not f.applied]
    entry: dict[str, Any] = {
        "applied": [
            {
                "code": f.code,
                "line": f.line,
                "message": f.message,
                **({"cell": f.cell} if f.cell else {}),
                **({"rewritten": True} if f.rewritten else {}),
            }
            for f in applied
        ],
        "manual": [
            {
                "code": f.code,
                "line": f.line,
                "message": f.message,
                **({"cell": f.cell} if f.cell else {}),
                **({"rewritten": True} if f.rewritten else {}),
            }
            for f in pending
        ],
    }
    # What the applied fixes contributed (e.g. `variables`, `fetches`, `announced`, `notes` for
    # verify); never overrides the two lists above.
    for key, value in result.manifest.items():
        entry.setdefault(key, value)
    return entry


def update(
    root: Path, changed: dict[str, FileResult], extra: dict[str, dict[str, Any]] | None = None
) -> Path | None:
    """Merge entries for ``changed`` (keys relative to ``root``) into the root's manifest."""
    if not changed and not extra:
        return None
    path = root / MANIFEST_NAME
    data = load(path)
    data["format"] = FORMAT_VERSION
    data["generator"] = f"tfmigrate {__version__}"
    files: dict[str, Any] = data["files"]
    for key, result in changed.items():
        files[key] = {**files.get(key, {}), **entry_for(result)}
    for key, value in (extra or {}).items():
        files[key] = {**files.get(key, {}), **value}
    data["files"] = dict(sorted(files.items()))
    text = json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False) + "\n"
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return path
    atomic_write(path, text.encode("utf-8"))
    return path
