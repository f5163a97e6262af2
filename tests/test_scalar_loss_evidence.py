"""Evidence for TFM207: a whole-batch (scalar) loss given to `fit` under MirroredStrategy on 2
logical CPU devices takes larger steps than one device on the same global batch; the fixes the
rule names behave as its docs say, and the code its unsafe fix writes (`global_batch_loss`)
trains exactly what one device trains. The numbers quoted in the rule docs come from this file.

TensorFlow runs in one subprocess (the logical devices must exist before TF starts); the losses
it trains with are the sources below, and the rule is run on the same sources.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tfmigrate.engine import Settings, process_source
from tfmigrate.rules.scalar_loss_under_strategy import ScalarLossUnderStrategy

# Dice over the whole batch (the Keras 2-era segmentation loss) and one dice per sample.
LOSSES = textwrap.dedent(
    """
    import keras
    import tensorflow as tf

    def dice_loss(y_true, y_pred, smooth=1.0):
        intersection = keras.ops.sum(y_true * y_pred)
        return 1.0 - (2.0 * intersection + smooth) / (
            keras.ops.sum(y_true) + keras.ops.sum(y_pred) + smooth)

    def per_sample_dice_loss(y_true, y_pred, smooth=1.0):
        intersection = keras.ops.sum(y_true * y_pred, axis=-1)
        return 1.0 - (2.0 * intersection + smooth) / (
            keras.ops.sum(y_true, axis=-1) + keras.ops.sum(y_pred, axis=-1) + smooth)

    def train(strategy, loss, divide=False):
        with strategy.scope():
            model = build()
            if divide:
                model.compile(optimizer=keras.optimizers.SGD(0.5),
                              loss=lambda t, p: loss(t, p) / strategy.num_replicas_in_sync)
            else:
                model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
        return model
    """
).lstrip()

HARNESS = textwrap.dedent(
    r"""
    import json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    import numpy as np

    sources = json.loads(sys.stdin.read())
    scope, fixed = {}, {}
    exec(sources["losses"], scope)
    exec(sources["fixed"], fixed)  # the same file after TFM207's fix: loss=global_batch_loss(...)
    rng = np.random.RandomState(0)
    x = rng.rand(8, 6).astype("float32")
    y = (rng.rand(8, 4) > 0.5).astype("float32")
    init = [rng.randn(6, 4).astype("float32") * 0.5, np.zeros(4, "float32")]

    def run(strategy, loss, divide=False, program=scope, weights=None):
        def build():
            inputs = keras.Input((6,))
            model = keras.Model(inputs, keras.layers.Dense(4, activation="sigmoid")(inputs))
            model.set_weights(init)
            return model
        program.update(build=build, LOSS=loss)
        model = program["train"](strategy, loss, divide)
        history = model.fit(x, y, sample_weight=weights, batch_size=8, epochs=1, shuffle=False,
                            verbose=0)
        kernel = model.get_weights()[0]
        return kernel, float(np.abs(kernel - init[0]).sum()), history.history["loss"][0]

    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    one = tf.distribute.get_strategy()
    dice, per_sample = scope["dice_loss"], scope["per_sample_dice_loss"]
    k1, step1, loss1 = run(one, dice)
    k2, step2, loss2 = run(mirrored, dice)
    _, step3, loss3 = run(mirrored, dice, divide=True)
    p1, _, ploss1 = run(one, per_sample)
    p2, _, ploss2 = run(mirrored, per_sample)
    g2, _, gloss2 = run(mirrored, None, program=fixed)  # global_batch_loss(dice_loss)
    # the emitted helper on a per-sample loss, with per-sample weights
    weights = rng.rand(8).astype("float32")
    w1, _, _ = run(one, per_sample, weights=weights)
    w2, _, _ = run(mirrored, fixed["global_batch_loss"](per_sample), weights=weights)
    print("TFM-EVIDENCE " + json.dumps({
        "replicas": mirrored.num_replicas_in_sync,
        "step_ratio": step2 / step1, "loss_ratio": loss2 / loss1,
        "divided_step_ratio": step3 / step1, "divided_loss": loss3, "one_device_loss": loss1,
        "per_sample_max_diff": float(np.abs(p1 - p2).max()),
        "per_sample_losses": [ploss1, ploss2],
        "global_batch_max_diff": float(np.abs(k1 - g2).max()),
        "global_batch_losses": [loss1, gloss2],
        "global_batch_per_sample_weighted_max_diff": float(np.abs(w1 - w2).max()),
    }))
    """
)


def _scan(source: str) -> list[str]:
    result = process_source(source, "train.py", Settings(rules=(ScalarLossUnderStrategy,)))
    return [f.message for f in result.findings]


def _fixed(source: str) -> str:
    settings = Settings(rules=(ScalarLossUnderStrategy,), fix=True, unsafe_fixes=True)
    fixed = process_source(source, "train.py", settings).new_code
    assert fixed is not None and "loss=global_batch_loss(dice_loss)" in fixed
    return fixed


def test_rule_flags_the_scalar_loss_and_not_the_per_sample_one():
    # The harness compiles with whichever loss it passes as LOSS; scan what a user would write.
    assert _scan(LOSSES) == []
    whole_batch = _scan(LOSSES.replace("loss=LOSS", "loss=dice_loss"))
    assert len(whole_batch) == 1
    assert whole_batch[0].startswith("`dice_loss` reduces the whole batch to one number")
    assert "strategy.num_replicas_in_sync" in whole_batch[0]
    assert _scan(LOSSES.replace("loss=LOSS", "loss=per_sample_dice_loss")) == []


# A repo whose losses live in modules of their own: beside the script and in a package.
REPO_FILES = {
    "losses.py": """
