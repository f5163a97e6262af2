from __future__ import annotations

import libcst as cst

from tfmigrate import tfapi
from tfmigrate.names import dotted
from tfmigrate.rule import Example, FixSafety

from ._tf_api import COMPAT_V1, ApiNameRule, build_chain

# tf.estimator is gone from TF 2.16 on; its mode keys were string constants, which a model
# function that never ran under an Estimator still compares against.
_MODE_KEYS = {
    "tf.estimator.ModeKeys.TRAIN": "train",
    "tf.estimator.ModeKeys.EVAL": "eval",
    "tf.estimator.ModeKeys.PREDICT": "infer",
}

_NO_SPACE = cst.AssignEqual(
    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
)


# TF 0.x names TF 1.0 renamed (its release notes); old tower code still uses them, and TF's
# upgrade tables, which start at TF1, do not know them. TF1's summary ops are tf.compat.v1's:
# TF2's tf.summary.scalar is another function (it writes to a default writer).
_V1 = "tf.compat.v1."
_TF0_NAMES = {
    "tf.mul": "tf.multiply",
    "tf.sub": "tf.subtract",
    "tf.neg": "tf.negative",
    "tf.pack": "tf.stack",
    "tf.unpack": "tf.unstack",
    "tf.select": "tf.where",
    "tf.initialize_all_variables": "tf.global_variables_initializer",
    "tf.initialize_local_variables": "tf.local_variables_initializer",
    "tf.initialize_variables": "tf.variables_initializer",
    "tf.all_variables": "tf.global_variables",
    "tf.merge_all_summaries": "tf.summary.merge_all",
    "tf.merge_summary": "tf.summary.merge",
    "tf.scalar_summary": "tf.compat.v1.summary.scalar",
    "tf.histogram_summary": "tf.compat.v1.summary.histogram",
    "tf.image_summary": "tf.compat.v1.summary.image",
    "tf.audio_summary": "tf.compat.v1.summary.audio",
    "tf.train.SummaryWriter": "tf.summary.FileWriter",
}


