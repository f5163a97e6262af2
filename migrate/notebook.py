"""Jupyter notebooks: code cells are Python sources; everything else in the file is kept as is."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

# IPython syntax that is not Python: line magics, shell escapes, help. Masked while rules run.
_MAGIC = re.compile(r"^(\s*)([%!?].*|\w[\w.]*\?{1,2}\s*)$")
_MASK = "#tfmigrate-ipython# "


class NotebookError(Exception):
    pass


@dataclass
class Cell:
    index: int  # 1-based among all cells
    source: str


def _cell_text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _mask(source: str) -> str | None:
    """Source with IPython-only lines turned into comments; None for a cell magic (``%%bash``)."""
    if source.lstrip().startswith("%%"):
        return None
    lines = source.split("\n")
    return "\n".join(
        f"{m.group(1)}{_MASK}{m.group(2)}" if (m := _MAGIC.match(line)) else line for line in lines
    )


def _unmask(source: str) -> str:
    return re.sub(rf"^(\s*){re.escape(_MASK)}", r"\1", source, flags=re.M)


def load(data: bytes) -> dict:
    try:
        notebook = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NotebookError(f"not a valid notebook: {exc}") from exc
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise NotebookError("not a valid notebook: no cells")
    return notebook


def code_cells(notebook: dict) -> list[Cell]:
    cells = []
    for index, cell in enumerate(notebook["cells"], start=1):
        if cell.get("cell_type") != "code":
            continue
        masked = _mask(_cell_text(cell))
        if masked is not None:
            cells.append(Cell(index, masked))
    return cells


def rewrite(data: bytes, notebook: dict, new_sources: dict[int, str]) -> bytes:
    """The notebook with the given cells' sources replaced, in nbformat's usual layout."""
    for index, source in new_sources.items():
        cell = notebook["cells"][index - 1]
        text = _unmask(source)
        lines = text.splitlines(keepends=True)
        cell["source"] = lines if isinstance(cell.get("source"), list) else text
    indent = _detect_indent(data)
    out = json.dumps(notebook, indent=indent, ensure_ascii=False)
    return (out + ("\n" if data.endswith(b"\n") else "")).encode("utf-8")


def _detect_indent(data: bytes) -> int:
    match = re.search(rb"\n( +)\"", data)
    return len(match.group(1)) if match else 1


def transform_cells(
    data: bytes, handle: Callable[[Cell], str | None]
) -> tuple[dict, dict[int, str]]:
    """Run ``handle`` on each code cell; returns the notebook and the cells whose text changed."""
    notebook = load(data)
    changed: dict[int, str] = {}
    for cell in code_cells(notebook):
        new_source = handle(cell)
        if new_source is not None and new_source != cell.source:
            changed[cell.index] = new_source
    return notebook, changed
