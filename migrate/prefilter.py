"""A light pass over one source, before libcst: which enabled rules could report anything in it.

CPython's own parser (``ast``, in C) is an order of magnitude cheaper than building a libcst tree
and walking it with every rule. From its tree this pass collects what rules match on — the
identifiers and string constants of the code (comments and docstrings left out), the imported
modules, the import bindings exactly as :class:`tfmigrate.names.NameResolver` computes them, and
the canonical qualified name of every dotted name. A rule's ``triggers`` are then checked against
those facts instead of the raw bytes, where most of TensorFlow-era code mentions every trigger
word somewhere in a comment or docstring.

It must be conservative: it only ever rules out a rule that could not have reported. Source that
``ast`` cannot parse (Python 2, syntax errors) gets no facts and takes the full path unchanged.
Set ``TFMIGRATE_LIGHT_PASS=0`` to switch the pass off (the differential tests compare both).
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from tfmigrate.names import canonical

if TYPE_CHECKING:  # rule.py imports this module
    from tfmigrate.rule import Rule

# Module roots a rule can be about; a file importing none of them is left alone by the engine.
TF_ROOTS = ("tensorflow", "keras", "horovod")
# Roots whose aliases the name resolver tracks (``slim = tf.contrib.slim``); as in names.py.
_TRACKED_ROOTS = ("tensorflow", "tf_slim", "keras", "horovod", "numpy")
_BODY_FIELDS = ("body", "handlers", "orelse", "finalbody", "cases")  # source order
# Spelled into the facts' words when a ``for`` loop adds up what it iterates over
# (``for g, _ in tower: total += g``): summing by hand, which a rule may look for.
LOOP_SUM = "+="

# ``trainable=False``: a keyword argument, or a dict literal's string key, given that literal.
_KEYWORD_VALUE = re.compile(r"\w+=(?:True|False)")

# A rule's trigger: a word, a qualified name, a name prefix, a quoted string, a keyword given a
# literal, a pattern searched in the words, or a tuple of triggers that must all match (see
# ``CodeFacts.matches``).
Trigger = str | re.Pattern[str] | tuple["Trigger", ...]


def enabled() -> bool:
    return os.environ.get("TFMIGRATE_LIGHT_PASS", "1") != "0"


@dataclass(frozen=True)
class CodeFacts:
    """What one source's code (not its comments or docstrings) can offer a rule."""

    words: str  # identifiers, string constants and resolved names, one per line
    strings: frozenset[str]  # string constants (docstrings too: a rule may match any string)
    names: frozenset[str]  # canonical qualified names of dotted names bound to imports
    spelled: frozenset[str]  # the same names as imported, before canonical() (tf.compat.v1...)
    imported_modules: frozenset[str]
    bindings: dict[str, str]  # local name -> qualified name, as NameResolver.bindings
    # The code's ``ast`` nodes, breadth first: for a rule's ``may_report`` that must look at how
    # a name is used. The engine drops them before libcst parses (``release``).
    nodes: list[ast.AST] = field(default_factory=list, compare=False, repr=False)
    _parents: dict[int, ast.AST] = field(default_factory=dict, compare=False, repr=False)

    def release(self) -> None:
        self.nodes.clear()
        self._parents.clear()

    def qualify(self, node: ast.AST) -> str | None:
        """``NameResolver.qualify`` on an ``ast`` expression: the canonical qualified name of a
        dotted name bound to an import, else None."""
        chain = _dotted(node) if isinstance(node, ast.expr) else None
        if chain is None:
            return None
        head, _, rest = chain.partition(".")
        bound = self.bindings.get(head)
        if bound is None:
            return None
        return canonical(f"{bound}.{rest}" if rest else bound)

    def parent(self, node: ast.AST) -> ast.AST | None:
        """The node holding ``node`` (the index is built on first use)."""
        if not self._parents and self.nodes:
            parents = self._parents
            for holder in self.nodes:
                for child in ast.iter_child_nodes(holder):
                    parents[id(child)] = holder
        return self._parents.get(id(node))

    def uses_any(self, roots: Iterable[str]) -> bool:
        """Same test as ``NameResolver.uses_any``."""
        roots = tuple(roots)
        return any(canonical(m).startswith(roots) for m in self.imported_modules)

    def has_name(self, qualified: str) -> bool:
        """A dotted name in the code resolves to ``qualified`` or to something inside it."""
        if qualified in self.names:
            return True
        prefix = qualified + "."
        return any(name.startswith(prefix) for name in self.names)

    def matches(self, trigger: Trigger) -> bool:
        """``trigger`` is a qualified name (``tensorflow.device``: a root module, then dots), a
        name prefix (``tensorflow.distribute*``, ``keras*``: some name, resolved as imported and
        not made canonical, starts with the text before the star, dot or not), a quoted string
        (``'VariableV2'``: a string constant equal to it), a keyword given a literal
        (``trainable=False``: a keyword argument or a dict literal's string key with that value),
        a word (a substring of an identifier, a string constant or a resolved name), a compiled
        pattern (searched in those words) or a tuple (all of them)."""
        if isinstance(trigger, tuple):
            return all(self.matches(part) for part in trigger)
        if isinstance(trigger, re.Pattern):
            return trigger.search(self.words) is not None
        if is_prefix(trigger):
            prefix = trigger[:-1]
            return any(name.startswith(prefix) for name in self.spelled)
        if is_qualified(trigger):
            return self.has_name(trigger)
        if is_quoted(trigger):
            return trigger[1:-1] in self.strings
        return trigger in self.words


