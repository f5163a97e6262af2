"""Per-GPU placeholder lists, through the command line: placeholders each tower appends to a
list (or a model method appends to the model's own lists), fed tower by tower (a feed dict at
constant indices, or a loop over the GPUs), become train step parameters given as distributed
values -- replica i gets what tower i was fed -- and the replica function takes its own value
as an argument; the step run may sit in a closure of the tower function."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import rewritten, run_cli

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
STAGED = "converted to MirroredStrategy (a tf.function train step, GradientTape replicas)"
BANNED = {"Session", "placeholder", "get_collection", "ConfigProto", "feed_dict"}
# Runs a program on two logical CPU devices (MirroredStrategy then has two replicas), from its
# own folder (it imports its modules), as its user would run it on two GPUs.
TWO_DEVICES = textwrap.dedent(
    """
    import os, runpy, sys
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)


def _finding(stdout: str, file: str = "train.py") -> dict:
    (finding,) = [
        f
        for f in json.loads(stdout)["findings"]
        if f["code"] == "TFM303" and f["path"].endswith(file)
    ]
    return finding


def _code_names(source: str) -> set[str]:
    tree = ast.parse(source)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return names | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def _undefined(path: Path) -> str:
    """ruff's F821 report on the converted file (empty: every name it reads is defined)."""
    ruff = Path(sys.executable).parent / "ruff"
    run = subprocess.run(
        [str(ruff), "check", "--isolated", "--select", "F821", "--output-format", "concise",
         str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return run.stdout if run.returncode else ""


def _function(source: str, name: str) -> ast.FunctionDef:
    (found,) = [
        n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == name
    ]
    return found


def _trains(out: Path, *args: str) -> str:
    (out / "two_devices.py").write_text(TWO_DEVICES)
    run = subprocess.run(
        [sys.executable, str(out / "two_devices.py"), str(out / "train.py"), *args],
        capture_output=True, text=True, timeout=600, cwd=out,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_placeholder_lists_fed_at_constant_indices_from_a_closure_become_distributed_values():
    """per_gpu_closures: `points_phs.append(tf.placeholder(...))` per tower, read as
    `points_phs[-1]`; the closure `train_one_epoch` feeds `points_phs[0]`, `points_phs[1]`."""
    out, result = rewritten(FIXTURES / "towers" / "per_gpu_closures", "--unsafe-fixes",
                            "--format", "json")  # fmt: skip
    finding = _finding(result.stdout)
    assert finding["applied"] and finding["message"].startswith(STAGED), finding["message"]
    source = (out / "train.py").read_text()
    compile(source, "train.py", "exec")
    assert not _undefined(out / "train.py")
    assert "def train_step(points_phs, labels_phs, is_training_phs):" in source
    replica = _function(source, "replica_step")
    assert [a.arg for a in replica.args.args] == ["points_ph", "labels_ph", "is_training_ph"]
    body = ast.unparse(replica)
    # the tower reads its own value, as its placeholder's dtype; no placeholder is made
    assert "points_ph = tf.cast(points_ph, tf.float32)" in body
    assert "is_training_ph = tf.cast(is_training_ph, tf.bool)" in body
    assert "get_loss(logits, labels_ph, is_training_ph)" in body
    assert "placeholder" not in body and "points_phs" not in body
    assert (
        "strategy.run(replica_step, args=(points_phs, labels_phs, is_training_phs))" in source
    )
    # the closure calls the step with each list's values in tower order, one per replica
    assert (
        "loss_val, pred_val = train_step(points_phs=per_replica([train_points[begin_0:end_0], "
        "train_points[begin_1:end_1]]), labels_phs=per_replica([train_labels[begin_0:end_0], "
        "train_labels[begin_1:end_1]]), is_training_phs=per_replica([True, True]))"
    ) in source
    helper = _function(source, "per_replica")
    assert "strategy.experimental_distribute_values_from_function" in ast.unparse(helper)
    # the evaluation closure ran the session on the last tower's placeholders: left to the user
    evaluation = source.split("def eval_one_epoch(epoch):")[1]
    assert "# TODO(tfmigrate): TFM310 runs graph ops in the TF1 session" in evaluation
    assert "#     points_phs[1]: test_points[begin:end]," in evaluation
    names = _code_names(source.split('"""', 2)[2])
    assert not names & BANNED, names & BANNED


def test_a_tower_reading_another_towers_placeholder_is_not_given_its_own_value(tmp_path):
    """A tower reading another tower's placeholder (`points_phs[0]` in every tower) does not
    read only its own: that list is no per-GPU input, and the step run's feed of it is refused
    with the reason."""
    folder = tmp_path / "legacy"
    shutil.copytree(FIXTURES / "towers" / "per_gpu_closures", folder)
    train = folder / "train.py"
    text = train.read_text().replace("logits = get_model(points_phs[-1])",
                                     "logits = get_model(points_phs[-1] + points_phs[0])")
    assert text != train.read_text()
    train.write_text(text)
    out, result = rewritten(folder, "--unsafe-fixes", "--format", "json")
    finding = _finding(result.stdout)
    assert not finding["applied"]
    assert "the training step's feed is not a dict of its placeholders" in finding["message"]


def test_placeholder_lists_a_model_method_makes_and_a_feed_loop_fills():
    """model_placeholder_lists: `model.create_placeholders()` appends each tower's placeholders
    (a SparseTensor of three among them) to the model's lists; the feed is built in a loop over
    the GPUs with the learning rate keyed after it."""
    out, result = rewritten(FIXTURES / "towers" / "model_placeholder_lists", "--format", "json")
    finding = _finding(result.stdout)
    assert finding["applied"] and finding["message"] == STAGED, finding["message"]
    source = (out / "train.py").read_text()
    compile(source, "train.py", "exec")
    assert not _undefined(out / "train.py")
    assert "TODO(tfmigrate)" not in source
    # values that change shape from step to step: one trace for all of them
    assert "@tf.function(reduce_retracing=True)" in source
    assert (
        "def train_step(inputs_pl_list, targets_pl_list, keep_prob_pl_list, "
        "learning_rate_pl_value):" in source
    )
    replica = ast.unparse(_function(source, "replica_step"))
    assert "create_placeholders" not in replica
    assert (
        "targets_pl = tf.SparseTensor(tf.cast(targets_pl[0], tf.int64), "
        "tf.cast(targets_pl[1], tf.float32), tf.cast(targets_pl[2], tf.int64))" in replica
    )
    assert "model.compute_loss(inputs_pl, targets_pl, keep_prob_pl)" in replica
    loop = textwrap.dedent(
        """\
        inputs_pl_list, targets_pl_list, keep_prob_pl_list = [], [], []
        for i_gpu in range(args.num_gpus):
            inputs_pl_list.append(inputs[i_gpu])
            targets_pl_list.append(to_sparse(targets[i_gpu]))
            keep_prob_pl_list.append(1 - args.dropout)
        loss_train = train_step(inputs_pl_list=per_replica(inputs_pl_list), targets_pl_list=per_replica(targets_pl_list), keep_prob_pl_list=per_replica(keep_prob_pl_list), learning_rate_pl_value=tf.constant(learning_rate, learning_rate_pl.dtype))
        """
    )
    assert textwrap.indent(loop, " " * 12) in source
    names = _code_names(source.split('"""', 2)[2])
    assert not names & BANNED, names & BANNED


def test_a_method_of_that_name_in_two_classes_is_not_read_as_the_towers_placeholders(tmp_path):
    folder = tmp_path / "legacy"
    shutil.copytree(FIXTURES / "towers" / "model_placeholder_lists", folder)
    model = folder / "model.py"
    model.write_text(
        model.read_text()
        + "\n\nclass Other(ModelBase):\n\n    def create_placeholders(self):\n"
        "        self.inputs_pl_list.append(tf.placeholder(tf.float32, [None, 4]))\n"
    )
    out, result = rewritten(folder, "--format", "json")
    assert "per_replica" not in (out / "train.py").read_text()


def test_a_feed_loop_over_the_gpus_at_module_level_fills_one_list_per_placeholder_list():
    """shapes/per_gpu_placeholders: the feed starts as `{is_training: True}` and a loop over the
    GPUs keys `feed[points_phs[i]]`."""
    out, result = rewritten(FIXTURES / "shapes" / "per_gpu_placeholders", "--format", "json")
    finding = _finding(result.stdout)
    assert finding["applied"] and finding["message"] == STAGED, finding["message"]
    source = (out / "train.py").read_text()
    assert "def train_step(points_phs, labels_phs, is_training):" in source
    assert "@tf.function\n" in source  # shapes written out: no retracing to reduce
    loop = textwrap.dedent(
        """\
        points_phs, labels_phs = [], []
        for i in range(NUM_GPU):
            lo = start + i * BATCH
            points_phs.append(data[lo:lo + BATCH])
            labels_phs.append(labels[lo:lo + BATCH])
        train_step(points_phs=per_replica(points_phs), labels_phs=per_replica(labels_phs), is_training=True)
        """
    )
    assert textwrap.indent(loop, " " * 12) in source
    # the step makes its own towers' lists, not the per-GPU ones it is given
    step = ast.unparse(_function(source, "train_step"))
    assert "tower_grads = []" in step and "points_phs = []" not in step
    assert not _undefined(out / "train.py")


def test_a_second_rewrite_of_a_converted_per_gpu_program_changes_nothing():
    out, _ = rewritten(FIXTURES / "towers" / "model_placeholder_lists", "--format", "json")
    again = run_cli("rewrite", "--check", "--unsafe-fixes", "--format", "json", out)
    assert again.returncode == 0, again
    assert json.loads(again.stdout)["changed"] == 0


@pytest.mark.slow
def test_the_model_placeholder_lists_program_trains_on_two_replicas():
    out, _ = rewritten(FIXTURES / "towers" / "model_placeholder_lists", "--format", "json")
    printed = _trains(out, "--steps", "40")
    losses = [float(x) for x in re.findall(r"^step \d+ loss ([0-9.]+)", printed, re.M)]
    assert len(losses) == 4 and losses[-1] < losses[0] / 2, printed


@pytest.mark.slow
def test_the_module_level_feed_loop_program_trains_on_two_replicas():
    out, _ = rewritten(FIXTURES / "shapes" / "per_gpu_placeholders", "--format", "json")
    _trains(out)
