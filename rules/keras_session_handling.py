from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import libcst as cst

from tfmigrate.rule import Example, FixSafety, Rule
from tfmigrate.rules._device_config import (
    CONFIG_PROTO,
    EXPLAIN,
    GPU_OPTIONS,
    Setting,
    attribute_path,
    remove_statement,
)
from tfmigrate.rules._towers import bound_names
from tfmigrate.rules.session_device_config import device_config, tf_imports
from tfmigrate.syntax import carried_lines, walk

# Canonical spellings: the name resolver folds `keras.backend.tensorflow_backend`,
# `tensorflow.python.keras` and `tensorflow.compat.v1` into these.
SET_SESSION = frozenset({"keras.backend.set_session", "tensorflow.keras.backend.set_session"})
GET_SESSION = frozenset({"keras.backend.get_session", "tensorflow.keras.backend.get_session"})
SESSION = "tensorflow.Session"


class _NotFollowed(Exception):
    """The session handed to `set_session` is built in a way this rule does not follow."""


@dataclass
class _Sessions:
    """Every `set_session` of a module whose sessions only carry device settings: what goes
    (statements, by id), the `tf.config` code the first call becomes, the TODOs for settings
    without a TF2 equivalent."""

    calls: list[cst.SimpleStatementLine] = field(default_factory=list)
    drop: set[int] = field(default_factory=set)
    settings: list[Setting] = field(default_factory=list)
    helpers: set[str] = field(default_factory=set)  # functions that built the sessions
    names: list[str] = field(default_factory=list)  # variables of the dropped statements


def _small(statement: cst.CSTNode) -> cst.BaseSmallStatement | None:
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        return statement.body[0]
    return None


def _assigned_call(statement: cst.CSTNode) -> tuple[str, cst.Call] | None:
    """`name = Call(...)` as a whole line."""
    small = _small(statement)
    if (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name)
        and isinstance(small.value, cst.Call)
    ):
        return small.targets[0].target.value, small.value
    return None


def _occurs(node: cst.CSTNode, name: str, skip: set[int], root: bool = True) -> int:
    """How often ``name`` is spelled as a variable in ``node`` outside the statements in
    ``skip`` (functions that bind it locally, attributes and keywords do not count)."""
    if id(node) in skip:
        return 0
    if isinstance(node, cst.FunctionDef | cst.ClassDef):
        if isinstance(node, cst.FunctionDef) and not root:
            params = {p.name.value for p in node.params.params}
            if name in params or name in bound_names(node.body):
                return 0
        # the name a def binds is not a read of it
        return sum(_occurs(c, name, skip, False) for c in node.children if c is not node.name)
    if isinstance(node, cst.Name):
        return int(node.value == name)
    if isinstance(node, cst.Attribute):
        return _occurs(node.value, name, skip, False)
    if isinstance(node, cst.Arg):
        return _occurs(node.value, name, skip, False)
    return sum(_occurs(child, name, skip, False) for child in node.children)


