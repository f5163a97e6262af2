"""TF1 layer-call model functions -> Keras 3 model classes (TFM303's model conversion).

Not a rule module. :func:`convert` reads a straight-line model function made of
``tf.layers`` / ``tf.contrib.layers`` / slim layer calls with literal names (and ``tf.nn``
activations or plain tensor ops between them) and writes a ``keras.Model`` subclass that
creates the same layers, with every default of the legacy API spelled out where Keras' differs,
and the mapping from legacy variable names to the Keras weight paths. Anything it does not know
raises :class:`NotConvertible` with the reason: the caller then keeps the TF1 code.

No TensorFlow import here (the rewrite path must not need it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import libcst as cst

from tfmigrate.rules._slim_arg_scope import (
    ArgScope,
    NotConvertible,
    defaults_for,
    is_arg_scope,
    scopes_of,
)
from tfmigrate.rules._slim_arg_scope import short_name as _short
from tfmigrate.rules._static_loops import NotStatic, unroll
from tfmigrate.rules._towers import walk

Qualify = Callable[[cst.BaseExpression], "str | None"]

__all__ = ["NotConvertible", "convert", "layer_variables", "LAYER_KINDS", "TF1_BATCH_NORM"]


# Emitted once into a program whose model has a TF1 fused batch norm. Measured on TF 2.21's
# compat layer: TF1 ran FusedBatchNormV3 (and its own gradient kernel) where this class does, and
# the same ops give bit-identical outputs, gradients and moving statistics; the unfused ops
# (moments, batch_normalization) round differently (gamma/beta gradients ~1e-6 relative), which a
# conv kernel whose gradient cancels through the batch norm magnifies over steps. tf_slim / contrib batch_norm feed the moving variance with the Bessel-corrected
# batch variance on 2-D and 4-D inputs (fused kernel), tf.layers.batch_normalization on 4-D
# inputs only (2-D: the biased variance, as Keras does). slim's batch_norm(trainable=False)
# still normalizes with the batch's statistics in training and updates its moving statistics
# on 2-D inputs (its own fused code) but not on 4-D ones (tf_keras' layer collects no updates
# from a layer that is not trainable); Keras 3's trainable=False would mean inference mode.
TF1_BATCH_NORM = '''
class TF1BatchNorm(keras.layers.BatchNormalization):
    """Keras batch norm computed as TF1 did. On inputs of the ranks in `unbiased_ranks` TF1 ran
    its fused kernel (FusedBatchNormV3, 2-D inputs viewed as NHWC): so does this layer in
    training, for the same rounding and gradient kernel, and its moving variance takes that
    kernel's unbiased batch variance n/(n-1). `frozen`: TF1's trainable=False -- gamma/beta are
    not trained, training still uses the batch's statistics, and the moving statistics are
    updated only on inputs of the ranks in `frozen_update_ranks`."""

    def __init__(self, unbiased_ranks=(2, 4), frozen=False, frozen_update_ranks=(2,), **kwargs):
        super().__init__(**kwargs)
        self.unbiased_ranks = tuple(unbiased_ranks)
        self.frozen = frozen
        self.frozen_update_ranks = tuple(frozen_update_ranks)

    def build(self, input_shape):
        super().build(input_shape)
        for weight in (self.gamma, self.beta) if self.frozen else ():
            if weight is not None:
                weight.trainable = False

    def call(self, inputs, training=False, mask=None):
        rank = len(inputs.shape)
        update = not self.frozen or rank in self.frozen_update_ranks
        if not training or (update and rank not in self.unbiased_ranks):
            return super().call(inputs, training=training, mask=mask)
        if rank in self.unbiased_ranks and not self.synchronized:
            outputs, mean, variance = self._fused(inputs)
        else:
            axes = [i for i in range(rank) if i != self.axis % rank]
            mean, variance = tf.nn.moments(inputs, axes)
            outputs = tf.nn.batch_normalization(
                inputs, mean, variance, self.beta, self.gamma, self.epsilon)
            if update:
                count = tf.cast(tf.size(inputs) // tf.size(mean), inputs.dtype)
                variance = variance * count / (count - 1.0)
        if update:
            # 1 - momentum as TF1 computed it: in float32 in its Keras layer (4-D inputs), in
            # float64 in slim's own fused code (2-D inputs)
            decay = 1.0 - (tf.constant(self.momentum) if rank == 4 else self.momentum)
            self.moving_mean.assign_sub((self.moving_mean - mean) * decay)
            self.moving_variance.assign_sub((self.moving_variance - variance) * decay)
        return outputs

    def _fused(self, inputs):
        """TF1's training-mode kernel: the output, the batch mean and the unbiased variance."""
        channels = inputs.shape[-1]
        gamma = self.gamma if self.scale else tf.ones([channels])
        beta = self.beta if self.center else tf.zeros([channels])
        x = inputs if len(inputs.shape) == 4 else tf.reshape(inputs, [-1, 1, 1, channels])
        empty = tf.constant([])  # no running statistics in: TF1 updated them outside the kernel
        outputs, mean, variance = tf.raw_ops.FusedBatchNormV3(
            x=x, scale=gamma, offset=beta, mean=empty, variance=empty, epsilon=self.epsilon,
            data_format="NHWC", is_training=True)[:3]
        return tf.reshape(outputs, tf.shape(inputs)), mean, variance

    def get_config(self):
        return {**super().get_config(), "unbiased_ranks": self.unbiased_ranks,
                "frozen": self.frozen, "frozen_update_ranks": self.frozen_update_ranks}
