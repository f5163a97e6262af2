"""When two values of one variable count as the same training (numpy only).

A faithful migration computes each step with other kernels, in another order, in another graph:
its weights differ from the legacy run's by rounding, and how much rounding a step turns into a
weight difference depends on the optimizer and on the CPU's kernels (Adam's first update,
lr·g/(|g|+ε), maps a rounding difference in a near-zero gradient to ~1e-5 on the weight). A fixed
elementwise tolerance therefore passes on one machine and fails on another. What a bug changes
is the step's *update*: a wrong learning rate moves every weight by a fraction of its update, a
missing batch-norm update leaves the statistics where they were (all of it).

So a variable is compared with the update the legacy step itself made to it: after step t the
difference counts as rounding when the migrated step's update, Δm = m_t − m_{t−1}, is within
``update_rtol`` of the legacy step's, Δl = l_t − l_{t−1}, in L2 norm over the variable:

    ‖Δm − Δl‖₂ ≤ update_rtol · ‖Δl‖₂

or when every element is within the float tolerance (atol + rtol·|l|), which covers a variable
the step did not really move (a bias right before a batch norm: its gradient cancels to rounding,
so its "update" is rounding too). See docs/verify.md, "Verdict criterion", for the measurements
behind the constant.
"""

from __future__ import annotations

import numpy as np

# The largest relative update error measured for a faithful migration, over every pair of kernel
# settings (oneDNN on/off, AVX2 instead of AVX-512, one intra-op thread), was 4.2e-4 (the Keras 2
# UNet under Adam); a 10% learning-rate error is 0.1 by construction. 1e-2 sits 24x above the one
# and 10x below the other.
UPDATE_RTOL = 1e-2
# A fetched scalar this many float32 steps from the legacy one is the same number rounded
# differently: addn_towers' loss of 42.45 came out 3 steps (1.1e-5) apart between one and two
# intra-op threads, over the early steps' atol 1e-5.
SCALAR_ULPS = 8
SCALAR_RESOLUTION = SCALAR_ULPS * float(np.finfo(np.float32).eps)


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def update_error(
    legacy_before: np.ndarray,
    legacy_after: np.ndarray,
    migrated_before: np.ndarray,
    migrated_after: np.ndarray,
) -> float:
    """‖Δmigrated − Δlegacy‖₂ / ‖Δlegacy‖₂ over one step (or over a whole run, from the start).

    0.0 when both updates are equal (also when neither side moved the variable); inf when only
    the migrated side moved it, or the shapes differ; nan when a value is not finite."""
    lb, la, mb, ma = map(_f64, (legacy_before, legacy_after, migrated_before, migrated_after))
    if not (la.shape == lb.shape == ma.shape == mb.shape):
        return float("inf")
    legacy_update = la - lb
    error = float(np.linalg.norm((ma - mb) - legacy_update))
    if not np.isfinite(error):
        return float("nan")
    scale = float(np.linalg.norm(legacy_update))
    if error == 0.0:
        return 0.0
    return error / scale if scale else float("inf")


def within_update(error: float, update_rtol: float) -> bool:
    return bool(np.isfinite(error) and error <= update_rtol)


def percent(x: float | None) -> str:
    """An update error for people: 0.029%, 10%, 100%, 1830%."""
    if x is None:
        return "-"
    v = 100 * x
    return f"{v:.2g}%" if not np.isfinite(v) or v < 10 else f"{v:.0f}%"