class KerasSessionHandling(Rule):
    """
    ## What it does
    Flags Keras 2's `set_session` and `get_session` (from `keras.backend`,
    `keras.backend.tensorflow_backend`, `tf.keras.backend`, `tensorflow.python.keras.backend`).

    ## Why is this bad?
    Keras 3 has no TensorFlow session: `keras.backend.set_session` and `get_session` do not
    exist, and TF2 runs eagerly. Keras 2 scripts mostly called `set_session(tf.Session(config=
    config))` only to pass GPU options (memory growth, soft placement); in TF2 these are
    process-wide `tf.config` calls (see TFM105). `get_session().run(tensor)` becomes evaluating
    the value directly (for memory statistics, `tf.config.experimental.get_memory_info`, see
    TFM109).

    ## Example
    ```python
    config = tf.ConfigProto()
    config.gpu_options.allow_growth = True
    KTF.set_session(tf.Session(config=config))
    ```
    Use instead:
    ```python
    for gpu in tf.config.list_physical_devices('GPU'):
        tf.config.experimental.set_memory_growth(gpu, True)
    ```

    ## Fix safety
    Safe where the session only carried device settings that all have `tf.config` equivalents
    (a `tf.Session()` with no argument, or one whose `config` TFM105 can move): the settings
    become `tf.config` calls and the `set_session` statement goes. A session with a graph, a
    target, or a config that is also used elsewhere, and every `get_session`, are left for a
    person (or the whole-program conversion).

    Sessions built by the program's own code are followed too: a session variable only Keras
    uses (`sess = tf.Session(config=config); K.set_session(sess)`), a config and its field
    assignments made before it (also when a function rebinds the same name for itself), and a
    helper of the module that builds the config and returns the session
    (`K.set_session(get_session(0.9))`, its parameters read as the call passes them). The first
    `set_session` becomes the `tf.config` calls, later ones (a reload calling the helper again)
    go, since TF2 device settings are made once, before the devices initialize (a second
    `set_memory_growth` raises); the statements that built the sessions go, and the helper too
    once nothing else calls it. A setting with no `tf.config` equivalent
    (`per_process_gpu_memory_fraction`) is left as a `# TODO(tfmigrate): TFM108` comment saying
    what to choose: that fix is unsafe, the others safe.
    """

    code = "TFM108"
    # every report is such a call, or a Keras file's session helper nothing calls
    triggers = (
        *sorted(SET_SESSION | GET_SESSION),
        ("tensorflow.Session", "keras*"),
        ("tensorflow.Session", "tensorflow.keras"),
    )
    name = "keras-session-handling"
    summary = "Keras 2 set_session/get_session: no sessions in Keras 3"
    fix_safety = FixSafety.SAFE

    valid = (
        # TF2: device settings already through tf.config.
        """import tensorflow as tf
for gpu in tf.config.list_physical_devices('GPU'):
    tf.config.experimental.set_memory_growth(gpu, True)
""",
        # The user's own function of the same name.
        """import tensorflow as tf
def set_session(session):
    global SESSION
    SESSION = session
set_session(tf.Session())
""",
        # clear_session still exists in Keras 3.
        "from keras import backend as K\nK.clear_session()\n",
        # A method called get_session on some other object.
        "import keras\nsession = client.get_session()\n",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            import keras.backend.tensorflow_backend as KTF

            config = tf.ConfigProto()
            config.gpu_options.allow_growth = True
            KTF.set_session(tf.Session(config=config))
            model = build_model()
            """,
            fixed="""
            import tensorflow as tf
            import keras.backend.tensorflow_backend as KTF

            for gpu in tf.config.list_physical_devices('GPU'):
                tf.config.experimental.set_memory_growth(gpu, True)
            model = build_model()
            """,
            message="no TensorFlow session",
        ),
        Example(
            """
            import tensorflow as tf
            from keras.backend.tensorflow_backend import set_session

            def setup():
                # GPU memory on demand, ops without GPU kernels on the CPU.
                set_session(tf.Session(config=tf.ConfigProto(
                    allow_soft_placement=True,
                    gpu_options=tf.GPUOptions(allow_growth=True))))
            """,
            fixed="""
            import tensorflow as tf
            from keras.backend.tensorflow_backend import set_session

            def setup():
                # GPU memory on demand, ops without GPU kernels on the CPU.
                tf.config.set_soft_device_placement(True)
                for gpu in tf.config.list_physical_devices('GPU'):
                    tf.config.experimental.set_memory_growth(gpu, True)
            """,
        ),
        Example(
            """
            import tensorflow as tf
            from tensorflow.keras import backend as K
            if USE_GPU:
                K.set_session(tf.Session())
            """,
            fixed="""
            import tensorflow as tf
            from tensorflow.keras import backend as K
            if USE_GPU:
                pass
            """,
        ),
        # A helper that builds the session, called before training and again before a reload:
        # its settings become tf.config calls once, where it was first called; the helper goes.
        Example(
            """
            import tensorflow as tf
            import keras.backend.tensorflow_backend as KTF

            def get_session(growth=True):
                config = tf.ConfigProto(log_device_placement=False)
                config.gpu_options.allow_growth = growth
                return tf.Session(config=config)

            KTF.set_session(get_session())
            model = train()
            KTF.set_session(get_session())
            model.load_weights('model.h5')
            """,
            fixed="""
            import tensorflow as tf
            import keras.backend.tensorflow_backend as KTF

            for gpu in tf.config.list_physical_devices('GPU'):
                tf.config.experimental.set_memory_growth(gpu, True)
            model = train()
            model.load_weights('model.h5')
            """,
        ),
        # A session variable Keras alone uses; a compat.v1 config with a memory fraction, whose
        # name a function binds again for itself: the fraction is left to a person, as a TODO.
        Example(
            """
            import tensorflow as tf

            config = tf.compat.v1.ConfigProto(
                gpu_options=tf.compat.v1.GPUOptions(per_process_gpu_memory_fraction=0.5))
            config.gpu_options.allow_growth = True
            session = tf.compat.v1.Session(config=config)
            tf.compat.v1.keras.backend.set_session(session)

            def main(path):
                config = load(path)
            """,
            fixed="""
            import tensorflow as tf

            # TODO(tfmigrate): TFM108 the session set per_process_gpu_memory_fraction=0.5; """
            + EXPLAIN["gpu_options.per_process_gpu_memory_fraction"]
            + """
            for gpu in tf.config.list_physical_devices('GPU'):
                tf.config.experimental.set_memory_growth(gpu, True)

            def main(path):
                config = load(path)
            """,
            message="left as a TODO",
        ),
        # A session helper left behind (its set_session commented out): it goes, unsafe.
        Example(
            """
            import tensorflow as tf
            from tensorflow import keras

            def get_session():
                \"\"\"A session that grows GPU memory.\"\"\"
                config = tf.ConfigProto()
                config.gpu_options.allow_growth = True
                return tf.Session(config=config)

            # keras.backend.set_session(get_session())
            model = keras.Sequential()
            """,
            fixed="""
            import tensorflow as tf
            from tensorflow import keras

            # keras.backend.set_session(get_session())
            model = keras.Sequential()
            """,
            message="nothing in this file calls it",
        ),
        # The session is kept and used: a person decides.
        Example(
            """
            import tensorflow as tf
            from keras import backend as K
            sess = tf.Session(graph=graph)
            K.set_session(sess)
            """,
            message="set_session",
        ),
        # The config carries only a memory fraction: no tf.config equivalent, a TODO.
        Example(
            """
            import tensorflow as tf
            from keras import backend as K
            config = tf.ConfigProto(gpu_options=tf.GPUOptions(per_process_gpu_memory_fraction=0.5))
            K.set_session(tf.Session(config=config))
            """,
            fixed="""
            import tensorflow as tf
            from keras import backend as K
            # TODO(tfmigrate): TFM108 the session set per_process_gpu_memory_fraction=0.5; """
            + EXPLAIN["gpu_options.per_process_gpu_memory_fraction"]
            + "\n",
        ),
        Example(
            """
            from keras import backend as K
            sess = K.get_session()
            """,
            message="get_session",
        ),
        Example(
            """
            import tensorflow.compat.v1 as tf
            value = tf.keras.backend.get_session().run(loss)
            """,
        ),
    )

    # -- sessions built by the program's own code ---------------------------------------------
    def _sessions(self) -> _Sessions | None:
        return self.context.shared("tfm108:sessions", self._follow_sessions)

    def _follow_sessions(self) -> _Sessions | None:
        """Every `set_session` of the module, followed to the settings of its session (inline,
        a session variable, a config built before, a user helper that returns the session);
        None when one of them is built any other way."""
        found = _Sessions()
        for node in walk(self.context.module):
            if not isinstance(node, cst.Call) or self.call_name(node) not in SET_SESSION:
                continue
            holder = self.parent(node)
            line = self.parent(holder) if holder is not None else None
            if not (
                isinstance(self.parent(node), cst.Expr)
                and isinstance(line, cst.SimpleStatementLine)
                and len(line.body) == 1
                and isinstance(self.parent(line), cst.Module | cst.IndentedBlock)
                and len(node.args) == 1
                and node.args[0].keyword is None
            ):
                return None
            try:
                self._follow(node.args[0].value, line, found)
            except _NotFollowed:
                return None
            found.calls.append(line)
        return found if found.calls else None

    def _follow(
        self, value: cst.BaseExpression, line: cst.SimpleStatementLine, found: _Sessions
    ) -> None:
        block = self.parent(line)
        assert isinstance(block, cst.Module | cst.IndentedBlock)
        before = list(block.body)[: list(block.body).index(line)]
        names = len(found.names)
        if isinstance(value, cst.Call) and self.call_name(value) == SESSION:
            self._session(value, before, {}, found)
        elif isinstance(value, cst.Name):
            bound = [s for s in before if (_assigned_call(s) or ("", None))[0] == value.value]
            if len(bound) != 1:
                raise _NotFollowed
            assigned = _assigned_call(bound[0])
            assert assigned is not None  # how bound[0] was picked
            _, call = assigned
            if self.call_name(call) != SESSION:
                raise _NotFollowed
            found.drop.add(id(bound[0]))
            found.names.append(value.value)
            self._session(call, before, {}, found)
        elif isinstance(value, cst.Call) and isinstance(value.func, cst.Name):
            self._helper(value, found)
            return
        else:
            raise _NotFollowed
        # what goes must not be read by anything that stays (in the same function or module)
        owner: cst.CSTNode = self.context.module
        for ancestor in self.ancestors(line):
            if isinstance(ancestor, cst.FunctionDef):
                owner = ancestor
                break
        skip = set(found.drop) | {id(c) for c in found.calls} | {id(line)}
        for name in found.names[names:]:
            if _occurs(owner, name, skip):
                raise _NotFollowed  # the session or config is used for something else

    def _helper(self, call: cst.Call, found: _Sessions) -> None:
        """`set_session(get_session(0.5))` with `def get_session(fraction=...)` in this module
        building a config and returning `tf.Session(config=config)`."""
        name = cast(cst.Name, call.func).value  # called for `helper(...)` only
        if name in self.context.resolver.bindings:
            raise _NotFollowed  # imported: not this module's code
        helpers = [
            s
            for s in self.context.module.body
            if isinstance(s, cst.FunctionDef) and s.name.value == name
        ]
        if len(helpers) != 1 or not isinstance(helpers[0].body, cst.IndentedBlock):
            raise _NotFollowed
        helper = helpers[0]
        params = helper.params
        if isinstance(params.star_arg, cst.Param):
            raise _NotFollowed
        if params.star_kwarg is not None or params.kwonly_params or params.posonly_params:
            raise _NotFollowed
        given: dict[str, cst.BaseExpression] = {}
        for index, arg in enumerate(call.args):
            if arg.star or (arg.keyword is None and index >= len(params.params)):
                raise _NotFollowed
            key = arg.keyword.value if arg.keyword is not None else params.params[index].name.value
            given[key] = arg.value
        for param in params.params:
            if param.name.value not in given:
                if param.default is None:
                    raise _NotFollowed
                given[param.name.value] = param.default
        self._helper_body(helper, given, found)

    def _helper_body(
        self, helper: cst.FunctionDef, given: dict[str, cst.BaseExpression], found: _Sessions
    ) -> None:
        """The settings of a helper whose body only builds a config and returns its session."""
        name = helper.name.value
        assert isinstance(helper.body, cst.IndentedBlock)
        body = list(helper.body.body)
        small = _small(body[0]) if body else None
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.SimpleString):
            body = body[1:]  # the docstring
        last = _small(body[-1]) if body else None
        if not isinstance(last, cst.Return) or last.value is None:
            raise _NotFollowed
        result = last.value
        known: set[int] = {id(body[-1])}
        if isinstance(result, cst.Name):
            bound = [s for s in body[:-1] if (_assigned_call(s) or ("", None))[0] == result.value]
            if len(bound) != 1:
                raise _NotFollowed
            known.add(id(bound[0]))
            assigned = _assigned_call(bound[0])
            assert assigned is not None  # how bound[0] was picked
            result = assigned[1]
        if not isinstance(result, cst.Call) or self.call_name(result) != SESSION:
            raise _NotFollowed
        inner = _Sessions()
        self._session(result, body, given, inner)
        if any(id(s) not in inner.drop | known for s in body):
            raise _NotFollowed  # the helper does more than build the session
        found.settings.extend(inner.settings)
        found.helpers.add(name)

    def _session(
        self,
        call: cst.Call,
        scope: list[cst.BaseStatement],
        given: dict[str, cst.BaseExpression],
        found: _Sessions,
    ) -> None:
        if not call.args:
            return
        if len(call.args) != 1 or call.args[0].keyword is None:
            raise _NotFollowed
        if call.args[0].keyword.value != "config":
            raise _NotFollowed  # a graph or a target: more than device settings
        config = call.args[0].value
        if isinstance(config, cst.Name):
            config = self._named(config.value, CONFIG_PROTO, "", scope, given, found)
        if not isinstance(config, cst.Call) or self.call_name(config) != CONFIG_PROTO:
            raise _NotFollowed
        self._proto(config, "", scope, given, found)

    def _named(
        self,
        name: str,
        kind: str,
        prefix: str,
        scope: list[cst.BaseStatement],
        given: dict[str, cst.BaseExpression],
        found: _Sessions,
    ) -> cst.Call:
        """The `name = ConfigProto(...)` (or GPUOptions) line of ``scope`` and its later field
        assignments (`name.gpu_options.allow_growth = True`), all to be dropped."""
        bound = [s for s in scope if (_assigned_call(s) or ("", None))[0] == name]
        if len(bound) != 1:
            raise _NotFollowed
        assigned = _assigned_call(bound[0])
        assert assigned is not None  # how bound[0] was picked
        _, call = assigned
        if self.call_name(call) != kind:
            raise _NotFollowed
        found.drop.add(id(bound[0]))
        for statement in scope[scope.index(bound[0]) + 1 :]:
            small = _small(statement)
            if not isinstance(small, cst.Assign) or len(small.targets) != 1:
                continue
            path = attribute_path(small.targets[0].target)
            if path is None or path[0].value != name:
                continue
            found.drop.add(id(statement))
            found.settings.append(Setting(prefix + path[1], self._given(small.value, given)))
        found.names.append(name)
        return call

    def _proto(
        self,
        call: cst.Call,
        prefix: str,
        scope: list[cst.BaseStatement],
        given: dict[str, cst.BaseExpression],
        found: _Sessions,
    ) -> None:
        for arg in call.args:
            if arg.keyword is None:
                raise _NotFollowed
            key = arg.keyword.value
            if key == "gpu_options" and not prefix:
                options = arg.value
                if isinstance(options, cst.Name):
                    options = self._named(
                        options.value, GPU_OPTIONS, "gpu_options.", scope, given, found
                    )
                if not isinstance(options, cst.Call) or self.call_name(options) != GPU_OPTIONS:
                    raise _NotFollowed
                self._proto(options, "gpu_options.", scope, given, found)
                continue
            found.settings.append(Setting(prefix + key, self._given(arg.value, given)))

    @staticmethod
    def _given(
        value: cst.BaseExpression, given: dict[str, cst.BaseExpression]
    ) -> cst.BaseExpression:
        """A helper's parameter read in a setting stands for the value the call passes."""
        if isinstance(value, cst.Name) and value.value in given:
            return given[value.value]
        return value

    def _fixed_module(self, found: _Sessions) -> tuple[cst.Module, bool]:
        """The module with the first `set_session` turned into `tf.config` calls, the others
        and the statements that built the sessions gone (helpers nothing else calls too), and
        whether a setting without a TF2 equivalent was left as a TODO."""
        config = device_config(self)
        module = self.context.module
        seen: dict[str, str] = {}
        code: list[str] = []
        todos: list[str] = []
        for setting in found.settings:
            if self.reads_horovod(setting.value):
                raise _NotFollowed  # Horovod's GPU pinning: the Horovod conversion's (TFM402)
            value = module.code_for_node(setting.value)
            if seen.get(setting.field, value) != value:
                raise _NotFollowed  # two sessions disagree: a person decides
            if setting.field in seen:
                continue
            seen[setting.field] = value
            lines = config._statements_for(setting, 1)
            if lines is not None:
                code.extend(lines)
                continue
            leaf = setting.field.rsplit(".", 1)[-1]
            why = EXPLAIN.get(
                setting.field, f"`{leaf}` has no tf.config equivalent: set it by hand"
            )
            todos.append(f"# TODO(tfmigrate): TFM108 the session set {leaf}={value}; {why}")
        new: list[cst.BaseStatement] = (
            list(cst.parse_module("\n".join(code) + "\n").body) if code else []
        )
        comments = [cst.EmptyLine(comment=cst.Comment(t)) for t in todos]
        replaced = _Replace(found, new, comments).transform(module)
        for name in sorted(found.helpers):
            if not _occurs(replaced, name, set()):
                replaced = replaced.with_changes(
                    body=[
                        s
                        for s in replaced.body
                        if not (isinstance(s, cst.FunctionDef) and s.name.value == name)
                    ]
                )
        return replaced, bool(todos)

    def reads_horovod(self, value: cst.BaseExpression) -> bool:
        return any(
            isinstance(n, cst.Call) and (self.call_name(n) or "").startswith("horovod.")
            for n in walk(value)
        )

    def _report_followed(self, node: cst.Call, message: str, found: _Sessions) -> bool:
        try:
            fixed, todo = self.context.shared("tfm108:fixed", lambda: self._fixed_module(found))
        except _NotFollowed:
            return False
        note = "the session only carried device settings: they are `tf.config` calls now" + (
            "; a setting without a TF2 equivalent is left as a TODO" if todo else ""
        )
        self.report(
            node,
            f"{message}; {note}",
            replacement=fixed,
            target=self.context.module,
            safety=FixSafety.UNSAFE if todo else FixSafety.SAFE,
            imports=tf_imports(self),
        )
        return True

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        """A module-level helper that only builds a TF1 session, called nowhere (its
        `set_session` already gone or commented out)."""
        module = self.context.module
        if self.parent(node) is not module or not isinstance(node.body, cst.IndentedBlock):
            return
        if not any(m.startswith(("keras", "tensorflow.keras")) for m in self._imported()):
            return
        params = node.params
        if isinstance(params.star_arg, cst.Param):
            return
        if params.star_kwarg is not None or params.kwonly_params or params.posonly_params:
            return
        given = {p.name.value: p.default or p.name for p in params.params}
        try:
            self._helper_body(node, given, _Sessions())
        except _NotFollowed:
            return
        if _occurs(module, node.name.value, set()):
            return
        self.report(
            node.name,
            f"`{node.name.value}()` builds a TF1 session for Keras and nothing in this file calls "
            "it: Keras 3 has no session and `tf.Session` is gone in TF2; delete it (unsafe: "
            "another module may import it)",
            replacement=cst.RemoveFromParent(),
            target=node,
            safety=FixSafety.UNSAFE,
        )

    def _imported(self) -> set[str]:
        """What the module imports: modules and the names bound by `from ... import`."""
        resolver = self.context.resolver
        return set(resolver.imported_modules) | set(resolver.bindings.values())

    def visit_Call(self, node: cst.Call) -> None:
        name = self.call_name(node)
        if name in GET_SESSION:
            self.report(
                node,
                "`get_session()`: Keras 3 has no TensorFlow session and TF2 runs eagerly; "
                "evaluate values directly (memory statistics: "
                "`tf.config.experimental.get_memory_info`, TFM109)",
            )
        elif name in SET_SESSION:
            self._set_session(node)

    def _set_session(self, node: cst.Call) -> None:
        message = (
            "`set_session(...)`: Keras 3 has no TensorFlow session; device settings are "
            "`tf.config` calls in TF2"
        )
        config = device_config(self)
        statement = config.statement(node)
        holder = self.parent(node)
        line = self.parent(holder) if holder is not None else None
        session = node.args[0].value if len(node.args) == 1 else None
        if (
            statement is None
            or not isinstance(self.parent(node), cst.Expr)
            or line is not statement
            or not isinstance(session, cst.Call)
            or self.call_name(session) != "tensorflow.Session"
        ):
            if not self._followed(node, message):
                self.report(node, message + " (not fixed: the session is more than its config)")
            return
        if not session.args:
            target, replacement = remove_statement(config, statement)
            self.report(node, message, replacement=replacement, target=target)
            return
        group = next((g for g in config.groups if any(c is session for c in g.consumers)), None)
        keyword = session.args[0].keyword if len(session.args) == 1 else None
        only_config = keyword is not None and keyword.value == "config"
        reason = "the session is more than its config" if not only_config else None
        if reason is None:
            reason = config.why_not(group) if group else "the config is not one tfmigrate follows"
        if reason is not None:
            if not self._followed(node, message):
                self.report(node, f"{message} (not fixed: {reason})")
            return
        assert group is not None  # else a reason above
        target, replacement = config.rewrite(group, remove=(statement,))
        self.report(node, message, replacement=replacement, target=target, imports=tf_imports(self))

    def _followed(self, node: cst.Call, message: str) -> bool:
        found = self._sessions()
        holder = self.parent(node)
        line = self.parent(holder) if holder is not None else None
        if found is None or not any(c is line for c in found.calls):
            return False
        return self._report_followed(node, message, found)


