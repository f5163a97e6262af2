"""TFM303's Keras conversion of one model function, from module source (no TensorFlow import).

Shared by test_keras_model_emit.py / test_keras_weights_emit.py and the numerics subprocesses
they start (keras_model_numerics.py, keras_weights_numerics.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import libcst as cst

from tfmigrate.names import NameResolver
from tfmigrate.rule import RuleContext
from tfmigrate.rules import _keras_model_emit as emit
from tfmigrate.rules.tower_program import TowerProgramToMirroredStrategy


def read_model_module(
    source: str, function: str
) -> tuple[cst.FunctionDef, cst.Module, TowerProgramToMirroredStrategy]:
    """`function` of `source` read as TFM303 reads a model module: the node, the module and
    the rule (its `qualify` resolves the module's names)."""
    module = cst.parse_module(source)
    context = RuleContext(
        PurePosixPath("model.py"), NameResolver.for_module(module), module, {"_tfm303_inner": True}
    )
    rule = TowerProgramToMirroredStrategy(context)
    cst.visit_batched(module, [rule])
    node = next(
        s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == function
    )
    return node, module, rule


def convert(source: str, function: str) -> emit.KerasModel:
    """The Keras model TFM303 writes for `function` of `source` (read as a model module)."""
    node, module, rule = read_model_module(source, function)
    return emit.convert(node, rule.qualify, module)


def run_numerics(script: str, cases: list[dict[str, Any]], **env: str) -> dict[str, Any]:
    """Run a numerics subprocess beside this file on `cases` (JSON on stdin, its last stdout
    line is the JSON answer)."""
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parent / script)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1", **env},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
