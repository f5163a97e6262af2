"""TensorFlow facts for rules, read from data files -- never from an imported TensorFlow.

``scripts/generate_tf_api_data.py`` writes the files from an installed TensorFlow:

* ``data/tf_upgrade_v2.json``: TF's own TF1 -> TF2 upgrade tables (renames, keyword renames,
  argument reorders, warnings, deprecated modules);
* ``data/tf_api.json.gz``: the public TF 2.x API (``tf.``, ``tf.compat.v1.``, ``tf.keras.``,
  ``keras.``) with parameter names and class members.

Names here use TF's own spelling (``tf.nn.conv2d``, ``keras.Model``); :func:`tf_spelling` turns a
canonical qualified name (``tensorflow.nn.conv2d``) into it. Files are loaded once, lazily.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
UPGRADE_FILE = DATA / "tf_upgrade_v2.json"
API_FILE = DATA / "tf_api.json.gz"

MODULE, CLASS, FUNCTION, VALUE = "module", "class", "function", "value"
_KINDS = {"m": MODULE, "c": CLASS, "f": FUNCTION, "v": VALUE}
_ROOTS = ("tf", "keras")


@lru_cache(maxsize=1)
def upgrade_tables() -> dict[str, Any]:
    return json.loads(UPGRADE_FILE.read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def api_data() -> dict[str, Any]:
    with gzip.open(API_FILE, "rb") as handle:
        return json.loads(handle.read())


def versions() -> dict[str, str]:
    """The TensorFlow and Keras versions the data was generated from."""
    data = api_data()
    return {"tensorflow": data["tensorflow_version"], "keras": data["keras_version"]}


def tf_spelling(qualified: str) -> str:
    """``tensorflow.compat.v1.nn.conv2d`` -> ``tf.compat.v1.nn.conv2d``; ``keras.X`` unchanged."""
    if qualified == "tensorflow" or qualified.startswith("tensorflow."):
        return "tf" + qualified[len("tensorflow") :]
    return qualified


# -- the upgrade tables ---------------------------------------------------------------------------
def rename(name: str) -> str | None:
    """TF's TF2 (or ``tf.compat.v1``) spelling of a TF1 symbol, e.g. ``tf.Session`` ->
    ``tf.compat.v1.Session``; None when the table has no entry."""
    return upgrade_tables()["renames"].get(name)


def compat_v1_only(name: str) -> str | None:
    """``tf.compat.v1.X`` for a ``tf.X`` that TF 2.x dropped but ``tf.compat.v1`` (TF1's API)
    still has. This covers what TF's rename table misses (it no longer lists ``tf.layers.*``)."""
    if not name.startswith("tf.") or name.startswith("tf.compat.") or exists(name) is not False:
        return None
    target = "tf.compat.v1." + name[3:]
    return target if exists(target) or needs_legacy_keras(target) else None


def tf2_rename(name: str) -> tuple[str, str] | None:
    """(prefix, new prefix) for the longest prefix of ``name`` that TF 2.x spells differently:
    TF's rename table first, then :func:`compat_v1_only`."""
    parts = name.split(".")
    prefixes = [".".join(parts[:end]) for end in range(len(parts), 1, -1)]
    for prefix in prefixes:
        target = rename(prefix)
        if target is not None:
            return prefix, target
    for prefix in prefixes:
        target = compat_v1_only(prefix)
        if target is not None:
            return prefix, target
    return None


def keyword_renames(name: str) -> dict[str, str | None]:
    """Old keyword -> new keyword (None: the argument is dropped) for calls of TF1 ``name``."""
    return upgrade_tables()["keyword_renames"].get(name, {})


def reorder(name: str) -> list[str | None] | None:
    """TF1 positional parameter names of a function whose TF2 order changed; positions holding
    None keep their place, the rest must be passed by keyword."""
    return upgrade_tables()["reorders"].get(name)


def warning(name: str) -> str | None:
    """TF's manual-migration note for a symbol (e.g. a contrib function moved to Keras)."""
    message = upgrade_tables()["warnings"].get(name)
    return message.replace("<function name>", name) if message else None


def arg_warnings(name: str) -> dict[str, str]:
    return upgrade_tables()["arg_warnings"].get(name, {})


@lru_cache(maxsize=1)
def _transformed() -> frozenset[str]:
    return frozenset(upgrade_tables()["transformed"])


def is_transformed(name: str) -> bool:
    """``tf_upgrade_v2`` rewrites calls of this function case by case (e.g. ``tf.nn.dropout``'s
    keep_prob -> rate): its TF2 behaviour differs from TF1's."""
    return name in _transformed()


def module_deprecation(name: str) -> tuple[str, str] | None:
    """(module, message) for the innermost deprecated module holding ``name`` (``tf.contrib``)."""
    table = upgrade_tables()["module_deprecations"]
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        module = ".".join(parts[:end])
        if module in table:
            return module, table[module].replace("<function name>", name)
    return None


# -- the TF 2.x API -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ApiEntry:
    name: str
    kind: str  # MODULE, CLASS, FUNCTION or VALUE
    # Parameter names (``*args``/``**kw`` marked, ``:kwonly``, ``/posonly``); None if unknown.
    params: tuple[str, ...] | None = None
    members: dict[str, int] | None = None  # classes: public member -> signature index (-1 attr)

    def member_params(self, member: str) -> tuple[str, ...] | None:
        if not self.members or self.members.get(member, -1) < 0:
            return None
        return _signature(self.members[member])

    def accepts_keyword(self, keyword: str) -> bool | None:
        """Whether a call can pass ``keyword=``; None when the parameters are unknown."""
        return accepts_keyword(self.params, keyword)


def accepts_keyword(params: tuple[str, ...] | None, keyword: str) -> bool | None:
    if params is None:
        return None
    if any(p.startswith("**") for p in params):
        return True
    return any(p.lstrip(":") == keyword for p in params if not p.startswith(("*", "/")))


def positional_names(params: tuple[str, ...] | None) -> list[str] | None:
    """Names of the parameters that can be passed positionally, in order (None if unknown or if
    ``*args`` makes the tail open-ended)."""
    if params is None:
        return None
    out: list[str] = []
    for p in params:
        if p.startswith("*"):
            return None if not p.startswith("**") else out
        if p.startswith(":"):
            break
        out.append(p.lstrip("/"))
    return out


def _signature(index: int) -> tuple[str, ...] | None:
    return None if index < 0 else tuple(api_data()["signatures"][index])


@lru_cache(maxsize=1)
def _legacy_keras() -> frozenset[str]:
    return frozenset(api_data()["legacy_keras"])


def lookup(name: str) -> ApiEntry | None:
    """The API entry for ``name`` in TF 2.x (``tf.distribute.MirroredStrategy``), including class
    members (``tf.distribute.MirroredStrategy.run``); None if it does not exist (or is unknown)."""
    return _lookup(name)


@lru_cache(maxsize=4096)
def _lookup(name: str) -> ApiEntry | None:
    data = api_data()
    raw = data["names"].get(name)
    if raw is not None:
        kind = _KINDS[raw[0]]
        if kind == CLASS:
            init, members = data["classes"][raw[1]]
            return ApiEntry(name, kind, _signature(init), members)
        if kind == FUNCTION:
            return ApiEntry(name, kind, _signature(raw[1]))
        return ApiEntry(name, kind)
    owner, _, member = name.rpartition(".")
    parent = _lookup(owner) if owner else None
    if parent is not None and parent.kind == CLASS and parent.members and member in parent.members:
        index = parent.members[member]
        return ApiEntry(name, FUNCTION if index >= 0 else VALUE, _signature(index))
    return None


def exists(name: str) -> bool | None:
    """Whether ``name`` exists in TF 2.x. None when the data cannot tell: not under ``tf.`` or
    ``keras.``, an attribute of a function or value, or a ``tf.compat.v1`` name that needs
    tf_keras (see :func:`needs_legacy_keras`)."""
    if name.split(".")[0] not in _ROOTS:
        return None
    if lookup(name) is not None:
        return True
    if needs_legacy_keras(name):
        return None
    parts = name.split(".")
    # Find the deepest known prefix: only a module or a class lists all its members.
    for end in range(len(parts) - 1, 0, -1):
        parent = lookup(".".join(parts[:end]))
        if parent is not None:
            return False if parent.kind in (MODULE, CLASS) else None
    return False


def needs_legacy_keras(name: str) -> bool:
    """``tf.compat.v1`` names (``tf.compat.v1.layers.dense``) that TF 2.16+ only provides with
    the tf_keras package and ``TF_USE_LEGACY_KERAS=1``."""
    return name in _legacy_keras()


@lru_cache(maxsize=1)
def _tf_slim() -> frozenset[str]:
    return frozenset(api_data()["tf_slim"])


def tf_slim_name(name: str) -> str | None:
    """Where a ``tf.contrib.slim``/``tf.contrib.layers``/``tf.contrib.framework`` symbol lives in
    the tf_slim package, if it does (``tf.contrib.layers.conv2d`` -> ``tf_slim.conv2d``)."""
    parts = name.split(".")
    if len(parts) < 4 or parts[:2] != ["tf", "contrib"]:
        return None
    rest = ".".join(parts[3:])
    if parts[2] == "slim":
        candidates = [f"tf_slim.{rest}"]
    elif parts[2] in ("layers", "losses", "metrics"):
        candidates = [f"tf_slim.{parts[2]}.{rest}", f"tf_slim.{rest}"]
    elif parts[2] == "framework":
        candidates = [f"tf_slim.{rest}"]
    else:
        return None
    known = _tf_slim()
    for candidate in candidates:
        pieces = candidate.split(".")
        # Submodules (tf_slim.nets.resnet_v1) are listed, not their contents.
        if candidate in known or (len(pieces) > 3 and ".".join(pieces[:3]) in known):
            return candidate
    return None


def class_members(name: str) -> frozenset[str]:
    entry = lookup(name)
    return frozenset(entry.members or ()) if entry is not None else frozenset()


def find_member(member: str, under: str = "") -> list[str]:
    """Public classes (optionally under a prefix) that have ``member``: a rule's hint for a
    method that does not exist where it was called."""
    data = api_data()
    return sorted(
        name
        for name, raw in data["names"].items()
        if raw[0] == "c" and name.startswith(under) and member in data["classes"][raw[1]][1]
    )
