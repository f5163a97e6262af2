"""TF1 summaries of a tower program, through the command line: the FileWriter becomes a
tf.summary file writer, the merged scalar summaries the loop wrote every N steps become
`tf.summary.scalar` writes of the train step's values under the writer, with the legacy tags
(the towers' under their name scope), and the converted program writes them to an event file."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import rewritten, run_cli

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "fixtures" / "towers" / "tower_summaries"

# Runs a program on two logical CPU devices (MirroredStrategy then has two replicas), as its
# user would run it on two GPUs.
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


def _source() -> str:
    out, result = rewritten(FIXTURE, "--format", "json")
    assert result.returncode == 1, result
    return (out / "train.py").read_text()


def test_the_writer_and_the_writes_are_tf2_summaries_of_the_step_values():
    source = _source()
    assert "TODO(tfmigrate)" not in source
    tree = ast.parse(source)
    code = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    code |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for legacy in ("FileWriter", "merge_all", "add_summary", "summary_op", "summary_str"):
        assert legacy not in code, legacy
    assert "summary_writer = tf.summary.create_file_writer(args.logdir)" in source
    # the step returns the averaged loss it fetched and every tower's loss
    assert "return (avg_loss, loss_towers)" in source
    assert "loss_towers = strategy.experimental_local_results(outputs)" in source
    assert (
        "loss_value, loss_towers = train_step(features=features_np[lo:lo + batch], "
        "labels=labels_np[lo:lo + batch])" in source
    )
    written = textwrap.dedent(
        """\
        if step % args.summary_every == 0:
            with summary_writer.as_default():
                for i, loss_tower in enumerate(loss_towers):
                    tf.summary.scalar('tower_%d/loss' % i, loss_tower, step=step)
                tf.summary.scalar('avg_loss', loss_value, step=step)
                tf.summary.scalar('learning_rate', lr(), step=step)
                for var_name, var in tf1_variables.by_name.items():
                    if var.trainable:
                        tf.summary.histogram(var_name, var, step=step)
            print('step %d loss %.4f' % (step, loss_value))
        """
    )
    assert textwrap.indent(written, " " * 12) in source
    assert "summary_writer.flush()\n        summary_writer.close()\n" in source
    # no summary is made in the train step any more (TF2 records replica 0's only)
    (step,) = [
        n for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef) and n.name == "train_step"
    ]  # fmt: skip
    assert "tf.summary" not in ast.unparse(step)


def test_the_manifest_says_how_the_summaries_changed():
    out, _ = rewritten(FIXTURE, "--format", "json")
    manifest = (out / "tfmigrate.json").read_text()
    assert "TF2 records summaries in replica 0 only" in manifest
    assert "the summary of the schedule `lr` reads it after the train step" in manifest


def test_a_summary_run_on_its_own_on_another_feed_stays_under_a_todo(tmp_path):
    """An evaluation summary (another batch fed) is no value of the train step: it stays."""
    legacy = (FIXTURE / "train.py").read_text()
    write = "                summary_writer.add_summary(summary_str, step)\n"
    assert write in legacy
    evaluation = (
        "                eval_str = sess.run(summary_op, feed_dict={features: features_np[:batch], "
        "labels: labels_np[:batch]})\n"
        "                summary_writer.add_summary(eval_str, step)\n"
    )
    (tmp_path / "train.py").write_text(legacy.replace(write, write + evaluation))
    out = tmp_path / "out"
    run_cli("rewrite", "--out", out, "--unsafe-fixes", tmp_path / "train.py")
    source = (out / "train.py").read_text()
    assert "# TODO(tfmigrate): TFM310" in source
    assert "#     summary_writer.add_summary(eval_str, step)" in source or (
        "# summary_writer.add_summary(eval_str, step)" in source
    )
    assert "tf.summary.scalar('avg_loss', loss_value, step=step)" in source


@pytest.mark.slow
def test_the_converted_program_writes_the_legacy_tags_to_an_event_file(tmp_path):
    out, _ = rewritten(FIXTURE, "--format", "json")
    logs = tmp_path / "logs"
    run = subprocess.run(
        [sys.executable, "-c", TWO_DEVICES, str(out / "train.py"), "--steps", "12",
         "--logdir", str(logs)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    import tensorflow as tf

    (events,) = logs.glob("events.out.tfevents.*")
    values: dict[tuple[int, str], float] = {}
    histograms: set[tuple[int, str]] = set()
    for event in tf.compat.v1.train.summary_iterator(str(events)):
        for value in event.summary.value:
            written = tf.make_ndarray(value.tensor)
            if written.ndim:  # a histogram: (left edge, right edge, count) per bucket
                histograms.add((event.step, value.tag))
            else:
                values[(event.step, value.tag)] = float(written)
    tags = {"tower_0/loss", "tower_1/loss", "avg_loss", "learning_rate"}
    assert set(values) == {(step, tag) for step in (0, 10) for tag in tags}
    variables = {"hidden/kernel", "hidden/bias", "logits/kernel", "logits/bias"}  # op names
    assert histograms == {(step, tag) for step in (0, 10) for tag in variables}
    for step in (0, 10):
        towers = (values[(step, "tower_0/loss")] + values[(step, "tower_1/loss")]) / 2
        assert values[(step, "avg_loss")] == pytest.approx(towers, rel=1e-6)
        assert values[(step, "learning_rate")] == pytest.approx(0.1)


def test_a_fetched_summary_read_by_more_than_its_write_stays_under_a_todo(tmp_path):
    """The serialized summary is read by other code too: that code needs it, so it stays."""
    legacy = (FIXTURE / "train.py").read_text()
    write = "                summary_writer.add_summary(summary_str, step)\n"
    assert write in legacy
    kept = "                last_summary = summary_str\n"
    (tmp_path / "train.py").write_text(legacy.replace(write, write + kept))
    out = tmp_path / "out"
    run_cli("rewrite", "--out", out, "--unsafe-fixes", tmp_path / "train.py")
    source = (out / "train.py").read_text()
    assert "# TODO(tfmigrate): TFM313" in source
    assert "# summary_op = tf.summary.merge_all()" in source
    assert "tf.summary.scalar(" not in source.replace("# tf.summary.scalar(", "")


def test_summaries_of_a_loop_running_the_update_twice_stay_as_they_were(tmp_path):
    """With two Session.runs of the update there is no one step the write follows: the
    program converts and its summaries stay under their TODO."""
    legacy = (FIXTURE / "train.py").read_text()
    run = "            if step % args.summary_every == 0:\n"
    again = "            sess.run(train_op, feed_dict=feed)\n"
    (tmp_path / "train.py").write_text(legacy.replace(run, again + run))
    out = tmp_path / "out"
    result = run_cli("rewrite", "--out", out, "--unsafe-fixes", tmp_path / "train.py")
    assert result.returncode == 1, result
    source = (out / "train.py").read_text()
    assert "# summary_writer = tf.summary.FileWriter(args.logdir, sess.graph)" in source
    assert "as_default()" not in source
