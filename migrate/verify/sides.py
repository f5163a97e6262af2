"""Run the two sides as subprocesses, concurrently, each in its own scratch folder (no TensorFlow).

The migrated side starts at once: importing TensorFlow and building its program overlaps with the
legacy run; it then waits for the legacy side's initial variables (init.npz). If the legacy side
ends without writing them, the migrated process is stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tfmigrate.verify.record import INIT_NPZ, INPUTS_NPZ, RECORD_JSON, RunRecord

LEGACY_ENV = {
    "TF_USE_LEGACY_KERAS": "1",
    "TF_DETERMINISTIC_OPS": "1",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}
MIGRATED_ENV = {"TF_DETERMINISTIC_OPS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}


@dataclass
class SideRun:
    side: str
    out: Path
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    record: RunRecord | None

    def tail(self, lines: int = 25) -> str:
        return "\n".join(self.stderr.strip().splitlines()[-lines:])


@dataclass
class RunPlan:
    legacy: Path
    migrated: Path
    workdir: Path
    replicas: int = 2
    steps: int = 20
    seed: int = 0
    device: str = "cpu"
    timeout: float = 600.0
    mapping: dict[str, str] | None = None
    mapping_source: str = ""  # the manifest or --mapping file it came from
    script_args: tuple[str, ...] = ()
    # a reusable earlier legacy run (its out folder): run only migrated
    legacy_done: Path | None = None
    roundtrip: bool = False
    workers: int = 0  # >0: the migrated side runs as this many MultiWorkerMirroredStrategy workers
    # boot flags of one side only (convert-checkpoint's check: start both from checkpoints)
    legacy_flags: tuple[str, ...] = ()
    migrated_flags: tuple[str, ...] = ()
    # the migrated replicas train on the legacy towers' batches (a program run as written)
    replay_inputs: bool = False

    @property
    def towers(self) -> int:
        """Legacy towers: as many as the migrated side has replicas in all."""
        return self.replicas * max(self.workers, 1)

    @property
    def roundtrip_dir(self) -> Path:
        return self.workdir / "roundtrip"


def _env(
    extra: dict[str, str], seed: int, device: str, drop: tuple[str, ...] = ()
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    env["PYTHONHASHSEED"] = str(seed)
    env["PYTHONUNBUFFERED"] = "1"
    # importing the user's modules must not write __pycache__ there
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = "-1"
    return env


def _start(
    cmd: list[str], cwd: Path, env: dict[str, str], log_prefix: Path, new_session: bool = False
) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    stdout = open(log_prefix.with_suffix(".stdout"), "w")  # noqa: SIM115  closed after wait
    stderr = open(log_prefix.with_suffix(".stderr"), "w")  # noqa: SIM115
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=stdout,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        start_new_session=new_session,
    )  # new_session: killable as a process group
    vars(proc)["_tfmigrate_logs"] = (stdout, stderr)  # the log files ride with the process
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _finish(
    side: str, proc: subprocess.Popen, out: Path, log_prefix: Path, timed_out: bool
) -> SideRun:
    for f in vars(proc)["_tfmigrate_logs"]:
        f.close()
    record = RunRecord.load(out) if (out / RECORD_JSON).exists() else None
    return SideRun(
        side=side,
        out=out,
        returncode=proc.returncode,
        stdout=log_prefix.with_suffix(".stdout").read_text(errors="replace"),
        stderr=log_prefix.with_suffix(".stderr").read_text(errors="replace"),
        timed_out=timed_out,
        record=record,
    )


@dataclass
class SideCommands:
    legacy: list[str]
    migrated: list[str]
    tail: list[str]  # ["--", *script arguments], for both
    legacy_out: Path  # the legacy record's folder (an earlier run's with plan.legacy_done)
    migrated_out: Path


def side_commands(plan: RunPlan) -> SideCommands:
    """Prepare the scratch folder and build both sides' boot commands."""
    work = plan.workdir
    work.mkdir(parents=True, exist_ok=True)
    for d in (work / "legacy" / "out", work / "migrated" / "out"):
        d.mkdir(parents=True, exist_ok=True)
    _mapping_file(plan).write_text(json.dumps(plan.mapping or {}, indent=2))
    return _commands(plan)


