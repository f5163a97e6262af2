"""TFM303: whole tower programs become MirroredStrategy programs that verify accepts."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest

from tfmigrate.engine import Settings, process_source
from tfmigrate.rules import _tower_program_example as example
from tfmigrate.rules.tower_program import TowerProgramToMirroredStrategy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CONVERTED = ("cifar_average", "bn_rmsprop", "sum_ema_decay")
# tower program -> the line the finding must name (what blocked the conversion).
BLOCKED = {
    "addn_towers/train.py": 38,  # a placeholder with a None dimension
    "cifar_towers/train_multi_gpu.py": 73,  # queue input
}
TF1_ONLY = re.compile(r"\b(Session|placeholder|feed_dict|global_variables_initializer)\b")


def _rewrite_out(cli, name: str, out: Path):
    result = cli("rewrite", "--out", out, FIXTURES / "towers" / name)
    assert result.returncode in (0, 1), result
    return result


@pytest.mark.parametrize("name", CONVERTED)
def test_fixture_converts_to_a_tf2_program(cli, tmp_path, name):
    out = tmp_path / "out"
    _rewrite_out(cli, name, out)
    code = (out / "train.py").read_text()
    cst.parse_module(code)
    compile(code, "train.py", "exec")
    assert not TF1_ONLY.findall(code)
    assert "def tfmigrate_program(strategy, argv):" in code
    assert "strategy.run(step_fn, args=batch)" in code
    assert "import tfmigrate" not in code
    entry = json.loads((out / "tfmigrate.json").read_text())["files"]["train.py"]
    assert [a["code"] for a in entry["applied"]] == ["TFM303"]
    assert entry["variables"] and all(k == v for k, v in entry["variables"].items())
    assert any(note.startswith("TFM303:") for note in entry["notes"])


def test_cifar_average_mapping_and_scaling(cli, tmp_path):
    out = tmp_path / "out"
    _rewrite_out(cli, "cifar_average", out)
    code = (out / "train.py").read_text()
    entry = json.loads((out / "tfmigrate.json").read_text())["files"]["train.py"]
    assert list(entry["variables"]) == [
        "global_step",
        "conv1/weights", "conv1/biases", "local2/weights", "local2/biases",
        "softmax_linear/weights", "softmax_linear/biases",
    ]  # fmt: skip
    # Averaged towers: the replica loss is divided; the helper is gone; the last tower is logged.
    assert "loss / strategy.num_replicas_in_sync" in code
    assert "def average_gradients" not in code
    assert "outputs['total_loss'])[-1]" in code
    assert "flags.num_gpus" not in code.split("def make_parser")[0]


@pytest.mark.parametrize("name", CONVERTED)
def test_second_rewrite_changes_nothing(cli, tmp_path, name):
    out = tmp_path / "out"
    _rewrite_out(cli, name, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    again = cli("rewrite", "--write", "--allow-dirty", out)
    assert again.returncode == 0, again
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize("name", sorted(BLOCKED))
def test_unconvertible_program_is_left_alone_with_a_finding(tmp_path, name):
    source = (FIXTURES / name).read_text()
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    result = process_source(source, Path(name).name, settings)
    assert result.new_code is None and result.manifest == {}
    [finding] = result.findings
    assert finding.line == BLOCKED[name]
    assert finding.message.startswith("not converted: ") and not finding.fixable


def test_manifest_contribution_only_when_the_fix_is_applied():
    rules = (TowerProgramToMirroredStrategy,)
    scan = process_source(example.LEGACY, "train.py", Settings(rules=rules))
    assert scan.manifest == {} and scan.findings[0].fixable
    fixed = process_source(example.LEGACY, "train.py", Settings(rules=rules, fix=True))
    assert fixed.manifest["variables"] == {"model/w": "model/w"}


def _verify(legacy: Path, migrated: Path, steps: int = 6) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tfmigrate", "verify", str(legacy), str(migrated),
         "--replicas", "2", "--steps", str(steps)],
        capture_output=True, text=True, timeout=600,
        env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", CONVERTED)
def test_converted_fixture_verifies(cli, tmp_path, name):
    out = tmp_path / "out"
    _rewrite_out(cli, name, out)
    result = _verify(FIXTURES / "towers" / name / "train.py", out / "train.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "EQUIVALENT" in result.stdout
    assert not re.findall(r"^(?:FAIL|DIVERGED|UNMATCHED)", result.stdout, re.M)
    if name == "sum_ema_decay":  # the shadows, the cross-tower sum and the learning rate
        for row in ("total_loss (reduced)", "learning_rate (reduced)", "global_step"):
            assert re.search(rf"^PASS\W+{re.escape(row)}", result.stdout, re.M), row
        assert len(re.findall(r"^PASS\W+net/\S+/ExponentialMov", result.stdout, re.M)) == 4


def test_bn_rmsprop_shape(cli, tmp_path):
    """main() parsing its own flags, per-tower placeholders fed in a loop, inline averaging,
    one tower's UPDATE_OPS through tf.group, contrib/slim layers from tf_slim."""
    out = tmp_path / "out"
    _rewrite_out(cli, "bn_rmsprop", out)
    code = (out / "train.py").read_text()
    entry = json.loads((out / "tfmigrate.json").read_text())["files"]["train.py"]
    assert "= tf.contrib" not in code and "tf.contrib.layers.batch_norm(" not in code
    assert "import tf_slim" in code and "slim = tf_slim" in code
    assert "GraphKeys.UPDATE_OPS" not in code and "tf.group(" not in code
    assert "bn_updates =" not in code
    assert "averaged = opt.compute_gradients(\n" in code
    assert "loss / strategy.num_replicas_in_sync" in code
    assert "x_parts.append(x_all[lo:lo + args.batch_size])" in code
    assert "yield np.concatenate(x_parts), np.concatenate(y_parts)" in code
    assert "args, _ = make_parser().parse_known_args()\n" in code
    assert code.rstrip().endswith("if __name__ == '__main__':\n  main()")
    assert sorted(entry["variables"]) == sorted(
        f"model/{name}" for name in (
            "fc1/weights", "fc1/biases", "bn1/beta", "bn1/moving_mean", "bn1/moving_variance",
            "logits/weights", "logits/biases",
        )
    )  # fmt: skip
    [announced] = entry["announced"]
    assert announced["match"] == ["*/moving_mean", "*/moving_variance"]
    assert announced["code"] == "TFM303" and "MEAN of the replicas'" in announced["reason"]