'''

# tf.nn functions kept as they are between layers (TF2 has them all under the same name).
_NN_KEPT = frozenset(
    {
        "relu", "relu6", "elu", "selu", "tanh", "sigmoid", "softplus", "softsign",
        "leaky_relu", "swish", "silu", "gelu", "softmax", "log_softmax",
    }
)  # fmt: skip
# Plain tensor ops allowed between layers (stateless, same meaning in TF2).
_OPS_KEPT = frozenset(
    {"reshape", "identity", "squeeze", "concat", "add", "multiply", "reduce_mean", "reduce_max",
     "reduce_sum", "math.reduce_mean", "math.reduce_max", "math.reduce_sum"}
)  # fmt: skip
# Random layers: verify compares their runs only with the randomness off (announced).
DROPOUT_NOTE = "dropout -> keras.layers.Dropout with the same rate: its random masks are not TF1's"
_LEGACY_ACTIVATIONS = {f"nn.{n}": n for n in _NN_KEPT} | {"tanh": "tanh", "sigmoid": "sigmoid"}


@dataclass
class Layer:
    attribute: str  # self.<attribute>
    constructor: str  # keras.layers.Dense(...)
    weights: dict[str, str]  # legacy variable suffix -> Keras weight name
    name: str | None  # the Keras layer name (the legacy scope, "/" -> "_")
    training: bool = False  # call takes training=
    scope: str | None = None  # the legacy scope when it is not `name` (`conv1/BatchNorm`)
    non_trainable: frozenset[str] = frozenset()  # legacy suffixes of non-trainable variables

    @property
    def legacy_scope(self) -> str | None:
        return self.scope or self.name


@dataclass
class Stages:
    """What one legacy layer call becomes: steps applied in turn, each a Keras layer (with its
    call-time training expression) or a ``tf.nn`` activation -- slim's layer, its normalizer,
    its activation; or the steps of each layer of a ``slim.repeat``."""

    steps: list[tuple[Layer | str, str | None]]
    inputs: cst.BaseExpression

    @property
    def layers(self) -> list[Layer]:
        return [step for step, _ in self.steps if isinstance(step, Layer)]


@dataclass
class KerasModel:
    function: cst.FunctionDef
    class_name: str
    input_param: str
    training_param: str | None
    training_default: str  # what call() receives when the legacy call passed no flag
    init_params: list[str]  # legacy parameters that configure layers (constructor arguments)
    scope: str | None  # the function's own literal variable_scope
    layers: list[Layer]
    source: str = ""  # the class (4-space indents)
    uses_tf1_batch_norm: bool = False
    notes: list[str] = field(default_factory=list)
    scope_param: str | None = None  # the parameter that names `scope` (its default)
    # A `True` training flag from the slim arg_scope around the towers' call follows call()'s
    # `training` (the towers pass True): the call site's mode, not one fixed in the model.
    call_site_training: bool = False

    @property
    def takes_training(self) -> bool:
        return self.training_param is not None or self.call_site_training

    def variables(self, prefix: str, model_name: str) -> dict[str, str]:
        """Legacy variable name -> Keras weight path, for a model instance named `model_name`
        built where the legacy variables lived under `prefix` (outer scopes, '' for none)."""
        scopes = "/".join(s for s in (prefix, self.scope) if s)
        mapping = {}
        for layer in self.layers:
            for legacy, new in layer.weights.items():
                legacy_name = "/".join(s for s in (scopes, layer.legacy_scope, legacy) if s)
                mapping[legacy_name] = f"{model_name}/{layer.name}/{new}"
        return mapping


# keras.Model's public names (Keras 3.x): a layer attribute named like one would shadow it or,
# for a read-only property such as `output` or `input`, fail to be set at all.
_MODEL_ATTRIBUTES = frozenset(
    """add_loss add_metric add_variable add_weight build build_from_config built call compile
    compile_from_config compiled_loss compiled_metrics compute_dtype compute_loss compute_mask
    compute_metrics compute_output_shape compute_output_spec count_params
    distribute_reduction_method distribute_strategy dtype dtype_policy evaluate export fit
    from_config get_build_config get_compile_config get_config get_layer get_metrics_result
    get_quantization_layer_structure get_state_tree get_weights history input input_dtype
    input_spec inputs jit_compile layers load_own_variables load_weights loss losses
    make_predict_function make_test_function make_train_function metrics metrics_names
    metrics_variables name non_trainable_variables non_trainable_weights optimizer output
    outputs path predict predict_on_batch predict_step quantization_mode quantize
    quantized_build quantized_call rematerialized_call reset_metrics run_eagerly save
    save_own_variables save_weights set_state_tree set_weights stateless_call
    stateless_compute_loss stop_training summary supports_masking symbolic_call test_on_batch
    test_step to_json train_on_batch train_step trainable trainable_variables
    trainable_weights variable_dtype variables weights""".split()
)


class _Reader:
    """Reads one model function; builds the Layers and the call() statements."""

    def __init__(
        self,
        function: cst.FunctionDef | None,
        qualify: Qualify,
        module: cst.Module,
        strings: dict[str, str] | None = None,
    ) -> None:
        """`function` None: only the variable names are wanted (layer_variables): values that
        only configure the layers are not checked, names may come from `strings`."""
        self.function = function
        self.names_only = function is None
        self.strings = strings or {}
        self.qualify = qualify
        self.code = module.code_for_node
        self.arg_scopes: list[ArgScope] = []  # the slim arg_scopes around the current call
        self.kind = ""  # the short name of the layer call being read
        self.layers: list[Layer] = []
        self.aliases: dict[str, cst.BaseExpression] = {}  # `regularizer = slim.l2_regularizer(..)`
        self.unnamed: dict[str, int] = {}
        self.tf1_batch_norm = False
        self.training_param: str | None = None
        # ids of the nodes of the arg_scopes around the towers' call (see call_site_training)
        self.call_site: frozenset[int] = frozenset()
        self.call_site_training = False
        self.params = [p.name.value for p in function.params.params] if function else []
        self.init_uses: set[str] = set()  # parameters read by layer constructors
        self.notes: list[str] = []

    # -- argument helpers ------------------------------------------------------------------
    def _args(
        self, call: cst.Call, positional: tuple[str, ...], known: frozenset[str]
    ) -> dict[str, cst.BaseExpression]:
        # slim arg_scope defaults first: the call's own arguments win (dicts replaced whole).
        out = defaults_for(self.kind, self.arg_scopes)
        for index, arg in enumerate(call.args):
            if arg.star:
                raise NotConvertible(call, "a layer called with *args / **kwargs")
            if arg.keyword is None:
                if index >= len(positional):
                    raise NotConvertible(call, "a layer with more positional arguments than known")
                out[positional[index]] = arg.value
            else:
                out[arg.keyword.value] = arg.value
        if "inputs" not in out:
            raise NotConvertible(call, "a layer call without its input")
        unknown = sorted(set(out) - set(positional) - known)
        if unknown:
            raise NotConvertible(
                call, f"a layer argument without a checked Keras mapping: `{unknown[0]}=`"
            )
        return out

    def _literal_bool(self, node: cst.BaseExpression | None, default: bool) -> bool:
        if node is None:
            return default
        if isinstance(node, cst.Name) and node.value in ("True", "False"):
            return node.value == "True"
        raise NotConvertible(node, "a layer flag that is not a literal True/False")

    def _config(self, node: cst.BaseExpression) -> str:
        """A constructor-time value: literals, module constants, the function's parameters."""
        if self.names_only:
            return self.code(node)
        if isinstance(node, cst.Name) and node.value in self.aliases:
            node = self.aliases[node.value]
        for n in walk(node):
            if isinstance(n, cst.Name) and n.value in self.params:
                if n.value == self.training_param or n.value == self.params[0]:
                    raise NotConvertible(node, "a layer configured by the input or training flag")
                self.init_uses.add(n.value)
            if isinstance(n, cst.Call):
                raise NotConvertible(node, "a layer argument computed by a call")
        return self.code(node)

    def _name(self, call: cst.Call, value: cst.BaseExpression | None, kind: str) -> str | None:
        if value is None:
            return None
        if isinstance(value, cst.Name) and value.value in self.strings:
            return self.strings[value.value]
        if isinstance(value, cst.SimpleString) and isinstance(value.evaluated_value, str):
            name = value.evaluated_value
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                return name
        raise NotConvertible(call, f"a {kind} whose name is not a literal identifier")

    def _training(self, call: cst.Call, value: cst.BaseExpression | None, default: bool) -> str:
        if value is None:
            return "True" if default else "False"
        if self.names_only:
            return "training"
        if isinstance(value, cst.Name) and value.value in ("True", "False"):
            if value.value == "True" and id(value) in self.call_site:
                # slim applied the towers' arg_scope to this call only: a model called outside
                # it (evaluation) did not train this layer. False stays fixed: slim used the
                # moving statistics in training too.
                self.call_site_training = True
                return "training"
            return value.value
        if isinstance(value, cst.Name) and value.value in self.params[1:]:
            if self.training_param not in (None, value.value):
                raise NotConvertible(call, "two different training flags")
            self.training_param = value.value
            return "training"
        raise NotConvertible(call, "a training flag that is neither a parameter nor a literal")

    def _activation(self, value: cst.BaseExpression | None, default: str | None) -> str | None:
        if value is None or self.names_only:
            return default
        if isinstance(value, cst.Name) and value.value == "None":
            return None
        short = _short(self.qualify(value))
        if short in _LEGACY_ACTIVATIONS:
            return _LEGACY_ACTIVATIONS[short]
        raise NotConvertible(
            value, f"an activation without a checked Keras mapping: `{self.code(value)}`"
        )

    def _initializer(self, value: cst.BaseExpression | None, default: str) -> str | None:
        """Keras spelling of a TF1 initializer; None for Keras' own default."""
        if value is None or self.names_only:
            return None if default == "keras" else default
        if isinstance(value, cst.Name) and value.value in self.aliases:
            value = self.aliases[value.value]
        if not isinstance(value, cst.Call):
            raise NotConvertible(value, "an initializer that is not a call")
        short = _short(self.qualify(value.func))
        args = {
            (a.keyword.value if a.keyword else str(i)): self._config(a.value)
            for i, a in enumerate(value.args)
        }
        if short in ("slim.xavier_initializer", "glorot_uniform_initializer") and not args:
            return '"glorot_uniform"'
        if short == "zeros_initializer" and not args:
            return '"zeros"'
        if short == "ones_initializer" and not args:
            return '"ones"'
        if short == "constant_initializer" and set(args) <= {"0", "value"} and args:
            return f"keras.initializers.Constant({next(iter(args.values()))})"
        if short in ("truncated_normal_initializer", "random_normal_initializer") and set(args) <= {
            "mean",
            "stddev",
        }:
            keras_name = "TruncatedNormal" if short.startswith("truncated") else "RandomNormal"
            given = ", ".join(f"{k}={v}" for k, v in args.items())
            # TF1's default stddev is 1.0; Keras' 0.05.
            if "stddev" not in args:
                given = ", ".join(filter(None, [given, "stddev=1.0"]))
            return f"keras.initializers.{keras_name}({given})"
        if short == "slim.variance_scaling_initializer":
            return self._variance_scaling(value)
        raise NotConvertible(
            value, f"an initializer without a checked Keras mapping: `{self.code(value)}`"
        )

    def _variance_scaling(self, call: cst.Call) -> str:
        """slim's variance_scaling_initializer(factor=2.0, mode='FAN_IN', uniform=False): a
        normal truncated at 2 stddev of stddev sqrt(1.3 * factor / n), or a uniform of limit
        sqrt(3 * factor / n). Keras' truncated normal divides sqrt(scale / n) by 0.8796...
        (the stddev of a unit normal truncated at 2), hence the scale below."""
        names = ("factor", "mode", "uniform", "seed")
        given: dict[str, cst.BaseExpression] = {}
        for index, arg in enumerate(call.args):
            if arg.star or (arg.keyword is None and index >= len(names)):
                raise NotConvertible(call, "variance_scaling_initializer with extra arguments")
            given[arg.keyword.value if arg.keyword else names[index]] = arg.value
        factor = self._config(given["factor"]) if "factor" in given else "2.0"
        mode = given.get("mode")
        modes = {"FAN_IN": "fan_in", "FAN_OUT": "fan_out", "FAN_AVG": "fan_avg"}
        if mode is not None and not (
            isinstance(mode, cst.SimpleString) and mode.evaluated_value in modes
        ):
            raise NotConvertible(call, "variance_scaling_initializer with a non-literal mode")
        # a key of modes (checked above): a str, not bytes
        keras_mode = modes[cast(str, mode.evaluated_value)] if mode is not None else "fan_in"
        uniform = self._literal_bool(given.get("uniform"), False)
        seed = f", seed={self._config(given['seed'])}" if "seed" in given else ""
        if uniform:
            return f'keras.initializers.VarianceScaling({factor}, "{keras_mode}", "uniform"{seed})'
        return (
            f"keras.initializers.VarianceScaling(1.3 * {factor} * 0.87962566103423978**2, "
            f'"{keras_mode}", "truncated_normal"{seed})'
        )

    def _regularizer(self, value: cst.BaseExpression | None) -> str | None:
        if value is None or self.names_only:
            return None
        if isinstance(value, cst.Name) and value.value == "None":
            return None
        if isinstance(value, cst.Name) and value.value in self.aliases:
            value = self.aliases[value.value]
        if isinstance(value, cst.Call) and len(value.args) == 1:
            arg = value.args[0]
            short = _short(self.qualify(value.func))
            if short == "slim.l2_regularizer" and (
                arg.keyword is None or arg.keyword.value == "scale"
            ):
                # TF1: scale * tf.nn.l2_loss(w) = scale * sum(w**2) / 2; Keras L2: l2 * sum(w**2).
                return f"keras.regularizers.L2(0.5 * {self._config(arg.value)})"
        raise NotConvertible(value, "a regularizer without a checked Keras mapping")

    def _attribute(self, name: str | None, kind: str) -> str:
        base = name or kind
        count = self.unnamed.get(base, 0)
        self.unnamed[base] = count + 1
        attribute = base if count == 0 else f"{base}_{count}"
        if attribute in _MODEL_ATTRIBUTES:
            attribute += "_layer"
        return attribute

    @staticmethod
    def _kwargs(pairs: list[tuple[str, str | None]]) -> str:
        return ", ".join(f"{k}={v}" if k else str(v) for k, v in pairs if v is not None)

    # -- the layers ---------------------------------------------------------------------------
    def layer(self, call: cst.Call, short: str) -> Stages:
        """The Keras layers of one legacy layer call (with the arg_scope defaults for it)."""
        dispatch = {
            "layers.dense": self._dense,
            "layers.conv2d": self._conv2d,
            "slim.fully_connected": self._fully_connected,
            "slim.conv2d": self._slim_conv2d,
            "layers.max_pooling2d": self._max_pooling2d,
            "slim.max_pool2d": self._max_pool2d,
            "layers.flatten": self._flatten,
            "slim.flatten": self._flatten,
            "layers.batch_normalization": self._batch_normalization,
            "slim.batch_norm": self._batch_norm,
            "layers.dropout": self._dropout,
            "slim.dropout": self._slim_dropout,
            "nn.dropout": self._nn_dropout,
            "slim.repeat": self._repeat,
        }
        outer, self.kind = self.kind, short
        try:
            result = dispatch[short](call)
        finally:
            self.kind = outer
        if isinstance(result, Stages):
            return result
        layer, inputs, training = result
        return Stages([(layer, training)], inputs)

    def _repeat(self, call: cst.Call) -> Stages:
        """``slim.repeat(net, 2, slim.conv2d, 64, [3, 3], scope='conv2')``: the layer called
        twice, under scopes ``conv2/conv2_1`` and ``conv2/conv2_2`` (tf_slim's naming)."""
        args = list(call.args)
        if len(args) < 3 or any(a.keyword is not None or a.star for a in args[:3]):
            raise NotConvertible(call, "slim.repeat without its input, count and layer")
        count = args[1].value
        if not isinstance(count, cst.Integer):
            raise NotConvertible(call, "slim.repeat with a count that is not a literal")
        kind = _short(self.qualify(args[2].value))
        if kind not in ("slim.conv2d", "slim.fully_connected", "slim.max_pool2d"):
            raise NotConvertible(call, "slim.repeat of a layer without a checked Keras mapping")
        rest = [a for a in args[3:] if not (a.keyword and a.keyword.value == "scope")]
        scope = self._name(
            call,
            next((a.value for a in args[3:] if a.keyword and a.keyword.value == "scope"), None),
            "slim.repeat",
        )
        if scope is None:
            raise NotConvertible(call, "slim.repeat without a literal scope")
        steps: list[tuple[Layer | str, str | None]] = []
        for index in range(1, int(count.value) + 1):
            inner = call.with_changes(
                func=args[2].value,
                args=[
                    args[0],
                    *rest,
                    cst.Arg(
                        cst.SimpleString(f"'{scope}_{index}'"),
                        keyword=cst.Name("scope"),
                        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
                    ),
                ],
            )
            built = self.layer(inner, kind)
            for layer in built.layers:
                layer.scope = f"{scope}/{layer.legacy_scope}"
            steps += built.steps
        return Stages(steps, args[0].value)

    def _slim_dropout(self, call: cst.Call):
        a = self._args(
            call,
            ("inputs", "keep_prob", "noise_shape", "is_training", "outputs_collections", "scope",
             "seed"),
            frozenset(),
        )  # fmt: skip
        if "noise_shape" in a or "outputs_collections" in a:
            raise NotConvertible(call, "a slim dropout with a noise_shape / outputs_collections")
        name = self._name(call, a.get("scope"), "dropout")
        # tf_slim: rate = 1 - keep_prob (default 0.5), is_training=True by default.
        keep = self._config(a["keep_prob"]) if "keep_prob" in a else "0.5"
        training = self._training(call, a.get("is_training"), True)
        return self._dropout_layer(name, f"1 - {keep}", a), a["inputs"], training

    def _dropout_layer(self, name: str | None, rate: str, args: dict) -> Layer:
        """A Keras Dropout of ``rate``, called in training mode (announced: it is random)."""
        pairs = [
            ("", rate),
            ("seed", self._config(args["seed"]) if "seed" in args else None),
            ("name", f'"{name}"' if name else None),
        ]
        self.notes.append(DROPOUT_NOTE)
        return Layer(
            self._attribute(name, "dropout"),
            f"keras.layers.Dropout({self._kwargs(pairs)})",
            {},
            name,
            training=True,
        )

    def _nn_dropout(self, call: cst.Call):
        """TF1's ``tf.nn.dropout(x, keep_prob)`` (or ``rate=``): always active, whatever the
        mode, so the Keras layer is called with ``training=True``."""
        if (self.qualify(call.func) or "").startswith("tensorflow.compat.v2."):
            raise NotConvertible(call, "a TF2 tf.nn.dropout (its second argument is the rate)")
        a = self._args(
            _x_as_inputs(call), ("inputs", "keep_prob", "noise_shape", "seed", "name", "rate"),
            frozenset(),
        )  # fmt: skip
        if "noise_shape" in a or ("keep_prob" in a) == ("rate" in a):
            raise NotConvertible(call, "a tf.nn.dropout with a noise_shape, or not one of keep_prob / rate")  # fmt: skip
        name = self._name(call, a.get("name"), "dropout")
        if "rate" in a:
            rate = self._config(a["rate"])
        else:
            keep = self._config(a["keep_prob"])
            simple = isinstance(a["keep_prob"], cst.Name | cst.Float | cst.Integer | cst.Attribute)
            rate = f"1 - {keep}" if simple else f"1 - ({keep})"
        layer = self._dropout_layer(name, rate, a)
        return layer, a["inputs"], "True"

    def _normalizer(self, call: cst.Call, a: dict, name: str) -> Stages | None:
        """slim's ``normalizer_fn=slim.batch_norm, normalizer_params={...}``: the batch norm
        under ``<layer scope>/BatchNorm``, called with the params (and the arg_scope defaults
        for slim.batch_norm: slim calls it under the same scopes). None without one."""
        fn = a.get("normalizer_fn")
        if fn is None or (isinstance(fn, cst.Name) and fn.value == "None"):
            return None
        if _short(self.qualify(fn)) != "slim.batch_norm":
            raise NotConvertible(call, "a normalizer_fn other than slim.batch_norm")
        params = a.get("normalizer_params")
        keywords: list[cst.Arg] = []
        if params is not None and not (isinstance(params, cst.Name) and params.value == "None"):
            if not isinstance(params, cst.Dict):
                raise NotConvertible(call, "normalizer_params that are not a literal dict")
            for element in params.elements:
                key = getattr(element, "key", None)
                if not (isinstance(key, cst.SimpleString) and isinstance(key.evaluated_value, str)):
                    raise NotConvertible(call, "normalizer_params with a non-literal key")
                keywords.append(
                    cst.Arg(element.value, keyword=cst.Name(key.evaluated_value))
                )
        if not any(k.keyword is not None and k.keyword.value == "scope" for k in keywords):
            keywords.append(cst.Arg(cst.SimpleString("'BatchNorm'"), keyword=cst.Name("scope")))
        bn_call = cst.Call(fn, [cst.Arg(cst.Name("inputs")), *keywords])
        outer, self.kind = self.kind, "slim.batch_norm"
        try:
            layer, _, training = self._batch_norm(bn_call)
        finally:
            self.kind = outer
        layer.scope = f"{name}/{layer.legacy_scope}"
        layer.name = f"{name}_{layer.name}"  # Keras names cannot contain "/"
        layer.attribute = self._attribute(layer.name, "batch_norm")
        layer.constructor = re.sub(r'name="[^"]*"\)$', f'name="{layer.name}")', layer.constructor)
        return Stages([(layer, training)], a["inputs"])

    def _dense(self, call: cst.Call):
        a = self._args(
            call,
            ("inputs", "units", "activation"),
            frozenset({"use_bias", "kernel_initializer", "bias_initializer", "kernel_regularizer",
                       "bias_regularizer", "name"}),
        )  # fmt: skip
        return self._dense_like(call, a, "units", "activation", None, "Dense", "dense", "layers")

    def _fully_connected(self, call: cst.Call):
        a = self._args(
            call,
            ("inputs", "num_outputs", "activation_fn"),
            frozenset({"weights_initializer", "weights_regularizer", "biases_initializer",
                       "biases_regularizer", "scope", "normalizer_fn", "normalizer_params"}),
        )  # fmt: skip
        return self._dense_like(
            call, a, "num_outputs", "activation_fn", "relu", "Dense", "fully_connected", "slim"
        )

    def _dense_like(self, call, a, units, activation, default_activation, keras, kind, style):
        slim = style == "slim"
        name = self._name(call, a.get("scope" if slim else "name"), kind)
        if name is None:
            raise NotConvertible(call, f"a {kind} layer without a literal name (TF1 numbers those)")
        if units not in a:
            raise NotConvertible(call, f"a {kind} layer without its size")
        act = self._activation(a.get(activation), default_activation)
        attribute = self._attribute(name, kind)
        normalizer = self._normalizer(call, a, name) if slim else None
        pairs: list[tuple[str, str | None]] = [
            ("", self._config(a[units])),
            ("activation", _quoted(act) if normalizer is None else None),
        ]  # fmt: skip
        tail, weights = self._kernel_and_bias(a, slim, name, normalizer is None)
        pairs += tail
        layer = Layer(attribute, f"keras.layers.{keras}({self._kwargs(pairs)})", weights, name)
        return _with_normalizer(layer, a["inputs"], normalizer, act)

    def _conv2d(self, call: cst.Call):
        a = self._args(
            call,
            ("inputs", "filters", "kernel_size", "strides", "padding"),
            frozenset({"activation", "use_bias", "kernel_initializer", "bias_initializer",
                       "kernel_regularizer", "bias_regularizer", "name", "dilation_rate"}),
        )  # fmt: skip
        return self._conv_like(call, a, slim=False)

    def _slim_conv2d(self, call: cst.Call):
        a = self._args(
            call,
            ("inputs", "num_outputs", "kernel_size", "stride", "padding"),
            frozenset({"activation_fn", "weights_initializer", "weights_regularizer",
                       "biases_initializer", "biases_regularizer", "scope", "rate",
                       "normalizer_fn", "normalizer_params"}),
        )  # fmt: skip
        return self._conv_like(call, a, slim=True)

    def _conv_like(self, call, a, slim: bool):
        kind = "conv2d"
        name = self._name(call, a.get("scope" if slim else "name"), kind)
        if name is None:
            raise NotConvertible(call, "a conv2d layer without a literal name (TF1 numbers those)")
        filters = a.get("num_outputs" if slim else "filters")
        if filters is None or "kernel_size" not in a:
            raise NotConvertible(call, "a conv2d layer without its filters / kernel size")
        # slim: padding 'SAME', relu; tf.layers: 'valid', no activation.
        padding = self._padding(a.get("padding"), "same" if slim else "valid")
        strides = a.get("stride" if slim else "strides")
        dilation = a.get("rate" if slim else "dilation_rate")
        act = self._activation(a.get("activation_fn" if slim else "activation"), "relu" if slim else None)  # fmt: skip
        attribute = self._attribute(name, kind)
        normalizer = self._normalizer(call, a, name) if slim else None
        pairs: list[tuple[str, str | None]] = [
            ("", self._config(filters)),
            ("", self._config(a["kernel_size"])),
            ("strides", self._config(strides) if strides is not None else None),
            ("padding", None if padding == "valid" else f'"{padding}"'),
            ("dilation_rate", self._config(dilation) if dilation is not None else None),
            ("activation", _quoted(act) if normalizer is None else None),
        ]  # fmt: skip
        tail, weights = self._kernel_and_bias(a, slim, name, normalizer is None)
        pairs += tail
        layer = Layer(attribute, f"keras.layers.Conv2D({self._kwargs(pairs)})", weights, name)
        return _with_normalizer(layer, a["inputs"], normalizer, act)

    def _kernel_and_bias(self, a, slim: bool, name: str, bias: bool = True):
        """The arguments dense and conv2d layers share, and their legacy -> Keras weight names.
        `bias` False: slim's layer with a normalizer_fn, which has no bias."""
        bias_init_arg = a.get("biases_initializer" if slim else "bias_initializer")
        if slim:  # slim drops the bias with biases_initializer=None
            use_bias = bias and not (
                isinstance(bias_init_arg, cst.Name) and bias_init_arg.value == "None"
            )
        else:
            use_bias = self._literal_bool(a.get("use_bias"), True)
        pairs: list[tuple[str, str | None]] = [
            ("use_bias", None if use_bias else "False"),
            # Both legacy APIs default to glorot_uniform (xavier) and zeros: Keras' defaults.
            ("kernel_initializer", self._initializer(a.get("weights_initializer" if slim else "kernel_initializer"), "keras")),
            ("bias_initializer", self._initializer(bias_init_arg, "keras") if use_bias else None),
            ("kernel_regularizer", self._regularizer(a.get("weights_regularizer" if slim else "kernel_regularizer"))),
            ("bias_regularizer", self._regularizer(a.get("biases_regularizer" if slim else "bias_regularizer"))),
            ("name", f'"{name}"'),
        ]  # fmt: skip
        weights = {"weights" if slim else "kernel": "kernel"}
        if use_bias:
            weights["biases" if slim else "bias"] = "bias"
        return pairs, weights

    def _padding(self, value: cst.BaseExpression | None, default: str) -> str:
        if value is None:
            return default
        if isinstance(value, cst.SimpleString) and str(value.evaluated_value).lower() in (
            "same",
            "valid",
        ):
            return str(value.evaluated_value).lower()
        raise NotConvertible(value, "a padding that is not a literal 'same' / 'valid'")

    def _max_pooling2d(self, call: cst.Call):
        a = self._args(call, ("inputs", "pool_size", "strides", "padding"), frozenset({"name"}))
        if "pool_size" not in a or "strides" not in a:
            raise NotConvertible(call, "max_pooling2d without pool_size / strides")
        return self._pool(
            call, a, a["pool_size"], a["strides"], self._padding(a.get("padding"), "valid")
        )

    def _max_pool2d(self, call: cst.Call):
        a = self._args(call, ("inputs", "kernel_size", "stride", "padding"), frozenset({"scope"}))
        if "kernel_size" not in a:
            raise NotConvertible(call, "max_pool2d without kernel_size")
        stride = a.get("stride") or cst.Integer("2")  # slim's default stride is 2
        return self._pool(
            call, a, a["kernel_size"], stride, self._padding(a.get("padding"), "valid")
        )

    def _pool(self, call, a, size, strides, padding):
        name = self._name(call, a.get("name") or a.get("scope"), "max pooling")
        pairs: list[tuple[str, str | None]] = [
            ("", self._config(size)),
            ("", self._config(strides)),
            ("padding", None if padding == "valid" else f'"{padding}"'),
            ("name", f'"{name}"' if name else None),
        ]
        layer = Layer(
            self._attribute(name, "max_pooling2d"),
            f"keras.layers.MaxPooling2D({self._kwargs(pairs)})",
            {},
            name,
        )
        return layer, a["inputs"], None

    def _flatten(self, call: cst.Call):
        a = self._args(call, ("inputs",), frozenset({"name", "scope"}))
        name = self._name(call, a.get("name") or a.get("scope"), "flatten")
        pairs = [("name", f'"{name}"' if name else None)]
        layer = Layer(
            self._attribute(name, "flatten"),
            f"keras.layers.Flatten({self._kwargs(pairs)})",
            {},
            name,
        )
        return layer, a["inputs"], None

    def _dropout(self, call: cst.Call):
        a = self._args(
            call, ("inputs", "rate", "noise_shape", "seed", "training"), frozenset({"name"})
        )
        if "rate" not in a or "noise_shape" in a:
            raise NotConvertible(call, "a dropout without its rate (or with a noise_shape)")
        name = self._name(call, a.get("name"), "dropout")
        training = self._training(call, a.get("training"), False)
        pairs = [
            ("", self._config(a["rate"])),
            ("seed", self._config(a["seed"]) if "seed" in a else None),
            ("name", f'"{name}"' if name else None),
        ]
        layer = Layer(
            self._attribute(name, "dropout"),
            f"keras.layers.Dropout({self._kwargs(pairs)})",
            {},
            name,
            training=True,
        )
        self.notes.append(DROPOUT_NOTE)
        return layer, a["inputs"], training

    def _batch_normalization(self, call: cst.Call):
        a = self._args(
            call,
            ("inputs", "axis", "momentum", "epsilon", "center", "scale"),
            frozenset({"training", "name", "fused"}),
        )
        return self._bn(call, a, slim=False)

    def _batch_norm(self, call: cst.Call):
        a = self._args(
            call,
            ("inputs", "decay", "center", "scale", "epsilon"),
            frozenset({"is_training", "scope", "fused", "updates_collections", "trainable"}),
        )
        updates = a.get("updates_collections")
        if updates is not None and not (
            (isinstance(updates, cst.Name) and updates.value == "None")
            or (_short(self.qualify(updates)) or "").endswith("GraphKeys.UPDATE_OPS")
        ):
            raise NotConvertible(call, "batch_norm with its own updates_collections")
        return self._bn(call, a, slim=True)

    def _bn(self, call, a, slim: bool):
        name = self._name(call, a.get("scope" if slim else "name"), "batch norm")
        if name is None:
            raise NotConvertible(call, "a batch norm without a literal name (TF1 numbers those)")
        if "axis" in a and not (
            isinstance(a["axis"], cst.UnaryOperation) and self.code(a["axis"]) == "-1"
        ):
            raise NotConvertible(call, "a batch norm over an axis other than the last")
        # Each legacy API's own defaults (slim: decay 0.999, scale False; tf.layers: 0.99, True).
        momentum = a.get("decay" if slim else "momentum")
        center = self._literal_bool(a.get("center"), True)
        scale = self._literal_bool(a.get("scale"), not slim)
        fused = self._literal_bool(a.get("fused"), True) if "fused" in a else None
        if fused is None and "fused" in a:
            raise NotConvertible(call, "a batch norm with a non-literal `fused`")
        training = self._training(call, a.get("is_training" if slim else "training"), slim)
        # slim's trainable=False: TF1's frozen gamma/beta (see TF1_BATCH_NORM), never Keras'
        # trainable=False (inference mode).
        frozen = not self._literal_bool(a.get("trainable"), True)
        pairs: list[tuple[str, str | None]] = [
            ("momentum", self._config(momentum) if momentum is not None else ("0.999" if slim else "0.99")),
            ("epsilon", self._config(a["epsilon"]) if "epsilon" in a else "0.001"),
            ("center", "True" if center else "False"),
            ("scale", "True" if scale else "False"),
        ]  # fmt: skip
        if fused is False and not frozen:
            constructor = "keras.layers.BatchNormalization"
        elif fused is False:
            raise NotConvertible(call, "a frozen batch norm with fused=False")
        else:
            constructor = "TF1BatchNorm"
            self.tf1_batch_norm = True
            pairs.insert(0, ("unbiased_ranks", "(2, 4)" if slim else "(4,)"))
            if frozen:
                pairs.insert(1, ("frozen", "True"))
                self.notes.append(
                    "slim batch_norm(trainable=False) -> TF1BatchNorm(frozen=True): gamma/beta "
                    "not trained, batch statistics used in training, moving statistics updated "
                    "on 2-D inputs only, as tf_slim did (Keras 3's trainable=False would mean "
                    "inference mode)"
                )
        pairs.append(("name", f'"{name}"'))
        weights = {}
        if scale:
            weights["gamma"] = "gamma"
        if center:
            weights["beta"] = "beta"
        weights.update(moving_mean="moving_mean", moving_variance="moving_variance")
        layer = Layer(
            self._attribute(name, "batch_norm"),
            f"{constructor}({self._kwargs(pairs)})",
            weights,
            name,
            training=True,
            non_trainable=frozenset(
                ["moving_mean", "moving_variance", *(["gamma", "beta"] if frozen else [])]
            ),
        )
        return layer, a["inputs"], training


def _with_normalizer(
    layer: Layer, inputs: cst.BaseExpression, normalizer: Stages | None, activation: str | None
) -> Stages:
    """slim's order: the layer (no bias, no activation), its batch norm, the activation."""
    if normalizer is None:
        return Stages([(layer, None)], inputs)
    after: list[tuple[Layer | str, str | None]] = (
        [(f"tf.nn.{activation}", None)] if activation else []
    )
    return Stages([(layer, None), *normalizer.steps, *after], inputs)


def _x_as_inputs(call: cst.Call) -> cst.Call:
    """``tf.nn.dropout(x=h, ...)``: its input keyword read as the layers' ``inputs``."""
    args = [
        a.with_changes(keyword=cst.Name("inputs")) if a.keyword and a.keyword.value == "x" else a
        for a in call.args
    ]
    return call.with_changes(args=args)


def _quoted(value: str | None) -> str | None:
    return f'"{value}"' if value is not None else None


class _Calls(cst.CSTTransformer):
    """Layer calls -> ``self.<layer>(inputs[, training=...])``; other calls must be kept ops."""

    def __init__(self, reader: _Reader) -> None:
        super().__init__()
        self.reader = reader
        self.error: NotConvertible | None = None
        self.replaced: dict[int, cst.BaseExpression] = {}
        self.stages: dict[int, tuple[Stages, cst.BaseExpression]] = {}  # by legacy call

    def visit_Call(self, node: cst.Call) -> bool:
        """A layer call is replaced whole: only its input is read further (its other
        arguments are constructor-time values, read by the layer's mapping)."""
        short = _short(self.reader.qualify(node.func))
        if short not in _LAYER_KINDS:
            return True
        try:
            stages = self.reader.layer(node, short)
        except NotConvertible as exc:
            self.error = self.error or exc
            return False
        # this transformer replaces expressions by expressions, never removing one
        inputs = cast(cst.BaseExpression, stages.inputs.visit(self))
        expression = inputs
        for step, training in stages.steps:
            if isinstance(step, Layer):
                self.reader.layers.append(step)
            expression = _stage_call(step, training, expression)
        self.replaced[id(node)] = expression
        self.stages[id(node)] = (stages, inputs)
        return False

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if id(original) in self.replaced:
            return self.replaced[id(original)]
        short = _short(self.reader.qualify(original.func))
        if short in _LAYER_KINDS:  # refused in visit_Call
            return updated
        if short is not None and (
            (short.startswith("nn.") and short[3:] in _NN_KEPT) or short in _OPS_KEPT
        ):
            return updated
        if self.error is None:
            self.error = NotConvertible(
                original, f"a call Keras layers do not cover: `{self.reader.code(original.func)}`"
            )
        return updated


def _stage_call(
    layer: Layer | str, training: str | None, inputs: cst.BaseExpression
) -> cst.BaseExpression:
    """``self.<layer>(inputs[, training=...])``, or ``tf.nn.<activation>(inputs)``."""
    args = [cst.Arg(inputs)]
    if isinstance(layer, str):
        return cst.Call(cst.parse_expression(layer), args)
    if layer.training:
        args.append(
            cst.Arg(
                cst.parse_expression(training or "training"),
                keyword=cst.Name("training"),
                equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
            )
        )
    return cst.Call(cst.parse_expression(f"self.{layer.attribute}"), args)


def _expanded(
    statement: cst.SimpleStatementLine, calls: _Calls, legacy: cst.BaseSmallStatement
) -> list[cst.BaseStatement]:
    """``net = slim.conv2d(..., normalizer_fn=...)`` -> one line per stage (layer, batch norm,
    activation), each assigning `net`; other statements as they are."""
    if not (
        isinstance(legacy, cst.Assign)
        and len(legacy.targets) == 1
        and isinstance(legacy.targets[0].target, cst.Name)
        and id(legacy.value) in calls.stages
    ):
        return [statement]
    stages, inputs = calls.stages[id(legacy.value)]
    if len(stages.steps) < 2:
        return [statement]
    target = legacy.targets[0].target
    lines: list[cst.BaseStatement] = []
    current: cst.BaseExpression = inputs
    for step, training in stages.steps:
        lines.append(cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(target)], _stage_call(step, training, current))]))  # fmt: skip
        current = target
    lines[0] = lines[0].with_changes(leading_lines=statement.leading_lines)
    return lines


LAYER_KINDS = frozenset(
    {
        "layers.dense", "layers.conv2d", "slim.fully_connected", "slim.conv2d",
        "layers.max_pooling2d", "slim.max_pool2d", "layers.flatten", "slim.flatten",
        "layers.batch_normalization", "slim.batch_norm", "layers.dropout", "slim.dropout",
        "nn.dropout", "slim.repeat",
    }
)  # fmt: skip
_LAYER_KINDS = LAYER_KINDS


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) or "Model"


def convert(
    function: cst.FunctionDef,
    qualify: Qualify,
    module: cst.Module,
    class_name: str | None = None,
    arg_scopes: list[ArgScope] | None = None,
    call_site_training: bool = True,
) -> KerasModel:
    """The Keras model class for `function`, or NotConvertible with the reason. `arg_scopes`:
    the slim arg_scopes around the legacy model call (outermost first). `call_site_training`
    False: their literal training flags are fixed in call() as they are (for a call that
    does not train the model, see KerasModel.call_site_training)."""
    reader = _Reader(function, qualify, module)
    if call_site_training:
        reader.call_site = frozenset(
            id(node)
            for scope in arg_scopes or ()
            for value in scope.defaults.values()
            for node in walk(value)
        )
    params = function.params
    if params.star_arg not in (None, cst.MaybeSentinel.DEFAULT) or params.star_kwarg or params.kwonly_params or params.posonly_params:  # fmt: skip
        raise NotConvertible(
            function, "a model function with *args / **kwargs / keyword-only parameters"
        )
    if not reader.params:
        raise NotConvertible(function, "a model function without an input parameter")
    if function.decorators:
        raise NotConvertible(function, "a decorated model function")
    body = list(function.body.body)
    docstring = function.get_docstring(clean=False)
    if docstring is not None:
        body = body[1:]
    functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
    own = _OwnScope(function, qualify)
    flat = _flatten(body, 1, list(arg_scopes or []), own, qualify, functions)
    statements: list[tuple[cst.BaseStatement, int]] = []
    calls = _Calls(reader)
    for statement, depth, stack, scoped in flat:
        try:
            if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
                raise NotConvertible(statement, "a model function that is not straight-line code")
            small = statement.body[0]
            if isinstance(small, cst.Assign) and _is_alias(small, qualify):
                # `regularizer = slim.l2_regularizer(wd)`: a constructor-time value, inlined.
                target = cast(cst.Name, small.targets[0].target)  # _is_alias checked it
                reader.aliases[target.value] = small.value
                continue
            if own.name is not None and not scoped and _has_layer(statement, qualify):
                raise NotConvertible(statement, "model code outside the function's variable_scope")
            if not isinstance(small, cst.Assign | cst.Return):
                raise NotConvertible(statement, "a statement other than an assignment or return")
            if isinstance(small, cst.Assign) and not all(
                isinstance(t.target, cst.Name) for t in small.targets
            ):
                raise NotConvertible(statement, "an assignment to something other than a name")
            reader.arg_scopes = stack
            # _Calls rewrites calls inside the line; the line itself stays
            new = cast(cst.SimpleStatementLine, statement.visit(calls))
            if calls.error is not None:
                raise calls.error
            for line in _expanded(new, calls, small):
                statements.append((line, depth))
        except NotConvertible as exc:
            loop = own.loops.get(id(statement))
            if loop is None:
                raise
            # The written-out copy is not in the source: name the loop's line.
            raise NotConvertible(loop, f"{exc.reason}, in a `for` loop") from None
    if not reader.layers or not any(layer.weights for layer in reader.layers):
        raise NotConvertible(function, "no layer with weights in the model function")
    names = [layer.name for layer in reader.layers if layer.name]
    if len(names) != len(set(names)):
        raise NotConvertible(function, "two layers with the same name (TF1 shared their weights)")
    input_param = reader.params[0]
    init_params = [p for p in reader.params[1:] if p in reader.init_uses and p != own.param]
    if own.param is not None and own.param in reader.init_uses:
        raise NotConvertible(function, f"the scope parameter `{own.param}` configures a layer")
    used_at_call = {
        n.value
        for s, _ in statements
        for n in walk(s)
        if isinstance(n, cst.Name) and n.value in reader.params
    }
    for param in reader.params[1:]:
        if param == reader.training_param or param in init_params:
            if param in used_at_call and param != reader.training_param:
                raise NotConvertible(function, f"the parameter `{param}` is used between layers")
            continue
        if param in used_at_call:
            raise NotConvertible(function, f"the parameter `{param}` is used between layers")
    training_default = "False"
    for p in function.params.params:
        if p.name.value == reader.training_param and p.default is not None:
            training_default = module.code_for_node(p.default)
    if reader.training_param is not None and input_param == reader.training_param:
        raise NotConvertible(function, "the training flag is the first parameter")
    result = KerasModel(
        function=function,
        class_name=class_name or _camel(function.name.value),
        input_param=input_param,
        training_param=reader.training_param,
        training_default=training_default,
        init_params=init_params,
        scope=own.name,
        layers=reader.layers,
        uses_tf1_batch_norm=reader.tf1_batch_norm,
        notes=list(dict.fromkeys(reader.notes)),
        scope_param=own.param,
        call_site_training=reader.call_site_training,
    )
    unit = module.default_indent
    result.source = _class_source(result, statements, docstring, unit)
    return result


def layer_variables(
    call: cst.Call,
    qualify: Qualify,
    module: cst.Module,
    strings: dict[str, str],
    arg_scopes: list[ArgScope],
) -> list[tuple[str, bool]]:
    """The legacy variables one TF1 layer call creates: (name under the enclosing scopes,
    trainable). The same mapping the Keras conversion uses (one table); NotConvertible when
    the call's variable names cannot be known statically. `strings`: parameters bound to
    literal strings (a layer named by a parameter)."""
    reader = _Reader(None, qualify, module, strings)
    reader.arg_scopes = arg_scopes
    stages = reader.layer(call, _short(qualify(call.func)) or "")
    out = []
    for layer in stages.layers:
        for legacy in layer.weights:
            out.append((f"{layer.legacy_scope}/{legacy}", legacy not in layer.non_trainable))
    return out


class _OwnScope:
    """The model function's own variable scope: `variable_scope('mlp')`, or a parameter with
    a literal default (`def net(x, scope='Net'): with variable_scope(scope, 'Net', [x])`)."""

    def __init__(self, function: cst.FunctionDef, qualify: Qualify) -> None:
        self.function, self.qualify = function, qualify
        self.name: str | None = None
        self.param: str | None = None
        self.loops: dict[int, cst.For] = {}  # written-out statements -> their source loop

    def read(self, statement: cst.With, call: cst.Call) -> None:
        if self.name is not None:
            raise NotConvertible(statement, "nested variable scopes in the model function")
        args = list(call.args)
        positional = [a for a in args if a.keyword is None]
        keywords = {a.keyword.value for a in args if a.keyword is not None}
        if not positional or len(positional) > 3 or keywords - {"default_name", "values"}:
            raise NotConvertible(
                statement, "a variable_scope with arguments other than its name (reuse, ...)"
            )
        value = positional[0].value
        defaults = {p.name.value: p.default for p in self.function.params.params}
        if isinstance(value, cst.Name):
            default = defaults.get(value.value)
            if isinstance(default, cst.SimpleString):
                self.param = value.value
                value = default
        if not (
            isinstance(value, cst.SimpleString)
            and isinstance(value.evaluated_value, str)
            and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value.evaluated_value)
        ):
            raise NotConvertible(
                statement, "a variable_scope whose name is not a literal identifier"
            )
        self.name = value.evaluated_value


def _flatten(
    body: Sequence[cst.CSTNode],  # a block's statements, or a one-line suite's small ones
    depth: int,
    stack: list[ArgScope],
    own: _OwnScope,
    qualify: Qualify,
    functions: dict[str, cst.FunctionDef],
    scoped: bool = False,
) -> list[tuple[cst.CSTNode, int, list[ArgScope], bool]]:
    """The function's statements with their block depth, the arg_scopes around them and
    whether they are inside the function's own variable scope."""
    out: list[tuple[cst.CSTNode, int, list[ArgScope], bool]] = []
    for statement in body:
        if isinstance(statement, cst.For):
            # A loop over a literal list: its iterations written out (layer names folded).
            try:
                unrolled = unroll(statement, own.function)
            except NotStatic as exc:
                raise NotConvertible(exc.node, exc.reason) from None
            source = own.loops.get(id(statement), statement)
            own.loops.update((id(s), source) for s in unrolled)
            out += _flatten(unrolled, depth + 1, stack, own, qualify, functions, scoped)
            continue
        if not isinstance(statement, cst.With):
            out.append((statement, depth, stack, scoped))
            continue
        if id(statement) in own.loops:  # a `with` in a loop: its body from the same loop
            own.loops.update((id(s), own.loops[id(statement)]) for s in statement.body.body)
        inner, inner_scoped = list(stack), scoped
        for item in statement.items:
            call = item.item
            if item.asname is not None or not isinstance(call, cst.Call):
                raise NotConvertible(
                    statement, "a `with` in the model function other than variable_scope"
                )
            if _short(qualify(call.func)) == "variable_scope":
                own.read(statement, call)
                inner_scoped = True
            elif is_arg_scope(call, qualify):
                inner += scopes_of(call, qualify, functions)
            else:
                raise NotConvertible(
                    statement, "a `with` in the model function other than variable_scope"
                )
        out += _flatten(
            list(statement.body.body),
            depth + 1,
            inner,
            own,
            qualify,
            functions,
            inner_scoped,
        )
    return out


def _has_layer(statement: cst.CSTNode, qualify: Qualify) -> bool:
    return any(
        isinstance(n, cst.Call) and _short(qualify(n.func)) in LAYER_KINDS for n in walk(statement)
    )


def _is_alias(small: cst.Assign, qualify: Qualify) -> bool:
    if len(small.targets) != 1 or not isinstance(small.targets[0].target, cst.Name):
        return False
    if not isinstance(small.value, cst.Call):
        return False
    short = _short(qualify(small.value.func)) or ""
    return short.endswith(("_regularizer", "_initializer"))


def _class_source(
    model: KerasModel,
    statements: list[tuple[cst.BaseStatement, int]],
    doc: str | None,
    unit: str,
) -> str:
    """The class in the module's indent `unit` (statements with their legacy block depth)."""
    init = "".join(f", {p}" for p in model.init_params)
    constructors = "".join(
        _wrapped(f"{unit * 2}self.{layer.attribute} = ", layer.constructor, unit * 3)
        for layer in model.layers
    )
    described = f"`{model.function.name.value}`" + (
        f" (variable scope `{model.scope}`)" if model.scope else ""
    )
    doc = (
        doc.strip()
        if doc
        else f"The layers of the TF1 model function {described}, as Keras layers."
    )
    training = ", training=False" if model.takes_training else ""
    return (
        f"class {model.class_name}(keras.Model):\n"
        f'{unit}"""{doc}"""\n\n'
        f"{unit}def __init__(self{init}, **kwargs):\n"
        f"{unit * 2}super().__init__(**kwargs)\n"
        f"{constructors}\n"
        f"{unit}def call(self, {model.input_param}{training}):\n"
        f"{_call_body(statements, model, unit)}"
    )


def _wrapped(head: str, call: str, indent: str, width: int = 100) -> str:
    """`head + call` on one line, or its arguments on the next when that is too long."""
    if len(head) + len(call) <= width or "(" not in call:
        return f"{head}{call}\n"
    name, arguments = call.split("(", 1)
    return f"{head}{name}(\n{indent}{arguments}\n"


def _call_body(
    statements: list[tuple[cst.BaseStatement, int]], model: KerasModel, unit: str
) -> str:
    """The call() statements at the method's indent (continuation lines shifted with them),
    the training flag renamed to Keras' `training`."""
    flag = model.training_param

    class _Rename(cst.CSTTransformer):
        def leave_Name(self, original, updated):
            return updated.with_changes(value="training") if updated.value == flag else updated

    indent = unit * 2
    out = []
    for statement, depth in statements:
        shift = len(indent) - len(unit) * depth
        if flag is not None:
            # _Rename renames names: the statement stays a statement (a block holds only
            # these two kinds; libcst's BaseStatement is their base)
            statement = cast(
                "cst.SimpleStatementLine | cst.BaseCompoundStatement", statement.visit(_Rename())
            )
        leading = len(getattr(statement, "leading_lines", ()))
        lines = cst.Module(
            body=[cast("cst.SimpleStatementLine | cst.BaseCompoundStatement", statement)]
        ).code.splitlines()
        for index, line in enumerate(lines):
            if not line.strip():
                out.append("")
            elif index <= leading:  # its comments and its first line
                out.append(indent + line.lstrip())
            elif shift >= 0:
                out.append(" " * shift + line)
            else:
                out.append(line[min(-shift, len(line) - len(line.lstrip())) :])
    return "\n".join(out) + "\n"
