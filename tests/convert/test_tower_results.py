"""A function that builds the towers and returns their gradients and mean loss to the training
function, which combines and applies the gradients and runs the step
(fixtures/shapes/tower_results): converted with the builder's body read in place of its call.
Builders the caller cannot take in as they are stay refused, with the reason. A layer library
with per-device loops of its own (fixtures/shapes/layerwise_towers) is part of its program."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import rewritten, run_cli

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "fixtures" / "shapes" / "tower_results"

TWO_DEVICES = textwrap.dedent(
    """
    import runpy, sys
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)


def _converted() -> tuple[dict, Path]:
    out, result = rewritten(FIXTURE, "--format", "json")
    (finding,) = [f for f in json.loads(result.stdout)["findings"] if f["code"] == "TFM303"]
    return finding, out


def test_the_towers_returned_to_the_training_function_convert_there():
    finding, out = _converted()
    assert finding["applied"], finding["message"]
    assert "TODO" not in finding["message"], finding["message"]
    source = (out / "train.py").read_text()
    compile(source, "train.py", "exec")
    tree = ast.parse(source)
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    # the builder is gone: its towers are the replica function of the training function
    assert "get_tower_results" not in functions and "get_tower_results" not in source
    assert "average_gradients" not in source
    (train_step,) = [
        n
        for n in ast.walk(functions["train"])
        if isinstance(n, ast.FunctionDef) and n.decorator_list
    ]
    assert train_step.name == "train_step"
    replica = functions["replica_step"]
    assert "optimizer.apply_gradients(gradients, global_step=global_step)" in ast.unparse(replica)
    # the caller's `loss` came back as the builder's `mean_loss` (the towers had a `loss`)
    assert ast.unparse(train_step.body[-1]) == "return mean_loss"
    loop = [n for n in ast.walk(functions["train"]) if isinstance(n, ast.For)][-1]
    assert "loss_value = train_step()" in ast.unparse(loop)
    assert "Session" not in source and "TODO" not in source
    undefined = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F821", str(out)],
        capture_output=True,
        text=True,
    )
    assert undefined.returncode == 0, undefined.stdout


def test_the_converted_program_trains_on_two_replicas(tmp_path):
    _, out = _converted()
    harness = tmp_path / "two_devices.py"
    harness.write_text(TWO_DEVICES)
    proc = subprocess.run(
        [sys.executable, str(harness), str(out / "train.py"), "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 0 loss" in proc.stdout


def _rewrite(tmp_path: Path, source: str) -> tuple[dict, str]:
    folder = tmp_path / "program"
    folder.mkdir()
    (folder / "train.py").write_text(source)
    out = tmp_path / "out"
    result = run_cli("rewrite", "--unsafe-fixes", "--out", out, "--format", "json", folder)
    (finding,) = [f for f in json.loads(result.stdout)["findings"] if f["code"] == "TFM303"]
    written = out / "train.py"
    return finding, written.read_text() if written.exists() else ""


def _fixture() -> str:
    return (FIXTURE / "train.py").read_text()


def test_a_builder_called_twice_is_not_taken_in(tmp_path):
    source = _fixture().replace(
        "    avg_gradients = average_gradients(gradients)\n",
        "    avg_gradients = average_gradients(gradients)\n"
        "    get_tower_results(iterator, optimizer, 1)\n",
    )
    finding, _ = _rewrite(tmp_path, source)
    assert not finding["applied"]
    assert "no statement after the loop combines `tower_gradients`" in finding["message"]
    assert "read inside" not in finding["message"]


def test_a_builder_whose_names_the_caller_reads_again_is_not_taken_in(tmp_path):
    # the towers' index `i` would overwrite the caller's `i`, which it prints afterwards
    source = (
        _fixture()
        .replace(
            "    iterator = make_dataset(",
            "    i = 'run-1'\n    iterator = make_dataset(",
        )
        .replace(
            "    global_step = tf.train.get_or_create_global_step()\n",
            "    global_step = tf.train.get_or_create_global_step()\n    print(i)\n",
        )
    )
    finding, _ = _rewrite(tmp_path, source)
    assert not finding["applied"]
    assert "read inside" not in finding["message"]


def test_arguments_that_are_not_the_parameters_are_bound_before_the_towers(tmp_path):
    source = _fixture().replace(
        "get_tower_results(iterator, optimizer, FLAGS.num_gpus)",
        "get_tower_results(iterator, optimizer=optimizer, num_gpus=2)",
    )
    finding, written = _rewrite(tmp_path, source)
    assert finding["applied"], finding["message"]
    assert "num_gpus = 2\n" in written
    compile(written, "train.py", "exec")


LAYERWISE = REPO / "fixtures" / "shapes" / "layerwise_towers"


def test_a_layer_library_is_no_program_of_its_own_and_layer_wise_towers_are_refused(tmp_path):
    folder = tmp_path / "program"
    shutil.copytree(LAYERWISE, folder)
    out = tmp_path / "out"
    result = run_cli("rewrite", "--unsafe-fixes", "--out", out, "--format", "json", folder)
    findings = [f for f in json.loads(result.stdout)["findings"] if f["code"] == "TFM303"]
    # the library's per-device loops belong to the program that imports it: no finding there
    assert [Path(f["path"]).name for f in findings] == ["train.py"], findings
    (finding,) = findings
    assert not finding["applied"]
    message = finding["message"]
    assert "the towers read `hidden`, made before their loop by `layers_mg.dense`" in message
    assert "layer-wise towers" in message
