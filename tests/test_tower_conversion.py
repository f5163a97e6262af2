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
from conftest import legacy_cache_dir, rewritten

from tfmigrate.engine import Settings, process_source
from tfmigrate.registry import rule_by_code
from tfmigrate.rules import _tower_program_example as example
from tfmigrate.rules._keras_model_emit import DROPOUT_NOTE
from tfmigrate.rules.tower_program import TowerProgramToMirroredStrategy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# tower program -> its script, relative to the folder rewrite converts (fixtures/towers/<name>
# unless the name is a path of its own under fixtures/)
SCRIPTS = {
    "cifar_average": "train.py", "bn_rmsprop": "train.py", "sum_ema_decay": "train.py",
    "global_updates": "train.py", "slim_clones": "train.py", "queue_saver": "train.py",
    "addn_towers": "train.py",  # with its model module
    "slim_towers": "train_clones.py",  # tf.app.flags, a slim model package
    "layers_adam": "train.py",  # UPDATE_OPS by the first tower's literal scope, add_n(losses) / n
    # the TF CIFAR-10 multi-GPU tutorial's layout: tf.app.flags in both modules, main(argv=None)
    # calling train(), a get_variable model module reading FLAGS.batch_size
    "tutorial_flags": "multi_gpu_train.py",
    # the tutorial's input: every tower dequeues its own batch from a prefetch_queue
    "cifar_towers": "train_multi_gpu.py",
}  # fmt: skip
# Script flags for verify (the same for both sides): two towers, a small batch, no dropout
# (random ops cannot match across runtimes).
VERIFY_ARGS = {
    "slim_towers": ["--num_clones", "2", "--batch_size", "16", "--dropout_keep_prob", "1"],
    "tutorial_flags": ["--batch_size", "4"],  # a flag the model module defines and reads
}
# verify options by fixture. addn_towers needs no --noise-floor: its first conv kernel's gradient
# cancels out through the batch norm, which once magnified the unfused batch norm's rounding to
# 9e-6 by step 3; TF1BatchNorm runs TF1's fused kernel, so the weights match exactly.
VERIFY_OPTIONS: dict[str, list[str]] = {}
CONVERTED = tuple(SCRIPTS)
# tower program -> the line the finding must name (what blocked the conversion).
BLOCKED = {
    "towers/shuffled_dequeue/train.py": (51, "shuffles (tf.train.shuffle_batch)"),
}
TF1_ONLY = re.compile(r"\b(Session|placeholder|feed_dict|global_variables_initializer)\b")
# tower program -> the Keras model class its model function became (the others keep their TF1
# model code on tf.compat.v1)
KERAS_MODELS = {
    "bn_rmsprop": "Model", "global_updates": "Model", "sum_ema_decay": "Network",
    "slim_clones": "Mlp", "cifar_average": "Inference", "queue_saver": "Inference",
    "layers_adam": "Net", "cifar_towers": "Inference",
}  # fmt: skip
# Of those, get_variable models: the Keras model owns the variables under their legacy names
# (add_weight), so the weight paths are the legacy names under the model's name.
GET_VARIABLE_MODELS = {
    "cifar_average": "inference", "queue_saver": "inference", "tutorial_flags": "inference",
    "cifar_towers": "inference",
}  # fmt: skip
# Model functions of an imported module: the class goes in that module.
KERAS_MODELS["slim_towers"] = "SmallNet"
KERAS_MODELS["addn_towers"] = "Build"  # built in a loop over a literal list: unrolled
KERAS_MODELS["tutorial_flags"] = "Inference"  # a get_variable model module
MODEL_MODULES = {
    "slim_towers": "nets/small_net.py", "addn_towers": "model.py", "tutorial_flags": "model.py"
}  # fmt: skip


STAGED = "converted to MirroredStrategy (a tf.function train step, GradientTape replicas)"


def _staged(result) -> object:
    """What the whole-program reader refuses, the staged converter (read -> plan -> emit)
    converts, keeping what it cannot convert under TODO(tfmigrate) markers."""
    [finding] = [f for f in result.findings if f.code == "TFM303"]
    assert finding.message.startswith(STAGED), finding.message
    return finding


def _folder(name: str) -> Path:
    return (
        FIXTURES / name if (FIXTURES / name / "EXPECTED").exists() else FIXTURES / "towers" / name
    )


def _rewrite_out(cli, name: str, out: Path):
    """The fixture's rewrite (made once per test session: several tests read the same output),
    copied to ``out``."""
    cached, result = rewritten(_folder(name))
    assert result.returncode in (0, 1), result
    shutil.copytree(cached, out)
    return result


@pytest.mark.parametrize("name", CONVERTED)
def test_fixture_converts_to_a_tf2_program(cli, tmp_path, name):
    out = tmp_path / "out"
    _rewrite_out(cli, name, out)
    script = SCRIPTS[name]
    code = (out / script).read_text()
    cst.parse_module(code)
    compile(code, script, "exec")
    assert not TF1_ONLY.findall(code)
    # a plain TF2 program: no verify hooks, one tf.function train step
    assert "tfmigrate_program" not in code and "build_program" not in code
    assert "make_parser" not in code and "restore_from" not in code
    assert "one_step" not in code and 'program["' not in code
    assert "@tf.function\n" in code and "def train_step(batch):" in code
    assert "strategy.run(step_fn, args=batch)" in code
    assert "import tfmigrate" not in code
    entry = json.loads((out / "tfmigrate.json").read_text())["files"][script]
    assert [a["code"] for a in entry["applied"]] == ["TFM303"]
    assert entry["variables"]
    if name in KERAS_MODELS:
        program = code.split('"""', 2)[2]  # after the module docstring
        model_code = (out / MODEL_MODULES[name]).read_text() if name in MODEL_MODULES else code
        assert f"class {KERAS_MODELS[name]}(keras.Model):" in model_code
        assert "TF1Variables" not in code and "variable_scope" not in program
        assert "tf_slim" not in code + model_code and "tf_keras" not in code + model_code
        statements = [line for line in program.splitlines() if not line.strip().startswith("#")]
        assert not [line for line in statements if "GraphKeys" in line]  # no collections left
        if name in GET_VARIABLE_MODELS:
            assert "get_variable(" not in program and "add_to_collection" not in program
            model = GET_VARIABLE_MODELS[name]
            assert all(
                v == f"{model}/{k}" for k, v in entry["variables"].items() if k != "global_step"
            )
        else:
            # legacy scope paths -> Keras weight paths (slim's weights/biases are kernel/bias)
            values = entry["variables"].values()
            assert not [v for v in values if v.endswith(("/weights", "/biases"))]
        assert any(n.startswith("TFM303: the model function ") for n in entry["notes"])
    else:
        assert all(k == v for k, v in entry["variables"].items())
        assert any("not converted to Keras layers: " in n for n in entry["notes"])
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
    assert "strategy.experimental_local_results(outputs['total_loss'])[-1].numpy()" in code
    assert "flags.num_gpus" not in code.split("if __name__")[0]


