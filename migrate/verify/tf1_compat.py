"""Make an unmodified TF1 script import and run on TF 2.21 (legacy side of verify only).

Only the legacy boot process calls :func:`install`; TensorFlow is imported inside it. After it ran:
- ``import tensorflow as tf`` gives ``tf.compat.v1`` (v2 behaviour disabled), falling back to the
  real TF namespace for names v1 lacks; ``tensorflow.python...`` imports still reach the real package;
- ``tf.contrib.slim`` / ``tensorflow.contrib.slim`` is tf_slim, ``tf.contrib.layers`` merges
  tf_slim's layers, initializers, regularizers and optimizers, ``tf.contrib.framework`` is slim's
  framework ops, ``tf.contrib.memory_stats`` reports the process' memory on CPU;
- ``tf.layers`` works (``TF_USE_LEGACY_KERAS=1`` must be in the environment before TF starts);
- ``keras.*`` (Keras 2-era imports) resolve to tf_keras, incl. ``keras.backend.tensorflow_backend``
  and ``keras.utils.multi_gpu_model`` (keras2_compat).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import resource
import sys
import types
from collections.abc import Callable
from typing import Any

LEGACY_ENV = {
    "TF_USE_LEGACY_KERAS": "1",  # tf.compat.v1.layers / tf_slim need Keras 2 (tf_keras)
    "TF_DETERMINISTIC_OPS": "1",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}

MEMORY_STATS_SCOPE = "tfmigrate_memory_stats"  # fetches under it are bookkeeping, never compared


def peak_rss_bytes() -> int:
    """Process peak resident memory (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def current_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return peak_rss_bytes()


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serve ``alias.sub`` as the already importable module ``target.sub`` (one module object, not a
    second copy, so registries inside tf_keras/tf_slim are not initialised twice)."""

    def __init__(self, prefixes: dict[str, Callable[[str], types.ModuleType]]) -> None:
        self.prefixes = prefixes

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        for prefix in self.prefixes:
            if fullname == prefix or fullname.startswith(prefix + "."):
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        for prefix, resolve in self.prefixes.items():
            if spec.name == prefix or spec.name.startswith(prefix + "."):
                return resolve(spec.name)
        raise ImportError(spec.name)

    def exec_module(self, module) -> None:  # the target module is already executed
        pass


class _TF1Namespace(types.ModuleType):
    """``tensorflow`` as a TF1 program sees it: compat.v1 first, then the real TF2 namespace."""

    def __init__(self, v1: types.ModuleType, real: types.ModuleType, contrib: types.ModuleType):
        super().__init__("tensorflow", real.__doc__)
        self._v1, self._real = v1, real
        self.__path__ = list(
            getattr(real, "__path__", [])
        )  # submodule imports reach the real package
        self.__spec__ = real.__spec__
        self.__file__ = getattr(real, "__file__", None)
        self.contrib = contrib
        self.__version__ = real.__version__

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self._v1, name)
        except AttributeError:
            pass
        try:
            return getattr(self._real, name)
        except AttributeError:
            if name in _TF0_RENAMES:  # TF 0.x spellings real tower code still has
                target: Any = self._v1
                for part in _TF0_RENAMES[name].split("."):
                    target = getattr(target, part)
                return target
            raise


_TF0_RENAMES = {
    "pack": "stack",
    "unpack": "unstack",
    "mul": "multiply",
    "sub": "subtract",
    "neg": "negative",
    "select": "where",
    "initialize_all_variables": "global_variables_initializer",
    "initialize_local_variables": "local_variables_initializer",
    "initialize_variables": "variables_initializer",
    "all_variables": "global_variables",
    "merge_all_summaries": "summary.merge_all",
}


def _tf0_argument_orders(namespace: types.ModuleType, v1: Any) -> None:
    """``concat(0, values)`` and ``split(0, n, value)``: TF 0.x argument orders, still in the wild."""

    def concat(*args: Any, **kwargs: Any) -> Any:
        if "concat_dim" in kwargs:
            kwargs["axis"] = kwargs.pop("concat_dim")
        if len(args) >= 2 and isinstance(args[0], int) and isinstance(args[1], (list, tuple)):
            args = (args[1], args[0], *args[2:])
        return v1.concat(*args, **kwargs)

    def split(*args: Any, **kwargs: Any) -> Any:
        if "split_dim" in kwargs or "num_split" in kwargs:
            axis, num, value = kwargs.pop("split_dim", 0), kwargs.pop("num_split"), kwargs.pop("value")
            return v1.split(value, num, axis=axis, **kwargs)
        if len(args) >= 3 and isinstance(args[0], int) and isinstance(args[1], int) and not isinstance(args[2], int):
            return v1.split(args[2], args[1], args[0], *args[3:], **kwargs)
        return v1.split(*args, **kwargs)

    namespace.__dict__.update(concat=concat, split=split)


class _MergedModule(types.ModuleType):
    """A module whose attributes come from the first of several modules that has them."""

    def __init__(
        self, name: str, sources: list[types.ModuleType], extra: dict[str, Any] | None = None
    ):
        super().__init__(name)
        self._sources = sources
        self.__dict__.update(extra or {})
        self.__path__: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        for src in self._sources:
            if hasattr(src, name):
                return getattr(src, name)
        raise AttributeError(
            f"{self.__name__}.{name} has no shim in tfmigrate's legacy runtime (tf.contrib is gone in TF2)"
        )


def _alias_tf_keras_legacy_layers() -> None:
    """tf_slim 1.1.0 imports ``tf_keras.legacy_tf_layers``; tf_keras ships it under ``src``."""
    import tf_keras.src.legacy_tf_layers as legacy

    sys.modules.setdefault("tf_keras.legacy_tf_layers", legacy)
    for sub in ("base", "core", "convolutional", "normalization", "pooling", "variable_scope_shim"):
        try:
            mod = importlib.import_module(f"tf_keras.src.legacy_tf_layers.{sub}")
        except ImportError:
            continue
        sys.modules.setdefault(f"tf_keras.legacy_tf_layers.{sub}", mod)


def _memory_stats(v1: Any) -> types.ModuleType:
    import numpy as np

    def op(name: str, fn: Callable[[], int]) -> Callable[[], Any]:
        def make(*_args: Any, **_kwargs: Any) -> Any:
            with v1.name_scope(MEMORY_STATS_SCOPE):
                return v1.py_func(lambda: np.int64(fn()), [], v1.int64, stateful=True, name=name)

        return make

    mod = types.ModuleType("tensorflow.contrib.memory_stats")
    mod.__dict__.update(
        MaxBytesInUse=op("MaxBytesInUse", peak_rss_bytes),
        BytesInUse=op("BytesInUse", current_rss_bytes),
        BytesLimit=op(
            "BytesLimit", lambda: os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        ),
    )
    mod.BytesInUse.__doc__ = "CPU stand-in: process resident memory."
    return mod


def _contrib(v1: Any) -> types.ModuleType:
    import tf_slim
    import tf_slim.layers
    from tf_slim.layers import initializers, optimizers, regularizers, summaries, utils
    from tf_slim.ops import arg_scope as arg_scope_mod
    from tf_slim.ops import variables as slim_variables

    layers = _MergedModule(
        "tensorflow.contrib.layers",
        [tf_slim.layers, initializers, regularizers, optimizers, summaries, utils, tf_slim],
    )
    framework = _MergedModule(
        "tensorflow.contrib.framework",
        [slim_variables, arg_scope_mod, tf_slim],
        {
            "get_or_create_global_step": v1.train.get_or_create_global_step,
            "get_global_step": v1.train.get_global_step,
        },
    )
    subs: dict[str, types.ModuleType] = {
        "slim": tf_slim,
        "layers": layers,
        "framework": framework,
        "memory_stats": _memory_stats(v1),
    }
    contrib = _MergedModule("tensorflow.contrib", [], subs)
    for name, mod in subs.items():
        sys.modules[f"tensorflow.contrib.{name}"] = mod
    sys.modules["tensorflow.contrib"] = contrib
    return contrib


def _keras_aliases() -> None:
    """Keras 2-era ``import keras`` / ``keras.backend.tensorflow_backend`` → tf_keras (graph mode)."""
    import tf_keras
    import tf_keras.backend as public_backend
    import tf_keras.src.backend as full_backend

    # Keras 2's backend had get_session/set_session; tf_keras keeps them out of its public API
    backend = _MergedModule("keras.backend", [public_backend, full_backend])
    backend.__dict__["tensorflow_backend"] = backend  # Keras 2's `import keras` made this an attribute too

    # Keras 2's optimizers (`SGD(lr=..., decay=...)`, updates built in the graph) are tf_keras's
    # legacy OptimizerV2 family; tf_keras's default ones cannot be converted in graph mode
    import tf_keras.optimizers
    import tf_keras.optimizers.legacy

    optimizers = _MergedModule("keras.optimizers", [tf_keras.optimizers.legacy, tf_keras.optimizers])

    def resolve(name: str) -> types.ModuleType:
        if name in ("keras.backend", "keras.backend.tensorflow_backend"):
            return backend
        if name == "keras.optimizers":
            return optimizers
        return importlib.import_module("tf_keras" + name[len("keras") :])

    import tf_keras.utils

    from tfmigrate.verify import keras2_compat

    keras2_compat.install(tf_keras.utils)  # multi_gpu_model (gone since TF 2.4)
    try:  # TF 1.x had tf.keras.utils.multi_gpu_model too: tf_keras's v1 API (tf.compat.v1.keras)
        import tf_keras.api._v1.keras.utils as v1_utils  # and v2 API (tf.keras) both get it
        import tf_keras.api._v2.keras.utils as v2_utils

        v1_utils.multi_gpu_model = v2_utils.multi_gpu_model = keras2_compat.multi_gpu_model
    except ImportError:
        pass
    sys.modules.pop("keras", None)
    sys.meta_path.insert(0, _AliasFinder({"keras": resolve}))
    sys.modules["keras"] = tf_keras
    tf_keras.backend = backend  # `import keras; keras.backend.set_session(...)` (a superset)
    tf_keras.optimizers = optimizers


def install(seed: int) -> Any:
    """Set up the TF1 world in this process and return the ``tensorflow`` module scripts will get."""
    for key, value in LEGACY_ENV.items():
        os.environ.setdefault(key, value)
    import tensorflow as real  # noqa: I001  (must come after the environment above)
    from tensorflow.python.framework import ops

    if not hasattr(ops, "Tensor"):  # removed in TF 2.21; tf_slim still spells it
        ops.Tensor = real.Tensor
    real.config.experimental.enable_op_determinism()
    v1 = real.compat.v1
    v1.disable_v2_behavior()
    _alias_tf_keras_legacy_layers()
    contrib = _contrib(v1)
    namespace = _TF1Namespace(v1, real, contrib)
    _tf0_argument_orders(namespace, v1)
    sys.modules["tensorflow"] = namespace
    try:
        _keras_aliases()
    except ImportError:  # tf_keras missing: only Keras 2-era scripts will notice
        pass
    _seed_every_graph(ops, seed)
    v1.set_random_seed(seed)
    return namespace


def _seed_every_graph(ops: Any, seed: int) -> None:
    """Op determinism refuses unseeded random ops; scripts often build a fresh ``tf.Graph()``."""
    orig_init = ops.Graph.__init__

    def init(graph: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(graph, *args, **kwargs)
        graph.seed = seed

    ops.Graph.__init__ = init
