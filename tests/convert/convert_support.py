"""Pieces the converter's end-to-end tests share: the TFM303 findings of a rewrite, a function
of converted source, and a script running a converted program on two logical CPU devices."""

from __future__ import annotations

import ast
import json
from pathlib import Path


def tfm303_findings(stdout: str) -> dict[str, dict]:
    """The TFM303 findings of a `rewrite --format json`, by file name."""
    found = [f for f in json.loads(stdout)["findings"] if f["code"] == "TFM303"]
    return {Path(f["path"]).name: f for f in found}


def function_def(tree: ast.AST, name: str) -> ast.FunctionDef:
    """The one function of that name in ``tree``."""
    (found,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    return found


def two_replica_boot(*argv: str) -> str:
    """Python source running ``train.py`` (with ``argv``) as its user would, on two logical CPU
    devices; it prints how many replicas each strategy the program made trained on."""
    return f"""
import runpy, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
made = []
class Counted(tf.distribute.MirroredStrategy):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        made.append(self.num_replicas_in_sync)
tf.distribute.MirroredStrategy = Counted
sys.path.insert(0, ".")
sys.argv = {["train.py", *argv]!r}
runpy.run_path("train.py", run_name="__main__")
print("replicas", made)
"""
