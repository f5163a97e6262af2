"""tfmigrate convert-checkpoint: TF1 checkpoints of the tower fixtures into their migrated programs.

The slow tests train each legacy fixture a few steps on verify's legacy runtime, save a TF1
checkpoint (every global variable, as a Saver in the script would), and convert it into the TFM303
output of that fixture (run as written: its own tf.train.Checkpoint, where the legacy program saved
or restored) and into its hand-migrated Keras version, whose ``--check`` restores both programs
from their checkpoints and compares what they compute on the same batch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import FIXTURES, rewritten, run_cli

from tfmigrate.checkpoint.plan import Spec, plan_conversion

# TFM303 converts these. sum_ema_decay resumes from its MonitoredTrainingSession folder (a
# CheckpointManager now: EMA shadows and a global step in it); cifar_average neither saves nor
# restores (its rewrite has no checkpoint either).
TOWERS = (
    "cifar_average",
    "sum_ema_decay",
)
# the fixture a program's own CheckpointManager resumes from, and the flag naming its folder
RESUMING = ("sum_ema_decay", "--train_dir")
# fixtures/migrated/: a Sequential and a fit program
HAND_MIGRATED = ("cifar_average", "keras2_fit")
LEGACY_STEPS = 3
CHECK_OK = "computes the same as the legacy program restored from the legacy checkpoint"


# -- the plan: what goes where, and every problem by name (no TensorFlow) ---------------------------

F32 = "float32"


def _spec(*shape: int, dtype: str = F32) -> Spec:
    return Spec(tuple(shape), dtype)


def test_plan_assigns_mapped_variables():
    plan = plan_conversion(
        {"fc/weights": _spec(3, 2), "fc/biases": _spec(2)},
        {"dense/kernel": _spec(3, 2), "dense/bias": _spec(2)},
        {"fc/weights": "dense/kernel", "fc/biases": "dense/bias"},
    )
    assert plan.ok and not plan.notes
    assert [(a.source, a.target, a.kind) for a in plan.assignments] == [
        ("fc/weights", "dense/kernel", "variable"),
        ("fc/biases", "dense/bias", "variable"),
    ]


def test_plan_lists_every_problem_by_name():
    plan = plan_conversion(
        checkpoint={
            "a": _spec(3, 2),
            "b": _spec(2),
            "step": _spec(dtype="int64"),
            "stray/w": _spec(1),
        },
        program={"A": _spec(2, 3), "B": _spec(2, dtype="float16"), "D": _spec(), "E": _spec(4)},
        mapping={"a": "A", "b": "B", "c": "C", "step": "D"},
    )
    assert not plan.ok
    text = "\n".join(plan.problems)
    assert "shape mismatch: 'a' is [3, 2] in the checkpoint, 'A' is [2, 3] in the program" in text
    assert "dtype mismatch: 'b' is float32 in the checkpoint, 'B' is float16 in the program" in text
    assert "dtype mismatch: 'step' is int64" in text
    assert "missing in the checkpoint: 'c' (mapped to 'C')" in text
    assert "missing in the mapping: the program's variable 'E'" in text
    assert "unknown name in the checkpoint: 'stray/w'" in text
    assert len(plan.problems) == 6


def test_plan_missing_program_variable():
    plan = plan_conversion({"a": _spec(1)}, {}, {"a": "gone"})
    assert plan.problems == [
        "missing in the program: 'gone' (mapped from 'a') is not among the "
        "variables the program has"
    ]


def test_plan_optimizer_state_converted_or_dropped_with_a_note():
    checkpoint = {"w": _spec(2), "w/Momentum": _spec(2), "global_step": _spec(dtype="int64")}
    exact = plan_conversion(
        checkpoint,
        {"w": _spec(2)},
        {"w": "w"},
        slots={"w/Momentum": ("w [slot momentum]", _spec(2))},
    )
    assert exact.ok and exact.dropped_state == ["global_step"]  # schedules restart: a note
    assert ("w/Momentum", "w [slot momentum]", "slot") in [
        (a.source, a.target, a.kind) for a in exact.assignments
    ]
    assert exact.notes == ["not converted (not mapped): global_step"]

    dropped = plan_conversion(checkpoint, {"w": _spec(2)}, {"w": "w"})
    assert dropped.ok and dropped.dropped_state == ["w/Momentum", "global_step"]
    assert any("optimizer state dropped" in n and "w/Momentum" in n for n in dropped.notes)


def test_plan_use_ema_loads_shadows_into_the_weights():
    checkpoint = {"w": _spec(2), "w/ExponentialMovingAverage": _spec(2), "b": _spec(1)}
    plan = plan_conversion(
        checkpoint, {"W": _spec(2), "B": _spec(1)}, {"w": "W", "b": "B"}, use_ema=True
    )
    assert plan.ok
    assert [(a.source, a.target, a.kind) for a in plan.assignments] == [
        ("w/ExponentialMovingAverage", "W", "ema"),
        ("b", "B", "variable"),  # no shadow: the variable itself, as variables_to_restore() does
    ]
    without = plan_conversion(checkpoint, {"W": _spec(2), "B": _spec(1)}, {"w": "W", "b": "B"})
    assert [a.source for a in without.assignments] == ["w", "b"]
    assert any("EMA shadows not converted" in n for n in without.notes)


def test_plan_use_ema_without_shadows_is_an_error():
    plan = plan_conversion({"w": _spec(2)}, {"w": _spec(2)}, {"w": "w"}, use_ema=True)
    assert plan.problems == [
        "--use-ema: the checkpoint holds no 'ExponentialMovingAverage' shadow "
        "of any mapped variable"
    ]


# -- the command line: argument errors need no TensorFlow ------------------------------------------


def test_cli_refuses_a_non_empty_out(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    script = FIXTURES / "migrated" / "bn_rmsprop" / "train.py"
    result = run_cli(
        "convert-checkpoint", tmp_path / "model.ckpt-1", "--script", script, "--out", out
    )
    assert result.returncode == 2, result
    assert "exists and is not empty" in result.stdout
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_cli_names_a_missing_checkpoint(tmp_path):
    script = FIXTURES / "migrated" / "bn_rmsprop" / "train.py"
    out = tmp_path / "out"
    result = run_cli(
        "convert-checkpoint", tmp_path / "model.ckpt-9", "--script", script, "--out", out
    )
    assert result.returncode == 2, result
    assert (
        "model.ckpt-9 not found (" in result.stdout
        and "model.ckpt-9.index does not exist" in result.stdout
    )
    result = run_cli("convert-checkpoint", tmp_path, "--script", script, "--out", out)
    assert result.returncode == 2 and "no TF checkpoint in folder" in result.stdout, result
    assert not out.exists()


# -- end to end: each tower fixture, legacy checkpoint -> both migrations ----------------------------


def _save_legacy_checkpoint(name: str, folder: Path) -> Path:
    """Train the unmodified legacy fixture LEGACY_STEPS steps; save its variables as TF1 does."""
    prefix = folder / "ckpt" / f"model.ckpt-{LEGACY_STEPS}"
    folder.mkdir(parents=True)
    env = {
        **os.environ,
        "TF_USE_LEGACY_KERAS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "CUDA_VISIBLE_DEVICES": "-1",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfmigrate.verify.legacy_boot",
            "--script",
            str(FIXTURES / "towers" / name / "train.py"),
            "--out",
            str(folder / "run"),
            "--towers",
            "2",
            "--steps",
            str(LEGACY_STEPS),
            "--save-checkpoint",
            str(prefix),
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    record = json.loads((folder / "run" / "record.json").read_text())
    assert record["status"] == "ok", (record, proc.stderr[-3000:])
    assert Path(str(prefix) + ".index").exists()
    return prefix


@pytest.fixture(scope="module")
def legacy(tmp_path_factory) -> dict[str, Path]:
    """name -> its TF1 checkpoint prefix; the TFM303 output lands next to it (see _tfm303)."""
    base = tmp_path_factory.mktemp("legacy-checkpoints")
    # bn_rmsprop's checkpoint: for the damaged and mismatched conversions
    wanted = (*HAND_MIGRATED, *TOWERS, "bn_rmsprop")
    names = [n for n in dict.fromkeys(wanted) if (FIXTURES / "towers" / n).is_dir()]
    with ThreadPoolExecutor(2) as pool:  # two legacy trainings at a time
        prefixes = dict(
            zip(names, pool.map(lambda n: _save_legacy_checkpoint(n, base / n), names), strict=True)
        )
    for name in names:
        if name in TOWERS:  # the session's rewrite of the fixture (test_tower_conversion's too)
            made, result = rewritten(FIXTURES / "towers" / name)
            assert (made / "tfmigrate.json").exists(), result
            shutil.copytree(made, base / name / "tfm303")
    return prefixes


def _tfm303(prefix: Path) -> Path:
    return prefix.parent.parent / "tfm303" / "train.py"


def _convert(prefix: Path, script: Path, out: Path, *extra: str | Path):
    result = run_cli("convert-checkpoint", prefix, "--script", script, "--out", out, *extra)
    print(result.stdout)  # the check's measured differences, for `pytest -rP`
    return result


@pytest.mark.slow
def test_tfm303_program_gets_the_legacy_checkpoint_in_its_own_layout(legacy, tmp_path):
    """Run as written, the rewritten program's own tf.train.Checkpoint (its CheckpointManager's
    names) holds the converted weights, EMA shadows and global step."""
    name, _ = RESUMING
    prefix = legacy[name]
    out = tmp_path / "converted"
    result = _convert(prefix.parent, _tfm303(prefix), out)
    assert result.returncode == 0, result
    report = json.loads((out / "conversion.json").read_text())
    assert report["layout"].startswith("the program's own tf.train.Checkpoint, as its")
    assert (out / f"ckpt-{LEGACY_STEPS}.index").exists() and (out / "checkpoint").exists()
    assert "not a tf.compat.v1.train optimizer" not in result.stdout
    assert report["optimizer_state_dropped"] == []  # gradient descent: no slots; step mapped
    kinds = {a["source"]: a["kind"] for a in report["converted"]}
    assert kinds["net/hidden/kernel/ExponentialMovingAverage"] == "variable"
    assert kinds["global_step"] == "variable" and len(kinds) == 9


@pytest.mark.slow
def test_tfm303_program_that_never_saves_gets_nothing_and_says_why(legacy, tmp_path):
    """cifar_average's legacy program neither saved nor restored: its rewrite makes no
    checkpoint, so there is nothing of the program's own to write the values through."""
    prefix = legacy["cifar_average"]
    out = tmp_path / "converted"
    result = _convert(prefix.parent, _tfm303(prefix), out)
    assert result.returncode == 2, result
    assert "the program makes no tf.train.Checkpoint" in result.stdout
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", HAND_MIGRATED)
def test_hand_migrated_keras_program_restores_the_legacy_checkpoint(legacy, name, tmp_path):
    """Keras 3 names through the fixture's own manifest; a Keras weights file next to the
    checkpoint; Keras optimizer state does not map exactly onto TF1's: dropped, with a note."""
    out = tmp_path / "converted"
    script = FIXTURES / "migrated" / name / "train.py"
    result = _convert(legacy[name], script, out, "--check", FIXTURES / "towers" / name / "train.py")
    assert result.returncode == 0, result
    assert CHECK_OK in result.stdout
    report = json.loads((out / "conversion.json").read_text())
    assert "model.weights.h5" in report["files"] and (out / "model.weights.h5").stat().st_size > 0
    mapping = json.loads((script.parent / "tfmigrate.json").read_text())["files"]["train.py"][
        "variables"
    ]
    assert {a["target"] for a in report["converted"]} == set(mapping.values())
    if name != "sum_ema_decay":  # gradient descent there: no optimizer state at all
        assert report["optimizer_state_dropped"]
        assert "optimizer state dropped" in result.stdout


