"""A model class run by another module under a Supervisor (fixtures/shapes/supervised_class):
the towers' gradients are taken by a method given the tower's loss and clipped there, the lists
are filled with ``+=``, the optimizer is made after the loop in training mode and its update
grouped with a moving average; run_utils.py makes the object, reads the global step, and runs
the update in a Supervisor's managed session until it should stop, adding a fetch on some steps
and tracing one step on request. Rewritten through the command line, as a user would."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import rewritten
from convert_support import function_def, tfm303_findings, two_replica_boot

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "shapes" / "supervised_class"

BOOT = two_replica_boot("--max_steps", "3")


def _class(source: str, name: str) -> ast.ClassDef:
    (found,) = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name]
    return found


@pytest.fixture(scope="module")
def converted() -> tuple[Path, dict[str, dict]]:
    out, result = rewritten(FIXTURE, "--unsafe-fixes", "--format", "json")
    return out, tfm303_findings(result.stdout)


def test_the_helper_given_the_towers_loss_differentiates_under_the_towers_tape(converted):
    out, findings = converted
    assert findings["model.py"]["applied"], findings["model.py"]["message"]
    cls = _class((out / "model.py").read_text(), "TinyLM")
    replica = function_def(cls, "replica_step")
    text = ast.unparse(replica)
    # the forward pass and the helper's call are under the tower's tape, handed to the helper
    assert "with tf.GradientTape() as tape:" in text
    assert "cur_grads = self._backward(loss, tape=tape)" in text
    # `losses += [loss]` in a replica function would make the list its local
    assert "losses.append(loss)" in text and "+=" not in text
    backward = function_def(cls, "_backward")
    assert ast.unparse(backward.args) == "self, loss, *, tape"
    body = [ast.unparse(s) for s in backward.body]
    assert body[2:5] == [
        "all_vars = tape.watched_variables()",
        "replica_loss = loss / tf.distribute.get_replica_context().num_replicas_in_sync",
        "grads = tape.gradient(replica_loss, all_vars)",
    ]
    # the clip now sees the replica's share: said on its line
    (clip,) = [
        line
        for line in (out / "model.py").read_text().splitlines()
        if "clip_by_global_norm" in line
    ]
    assert "TODO(tfmigrate): TFM316 clips the replica's share" in clip
    # the optimizer made after the loop in training mode stays there; the update is the step's
    init = function_def(cls, "__init__")
    assert "optimizer = tf.compat.v1.train.AdagradOptimizer(" in ast.unparse(init)
    assert "train_op = optimizer.apply_gradients" not in ast.unparse(init)
    # the moving average grouped with the update goes under TODOs; the step runs the update alone
    assert "tf.group" not in ast.unparse(init) and "ema" not in ast.unparse(init)
    model_lines = (out / "model.py").read_text().splitlines()
    (grouped,) = [
        i for i, line in enumerate(model_lines) if "TFM314 grouped with the update" in line
    ]
    assert (
        model_lines[grouped + 1].strip() == "# self.train_op = tf.group(*[self.train_op, ema_op])"
    )


def test_the_supervised_loop_calls_the_train_step(converted):
    out, findings = converted
    runner = findings["run_utils.py"]
    assert runner["applied"] and "`TinyLM` of `model.py`" in runner["message"]
    source = (out / "run_utils.py").read_text()
    run_train = function_def(ast.parse(source), "run_train")
    text = ast.unparse(run_train)
    # the device settings of the managed session's config, before the object's strategy
    assert [ast.unparse(s) for s in run_train.body[:3]] == [
        "tf.config.set_soft_device_placement(True)",
        "tf.config.threading.set_intra_op_parallelism_threads(2)",
        "with tf.compat.v1.variable_scope('model'):\n    model = TinyLM(hps, 'train')",
    ]
    assert "prev_global_step = int(model.global_step.numpy())" in text
    assert "fetched = model.train_step(x=x, y=y)" in text
    for gone in ("Supervisor", "managed_session", "sv.stop", "fetches", "ConfigProto"):
        assert gone not in text, gone
    lines = source.splitlines()
    # what the Supervisor did and what ended its loop: TODOs
    assert any("TFM310 a tf.train.Supervisor initialized or restored" in line for line in lines)
    (loop,) = [line for line in lines if line.strip().startswith("while True:")]
    assert "the Supervisor (its should_stop()) ended this loop" in loop
    # a fetch added on some steps, and the options tracing one step: TODOs
    (added,) = [
        i for i, line in enumerate(lines) if "adds a fetch to the step's Session.run" in line
    ]
    assert lines[added + 2].strip() == "#     fetches += [model.summary_op]"
    traced = [line for line in lines if "fetched = model.train_step(x=x, y=y)" in line]
    assert len(traced) == 2 and "given options and run_metadata" in traced[0], traced
    # the trainable variables of the graph: there are none before the first train step
    assert any("TFM317" in line and "made by its first train step" in line for line in lines)
    # the evaluation function, which the converted training does not run, keeps its session
    run_eval = ast.unparse(function_def(ast.parse(source), "run_eval"))
    assert "tf.compat.v1.Session()" in run_eval
    compile(source, "run_utils.py", "exec")
    compile((out / "model.py").read_text(), "model.py", "exec")


@pytest.mark.slow
def test_the_converted_program_trains_on_two_replicas(tmp_path, converted):
    out, _ = converted
    work = tmp_path / "converted"
    shutil.copytree(out, work)
    run = subprocess.run(
        [sys.executable, "-c", BOOT], capture_output=True, text=True, timeout=300, cwd=work,
        env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Iteration 1, words 40" in run.stdout and "replicas [2]" in run.stdout, run.stdout
