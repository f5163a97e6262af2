"""The pre-commit hooks of .pre-commit-hooks.yaml, run as a user runs them: `pre-commit try-repo`.

try-repo installs the hook's environment from the project's git repo: from its last commit, plus
uncommitted changes to files git already tracks (an untracked file is left out). The test clones
the committed project into a scratch folder and commits the working tree's hook file on top, so
the hooks under test are the ones in this tree, and the package is what was committed. The
hook's environment is built by pip from the package index (libcst, typer, rich, pathspec).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
yaml = pytest.importorskip("yaml")  # PyYAML comes with pre-commit
PRE_COMMIT = Path(sys.executable).with_name("pre-commit")
GIT_IDENTITY = ["-c", "user.name=tfmigrate tests", "-c", "user.email=tests@tfmigrate.invalid"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("git") is None, reason="needs git"),
    pytest.mark.skipif(not PRE_COMMIT.exists(), reason="needs pre-commit (the dev extra)"),
]


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *GIT_IDENTITY, *args], cwd=cwd, check=True, capture_output=True)


def _commit_all(folder: Path, message: str) -> None:
    _git(folder, "add", "-A")
    _git(folder, "commit", "-q", "--no-verify", "-m", message)


@pytest.fixture(scope="module")
def hooks_repo(tmp_path_factory):
    """The project at its last commit, with this tree's .pre-commit-hooks.yaml committed on top,
    and a pre-commit home of its own (the hook environment is built once for the module)."""
    base = tmp_path_factory.mktemp("precommit")
    tool = base / "tfmigrate"
    subprocess.run(
        ["git", "clone", "-q", "--no-hardlinks", str(REPO), str(tool)],
        check=True,
        capture_output=True,
    )
    shutil.copy(REPO / ".pre-commit-hooks.yaml", tool / ".pre-commit-hooks.yaml")
    if subprocess.run(
        ["git", "status", "--porcelain"], cwd=tool, capture_output=True, text=True
    ).stdout:
        _commit_all(tool, "hooks as in the working tree")
    return tool, base / "home"


def _user_repo(folder: Path, files: dict[str, Path]) -> Path:
    folder.mkdir()
    for name, source in files.items():
        shutil.copy(source, folder / name)
    _git(folder, "init", "-q")
    _commit_all(folder, "user code")
    return folder


def _try_repo(hooks_repo, user: Path, hook: str) -> subprocess.CompletedProcess[str]:
    tool, home = hooks_repo
    env = {**os.environ, "PRE_COMMIT_HOME": str(home), "NO_COLOR": "1"}
    return subprocess.run(
        [str(PRE_COMMIT), "try-repo", str(tool), hook, "--all-files", "--color", "never"],
        cwd=user,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


LEGACY = FIXTURES / "towers" / "cifar_average" / "train.py"
MIGRATED = FIXTURES / "migrated" / "cifar_average" / "train.py"


def test_scan_hook_fails_on_findings_and_passes_on_clean_code(hooks_repo, tmp_path):
    legacy = _user_repo(tmp_path / "legacy", {"train.py": LEGACY, "notes.txt": REPO / "Makefile"})
    result = _try_repo(hooks_repo, legacy, "tfmigrate-scan")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "tfmigrate scan" in result.stdout and "Failed" in result.stdout
    assert "train.py:66:1: TFM102" in result.stdout  # the finding, as scan prints it
    assert "notes.txt" not in result.stdout  # types: [python]

    clean = _user_repo(tmp_path / "clean", {"train.py": MIGRATED})
    result = _try_repo(hooks_repo, clean, "tfmigrate-scan")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Passed" in result.stdout


def _documented_config(tool: Path) -> str:
    """docs/pre-commit.md's .pre-commit-config.yaml, pointed at the scratch clone."""
    text = (REPO / "docs" / "pre-commit.md").read_text(encoding="utf-8")
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "repos:" in b]
    config = yaml.safe_load(block)
    [entry] = config["repos"]
    assert [h["id"] for h in entry["hooks"]] == ["tfmigrate-scan", "tfmigrate-rewrite-check"]
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tool, check=True, capture_output=True, text=True
    )
    entry.update(repo=str(tool), rev=head.stdout.strip())
    return yaml.safe_dump(config)


def test_documented_config_runs_both_hooks(hooks_repo, tmp_path):
    """`pre-commit run --all-files` with the documented config: both hooks fail on a legacy
    script (rewrite --check writes nothing) and pass on its migration."""
    tool, home = hooks_repo
    env = {**os.environ, "PRE_COMMIT_HOME": str(home), "NO_COLOR": "1"}
    runs = {}
    for name, source in (("legacy", LEGACY), ("clean", MIGRATED)):
        user = tmp_path / name
        user.mkdir()
        shutil.copy(source, user / "train.py")
        (user / ".pre-commit-config.yaml").write_text(_documented_config(tool))
        _git(user, "init", "-q")
        _commit_all(user, "user code")
        runs[name] = subprocess.run(
            [str(PRE_COMMIT), "run", "--all-files", "--color", "never"],
            cwd=user, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert (user / "train.py").read_bytes() == source.read_bytes()
    legacy, clean = runs["legacy"], runs["clean"]
    assert legacy.returncode == 1, legacy.stdout + legacy.stderr
    assert re.search(r"tfmigrate scan\.+Failed", legacy.stdout)
    assert re.search(r"tfmigrate rewrite --check\.+Failed", legacy.stdout)
    assert "TFM303" in legacy.stdout
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert len(re.findall(r"\.+Passed", clean.stdout)) == 2
