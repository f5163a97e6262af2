"""`tfmigrate verify --workers W`: the migrated side as MultiWorkerMirroredStrategy worker processes
on loopback, compared with the legacy program run with W towers; processes and ports cleaned up
whatever happens."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from verify_support import FIXTURES, plant

from tfmigrate.verify import compare as cmp
from tfmigrate.verify.record import Fetch, RunRecord, Step
from tfmigrate.verify.workers import WORKERS_JSON, agreement_rows, free_ports, tf_config

LEGACY = FIXTURES / "towers" / "cifar_average" / "train.py"
MULTI_WORKER = "cifar_average_multi_worker"
STEPS = 4
TIMEOUT = 420  # seconds for one CLI run; verify's own --timeout is shorter


def run_verify_cli(*args: str | Path) -> subprocess.CompletedProcess:
    """The real command line in its own process group, killed with everything in it at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfmigrate", "verify", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def started(report: Path) -> dict:
    (path,) = report.glob(f"runs/*/{WORKERS_JSON}")
    return json.loads(path.read_text())


def leftovers(report: Path) -> list[str]:
    """Processes verify started that still run, ports of the cluster still listened on; kills them."""
    found = []
    info = started(report)
    for pid in info["pids"]:
        try:
            os.kill(pid, signal.SIGKILL)
            found.append(f"process {pid}")
        except ProcessLookupError:
            pass
    for port in info["ports"]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                found.append(f"port {port}")
    return found


def verify_workers(
    migrated: Path,
    report: Path,
    cache: Path,
    *extra: str,
    legacy: Path = LEGACY,
    steps: int = STEPS,
) -> subprocess.CompletedProcess:
    """`verify --workers 2` of `migrated` against `legacy`; checks nothing is left running."""
    try:
        return run_verify_cli(
            legacy,
            migrated,
            "--workers",
            "2",
            "--steps",
            str(steps),
            "--timeout",
            "300",
            "--report",
            report,
            "--legacy-cache",
            cache,
            *extra,
        )
    finally:
        if list(report.glob(f"runs/*/{WORKERS_JSON}")):
            assert not leftovers(report), "verify left processes or ports behind"


@pytest.mark.slow
def test_two_workers_verify_against_two_towers(tmp_path, legacy_cache):
    report = tmp_path / "report"
    result = verify_workers(FIXTURES / "migrated" / MULTI_WORKER / "train.py", report, legacy_cache)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "EQUIVALENT" in result.stdout
    data = json.loads((report / "report.json").read_text())
    rows = {row["quantity"]: row for row in data["rows"]}
    # both towers' inputs matched the two workers' (fingerprints), the last tower's loss was compared
    assert rows["total_loss (tower 1)"]["status"] == "pass"
    assert rows["total_loss (tower 1)"]["steps_compared"] == STEPS
    assert rows["conv1/weights"]["status"] == "pass"
    assert rows["worker 1 agrees with the chief"]["status"] == "pass"
    assert data["workers"] == 2 and data["replicas"] == 1
    assert data["sides"]["legacy"]["devices"] == 2 and data["sides"]["migrated"]["devices"] == 2
    assert started(report)["ports"] and len(set(started(report)["ports"])) == 2


@pytest.mark.slow
def test_loss_scaled_by_local_replicas_diverges(tmp_path, legacy_cache):
    # the classic multi-worker bug: dividing by this worker's replicas, not all workers'
    migrated = plant(
        tmp_path,
        MULTI_WORKER,
        "scaled_loss = total_loss / strategy.num_replicas_in_sync",
        "scaled_loss = total_loss / len(strategy.extended.worker_devices)",
    )
    result = verify_workers(migrated, tmp_path / "report", legacy_cache)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "DIVERGED: first divergence at step 1" in result.stdout


@pytest.mark.slow
def test_workers_reading_the_same_slice_are_caught_as_different_inputs(tmp_path, legacy_cache):
    # every worker keeps the first replica's rows: the gathered inputs are not tower 0 + tower 1
    migrated = plant(
        tmp_path, MULTI_WORKER, "first = context.input_pipeline_id * local", "first = 0"
    )
    result = verify_workers(migrated, tmp_path / "report", legacy_cache)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "trained on different inputs at step 1" in result.stdout


@pytest.mark.slow
def test_a_failing_worker_stops_the_cluster_and_is_named(tmp_path, legacy_cache):
    migrated = plant(
        tmp_path,
        MULTI_WORKER,
        "    with strategy.scope():\n",
        "    assert strategy.cluster_resolver.task_id != 1, 'worker 1 lost its data'\n"
        "    with strategy.scope():\n",
    )
    result = verify_workers(migrated, tmp_path / "report", legacy_cache)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "the worker 1 script crashed: AssertionError: worker 1 lost its data" in result.stdout
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    assert "worker 1 lost its data" in data["sides"]["worker 1"]["traceback"]