import tensorflow as tf


def soft_dice(y_true, y_pred, smooth=1.0):
    inter = tf.reduce_sum(y_true * y_pred)
    return 1.0 - (2.0 * inter + smooth) / (tf.reduce_sum(y_true) + tf.reduce_sum(y_pred) + smooth)


def per_image_dice(y_true, y_pred):
    inter = tf.reduce_sum(y_true * y_pred, axis=[1, 2, 3])
    return 1.0 - 2.0 * inter / (tf.reduce_sum(y_true + y_pred, axis=[1, 2, 3]) + 1.0)
""",
    "nets/__init__.py": "",
    "nets/objectives.py": """
import keras
from keras import ops


class IoULoss(keras.losses.Loss):
    def call(self, y_true, y_pred):
        inter = ops.sum(y_true * y_pred)
        return 1.0 - inter / (ops.sum(y_true + y_pred) - inter + 1e-6)
""",
    "train.py": """
import tensorflow as tf

import losses
from losses import per_image_dice, soft_dice
from nets.objectives import IoULoss
from unknown_module import mystery_loss

strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = build()
    model.compile(optimizer='adam', loss=soft_dice)
    other = build()
    other.compile(optimizer='adam', loss=[per_image_dice, losses.soft_dice, IoULoss(), mystery_loss])
""",
}


def test_losses_defined_in_other_modules_of_the_repo_are_read(tree, cli):
    repo = tree(REPO_FILES)
    scan = cli("scan", "--select", "TFM207", ".", cwd=repo)
    assert scan.returncode == 1, scan
    flagged = sorted(
        line.split(": TFM207 ")[1].split(" reduces")[0]
        for line in scan.stdout.splitlines()
        if ": TFM207 " in line
    )
    # the per-image dice returns one loss per sample; a module not in the repo is not guessed at
    assert flagged == ["`IoULoss()`", "`losses.soft_dice`", "`soft_dice`"]
    out = repo.parent / "out"
    cli("rewrite", "--select", "TFM207", "--unsafe-fixes", "--out", str(out), ".", cwd=repo)
    fixed = (out / "train.py").read_text(encoding="utf-8")
    assert "loss=global_batch_loss(soft_dice)" in fixed
    assert (
        "loss=[per_image_dice, global_batch_loss(losses.soft_dice), "
        "global_batch_loss(IoULoss()), mystery_loss]" in fixed
    )
    # the loss modules are read, never changed
    assert (out / "losses.py").read_bytes() == (repo / "losses.py").read_bytes()


@pytest.mark.slow
def test_scalar_loss_steps_grow_with_the_replicas_and_the_fixes_undo_it():
    fixed = _fixed(LOSSES.replace("loss=LOSS", "loss=dice_loss"))
    done = subprocess.run(
        [sys.executable, "-c", HARNESS], input=json.dumps({"losses": LOSSES, "fixed": fixed}),
        capture_output=True, text=True,
        timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("TFM-EVIDENCE "))
    evidence = json.loads(line[len("TFM-EVIDENCE ") :])
    print(evidence)
    assert evidence["replicas"] == 2
    # The pitfall: larger steps, a loss logged as the replicas' sum.
    assert evidence["step_ratio"] > 1.5
    assert evidence["loss_ratio"] > 1.4
    # Dividing by the replicas brings the step back near one device's, not exactly.
    assert 0.8 < evidence["divided_step_ratio"] < 1.1
    # A per-sample loss is averaged over the global batch: what one device computes.
    assert evidence["per_sample_max_diff"] < 1e-6
    assert evidence["per_sample_losses"][0] == pytest.approx(evidence["per_sample_losses"][1])
    # The unsafe fix: the whole-batch loss on the gathered global batch is one device's step.
    assert evidence["global_batch_max_diff"] < 1e-6
    assert evidence["global_batch_losses"][1] == pytest.approx(evidence["global_batch_losses"][0])
    assert evidence["global_batch_per_sample_weighted_max_diff"] < 1e-6
