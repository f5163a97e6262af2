"""A graph the TF1 session ran apart from the train step -- a sampling or prediction graph built
from the step's placeholders, fetched by its own ``sess.run(graph, feed_dict={placeholder:
value})`` -- becomes a ``@tf.function`` of what each run fed, and each run a call of it.

TF1 computed the fetched value from the fed placeholders through every op between them: the
function holds the statements the value needs from its placeholders on (the same model code the
replica function runs, its variables shared by name through the TF1Variables store) and returns
the value; ``sess.run`` gave the value as a NumPy array, so the call gives ``.numpy()`` of it.
The plan finds such graphs (``find``); the emit stage writes them (``function_def``, ``RunCall``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import libcst as cst
from libcst.helpers import parse_template_expression

from tfmigrate import tree
from tfmigrate.rules._towers import bound_names, free_names, get_arg, method_name

# Values whose run gives a structure of arrays, not one array (``.numpy()`` does not apply).
_STRUCTURES = (cst.Dict, cst.List, cst.Tuple, cst.Set, cst.ListComp, cst.DictComp, cst.SetComp)


@dataclass(frozen=True)
class GraphFunction:
    """The fetched graph's name (now the function's), the placeholders its runs feed (its
    parameters, in the program's order), the statements it needs from them on (as written, in
    order) and the statement that made it."""

    name: str
    params: tuple[str, ...]
    body: tuple[cst.SimpleStatementLine, ...]
    made: cst.SimpleStatementLine


def find(
    statement: cst.SimpleStatementLine,
    earlier: Sequence[cst.SimpleStatementLine],
    movable: Callable[[cst.SimpleStatementLine], bool],
    placeholders: Sequence[str],
    scope: cst.CSTNode,
) -> GraphFunction | None:
    """``statement`` (``name = <graph>``) as a graph function, or None. ``earlier`` are the
    per-step graph's statements before it, ``movable`` says which of them can be repeated in the
    function (model code the replica function runs), ``placeholders`` the per-step placeholders
    in order. Every read of ``name`` in ``scope`` must be the fetch of a run whose feed gives
    exactly the placeholders the graph depends on (anything else the session did with it has no
    function form)."""
    small = statement.body[0] if len(statement.body) == 1 else None
    if not (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name)
        and not isinstance(small.value, _STRUCTURES)
    ):
        return None
    name = small.targets[0].target.value
    body: list[cst.SimpleStatementLine] = []
    needed = free_names(small.value)
    for candidate in reversed(earlier):
        if bound_names(candidate) & needed:
            if not movable(candidate):
                return None
            body.insert(0, candidate)
            needed |= free_names(candidate)
    params = tuple(p for p in placeholders if p in needed)
    if not params:
        return None  # no placeholder: the graph reads a batch the session took, or nothing fed
    runs = fetch_runs(scope, name, statement)
    if not runs or any(run_feed(run) != set(params) for run in runs):
        return None
    return GraphFunction(name, params, tuple(body), statement)


def fetch_runs(scope: cst.CSTNode, name: str, made: cst.CSTNode) -> list[cst.Call] | None:
    """The ``x.run(name, ...)`` calls in ``scope`` fetching ``name`` alone; None when ``name``
    is read any other way (or bound again, outside ``made``)."""
    runs: list[cst.Call] = []
    fetched: set[int] = set()
    for node in tree.walk(scope):
        if isinstance(node, cst.Call) and method_name(node) == "run":
            fetches = get_arg(node, 0, "fetches")
            if isinstance(fetches, cst.Name) and fetches.value == name:
                runs.append(node)
                fetched.add(id(fetches))
    inside = {id(n) for n in tree.walk(made)}
    for node in tree.walk(scope):  # attribute and keyword names are not reads
        if isinstance(node, cst.Attribute):
            fetched.add(id(node.attr))
        elif isinstance(node, cst.Arg) and node.keyword is not None:
            fetched.add(id(node.keyword))
    for node in tree.walk(scope):
        if isinstance(node, cst.Name) and node.value == name and id(node) not in fetched:
            if id(node) not in inside:
                return None
        if isinstance(node, cst.Param) and node.name.value == name:
            return None  # a parameter of that name: another value
    return runs


def run_feed(run: cst.Call) -> set[str] | None:
    """The placeholder names a run feeds (``feed_dict={p: v, ...}``); None for any other feed."""
    feed = get_arg(run, 1, "feed_dict")
    if not isinstance(feed, cst.Dict):
        return None
    keys = set()
    for element in feed.elements:
        if not isinstance(element, cst.DictElement) or not isinstance(element.key, cst.Name):
            return None
        keys.add(element.key.value)
    return keys


def function_def(
    function: GraphFunction,
    decorator: cst.BaseExpression,
    visited: Callable[[cst.SimpleStatementLine], cst.BaseStatement],
) -> cst.FunctionDef:
    """``@tf.function def name(params): with tf1_variables.scope(): <body>; return <graph>``
    in the place of the statement that made the graph (its comments above it)."""
    made = function.made
    small = made.body[0]
    assert isinstance(small, cst.Assign)
    lines: list[cst.BaseStatement] = [
        visited(s).with_changes(leading_lines=[]) for s in function.body
    ]
    returned = visited(made.with_changes(body=[cst.Return(small.value)], leading_lines=[]))
    lines.append(returned)
    scoped = cst.With(
        items=[cst.WithItem(cst.parse_expression("tf1_variables.scope()"))],
        body=cst.IndentedBlock(body=lines),
    )
    fed = ", ".join(f"`{p}`" for p in function.params)
    why = [
        cst.EmptyLine(
            comment=cst.Comment(
                f"# The session ran `{function.name}` apart from the train step, fed {fed}:"
            )
        ),
        cst.EmptyLine(
            comment=cst.Comment(
                "# a tf.function of what it was fed (the model's variables shared by name)."
            )
        ),
    ]
    leading = list(made.leading_lines)
    if not leading or leading[0].comment is not None:
        leading.insert(0, cst.EmptyLine(indent=False))
    return cst.FunctionDef(
        name=cst.Name(function.name),
        params=cst.Parameters(params=[cst.Param(cst.Name(p)) for p in function.params]),
        body=cst.IndentedBlock(body=[scoped]),
        decorators=[cst.Decorator(decorator)],
        leading_lines=[*leading, *why],
    )


def signature(
    params: Sequence[str],
    specs: dict[str, tuple[cst.BaseExpression, cst.BaseExpression | None]],
) -> cst.BaseExpression:
    """``tf.function``, with the placeholders' dtypes and shapes as its input signature when
    every parameter was one with a dtype (the fed value is converted as feed_dict did)."""
    if not params or not set(params) <= set(specs):
        return cst.parse_expression("tf.function")
    elements = []
    for name in params:
        dtype, shape = specs[name]
        elements.append(
            cst.Element(
                parse_template_expression(
                    "tf.TensorSpec({shape}, {dtype})",
                    shape=shape if shape is not None else cst.Name("None"),
                    dtype=dtype,
                )
            )
        )
    return parse_template_expression(
        "tf.function(input_signature={specs})", specs=cst.List(elements)
    )


class RunCall(cst.CSTTransformer):
    """``sess.run(name, feed_dict={p: v})`` -> ``name(p=v).numpy()`` for the graph functions'
    runs (the value sess.run gave: an array)."""

    def __init__(self, functions: dict[str, GraphFunction]) -> None:
        self.functions = functions

    def leave_Call(self, original_node, updated_node):
        if method_name(original_node) != "run":
            return updated_node
        fetches = get_arg(original_node, 0, "fetches")
        if not isinstance(fetches, cst.Name) or fetches.value not in self.functions:
            return updated_node
        feed = get_arg(updated_node, 1, "feed_dict")
        assert isinstance(feed, cst.Dict)
        given = {
            e.key.value: e.value
            for e in feed.elements
            if isinstance(e, cst.DictElement) and isinstance(e.key, cst.Name)
        }
        function = self.functions[fetches.value]
        equal = cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        )
        call = cst.Call(
            cst.Name(function.name),
            [cst.Arg(given[p], keyword=cst.Name(p), equal=equal) for p in function.params],
        )
        return cst.Call(cst.Attribute(call, cst.Name("numpy")))
