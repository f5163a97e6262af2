"""TFM303's conversion of one tf.get_variable model function, from module source (no
TensorFlow import).

Shared by test_keras_weights_emit.py and the keras_weights_numerics.py subprocess it starts.
"""

from __future__ import annotations

from keras_model_source import read_model_module

from tfmigrate.rules._keras_weights_emit import WeightsModel, convert_weights


def convert(source: str, function: str) -> WeightsModel:
    """The Keras model TFM303 writes for `function` of `source` (raises NotConvertible)."""
    node, module, rule = read_model_module(source, function)
    return convert_weights(node, module, rule.qualify)