@pytest.mark.parametrize("name", CONVERTED)
def test_second_rewrite_changes_nothing(cli, tmp_path, name):
    out = tmp_path / "out"
    _rewrite_out(cli, name, out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    again = cli("rewrite", "--write", "--allow-dirty", out)
    assert again.returncode in (0, 1) and " yes " not in again.stdout, again  # 1: findings left
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("name", sorted(BLOCKED))
def test_unconvertible_program_is_left_alone_with_a_finding(tmp_path, name):
    source = (FIXTURES / name).read_text()
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    result = process_source(source, Path(name).name, settings)
    # The staged converter converts it, its input under a TODO it cannot run without: an
    # unsafe fix, not applied without --unsafe-fixes.
    assert result.new_code is None and result.manifest == {}
    [finding] = result.findings
    assert _staged(result) is finding and finding.fixable  # type: ignore[comparison-overlap]
    assert "TFM311" in finding.message and finding.safety.value == "unsafe"


def test_manifest_contribution_only_when_the_fix_is_applied():
    rules = (TowerProgramToMirroredStrategy,)
    scan = process_source(example.LEGACY, "train.py", Settings(rules=rules))
    assert scan.manifest == {} and scan.findings[0].fixable
    fixed = process_source(example.LEGACY, "train.py", Settings(rules=rules, fix=True))
    assert fixed.manifest["variables"] == {"model/w": "model/w"}


# verify's steps: those of tests/verify/ (verify_support.STEPS), so that a legacy program both
# verify there shares one legacy run (bn_rmsprop: same mapping, same flags)
STEPS = 8


def _verify(
    legacy: Path,
    migrated: Path,
    steps: int = STEPS,
    args: list[str] | None = None,
    options: list[str] | None = None,
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tfmigrate", "verify", str(legacy), str(migrated),
         "--replicas", "2", "--steps", str(steps), "--legacy-cache", str(legacy_cache_dir()),
         *(options or []), *(["--", *args] if args else [])],
        capture_output=True, text=True, timeout=600,
        env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", CONVERTED)
def test_converted_fixture_verifies(cli, tmp_path, name):
    out = tmp_path / "out"
    _rewrite_out(cli, name, out)
    convnets = ("addn_towers", "slim_towers", "tutorial_flags", "cifar_towers")
    steps = 3 if name in convnets else STEPS
    script = SCRIPTS[name]
    result = _verify(
        _folder(name) / script, out / script, steps, VERIFY_ARGS.get(name), VERIFY_OPTIONS.get(name)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "EQUIVALENT" in result.stdout
    assert not re.findall(r"^(?:FAIL|DIVERGED|UNMATCHED)", result.stdout, re.M)
    if name == "tutorial_flags":  # the tower's sum, named after the discarded loss() sum's
        assert re.search(r"^PASS\W+total_loss_1 \(tower 1\)", result.stdout, re.M)
    if name == "cifar_towers":  # tower i took the i-th batch (verify fixed TF1's free order)
        assert re.search(r"^PASS\W+total_loss \(tower 1\)", result.stdout, re.M)
        assert "verify ran tower i's dequeue after tower i-1's" in result.stdout
    if name == "bn_rmsprop":
        # Announced, and measured: replica 0's Keras batch norm (TF1BatchNorm: the fused kernel's
        # unbiased variance) updates from tower 0's sub-batch, which is what the legacy step kept
        # (--bn_updates first, the default): the statistics match.
        rows = r"^PASS\W+(model/bn1/moving_\w+)\W.*announced TFM303"
        assert re.findall(rows, result.stdout, re.M) == [
            "model/bn1/moving_mean", "model/bn1/moving_variance"
        ]  # fmt: skip
        assert not re.findall(r"^EXPECTED", result.stdout, re.M)
        assert len(re.findall(r"^PASS\W+xent/value", result.stdout, re.M)) == 2  # both towers
    if name == "sum_ema_decay":  # the shadows, the cross-tower sum and the learning rate
        for row in ("total_loss (reduced)", "learning_rate (reduced)", "global_step"):
            assert re.search(rf"^PASS\W+{re.escape(row)}", result.stdout, re.M), row
        assert len(re.findall(r"^PASS\W+net/\S+/ExponentialMov", result.stdout, re.M)) == 4
    if name == "global_updates":  # every tower's statistics updates: announced, with their size
        expected = re.findall(r"^EXPECTED\W+(\S+)", result.stdout, re.M)
        assert expected == ["net/bn1/moving_mean", "net/bn1/moving_variance"]
        assert re.search(r"^PASS\W+Mean \(tower 1\)", result.stdout, re.M)  # the last tower's
        assert len(re.findall(r"^PASS\W+net/\S+/ExponentialMov", result.stdout, re.M)) == 5
    if name == "slim_clones":  # with_dependencies' value: the SUM of the clones' scaled losses
        assert re.search(r"^PASS\W+train_op\W", result.stdout, re.M)
        assert re.findall(r"^EXPECTED\W+(\S+)", result.stdout, re.M) == [
            "mlp/bn1/moving_mean", "mlp/bn1/moving_variance"
        ]  # fmt: skip
    if name == "slim_towers":  # the clones' summed loss; MaxBytesInUse is not compared
        assert re.search(r"^PASS\W+train_op\W", result.stdout, re.M)
        rows = r"^(?:PASS|FAIL|EXPECTED|DIVERGED|UNMATCHED)\W+\S*(?:MaxBytesInUse|peak)"
        assert not re.findall(rows, result.stdout, re.M)
        assert len(re.findall(r"^EXPECTED\W+SmallNet/\S+/moving_\w+", result.stdout, re.M)) >= 2
    if name == "addn_towers":  # the towers' mean loss and the whole batch's accuracy, reduced
        # ... from a Keras model: the loop-built tf.layers model, unrolled, no TF1 variables
        model_code = (out / MODEL_MODULES[name]).read_text()
        assert "class Build(keras.Model):" in model_code and "tf_keras" not in model_code
        assert "TF1Variables" not in (out / script).read_text()
        assert re.search(r"^PASS\W+Mean \(reduced\)", result.stdout, re.M)
        assert re.search(r"^PASS\W+Mean_1 \(reduced\)", result.stdout, re.M)
        shadows = re.findall(r"^(\w+)\W+net/\S+/ExponentialMovingAverage", result.stdout, re.M)
        assert len(shadows) == 10 and set(shadows) <= {"PASS", "EXPECTED"}  # orderless EMA
        expected = re.findall(r"^EXPECTED\W+(net/\S+/moving_\w+)\s", result.stdout, re.M)
        assert len(expected) == 4  # every tower's statistics updates: announced, with size
        assert re.search(r"^PASS\W+net/conv1/kernel\W", result.stdout, re.M)  # no noise floor


def test_cifar_towers_dequeue_shape(cli, tmp_path):
    """Towers that each dequeue their own batch from a prefetch_queue: one global batch of
    num_replicas consecutive queue batches per step, replica i taking the i-th."""
    out = tmp_path / "out"
    _rewrite_out(cli, "cifar_towers", out)
    code = (out / "train_multi_gpu.py").read_text()
    entry = json.loads((out / "tfmigrate.json").read_text())["files"]["train_multi_gpu.py"]
    program = code.split('"""', 2)[2]  # after the module docstring
    assert "prefetch_queue" not in program and ".dequeue()" not in program
    assert "input_dataset = inputs(images_np, labels_np, flags.batch_size)\n" in code
    assert (
        "input_dataset = input_dataset.unbatch().batch("
        "flags.batch_size * strategy.num_replicas_in_sync)"
    ) in code
    assert "def tower_fn(image_batch, label_batch):" in code
    [note] = [n for n in entry["notes"] if "batch_queue.dequeue()" in n]
    assert "verify runs the legacy towers' dequeues in tower order" in note


def test_bn_rmsprop_shape(cli, tmp_path):
    """main() parsing its own flags, per-tower placeholders fed in a loop, inline averaging,
    one tower's UPDATE_OPS through tf.group, contrib/slim layers from tf_slim."""
    out = tmp_path / "out"
    _rewrite_out(cli, "bn_rmsprop", out)
    code = (out / "train.py").read_text()
    entry = json.loads((out / "tfmigrate.json").read_text())["files"]["train.py"]
    assert "= tf.contrib" not in code and "tf.contrib.layers.batch_norm(" not in code
    assert "tf_slim" not in code and "slim = " not in code  # the model became Keras layers
    assert "class TF1BatchNorm(keras.layers.BatchNormalization):" in code
    assert (  # slim's defaults spelled out; TF1's fused kernel: unbiased moving variance
        "TF1BatchNorm( unbiased_ranks=(2, 4), momentum=0.9, epsilon=0.001, center=True, "
        'scale=False, name="bn1")'
    ) in " ".join(code.split())
    assert 'self.fc1 = keras.layers.Dense(16, name="fc1")' in code  # activation_fn=None
    assert 'model = Model(name="model")' in code and "logits = model(x, training=True)" in code
    assert "GraphKeys.UPDATE_OPS" not in code and "tf.group(" not in code
    assert "bn_updates = " not in code
    assert "averaged = list(zip(\n" in code and "compute_gradients" not in code
    assert "loss / strategy.num_replicas_in_sync" in code
    assert "x_parts.append(x_all[lo:lo + args.batch_size])" in code
    assert "yield np.concatenate(x_parts), np.concatenate(y_parts)" in code
    assert "  parser = argparse.ArgumentParser()\n" in code.split("def main():")[1]
    assert "  args, _ = parser.parse_known_args()\n" in code  # parsed where it was
    assert code.rstrip().endswith("if __name__ == '__main__':\n  main()")
    assert entry["variables"] == {
        "model/fc1/weights": "model/fc1/kernel", "model/fc1/biases": "model/fc1/bias",
        "model/bn1/beta": "model/bn1/beta", "model/bn1/moving_mean": "model/bn1/moving_mean",
        "model/bn1/moving_variance": "model/bn1/moving_variance",
        "model/logits/weights": "model/logits/kernel", "model/logits/biases": "model/logits/bias",
    }  # fmt: skip
    [announced] = entry["announced"]
    assert announced["match"] == ["*/moving_mean", "*/moving_variance"]
    assert announced["code"] == "TFM303"
    assert "only where the legacy step kept the FIRST tower's updates" in announced["reason"]


def test_sum_ema_decay_shape(cli, tmp_path):
    """tf.data iterator split per clone, make_template, summed clones, EMA with num_updates,
    exponential_decay on global_step, MonitoredTrainingSession + StopAtStepHook, fetches of a
    cross-tower sum and of the learning rate."""
    out = tmp_path / "out"
    _rewrite_out(cli, "sum_ema_decay", out)
    code = (out / "train.py").read_text()
    entry = json.loads((out / "tfmigrate.json").read_text())["files"]["train.py"]
    assert "train.MonitoredTrainingSession(" not in code and "make_one_shot_iterator" not in code
    program = code.split('"""', 2)[2]  # after the module docstring
    assert "layers.dense(" not in program and "make_template" not in program
    assert 'net = Network(name="net")' in code and "logits = net(images)" in code
    assert 'self.hidden = keras.layers.Dense(24, activation="tanh", name="hidden")' in code
    assert "batches = iter(strategy.experimental_distribute_dataset(dataset))" in code
    # Summed clones: no rescaling; the clones' own 1/N now divides by the replica count.
    assert "/ strategy.num_replicas_in_sync" not in code
    assert "1.0 * strategy.num_replicas_in_sync, name='clone_loss'" in code
    assert "def sum_clones_gradients" not in code
    assert "train_op = ema.apply([weight.value for weight in net.trainable_weights])" in code
    assert "fetches['learning_rate'] = lr() if callable(lr) else lr" in code
    assert "strategy.reduce(tf.distribute.ReduceOp.SUM, outputs['clone_loss'], axis=None)" in code
    assert "while int(global_step.numpy()) < args.max_steps:" in code
    assert "manager.save(checkpoint_number=int(global_step.numpy()))" in code
    weights = ["net/hidden/kernel", "net/hidden/bias", "net/logits/kernel", "net/logits/bias"]
    assert list(entry["variables"]) == [
        "global_step",
        *weights,
        *(f"{w}/ExponentialMovingAverage" for w in weights),
    ]
    assert "announced" not in entry


def test_global_updates_shape(cli, tmp_path):
    """Global UPDATE_OPS before the update, a None batch dimension, six.moves.xrange, a named
    variable_scope around the tower, parse_args() in its own function, EMA over
    trainable_variables() + moving_average_variables()."""
    out = tmp_path / "out"
    _rewrite_out(cli, "global_updates", out)
    code = (out / "train.py").read_text()
    entry = json.loads((out / "tfmigrate.json").read_text())["files"]["train.py"]
    body = code.split('"""', 2)[2]  # after the module docstring, which still describes the towers
    code_lines = [line for line in body.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code_lines if "UPDATE_OPS" in line]
    assert "control_dependencies(update_ops)" not in code
    # one fed batch per element, distributed by the strategy
    assert "tf.TensorSpec([None, FEATURES], tf.float32)" in code
    assert "batches = iter(strategy.experimental_distribute_dataset(dataset))" in code
    assert "from six.moves import xrange" in code and "for step in xrange(args.steps):" in code
    assert "variable_scope" not in code.split('"""', 2)[2]
    assert "logits = model(x, training=True)" in code and 'model = Model(name="net")' in code
    assert "replica_index" not in code  # the tower index only chose the scope's reuse
    # tf.layers batch norm: its own defaults; the fused (unbiased) update on 4-D inputs only
    flat = " ".join(code.split())
    assert "TF1BatchNorm( unbiased_ranks=(4,), momentum=0.9, epsilon=0.001" in flat
    assert "def parse_args" in code and "args = parse_args()\n" in code  # kept as it was
    # trainable_variables() + moving_average_variables(): batch norm put nothing in that
    # collection (TF 2.21's compat layer), so the weights alone
    assert "ema.apply([weight.value for weight in model.trainable_weights])" in code
    assert "regularization_losses" not in code  # nothing reads it here
    assert "# No UPDATE_OPS to run" in code  # the program itself says what differs
    # the unnamed last-tower loss, as TF1 named it
    assert "strategy.experimental_local_results(outputs['Mean'])[-1]" in code
    [announced] = entry["announced"]
    assert announced["match"] == [
        "*/moving_mean", "*/moving_variance", "*/moving_mean/*", "*/moving_variance/*"
    ]  # fmt: skip
    assert "every tower's batch-norm UPDATE_OPS" in announced["reason"]
    assert "update their own copy of the moving statistics" in announced["reason"]
    names = ["fc1/kernel", "bn1/gamma", "bn1/beta", "logits/kernel", "logits/bias"]
    assert list(entry["variables"]) == [
        "net/fc1/kernel", "net/bn1/gamma", "net/bn1/beta", "net/bn1/moving_mean",
        "net/bn1/moving_variance", "net/logits/kernel", "net/logits/bias",
        *(f"net/{n}/ExponentialMovingAverage" for n in names),
    ]  # fmt: skip


def test_slim_clones_shape(cli, tmp_path):
    """Slim clones: pre-scaled losses summed, weight decay on the first clone only, the last
    clone's UPDATE_OPS after the loop, with_dependencies fetched for its value."""
    out = tmp_path / "out"
    _rewrite_out(cli, "slim_clones", out)
    code = (out / "train.py").read_text()
    entry = json.loads((out / "tfmigrate.json").read_text())["files"]["train.py"]
    assert "/ strategy.num_replicas_in_sync" not in code  # summed: no rescaling
    assert "1.0 * strategy.num_replicas_in_sync, name='scaled_clone_loss'" in code
    assert "tf.add_n(mlp.losses," in code  # the layers' regularizers, this replica's copy
    assert "if i == 0:" in code  # only replica 0 adds it, as only clone 0 did
    # slim l2_regularizer(wd) is wd * sum(w**2) / 2; the model is configured by the flag
    assert "kernel_regularizer=keras.regularizers.L2(0.5 * weight_decay)" in code
    assert 'mlp = Mlp(args.weight_decay, name="mlp")' in code
    program = code.split('"""', 2)[2]  # after the module docstring
    assert "with_dependencies" not in program and "control_flow_ops" not in program
    assert "update_ops" not in program and "def sum_clones_gradients" not in program
    assert "outputs['train_op'] = strategy.reduce(tf.distribute.ReduceOp.SUM, " in code
    assert "loss_value = outputs['train_op'].numpy()" in code  # reduced: one value
    [announced] = entry["announced"]
    assert "only the last tower's batch-norm UPDATE_OPS (scope `scope`" in announced["reason"]
    assert "differ otherwise" in announced["reason"]  # the last clone's: not replica 0's
    assert list(entry["variables"]) == ["global_step"] + [
        f"mlp/{n}" for n in (
            "fc1/weights", "fc1/biases", "bn1/beta", "bn1/moving_mean", "bn1/moving_variance",
            "logits/weights", "logits/biases",
        )
    ]  # fmt: skip


def test_queue_saver_shape(cli, tmp_path):
    """Ordered queue input, tf.train.Saver and summaries in the Session loop."""
    out = tmp_path / "out"
    _rewrite_out(cli, "queue_saver", out)
    code = (out / "train.py").read_text()
    entry = json.loads((out / "tfmigrate.json").read_text())["files"]["train.py"]
    program = code.split('"""', 2)[2]  # after the module docstring
    assert "train.slice_input_producer" not in program and "tf.train.batch(" not in program
    assert "start_queue_runners" not in program and "Saver(" not in program
    assert "FileWriter(" not in program and "merge_all" not in program
    assert "add_summary" not in program
    assert "dataset = tf.data.Dataset.from_tensor_slices((x, y))\n" in code
    assert "return dataset.repeat().batch(batch_size)\n" in code
    assert "batches = iter(strategy.experimental_distribute_dataset(input_dataset))" in code
    assert "summary_writer = tf.summary.create_file_writer(flags.train_dir)" in code
    assert "max_to_keep=3" in code and "manager.save(checkpoint_number=step)" in code
    assert "summary = {'cross_entropy': " in code
    assert any("queue input (`input_batches`" in note for note in entry["notes"])


@pytest.mark.slow
def test_queue_saver_program_runs_and_writes(tmp_path, cli):
    """The migrated program, run as a user would: it trains, logs, writes the summaries and
    the checkpoints (same file names as the legacy Saver's)."""
    out = tmp_path / "out"
    _rewrite_out(cli, "queue_saver", out)
    logs = tmp_path / "logs"
    done = subprocess.run(
        [sys.executable, str(out / "train.py"), "--max_steps", "12", "--train_dir", str(logs)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.findall(r"^step (\d+), loss = ", done.stdout, re.M) == ["0", "10"]
    names = sorted(p.name for p in logs.iterdir())
    assert "model.ckpt-0.index" in names and "model.ckpt-11.index" in names
    [events] = [p for p in logs.iterdir() if p.name.startswith("events.out.tfevents")]
    probe = (
        "import sys, tensorflow as tf\n"
        "for e in tf.compat.v1.train.summary_iterator(sys.argv[1]):\n"
        "    for v in e.summary.value:\n"
        "        print(e.step, v.tag, v.metadata.plugin_data.plugin_name)\n"
    )
    read = subprocess.run([sys.executable, "-c", probe, str(events)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert read.stdout.split("\n")[:2] == ["0 cross_entropy scalars", "10 cross_entropy scalars"]


def test_batch_norm_sync(cli, tmp_path):
    """--batch-norm sync: the batch norms of a model converted to Keras layers get
    synchronized=True (TF1BatchNorm's own statistics too), the manifest announces cross-replica
    statistics and, the forward pass having changed, every quantity; TF1 batch norm kept on
    compat.v1 has no cross-replica mode, so such a program is left alone with a finding that
    says so; without batch norm the option changes nothing; faithful is the default."""
    synced, _ = rewritten(FIXTURES / "towers" / "bn_rmsprop", "--batch-norm", "sync")
    code = (synced / "train.py").read_text()
    assert re.search(r"= TF1BatchNorm\(\n.*scale=False,\n +synchronized=True, name=\"bn1\"\)", code)
    assert "keras.ops.moments(inputs, axes, synchronized=self.synchronized)" in code
    assert 'all_reduce("sum", count)' in code  # the global batch's n/(n-1)
    entry = json.loads((synced / "tfmigrate.json").read_text())["files"]["train.py"]
    statistics, everything = entry["announced"]
    assert statistics["match"][:2] == ["*/moving_mean", "*/moving_variance"]
    assert "GLOBAL batch" in statistics["reason"] and "cross-replica" in statistics["reason"]
    assert everything["match"] == ["*"] and "losses and the weights differ" in everything["reason"]
    assert any("--batch-norm sync" in note for note in entry["notes"])
    jit = cli("rewrite", "--batch-norm", "sync", "--jit", "--format", "json",
              FIXTURES / "towers" / "bn_rmsprop")  # fmt: skip
    [refusal] = [f for f in json.loads(jit.stdout)["findings"] if f["code"] == "TFM303"]
    assert "--batch-norm sync with --jit" in refusal["message"]
    legacy = tmp_path / "kept"  # a model kept on tf.compat.v1 (a get_variable + tf.layers mix)
    legacy.mkdir()
    mean = "    return tf.reduce_mean(tf.square(tf.matmul(x, w) - y), name='loss')\n"
    assert example.LEGACY.count(mean) == 1
    bn = "    h = tf.layers.batch_normalization(tf.matmul(x, w), training=True, name='bn')\n"
    (legacy / "train.py").write_text(
        example.LEGACY.replace(mean, bn + mean.replace("tf.matmul(x, w)", "h"))
    )
    out = tmp_path / "sync"
    result = cli("rewrite", "--batch-norm", "sync", "--format", "json", "--out", out, legacy)
    assert result.returncode == 1, result
    assert (out / "train.py").read_bytes() == (legacy / "train.py").read_bytes()
    [refusal] = [f for f in json.loads(result.stdout)["findings"] if f["code"] == "TFM303"]
    kept = "--batch-norm sync: `tf.compat.v1.layers.batch_normalization` (line 9)"
    assert kept in refusal["message"]
    assert "no cross-replica mode" in refusal["message"]
    plain, synced, faithful = tmp_path / "plain", tmp_path / "synced", tmp_path / "faithful"
    _rewrite_out(cli, "cifar_average", plain)
    cli("rewrite", "--batch-norm", "sync", "--out", synced, FIXTURES / "towers" / "cifar_average")
    cli("rewrite", "--batch-norm", "faithful", "--out", faithful,
        FIXTURES / "towers" / "cifar_average")  # fmt: skip
    code = (plain / "train.py").read_text()
    assert "def train_step(batch):" in code
    assert (synced / "train.py").read_text() == code == (faithful / "train.py").read_text()
    bad = cli("rewrite", "--batch-norm", "global", FIXTURES / "towers" / "cifar_average")
    assert bad.returncode == 2


@pytest.mark.slow
def test_slim_clones_weight_decay_is_checked(cli, tmp_path):
    """verify notices when the first clone's weight decay is lost (the conversion keeps it)."""
    out = tmp_path / "out"
    _rewrite_out(cli, "slim_clones", out)
    script = out / "train.py"
    code = script.read_text()
    kept = "clone_loss = clone_loss + regularization_loss"
    assert code.count(kept) == 1
    script.write_text(code.replace(kept, "clone_loss = clone_loss + 0.0 * regularization_loss"))
    result = _verify(FIXTURES / "towers" / "slim_clones" / "train.py", script)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "DIVERGED" in result.stdout and "train_op (reduced)" in result.stdout


@pytest.mark.slow
def test_bn_rmsprop_synchronized_statistics_are_announced(cli, tmp_path):
    """--batch-norm sync trains with cross-replica statistics: verify reports the statistics,
    the losses and the weights as differing as announced, with their size -- never FAIL."""
    out = tmp_path / "out"  # test_batch_norm_sync reads the same rewrite
    shutil.copytree(rewritten(FIXTURES / "towers" / "bn_rmsprop", "--batch-norm", "sync")[0], out)
    result = _verify(FIXTURES / "towers" / "bn_rmsprop" / "train.py", out / "train.py")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "DIFFERS AS ANNOUNCED" in result.stdout
    assert not re.findall(r"^(?:FAIL|DIVERGED|UNMATCHED)", result.stdout, re.M)
    rows = r"^EXPECTED\W+(model/bn1/moving_\w+)\W.*announced TFM303"
    assert re.findall(rows, result.stdout, re.M) == [
        "model/bn1/moving_mean", "model/bn1/moving_variance"
    ]  # fmt: skip
    assert "statistics of the GLOBAL batch" in " ".join(result.stdout.split())  # their reason
    assert len(re.findall(r"^EXPECTED\W+xent/value", result.stdout, re.M)) == 2  # both towers
    assert "replicas hold different values of model/bn1" not in result.stdout  # all-reduced


@pytest.mark.slow
def test_differently_written_program_verifies(cli, tmp_path):
    """The rule's own example: no graph block, reuse=i > 0 inside the tower, default init.
    Verified with its loss from tf.losses (no scope=): the legacy tensor is
    `tower_1/model/mean_squared_error/value`, and verify compares it."""
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "train.py").write_text(example.LEGACY)
    out = tmp_path / "out"
    assert cli("rewrite", "--out", out, legacy).returncode in (0, 1)
    assert (out / "train.py").read_text() == example.CONVERTED
    mean = "tf.reduce_mean(tf.square(tf.matmul(x, w) - y), name='loss')"
    assert example.LEGACY.count(mean) == 1
    (legacy / "train.py").write_text(
        example.LEGACY.replace(mean, "tf.losses.mean_squared_error(y, tf.matmul(x, w))")
    )
    assert cli("rewrite", "--out", out, "--force", legacy).returncode in (0, 1)
    result = _verify(legacy / "train.py", out / "train.py", steps=4)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^PASS\W+model/mean_squared_error/value \(tower 1\)", result.stdout, re.M)
    assert "UNMATCHED" not in result.stdout


def test_example_is_current():
    """The documented conversion is what the rule writes (regenerate it on purpose)."""
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    assert process_source(example.LEGACY, "train.py", settings).new_code == example.CONVERTED


def test_blocked_fixture_copy_is_byte_identical(cli, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURES / "towers" / "shuffled_dequeue", repo)
    before = {p.name: p.read_bytes() for p in repo.iterdir()}
    cli("rewrite", "--write", "--allow-dirty", "--select", "TFM303", repo)
    assert {p.name: p.read_bytes() for p in repo.iterdir()} == before


def test_addn_towers_shape(cli, tmp_path):
    """A model module of its own (tf.layers), a PS_OPS device function, tf.add_n averaging,
    an EMA grouped with the update in no order, the towers' mean loss and the whole batch's
    accuracy fetched, GPUOptions/ConfigProto, an inline feed_dict, a Saver after the loop."""
    out = tmp_path / "out"
    _rewrite_out(cli, "addn_towers", out)
    code = (out / "train.py").read_text()
    model = (out / "model.py").read_text()
    files = json.loads((out / "tfmigrate.json").read_text())["files"]
    entry = files["train.py"]
    # The model module is converted with the program: its loop over a literal list unrolled
    # into Keras layers named after the legacy scopes ('conv%d' % (k + 1) -> conv1, conv2).
    assert "layers.conv2d(" not in model and "tf_keras" not in model and "for k" not in model
    assert 'self.conv2 = keras.layers.Conv2D(64, 3, padding="same", use_bias=False' in model
    assert "net = self.bn2(net, training=training)" in model
    assert 'build_model = model.Build(10, name="net")' in code
    assert [a["code"] for a in files["model.py"]["applied"]] == ["TFM303"]
    assert "def assign_to_device" not in code and "PS_OPS" not in code  # dead with the towers
    # The EMA runs first, on the weights the step started from; the difference is announced.
    step = code.split("def step_fn", 1)[1]
    assert step.index("ema_op = ema.apply(") < step.index("apply_op = opt.apply_gradients(")
    [ema] = [a for a in entry["announced"] if a["match"] == ["*/ExponentialMovingAverage"]]
    assert "before the update in some steps, after it in others" in ema["reason"]
    # mean_loss / accuracy: reduced with MEAN under the legacy op names.
    assert "accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y)" in code
    assert "outputs['Mean'] = strategy.reduce(tf.distribute.ReduceOp.MEAN, outputs['Mean']" in code
    assert "loss_value = outputs['Mean'].numpy()" in code
    assert "acc = outputs['Mean_1'].numpy()" in code
    # The session config -> tf.config in main(), before the strategy.
    main = code.split("\ndef main(", 1)[1]
    assert main.index("tf.config.set_soft_device_placement(True)") < main.index(
        "MirroredStrategy()"
    )
    assert "set_memory_growth(gpu, True)" in main and "GPUOptions" not in code
    assert "checkpoint.write('/tmp/addn_towers/model.ckpt')" in code
    assert "checkpoint = tf.train.Checkpoint(variables=variables, optimizer=opt)" in code
    assert entry["variables"]["net/conv2/kernel"] == "net/conv2/kernel"
    assert entry["variables"]["net/bn1/moving_variance"] == "net/bn1/moving_variance"
    assert len([k for k in entry["variables"] if "ExponentialMovingAverage" not in k]) == 14


def test_model_module_of_a_blocked_program_stays(cli, tmp_path):
    """A model module is converted with its program or not at all."""
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURES / "addn_towers", repo)
    train = repo / "train.py"
    train.write_text(train.read_text().replace("for i in xrange(args.num_gpus):", "for i in gpus:"))
    scan = cli("scan", "--select", "TFM303", repo)
    # The staged converter converts the program: the model module goes with it.
    assert "train.py:49:5: TFM303 converted to MirroredStrategy" in scan.stdout, scan.stdout
    assert "model.py" in scan.stdout and "with the tower program" in scan.stdout


def test_slim_towers_shape(cli, tmp_path):
    """tf.app.flags + tf.app.run, a slim model package with arg_scope, MaxBytesInUse fetched,
    ConfigProto + allow_growth before the Session, a Saver without `import os`."""
    out = tmp_path / "out"
    _rewrite_out(cli, "slim_towers", out)
    code = (out / "train_clones.py").read_text()
    net = (out / "nets" / "small_net.py").read_text()
    files = json.loads((out / "tfmigrate.json").read_text())["files"]
    entry = files["train_clones.py"]
    # The model module's function is a Keras class the script builds; its arg-scope function
    # (read at the towers' call: is_training=True, the defaults) goes, and tf_slim with it.
    assert "import tf_slim" not in net and "slim." not in net
    assert "def small_net_arg_scope" not in net
    assert 'model = small_net.SmallNet(10, FLAGS.dropout_keep_prob, name="SmallNet")' in code
    assert "logits = model(images, training=True)" in code and "arg_scope" not in code
    # slim's order: conv without bias, its batch norm (the explicit normalizer_params replace
    # the arg_scope's dict whole: default decay 0.999, frozen), then relu.
    assert (
        "        net = self.conv1(images)\n"
        "        net = self.conv1_BatchNorm(net, training=training)\n"
        "        net = tf.nn.relu(net)\n"
    ) in net
    assert "unbiased_ranks=(2, 4), frozen=True, momentum=0.999, epsilon=0.001" in net
    assert "self.conv2_2 = keras.layers.Conv2D(\n            64, [3, 3]" in net  # slim.repeat
    assert "keras.layers.Dropout(1 - dropout_keep_prob" in net
    assert "net = tf.reduce_mean(net, [1, 2], name='global_pool')" in net
    assert entry["variables"]["SmallNet/conv2/conv2_2/BatchNorm/moving_mean"] == (
        "SmallNet/conv2_2_BatchNorm/moving_mean"
    )
    assert [a["code"] for a in files["nets/small_net.py"]["applied"]] == ["TFM303"]
    # absl flags: parsed by app.run in main.
    assert "tf.app" not in code and "from absl import app, flags\n" in code
    assert "argv" not in code.split("\ndef main(", 1)[1] and "restore_from" not in code
    assert code.rstrip().endswith('if __name__ == "__main__":\n    app.run(main)')
    # MaxBytesInUse: asked of tf.config in the loop (a CPU fallback), not a train_step output.
    assert "peak = memory_bytes('peak')" in code and "get_memory_info(gpus[0].name)[key]" in code
    assert "memory_stats.MaxBytesInUse()" not in code and "peak_bytes" not in code
    assert any("verify does not compare it" in note for note in entry["notes"])
    main = code.split("\ndef main(", 1)[1]
    assert main.index("set_memory_growth(gpu, True)") < main.index("MirroredStrategy()")
    assert "import os\n" in code and "manager.save(checkpoint_number=step)" in code


# Written differently from the fixtures: AUTO_REUSE, a stacked mean of the towers' losses
# fetched, an inline tf.stack/reduce_mean aggregation, config.gpu_options set after the
# ConfigProto, the feed dict passed positionally. (verify: EQUIVALENT, the mean loss compared.)
STACKED_MEAN = "\"\"\"Linear softmax on N GPUs, AUTO_REUSE sharing, the towers' mean loss logged.\"\"\"\n\nimport argparse\n\nimport numpy as np\nimport tensorflow as tf\n\n\ndef tower_loss(x, y):\n    with tf.variable_scope('linear', reuse=tf.AUTO_REUSE):\n        w = tf.get_variable('w', [10, 3], initializer=tf.glorot_uniform_initializer(seed=1))\n        b = tf.get_variable('b', [3], initializer=tf.zeros_initializer())\n    logits = tf.matmul(x, w) + b\n    return tf.losses.sparse_softmax_cross_entropy(labels=y, logits=logits)\n\n\ndef main():\n    parser = argparse.ArgumentParser()\n    parser.add_argument('--gpus', type=int, default=2)\n    parser.add_argument('--steps', type=int, default=50)\n    args = parser.parse_args()\n\n    x = tf.placeholder(tf.float32, [None, 10])\n    y = tf.placeholder(tf.int64, [None])\n    x_parts = tf.split(x, args.gpus)\n    y_parts = tf.split(y, args.gpus)\n    global_step = tf.train.get_or_create_global_step()\n    lr = tf.train.exponential_decay(0.5, global_step, 10, 0.5, staircase=True)\n    opt = tf.train.GradientDescentOptimizer(lr)\n    grads_per_tower, losses = [], []\n    for i in range(args.gpus):\n        with tf.device('/gpu:%d' % i), tf.name_scope('gpu_%d' % i):\n            loss = tower_loss(x_parts[i], y_parts[i])\n            losses.append(loss)\n            grads_per_tower.append(opt.compute_gradients(loss))\n    averaged = []\n    for gv in zip(*grads_per_tower):\n        averaged.append((tf.reduce_mean(tf.stack([g for g, _ in gv]), 0), gv[0][1]))\n    train_op = opt.apply_gradients(averaged, global_step=global_step)\n    mean_loss = tf.reduce_mean(tf.stack(losses))\n\n    config = tf.ConfigProto()\n    config.gpu_options.allow_growth = True\n    with tf.Session(config=config) as sess:\n        sess.run(tf.global_variables_initializer())\n        data = np.random.RandomState(3)\n        for step in range(args.steps):\n            xs = data.rand(8 * args.gpus, 10).astype(np.float32)\n            ys = data.randint(0, 3, 8 * args.gpus)\n            _, l = sess.run([train_op, mean_loss], {x: xs, y: ys})\n            print(step, l)\n\n\nif __name__ == '__main__':\n    main()\n"


def test_differently_written_mean_loss_keeps_its_legacy_name():
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    code = process_source(STACKED_MEAN, "train.py", settings).new_code
    assert code is not None and not TF1_ONLY.findall(code)
    # The aggregation wrote Mean, Mean_1 (one per variable) at the root: the mean loss is Mean_2.
    mean = "outputs['Mean_2'] = strategy.reduce(tf.distribute.ReduceOp.MEAN, outputs["
    assert mean + "'sparse_softmax_cross_entropy_loss/value']" in code
    assert 'for gpu in tf.config.list_physical_devices("GPU"):' in code


def test_clipping_after_the_aggregation_is_applied_to_the_replicas_sum():
    clipped = STACKED_MEAN.replace(
        "    train_op = opt.apply_gradients(averaged, global_step=global_step)\n",
        "    clipped, norm = tf.clip_by_global_norm([g for g, _ in averaged], 1.0)\n"
        "    train_op = opt.apply_gradients(zip(clipped, [v for _, v in averaged]))\n",
    )
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    result = process_source(clipped, "train.py", settings)
    # The clip runs on the all-reduced sum in every replica; each replica applies its share.
    finding = _staged(result)
    code = result.new_code
    assert code is not None and "TFM316" not in finding.message  # type: ignore[attr-defined]
    assert 'all_reduce("SUM", [g for g, _ in averaged])' in code
    assert "g / strategy.num_replicas_in_sync for g in clipped" in code


def _one_tower_logged(fetches: str, scalar: str = "losses[0]") -> str:
    """STACKED_MEAN logging one tower's entry of its per-tower `losses` list, in the fetches
    and in a summary written through merge_all."""
    return (
        STACKED_MEAN.replace(
            "    mean_loss = tf.reduce_mean(tf.stack(losses))\n",
            f"    tf.summary.scalar('first_loss', {scalar})\n    merged = tf.summary.merge_all()\n",
        )
        .replace(
            "        sess.run(tf.global_variables_initializer())\n",
            "        sess.run(tf.global_variables_initializer())\n"
            "        writer = tf.summary.FileWriter('logs', sess.graph)\n",
        )
        .replace(
            "            _, l = sess.run([train_op, mean_loss], {x: xs, y: ys})\n",
            f"            _, first, last, summary = sess.run({fetches}, {{x: xs, y: ys}})\n"
            "            writer.add_summary(summary, step)\n",
        )
        .replace("print(step, l)", "print(step, first, last)")
    )


def test_one_towers_entry_of_a_per_tower_list_is_logged_from_its_replica():
    legacy = _one_tower_logged("[train_op, losses[0], losses[-1], merged]")
    assert legacy != STACKED_MEAN and "mean_loss" not in legacy
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    result = process_source(legacy, "train.py", settings)
    code = result.new_code
    assert code is not None and not TF1_ONLY.findall(code)
    key = "strategy.experimental_local_results(outputs['sparse_softmax_cross_entropy_loss/value'])"
    assert f"first = {key}[0].numpy()\n" in code and f"last = {key}[-1].numpy()\n" in code
    assert f"summary = {{'first_loss': {key}[0]}}" in code
    notes = result.manifest["notes"]
    assert "TFM303: the loop fetched tower 0's `loss` (`losses[0]`); train_step returns it " in (
        "\n".join(notes)
    )
    assert any("the last tower's `loss` (`losses[-1]`)" in n and "(the last)" in n for n in notes)


@pytest.mark.parametrize(
    ("fetches", "scalar", "message"),
    [
        ("[train_op, losses[step % 2], losses[-1], merged]", "losses[0]", "`losses[step % 2]`"),
        # the staged converter reads these in the train step, where the towers filled the list
        ("[train_op, losses[0], losses[-1], merged]", "losses[args.gpus - 1]", STAGED),
        ("[train_op, losses[0], grads_per_tower[0], merged]", "losses[0]", STAGED),
    ],
)
def test_a_per_tower_entry_not_named_by_a_literal_is_refused(fetches, scalar, message):
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    result = process_source(_one_tower_logged(fetches, scalar), "train.py", settings)
    [finding] = [f for f in result.findings if f.code == "TFM303"]
    assert result.new_code is None and message in finding.message


# Written differently again (verify: EQUIVALENT, every value bit-identical over 6 steps with
# `--keep 1.0`): contrib layers, a keep_prob placeholder_with_default fed a flag, the batch size
# computed after the Session opens, `tf.reduce_mean(tower_losses)` logged.
FED_DEFAULT = "\"\"\"Two-layer classifier trained on synthetic data over several GPUs (tower style).\"\"\"\nfrom __future__ import print_function\n\nimport argparse\nimport time\n\nimport numpy as np\nimport tensorflow as tf\n\n\ndef average_gradients(tower_grads):\n    average_grads = []\n    for grad_and_vars in zip(*tower_grads):\n        grads = [tf.expand_dims(g, 0) for g, _ in grad_and_vars]\n        grad = tf.reduce_mean(tf.concat(grads, 0), 0)\n        average_grads.append((grad, grad_and_vars[0][1]))\n    return average_grads\n\n\ndef classifier(x, keep_prob):\n    h = tf.contrib.layers.fully_connected(x, 64, scope='hidden')\n    h = tf.nn.dropout(h, keep_prob)\n    return tf.contrib.layers.fully_connected(h, 5, activation_fn=None, scope='out')\n\n\ndef make_data(n, dim, seed):\n    rng = np.random.RandomState(seed)\n    x = rng.randn(n, dim).astype(np.float32)\n    y = (x[:, :5].argmax(axis=1)).astype(np.int32)\n    return x, y\n\n\ndef main(args):\n    data_x, data_y = make_data(4096, 20, 0)\n    with tf.Graph().as_default(), tf.device('/cpu:0'):\n        x = tf.placeholder(tf.float32, [None, 20], name='x')\n        y = tf.placeholder(tf.int32, [None], name='y')\n        keep_prob = tf.placeholder_with_default(1.0, [])\n        global_step = tf.train.get_or_create_global_step()\n        boundaries = [args.steps // 2]\n        lr = tf.train.piecewise_constant(global_step, boundaries, [args.lr, args.lr * 0.1])\n        opt = tf.train.GradientDescentOptimizer(lr)\n\n        xs = tf.split(x, args.num_gpus)\n        ys = tf.split(y, args.num_gpus)\n        tower_grads, tower_losses = [], []\n        with tf.variable_scope(tf.get_variable_scope()):\n            for i in range(args.num_gpus):\n                with tf.device('/gpu:%d' % i), tf.name_scope('tower_%d' % i):\n                    logits = classifier(xs[i], keep_prob)\n                    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(\n                        labels=ys[i], logits=logits))\n                    tf.get_variable_scope().reuse_variables()\n                    tower_grads.append(opt.compute_gradients(loss))\n                    tower_losses.append(loss)\n        grads = average_gradients(tower_grads)\n        train_op = opt.apply_gradients(grads, global_step=global_step)\n        mean_loss = tf.reduce_mean(tower_losses)\n\n        config = tf.ConfigProto(allow_soft_placement=True)\n        config.gpu_options.allow_growth = True\n        sess = tf.Session(config=config)\n        sess.run(tf.global_variables_initializer())\n        batch = args.batch_size * args.num_gpus\n        start = time.time()\n        for step in range(args.steps):\n            lo = (step * batch) % (len(data_x) - batch)\n            feed = {x: data_x[lo:lo + batch], y: data_y[lo:lo + batch], keep_prob: args.keep}\n            _, l = sess.run([train_op, mean_loss], feed_dict=feed)\n            if step % 10 == 0:\n                print('step %d loss %.4f (%.1f s)' % (step, l, time.time() - start))\n\n\nif __name__ == '__main__':\n    parser = argparse.ArgumentParser()\n    parser.add_argument('--num_gpus', type=int, default=2)\n    parser.add_argument('--batch_size', type=int, default=32)\n    parser.add_argument('--steps', type=int, default=200)\n    parser.add_argument('--lr', type=float, default=0.1)\n    parser.add_argument('--keep', type=float, default=0.5)\n    main(parser.parse_args())\n"


def test_fed_default_session_values_and_a_mean_of_the_list_convert():
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    result = process_source(FED_DEFAULT, "train.py", settings)
    code = result.new_code
    assert code is not None and not TF1_ONLY.findall(code)
    # tf.nn.dropout(h, keep_prob): a Keras Dropout built with the fed value, always active;
    # its random masks are announced, so verify compares the runs only with the dropout off.
    assert "self.dropout = keras.layers.Dropout(1 - keep_prob)" in code
    assert "h = self.dropout(h, training=True)" in code and "TF1Variables" not in code
    assert 'classifier = Classifier(keep_prob, name="classifier")' in code
    announced = {"match": ["*"], "code": "TFM303", "reason": DROPOUT_NOTE}
    assert announced in result.manifest["announced"]
    # the flag fed at every step is what the graph reads; the feed dict is gone from the loop
    assert "keep_prob = args.keep\n" in code and "feed = " not in code
    # plain values made after the Session opens: in the feeding generator and in the loop
    assert code.count("batch = args.batch_size * strategy.num_replicas_in_sync") == 2
    assert code.count("start = time.time()") == 2
    assert (
        "outputs['Mean_4'] = strategy.reduce(tf.distribute.ReduceOp.MEAN, outputs['Mean']" in code
    )


def test_aggregation_inside_apply_gradients_and_an_operator_named_loss_convert():
    # `opt.apply_gradients(average_gradients(tower_grads))` in one statement; the logged tower
    # loss is `... / n`, the op TF1 named `truediv` (verify: EQUIVALENT, the loss compared).
    source = FED_DEFAULT.replace(
        "grads = average_gradients(tower_grads)\n        train_op = opt.apply_gradients(grads,",
        "train_op = opt.apply_gradients(average_gradients(tower_grads),",
    ).replace("labels=ys[i], logits=logits))", "labels=ys[i], logits=logits)) / args.num_gpus")
    assert "= average_gradients(" not in source and "/ args.num_gpus" in source
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    code = process_source(source, "train.py", settings).new_code
    assert code is not None and not TF1_ONLY.findall(code)
    assert "opt.apply_gradients(tower_grads_aggregated, global_step=global_step)" in code
    assert "def average_gradients" not in code
    assert "{'truediv': loss}" in code


def test_a_default_fed_a_changing_value_is_refused():
    changing = FED_DEFAULT.replace("keep_prob: args.keep}", "keep_prob: 1.0 / (step + 1)}")
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    result = process_source(changing, "train.py", settings)
    _staged(result)


def test_device_settings_already_in_tf_config_spelling_move_into_main():
    # `rewrite --select TFM105` first, the whole program later: the tf.config calls TFM105
    # wrote between apply_gradients and the Session run first thing in the migrated main.
    legacy = (_folder("cifar_average") / "train.py").read_text()
    device_rule = rule_by_code("TFM105")
    assert device_rule is not None
    step1 = process_source(legacy, "train.py", Settings(rules=(device_rule,), fix=True))
    assert (
        step1.new_code is not None and "tf.config.set_soft_device_placement(True)" in step1.new_code
    )
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    code = process_source(step1.new_code, "train.py", settings).new_code
    assert code is not None and not TF1_ONLY.findall(code)
    main = code.split("def train(flags):")[1]
    assert main.index("tf.config.set_soft_device_placement(True)") < main.index(
        "MirroredStrategy()"
    )


def test_summary_writer_closed_after_the_loop_stays_closed():
    legacy = (_folder("queue_saver") / "train.py").read_text()
    loop_end = "global_step=step)\n"
    closed = legacy.replace(loop_end, loop_end + "    summary_writer.close()\n", 1)
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    code = process_source(closed, "train.py", settings).new_code
    assert code is not None and not TF1_ONLY.findall(code)
    main = code.split("def train(flags):")[1]
    assert main.index("for step in range(") < main.index("summary_writer.close()")
    other = legacy.replace(loop_end, loop_end + "    saver.close()\n", 1)
    result = process_source(other, "train.py", settings)
    _staged(result)


def test_layers_adam_shape(cli, tmp_path):
    """Written differently from the other fixtures: the first tower's UPDATE_OPS collected after
    the loop by its literal scope name, `tf.add_n(tower_losses) / num_gpus` logged, a Saver that
    only writes once, after the loop, with `global_step=`."""
    out = tmp_path / "out"
    _rewrite_out(cli, "layers_adam", out)
    code = (out / "train.py").read_text()
    entry = json.loads((out / "tfmigrate.json").read_text())["files"]["train.py"]
    assert any("UPDATE_OPS only of the towers selected by `i == 0`" in n for n in entry["notes"])
    # the towers' mean loss keeps its legacy name (the division's op, `truediv`), and so does
    # each tower's tf.losses value it averages
    mean = "outputs['truediv'] = strategy.reduce(tf.distribute.ReduceOp.MEAN, outputs["
    assert mean + "'sparse_softmax_cross_entropy_loss/value']" in code
    assert "checkpoint.write('%s-%d' % ('towers.ckpt', FLAGS.steps))" in code
    assert "CheckpointManager" not in code


def test_update_ops_of_a_scope_no_tower_takes_is_refused_with_the_towers_names():
    legacy = (_folder("layers_adam") / "train.py").read_text()
    wrong = legacy.replace("scope='tower0'", "scope='tower_0'")
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    result = process_source(wrong, "train.py", settings)
    # The staged converter converts it; that the layers now update their statistics (the
    # legacy's collection held no update) is announced in the manifest.
    _staged(result)
    unsafe = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True, unsafe_fixes=True)
    notes = process_source(wrong, "train.py", unsafe).manifest.get("notes", [])
    assert any("UPDATE_OPS" in note for note in notes), notes


def test_tutorial_flags_shape(cli, tmp_path):
    """The TF CIFAR-10 multi-GPU tutorial's layout: tf.app.flags defined in the script and in
    the model module, `main(argv=None)` calling `train()` run by `tf.app.run()`, the gradients
    appended in two statements, a get_variable model module (`_variable_on_cpu` /
    `_variable_with_weight_decay`) whose model reads `FLAGS.batch_size`."""
    out = tmp_path / "out"
    _rewrite_out(cli, "tutorial_flags", out)
    code = (out / "multi_gpu_train.py").read_text()
    model = (out / "model.py").read_text()
    files = json.loads((out / "tfmigrate.json").read_text())["files"]
    # absl's flags in both modules, the same definitions: one registry, the same command line.
    assert "tf.app" not in code + model and "from absl import flags\n" in model
    assert "FLAGS = flags.FLAGS\n" in code and "FLAGS = flags.FLAGS\n" in model
    assert "flags.DEFINE_integer('num_gpus', 2," in code
    assert "flags.DEFINE_integer('batch_size', 8," in model
    # main(argv=None) stays the function app.run runs; it calls the migrated train().
    assert "def main(argv=None):  # pylint: disable=unused-argument\n  train()\n" in code
    assert code.rstrip().endswith('if __name__ == "__main__":\n  app.run(main)')
    assert "make_parser" not in code and "restore_from" not in code
    # The model module's function is the Keras class the script builds; its helpers go.
    assert "class Inference(keras.Model):" in model and "def inference(" not in model
    assert "_variable_on_cpu" not in model and "_variable_with_weight_decay" not in model
    assert "reshape = tf.reshape(pool1, [FLAGS.batch_size, -1])" in model
    assert "def loss(logits, labels):" in model  # still the script's
    # loss() added its cross entropy to 'losses' and returned the unscoped collection's sum,
    # which the towers discarded: it returns what it added; the tower sums its scope's order.
    assert "get_collection" not in model and "add_to_collection" not in model
    assert "  return cross_entropy_mean\n" in model
    assert "_ = model.loss" not in code and "collection('losses'" not in code
    assert 'inference = model.Inference(name="inference")' in code
    assert "def tower_loss(inference, scope, images, labels):" in code
    assert "losses = [*inference.losses, model.loss(logits, labels)]" in code
    notes = files["multi_gpu_train.py"]["notes"]
    assert any("`model.loss` added its value to the `losses` collection" in n for n in notes)
    # The model builds in the first train step, from each replica's own static batch (the
    # reshape reads it): nothing needs its weights before (no checkpoint, no EMA).
    assert "create_variables" not in code and "get_concrete_function" not in code
    assert [a["code"] for a in files["model.py"]["applied"]] == ["TFM303"]
    assert files["multi_gpu_train.py"]["variables"]["local2/weights"] == "inference/local2/weights"


def test_tutorial_loss_used_or_fp16_variables_are_refused_with_their_reason(tmp_path):
    """The tutorial's `loss()` sums the unscoped 'losses' collection: its value is only
    dropped where the towers discarded it. Its `use_fp16` dtype switch has no Keras mapping
    checked: the model stays on tf.compat.v1, saying why and where."""
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)

    def notes(train_edit: tuple[str, str], model_edit: tuple[str, str], name: str) -> str:
        repo = tmp_path / name
        shutil.copytree(_folder("tutorial_flags"), repo)
        model = (repo / "model.py").read_text()
        (repo / "model.py").write_text(model.replace(*model_edit))
        train = (repo / "multi_gpu_train.py").read_text().replace(*train_edit)
        result = process_source(train, str(repo / "multi_gpu_train.py"), settings)
        assert result.new_code is not None and "TF1Variables" in result.new_code
        return "\n".join(result.manifest["notes"])

    used = ("  _ = model.loss(logits, labels)\n", "  print(model.loss(logits, labels))\n")
    assert (
        "not converted to Keras layers: the towers use the value of `model.loss`, the sum of "
        "the unscoped `losses` collection (in tower i>0 every tower's losses so far)"
    ) in notes(used, ("", ""), "used")
    fp16 = (
        "    var = tf.get_variable(name, shape, initializer=initializer, dtype=tf.float32)\n",
        "    dtype = tf.float16 if FLAGS.use_fp16 else tf.float32\n"
        "    var = tf.get_variable(name, shape, initializer=initializer, dtype=dtype)\n",
    )
    assert (
        "a variable dtype chosen at run time (a float16 switch): only float32 variables convert "
        "to Keras weights (model.py, line 45)"
    ) in notes(("", ""), fp16, "fp16")


def test_tutorial_launcher_doing_more_is_refused_with_its_line():
    source = (_folder("tutorial_flags") / "multi_gpu_train.py").read_text()
    busy = source.replace("  train()\n\n\nif __name__", "  print(argv)\n  train()\n\n\nif __name__")
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    result = process_source(busy, "multi_gpu_train.py", settings)
    assert _staged(result).line == 124  # type: ignore[attr-defined]


def _argparse_tutorial(repo: Path, parse_in_main: bool) -> str:
    """The tutorial layout with argparse instead of tf.app.flags: the parser built and parsed
    at module level (or first in the main block, `FLAGS = None` above), no flags in the model
    module (verify: EQUIVALENT, like the tf.app.flags spelling)."""
    shutil.copytree(_folder("tutorial_flags"), repo)
    model = (repo / "model.py").read_text()
    start, end = model.index("FLAGS = tf.app.flags.FLAGS"), model.index("IMAGE_SIZE = 8")
    model = model[:start] + "BATCH_SIZE = 8\n" + model[end:]
    (repo / "model.py").write_text(
        model.replace("FLAGS.data_seed", "7").replace("FLAGS.batch_size", "BATCH_SIZE")
    )
    train = (repo / "multi_gpu_train.py").read_text()
    train = train.replace("import time\n", "import argparse\nimport time\n")
    start, end = train.index("FLAGS = tf.app.flags.FLAGS"), train.index("\n\ndef tower_loss")
    parser = (
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--max_steps', type=int, default=1000)\n"
        "parser.add_argument('--num_gpus', type=int, default=2)\n"
        "parser.add_argument('--batch_size', type=int, default=8)\n"
        "parser.add_argument('--learning_rate', type=float, default=0.1)\n"
        "parser.add_argument('--log_device_placement', action='store_true')\n"
        "FLAGS, unparsed = parser.parse_known_args()\n"
    )
    if parse_in_main:
        train = train[:start] + "FLAGS = None\n" + train[end:]
        main = "".join(f"  {line}\n" for line in parser.splitlines()) + "  main()\n"
        train = train.replace("  tf.app.run()\n", main)
    else:
        train = train[:start] + parser + train[end:]
        train = train.replace("  tf.app.run()\n", "  main()\n")
    (repo / "multi_gpu_train.py").write_text(train)
    return train


def test_module_level_argparse_flags_stay_where_they_were_parsed(cli, tmp_path):
    legacy = _argparse_tutorial(tmp_path / "legacy", parse_in_main=False)
    out = tmp_path / "out"
    assert cli("rewrite", "--out", out, tmp_path / "legacy").returncode in (0, 1)
    code = (out / "multi_gpu_train.py").read_text()
    assert not TF1_ONLY.findall(code) and 'model.Inference(name="inference")' in code
    parsing = legacy[legacy.index("parser = argparse") : legacy.index("\n\ndef tower_loss")]
    assert "\n" + parsing + "\n" in code  # at module level, as the legacy program parsed
    assert "make_parser" not in code and "parse_known_args(argv)" not in code
    assert code.rstrip().endswith("if __name__ == '__main__':\n  main()")
    # The parse in the main block (FLAGS = None above it): it stays there.
    legacy = _argparse_tutorial(tmp_path / "in_main", parse_in_main=True)
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    converted = process_source(legacy, str(tmp_path / "in_main" / "multi_gpu_train.py"), settings)
    assert converted.new_code is not None and "\nFLAGS = None\n" in converted.new_code
    main = legacy[legacy.index("if __name__ == '__main__':") :]
    assert converted.new_code.endswith(main) and "make_parser" not in converted.new_code
    # Used besides building and parsing: refused, saying so.
    used = legacy.replace("  main()\n", "  parser.print_help()\n  main()\n")
    refused = process_source(used, str(tmp_path / "in_main" / "multi_gpu_train.py"), settings)
    _staged(refused)


def _module_level_parser(source: str) -> str:
    """layers_adam with its parser built at module level, after the imports, and parsed in the
    main block: `main(parser.parse_args())` (verify: EQUIVALENT, like the fixture)."""
    main = source.index("if __name__ == '__main__':\n")
    block = source[main:].splitlines()[1:-1]  # the parser's statements, without the call
    parser = "".join(f"{line.strip()}\n" for line in block)
    source = source[:main] + "if __name__ == '__main__':\n    main(parser.parse_args())\n"
    first = source.index("\n\n\ndef ")
    return source[:first] + "\n\n" + parser + source[first:]


def test_module_level_parser_parsed_in_the_main_block_converts():
    path = _folder("layers_adam") / "train.py"
    legacy = _module_level_parser(path.read_text())
    assert "\nparser = argparse.ArgumentParser()\n" in legacy
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    code = process_source(legacy, str(path), settings).new_code
    assert code is not None and not TF1_ONLY.findall(code)
    assert (  # the module-level parser stays where it was, and the main block
        "\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--num_gpus', type=int, default=2)\n"
        "parser.add_argument('--batch_per_gpu', type=int, default=16)\n"
        "parser.add_argument('--steps', type=int, default=100)\n"
        "parser.add_argument('--lr', type=float, default=1e-3)\n"
    ) in code
    assert "make_parser" not in code
    assert code.endswith("\n\nif __name__ == '__main__':\n    main(parser.parse_args())\n")
    assert process_source(code, str(path), settings).new_code is None  # nothing left to do
    # The parser used for anything else, at module level or in the main block: it stays, and
    # that use with it.
    after = "parser.add_argument('--lr', type=float, default=1e-3)\n"
    for used, text in (
        (legacy.replace(after, after + "parser.set_defaults(steps=3)\n"), "parser.set_defaults"),
        (legacy.replace(after, after + "\n\ndef usage():\n    parser.print_help()\n"), "parser.p"),
        (
            legacy.replace("    main(parser", "    parser.print_help()\n    main(parser"),
            "parser.print_help",
        ),
    ):
        kept = process_source(used, str(path), settings).new_code
        assert kept is not None and "def train_step(batch):" in kept and text in kept


def test_launcher_function_parsing_the_flags_is_kept():
    """queue_saver's `def main():` builds the parser and ends `args = parser.parse_args()`,
    `train(args)`: it stays as it was (an entry point may name it). (Verified and run from the
    command line by the slow queue_saver tests.)"""
    path = _folder("queue_saver") / "train.py"
    legacy = path.read_text()
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    code = process_source(legacy, str(path), settings).new_code
    assert code is not None and not TF1_ONLY.findall(code)
    assert "  parser = argparse.ArgumentParser()\n  parser.add_argument('--num_gpus'" in code
    assert code.count("argparse.ArgumentParser()") == 1 and "make_parser" not in code
    launcher = legacy[legacy.index("def main():\n") :]
    assert code.endswith(launcher)  # the launcher and the main block, as they were
    assert process_source(code, str(path), settings).new_code is None  # nothing left to do
    # The main block doing the two-statement parse itself: kept as it is too.
    start = legacy.index("def main():\n")
    body = legacy[legacy.index("  parser = ", start) : legacy.index("\n\n\nif __name__")]
    in_block = legacy[:start].rstrip("\n") + "\n\n\nif __name__ == '__main__':\n" + body + "\n"
    converted = process_source(in_block, str(path), settings).new_code
    assert converted is not None and "def main()" not in converted
    assert converted.endswith("if __name__ == '__main__':\n" + body + "\n")


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "  args = parser.parse_args()\n",
            "  args = parser.parse_args()\n  print(args)\n",
            "`main()`, which the main block calls, does not end with `train(parser.parse_args())`",
        ),
        ("def main():\n", "def main(argv=None):\n", "`main`, which the main block calls to run"),
    ],
)
def test_launcher_doing_more_is_refused_with_its_line(old, new, message):
    path = _folder("queue_saver") / "train.py"
    legacy = path.read_text().replace(old, new)
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    result = process_source(legacy, str(path), settings)
    _staged(result)


