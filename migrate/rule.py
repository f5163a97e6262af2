"""What every rule is: a libcst visitor with a code, documentation, examples and optional fixes.

A rule never edits the tree itself. It calls :meth:`Rule.report` with the node it found and, when
it can, the node that should replace it. The engine decides which fixes are applied (by safety and
configuration), applies them in one transform, and re-runs the rules until nothing changes.
"""

from __future__ import annotations

import enum
import inspect
import re
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import ClassVar, TypeVar, cast

import libcst as cst
from libcst.metadata import CodeRange, ParentNodeProvider, PositionProvider

from tfmigrate import tree
from tfmigrate.names import NameResolver
from tfmigrate.positions import LazyPositions
from tfmigrate.prefilter import CodeFacts, Trigger

T = TypeVar("T")
_UNSET = object()


class FixSafety(str, enum.Enum):
    """Ruff's vocabulary: safe fixes apply with --write, unsafe only with --unsafe-fixes."""

    SAFE = "safe"
    UNSAFE = "unsafe"
    MANUAL = "manual"  # reported only; a person has to decide


@dataclass(frozen=True)
class Example:
    """An INVALID example: code the rule must flag and, if it fixes, the exact fixed code."""

    code: str
    fixed: str | None = None
    # Substring the message must contain; documents what the finding says.
    message: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", textwrap.dedent(self.code).lstrip("\n"))
        if self.fixed is not None:
            object.__setattr__(self, "fixed", textwrap.dedent(self.fixed).lstrip("\n"))


@dataclass(frozen=True)
class Import:
    """An import a fix needs: ``import module as asname`` or ``from module import obj``."""

    module: str
    obj: str | None = None
    asname: str | None = None


@dataclass
class Fix:
    node: cst.CSTNode
    replacement: cst.CSTNode | cst.FlattenSentinel | cst.RemovalSentinel
    safety: FixSafety
    imports: tuple[Import, ...] = ()
    # Entries for this file's manifest record (``tfmigrate.json``), kept only if the fix is
    # applied: e.g. a program conversion's variable mapping for ``verify``.
    manifest: Mapping[str, object] | None = None


@dataclass
class Finding:
    path: str
    line: int
    col: int
    code: str
    message: str
    safety: FixSafety
    fixable: bool = False  # a fix exists (maybe not enabled)
    applied: bool = False
    cell: int | None = None  # notebook cell index (1-based) when the file is a notebook
    end_line: int | None = None
    # Found on the text the fixes wrote, not the input: ``line`` counts lines of that text.
    rewritten: bool = False

    @property
    def location(self) -> str:
        cell = f"cell {self.cell}:" if self.cell is not None else ""
        return f"{self.path}:{cell}{self.line}:{self.col}"

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {
            "path": self.path,
            "line": self.line,
            "col": self.col,
            "code": self.code,
            "message": self.message,
            "fix_safety": self.safety.value,
            "fixable": self.fixable,
            "applied": self.applied,
        }
        if self.cell is not None:
            data["cell"] = self.cell
        if self.rewritten:
            data["rewritten"] = True
        return data


@dataclass
class RuleContext:
    """What a rule may know about the file it runs on.

    Metadata is computed lazily and once per file: most files need no positions (no findings)
    and many rules never ask for parents, and libcst's providers cost more than a rule's visit.
    """

    path: PurePosixPath
    resolver: NameResolver
    module: cst.Module
    options: dict[str, object] = field(default_factory=dict)
    # False in `scan`: nobody applies fixes, so a rule may skip building costly replacements.
    fixing: bool = True
    _parents: dict[int, cst.CSTNode] | None = field(default=None, repr=False)
    _positions: Mapping[cst.CSTNode, CodeRange] | None = field(default=None, repr=False)
    _shared: dict[str, object] = field(default_factory=dict, repr=False)

    def parent_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        if self._parents is None:
            self._parents = tree.parents(self.module)
        return self._parents.get(id(node))

    def position_of(self, node: cst.CSTNode) -> CodeRange:
        if self._positions is None:
            self._positions = positions(self.module)
        return self._positions[node]

    def shared(self, key: str, compute: Callable[[], T]) -> T:
        """One analysis per file, shared by every rule that asks for ``key``."""
        if key not in self._shared:
            self._shared[key] = compute()
        return cast(T, self._shared[key])  # stored by compute() under this key


def positions(module: cst.Module) -> Mapping[cst.CSTNode, CodeRange]:
    """PositionProvider's positions of every node, each worked out when asked for
    (``tfmigrate.positions``; ``MetadataWrapper.resolve`` would also walk the whole tree)."""
    return LazyPositions(module)


@dataclass
class Report:
    node: cst.CSTNode
    message: str
    fix: Fix | None


_DOC_SECTIONS = ("What it does", "Why is this bad?", "Example", "Fix safety")


