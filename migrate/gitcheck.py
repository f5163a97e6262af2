"""Refuse to overwrite uncommitted work: ``--write`` on a git work tree needs clean target files."""

from __future__ import annotations

import subprocess
from collections import defaultdict
from pathlib import Path


def git_root(path: Path) -> Path | None:
    directory = path if path.is_dir() else path.parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


def dirty_files(paths: list[Path]) -> list[Path]:
    """Those of ``paths`` that are modified, staged or untracked in their git work tree."""
    by_root: dict[Path, list[Path]] = defaultdict(list)
    for path in paths:
        root = git_root(path)
        if root is not None:
            by_root[root].append(path.resolve())
    dirty: list[Path] = []
    for root, files in by_root.items():
        out = subprocess.run(
            ["git", "status", "--porcelain", "-z", "--untracked-files=all", "--", *map(str, files)],
            cwd=root,
            capture_output=True,
            timeout=60,
        )
        if out.returncode != 0:
            continue
        for record in out.stdout.split(b"\0"):
            if len(record) > 3:
                dirty.append(root / record[3:].decode("utf-8", "surrogateescape"))
    return dirty
