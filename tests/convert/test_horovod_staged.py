"""The staged conversion of Horovod TF1 programs the whole-program reader refuses (TFM401):
`rewrite --unsafe-fixes` writes one tf.function train step under MultiWorkerMirroredStrategy and
keeps what has no TF2 form under TODO(tfmigrate) markers; the converted fixture trains."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import rewritten, run_cli, write_tree

REPO = Path(__file__).resolve().parents[2]
MODULE_LEVEL = REPO / "fixtures" / "shapes" / "horovod_module_level"
SRC_MODEL = REPO / "fixtures" / "shapes" / "horovod_src_model"
# TF1 names a converted program keeps only under a TODO (the real-world counting rule).
BANNED = {"Session", "MonitoredTrainingSession", "placeholder", "get_collection"}


def _code_names(source: str) -> set[str]:
    """Every name and attribute the code uses (comments, so TODOs, are not code)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
    return found


def _functions(source: str, decorator: str) -> list[ast.FunctionDef]:
    return [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef)
        and any(ast.unparse(d).split("(")[0] == decorator for d in node.decorator_list)
    ]


def _calls(node: ast.AST) -> list[str]:
    return [ast.unparse(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)]


def _conversion(stdout: str) -> str:
    """The message of the applied TFM401 conversion in `rewrite --format json` output."""
    (message,) = [
        f["message"]
        for f in json.loads(stdout)["findings"]
        if f["code"] == "TFM401" and f["applied"]
    ]
    return message


def _assert_tf2_program(source: str) -> ast.FunctionDef:
    """One tf.function train step whose replica function takes a GradientTape and applies the
    gradients; the strategy made; no Horovod, session or placeholder left in code."""
    compile(source, "converted.py", "exec")
    (train_step,) = [f for f in _functions(source, "tf.function") if f.name == "train_step"]
    calls = _calls(train_step)
    assert "tf.GradientTape" in calls and "strategy.run" in calls
    assert any(c.endswith(".apply_gradients") for c in calls)
    assert "tf.distribute.MultiWorkerMirroredStrategy" in _calls(ast.parse(source))
    names = _code_names(source)
    assert not names & BANNED, names & BANNED
    assert "hvd" not in names and "horovod" not in source.split("# TODO")[0]
    return train_step


def test_module_level_script_becomes_one_train_step_with_todos():
    out, result = rewritten(MODULE_LEVEL, "--unsafe-fixes", "--format", "json")
    message = _conversion(result.stdout)
    assert "converted to a MultiWorkerMirroredStrategy program" in message
    assert "1 TODO(tfmigrate) marker(s) (TFM313)" in message
    source = (out / "train_hvd.py").read_text()
    train_step = _assert_tf2_program(source)
    # the placeholders' dtypes and shapes: the train step's input signature
    assert (
        "@tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32), "
        "tf.TensorSpec([None], tf.int64)])" in source
    )
    # Averaged like hvd.DistributedOptimizer: the replica's loss over all replicas.
    assert "replica_loss = loss / strategy.num_replicas_in_sync" in ast.unparse(train_step)
    # the fetched accuracy is computed in the replica and returned with the logged tensors
    assert "return (accuracy, {'step': global_step, 'loss': loss})" in ast.unparse(train_step)
    # the hooks: StopAtStepHook bounds the loop, LoggingTensorHook prints, the broadcast goes
    assert "while global_step.numpy() < args.steps // strategy.num_replicas_in_sync:" in source
    assert "accuracy_value, logged_tensors = train_step(features=x, labels=y)" in source
    assert "BroadcastGlobalVariablesHook" not in source
    # rank 0's checkpoint directory: the chief's CheckpointManager
    assert (
        "checkpoint_dir = args.checkpoint_dir if (strategy.cluster_resolver.task_id or 0) == 0"
        in source
    )
    assert "tf.train.CheckpointManager(checkpoint, checkpoint_dir, max_to_keep=5)" in source
    # the summary has no TF2 place here: commented out under its TODO
    assert "# TODO(tfmigrate): TFM313" in source and "# tf.summary.scalar('loss', loss)" in source
    # the GPU pinning went, the memory setting moved to tf.config
    assert "visible_device_list" not in source
    assert "tf.config.experimental.set_memory_growth(gpu, True)" in source
    notes = json.loads((out / "tfmigrate.json").read_text())
    text = json.dumps(notes)
    assert "the GPU pinning with hvd.local_rank() went" in text


