"""Read a project: find its entry programs and the repo-local modules they import.

Each file is parsed once (libcst, through the engine's parse helper); its ``tf``, ``tfv1``,
``slim`` aliases are the bindings ``NameResolver`` makes, read from its simple statements. Imports are resolved against the file's
package (relative imports), the file's folder and its parents up to the project root, and the
folders a script adds with ``sys.path.append``/``insert`` -- the ways tower scripts reach their
model and helper modules.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import libcst as cst

from tfmigrate import tree
from tfmigrate.convert.ir import Where
from tfmigrate.engine import check_syntax
from tfmigrate.names import NameResolver, dotted
from tfmigrate.rule import RuleContext

# Folders that hold no project code.
_SKIPPED_DIRS = frozenset({".git", ".venv", "venv", "site-packages", "__pycache__", "node_modules"})
_ROOT_MARKERS = (".git", "setup.py", "pyproject.toml", "setup.cfg", "LICENSE")


def _skipped(folder: Path) -> bool:
    name = folder.name
    return name in _SKIPPED_DIRS or name.startswith(".") or (folder / "pyvenv.cfg").exists()


ENTRY_BYTES = re.compile(rb"__main__|\bapp\.run\b")
_APP_RUN = frozenset({"tensorflow.app.run", "absl.app.run", "tensorflow.compat.v1.app.run"})


@dataclass(frozen=True)
class ImportTarget:
    """What a local name imported from the repo is: a module (``attr`` None) or a name
    ``attr`` defined in the module ``file``."""

    file: Path
    attr: str | None


@dataclass(eq=False)
class SourceFile:
    """One parsed file of the project, with the lookups the recognizers need."""

    path: Path
    rel: str
    module: cst.Module
    context: RuleContext
    raw: bytes = b""
    imports: dict[str, ImportTarget] = field(default_factory=dict)
    star_imports: list[Path] = field(default_factory=list)
    extra_paths: list[Path] = field(default_factory=list)
    shared: dict[str, object] = field(default_factory=dict)

    @property
    def resolver(self) -> NameResolver:
        return self.context.resolver

    def qualify(self, node: cst.BaseExpression) -> str | None:
        return self.resolver.qualify(node)

    def line(self, node: cst.CSTNode) -> int:
        return self.context.position_of(node).start.line

    def where(self, node: cst.CSTNode) -> Where:
        return Where(self.rel, self.line(node))

    def src(self, node: cst.CSTNode, limit: int = 90) -> str:
        text = " ".join(self.module.code_for_node(node).split())
        return text if len(text) <= limit else text[: limit - 1] + "…"

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.context.parent_of(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        current = self.parent(node)
        while current is not None:
            yield current
            current = self.parent(current)

    def enclosing_def(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef):
                return ancestor
        return None

    def enclosing_class(self, node: cst.CSTNode) -> cst.ClassDef | None:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.ClassDef):
                return ancestor
        return None

    def qualname(self, node: cst.CSTNode) -> str:
        """``Trainer.build`` / ``train`` / ``<module>`` for the code holding ``node``."""
        names = [
            a.name.value
            for a in self.ancestors(node)
            if isinstance(a, cst.FunctionDef | cst.ClassDef)
        ]
        if isinstance(node, cst.FunctionDef | cst.ClassDef):
            names.insert(0, node.name.value)
        return ".".join(reversed(names)) or "<module>"

    def top_level(self, name: str) -> cst.FunctionDef | cst.ClassDef | None:
        for statement in self.module.body:
            if isinstance(statement, cst.FunctionDef | cst.ClassDef) and (
                statement.name.value == name
            ):
                return statement
        return None

    def is_entry(self) -> bool:
        """A ``__main__`` block or a ``tf.app.run``/``absl.app.run`` call at module level."""
        for statement in self.module.body:
            if isinstance(statement, cst.If) and "__main__" in self.module.code_for_node(
                statement.test
            ):
                return True
            for node in tree.walk(statement, (cst.FunctionDef, cst.ClassDef)):
                if isinstance(node, cst.Call) and self.qualify(node.func) in _APP_RUN:
                    return True
        return False


def small_statements(module: cst.Module) -> list[cst.BaseSmallStatement]:
    """Every simple statement (imports, assignments, expressions), in source order, inside
    functions and classes too: what imports and aliases are made of, without walking every
    expression of the file."""
    found: list[cst.BaseSmallStatement] = []
    pending: list[cst.CSTNode] = list(reversed(module.body))
    while pending:
        node = pending.pop()
        if isinstance(node, cst.SimpleStatementLine):
            found.extend(node.body)
        elif isinstance(node, cst.SimpleStatementSuite):
            found.extend(node.body)
        elif isinstance(node, cst.BaseCompoundStatement):
            blocks: list[cst.CSTNode] = [node.body]
            for name in ("orelse", "finalbody"):
                extra = getattr(node, name, None)
                if extra is not None:
                    blocks.append(
                        extra.body if isinstance(extra, cst.Else | cst.Finally) else extra
                    )
            blocks.extend(h.body for h in getattr(node, "handlers", ()))
            if isinstance(node, cst.Match):
                blocks.extend(case.body for case in node.cases)
            children: list[cst.CSTNode] = []
            for block in blocks:
                if isinstance(block, cst.IndentedBlock):
                    children.extend(block.body)
                elif isinstance(block, cst.BaseCompoundStatement | cst.SimpleStatementSuite):
                    children.append(block)
            pending.extend(reversed(children))
    return found


def _resolver(small: list[cst.BaseSmallStatement]) -> NameResolver:
    """``NameResolver.for_module``'s bindings, read from the simple statements only (its
    visit collects nothing else)."""
    resolver = NameResolver()
    for node in small:
        if isinstance(node, cst.Import):
            resolver.visit_Import(node)
        elif isinstance(node, cst.ImportFrom):
            resolver.visit_ImportFrom(node)
        elif isinstance(node, cst.Assign):
            resolver.visit_Assign(node)
    return resolver


def method_of(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    for statement in cls.body.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
            return statement
    return None


class Project:
    """The files of one project, each parsed once when first needed."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._files: dict[Path, SourceFile | None] = {}
        self.errors: dict[Path, tuple[int, str]] = {}

    @classmethod
    def for_path(cls, path: Path) -> Project:
        path = path.resolve()
        if path.is_dir():
            return cls(path)
        for folder in path.parents:
            if any((folder / marker).exists() for marker in _ROOT_MARKERS):
                return cls(folder)
        return cls(path.parent)

    def rel(self, path: Path) -> str:
        try:
            return PurePosixPath(path.resolve().relative_to(self.root)).as_posix()
        except ValueError:
            return path.name

    def python_files(self) -> list[Path]:
        """The project's ``.py`` files, sorted; virtual environments, hidden and tool folders
        are pruned before they are entered (a repo's ``.venv`` alone holds ~10^5 files)."""
        found = []
        for folder, subfolders, files in os.walk(self.root):
            subfolders[:] = [d for d in subfolders if not _skipped(Path(folder) / d)]
            found += [Path(folder) / f for f in files if f.endswith(".py")]
        return sorted(found)

    def candidate_entries(self, path: Path) -> list[Path]:
        """Files with a main block or ``app.run`` (byte test first; parsed only if it hits)."""
        path = path.resolve()
        if path.is_file():
            return [path]
        found = []
        for file in self.python_files():
            if ENTRY_BYTES.search(file.read_bytes()):
                source = self.load(file)
                # A file libcst cannot parse is kept: its refusal is reported.
                if source is None or source.is_entry():
                    found.append(file)
        return found

    # -- parsing ------------------------------------------------------------------------------
    def load(self, path: Path) -> SourceFile | None:
        path = path.resolve()
        if path in self._files:
            return self._files[path]
        self._files[path] = None
        try:
            text = path.read_bytes()
        except OSError as exc:
            self.errors[path] = (1, f"cannot read: {exc}")
            return None
        try:
            module = tree.parse_module(text)
        except cst.ParserSyntaxError as exc:
            message = check_syntax(text, str(path)) or str(exc).splitlines()[0]
            self.errors[path] = (_error_line(text) or exc.raw_line, message)
            return None
        small = small_statements(module)
        resolver = _resolver(small)
        context = RuleContext(PurePosixPath(self.rel(path)), resolver, module, fixing=False)
        source = SourceFile(path, self.rel(path), module, context, text)
        source.shared["statements"] = small
        source.shared["project"] = self
        self._files[path] = source
        self._read_imports(source)
        # `from helpers import *` brings the helper module's `tf` binding along.
        for star in source.star_imports:
            imported = self.load(star)
            if imported is not None:
                for name, bound in imported.resolver.bindings.items():
                    resolver.bindings.setdefault(name, bound)
                resolver.imported_modules |= imported.resolver.imported_modules
        return source

    def adopt(self, path: Path, context: RuleContext) -> SourceFile:
        """``path`` as a rule sees it (its module, maybe already changed by other rules' fixes):
        registered in place of the file on disk, its imports read from disk."""
        path = path.resolve()
        module = context.module
        small = small_statements(module)
        source = SourceFile(path, self.rel(path), module, context, module.code.encode())
        source.shared["statements"] = small
        source.shared["project"] = self  # the planner follows calls into the repo's modules
        self._files[path] = source
        self._read_imports(source)
        return source

    def loaded(self) -> list[SourceFile]:
        return [s for s in self._files.values() if s is not None]

    # -- imports ------------------------------------------------------------------------------
    def _bases(self, source: SourceFile) -> list[Path]:
        """Folders an absolute import of ``source`` may be found under."""
        bases = [source.path.parent]
        for folder in source.path.parent.parents:
            if folder == self.root or self.root in folder.parents:
                bases.append(folder)
        bases.extend(source.extra_paths)
        return list(dict.fromkeys(bases))

    def _module_file(self, base: Path, name: str) -> Path | None:
        target = base.joinpath(*name.split(".")) if name else base
        if target.with_suffix(".py").is_file():
            return target.with_suffix(".py").resolve()
        if (target / "__init__.py").is_file():
            return (target / "__init__.py").resolve()
        return None

    def _find_module(self, source: SourceFile, name: str, level: int) -> Path | None:
        if level:
            base = source.path.parent
            for _ in range(level - 1):
                base = base.parent
            return self._module_file(base, name)
        for base in self._bases(source):
            found = self._module_file(base, name)
            if found is not None:
                return found
        return None

    def _read_imports(self, source: SourceFile) -> None:
        small = source.shared["statements"]
        assert isinstance(small, list)
        # sys.path additions first: they decide where the script's imports are found.
        for node in small:
            call = node.value if isinstance(node, cst.Expr) else None
            if isinstance(call, cst.Call) and dotted(call.func) in (
                "sys.path.append",
                "sys.path.insert",
            ):
                folder = _path_argument(call, source.path.parent)
                if folder is not None and folder.is_dir():
                    source.extra_paths.append(folder.resolve())
        for node in small:
            if isinstance(node, cst.Import):
                for alias in node.names:
                    name = dotted(alias.name)
                    if name is None:
                        continue
                    found = self._find_module(source, name, 0)
                    if found is None:
                        continue
                    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                        source.imports[alias.asname.name.value] = ImportTarget(found, None)
                    else:
                        head = self._find_module(source, name.split(".")[0], 0)
                        source.imports[name] = ImportTarget(found, None)
                        if head is not None:
                            source.imports.setdefault(name.split(".")[0], ImportTarget(head, None))
            elif isinstance(node, cst.ImportFrom):
                self._read_import_from(source, node)

    def _read_import_from(self, source: SourceFile, node: cst.ImportFrom) -> None:
        level = len(node.relative)
        name = dotted(node.module) if node.module is not None else ""
        if name is None:
            return
        module = self._find_module(source, name, level)
        if isinstance(node.names, cst.ImportStar):
            if module is not None:
                source.star_imports.append(module)
            return
        for alias in node.names:
            imported = dotted(alias.name)
            if imported is None:
                continue
            local = imported
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
            # `from pkg import mod` names a module when pkg/mod.py exists.
            submodule = self._find_module(source, f"{name}.{imported}" if name else imported, level)
            if submodule is not None:
                source.imports[local] = ImportTarget(submodule, None)
            elif module is not None:
                source.imports[local] = ImportTarget(module, imported)

    def closure(self, entry: SourceFile) -> list[SourceFile]:
        """``entry`` and the repo modules it imports, transitively, in discovery order."""
        seen: dict[Path, SourceFile] = {entry.path: entry}
        queue = [entry]
        while queue:
            current = queue.pop(0)
            targets = [t.file for t in current.imports.values()] + current.star_imports
            for path in targets:
                if path in seen:
                    continue
                loaded = self.load(path)
                if loaded is not None:
                    seen[path] = loaded
                    queue.append(loaded)
        return list(seen.values())

    # -- name lookup across modules ------------------------------------------------------------
    def definition(
        self, source: SourceFile, name: str, depth: int = 0
    ) -> tuple[SourceFile, cst.FunctionDef | cst.ClassDef] | None:
        """The function or class a module-level name of ``source`` denotes (local def, or
        imported from a repo module, ``module.attr`` included)."""
        if depth > 4:
            return None
        head, _, rest = name.partition(".")
        if not rest:
            found = source.top_level(name)
            if found is not None:
                return source, found
        target = source.imports.get(head)
        if target is None and rest:
            # `import a.b` then `a.b.f`
            for local, imported in source.imports.items():
                if imported.attr is None and name.startswith(local + "."):
                    target, rest = imported, name[len(local) + 1 :]
                    break
        if target is not None:
            module = self.load(target.file)
            if module is None:
                return None
            if target.attr is not None:
                return self.definition(
                    module, ".".join(filter(None, [target.attr, rest])), depth + 1
                )
            if rest:
                return self.definition(module, rest, depth + 1)
            return None
        for star in source.star_imports:
            module = self.load(star)
            if module is not None:
                starred = self.definition(module, name, depth + 1)
                if starred is not None:
                    return starred
        if rest:
            # `Class.method`
            cls = source.top_level(head)
            if isinstance(cls, cst.ClassDef):
                method = method_of(cls, rest)
                if method is not None:
                    return source, method
        return None


def _error_line(text: bytes) -> int | None:
    """CPython's line for the first syntax error (libcst's points past a Python 2 print)."""
    try:
        ast.parse(text)
    except SyntaxError as exc:
        return exc.lineno
    except ValueError:
        return None
    return None


def _path_argument(call: cst.Call, folder: Path) -> Path | None:
    """The folder of ``sys.path.append('..')`` or ``os.path.join(os.path.dirname(__file__),
    '..')``: relative to the script's folder (scripts are run from there)."""
    if not call.args:
        return None
    value = call.args[-1].value
    parts = [
        n.evaluated_value
        for n in tree.walk(value)
        if isinstance(n, cst.SimpleString) and isinstance(n.evaluated_value, str)
    ]
    if not parts:
        return None
    candidate = folder.joinpath(*parts)
    return candidate if candidate.is_dir() else None
