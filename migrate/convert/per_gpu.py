"""Placeholders made once per GPU and kept in lists: ``points_phs.append(tf.placeholder(...))``
in the tower loop, or a method of the model the towers call that appends them to the model's
own lists (``model.create_placeholders()`` then ``model.inputs_pl_list[i]``).

Each such list becomes one train step parameter holding every tower's value in tower order:
replica i reads it at its index, as tower i read its own placeholder (``points_phs[-1]`` right
after the append is ``points_phs[i]``). The feed that gave each tower its value gives the list:
a feed dict keyed ``points_phs[0]``, ``points_phs[1]``... becomes ``points_phs=[v0, v1]``, and a
loop over the GPUs that keys ``feed[points_phs[i]] = value`` appends each value to a list named
after it instead. The plan reads these shapes here; ``plan`` decides and ``emit`` writes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import libcst as cst

from tfmigrate import tree
from tfmigrate.convert.project import Project, SourceFile
from tfmigrate.rules._towers import get_arg

_PLACEHOLDERS = frozenset(
    {
        "tensorflow.placeholder",
        "tensorflow.placeholder_with_default",
        "tensorflow.compat.v1.placeholder",
        "tensorflow.compat.v1.placeholder_with_default",
    }
)
_SPARSE = frozenset({"tensorflow.SparseTensor", "tensorflow.compat.v1.SparseTensor"})
_DTYPES = frozenset(
    {
        "float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
        "uint8", "uint16", "uint32", "uint64", "bool", "string", "complex64", "complex128",
    }
)  # fmt: skip
Qualify = Callable[[cst.BaseExpression], str | None]
# what a placeholder list holds: ``dense`` (``static`` when its shape is fully given) or
# ``sparse`` (a SparseTensor of three), with the placeholders' dtypes as ``tf.x`` when all are
# written out (else none)
Made = tuple[str, tuple[str, ...]]


@dataclass
class PerGpuLists:
    """The per-GPU placeholder lists of one tower loop: each list as the program spells it
    (``points_phs``, ``model.inputs_pl_list``) -> the train step's parameter for it; the ids of
    the tower statements that made the placeholders (they go: the step is given the values);
    the lists whose placeholders make a ``tf.SparseTensor`` (fed sparse values)."""

    params: dict[str, str] = field(default_factory=dict)
    makers: set[int] = field(default_factory=set)
    sparse: set[str] = field(default_factory=set)
    dtypes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # list -> its dtypes
    # the lists whose values change shape from step to step (a dimension None, no shape, or
    # sparse): the train step generalizes its trace instead of tracing each new shape
    dynamic: set[str] = field(default_factory=set)


def written(node: cst.CSTNode) -> str | None:
    """``points_phs`` or ``model.inputs_pl_list`` (a name, or attributes of a name)."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = written(node.value)
        return f"{head}.{node.attr.value}" if head is not None else None
    return None


def _is_placeholder(node: cst.BaseExpression, qualify: Qualify) -> bool:
    return isinstance(node, cst.Call) and qualify(node.func) in _PLACEHOLDERS


def _dtype(call: cst.BaseExpression, qualify: Qualify) -> str | None:
    """``tf.float32`` for ``tf.placeholder(tf.float32, ...)``; None when the dtype is not a
    TensorFlow dtype written out (a variable, or a placeholder_with_default's default)."""
    if not isinstance(call, cst.Call) or "default" in (qualify(call.func) or ""):
        return None
    dtype = get_arg(call, 0, "dtype")
    name = qualify(dtype) if dtype is not None else None
    if name is None or not name.startswith("tensorflow."):
        return None
    last = name.rsplit(".", 1)[-1]
    return f"tf.{last}" if last in _DTYPES else None


def _static_shape(call: cst.BaseExpression) -> bool:
    """A placeholder whose shape is written out with no ``None`` in it."""
    if not isinstance(call, cst.Call):
        return False
    shape = get_arg(call, 1, "shape")
    if not isinstance(shape, cst.List | cst.Tuple):
        return False
    return not any(isinstance(e.value, cst.Name) and e.value.value == "None" for e in shape.elements)