@pytest.mark.slow
def test_a_strategy_created_after_the_first_op_is_named_as_the_cause(tmp_path, legacy_cache):
    # TensorFlow configures collectives at start-up: a worker that ran an op first cannot join
    migrated = plant(
        tmp_path,
        MULTI_WORKER,
        "    flags = parse_args(argv)\n",
        "    flags = parse_args(argv)\n    tf.constant(0)\n",
    )
    result = verify_workers(migrated, tmp_path / "report", legacy_cache)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Collective ops must be configured at program startup" in result.stdout
    assert "the program ran TensorFlow ops before it created its MultiWorkerMirroredStrategy" in (
        result.stdout
    )
    assert "created no tf.distribute.MultiWorkerMirroredStrategy" not in result.stdout


# -- hand-written programs: each worker runs the main block ------------------------------------

HANDWRITTEN = FIXTURES / "handwritten"
TOWERS_LEGACY = HANDWRITTEN / "get_variable_towers" / "legacy.py"
AS_WRITTEN = HANDWRITTEN / "multi_worker" / "train_tf2.py"
AS_WRITTEN_STEPS = 6  # the steps test_as_written.py runs: the same legacy run, from the cache


def hand_written(tmp_path: Path, old: str, new: str) -> Path:
    text = AS_WRITTEN.read_text()
    assert text.count(old) == 1, old
    out = tmp_path / "train_tf2.py"
    out.write_text(text.replace(old, new))
    return out