def _mapping_file(plan: RunPlan) -> Path:
    """The variable mapping the migrated side matches the legacy variables by."""
    return plan.workdir / "mapping.json"


def _commands(plan: RunPlan) -> SideCommands:
    """Both sides' boot commands over the files side_commands wrote (writes nothing)."""
    work = plan.workdir
    legacy_out, migrated_out = work / "legacy" / "out", work / "migrated" / "out"
    mapping_file = _mapping_file(plan)
    tail = ["--", *plan.script_args]
    common = ["--steps", str(plan.steps), "--seed", str(plan.seed)]
    legacy_cmd = [
        sys.executable,
        "-m",
        "tfmigrate.verify.legacy_boot",
        "--script",
        str(plan.legacy.resolve()),
        "--out",
        str(legacy_out),
        "--towers",
        str(plan.towers),
        "--device",
        plan.device,
        *common,
    ]
    # the migrated program runs as written (its mapping may cover only some variables): the
    # legacy side traces all its variables but the optimizer's
    migrated_cmd = [
        sys.executable,
        "-m",
        "tfmigrate.verify.migrated_boot",
        "--script",
        str(plan.migrated.resolve()),
        "--out",
        str(migrated_out),
        "--replicas",
        str(plan.replicas),
        "--device",
        plan.device,
        "--init",
        str(legacy_out / INIT_NPZ),
        "--mapping",
        str(mapping_file),
        "--mapping-source",
        plan.mapping_source,
        "--wait",
        str(plan.timeout),
        *common,
    ]
    if plan.roundtrip:
        migrated_cmd += ["--roundtrip", str(plan.roundtrip_dir)]
    legacy_cmd += plan.legacy_flags
    migrated_cmd += plan.migrated_flags
    legacy_out = plan.legacy_done or legacy_out
    migrated_cmd[migrated_cmd.index("--init") + 1] = str(legacy_out / INIT_NPZ)
    if plan.replay_inputs:
        migrated_cmd += ["--replay-inputs", str(legacy_out / INPUTS_NPZ)]
    return SideCommands(legacy_cmd, migrated_cmd, tail, legacy_out, migrated_out)


def run_sides(plan: RunPlan) -> tuple[SideRun, SideRun]:
    work = plan.workdir
    cmds = side_commands(plan)
    legacy_cmd, migrated_cmd, tail = cmds.legacy, cmds.migrated, cmds.tail
    legacy_out, migrated_out = cmds.legacy_out, cmds.migrated_out
    legacy_proc = None
    if plan.legacy_done is None:
        legacy_proc = _start(
            legacy_cmd + tail,
            work / "legacy" / "cwd",
            _env(LEGACY_ENV, plan.seed, plan.device),
            work / "legacy" / "log",
        )
    migrated_proc = _start(
        migrated_cmd + tail,
        work / "migrated" / "cwd",
        _env(MIGRATED_ENV, plan.seed, plan.device, drop=("TF_USE_LEGACY_KERAS",)),
        work / "migrated" / "log",
    )
    procs = [p for p in (legacy_proc, migrated_proc) if p is not None]
    deadline = time.monotonic() + plan.timeout
    timed_out = False
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                timed_out = True
                break
            if (
                legacy_proc is not None
                and legacy_proc.poll() is not None
                and not (legacy_out / INIT_NPZ).exists()
            ):
                break  # the migrated side would wait forever for the initial variables
            time.sleep(0.05)
    finally:
        timed_out_sides = {p.pid for p in procs if timed_out and p.poll() is None}
        for p in procs:
            _stop(p)
    if legacy_proc is None:
        legacy_run = SideRun("legacy", legacy_out, 0, "", "", False, RunRecord.load(legacy_out))
    else:
        legacy_run = _finish(
            "legacy",
            legacy_proc,
            legacy_out,
            work / "legacy" / "log",
            legacy_proc.pid in timed_out_sides,
        )
    return legacy_run, _finish(
        "migrated",
        migrated_proc,
        migrated_out,
        work / "migrated" / "log",
        migrated_proc.pid in timed_out_sides,
    )


