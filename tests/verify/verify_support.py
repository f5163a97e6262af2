"""Helpers for verify's tests: fixture pairs, planting bugs, running verify in-process."""

from __future__ import annotations

import shutil
from pathlib import Path

from tfmigrate.verify.verifier import Outcome, VerifyOptions, run_verify

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
PAIRS = ("cifar_average", "bn_rmsprop", "sum_ema_decay", "keras2_fit")


def pair(name: str) -> tuple[Path, Path]:
    return FIXTURES / "towers" / name / "train.py", FIXTURES / "migrated" / name / "train.py"


def plant(tmp_path: Path, name: str, old: str, new: str) -> Path:
    """A copy of the migrated fixture (with its manifest) where ``old`` became ``new``, once."""
    dst = tmp_path / name
    shutil.copytree(FIXTURES / "migrated" / name, dst)
    script = dst / "train.py"
    text = script.read_text()
    assert text.count(old) == 1, f"{old!r} must occur exactly once in {name}"
    script.write_text(text.replace(old, new))
    return script


STEPS = 8  # enough for every planted bug to show (the staircase schedule steps at step 5)


def verify(legacy: Path, migrated: Path, *, steps: int = STEPS, args: tuple[str, ...] = (),
           cache: Path | None = None, **kwargs) -> Outcome:
    kwargs.setdefault("timeout", 300)
    opts = VerifyOptions(legacy=legacy, migrated=migrated, replicas=2, steps=steps,
                         script_args=args, legacy_cache=cache, **kwargs)
    return run_verify(opts)
