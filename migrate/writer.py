"""Writing results: atomic in-place edits, or a migrated copy of the tree under --out."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path


class OutputError(Exception):
    pass


def atomic_write(path: Path, data: bytes, mode_from: Path | None = None) -> None:
    """Replace ``path`` in one step, keeping the permissions of ``mode_from`` (or of ``path``)."""
    source = mode_from if mode_from is not None else path
    mode = stat.S_IMODE(source.stat().st_mode) if source.exists() else 0o644
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tfmigrate-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def output_layout(inputs: list[Path]) -> Path:
    """The folder whose contents land at OUT: a folder input itself, a file input's folder, or
    the common parent of several inputs."""
    resolved = [p.resolve() for p in inputs]
    if len(resolved) == 1:
        only = resolved[0]
        return only if only.is_dir() else only.parent
    return Path(os.path.commonpath([str(p if p.is_dir() else p.parent) for p in resolved]))


def check_out_dir(out: Path, inputs: list[Path], force: bool) -> None:
    out_resolved = out.resolve()
    for raw in inputs:
        base = raw.resolve()
        if base.is_dir() and (out_resolved == base or base in out_resolved.parents):
            if not force:
                raise OutputError(f"--out {out} is inside the input {raw} (use --force to allow)")
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise OutputError(f"--out {out} exists and is not empty (use --force to write into it)")


def copy_file(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)  # keeps permissions and times
