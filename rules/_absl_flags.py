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


def without_flags_alias(module: cst.Module) -> tuple[cst.Module, bool]:
    """The module without its top-level ``flags = tf.app.flags`` (C3D's and many scripts'
    spelling): ``from absl import flags`` binds the same name to the same module."""
    resolver = NameResolver.for_module(module)
    body = []
    dropped = False
    for statement in module.body:
        line = statement if isinstance(statement, cst.SimpleStatementLine) else None
        small = line.body[0] if line is not None and len(line.body) == 1 else None
        if (
            isinstance(small, cst.Assign)
            and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Name)
            and small.targets[0].target.value == "flags"
            and resolver.qualify(small.value) in TF_FLAGS
        ):
            dropped = True
            continue
        body.append(statement)
    return (module.with_changes(body=body), True) if dropped else (module, False)


class _ToCompatV1(_ToAbsl):
    def __init__(self, resolver: NameResolver, tf: str) -> None:
        super().__init__(resolver)
        self.tf = tf

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        if self.resolver.qualify(original_node) in TF_FLAGS:
            self.changed = True
            return cst.parse_expression(f"{self.tf}.compat.v1.flags")
        return updated_node


def to_compat_v1_flags(module: cst.Module, tf: str) -> cst.Module:
    """The module with every ``tf.app.flags`` / ``tf.flags`` spelled ``tf.compat.v1.flags``:
    absl's flags behind TF1's wrapper, which parses ``sys.argv`` when a flag is read before
    ``app.run`` parsed it (code that reads FLAGS at import time keeps working)."""
    return module.visit(_ToCompatV1(NameResolver.for_module(module), tf))
