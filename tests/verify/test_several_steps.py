"""Several training steps per call (the protocol's optional ``one_step``): verify records each
step as it does when it drives ``train_step`` one batch at a time, and verify's loop
(WatchedSteps) trains exactly what one step per call trains."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from verify_support import STEPS

from tfmigrate.engine import Settings, process_source
from tfmigrate.rules import _tower_program_example as example
from tfmigrate.rules.tower_program import TowerProgramToMirroredStrategy
from tfmigrate.verify.migrated_boot import MigratedRunner

CALL_SECONDS = 0.04  # one call of train_steps, whatever its step count


class ToyProgram:
    """verify's loop (WatchedSteps' calls) over 7 batches: step s fetches loss s (replica 0) and s + 0.5 (replica 1), a
    learning rate not per replica, and the watched variable is s after step s."""

    def __init__(self, batches: int = 7) -> None:
        self.left = batches
        self.taken = 0
        self.calls: list[int] = []

    def train_steps(self, iterator, count):  # noqa: ANN001
        time.sleep(CALL_SECONDS)
        self.calls.append(count)
        steps = []
        for _ in range(min(count, self.left)):
            self.left -= 1
            self.taken += 1
            s = float(self.taken)
            rows = np.full((4, 3), s, dtype=np.float32)
            steps.append({
                "outputs": {"loss": [np.float32(s), np.float32(s + 0.5)], "lr": [np.float32(0.1)]},
                "per_replica": ["loss"],
                "watched": [np.full((2,), s, dtype=np.float32)],
                "inputs": [[rows[:2], rows[2:]]],
            })  # fmt: skip
        return steps


def _runner(tmp_path: Path, program: ToyProgram) -> MigratedRunner:
    fake_tf = SimpleNamespace(distribute=SimpleNamespace(DistributedValues=tuple))
    strategy = SimpleNamespace(num_replicas_in_sync=2)
    protocol = {
        "variables": {"w": SimpleNamespace(shape=(2,))},
        "train_step": None,
        "batches": [],
        "one_step": object(),  # offered: verify runs several steps per call
    }
    runner = MigratedRunner(fake_tf, strategy, protocol, tmp_path)
    watched: list[list[object]] = []

    def watched_steps(watch):  # noqa: ANN001, ANN202
        watched.append(watch)
        return program.train_steps

    runner.watched_steps = watched_steps  # type: ignore[method-assign]
    program.watched = watched  # type: ignore[attr-defined]
    return runner


def test_each_step_of_a_call_is_recorded_like_a_step_driven_alone(tmp_path: Path):
    program = ToyProgram()
    runner = _runner(tmp_path, program)
    runner.run(6, ["w"])
    assert program.watched == [[runner.variables["w"]]]  # the traced variables, once
    # a first call of two steps (the loop's first step and its body: traced, compiled), then
    # the rest in one call
    assert program.calls == [2, 4]
    steps = runner.record.steps
    assert [s.step for s in steps] == [1, 2, 3, 4, 5, 6]
    assert [f.name for f in steps[2].fetches] == ["loss[0]", "loss[1]", "lr"]
    assert [f.value for f in steps[2].fetches] == [3.0, 3.5, pytest.approx(0.1)]
    assert [f.tower for f in steps[2].fetches] == [0, 1, None]
    assert steps[2].samples == 4 and steps[2].inputs != steps[1].inputs
    # a step's time is its call's over the steps the call ran
    assert steps[0].seconds == steps[1].seconds >= CALL_SECONDS / 2
    assert CALL_SECONDS / 4 <= steps[3].seconds < CALL_SECONDS / 2
    assert [v[0] for v in runner.trace["w"]] == [1, 2, 3, 4, 5, 6]
    assert not runner.record.notes


def test_batches_ending_inside_a_call_end_the_run_with_a_note(tmp_path: Path):
    program = ToyProgram(batches=4)
    runner = _runner(tmp_path, program)
    runner.run(10, ["w"])
    assert [s.step for s in runner.record.steps] == [1, 2, 3, 4]
    assert runner.record.notes == ["the migrated program's batches ended after 4 steps"]


# verify's loop against one step per call, on 2 logical CPU devices, in a
# fresh process.
SCRIPT = r"""
import json, sys
from pathlib import Path

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
from tfmigrate.verify.watched_steps import WatchedSteps

rng = np.random.RandomState(0)
x = rng.rand(7 * 8, 3).astype(np.float32)
y = x.dot([[1.0], [-2.0], [0.5]]).astype(np.float32)


def program():
    with strategy.scope():  # each replica's update is summed into the mirrored variable
        w = tf.Variable(tf.zeros([3, 1]), aggregation=tf.VariableAggregation.SUM)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)  # 7 batches

    def step_fn(xb, yb):
        error = tf.matmul(xb, w) - yb
        loss = tf.reduce_mean(error**2)
        gradient = tf.matmul(xb, error, transpose_a=True) * (2.0 / 4)  # d loss / d w
        w.assign_sub(0.1 * gradient / 2)  # the replicas' mean
        return {"loss": loss}

    def one_step(batch):
        out = strategy.run(step_fn, args=batch)
        out["sum"] = strategy.reduce("SUM", out["loss"], axis=None)
        return out

    return w, iter(strategy.experimental_distribute_dataset(dataset)), one_step


