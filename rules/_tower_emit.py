"""Writing the TF2 program for a :class:`~tfmigrate.rules._tower_program.Program` (TFM303).

Not a rule module. The new code is written as text from templates (4-space indents, turned into
the file's own indent unit), parsed, and the user's statements are then put in as CST nodes, so
their comments and formatting survive untouched.
"""

from __future__ import annotations

import re
import textwrap

import libcst as cst

from tfmigrate.rules._tower_program import Blocked, Program
from tfmigrate.rules._towers import bound_names, free_names, get_arg, walk

# Emitted into the migrated program: it must not import tfmigrate.
STORE = '''
class TF1Variables:
    """Owns the variables that TF1 model code creates with tf.compat.v1.get_variable.

    Used as a custom getter: the first request of a name creates the variable -- eagerly, under
    the strategy (so it is mirrored on every replica), with its legacy name; every later request,
    from any replica, gets that same variable back.
    """

    def __init__(self, strategy):
        self.strategy = strategy
        self.variables = {}  # legacy name -> variable, in creation order
        self.trainable = []

    def getter(self, getter, name, *args, **kwargs):
        variable = self.variables.get(name)
        if variable is None:
            def create(strategy):
                with tf.init_scope(), strategy.scope():
                    return getter(name, *args, **kwargs)

            context = tf.distribute.get_replica_context()
            if context is not None and tf.distribute.has_strategy():
                # Inside strategy.run every replica asks; merge_call creates it once.
                variable = context.merge_call(create)
            else:
                variable = create(self.strategy)
            if name in self.variables:  # another replica's request created it
                return self.variables[name]
            self.variables[name] = variable
            if variable.trainable:
                self.trainable.append(variable)
        return variable

    def scope(self):
        return tf.compat.v1.variable_scope("", custom_getter=self.getter)


def replica_index():
    """This replica's number as a Python int: the legacy tower index."""
    context = tf.distribute.get_replica_context()
    return int(tf.get_static_value(context.replica_id_in_sync_group))
'''

SLOT = "__tfmigrate_slot_{}__"


class _FillSlots(cst.CSTTransformer):
    """Replaces each ``__tfmigrate_slot_k__`` statement with the statements of slot k."""

    def __init__(self, slots: dict[str, list[cst.BaseStatement]]) -> None:
        super().__init__()
        self.slots = slots

    def leave_SimpleStatementLine(self, original, updated):  # type: ignore[no-untyped-def]
        if len(updated.body) == 1 and isinstance(updated.body[0], cst.Expr):
            value = updated.body[0].value
            if isinstance(value, cst.Name) and value.value in self.slots:
                statements = self.slots[value.value]
                return cst.FlattenSentinel(statements) if statements else cst.RemoveFromParent()
        return updated


class _Trainables(cst.CSTTransformer):
    """``tf.compat.v1.trainable_variables()`` (a graph collection) -> the store's list."""

    def leave_Call(self, original, updated):  # type: ignore[no-untyped-def]
        code = cst.Module([]).code_for_node(updated.func)
        if code.endswith("trainable_variables") and not updated.args:
            return cst.parse_expression("tf1_variables.trainable")
        return updated


class _Replace(cst.CSTTransformer):
    """Replaces every occurrence of one expression (compared structurally) with another."""

    def __init__(self, old: cst.BaseExpression, new: cst.BaseExpression) -> None:
        super().__init__()
        self.old, self.new = old, new

    def on_leave(self, original, updated):  # type: ignore[no-untyped-def]
        if isinstance(original, cst.BaseExpression) and original.deep_equals(self.old):
            return self.new
        return updated


