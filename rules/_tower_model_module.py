"""The model modules of a tower program (TFM303): found from the module's side.

Not a rule module. A TF1 training script often imports its model from a module of its own
(``import model``, ``from nets import small_net``). That module has no tower loop; it is converted
when, and only when, a tower (or Horovod) program next to it that imports it is convertible, so
that the two stay consistent (a program left as it was keeps its model module as it was too).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from functools import lru_cache
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
    plain = re.compile(rf"^\s*(?:import\s+{stem}\b|from\s+{stem}\s+import\b)", re.M)
    patterns = [
        (path.parent, plain),
        (
            path.parent.parent,
            re.compile(
                rf"^\s*(?:from\s+{package}\s+import\s+(?:\(\s*)?(?:\w+\s*,\s*)*{stem}\b"
                rf"|import\s+{package}\.{stem}\b|from\s+{package}\.{stem}\s+import\b)",
                re.M,
            ),
        ),
    ]
    # A script one folder up importing the module by its own name runs with the module's
    # folder on its path (`PYTHONPATH=src ./train.py`), when no such module sits next to it.
    above = path.parent.parent
    if not (above / path.name).exists() and not (above / path.stem).is_dir():
        patterns.append((above, plain))
    return patterns


def _importers(module: Path, word: str = "device") -> Iterator[tuple[Path, str]]:
    """(path, text) of each neighbour that may import ``module``: it spells ``word`` (a
    tf.device call's last word) and an import of the module (the text test; only a
    convertible one counts)."""
    if module.stem == "__init__" or not module.is_file():
        return
    itself = module.resolve()
    for folder, pattern in _import_patterns(module):
        for candidate in sorted(folder.glob("*.py")):
            if candidate.resolve() == itself:
                continue
            text = _text(candidate)
            if text is None or word not in text or not pattern.search(text):
                continue
            yield candidate, text


def _text(path: Path) -> str | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return _read(str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=4096)
def _read(path: str, _mtime_ns: int, _size: int) -> str | None:
    """Each neighbour is read once per process while it is unchanged: every model-like module of
    a folder looks at all the others."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def may_have_importing_program(path: PurePosixPath, triggers: tuple[str, ...]) -> bool:
    """From the neighbours' light pass, before any libcst tree: False only when no neighbour
    can be a tower program importing the module at ``path`` (none spells the import, or none
    can fire TFM303 at all), so that the module need not be parsed for TFM303."""
    from tfmigrate import prefilter

    for _candidate, text in _importers(Path(path)):
        facts = prefilter.code_facts(text)
        if facts is None or any(facts.matches(t) for t in triggers):
            return True
    return False


def may_have_importing_helper(path: PurePosixPath) -> bool:
    """Whether a neighbour importing the module at ``path`` may take a tower's gradients (a
    converted program's helper module, whose model and update code the program runs)."""
    return any(True for _ in _importers(Path(path), "gradients"))


def importing_program(path: PurePosixPath, rule: type) -> str | None:
    """The convertible tower (or Horovod) program that imports the module at ``path`` (its
    path relative to the module's folder), if there is one."""
    from tfmigrate.rules.horovod_training import HorovodTraining

    module = Path(path)
    for candidate, text in _importers(module):
        rules = (rule, HorovodTraining) if "horovod" in text else (rule,)
        if any(_convertible(text, str(candidate), os.getcwd(), r) for r in rules):
            if candidate.parent == module.parent:
                return candidate.name
            return f"../{candidate.name}"
    return None


@lru_cache(maxsize=256)
def _convertible(text: str, name: str, _cwd: str, rule: type) -> bool:
    """Whether TFM303 finds the tower program ``text`` convertible; once per text, as every
    model module of the program asks (its name and the working folder can matter)."""
    from tfmigrate.engine import Settings, process_source

    try:
        result = process_source(text, name, Settings(rules=(rule,), fix=False))
    except Exception:  # noqa: BLE001 - an unreadable neighbour only means "no importer"
        return False
    # the whole-program reader's "convertible", or the staged converter's conversion
    return any(
        f.message.startswith(("convertible:", "converted to MirroredStrategy"))
        or (f.code == "TFM401" and "converted to a MultiWorkerMirroredStrategy program" in f.message)
        for f in result.findings
    )
