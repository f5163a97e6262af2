"""--roundtrip: the migrated program's training state, saved after step K, resumes in a fresh run of
the program as the trained run went on (bn_rmsprop's model-only checkpoint passes in the
fixture-pair test; without its batch-norm statistics it fails, below)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from verify_support import FIXTURES, pair, plant, verify

from tfmigrate.verify import compare as cmp


@pytest.mark.slow
def test_roundtrip_fails_when_batch_norm_statistics_are_not_saved(tmp_path, legacy_cache):
    migrated = plant(
        tmp_path,
        "bn_rmsprop",
        "checkpoint = tf.train.Checkpoint(model=model)",
        "checkpoint = tf.train.Checkpoint(weights=model.trainable_weights)",
    )
    outcome = verify(pair("bn_rmsprop")[0], migrated, cache=legacy_cache, roundtrip=True)
    assert outcome.comparison.verdict == cmp.DIVERGED
    assert outcome.comparison.exit_code == 1
    assert "round trip failed" in outcome.comparison.reason


# -- a hand-written program: its training state saved from outside after step K, restored into a
# fresh run of the program, the next steps compared --------------------------------------------

TOWERS = FIXTURES / "handwritten" / "get_variable_towers"
STEPS = 6  # the steps test_as_written.py runs: the same legacy run, from the cache


def _hand_written(tmp_path: Path, *changes: tuple[str, str]) -> Path:
    text = (TOWERS / "train_tf2.py").read_text()
    for old, new in changes:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    out = tmp_path / "train_tf2.py"
    out.write_text(text)
    return out


def _roundtrip(cli, tmp_path: Path, migrated: Path, cache: Path) -> tuple[int, str, dict]:
    report = tmp_path / "report"
    result = cli(
        "verify",
        TOWERS / "legacy.py",
        migrated,
        "--steps",
        str(STEPS),
        "--roundtrip",
        "--timeout",
        "300",
        "--legacy-cache",
        cache,
        "--report",
        report,
    )
    data = json.loads((report / "report.json").read_text())
    return result.returncode, result.stdout, data


def _roundtrip_row(data: dict) -> dict:
    (row,) = [row for row in data["rows"] if row["category"] == "roundtrip"]
    return row


@pytest.mark.slow
def test_hand_written_program_resumes_the_same_from_its_own_checkpoint(cli, tmp_path, legacy_cache):
    code, stdout, data = _roundtrip(cli, tmp_path, TOWERS / "train_tf2.py", legacy_cache)
    assert code == 0, stdout
    assert "EQUIVALENT" in stdout
    assert _roundtrip_row(data)["status"] == "pass"
    assert any("through the program's tf.train.Checkpoint" in n for n in data["notes"])


@pytest.mark.slow
def test_a_checkpoint_that_forgets_the_biases_fails_the_round_trip(cli, tmp_path, legacy_cache):
    # (a Keras optimizer in the checkpoint would bring the weights it trains along)
    migrated = _hand_written(
        tmp_path,
        (
            "tf.train.Checkpoint(model=model, optimizer=optimizer)",
            "tf.train.Checkpoint(weights=[model.w1, model.w2])",
        ),
    )
    code, stdout, data = _roundtrip(cli, tmp_path, migrated, legacy_cache)
    assert code == 1, stdout
    assert "round trip failed" in stdout
    assert _roundtrip_row(data)["status"] == "fail"
    # what verify compares with the legacy run is unchanged: the first K steps trained the same
    assert all(row["status"] == "pass" for row in data["rows"] if row["category"] == "weight")


@pytest.mark.slow
def test_a_model_only_checkpoint_is_judged_on_the_restored_model(cli, tmp_path, legacy_cache):
    # for inference: resuming from it would start the optimizer over, which the note says
    migrated = _hand_written(
        tmp_path,
        (
            "tf.train.Checkpoint(model=model, optimizer=optimizer)",
            "tf.train.Checkpoint(model=model)",
        ),
    )
    code, stdout, data = _roundtrip(cli, tmp_path, migrated, legacy_cache)
    assert code == 0, stdout
    assert _roundtrip_row(data)["status"] == "pass"
    assert any("holds no optimizer" in n for n in data["notes"])


@pytest.mark.slow
def test_without_a_checkpoint_the_variables_found_are_saved(cli, tmp_path, legacy_cache):
    migrated = _hand_written(
        tmp_path,
        ("    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)\n", ""),
        (
            "    manager = tf.train.CheckpointManager(checkpoint, args.model_dir, max_to_keep=2)\n"
            "    if manager.restore_or_initialize():\n"
            "      print('restored from', manager.latest_checkpoint)\n",
            "",
        ),
        ("  print('saved', manager.save())\n", ""),
    )
    code, stdout, data = _roundtrip(cli, tmp_path, migrated, legacy_cache)
    assert code == 0, stdout
    assert _roundtrip_row(data)["status"] == "pass"
    assert any(
        "every variable verify found and the optimizers' variables" in n for n in data["notes"]
    )


def test_roundtrip_with_replayed_inputs_is_refused(cli):
    result = cli(
        "verify", TOWERS / "legacy.py", TOWERS / "train_tf2.py", "--roundtrip", "--replay-inputs"
    )
    assert result.returncode == 2, result
    assert "--roundtrip is not supported with --replay-inputs yet" in result.stdout