@dataclass
class NoiseRun:
    """One rounding-level perturbation of the legacy run (verify's noise floor)."""

    name: str  # folder under the scratch folder, and the side's label
    env: dict[str, str]  # kernel settings over the main run's
    nudge_seed: int | None = None  # move each trainable float one step at random (seeded)


def noise_runs() -> list[NoiseRun]:
    """What verify does not pin and a faithful migration changes anyway: the kernels' rounding.
    Flip oneDNN (TF's default on x86 Linux is on) and, in a second run, compute on one intra-op
    thread from weights one float step away."""
    onednn = "1" if os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0" else "0"
    return [
        NoiseRun(f"noise-onednn{onednn}", {"TF_ENABLE_ONEDNN_OPTS": onednn}),
        NoiseRun("noise-1thread", {"TF_NUM_INTRAOP_THREADS": "1", "OMP_NUM_THREADS": "1"}, 1),
    ]


def noise_command(plan: RunPlan, run: NoiseRun) -> list[str]:
    """A perturbed legacy run's command: the first legacy command with its own out folder. It
    reads the mapping file the main runs used and leaves them as they are (the report
    keeps them)."""
    cmd = _commands(plan).legacy
    cmd[cmd.index("--out") + 1] = str(plan.workdir / run.name / "out")
    nudge = ["--nudge-initial", str(run.nudge_seed)] if run.nudge_seed is not None else []
    return [*cmd, *nudge, "--", *plan.script_args]


def noise_label(run: NoiseRun) -> str:
    settings = ", ".join(f"{k}={v}" for k, v in run.env.items() if k != "OMP_NUM_THREADS")
    return f"legacy ({settings}{', nudged' if run.nudge_seed is not None else ''})"


def run_noise(plan: RunPlan, run: NoiseRun) -> SideRun:
    """The legacy program once more under ``run``'s perturbation: how far its own training
    carries a rounding difference (verify's noise floor)."""
    out = plan.workdir / run.name / "out"
    out.mkdir(parents=True, exist_ok=True)
    return _run_alone(
        noise_label(run),
        noise_command(plan, run),
        out,
        plan.workdir / run.name,
        plan,
        {**_env(LEGACY_ENV, plan.seed, plan.device), **run.env},
    )


def run_roundtrip(plan: RunPlan) -> SideRun:
    """Reload what the migrated run saved in a fresh process without a strategy (one device)."""
    folder = plan.roundtrip_dir
    cmd = [
        sys.executable,
        "-m",
        "tfmigrate.verify.roundtrip_boot",
        "--script",
        str(plan.migrated.resolve()),
        "--dir",
        str(folder),
        "--seed",
        str(plan.seed),
        "--",
        *plan.script_args,
    ]
    return _run_alone(
        "roundtrip",
        cmd,
        folder,
        plan.workdir / "roundtrip-run",
        plan,
        _env(MIGRATED_ENV, plan.seed, plan.device, drop=("TF_USE_LEGACY_KERAS",)),
    )


def _run_alone(
    side: str, cmd: list[str], out: Path, folder: Path, plan: RunPlan, env: dict[str, str]
) -> SideRun:
    """One more process after both sides: run it in ``folder``/cwd to its end (or the timeout)."""
    proc = _start(cmd, folder / "cwd", env, folder / "log")
    try:
        proc.wait(timeout=plan.timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    _stop(proc)
    return _finish(side, proc, out, folder / "log", timed_out)
