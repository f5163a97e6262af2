"""What verify reads from a migration manifest (``tfmigrate.json``) or an explicit mapping file.

Per migrated script (key: POSIX path relative to the manifest's folder) verify uses::

    "variables": {"<legacy variable name>": "<migrated variable name>", ...}
    "fetches":   {"<legacy tensor name>": "<train_step key>" | "<key>[<replica>]", ...}   (optional)
    "announced": [{"match": ["*/moving_mean", ...], "code": "TFM3xx", "reason": "..."}] (optional)

Unknown keys are ignored (the manifest carries more for other tools). A mapping file given with
``--mapping`` holds either the same object for one script or just ``{legacy: migrated}``.

``"variables": {"*": "*"}`` maps by name: every legacy variable to the migrated variable of the
same name (Keras 2 and Keras 3 both name a functional model's weights ``layer/weight``, which a
rewriter cannot list without running the model code). The migrated side resolves it once both
sides' variables exist and writes the resolved mapping for the comparison.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_NAME = "tfmigrate.json"
SAME_NAMES = {"*": "*"}
RESOLVED_MAPPING = "mapping.json"  # in the migrated side's out folder: what by-name matching found


class ManifestError(Exception):
    pass


@dataclass
class Announced:
    """A semantic difference the migration declared: compared, reported with its size, not failed."""

    match: list[str]
    code: str = ""
    reason: str = ""

    def covers(self, *names: str) -> bool:
        return any(fnmatch.fnmatchcase(n, pattern) for n in names if n for pattern in self.match)


@dataclass
class ScriptManifest:
    variables: dict[str, str] = field(default_factory=dict)
    fetches: dict[str, str] = field(default_factory=dict)
    announced: list[Announced] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    source: str = ""  # where it came from, for the report

    def announcement_for(self, *names: str) -> Announced | None:
        return next((a for a in self.announced if a.covers(*names)), None)


def find_manifest(migrated_script: Path) -> Path | None:
    """DESIGN.md: the migrated script's folder, then its parents."""
    for folder in [migrated_script.resolve().parent, *migrated_script.resolve().parents]:
        candidate = folder / MANIFEST_NAME
        if candidate.is_file():
            return candidate
    return None


def _parse_entry(entry: dict[str, Any], source: str) -> ScriptManifest:
    if not isinstance(entry, dict):
        raise ManifestError(f"{source}: expected an object")
    variables = entry.get("variables", {})
    if not isinstance(variables, dict) or not all(isinstance(v, str) for v in variables.values()):
        raise ManifestError(f"{source}: 'variables' must map legacy names to migrated names")
    announced = []
    for item in entry.get("announced", []):
        match = item.get("match", [])
        announced.append(Announced(match=[match] if isinstance(match, str) else list(match),
                                   code=item.get("code", ""), reason=item.get("reason", "")))
    return ScriptManifest(
        variables=dict(variables),
        fetches={str(k): str(v) for k, v in entry.get("fetches", {}).items()},
        announced=announced,
        notes=[str(n) for n in entry.get("notes", [])],
        source=source,
    )


def load_manifest(path: Path, migrated_script: Path) -> ScriptManifest:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ManifestError(f"cannot read manifest {path}: {exc}") from exc
    scripts = data.get("scripts") or data.get("files") or {}
    try:
        key = migrated_script.resolve().relative_to(path.resolve().parent).as_posix()
    except ValueError:
        key = migrated_script.name
    entry = scripts.get(key)
    if entry is None:
        raise ManifestError(f"manifest {path} has no entry for {key!r} (has: {sorted(scripts)})")
    return _parse_entry(entry, f"{path} [{key}]")


def load_mapping_file(path: Path) -> ScriptManifest:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ManifestError(f"cannot read mapping {path}: {exc}") from exc
    if isinstance(data, dict) and "variables" in data:
        return _parse_entry(data, str(path))
    return _parse_entry({"variables": data}, str(path))


def parse_fetch_target(target: str) -> tuple[str, int | None]:
    """'total_loss[1]' -> ('total_loss', 1); 'loss' -> ('loss', None)."""
    if target.endswith("]") and "[" in target:
        key, _, index = target[:-1].rpartition("[")
        if index.isdigit():
            return key, int(index)
    return target, None
