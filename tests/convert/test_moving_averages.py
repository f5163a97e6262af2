"""An ExponentialMovingAverage of the trainable variables that the train op groups with the
update (``tf.group(apply_op, ema.apply(tf.trainable_variables()))``): the converted replica
function applies it after each update, its shadow variables in the checkpoint as the Saver had
them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import run_cli

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "towers" / "averaged_weights"

RUN = """
import os, runpy, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
logs = sys.argv[2]
sys.argv = ["train.py", "--max_steps", "3", "--train_dir", logs]
runpy.run_path({script!r}, run_name="__main__")
index = [os.path.join(d, f) for d, _, fs in os.walk(logs) for f in fs if f.endswith(".index")]
names = [n for n, _ in tf.train.list_variables(index[0][: -len(".index")])]
print("AVERAGES", sum("ExponentialMovingAverage" in n for n in names))
print("FILES", sorted(os.path.basename(i) for i in index))
"""


def test_the_averages_grouped_with_the_update_are_applied_in_the_replicas(tmp_path):
    out = tmp_path / "out"
    run_cli("rewrite", "--unsafe-fixes", "--out", out, FIXTURE)
    source = (out / "train.py").read_text()
    compile(source, "train.py", "exec")
    assert "TODO(tfmigrate)" not in source
    assert "averages_op" not in source and "tf.group" not in source
    step = source[source.index("def replica_step") : source.index("strategy.run(replica_step)")]
    update = step.index("opt.apply_gradients(grads, global_step=global_step)")
    assert step.index("averages.apply(tf1_variables.trainable_variables)") > update
    assert "averages = tf.train.ExponentialMovingAverage(MOVING_AVERAGE_DECAY, global_step)" in source
    ruff = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F821", "-"],
        input=source,
        capture_output=True,
        text=True,
    )
    assert ruff.returncode == 0, ruff.stdout
    # three steps on two logical CPUs: the checkpoint holds an average of each of the three
    # trainable variables
    runner = tmp_path / "run.py"
    runner.write_text(RUN.format(script=str(out / "train.py")))
    done = subprocess.run(
        [sys.executable, str(runner), "x", str(tmp_path / "logs")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "AVERAGES 3" in done.stdout, done.stdout
    # saved as the legacy Saver named it: the step's number, not the variable's repr
    assert "FILES ['model.ckpt-3.index']" in done.stdout, done.stdout
