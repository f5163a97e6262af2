"""Shared by TFM105 and TFM108: follow a TF1 session config and move its device settings to tf.config.

A TF1 `ConfigProto` is a *group*: the call that builds it (maybe with an inline or named
`GPUOptions`), the statements that set its fields later, and the sessions it is passed to. The
settings can only move as a whole: `tf.Session(config=...)` ignores every `tf.config` setting
(TF's session uses the eager context's config only when `config` is None), so a fix that moves
the settings must also drop `config=` from the sessions, and a half-moved group would silently
lose settings. A group is therefore fixed all at once by rewriting the smallest block that holds
all its statements; every finding of the group carries that same fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import cast

import libcst as cst

from tfmigrate import tree
from tfmigrate.names import NameResolver
from tfmigrate.syntax import carried_lines

CONFIG_PROTO = "tensorflow.ConfigProto"
GPU_OPTIONS = "tensorflow.GPUOptions"
# Sessions that fall back to the eager context's config (with tf.config settings) when given none.
# InteractiveSession is not one of them: without a config it forces allow_growth itself.
SESSIONS = frozenset({"tensorflow.Session", "tensorflow.train.MonitoredTrainingSession"})
# a tf.train.Supervisor's methods making its session (it too falls back to the context's config)
SUPERVISOR_SESSIONS = frozenset({"managed_session", "prepare_or_wait_for_session"})

# field -> how the finding explains its TF2 equivalent
EXPLAIN = {
    "gpu_options.allow_growth": "`allow_growth` is `tf.config.experimental.set_memory_growth` "
    "on each GPU",
    "allow_soft_placement": "`allow_soft_placement` is `tf.config.set_soft_device_placement`",
    "log_device_placement": "`log_device_placement` is `tf.debugging.set_log_device_placement`",
    "gpu_options.visible_device_list": "`visible_device_list` is `tf.config.set_visible_devices`",
    "device_count": "`device_count` is `tf.config.set_visible_devices` (GPU count)",
    "gpu_options.per_process_gpu_memory_fraction": "`per_process_gpu_memory_fraction` has no TF2 "
    "equivalent: `tf.config.set_logical_device_configuration(gpu, "
    "[tf.config.LogicalDeviceConfiguration(memory_limit=MB)])` takes an absolute limit that "
    "depends on the GPU's size in MB, so choose it by hand (or use memory growth)",
    "intra_op_parallelism_threads": "`intra_op_parallelism_threads` is "
    "`tf.config.threading.set_intra_op_parallelism_threads`",
    "inter_op_parallelism_threads": "`inter_op_parallelism_threads` is "
    "`tf.config.threading.set_inter_op_parallelism_threads`",
}
# Settings whose literal False is TF1's default, so it needs no statement when set only once.
_FALSE_IS_DEFAULT = frozenset(
    {"gpu_options.allow_growth", "allow_soft_placement", "log_device_placement"}
)


@dataclass
class Setting:
    field: str  # path inside ConfigProto, e.g. "gpu_options.allow_growth"
    value: cst.BaseExpression


@dataclass
class Anchor:
    """One finding: a ConfigProto/GPUOptions call or a field assignment statement."""

    node: cst.CSTNode
    settings: list[Setting]


@dataclass
class Group:
    config: cst.Call | None  # the ConfigProto call (None: a GPUOptions nobody passes on)
    anchors: list[Anchor] = field(default_factory=list)
    # statement -> settings it holds, in source order (ConfigProto/GPUOptions bindings too); in
    # a group with a problem, a field set in a one-line suite (`if x: c.f = 1`) holds the suite
    statements: list[tuple[cst.CSTNode, list[Setting]]] = field(default_factory=list)
    consumers: list[cst.Call] = field(default_factory=list)  # sessions given this config
    inline_consumer: cst.BaseStatement | None = None  # statement of `Session(config=ConfigProto())`
    problems: list[str] = field(default_factory=list)

    @property
    def settings(self) -> list[Setting]:
        return [s for _, settings in self.statements for s in settings]


def _kwarg(call: cst.Call, name: str) -> cst.Arg | None:
    return next((a for a in call.args if a.keyword and a.keyword.value == name), None)


def drop_kwarg(call: cst.Call, name: str) -> cst.Call:
    args = [a for a in call.args if not (a.keyword and a.keyword.value == name)]
    if args:  # the new last argument must not keep a trailing comma it did not have
        args[-1] = args[-1].with_changes(comma=call.args[-1].comma)
    return call.with_changes(args=args)


def attribute_path(node: cst.BaseExpression) -> tuple[cst.Name, str] | None:
    """`config.gpu_options.allow_growth` -> (Name config, "gpu_options.allow_growth")."""
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name) or not parts:
        return None
    return node, ".".join(reversed(parts))


def _is_literal(node: cst.BaseExpression, value: str) -> bool:
    return isinstance(node, cst.Name) and node.value == value


class _Collect(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[cst.Call] = []
        self.names: list[cst.Name] = []
        self.strings: list[str] = []

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)

    def visit_Name(self, node: cst.Name) -> None:
        self.names.append(node)

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        body = node.value.lstrip("rRbBuUfF")
        if not body.startswith(('"""', "'''")):  # docstrings say nothing about the style
            self.strings.append(body[:1])


