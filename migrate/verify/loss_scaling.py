"""Which legacy fetch a migrated program's differentiated loss is, and how it is scaled (numpy only).

Under MirroredStrategy the gradients of the replicas are summed, so a TF2 step that reproduces
towers whose gradients were averaged differentiates each tower's loss divided by the number of
replicas (``loss / num_replicas_in_sync``, ``tf.nn.compute_average_loss`` over the global batch);
one that reproduces summed gradients differentiates it unscaled. A program run as written names
the value it differentiates ``loss`` (as_written.py); here it is matched, on step 1, against every
per-tower legacy fetch times each candidate factor {1, N}: the pair that agrees (relative
difference below MATCH_RTOL) renames the migrated fetch after the legacy one and multiplies every
step's value by the factor, and the report says so. A legacy loop that fetched a reduction of
the towers' losses instead (tower None: their mean or sum) is matched the same way against the
replicas' mean or sum, which becomes the migrated fetch. Step 1 is computed before any update, so a
bug in the update cannot hide the match; a bug in the loss leaves it unmatched, and the weights
(the ground truth) still show the divergence.
"""

from __future__ import annotations

from collections.abc import Mapping

from tfmigrate.verify.record import Fetch, RunRecord

SOURCE = "differentiated"
MATCH_RTOL = 1e-3  # loose on purpose: this chooses a counterpart, compare.py judges the values


def _groups(record: RunRecord, source: str | None) -> dict[str, dict[int, dict[int, Fetch]]]:
    table: dict[str, dict[int, dict[int, Fetch]]] = {}
    for step in record.steps:
        for f in step.fetches:
            if f.tower is None or (source is not None and f.source != source):
                continue
            table.setdefault(f.base, {}).setdefault(step.step, {})[f.tower] = f
    return table


def _relative(migrated: dict[int, Fetch], legacy: dict[int, Fetch], factor: float) -> float | None:
    if not legacy or not set(legacy) <= set(migrated):
        return None  # a loop may fetch one tower's loss only (the last tower's, often)
    worst = 0.0
    for tower, f in legacy.items():
        want = f.value
        worst = max(worst, abs(migrated[tower].value * factor - want) / max(abs(want), 1e-12))
    return worst


def _reduced(record: RunRecord) -> dict[str, dict[int, Fetch]]:
    """Legacy fetches not tied to a tower, by base name and step."""
    table: dict[str, dict[int, Fetch]] = {}
    for step in record.steps:
        for f in step.fetches:
            if f.tower is None:
                table.setdefault(f.base, {})[step.step] = f
    return table


def _combine(parts: Mapping[int, Fetch] | Mapping[int | None, Fetch], how: str) -> float:
    total = sum(f.value for f in parts.values())
    return total / len(parts) if how == "mean" else total


def _match_reduced(
    legacy: RunRecord, migrated: RunRecord, base: str, steps: dict[int, dict[int, Fetch]],
    factors: list[float], taken: set[str],
) -> str | None:
    """Match the differentiated loss against a reduced legacy fetch; replace it by its reduction."""
    first = min(steps)
    found = []
    for lbase, lsteps in _reduced(legacy).items():
        if first not in lsteps or lbase in taken or not steps[first]:
            continue
        want = lsteps[first].value
        for how in ("mean", "sum"):
            for factor in factors:
                rel = abs(_combine(steps[first], how) * factor - want) / max(abs(want), 1e-12)
                if rel <= MATCH_RTOL:
                    found.append((rel, "loss" not in lbase.lower(), len(lbase), lbase, how, factor))
    if not found:
        return None
    _, _, _, lbase, how, factor = min(found)
    taken.add(lbase)
    for step in migrated.steps:
        parts = {f.tower: f for f in step.fetches if f.source == SOURCE and f.base == base}
        kept = [f for f in step.fetches if f not in parts.values() and f.base != lbase]
        if parts:
            value = _combine(parts, how) * factor
            kept.append(Fetch(lbase, lbase, None, value, SOURCE, factor))
        step.fetches = kept
    scaled = f" x {factor:g}" if factor != 1.0 else ""
    return (f"the migrated step differentiates the legacy {lbase}: the {how} of the replicas' "
            f"{base}{scaled} is compared with it")


def scale_differentiated(legacy: RunRecord, migrated: RunRecord) -> list[str]:
    """Rename and scale the migrated differentiated losses in place; the report's notes."""
    replicas = max(migrated.devices, 1)
    factors = sorted({1.0, float(replicas)})
    targets = _groups(migrated, SOURCE)
    towers = _groups(legacy, None)
    notes: list[str] = []
    taken: set[str] = set()
    for base, steps in targets.items():
        first = min(steps)
        found = []
        for lbase, lsteps in towers.items():
            if first not in lsteps or lbase in taken:
                continue
            for factor in factors:
                rel = _relative(steps[first], lsteps[first], factor)
                if rel is not None and rel <= MATCH_RTOL:
                    found.append((rel, "loss" not in lbase.lower(), len(lbase), lbase, factor))
        if not found:
            note = _match_reduced(legacy, migrated, base, steps, factors, taken)
            if note is not None:
                notes.append(note)
                continue
            notes.append(
                f"the loss the migrated step differentiates ({base}) matches no per-tower legacy fetch at "
                f"step {first} (as is or times {replicas}): it is not compared; the weights are")
            continue
        _, _, _, lbase, factor = min(found)
        taken.add(lbase)
        for step in migrated.steps:
            kept = []
            for f in step.fetches:
                if f.source == SOURCE and f.base == base:
                    f.base, f.name = lbase, f"{lbase}[{f.tower}]"
                    f.value, f.scale = f.value * factor, factor
                elif f.base == lbase and f.source != SOURCE:
                    continue  # a returned value of the same name: the differentiated one is compared
                kept.append(f)
            step.fetches = kept
        if factor == 1.0:
            notes.append(f"the migrated step differentiates the legacy towers' {lbase} as it is "
                         f"(compared as {base} of each replica)")
        else:
            notes.append(
                f"loss scaling: the migrated step differentiates the legacy towers' {lbase} divided by "
                f"{replicas} (the replicas' gradients are summed); replica i's {base} x {replicas} is "
                f"compared with tower i's {lbase} — scaled, not a divergence")
    return notes
