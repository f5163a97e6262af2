"""The Keras 2 fixture (multi_gpu_model UNet) rewrites to a Keras 3 MirroredStrategy program that
runs and trains on 2 logical CPU devices, and computes what multi_gpu_model computed: its dice
loss (a scalar over the whole batch) is computed on the gathered global batch by the emitted
`global_batch_loss`.

multi_gpu_model split each batch over the GPUs, ran the template on each slice and concatenated
the outputs; the loss was computed once on the concatenated batch. The reference here rebuilds
exactly that on one device (Keras 3 layers: slice, template, concatenate) from the same initial
weights and batches, and compares it with the migrated program trained under MirroredStrategy
on 2 replicas (DESIGN.md tolerances: per-step losses atol 1e-5, weights rtol 1e-4/atol 1e-6).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import run_cli

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "fixtures" / "keras2_multi_gpu"
TINY = ["--epochs", "1", "--samples", "16", "--image-size", "16", "--batch-size", "4"]

# Two logical CPU devices before TensorFlow initializes, then the script as `python script`.
RUNNER = textwrap.dedent(
    """
    import os, runpy, sys
    import tensorflow as tf
    cpu = tf.config.list_physical_devices('CPU')[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    script = os.path.abspath(sys.argv[1])
    sys.path.insert(0, os.path.dirname(script))
    sys.argv = sys.argv[1:]
    if os.environ.get('TFM_COMPARE'):
        import compare
        compare.install()
    scope = runpy.run_path(script, run_name='__main__')
    if os.environ.get('TFM_COMPARE'):
        compare.report(scope)
    """
)

# Records the migrated program's fit (initial weights, batches, per-step losses), then trains the
# multi_gpu_model computation and a plain single-device model from the same start.
COMPARE = textwrap.dedent(
    """
    import json, os
    import numpy as np
    import keras

    RECORD = {}
    ORIGINAL = {}
    LOSS = os.environ.get('TFM_LOSS')  # None: the program's own loss

    class StepLosses(keras.callbacks.Callback):
        # Keras 3 logs the running mean of the epoch; recover each step's loss.
        def on_train_begin(self, logs=None):
            self.means = []
        def on_train_batch_end(self, batch, logs=None):
            self.means.append(float(logs['loss']))
        def steps(self):
            before = [0.0] + self.means[:-1]
            return [(k + 1) * m - k * p for k, (m, p) in enumerate(zip(self.means, before))]

    def install():
        keras.utils.set_random_seed(0)  # the same initial weights in every run: numbers in docs
        ORIGINAL.update(fit=keras.Model.fit, compile=keras.Model.compile)
        def recording_compile(self, *args, **kwargs):
            if LOSS:
                kwargs['loss'] = LOSS
            if os.environ.get('TFM_SGD'):  # gradient size shows through plain SGD, not Adam
                kwargs['optimizer'] = keras.optimizers.SGD(learning_rate=0.1)
            RECORD['compile'] = kwargs
            return ORIGINAL['compile'](self, *args, **kwargs)
        def recording_fit(self, x, y, **kwargs):
            RECORD.update(init=self.get_weights(), x=x, y=y, batch_size=kwargs['batch_size'],
                          replicas=self.distribute_strategy.num_replicas_in_sync)
            steps = StepLosses()
            kwargs.update(shuffle=False, epochs=1)  # both runs must see the same batches
            kwargs['callbacks'] = [*kwargs.get('callbacks', []), steps]
            history = ORIGINAL['fit'](self, x, y, **kwargs)
            RECORD['steps'] = steps.steps()
            return history
        keras.Model.compile, keras.Model.fit = recording_compile, recording_fit

    def multi_gpu_model_on_one_device(template):
        # Keras 2's multi_gpu_model: slice the batch, run the template per slice, concatenate.
        parts = RECORD['replicas']
        inputs = keras.Input(RECORD['x'].shape[1:])
        def piece(i):
            def cut(t):
                size = keras.ops.shape(t)[0]
                step = size // parts
                return t[i * step:(i + 1) * step] if i < parts - 1 else t[i * step:]
            return keras.layers.Lambda(cut)(inputs)
        outputs = [template(piece(i)) for i in range(parts)]
        return keras.Model(inputs, keras.layers.Concatenate(axis=0)(outputs))

    def train(scope, wrap):
        template = scope['build_unet'](input_shape=RECORD['x'].shape[1:])
        template.set_weights(RECORD['init'])
        model = wrap(template)
        kwargs = dict(RECORD['compile'])
        optimizer = kwargs['optimizer']
        kwargs['optimizer'] = type(optimizer).from_config(optimizer.get_config())
        ORIGINAL['compile'](model, **kwargs)
        steps = StepLosses()
        ORIGINAL['fit'](model, RECORD['x'], RECORD['y'], batch_size=RECORD['batch_size'],
                        epochs=1, shuffle=False, verbose=0, callbacks=[steps])
        return template, steps.steps()

    def values(model, trainable):
        weights = model.trainable_weights if trainable else model.non_trainable_weights
        return [np.asarray(w) for w in weights]

    def report(scope):
        migrated = scope['template']
        start = keras.models.clone_model(migrated)
        start.set_weights(RECORD['init'])
        legacy, legacy_steps = train(scope, multi_gpu_model_on_one_device)
        plain, plain_steps = train(scope, lambda t: t)
        def diff(a, b, trainable=True):
            return max(float(np.max(np.abs(u - v)))
                       for u, v in zip(values(a, trainable), values(b, trainable)))
        def close(a, b):  # DESIGN.md: final weights rtol 1e-4, atol 1e-6
            return all(np.allclose(u, v, rtol=1e-4, atol=1e-6)
                       for u, v in zip(values(a, True), values(b, True)))
        print('TFM-RESULT ' + json.dumps({
            'replicas': RECORD['replicas'],
            'steps': RECORD['steps'],
            'legacy_steps': legacy_steps,
            'plain_steps': plain_steps,
            'trainable_vs_legacy': diff(migrated, legacy),
            'trainable_close_to_legacy': close(migrated, legacy),
            'trainable_vs_plain': diff(migrated, plain),
            'legacy_trained_by': diff(legacy, start),
            'moving_stats_vs_legacy': diff(migrated, legacy, trainable=False),
            'trained_by': diff(migrated, start),
        }))
    """
)


@pytest.fixture(scope="module")
def migrated(tmp_path_factory) -> Path:
    """The fixture rewritten with safe and unsafe fixes."""
    out = tmp_path_factory.mktemp("keras2") / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "tfmigrate", "rewrite", "--unsafe-fixes", "--out", str(out),
         str(FIXTURE)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    (out / "runner.py").write_text(RUNNER, encoding="utf-8")
    (out / "compare.py").write_text(COMPARE, encoding="utf-8")
    return out


def test_rewrite_leaves_no_keras2_code(migrated, cli):
    train = (migrated / "train.py").read_text(encoding="utf-8")
    assert "multi_gpu_model(" not in train and "import multi_gpu_model" not in train
    assert "set_session" not in train
    assert "strategy = tf.distribute.MirroredStrategy()" in train
    assert (
        "    template.compile(optimizer=Adam(learning_rate=1e-3), "
        "loss=global_batch_loss(dice_loss)" in train
    )
    assert "\ndef global_batch_loss(loss):\n" in train
    assert "template.fit(x, y, batch_size=args.batch_size * args.gpus" in train  # global batch
    assert "ModelCheckpoint('unet.weights.h5'" in train
    assert "template.load_weights('unet.weights.h5')" in train
    assert "loss, dice = template.evaluate(" in train
    assert "keras.ops.sum(" in (migrated / "model.py").read_text(encoding="utf-8")
    scan = cli("scan", str(migrated))
    assert scan.returncode == 0, scan
    manifest = json.loads((migrated / "tfmigrate.json").read_text(encoding="utf-8"))
    entry = manifest["files"]["train.py"]
    notes = entry["keras_multi_gpu_model"]["notes"]
    assert any("computed on the global batch by `global_batch_loss`" in note for note in notes)
    # the script keeps its shape (verify runs it as written): no entry point of verify's
    assert "tfmigrate_program" not in train and '__name__ == "__main__"' not in train
    assert "\nstrategy = tf.distribute.MirroredStrategy()" in train
    compile(train, "train.py", "exec")
    assert entry["variables"] == {"*": "*"} and entry["fetches"] == {"loss": "loss"}
    announced = {tuple(a["match"]) for a in entry["announced"]}
    assert ("*/moving_mean", "*/moving_variance") in announced
    assert ("*",) not in announced  # the dice loss is computed as multi_gpu_model computed it


def _rewritten(fixture: str, out: Path) -> tuple[str, dict[str, object]]:
    """A Keras 2 fixture rewritten with safe and unsafe fixes: its train.py and manifest entry."""
    proc = subprocess.run(
        [sys.executable, "-m", "tfmigrate", "rewrite", "--unsafe-fixes", "--out", str(out),
         str(REPO / "fixtures" / fixture)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr  # 1: reported-only findings remain
    manifest = json.loads((out / "tfmigrate.json").read_text(encoding="utf-8"))
    train = (out / "train.py").read_text(encoding="utf-8")
    compile(train, "train.py", "exec")
    return train, manifest["files"]["train.py"]


def test_classifier_script_keras2_arguments_go_and_differences_are_announced(tmp_path):
    """Keras 2.2 spellings Keras 3 rejects at construction or at the first step are fixed; what
    no Keras 3 setting reproduces (RMSprop's epsilon, dropout's random numbers) is announced to
    verify; the session's memory fraction is left to a person as a TODO, its other settings
    become tf.config calls."""
    train, entry = _rewritten("keras2_classifier", tmp_path / "out")
    assert "optimizer=RMSprop(learning_rate=0.001, rho=0.9)," in train  # epsilon=None, decay=0.0
    assert "ModelCheckpoint('weights.{epoch:02d}.weights.h5', save_weights_only=True)," in train
    assert "base_model.fit(generator," in train and "fit_generator" not in train
    assert "multi_gpu_model" not in train
    # a blank line moved into the strategy scope carries no indentation
    assert "    base_model.summary()\n\n    base_model.compile(" in train
    assert "set_session" not in train and "tf.Session" not in train
    assert "# TODO(tfmigrate): TFM108 the session set per_process_gpu_memory_fraction=0.9" in train
    assert "tf.config.set_soft_device_placement(True)" in train
    manual = {(f["code"], f["line"]) for f in entry["manual"]}
    assert {("TFM105", 22), ("TFM112", 69)} <= manual
    assert ("TFM108", 24) in {(f["code"], f["line"]) for f in entry["applied"]}
    reasons = [a["reason"] for a in entry["announced"] if a["match"] == ["*"]]
    assert any("sqrt(ms) + epsilon" in r for r in reasons)
    assert any("random layers" in r for r in reasons)


def test_functional_script_keeps_its_learning_rate_decay(tmp_path):
    """`tf.keras.utils.multi_gpu_model` behind `if gpus > 1` inside main(); Keras 2's `decay=`
    becomes the InverseTimeDecay schedule instead of being ignored by Keras 3."""
    train, entry = _rewritten("keras2_functional", tmp_path / "out")
    assert (
        "model.compile(optimizer=keras.optimizers.SGD(learning_rate=keras.optimizers.schedules."
        "InverseTimeDecay(args.lr, decay_steps=1, decay_rate=1e-4), momentum=0.9)," in train
    )
    assert "if args.gpus > 1" not in train and "train_model" not in train
    assert "model.save_weights('regressor.weights.h5')" in train
    applied = [f["message"] for f in entry["applied"] if f["code"] == "TFM112"]
    assert any("InverseTimeDecay" in m for m in applied)
    assert [a["match"] for a in entry["announced"]] == [["*/moving_mean", "*/moving_variance"]]


def _start(migrated: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "runner.py", "train.py", *args],
        cwd=migrated, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **env},
    )  # fmt: skip


def _finish(proc: subprocess.Popen[str]) -> tuple[str, dict[str, object] | None]:
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-4000:]
    lines = [line for line in output.splitlines() if line.startswith("TFM-RESULT ")]
    return output, json.loads(lines[-1][len("TFM-RESULT ") :]) if lines else None


@pytest.mark.slow
def test_migrated_program_trains_on_two_devices(migrated):
    work = migrated.parent / "plain_run"
    shutil.copytree(migrated, work)
    output, _ = _finish(_start(work, *TINY[:1], "2", *TINY[2:]))
    assert "Epoch 2/2" in output
    assert (work / "unet.weights.h5").exists() and (work / "unet_final.weights.h5").exists()
    assert "peak GPU memory 0.0 MB" in output  # the TFM109 CPU fallback
    assert "reloaded checkpoint: loss" in output  # the checkpoint loads into the one model


@pytest.mark.slow
def test_migrated_program_computes_what_multi_gpu_model_did(migrated):
    """With a loss that is a mean over samples the conversion is exact; with the fixture's own
    dice loss (a scalar over the batch) too, through `global_batch_loss`. The dice loss as it
    was (per replica) takes twice the step: test_scalar_loss_evidence.py."""
    # Each run in its own copy: both write the same checkpoint file, and HDF5 locks it.
    runs = {}
    for name in ("per_sample", "dice"):
        runs[name] = migrated.parent / f"compare_{name}"
        shutil.copytree(migrated, runs[name], dirs_exist_ok=True)
    per_sample = _start(runs["per_sample"], *TINY, TFM_COMPARE="1", TFM_SGD="1",
                        TFM_LOSS="binary_crossentropy")  # fmt: skip
    dice = _start(runs["dice"], *TINY, TFM_COMPARE="1", TFM_SGD="1")
    _, same = _finish(per_sample)
    _, dice_run = _finish(dice)
    assert same is not None and dice_run is not None
    print("per-sample loss:", same, "\ndice loss:", dice_run)
    for result in (same, dice_run):
        assert result["replicas"] == 2 and len(result["steps"]) == 2
        for got, want in zip(result["steps"], result["legacy_steps"], strict=True):
            assert abs(got - want) <= 1e-5
        assert result["trainable_close_to_legacy"]
        # The reference is not trivially one device: batch norm on the global batch differs.
        assert result["trainable_vs_plain"] > 1e-3


VERIFY_ARGS = ["--", "--epochs", "2", "--samples", "16", "--image-size", "16", "--batch-size", "4",
               "--no-shuffle"]  # fmt: skip


def _verify(legacy: Path, migrated: Path, report: Path, *options: str) -> tuple[int, dict[str, object]]:
    proc = subprocess.run(
        [sys.executable, "-m", "tfmigrate", "verify", str(legacy), str(migrated), "--steps", "2",
         "--report", str(report), *options, *VERIFY_ARGS],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads((report / "report.json").read_text(encoding="utf-8"))


def _rows(report: dict[str, object]) -> dict[str, dict[str, object]]:
    return {row["quantity"]: row for row in report["rows"]}  # type: ignore[index,union-attr]


@pytest.mark.slow
def test_verify_finds_the_rewritten_dice_program_equivalent(tmp_path):
    """The fixture as it is (UNet, dice loss over the whole batch, multi_gpu_model, Adam 1e-3):
    `rewrite` (safe fixes only) computes the dice loss on the global batch; verify finds the loss
    equal and every weight the same training; only the announced batch-norm moving statistics
    differ.

    Several kernels end 4e-6 to 3e-5 apart within 2 steps (depending on the CPU's kernels), over
    the elementwise atol 1e-6: Adam's first update is lr * g / (|g| + 1e-7 / sqrt(1 - 0.999)) =
    lr * g / (|g| + 3.16e-6), whose slope near 0, lr / 3.16e-6 = 316, turns the float
    differences of near-zero gradient entries into 1e-5 on near-zero weights. Each step's update
    of every weight is still within 0.05% of the legacy step's (L2), which the default criterion
    accepts (docs/verify.md, "Verdict criterion")."""
    legacy = tmp_path / "legacy"
    shutil.copytree(FIXTURE, legacy)
    script = legacy / "train.py"
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "tfmigrate", "rewrite", "--out", str(out),
                           str(legacy)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    train = (out / "train.py").read_text("utf-8")
    assert "tfmigrate_program" not in train
    assert "loss=global_batch_loss(dice_loss)" in train
    code, report = _verify(script, out / "train.py", tmp_path / "report")
    assert code == 0 and report["verdict"] == "equivalent", report["reason"]
    rows = _rows(report)
    assert rows["loss (reduced)"]["status"] == "pass"
    assert rows["loss (reduced)"]["steps_compared"] == 2
    weights = [r for r in rows.values() if r["category"] == "weight"]
    assert len(weights) == 42 and all(r["status"] == "pass" for r in weights)
    assert all(r["update_error"] is not None for r in weights)  # judged step by step
    stats = [r for r in rows.values() if r["category"] == "bn_stat"]
    assert len(stats) == 20 and all(r["status"] in ("pass", "expected") for r in stats)
    assert any(r["status"] == "expected" for r in stats)


def test_tabular_script_names_only_what_it_uses_and_saves_a_model_keras_3_can_load(tmp_path):
    """A Keras 2 script that imports `Dropout` without using it has no random layer: nothing is
    announced but the batch-norm statistics (verify then expects equal losses). Its whole model,
    saved as `.h5` and loaded back, becomes `.keras` at both calls (TFM206, unsafe), which Keras 3
    loads with its compile settings."""
    train, entry = _rewritten("keras2_tabular", tmp_path / "out")
    assert [a["match"] for a in entry["announced"]] == [["*/moving_mean", "*/moving_variance"]]
    assert "base.save('final_model.keras')" in train
    assert "load_model('final_model.keras', custom_objects={'rmse': rmse})" in train
    assert "ModelCheckpoint('weights.{epoch:02d}.weights.h5', save_weights_only=True)" in train
    assert "with tf.device('/cpu:0')" not in train and "multi_gpu_model(" not in train


@pytest.mark.slow
def test_image_data_generator_becomes_preprocessing_layers_over_tf_data(tmp_path):
    """Keras 3 has no ImageDataGenerator: its shifts and flips become preprocessing layers
    mapped over a tf.data pipeline of the arrays flow() batched (TFM117), its import and its
    no-op fit(x) go, and the converted program trains."""
    out = tmp_path / "out"
    result = run_cli("rewrite", "--unsafe-fixes", "--out", out, REPO / "fixtures" / "keras2_augment")
    assert result.returncode == 1, result
    train = (out / "train.py").read_text()
    assert "ImageDataGenerator" not in train.split('"""', 2)[2] and "datagen.fit(" not in train
    assert (
        "datagen = keras.Sequential([\n"
        "    keras.layers.RandomTranslation(0.1, 0.1, fill_mode='nearest'),\n"
        "    keras.layers.RandomFlip('horizontal'),\n])\n"
    ) in train
    assert (
        "    tf.data.Dataset.from_tensor_slices((x_train, y_train))\n"
        "    .shuffle(len(x_train)).batch(batch_size).repeat()\n"
        "    .map(lambda images, labels: (datagen(images, training=True), labels))\n"
    ) in train
    assert "history = model.fit(augmented_batches," in train
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, str(out / "train.py"), "--epochs", "2", "--samples", "64"],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"^accuracy \['[\d.]+', '[\d.]+'\]$", done.stdout, re.M), done.stdout
