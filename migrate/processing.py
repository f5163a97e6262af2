"""One file in, one result out: findings and the new bytes for a .py file or a notebook."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tfmigrate import notebook
from tfmigrate.engine import RuleCrashed, Settings, process_source
from tfmigrate.rule import Finding


@dataclass
class FileResult:
    path: str  # POSIX path as shown to the user
    findings: list[Finding] = field(default_factory=list)
    new: bytes | None = None  # new content when the file changes
    error: str | None = None
    manifest: dict[str, object] = field(default_factory=dict)  # rule-contributed entry keys

    @property
    def changed(self) -> bool:
        return self.new is not None

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "changed": self.changed,
            "error": self.error,
            "findings": [f.to_json() for f in self.findings],
        }


def process_file(path: Path, display: str, settings: Settings) -> FileResult:
    try:
        data = path.read_bytes()
    except OSError as exc:
        return FileResult(display, error=f"cannot read: {exc.strerror or exc}")
    try:
        if path.suffix == ".ipynb":
            return _process_notebook(data, display, settings)
        result = process_source(data, display, settings)
    except RuleCrashed as exc:
        return FileResult(display, error=f"internal error: {exc}")
    new = result.new_bytes if result.new_bytes != data else None
    return FileResult(display, result.findings, new, result.error, result.manifest if new else {})


def _process_notebook(data: bytes, display: str, settings: Settings) -> FileResult:
    findings: list[Finding] = []
    errors: list[str] = []
    bindings: dict[str, str] = {}  # cells share one namespace: imports carry over

    def handle(cell: notebook.Cell) -> str | None:
        result = process_source(cell.source, display, settings, bindings)
        bindings.update(result.bindings)
        for finding in result.findings:
            finding.cell = cell.index
        findings.extend(result.findings)
        if result.error:
            errors.append(f"cell {cell.index}: {result.error}")
        return result.new_code

    try:
        nb, changed = notebook.transform_cells(data, handle)
    except notebook.NotebookError as exc:
        return FileResult(display, error=str(exc))
    new = notebook.rewrite(data, nb, changed) if changed else None
    return FileResult(display, findings, new, "; ".join(errors) or None)
