"""convert-checkpoint on hand-written TF2 programs as they are written (no manifest): the program runs to its first training step, its own tf.train.CheckpointManager writes
the legacy values, and the program's own restore code reads them.

The legacy twin (fixtures/handwritten/get_variable_towers/legacy.py) trains LEGACY_STEPS steps on
verify's TF1 runtime and saves a TF1 checkpoint of every global variable, once for the module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import FIXTURES, rewritten, run_cli, run_harness

TOWERS = FIXTURES / "handwritten" / "get_variable_towers"
LEGACY_STEPS = 3
# the legacy variables and where train_tf2.py's tf.train.Checkpoint(model=...) keeps them
OBJECT_KEYS = {
    "hidden/weights": "model/w1",
    "hidden/biases": "model/b1",
    "logits/weights": "model/w2",
    "logits/biases": "model/b2",
}
# train_fit.py's Keras weight paths (its .weights.h5 file keeps them per layer, in order)
FIT_MAPPING = {
    f"{layer}/{tf1}": f"classifier/{layer}/{keras}"
    for layer in ("hidden", "logits")
    for tf1, keras in (("weights", "kernel"), ("biases", "bias"))
}
CHECKPOINTING = """\
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, args.model_dir, max_to_keep=2)
    if manager.restore_or_initialize():
      print('restored from', manager.latest_checkpoint)
"""
SAVING = "  print('saved', manager.save())\n"
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"}


def _save_legacy_checkpoint(script: Path, folder: Path) -> Path:
    """The TF1 checkpoint prefix of a legacy program after LEGACY_STEPS steps on 2 towers."""
    prefix = folder / "ckpt" / f"model.ckpt-{LEGACY_STEPS}"
    folder.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "tfmigrate.verify.legacy_boot", "--script", str(script),
         "--out", str(folder / "run"), "--towers", "2", "--steps", str(LEGACY_STEPS),
         "--save-checkpoint", str(prefix)],
        cwd=folder, env={**os.environ, **ENV, "TF_USE_LEGACY_KERAS": "1"},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    record = json.loads((folder / "run" / "record.json").read_text())
    assert record["status"] == "ok", (record, proc.stderr[-3000:])
    return prefix


@pytest.fixture(scope="module")
def legacy_checkpoint(tmp_path_factory) -> Path:
    return _save_legacy_checkpoint(TOWERS / "legacy.py", tmp_path_factory.mktemp("legacy"))


def _variant(tmp_path: Path, name: str, *edits: tuple[str, str]) -> Path:
    """train_tf2.py with each (old, new) edit made exactly once, in a folder of its own."""
    text = (TOWERS / "train_tf2.py").read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    script = tmp_path / name / "train_tf2.py"
    script.parent.mkdir()
    script.write_text(text)
    return script


def _convert(prefix: Path, script: Path, out: Path, *extra: str | Path):
    result = run_cli("convert-checkpoint", prefix, "--script", script, "--out", out, *extra)
    print(result.stdout)
    return result


def _convert_all(prefix: Path, cases: dict[str, tuple], out: Path) -> dict:
    """Each case (script, *options) converted into out/<case>, two conversions at a time."""
    out.mkdir()
    with ThreadPoolExecutor(2) as pool:
        futures = {
            n: pool.submit(_convert, prefix, c[0], out / n, *c[1:]) for n, c in cases.items()
        }
        return {name: future.result() for name, future in futures.items()}


COMPARE = """
import json, sys
import numpy as np
import tensorflow as tf
job = json.load(sys.stdin)
legacy = tf.train.load_checkpoint(job["legacy"])
if job.get("h5"):
    import h5py
    with h5py.File(job["h5"]) as f:
        layers = {n: [np.asarray(f["layers"][n]["vars"][str(i)]) for i in range(2)] for n in f["layers"]}
    # the file names a Sequential's Dense layers by class, in order: hidden, logits
    order = dict(zip(("hidden", "logits"), sorted(layers)))
    restored = {k: layers[order[k.split("/")[0]]][0 if k.endswith("weights") else 1] for k in job["keys"]}
else:
    saved = tf.train.load_checkpoint(tf.train.latest_checkpoint(job["restored"]))
    restored = {k: saved.get_tensor(v + "/.ATTRIBUTES/VARIABLE_VALUE") for k, v in job["keys"].items()}
print("RESULT " + json.dumps({k: float(np.max(np.abs(legacy.get_tensor(k) - v)))
                              for k, v in restored.items()}))
