from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"


class CliResult:
    def __init__(self, proc: subprocess.CompletedProcess[bytes]) -> None:
        self.returncode = proc.returncode
        self.stdout_bytes = proc.stdout
        self.stdout = proc.stdout.decode("utf-8", "replace")
        self.stderr = proc.stderr.decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"<exit {self.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}>"


def run_cli(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> CliResult:
    """Run the real command line, as a user would (a fresh process, output piped)."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "tfmigrate", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        env=full_env,
        timeout=600,
    )
    return CliResult(proc)


def write_tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(textwrap.dedent(content).lstrip("\n"), encoding="utf-8")
    return root


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def tree(tmp_path):
    def make(files: dict[str, str | bytes], name: str = "repo") -> Path:
        return write_tree(tmp_path / name, files)

    return make


def run_harness(harness: str, payload: object, env: dict[str, str] | None = None) -> dict:
    """Run a measuring script in a fresh Python (TensorFlow's devices are fixed per process).

    `payload` goes to its stdin as JSON; its last stdout line starting with "RESULT " carries the
    measured numbers as JSON. Printed too, so `pytest -s` shows what the rule docs quote."""
    proc = subprocess.run(
        [sys.executable, "-c", harness],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})},
        timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    data = json.loads(lines[-1][len("RESULT ") :])
    print(json.dumps(data, indent=1))
    return data