def is_qualified(trigger: str) -> bool:
    return "." in trigger and trigger.split(".", 1)[0] in _TRACKED_ROOTS


def is_prefix(trigger: str) -> bool:
    return trigger.endswith("*") and trigger[:-1].split(".", 1)[0] in _TRACKED_ROOTS


def is_quoted(trigger: str) -> bool:
    return len(trigger) >= 2 and trigger[0] == trigger[-1] == "'"


def is_keyword_value(trigger: str) -> bool:
    return _KEYWORD_VALUE.fullmatch(trigger) is not None


def raw_needle(trigger: str) -> str:
    """What the raw-bytes pre-check looks for: a qualified name is spelled with its last part
    (``tf.device``, ``from tensorflow import device as d``), a name prefix likewise, a quoted
    string without quotes (it may be written with either), a keyword's value by the keyword
    (spaces may surround the ``=``), a word as it is."""
    if is_keyword_value(trigger):
        return trigger.split("=", 1)[0]
    if is_prefix(trigger):
        return trigger[:-1].rsplit(".", 1)[-1]
    if is_qualified(trigger):
        return trigger.rsplit(".", 1)[-1]
    return trigger[1:-1] if is_quoted(trigger) else trigger


def raw_matches(trigger: Trigger, raw: bytes) -> bool:
    """The cheap test on the file's bytes, before any parse: could ``trigger`` match at all."""
    if isinstance(trigger, tuple):
        return all(raw_matches(part, raw) for part in trigger)
    if isinstance(trigger, re.Pattern):
        return _bytes_pattern(trigger).search(raw) is not None
    return raw_needle(trigger).encode() in raw


# id(a rule's triggers) -> (those triggers, each one's needles, all required): worked out once.
_NEEDLES: dict[int, tuple[object, tuple[tuple[bytes | re.Pattern[bytes], ...], ...]]] = {}


def raw_possible(
    triggers: tuple[Trigger, ...], raw: bytes, found: dict[object, bool] | None = None
) -> bool:
    """``any(raw_matches(t, raw) for t in triggers)``, with the needles of a rule's triggers
    worked out once per process rather than once per file; ``found`` remembers which needles
    ``raw`` holds, for the next rule's triggers (many share one: ``device``)."""
    entry = _NEEDLES.get(id(triggers))
    if entry is None or entry[0] is not triggers:
        entry = _NEEDLES[id(triggers)] = (triggers, tuple(_needles(t) for t in triggers))
    if found is None:
        found = {}
    for needles in entry[1]:
        for needle in needles:
            held = found.get(needle)
            if held is None:
                if isinstance(needle, bytes):
                    held = found[needle] = needle in raw
                else:
                    held = found[needle] = needle.search(raw) is not None
            if not held:
                break
        else:
            return True
    return False


