"""Training throughput: legacy TF1 towers against their migrated TF2 programs, in one run.

    .venv/bin/python bench/training.py [--steps 60] [--replicas 2] [--rounds 1] [--jit]
        [--only cifar_average [--variant other/train.py]] [-- --batch_size 256]
    .venv/bin/python bench/training.py --compute-bound [--steps 20] [--rounds 3]

For every bundled tower program (fixtures/towers/*) it trains, on the same N logical CPU devices,
with the same model and batch: the legacy program (TF1 graph on TF2's compat layer), the program
that `tfmigrate rewrite` makes of it (when the rewriter converts it; with `--jit`, also the one
`rewrite --jit` makes) and the hand-migrated one in fixtures/migrated/ (when there is one). Each
pair runs through `tfmigrate verify`, which also checks that both sides trained the same; the
table shows steps/s after warm-up and peak memory of each side (1 / median step time), and the
ratio migrated/legacy (above 1.0: the migrated program is faster).

Targets. The tiny programs (a few thousand weights, a step of about a millisecond) measure the
fixed cost per step of each runtime, not the training: they are reported without a target. The
compute-bound case (COMPUTE_BOUND: resnet20, a ResNet-20-size tower program, 64 images per
tower on 2 logical CPU devices) carries the target: the rewrite, verified EQUIVALENT (or
differing only as announced), trains at >= 0.95x the legacy towers' steps/s, median of 3
alternating rounds. `--compute-bound` runs that case alone (3 rounds unless `--rounds` says
otherwise, 20 steps unless `--steps` does); in a run of every program, resnet20 gets the case's
flags unless arguments after `--` are given, and its target is judged only with those flags,
`--replicas 2` and 3 rounds or more.

What is timed, per step, is what each program's own loop pays: the legacy side's Session.run of
the train op (feeding its batch, or running its in-graph input pipeline); the migrated side's
next(iterator) over its distributed batches plus the train_step call until its fetched values
are on the host -- or, for a program that offers its step for several steps per call (the
protocol's one_step), each of verify's calls' time over the steps it ran (batches taken inside
the call; as many steps per call as the program's own loop runs: `steps_per_execution` for a
`fit` program). No side is timed while the other one runs: the legacy program first trains
alone, then each migrated program is verified against that legacy run (verify's --legacy-cache),
so only the migrated process is busy while it is timed. `--rounds R` repeats that sequence
(legacy, migrated, legacy, migrated, ...); the table shows medians (a shared machine's load
drifts between runs) and each round's ratio.

Arguments after `--` go to both programs (e.g. `-- --batch_size 256`: is a ratio an artefact of
a tiny model?). `--variant FILE` adds another migrated version of the one `--only` program (a
candidate rewrite, with its tfmigrate.json beside it or above). Absolute numbers vary between
machines; the ratios in one run are the point.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tfmigrate.verify.sides import LEGACY_ENV, RunPlan, side_commands

REPO = Path(__file__).resolve().parents[1]
TOWERS = REPO / "fixtures" / "towers"
HAND_MIGRATED = REPO / "fixtures" / "migrated"
REWRITE = "tfmigrate rewrite"


@dataclass(frozen=True)
class Case:
    """A program run with fixed flags, and the ratio its rewrite must reach there."""

    program: str
    script_args: tuple[str, ...]
    replicas: int
    rounds: int  # the target is a median over this many alternating rounds
    target: float  # migrated / legacy steps/s


# A step of ResNet-20 at 64 images per tower is the model's convolutions, so a runtime's fixed
# cost per step (a tf.function call, an iterator's next) is a small share of it.
COMPUTE_BOUND = Case("resnet20", ("--batch_size", "64"), replicas=2, rounds=3, target=0.95)
COMPUTE_BOUND_STEPS = 20


@dataclass
class Row:
    program: str
    migrated_by: str
    verdict: str
    legacy_sps: float | None
    migrated_sps: float | None
    legacy_mb: float | None
    migrated_mb: float | None

    round_ratio: float | None = None  # median over rounds of each round's own ratio
    round_ratios: tuple[float | None, ...] = ()
    target: float | None = None  # set where the run is the compute-bound case

    @property
    def ratio(self) -> float | None:
        if self.round_ratio is not None:
            return self.round_ratio
        if self.legacy_sps and self.migrated_sps:
            return self.migrated_sps / self.legacy_sps
        return None


def _tfmigrate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tfmigrate", *args], capture_output=True, text=True
    )


def _verify(
    legacy: Path,
    migrated: Path,
    report: Path,
    cache: Path,
    opts: argparse.Namespace,
    script_args: list[str],
) -> tuple[dict, Path]:
    """Verify MIGRATED against the cached legacy run, so that only the migrated side is timed."""
    before = set(cache.iterdir()) if cache.exists() else set()
    for _ in range(2):  # a run that had to train the legacy side too (cache miss) is run again
        _tfmigrate(
            "verify",
            str(legacy),
            str(migrated),
            "--steps",
            str(opts.steps),
            "--replicas",
            str(opts.replicas),
            "--report",
            str(report),
            "--legacy-cache",
            str(cache),
            "--",
            *script_args,
        )
        after = set(cache.iterdir()) if cache.exists() else set()
        if after == before:
            break
        before = after
    path = report / "report.json"
    if not path.exists():
        raise SystemExit(f"verify wrote no report for {legacy} vs {migrated}")
    return json.loads(path.read_text()), report


def _legacy_alone(
    legacy: Path, work: Path, opts: argparse.Namespace, script_args: list[str]
) -> float | None:
    """Train the legacy program alone, with verify's own legacy runtime, and time its steps."""
    plan = RunPlan(
        legacy=legacy,
        migrated=legacy,
        workdir=work,
        replicas=opts.replicas,
        steps=opts.steps,
        script_args=tuple(script_args),
    )
    cmds = side_commands(plan)
    cwd = work / "legacy" / "cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **LEGACY_ENV, "PYTHONHASHSEED": "0", "CUDA_VISIBLE_DEVICES": "-1"}
    subprocess.run(
        cmds.legacy + cmds.tail, cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    return _median_steps_per_second(cmds.legacy_out / "record.json")


def _median_steps_per_second(record: Path | None, warmup: int = 2) -> float | None:
    """1 / median step time after warm-up: robust to the odd step slowed by a busy machine."""
    if record is None or not record.exists():
        return None
    seconds = [s["seconds"] for s in json.loads(record.read_text())["steps"][warmup:]]
    return 1.0 / statistics.median(seconds) if seconds else None


def _side_record(report_dir: Path, side: str) -> Path | None:
    records = sorted(report_dir.glob(f"runs/*/{side}/out/record.json"))
    return records[0] if records else None


def _row(
    program: str, migrated_by: str, legacy_sps: float | None, report: dict, report_dir: Path
) -> Row:
    sides = report.get("sides", {})

    def megabytes(name: str) -> float | None:
        value = sides.get(name, {}).get("peak_memory_bytes")
        return value / 2**20 if value else None

    return Row(
        program,
        migrated_by,
        report["verdict"],
        legacy_sps,
        _median_steps_per_second(_side_record(report_dir, "migrated")),
        megabytes("legacy"),
        megabytes("migrated"),
    )


def _converted(legacy: Path, script: Path) -> bool:
    """Whether the rewrite made a TF2 distributed program of `legacy` (a refused program comes
    out with its one-file fixes only, still a TF1 program)."""
    if not script.exists():
        return False
    text = script.read_text()
    return text != legacy.read_text() and "tf.distribute." in text


def script_args_for(name: str, opts: argparse.Namespace) -> list[str]:
    """The compute-bound program runs with its case's flags unless flags were given."""
    if name == COMPUTE_BOUND.program and not opts.script_args:
        return list(COMPUTE_BOUND.script_args)
    return list(opts.script_args)


def target_for(row: Row, script_args: list[str], opts: argparse.Namespace) -> float | None:
    """The compute-bound target, where this row is that case: the rewrite of its program, with
    its flags and devices (tiny programs have none)."""
    case = COMPUTE_BOUND
    is_case = (
        row.program == case.program
        and row.migrated_by == REWRITE
        and tuple(script_args) == case.script_args
        and opts.replicas == case.replicas
    )
    return case.target if is_case else None


def measure(name: str, work: Path, opts: argparse.Namespace) -> list[Row]:
    """Legacy alone, then each migrated version alone, `rounds` times over: the machine's load
    drifts, so every round yields its own ratios and the table shows their medians."""
    legacy = TOWERS / name / "train.py"
    cache = work / "legacy-cache"
    script_args = script_args_for(name, opts)
    versions: list[tuple[str, Path]] = []
    for flags in [[], ["--jit"]] if opts.jit else [[]]:
        rewritten = work / ("rewritten" + "".join(flags)) / name
        done = _tfmigrate("rewrite", *flags, "--out", str(rewritten), str(legacy.parent))
        script = rewritten / "train.py"
        if done.returncode in (0, 1) and _converted(legacy, script):
            versions.append((" ".join([REWRITE, *flags]), script))
    hand = HAND_MIGRATED / name / "train.py"
    if hand.exists():
        versions.append(("by hand", hand))
    versions += [(str(v), v.resolve()) for v in opts.variant or []]
    rounds: list[list[Row]] = []
    for r in range(opts.rounds):
        legacy_sps = _legacy_alone(legacy, work / f"legacy-alone-{r}" / name, opts, script_args)
        rows = []
        for i, (label, migrated) in enumerate(versions):
            report = _verify(
                legacy, migrated, work / "reports" / f"{name}-{i}-{r}", cache, opts, script_args
            )
            rows.append(_row(name, label, legacy_sps, *report))
        rounds.append(rows)
        if opts.progress:
            for row in rows:
                print(
                    f"round {r + 1}/{opts.rounds} {name} ({row.migrated_by}): legacy "
                    f"{_fmt(row.legacy_sps, '.2f')} steps/s, migrated "
                    f"{_fmt(row.migrated_sps, '.2f')}, × {_fmt(row.ratio, '.3f')}, {row.verdict}",
                    file=sys.stderr,
                    flush=True,
                )
    out = []
    for i in range(len(versions)):
        row = _median_row([rows[i] for rows in rounds])
        row.target = target_for(row, script_args, opts)
        out.append(row)
    return out


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _median_row(rows: list[Row]) -> Row:
    first = rows[0]
    verdicts = sorted({r.verdict for r in rows})
    row = Row(
        first.program,
        first.migrated_by,
        "/".join(verdicts),
        _median([r.legacy_sps for r in rows]),
        _median([r.migrated_sps for r in rows]),
        _median([r.legacy_mb for r in rows]),
        _median([r.migrated_mb for r in rows]),
    )
    row.round_ratios = tuple(r.ratio for r in rows)
    row.round_ratio = _median(list(row.round_ratios))
    return row


# verify's verdicts a timed migrated run may have: it trained the same (announced differences
# included)
TRAINED_THE_SAME = frozenset({"equivalent", "differs-as-announced"})


def judged(row: Row, opts: argparse.Namespace) -> str:
    """'met' / 'missed' against the row's target; '-' without one, or with too few rounds."""
    if row.target is None:
        return "-"
    if opts.rounds < COMPUTE_BOUND.rounds:
        return f"not judged ({opts.rounds} round(s) < {COMPUTE_BOUND.rounds})"
    same = set(row.verdict.split("/")) <= TRAINED_THE_SAME
    if not same:
        return f"missed (verify: {row.verdict})"
    return "met" if row.ratio is not None and row.ratio >= row.target else "missed"


def _fmt(value: float | None, spec: str) -> str:
    return format(value, spec) if value is not None else "-"


def print_table(rows: list[Row], opts: argparse.Namespace) -> None:
    extra = f", script args {' '.join(opts.script_args)}" if opts.script_args else ""
    case = COMPUTE_BOUND
    print(
        f"Training throughput, {opts.replicas} logical CPU devices, {opts.steps} steps{extra}, "
        f"{opts.rounds} round(s) (2 steps of warm-up not timed; 1 / median step time; each side "
        "timed alone, legacy then migrated in each round; × legacy is the median of the rounds' "
        f"ratios). Target: ≥ {case.target:.2f}× for the compute-bound case ({case.program} with "
        f"{' '.join(case.script_args)} per tower on {case.replicas} devices, median of "
        f"{case.rounds} rounds); the tiny programs have none.\n"
    )
    print(
        "| program | migrated by | verify | legacy steps/s | migrated steps/s | × legacy "
        "| rounds' × | target | legacy MB | migrated MB |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | --- | --- | ---: | ---: |")
    for r in rows:
        each = ", ".join(_fmt(x, ".2f") for x in r.round_ratios)
        target = f"≥ {r.target:.2f}: {judged(r, opts)}" if r.target is not None else "-"
        print(
            f"| {r.program} | {r.migrated_by} | {r.verdict} | {_fmt(r.legacy_sps, '.2f')} | "
            f"{_fmt(r.migrated_sps, '.2f')} | {_fmt(r.ratio, '.2f')} | {each} | {target} | "
            f"{_fmt(r.legacy_mb, '.0f')} | {_fmt(r.migrated_mb, '.0f')} |"
        )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    script_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, help="steps per run (default 60; 20 compute-bound)")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument(
        "--rounds", type=int, help="repeat legacy-then-migrated timing; medians shown (default 1)"
    )
    parser.add_argument(
        "--only", action="append", help="a program under fixtures/towers (repeatable)"
    )
    parser.add_argument(
        "--compute-bound",
        action="store_true",
        help=f"only the compute-bound case ({COMPUTE_BOUND.program}, "
        f"{' '.join(COMPUTE_BOUND.script_args)}, {COMPUTE_BOUND.replicas} devices), judged "
        f"against its {COMPUTE_BOUND.target}x target",
    )
    parser.add_argument(
        "--jit", action="store_true", help="also the rewrite with --jit (XLA), as its own row"
    )
    parser.add_argument(
        "--variant",
        action="append",
        type=Path,
        help="another migrated version of the --only program (repeatable)",
    )
    parser.add_argument(
        "--progress", action="store_true", help="print each round's numbers (stderr) as it ends"
    )
    opts = parser.parse_args(argv)
    opts.script_args = script_args
    if opts.compute_bound:
        if opts.only or script_args or opts.replicas != COMPUTE_BOUND.replicas:
            parser.error("--compute-bound fixes the program, its flags and the devices")
        opts.only = [COMPUTE_BOUND.program]
        opts.steps = opts.steps or COMPUTE_BOUND_STEPS
        opts.rounds = opts.rounds or COMPUTE_BOUND.rounds
    opts.steps = opts.steps or 60
    opts.rounds = opts.rounds or 1
    if opts.variant and len(opts.only or []) != 1:
        parser.error("--variant needs exactly one --only program")
    names = opts.only or sorted(p.name for p in TOWERS.iterdir() if (p / "train.py").exists())
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="tfmigrate-bench-") as tmp:
        for name in names:
            rows.extend(measure(name, Path(tmp), opts))
    print_table(rows, opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
