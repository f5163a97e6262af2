from __future__ import annotations

import libcst as cst
from libcst.metadata import PositionProvider

from tfmigrate.rule import Example, FixSafety, Rule
from tfmigrate.rules.session_device_config import tf_imports, tf_module

_PREFIXES = ("tensorflow.contrib.memory_stats.", "tensorflow.contrib.memory_stats.python.ops.")
# op -> key of tf.config.experimental.get_memory_info (None: no TF2 equivalent)
_KEYS = {"MaxBytesInUse": "peak", "BytesInUse": "current", "BytesLimit": None}


def _op(name: str | None) -> str | None:
    if name is None or not name.startswith(_PREFIXES):
        return None
    op = name.rsplit(".", 1)[1]
    return op if op in _KEYS else None


class ContribMemoryStats(Rule):
    """
    ## What it does
    Flags `tf.contrib.memory_stats` ops: `MaxBytesInUse()`, `BytesInUse()`, `BytesLimit()`.

    ## Why is this bad?
    `tf.contrib` does not exist in TF2. The TF2 equivalent is
    `tf.config.experimental.get_memory_info(device)`, a plain Python dict: `['peak']` is
    `MaxBytesInUse`, `['current']` is `BytesInUse`; `BytesLimit` has none (the limit is whatever
    memory growth or `set_logical_device_configuration` allows). Unlike the old ops, which
    returned 0 on a CPU, `get_memory_info` raises `ValueError` on CPU devices, so the
    replacement must check for a GPU first.

    ## Example
    ```python
    peak = sess.run(tf.contrib.memory_stats.MaxBytesInUse())
    ```
    Use instead:
    ```python
    peak = (tf.config.experimental.get_memory_info('GPU:0')['peak']
            if tf.config.list_physical_devices('GPU') else 0)
    ```

    ## Fix safety
    Safe where the op's value is fetched right away (`sess.run(MaxBytesInUse())`,
    `K.get_session().run(BytesInUse())`): the whole fetch becomes the dict lookup on `GPU:0`
    (where TF1 placed the op), with 0 on a machine without GPUs, as TF1's CPU kernel returned.
    An op kept as a tensor (passed around, fetched with others), placed on another device, or
    `BytesLimit` is left for a person.
    """

    code = "TFM109"
    triggers = ("memory_stats", "BytesInUse", "BytesLimit")
    name = "contrib-memory-stats"
    summary = "tf.contrib.memory_stats: use tf.config.experimental.get_memory_info"
    fix_safety = FixSafety.SAFE

    valid = (
        """import tensorflow as tf
if tf.config.list_physical_devices('GPU'):
    peak = tf.config.experimental.get_memory_info('GPU:0')['peak']
""",
        # A user's own helper with the same name.
        """import tensorflow as tf
from myproject.profiling import MaxBytesInUse
peak = sess.run(MaxBytesInUse())
""",
        "import tensorflow as tf\nused = tf.contrib.layers.flatten(x)\n",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            from keras import backend as K
            print('peak GPU memory (MB):', K.get_session().run(tf.contrib.memory_stats.MaxBytesInUse()) / 2**20)
            """,
            fixed="""
            import tensorflow as tf
            from keras import backend as K
            print('peak GPU memory (MB):', (tf.config.experimental.get_memory_info('GPU:0')['peak']
                                            if tf.config.list_physical_devices('GPU') else 0) / 2**20)
            """,
            message="get_memory_info",
        ),
        Example(
            """
            from tensorflow.contrib.memory_stats import BytesInUse
            with tf.Session() as sess:
                in_use = sess.run(BytesInUse())
            """,
            fixed="""
            from tensorflow.contrib.memory_stats import BytesInUse
            import tensorflow as tf

            with tf.Session() as sess:
                in_use = (tf.config.experimental.get_memory_info('GPU:0')['current']
                          if tf.config.list_physical_devices('GPU') else 0)
            """,
        ),
        # Kept as a tensor and fetched later: a person decides.
        Example(
            """
            import tensorflow as tf
            max_bytes = tf.contrib.memory_stats.MaxBytesInUse()
            _, peak = sess.run([train_op, max_bytes])
            """,
            message="MaxBytesInUse",
        ),
        Example(
            """
            import tensorflow as tf
            limit = sess.run(tf.contrib.memory_stats.BytesLimit())
            """,
            message="no TF2 equivalent",
        ),
        Example(
            """
            import tensorflow as tf
            with tf.device('/gpu:1'):
                peak = sess.run(tf.contrib.memory_stats.MaxBytesInUse())
            """,
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        op = _op(self.call_name(node))
        if op is None:
            return
        key = _KEYS[op]
        if key is None:
            self.report(
                node,
                "`tf.contrib.memory_stats.BytesLimit()` is gone and has no TF2 equivalent: the "
                "limit is set by memory growth or `tf.config.set_logical_device_configuration`",
            )
            return
        message = (
            f"`tf.contrib.memory_stats.{op}()` is gone with tf.contrib: use "
            f"`tf.config.experimental.get_memory_info(device)['{key}']` (it raises on CPU "
            "devices, so check for a GPU)"
        )
        fetch = self._fetch(node)
        if fetch is None or self._under_device_scope(node):
            self.report(node, message + " (not fixed: the op is not fetched right away on GPU:0)")
            return
        tf = tf_module(self) or "tf"
        value = cst.parse_expression(
            f"{tf}.config.experimental.get_memory_info('GPU:0')['{key}'] "
            f"if {tf}.config.list_physical_devices('GPU') else 0"
        )
        # Parenthesized, the `if` goes on its own line aligned under the value.
        start = self.get_metadata(PositionProvider, fetch).start
        line = self.context.module.code.splitlines()[start.line - 1]
        indent = len(line) - len(line.lstrip())
        assert isinstance(value, cst.IfExp)
        value = value.with_changes(
            lpar=[cst.LeftParen()],
            rpar=[cst.RightParen()],
            whitespace_before_if=cst.ParenthesizedWhitespace(
                indent=True, last_line=cst.SimpleWhitespace(" " * (start.column - indent + 1))
            ),
        )
        imports = tf_imports(self)
        self.report(node, message, replacement=value, target=fetch, imports=imports)

    def _fetch(self, node: cst.Call) -> cst.Call | None:
        """The `X.run(op)` call that fetches ``node`` alone, if any."""
        arg = self.parent(node)
        run = self.parent(arg) if isinstance(arg, cst.Arg) else None
        if (
            isinstance(run, cst.Call)
            and isinstance(run.func, cst.Attribute)
            and run.func.attr.value == "run"
            and len(run.args) == 1
            and run.args[0] is arg
            and arg.keyword is None
        ):
            return run
        return None

    def _under_device_scope(self, node: cst.CSTNode) -> bool:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.With):
                for item in ancestor.items:
                    call = item.item
                    if isinstance(call, cst.Call) and (self.call_name(call) or "").endswith(
                        ".device"
                    ):
                        return True
        return False
