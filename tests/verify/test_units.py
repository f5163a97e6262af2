"""Fast tests of verify's pure parts: fingerprints, names, manifest, comparison (no TensorFlow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tfmigrate.verify import compare as cmp
from tfmigrate.verify.fingerprint import step_fingerprint, step_samples, stream_digest
from tfmigrate.verify.manifest import (
    Announced,
    ManifestError,
    ScriptManifest,
    find_manifest,
    load_manifest,
    load_mapping_file,
    parse_fetch_target,
)
from tfmigrate.verify.record import Fetch, RunRecord, Step, load_arrays, save_arrays
from tfmigrate.verify.tower_names import split_tower, strip_output_index


def test_fingerprint_ignores_how_the_batch_was_split_and_dtype_widening():
    x = np.arange(24, dtype=np.float64).reshape(8, 3)
    y = np.arange(8, dtype=np.int32)
    whole = step_fingerprint([[x], [y]])
    towers = step_fingerprint([[y[:4].astype(np.int64), y[4:]], [x[:4].astype(np.float32), x[4:]]])
    assert whole == towers
    assert stream_digest([x[::-1]]) != stream_digest([x])  # order of samples matters


@pytest.mark.parametrize(
    ("name", "hint", "expected"),
    [
        ("tower_1/total_loss", None, ("total_loss", 1)),
        ("gpu_0/xent/value", None, ("xent/value", 0)),
        ("clone_1/clone_loss", None, ("clone_loss", 1)),
        ("mytower7/loss", 7, ("loss", 7)),
        ("total_loss", None, ("total_loss", None)),
        ("conv_1/weights", None, ("conv_1/weights", None)),
    ],
)
def test_split_tower(name, hint, expected):
    assert split_tower(name, hint) == expected


def test_strip_output_index():
    assert strip_output_index("tower_0/loss:0") == "tower_0/loss"
    assert strip_output_index("split:1") == "split:1"


def test_manifest_lookup_and_parse(tmp_path):
    (tmp_path / "pkg").mkdir()
    script = tmp_path / "pkg" / "train.py"
    script.write_text("")
    manifest = tmp_path / "tfmigrate.json"
    manifest.write_text(
        json.dumps(
            {
                "format": 1,
                "files": {
                    "pkg/train.py": {
                        "variables": {"a/w": "m/a/kernel"},
                        "fetches": {"tower_1/loss": "loss[1]"},
                        "announced": [
                            {"match": "*/moving_mean", "code": "TFM301", "reason": "replica 0"}
                        ],
                        "applied": [],
                    }
                },
            }
        )
    )
    assert find_manifest(script) == manifest
    entry = load_manifest(manifest, script)
    assert entry.variables == {"a/w": "m/a/kernel"}
    assert entry.announcement_for("bn/moving_mean").code == "TFM301"
    assert entry.announcement_for("bn/beta") is None
    other = tmp_path / "other.py"
    other.write_text("")
    with pytest.raises(ManifestError, match="no entry"):
        load_manifest(manifest, other)


def test_mapping_file_plain_or_full(tmp_path):
    plain = tmp_path / "m.json"
    plain.write_text(json.dumps({"a": "b"}))
    assert load_mapping_file(plain).variables == {"a": "b"}
    full = tmp_path / "f.json"
    full.write_text(json.dumps({"variables": {"a": "b"}, "fetches": {"x": "y[0]"}}))
    assert load_mapping_file(full).fetches == {"x": "y[0]"}
    assert parse_fetch_target("y[0]") == ("y", 0)
    assert parse_fetch_target("loss") == ("loss", None)


def test_arrays_roundtrip_with_scope_names(tmp_path):
    arrays = {"tower_0/conv1/weights:0": np.ones((2, 2)), "a/b": np.zeros(3, np.int64)}
    save_arrays(tmp_path / "x.npz", arrays)
    back = load_arrays(tmp_path / "x.npz")
    assert set(back) == set(arrays)
    np.testing.assert_array_equal(back["a/b"], arrays["a/b"])


# -- comparison on synthetic records -------------------------------------------------------------


def _side(side, losses, *, tower=1, inputs=None, every=1, weights=None):
    rec = RunRecord(side=side, devices=2)
    for i, v in enumerate(losses, start=1):
        fetches = (
            [
                Fetch(
                    name="tower_1/loss" if side == "legacy" else f"loss[{tower}]",
                    base="loss",
                    tower=tower,
                    value=v,
                )
            ]
            if (i - 1) % every == 0
            else []
        )
        rec.steps.append(
            Step(
                step=i,
                seconds=0.01,
                fetches=fetches,
                inputs=inputs[i - 1] if inputs else [f"in{i}"],
            )
        )
    rec.variables = {"w": {"kind": "weight", "shape": [2]}}
    final = {"w": np.asarray(weights if weights is not None else [1.0, 2.0], np.float32)}
    return cmp.SideData(rec, {}, final, {})


def _manifest():
    return ScriptManifest(variables={"w": "w"})


def test_equal_runs_are_equivalent():
    result = cmp.compare(
        _side("legacy", [2.0, 1.5, 1.2]),
        _side("migrated", [2.0, 1.5, 1.2 + 1e-7]),
        _manifest(),
        cmp.Tolerances(),
    )
    assert result.verdict == cmp.EQUIVALENT
    assert [r.status for r in result.rows] == [cmp.PASS, cmp.PASS]


def test_first_divergence_names_step_and_quantity():
    result = cmp.compare(
        _side("legacy", [2.0, 1.5, 1.2, 1.0]),
        _side("migrated", [2.0, 1.5, 1.3, 1.1]),
        _manifest(),
        cmp.Tolerances(),
    )
    assert result.verdict == cmp.DIVERGED
    assert result.first_divergence["step"] == 3
    assert "loss (tower 1)" in result.first_divergence["quantity"]
    assert result.exit_code == 1


def test_later_steps_use_relative_tolerance():
    tol = cmp.Tolerances(early_steps=1)
    assert tol.scalar_ok(5, 1000.0, 1000.05)  # 5e-5 relative
    assert not tol.scalar_ok(1, 1000.0, 1000.05)


def test_loss_fetched_every_few_steps_compares_common_steps_only():
    legacy = _side("legacy", [2.0, 9.0, 1.2, 9.0, 1.0], every=2)
    result = cmp.compare(
        legacy, _side("migrated", [2.0, 1.5, 1.2, 1.1, 1.0]), _manifest(), cmp.Tolerances()
    )
    assert result.verdict == cmp.EQUIVALENT
    assert result.rows[0].steps_compared == 3


def test_different_inputs_could_not_run_instead_of_diverging():
    legacy = _side("legacy", [2.0, 1.5], inputs=[["a"], ["b"]])
    migrated = _side("migrated", [2.0, 7.5], inputs=[["a"], ["c"]])
    result = cmp.compare(legacy, migrated, _manifest(), cmp.Tolerances())
    assert result.verdict == cmp.COULD_NOT_RUN
    assert "different inputs at step 2" in result.reason
    assert result.exit_code == 2


def test_batch_size_mix_up_is_named_with_the_sample_counts():
    x = np.zeros((64, 3), np.float32)
    assert step_samples([[x[:32], x[32:]], [np.arange(64)]]) == 64
    legacy = _side("legacy", [2.0], inputs=[["a"]])
    migrated = _side("migrated", [2.0], inputs=[["b"]])
    legacy.record.steps[0].samples, migrated.record.steps[0].samples = 64, 32
    result = cmp.compare(legacy, migrated, _manifest(), cmp.Tolerances())
    assert result.verdict == cmp.COULD_NOT_RUN
    assert "step 1: legacy's step had 64 samples, migrated's 32" in result.reason


def test_announced_difference_is_expected_with_its_size():
    manifest = ScriptManifest(
        variables={"w": "w"}, announced=[Announced(["w"], "TFM301", "replica 0")]
    )
    result = cmp.compare(
        _side("legacy", [1.0]),
        _side("migrated", [1.0], weights=[1.0, 2.5]),
        manifest,
        cmp.Tolerances(),
    )
    assert result.verdict == cmp.EQUIVALENT
    row = next(r for r in result.rows if r.legacy == "w")
    assert row.status == cmp.EXPECTED and row.max_abs == pytest.approx(0.5)


def test_announced_difference_in_the_logged_loss_is_not_called_equivalent():
    manifest = ScriptManifest(variables={"w": "w"},
                              announced=[Announced(["*"], "TFM107", "whole-batch loss")])  # fmt: skip
    result = cmp.compare(_side("legacy", [1.0, 0.8]), _side("migrated", [2.0, 1.6]), manifest,
                         cmp.Tolerances())  # fmt: skip
    assert result.verdict == cmp.ANNOUNCED and result.exit_code == 1
    assert "does not show" in result.reason and "loss (tower 1)" in result.reason


def test_unmatched_fetch_is_reported_not_failed():
    migrated = _side("migrated", [2.0, 1.0])
    for step in migrated.record.steps:
        for f in step.fetches:
            f.base = "something_else"
    result = cmp.compare(_side("legacy", [2.0, 1.0]), migrated, _manifest(), cmp.Tolerances())
    assert result.verdict == cmp.EQUIVALENT
    assert result.rows[0].status == cmp.UNMATCHED


def test_fetch_under_enclosing_scopes_matches_the_key_that_names_it_without_them():
    """tf.losses under a variable_scope: `tower_1/net/sparse_softmax_cross_entropy_loss/value`
    is the migrated key `sparse_softmax_cross_entropy_loss/value`, not any other `.../value`."""
    legacy, migrated = _side("legacy", [2.0, 1.0]), _side("migrated", [2.0, 1.0])
    for step in legacy.record.steps:
        step.fetches[0].base = "net/sparse_softmax_cross_entropy_loss/value"
    for step in migrated.record.steps:
        step.fetches[0].name = step.fetches[0].base = "sparse_softmax_cross_entropy_loss/value"
        step.fetches.append(Fetch(name="xent/value", base="xent/value", tower=1, value=9.0))
    result = cmp.compare(legacy, migrated, _manifest(), cmp.Tolerances())
    assert result.verdict == cmp.EQUIVALENT
    [row] = [r for r in result.rows if r.phase == cmp.FETCH_PHASE]
    assert row.status == cmp.PASS and row.migrated == "sparse_softmax_cross_entropy_loss/value"


def test_fetch_of_a_tower_without_name_scope_matches_its_ops_own_name():
    """Towers apart by device only: TF1 named tower 1's loss `Mean_1` (its re-entered variable
    scope `net_1`); the migrated key is `Mean` (`net/xent/value`) for every replica."""
    for legacy_name, key in (("Mean_1", "Mean"), ("net_1/xent/value", "xent/value")):
        legacy, migrated = _side("legacy", [2.0, 1.0]), _side("migrated", [2.0, 1.0])
        for step in legacy.record.steps:
            step.fetches[0].name = step.fetches[0].base = legacy_name
        for step in migrated.record.steps:
            step.fetches[0].base = key
            step.fetches.append(Fetch(name=f"{key}[0]", base=key, tower=0, value=9.0))
        result = cmp.compare(legacy, migrated, _manifest(), cmp.Tolerances())
        [row] = [r for r in result.rows if r.phase == cmp.FETCH_PHASE]
        assert row.status == cmp.PASS and row.migrated == "loss[1]", (legacy_name, row)


def test_cli_import_does_not_import_tensorflow():
    code = (
        "import sys, tfmigrate.cli, tfmigrate.verify.command, tfmigrate.verify.verifier, "
        "tfmigrate.verify.report; sys.exit('tensorflow' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_legacy_rev_takes_the_script_folder_from_git(tmp_path):
    """--legacy-rev: after an in-place rewrite the legacy side comes from git (read-only archive)."""
    from tfmigrate.verify.verifier import legacy_from_git

    repo = tmp_path / "repo"
    (repo / "proj").mkdir(parents=True)
    script = repo / "proj" / "train.py"
    script.write_text("print('legacy')\n")
    (repo / "proj" / "model.py").write_text("X = 1\n")
    git = [
        "git",
        "-C",
        str(repo),
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@e",
        "-c",
        "commit.gpgsign=false",
    ]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "legacy"], check=True)
    script.write_text("print('rewritten')\n")
    taken = legacy_from_git(script, "HEAD", tmp_path / "out")
    assert taken.read_text() == "print('legacy')\n"
    assert (taken.parent / "model.py").read_text() == "X = 1\n"


def _row(quantity: str, error: float, status: str = cmp.FAIL, step: int | None = 1) -> cmp.Row:
    """A variable row whose update error is ``error`` at every one of 4 steps (failing from
    ``step`` on)."""
    bad = [] if step is None else list(range(step, 5))
    return cmp.Row(
        quantity,
        "weight",
        quantity,
        quantity,
        status,
        steps_compared=4,
        max_abs=error,
        first_step=step,
        phase=cmp.VARIABLE_PHASE,
        note=f"update error {error:.3g}",
        update_error=error,
        per_step={s: error for s in range(1, 5)},
        bad_steps=bad,
    )


def _judged(rows: list[cmp.Row]) -> cmp.Comparison:
    result = cmp.Comparison(verdict=cmp.EQUIVALENT, rows=rows, steps_compared=4)
    cmp._judge(result)
    return result


def _floor(**errors: dict[int, float]) -> cmp.Comparison:
    rows = [_row(q, 0.0, cmp.PASS, None) for q in errors]
    for row, per_step in zip(rows, errors.values(), strict=True):
        row.per_step = per_step
    return cmp.Comparison(verdict=cmp.EQUIVALENT, rows=rows)


def test_noise_floor_accepts_only_differences_the_legacy_program_makes_with_itself():
    result = _judged([_row("a", 0.05, step=3), _row("b", 1e-4, cmp.PASS, None)])
    assert result.verdict == cmp.DIVERGED
    # two floor runs: the larger drift counts, and a drift seen at step 2 still counts at step 3
    floors = [
        _floor(a={1: 1e-4, 2: 0.03, 3: 0.001, 4: 0.02}),
        _floor(a={1: 1e-4, 2: 0.01, 3: 0.002, 4: 0.025}),
    ]
    cmp.apply_noise_floor(result, floors)
    assert result.verdict == cmp.EQUIVALENT and result.first_divergence is None
    assert [r.status for r in result.rows] == [cmp.NOISE, cmp.PASS]
    assert "the legacy program's own under other kernels 0.03" in result.rows[0].note
    assert any("noise floor" in n and "3×" in n and "2 run(s)" in n for n in result.notes)

    # 4x the drift is a difference of the migration; so is any change where the runs moved nothing
    result = _judged([_row("a", 0.08, step=2), _row("c", 0.5, step=2)])
    cmp.apply_noise_floor(
        result, [_floor(a={1: 0.0, 2: 0.02, 3: 0.02, 4: 0.02}, c={1: 0.0, 2: 0.0})]
    )
    assert result.verdict == cmp.DIVERGED
    assert [r.status for r in result.rows] == [cmp.FAIL, cmp.FAIL]
    assert result.first_divergence["quantity"] == "a"


def test_noise_floor_runs_on_a_divergence_unless_turned_off():
    from tfmigrate.verify.verifier import VerifyOptions, _wants_noise_floor

    def wants(rows: list[cmp.Row], **flag: bool) -> bool:
        return _wants_noise_floor(
            VerifyOptions(legacy=Path("a"), migrated=Path("b"), **flag), _judged(rows)
        )

    assert wants([_row("a", 0.5, step=1)]) and wants([_row("a", 0.5, step=3)])
    assert not wants([_row("a", 0.5, step=1)], noise_floor=False)
    assert not wants([_row("a", 0.0, cmp.PASS, None)])


def test_noise_runs_leave_the_main_runs_files_alone(tmp_path, monkeypatch):
    """The noise floor's extra legacy runs read the mapping file of the main runs (kept with
    --report) and write only into their own folders, each under its own kernel settings."""
    from tfmigrate.verify import sides

    plan = sides.RunPlan(legacy=tmp_path / "train.py", migrated=tmp_path / "new.py",
                         workdir=tmp_path / "work", mapping={"a/w": "m/w"}, script_args=("--x", "1"))  # fmt: skip
    main = sides.side_commands(plan)
    files = {p: p.read_text() for p in (plan.workdir / "mapping.json",)}
    for p in files:
        p.write_text(files[p] + " ")  # what the main runs left, to be kept byte for byte
    ran = []
    monkeypatch.setattr(
        sides,
        "_run_alone",
        lambda side, cmd, out, folder, plan, env: ran.append((side, cmd, out, env)),
    )
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    for run in sides.noise_runs():
        sides.run_noise(plan, run)
    assert all(p.read_text() == text + " " for p, text in files.items())
    [(side1, cmd1, out1, env1), (side2, cmd2, out2, env2)] = ran
    assert env1["TF_ENABLE_ONEDNN_OPTS"] == "1" and "nudged" not in side1  # flipped from the user's
    assert env2["TF_NUM_INTRAOP_THREADS"] == "1" and side2.endswith("nudged)")
    for cmd, out in ((cmd1, out1), (cmd2, out2)):
        assert out.parent.parent == plan.workdir and out.is_dir() and out != main.legacy_out
        assert cmd[cmd.index("--out") + 1] == str(out)
        assert "--trace" not in cmd and "--trace" not in main.legacy  # every variable is traced
    assert cmd1[-3:] == ["--", "--x", "1"] and "--nudge-initial" not in cmd1
    assert cmd2[-5:] == ["--nudge-initial", "1", "--", "--x", "1"]


def test_noise_runs_are_kept_in_the_legacy_cache(tmp_path, monkeypatch):
    """Like the legacy run, the noise floor's runs are deterministic: a second verify with the
    same --legacy-cache reuses them instead of running the legacy program twice more."""
    from tfmigrate.verify import sides, verifier
    from tfmigrate.verify.record import RECORD_JSON

    plan = sides.RunPlan(
        legacy=tmp_path / "train.py", migrated=tmp_path / "new.py", workdir=tmp_path / "work"
    )
    ran = []

    def fake_run(plan, spec):
        out = plan.workdir / spec.name / "out"
        out.mkdir(parents=True, exist_ok=True)
        RunRecord(side="legacy").save(out)
        ran.append(spec.name)
        return sides.SideRun(sides.noise_label(spec), out, 0, "", "", False, RunRecord.load(out))

    monkeypatch.setattr(verifier, "run_noise", fake_run)
    monkeypatch.setattr(cmp, "apply_noise_floor", lambda result, floors: None)
    monkeypatch.setattr(cmp, "compare", lambda *args: cmp.Comparison(verdict=cmp.EQUIVALENT))
    cache = tmp_path / "cache" / "key"
    cache.parent.mkdir()
    legacy = cmp.SideData(RunRecord(side="legacy"), {}, {}, {})
    for _ in range(2):
        outcome = verifier.Outcome(cmp.Comparison(verdict=cmp.DIVERGED),
                                   verifier.VerifyOptions(legacy=Path("a"), migrated=Path("b")),
                                   manifest=ScriptManifest(variables={"w": "w"}))  # fmt: skip
        verifier._noise_floor(plan, outcome, legacy, cache)
        assert [r.side for r in outcome.noise] == [sides.noise_label(s) for s in sides.noise_runs()]
    assert ran == [s.name for s in sides.noise_runs()]  # the second verify ran nothing
    assert all(
        (cache.with_name(f"key.{s.name}") / RECORD_JSON).exists() for s in sides.noise_runs()
    )
