"""Unified diffs that `git apply` accepts, with review notes where `git apply` ignores them."""

from __future__ import annotations

import difflib

from rich.console import Console
from rich.text import Text

from tfmigrate.rule import Finding

_NO_NEWLINE = b"\\ No newline at end of file\n"


def unified_diff(path: str, old: bytes, new: bytes) -> bytes:
    """A `git apply`-able diff (``a/``/``b/`` prefixes), byte-exact for any encoding or newline."""
    lines = difflib.diff_bytes(
        difflib.unified_diff,
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        f"a/{path}".encode(),
        f"b/{path}".encode(),
        n=3,
    )
    out = bytearray()
    for line in lines:
        if line.startswith((b"---", b"+++")):
            line = line.rstrip(b" \t\r\n") + b"\n"  # difflib adds a trailing tab for dates
        out += line
        if not line.endswith(b"\n"):
            out += b"\n" + _NO_NEWLINE
    return bytes(out)


def notes_for(findings: list[Finding]) -> bytes:
    """Review notes, placed before a file's diff: `git apply` skips text before the header."""
    out = []
    for finding in findings:
        state = (
            "fixed"
            if finding.applied
            else (f"{finding.safety.value} fix available" if finding.fixable else "manual")
        )
        if finding.rewritten:
            state += ", line of the rewritten file"
        out.append(f"# {finding.location}: {finding.code} [{state}] {finding.message}\n")
    return "".join(out).encode()


def print_diff(console: Console, patch: bytes) -> None:
    """Colored on a terminal; the caller writes raw bytes when output is piped."""
    for raw in patch.decode("utf-8", "replace").splitlines():
        style = None
        if raw.startswith("#"):
            style = "cyan"
        elif raw.startswith(("+++", "---")):
            style = "bold"
        elif raw.startswith("@@"):
            style = "magenta"
        elif raw.startswith("+"):
            style = "green"
        elif raw.startswith("-"):
            style = "red"
        console.print(Text(raw, style=style or ""), soft_wrap=True)
