"""Removing a user's copy of `multi_gpu_model` once TFM107 has converted its callers.

Not a rule module. The callers' conversion (TFM107) drops their import of the copy when they
read it no more; the module that defines the copy then deletes its def, with the imports only
the def used, when no file of the project still calls it. Which files still do is found by
converting each caller that imports the copy with TFM107 alone and reading the result, so the
def goes exactly when its callers' conversions leave no reference behind.

No TensorFlow import here (the rewrite path must not need it).
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import libcst as cst

from tfmigrate import tree
from tfmigrate.names import dotted
from tfmigrate.rule import FixSafety
from tfmigrate.rules import _keras_parallel as parallel_copy
from tfmigrate.rules._keras2 import is_used, reads

# Set while a caller is converted to see what is left of it: that conversion does not in turn
# ask about the callers of copies the caller defines.
_SIMULATING: contextvars.ContextVar[bool] = contextvars.ContextVar("tfm107_sim", default=False)
_SKIPPED_DIRS = frozenset({".git", ".venv", "venv", "site-packages", "__pycache__", "build"})
_ROOT_MARKERS = (".git", "setup.py", "pyproject.toml", "setup.cfg")
_MAX_FILES = 2000


def simulating() -> bool:
    return _SIMULATING.get()


# -- the caller's side: its import of the copy, once nothing reads it --------------------------
def drop_dead_imports(module: cst.Module, name: str) -> cst.Module:
    """``module`` without the `from ... import name` aliases whose binding no read can see
    (one at module level: no read anywhere; one in a block: no read after it in that block,
    in an enclosing loop, or after the statements enclosing it)."""
    parents = tree.parents(module)
    dead: set[int] = set()
    for node in tree.walk(module):
        if isinstance(node, cst.SimpleStatementLine) and any(
            _binds_name(s, name) for s in node.body
        ):
            if not _visible_read(module, node, name, parents):
                dead.add(id(node))
    if not dead:
        return module
    return module.visit(_DropAliases(dead, name))


def _binds_name(small: cst.BaseSmallStatement, name: str) -> bool:
    if not isinstance(small, cst.ImportFrom) or not isinstance(small.names, list | tuple):
        return False
    return any(_bound(a) == name for a in small.names)


def _bound(alias: cst.ImportAlias) -> str:
    return dotted(alias.asname.name if alias.asname else alias.name) or ""


def _visible_read(
    module: cst.Module, line: cst.CSTNode, name: str, parents: dict[int, cst.CSTNode]
) -> bool:
    """Whether a read of ``name`` can see the binding made by the import ``line``."""
    node: cst.CSTNode = line
    while True:
        block = parents.get(id(node))
        if block is None:
            return False
        if isinstance(block, cst.Module):
            if node is line:  # a module-level import: any read, functions included
                return is_used(module, name)
            return any(_reads(s, name) for s in _after(block.body, node))
        if not isinstance(block, cst.IndentedBlock):
            node = block
            continue
        if any(_reads(s, name) for s in _after(block.body, node)):
            return True
        owner = parents.get(id(block))
        if isinstance(owner, cst.FunctionDef):
            return False  # the function's local: nothing outside it reads it
        if isinstance(owner, cst.For | cst.While) and _reads(owner, name):
            return True
        node = _statement_of(owner, parents) if owner is not None else block


def _after(body: Sequence[cst.BaseStatement], node: cst.CSTNode) -> list[cst.BaseStatement]:
    """The statements of ``body`` after ``node`` (by identity; none when it is not there)."""
    for index, statement in enumerate(body):
        if statement is node:
            return list(body[index + 1 :])
    return []


def _statement_of(node: cst.CSTNode, parents: dict[int, cst.CSTNode]) -> cst.CSTNode:
    """The statement of a block holding ``node``: an `elif` climbs to its first `if`, an
    `else`/`except` to its statement."""
    current = node
    while True:
        parent = parents.get(id(current))
        if parent is None or isinstance(parent, cst.IndentedBlock | cst.Module):
            return current
        current = parent


def _reads(node: cst.CSTNode, name: str) -> bool:
    return reads(node, name)


class _DropAliases(cst.CSTTransformer):
    def __init__(self, lines: set[int], name: str) -> None:
        super().__init__()
        self.lines, self.name = lines, name

    def leave_SimpleStatementLine(self, original, updated):
        if id(original) not in self.lines:
            return updated
        body = []
        for small in updated.body:
            if _binds_name(small, self.name):
                kept = [a for a in small.names if _bound(a) != self.name]
                if not kept:
                    continue
                kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                small = small.with_changes(names=kept)
            body.append(small)
        if not body:
            return cst.RemoveFromParent()
        return updated.with_changes(body=body)

    def leave_IndentedBlock(self, original, updated):
        if updated.body:
            return updated
        return updated.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])


# -- the defining module's side: the def and the imports only it used -------------------------
def without_copy(module: cst.Module, name: str) -> cst.Module | None:
    """``module`` without the module-level def ``name`` and the imports only that def read;
    None when the module itself still reads ``name`` or lists it in ``__all__``."""
    body = [s for s in module.body if not (isinstance(s, cst.FunctionDef) and s.name.value == name)]
    if len(body) == len(module.body):
        return None
    rest = module.with_changes(body=body)
    if is_used(rest, name) or re.search(rf"__all__[^\n]*['\"]{re.escape(name)}['\"]", rest.code):
        return None
    defined = next(
        s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == name
    )
    read = {n.value for n in tree.walk(defined) if isinstance(n, cst.Name)}
    kept: list[cst.BaseStatement] = []
    for statement in body:
        trimmed = _without_imports_of(statement, read, rest)
        if trimmed is not None:
            kept.append(trimmed)
    return module.with_changes(body=kept)


def _without_imports_of(
    statement: cst.BaseStatement, read: set[str], module: cst.Module
) -> cst.BaseStatement | None:
    """A module-level import line without the names the deleted def read and nothing else
    reads (None when none is left); any other statement as it is."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return statement
    small = statement.body[0]
    if isinstance(small, cst.ImportFrom):
        if small.module is not None and dotted(small.module) == "__future__":
            return statement
        if not isinstance(small.names, list | tuple):
            return statement
        names = list(small.names)
    elif isinstance(small, cst.Import):
        names = list(small.names)
    else:
        return statement

    def bound(alias: cst.ImportAlias) -> str:
        if alias.asname is not None:
            return dotted(alias.asname.name) or ""
        return (dotted(alias.name) or "").split(".")[0]

    kept = [a for a in names if not (bound(a) in read and not is_used(module, bound(a)))]
    if not kept:
        return None
    if len(kept) == len(names):
        return statement
    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return statement.with_changes(body=[small.with_changes(names=kept)])


