"""Decide whether two recorded runs trained the same (numpy only).

Time order inside step s: the fetched scalars are computed *before* update s, traced variables are
read *after* it; the first divergence is the earliest (step, phase) that breaks its tolerance.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tfmigrate.verify.criterion import (
    SCALAR_RESOLUTION,
    UPDATE_RTOL,
    percent,
    update_error,
    within_update,
)
from tfmigrate.verify.manifest import ScriptManifest, parse_fetch_target
from tfmigrate.verify.record import OK, Fetch, RunRecord

EQUIVALENT, DIVERGED, COULD_NOT_RUN = "equivalent", "diverged", "could-not-run"
# Nothing failed, but what the loop fetched differs (as the migration announced): the run shows
# the size of a difference, not that the programs train the same, so it must not read as a pass.
ANNOUNCED = "differs-as-announced"
EXIT_CODES = {EQUIVALENT: 0, DIVERGED: 1, ANNOUNCED: 1, COULD_NOT_RUN: 2}
PASS, FAIL, EXPECTED, UNMATCHED = "pass", "fail", "expected", "unmatched"
# Out of tolerance, but no further from the legacy run than the legacy program drifts from itself
# under other kernel settings (the noise floor): rounding, not the migration.
NOISE = "within-noise"
NOISE_FACTOR = 3.0  # see docs/verify.md, "Verdict criterion", for the measurements
FETCH_PHASE, VARIABLE_PHASE, FINAL_PHASE = 0, 1, 2
FINAL_KEY = 0  # Row.per_step's key for the whole run judged as one update (no per-step values)
_UNIQUIFIED = re.compile(r"_\d+$")  # TF1's suffix for a name already taken in its scope


@dataclass
class Tolerances:
    """Defaults for CPU float32; the variables' rule is criterion.py's (docs/verify.md, "Verdict
    criterion")."""

    atol: float = 1e-5  # fetched scalars, steps 1..early_steps
    rtol: float = 1e-4  # fetched scalars after early_steps (never stricter than atol)
    early_steps: int = 10
    weights_atol: float = 1e-6  # variables: within float tolerance elementwise ...
    weights_rtol: float = 1e-4
    update_rtol: float = UPDATE_RTOL  # ... or each step's update within this of legacy's (L2)

    def scalar_ok(self, step: int, legacy: float, migrated: float) -> bool:
        diff = abs(legacy - migrated)
        if not np.isfinite(diff):
            return bool(np.isnan(legacy) and np.isnan(migrated))
        if step <= self.early_steps:  # never finer than float32 resolves the value
            return diff <= max(self.atol, SCALAR_RESOLUTION * abs(legacy))
        return diff <= max(self.atol, self.rtol * abs(legacy))

    def scalar_text(self) -> str:
        return (
            f"atol {self.atol:g} or {SCALAR_RESOLUTION:.2g}·|legacy| (steps 1-{self.early_steps}), "
            f"then rtol {self.rtol:g}"
        )

    def array_ok(self, legacy: np.ndarray, migrated: np.ndarray) -> bool:
        return bool(
            np.all(
                np.abs(legacy - migrated) <= self.weights_atol + self.weights_rtol * np.abs(legacy)
            )
        )

    def array_text(self) -> str:
        return f"rtol {self.weights_rtol:g}, atol {self.weights_atol:g}"

    def variable_text(self) -> str:
        return (
            f"each step's update within {self.update_rtol:g} of legacy's (L2), "
            f"or elementwise {self.array_text()}"
        )

    def variable_ok(
        self, before: tuple[np.ndarray, np.ndarray] | None, legacy: np.ndarray, migrated: np.ndarray
    ) -> tuple[bool, float | None]:
        """One variable after a step (or a run) from ``before`` (legacy's and migrated's values
        then; None: unknown, only the float tolerance applies): (accepted, update error)."""
        if legacy.shape != migrated.shape:
            return False, None
        error = None if before is None else update_error(before[0], legacy, before[1], migrated)
        close = self.array_ok(legacy, migrated)
        return close or (error is not None and within_update(error, self.update_rtol)), error


@dataclass
class Row:
    quantity: str  # what the report calls it
    category: str  # loss/metric fetch, weight, ema, bn_stat, other
    legacy: str
    migrated: str
    status: str
    steps_compared: int = 0
    max_abs: float | None = None
    max_rel: float | None = None
    first_step: int | None = None  # first step out of tolerance (None: none, or final only)
    phase: int = FETCH_PHASE
    tolerance: str = ""
    note: str = ""
    # variables: the largest relative update error over the compared steps (criterion.py)
    update_error: float | None = None
    # step -> what was judged there (variables: update error; fetches: |diff|), and the steps
    # out of tolerance: the noise floor re-judges those steps
    per_step: dict[int, float] = field(default_factory=dict)
    bad_steps: list[int] = field(default_factory=list)


@dataclass
class Series:
    label: str
    steps: list[int]
    legacy: list[float]
    migrated: list[float]


@dataclass
class Comparison:
    verdict: str
    reason: str = ""
    rows: list[Row] = field(default_factory=list)
    first_divergence: dict[str, Any] | None = None
    series: list[Series] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    steps_compared: int = 0

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SideData:
    record: RunRecord
    init: dict[str, np.ndarray]
    final: dict[str, np.ndarray]
    trace: dict[str, np.ndarray]


def could_not_run(reason: str, notes: list[str] | None = None) -> Comparison:
    return Comparison(verdict=COULD_NOT_RUN, reason=reason, notes=notes or [])


def compare(
    legacy: SideData, migrated: SideData, manifest: ScriptManifest, tol: Tolerances
) -> Comparison:
    for side in (legacy, migrated):
        if side.record.status != OK:
            return could_not_run(f"{side.record.side} side: {side.record.message}")
    n_steps = min(len(legacy.record.steps), len(migrated.record.steps))
    notes: list[str] = []
    if len(legacy.record.steps) != len(migrated.record.steps):
        notes.append(
            f"legacy ran {len(legacy.record.steps)} steps, migrated {len(migrated.record.steps)}; "
            f"comparing the first {n_steps}"
        )
    if n_steps == 0:
        return could_not_run("no training step ran on one of the sides", notes)

    mismatch = _input_mismatch(legacy.record, migrated.record, n_steps, notes)
    if mismatch:
        return could_not_run(mismatch, notes)

    rows, series = _compare_fetches(legacy.record, migrated.record, n_steps, manifest, tol)
    rows += _compare_variables(legacy, migrated, n_steps, manifest, tol, notes)
    for name, spread in migrated.record.replica_spread.items():
        notes.append(
            f"migrated replicas hold different values of {name} (max |replica i - replica 0| = "
            f"{spread:.3g}); replica 0's is what a checkpoint keeps"
        )

    result = Comparison(
        verdict=EQUIVALENT, rows=rows, series=series, notes=notes, steps_compared=n_steps
    )
    compared = [r for r in rows if r.status in (PASS, FAIL, EXPECTED)]
    if not compared:
        return could_not_run(
            "nothing to compare: no legacy fetch and no mapped variable has a migrated "
            "counterpart (check the manifest's 'fetches' and 'variables')",
            notes,
        )
    if not any(r.phase == FETCH_PHASE and r.status != UNMATCHED for r in rows):
        notes.append("no per-step fetched scalar was compared (none matched); only variables were")
    _judge(result)
    return result


def _judge(result: Comparison) -> None:
    """The verdict from the rows: the earliest failing row, else announced-only, else equivalent."""
    rows, n_steps = result.rows, result.steps_compared
    result.verdict, result.reason, result.first_divergence = EQUIVALENT, "", None
    compared = [r for r in rows if r.status in (PASS, FAIL, EXPECTED, NOISE)]
    failing = [r for r in rows if r.status == FAIL]
    if failing:
        first = min(
            failing,
            key=lambda r: (r.first_step if r.first_step is not None else n_steps + 1, r.phase),
        )
        result.verdict = DIVERGED
        result.first_divergence = {
            "step": first.first_step,
            "quantity": first.quantity,
            "phase": (
                "fetched before the update of step",
                "after the update of step",
                "final values",
            )[first.phase],
        }
        where = f"step {first.first_step}" if first.first_step is not None else "the final values"
        result.reason = (
            f"first divergence at {where}: {first.quantity} ({first.note or first.tolerance})"
        )
        return
    fetched = [r for r in compared if r.phase == FETCH_PHASE]
    if all(r.status == EXPECTED for r in (fetched or compared)):
        expected = [r.quantity for r in (fetched or compared)]
        result.verdict = ANNOUNCED
        result.reason = (
            f"{', '.join(expected[:3])}{' and more' if len(expected) > 3 else ''} differ, as the "
            "migration announced: this run measures the difference; it does not show that "
            "both programs train the same"
        )


def noise_manifest(manifest: ScriptManifest) -> ScriptManifest:
    """Legacy against legacy: every mapped legacy variable and fetch is its own counterpart."""
    return ScriptManifest(
        variables={name: name for name in manifest.variables}, source=manifest.source
    )


def apply_noise_floor(
    result: Comparison, floors: list[Comparison], factor: float = NOISE_FACTOR
) -> None:
    """Re-judge the failing rows against ``floors``: the legacy run against itself under other
    kernel settings (sides.noise_runs), compared by the same rules.

    The floor of a quantity at step s is the largest drift any floor run shows on it up to s
    (a chaotic training's rounding differences only grow; the running maximum keeps a floor run
    that happens to cross the legacy one at s from counting as no noise). A failing row becomes
    WITHIN-NOISE when at each of its failing steps its own measure (a variable's update error, a
    fetch's |diff|) is at most ``factor`` times that floor; a quantity no floor run moved has no
    noise."""
    drift: dict[str, dict[int, float]] = {}
    for floor in floors:
        for r in floor.rows:
            steps = drift.setdefault(r.quantity, {})
            for step, value in r.per_step.items():
                if np.isfinite(value):
                    steps[step] = max(steps.get(step, 0.0), value)
    for row in result.rows:
        if row.status != FAIL or not row.bad_steps:
            continue
        own = _running_max(drift.get(row.quantity, {}))
        if not own:
            continue
        ratios = [
            row.per_step.get(s, float("inf")) / own[s] if own.get(s) else float("inf")
            for s in row.bad_steps
        ]
        worst = max(ratios)
        at = row.bad_steps[ratios.index(worst)]
        where = "the run" if at == FINAL_KEY else f"step {at}"
        measure = "update error" if row.phase != FETCH_PHASE else "|diff|"
        text = (
            f"{where}: {measure} {row.per_step.get(at, float('nan')):.3g}, the legacy program's own "
            f"under other kernels {own.get(at, 0.0):.3g}"
        )
        row.note = f"{row.note}; {text}" if row.note else text
        if worst <= factor:
            row.status = NOISE
    moved = [q for q, steps in drift.items() if any(steps.values())]
    result.notes.append(
        f"noise floor: the legacy program run again under other kernel settings ({len(floors)} "
        f"run(s)) drifted from its first run on {len(moved)} of {len(drift)} quantities; failing "
        f"steps within {factor:g}× that drift count as rounding ({NOISE.upper()})"
    )
    _judge(result)


def _running_max(steps: dict[int, float]) -> dict[int, float]:
    out, top = {}, 0.0
    for step in sorted(s for s in steps if s != FINAL_KEY):
        top = max(top, steps[step])
        out[step] = top
    if FINAL_KEY in steps:
        out[FINAL_KEY] = steps[FINAL_KEY]
    return out


def _input_mismatch(
    legacy: RunRecord, migrated: RunRecord, n_steps: int, notes: list[str]
) -> str | None:
    unchecked = 0
    for ls, ms in zip(legacy.steps[:n_steps], migrated.steps[:n_steps], strict=True):
        if ls.inputs is None or ms.inputs is None:
            unchecked += 1
            continue
        if ls.inputs != ms.inputs:
            if ls.samples and ms.samples and ls.samples != ms.samples:
                return (
                    f"the two sides trained on different inputs at step {ls.step}: legacy's step had "
                    f"{ls.samples} samples, migrated's {ms.samples} — a batch size mix-up? Under "
                    "MirroredStrategy fit() and experimental_distribute_dataset take the GLOBAL batch "
                    "(all replicas), as multi_gpu_model and tower code sliced it."
                )
            return (
                f"the two sides trained on different inputs at step {ls.step} (input fingerprints "
                f"legacy {ls.inputs} vs migrated {ms.inputs}); a divergence would be meaningless. "
                "Make both programs read the same data in the same order and split it the same way."
            )
    if unchecked:
        notes.append(
            f"inputs could not be fingerprinted on {unchecked} of {n_steps} steps "
            "(no fed arrays or recognised input pipeline)"
        )
    return None


def _fetch_table(record: RunRecord, n_steps: int) -> dict[str, dict[int, Fetch]]:
    table: dict[str, dict[int, Fetch]] = {}
    for step in record.steps[:n_steps]:
        for f in step.fetches:
            table.setdefault(f.name, {})[step.step] = f
    return table


def _counterpart(
    f: Fetch, manifest: ScriptManifest, migrated: dict[str, dict[int, Fetch]]
) -> str | None:
    """The migrated fetch name that should equal legacy fetch ``f``."""
    by_key: dict[tuple[str, int | None], str] = {}
    for name, steps in migrated.items():
        sample = next(iter(steps.values()))
        by_key[(sample.base, sample.tower)] = name
    target = manifest.fetches.get(f.name) or manifest.fetches.get(f.name + ":0")
    if target is not None:
        key, replica = parse_fetch_target(target)
        return by_key.get((key, replica if replica is not None else f.tower)) or by_key.get(
            (key, None)
        )
    # The legacy name carries every scope open where the op was made (`net/xent_loss/value` under
    # a variable_scope); the migrated key names the value without them: try each tail of the
    # path, longest first.
    names = [f.base]
    if f.tower is not None:
        # Towers told apart by device only (no name scope) share one name scope, so TF1 made
        # their ops and re-entered scopes unique with a suffix (tower 1's `Mean` is `Mean_1`, its
        # `net/xent` is `net_1/xent`); the migrated key is the op's own name, per replica. In a
        # tower's own scope an op made earlier can take the name too (the CIFAR-10 tutorial's
        # discarded `loss()` sum is `tower_0/total_loss`, the tower's is `tower_0/total_loss_1`).
        names.append("/".join(_UNIQUIFIED.sub("", part) for part in f.base.split("/")))
    for name in names:
        parts = name.split("/")
        for base in ("/".join(parts[i:]) for i in range(len(parts))):
            if (base, f.tower) in by_key:
                return by_key[(base, f.tower)]
    return None


def _compare_fetches(
    legacy: RunRecord, migrated: RunRecord, n_steps: int, manifest: ScriptManifest, tol: Tolerances
) -> tuple[list[Row], list[Series]]:
    ltable, mtable = _fetch_table(legacy, n_steps), _fetch_table(migrated, n_steps)
    rows, series = [], []
    for lname, lsteps in ltable.items():
        sample = next(iter(lsteps.values()))
        mname = _counterpart(sample, manifest, mtable)
        tower = f"tower {sample.tower}" if sample.tower is not None else "reduced"
        quantity = f"{sample.base} ({tower})"
        category = "loss" if "loss" in sample.base.lower() else "fetch"
        if mname is None:
            rows.append(
                Row(
                    quantity,
                    category,
                    lname,
                    "-",
                    UNMATCHED,
                    note="no migrated train_step value matches; map it in the manifest's 'fetches'",
                )
            )
            continue
        msteps = mtable[mname]
        common = sorted(s for s in lsteps if s in msteps)
        lv = [lsteps[s].value for s in common]
        mv = [msteps[s].value for s in common]
        diffs = [abs(a - b) for a, b in zip(lv, mv, strict=True)]
        bad = [s for s, a, b in zip(common, lv, mv, strict=True) if not tol.scalar_ok(s, a, b)]
        announced = manifest.announcement_for(lname, mname)
        status = PASS if not bad else (EXPECTED if announced else FAIL)
        note = ""
        if bad:
            s = bad[0]
            note = f"legacy {lsteps[s].value:.8g} vs migrated {msteps[s].value:.8g} at step {s}"
        if announced:
            note = f"announced {announced.code}: {announced.reason}".strip()
        rows.append(
            Row(
                quantity,
                category,
                lname,
                mname,
                status,
                steps_compared=len(common),
                max_abs=max(diffs) if diffs else None,
                max_rel=max(
                    (d / abs(a) for d, a in zip(diffs, lv, strict=True) if a), default=None
                ),
                first_step=bad[0] if bad else None,
                phase=FETCH_PHASE,
                tolerance=tol.scalar_text(),
                note=note,
                per_step=dict(zip(common, diffs, strict=True)),
                bad_steps=bad,
            )
        )
        series.append(Series(quantity, common, lv, mv))
    return rows, series


def _diff(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    rel = d / np.maximum(np.abs(a.astype(np.float64)), 1e-12)
    return (float(d.max()) if d.size else 0.0, float(rel.max()) if rel.size else 0.0)


def _compare_variables(
    legacy: SideData,
    migrated: SideData,
    n_steps: int,
    manifest: ScriptManifest,
    tol: Tolerances,
    notes: list[str],
) -> list[Row]:
    rows = []
    same_length = len(legacy.record.steps) == len(migrated.record.steps)
    for lname, mname in manifest.variables.items():
        meta = legacy.record.variables.get(lname, {})
        category = meta.get("kind", "weight")
        announced = manifest.announcement_for(lname, mname)
        lt, mt = legacy.trace.get(lname), migrated.trace.get(mname)
        start = _start(legacy, migrated, lname, mname)
        first_bad: int | None = None
        bad_error: float | None = None  # the first failing step's update error
        worst: float | None = None
        max_abs = max_rel = 0.0
        compared = 0
        over_float = False  # accepted by the update rule while over the float tolerance
        per_step: dict[int, float] = {}
        bad_steps: list[int] = []
        before = start
        if lt is not None and mt is not None:
            for i in range(min(n_steps, len(lt), len(mt))):
                compared += 1
                a, r = _diff(lt[i], mt[i])
                max_abs, max_rel = max(max_abs, a), max(max_rel, r)
                ok, error = tol.variable_ok(before, lt[i], mt[i])
                worst = _worse(worst, error)
                over_float = over_float or (ok and not tol.array_ok(lt[i], mt[i]))
                if error is not None:
                    per_step[i + 1] = error
                if not ok:
                    bad_steps.append(i + 1)
                if first_bad is None and not ok:
                    first_bad, bad_error = i + 1, error
                before = (lt[i], mt[i])
        if same_length and lname in legacy.final and mname in migrated.final:
            lf, mf = legacy.final[lname], migrated.final[mname]
            if lf.shape == mf.shape:
                a, r = _diff(lf, mf)
                max_abs, max_rel = max(max_abs, a), max(max_rel, r)
            # With every step traced the steps judged the final values; else the whole run
            # counts as one update from the start.
            traced = (
                lt is not None
                and mt is not None
                and compared == n_steps
                and _same(lt[n_steps - 1], lf)
                and _same(mt[n_steps - 1], mf)
            )
            if traced:
                final_ok = True
            else:
                final_ok, error = tol.variable_ok(start, lf, mf)
                worst = _worse(worst, error)
                over_float = over_float or (final_ok and not tol.array_ok(lf, mf))
                if error is not None:
                    per_step[FINAL_KEY] = error
                if not final_ok:
                    bad_steps.append(FINAL_KEY)
                if not final_ok and first_bad is None:
                    bad_error = error
            compared = max(compared, 1)
        elif compared:
            final_ok = first_bad is None
        else:
            rows.append(
                Row(
                    f"{lname}",
                    category,
                    lname,
                    mname,
                    UNMATCHED,
                    phase=FINAL_PHASE,
                    note="no values on one of the sides",
                )
            )
            continue
        ok = final_ok and first_bad is None
        status = PASS if ok else (EXPECTED if announced else FAIL)
        note = ""
        if announced:
            note = f"announced {announced.code}: {announced.reason} (measured max |diff| {max_abs:.3g})".strip()
        elif not ok:
            where = f"step {first_bad}" if first_bad is not None else "the run"
            note = f"{_update_text(where, bad_error, tol)}max |diff| {max_abs:.3g}, max rel {max_rel:.3g}"
        elif over_float:
            note = (
                f"max |diff| {max_abs:.3g} is rounding: every update within "
                f"{percent(worst)} of legacy's"
            )
        rows.append(
            Row(
                lname,
                category,
                lname,
                mname,
                status,
                steps_compared=compared,
                max_abs=max_abs,
                max_rel=max_rel,
                first_step=first_bad,
                phase=VARIABLE_PHASE if first_bad is not None else FINAL_PHASE,
                tolerance=tol.variable_text(),
                note=note,
                update_error=worst,
                per_step=per_step,
                bad_steps=bad_steps,
            )
        )
    return rows


def _start(
    legacy: SideData, migrated: SideData, lname: str, mname: str
) -> tuple[np.ndarray, np.ndarray] | None:
    """Both sides' values before step 1 (the migrated side loaded legacy's: equal unless a
    conversion was inexact)."""
    if lname not in legacy.init:
        return None
    return legacy.init[lname], migrated.init.get(mname, legacy.init[lname])


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))