class DeviceConfig:
    """All session-config groups of one module."""

    def __init__(
        self,
        module: cst.Module,
        resolver: NameResolver,
        parent: Callable[[cst.CSTNode], cst.CSTNode | None],
        line: Callable[[cst.CSTNode], int],
        tf: str,
        fixing: bool = True,
    ) -> None:
        self.module = module
        # False in `scan`: a fix is only announced, so its replacement need not be built.
        self.fixing = fixing
        self.resolver = resolver
        self.parent = parent
        self.line = line
        self.tf = tf
        collect = _Collect()
        tree.visit(module, collect)
        self.quote = "'" if collect.strings.count("'") >= collect.strings.count('"') else '"'
        used = {n.value for n in collect.names}
        self.gpu = next(n for n in ("gpu", "physical_gpu", "gpu_device", "_gpu") if n not in used)
        self.groups: list[Group] = []
        self.group_of_call: dict[int, Group] = {}  # id(ConfigProto call) -> group
        self._rewrites: dict[tuple[int, ...], tuple[cst.CSTNode, cst.CSTNode]] = {}
        self._build(collect)

    # -- analysis -----------------------------------------------------------------------------
    def _qualify(self, node: cst.BaseExpression) -> str | None:
        return self.resolver.qualify(node)

    def _scope(self, node: cst.CSTNode) -> int:
        """The id of the function (or lambda) whose variable a name at ``node`` is, or 0 for
        the module's."""
        current = self.parent(node)
        while current is not None:
            if isinstance(current, cst.FunctionDef | cst.Lambda):
                return id(current)
            current = self.parent(current)
        return 0

    def _binding_key(
        self, name: cst.Name, named: dict[tuple[int, str], tuple[cst.Call, cst.BaseStatement]]
    ) -> tuple[int, str] | None:
        """The binding a use of ``name`` reads: its function's, or an enclosing one's."""
        if not any(key[1] == name.value for key in named):
            return None
        current: cst.CSTNode | None = name
        while current is not None:
            if isinstance(current, cst.FunctionDef | cst.Lambda) or current is self.module:
                scope = 0 if current is self.module else id(current)
                if (scope, name.value) in named:
                    return (scope, name.value)
            current = self.parent(current)
        return None

    def _is_session(self, call: cst.Call) -> bool:
        """A session given the config: ``tf.Session(config=...)``, or the session a
        Supervisor makes (``sv.managed_session(config=...)``)."""
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in SUPERVISOR_SESSIONS:
            return True
        return self._qualify(func) in SESSIONS

    def statement(self, node: cst.CSTNode) -> cst.BaseStatement | None:
        """The statement holding ``node`` that sits directly in a block (None if in a one-line
        suite such as `if x: y`, where statements cannot be inserted)."""
        current: cst.CSTNode | None = node
        while current is not None:
            parent = self.parent(current)
            if isinstance(current, cst.BaseStatement) and isinstance(
                parent, cst.Module | cst.IndentedBlock
            ):
                return current
            if isinstance(current, cst.BaseStatement):
                return None
            current = parent
        return None

    def _binding(self, call: cst.Call) -> tuple[str, cst.BaseStatement] | None:
        """`name = Call(...)` as the only statement on its line."""
        assign = self.parent(call)
        if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
            return None
        target = assign.targets[0].target
        line = self.parent(assign)
        if not isinstance(target, cst.Name) or not isinstance(line, cst.SimpleStatementLine):
            return None
        if len(line.body) != 1 or self.statement(line) is None:
            return None
        return target.value, line

    def _kwarg_of(self, node: cst.CSTNode) -> tuple[cst.Call, str] | None:
        arg = self.parent(node)
        if isinstance(arg, cst.Arg) and arg.keyword is not None:
            call = self.parent(arg)
            if isinstance(call, cst.Call):
                return call, arg.keyword.value
        return None

    def _build(self, collect: _Collect) -> None:
        config_calls = [c for c in collect.calls if self._qualify(c.func) == CONFIG_PROTO]
        gpu_calls = [c for c in collect.calls if self._qualify(c.func) == GPU_OPTIONS]
        # Names are counted per function (or the module): `config` made in two functions is
        # two variables.
        stores: dict[tuple[int, str], int] = {}
        # Without such calls nothing is grouped: no need for every name's parent (a tree walk).
        for name in collect.names if config_calls or gpu_calls else ():
            parent = self.parent(name)
            key = (self._scope(name), name.value)
            if isinstance(parent, cst.AssignTarget | cst.AnnAssign | cst.AugAssign | cst.For):
                if getattr(parent, "target", None) is name:
                    stores[key] = stores.get(key, 0) + 1
            elif isinstance(parent, cst.Param | cst.AsName):
                stores[key] = stores.get(key, 0) + 1

        named: dict[tuple[int, str], tuple[cst.Call, cst.BaseStatement]] = {}
        for call in config_calls + gpu_calls:
            bound = self._binding(call)
            if bound is not None:
                named[(self._scope(call), bound[0])] = (call, bound[1])

        # One group per ConfigProto call.
        for call in config_calls:
            group = Group(call)
            self.groups.append(group)
            self.group_of_call[id(call)] = group
            direct = [
                Setting(a.keyword.value, a.value)
                for a in call.args
                if a.keyword is not None and a.keyword.value != "gpu_options"
            ]
            if any(a.keyword is None for a in call.args):
                group.problems.append("ConfigProto takes positional arguments here")
            group.anchors.append(Anchor(call, direct))
            bound = self._binding(call)
            if bound is not None:
                bound_name, bound_stmt = bound
                group.statements.append((bound_stmt, direct))
                if stores.get((self._scope(call), bound_name), 0) > 1:
                    group.problems.append(f"`{bound_name}` is assigned more than once")
            else:
                consumer = self._kwarg_of(call)
                stmt = self.statement(call)
                if (
                    consumer is None
                    or consumer[1] != "config"
                    or not self._is_session(consumer[0])
                    or stmt is None
                ):
                    group.problems.append("the config is used in a way tfmigrate does not follow")
                else:
                    group.consumers.append(consumer[0])
                    group.inline_consumer = stmt
                    group.statements.append((stmt, direct))

        # GPUOptions: inline in a ConfigProto, or named and passed as `gpu_options=name`.
        gpu_group: dict[int, Group] = {}
        for call in gpu_calls:
            owner = self._kwarg_of(call)
            settings = [
                Setting(f"gpu_options.{a.keyword.value}", a.value)
                for a in call.args
                if a.keyword is not None
            ]
            if (
                owner is not None
                and owner[1] == "gpu_options"
                and id(owner[0]) in self.group_of_call
            ):
                group = self.group_of_call[id(owner[0])]
                group.anchors.append(Anchor(call, settings))
                # Inline settings belong to the ConfigProto's statement.
                for holder, held in group.statements:
                    if holder is self.statement(owner[0]):
                        held.extend(settings)
                        break
                continue
            group = Group(None)
            group.anchors.append(Anchor(call, settings))
            gpu_group[id(call)] = group
            bound = self._binding(call)
            if bound is None:
                group.problems.append("the GPUOptions is used in a way tfmigrate does not follow")
            else:
                group.statements.append((bound[1], settings))
                if stores.get((self._scope(call), bound[0]), 0) > 1:
                    group.problems.append(f"`{bound[0]}` is assigned more than once")
            self.groups.append(group)

        # Every other use of a config/GPUOptions name: field assignments, sessions, links.
        by_call = {**gpu_group, **self.group_of_call}
        for name in collect.names:
            found_key = self._binding_key(name, named)
            if found_key is None:
                continue
            call, binding = named[found_key]
            found = by_call.get(id(call))
            parent = self.parent(name)
            if found is None or self._is_binding_target(name, binding):
                continue
            group = found
            if isinstance(parent, cst.Attribute) and parent.attr is name:
                continue  # `x.config`: an attribute, not this variable
            if isinstance(parent, cst.Arg) and parent.keyword is name:
                continue  # `f(config=...)`: the keyword itself
            is_config = self._qualify(call.func) == CONFIG_PROTO
            if self._field_assignment(name, group, prefix="" if is_config else "gpu_options."):
                continue
            user = self._kwarg_of(name)
            if is_config and user is not None and user[1] == "config":
                if self._is_session(user[0]):
                    group.consumers.append(user[0])
                    continue
            if (
                not is_config
                and user is not None
                and user[1] == "gpu_options"
                and id(user[0]) in self.group_of_call
                and group.config is None
            ):
                into = self.group_of_call[id(user[0])]
                self._merge(group, into)
                by_call[id(call)] = into
                continue
            group.problems.append(f"`{name.value}` is also used at line {self.line(name)}")

        for group in self.groups:
            if group.config is not None and not group.consumers and not group.problems:
                group.problems.append("the config is not passed to a tf.Session here")
            if group.config is None and not group.problems:
                group.problems.append("the GPUOptions is not passed to a ConfigProto here")
            group.statements.sort(key=lambda item: self.line(item[0]))

    def _is_binding_target(self, name: cst.Name, binding: cst.BaseStatement) -> bool:
        target = self.parent(name)
        return isinstance(target, cst.AssignTarget) and self.statement(target) is binding

    def _field_assignment(self, name: cst.Name, group: Group, prefix: str) -> bool:
        node: cst.BaseExpression = name
        parent = self.parent(node)
        while isinstance(parent, cst.Attribute) and parent.value is node:
            node = parent
            parent = self.parent(node)
        target = parent
        if node is name or not isinstance(target, cst.AssignTarget):
            return False
        assign = self.parent(target)
        path = attribute_path(node)
        if not isinstance(assign, cst.Assign) or path is None:
            return False
        line = self.parent(assign)
        assert line is not None  # an Assign sits in a statement line or a one-line suite
        setting = Setting(prefix + path[1], assign.value)
        stmt: cst.CSTNode | None = (
            self.statement(line) if isinstance(line, cst.SimpleStatementLine) else None
        )
        if (
            stmt is None
            or len(assign.targets) != 1
            or not isinstance(line, cst.SimpleStatementLine)
            or len(line.body) != 1
        ):
            group.problems.append(
                f"line {self.line(assign)} sets the config in a complex statement"
            )
            stmt = line
        group.anchors.append(Anchor(line, [setting]))
        group.statements.append((stmt, [setting]))
        return True

    def _merge(self, gpu: Group, into: Group) -> None:
        into.anchors.extend(gpu.anchors)
        into.statements.extend(gpu.statements)
        into.problems.extend(gpu.problems)
        self.groups.remove(gpu)

    def anchors(self) -> Iterator[tuple[Anchor, Group]]:
        for group in self.groups:
            for anchor in group.anchors:
                if any(s.field in EXPLAIN for s in anchor.settings):
                    yield anchor, group

    # -- fixes --------------------------------------------------------------------------------
    def why_not(self, group: Group) -> str | None:
        """Why ``group`` cannot be fixed (None when it can)."""
        if group.problems:
            return group.problems[0]
        settings = group.settings
        fields = [s.field for s in settings]
        for setting in settings:
            if self._statements_for(setting, fields.count(setting.field)) is None:
                if setting.field in EXPLAIN:
                    return f"`{setting.field.rsplit('.', 1)[-1]}` needs a manual choice"
                return f"`{setting.field}` has no tf.config equivalent"
        return None

    def _statements_for(self, setting: Setting, times_set: int) -> list[str] | None:
        """TF2 statements for one setting ([] when it is TF1's default), None if none exist."""
        tf, q, gpu = self.tf, self.quote, self.gpu
        value = self.module.code_for_node(setting.value)
        if (
            setting.field in _FALSE_IS_DEFAULT
            and times_set == 1
            and _is_literal(setting.value, "False")
        ):
            return []
        if setting.field == "gpu_options.allow_growth":
            return [
                f"for {gpu} in {tf}.config.list_physical_devices({q}GPU{q}):\n"
                f"    {tf}.config.experimental.set_memory_growth({gpu}, {value})"
            ]
        if setting.field == "allow_soft_placement":
            return [f"{tf}.config.set_soft_device_placement({value})"]
        if setting.field == "log_device_placement":
            return [f"{tf}.debugging.set_log_device_placement({value})"]
        if setting.field in ("intra_op_parallelism_threads", "inter_op_parallelism_threads"):
            return [f"{tf}.config.threading.set_{setting.field}({value})"]
        if setting.field == "gpu_options.visible_device_list":
            return self._visible(setting.value)
        if setting.field == "device_count":
            return self._device_count(setting.value)
        return None

    def _gpus_subset(self, indices: list[int]) -> str:
        tf, q = self.tf, self.quote
        listed = f"{tf}.config.list_physical_devices({q}GPU{q})"
        if not indices:
            subset = "[]"
        elif indices == list(range(indices[0], indices[-1] + 1)):  # contiguous: a slice
            start = str(indices[0]) if indices[0] else ""
            subset = f"{listed}[{start}:{indices[-1] + 1}]"
        else:
            wanted = ", ".join(map(str, indices)) + ("," if len(indices) == 1 else "")
            subset = f"[g for i, g in enumerate({listed}) if i in ({wanted})]"
        return f"{tf}.config.set_visible_devices({subset}, {q}GPU{q})"

    def _visible(self, value: cst.BaseExpression) -> list[str] | None:
        if not isinstance(value, cst.SimpleString):
            return None
        text = value.evaluated_value
        if not isinstance(text, str):
            return None
        if not text.strip():
            return []  # empty list: every GPU, TF1's default
        parts = [p.strip() for p in text.split(",")]
        if not all(p.isdigit() for p in parts):
            return None
        indices = [int(p) for p in parts]
        # TF1 also renumbers the listed GPUs in list order; set_visible_devices keeps device order.
        if indices != sorted(set(indices)):
            return None
        return [self._gpus_subset(indices)]

    def _device_count(self, value: cst.BaseExpression) -> list[str] | None:
        if not isinstance(value, cst.Dict) or len(value.elements) != 1:
            return None
        element = value.elements[0]
        if not (
            isinstance(element, cst.DictElement)
            and isinstance(element.key, cst.SimpleString)
            and element.key.evaluated_value == "GPU"
            and isinstance(element.value, cst.Integer)
        ):
            return None  # CPU counts need logical devices: a manual choice
        return [self._gpus_subset(list(range(int(element.value.value))))]

    def rewrite(
        self, group: Group, remove: tuple[cst.BaseStatement, ...] = ()
    ) -> tuple[cst.CSTNode, cst.CSTNode]:
        """(block to replace, its replacement) moving the group's settings to tf.config.

        ``remove`` names extra statements to drop in the same edit (TFM108's `set_session`)."""
        key = (id(group), *(id(s) for s in remove))
        cached = self._rewrites.get(key)
        if cached is not None:
            return cached
        involved: list[cst.CSTNode | None] = [s for s, _ in group.statements]
        involved += remove
        involved += [self.statement(c) for c in group.consumers]
        block = self._common_block([s for s in involved if s is not None])
        if not self.fixing:
            return block, block  # scan: the fix exists; nobody applies it
        fields = [s.field for s in group.settings]
        plan: dict[int, list[cst.BaseStatement] | None] = {}  # None: keep, with prefix below
        prefix: dict[int, list[cst.BaseStatement]] = {}
        for stmt, settings in group.statements:
            code: list[str] = []
            for setting in settings:
                code.extend(self._statements_for(setting, fields.count(setting.field)) or [])
            new = self._parse(code)
            if stmt is group.inline_consumer:
                prefix[id(stmt)] = prefix.get(id(stmt), []) + new
            else:
                plan[id(stmt)] = (plan.get(id(stmt)) or []) + new
        for stmt in remove:  # an inline config's statements stay where the statement was
            plan[id(stmt)] = prefix.pop(id(stmt), [])
        calls = {id(c): drop_kwarg(c, "config") for c in group.consumers}
        # _Rewrite only rebuilds blocks: a block comes out as a block, never removed
        replacement = cast(cst.CSTNode, block.visit(_Rewrite(plan, prefix, calls)))
        self._rewrites[key] = (block, replacement)
        return block, replacement

    def _parse(self, code: list[str]) -> list[cst.BaseStatement]:
        if not code:
            return []
        return list(cst.parse_module("\n".join(code) + "\n").body)

    def _common_block(self, statements: list[cst.CSTNode]) -> cst.CSTNode:
        chains = []
        for stmt in statements:
            chain: list[cst.CSTNode] = []
            node: cst.CSTNode | None = self.parent(stmt)
            while node is not None:
                if isinstance(node, cst.Module | cst.IndentedBlock):
                    chain.append(node)
                node = self.parent(node)
            chains.append(list(reversed(chain)))
        common = chains[0][0]
        for depth in range(min(len(c) for c in chains)):
            if all(c[depth] is chains[0][depth] for c in chains):
                common = chains[0][depth]
            else:
                break
        return common


