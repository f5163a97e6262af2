"""``verify --workers W``: the migrated side as W MultiWorkerMirroredStrategy workers (no TensorFlow).

Each worker is its own process (``migrated_boot --strategy multi-worker``) with a ``TF_CONFIG``
naming all W workers on loopback ports picked free just before the start. The legacy side runs
as usual, with as many towers as the workers have replicas in all. Every process gets its own
process group, and every group is killed when the run ends, however it ends: a worker that fails
leaves the others blocked in a collective, so its failure ends the workers at once (one that could
not run, rather than crash, gives the others ``FAILED_GRACE_SECONDS`` to end by themselves; the
legacy side finishes its run, so the report names the worker's problem); once one worker has finished
well, the others get ``GRACE_SECONDS`` to finish too.

A worker runs the program as written (multi_worker_runtime.WorkerAsWritten). The workers gather every replica's fetches and inputs (multi_worker_runtime.py), so each record
describes the whole cluster; the chief's is compared with the legacy run, and every other worker's
must agree with the chief's (``agreement_rows``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfmigrate.verify import compare as cmp
from tfmigrate.verify.as_written import SOURCE_TARGET as DIFFERENTIATED
from tfmigrate.verify.record import CRASHED, INIT_NPZ, OK, RECORD_JSON, RunRecord, write_json_atomic
from tfmigrate.verify.sides import (
    LEGACY_ENV,
    MIGRATED_ENV,
    RunPlan,
    SideRun,
    _env,
    _finish,
    _start,
    side_commands,
)

LOOPBACK = "127.0.0.1"
GRACE_SECONDS = 30.0  # after one worker finished well, for the others to finish too
FAILED_GRACE_SECONDS = 5.0  # after one worker could not run, for the others to end by themselves
WORKERS_JSON = "workers.json"  # in the run's scratch folder: the ports and process ids used


def free_ports(count: int) -> list[int]:
    """Ports the kernel reports free on loopback (all held open together, so they are distinct)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tf_config(ports: list[int], index: int) -> str:
    cluster = {"worker": [f"{LOOPBACK}:{port}" for port in ports]}
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})


def worker_side(index: int) -> str:
    return "migrated" if index == 0 else f"worker {index}"


@dataclass
class WorkerRuns:
    legacy: SideRun
    workers: list[SideRun]  # the chief (worker 0, side "migrated") first
    ports: list[int]


def _finished_ok(out: Path) -> bool:
    return (out / RECORD_JSON).exists() and RunRecord.load(out).status == OK


