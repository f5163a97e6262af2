"""README's rule table is the catalog, generated; it may not drift."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import legacy_cache_dir

from tfmigrate.cli import rules_markdown

REPO = Path(__file__).resolve().parents[1]


def test_readme_rule_table_is_current():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- rules-table:[^\n]*-->\n(.*?)<!-- end rules-table -->", readme, re.S)
    assert match, "README lost its rules-table markers"
    assert match.group(1) == rules_markdown(), "regenerate: scripts/update_readme.py"


def test_readme_is_short_and_starts_with_the_set_up():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move details to docs/"
    head = "\n".join(lines[:40])
    assert re.search(r"^make demo\b", head, re.M) and re.search(r"^make test\b", head, re.M)


def test_set_up_commands_do_what_the_readme_says():
    """`make demo` runs scripts/demo.sh on the fixture the README names; `make test` the suite."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    rules = dict(re.findall(r"^([\w-]+):[^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.M))
    assert "scripts/demo.sh" in rules["demo"]
    assert "pytest" in rules["test"] and "not slow" not in rules["test"]
    assert '-m "not slow"' in rules["test-fast"]
    demo = (REPO / "scripts" / "demo.sh").read_text(encoding="utf-8")
    fixture = re.search(r"^FIXTURE=\$\{1:-([^}]+)\}", demo, re.M).group(1)
    [line] = [line for line in readme.splitlines() if line.startswith("make demo")]
    assert fixture in line and (REPO / fixture).is_dir()
    for step in ("$TFM scan", "$TFM rewrite", '--out "$OUT"', "$TFM verify"):
        assert step in demo, step


@pytest.mark.slow
def test_demo_script_runs_the_tour(tmp_path):
    """scripts/demo.sh (`make demo` after the set-up) in a scratch copy of the repository's
    layout: it scans, shows the diffs, writes the migrated copy and verifies it."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "demo.sh", tmp_path / "scripts" / "demo.sh")
    shutil.copytree(REPO / "fixtures", tmp_path / "fixtures")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "tfmigrate").symlink_to(
        Path(sys.executable).with_name("tfmigrate")
    )
    # the legacy run shared with the README tour's test (verify reads TFMIGRATE_LEGACY_CACHE)
    env = {**os.environ, "TFMIGRATE_LEGACY_CACHE": str(legacy_cache_dir())}
    done = subprocess.run(
        ["bash", "scripts/demo.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=900,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for step in ("== tfmigrate scan", "== tfmigrate rewrite", "== tfmigrate verify", "EQUIVALENT"):
        assert step in done.stdout, step
    assert (tmp_path / "out" / "cifar_average" / "tfmigrate.json").is_file()
    assert (tmp_path / "out" / "verify-report" / "loss.png").is_file()


def test_realworld_summary_row_is_where_the_readme_points():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "[docs/realworld.md](docs/realworld.md)" in readme and "summary row" in readme
    realworld = (REPO / "docs" / "realworld.md").read_text(encoding="utf-8")
    assert re.search(r"^\*\*Summary:\*\* \d+ converted of \d+", realworld, re.M)
