"""Each legacy mini-repo in fixtures/ yields exactly the findings its EXPECTED file lists, and
rewrites cleanly: --check sees the pending fixes, --write applies them, a second --write is a no-op."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tfmigrate.workflow import RunOptions, run

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

FIXTURE_DIRS = sorted(p.parent for p in FIXTURES.glob("*/EXPECTED"))


def _expected(root: Path) -> list[str]:
    lines = (root / "EXPECTED").read_text(encoding="utf-8").splitlines()
    return sorted(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def _actual(root: Path) -> list[str]:
    result = run(RunOptions([root], no_config=False))
    lines = []
    for file_result in result.results:
        rel = Path(result.sources[file_result.path]).relative_to(root).as_posix()
        if file_result.error:
            lines.append(f"{rel}: error")
        for f in file_result.findings:
            cell = f"cell {f.cell}:" if f.cell is not None else ""
            lines.append(f"{rel}:{cell}{f.line} {f.code}")
    return sorted(lines)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("root", FIXTURE_DIRS, ids=[p.name for p in FIXTURE_DIRS])
def test_scan_matches_expected(root):
    assert _actual(root) == _expected(root)


@pytest.mark.parametrize("root", FIXTURE_DIRS, ids=[p.name for p in FIXTURE_DIRS])
def test_rewrite_check_write_idempotent(root, tmp_path, cli):
    repo = tmp_path / root.name
    shutil.copytree(root, repo)
    has_errors = any(line.endswith(": error") for line in _expected(root))
    # --check's exit status and, in the same run, the plan it counted
    check = cli("rewrite", "--check", "--format", "json", ".", cwd=repo)
    plan = json.loads(check.stdout)
    assert plan["mode"] == "check"
    to_change = {row["path"] for row in plan["files"] if row["changed"]}
    pending = bool(to_change)
    if has_errors:
        assert check.returncode == 2, check
    else:
        assert check.returncode == (1 if pending else 0), check
    before = _snapshot(repo)
    cli("rewrite", "--write", ".", cwd=repo)
    after_first = _snapshot(repo)
    if pending:
        assert after_first != before
        assert "tfmigrate.json" in after_first
    else:
        assert after_first == before
    # A second --write has nothing left to apply (so --check, which counts exactly what --write
    # applies, passes) and leaves every byte, the manifest's included, as it was.
    again = json.loads(cli("rewrite", "--write", "--format", "json", ".", cwd=repo).stdout)
    assert again["mode"] == "write" and again["changed"] == 0, again["files"]
    assert _snapshot(repo) == after_first
    # Exactly the planned files changed; everything else is byte-identical.
    changed = {rel for rel, data in after_first.items() if before.get(rel) != data}
    assert changed - {"tfmigrate.json"} == to_change
