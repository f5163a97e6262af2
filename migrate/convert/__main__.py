"""``python -m tfmigrate.convert PATH [--json]``: each entry program's tower cores, input and
session, or why it was refused."""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import sys
from pathlib import Path

from tfmigrate.convert import ir, read_project
from tfmigrate.convert.recognize import ProgramReading


def _plain(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return value.as_posix()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def summary(reading: ProgramReading, root: Path) -> list[str]:
    entry = _shown(reading.entry, root)
    if reading.refusal is not None:
        return [f"{entry}: refused at {reading.refusal}"]
    program = reading.program
    assert program is not None
    lines = [f"{entry}:"]
    for index, core in enumerate(program.cores, 1):
        where = core.towers.where if core.towers is not None else core.combination.where
        towers = (
            f"towers over {core.towers.count} on {core.towers.devices} in {core.towers.function}"
            if core.towers is not None
            else "one process per device (Horovod)"
        )
        lines.append(f"  core {index} at {where}: {towers}")
        if core.loss is not None:
            lines.append(f"    loss: {core.loss.expression} ({core.loss.where})")
        lines.append(
            f"    combination: {core.combination.kind.value}, {core.combination.spelling} "
            f"({core.combination.where})"
        )
        built = f", built at {core.update.optimizer_where}" if core.update.optimizer_where else ""
        lines.append(
            f"    update: {core.update.kind.value} of {core.update.optimizer} "
            f"({core.update.where}{built})"
        )
    inputs = ", ".join(f"{i.kind.value} ({i.where})" for i in program.inputs) or "not found"
    lines.append(f"  input: {inputs}")
    if program.session is not None:
        steps = f", {len(program.session.steps)} step run(s)" if program.session.steps else ""
        first = f", first {program.session.steps[0].where}" if program.session.steps else ""
        lines.append(
            f"  session: {program.session.kind.value} ({program.session.where}){steps}{first}"
        )
        if program.session.loop is not None:
            loop = program.session.loop
            lines.append(f"  loop: {loop.header} ({loop.where})")
    else:
        lines.append("  session: not found")
    if program.devices is not None:
        lines.append(f"  device config: {', '.join(program.devices.settings) or '-'}")
    if program.setup:
        parts = ", ".join(dict.fromkeys(f"{s.kind.value} ({s.where})" for s in program.setup))
        lines.append(f"  set-up: {parts}")
    for note in program.notes:
        lines.append(f"  note: {note.where}: {note.text}")
    return lines


def _shown(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfmigrate.convert", description=__doc__)
    parser.add_argument("path", type=Path)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    if not args.path.exists():
        print(f"error: {args.path} does not exist", file=sys.stderr)
        return 2
    readings = read_project(args.path)
    root = (args.path if args.path.is_dir() else args.path.parent).resolve()
    if args.json:
        shown = [
            {
                "entry": _shown(r.entry, root),
                "program": _plain(r.program),
                "refusal": _plain(r.refusal),
            }
            for r in readings
        ]
        print(json.dumps(shown, indent=2))
    else:
        if not readings:
            print(f"{args.path}: no entry program reaches a tower core")
        for reading in readings:
            print("\n".join(summary(reading, root)))
    return 1 if any(r.refusal is not None for r in readings) else 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["ir", "main"]
