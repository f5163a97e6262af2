"""Regenerate tfmigrate's TensorFlow data files from an installed TensorFlow.

    .venv/bin/python scripts/generate_tf_api_data.py [--out DIR]

Writes two deterministic (sorted, compact) files into ``migrate/data/``:

* ``tf_upgrade_v2.json`` -- TensorFlow's own TF1 -> TF2 upgrade tables
  (``tensorflow.tools.compatibility``): symbol renames, keyword renames, argument reorders,
  warnings, deprecated modules, and the functions ``tf_upgrade_v2`` rewrites case by case.
* ``tf_api.json.gz`` -- every public name of the TF 2.x API (``tf.``, ``tf.compat.v1.``,
  ``tf.keras.`` and Keras 3 ``keras.``), with parameter names of callables and public members of
  classes.

Both record the TensorFlow and Keras versions they were generated from. Rerun on TF upgrades;
``tests/test_tfapi.py`` checks (slow) that the committed files match the installed TensorFlow.
The rewrite path never imports TensorFlow: ``tfmigrate.tfapi`` reads these files.
"""

from __future__ import annotations

import argparse
import gzip
import inspect
import io
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

# tf.keras must be Keras 3, the Keras TF 2.16+ users get by default (the legacy walk below
# sets it in a child process of its own).
_LEGACY_WALK = "--legacy-walk"
if _LEGACY_WALK not in sys.argv:
    os.environ.pop("TF_USE_LEGACY_KERAS", None)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

DATA = Path(__file__).resolve().parents[1] / "migrate" / "data"
UPGRADE_FILE = "tf_upgrade_v2.json"
API_FILE = "tf_api.json.gz"
FORMAT = 1

# Kinds of API entries (one letter keeps the file small).
MODULE, CLASS, FUNCTION, VALUE = "m", "c", "f", "v"


# ---------------------------------------------------------------------------------------------
# TF 2.x public API
# ---------------------------------------------------------------------------------------------
def _is_api_module(module: types.ModuleType) -> bool:
    """Public API modules live in TF's generated ``_api`` tree or Keras' API packages; anything
    else reachable as an attribute (``tf.python``, ``tf.tools``, ``keras.src``) is internal."""
    name = getattr(module, "__name__", "") or ""
    if name.startswith("keras."):
        return not name.startswith("keras.src")
    if name.startswith("tf_keras."):  # what tf.compat.v1.layers etc. load with legacy Keras
        return name.startswith("tf_keras.api.")
    path = getattr(module, "__file__", "") or ""
    return f"{os.sep}_api{os.sep}" in path