# -- the project: who imports the copy, and what is left of them once converted ----------------
def project_root(file: Path) -> Path:
    """The folder holding the project of ``file``: the nearest one above it with a project
    marker, else the folder above its outermost package."""
    for folder in file.parents:
        if any((folder / marker).exists() for marker in _ROOT_MARKERS):
            return folder
    folder = file.parent
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        folder = folder.parent
    return folder


def _project_files(root: Path) -> list[Path]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if _SKIPPED_DIRS.intersection(path.relative_to(root).parts[:-1]):
            continue
        found.append(path)
        if len(found) > _MAX_FILES:
            break
    return found


def callers_left(definer: Path, name: str, convert: ConvertOne) -> tuple[bool, FixSafety] | None:
    """For the copy ``name`` defined in ``definer``: (True, the safety of the callers'
    conversions) when at least one file called it and none does once TFM107 has converted
    them; None when some file still reads it (or none ever did)."""
    definer = definer.resolve()
    root = project_root(definer)
    files = _project_files(root)
    if len(files) > _MAX_FILES:
        return None
    word = re.compile(rb"\b" + re.escape(name.encode()) + rb"\b")
    safety = FixSafety.SAFE
    called = False
    for file in files:
        if file.resolve() == definer:
            continue
        try:
            raw = file.read_bytes()
        except OSError:
            return None
        if not word.search(raw):
            continue
        verdict = _verdict(file, file.stat().st_mtime, definer, name, convert)
        if verdict is None:
            return None  # unreadable, or it still reads the copy once converted
        called |= verdict[0]
        if verdict[1]:
            safety = FixSafety.UNSAFE
    return (True, safety) if called else None


@lru_cache(maxsize=512)
def _verdict(
    file: Path, mtime: float, definer: Path, name: str, convert: ConvertOne
) -> tuple[bool, bool] | None:
    """For one file of the project: (whether it reads the copy, whether its conversion was
    unsafe) when its conversion leaves no read of the copy; None when one is left (or the file
    cannot be read). Cached: every fix pass of the defining module asks again."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    before = _references(file, text, definer, name)
    if before is None:
        return None
    if not before:
        return False, False
    after, unsafe = _converted(file, mtime, convert)
    if after is None:
        return None
    left = _references(file, after, definer, name)
    if left is None or left:
        return None
    return True, unsafe


class ConvertOne:
    """How a caller is converted: TFM107 alone over its text (set by the rule module)."""

    def __call__(self, path: Path, text: str) -> tuple[str | None, bool]:
        raise NotImplementedError


@lru_cache(maxsize=256)
def _converted(file: Path, mtime: float, convert: ConvertOne) -> tuple[str | None, bool]:
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None, False
    token = _SIMULATING.set(True)
    try:
        return convert(file, text)
    finally:
        _SIMULATING.reset(token)


def _references(file: Path, text: str, definer: Path, name: str) -> bool | None:
    """Whether ``text`` (of ``file``) imports ``name`` from ``definer``'s module, imports the
    module itself and reads an attribute ``name``, or star-imports it; None when unparsable."""
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError:
        return None
    attribute = re.search(rf"\.{re.escape(name)}\b", text) is not None
    for node in tree.walk(module):
        if isinstance(node, cst.ImportFrom):
            target = _module_of(file, node)
            if target is None:
                continue
            if target == definer:
                if not isinstance(node.names, list | tuple):
                    return True  # `import *`
                if any(dotted(a.name) == name for a in node.names):
                    return True
            elif isinstance(node.names, list | tuple) and attribute:
                # `from pkg import module`: then `module.name`
                for alias in node.names:
                    sub = parallel_copy.module_file(target.parent, dotted(alias.name) or "")
                    if sub is not None and sub.resolve() == definer:
                        return True
        elif isinstance(node, cst.Import) and attribute:
            for alias in node.names:
                found = parallel_copy.module_file(file.parent, dotted(alias.name) or "")
                if found is not None and found.resolve() == definer:
                    return True
    return False


def _module_of(file: Path, node: cst.ImportFrom) -> Path | None:
    """The project file a `from X import ...` in ``file`` reads (relative imports too)."""
    name = dotted(node.module) if node.module is not None else ""
    level = len(node.relative)
    if level:
        base = file.parent
        for _ in range(level - 1):
            base = base.parent
        found = parallel_copy.module_file_at(base, name) if name else base / "__init__.py"
    else:
        found = parallel_copy.module_file(file.parent, name or "")
    return found.resolve() if found is not None and found.is_file() else None