class _Rewrite(cst.CSTTransformer):
    """Replace statements (by identity of the original) inside one block, keeping comments."""

    def __init__(
        self,
        plan: dict[int, list[cst.BaseStatement] | None],
        prefix: dict[int, list[cst.BaseStatement]],
        calls: dict[int, cst.Call],
    ) -> None:
        super().__init__()
        self.plan, self.prefix, self.calls = plan, prefix, calls

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if id(original) in self.calls:
            return updated.with_changes(args=self.calls[id(original)].args)
        return updated

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        return updated.with_changes(body=self._body(original.body, updated.body))

    def leave_IndentedBlock(
        self, original: cst.IndentedBlock, updated: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        body = self._body(original.body, updated.body) or [cst.SimpleStatementLine([cst.Pass()])]
        return updated.with_changes(body=body)

    def _body(self, originals, updated) -> list[cst.BaseStatement]:
        body: list[cst.BaseStatement] = []
        carried: list[cst.EmptyLine] = []  # comments of a statement that went away
        for original, stmt in zip(originals, updated, strict=True):
            key = id(original)
            if key in self.plan:
                new = self.plan[key] or []
                if not new:
                    carried += list(stmt.leading_lines)
                    continue
                new = [_with_comments(new[0], stmt), *new[1:]]
            elif self.prefix.get(key):
                first = _with_comments(self.prefix[key][0], stmt, trailing=False)
                new = [first, *self.prefix[key][1:], stmt.with_changes(leading_lines=[])]
            else:
                new = [stmt]
            if carried:
                lines = carried_lines(carried, list(_statement_lines(new[0])))
                new[0] = new[0].with_changes(leading_lines=lines)
                carried = []
            body.extend(new)
        return body


def _statement_lines(statement: cst.BaseStatement) -> Sequence[cst.EmptyLine]:
    # Each kind of statement has leading_lines; libcst's BaseStatement does not declare them.
    return cast("cst.SimpleStatementLine | cst.BaseCompoundStatement", statement).leading_lines


def _with_comments(
    new: cst.BaseStatement, old: cst.BaseStatement, trailing: bool = True
) -> cst.BaseStatement:
    """``new`` takes ``old``'s leading lines and, if it had one, its end-of-line comment."""
    new = new.with_changes(leading_lines=_statement_lines(old))
    if not trailing or not isinstance(old, cst.SimpleStatementLine):
        return new
    if old.trailing_whitespace.comment is None:
        return new
    if isinstance(new, cst.SimpleStatementLine):
        return new.with_changes(trailing_whitespace=old.trailing_whitespace)
    body = getattr(new, "body", None)
    if isinstance(body, cst.IndentedBlock):
        return new.with_changes(body=body.with_changes(header=old.trailing_whitespace))
    return new


def remove_statement(
    config: DeviceConfig, statement: cst.BaseStatement
) -> tuple[cst.CSTNode, cst.CSTNode]:
    """(block, block without ``statement``); an emptied block gets `pass`."""
    block = config.parent(statement)
    assert block is not None
    if not config.fixing:
        return block, block  # scan: the fix exists; nobody applies it
    return block, cast(cst.CSTNode, block.visit(_Rewrite({id(statement): []}, {}, {})))