def _worse(worst: float | None, error: float | None) -> float | None:
    if error is None or (worst is not None and (np.isnan(worst) or error <= worst)):
        return worst
    return error  # larger, or nan (a value not finite): it stays visible


def _update_text(where: str, error: float | None, tol: Tolerances) -> str:
    """Why a variable failed, in terms of the step's update (criterion.py)."""
    if error is None:
        return ""
    if np.isnan(error):
        return f"{where}: values not finite; "
    if np.isinf(error):
        return f"{where} moved it where legacy's did not; "
    return (
        f"{where}'s update {percent(error)} off legacy's (tolerance {percent(tol.update_rtol)}); "
    )


def compare_roundtrip(before: np.ndarray, after: np.ndarray, tol: Tolerances) -> Row:
    """The trained run's state after step K and its next steps vs a fresh run restored from what
    it saved (roundtrip_boot.py): one flat vector each."""
    row = Row(
        "state after save → restore in a fresh run",
        "roundtrip",
        "trained",
        "restored",
        PASS,
        steps_compared=1,
        phase=FINAL_PHASE,
        tolerance=tol.array_text(),
    )
    if before.shape != after.shape:
        row.status, row.note = FAIL, f"prediction shapes differ: {before.shape} vs {after.shape}"
        return row
    row.max_abs, row.max_rel = _diff(before, after)
    if not tol.array_ok(before, after):
        row.status = FAIL
        row.note = (
            f"max |diff| {row.max_abs:.3g}: the saved model does not reload to the trained one"
        )
    return row


def add_roundtrip(result: Comparison, row: Row) -> None:
    result.rows.append(row)
    if row.status == FAIL and result.verdict in (EQUIVALENT, ANNOUNCED):
        result.verdict = DIVERGED
        result.first_divergence = {"step": None, "quantity": row.quantity, "phase": "round trip"}
        result.reason = f"round trip failed: {row.note}"