def test_plain_arithmetic_between_the_update_and_the_session_converts():
    """`log_every = max(1, flags.max_steps // 20)` after apply_gradients: plain Python, computed
    before the graph and handed to the loop; a value read from the graph stays refused."""
    path = _folder("cifar_average") / "train.py"
    apply = "    train_op = opt.apply_gradients(grads, global_step=global_step)\n"
    legacy = path.read_text().replace("if step % 10 == 0", "if step % log_every == 0")
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    plain = legacy.replace(apply, apply + "    log_every = max(1, flags.max_steps // 20)\n")
    code = process_source(plain, str(path), settings).new_code
    assert code is not None and not TF1_ONLY.findall(code)
    start = code.index("def train(")
    build = code[start : code.index("with strategy.scope():", start)]
    assert "  log_every = max(1, flags.max_steps // 20)\n" in build  # before the graph
    assert "if step % log_every == 0" in code and 'program["' not in code
    graph = legacy.replace(apply, apply + "    log_every = len(tower_grads) * 10\n")
    result = process_source(graph, str(path), settings)
    _staged(result)


def test_a_layer_named_like_a_keras_model_property_gets_its_own_attribute():
    """tf.layers.dense(..., name='output'): `self.output` is keras.Model's read-only property."""
    path = _folder("layers_adam") / "train.py"
    legacy = path.read_text().replace("name='logits')", "name='output')")
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    code = process_source(legacy, str(path), settings).new_code
    assert code is not None
    assert 'self.output_layer = keras.layers.Dense(5, name="output")' in code
    assert "self.output =" not in code and "return self.output_layer(x)" in code


