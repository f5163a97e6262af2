"""Golden files: the expected output of `tfmigrate rewrite` on the fixtures the whole-program
conversions change (tower programs, Horovod, Keras 2).

``fixtures/goldens/<fixture>/`` holds, for the fixture folder ``fixtures/<fixture>``, every file
the rewrite writes differently from its input, and the manifest. tests/test_goldens.py compares
them exactly; they change only through ``make goldens`` (this module run as a script), whose diff
is reviewed like code.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
GOLDENS = FIXTURES / "goldens"
MANIFEST = "tfmigrate.json"

# fixture folder (relative to fixtures/) -> extra rewrite flags
GOLDEN_FIXTURES: dict[str, tuple[str, ...]] = {
    **{
        f"towers/{name}": ()
        for name in (
            "averaged_weights", "bn_rmsprop", "cifar_average", "clipped_average", "colocated_loss", "fed_learning_rate", "finetune_head", "global_updates",
            "gradient_helper", "hand_written_adam",
            "horovod_average", "keras2_fit",
            "layers_adam", "model_object", "monitored_session", "queue_saver", "resnet20", "shuffled_dequeue", "slim_clones", "sum_ema_decay",
            "summed_reuse_flag", "tower_summaries", "trainer_class", "tutorial_flags",
        )
    },
    # the staged conversion comments out the session's summary writes: unsafe
    "towers/module_script": ("--unsafe-fixes",),
    # the update function runs per replica now (TFM316): unsafe
    "towers/builder_modules": ("--unsafe-fixes",),
    # the evaluation closure's session run is commented out: unsafe
    "towers/per_gpu_closures": ("--unsafe-fixes",),
    "towers/model_placeholder_lists": (),
    "shapes/per_gpu_placeholders": (),
    "addn_towers": (),
    "cifar_towers": (),
    "slim_towers": (),
    "horovod_tf1": ("--unsafe-fixes",),  # the conversion changes the launch: unsafe
    "towers/horovod_update_module": ("--unsafe-fixes",),
    "shapes/horovod_src_model": ("--unsafe-fixes",),
    "shapes/horovod_sampled_graph": ("--unsafe-fixes",),
    "keras2_classifier": ("--unsafe-fixes",),
    "keras2_functional": ("--unsafe-fixes",),
    "keras2_multi_gpu": ("--unsafe-fixes",),
    "keras2_tabular": ("--unsafe-fixes",),
    "keras2_vendored": ("--unsafe-fixes",),
    "keras2_make_parallel": ("--unsafe-fixes",),
    "keras2_session_unet": ("--unsafe-fixes",),
    "keras2_horovod": ("--unsafe-fixes",),
    "keras2_augment": ("--unsafe-fixes",),
}  # fmt: skip


def changed_files(source: Path, out: Path) -> list[str]:
    """The files of a rewrite's output that differ from the fixture (and the manifest)."""
    names = []
    for path in sorted(out.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(out).as_posix()
        original = source / rel
        if rel == MANIFEST or not original.exists() or not filecmp.cmp(path, original, False):
            names.append(rel)
    return names


def rewrite(fixture: str, flags: tuple[str, ...], into: Path) -> Path:
    out = into / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "tfmigrate", "rewrite", "--out", str(out), *flags,
         str(FIXTURES / fixture)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if proc.returncode not in (0, 1):
        raise SystemExit(f"rewrite of {fixture} failed (exit {proc.returncode}):\n{proc.stderr}")
    return out


def update(only: list[str]) -> None:
    for fixture, flags in GOLDEN_FIXTURES.items():
        if only and not any(o in fixture for o in only):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            out = rewrite(fixture, flags, Path(tmp))
            golden = GOLDENS / fixture
            shutil.rmtree(golden, ignore_errors=True)
            for rel in changed_files(FIXTURES / fixture, out):
                (golden / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(out / rel, golden / rel)
        print(f"updated {golden.relative_to(REPO)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Rewrite the golden files from the current code.")
    parser.add_argument("only", nargs="*", help="only fixtures whose path contains one of these")
    update(parser.parse_args().only)
