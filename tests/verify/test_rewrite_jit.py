"""`rewrite --jit`: the replicas' forward and backward pass compiled with XLA; the program it writes
verifies as written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from verify_support import STEPS

from tfmigrate.engine import Settings, process_source
from tfmigrate.rules import _tower_program_example as example
from tfmigrate.rules.tower_program import TowerProgramToMirroredStrategy


def test_jit_compiles_the_replicas_forward_and_backward_pass_only():
    """`rewrite --jit` (option jit = on): tower_fn under XLA, the update outside; said in the
    manifest; verify sees the jit_compile function itself. Without it, nothing of XLA."""
    rules = (TowerProgramToMirroredStrategy,)
    jit = process_source(
        example.LEGACY, "train.py", Settings(rules=rules, fix=True, options={"jit": "on"})
    )
    code = jit.new_code or ""
    assert "@tf.function(jit_compile=True)\n    def compiled_tower(x, y):" in code
    assert "grads, fetches = compiled_tower(x, y)\n" in code
    assert "grads = list(zip(grads, tf1_variables.trainable))\n" in code
    assert code.count("jit_compile=True") == 1 and 'jit_compile": True' not in code
    assert any("rewrite --jit" in note for note in jit.manifest["notes"])
    plain = process_source(example.LEGACY, "train.py", Settings(rules=rules, fix=True))
    assert "jit" not in (plain.new_code or "") and plain.new_code == example.CONVERTED
    assert not any("jit" in note for note in plain.manifest["notes"])


@pytest.mark.slow
def test_rewrite_jit_runs_and_verifies(tmp_path: Path, legacy_cache: Path):
    """rewrite --jit, then the migrated program trains on its own and verify finds it EQUIVALENT
    to the towers (a max-pool convnet: XLA has no deterministic MaxPool gradient)."""
    legacy = Path(__file__).parents[2] / "fixtures" / "towers" / "cifar_average" / "train.py"
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "200", "TF_CPP_MIN_LOG_LEVEL": "2"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                              timeout=600, env=env, cwd=tmp_path)  # fmt: skip

    done = run("-m", "tfmigrate", "rewrite", "--jit", "--out", "out", str(legacy.parent))
    assert done.returncode in (0, 1), done.stderr
    migrated = tmp_path / "out" / "train.py"
    assert "jit_compile=True" in migrated.read_text()
    manifest = json.loads((tmp_path / "out" / "tfmigrate.json").read_text())
    assert any("rewrite --jit" in n for n in manifest["files"]["train.py"]["notes"])
    trained = run(str(migrated), "--max_steps", "3")  # one CPU device: one replica
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert re.search(r"^step 0, loss = \d+\.\d{4}", trained.stdout, re.M), trained.stdout
    cache = ["--legacy-cache", str(legacy_cache)]  # the other cifar_average tests' legacy run
    verified = run("-m", "tfmigrate", "verify", str(legacy), str(migrated), "--steps", str(STEPS),
                   *cache)  # fmt: skip
    assert verified.returncode == 0, verified.stdout[-4000:] + verified.stderr[-2000:]
    assert re.search(r"^EQUIVALENT", verified.stdout, re.M)
    assert "ran without TensorFlow's op determinism" in verified.stdout
