"""Are the converted checkpoint and the legacy one the same model? (no TensorFlow here)

verify's two sides run for one step, each restored the way its own world restores: the legacy
script unmodified, every global variable loaded by name from the TF1 checkpoint (shadows into the
weights with --use-ema); the migrated program as written, its own restore code reading the
converted checkpoint, which is put where its CheckpointManager looks (migrated_boot's
place_converted). Compared: every mapped variable as restored (before the first update), and the
scalars the first step fetched (computed before its update: the model's outputs, e.g. the loss, on
the same batch). When all the optimizer state was converted (``same_update``), the variables after
that first update are compared too: they show that the slots came across.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from tfmigrate.verify import compare as cmp
from tfmigrate.verify import loss_scaling
from tfmigrate.verify.manifest import ScriptManifest
from tfmigrate.verify.record import INIT_NPZ, load_arrays
from tfmigrate.verify.sides import RunPlan, run_sides
from tfmigrate.verify.verifier import side_data, side_problem


@dataclass
class CheckResult:
    verdict: str  # compare.EQUIVALENT / DIVERGED / COULD_NOT_RUN
    reason: str = ""
    rows: list[cmp.Row] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return cmp.EXIT_CODES[self.verdict]


def run_check(
    legacy: Path,
    migrated: Path,
    legacy_checkpoint: str,
    converted: Path,
    manifest: ScriptManifest,
    *,
    replicas: int = 2,
    device: str = "cpu",
    timeout: float = 600.0,
    script_args: tuple[str, ...] = (),
    ema_name: str | None = None,
    same_update: bool = False,
    tolerances: cmp.Tolerances | None = None,
) -> CheckResult:
    tol = tolerances or cmp.Tolerances()
    workdir = Path(tempfile.mkdtemp(prefix="tfmigrate-checkpoint-check-"))
    legacy_flags = ["--restore-checkpoint", legacy_checkpoint]
    if ema_name:
        legacy_flags += ["--restore-ema", ema_name]
    plan = RunPlan(
        legacy=legacy,
        migrated=migrated,
        workdir=workdir,
        replicas=replicas,
        steps=1,
        device=device,
        timeout=timeout,
        mapping=manifest.variables,
        script_args=script_args,
        legacy_flags=tuple(legacy_flags),
        migrated_flags=("--restore", str(converted)),
    )
    try:
        legacy_run, migrated_run = run_sides(plan)
        for run in (legacy_run, migrated_run):
            problem = side_problem(run, timeout)
            if problem:
                detail = f"\n{run.record.traceback}" if run.record and run.record.traceback else ""
                return CheckResult(cmp.COULD_NOT_RUN, problem + detail)
        assert legacy_run.record is not None and migrated_run.record is not None  # no side_problem
        # a loss the migrated step differentiates, scaled for the strategy's sum, as verify does
        loss_scaling.scale_differentiated(legacy_run.record, migrated_run.record)
        legacy_data, migrated_data = side_data(legacy_run), side_data(migrated_run)
        restored = restored_rows(
            load_arrays(legacy_run.out / INIT_NPZ),
            load_arrays(migrated_run.out / INIT_NPZ),
            manifest,
            tol,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    comparison = cmp.compare(legacy_data, migrated_data, manifest, tol)
    if comparison.verdict == cmp.COULD_NOT_RUN:
        return CheckResult(cmp.COULD_NOT_RUN, comparison.reason)
    # Only what the restored model computed: step 1's fetches precede its update (optimizer
    # state that could not be converted shows in the weights after it, not here).
    outputs = [
        r for r in comparison.rows if r.phase == cmp.FETCH_PHASE and r.status != cmp.UNMATCHED
    ]
    if not same_update:
        outputs = [_state_dependent(r) for r in outputs]
    if not outputs:
        return CheckResult(
            cmp.COULD_NOT_RUN,
            "the first step fetched no scalar both programs return "
            "(map it in the manifest's 'fetches')",
            restored,
        )
    rows = restored + outputs
    if same_update:
        rows += [
            replace(r, quantity=f"{r.quantity} after step 1")
            for r in comparison.rows
            if r.phase != cmp.FETCH_PHASE and r.status != cmp.UNMATCHED
        ]
    failing = [r for r in rows if r.status == cmp.FAIL]
    if failing:
        return CheckResult(cmp.DIVERGED, f"{failing[0].quantity}: {failing[0].note}", rows)
    return CheckResult(cmp.EQUIVALENT, "", rows)


def _state_dependent(row: cmp.Row) -> cmp.Row:
    """With training state dropped (optimizer slots, the global step), a fetched scalar other than
    a loss (a learning rate on a schedule, say) may differ while the model is the same: shown as
    expected, not failed."""
    if row.category == "loss" or row.status != cmp.FAIL:
        return row
    return replace(
        row,
        status=cmp.EXPECTED,
        note=f"{row.note}; training state not converted (see the notes)".lstrip("; "),
    )


def restored_rows(
    legacy: dict, migrated: dict, manifest: ScriptManifest, tol: cmp.Tolerances
) -> list[cmp.Row]:
    rows = []
    for lname, mname in manifest.variables.items():
        if lname not in legacy or mname not in migrated:
            rows.append(
                cmp.Row(
                    f"restored {lname}",
                    "restored",
                    lname,
                    mname,
                    cmp.FAIL,
                    note="no restored value on one of the sides",
                )
            )
            continue
        a, b = legacy[lname], migrated[mname]
        ok = a.shape == b.shape and tol.array_ok(a, b)
        diff = (
            float(abs(a.astype("float64") - b.astype("float64")).max())
            if a.shape == b.shape and a.size
            else 0.0
        )
        rows.append(
            cmp.Row(
                f"restored {lname}",
                "restored",
                lname,
                mname,
                cmp.PASS if ok else cmp.FAIL,
                steps_compared=1,
                max_abs=diff,
                phase=cmp.FINAL_PHASE,
                tolerance=tol.array_text(),
                note="" if ok else f"max |diff| {diff:.3g}",
            )
        )
    return rows
