"""tfmigrate.tree walks libcst trees without rebuilding them: the same nodes, in the same order,
with the same callbacks as libcst's own ``children`` / ``visit`` / ``visit_batched``.

Checked node by node on every fixture and on a sample of TensorFlow's and tf_slim's sources
(every node class they contain), and on visitors that skip subtrees or need per-attribute hooks.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import libcst as cst
import pytest

from tfmigrate import tree

REPO = Path(__file__).resolve().parents[1]


def _sources() -> list[Path]:
    paths = sorted(p for p in (REPO / "fixtures").rglob("*.py"))
    for package, sub in (("tf_slim", ""), ("tensorflow", "python")):
        spec = importlib.util.find_spec(package)  # finds the package without importing it
        if spec is not None and spec.submodule_search_locations:
            root = Path(next(iter(spec.submodule_search_locations))) / sub
            pool = sorted(p for p in root.rglob("*.py") if 2_000 < p.stat().st_size < 15_000)
            paths += pool[:: max(1, len(pool) // 8)][:8]
    return paths


def _modules() -> list[tuple[str, cst.Module]]:
    modules = []
    for path in _sources():
        try:
            modules.append((path.name, cst.parse_module(path.read_bytes())))
        except cst.ParserSyntaxError:
            continue  # the fixtures' deliberately broken files
    return modules


MODULES = _modules()


class _Recorder(cst.CSTVisitor):
    """Records every callback; skips the bodies of functions (visit_FunctionDef -> False)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, int]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.events.append(("visit", id(node)))
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.events.append(("leave", id(original_node)))
        super().on_leave(original_node)


class _Skipping(cst.CSTVisitor):
    """The common shape: plain visit_/leave_ methods, one of them cutting a subtree off."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, int]] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.events.append(("def", id(node)))
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.events.append(("name", id(node)))

    def leave_Call(self, original_node: cst.Call) -> None:
        self.events.append(("call", id(original_node)))


class _WithAttributeHook(_Skipping):
    def visit_Call_func(self, node: cst.Call) -> None:
        self.events.append(("func", id(node)))


class _Batch(cst.BatchableCSTVisitor):
    def __init__(self, tag: str, log: list[tuple[str, str, int]]) -> None:
        super().__init__()
        self.tag = tag
        self.log = log

    def visit_Call(self, node: cst.Call) -> None:
        self.log.append((self.tag, "call", id(node)))

    def visit_Name(self, node: cst.Name) -> None:
        self.log.append((self.tag, "name", id(node)))

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.log.append((self.tag, "def", id(original_node)))

    def leave_Module(self, original_node: cst.Module) -> None:
        self.log.append((self.tag, "module", id(original_node)))


def test_the_sample_is_broad():
    kinds = {type(node) for _, module in MODULES for node in tree.walk(module)}
    assert len(MODULES) >= 20 and len(kinds) >= 80


@pytest.mark.parametrize(("name", "module"), MODULES, ids=[n for n, _ in MODULES])
def test_children_walk_and_parents_match_libcst(name, module):
    recorder = _Recorder()
    module.visit(recorder)
    libcst_order = [node_id for event, node_id in recorder.events if event == "visit"]

    walked = list(tree.walk(module))
    assert [id(node) for node in walked] == libcst_order
    for node in walked:
        expected = node.children
        got = tree.children(node)
        assert len(got) == len(expected) and all(a is b for a, b in zip(got, expected, strict=True))

    stack: list[cst.CSTNode] = []
    libcst_parents: dict[int, cst.CSTNode] = {}

    class Parents(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if stack:
                libcst_parents[id(node)] = stack[-1]
            stack.append(node)
            return True

        def on_leave(self, original_node: cst.CSTNode) -> None:
            stack.pop()

    module.visit(Parents())
    fast_parents = tree.parents(module)
    assert fast_parents.keys() == libcst_parents.keys()
    assert all(fast_parents[key] is libcst_parents[key] for key in libcst_parents)


@pytest.mark.parametrize("visitor_class", [_Recorder, _Skipping, _WithAttributeHook])
def test_visit_gives_the_same_callbacks(visitor_class):
    for _, module in MODULES:
        ours, theirs = visitor_class(), visitor_class()
        tree.visit(module, ours)
        module.visit(theirs)
        assert ours.events == theirs.events
    assert any(event == "def" for event, _ in ours.events) or visitor_class is _Recorder


def test_visit_batched_gives_the_same_callbacks_in_visitor_order():
    for _, module in MODULES:
        ours: list[tuple[str, str, int]] = []
        theirs: list[tuple[str, str, int]] = []
        tree.visit_batched(module, [_Batch("a", ours), _Batch("b", ours)])
        cst.visit_batched(module, [_Batch("a", theirs), _Batch("b", theirs)])
        assert ours == theirs
        assert ours[-2:] == [("a", "module", id(module)), ("b", "module", id(module))]


def test_walk_can_stop_at_definitions():
    module = cst.parse_module("def f():\n    x = 1\ny = 2\n")
    names = [n.value for n in tree.walk(module, (cst.FunctionDef,)) if isinstance(n, cst.Name)]
    assert names == ["y"]  # the def itself is yielded, its name and body are not entered


def test_most_node_classes_get_a_compiled_reader():
    for _, module in MODULES:
        for node in tree.walk(module):
            tree.children(node)
    readers = {cls: tree._READERS[cls] for cls in tree._READERS}
    compiled = [cls for cls, reader in readers.items() if reader and reader.__name__ == "read"]
    assert len(compiled) >= 0.9 * len(readers)


def test_parse_without_node_checks_builds_the_same_tree_and_restores_them():
    for path in _sources()[:: max(1, len(_sources()) // 6)]:
        source = path.read_bytes()
        try:
            expected = cst.parse_module(source)
        except cst.ParserSyntaxError:
            with pytest.raises(cst.ParserSyntaxError):
                tree.parse_module(source)
            continue
        got = tree.parse_module(source)
        assert got.deep_equals(expected) and got.code == expected.code, path
    with pytest.raises(cst.CSTValidationError):  # nodes built afterwards are checked again
        cst.Name("not a name")
