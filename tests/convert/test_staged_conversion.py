"""TFM303's staged conversion of tower programs the whole-program reader refuses, through the
command line: `rewrite` turns each fixture into one tf.function train step with GradientTape
replicas (its golden files: tests/test_goldens.py), leaves what has no TF2 form under
TODO(tfmigrate) markers, applies a conversion that comments code out only with --unsafe-fixes,
is a no-op on its own output, and the converted program trains like the legacy one."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import legacy_cache_dir, rewritten, run_cli

REPO = Path(__file__).resolve().parents[2]
TOWERS = REPO / "fixtures" / "towers"
STAGED = "converted to MirroredStrategy (a tf.function train step, GradientTape replicas)"
# TF1 names a converted program may keep only under a TODO (comments are not in the AST).
BANNED = {"Session", "placeholder", "get_collection", "ConfigProto", "Saver", "FileWriter"}
# The protocol of the old whole-program path: a staged conversion runs as written.
PROTOCOL = {"tfmigrate_program", "build_program"}


# fixture -> (rewrite flags, TODO codes in the output, statements commented out)
FIXTURES: dict[str, tuple[tuple[str, ...], list[str], int]] = {
    "clipped_average": ((), [], 0),
    "colocated_loss": ((), [], 0),
    "fed_learning_rate": ((), [], 0),
    "finetune_head": ((), [], 0),
    "gradient_helper": ((), [], 0),
    "hand_written_adam": ((), [], 0),
    "model_object": ((), [], 0),
    "monitored_session": ((), [], 0),
    "module_script": (("--unsafe-fixes",), [], 0),
    # the evaluation closure runs the session: under its TODO, commented out
    "per_gpu_closures": (("--unsafe-fixes",), ["TFM310", "TFM314", "TFM314"], 3),
    "summed_reuse_flag": ((), [], 0),
    "tower_summaries": ((), [], 0),
    "trainer_class": ((), [], 0),
}


def _conversion(stdout: str) -> dict:
    """The TFM303 finding of `rewrite --format json` output on the program (not a module it
    imports)."""
    (finding,) = [
        f
        for f in json.loads(stdout)["findings"]
        if f["code"] == "TFM303" and f["path"].endswith("train.py")
    ]
    return finding


def _code_names(tree: ast.AST) -> set[str]:
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return names | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def _calls(tree: ast.AST) -> list[str]:
    return [ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)]


def _tf_functions(tree: ast.AST) -> list[ast.FunctionDef]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef)
        and any(ast.unparse(d).split("(")[0] == "tf.function" for d in n.decorator_list)
    ]


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_the_old_reader_refuses_it_and_the_staged_path_converts_it(name):
    flags, codes, commented = FIXTURES[name]
    out, result = rewritten(TOWERS / name, *flags, "--format", "json")
    assert result.returncode == 1, result  # files changed
    finding = _conversion(result.stdout)
    assert finding["applied"], finding
    assert finding["message"].startswith(STAGED), finding["message"]
    if commented:
        assert f"{commented} statement(s) commented out" in finding["message"]
        assert f"{len(codes)} TODO(tfmigrate) marker(s)" in finding["message"]
    else:
        assert "TODO" not in finding["message"] and "commented out" not in finding["message"]
    source = (out / "train.py").read_text()
    markers = re.findall(r"# TODO\(tfmigrate\): (TFM3\d\d)", source)
    assert sorted(markers) == codes


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_the_output_is_an_idiomatic_tf2_program(name):
    out, _ = rewritten(TOWERS / name, *FIXTURES[name][0], "--format", "json")
    source = (out / "train.py").read_text()
    compile(source, "train.py", "exec")
    tree = ast.parse(source)
    (train_step,) = _tf_functions(tree)
    step_calls = _calls(train_step)
    # the tape in the replicas, or in the function a tower calls that takes its gradients
    called = {c.split(".")[-1] for c in step_calls}
    taped = step_calls + [
        c
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef) and n.name in called
        for c in _calls(n)
    ]
    assert "tf.GradientTape" in taped and "strategy.run" in step_calls
    # the optimizer's update in the replicas, or the program's own update function after them
    assert any(c.endswith(".apply_gradients") for c in step_calls) or (
        "strategy.reduce" in step_calls and "update_state.scope" in step_calls
    )
    assert "tf.distribute.MirroredStrategy" in _calls(tree)
    names = _code_names(tree)
    assert not names & BANNED, names & BANNED
    assert not names & PROTOCOL and "def tfmigrate_program" not in source
    # the session's step run became a call of the train step (on the object, for a class)
    assert {"train_step", "self.train_step", "model.train_step"} & set(_calls(tree))


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_a_second_rewrite_changes_nothing(name):
    out, _ = rewritten(TOWERS / name, *FIXTURES[name][0], "--format", "json")
    again = run_cli("rewrite", "--check", "--unsafe-fixes", "--format", "json", out / "train.py")
    assert again.returncode == 0, again
    plan = json.loads(again.stdout)
    assert plan["changed"] == 0 and not any(f["applied"] for f in plan["files"]), plan["files"]


def test_without_unsafe_fixes_a_conversion_that_comments_code_out_is_not_applied(tmp_path):
    # module_script with a statement that has no TF2 form (it goes under a TODO, commented out)
    folder = tmp_path / "legacy"
    folder.mkdir()
    legacy = (TOWERS / "module_script" / "train.py").read_text()
    saver = "  saver = tf.train.Saver()\n"
    assert saver in legacy
    graph = "  graph_def = tf.get_default_graph().as_graph_def()\n"
    (folder / "train.py").write_text(legacy.replace(saver, saver + graph))
    check = run_cli("rewrite", "--check", "--format", "json", folder)
    assert check.returncode == 0, check  # nothing --write would apply
    assert json.loads(check.stdout)["changed"] == 0
    finding = _conversion(check.stdout)
    assert finding["fix_safety"] == "unsafe" and not finding["applied"], finding
    assert finding["message"].startswith(STAGED)
    unsafe = run_cli("rewrite", "--check", "--unsafe-fixes", "--format", "json", folder)
    assert unsafe.returncode == 1 and json.loads(unsafe.stdout)["changed"] == 1, unsafe
    # and the written tree keeps the program as it was
    out = tmp_path / "out"
    run_cli("rewrite", "--out", out, folder)
    written = out / "train.py"
    assert not written.exists() or written.read_bytes() == (folder / "train.py").read_bytes()


def test_a_conversion_that_comments_nothing_out_is_a_safe_fix():
    folder = TOWERS / "summed_reuse_flag"
    check = run_cli("rewrite", "--check", "--format", "json", folder)
    assert check.returncode == 1 and json.loads(check.stdout)["changed"] == 1, check
    finding = _conversion(check.stdout)
    assert finding["fix_safety"] == "safe" and finding["applied"], finding


# fixture -> (legacy loss rows compared, weights compared): module_script fetches both towers'
# losses, summed_reuse_flag and hand_written_adam the last tower's, colocated_loss the towers'
# combined loss, trainer_class, gradient_helper and model_object the towers' mean (one reduced row
# each, below)
COMPARED = {
    "clipped_average": (1, 4),
    "colocated_loss": (1, 4),
    "fed_learning_rate": (1, 4),
    "finetune_head": (1, 4),
    "gradient_helper": (1, 3),
    "hand_written_adam": (1, 3),
    "model_object": (1, 4),
    "monitored_session": (1, 4),
    "module_script": (2, 6),
    "per_gpu_closures": (1, 4),
    "summed_reuse_flag": (1, 4),
    "tower_summaries": (1, 4),
    "trainer_class": (1, 4),
}
# fixture -> reduced (not per-tower) loss rows among them
REDUCED = {
    "colocated_loss": 1, "fed_learning_rate": 1, "gradient_helper": 1, "model_object": 1,
    "monitored_session": 1,
    "tower_summaries": 1, "trainer_class": 1,
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_the_converted_program_verifies_equivalent(name):
    out, _ = rewritten(TOWERS / name, *FIXTURES[name][0], "--format", "json")
    result = subprocess.run(
        [sys.executable, "-m", "tfmigrate", "verify", str(TOWERS / name / "train.py"),
         str(out / "train.py"), "--replicas", "2", "--steps", "3",
         "--legacy-cache", str(legacy_cache_dir())],
        capture_output=True, text=True, timeout=600,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.rstrip().endswith("EQUIVALENT"), result.stdout
    assert not re.findall(r"^(?:FAIL|DIVERGED)", result.stdout, re.M), result.stdout
    losses, weights = COMPARED[name]
    # a row within the legacy program's own drift under other kernel settings is compared and
    # equivalent (WITHIN-NOISE): seen on finetune_head (two Adam optimizers, epsilon 1e-8),
    # whose re-runs pass exactly
    compared = r"^(?:PASS|WITHIN-NOISE)\W+"
    rows = re.findall(
        compared + r"(\S+) \((?:tower [01]|reduced)\)\W+(?:loss|fetch)\W+3\W",
        result.stdout,
        re.M,
    )
    assert len(rows) == losses, result.stdout
    assert len(re.findall(compared + r"\S+\W+weight\W+3\W", result.stdout, re.M)) == weights
    if name in REDUCED:
        reduced = re.findall(r"^PASS\W+\S+ \(reduced\)\W+(?:loss|fetch)\W+3\W", result.stdout, re.M)
        assert len(reduced) == REDUCED[name], result.stdout


def test_gradients_clipped_after_the_combination_are_clipped_once_on_the_sum():
    """`clip_by_global_norm` of the averaged gradients sees the replicas' all-reduced sum (their
    losses scaled), and the update gets each replica's share of the clipped result: the clip of
    the combination, not of each replica's gradients (its verify run above checks the values)."""
    out, _ = rewritten(TOWERS / "clipped_average", "--format", "json")
    source = (out / "train.py").read_text()
    (train_step,) = _tf_functions(ast.parse(source))
    (replica,) = [n for n in ast.walk(train_step) if isinstance(n, ast.FunctionDef)
                  and n.name == "replica_step"]  # fmt: skip
    lines = [ast.unparse(s) for s in replica.body]
    reduce_at = next(k for k, s in enumerate(lines) if "all_reduce('SUM'" in s)
    clip_at = next(
        k for k, s in enumerate(lines) if "tf.clip_by_global_norm(grads, CLIP_NORM)" in s
    )
    update = next(s for s in lines if ".apply_gradients(" in s)
    assert reduce_at < clip_at < lines.index(update)
    assert "zip([g / strategy.num_replicas_in_sync for g in clipped], variables)" in update
    assert "TODO(tfmigrate)" not in source


