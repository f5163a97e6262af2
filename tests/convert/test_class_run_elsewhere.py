"""A class trainer whose object is made and run in another module
(fixtures/shapes/class_run_elsewhere): model.py's class builds the towers in ``__init__``,
train.py makes the object and runs ``model.train_op`` in its session. Both modules are
converted, each from its own side, through the command line as a user would."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import rewritten, run_cli
from convert_support import function_def, tfm303_findings, two_replica_boot

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "shapes" / "class_run_elsewhere"

# Two logical CPU devices, then train.py as `python train.py --steps 3`; the strategies the
# program makes say how many replicas they train.
BOOT = two_replica_boot("--steps", "3")


def test_the_class_and_the_function_running_its_object_are_converted_together():
    out, result = rewritten(FIXTURE, "--format", "json")
    findings = tfm303_findings(result.stdout)
    model, train = findings["model.py"], findings["train.py"]
    assert model["applied"] and "TODO" not in model["message"], model["message"]
    assert train["applied"], train["message"]
    assert "`TowerModel` of `model.py`" in train["message"]
    assert "`train` makes the object" in train["message"]
    # the class makes its train step in __init__, taking what train.py fed its placeholders
    model_source = (out / "model.py").read_text()
    (cls,) = [n for n in ast.parse(model_source).body if isinstance(n, ast.ClassDef)
              and n.name == "TowerModel"]  # fmt: skip
    init = function_def(cls, "__init__")
    step = function_def(init, "train_step")
    assert [a.arg for a in step.args.args] == ["features", "labels"]
    # it returns what the session fetched besides the update, on the object
    assert ast.unparse(step.body[-1]) == "return (loss, self.global_step)"
    assert "self.train_step = train_step" in ast.unparse(init)
    assert "placeholder" not in ast.unparse(cls)
    # the function calls it with what it fed, its device settings before the object's strategy
    train_source = (out / "train.py").read_text()
    runner = function_def(ast.parse(train_source), "train")
    assert [ast.unparse(s) for s in runner.body[:3]] == [
        "tf.config.set_soft_device_placement(True)",
        "model = TowerModel(num_gpus)",
        "data = batches(batch_size * num_gpus)",
    ]
    assert "loss_value, global_step = model.train_step(features=features, labels=labels)" in (
        ast.unparse(runner)
    )
    for banned in ("Session", "ConfigProto", "global_variables_initializer", "fetches"):
        assert banned not in train_source, banned
    compile(model_source, "model.py", "exec")
    compile(train_source, "train.py", "exec")


def test_the_runner_alone_is_not_converted_without_the_class(tmp_path):
    """The function's module follows the class: where the class's module does not convert
    (its towers' update is no longer read), the function is left as it was too."""
    folder = tmp_path / "program"
    shutil.copytree(FIXTURE, folder)
    model = folder / "model.py"
    # the towers' gradients are no longer combined: no tower core, nothing to run
    model.write_text(
        model.read_text().replace(
            "average_gradients(tower_grads), global_step", "tower_grads[0], global_step"
        )
    )
    result = run_cli("rewrite", "--unsafe-fixes", "--format", "json", folder)
    findings = tfm303_findings(result.stdout)
    assert not findings.get("train.py", {}).get("applied"), findings.get("train.py")
    assert not findings["model.py"]["applied"]


@pytest.mark.slow
def test_the_converted_program_trains_on_two_replicas(tmp_path):
    out, _ = rewritten(FIXTURE, "--format", "json")
    work = tmp_path / "converted"
    shutil.copytree(out, work)
    run = subprocess.run(
        [sys.executable, "-c", BOOT], capture_output=True, text=True, timeout=300, cwd=work,
        env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "step 1 loss" in run.stdout and "replicas [2]" in run.stdout, run.stdout
