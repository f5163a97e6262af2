from __future__ import annotations

import ast
from pathlib import PurePosixPath

import libcst as cst

from tfmigrate.prefilter import CodeFacts, argument
from tfmigrate.rule import Example, FixSafety, Rule

BATCH_NORM_FUNCTIONS = frozenset(
    {
        "tensorflow.contrib.layers.batch_norm",
        "tensorflow.contrib.slim.batch_norm",
        "tensorflow.layers.batch_normalization",
        "tensorflow.contrib.layers.python.layers.layers.batch_norm",
        "tensorflow.nn.fused_batch_norm",
    }
)


_FUNCTIONS_AND_SCOPES = BATCH_NORM_FUNCTIONS | {
    "tensorflow.contrib.framework.arg_scope",
    "tensorflow.contrib.slim.arg_scope",
}


def _ast_false(node: ast.expr | None) -> bool:
    return type(node) is ast.Constant and node.value is False


def _is_false(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "False"


def _drop_arg(call: cst.Call, arg: cst.Arg) -> cst.Call:
    args = [a for a in call.args if a is not arg]
    if args:  # the new last argument must not keep a trailing comma it did not have
        args[-1] = args[-1].with_changes(comma=call.args[-1].comma)
    return call.with_changes(args=args)


class FrozenBatchNorm(Rule):
    """
    ## What it does
    Flags TF1 batch norm layers created with `trainable=False`: directly, through a slim
    `normalizer_params` dict, or through an `arg_scope` over `batch_norm`.

    ## Why is this bad?
    In TF1, `trainable=False` only keeps gamma and beta out of `TRAINABLE_VARIABLES`: the layer
    still normalizes with batch statistics during training, so the model trains with a batch norm
    whose scale and offset never learn. This is often a copy-paste accident. Worse, the obvious
    TF2 spelling, Keras `BatchNormalization(trainable=False)`, means something else: the layer
    runs in inference mode (moving statistics, no updates). A faithful migration keeps gamma/beta
    frozen without using that flag.

    ## Example
    ```python
    net = tf.contrib.layers.batch_norm(net, is_training=True, trainable=False)
    ```
    Use instead (opt-in fix):
    ```python
    net = tf.contrib.layers.batch_norm(net, is_training=True)
    ```

    ## Fix safety
    Unsafe: making gamma/beta trainable changes what the model learns. Applied only with
    `--unsafe-fixes`, so `verify` can first prove the faithful migration. No fix is offered for an
    `arg_scope` that also covers other layers.
    """

    code = "TFM104"
    # A batch-norm function or arg_scope over one, or a normalizer_params dict; each finding is
    # a literal `trainable=False` (a keyword, or the dict's 'trainable' key).
    triggers = tuple(
        (where, "trainable=False")
        for where in (
            *sorted(BATCH_NORM_FUNCTIONS),
            "tensorflow.contrib.framework.arg_scope",
            "tensorflow.contrib.slim.arg_scope",
            "normalizer_params",
        )
    )
    name = "frozen-batch-norm"
    summary = "batch norm with trainable=False: gamma/beta never learn"
    fix_safety = FixSafety.UNSAFE

    valid = (
        "import tensorflow as tf\nnet = tf.contrib.layers.batch_norm(x, is_training=True)\n",
        "import tensorflow as tf\nnet = tf.layers.batch_normalization(x, trainable=True)\n",
        "import tensorflow as tf\nnet = tf.layers.dense(x, 10, trainable=False)\n",
        "def batch_norm(x, trainable):\n    return x\nbatch_norm(1, trainable=False)\n",
    )
    invalid = (
        Example(
            """
            import tensorflow as tf
            net = tf.contrib.layers.batch_norm(net, is_training=True, trainable=False)
            """,
            fixed="""
            import tensorflow as tf
            net = tf.contrib.layers.batch_norm(net, is_training=True)
            """,
            message="gamma/beta",
        ),
        Example(
            """
            import tensorflow.compat.v1 as tf
            y = tf.layers.batch_normalization(x, training=is_training, trainable=False, name='bn')
            """,
            fixed="""
            import tensorflow.compat.v1 as tf
            y = tf.layers.batch_normalization(x, training=is_training, name='bn')
            """,
        ),
        Example(
            """
            import tensorflow.contrib.slim as slim
            net = slim.conv2d(x, 64, [3, 3], normalizer_fn=slim.batch_norm,
                              normalizer_params={'is_training': True, 'trainable': False})
            """,
            fixed="""
            import tensorflow.contrib.slim as slim
            net = slim.conv2d(x, 64, [3, 3], normalizer_fn=slim.batch_norm,
                              normalizer_params={'is_training': True})
            """,
        ),
        Example(
            """
            from tensorflow.contrib.layers import batch_norm
            import tensorflow as tf
            slim = tf.contrib.slim
            with slim.arg_scope([slim.batch_norm], trainable=False):
                y = batch_norm(x)
            """,
            fixed="""
            from tensorflow.contrib.layers import batch_norm
            import tensorflow as tf
            slim = tf.contrib.slim
            with slim.arg_scope([slim.batch_norm]):
                y = batch_norm(x)
            """,
        ),
        Example(
            """
            import tensorflow as tf
            slim = tf.contrib.slim
            with slim.arg_scope([slim.conv2d, slim.batch_norm], trainable=False):
                y = slim.conv2d(x, 3, [3, 3])
            """,
        ),
        # Spaces around `=`: the light pass reads the keyword, not the bytes.
        Example(
            """
            import tensorflow as tf
            net = tf.layers.batch_normalization(x, training=True, trainable = False)
            """,
            fixed="""
            import tensorflow as tf
            net = tf.layers.batch_normalization(x, training=True)
            """,
        ),
    )

    @classmethod
    def may_report(cls, path: PurePosixPath, facts: CodeFacts) -> bool:
        """``visit_Call``'s three cases on the ``ast`` tree, erring towards True (an arg_scope's
        layer list is not read): `trainable=False` in the call itself, or in its
        normalizer_params dict."""
        for node in facts.nodes:
            if type(node) is not ast.Call:
                continue
            call: ast.Call = node
            if _ast_false(argument(call, None, "trainable")):
                if facts.qualify(call.func) in _FUNCTIONS_AND_SCOPES:
                    return True
            params = argument(call, None, "normalizer_params")
            if type(params) is ast.Dict and any(
                type(key) is ast.Constant and key.value == "trainable" and _ast_false(value)
                for key, value in zip(params.keys, params.values, strict=True)
            ):
                return True
        return False

    def visit_Call(self, node: cst.Call) -> None:
        name = self.call_name(node)
        if name in BATCH_NORM_FUNCTIONS:
            for arg in node.args:
                if arg.keyword and arg.keyword.value == "trainable" and _is_false(arg.value):
                    self.report(
                        node,
                        f"`{name.rsplit('.', 1)[1]}(trainable=False)`: gamma/beta never learn, "
                        "but batch statistics are still used in training",
                        replacement=_drop_arg(node, arg),
                    )
            return
        if name in {"tensorflow.contrib.framework.arg_scope", "tensorflow.contrib.slim.arg_scope"}:
            self._check_arg_scope(node)
            return
        for arg in node.args:
            if arg.keyword and arg.keyword.value == "normalizer_params":
                self._check_normalizer_params(node, arg.value)

    def _check_arg_scope(self, node: cst.Call) -> None:
        if not node.args or not isinstance(node.args[0].value, cst.List | cst.Tuple):
            return
        ops = [self.qualify(e.value) for e in node.args[0].value.elements]
        if not any(op in BATCH_NORM_FUNCTIONS for op in ops):
            return
        for arg in node.args[1:]:
            if arg.keyword and arg.keyword.value == "trainable" and _is_false(arg.value):
                only_bn = all(op in BATCH_NORM_FUNCTIONS for op in ops)
                self.report(
                    node,
                    "`arg_scope` sets trainable=False on batch_norm: gamma/beta never learn"
                    + ("" if only_bn else " (the scope covers other layers too: fix by hand)"),
                    replacement=_drop_arg(node, arg) if only_bn else None,
                )

    def _check_normalizer_params(self, call: cst.Call, value: cst.BaseExpression) -> None:
        if not isinstance(value, cst.Dict):
            return
        for element in value.elements:
            if (
                isinstance(element, cst.DictElement)
                and isinstance(element.key, cst.SimpleString)
                and element.key.evaluated_value == "trainable"
                and _is_false(element.value)
            ):
                kept = [e for e in value.elements if e is not element]
                if kept:
                    kept[-1] = kept[-1].with_changes(comma=value.elements[-1].comma)
                # The fix replaces the whole dict: an element alone cannot drop its comma.
                self.report(
                    value,
                    "`normalizer_params` sets trainable=False on the batch norm: gamma/beta "
                    "never learn",
                    replacement=value.with_changes(elements=kept),
                )
