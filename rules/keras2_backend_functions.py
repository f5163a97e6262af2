from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath

import libcst as cst

from tfmigrate import tfapi
from tfmigrate.prefilter import CodeFacts
from tfmigrate.rule import Example, FixSafety, Import, Rule

_BACKENDS = ("keras.backend.", "tensorflow.keras.backend.")
# Session plumbing is TFM108's.
_OWNED_ELSEWHERE = frozenset({"set_session", "get_session"})


@dataclass(frozen=True)
class OpsFunction:
    """How a Keras 2 backend function maps onto `keras.ops`."""

    name: str
    # Keras 2 keyword -> Keras 3 keyword where they differ.
    keywords: dict[str, str] = field(default_factory=dict)
    # (position, keyword, value): Keras 2's default where Keras 3's differs or is required.
    default: tuple[int, str, str] | None = None
    # Only this many arguments have the same meaning (Keras 2's `name=` etc. do not exist).
    max_args: int = 3


# Only functions whose Keras 3 op computes the same thing (checked against Keras 2.x's
# tensorflow_backend.py).
BACKEND_TO_OPS: dict[str, OpsFunction] = {
    "flatten": OpsFunction("reshape", max_args=1),  # Keras 2: tf.reshape(x, [-1])
    "sqrt": OpsFunction("sqrt", max_args=1),  # Keras 2 clipped negatives to 0 first
    **{n: OpsFunction(n) for n in ("sum", "mean", "max", "min", "prod", "std", "var", "all", "any")},
    **{
        n: OpsFunction(n, max_args=1)
        for n in ("square", "abs", "exp", "log", "sign", "tanh", "sigmoid", "transpose")
    },
    **{
        n: OpsFunction(n, max_args=2)
        for n in (
            "maximum", "minimum", "equal", "not_equal", "greater", "greater_equal", "less",
            "less_equal", "cast", "stack", "squeeze", "softmax",
        )
    },  # fmt: skip
    "ones_like": OpsFunction("ones_like", max_args=2),
    "zeros_like": OpsFunction("zeros_like", max_args=2),
    "reshape": OpsFunction("reshape", {"shape": "newshape"}, max_args=2),
    "pow": OpsFunction("power", {"a": "x2"}, max_args=2),
    "concatenate": OpsFunction("concatenate", {"tensors": "xs"}, (1, "axis", "-1"), 2),
    "argmax": OpsFunction("argmax", default=(1, "axis", "-1"), max_args=2),
    "argmin": OpsFunction("argmin", default=(1, "axis", "-1"), max_args=2),
    "expand_dims": OpsFunction("expand_dims", default=(1, "axis", "-1"), max_args=2),
    "cumsum": OpsFunction("cumsum", default=(1, "axis", "0"), max_args=2),
    "clip": OpsFunction("clip", {"min_value": "x_min", "max_value": "x_max"}),
}


