"""verify's verdict criterion on synthetic records (no TensorFlow): a variable counts as the same
training when each step's update is within 1% of the legacy step's own update (L2), or when it is
within the float tolerance elementwise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tfmigrate.verify import compare as cmp
from tfmigrate.verify.criterion import UPDATE_RTOL, update_error
from tfmigrate.verify.manifest import ScriptManifest
from tfmigrate.verify.record import Fetch, RunRecord, Step

STEPS = 6
LR = 1e-3


def _trajectory(init: np.ndarray, updates: list[np.ndarray]) -> np.ndarray:
    """Values after each step (float32, as the sides record them)."""
    values, w = [], init.astype(np.float64)
    for u in updates:
        w = w + u
        values.append(w.astype(np.float32))
    return np.stack(values)


def _adam_like_updates(rng: np.random.Generator, shape: tuple[int, ...]) -> list[np.ndarray]:
    """Updates of about lr per element, as Adam makes them."""
    return [-LR * np.tanh(rng.normal(size=shape) * 50) for _ in range(STEPS)]


def _sides(
    legacy_trace: dict[str, np.ndarray],
    migrated_trace: dict[str, np.ndarray],
    init: dict[str, np.ndarray],
    *,
    traced: bool = True,
) -> tuple[cmp.SideData, cmp.SideData]:
    sides = []
    for name, trace in (("legacy", legacy_trace), ("migrated", migrated_trace)):
        rec = RunRecord(side=name, devices=2)
        for i in range(1, STEPS + 1):
            rec.steps.append(Step(step=i, seconds=0.01, inputs=[f"in{i}"],
                                  fetches=[Fetch(name="loss", base="loss", tower=None, value=1.0)]))  # fmt: skip
        rec.variables = {n: {"kind": "weight", "shape": list(v.shape)} for n, v in init.items()}
        final = {n: t[-1] for n, t in trace.items()}
        sides.append(cmp.SideData(rec, dict(init), final, dict(trace) if traced else {}))
    return sides[0], sides[1]


def _compare(legacy, migrated, tol=None) -> cmp.Comparison:
    names = {n: n for n in legacy.init}
    return cmp.compare(legacy, migrated, ScriptManifest(variables=names), tol or cmp.Tolerances())


def _row(result: cmp.Comparison, name: str) -> cmp.Row:
    return next(r for r in result.rows if r.legacy == name and r.phase != cmp.FETCH_PHASE)


@pytest.fixture
def kernel():
    rng = np.random.default_rng(0)
    init = rng.normal(scale=0.1, size=(3, 3, 8, 16)).astype(np.float32)
    return init, _adam_like_updates(rng, init.shape)


def test_rounding_turned_into_large_elementwise_differences_is_accepted(kernel):
    """The dice UNet's case: a few near-zero gradient entries, rounded differently, become 1e-5
    weight differences (10x the float tolerance) while the step's update as a whole is the same."""
    init, updates = kernel
    legacy = _trajectory(init, updates)
    noisy = [u.copy() for u in updates]
    for u in noisy:
        u.flat[::97] += 1.5e-5  # 12 of 1152 entries
    result = _compare(*_sides({"k": legacy}, {"k": _trajectory(init, noisy)}, {"k": init}))
    row = _row(result, "k")
    assert result.verdict == cmp.EQUIVALENT, result.reason
    assert row.status == cmp.PASS and row.max_abs > 10 * cmp.Tolerances().weights_atol
    assert 0 < row.update_error < UPDATE_RTOL
    assert "is rounding" in row.note

    # the same run judged by the float tolerance alone is a divergence
    strict = _compare(*_sides({"k": legacy}, {"k": _trajectory(init, noisy)}, {"k": init}),
                      cmp.Tolerances(update_rtol=0.0))  # fmt: skip
    assert strict.verdict == cmp.DIVERGED and strict.first_divergence["step"] == 1


def test_a_ten_percent_learning_rate_error_diverges_at_step_1(kernel):
    init, updates = kernel
    result = _compare(*_sides({"k": _trajectory(init, updates)},
                              {"k": _trajectory(init, [1.1 * u for u in updates])}, {"k": init}))  # fmt: skip
    row = _row(result, "k")
    assert result.verdict == cmp.DIVERGED and result.exit_code == 1
    assert result.first_divergence == {"step": 1, "quantity": "k", "phase": "after the update of step"}
    assert row.update_error == pytest.approx(0.1, rel=1e-3)
    assert "step 1's update 10% off legacy's (tolerance 1%)" in row.note


def test_a_learning_rate_error_from_a_later_step_names_that_step(kernel):
    init, updates = kernel
    late = [u * (1.5 if i >= 3 else 1.0) for i, u in enumerate(updates)]  # a schedule off by one
    result = _compare(*_sides({"k": _trajectory(init, updates)}, {"k": _trajectory(init, late)},
                              {"k": init}))  # fmt: skip
    assert result.verdict == cmp.DIVERGED and result.first_divergence["step"] == 4


