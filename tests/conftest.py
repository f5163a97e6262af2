from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import TextIO

import pytest

REPO = Path(__file__).resolve().parents[1]
# a legacy cache of the caller's environment would let verify tests skip the legacy runs they check
os.environ.pop("TFMIGRATE_LEGACY_CACHE", None)
FIXTURES = REPO / "fixtures"


class CliResult:
    def __init__(self, proc: subprocess.CompletedProcess[bytes]) -> None:
        self.returncode = proc.returncode
        self.stdout_bytes = proc.stdout
        self.stdout = proc.stdout.decode("utf-8", "replace")
        self.stderr = proc.stderr.decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"<exit {self.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}>"


def run_cli(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> CliResult:
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


# The folder every xdist worker of this test session shares (set by _session_shared below).
_SHARED: dict[str, Path] = {}


@pytest.fixture(scope="session", autouse=True)
def _session_shared(tmp_path_factory) -> None:
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # pytest-N/popen-gwK: pytest-N is this session's, for every worker
    _SHARED["dir"] = base


def legacy_cache_dir() -> Path:
    """Legacy runs are deterministic: tests that run one legacy program with the same options
    share its run (verify --legacy-cache; an entry appears by an atomic rename, so a worker never
    reads a half-written one)."""
    return _SHARED["dir"] / "tfmigrate-verify-legacy-cache"


@pytest.fixture(scope="session")
def legacy_cache() -> Path:
    """verify's --legacy-cache folder for this test session (see legacy_cache_dir)."""
    return legacy_cache_dir()


def rewritten(folder: Path, *flags: str) -> tuple[Path, CliResult]:
    """`tfmigrate rewrite --out OUT [flags] folder` of a committed fixture folder, run once per
    test session and shared by the xdist workers: the output folder (read-only: copy it before
    changing it) and the run.

    Published by an atomic rename; a worker that finds another's rewrite in progress waits for it
    (a file lock) instead of repeating it."""
    digest = hashlib.sha1("\0".join([str(folder.resolve()), *flags]).encode()).hexdigest()[:12]
    key = f"{folder.name}-{digest}"
    root = _SHARED["dir"] / "tfmigrate-rewritten"
    root.mkdir(parents=True, exist_ok=True)
    done = root / key
    with open(root / f"{key}.lock", "w") as lock:
        _lock(lock)
        if not (done / "result.json").exists():
            work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
            result = run_cli("rewrite", "--out", work / "out", *flags, folder)
            (work / "result.json").write_text(
                json.dumps([result.returncode, result.stdout, result.stderr])
            )
            shutil.rmtree(done, ignore_errors=True)
            work.rename(done)
    code, stdout, stderr = json.loads((done / "result.json").read_text())
    proc = subprocess.CompletedProcess([], code, stdout.encode(), stderr.encode())
    return done / "out", CliResult(proc)


def _lock(file: TextIO) -> None:
    try:
        import fcntl
    except ImportError:  # no advisory locks (Windows): workers may repeat a rewrite, no harm
        return
    fcntl.flock(file, fcntl.LOCK_EX)  # released when the file closes


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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with the larger share of slow tests run first; each module's tests stay together
    and in order (module-scoped fixtures are made once).

    `pytest -n 2 --dist worksteal` hands each worker a contiguous half of this list, and an idle
    worker takes tests from the end of the other's queue: with the quick modules last, the run
    ends on quick tests instead of one worker idling while the other runs a long one."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    def slow_share(tests: list[pytest.Item]) -> float:
        return sum(test.get_closest_marker("slow") is not None for test in tests) / len(tests)

    ordered = sorted(modules.values(), key=slow_share, reverse=True)  # stable: ties keep order
    items[:] = [test for tests in ordered for test in tests]