def _param_list(obj: Any, *, drop_self: bool = False) -> list[str] | None:
    """Parameter names; ``*x``/``**x`` for var-args, ``:x`` keyword-only, ``/x`` positional-only."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    params = list(signature.parameters.values())
    if drop_self and params and params[0].name in {"self", "cls"}:
        params = params[1:]
    out = []
    for p in params:
        prefix = {
            p.VAR_POSITIONAL: "*",
            p.VAR_KEYWORD: "**",
            p.KEYWORD_ONLY: ":",
            p.POSITIONAL_ONLY: "/",
        }.get(p.kind, "")
        out.append(prefix + p.name)
    return out


class ApiWalker:
    def __init__(self) -> None:
        self.names: dict[str, list[Any]] = {}
        self.signatures: dict[tuple[str, ...], int] = {}
        self.classes: dict[int, int] = {}  # id(class) -> index in class_table
        self.class_table: list[dict[str, Any]] = []
        self._keep_alive: list[Any] = []

    def sig(self, params: list[str] | None) -> int:
        if params is None:
            return -1
        key = tuple(params)
        return self.signatures.setdefault(key, len(self.signatures))

    def class_index(self, cls: type) -> int:
        if id(cls) in self.classes:
            return self.classes[id(cls)]
        self._keep_alive.append(cls)
        index = len(self.class_table)
        self.classes[id(cls)] = index
        entry: dict[str, Any] = {"init": self.sig(_param_list(cls))}
        self.class_table.append(entry)
        members: dict[str, int] = {}
        for name in dir(cls):
            if name.startswith("_"):
                continue
            try:
                static = inspect.getattr_static(cls, name)
            except AttributeError:
                continue
            if (
                isinstance(static, property)
                or not callable(static)
                and not isinstance(static, staticmethod | classmethod)
            ):
                members[name] = -1  # attribute / property
                continue
            if isinstance(static, type):
                members[name] = -1
                continue
            try:
                value = getattr(cls, name)
            except Exception:  # noqa: BLE001 - descriptors may raise anything on class access
                members[name] = -1
                continue
            bound = isinstance(static, classmethod)
            plain = inspect.isfunction(static)
            members[name] = self.sig(_param_list(value, drop_self=plain and not bound))
        entry["members"] = members
        return index

    def walk(self, prefix: str, module: types.ModuleType, skip: frozenset[str] = frozenset()):
        seen: set[str] = set()
        stack = [(prefix, module)]
        while stack:
            path, mod = stack.pop()
            if path in seen:
                continue
            seen.add(path)
            self.names[path] = [MODULE]
            for name in sorted(dir(mod)):
                if name.startswith("_") or f"{path}.{name}" in skip:
                    continue
                try:
                    value = getattr(mod, name)
                except Exception:  # noqa: BLE001 - lazy modules may fail to load; not API then
                    continue
                full = f"{path}.{name}"
                if isinstance(value, types.ModuleType):
                    if _is_api_module(value) and full.count(".") < 8:
                        stack.append((full, value))
                elif inspect.isclass(value):
                    self.names[full] = [CLASS, self.class_index(value)]
                elif callable(value):
                    self.names[full] = [FUNCTION, self.sig(_param_list(value))]
                else:
                    self.names[full] = [VALUE]

    def to_json(self, versions: dict[str, str]) -> dict[str, Any]:
        signatures = [list(s) for s, _ in sorted(self.signatures.items(), key=lambda kv: kv[1])]
        # Renumber signatures and classes in a canonical (sorted) order so the output does not
        # depend on the walk order.
        sig_order = sorted(range(len(signatures)), key=lambda i: signatures[i])
        sig_map = {old: new for new, old in enumerate(sig_order)}
        remap = lambda i: -1 if i < 0 else sig_map[i]  # noqa: E731

        def class_key(i: int) -> str:
            entry = self.class_table[i]
            return json.dumps(
                [
                    signatures[entry["init"]] if entry["init"] >= 0 else None,
                    sorted(
                        (k, signatures[v] if v >= 0 else None) for k, v in entry["members"].items()
                    ),
                ],
                sort_keys=True,
            )

        class_keys = {i: class_key(i) for i in range(len(self.class_table))}
        unique = sorted(set(class_keys.values()))
        class_pos = {key: n for n, key in enumerate(unique)}
        classes: list[Any] = [None] * len(unique)
        for i, entry in enumerate(self.class_table):
            classes[class_pos[class_keys[i]]] = [
                remap(entry["init"]),
                {k: remap(v) for k, v in sorted(entry["members"].items())},
            ]
        names: dict[str, Any] = {}
        for name, entry in sorted(self.names.items()):
            if entry[0] == CLASS:
                names[name] = [CLASS, class_pos[class_keys[entry[1]]]]
            elif entry[0] == FUNCTION:
                names[name] = [FUNCTION, remap(entry[1])]
            else:
                names[name] = entry[0]
        return {
            "format": FORMAT,
            **versions,
            "signatures": [signatures[i] for i in sig_order],
            "classes": classes,
            "names": names,
        }


def _legacy_keras_names() -> list[str]:
    """``tf.compat.v1`` names that only load with tf_keras (``TF_USE_LEGACY_KERAS=1``), such as
    ``tf.compat.v1.layers.*`` and ``tf.compat.v1.nn.rnn_cell.*``: walked in a child process,
    because the Keras flavour is fixed when TensorFlow is first imported."""
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1"}
    proc = subprocess.run(
        [sys.executable, __file__, _LEGACY_WALK], env=env, capture_output=True, check=True
    )
    return json.loads(proc.stdout)


def _legacy_walk() -> None:
    import tensorflow as tf

    walker = ApiWalker()
    walker.walk("tf.compat.v1", tf.compat.v1, skip=frozenset({"tf.compat.v1.compat"}))
    sys.stdout.write(json.dumps(sorted(walker.names)))


def build_api(tf: Any, keras: Any, versions: dict[str, str]) -> dict[str, Any]:
    walker = ApiWalker()
    # tf.compat holds v1 (walked on its own) and v2 (the same API as tf.) -- not a third copy.
    walker.walk("tf", tf, skip=frozenset({"tf.compat.v1", "tf.compat.v2"}))
    # v1's own compat.v1/v2 would only repeat the two walks above.
    walker.walk("tf.compat.v1", tf.compat.v1, skip=frozenset({"tf.compat.v1.compat"}))
    walker.walk("keras", keras)
    data = walker.to_json(versions)
    data["legacy_keras"] = sorted(set(_legacy_keras_names()) - set(data["names"]))
    data["tf_slim"] = _tf_slim_names()
    return data


def _tf_slim_names() -> list[str]:
    """Public names of tf_slim (PyPI), which carries most of ``tf.contrib.slim`` and
    ``tf.contrib.layers``: where a contrib symbol can go without a rewrite."""
    import tf_slim

    names = {f"tf_slim.{n}" for n in dir(tf_slim) if not n.startswith("_")}
    for sub in ("layers", "losses", "metrics", "nets"):
        module = getattr(tf_slim, sub, None)
        if isinstance(module, types.ModuleType):
            names.update(f"tf_slim.{sub}.{n}" for n in dir(module) if not n.startswith("_"))
    return sorted(names)


# ---------------------------------------------------------------------------------------------
# TF's upgrade tables
# ---------------------------------------------------------------------------------------------
def _normalize(name: str) -> str:
    # In TF 2.x, tf.compat.v2.X *is* tf.X: one spelling keeps lookups simple.
    return "tf." + name[len("tf.compat.v2.") :] if name.startswith("tf.compat.v2.") else name


def _message(value: Any) -> str:
    return value[1] if isinstance(value, tuple) else str(value)


def build_upgrade(versions: dict[str, str]) -> dict[str, Any]:
    from tensorflow.tools.compatibility import tf_upgrade_v2

    spec = tf_upgrade_v2.TFAPIChangeSpec()

    # Entries spelled ``contrib_layers.x`` (direct-import support) or ``*.method`` (any object)
    # are not qualified names: tfmigrate resolves imports itself and does not guess receivers.
    def qualified(name: str) -> bool:
        return name.startswith("tf.")

    renames = {_normalize(k): _normalize(v) for k, v in spec.symbol_renames.items() if qualified(k)}
    # A target that is itself renamed would be renamed again on the next fix pass; apply the
    # whole chain now (tf.nn.max_pool_v2 -> tf.nn.max_pool -> tf.nn.max_pool2d).
    for key in list(renames):
        target, hops = renames[key], 0
        while target in renames and renames[target] != target and hops < 5:
            target, hops = renames[target], hops + 1
        renames[key] = target

    reorders: dict[str, list[str | None]] = {}
    for name, order in spec.function_reorders.items():
        if not qualified(name):
            continue
        first = next((i for i, a in enumerate(order) if a is not None), len(order))
        if all(a is not None for a in order[first:]):  # Nones only lead: a valid keyword tail
            reorders[name] = list(order)

    return {
        "format": FORMAT,
        **versions,
        "renames": dict(sorted(renames.items())),
        "keyword_renames": {
            k: dict(sorted(v.items()))
            for k, v in sorted(spec.function_keyword_renames.items())
            if qualified(k)
        },
        "reorders": dict(sorted(reorders.items())),
        "warnings": {
            k: _message(v) for k, v in sorted(spec.function_warnings.items()) if qualified(k)
        },
        "arg_warnings": {
            k: {arg: _message(msg) for (arg, _pos), msg in sorted(v.items())}
            for k, v in sorted(spec.function_arg_warnings.items())
            if qualified(k)
        },
        "transformed": sorted(k for k in spec.function_transformers if qualified(k)),
        "module_deprecations": {
            k: _message(v) for k, v in sorted(spec.module_deprecations.items())
        },
    }


# ---------------------------------------------------------------------------------------------
def _dump(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")


def _gzip(raw: bytes) -> bytes:
    buffer = io.BytesIO()
    # mtime=0 and no file name: the same input gives the same bytes.
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as out:
        out.write(raw)
    return buffer.getvalue()


def generate() -> dict[str, bytes]:
    """File name -> contents (uncompressed JSON for both; the caller gzips the API file)."""
    import keras
    import tensorflow as tf

    versions = {"tensorflow_version": tf.__version__, "keras_version": keras.__version__}
    # Walk the API before importing tensorflow.tools.*, which would add `tf.tools`.
    api = build_api(tf, keras, versions)
    upgrade = build_upgrade(versions)
    return {UPGRADE_FILE: _dump(upgrade), API_FILE: _dump(api)}


def main(argv: list[str] | None = None) -> int:
    if _LEGACY_WALK in (argv if argv is not None else sys.argv[1:]):
        _legacy_walk()
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, raw in generate().items():
        data = _gzip(raw) if name.endswith(".gz") else raw
        (args.out / name).write_bytes(data)
        print(f"wrote {args.out / name} ({len(data):,} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