@pytest.mark.slow
def test_hand_written_multi_worker_program_verifies_as_written(tmp_path, legacy_cache):
    report = tmp_path / "report"
    result = verify_workers(
        AS_WRITTEN, report, legacy_cache, legacy=TOWERS_LEGACY, steps=AS_WRITTEN_STEPS
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "EQUIVALENT" in result.stdout
    data = json.loads((report / "report.json").read_text())
    rows = {row["quantity"]: row for row in data["rows"]}
    # each worker recorded its own replica's loss; gathered, the chief's record has both towers'
    for tower in (0, 1):
        assert rows[f"loss (tower {tower})"]["status"] == "pass"
        assert rows[f"loss (tower {tower})"]["steps_compared"] == AS_WRITTEN_STEPS
    for name in ("hidden/weights", "hidden/biases", "logits/weights", "logits/biases"):
        assert rows[name]["status"] == "pass"
    assert rows["worker 1 agrees with the chief"]["status"] == "pass"
    assert data["sides"]["migrated"]["devices"] == 2
    assert not any("could not be fingerprinted" in note for note in data["notes"])


@pytest.mark.slow
def test_hand_written_loss_scaled_by_local_replicas_diverges(tmp_path, legacy_cache):
    migrated = hand_written(
        tmp_path,
        "loss = tf.reduce_mean(per_example) / replicas",
        "loss = tf.reduce_mean(per_example) / len(strategy.extended.worker_devices)",
    )
    result = verify_workers(
        migrated, tmp_path / "report", legacy_cache, legacy=TOWERS_LEGACY, steps=AS_WRITTEN_STEPS
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "DIVERGED: first divergence at step 1" in result.stdout


@pytest.mark.slow
def test_a_mirrored_strategy_program_is_not_a_multi_worker_program(tmp_path, legacy_cache):
    mirrored = HANDWRITTEN / "get_variable_towers" / "train_tf2.py"
    result = verify_workers(
        mirrored, tmp_path / "report", legacy_cache, legacy=TOWERS_LEGACY, steps=AS_WRITTEN_STEPS
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "creates a tf.distribute.MirroredStrategy" in result.stdout
    assert "it is not a multi-worker program" in result.stdout


def test_workers_need_one_replica_each_on_cpu(tmp_path):
    result = run_verify_cli(
        LEGACY,
        FIXTURES / "migrated" / MULTI_WORKER / "train.py",
        "--workers",
        "2",
        "--replicas",
        "2",
    )
    assert result.returncode == 2
    assert "--replicas must be 1" in result.stdout


def test_cluster_config_names_every_worker_on_loopback():
    ports = free_ports(3)
    assert len(set(ports)) == 3
    config = json.loads(tf_config(ports, 2))
    assert config["cluster"]["worker"] == [f"127.0.0.1:{p}" for p in ports]
    assert config["task"] == {"type": "worker", "index": 2}


def _side(weights: float, bn: float, loss: float) -> cmp.SideData:
    record = RunRecord(side="migrated", variables={"w": {"trainable": True}, "bn/moving_mean": {}})
    record.steps = [
        Step(step=1, seconds=0.1, fetches=[Fetch("loss[0]", "loss", 0, loss)], inputs=["ab"])
    ]
    final = {"w": np.full(3, weights, np.float32), "bn/moving_mean": np.full(2, bn, np.float32)}
    return cmp.SideData(record, {}, final, {})


def test_agreement_fails_on_a_worker_with_other_weights_and_notes_other_statistics():
    notes: list[str] = []
    chief = _side(1.0, 0.5, 2.0)
    rows = agreement_rows(
        chief,
        {"worker 1": _side(1.0, 0.7, 2.0), "worker 2": _side(1.1, 0.5, 2.0)},
        cmp.Tolerances(),
        notes,
    )
    assert [r.status for r in rows] == [cmp.PASS, cmp.FAIL]
    assert "its w differs from the chief's by 0.1" in rows[1].note
    assert any("worker 1 holds a different bn/moving_mean" in n for n in notes)
    rows = agreement_rows(chief, {"worker 1": _side(1.0, 0.5, 2.5)}, cmp.Tolerances(), [])
    assert rows[0].status == cmp.FAIL and "fetched values differ" in rows[0].note


def test_rewrite_targets_multi_worker_on_request(cli, tmp_path):
    towers = FIXTURES / "towers" / "cifar_average"
    default = cli("rewrite", "--out", tmp_path / "mirrored", towers)
    multi = cli("rewrite", "--strategy", "multi-worker", "--out", tmp_path / "multi", towers)
    # exit 1: findings that stay manual (the tower loop's own notes)
    assert default.returncode == 1 and multi.returncode == 1, multi
    mirrored_text = (tmp_path / "mirrored" / "train.py").read_text()
    text = (tmp_path / "multi" / "train.py").read_text()
    assert "MultiWorkerMirroredStrategy" not in mirrored_text
    assert "strategy = tf.distribute.MultiWorkerMirroredStrategy()" in text
    assert "experimental_distribute_dataset(split_over_workers(dataset))" in text
    notes = json.loads((tmp_path / "multi" / "tfmigrate.json").read_text())["files"]["train.py"]
    assert any("TF_CONFIG" in note for note in notes["notes"])
    bad = cli("rewrite", "--strategy", "parameter-server", towers)
    assert bad.returncode == 2


@pytest.mark.slow
def test_tower_fixture_migrated_for_multi_worker_verifies_with_two_workers(
    cli, tmp_path, legacy_cache
):
    out = tmp_path / "migrated"
    rewrite = cli("rewrite", "--strategy", "multi-worker", "--out", out, LEGACY.parent)
    assert rewrite.returncode == 1 and (out / "train.py").exists(), rewrite
    result = verify_workers(out / "train.py", tmp_path / "report", legacy_cache)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    rows = {row["quantity"]: row for row in data["rows"]}
    assert rows["total_loss (tower 1)"]["status"] == "pass"
    assert rows["worker 1 agrees with the chief"]["status"] == "pass"
    assert all(row["status"] == "pass" for row in data["rows"] if row["category"] == "weight")


@pytest.mark.slow
def test_migrated_program_trains_and_checkpoints_on_a_two_worker_cluster(cli, tmp_path):
    """The converted program's own main(), as on a real cluster: one process per worker with its
    TF_CONFIG; the chief's checkpoint folder gets the checkpoint, the others' temporary ones go."""
    out = tmp_path / "migrated"
    towers = FIXTURES / "towers" / "sum_ema_decay"
    assert cli("rewrite", "--strategy", "multi-worker", "--out", out, towers).returncode == 1
    ports = free_ports(2)
    train_dir = tmp_path / "train_logs"
    procs = []
    try:
        for index in range(2):
            env = {
                **os.environ,
                "TF_CONFIG": tf_config(ports, index),
                "CUDA_VISIBLE_DEVICES": "-1",
                "TF_CPP_MIN_LOG_LEVEL": "2",
            }
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(out / "train.py"),
                        "--max_steps",
                        "3",
                        "--train_dir",
                        str(train_dir),
                    ],
                    cwd=tmp_path,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
            )
        logs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)
    assert (train_dir / "ckpt-3.index").exists(), sorted(p.name for p in train_dir.iterdir())
    assert not list(train_dir.glob("worker_tmp_*")), "a worker left its temporary checkpoint folder"