def _made_input(node: cst.BaseExpression, qualify: Qualify) -> Made | None:
    """A placeholder (``dense``) or a ``tf.SparseTensor`` of (indices, values, shape)
    placeholders (``sparse``), with the dtypes when all are written out; else None."""
    if _is_placeholder(node, qualify):
        dtype = _dtype(node, qualify)
        kind = "static" if _static_shape(node) else "dense"
        return kind, (dtype,) if dtype is not None else ()
    if (
        isinstance(node, cst.Call)
        and qualify(node.func) in _SPARSE
        and len(node.args) == 3
        and all(_is_placeholder(a.value, qualify) for a in node.args)
    ):
        dtypes = tuple(d for a in node.args if (d := _dtype(a.value, qualify)) is not None)
        return "sparse", dtypes if len(dtypes) == 3 else ()
    return None


def _expression_call(statement: cst.BaseStatement) -> cst.Call | None:
    if (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, cst.Call)
    ):
        return statement.body[0].value
    return None


def appended_input(statement: cst.BaseStatement, qualify: Qualify) -> tuple[str, Made] | None:
    """(the list, what it holds) of ``L.append(tf.placeholder(...))``."""
    call = _expression_call(statement)
    if (
        call is None
        or not isinstance(call.func, cst.Attribute)
        or call.func.attr.value != "append"
        or len(call.args) != 1
    ):
        return None
    target = written(call.func.value)
    kind = _made_input(call.args[0].value, qualify)
    return (target, kind) if target is not None and kind is not None else None


def _docstring(statement: cst.BaseStatement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, cst.SimpleString | cst.ConcatenatedString)
    )


def maker_method(sources: Iterable[SourceFile], method: str) -> dict[str, Made] | None:
    """The lists a method named ``method`` of a class in ``sources`` appends placeholders to
    (``self.inputs_pl_list.append(tf.placeholder(...))``), attribute -> what it holds, when its whole body does only that and no other class there has a method of that name
    (besides abstract ones, which only raise: a base class's)."""
    found: list[dict[str, Made]] = []
    for source in sources:
        for statement in source.module.body:
            if not isinstance(statement, cst.ClassDef):
                continue
            for member in statement.body.body:
                if not (isinstance(member, cst.FunctionDef) and member.name.value == method):
                    continue
                body = member.body.body if isinstance(member.body, cst.IndentedBlock) else []
                code = [s for s in body if not _docstring(s)]
                if len(code) == 1 and isinstance(code[0], cst.SimpleStatementLine) and isinstance(
                    code[0].body[0], cst.Raise | cst.Pass
                ):
                    continue  # abstract: the subclass's method is the one called
                lists: dict[str, Made] = {}
                for inner in body:
                    if _docstring(inner):
                        continue
                    made = appended_input(inner, source.qualify)
                    if made is None or not made[0].startswith("self."):
                        lists = {}
                        break
                    lists[made[0][len("self.") :]] = made[1]
                found.append(lists)
    if len(found) != 1 or not found[0]:
        return None
    return found[0]


def tower_lists(
    source: SourceFile, tower: Sequence[cst.BaseStatement], qualify: Qualify
) -> PerGpuLists:
    """The per-GPU placeholder lists the tower statements ``tower`` fill, with their makers."""
    found = PerGpuLists()
    project = source.shared.get("project")
    sources: list[SourceFile] = [source]
    if isinstance(project, Project):
        sources = project.closure(source)
    for statement in tower:
        made = appended_input(statement, qualify)
        if made is not None and made[0].split(".")[0] != "self":
            found.params.setdefault(made[0], made[0].split(".")[-1])
            found.makers.add(id(statement))
            found.dtypes[made[0]] = made[1][1]
            if made[1][0] == "sparse":
                found.sparse.add(made[0])
            if made[1][0] != "static":
                found.dynamic.add(made[0])
            continue
        call = _expression_call(statement)
        if (
            call is not None
            and isinstance(call.func, cst.Attribute)
            and isinstance(call.func.value, cst.Name)
            and call.func.value.value != "self"
            and not call.args
        ):
            lists = maker_method(sources, call.func.attr.value)
            if lists is None:
                continue
            owner = call.func.value.value
            for attribute, (kind, dtypes) in lists.items():
                key = f"{owner}.{attribute}"
                found.params.setdefault(key, attribute)
                found.dtypes[key] = dtypes
                if kind == "sparse":
                    found.sparse.add(key)
                if kind != "static":
                    found.dynamic.add(key)
            found.makers.add(id(statement))
    return found