def test_a_fetched_value_of_the_clipping_is_returned_by_the_replicas(tmp_path):
    folder = tmp_path / "clipped_average"
    shutil.copytree(TOWERS / "clipped_average", folder)
    train = folder / "train.py"
    text = train.read_text().replace("clipped, _ = tf", "clipped, norm = tf")
    text = text.replace(
        "_, loss_value = sess.run([train_op, loss]",
        "_, loss_value, n = sess.run([train_op, loss, norm]",
    )
    train.write_text(text)
    run_cli("rewrite", "--out", tmp_path / "out", folder)
    source = (tmp_path / "out" / "train.py").read_text()
    assert "norm = strategy.experimental_local_results(outputs[1])[0]" in source
    assert "return (loss, norm)" in source and "TODO(tfmigrate)" not in source


def test_a_monitored_session_loop_runs_to_its_stop_hook_last_step(tmp_path):
    """`while not sess.should_stop()` under a MonitoredTrainingSession whose StopAtStepHook has a
    last step: the loop runs while the global step is below it; what else the session did
    (checkpoint_dir, other hooks) stays as a TODO on the loop's first line."""
    out, result = rewritten(TOWERS / "monitored_session", "--format", "json")
    assert _conversion(result.stdout)["applied"]
    source = (out / "train.py").read_text()
    assert "    while global_step < 50:\n" in source
    code = source.split('"""', 2)[2]  # after the module docstring
    assert "should_stop" not in code and "StopAtStepHook" not in code
    folder = tmp_path / "monitored_session"
    shutil.copytree(TOWERS / "monitored_session", folder)
    train = folder / "train.py"
    text = train.read_text().replace(
        "MonitoredTrainingSession(hooks=hooks)",
        "MonitoredTrainingSession(hooks=hooks, checkpoint_dir='ckpt')",
    )
    train.write_text(text.replace("StopAtStepHook(last_step=50)", "StopAtStepHook(num_steps=50)"))
    run_cli("rewrite", "--out", tmp_path / "out", folder)
    source = (tmp_path / "out" / "train.py").read_text()
    assert (
        "    while True:  # TODO(tfmigrate): TFM310 the monitored session's hooks ended" in source
    )
    assert (
        "# TODO(tfmigrate): TFM310 the monitored session's tf.train.StopAtStepHook(num_steps=50), "
        "checkpoint_dir='ckpt': no TF2 form here"
    ) in source


