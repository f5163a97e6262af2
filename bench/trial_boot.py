"""Run one converted program for a few steps on fake data, as its user runs it:
``python bench/trial_boot.py --script S --out DIR --steps 3 [--fake mnist] -- ARGS``.

The program's main block runs unmodified under verify's instrumentation (tfmigrate.verify.
as_written), which counts its training steps and stops it after ``--steps``; there is no legacy
side, so the program keeps the initial values it made. Data a program would download from
``keras.datasets`` is faked from outside (``--fake``): the Keras loader returns random arrays of
the real shapes. ``DIR/trial.json`` says how many steps ran and, if the program failed, how.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np

# keras.datasets loaders: (image shape, label shape, classes) of each, with a few samples.
_DATASETS = {
    "mnist": ((28, 28), (), 10),
    "fashion_mnist": ((28, 28), (), 10),
    "cifar10": ((32, 32, 3), (1,), 10),
    "cifar100": ((32, 32, 3), (1,), 100),
}
_SAMPLES = 512


def _fake_loader(shape: tuple[int, ...], label: tuple[int, ...], classes: int) -> Any:
    def load_data(*args: Any, **kwargs: Any) -> Any:
        rng = np.random.default_rng(0)
        x = rng.integers(0, 256, size=(_SAMPLES, *shape), dtype=np.uint8)
        y = rng.integers(0, classes, size=(_SAMPLES, *label), dtype=np.uint8)
        return (x, y), (x[:128], y[:128])

    return load_data


def _install_fakes(names: list[str]) -> None:
    import importlib

    for name in names:
        shape, label, classes = _DATASETS[name]
        for package in ("keras.datasets", "tensorflow.keras.datasets", "tf_keras.datasets"):
            try:
                module = importlib.import_module(f"{package}.{name}")
            except ImportError:
                continue
            module.load_data = _fake_loader(shape, label, classes)  # type: ignore[attr-defined]  # reason: patched from outside


_EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b.*:")


def _quoted(formatted: str) -> str:
    """The line that names the exception: the last such line of a message autograph wraps
    (its own text last), the first of a message that spans lines (a variable's repr)."""
    lines = [line.strip() for line in formatted.strip().splitlines()]
    named = [line for line in lines if _EXCEPTION_LINE.match(line)]
    return (named[-1] if named else lines[-1])[:300]


def _trial_runner(as_written: Any) -> Any:
    class Trial(as_written.AsWritten):
        """Counts steps and stops after K; nothing to load: the program's own start."""

        def start(self) -> None:
            self.started = True
            self.collect()

    return Trial


def _missing_dependency(exc: BaseException) -> str | None:
    """The third-party package the program could not import (not a module gone from an
    installed package, such as tensorflow.contrib: that is the program's failure)."""
    import importlib.util

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ModuleNotFoundError) and seen.name:
            top = seen.name.split(".")[0]
            return top if importlib.util.find_spec(top) is None else None
        seen = seen.__cause__ or seen.__context__
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--script", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--fake", action="append", default=[], choices=sorted(_DATASETS))
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args()
    script_args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    ns.out.mkdir(parents=True, exist_ok=True)
    os.environ.pop("TF_USE_LEGACY_KERAS", None)
    import tensorflow as tf

    from tfmigrate.verify import as_written

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * ns.replicas
    )
    devices = [f"/cpu:{i}" for i in range(ns.replicas)]
    result: dict[str, Any] = {"steps": 0, "error": None, "missing": None}
    try:
        _install_fakes(ns.fake)
        runner = _trial_runner(as_written)(
            tf, devices, ns.out, ns.steps, ns.out / "no-legacy-side", {}, 0.0, None
        )
        ended = as_written.run_program(tf, runner, ns.script.resolve(), script_args)
        result["steps"] = len(runner.record.steps)
        if runner.problem is not None:
            result["error"] = runner.problem
        elif isinstance(ended, SystemExit):
            result["error"] = f"exited with status {ended.code}"
        elif ended is not None:
            result["missing"] = _missing_dependency(ended)
            result["error"] = _quoted(traceback.format_exception(ended)[-1])
    except Exception as exc:  # noqa: BLE001  the trial's own failure is a result too
        result["error"] = f"the trial runner failed: {exc!r}"[:300]
    (ns.out / "trial.json").write_text(json.dumps(result))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