def per_gpu_key(
    key: cst.BaseExpression, lists: dict[str, str]
) -> tuple[str, cst.BaseExpression] | None:
    """(the list, the index) of a feed key ``L[index]`` of one of ``lists``."""
    if not isinstance(key, cst.Subscript) or len(key.slice) != 1:
        return None
    index = key.slice[0].slice
    target = written(key.value)
    if target is None or target not in lists or not isinstance(index, cst.Index):
        return None
    return target, index.value


def keyed(
    statement: cst.BaseStatement, feed: str
) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """(key, value) of ``feed[key] = value``."""
    if not (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Assign)
        and len(statement.body[0].targets) == 1
    ):
        return None
    target = statement.body[0].targets[0].target
    if (
        isinstance(target, cst.Subscript)
        and isinstance(target.value, cst.Name)
        and target.value.value == feed
        and len(target.slice) == 1
        and isinstance(target.slice[0].slice, cst.Index)
    ):
        return target.slice[0].slice.value, statement.body[0].value
    return None


def constant_index(node: cst.BaseExpression) -> int | None:
    if isinstance(node, cst.Integer):
        return int(node.value)
    return None


def literal_lists(
    feed: cst.Dict, lists: dict[str, str]
) -> tuple[list[cst.DictElement], dict[str, cst.List]] | None:
    """A feed dict literal keyed by per-GPU lists at constant indices (``points_phs[0]: a,
    points_phs[1]: b``): its other elements, and each list's values in tower order (None when
    a list's indices are not 0..n-1)."""
    rest: list[cst.DictElement] = []
    by_list: dict[str, dict[int, cst.BaseExpression]] = {}
    for element in feed.elements:
        if not isinstance(element, cst.DictElement):
            return None
        found = per_gpu_key(element.key, lists)
        if found is None:
            rest.append(element)
            continue
        index = constant_index(found[1])
        if index is None:
            return None
        by_list.setdefault(found[0], {})[index] = element.value
    values: dict[str, cst.List] = {}
    for name, indexed in by_list.items():
        if sorted(indexed) != list(range(len(indexed))):
            return None
        values[name] = cst.List([cst.Element(indexed[k]) for k in sorted(indexed)])
    return rest, values


@dataclass
class BuiltFeed:
    """A feed dict built around loops over the GPUs: ``feed = {...}`` (``made``), then
    ``feed[x] = v`` (``direct``: their values are the step's arguments) and loops ``for i in
    range(n):`` keying ``feed[L[i]] = v`` (``appends``: statement id -> the list, whose values
    the loop now appends to a list of the same name) before the run that feeds it."""

    name: str
    made: cst.SimpleStatementLine
    elements: list[cst.DictElement]
    direct: list[cst.SimpleStatementLine]
    appends: dict[int, str]
    lists: list[str]  # the per-GPU lists the loops fill, in order


def _gpu_loop(
    statement: cst.BaseStatement, feed: str, lists: dict[str, str]
) -> dict[int, str] | None:
    """``for i in range(n):`` whose body keys ``feed[L[i]] = v`` for per-GPU lists (and binds
    plain values): statement id -> the list."""
    if not (
        isinstance(statement, cst.For)
        and isinstance(statement.target, cst.Name)
        and isinstance(statement.iter, cst.Call)
        and isinstance(statement.iter.func, cst.Name)
        and statement.iter.func.value == "range"
        and len(statement.iter.args) == 1
        and statement.orelse is None
        and isinstance(statement.body, cst.IndentedBlock)
    ):
        return None
    index = statement.target.value
    found: dict[int, str] = {}
    for inner in statement.body.body:
        pair = keyed(inner, feed)
        if pair is None:
            if not isinstance(inner, cst.SimpleStatementLine) or _reads_feed(inner, feed):
                return None
            continue  # `lo = start + i * batch`: plain values the keyed values read
        target = per_gpu_key(pair[0], lists)
        if target is None or not (isinstance(target[1], cst.Name) and target[1].value == index):
            return None
        found[id(inner)] = target[0]
    return found or None