def test_a_program_on_the_compat_v1_alias_gets_tf2_with_its_tf1_code_on_compat_v1():
    out, result = rewritten(REPO / "fixtures" / "shapes" / "horovod_monitored", "--unsafe-fixes")
    source = (out / "train_hvd.py").read_text()
    _assert_tf2_program(source)
    assert "import tensorflow as tf\n" in source and "tensorflow.compat.v1 as" not in source
    assert "opt = tf.compat.v1.train.MomentumOptimizer(" in source
    # Horovod is used in another function too (the data's seed): the strategy is module-level
    tree = ast.parse(source)
    assert [ast.unparse(s) for s in tree.body if isinstance(s, ast.Assign)][:1] == [
        "strategy = tf.distribute.MultiWorkerMirroredStrategy()"
    ]
    assert "rng = np.random.RandomState(strategy.cluster_resolver.task_id or 0)" in source


def test_monitored_session_made_by_assignment_and_closed(tmp_path):
    text = (MODULE_LEVEL / "train_hvd.py").read_text()
    opened = (
        "with tf.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir, hooks=hooks,\n"
        "                                       config=config) as sess:\n"
    )
    assert opened in text
    body = text.split(opened)[1].split("print(")[0]
    text = text.replace(
        opened + body,
        "sess = tf.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir, hooks=hooks)\n"
        + "".join(line[4:] + "\n" for line in body.splitlines())
        + "sess.close()\n",
    )
    repo = write_tree(tmp_path / "repo", {"train_hvd.py": text})
    run_cli("rewrite", "--unsafe-fixes", "--out", tmp_path / "out", repo)
    source = (tmp_path / "out" / "train_hvd.py").read_text()
    _assert_tf2_program(source)
    code = ast.unparse(ast.parse(source))
    # the session's place: the chief's CheckpointManager; its close: the last save
    assert code.index("checkpoint_manager = None") < code.index("while global_step.numpy()")
    assert code.rstrip().splitlines()[-3:-1] == [
        "if checkpoint_manager is not None:",
        "    checkpoint_manager.save(checkpoint_number=global_step)",
    ]


# A gpt-2-style program: hvd.init() at module level, the graph in a `with tf.Session()` block of
# a function called through an entry the old reader does not take, a Saver restored and saved
# by a nested function, a second graph (sampling) fed the same placeholder.
SESSION_SCRIPT = """
import sys

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

hvd.init()


def network(tokens):
    embedded = tf.layers.dense(tf.one_hot(tokens, 16), 8, name='embed')
    return tf.layers.dense(embedded, 16, name='out')


def run(steps=3, save_dir='ckpt'):
    config = tf.ConfigProto()
    config.gpu_options.visible_device_list = str(hvd.local_rank())
    with tf.Session(config=config) as sess:
        tokens = tf.placeholder(tf.int32, [None, 4])
        logits = network(tokens)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tokens, logits=logits))
        sampled = tf.argmax(logits, -1)
        train_vars = [v for v in tf.trainable_variables() if 'out' in v.name]
        opt = hvd.DistributedOptimizer(tf.train.GradientDescentOptimizer(0.1))
        train_op = opt.minimize(loss, var_list=train_vars)
        bcast = hvd.broadcast_global_variables(0)
        saver = tf.train.Saver(var_list=train_vars)
        sess.run(tf.global_variables_initializer())
        bcast.run()

        def save(step):
            saver.save(sess, save_dir + '/model', global_step=step)

        def sample():
            return sess.run(sampled, feed_dict={tokens: np.zeros([1, 4], np.int32)})

        for step in range(steps):
            batch = np.random.randint(0, 16, [2, 4])
            _, value = sess.run((train_op, loss), feed_dict={tokens: batch})
            if hvd.rank() == 0:
                print(step, value)
                save(step)


if __name__ == '__main__':
    run(int(sys.argv[1]), sys.argv[2])
"""