def test_sum_ema_decay_shape(cli, tmp_path):
    """tf.data iterator split per clone, make_template, summed clones, EMA with num_updates,
    exponential_decay on global_step, MonitoredTrainingSession + StopAtStepHook, fetches of a
    cross-tower sum and of the learning rate."""
    out = tmp_path / "out"
    _rewrite_out(cli, "sum_ema_decay", out)
    code = (out / "train.py").read_text()
    entry = json.loads((out / "tfmigrate.json").read_text())["files"]["train.py"]
    assert "train.MonitoredTrainingSession(" not in code and "make_one_shot_iterator" not in code
    assert "tf.compat.v1.layers.dense(" not in code and "tf1_core_layers.dense(" in code
    assert "batches = strategy.experimental_distribute_dataset(dataset)" in code
    # Summed clones: no rescaling; the clones' own 1/N now divides by the replica count.
    assert "/ strategy.num_replicas_in_sync" not in code
    assert "1.0 * strategy.num_replicas_in_sync, name='clone_loss'" in code
    assert "def sum_clones_gradients" not in code
    assert "train_op = ema.apply(tf1_variables.trainable)" in code
    assert "fetches['learning_rate'] = lr() if callable(lr) else lr" in code
    assert "strategy.reduce(tf.distribute.ReduceOp.SUM, outputs['clone_loss'], axis=None)" in code
    assert "while int(global_step.numpy()) < args.max_steps:" in code
    assert "manager.save(checkpoint_number=int(global_step.numpy()))" in code
    weights = ["net/hidden/kernel", "net/hidden/bias", "net/logits/kernel", "net/logits/bias"]
    assert list(entry["variables"]) == [
        "global_step", *weights, *(f"{w}/ExponentialMovingAverage" for w in weights)
    ]
    assert "announced" not in entry


@pytest.mark.slow
def test_bn_rmsprop_statistics_are_announced(cli, tmp_path):
    out = tmp_path / "out"
    _rewrite_out(cli, "bn_rmsprop", out)
    result = _verify(FIXTURES / "towers" / "bn_rmsprop" / "train.py", out / "train.py")
    assert result.returncode == 0, result.stdout + result.stderr
    expected = re.findall(r"^EXPECTED\W+(\S+)", result.stdout, re.M)
    assert expected == ["model/bn1/moving_mean", "model/bn1/moving_variance"]
    assert not re.findall(r"^(?:FAIL|DIVERGED)", result.stdout, re.M)
    assert len(re.findall(r"^PASS\W+xent/value", result.stdout, re.M)) == 2  # both towers


@pytest.mark.slow
def test_differently_written_program_verifies(cli, tmp_path):
    """The rule's own example: no graph block, reuse=i > 0 inside the tower, default init."""
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "train.py").write_text(example.LEGACY)
    out = tmp_path / "out"
    assert cli("rewrite", "--out", out, legacy).returncode in (0, 1)
    assert (out / "train.py").read_text() == example.CONVERTED
    result = _verify(legacy / "train.py", out / "train.py", steps=4)
    assert result.returncode == 0, result.stdout + result.stderr


def test_example_is_current():
    """The documented conversion is what the rule writes (regenerate it on purpose)."""
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    assert process_source(example.LEGACY, "train.py", settings).new_code == example.CONVERTED


def test_blocked_fixture_copy_is_byte_identical(cli, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURES / "addn_towers", repo)
    before = {p.name: p.read_bytes() for p in repo.iterdir()}
    cli("rewrite", "--write", "--allow-dirty", "--select", "TFM303", repo)
    assert {p.name: p.read_bytes() for p in repo.iterdir()} == before
