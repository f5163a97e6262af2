"""Recognise tower scopes in TF1 names: ``tower_1/loss`` is tower 1's ``loss`` (no TensorFlow)."""

from __future__ import annotations

import re

# Scope spellings found in real tower code (DESIGN.md): tower_%d, '%s_%d' % (TOWER_NAME, i), model_%d,
# gpu_%d, replica_%d, clone_%d.
_KNOWN = re.compile(r"^(?:tower|gpu|model|replica|clone|device|dev|worker|split)[_-]?(\d+)$", re.I)
_ANY = re.compile(r"^[A-Za-z][A-Za-z0-9]*?[_-]?(\d+)$")


def split_tower(name: str, tower_hint: int | None = None) -> tuple[str, int | None]:
    """(base name, tower) for a tensor/variable name.

    With ``tower_hint`` (from the op's device) the first scope component ending in that index is the
    tower scope, whatever it is called; without it only well-known tower scope spellings count.
    """
    parts = name.split("/")
    for i, part in enumerate(parts[:-1]):
        if tower_hint is not None:
            m = _ANY.match(part)
            if m and int(m.group(1)) == tower_hint:
                return "/".join(parts[:i] + parts[i + 1 :]), tower_hint
        else:
            m = _KNOWN.match(part)
            if m:
                return "/".join(parts[:i] + parts[i + 1 :]), int(m.group(1))
    return name, tower_hint


def strip_output_index(tensor_name: str) -> str:
    """'tower_0/loss:0' -> 'tower_0/loss'; other outputs keep their index ('split:1')."""
    return tensor_name[:-2] if tensor_name.endswith(":0") else tensor_name