def test_session_function_with_module_level_init_and_a_saver(tmp_path):
    repo = write_tree(tmp_path / "repo", {"train.py": SESSION_SCRIPT})
    result = run_cli(
        "rewrite", "--unsafe-fixes", "--format", "json", "--out", tmp_path / "out", repo
    )
    assert "converted to a MultiWorkerMirroredStrategy program" in _conversion(result.stdout)
    source = (tmp_path / "out" / "train.py").read_text()
    train_step = _assert_tf2_program(source)
    step = ast.unparse(train_step)
    # the var_list is read in the replica, after the forward pass made the variables
    assert "train_vars = [v for v in tf1_variables.trainable_variables if 'out' in v.name]" in step
    assert "variables = train_vars" in step
    # the optimizer unwrapped, the strategy where hvd.init() was (module level)
    assert "opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)" in source
    tree = ast.parse(source)
    assert any(
        isinstance(s, ast.Assign)
        and ast.unparse(s.value) == "tf.distribute.MultiWorkerMirroredStrategy()"
        for s in tree.body
    )
    # the run: `_` dropped from the target
    assert "value = train_step(tokens=batch)" in source
    assert "if (strategy.cluster_resolver.task_id or 0) == 0:" in source
    # Saver -> Checkpoint, save(sess, ...) -> write(...)
    assert "saver = tf.train.Checkpoint(model=tf1_variables, optimizer=opt)" in source
    assert "saver.write('{}-{}'.format(save_dir + '/model', step))" in ast.unparse(tree)
    # the sampling graph, fed the per-step placeholder by its own run: a tf.function of it that
    # repeats the forward pass it needs; the run a call of it
    (sampled,) = [f for f in _functions(source, "tf.function") if f.name == "sampled"]
    assert ast.unparse(sampled).splitlines()[1:] == [
        "def sampled(tokens):",
        "    with tf1_variables.scope():",
        "        logits = network(tokens)",
        "        return tf.argmax(logits, -1)",
    ]
    assert "return sampled(tokens=np.zeros([1, 4], np.int32)).numpy()" in source
    assert "TODO(tfmigrate)" not in source
    assert "bcast" not in _code_names(source)


PAIRS_SCRIPT = """
import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd


def main():
    hvd.init()
    with tf.Graph().as_default(), tf.device('/gpu:%d' % hvd.local_rank()):
        x = tf.placeholder(tf.float32, [None, 4])
        y = tf.placeholder(tf.float32, [None, 1])
        loss = tf.reduce_mean(tf.square(tf.layers.dense(x, 1, name='out') - y))
        opt = hvd.DistributedOptimizer(tf.train.MomentumOptimizer(0.01 * hvd.size(), 0.9))
        grads_and_vars = opt.compute_gradients(loss)
        clipped = [(tf.clip_by_norm(g, 1.0), v) for g, v in grads_and_vars]
        train_op = opt.apply_gradients(clipped)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            sess.run(hvd.broadcast_global_variables(0))
            for step in range(5):
                _, value = sess.run([train_op, loss], {x: np.ones([2, 4]), y: np.ones([2, 1])})


if __name__ == '__main__':
    main()
"""


def test_compute_and_apply_gradients_with_clipping_between_in_a_graph_block(tmp_path):
    repo = write_tree(tmp_path / "repo", {"train.py": PAIRS_SCRIPT})
    result = run_cli(
        "rewrite", "--unsafe-fixes", "--format", "json", "--out", tmp_path / "out", repo
    )
    assert "(TFM316)" in _conversion(result.stdout)
    source = (tmp_path / "out" / "train.py").read_text()
    step = ast.unparse(_assert_tf2_program(source))
    assert "grads_and_vars = list(zip(tape.gradient(replica_loss, variables), variables))" in step
    # the clipping ran on Horovod's averaged gradients: now per replica, marked
    assert "clipped = [(tf.clip_by_norm(g, 1.0), v)" in step
    assert "v) for g, v in grads_and_vars]  # TODO(tfmigrate): TFM316" in source
    assert "opt.apply_gradients(clipped)" in step and "train_op" not in step  # run by the call
    assert "value = train_step(x=np.ones([2, 4]), y=np.ones([2, 1])).numpy()" in source
    # TF2 runs eagerly: the graph block goes, and the device Horovod pinned per process
    assert not {"Graph", "as_default", "device"} & _code_names(source)