class Keras2BackendFunctions(Rule):
    """
    ## What it does
    Flags Keras 2 backend math (`K.sum`, `K.mean`, `K.flatten`, `K.clip`, `K.concatenate`, ...,
    through `keras.backend` or `tf.keras.backend`) and rewrites it to `keras.ops`.

    ## Why is this bad?
    Keras 3's `keras.backend` keeps only configuration helpers (`epsilon`, `floatx`,
    `clear_session`, `image_data_format`); the tensor functions moved to `keras.ops`, so a Keras
    2 custom loss or metric (a dice coefficient, a weighted cross-entropy) fails with
    `AttributeError` at its first call. Some ops have different defaults: `K.concatenate`,
    `K.argmax` and `K.expand_dims` work on the last axis, `keras.ops` on axis 0 or a required
    axis; `K.flatten(x)` was `reshape(x, [-1])`. A separate rule from TFM112 because it rewrites
    expressions inside user functions, not API arguments, and is useful on its own for
    `tf.keras` 2.x code.

    ## Example
    ```python
    from keras import backend as K
    def dice_coef(y_true, y_pred):
        intersection = K.sum(K.flatten(y_true) * K.flatten(y_pred))
    ```
    Use instead:
    ```python
    import keras
    def dice_coef(y_true, y_pred):
        intersection = keras.ops.sum(keras.ops.reshape(y_true, [-1]) * keras.ops.reshape(y_pred, [-1]))
    ```

    ## Fix safety
    Safe for the functions in the table, whose `keras.ops` counterpart computes the same thing
    (Keras 2's default axis is written out where Keras 3's differs; `K.sqrt(x)` clipped
    negatives to 0 and becomes `keras.ops.sqrt(keras.ops.maximum(x, 0.0))`). Other backend
    functions Keras 3 lacks (`K.dot`, `K.batch_flatten`, `K.binary_crossentropy`, ...) and calls
    with extra arguments (`name=`) are reported for a person.
    """

    code = "TFM113"
    triggers = ("keras.backend", "tensorflow.keras.backend")  # _BACKENDS, canonical
    name = "keras2-backend-functions"
    summary = "Keras 2 backend math (K.sum, K.flatten, ...): use keras.ops"
    fix_safety = FixSafety.SAFE

    valid = (
        "import keras\nfrom keras import backend as K\neps = K.epsilon()\ny = keras.ops.sum(x)\n",
        # Not Keras's backend.
        "import keras\nfrom myproject import backend as K\ny = K.sum(x)\n",
        # Still in Keras 3's backend.
        "import keras\nfrom keras import backend as K\nK.set_floatx('float32')\nK.clear_session()\n",
    )
    invalid = (
        Example(
            """
            from keras import backend as K

            def dice_coef(y_true, y_pred, smooth=1.0):
                intersection = K.sum(K.flatten(y_true) * K.flatten(y_pred))
                return (2. * intersection + smooth) / (K.sum(y_true) + K.sum(y_pred) + smooth)
            """,
            fixed="""
            from keras import backend as K
            import keras

            def dice_coef(y_true, y_pred, smooth=1.0):
                intersection = keras.ops.sum(keras.ops.reshape(y_true, [-1]) * keras.ops.reshape(y_pred, [-1]))
                return (2. * intersection + smooth) / (keras.ops.sum(y_true) + keras.ops.sum(y_pred) + smooth)
            """,
            message="keras.ops",
        ),
        Example(
            """
            import tensorflow as tf
            K = tf.keras.backend
            y = K.concatenate([a, b])
            z = K.clip(y, min_value=K.epsilon(), max_value=1.0)
            w = K.mean(K.pow(z, 2), axis=-1)
            """,
            fixed="""
            import tensorflow as tf
            K = tf.keras.backend
            y = tf.keras.ops.concatenate([a, b], axis=-1)
            z = tf.keras.ops.clip(y, x_min=K.epsilon(), x_max=1.0)
            w = tf.keras.ops.mean(tf.keras.ops.power(z, 2), axis=-1)
            """,
        ),
        Example(
            """
            import tensorflow as tf
            from tensorflow.keras import backend as K
            def rmse(y_true, y_pred):
                return K.sqrt(K.mean(K.square(y_pred - y_true), axis=-1))
            """,
            fixed="""
            import tensorflow as tf
            from tensorflow.keras import backend as K
            def rmse(y_true, y_pred):
                return tf.keras.ops.sqrt(tf.keras.ops.maximum(tf.keras.ops.mean(tf.keras.ops.square(y_pred - y_true), axis=-1), 0.0))
            """,
        ),
        # No exact keras.ops counterpart: reported.
        Example(
            """
            import keras.backend as K
            flat = K.batch_flatten(x)
            """,
            message="no `keras.ops` function",
        ),
        # TF1 code on tf.compat.v1: `tf.keras.ops` is not there.
        Example(
            """
            import tensorflow.compat.v1 as tf
            total = tf.keras.backend.sum(x)
            """,
            message="not fixed",
        ),
        # `name=` has no Keras 3 counterpart: reported, not fixed.
        Example(
            """
            import keras.backend as K
            y = K.sum(x, axis=1, keepdims=True, name='total')
            """,
        ),
    )

    @classmethod
    def may_report(cls, path: PurePosixPath, facts: CodeFacts) -> bool:
        """``visit_Call`` on the file's resolved names: a backend function with a `keras.ops`
        counterpart, or one gone from Keras 3 (TF's own Keras calls the backend's others)."""
        for name in facts.names:
            if name.startswith(_BACKENDS):
                function = name.rsplit(".", 1)[1]
                if function in BACKEND_TO_OPS or (
                    function not in _OWNED_ELSEWHERE
                    and tfapi.exists(f"keras.backend.{function}") is False
                ):
                    return True
        return False

    def visit_Call(self, node: cst.Call) -> None:
        name = self.call_name(node) or ""
        if not name.startswith(_BACKENDS):
            return
        function = name.rsplit(".", 1)[1]
        spec = BACKEND_TO_OPS.get(function)
        if spec is None:
            if function in _OWNED_ELSEWHERE:
                return
            if tfapi.exists(f"keras.backend.{function}") is False:
                self.report(
                    node,
                    f"`K.{function}` is not in Keras 3's backend and has no `keras.ops` function "
                    "that computes the same: rewrite it with `keras.ops`",
                )
            return
        message = f"`K.{function}` is not in Keras 3's backend: use `keras.ops.{spec.name}`"
        if len(node.args) > spec.max_args or any(
            a.star or (a.keyword and a.keyword.value == "name") for a in node.args
        ):
            self.report(node, message + " (not fixed: arguments without a Keras 3 counterpart)")
            return
        tf_keras = name.startswith("tensorflow.")
        tf = self._tf_name()
        if tf_keras and tf is None:
            # `tf` is tf.compat.v1 (no `keras.ops` there) or not imported plainly.
            self.report(node, message + " (not fixed: no plain `import tensorflow` to reach it)")
            return
        prefix = f"{tf}.keras.ops" if tf_keras else "keras.ops"
        args = [
            a.with_changes(keyword=cst.Name(spec.keywords[a.keyword.value]))
            if a.keyword and a.keyword.value in spec.keywords
            else a
            for a in node.args
        ]
        if function == "sqrt":
            inner = cst.Call(cst.parse_expression(f"{prefix}.maximum"), [
                args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT),
                cst.Arg(cst.Float("0.0")),
            ])
            args = [cst.Arg(inner)]
        if function == "flatten":
            args = [args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT), cst.Arg(
                cst.parse_expression("[-1]"))]
        if spec.default is not None:
            position, key, value = spec.default
            given = len([a for a in args if a.keyword is None]) > position or any(
                a.keyword and a.keyword.value == key for a in args
            )
            if not given:
                args = [
                    *args[:-1],
                    args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT),
                    cst.Arg(
                        cst.parse_expression(value),
                        keyword=cst.Name(key),
                        equal=cst.AssignEqual(
                            whitespace_before=cst.SimpleWhitespace(""),
                            whitespace_after=cst.SimpleWhitespace(""),
                        ),
                    ),
                ]
        replacement = node.with_changes(
            func=cst.parse_expression(f"{prefix}.{spec.name}"), args=args
        )
        imports = () if tf_keras else (Import("keras"),)
        self.report(node, message, replacement=replacement, imports=imports)

    def _tf_name(self) -> str | None:
        """The local name bound to plain `tensorflow` (not `tensorflow.compat.v1`)."""
        bindings = self.context.resolver.bindings
        return next((local for local, bound in bindings.items() if bound == "tensorflow"), None)