def test_a_missing_batch_norm_update_diverges():
    """Moving statistics the migrated step never updates: the whole update is missing (100%)."""
    init = np.zeros(16, np.float32)
    rng = np.random.default_rng(1)
    updates = [0.01 * rng.normal(size=16) for _ in range(STEPS)]
    stuck = np.stack([init] * STEPS)
    result = _compare(*_sides({"bn/moving_mean": _trajectory(init, updates)}, {"bn/moving_mean": stuck},
                              {"bn/moving_mean": init}))  # fmt: skip
    row = _row(result, "bn/moving_mean")
    assert result.verdict == cmp.DIVERGED and result.first_divergence["step"] == 1
    assert row.update_error == pytest.approx(1.0)
    assert "100% off" in row.note


def test_a_variable_only_the_migrated_step_moves_diverges():
    init = np.ones(4, np.float32)
    moved = np.stack([init + 1e-3 * (i + 1) for i in range(STEPS)])
    result = _compare(*_sides({"w": np.stack([init] * STEPS)}, {"w": moved}, {"w": init}))
    row = _row(result, "w")
    assert result.verdict == cmp.DIVERGED
    assert row.update_error == float("inf") and "moved it where legacy's did not" in row.note


def test_a_variable_whose_update_is_itself_rounding_passes_on_the_float_tolerance():
    """A bias right before a batch norm: its gradient cancels, both updates are rounding and
    differ by 100% of themselves, but by far less than the float tolerance."""
    init = np.zeros(8, np.float32)
    rng = np.random.default_rng(2)
    legacy = [1e-8 * rng.normal(size=8) for _ in range(STEPS)]
    migrated = [1e-8 * rng.normal(size=8) for _ in range(STEPS)]
    result = _compare(*_sides({"b": _trajectory(init, legacy)}, {"b": _trajectory(init, migrated)},
                              {"b": init}))  # fmt: skip
    row = _row(result, "b")
    assert result.verdict == cmp.EQUIVALENT
    assert row.status == cmp.PASS and row.update_error > 0.5 and row.note == ""


def test_non_finite_values_diverge(kernel):
    init, updates = kernel
    migrated = _trajectory(init, updates)
    migrated[2].flat[5] = np.nan
    result = _compare(*_sides({"k": _trajectory(init, updates)}, {"k": migrated}, {"k": init}))
    row = _row(result, "k")
    assert result.verdict == cmp.DIVERGED and result.first_divergence["step"] == 3
    assert np.isnan(row.update_error) and "not finite" in row.note


def test_without_per_step_values_the_whole_run_is_one_update(kernel):
    """Big models: only the final values; rounding passes, a 10% learning rate does not."""
    init, updates = kernel
    legacy = {"k": _trajectory(init, updates)}
    noisy = [u.copy() for u in updates]
    for u in noisy:
        u.flat[::97] += 1.5e-5
    same = _compare(*_sides(legacy, {"k": _trajectory(init, noisy)}, {"k": init}, traced=False))
    assert same.verdict == cmp.EQUIVALENT, same.reason
    assert _row(same, "k").steps_compared == 1
    wrong = _compare(*_sides(legacy, {"k": _trajectory(init, [1.1 * u for u in updates])}, {"k": init},
                             traced=False))  # fmt: skip
    assert wrong.verdict == cmp.DIVERGED and wrong.first_divergence["phase"] == "final values"
    assert "the run's update 10% off" in _row(wrong, "k").note


def test_a_fetched_scalar_is_never_judged_finer_than_float32_resolves_it():
    tol = cmp.Tolerances()
    loss = np.float32(42.45253)
    three_steps = float(np.nextafter(np.nextafter(np.nextafter(loss, 100), 100), 100))
    assert three_steps - float(loss) > tol.atol  # 1.1e-5: over atol, yet the same number rounded
    assert tol.scalar_ok(1, float(loss), three_steps)
    assert not tol.scalar_ok(1, 2.3804255, 2.348244)  # the regularization loss dropped
    assert not tol.scalar_ok(1, float(loss), float(loss) * (1 + 1e-5))


def test_update_error():
    a = np.array([1.0, 2.0, 3.0])
    assert update_error(a, a + 1, a, a + 1) == 0.0
    assert update_error(a, a, a, a) == 0.0  # neither side moved it
    assert update_error(a, a + 1, a, a + 1.1) == pytest.approx(0.1)
    assert update_error(a, a, a, a + 1) == float("inf")
    assert update_error(a, a + 1, a, np.ones(2)) == float("inf")  # shapes differ
    assert np.isnan(update_error(a, a + 1, a, a + np.inf))


def test_report_shows_the_update_error(kernel):
    from tfmigrate.verify.report import to_markdown
    from tfmigrate.verify.verifier import Outcome, VerifyOptions

    init, updates = kernel
    result = _compare(*_sides({"k": _trajectory(init, updates)},
                              {"k": _trajectory(init, [1.1 * u for u in updates])}, {"k": init}))  # fmt: skip
    md = to_markdown(Outcome(result, VerifyOptions(legacy=Path("a.py"), migrated=Path("b.py"))))
    assert "| update error |" in md and "| 10% | FAIL |" in md
    assert "each step's update within 0.01 of legacy's" in md
