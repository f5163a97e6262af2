"""The model modules of a tower program (TFM303): found from the module's side.

Not a rule module. A TF1 training script often imports its model from a module of its own
(``import model``, ``from nets import small_net``). That module has no tower loop; it is converted
when, and only when, a tower program next to it that imports it is convertible, so that the two
stay consistent (a program left as it was keeps its model module as it was too).
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

import libcst as cst

from tfmigrate.rules._towers import TowerRule, walk

# TF1 layer APIs TensorFlow 2 no longer has under these names (tf_keras / tf_slim carry them).
MODEL_TRIGGERS = ("tensorflow.layers", "tensorflow.contrib.slim", "tensorflow.contrib.layers")
_TF1_LAYERS = tuple(f"{t}." for t in MODEL_TRIGGERS) + MODEL_TRIGGERS


def first_tf1_layer(rule: TowerRule) -> cst.CSTNode | None:
    """The first use of a TF1 layer API in the module (where the finding goes), if any."""
    for node in walk(rule.context.module):
        if isinstance(node, cst.Attribute) and not isinstance(rule.parent(node), cst.Attribute):
            name = rule.qualify(node) or ""
            if name.startswith(_TF1_LAYERS):
                return node
    return None


def _import_patterns(path: Path) -> list[tuple[Path, re.Pattern[str]]]:
    """(folder, pattern): where an importer of ``path`` would sit, and how it imports it."""
    stem = re.escape(path.stem)
    package = re.escape(path.parent.name)
    return [
        (path.parent, re.compile(rf"^\s*(?:import\s+{stem}\b|from\s+{stem}\s+import\b)", re.M)),
        (
            path.parent.parent,
            re.compile(
                rf"^\s*(?:from\s+{package}\s+import\s+(?:\(\s*)?(?:\w+\s*,\s*)*{stem}\b"
                rf"|import\s+{package}\.{stem}\b|from\s+{package}\.{stem}\s+import\b)",
                re.M,
            ),
        ),
    ]


def importing_program(path: PurePosixPath, rule: type) -> str | None:
    """The convertible tower program that imports the module at ``path`` (its path relative
    to the module's folder), if there is one."""
    from tfmigrate.engine import Settings, process_source

    module = Path(path)
    if module.stem == "__init__" or not module.is_file():
        return None
    for folder, pattern in _import_patterns(module):
        for candidate in sorted(folder.glob("*.py")):
            if candidate.resolve() == module.resolve():
                continue
            try:
                text = candidate.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if "device" not in text or not pattern.search(text):
                continue
            try:
                result = process_source(text, candidate.name, Settings(rules=(rule,), fix=False))
            except Exception:  # noqa: BLE001 - an unreadable neighbour only means "no importer"
                continue
            if any(f.message.startswith("convertible:") for f in result.findings):
                if candidate.parent == module.parent:
                    return candidate.name
                return f"../{candidate.name}"
    return None