def test_variables_picked_with_set_algebra_are_keyed_on_their_refs():
    """TF2 variables are unhashable: the two optimizers' variable lists are made from sets of
    `v.ref()` (TFM116), in the replica, before the tape's gradients read them."""
    out, _ = rewritten(TOWERS / "finetune_head", "--format", "json")
    source = (out / "train.py").read_text()
    assert "set(" not in source.split('"""', 2)[2]
    assert (
        "varlist1 = [ref.deref() for ref in {v.ref() for v in list(weights.values()) + "
        "list(biases.values())} - {v.ref() for v in varlist2}]\n" in source
    )
    assert "grads1 = list(zip(tape.gradient(replica_loss, varlist1), varlist1))" in source


@pytest.mark.slow
def test_the_converted_saver_writes_a_checkpoint(tmp_path):
    out, _ = rewritten(TOWERS / "module_script", "--unsafe-fixes", "--format", "json")
    run = subprocess.run(
        [sys.executable, str(out / "train.py"), "--epochs", "1", "--save_every", "4",
         "--logdir", str(tmp_path / "logs")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "logs" / "model.ckpt-4.index").exists()


def test_tf_app_flags_of_a_converted_program_stay_tf1_flags_on_compat_v1(tmp_path):
    """TF 2 has no tf.app: the program's flags are tf.compat.v1.flags, absl's registry behind
    TF1's wrapper, which parses the command line when a flag is read before app.run."""
    legacy = (TOWERS / "module_script" / "train.py").read_text()
    flagged = (
        legacy.replace(
            "import tensorflow as tf\n",
            "import tensorflow as tf\n\ntf.app.flags.DEFINE_integer('num_gpus', 2, 'towers')\n"
            "FLAGS = tf.app.flags.FLAGS\n",
        )
        .replace("  parser.add_argument('--num_gpus', type=int, default=2)\n", "")
        .replace("args.num_gpus", "FLAGS.num_gpus")
    )
    assert flagged.count("FLAGS.num_gpus") >= 2
    (tmp_path / "legacy").mkdir()
    (tmp_path / "legacy" / "train.py").write_text(flagged)
    out, result = rewritten(tmp_path / "legacy", "--unsafe-fixes", "--format", "json")
    assert _conversion(result.stdout)["message"].startswith(STAGED)
    source = (out / "train.py").read_text()
    compile(source, "train.py", "exec")
    assert "tf.compat.v1.flags.DEFINE_integer('num_gpus', 2, 'towers')" in source
    assert "FLAGS = tf.compat.v1.flags.FLAGS" in source and "tf.app" not in source
    # read at import time, as TF1 allowed (absl's own FLAGS would refuse before parsing)
    probe = "import tensorflow as tf\nFLAGS = tf.compat.v1.flags.FLAGS\n"
    probe += "tf.compat.v1.flags.DEFINE_integer('num_gpus', 2, 'towers')\nprint(FLAGS.num_gpus)\n"
    (tmp_path / "probe.py").write_text(probe)
    run = subprocess.run(
        [sys.executable, str(tmp_path / "probe.py"), "--num_gpus", "3"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.stdout.strip() == "3", run.stderr[-2000:]


def test_a_hand_written_update_is_called_with_the_replicas_mean_after_them():
    out, _ = rewritten(TOWERS / "hand_written_adam", "--format", "json")
    tree = ast.parse((out / "train.py").read_text())
    (train_step,) = _tf_functions(tree)
    (replica_step,) = [n for n in ast.walk(train_step) if isinstance(n, ast.FunctionDef)
                       and n.name == "replica_step"]  # fmt: skip
    # the replicas only differentiate (their losses unscaled: the mean is taken after them)
    assert "adam" not in _calls(replica_step) and "strategy.reduce" not in _calls(replica_step)
    assert "strategy.num_replicas_in_sync" not in ast.unparse(replica_step)
    reduce = [n for n in ast.walk(train_step) if isinstance(n, ast.Call)
              and ast.unparse(n.func) == "strategy.reduce"]  # fmt: skip
    assert [ast.unparse(n.args[0]) for n in reduce] == ["'MEAN'"]
    # the user's function, kept, called once per step in cross-replica context
    assert _calls(train_step).count("adam") == 1
    opt = (out / "opt.py").read_text()
    assert "def adam(" in opt and "tf.compat.v1.assign_sub(" in opt
    assert "tf.assign(" not in opt


def test_a_hand_written_update_reading_a_tower_value_is_refused_with_the_reason(tmp_path):
    folder = tmp_path / "hand_written_adam"
    shutil.copytree(TOWERS / "hand_written_adam", folder)
    train = folder / "train.py"
    # the learning rate scaled by the last tower's loss: a value of one replica now
    text = train.read_text().replace("adam(params, grads, LR)", "adam(params, grads, LR * loss)")
    train.write_text(text)
    result = run_cli("scan", "--format", "json", train)
    files = json.loads(result.stdout)["files"]
    (finding,) = [f for file in files for f in file["findings"] if f["code"] == "TFM303"]
    assert "the hand-written update reads `loss`, a value each tower computes" in finding["message"]
    assert finding["message"].startswith("not converted")


def test_a_learning_rate_placeholder_fed_key_by_key_becomes_a_variable_the_step_assigns():
    """fed_learning_rate: the optimizer comes from the program's own factory, which reads a
    learning-rate placeholder; the feed dict is built key by key before the step run. The
    placeholder becomes a variable the train step assigns, the keys become its arguments."""
    out, result = rewritten(TOWERS / "fed_learning_rate", "--format", "json")
    assert _conversion(result.stdout)["applied"]
    source = (out / "train.py").read_text()
    assert (
        "learning_rate_pl = tf.Variable(tf.constant(0, tf.float32), trainable=False, "
        "name='learning_rate')" in source
    )
    assert "optimizer = set_optimizer(args.optimizer, learning_rate_pl)" in source
    assert "def train_step(learning_rate_pl_value, inputs_pl, targets_pl):" in source
    assert "learning_rate_pl.assign(learning_rate_pl_value)" in source
    assert (
        # a tensor, not the Python float: a new learning rate must not trace the step again
        "loss_train = train_step("
        "learning_rate_pl_value=tf.constant(learning_rate, learning_rate_pl.dtype), "
        "inputs_pl=data_inputs[lo:lo + batch], targets_pl=data_targets[lo:lo + batch])"
    ) in source
    assert "feed_dict_train" not in source
    # the session's read of the global step reads the variable
    assert "start_step = global_step.numpy()" in source
    # the towers' lists are made in the step: each trace fills its own
    made = source.index("total_grads_and_vars, total_losses = [], []")
    assert source.index("def train_step(") < made < source.index("def replica_step(")


def test_memory_growth_of_a_module_level_session_moves_before_the_strategy_once(tmp_path):
    """module_script with a ConfigProto asking for GPU memory growth: its TF2 loop over the GPUs
    moves before the strategy as one statement (its body is not moved again after it, where
    `gpu` is unbound on a machine without GPUs)."""
    legacy = (TOWERS / "module_script" / "train.py").read_text()
    configured = legacy.replace(
        "  with tf.Session() as sess:\n",
        "  config = tf.ConfigProto(allow_soft_placement=True)\n"
        "  config.gpu_options.allow_growth = True\n"
        "  with tf.Session(config=config) as sess:\n",
    )
    assert configured != legacy
    (tmp_path / "legacy").mkdir()
    (tmp_path / "legacy" / "train.py").write_text(configured)
    out, result = rewritten(tmp_path / "legacy", "--unsafe-fixes", "--format", "json")
    assert _conversion(result.stdout)["message"].startswith(STAGED)
    source = (out / "train.py").read_text()
    tree = ast.parse(source)
    growth = [c for c in _calls(tree) if c == "tf.config.experimental.set_memory_growth"]
    assert len(growth) == 1, source
    loops = [
        n for n in tree.body if isinstance(n, ast.For) and "list_physical_devices" in ast.unparse(n)
    ]
    assert len(loops) == 1, source
    strategy = next(
        i for i, n in enumerate(tree.body) if "tf.distribute.MirroredStrategy()" in ast.unparse(n)
    )
    assert tree.body.index(loops[0]) < strategy


def test_a_device_setting_that_reads_the_main_blocks_flags_stays_after_them(tmp_path):
    # module_script's session with a ConfigProto whose device logging is a flag of the main
    # block: the memory and placement settings go before the strategy, the flag's stays after
    # the flags are parsed (the legacy read them there; device logging can be set any time)
    legacy = (TOWERS / "module_script" / "train.py").read_text()
    flag = "  args = parser.parse_args()\n"
    session = "  with tf.Session() as sess:\n"
    assert flag in legacy and session in legacy
    legacy = legacy.replace(
        flag, "  parser.add_argument('--log_devices', action='store_true')\n" + flag
    ).replace(
        session,
        "  config = tf.ConfigProto(allow_soft_placement=True,\n"
        "                          log_device_placement=args.log_devices)\n"
        "  config.gpu_options.allow_growth = True\n"
        "  with tf.Session(config=config) as sess:\n",
    )
    folder = tmp_path / "legacy"
    folder.mkdir()
    (folder / "train.py").write_text(legacy)
    run_cli("rewrite", "--unsafe-fixes", "--out", tmp_path / "out", folder)
    source = (tmp_path / "out" / "train.py").read_text()
    compile(source, "train.py", "exec")
    strategy = source.index("strategy = tf.distribute.MirroredStrategy()")
    assert source.index("tf.config.set_soft_device_placement(True)") < strategy
    assert source.index("tf.config.experimental.set_memory_growth(gpu, True)") < strategy
    logging = source.index("tf.debugging.set_log_device_placement(args.log_devices)")
    assert logging > source.index("args = parser.parse_args()") > strategy
    assert "TODO(tfmigrate): TFM318" not in source
    ruff = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F821", "-"],
        input=source,
        capture_output=True,
        text=True,
    )
    assert ruff.returncode == 0, ruff.stdout