"""


@pytest.mark.slow
def test_hand_written_program_restores_the_legacy_values_through_its_own_manager(
    legacy_checkpoint, tmp_path
):
    """Converted as written (variables matched by name and shape), then `train_tf2.py --model_dir
    DIR --steps 0` restores it with manager.restore_or_initialize() and saves what it restored:
    every variable exactly the legacy checkpoint's value."""
    out = tmp_path / "converted"
    result = _convert(legacy_checkpoint, TOWERS / "train_tf2.py", out)
    assert result.returncode == 0, result
    assert "4 variables matched by name and shape" in result.stdout
    assert "as its CheckpointManager saves it ('ckpt-N')" in result.stdout
    assert "not converted (not mapped): global_step" in result.stdout
    assert (out / f"ckpt-{LEGACY_STEPS}.index").exists() and (out / "checkpoint").exists()
    report = json.loads((out / "conversion.json").read_text())
    assert report["mapping"] == {name: name for name in OBJECT_KEYS}

    proc = subprocess.run(
        [sys.executable, TOWERS / "train_tf2.py", "--model_dir", out, "--steps", "0"],
        cwd=tmp_path, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"restored from {out / f'ckpt-{LEGACY_STEPS}'}" in proc.stdout
    differences = run_harness(
        COMPARE, {"legacy": str(legacy_checkpoint), "restored": str(out), "keys": OBJECT_KEYS}
    )
    assert differences == {name: 0.0 for name in OBJECT_KEYS}


@pytest.mark.slow
def test_other_ways_of_writing_the_program(legacy_checkpoint, tmp_path):
    """An eager step (its first GradientTape is the stop), a mapping that names a renamed weight,
    and a Keras fit program without a tf.train.Checkpoint (its model's weights file)."""
    renamed = _variant(tmp_path, "renamed", ("name='hidden/weights'", "name='dense/kernel'"))
    mapping = tmp_path / "mapping.json"
    mapping.write_text(json.dumps({"hidden/weights": "dense/kernel"}))
    fit_mapping = tmp_path / "fit.json"
    fit_mapping.write_text(json.dumps(FIT_MAPPING))
    cases = {
        "eager": (_variant(tmp_path, "eager", ("  @tf.function\n  def train_step", "  def train_step")),),
        "mapped": (renamed, "--mapping", mapping),
        "fit": (TOWERS / "train_fit.py", "--mapping", fit_mapping),
    }  # fmt: skip
    results = _convert_all(legacy_checkpoint, cases, tmp_path / "out")
    for name, result in results.items():
        assert result.returncode == 0, (name, result)
        assert "(4 variables)" in result.stdout, name
    assert "3 variables matched by name and shape" in results["mapped"].stdout
    report = json.loads((tmp_path / "out" / "mapped" / "conversion.json").read_text())
    assert report["mapping"]["hidden/weights"] == "dense/kernel"

    fitted = tmp_path / "out" / "fit"
    fit = json.loads((fitted / "conversion.json").read_text())
    assert fit["layout"].startswith("the Keras model's weights")
    assert fit["files"] == ["model.weights.h5"] and not (fitted / "checkpoint").exists()
    differences = run_harness(COMPARE, {"legacy": str(legacy_checkpoint), "keys": list(FIT_MAPPING),
                                        "h5": str(fitted / "model.weights.h5")})  # fmt: skip
    assert differences == {name: 0.0 for name in FIT_MAPPING}


@pytest.mark.slow
def test_what_cannot_be_converted_writes_nothing(legacy_checkpoint, tmp_path):
    """Unmatched variables, listed by name and shape on both sides; a program that makes no
    tf.train.Checkpoint (and trains with no fit); a program that crashes before its first step."""
    cases = {
        "renamed": _variant(tmp_path, "renamed", ("name='hidden/weights'", "name='dense/kernel'")),
        "no-checkpoint": _variant(tmp_path, "no-checkpoint", (CHECKPOINTING, ""), (SAVING, "")),
        "crash": _variant(tmp_path, "crash", ("    model = Classifier()\n", "    model = Classifier(3)\n")),
    }  # fmt: skip
    results = _convert_all(legacy_checkpoint, {n: (s,) for n, s in cases.items()}, tmp_path / "out")
    for name, result in results.items():
        assert result.returncode == 2, (name, result)
        assert not (tmp_path / "out" / name).exists(), name
    assert [p.name for p in (tmp_path / "out").iterdir()] == []  # no partial folder left behind
    renamed = results["renamed"].stdout
    assert "variables could not be matched by name and shape (give --mapping)" in renamed
    assert "legacy only: hidden/weights [12, 16]" in renamed
    assert "migrated only: dense/kernel [12, 16]" in renamed
    assert "makes no tf.train.Checkpoint" in results["no-checkpoint"].stdout
    crash = results["crash"].stdout
    assert "TypeError" in crash and "Classifier(3)" in crash  # the user's own traceback


@pytest.mark.slow
def test_a_rewritten_program_converts_as_written_and_resumes(tmp_path):
    """TFM303's output of sum_ema_decay, a plain TF2 program whose CheckpointManager resumes from
    --train_dir (the legacy MonitoredTrainingSession did): its weights, EMA shadows and global
    step get the legacy values through the manifest, and its own restore resumes from them."""
    made, result = rewritten(FIXTURES / "towers" / "sum_ema_decay")
    assert (made / "tfmigrate.json").exists(), result
    script = made / "train.py"
    prefix = _save_legacy_checkpoint(FIXTURES / "towers" / "sum_ema_decay" / "train.py",
                                     tmp_path / "legacy")  # fmt: skip
    out = tmp_path / "out"
    converted = _convert(prefix, script, out)
    assert converted.returncode == 0, converted
    assert "(9 variables)" in converted.stdout  # 4 weights, their 4 shadows, the global step
    assert "as its CheckpointManager saves it ('ckpt-N')" in converted.stdout
    report = json.loads((out / "conversion.json").read_text())
    pairs = {a["source"]: a["target"] for a in report["converted"]}
    assert pairs["net/hidden/kernel/ExponentialMovingAverage"] == (
        "net/hidden/kernel/ExponentialMovingAverage"
    )
    assert pairs["global_step"] == "global_step"
    # Resumed at the legacy global step: with --max_steps at that step it trains no step more
    # (a fresh start trains and logs step 0).
    runs = {}
    for name, folder in (("resumed", out), ("fresh", tmp_path / "fresh")):
        proc = subprocess.run(
            [sys.executable, str(script), "--train_dir", str(folder),
             "--max_steps", str(LEGACY_STEPS)],
            cwd=tmp_path, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = proc.stdout
    assert "step 0 " not in runs["resumed"] and "step 0 " in runs["fresh"]


@pytest.mark.slow
def test_check_runs_the_program_restored_by_its_own_manager(legacy_checkpoint, tmp_path):
    """--check: the legacy program restored from its checkpoint, and train_tf2.py restored by its
    own manager.restore_or_initialize() from the converted one (put where its --model_dir points),
    compute the same first step. A variant whose restore never runs is caught (exit 1)."""
    cases = {
        "checked": (TOWERS / "train_tf2.py", "--check", TOWERS / "legacy.py"),
        "no-restore": (_variant(tmp_path, "no-restore", ("if manager.restore_or_initialize():",
                                                         "if manager.latest_checkpoint is None:")),
                       "--check", TOWERS / "legacy.py"),
    }  # fmt: skip
    results = _convert_all(legacy_checkpoint, cases, tmp_path / "out")
    checked = results["checked"]
    assert checked.returncode == 0, checked
    assert (
        "computes the same as the legacy program restored from the legacy checkpoint"
        in checked.stdout
    )
    assert "ok   restored hidden/weights" in checked.stdout
    missed = results["no-restore"]
    assert missed.returncode == 1, missed
    assert "check: DIFFERENT: restored " in missed.stdout
    assert (tmp_path / "out" / "no-restore" / "conversion.json").exists()  # the conversion stays


def test_check_of_a_program_without_a_checkpoint_manager_says_why(tmp_path):
    """Where its own restore reads from is not known: exit 2 with the reason (no TensorFlow)."""
    from tfmigrate.verify.migrated_boot import SetupProblem, place_converted

    folder = tmp_path / "converted"
    folder.mkdir()
    (folder / "conversion.json").write_text(json.dumps({"restore_folder": None}))
    with pytest.raises(SetupProblem, match="keeps no tf.train.CheckpointManager"):
        place_converted(folder, tmp_path)
    (folder / "conversion.json").write_text(json.dumps({"restore_folder": "model"}))
    (folder / "ckpt-3.index").write_text("x")
    place_converted(folder, tmp_path / "cwd")
    assert (tmp_path / "cwd" / "model" / "ckpt-3.index").read_text() == "x"
    (folder / "conversion.json").write_text(
        json.dumps({"restore_folder": str(tmp_path / "elsewhere")})
    )
    with pytest.raises(SetupProblem, match="not from the converted folder"):
        place_converted(folder, tmp_path / "cwd")
