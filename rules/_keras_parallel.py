"""A user's own copy of Keras 2's `multi_gpu_model` (vendored, or hand-written as `make_parallel`).

Not a rule module. Such a function slices the inputs per device, calls the Keras model it was
given under `tf.device` in a loop, and concatenates the outputs into a new `Model`: it is a
multi_gpu_model (TFM107 converts its callers to MirroredStrategy), not a TF1 tower core, so the
tower rules skip it. Recognized by that shape, whatever the function is called, in the caller's
module or in a module of the project the caller imports.

No TensorFlow import here (the rewrite path must not need it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path, PurePosixPath

import libcst as cst

from tfmigrate.names import NameResolver
from tfmigrate.syntax import walk

Qualify = Callable[[cst.BaseExpression], str | None]

# libraries, not the project: no file of theirs is looked for
_LIBRARIES = frozenset({"tensorflow", "keras", "tf_keras", "numpy", "horovod", "tf_slim"})
_SLICES = ("tensorflow.slice", "tensorflow.split", "tensorflow.strided_slice", "tensorflow.gather")
_MERGES = ("concatenate", "Concatenate", "tensorflow.concat")


def _params(function: cst.FunctionDef) -> set[str]:
    params = function.params
    return {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)}


def is_parallel_copy(function: cst.FunctionDef, qualify: Qualify) -> bool:
    """Whether ``function`` is multi_gpu_model's shape: a loop over devices whose `tf.device`
    block calls a model parameter, input slices (`tf.slice`/`tf.split`, a `Lambda`) and a
    concatenation of the outputs into a returned Keras `Model`."""
    params = _params(function)
    calls_model = slices = merges = returns_model = False
    for node in walk(function.body):
        if isinstance(node, cst.For):
            for inner in walk(node.body):
                if not isinstance(inner, cst.With):
                    continue
                if not any(
                    isinstance(item.item, cst.Call)
                    and qualify(item.item.func) == "tensorflow.device"
                    for item in inner.items
                ):
                    continue
                calls_model |= any(
                    isinstance(c, cst.Call)
                    and isinstance(c.func, cst.Name)
                    and c.func.value in params
                    for c in walk(inner.body)
                )
        elif isinstance(node, cst.Call):
            name = qualify(node.func) or ""
            slices |= name.startswith(_SLICES) or name.endswith(".Lambda")
            merges |= name.endswith(_MERGES)
        elif isinstance(node, cst.Return) and isinstance(node.value, cst.Call):
            returns_model |= (qualify(node.value.func) or "").endswith(".Model")
    return calls_model and slices and merges and returns_model


@lru_cache(maxsize=1024)
def _module_file(folder_of_script: Path, dotted: str) -> Path | None:
    """The project file of module ``dotted`` as a script in ``folder_of_script`` imports it:
    looked up from that folder and each folder above it (a package imported from its root)."""
    relative = Path(*dotted.split("."))
    for folder in [folder_of_script, *folder_of_script.parents]:
        for candidate in (folder / relative.with_suffix(".py"), folder / relative / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def module_file(folder_of_script: Path, dotted: str) -> Path | None:
    """The project file of module ``dotted`` as a script in ``folder_of_script`` imports it
    (None for a library or a module not found)."""
    root = dotted.split(".", 1)[0]
    if not dotted or root in _LIBRARIES or root in sys.stdlib_module_names:
        return None
    return _module_file(folder_of_script, dotted)


def module_file_at(base: Path, dotted: str) -> Path | None:
    """The file of module ``dotted`` relative to the package folder ``base`` (a relative
    import), else None."""
    relative = Path(*dotted.split("."))
    for candidate in (base / relative.with_suffix(".py"), base / relative / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@lru_cache(maxsize=64)
def _copies_in(file: Path, mtime: float) -> frozenset[str]:
    """Names of the module-level multi_gpu_model copies defined in ``file``."""
    try:
        module = cst.parse_module(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, cst.ParserSyntaxError):
        return frozenset()
    qualify = NameResolver.for_module(module).qualify
    return frozenset(
        s.name.value
        for s in module.body
        if isinstance(s, cst.FunctionDef) and is_parallel_copy(s, qualify)
    )


def imported_copy(path: PurePosixPath | None, qualified: str | None) -> str | None:
    """For a call resolving to ``qualified`` (`utils.multi_gpu_model.multi_gpu_model`) in the
    script at ``path``: the project file that defines it as a multi_gpu_model copy, relative to
    the script's folder when it is below it; None when it is not one."""
    if path is None or not qualified or "." not in qualified:
        return None
    module, _, name = qualified.rpartition(".")
    root = module.split(".", 1)[0]
    if root in _LIBRARIES or root in sys.stdlib_module_names:
        return None
    script = Path(path)
    file = _module_file(script.parent, module)
    if file is None:
        return None
    try:
        mtime = file.stat().st_mtime
    except OSError:
        return None
    if name not in _copies_in(file.resolve(), mtime):
        return None
    return PurePosixPath(Path(os.path.relpath(file, script.parent)).as_posix()).as_posix()


def local_copies(module: cst.Module, qualify: Qualify) -> dict[str, cst.FunctionDef]:
    """The module-level multi_gpu_model copies of ``module`` by name."""
    return {
        s.name.value: s
        for s in module.body
        if isinstance(s, cst.FunctionDef) and is_parallel_copy(s, qualify)
    }


def may_call_copy(path: PurePosixPath, bindings: dict[str, str], words: str) -> bool:
    """Light-pass test: the file defines a function shaped like one (its words name a device
    and a concatenation), or imports a name from a project module that defines one."""
    if "device" in words and "oncat" in words and "Model" in words:
        return True
    for qualified in bindings.values():
        if imported_copy(path, qualified) is not None:
            return True
    return False


def inside_copy(function: cst.FunctionDef | None, qualify: Qualify) -> bool:
    """Whether a tower loop found in ``function`` is the loop of a multi_gpu_model copy."""
    return function is not None and is_parallel_copy(function, qualify)
