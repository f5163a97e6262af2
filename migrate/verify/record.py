"""What one side of a verify run leaves behind, shared by both boot modules and the comparison.

A side writes into its own output folder:
  record.json  the run: status, per-step fetched scalars, input fingerprints, timings, notes
  init.npz     variable values at the start of step 1 (legacy: every global variable)
  final.npz    variable values after the last step
  trace.npz    per-step values (stacked over steps) of the variables verify was asked to trace
  traced.json  (legacy) which variables it traces, so the migrated side traces their counterparts
  variables.json (legacy) each variable's shape, kind and trainability, written with traced.json
  inputs.npz   (legacy) each step's input batches, tower by tower (verify --replay-inputs)
numpy + json only (no TensorFlow), so the CLI can read records without importing TF.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

RECORD_JSON = "record.json"
INIT_NPZ = "init.npz"
FINAL_NPZ = "final.npz"
TRACE_NPZ = "trace.npz"
TRACED_JSON = "traced.json"  # legacy names traced per step (written before init.npz)
LEGACY_VARIABLES_JSON = "variables.json"  # legacy variables' metadata (written before init.npz)
INPUTS_NPZ = "inputs.npz"
# --roundtrip: what the trained run and the resumed run compare (roundtrip_boot.py)
ROUNDTRIP_BEFORE = "roundtrip_before.npz"
ROUNDTRIP_AFTER = "roundtrip_after.npz"

# Status of a side. "ok": reached the requested steps (or the script's own end); "crashed": user code
# raised; "error": the runtime could not set the program up (no training step seen, a mapping that does not fit, ...).
OK, CRASHED, ERROR = "ok", "crashed", "error"


@dataclass
class Fetch:
    """One scalar a training step fetched. ``tower`` is None for a reduction (not tied to a device)."""

    name: str  # legacy: tensor name without ':0'; migrated: the key train_step returned
    base: str  # name without the tower scope ("tower_1/loss" -> "loss")
    tower: int | None
    value: float
    # migrated side run as written: "differentiated" (a GradientTape target) or "returned" (a
    # value the step function returned); "" for the other runners
    source: str = ""
    scale: float = 1.0  # the factor the value was multiplied by to compare it (loss scaling)


@dataclass
class Step:
    step: int  # 1-based
    seconds: float
    fetches: list[Fetch] = field(default_factory=list)
    inputs: list[str] | None = None  # step fingerprint (see fingerprint.py); None = not captured
    samples: int | None = None  # samples in the step's input (global batch), when fingerprinted


@dataclass
class RunRecord:
    side: str  # "legacy" | "migrated"
    status: str = OK
    message: str = ""
    traceback: str = ""
    steps: list[Step] = field(default_factory=list)
    devices: int = 0  # towers seen (legacy) / replicas (migrated)
    variables: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> shape, kind, ...
    replica_spread: dict[str, float] = field(
        default_factory=dict
    )  # var -> max |replica i - replica 0|
    peak_memory_bytes: int | None = None
    memory_source: str = ""
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        steps = [
            Step(
                step=s["step"],
                seconds=s["seconds"],
                fetches=[Fetch(**f) for f in s.get("fetches", [])],
                inputs=s.get("inputs"),
                samples=s.get("samples"),
            )
            for s in data.get("steps", [])
        ]
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "steps"}
        return cls(steps=steps, **known)

    def save(self, folder: Path) -> None:
        write_json_atomic(folder / RECORD_JSON, self.to_json())

    @classmethod
    def load(cls, folder: Path) -> RunRecord:
        return cls.from_json(json.loads((folder / RECORD_JSON).read_text()))

    def steps_per_second(self, warmup: int = 2) -> float | None:
        """Throughput after warm-up (the first steps include graph building / tracing)."""
        timed = [s.seconds for s in self.steps[warmup:]]
        if not timed or sum(timed) <= 0:
            return None
        return len(timed) / sum(timed)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_json_default))
    os.replace(tmp, path)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """npz keyed by position; the real names (which contain '/' and ':') travel in an index array."""
    names = sorted(arrays)
    payload = {f"a{i}": np.asarray(arrays[n]) for i, n in enumerate(names)}
    payload["__names__"] = np.array(names, dtype=str)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, allow_pickle=True, **payload)  # numpy's default, named: no array takes it
    os.replace(tmp, path)


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    if not path.exists():
        return {}
    with np.load(path, allow_pickle=False) as data:
        names = [str(n) for n in data["__names__"]]
        return {n: data[f"a{i}"] for i, n in enumerate(names)}


def save_step_inputs(path: Path, steps: list[list[tuple[str, list[np.ndarray]]]]) -> None:
    """Each step's input streams, in the step's order, each as its tower parts in tower order."""
    arrays = {}
    for s, streams in enumerate(steps):
        for i, (name, parts) in enumerate(streams):
            for t, part in enumerate(parts):
                arrays[f"{s:06d}|{i:04d}|{t:04d}|{name}"] = np.asarray(part)
    save_arrays(path, arrays)


def load_step_inputs(path: Path) -> list[list[tuple[str, list[np.ndarray]]]]:
    table: dict[int, dict[int, tuple[str, dict[int, np.ndarray]]]] = {}
    for key, value in load_arrays(path).items():
        s, i, t, name = key.split("|", 3)
        table.setdefault(int(s), {}).setdefault(int(i), (name, {}))[1][int(t)] = value
    return [
        [
            (name, [parts[t] for t in sorted(parts)])
            for _, (name, parts) in sorted(table.get(s, {}).items())
        ]
        for s in range(max(table) + 1 if table else 0)
    ]