def _reads_feed(node: cst.CSTNode, feed: str) -> bool:
    return any(isinstance(n, cst.Name) and n.value == feed for n in tree.walk(node))


def built_feed(
    block: Sequence[cst.BaseStatement],
    run_statement: cst.BaseStatement,
    feed: str,
    lists: dict[str, str],
) -> BuiltFeed | None:
    """The feed ``feed`` built in ``block`` before ``run_statement`` with loops over the GPUs
    (None when it is not built that way)."""
    if run_statement not in block:
        return None
    direct: list[cst.SimpleStatementLine] = []
    appends: dict[int, str] = {}
    for sibling in reversed(list(block[: list(block).index(run_statement)])):
        pair = keyed(sibling, feed)
        if pair is not None and per_gpu_key(pair[0], lists) is None:
            assert isinstance(sibling, cst.SimpleStatementLine)
            direct.insert(0, sibling)
            continue
        loop = _gpu_loop(sibling, feed, lists)
        if loop is not None:
            if set(loop.values()) & set(appends.values()):
                return None  # two loops key one list: which tower is which is not plain
            appends.update(loop)
            continue
        if (
            isinstance(sibling, cst.SimpleStatementLine)
            and len(sibling.body) == 1
            and isinstance(sibling.body[0], cst.Assign)
            and len(sibling.body[0].targets) == 1
            and isinstance(sibling.body[0].targets[0].target, cst.Name)
            and sibling.body[0].targets[0].target.value == feed
            and isinstance(sibling.body[0].value, cst.Dict)
            and appends
        ):
            elements = [e for e in sibling.body[0].value.elements if isinstance(e, cst.DictElement)]
            if len(elements) != len(sibling.body[0].value.elements):
                return None
            for statement in direct:
                pair = keyed(statement, feed)
                assert pair is not None
                elements.append(cst.DictElement(pair[0], pair[1]))
            ordered = list(dict.fromkeys(appends.values()))
            return BuiltFeed(feed, sibling, elements, direct, appends, ordered)
        if isinstance(sibling, cst.SimpleStatementLine) and not _reads_feed(sibling, feed):
            continue  # `lo = start * batch`: plain values the keys read
        return None
    return None


def singular(name: str) -> str:
    """The replica's name for its own value of a list: ``points_phs`` -> ``points_ph``,
    ``inputs_pl_list`` -> ``inputs_pl``."""
    for suffix in ("_list", "_lst"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    if name.endswith("s") and not name.endswith("ss") and len(name) > 1:
        return name[:-1]
    return f"{name}_value"


def read_as_own(
    tower: Sequence[cst.BaseStatement], listed: str, index: str, found: PerGpuLists
) -> bool:
    """Whether the towers read the list ``listed`` only at their own place: ``L[-1]`` (after
    their append) or ``L[index]`` -- besides the statements that make its placeholders."""
    for statement in tower:
        if id(statement) in found.makers or not isinstance(statement, cst.SimpleStatementLine):
            continue  # compound statements: their inner statements are in ``tower`` too
        for node in tree.walk(statement):
            if isinstance(node, cst.Subscript) and written(node.value) == listed:
                if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
                    return False
                at = node.slice[0].slice.value
                own = isinstance(at, cst.Name) and at.value == index
                last = (
                    isinstance(at, cst.UnaryOperation)
                    and isinstance(at.operator, cst.Minus)
                    and isinstance(at.expression, cst.Integer)
                    and at.expression.value == "1"
                )
                if not (own or last):
                    return False
        # any other use of the list (its length, the list itself) reads every tower's
        uses = sum(
            1
            for node in tree.walk(statement)
            if (isinstance(node, cst.Name | cst.Attribute) and written(node) == listed)
        )
        subscripts = sum(
            1
            for node in tree.walk(statement)
            if isinstance(node, cst.Subscript) and written(node.value) == listed
        )
        if uses > subscripts:
            return False
    return True