SUMMARY_SCRIPT = """
import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd


def main():
    hvd.init()
    x = tf.placeholder(tf.float32, [None, 4])
    loss = tf.reduce_mean(tf.square(tf.layers.dense(x, 1, name='out')))
    tf.summary.scalar('loss', loss)
    merged = tf.summary.merge_all()
    global_step = tf.train.get_or_create_global_step()
    opt = hvd.DistributedOptimizer(tf.train.AdamOptimizer(0.01))
    train_op = opt.minimize(loss, global_step=global_step)
    saver = tf.train.Saver()
    with tf.Session() as sess:
        writer = tf.summary.FileWriter('logs', sess.graph)
        sess.run(tf.global_variables_initializer())
        for step in range(3):
            _, summary, value = sess.run([train_op, merged, loss], {x: np.ones([2, 4])})
            writer.add_summary(summary, step)
            saver.save(sess, 'ckpt/model', global_step=global_step)


if __name__ == '__main__':
    main()
"""


def test_fetched_summaries_go_under_todos_and_the_saver_names_files_by_step(tmp_path):
    repo = write_tree(tmp_path / "repo", {"train.py": SUMMARY_SCRIPT})
    run_cli("rewrite", "--unsafe-fixes", "--out", tmp_path / "out", repo)
    source = (tmp_path / "out" / "train.py").read_text()
    step = ast.unparse(_assert_tf2_program(source))
    assert "return (None, loss)" in step  # the summary's place in the fetches
    assert (
        "summary, value = train_step(x=np.ones([2, 4]))  # TODO(tfmigrate): TFM314 fetched "
        "`merged`, left under a TODO above: None now" in source
    )
    assert "# merged = tf.summary.merge_all()" in source
    assert "# writer.add_summary(summary, step)" in source
    assert "saver.write(\"{}-{}\".format('ckpt/model', global_step.numpy()))" in source


def test_a_script_of_no_known_shape_is_left_with_the_reason(tmp_path):
    script = """
    import tensorflow as tf
    import horovod.tensorflow as hvd

    def train(loss):
        hvd.init()
        opt = hvd.DistributedOptimizer(tf.train.AdamOptimizer(0.001))
        train_op = opt.minimize(loss)
        return train_op
    """
    repo = write_tree(tmp_path / "repo", {"train.py": script})
    result = run_cli("scan", repo)
    assert "the script is not converted" in result.stdout
    assert (
        "staged converter: no Session.run of the Horovod update where it is built" in result.stdout
    )


@pytest.mark.slow
def test_converted_module_level_script_trains_and_resumes_from_its_checkpoint(tmp_path):
    out, _ = rewritten(MODULE_LEVEL, "--unsafe-fixes", "--format", "json")
    script = out / "train_hvd.py"
    proc = _run(script, tmp_path, "--steps", "2", "--checkpoint_dir", "ckpt")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # LoggingTensorHook's print of the first step, then the script's own last line
    assert "step = 1, loss = " in proc.stdout, proc.stdout
    assert "rank 0 done, last accuracy" in proc.stdout
    assert (tmp_path / "ckpt" / "ckpt-2.index").exists()
    # The chief's CheckpointManager restores: a longer run goes on from step 2.
    proc = _run(script, tmp_path, "--steps", "3", "--checkpoint_dir", "ckpt")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step = 3, loss = " in proc.stdout, proc.stdout
    assert (tmp_path / "ckpt" / "ckpt-3.index").exists()