class Rule(cst.BatchableCSTVisitor):
    """Base class. Subclasses set the class attributes and write Ruff-style docs in the docstring:
    sections ``## What it does``, ``## Why is this bad?``, ``## Example``, ``## Fix safety``."""

    METADATA_DEPENDENCIES = ()  # positions and parents come lazily from the context

    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]
    fix_safety: ClassVar[FixSafety] = FixSafety.MANUAL
    # Opt-in rules run only when selected (--select, or `select` in the config).
    default_enabled: ClassVar[bool] = True
    # Options (`[tool.tfmigrate.options]`, or CLI flags) that take one of a few values: checked
    # before any file is read, so a typo is an error instead of a silent default.
    option_choices: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    # What the rule cannot fire without (None: always run), any one of: a word, found in the
    # code's identifiers or string constants (not comments or docstrings); a qualified name
    # (``tensorflow.device``), some dotted name in the code resolving to it or inside it; a name
    # prefix (``keras*``); a quoted string (``'VariableV2'``), a string constant equal to it; a
    # keyword given a literal (``trainable=False``, also a dict literal's string key); a
    # compiled pattern; a tuple of these, all required. A file where no enabled rule's trigger
    # occurs is never parsed by libcst, which is most of the cost (see prefilter).
    triggers: ClassVar[tuple[Trigger, ...] | None] = None
    valid: ClassVar[tuple[str, ...]] = ()
    invalid: ClassVar[tuple[Example, ...]] = ()

    def __init__(self, context: RuleContext) -> None:
        super().__init__()
        self.context = context
        self.reports: list[Report] = []

    @classmethod
    def may_report(cls, path: PurePosixPath, facts: CodeFacts) -> bool:
        """Asked by the light pass once the triggers matched, before any libcst tree: False
        when the rule cannot report in the file at ``path`` with these facts. For rules whose
        findings depend on other files (their light pass is cheap), or on how a name is used,
        read from the file's ``ast`` nodes (``facts.nodes``, ``facts.parent``,
        ``facts.qualify``); must be conservative."""
        return True

    # -- helpers for subclasses ---------------------------------------------------------------
    def qualify(self, node: cst.BaseExpression) -> str | None:
        return self.context.resolver.qualify(node)

    def call_name(self, node: cst.Call) -> str | None:
        return self.qualify(node.func)

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.context.parent_of(node)

    def position(self, node: cst.CSTNode) -> CodeRange:
        return self.context.position_of(node)

    def get_metadata(self, key, node, default=_UNSET):
        """Positions and parents without declaring them: computed on first use, once per file."""
        if key is PositionProvider:
            return self.context.position_of(node)
        if key is ParentNodeProvider:
            parent = self.context.parent_of(node)
            if parent is None and default is not _UNSET:
                return default
            return parent
        if default is _UNSET:
            return super().get_metadata(key, node)
        return super().get_metadata(key, node, default)

    def ancestors(self, node: cst.CSTNode):
        current = self.parent(node)
        while current is not None:
            yield current
            current = self.parent(current)

    def enclosing_statement(self, node: cst.CSTNode) -> cst.CSTNode:
        """The statement (simple or compound) that holds ``node``."""
        current: cst.CSTNode = node
        while not isinstance(current, cst.SimpleStatementLine | cst.BaseCompoundStatement):
            parent = self.parent(current)
            if parent is None:
                return current
            current = parent
        return current

    def tf_local(self) -> str:
        """The local name of the ``tensorflow`` module (``tf`` if it is not imported)."""
        return self.context.resolver.local_name_for("tensorflow") or "tf"

    def report(
        self,
        node: cst.CSTNode,
        message: str,
        *,
        replacement: cst.CSTNode | cst.FlattenSentinel | cst.RemovalSentinel | None = None,
        safety: FixSafety | None = None,
        imports: tuple[Import, ...] = (),
        target: cst.CSTNode | None = None,
        manifest: Mapping[str, object] | None = None,
    ) -> None:
        """Report a finding at ``node``. ``replacement`` replaces ``target`` (default: ``node``);
        a finding can sit on one call while its fix rewrites the enclosing statement or block.
        Findings whose fixes share one target must pass equal replacements. ``manifest``: keys
        merged into the file's manifest entry when (and only when) the fix is applied."""
        fix = None
        if replacement is not None:
            fix = Fix(target or node, replacement, safety or self.fix_safety, imports, manifest)
        self.reports.append(Report(node, message, fix))

    # -- catalog ------------------------------------------------------------------------------
    @classmethod
    def docs(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")

    @classmethod
    def doc_sections(cls) -> dict[str, str]:
        sections: dict[str, str] = {}
        for match in re.finditer(r"^## (.+?)\n(.*?)(?=^## |\Z)", cls.docs(), re.S | re.M):
            sections[match.group(1).strip()] = match.group(2).strip()
        return sections

    @classmethod
    def missing_doc_sections(cls) -> list[str]:
        present = cls.doc_sections()
        return [s for s in _DOC_SECTIONS if not present.get(s)]