def kill_group(proc: subprocess.Popen) -> None:
    """Kill the process and everything it started (its own process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_worker_sides(plan: RunPlan) -> WorkerRuns:
    work = plan.workdir
    cmds = side_commands(plan)
    ports = free_ports(plan.workers)
    legacy_proc = None
    if plan.legacy_done is None:
        legacy_proc = _start(
            cmds.legacy + cmds.tail,
            work / "legacy" / "cwd",
            _env(LEGACY_ENV, plan.seed, plan.device),
            work / "legacy" / "log",
            new_session=True,
        )
    workers = []
    for index in range(plan.workers):
        folder = work / f"worker-{index}"
        (folder / "out").mkdir(parents=True, exist_ok=True)
        cmd = list(cmds.migrated)
        cmd[cmd.index("--out") + 1] = str(folder / "out")
        env = _env(MIGRATED_ENV, plan.seed, plan.device, drop=("TF_USE_LEGACY_KERAS",))
        env["TF_CONFIG"] = tf_config(ports, index)
        if plan.device == "gpu":  # this worker's own GPUs
            env["CUDA_VISIBLE_DEVICES"] = ",".join(
                str(g) for g in range(index * plan.replicas, (index + 1) * plan.replicas)
            )
        workers.append(
            _start(
                cmd + ["--strategy", "multi-worker", *cmds.tail],
                folder / "cwd",
                env,
                folder / "log",
                new_session=True,
            )
        )
    procs = [p for p in (legacy_proc, *workers) if p is not None]
    # what was started, for whoever checks that it is all gone afterwards
    write_json_atomic(work / WORKERS_JSON, {"ports": ports, "pids": [p.pid for p in procs]})
    deadline = time.monotonic() + plan.timeout
    first_end: float | None = None
    timed_out: set[int] = set()
    try:
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if now > deadline or (first_end is not None and now > first_end + GRACE_SECONDS):
                timed_out = {p.pid for p in procs if p.poll() is None and now > deadline}
                break
            if (
                legacy_proc is not None
                and legacy_proc.poll() is not None
                and not (cmds.legacy_out / INIT_NPZ).exists()
            ):
                break  # the workers would wait forever for the initial variables
            ended = [i for i, w in enumerate(workers) if w.poll() is not None]
            failed = [i for i in ended if not _finished_ok(work / f"worker-{i}" / "out")]
            if failed:
                # a worker failed: the others would wait for it in a collective. One that could
                # not run (not crashed in user code) is usually not alone: the others get a moment
                # to say so too. The legacy side finishes its run: the report names the problem.
                if not _crashed(work / f"worker-{failed[0]}" / "out"):
                    for w in workers:
                        _wait_until(w, min(deadline, time.monotonic() + FAILED_GRACE_SECONDS))
                for w in workers:
                    kill_group(w)
                _wait_until(legacy_proc, deadline)
                break
            if first_end is None and ended:
                first_end = now
            time.sleep(0.05)
    finally:
        for p in procs:
            kill_group(p)
    if legacy_proc is None:
        legacy = SideRun(
            "legacy", cmds.legacy_out, 0, "", "", False, RunRecord.load(cmds.legacy_out)
        )
    else:
        legacy = _finish(
            "legacy",
            legacy_proc,
            cmds.legacy_out,
            work / "legacy" / "log",
            legacy_proc.pid in timed_out,
        )
    runs = [
        _finish(
            worker_side(i),
            p,
            work / f"worker-{i}" / "out",
            work / f"worker-{i}" / "log",
            p.pid in timed_out,
        )
        for i, p in enumerate(workers)
    ]
    return WorkerRuns(legacy, runs, ports)


def _crashed(out: Path) -> bool:
    return (out / RECORD_JSON).exists() and RunRecord.load(out).status == CRASHED


def _wait_until(proc: subprocess.Popen | None, deadline: float) -> None:
    if proc is not None:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            pass


def agreement_rows(
    chief: cmp.SideData, others: dict[str, cmp.SideData], tol: cmp.Tolerances, notes: list[str]
) -> list[cmp.Row]:
    """Every worker must have trained exactly what the chief trained: same inputs, fetches, weights.

    Non-trainable variables (batch-norm statistics) may drift apart per replica, as under
    MirroredStrategy; how far is a note.
    """
    rows = []
    trainable = {n for n, meta in chief.record.variables.items() if meta.get("trainable")}
    for side, data in others.items():
        row = cmp.Row(
            f"{side} agrees with the chief",
            "workers",
            "chief",
            side,
            cmp.PASS,
            steps_compared=min(len(chief.record.steps), len(data.record.steps)),
            max_abs=0.0,
            phase=cmp.FINAL_PHASE,
            tolerance=tol.array_text(),
        )
        problems = []
        if [s.inputs for s in chief.record.steps] != [s.inputs for s in data.record.steps]:
            problems.append("its input fingerprints differ")
        fetches, theirs = _fetch_values(chief.record), _fetch_values(data.record)
        if not fetches.keys() <= theirs.keys() or any(
            not tol.scalar_ok(step, fetches[step, name], theirs[step, name])
            for step, name in fetches
        ):
            problems.append("its fetched values differ")
        for name, mine in chief.final.items():
            other = data.final.get(name)
            if other is None or other.shape != mine.shape:
                problems.append(f"{name} is missing or has another shape")
                continue
            diff = float(np.max(np.abs(mine.astype(np.float64) - other))) if mine.size else 0.0
            if name in trainable:
                row.max_abs = max(row.max_abs or 0.0, diff)
                if not tol.array_ok(mine, other):
                    problems.append(f"its {name} differs from the chief's by {diff:.3g}")
            elif diff > 0:
                notes.append(
                    f"{side} holds a different {name} than the chief (max |diff| {diff:.3g}); the "
                    "chief's is what a checkpoint keeps"
                )
        if problems:
            row.status, row.note = cmp.FAIL, "; ".join(problems[:3])
        rows.append(row)
    return rows


def _fetch_values(record: RunRecord) -> dict[tuple[int, str], float]:
    """Each step's fetched values as the worker recorded them. The chief's record has been
    compared with the legacy run by then: a loss its step differentiates (a program run as
    written) may carry the legacy name and scale (loss_scaling.py), so such values are keyed by
    replica and order and divided back by their scale."""
    values = {}
    for step in record.steps:
        order: dict[int | None, int] = {}
        for f in step.fetches:
            if f.source == DIFFERENTIATED:
                index = order[f.tower] = order.get(f.tower, -1) + 1
                key = f"{DIFFERENTIATED} {index} [{f.tower}]"
            else:
                key = f.name
            values[step.step, key] = f.value / f.scale
    return values


def add_agreement(result: cmp.Comparison, rows: list[cmp.Row]) -> None:
    result.rows.extend(rows)
    failing = [r for r in rows if r.status == cmp.FAIL]
    if failing and result.verdict in (cmp.EQUIVALENT, cmp.ANNOUNCED):
        result.verdict = cmp.DIVERGED
        result.first_divergence = {
            "step": None,
            "quantity": failing[0].quantity,
            "phase": "final values",
        }
        result.reason = f"the workers disagree: {failing[0].migrated}: {failing[0].note}"