w, it, one_step = program()
train_step = tf.function(one_step)
alone = []
for _ in range(7):
    out = train_step(next(it))
    alone.append({"loss": [float(v) for v in strategy.experimental_local_results(out["loss"])],
                  "sum": float(out["sum"]), "w": w.numpy().ravel().tolist()})
def watched():
    w, it, one_step = program()
    train_steps = WatchedSteps(strategy, one_step, [w])
    calls = [train_steps(it, 5) for _ in range(3)]
    return calls, [{"loss": [float(v) for v in s["outputs"]["loss"]],
                    "sum": float(s["outputs"]["sum"][0]), "w": s["watched"][0].ravel().tolist(),
                    "per_replica": s["per_replica"],
                    "rows": [[p.shape[0] for p in parts] for parts in s["inputs"]],
                    "x0": float(s["inputs"][0][0][0, 0]),
                    "x1": float(s["inputs"][0][1][0, 0])} for call in calls for s in call]


calls, several = watched()
json.dump({"alone": alone, "calls": [len(c) for c in calls], "several": several}, sys.stdout)
"""


@pytest.mark.slow
def test_watched_steps_train_what_one_step_per_call_trains(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    # 7 batches: 5 steps, the 2 left (the batches end inside the call), then none
    assert result["calls"] == [5, 2, 0]
    alone, several = result["alone"], result["several"]
    assert len(several) == 7
    for one, many in zip(alone, several, strict=True):
        assert many["loss"] == pytest.approx(one["loss"], abs=1e-6)
        assert many["sum"] == pytest.approx(one["sum"], abs=1e-6)
        assert many["w"] == pytest.approx(one["w"], abs=1e-6)  # read after the step's update
        assert many["per_replica"] == ["loss"]
        assert many["rows"] == [[4, 4], [4, 4]]  # x and y, half a batch per replica
    x = np.random.RandomState(0).rand(56, 3).astype(np.float32)
    assert [s["x0"] for s in several] == pytest.approx([float(v) for v in x[::8, 0]])
    assert [s["x1"] for s in several] == pytest.approx([float(v) for v in x[4::8, 0]])


def test_jit_compiles_the_replicas_forward_and_backward_pass_only():
    """`rewrite --jit` (option jit = on): tower_fn under XLA, the update outside; said in the
    manifest; verify sees the jit_compile function itself. Without it, nothing of XLA."""
    rules = (TowerProgramToMirroredStrategy,)
    jit = process_source(
        example.LEGACY, "train.py", Settings(rules=rules, fix=True, options={"jit": "on"})
    )
    code = jit.new_code or ""
    assert "@tf.function(jit_compile=True)\n    def compiled_tower(x, y):" in code
    assert "grads, fetches = compiled_tower(x, y)\n" in code
    assert "grads = list(zip(grads, tf1_variables.trainable))\n" in code
    assert code.count("jit_compile=True") == 1 and "jit_compile\": True" not in code
    assert any("rewrite --jit" in note for note in jit.manifest["notes"])
    plain = process_source(example.LEGACY, "train.py", Settings(rules=rules, fix=True))
    assert "jit" not in (plain.new_code or "") and plain.new_code == example.CONVERTED
    assert not any("jit" in note for note in plain.manifest["notes"])


@pytest.mark.slow
def test_rewrite_jit_runs_and_verifies(tmp_path: Path, legacy_cache: Path):
    """rewrite --jit, then the migrated program trains on its own and verify finds it EQUIVALENT
    to the towers (a max-pool convnet: XLA has no deterministic MaxPool gradient)."""
    legacy = Path(__file__).parents[2] / "fixtures" / "towers" / "cifar_average" / "train.py"
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "200", "TF_CPP_MIN_LOG_LEVEL": "2"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                              timeout=600, env=env, cwd=tmp_path)  # fmt: skip

    done = run("-m", "tfmigrate", "rewrite", "--jit", "--out", "out", str(legacy.parent))
    assert done.returncode in (0, 1), done.stderr
    migrated = tmp_path / "out" / "train.py"
    assert "jit_compile=True" in migrated.read_text()
    manifest = json.loads((tmp_path / "out" / "tfmigrate.json").read_text())
    assert any("rewrite --jit" in n for n in manifest["files"]["train.py"]["notes"])
    trained = run(str(migrated), "--max_steps", "3")  # one CPU device: one replica
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert re.search(r"^step 0, loss = \d+\.\d{4}", trained.stdout, re.M), trained.stdout
    cache = ["--legacy-cache", str(legacy_cache)]  # the other cifar_average tests' legacy run
    verified = run("-m", "tfmigrate", "verify", str(legacy), str(migrated), "--steps", str(STEPS),
                   *cache)  # fmt: skip
    assert verified.returncode == 0, verified.stdout[-4000:] + verified.stderr[-2000:]
    assert re.search(r"^EQUIVALENT", verified.stdout, re.M)
    assert "ran without TensorFlow's op determinism" in verified.stdout
