"""One-line explanations for source that does not parse, naming Python 2 when that is the cause."""

from __future__ import annotations

import re

# Python 2 constructs that are syntax errors in Python 3, checked on the failing line.
_PY2_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^\s*print\s+(?![\s(=]|$)"), "print statement"),
    (re.compile(r"^\s*print\s*>>"), "print >> statement"),
    (re.compile(r"^\s*except\s+[\w.]+\s*,\s*\w+\s*:"), "'except X, e:'"),
    (re.compile(r"^\s*exec\s+[\"'\w]"), "exec statement"),
    (re.compile(r"^\s*raise\s+[\w.]+\s*,"), "'raise E, msg'"),
    (re.compile(r"`[^`]+`"), "backtick repr"),
    (re.compile(r"\b0[0-7]+\b"), "old octal literal"),
    (re.compile(r"\b\d+[lL]\b"), "long integer literal"),
    (re.compile(r"\bur['\"]"), "ur'' string prefix"),
    (re.compile(r"<>"), "'<>' operator"),
)


def _text(source: bytes | str) -> str:
    if isinstance(source, bytes):
        return source.decode("utf-8", "replace")
    return source


def describe_syntax_error(source: bytes | str, exc: SyntaxError) -> str:
    line_no = exc.lineno or 0
    lines = _text(source).splitlines()
    line = lines[line_no - 1] if 0 < line_no <= len(lines) else (exc.text or "")
    for pattern, what in _PY2_PATTERNS:
        if pattern.search(line):
            return (
                f"Python 2 syntax at line {line_no} ({what}); tfmigrate reads Python 3 only "
                "- convert the file first (e.g. with 2to3)"
            )
    col = exc.offset or 0
    return f"syntax error at line {line_no}:{col}: {exc.msg}"
