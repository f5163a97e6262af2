"""Reading a whole TF1 tower training function into the parts the conversion rebuilds (TFM303).

Not a rule module. :func:`read_program` either returns a :class:`Program` -- every statement of
the training function assigned to a role -- or raises :class:`Blocked` naming the first
statement it cannot place. Nothing is guessed: a statement whose role is unclear blocks the
conversion, and the rule reports it instead of producing code that trains differently.

The shape read here (phase 1): one module-level training function holding, possibly inside
graph-only ``with`` blocks (``tf.Graph().as_default()``, a fixed ``tf.device``,
``tf.variable_scope(tf.get_variable_scope())``):
placeholders of the global batch, split per tower with ``tf.split``; a ``for`` tower loop whose
body builds one tower and appends ``opt.compute_gradients(loss)`` to a list; one aggregation
statement (a TFM102 helper call); ``opt.apply_gradients``; a ``tf.Session``, its variable
initializer, and a ``for`` step loop feeding the placeholders and fetching tower tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from tfmigrate.rules._towers import TowerRule, bound_names, free_names, get_arg, walk

GRAPH_CONTEXTS = frozenset({"tensorflow.Graph.as_default", "tensorflow.device"})
SESSIONS = frozenset({"tensorflow.Session", "tensorflow.InteractiveSession"})
INITIALIZERS = frozenset(
    {
        "tensorflow.global_variables_initializer",
        "tensorflow.initialize_all_variables",
        "tensorflow.local_variables_initializer",
    }
)


class Blocked(Exception):
    """The program has a shape the conversion does not handle (yet)."""

    def __init__(self, node: cst.CSTNode, reason: str) -> None:
        super().__init__(reason)
        self.node = node
        self.reason = reason


@dataclass
class Placeholder:
    name: str
    dtype: cst.BaseExpression
    shape: cst.BaseExpression


@dataclass
class Fetch:
    target: str | None  # the loop's variable receiving the value (None for `_`)
    tensor: str  # the tower-body name that was fetched


@dataclass
class Program:
    function: cst.FunctionDef
    python_setup: list[cst.BaseStatement]  # before the graph: plain Python, kept as is
    graph_setup: list[cst.BaseStatement]  # graph-building statements outside the towers
    placeholders: list[Placeholder]
    splits: dict[str, str]  # per-tower list name -> placeholder name
    tower_loop: cst.For
    tower_index: str
    tower_count: cst.BaseExpression
    tower_body: list[cst.BaseStatement]  # with the `grads` append already rewritten
    tower_withs: list[cst.WithItem]  # per-tower scopes kept around the body (name_scope)
    loss: cst.BaseExpression  # what the tower differentiated
    optimizer: str
    grads_name: str  # the aggregated gradients' name, now one replica's gradients
    averaged: bool
    apply: list[cst.BaseStatement]  # apply_gradients and what follows it before the session
    train_op: str
    step_loop: cst.For
    feed_statements: list[cst.BaseStatement]
    feed_values: dict[str, cst.BaseExpression]  # placeholder -> fed value
    run_statement: cst.SimpleStatementLine
    fetches: list[Fetch]
    helper: cst.FunctionDef | None  # the aggregation helper, dropped if nothing else uses it
    notes: list[str] = field(default_factory=list)


def _simple(statement: cst.CSTNode) -> cst.BaseSmallStatement | None:
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        return statement.body[0]
    return None


def _assign(statement: cst.CSTNode) -> tuple[list[str], cst.BaseExpression] | None:
    """``a = value`` / ``a, b = value`` -> (names, value)."""
    small = _simple(statement)
    if not isinstance(small, cst.Assign) or len(small.targets) != 1:
        return None
    target = small.targets[0].target
    if isinstance(target, cst.Name):
        return [target.value], small.value
    if isinstance(target, cst.Tuple) and all(isinstance(e.value, cst.Name) for e in target.elements):
        return [e.value.value for e in target.elements], small.value  # type: ignore[union-attr]
    return None


def _call_of(expr: cst.BaseExpression | None) -> cst.Call | None:
    return expr if isinstance(expr, cst.Call) else None


class ProgramReader:
    """Classifies the statements of the function that holds the tower loop."""

    def __init__(self, rule: TowerRule, aggregation: dict[int, bool]) -> None:
        self.rule = rule
        # id(helper def or aggregating statement) -> averaged?  (what TFM102 found)
        self.aggregation = aggregation

    def q(self, node: cst.BaseExpression) -> str | None:
        return self.rule.qualify(node)

    def call_q(self, node: cst.BaseExpression | None) -> str | None:
        call = _call_of(node)
        if call is None:
            return None
        if isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Call):
            # `tf.Graph().as_default()`
            inner = self.q(call.func.value.func)
            if inner is not None:
                return f"{inner}.{call.func.attr.value}"
        return self.q(call.func)

    # -- the function -------------------------------------------------------------------------
    def read(self, loop: cst.For) -> Program:
        function = self.rule.enclosing_def(loop)
        if function is None or self.rule.enclosing_def(function) is not None:
            raise Blocked(loop, "the tower loop is not inside a module-level training function")
        if self.rule.parent(function) is not self._module_body_parent(function):
            raise Blocked(function, "the training function is not defined at module level")
        python_setup: list[cst.BaseStatement] = []
        graph: list[cst.BaseStatement] = []
        in_graph = False
        statements = list(function.body.body)
        if function.get_docstring() is not None:
            statements = statements[1:]  # the new training function keeps it
        for statement in statements:
            flattened = self._flatten_graph_with(statement)
            if flattened is not None:
                in_graph = True
                graph.extend(flattened)
            elif in_graph:
                graph.append(statement)
            else:
                python_setup.append(statement)
        if not in_graph:
            # No graph block: every statement is graph-building code.
            graph, python_setup = python_setup, []
        return self._read_graph(function, loop, python_setup, graph)

    def _module_body_parent(self, function: cst.FunctionDef) -> cst.CSTNode:
        return self.rule.context.module

    def _flatten_graph_with(self, statement: cst.CSTNode) -> list[cst.BaseStatement] | None:
        """The body of a ``with`` that only sets up a graph (nested ones flattened), else None."""
        if not isinstance(statement, cst.With):
            return None
        for item in statement.items:
            name = self.call_q(item.item)
            if name not in GRAPH_CONTEXTS or item.asname is not None:
                return None
            if name == "tensorflow.device" and free_names(item.item) - {"tf", "tensorflow"}:
                return None  # a device that depends on something: not a fixed placement
        body: list[cst.BaseStatement] = []
        for inner in statement.body.body:  # type: ignore[union-attr]
            nested = self._flatten_graph_with(inner)
            body.extend(nested if nested is not None else [inner])
        return body

    def _read_graph(
        self,
        function: cst.FunctionDef,
        loop: cst.For,
        python_setup: list[cst.BaseStatement],
        graph: list[cst.BaseStatement],
    ) -> Program:
        placeholders: list[Placeholder] = []
        splits: dict[str, str] = {}
        setup: list[cst.BaseStatement] = []
        lists: set[str] = set()
        index = 0
        tower_statement = None
        while index < len(graph):
            statement = graph[index]
            if self._contains(statement, loop):
                tower_statement = statement
                break
            assigned = _assign(statement)
            name = self.call_q(assigned[1]) if assigned else None
            if assigned and name == "tensorflow.placeholder":
                placeholders.append(self._placeholder(statement, assigned))
            elif assigned and name == "tensorflow.split":
                source = get_arg(assigned[1], 0, "value")  # type: ignore[arg-type]
                if not isinstance(source, cst.Name) or source.value not in {
                    p.name for p in placeholders
                }:
                    raise Blocked(statement, "the split input is not a placeholder: only "
                                  "placeholder + feed_dict input is converted so far (tf.data, "
                                  "queues: later)")
                if len(assigned[0]) != 1:
                    raise Blocked(statement, "tf.split unpacked into names")
                splits[assigned[0][0]] = source.value
            elif assigned and isinstance(assigned[1], cst.List) and not assigned[1].elements:
                lists.update(assigned[0])  # `tower_grads = []`: kept unless it held the grads
                setup.append(statement)
            else:
                self._check_setup(statement, placeholders)
                setup.append(statement)
            index += 1
        if tower_statement is None:
            raise Blocked(loop, "the tower loop is nested in a statement the conversion cannot read")
        if not placeholders:
            per_tower = any(
                isinstance(n, cst.Call) and self.call_q(n) == "tensorflow.placeholder"
                for n in walk(loop)
            )
            raise Blocked(loop, "placeholders are created per tower inside the loop: only a "
                          "global-batch placeholder split with tf.split is converted so far"
                          if per_tower else "the input is not a tf.placeholder fed with "
                          "feed_dict: queue and tf.data input are not converted yet")
        if tower_statement is not loop and not self._is_reuse_scope(tower_statement, loop):
            raise Blocked(tower_statement, "the tower loop sits inside an unsupported block")
        tower = self._read_tower(loop, splits, lists)
        setup = [s for s in setup if _assign(s) is None or _assign(s)[0] != [tower["list"]]]
        for statement in tower["body"]:
            for node in walk(statement):
                if (
                    isinstance(node, cst.Call)
                    and isinstance(node.func, cst.Attribute)
                    and isinstance(node.func.value, cst.Name)
                    and node.func.value.value in lists
                ):
                    raise Blocked(statement, f"the towers also collect `{node.func.value.value}`"
                                  " (only the gradient list is converted so far)")
        rest = graph[index + 1 :]
        return self._read_tail(
            function, loop, python_setup, setup, placeholders, splits, tower, rest
        )

    def _contains(self, statement: cst.CSTNode, node: cst.CSTNode) -> bool:
        return statement is node or any(a is statement for a in self.rule.ancestors(node))

    def _is_reuse_scope(self, statement: cst.CSTNode, loop: cst.For) -> bool:
        """``with tf.variable_scope(tf.get_variable_scope()):`` directly around the loop."""
        if not isinstance(statement, cst.With) or len(statement.items) != 1:
            return False
        call = _call_of(statement.items[0].item)
        if self.call_q(call) != "tensorflow.variable_scope" or call is None or len(call.args) != 1:
            return False
        if self.call_q(call.args[0].value) != "tensorflow.get_variable_scope":
            return False
        body = statement.body.body  # type: ignore[union-attr]
        return len(body) == 1 and body[0] is loop

    def _placeholder(
        self, statement: cst.CSTNode, assigned: tuple[list[str], cst.BaseExpression]
    ) -> Placeholder:
        call = assigned[1]
        assert isinstance(call, cst.Call)
        dtype = get_arg(call, 0, "dtype")
        shape = get_arg(call, 1, "shape")
        if len(assigned[0]) != 1 or dtype is None or shape is None:
            raise Blocked(statement, "a placeholder without a dtype and a full shape")
        if isinstance(shape, cst.List | cst.Tuple):
            for element in shape.elements:
                if isinstance(element.value, cst.Name) and element.value.value == "None":
                    raise Blocked(statement, "a placeholder with an unknown (None) dimension")
        return Placeholder(assigned[0][0], dtype, shape)

    def _check_setup(self, statement: cst.CSTNode, placeholders: list[Placeholder]) -> None:
        used = free_names(statement) & {p.name for p in placeholders}
        if used:
            raise Blocked(statement, f"graph code reads the placeholder `{sorted(used)[0]}` "
                          "outside the towers")
        for node in walk(statement):
            if isinstance(node, cst.Call) and self.call_q(node) in SESSIONS:
                raise Blocked(statement, "a Session opened before the towers are built")

    # -- the tower loop -----------------------------------------------------------------------
    def _read_tower(self, loop: cst.For, splits: dict[str, str], lists: set[str]) -> dict:
        if loop.orelse is not None:
            raise Blocked(loop, "a tower loop with an `else` block")
        if not isinstance(loop.target, cst.Name):
            raise Blocked(loop, "the tower loop does not iterate over tower indices (`for i in ...`)")
        count = self._range_count(loop.iter)
        if count is None:
            raise Blocked(loop, "the tower loop is not `for i in range(num_towers)`")
        index = loop.target.value
        withs: list[cst.WithItem] = []
        body: list[cst.BaseStatement] = list(loop.body.body)  # type: ignore[arg-type]
        # Peel `with tf.device(...)`, `with tf.name_scope(...) as scope` wrappers.
        while len(body) == 1 and isinstance(body[0], cst.With):
            for item in body[0].items:
                name = self.call_q(item.item)
                if name == "tensorflow.device":
                    continue
                if name in ("tensorflow.name_scope",):
                    withs.append(item)
                    continue
                raise Blocked(body[0], f"an unsupported `with {self.rule.src(item.item, 40)}` "
                              "around the tower")
            body = list(body[0].body.body)  # type: ignore[union-attr]
        kept: list[cst.BaseStatement] = []
        grads = None
        for statement in body:
            small = _simple(statement)
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                call = small.value
                func = call.func
                if (
                    isinstance(func, cst.Attribute)
                    and func.attr.value == "reuse_variables"
                    and self.call_q(func.value) == "tensorflow.get_variable_scope"
                ):
                    continue  # the variable store shares the variables now
                if (
                    isinstance(func, cst.Attribute)
                    and func.attr.value == "append"
                    and isinstance(func.value, cst.Name)
                    and func.value.value in lists
                    and call.args
                ):
                    grads_call = _call_of(call.args[0].value)
                    if (
                        grads_call is not None
                        and isinstance(grads_call.func, cst.Attribute)
                        and grads_call.func.attr.value == "compute_gradients"
                    ):
                        if grads is not None:
                            raise Blocked(statement, "a tower computes gradients twice")
                        grads = (func.value.value, grads_call, statement)
                        continue
            for node in walk(statement):
                if isinstance(node, cst.Call) and self.call_q(node) == "tensorflow.device":
                    raise Blocked(statement, "a nested tf.device inside the tower body")
            kept.append(statement)
        if grads is None:
            raise Blocked(loop, "the tower body does not append `opt.compute_gradients(loss)` "
                          "to a per-tower list")
        list_name, grads_call, _ = grads
        loss = get_arg(grads_call, 0, "loss")
        if loss is None or len(grads_call.args) != 1:
            raise Blocked(grads_call, "compute_gradients with arguments other than the loss")
        optimizer = grads_call.func.value  # type: ignore[union-attr]
        if not isinstance(optimizer, cst.Name):
            raise Blocked(grads_call, "compute_gradients on something other than a named optimizer")
        # `image_splits[i]` -> the replica's own input.
        kept = [self._unsplit(s, splits, index) for s in kept]
        loss = self._unsplit(loss, splits, index)
        for statement in kept:
            for node in walk(statement):
                if isinstance(node, cst.Name) and node.value in splits:
                    raise Blocked(statement, f"`{node.value}` is used other than as "
                                  f"`{node.value}[{index}]`")
        return {
            "index": index,
            "count": count,
            "withs": withs,
            "body": kept,
            "list": list_name,
            "loss": loss,
            "optimizer": optimizer.value,
        }

    def _range_count(self, node: cst.BaseExpression) -> cst.BaseExpression | None:
        call = _call_of(node)
        if call is None or not isinstance(call.func, cst.Name) or call.func.value != "range":
            return None
        if len(call.args) == 1:
            return call.args[0].value
        return None

    def _unsplit(self, node, splits: dict[str, str], index: str):  # type: ignore[no-untyped-def]
        class Unsplit(cst.CSTTransformer):
            def leave_Subscript(self, original, updated):  # type: ignore[no-untyped-def]
                if (
                    isinstance(updated.value, cst.Name)
                    and updated.value.value in splits
                    and len(updated.slice) == 1
                    and isinstance(updated.slice[0].slice, cst.Index)
                    and isinstance(updated.slice[0].slice.value, cst.Name)
                    and updated.slice[0].slice.value.value == index
                ):
                    return cst.Name(splits[updated.value.value])
                return updated

        return node.visit(Unsplit())

    # -- after the towers ---------------------------------------------------------------------
    def _read_tail(self, function, loop, python_setup, setup, placeholders, splits, tower, rest):  # type: ignore[no-untyped-def]
        tower_list = tower["list"]
        aggregate = None
        helper = None
        apply: list[cst.BaseStatement] = []
        train_op = None
        session = None
        step_loop = None
        for position, statement in enumerate(rest):
            assigned = _assign(statement)
            if aggregate is None:
                if assigned is None or len(assigned[0]) != 1:
                    raise Blocked(statement, "expected the towers' gradients to be aggregated "
                                  "right after the tower loop")
                call = _call_of(assigned[1])
                if (
                    call is None
                    or not isinstance(call.func, cst.Name)
                    or free_names(call) != {call.func.value, tower_list}
                ):
                    raise Blocked(statement, "the towers' gradients are aggregated inline; only "
                                  "an aggregation helper (`grads = average_gradients(tower_grads)`) "
                                  "is converted so far")
                helper = self._helper_def(call.func.value)
                if helper is None or id(helper) not in self.aggregation:
                    raise Blocked(statement, f"`{call.func.value}` is not an aggregation helper "
                                  "TFM102 recognises (averaged or summed)")
                aggregate = (assigned[0][0], self.aggregation[id(helper)])
                continue
            if train_op is None:
                call = _call_of(assigned[1]) if assigned else None
                if (
                    assigned is None
                    or len(assigned[0]) != 1
                    or call is None
                    or not isinstance(call.func, cst.Attribute)
                    or call.func.attr.value != "apply_gradients"
                ):
                    raise Blocked(statement, "expected `train_op = opt.apply_gradients(grads...)`"
                                  " after the aggregation")
                train_op = assigned[0][0]
                apply.append(statement)
                continue
            session = self._session(statement)
            if session is not None:
                step_loop = self._read_session(rest[position:], session, train_op)
                break
            raise Blocked(statement, "graph code between apply_gradients and the Session is not "
                          "converted yet")
        if session is None or step_loop is None:
            raise Blocked(loop, "no `tf.Session` training loop found after the towers")
        feed_statements, feed_values, run_statement, fetches = step_loop[1:]
        tower_names = bound_names(cst.IndentedBlock(body=tower["body"])) | {tower["index"]}
        for fetch in fetches:
            if fetch.tensor == train_op:
                continue
            if fetch.tensor not in tower_names:
                raise Blocked(run_statement, f"the loop fetches `{fetch.tensor}`, which is not "
                              "a tower tensor (only tower tensors are converted so far)")
        for placeholder in placeholders:
            if placeholder.name not in feed_values:
                raise Blocked(run_statement, f"the placeholder `{placeholder.name}` is not fed")
        return Program(
            function=function,
            python_setup=python_setup,
            graph_setup=setup,
            placeholders=placeholders,
            splits=splits,
            tower_loop=loop,
            tower_index=tower["index"],
            tower_count=tower["count"],
            tower_body=tower["body"],
            tower_withs=tower["withs"],
            loss=tower["loss"],
            optimizer=tower["optimizer"],
            grads_name=aggregate[0],
            averaged=aggregate[1],
            apply=apply,
            train_op=train_op,
            step_loop=step_loop[0],
            feed_statements=feed_statements,
            feed_values=feed_values,
            run_statement=run_statement,
            fetches=fetches,
            helper=helper,
        )

    def _helper_def(self, name: str) -> cst.FunctionDef | None:
        for statement in self.rule.context.module.body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
                return statement
        return None

    def _session(self, statement: cst.CSTNode) -> str | None:
        assigned = _assign(statement)
        if assigned and len(assigned[0]) == 1 and self.call_q(assigned[1]) in SESSIONS:
            return assigned[0][0]
        return None

    def _read_session(self, statements, session: str, train_op: str):  # type: ignore[no-untyped-def]
        """``sess = tf.Session(...)``, ``sess.run(init)``, then the step loop, then nothing."""
        if len(statements) != 3:
            raise Blocked(statements[0], "the session block is not `sess = tf.Session(...)`, "
                          "`sess.run(initializer)`, one step loop")
        init = _simple(statements[1])
        if not (
            isinstance(init, cst.Expr)
            and isinstance(init.value, cst.Call)
            and self._is_method(init.value, session, "run")
            and init.value.args
            and self.call_q(init.value.args[0].value) in INITIALIZERS
        ):
            raise Blocked(statements[1], "expected `sess.run(tf.global_variables_initializer())`")
        step_loop = statements[2]
        if not isinstance(step_loop, cst.For) or step_loop.orelse is not None:
            raise Blocked(step_loop, "the training loop is not a plain `for` loop")
        run = None
        body = list(step_loop.body.body)  # type: ignore[union-attr]
        for statement in body:
            for node in walk(statement):
                if isinstance(node, cst.Call) and self._is_method(node, session, "run"):
                    if run is not None:
                        raise Blocked(node, "more than one sess.run in the training loop")
                    run = (statement, node)
        if run is None:
            raise Blocked(step_loop, "no sess.run in the training loop")
        run_statement, run_call = run
        assigned = _assign(run_statement)
        if assigned is None or assigned[1] is not run_call:
            raise Blocked(run_statement, "sess.run's result is not assigned to names")
        fetched = get_arg(run_call, 0, "fetches")
        feed = get_arg(run_call, 1, "feed_dict")
        if not isinstance(fetched, cst.List | cst.Tuple) or not all(
            isinstance(e.value, cst.Name) for e in fetched.elements
        ):
            raise Blocked(run_call, "sess.run fetches something other than a list of names")
        names = [e.value.value for e in fetched.elements]  # type: ignore[union-attr]
        if len(names) != len(assigned[0]):
            raise Blocked(run_call, "sess.run's fetches and targets differ in length")
        if train_op not in names:
            raise Blocked(run_call, f"sess.run does not run `{train_op}`")
        fetches = [
            Fetch(None if target == "_" else target, tensor)
            for target, tensor in zip(assigned[0], names, strict=True)
        ]
        if not isinstance(feed, cst.Name):
            raise Blocked(run_call, "feed_dict is not a dict built in the loop")
        feed_statements, feed_values = self._feed(body, feed.value, run_statement)
        return step_loop, feed_statements, feed_values, run_statement, fetches

    def _feed(self, body, feed: str, run_statement):  # type: ignore[no-untyped-def]
        """The loop statements the feed dict needs (and nothing else reads), and its values."""
        values: dict[str, cst.BaseExpression] = {}
        feed_statement = None
        for statement in body:
            assigned = _assign(statement)
            if assigned and assigned[0] == [feed]:
                if not isinstance(assigned[1], cst.Dict):
                    raise Blocked(statement, "feed_dict is not a dict literal")
                for element in assigned[1].elements:
                    if not isinstance(element, cst.DictElement) or not isinstance(
                        element.key, cst.Name
                    ):
                        raise Blocked(statement, "a feed_dict key that is not a placeholder name")
                    values[element.key.value] = element.value
                feed_statement = statement
        if feed_statement is None:
            raise Blocked(run_statement, f"`{feed}` is not built in the training loop")
        needed = set().union(*(free_names(v) for v in values.values()))
        feed_statements: list[cst.BaseStatement] = []
        position = body.index(feed_statement)
        for statement in reversed(body[:position]):
            bound = bound_names(statement)
            if bound & needed:
                feed_statements.insert(0, statement)
                needed |= free_names(statement)
        others = [
            s
            for s in body
            if s is not feed_statement and s is not run_statement and s not in feed_statements
        ]
        for statement in others:
            shared = free_names(statement) & (
                set().union(*(bound_names(s) for s in feed_statements)) | {feed}
            )
            if shared:
                raise Blocked(statement, f"the loop also uses `{sorted(shared)[0]}`, which only "
                              "exists to feed the graph")
        return feed_statements, values

    def _is_method(self, call: cst.Call, receiver: str, method: str) -> bool:
        func = call.func
        return (
            isinstance(func, cst.Attribute)
            and func.attr.value == method
            and isinstance(func.value, cst.Name)
            and func.value.value == receiver
        )
