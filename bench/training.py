"""Training throughput: legacy TF1 towers against their migrated TF2 programs, in one run.

    .venv/bin/python bench/training.py [--steps 60] [--replicas 2] [--only cifar_average]

For every bundled tower program (fixtures/towers/*) it trains, on the same N logical CPU devices,
with the same model and batch: the legacy program (TF1 graph on TF2's compat layer), the program
that `tfmigrate rewrite` makes of it (when the rewriter converts it) and the hand-migrated one in
fixtures/migrated/ (when there is one). Each pair runs through `tfmigrate verify`, which also
checks that both sides trained the same; the table shows steps/s after warm-up and peak memory of
each side (1 / median step time), and the ratio migrated/legacy (above 1.0: the migrated program is faster).

What is timed, per step: the legacy side's Session.run of the train op; the migrated side's
train_step call until its fetched values are on the host. Feeding data is outside the timed part
on both sides. Absolute numbers vary between machines; the ratios in one run are the point.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOWERS = REPO / "fixtures" / "towers"
HAND_MIGRATED = REPO / "fixtures" / "migrated"


@dataclass
class Row:
    program: str
    migrated_by: str
    verdict: str
    legacy_sps: float | None
    migrated_sps: float | None
    legacy_mb: float | None
    migrated_mb: float | None

    @property
    def ratio(self) -> float | None:
        if self.legacy_sps and self.migrated_sps:
            return self.migrated_sps / self.legacy_sps
        return None


def _tfmigrate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tfmigrate", *args], capture_output=True, text=True
    )


def _verify(
    legacy: Path, migrated: Path, report: Path, steps: int, replicas: int
) -> tuple[dict, Path]:
    _tfmigrate(
        "verify",
        str(legacy),
        str(migrated),
        "--steps",
        str(steps),
        "--replicas",
        str(replicas),
        "--report",
        str(report),
    )
    path = report / "report.json"
    if not path.exists():
        raise SystemExit(f"verify wrote no report for {legacy} vs {migrated}")
    return json.loads(path.read_text()), report


def _median_steps_per_second(report_dir: Path, side: str, warmup: int = 2) -> float | None:
    """1 / median step time after warm-up: robust to the odd step slowed by a busy machine."""
    records = sorted(report_dir.glob(f"runs/*/{side}/out/record.json"))
    if not records:
        return None
    seconds = [s["seconds"] for s in json.loads(records[0].read_text())["steps"][warmup:]]
    return 1.0 / statistics.median(seconds) if seconds else None


def _row(program: str, migrated_by: str, report: dict, report_dir: Path) -> Row:
    sides = report.get("sides", {})

    def megabytes(name: str) -> float | None:
        value = sides.get(name, {}).get("peak_memory_bytes")
        return value / 2**20 if value else None

    return Row(
        program,
        migrated_by,
        report["verdict"],
        _median_steps_per_second(report_dir, "legacy"),
        _median_steps_per_second(report_dir, "migrated"),
        megabytes("legacy"),
        megabytes("migrated"),
    )


def measure(name: str, work: Path, steps: int, replicas: int) -> list[Row]:
    legacy = TOWERS / name / "train.py"
    rows = []
    rewritten = work / "rewritten" / name
    done = _tfmigrate("rewrite", "--out", str(rewritten), str(legacy.parent))
    if done.returncode in (0, 1) and "tfmigrate_program" in (rewritten / "train.py").read_text():
        report = _verify(
            legacy, rewritten / "train.py", work / "reports" / f"{name}-rewrite", steps, replicas
        )
        rows.append(_row(name, "tfmigrate rewrite", *report))
    hand = HAND_MIGRATED / name / "train.py"
    if hand.exists():
        report = _verify(legacy, hand, work / "reports" / f"{name}-hand", steps, replicas)
        rows.append(_row(name, "by hand", *report))
    return rows


def _fmt(value: float | None, spec: str) -> str:
    return format(value, spec) if value is not None else "-"


def print_table(rows: list[Row], steps: int, replicas: int) -> None:
    print(
        f"Training throughput, {replicas} logical CPU devices, {steps} steps (2 of warm-up not timed; 1 / median step time)\n"
    )
    print(
        "| program | migrated by | verify | legacy steps/s | migrated steps/s | × legacy | legacy MB | migrated MB |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r.program} | {r.migrated_by} | {r.verdict} | {_fmt(r.legacy_sps, '.1f')} | "
            f"{_fmt(r.migrated_sps, '.1f')} | {_fmt(r.ratio, '.2f')} | {_fmt(r.legacy_mb, '.0f')} | "
            f"{_fmt(r.migrated_mb, '.0f')} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument(
        "--only", action="append", help="a program under fixtures/towers (repeatable)"
    )
    args = parser.parse_args(argv)
    names = args.only or sorted(p.name for p in TOWERS.iterdir() if (p / "train.py").exists())
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="tfmigrate-bench-") as tmp:
        for name in names:
            rows.extend(measure(name, Path(tmp), args.steps, args.replicas))
    print_table(rows, args.steps, args.replicas)
    return 0


if __name__ == "__main__":
    sys.exit(main())