def _integer(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
        value = value.expression
    return isinstance(value, cst.Integer)


def _tf0_arguments(name: str, call: cst.Call | None) -> list[cst.Arg] | None:
    """``concat(0, values)`` -> ``concat(values, 0)`` and ``split(0, n, value)`` ->
    ``split(value, n, axis=0)``: TF 0.x put the dimension first. A literal integer first is
    that order (TF1's first argument is a tensor or a list of them)."""
    if call is None or name not in ("tf.concat", "tf.split") or any(a.star for a in call.args):
        return None
    positional = [a for a in call.args if a.keyword is None]
    keywords = [a for a in call.args if a.keyword is not None]
    if not positional or not _integer(positional[0].value):
        return None
    if name == "tf.concat" and len(positional) == 2:
        new = [positional[1], positional[0]]
    elif name == "tf.split" and len(positional) == 3:
        axis = positional[0].with_changes(keyword=cst.Name("axis"), equal=_NO_SPACE)
        new = [positional[2], positional[1], axis]
    else:
        return None
    return [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in [*new, *keywords]]


def _available(name: str) -> bool:
    return bool(tfapi.exists(name)) or tfapi.needs_legacy_keras(name)


def _binding_changed(call: cst.Call | None, v1: str, v2: str) -> bool:
    """Would this call bind its arguments differently to TF1's and TF2's function? (Unknown
    signatures or a non-call use count as changed: keeping TF1's function is always faithful.)"""
    old, new = tfapi.lookup(v1), tfapi.lookup(v2)
    if call is None or old is None or new is None:
        return True
    old_pos, new_pos = tfapi.positional_names(old.params), tfapi.positional_names(new.params)
    if old_pos is None or new_pos is None:
        return True
    for index, arg in enumerate(call.args):
        if arg.star:
            return True
        if arg.keyword is None:
            if index >= len(old_pos) or index >= len(new_pos):
                return True
            # A parameter merely renamed in place (`tensor` -> `input`) binds the same value;
            # one that moved (`keep_prob` became `rate`, which TF1 had elsewhere) does not.
            was, now = old_pos[index], new_pos[index]
            if was != now and (now in old_pos or was in new_pos):
                return True
        elif not new.accepts_keyword(arg.keyword.value):
            return True
    return False


def _rewrite_args(call: cst.Call, name: str) -> tuple[list[cst.Arg], list[str]] | None:
    """Apply TF's argument reorder (positional -> keyword) and keyword renames for TF1 ``name``.
    None when nothing changes or the call cannot be rewritten safely (``*args``, clashes)."""
    order = tfapi.reorder(name)
    renames = tfapi.keyword_renames(name)
    if not order and not renames:
        return None
    args: list[cst.Arg] = []
    notes: list[str] = []
    position = 0
    for arg in call.args:
        if arg.star == "*":
            return None  # positions after *args are unknowable
        if arg.keyword is None and not arg.star and order:
            if position >= len(order):
                return None
            keyword = order[position]
            position += 1
            if keyword is not None:
                arg = arg.with_changes(keyword=cst.Name(keyword), equal=_NO_SPACE)
                if "by keyword" not in notes:
                    notes.append("by keyword")
        if arg.keyword is not None and arg.keyword.value in renames:
            new = renames[arg.keyword.value]
            if new is None:
                notes.append(f"`{arg.keyword.value}=` dropped")
                continue
            notes.append(f"`{arg.keyword.value}=` -> `{new}=`")
            arg = arg.with_changes(keyword=cst.Name(new))
        args.append(arg)
    if not notes:
        return None
    keywords = [a.keyword.value for a in args if a.keyword is not None]
    if len(keywords) != len(set(keywords)):
        return None
    if args:  # the new last argument keeps the call's trailing-comma style
        args[-1] = args[-1].with_changes(comma=call.args[-1].comma)
    notes = ["positional arguments passed by keyword" if n == "by keyword" else n for n in notes]
    return args, notes


class Tf1ApiToCompatV1(ApiNameRule):
    """
    ## What it does
    Gives TF1 symbols that no structural rule converts their TF2 spelling from TensorFlow's own
    upgrade tables (`tf_upgrade_v2`): `tf.Session` becomes `tf.compat.v1.Session`, `tf.log`
    becomes `tf.math.log`, keyword arguments renamed in TF2 (`keep_dims` -> `keepdims`) are
    renamed, and arguments whose position changed are passed by keyword. Functions whose TF2
    behaviour differs (`tf.nn.dropout`'s `keep_prob`) stay on `tf.compat.v1` when the call would
    bind its arguments differently. TF 0.x names and argument orders that old tower code still
    has (`tf.mul`, `tf.scalar_summary`, `tf.concat(0, values)`, `tf.split(0, n, value)`) become
    their TF1 function first, spelled the same way.

    ## Why is this bad?
    TF 2.x removed these names from `tf.`: the program stops at the first one. What the
    whole-program conversion does not turn into idiomatic TF2 must still run, and
    `tf.compat.v1` keeps TF1's exact behaviour. Each finding names what is left on
    `tf.compat.v1`, so the summary shows how much TF1 remains. Files imported as
    `import tensorflow.compat.v1 as tf` already spell everything that way.

    ## Example
    ```python
    import tensorflow as tf
    sess = tf.Session()
    m = tf.reduce_mean(x, reduction_indices=[1], keep_dims=True)
    ```
    Use instead:
    ```python
    import tensorflow as tf
    sess = tf.compat.v1.Session()
    m = tf.reduce_mean(x, axis=[1], keepdims=True)
    ```

    ## Fix safety
    Safe: these are TensorFlow's own mechanical renames, and `tf.compat.v1` is the TF1
    implementation. A table target that the TensorFlow the data was generated from no longer has
    is reported without a fix. Targets such as `tf.compat.v1.layers` need the `tf_keras`
    package and `TF_USE_LEGACY_KERAS=1`; the message says so. Graph-mode code still needs
    `tf.compat.v1.disable_eager_execution()` to run.
    """

    code = "TFM301"
    name = "tf1-api-to-compat-v1"
    summary = "TF1 symbol renamed by TensorFlow's upgrade tables (kept on tf.compat.v1 or TF2)"
    fix_safety = FixSafety.SAFE
    # Opt-in until the whole-program conversion decides what stays on compat.v1: on a tower
    # script it renames dozens of names, which would drown the structural findings.
    default_enabled = False

    valid = (
        "import tensorflow.compat.v1 as tf\nsess = tf.Session()\ny = tf.layers.dense(x, 3)\n",
        "import tensorflow as tf\nsess = tf.compat.v1.Session()\nm = tf.reduce_mean(x, axis=1)\n",
        "import tensorflow as tf\ny = tf.nn.dropout(x, rate=0.5)\nz = tf.zeros_like(x)\n",
        # TF2 code (tf.distribute): TFM205's business, even for names TF's table renames.
        "import tensorflow as tf\nstrategy = tf.distribute.MirroredStrategy()\n"
        "init = tf.keras.initializers.Constant(0.1)\n",
        "class Session:\n    pass\ns = Session()\n",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            x = tf.placeholder(tf.float32, [None, 3])
            with tf.Session(config=config) as sess:
                sess.run(tf.global_variables_initializer())
            """,
            fixed="""
            import tensorflow as tf
            x = tf.compat.v1.placeholder(tf.float32, [None, 3])
            with tf.compat.v1.Session(config=config) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
            """,
            message="`tf.Session` -> `tf.compat.v1.Session`",
        ),
        Example(
            """
            import tensorflow as tf
            m = tf.reduce_mean(x, reduction_indices=[1], keep_dims=True)
            p = tf.argmax(logits, 1, 'pred')
            n = tf.log(x)
            """,
            fixed="""
            import tensorflow as tf
            m = tf.reduce_mean(x, axis=[1], keepdims=True)
            p = tf.argmax(logits, 1, name='pred')
            n = tf.math.log(x)
            """,
            message="`keep_dims=` -> `keepdims=`",
        ),
        Example(
            """
            import tensorflow as tensorflow_v1
            ops = tensorflow_v1.get_collection(tensorflow_v1.GraphKeys.UPDATE_OPS)
            y = tensorflow_v1.nn.dropout(x, 0.5)
            h = tensorflow_v1.layers.dense(x, 10)
            """,
            fixed="""
            import tensorflow as tensorflow_v1
            ops = tensorflow_v1.compat.v1.get_collection(tensorflow_v1.compat.v1.GraphKeys.UPDATE_OPS)
            y = tensorflow_v1.compat.v1.nn.dropout(x, 0.5)
            h = tensorflow_v1.compat.v1.layers.dense(x, 10)
            """,
            message="needs tf_keras",
        ),
        Example(
            """
            import tensorflow as tf
            cell = tf.contrib.rnn.LSTMCell(128)
            flags = tf.app.flags
            """,
            fixed="""
            import tensorflow as tf
            cell = tf.compat.v1.nn.rnn_cell.LSTMCell(128)
            flags = tf.app.flags
            """,
            message="absl",
        ),
        Example(
            """
            import tensorflow as tf
            xs = tf.split(0, 2, x)
            y = tf.concat(1, [a, b])
            s = tf.scalar_summary('loss', tf.mul(loss, 2.0))
            """,
            fixed="""
            import tensorflow as tf
            xs = tf.split(x, 2, axis=0)
            y = tf.concat([a, b], 1)
            s = tf.compat.v1.summary.scalar('loss', tf.multiply(loss, 2.0))
            """,
            message="TF 0.x",
        ),
        Example(
            """
            import tensorflow as tf
            training = mode == tf.estimator.ModeKeys.TRAIN
            """,
            fixed="""
            import tensorflow as tf
            training = mode == 'train'
            """,
            message="is the string 'train'",
        ),
        Example(
            """
            from tensorflow.train import AdamOptimizer
            import tensorflow as tf
            opt = AdamOptimizer(0.1)
            """,
            message="`tf.compat.v1.train.AdamOptimizer`",
        ),
    )

    def __init__(self, context) -> None:
        super().__init__(context)
        self.calls: dict[int, cst.Call] = {}

    def visit_Call(self, node: cst.Call) -> None:
        self.calls[id(node.func)] = node

    def finish(self, kind: str | None) -> None:
        if kind == "tf2":
            return
        for alias, raw in self.imports:
            self._check_import(alias, raw)
        for node, raw, binding in self.chains:
            if not isinstance(node, cst.Attribute) or raw.startswith(COMPAT_V1):
                continue
            name = tfapi.tf_spelling(raw)
            if name.startswith("tf.") and not name.startswith("tf.compat."):
                self._check(node, name, binding, self.calls.get(id(node)))

    def _check_import(self, alias: cst.CSTNode, raw: str) -> None:
        name = tfapi.tf_spelling(raw)
        if not name.startswith("tf.") or name.startswith("tf.compat.") or name.count(".") < 2:
            return
        found = tfapi.tf2_rename(name)
        if found is not None and found[0] == name and _available(found[1]):
            self.report(
                alias,
                f"`{name}` is `{found[1]}` in TF2: import it from there (TF's upgrade table)",
            )

    def _check(self, node: cst.Attribute, name: str, binding: str, call: cst.Call | None) -> None:
        if name in _MODE_KEYS and not tfapi.exists("tf.estimator"):
            value = _MODE_KEYS[name]
            self.report(
                node,
                f"`{name}` is the string {value!r}: tf.estimator is not in TensorFlow "
                f"{tfapi.versions()['tensorflow']}",
                replacement=cst.SimpleString(repr(value)),
            )
            return
        tf1 = _TF0_NAMES.get(name)
        reordered = _tf0_arguments(name, call)
        if tf1 is not None or reordered is not None:
            self._tf0(node, name, tf1 or name, binding, call, reordered)
            return
        new_name: str | None = None
        found = tfapi.tf2_rename(name)
        if found is not None:
            prefix, target = found
            if not _available(target):
                deprecation = tfapi.module_deprecation(prefix)
                self.report(
                    node,
                    f"`{prefix}`: TF's upgrade table maps it to `{target}`, which TensorFlow "
                    f"{tfapi.versions()['tensorflow']} no longer provides"
                    + (f": {deprecation[1]}" if deprecation else ""),
                )
                return
            new_name = target + name[len(prefix) :]
        elif tfapi.is_transformed(name):
            v1 = "tf.compat.v1." + name[3:]
            if tfapi.exists(v1) and _binding_changed(call, v1, name):
                new_name = v1
        rewritten = _rewrite_args(call, name) if call is not None else None
        if new_name is None and rewritten is None:
            return

        func: cst.BaseExpression = node
        parts: list[str] = []
        if new_name is not None:
            spelled = self._spell(node, binding, new_name)
            if spelled is None:
                self.report(node, f"`{name}` is `{new_name}` in TF2 (TF's upgrade table)")
                return
            func = build_chain(spelled)
            where = "kept on tf.compat.v1" if new_name.startswith("tf.compat.v1.") else "TF2"
            parts.append(f"`{name}` -> `{new_name}` ({where})")
            if tfapi.needs_legacy_keras(new_name):
                parts.append("needs tf_keras and TF_USE_LEGACY_KERAS=1")
        else:
            parts.append(f"`{name}`: TF2 changed its arguments")
        if rewritten is not None:
            parts.extend(rewritten[1])
        message = "; ".join(parts)
        if call is not None and (rewritten is not None):
            args = rewritten[0]
            self.report(call, message, replacement=call.with_changes(func=func, args=args))
        else:
            self.report(node, message, replacement=func)

    def _tf0(
        self,
        node: cst.Attribute,
        name: str,
        tf1: str,
        binding: str,
        call: cst.Call | None,
        reordered: list[cst.Arg] | None,
    ) -> None:
        """A TF 0.x name or argument order: its TF1 function, on its TF2 spelling."""
        found = None if tf1.startswith(_V1) else tfapi.tf2_rename(tf1)
        target = found[1] + tf1[len(found[0]) :] if found is not None else tf1
        if not _available(target) and not target.startswith(_V1):
            target = _V1 + tf1[3:]
        spelled = self._spell(node, binding, target)
        if spelled is None:
            self.report(node, f"`{name}` is TF 0.x: `{target}` in TF2")
            return
        func = build_chain(spelled)
        if reordered is not None and call is not None:
            self.report(
                call,
                f"`{name}` with TF 0.x's argument order (the dimension first): "
                f"`{target}` takes it {'last' if name == 'tf.concat' else 'as axis='}",
                replacement=call.with_changes(func=func, args=reordered),
            )
            return
        where = "kept on tf.compat.v1" if target.startswith("tf.compat.v1.") else "TF2"
        self.report(
            node,
            f"`{name}` is TF 0.x: `{tf1.replace(_V1, 'tf.')}` in TF1, `{target}` ({where})",
            replacement=func,
        )

    def _spell(self, node: cst.Attribute, binding: str, new_name: str) -> str | None:
        """The new chain in the user's own alias (``tensorflow_v1.compat.v1.Session``)."""
        written = dotted(node) or ""
        head = written.split(".")[0]
        qualified = "tensorflow" + new_name[2:]
        if qualified.startswith(binding + "."):
            return head + qualified[len(binding) :]
        local = self.context.resolver.local_name_for("tensorflow")
        if local is not None and self.context.resolver.bindings.get(local) == "tensorflow":
            return local + qualified[len("tensorflow") :]
        return None