def _needles(trigger: Trigger) -> tuple[bytes | re.Pattern[bytes], ...]:
    if isinstance(trigger, tuple):
        return tuple(needle for part in trigger for needle in _needles(part))
    if isinstance(trigger, re.Pattern):
        return (_bytes_pattern(trigger),)
    return (raw_needle(trigger).encode(),)


@lru_cache(maxsize=64)
def _bytes_pattern(pattern: re.Pattern[str]) -> re.Pattern[bytes]:
    return re.compile(pattern.pattern.encode(), pattern.flags & ~re.UNICODE)


def code_facts(source: str | bytes, inherited: dict[str, str] | None = None) -> CodeFacts | None:
    """The facts of ``source``, or None when ``ast`` cannot read it (the full path decides)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    bindings: dict[str, str] = dict(inherited or {})
    imported: set[str] = set((inherited or {}).values())
    from_names: set[str] = set()  # ``module.name`` of every from-import, even a rebound one
    _collect_bindings(tree.body, bindings, imported, from_names)

    words: list[str] = []
    strings: set[str] = set()
    chains: set[str] = set()
    docstrings: set[int] = set()
    loops: list[ast.For | ast.AsyncFor] = []
    adds = False
    nodes = _nodes(tree)
    # Dispatched on the exact class once per node (this loop is most of the pass); mypy cannot
    # narrow ``node`` through ``kind``, so the branches read it untyped.
    node: Any
    for node in nodes:
        kind = type(node)
        if kind is ast.Name:
            words.append(node.id)
            chains.add(node.id)
        elif kind is ast.Attribute:
            words.append(node.attr)
            chain = _dotted(node)
            if chain is not None:
                chains.add(chain)
        elif kind is ast.Constant:
            value = node.value
            if isinstance(value, str):
                strings.add(value)
                if id(node) not in docstrings:
                    words.append(value)
            elif isinstance(value, bytes):
                words.append(value.decode("latin-1"))
        elif kind is ast.Expr:
            value = node.value
            if type(value) is ast.Constant and isinstance(value.value, str):
                docstrings.add(id(value))  # a bare string statement: documentation
        elif kind is ast.keyword:
            if node.arg is not None:
                words.append(node.arg)
                value = node.value
                if type(value) is ast.Constant and type(value.value) is bool:
                    words.append(f"{node.arg}={value.value}")
        elif kind is ast.Dict:
            for key, value in zip(node.keys, node.values, strict=True):
                if (
                    type(key) is ast.Constant
                    and type(value) is ast.Constant
                    and type(key.value) is str
                    and type(value.value) is bool
                ):
                    words.append(f"{key.value}={value.value}")  # {'trainable': False}
        elif kind is ast.arg:
            words.append(node.arg)
        elif kind in (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef):
            words.append(node.name)
        elif kind is ast.alias:
            words.append(node.name)
            if node.asname:
                words.append(node.asname)
        elif kind is ast.ImportFrom:
            if node.module:
                words.append(node.module)
        elif kind in (ast.Global, ast.Nonlocal):
            words.extend(node.names)
            chains.update(node.names)
        elif kind is ast.AugAssign:
            adds = adds or type(node.op) is ast.Add
        elif kind in (ast.For, ast.AsyncFor):
            loops.append(node)
        elif kind is ast.ExceptHandler:
            if node.name:
                words.append(node.name)

    spelled: set[str] = imported | from_names
    spelled.update(bindings.values())
    for chain in chains:
        head, _, rest = chain.partition(".")
        bound = bindings.get(head)
        if bound is not None:
            spelled.add(f"{bound}.{rest}" if rest else bound)
    names = {canonical(name) for name in spelled}
    if adds and any(_sums_its_items(loop) for loop in loops):
        words.append(LOOP_SUM)
    words.extend(names)
    words.extend(bindings.values())
    return CodeFacts(
        "\n".join(words),
        frozenset(strings),
        frozenset(names),
        frozenset(spelled),
        frozenset(imported),
        bindings,
        nodes,
    )


def _nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node under ``tree`` in ``ast.walk``'s order (breadth first), without its generators:
    the walk was half of this pass's time. Expression contexts (Load, Store) are left out."""
    nodes = [tree]
    append = nodes.append
    for node in nodes:  # grows while it is read: breadth first
        for name in node._fields:
            if name == "ctx":
                continue
            value = getattr(node, name, None)
            if type(value) is list:
                for item in value:
                    if isinstance(item, ast.AST):
                        append(item)
            elif isinstance(value, ast.AST):
                append(value)
    return nodes