def test_learning_rate_summary_and_a_writer_opened_before_the_initializer_convert():
    """queue_saver with a polynomial-decay learning rate logged as a summary and its FileWriter
    opened before the initializer: the rate is read in the step (before the update, as the
    optimizer reads it) and logged under its tag; the writer becomes a TF2 summary writer.
    (A fresh script in this style verified EQUIVALENT, 4 steps, 2 replicas.)"""
    path = _folder("queue_saver") / "train.py"
    legacy = path.read_text()
    opt = "    opt = tf.train.GradientDescentOptimizer(flags.learning_rate)\n"
    decayed = (
        "    lr = tf.train.polynomial_decay(flags.learning_rate, global_step, flags.max_steps,\n"
        "                                   end_learning_rate=0.01)\n"
        "    opt = tf.train.GradientDescentOptimizer(lr)\n"
    )
    init = "    sess.run(tf.global_variables_initializer())\n"
    writer = "    summary_writer = tf.summary.FileWriter(flags.train_dir, sess.graph)\n"
    legacy = legacy.replace(opt, decayed).replace(writer, "").replace(init, writer + init)
    legacy = legacy.replace(
        "    tf.summary.scalar('cross_entropy', loss)\n",
        "    tf.summary.scalar('cross_entropy', loss)\n    tf.summary.scalar('learning_rate', lr)\n",
    )
    assert legacy.index(writer) < legacy.index(init)
    settings = Settings(rules=(TowerProgramToMirroredStrategy,), fix=True)
    code = process_source(legacy, str(path), settings).new_code
    assert code is not None and not TF1_ONLY.findall(code)
    assert "fetches['lr'] = lr() if callable(lr) else lr\n" in code
    assert "'learning_rate': outputs['lr']" in code
    assert "summary_writer = tf.summary.create_file_writer(flags.train_dir)" in code
    # Anything else before the initializer: still refused, naming its line.
    busy = legacy.replace(writer, writer + "    print(sess.graph)\n")
    result = process_source(busy, str(path), settings)
    _staged(result)
    # The global step fetched next to its own update (read in no fixed order): still refused.
    run = "sess.run([train_op, loss, summary_op])"
    stepped = legacy.replace(run, run.replace("summary_op]", "summary_op, global_step]"))
    stepped = stepped.replace("_, loss_value, summary =", "_, loss_value, summary, at =")
    result = process_source(stepped, str(path), settings)
    _staged(result)
