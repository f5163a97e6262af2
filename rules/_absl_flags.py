"""``tf.app.flags`` / ``tf.flags`` spelled out in a module: absl's ``flags`` in TF 2.

Not a rule module. TF 1's ``tf.app.flags`` was absl's ``flags`` module under another name
(``tf.compat.v1.flags`` still is), so ``tf.app.flags.DEFINE_integer(...)`` and
``FLAGS = tf.app.flags.FLAGS`` become ``flags.DEFINE_integer(...)`` and ``FLAGS = flags.FLAGS``
after ``from absl import flags``: the same flags, the same command line, one registry shared
with every other module that defines flags. No TensorFlow import here.
"""

from __future__ import annotations

import libcst as cst

from tfmigrate.names import NameResolver

TF_FLAGS = frozenset({"tensorflow.app.flags", "tensorflow.flags"})


class _ToAbsl(cst.CSTTransformer):
    def __init__(self, resolver: NameResolver) -> None:
        super().__init__()
        self.resolver = resolver
        self.changed = False

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        if self.resolver.qualify(original_node) in TF_FLAGS:
            self.changed = True
            return cst.Name("flags")
        return updated_node


def uses_tf_flags(module: cst.Module) -> bool:
    """Whether the module spells ``tf.app.flags`` / ``tf.flags`` somewhere."""
    probe = _ToAbsl(NameResolver.for_module(module))
    module.visit(probe)
    return probe.changed


def to_absl_flags(module: cst.Module) -> cst.Module:
    """The module with every ``tf.app.flags`` / ``tf.flags`` spelled ``flags`` (absl's); the
    caller adds ``from absl import flags`` and checks first that ``flags`` is free."""
    return module.visit(_ToAbsl(NameResolver.for_module(module)))
