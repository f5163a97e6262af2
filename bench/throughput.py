"""Scan and rewrite throughput: tfmigrate against TensorFlow's own tf_upgrade_v2, in one run.

    .venv/bin/python bench/throughput.py [--files 1200] [--repeat 1]

Builds a tree of TF-era Python files (the fixtures' sources with their identifiers varied, plus
TensorFlow's and tf_slim's own Python sources from site-packages up to --files), then times each
command as a whole process (start-up included) and reads its peak memory (max RSS), and prints a
table with ratios to tf_upgrade_v2. Absolute times vary between machines; the ratios are the point.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _site_packages() -> Path:
    import sysconfig

    return Path(sysconfig.get_paths()["purelib"])


def build_tree(target: Path, total: int) -> int:
    """Fixture sources ×variants, topped up with TF/tf_slim sources. Returns the file count."""
    count = 0
    fixture_sources = sorted(
        p for p in (REPO / "fixtures").rglob("*.py") if "migrated" not in p.parts
    )
    for variant in range(max(1, total // 10 // max(1, len(fixture_sources)))):
        for source in fixture_sources:
            text = source.read_text(encoding="utf-8", errors="replace")
            # Vary identifiers so no two files are the same text.
            text = re.sub(r"\b(tower|model|net|loss)\b", rf"\1_{variant}", text)
            dest = target / "fixtures" / f"v{variant}" / source.relative_to(REPO / "fixtures")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text, encoding="utf-8")
            count += 1
    site = _site_packages()
    pool = sorted((site / "tf_slim").rglob("*.py")) + sorted((site / "tensorflow" / "python").rglob("*.py"))
    for source in pool:
        if count >= total:
            break
        dest = target / "site" / source.relative_to(site)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)
        count += 1
    return count


def measure(cmd: list[str], cwd: Path) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in MB of the process and its waited children, exit status)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    return wall, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1200)
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs per command")
    args = parser.parse_args()

    bin_dir = Path(sys.executable).parent
    tfm = [sys.executable, "-m", "tfmigrate"]
    upgrader = bin_dir / "tf_upgrade_v2"
    with tempfile.TemporaryDirectory(prefix="tfm-bench-") as tmp:
        tree = Path(tmp) / "tree"
        n = build_tree(tree, args.files)
        out = Path(tmp) / "out"
        commands: dict[str, list[str]] = {
            "tfmigrate scan -j1": [*tfm, "scan", "-j", "1", "--format", "json", str(tree)],
            "tfmigrate scan -j2": [*tfm, "scan", "-j", "2", "--format", "json", str(tree)],
            "tfmigrate rewrite -j1": [*tfm, "rewrite", "-j", "1", "--out", str(out), "--force", str(tree)],
            "tfmigrate rewrite -j2": [*tfm, "rewrite", "-j", "2", "--out", str(out), "--force", str(tree)],
        }
        if upgrader.exists():
            commands["tf_upgrade_v2 (rewrite)"] = [
                str(upgrader), "--intree", str(tree), "--outtree", str(Path(tmp) / "up"),
                "--reportfile", str(Path(tmp) / "report.txt"), "--no_import_rename",
            ]
        rows = []
        print(f"{n} files; {os.cpu_count()} cores; Python {sys.version.split()[0]}", flush=True)
        for name, cmd in commands.items():
            best = None
            for _ in range(args.repeat):
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(Path(tmp) / "up", ignore_errors=True)
                result = measure(cmd, Path(tmp))
                if best is None or result[0] < best[0]:
                    best = result
            rows.append((name, *best))
            print(f"  measured {name}: {best[0]:.2f} s, {best[1]:.0f} MB, exit {best[2]}", flush=True)

    baseline = next((r[1] for r in rows if r[0].startswith("tf_upgrade_v2")), None)
    print()
    print("| command | wall s | files/s | peak MB | × tf_upgrade_v2 | exit |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, wall, peak, code in rows:
        ratio = f"{wall / baseline:.2f}" if baseline else "-"
        print(f"| {name} | {wall:.2f} | {n / wall:.0f} | {peak:.0f} | {ratio} | {code} |")
    j1 = next((r[1] for r in rows if r[0] == "tfmigrate rewrite -j1"), None)
    j2 = next((r[1] for r in rows if r[0] == "tfmigrate rewrite -j2"), None)
    if j1 and j2:
        print(f"\nrewrite speed-up -j2 over -j1: {j1 / j2:.2f}×")


if __name__ == "__main__":
    main()