class _Replace(cst.CSTTransformer):
    """Drop the statements that built the sessions; the first `set_session` line becomes the
    new `tf.config` statements (TODO comments above them), the others go."""

    def __init__(
        self, found: _Sessions, new: list[cst.BaseStatement], comments: list[cst.EmptyLine]
    ) -> None:
        super().__init__()
        self.first = id(found.calls[0])
        self.gone = found.drop | {id(c) for c in found.calls[1:]}
        self.new, self.comments = new, comments

    def transform(self, module: cst.Module) -> cst.Module:
        return module.visit(self)

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        body, left = self._body(original.body, updated.body)
        return updated.with_changes(body=body, footer=[*left, *updated.footer])

    def leave_IndentedBlock(
        self, original: cst.IndentedBlock, updated: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        body, left = self._body(original.body, updated.body)
        if not body:
            return updated.with_changes(body=[cst.SimpleStatementLine([cst.Pass()], left)])
        return updated.with_changes(body=body, footer=[*left, *updated.footer])

    def _body(self, originals, updated) -> tuple[list[cst.BaseStatement], list[cst.EmptyLine]]:
        """The new statements, and the comments left over at the end of the block."""
        body: list[cst.BaseStatement] = []
        carried: list[cst.EmptyLine] = []  # comments of statements that went away
        for original, statement in zip(originals, updated, strict=True):
            if id(original) in self.gone or id(original) == self.first:
                # the first statement that goes leaves its spacing; later ones their comments
                own = list(statement.leading_lines)
                carried += own if not carried else [line for line in own if line.comment]
            if id(original) in self.gone:
                continue
            if id(original) == self.first:
                carried += self.comments
                if not self.new:
                    continue
                new = list(self.new)
                new[0] = new[0].with_changes(leading_lines=carried)
                carried = []
                body.extend(new)
                continue
            if carried:
                lines = carried_lines(carried, statement.leading_lines)
                statement = statement.with_changes(leading_lines=lines)
                carried = []
            body.append(statement)
        return body, [line for line in carried if line.comment]