@pytest.mark.slow
def test_use_ema_loads_the_averaged_weights(legacy, tmp_path):
    """--use-ema: the weights get the shadows' values (as ExponentialMovingAverage's
    variables_to_restore() restores them)."""
    prefix = legacy["sum_ema_decay"]
    out = tmp_path / "ema"
    result = _convert(prefix, _tfm303(prefix), out, "--use-ema")
    assert result.returncode == 0, result
    assert "4 of them from their EMA shadows" in result.stdout
    report = json.loads((out / "conversion.json").read_text())
    loaded = {a["target"]: a["source"] for a in report["converted"] if a["kind"] == "ema"}
    assert loaded == {
        f"net/{v}": f"net/{v}/ExponentialMovingAverage"
        for v in ("hidden/kernel", "hidden/bias", "logits/kernel", "logits/bias")
    }


@pytest.mark.slow
def test_emitted_main_starts_from_the_converted_checkpoint(legacy, tmp_path):
    """`python train.py --train_dir DIR`, as a user runs the rewritten program: its own
    CheckpointManager restores the converted checkpoint and it trains on from there."""
    name, flag = RESUMING
    prefix = legacy[name]
    out = tmp_path / "converted"
    assert _convert(prefix, _tfm303(prefix), out).returncode == 0
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"}
    env.pop("TF_USE_LEGACY_KERAS", None)

    def first_losses(*args: str | Path) -> str:
        proc = subprocess.run(
            [
                sys.executable,
                _tfm303(prefix),
                "--max_steps",
                str(LEGACY_STEPS + 2),
                *map(str, args),
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return next(line for line in proc.stdout.splitlines() if line.startswith("step 0"))

    with ThreadPoolExecutor(2) as pool:
        restored, fresh = pool.map(
            lambda args: first_losses(*args), [(flag, out), (flag, tmp_path / "fresh")]
        )
    assert restored != fresh


@pytest.mark.slow
def test_damaged_or_mismatched_checkpoints_write_nothing(legacy, tmp_path):
    bn = legacy["bn_rmsprop"]
    # a data file cut short: the variables that cannot be read are named
    damaged = tmp_path / "damaged"
    shutil.copytree(bn.parent, damaged)
    data = damaged / f"{bn.name}.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    # a mapping whose shapes do not fit (the hand-migrated programs: both keep checkpoints)
    bn_script = FIXTURES / "migrated" / "bn_rmsprop" / "train.py"
    cifar_script = FIXTURES / "migrated" / "cifar_average" / "train.py"
    entry = json.loads((bn_script.parent / "tfmigrate.json").read_text())["files"]["train.py"]
    swapped = dict(entry["variables"])
    swapped["model/fc1/weights"], swapped["model/logits/weights"] = (
        swapped["model/logits/weights"],
        swapped["model/fc1/weights"],
    )
    mapping = tmp_path / "swapped.json"
    mapping.write_text(json.dumps(swapped))
    cases = {  # out folder -> arguments; each a conversion process of its own, run side by side
        "from-damaged": (damaged / bn.name, bn_script),
        "mismatched": (bn, cifar_script),  # another model's checkpoint
        "swapped": (bn, bn_script, "--mapping", mapping),
    }
    with ThreadPoolExecutor(len(cases)) as pool:
        futures = {
            name: pool.submit(_convert, args[0], args[1], tmp_path / name, *args[2:])
            for name, args in cases.items()
        }
        results = {name: future.result() for name, future in futures.items()}
    for name, result in results.items():
        assert result.returncode == 2, result
        assert not (tmp_path / name).exists()  # nothing written, no partial folder left behind
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(f".{name}.")]
    damaged_out = results["from-damaged"].stdout
    assert "is damaged" in damaged_out and "cannot read 'model/" in damaged_out
    mismatched = results["mismatched"].stdout
    assert "missing in the checkpoint: 'conv1/weights'" in mismatched
    assert "unknown name in the checkpoint: 'model/fc1/weights'" in mismatched
    assert (
        "shape mismatch: 'model/fc1/weights' is [12, 16] in the checkpoint, "
        "'convnet/logits/kernel' is [16, 4] in the program"  # its Keras weight path
    ) in results["swapped"].stdout
