"""How batches reach the towers: placeholders fed per step (one set, or one per GPU), queues
(FIFOQueue, shuffle_batch, prefetch_queue), tf.data iterators of every kind, py_func splits."""

from __future__ import annotations

import libcst as cst

from tfmigrate.convert import ir
from tfmigrate.convert.recognize._code import Code, body_nodes, call_name, keyword
from tfmigrate.rules._towers import LOOP, TOWERISH, method_name

_QUEUES = frozenset(
    {
        "tensorflow.FIFOQueue",
        "tensorflow.PaddingFIFOQueue",
        "tensorflow.RandomShuffleQueue",
        "tensorflow.train.shuffle_batch",
        "tensorflow.train.batch",
        "tensorflow.train.batch_join",
        "tensorflow.train.shuffle_batch_join",
        "tensorflow.train.string_input_producer",
        "tensorflow.train.slice_input_producer",
        "tensorflow.train.input_producer",
    }
)
_ITERATORS = {
    "make_one_shot_iterator": ir.InputKind.ONE_SHOT,
    "make_initializable_iterator": ir.InputKind.INITIALIZABLE,
    "from_structure": ir.InputKind.REINITIALIZABLE,
    "from_string_handle": ir.InputKind.STRING_HANDLE,
    "string_handle": ir.InputKind.STRING_HANDLE,
}


def find_inputs(region: list[Code], tower_loops: list[cst.CSTNode]) -> tuple[ir.Input, ...]:
    """Every input kind found in ``region`` (the tower code first), one entry per kind."""
    found: dict[ir.InputKind, ir.Input] = {}
    loops = {id(loop) for loop in tower_loops}
    for code in region:
        source = code.source
        for node in body_nodes(code):
            if not isinstance(node, cst.Call):
                continue
            kind = _kind(code, node, loops)
            if kind is not None and kind not in found:
                found[kind] = ir.Input(kind, source.where(node), source.src(node, 70))
    # Placeholders per GPU supersede the plain feed_dict reading of the same program.
    if ir.InputKind.PER_GPU_PLACEHOLDERS in found:
        found.pop(ir.InputKind.FEED_DICT, None)
    # A dataset read through a named iterator kind is that kind.
    if any(kind in found for kind in _ITERATORS.values()):
        found.pop(ir.InputKind.DATASET, None)
    return tuple(found.values())


def _kind(code: Code, call: cst.Call, loops: set[int]) -> ir.InputKind | None:
    source = code.source
    name = call_name(source, call) or ""
    method = method_name(call)
    if name in _QUEUES:
        return ir.InputKind.QUEUE
    if name.endswith("prefetch_queue") or method == "prefetch_queue":
        return ir.InputKind.PREFETCH_QUEUE
    if name in ("tensorflow.py_func", "tensorflow.numpy_function") and _splits(code):
        return ir.InputKind.PY_FUNC_SPLIT
    last = name.rsplit(".", 1)[-1] if name else method
    if last in _ITERATORS and (name.startswith("tensorflow.") or method is not None):
        return _ITERATORS[last]
    if name == "tensorflow.placeholder":
        if _in_device_loop(code, call, loops):
            return ir.InputKind.PER_GPU_PLACEHOLDERS
        return None
    if method == "run" and _feeds(call):
        return ir.InputKind.FEED_DICT
    if method == "dequeue" or method == "dequeue_many":
        return ir.InputKind.QUEUE
    if name.startswith("tensorflow.data.") and "Dataset" in name:
        return ir.InputKind.DATASET
    return None


def _feeds(call: cst.Call) -> bool:
    """``sess.run(op, feed_dict=...)`` or ``sess.run(op, {x: batch})``."""
    if keyword(call, "feed_dict") is not None:
        return True
    positional = [a for a in call.args if a.keyword is None]
    return len(positional) > 1 and isinstance(positional[1].value, cst.Dict | cst.DictComp)


def _splits(code: Code) -> bool:
    return any(
        isinstance(n, cst.Call) and call_name(code.source, n) == "tensorflow.split"
        for n in body_nodes(code)
    )


def _in_device_loop(code: Code, call: cst.Call, loops: set[int]) -> bool:
    """A placeholder made once per GPU: inside a tower loop, or a loop over GPUs."""
    for ancestor in code.source.ancestors(call):
        if id(ancestor) in loops:
            return True
        if isinstance(ancestor, LOOP) and isinstance(ancestor, cst.For):
            if TOWERISH.search(code.source.src(ancestor.iter) + code.source.src(ancestor.target)):
                return True
        if isinstance(ancestor, cst.FunctionDef):
            break
    return False
