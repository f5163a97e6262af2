"""TFM303's conversion of one tf.get_variable model function, from module source (no
TensorFlow import).

Shared by test_keras_weights_emit.py and the keras_weights_numerics.py subprocess it starts.
"""

from __future__ import annotations

from pathlib import PurePosixPath

import libcst as cst

from tfmigrate.names import NameResolver
from tfmigrate.rule import RuleContext
from tfmigrate.rules._keras_weights_emit import WeightsModel, convert_weights
from tfmigrate.rules.tower_program import TowerProgramToMirroredStrategy


def convert(source: str, function: str) -> WeightsModel:
    """The Keras model TFM303 writes for `function` of `source` (raises NotConvertible)."""
    module = cst.parse_module(source)
    context = RuleContext(
        PurePosixPath("model.py"), NameResolver.for_module(module), module, {"_tfm303_inner": True}
    )
    rule = TowerProgramToMirroredStrategy(context)
    cst.visit_batched(module, [rule])
    node = next(
        s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == function
    )
    return convert_weights(node, module, rule.qualify)