def _indent(text: str, unit: str) -> str:
    """Template text (4-space indents) in the module's own indent unit."""
    text = textwrap.dedent(text).strip("\n") + "\n"
    return re.sub(
        r"^((?:    )+)", lambda m: unit * (len(m.group(1)) // 4), text, flags=re.M
    )


class Emitter:
    def __init__(self, module: cst.Module, program: Program) -> None:
        self.module = module
        self.p = program
        self.code = module.code_for_node
        self.slots: dict[str, list[cst.BaseStatement]] = {}
        self.strategy_count = cst.parse_expression("strategy.num_replicas_in_sync")

    def slot(self, statements: list[cst.BaseStatement]) -> str:
        key = SLOT.format(len(self.slots))
        statements = [self._retarget(s) for s in statements]
        if statements and hasattr(statements[0], "leading_lines"):
            # A blank line that separated it from what came before would open the block now.
            lines = [line for line in statements[0].leading_lines if line.comment is not None]
            statements[0] = statements[0].with_changes(leading_lines=lines)
        self.slots[key] = statements
        return key

    def _retarget(self, node):  # type: ignore[no-untyped-def]
        """The legacy tower count (`flags.num_gpus`) is the strategy's replica count now."""
        return node.visit(_Replace(self.p.tower_count, self.strategy_count))

    def expr(self, node: cst.CSTNode) -> str:
        return self.code(self._retarget(node))

    # -- the pieces ---------------------------------------------------------------------------
    def fetch_keys(self) -> dict[str, str]:
        """Tower tensor name -> train_step key: the legacy op's own name when it is a literal
        (`tf.add_n(losses, name='total_loss')`), so that verify matches it by name."""
        keys: dict[str, str] = {}
        for fetch in self.p.fetches:
            if fetch.tensor == self.p.train_op:
                continue
            tensor = self.p.collected.get(fetch.tensor, fetch.tensor)
            where = self.p.tower_body
            if tensor in self.p.reductions:
                where = self.p.tower_body + self._reduction_statements()
            elif tensor in self.setup_fetches():
                where = self.p.graph_setup
            keys[tensor] = self._op_name(tensor, where) or tensor
        for source in self.p.reductions.values():
            tensor = self.p.collected[source]
            keys.setdefault(tensor, self._op_name(tensor, self.p.tower_body) or tensor)
        return keys

    def _reduction_statements(self) -> list[cst.BaseStatement]:
        return [
            cst.parse_statement(f"{name} = tf.add_n({source})")
            for name, source in self.p.reductions.items()
        ]

    def _op_name(self, name: str, statements, depth: int = 0) -> str | None:  # type: ignore[no-untyped-def]
        value = None
        for statement in statements:
            for node in walk(statement):
                if isinstance(node, cst.Assign) and any(
                    isinstance(t.target, cst.Name) and t.target.value == name for t in node.targets
                ):
                    value = node.value
        return self._name_of(value, depth)

    def _name_of(self, value, depth: int) -> str | None:  # type: ignore[no-untyped-def]
        if not isinstance(value, cst.Call) or depth > 5:
            return None
        literal = get_arg(value, None, "name")
        if isinstance(literal, cst.SimpleString):
            return literal.evaluated_value  # type: ignore[return-value]
        scope = get_arg(value, None, "scope")
        if (
            isinstance(scope, cst.SimpleString)
            and isinstance(value.func, cst.Attribute)
            and isinstance(value.func.value, cst.Attribute)
            and value.func.value.attr.value == "losses"
        ):
            # tf.losses.*(..., scope='xent') returns the tensor `xent/value`.
            return f"{scope.evaluated_value}/value"
        if isinstance(value.func, cst.Name):
            for statement in self.module.body:
                if isinstance(statement, cst.FunctionDef) and statement.name.value == value.func.value:
                    returns = [n for n in walk(statement) if isinstance(n, cst.Return)]
                    if len(returns) == 1 and returns[0].value is not None:
                        ret = returns[0].value
                        if isinstance(ret, cst.Name):
                            return self._op_name(ret.value, statement.body.body, depth + 1)
                        return self._name_of(ret, depth + 1)
        return None

    def build_function(self, params: str, keys: dict[str, str], loop_needs: list[str]) -> str:
        p = self.p
        if p.dataset is not None:
            return self._build_from_dataset(params, keys, loop_needs)
        inputs = ", ".join(ph.name for ph in p.placeholders)
        header = self.code(p.step_loop.target), self.expr(p.step_loop.iter)
        # Continuation lines carry the template's own 12-space base (removed by dedent).
        specs = "".join(
            f"\n{' ' * 24}tf.TensorSpec({self._spec_shape(ph.shape)}, {self.code(ph.dtype)}),"
            for ph in p.placeholders
        )
        scale = " / strategy.num_replicas_in_sync" if p.averaged else ""
        scale_note = (
            "# The towers AVERAGED their gradients; apply_gradients SUMS the replicas'."
            if p.averaged
            else "# The towers SUMMED their gradients, as apply_gradients does: not rescaled."
        )
        withs = "".join(f", {self.code(item)}" for item in p.tower_withs)
        fetched = ", ".join(f"{key!r}: {tensor}" for tensor, key in keys.items())
        extra = "".join(f'\n{" " * 20}"{name}": {name},' for name in loop_needs)
        python_setup = self.slot(p.python_setup)
        graph_setup = self.slot(p.graph_setup)
        prelude = self.slot(p.session_prelude)
        feed = self.slot(p.feed_statements)
        body = self.slot(p.tower_body)
        apply = self.slot(p.apply)
        pad = " " * 24
        if p.tower_feed is None:
            values = [self.expr(p.feed_values[ph.name]) for ph in p.placeholders]
            yielded = f"({values[0]},)" if len(values) == 1 else ", ".join(values)
            fill = ""
            slicing = "Replica i receives the i-th slice of each global batch, as tower i did."
        else:
            np_name = self.numpy_name()
            parts = [f"{ph.name}_parts" for ph in p.placeholders]
            joined = [f"{np_name}.concatenate({part})" for part in parts]
            yielded = f"({joined[0]},)" if len(joined) == 1 else ", ".join(joined)
            lists = ", ".join(parts) + (" =" if len(parts) == 1 else " = ") + ", ".join(
                "[]" for _ in parts
            )
            tower_slot = self.slot(p.tower_feed.statements)
            fill = (
                f"\n{pad}{lists}"
                f"\n{pad}for {p.tower_feed.index} in range(strategy.num_replicas_in_sync):"
                f"\n{pad}    {tower_slot}"
            )
            slicing = ("The towers' feeds, one after another: replica i receives the i-th "
                       "slice, as tower i did.")
        doc = ("What the legacy loop fed, one global batch per step." if p.tower_feed is None
               else "What the legacy loop fed the towers, as one global batch per step.")
        return textwrap.dedent(f'''
            def build_program(strategy, {params}):
                """The training program under `strategy` (its variables, one step, the batches)."""
                {python_setup}
                tf1_variables = TF1Variables(strategy)
                with strategy.scope(), tf1_variables.scope():
                    {graph_setup}

                def fed_batches():
                    """{doc}"""
                    {prelude}
                    for {header[0]} in {header[1]}:
                        {feed}{fill}
                        yield {yielded}

                dataset = tf.data.Dataset.from_generator(
                    fed_batches,
                    output_signature=({specs}
                    ),
                )
                # {slicing}
                batches = strategy.experimental_distribute_dataset(dataset)

                def tower_fn({inputs}):
                    """One tower of the legacy loop, now one replica."""
                    {p.tower_index} = replica_index()
                    with tf1_variables.scope(){withs}:
                        {body}
                        {scale_note}
                        {p.grads_name} = {p.optimizer}.compute_gradients(
                            {self.expr(p.loss)}{scale}, var_list=tf1_variables.trainable)
                    return {p.grads_name}, {{{fetched}}}

                @tf.function
                def build(*batch):
                    strategy.run(tower_fn, args=batch)

                # Trace once, without training: creates the variables under their legacy names.
                build.get_concrete_function(*[
                    tf.TensorSpec([None, *spec.shape[1:]], spec.dtype) for spec in dataset.element_spec])

                def step_fn({inputs}):
                    {p.grads_name}, fetches = tower_fn({inputs})
                    {apply}
                    return fetches

                @tf.function
                def train_step(batch):
                    return strategy.run(step_fn, args=batch)

                return {{
                    "variables": dict(tf1_variables.variables),
                    "train_step": train_step,
                    "batches": batches,{extra}
                }}
            ''')

    def _build_from_dataset(self, params: str, keys: dict[str, str], loop_needs: list[str]) -> str:
        """The tf.data variant: the legacy dataset itself is distributed (tf.split of each of
        its batches == the strategy's split), EMA shadows are made before the first step,
        and cross-tower / non-tower fetches are reduced in the train step."""
        p = self.p
        inputs = ", ".join(ph.name for ph in p.placeholders)
        scale = " / strategy.num_replicas_in_sync" if p.averaged else ""
        scale_note = (
            "# The towers AVERAGED their gradients; apply_gradients SUMS the replicas'."
            if p.averaged
            else "# The towers SUMMED their gradients, as apply_gradients does: not rescaled."
        )
        withs = "".join(f", {self.code(item)}" for item in p.tower_withs)
        tower_keys = {t: k for t, k in keys.items() if t not in p.reductions and t not in
                      self.setup_fetches()}
        fetched = ", ".join(f"{key!r}: {tensor}" for tensor, key in tower_keys.items())
        extra = "".join(f'\n{" " * 20}"{name}": {name},' for name in loop_needs)
        python_setup = self.slot(p.python_setup)
        graph_setup = self.slot(p.graph_setup)
        body = self.slot(p.tower_body)
        apply = self.slot([s.visit(_Trainables()) for s in p.apply])
        pad = " " * 16
        reads = "".join(
            f"\n{pad}    fetches[{keys[name]!r}] = {name}() if callable({name}) else {name}"
            for name in self.setup_fetches()
        )
        if reads:
            reads = f"\n{pad}    # Read before the update, as the legacy fetch was.{reads}"
        reduced = "".join(
            f"\n{pad}    outputs[{keys[name]!r}] = strategy.reduce(tf.distribute.ReduceOp.SUM, "
            f"outputs[{tower_keys[p.collected[source]]!r}], axis=None)"
            for name, source in p.reductions.items()
        ) + "".join(
            f"\n{pad}    outputs[{keys[name]!r}] = strategy.experimental_local_results("
            f"outputs[{keys[name]!r}])[0]  # the same on every replica"
            for name in self.setup_fetches()
        )
        variables = "dict(tf1_variables.variables)"
        ema = ""
        if p.ema is not None:
            name = p.ema[0]
            ema_slot = self.slot([p.ema[1]])
            ema = f"""
                with strategy.scope():
                    {ema_slot}
                    # Creates the shadow variables now (equal to the weights, as TF1 initialised
                    # them), outside the train step.
                    {name}.apply(tf1_variables.trainable)
                variables = dict(tf1_variables.variables)
                for legacy_name, variable in tf1_variables.variables.items():
                    if variable.trainable:
                        variables[f"{{legacy_name}}/{{{name}.name}}"] = {name}.average(variable)
"""
            variables = "variables"
        return textwrap.dedent(f'''
            def build_program(strategy, {params}):
                """The training program under `strategy` (its variables, one step, the batches)."""
                {python_setup}
                tf1_variables = TF1Variables(strategy)
                with strategy.scope(), tf1_variables.scope():
                    {graph_setup}
                # Replica i receives the i-th slice of each batch, as tf.split gave tower i.
                batches = strategy.experimental_distribute_dataset({p.dataset})

                def tower_fn({inputs}):
                    """One tower of the legacy loop, now one replica."""
                    {p.tower_index} = replica_index()
                    with tf1_variables.scope(){withs}:
                        {body}
                        {scale_note}
                        {p.grads_name} = {p.optimizer}.compute_gradients(
                            {self.expr(p.loss)}{scale}, var_list=tf1_variables.trainable)
                    return {p.grads_name}, {{{fetched}}}

                @tf.function
                def build(*batch):
                    strategy.run(tower_fn, args=batch)

                # Trace once, without training: creates the variables under their legacy names.
                build.get_concrete_function(*[
                    tf.TensorSpec([None, *spec.shape[1:]], spec.dtype)
                    for spec in {p.dataset}.element_spec])
{ema}
                def step_fn({inputs}):
                    {p.grads_name}, fetches = tower_fn({inputs}){reads}
                    {apply}
                    return fetches

                @tf.function
                def train_step(batch):
                    outputs = strategy.run(step_fn, args=batch){reduced}
                    return outputs

                return {{
                    "variables": {variables},
                    "train_step": train_step,
                    "batches": batches,{extra}
                }}
            ''')

    def setup_fetches(self) -> list[str]:
        """Fetched names the graph setup made (the learning rate): read in the step."""
        made = set().union(set(), *(bound_names(s) for s in self.p.graph_setup))
        return [f.tensor for f in self.p.fetches if f.tensor in made]

    def global_step(self) -> str:
        """The `global_step=` that the legacy apply_gradients advanced (StopAtStepHook's)."""
        for statement in self.p.apply:
            for node in walk(statement):
                if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and (
                    node.func.attr.value == "apply_gradients"
                ):
                    step = get_arg(node, 2, "global_step")
                    if isinstance(step, cst.Name):
                        return step.value
        raise Blocked(self.p.tower_loop, "StopAtStepHook counts global_step, which "
                      "apply_gradients does not advance here")

    def _spec_shape(self, shape: cst.BaseExpression) -> str:
        """A per-tower placeholder's shape with the batch dimension left open (the global
        batch holds every tower's)."""
        if not self.p.per_tower_inputs:
            return self.expr(shape)
        if not isinstance(shape, cst.List | cst.Tuple) or not shape.elements:
            raise Blocked(self.p.tower_loop, "a per-tower placeholder shape that is not a list")
        rest = "".join(f", {self.expr(e.value)}" for e in shape.elements[1:])
        return f"[None{rest}]"

    def numpy_name(self) -> str:
        for statement in self.module.body:
            small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
            if isinstance(small, cst.Import):
                for alias in small.names:
                    if self.code(alias.name) == "numpy":
                        return alias.asname.name.value if alias.asname else "numpy"  # type: ignore[union-attr]
        raise Blocked(self.p.tower_loop, "the towers are fed separately and numpy is not imported "
                      "(needed to join their feeds into one global batch)")

    def loop_body(self, keys: dict[str, str]) -> list[cst.BaseStatement]:
        p = self.p
        statements: list[cst.BaseStatement] = []
        for statement in p.step_loop.body.body:  # type: ignore[union-attr]
            if statement in p.feed_statements or self._is_feed(statement):
                continue
            if statement is p.run_statement:
                statements.append(cst.parse_statement("outputs = train_step(next(batches))"))
                if p.run_fetches_list is not None:
                    # `results = sess.run([train_op] + losses)`: None, then every tower's value.
                    target = p.fetches[1].target
                    key = keys[p.collected[p.fetches[1].tensor]]
                    statements.append(cst.parse_statement(
                        f"{target} = [None] + [value.numpy() for value in "
                        f"strategy.experimental_local_results(outputs[{key!r}])]"))
                    continue
                for fetch in p.fetches:
                    if fetch.target is None or fetch.tensor == p.train_op:
                        if fetch.target is not None:
                            raise Blocked(p.run_statement, "the loop keeps the train op's value")
                        continue
                    key = keys[fetch.tensor]
                    if fetch.tensor in p.reductions or fetch.tensor in self.setup_fetches():
                        statements.append(
                            cst.parse_statement(f"{fetch.target} = outputs[{key!r}].numpy()")
                        )
                        continue
                    statements.append(
                        cst.parse_statement(
                            f"{fetch.target} = strategy.experimental_local_results("
                            f"outputs[{key!r}])[-1].numpy()"
                        )
                    )
                continue
            statements.append(self._retarget(statement))
        return statements

    def _is_feed(self, statement: cst.CSTNode) -> bool:
        if self.p.tower_feed is not None and any(
            statement is node for node in self.p.tower_feed.replaced
        ):
            return True
        return any(
            isinstance(node, cst.Dict)
            and all(
                isinstance(e, cst.DictElement)
                and isinstance(e.key, cst.Name)
                and e.key.value in {ph.name for ph in self.p.placeholders}
                for e in node.elements
            )
            and node.elements
            for node in walk(statement)
        )

    def loop_needs(self) -> list[str]:
        """Names the eager loop reads that the build made (returned in the program dict)."""
        made = set().union(
            *(bound_names(s) for s in [*self.p.python_setup, *self.p.graph_setup])
        )
        used: set[str] = set()
        for statement in self.loop_body_sources():
            used |= free_names(statement)
        if isinstance(self.p.step_loop, cst.For):
            used |= free_names(self.p.step_loop.iter)
        if self.p.monitored is not None:
            used |= {self.global_step()} | free_names(self.p.monitored)
        return sorted(used & made)

    def loop_body_sources(self) -> list[cst.CSTNode]:
        p = self.p
        return [
            s
            for s in p.step_loop.body.body  # type: ignore[union-attr]
            if s not in p.feed_statements and s is not p.run_statement and not self._is_feed(s)
        ]

    def fill(self, module: cst.Module) -> cst.Module:
        return module.visit(_FillSlots(self.slots))