@pytest.mark.slow
def test_converted_session_function_trains_and_writes_checkpoints(tmp_path):
    repo = write_tree(tmp_path / "repo", {"train.py": SESSION_SCRIPT})
    run_cli("rewrite", "--unsafe-fixes", "--out", tmp_path / "out", repo)
    proc = _run(tmp_path / "out" / "train.py", tmp_path, "2", str(tmp_path / "ckpt"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir())[:1] == [
        "model-0.data-00000-of-00001"
    ]


SAMPLED_GRAPH = REPO / "fixtures" / "shapes" / "horovod_sampled_graph"


def test_graph_run_apart_from_the_step_becomes_a_function_and_nccl_built_the_cuda_build():
    out, result = rewritten(SAMPLED_GRAPH, "--unsafe-fixes", "--format", "json")
    message = _conversion(result.stdout)
    assert "converted to a MultiWorkerMirroredStrategy program" in message
    source = (out / "train.py").read_text()
    _assert_tf2_program(source)
    assert "TODO(tfmigrate)" not in source
    # the sampling graph: a tf.function of the placeholder its run fed, with the placeholder's
    # dtype and shape; the model code it calls shares the train step's variables by name
    assert (
        "@tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])\n"
        "    def sampled(tokens):\n"
        "        with tf1_variables.scope():\n"
        "            return sample_next(tokens, temperature=0.7)\n"
    ) in source
    assert "next_tokens = sampled(tokens=prompts).numpy()" in source
    # made before the train step, as the graph was: the def is where the tensor was made
    assert source.index("def sampled(") < source.index("def train_step(")
    # Horovod's build queries: how TensorFlow was built
    assert (
        "lr_scaler = len(strategy.extended.worker_devices) if tf.test.is_built_with_cuda() else 1"
        in source
    )
    notes = json.dumps(json.loads((out / "tfmigrate.json").read_text()))
    assert "hvd.nccl_built() (how Horovod was built) became how TensorFlow was built" in notes
    assert "`sampled`, which the session ran apart from the train step" in notes
    # the model module's collection nothing in the program reads: the add (and the `if` that only
    # guarded it) went, a comment in its place
    model = (out / "model.py").read_text()
    assert "TODO(tfmigrate)" not in model and "add_to_collection" not in model
    assert (
        "            hidden = tf1_core_layers.dense(hidden, 32, activation=tf.nn.relu, "
        "name='hidden%d' % layer)\n"
        "            # TF1 added `hidden` to the graph collection 'activations' here (when "
        "`layer == 0`);\n"
        "            # nothing in the program reads it, and TF2 has no graph collections.\n"
        "        return tf1_core_layers.dense(hidden, VOCAB, name='logits')\n"
    ) in model


def test_a_collection_the_program_reads_stays_with_its_todo(tmp_path):
    files = {p.name: p.read_text() for p in SAMPLED_GRAPH.glob("*.py")}
    files["train.py"] = files["train.py"].replace(
        "    sampled = sample_next(tokens, temperature=0.7)\n",
        "    sampled = sample_next(tokens, temperature=0.7)\n"
        "    activations = tf.get_collection('activations')\n",
    )
    repo = write_tree(tmp_path / "repo", files)
    run_cli("rewrite", "--unsafe-fixes", "--out", tmp_path / "out", repo)
    model = (tmp_path / "out" / "model.py").read_text()
    assert "if layer == 0:" in model
    (line,) = [line for line in model.splitlines() if "add_to_collection" in line]
    assert "# TODO(tfmigrate): TFM317 a graph collection" in line


def test_a_graph_read_by_anything_but_its_own_runs_stays_under_its_todo(tmp_path):
    text = (SAMPLED_GRAPH / "train.py").read_text()
    # the sampled tokens are also printed as a tensor: that read has no function form
    text = text.replace(
        "    sampled = sample_next(tokens, temperature=0.7)\n",
        "    sampled = sample_next(tokens, temperature=0.7)\n    print(sampled)\n",
    )
    repo = write_tree(tmp_path / "repo", {"train.py": text})
    run_cli("rewrite", "--unsafe-fixes", "--out", tmp_path / "out", repo)
    source = (tmp_path / "out" / "train.py").read_text()
    assert "# TODO(tfmigrate): TFM310 a graph of the per-step inputs" in source
    assert "# sampled = sample_next(tokens, temperature=0.7)" in source
    assert "def sampled(" not in source


@pytest.mark.slow
def test_converted_sampled_graph_samples_from_the_trained_variables(tmp_path):
    out, _ = rewritten(SAMPLED_GRAPH, "--unsafe-fixes")
    proc = _run(
        out / "train.py", tmp_path, "--steps", "160", "--batch-size", "16", "--sample-every", "50"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["0", "50", "100", "150"]
    # the model learned to count: the sampling function reads the trained variables
    pairs = [pair.split(">") for pair in lines[-1].split("last>next ")[1].split()]
    assert len(pairs) == 2
    assert all((int(last) + 1) % 12 == int(following) for last, following in pairs), lines


def _run(script: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A converted program run as its user would, one worker (no TF_CONFIG), CPU only."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_main_block_that_parses_the_flags_into_a_name_first_is_converted(tmp_path):
    from tfmigrate.rules import _horovod_program_example as example

    main = (
        "if __name__ == '__main__':\n"
        "    import signal\n"
        "    signal.signal(signal.SIGINT, lambda x, y: sys.exit(0))\n"
        "    parser = argparse.ArgumentParser()\n"
        "    hps = parser.parse_args()  # so a typo is an error\n"
        "    train(hps)\n"
    )
    legacy = (
        example.LEGACY.split("if __name__")[0].replace(
            "import argparse\n", "import argparse\nimport sys\n"
        )
        + main
    )
    repo = write_tree(tmp_path / "repo", {"train.py": legacy})
    result = run_cli(
        "rewrite", "--unsafe-fixes", "--format", "json", "--out", tmp_path / "out", repo
    )
    assert "converted the training function `train`" in _conversion(result.stdout)
    source = (tmp_path / "out" / "train.py").read_text()
    assert source.rstrip().endswith(main.rstrip())  # the main block is kept as written
    assert "tf.distribute.MultiWorkerMirroredStrategy" in source


# A glow-style program: hvd.init() in the entry, the step built by a repo module it imports
# (placeholders fed per step, gradients with tf.gradients or a drop-in chosen by a flag, a
# hand-written Adam chosen from a dict by a flag), the update's allreduce in a helper module.
UPDATE_MODULE = REPO / "fixtures" / "towers" / "horovod_update_module"


def test_step_built_in_another_module_converts_every_module_of_the_program():
    out, result = rewritten(UPDATE_MODULE, "--unsafe-fixes", "--format", "json")
    applied = {
        f["path"].rsplit("/", 1)[-1]: f["message"]
        for f in json.loads(result.stdout)["findings"]
        if f["code"] == "TFM401" and f.get("applied")
    }
    assert set(applied) == {"train.py", "model.py", "tfops.py"}
    assert (
        "whose train step (a tf.function, GradientTape replica) is built in `model.py`"
        in (applied["train.py"])
    )
    # the entry: the strategy made first and set as the program's; no session, no Horovod
    entry = (out / "train.py").read_text()
    assert (
        "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
        "tf.distribute.experimental_set_strategy(strategy)\n" in entry
    )
    assert "m = model.model(None, hps, train_iterator)" in entry
    assert "    tensorflow_session()\n" in entry  # its tf.config settings still run
    assert "tf.config.experimental.set_memory_growth(gpu, True)" in entry
    assert not _code_names(entry) & (BANNED | {"hvd", "ConfigProto"})
    # the step module: one train step, the gradients from the tape, the program's own update
    step_module = (out / "model.py").read_text()
    train_step = _assert_tf2_program_of_another_entry(step_module)
    step = ast.unparse(train_step)
    assert "all_params = list(tf1_variables.trainable_variables)" in step
    assert "gs = tape.gradient(loss, all_params)" in step
    assert (
        "with update_state.scope():\n            optimizer(all_params, gs, alpha=lr, hps=hps)"
        in (step)
    )
    assert "num_replicas_in_sync" not in step  # the update averages the gradients itself
    assert "gs = tape.gradient(loss, all_params)  # TODO(tfmigrate): TFM317" in step_module
    assert "strategy = tf.distribute.get_strategy()" in step_module
    assert "return train_step(x=_x, y=_y, lr=_lr).numpy()" in step_module
    # the helpers: Horovod's private allreduce -> the replica context's, hvd.size() the strategy's
    helpers = (out / "tfops.py").read_text()
    assert (
        "return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, x)"
        in helpers
    )
    assert "x = allreduce_sum(x) / tf.distribute.get_strategy().num_replicas_in_sync" in helpers
    assert "hvd" not in _code_names(helpers) and "horovod" not in helpers
    # the update module calls no Horovod: left as it was
    assert (out / "optim.py").read_text() == (UPDATE_MODULE / "optim.py").read_text()


def _assert_tf2_program_of_another_entry(source: str) -> ast.FunctionDef:
    """As _assert_tf2_program, for a module whose entry makes the strategy: the train step
    calls the program's own update (no apply_gradients)."""
    compile(source, "converted.py", "exec")
    (train_step,) = [f for f in _functions(source, "tf.function") if f.name == "train_step"]
    calls = _calls(train_step)
    assert "tf.GradientTape" in calls and "strategy.run" in calls
    assert not _code_names(source) & (BANNED | {"hvd"})
    return train_step


def test_a_helper_module_other_scripts_import_names_them(tmp_path):
    files = {p.name: p.read_text() for p in UPDATE_MODULE.glob("*.py")}
    files["sample.py"] = "import tfops\n\nprint(tfops.allreduce_mean)\n"
    repo = write_tree(tmp_path / "repo", files)
    result = run_cli("rewrite", "--format", "json", repo)  # without --unsafe-fixes
    (message,) = [
        f["message"]
        for f in json.loads(result.stdout)["findings"]
        if f["path"].endswith("tfops.py") and "Horovod helpers" in f["message"]
    ]
    assert "other scripts import this module too (sample.py)" in message
    result = run_cli("rewrite", "--format", "json", "--out", tmp_path / "out", repo)
    assert (tmp_path / "out" / "tfops.py").read_text() == files["tfops.py"]  # unsafe: not applied


@pytest.mark.slow
def test_converted_program_with_the_step_in_another_module_trains(tmp_path):
    out, _ = rewritten(UPDATE_MODULE, "--unsafe-fixes")
    proc = _run(out / "train.py", tmp_path, "--epochs", "2", "--train_its", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if " loss " in line]
    assert [line.split()[:2] for line in lines] == [["1", "48"], ["2", "96"]], proc.stdout
    assert "Finished!" in proc.stdout


def test_the_model_module_under_src_is_converted_with_the_program():
    """A Horovod script run with `PYTHONPATH=src` imports `model` from src/: the module is
    converted with the program (its get_variable calls on tf.compat.v1 under the program's
    variable scope, TF2 shapes' ints, and a class of its own for tf.contrib's HParams)."""
    out, result = rewritten(SRC_MODEL, "--unsafe-fixes", "--format", "json")
    assert "converted to a MultiWorkerMirroredStrategy program" in _conversion(result.stdout)
    [module] = [
        f["message"]
        for f in json.loads(result.stdout)["findings"]
        if f["code"] == "TFM303" and f["path"].endswith("src/model.py") and f["applied"]
    ]
    assert module.startswith("converted with the tower program `../train.py`"), module
    source = (out / "src" / "model.py").read_text()
    assert "contrib" not in source.split('"""', 2)[2].split("class HParams")[0]
    assert "\nclass HParams:\n" in source and "def override_from_dict(self, values_dict):" in source
    assert "n_in = x.shape[-1]\n" in source and ".value" not in source
    assert "tf.compat.v1.get_variable('wte'" in source and "tf.get_variable(" not in source
    _assert_tf2_program((out / "train.py").read_text())


@pytest.mark.slow
def test_the_converted_program_trains_with_its_converted_model_module(tmp_path):
    out, _ = rewritten(SRC_MODEL, "--unsafe-fixes", "--format", "json")
    (tmp_path / "hparams.json").write_text('{"n_vocab": 20}')
    env = {**os.environ, "PYTHONPATH": str(out / "src")}
    env.pop("TF_CONFIG", None)
    env.update(CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, str(out / "train.py"), "12", "hparams.json"],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [float(v) for v in re.findall(r"^\[\d+\] loss=(\S+)$", proc.stdout, re.M)]
    # a counting sequence: twelve steps learn much of it
    assert len(losses) == 12 and losses[-1] < losses[0] - 0.3, proc.stdout