def argument(call: ast.Call, index: int | None, keyword: str) -> ast.expr | None:
    """``_towers.get_arg`` on an ``ast`` call: by keyword, else at a positional index (starred
    arguments left out)."""
    for item in call.keywords:
        if item.arg == keyword:
            return item.value
    if index is None:
        return None
    positional = [a for a in call.args if type(a) is not ast.Starred]
    return positional[index] if index < len(positional) else None


def possible_rules(
    facts: CodeFacts, rules: Iterable[type[Rule]], path: PurePosixPath | None = None
) -> tuple[type[Rule], ...]:
    """The rules that could report in a source with these facts; with ``path``, also asking
    each rule whose triggers matched (``Rule.may_report``: what other files tell)."""
    return tuple(
        rule
        for rule in rules
        if (rule.triggers is None or any(facts.matches(t) for t in rule.triggers))
        and (path is None or rule.may_report(path, facts))
    )


def _sums_its_items(loop: ast.For | ast.AsyncFor) -> bool:
    """Some ``x += y`` inside ``loop`` adds a name the loop's target binds."""
    bound = names_in(loop.target)
    for statement in (*loop.body, *loop.orelse):
        for node in ast.walk(statement):
            if (
                type(node) is ast.AugAssign
                and type(node.op) is ast.Add
                and not bound.isdisjoint(names_in(node.value))
            ):
                return True
    return False


# The nodes that open a scope of their own: a walk up from a node stops at the first one.
AST_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def names_in(node: ast.AST) -> set[str]:
    """Every identifier spelled in ``node``, as libcst's ``Name`` nodes would hold them."""
    found: set[str] = set()
    inner: Any  # dispatched on ``kind``, as in code_facts
    for inner in ast.walk(node):
        kind = type(inner)
        if kind is ast.Name:
            found.add(inner.id)
        elif kind is ast.Attribute:
            found.add(inner.attr)
        elif kind in (ast.arg, ast.keyword) and inner.arg:
            found.add(inner.arg)
    return found


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while type(node) is ast.Attribute:
        parts.append(node.attr)
        node = node.value
    if type(node) is not ast.Name:
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _collect_bindings(
    body: list[ast.stmt], bindings: dict[str, str], imported: set[str], from_names: set[str]
) -> None:
    """NameResolver's bindings, statement by statement in source order (later imports win,
    assignment aliases keep the first binding), which is what makes the two agree."""
    for statement in body:
        if type(statement) is ast.Import:
            for alias in statement.names:
                imported.add(alias.name)
                if alias.asname:
                    bindings[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    bindings.setdefault(head, head)
        elif type(statement) is ast.ImportFrom:
            module = statement.module
            if statement.level or module is None:
                continue  # relative imports name the user's own modules
            imported.add(module)
            for alias in statement.names:
                if alias.name == "*":
                    break
                bindings[alias.asname or alias.name] = f"{module}.{alias.name}"
                from_names.add(f"{module}.{alias.name}")
        elif type(statement) is ast.Assign:
            targets = statement.targets
            if len(targets) == 1 and type(targets[0]) is ast.Name:
                chain = _dotted(statement.value)
                if chain is not None:
                    head, _, rest = chain.partition(".")
                    bound = bindings.get(head)
                    if bound is not None:
                        resolved = f"{bound}.{rest}" if rest else bound
                        if resolved.split(".")[0] in _TRACKED_ROOTS:
                            bindings.setdefault(targets[0].id, resolved)
        else:
            for field_name in _BODY_FIELDS:
                children = getattr(statement, field_name, None)
                if children:
                    if field_name in ("handlers", "cases"):
                        for child in children:
                            _collect_bindings(child.body, bindings, imported, from_names)
                    else:
                        _collect_bindings(children, bindings, imported, from_names)
