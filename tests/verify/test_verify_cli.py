"""`tfmigrate verify` end to end through the command line: exit codes, report folder."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from verify_support import STEPS, pair


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfmigrate", "verify", *args], capture_output=True,
                          text=True, timeout=600, env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"})


def test_verify_is_registered_and_documented():
    result = _cli("--help")
    assert result.returncode == 0, result.stderr
    for option in ("--replicas", "--steps", "--report", "--manifest", "--timeout", "--atol", "--legacy-rev"):
        assert option in result.stdout


def test_bad_arguments_exit_2(tmp_path):
    result = _cli(str(tmp_path / "missing.py"), str(tmp_path / "missing2.py"))
    assert result.returncode == 2
    assert "does not exist" in result.stdout


@pytest.mark.slow
def test_cli_pass_writes_the_report(tmp_path, legacy_cache):
    report = tmp_path / "report"
    legacy, migrated = pair("cifar_average")
    result = _cli(str(legacy), str(migrated), "--steps", str(STEPS), "--report", str(report),
                  "--legacy-cache", str(legacy_cache))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "EQUIVALENT" in result.stdout
    data = json.loads((report / "report.json").read_text())
    assert data["verdict"] == "equivalent" and data["exit_code"] == 0
    assert data["sides"]["legacy"]["steps_per_second"] and data["sides"]["migrated"]["steps_per_second"]
    assert "| `total_loss (tower 1)` |" in (report / "report.md").read_text()
    assert (report / "loss.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_cli_diverged_exits_1_naming_the_step(tmp_path, legacy_cache):
    from verify_support import plant

    legacy, _ = pair("cifar_average")
    migrated = plant(tmp_path, "cifar_average", "total_loss = cross_entropy + tf.add_n(model.losses)",
                     "total_loss = cross_entropy")
    result = _cli(str(legacy), str(migrated), "--steps", str(STEPS), "--legacy-cache", str(legacy_cache))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "DIVERGED: first divergence at step 1: total_loss (tower 1)" in result.stdout
