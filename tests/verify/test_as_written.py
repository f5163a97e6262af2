"""verify runs a hand-written TF2 program as its user runs it (no manifest):
steps found at the optimizer update, losses where the gradient is taken, variables matched by
name and shape, loss scaling detected, the legacy batches replayed on request."""

from __future__ import annotations

import json

import numpy as np
import pytest
from verify_support import FIXTURES, verify

from tfmigrate.verify import compare as cmp
from tfmigrate.verify.as_written import (
    OLD_ENTRY_POINT,
    _convertible,
    _pair,
    defines_function,
    match_by_name,
)
from tfmigrate.verify.loss_scaling import scale_differentiated
from tfmigrate.verify.record import Fetch, RunRecord, Step, load_step_inputs, save_step_inputs

HANDWRITTEN = FIXTURES / "handwritten"
TOWERS = HANDWRITTEN / "get_variable_towers"
SHUFFLED = HANDWRITTEN / "shuffled_input"
STEPS = 6  # the staircase schedule halves the learning rate after steps 3 and 6


def _copy(tmp_path, folder, old: str, new: str):
    """The hand-written program of ``folder`` with ``old`` replaced by ``new`` (exactly once)."""
    text = (folder / "train_tf2.py").read_text()
    assert text.count(old) == 1, old
    out = tmp_path / "train_tf2.py"
    out.write_text(text.replace(old, new))
    return out


def _statuses(outcome) -> dict[str, str]:
    return {row.quantity: row.status for row in outcome.comparison.rows}


# -- end to end (each reuses the legacy run of its fixture) -----------------------------------------


@pytest.mark.slow
def test_hand_written_program_is_equivalent_without_manifest_or_mapping(legacy_cache):
    outcome = verify(TOWERS / "legacy.py", TOWERS / "train_tf2.py", steps=STEPS, cache=legacy_cache)
    comparison = outcome.comparison
    assert comparison.verdict == cmp.EQUIVALENT, comparison.reason
    statuses = _statuses(outcome)
    for name in ("hidden/weights", "hidden/biases", "logits/weights", "logits/biases"):
        assert statuses[name] == cmp.PASS
    # the replica losses are the tower losses / 2: compared scaled, and said so
    assert statuses["loss (tower 0)"] == statuses["loss (tower 1)"] == cmp.PASS
    assert any("loss scaling" in n and "divided by 2" in n for n in comparison.notes)
    assert any("matched by name and shape" in n for n in comparison.notes)
    # the learning rate the legacy loop fetched is the one the step writes with tf.summary
    assert statuses["learning_rate (reduced)"] == cmp.PASS
    assert comparison.steps_compared == STEPS
    assert not any("could not be fingerprinted" in n for n in comparison.notes)  # inputs compared


@pytest.mark.slow
def test_an_eager_step_is_a_step_too(tmp_path, legacy_cache):
    eager = _copy(tmp_path, TOWERS, "  @tf.function\n  def train_step", "  def train_step")
    outcome = verify(TOWERS / "legacy.py", eager, steps=STEPS, cache=legacy_cache)
    assert outcome.comparison.verdict == cmp.EQUIVALENT, outcome.comparison.reason
    assert outcome.comparison.steps_compared == STEPS
    assert not any(
        "could not be fingerprinted" in n for n in outcome.comparison.notes
    )  # strategy.run's batch
    assert not any(
        "sgd/iteration" in n for n in outcome.comparison.notes
    )  # the counter is the optimizer's


@pytest.mark.slow
def test_a_keras_fit_program_is_verified_through_a_mapping_of_its_weight_paths(
    tmp_path, legacy_cache
):
    mapping = tmp_path / "mapping.json"
    mapping.write_text(
        json.dumps(
            {
                f"{layer}/{tf1}": f"classifier/{layer}/{keras}"
                for layer in ("hidden", "logits")
                for tf1, keras in (("weights", "kernel"), ("biases", "bias"))
            }
        )
    )
    outcome = verify(
        TOWERS / "legacy.py",
        TOWERS / "train_fit.py",
        steps=STEPS,
        cache=legacy_cache,
        mapping=mapping,
    )
    comparison = outcome.comparison
    assert comparison.verdict == cmp.EQUIVALENT, comparison.reason
    assert _statuses(outcome)["loss (tower 1)"] == _statuses(outcome)["logits/weights"] == cmp.PASS
    assert any("loss scaling" in n for n in comparison.notes)
    assert not any(
        "loss/total" in n for n in comparison.notes
    )  # fit's loss tracker is not a weight


@pytest.mark.slow
def test_learning_rate_ten_percent_higher_diverges(tmp_path, legacy_cache):
    mutant = _copy(tmp_path, TOWERS, "args.lr, decay_steps=3", "args.lr * 1.1, decay_steps=3")
    outcome = verify(TOWERS / "legacy.py", mutant, steps=STEPS, cache=legacy_cache)
    assert outcome.comparison.verdict == cmp.DIVERGED
    assert outcome.comparison.exit_code == 1
    # the learning rate the step writes differs from step 1 on, before any update; the weights
    # after that first update differ too
    first = outcome.comparison.first_divergence
    assert (first["step"], first["quantity"]) == (1, "learning_rate (reduced)")
    assert first["phase"] == "fetched before the update of step"
    statuses = _statuses(outcome)
    assert statuses["loss (tower 0)"] == cmp.FAIL and statuses["hidden/weights"] == cmp.FAIL


@pytest.mark.slow
def test_shuffled_legacy_input_is_equivalent_only_with_replayed_inputs(legacy_cache):
    legacy, migrated = SHUFFLED / "legacy.py", SHUFFLED / "train_tf2.py"
    own = verify(legacy, migrated, steps=STEPS, cache=legacy_cache)
    assert own.comparison.verdict == cmp.COULD_NOT_RUN and own.comparison.exit_code == 2
    assert "different inputs" in own.comparison.reason
    assert any("--replay-inputs" in n for n in own.comparison.notes)

    replayed = verify(legacy, migrated, steps=STEPS, cache=legacy_cache, replay_inputs=True)
    comparison = replayed.comparison
    assert comparison.verdict == cmp.EQUIVALENT, comparison.reason
    assert {"net/hidden/kernel", "net/out/bias"} <= {
        r.quantity for r in comparison.rows if r.status == cmp.PASS
    }
    assert any("input pipeline itself was not compared" in n for n in comparison.notes)
    losses = [r for r in comparison.rows if r.category == "loss"]
    assert len(losses) == 2 and all(r.status == cmp.PASS for r in losses)


@pytest.mark.slow
def test_replayed_batches_that_fit_no_migrated_input_name_both_structures(tmp_path, legacy_cache):
    # the migrated labels are floats: no legacy batch has their shape and kind
    migrated = _copy(
        tmp_path, SHUFFLED, "argmax(axis=1)).astype(np.int32)", "argmax(axis=1)).astype(np.float32)"
    )
    outcome = verify(
        SHUFFLED / "legacy.py", migrated, steps=STEPS, cache=legacy_cache, replay_inputs=True
    )
    reason = outcome.comparison.reason
    assert outcome.comparison.exit_code == 2
    assert "do not fit" in reason and "int32 [16] x2" in reason and "float32 [16] x2" in reason
    assert "\n" not in reason


@pytest.mark.slow
def test_program_that_never_reaches_a_training_step_times_out_with_a_one_line_reason(
    tmp_path, legacy_cache
):
    migrated = _copy(
        tmp_path,
        TOWERS,
        "  for step, (rows, labels) in enumerate(dist_data):",
        "  import time\n  while True:\n    time.sleep(0.2)\n  for step, (rows, labels) in enumerate(dist_data):",
    )
    # the legacy run comes from the cache (made here if no other test made it yet), so that
    # only the migrated side runs under the short limit, however loaded the machine is
    warm = verify(TOWERS / "legacy.py", TOWERS / "train_tf2.py", steps=STEPS, cache=legacy_cache)
    assert warm.comparison.verdict == cmp.EQUIVALENT, warm.comparison.reason
    outcome = verify(TOWERS / "legacy.py", migrated, steps=STEPS, cache=legacy_cache, timeout=25)
    assert outcome.comparison.exit_code == 2
    assert (
        outcome.comparison.reason
        == "the migrated side reached no training step in 25 s (timed out)"
    )


@pytest.mark.slow
def test_program_without_a_visible_optimizer_and_unmatched_variables_exit_2(tmp_path, legacy_cache):
    by_hand = _copy(
        tmp_path,
        TOWERS,
        "    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))",
        "    for v, g in zip(variables, tape.gradient(loss, variables)):\n      v.assign_sub(0.4 * g)",
    )
    outcome = verify(TOWERS / "legacy.py", by_hand, steps=STEPS, cache=legacy_cache)
    assert outcome.comparison.exit_code == 2
    assert "no training step recognised" in outcome.comparison.reason

    (tmp_path / "renamed").mkdir()
    renamed = _copy(tmp_path / "renamed", TOWERS, "name='hidden/weights'", "name='dense/kernel'")
    outcome = verify(TOWERS / "legacy.py", renamed, steps=STEPS, cache=legacy_cache)
    reason = outcome.comparison.reason
    assert outcome.comparison.exit_code == 2
    assert "legacy only: global_step [], hidden/weights [12, 16]" in reason
    assert "migrated only: dense/kernel [12, 16]" in reason

    # a mapping names the pair verify cannot find; the other variables still match by name
    mapping = tmp_path / "mapping.json"
    mapping.write_text(json.dumps({"hidden/weights": "dense/kernel"}))
    outcome = verify(
        TOWERS / "legacy.py", renamed, steps=STEPS, cache=legacy_cache, mapping=mapping
    )
    assert outcome.comparison.verdict == cmp.EQUIVALENT, outcome.comparison.reason
    assert _statuses(outcome)["hidden/weights"] == _statuses(outcome)["hidden/biases"] == cmp.PASS


# -- units (no TensorFlow) --------------------------------------------------------------------------


def _shapes(**named):
    return {k.replace("__", "/"): (v, np.dtype(np.float32)) for k, v in named.items()}


def test_names_match_across_a_model_prefix_and_slashes_for_underscores():
    legacy = _shapes(net__hidden__kernel=(3, 4), net__hidden__bias=(4,), conv1__weights=(2, 2))
    migrated = _shapes(model__net__hidden__kernel=(3, 4), hidden__bias=(4,), conv1_weights=(2, 2))
    mapping, ambiguous = match_by_name(legacy, migrated)
    assert mapping == {
        "net/hidden/kernel": "model/net/hidden/kernel",
        "net/hidden/bias": "hidden/bias",
        "conv1/weights": "conv1_weights",
    }
    assert not ambiguous


def test_same_name_wins_and_equal_tails_of_equal_shape_are_ambiguous_not_guessed():
    legacy = _shapes(a__w=(2,), b__w=(2,), w=(2,))
    mapping, ambiguous = match_by_name(legacy, _shapes(w=(2,), x__y=(2,)))
    assert mapping == {"w": "w"}  # a/w and b/w fit no remaining variable
    mapping, ambiguous = match_by_name(_shapes(c__w=(2,)), _shapes(m1__w=(2,), m2__w=(2,)))
    assert mapping == {} and ambiguous == {"c/w": ["m1/w", "m2/w"]}
    mapping, _ = match_by_name(_shapes(kernel=(2, 3)), _shapes(kernel=(3, 2)))
    assert mapping == {}  # a shape that differs is no match


def test_dtypes_convert_only_when_exact():
    assert _convertible(np.array(3.0, np.float32), np.dtype(np.int64))
    assert not _convertible(np.array(3.5, np.float32), np.dtype(np.int64))
    assert _convertible(np.arange(3, dtype=np.int32), np.dtype(np.float32))


def _record(side, steps, devices=2):
    return RunRecord(
        side=side,
        devices=devices,
        steps=[Step(step=i + 1, seconds=0.0, fetches=f) for i, f in enumerate(steps)],
    )


def test_loss_scaling_is_detected_from_step_one_and_applied_to_every_step():
    legacy = _record(
        "legacy",
        [
            [
                Fetch("tower_0/xent", "xent", 0, 2.0),
                Fetch("tower_1/xent", "xent", 1, 3.0),
                Fetch("lr", "lr", None, 0.1),
            ],
            [Fetch("tower_0/xent", "xent", 0, 1.5), Fetch("tower_1/xent", "xent", 1, 2.5)],
        ],
    )
    migrated = _record(
        "migrated",
        [
            [
                Fetch("loss[0]", "loss", 0, 1.0, source="differentiated"),
                Fetch("loss[1]", "loss", 1, 1.5, source="differentiated"),
            ],
            [
                Fetch("loss[0]", "loss", 0, 0.7, source="differentiated"),
                Fetch("loss[1]", "loss", 1, 1.25, source="differentiated"),
            ],
        ],
    )
    notes = scale_differentiated(legacy, migrated)
    assert [(f.name, f.value, f.scale) for f in migrated.steps[1].fetches] == [
        ("xent[0]", 1.4, 2.0),
        ("xent[1]", 2.5, 2.0),
    ]
    assert len(notes) == 1 and "divided by 2" in notes[0]
    unscaled = _record(
        "migrated",
        [
            [
                Fetch("loss[0]", "loss", 0, 2.0, source="differentiated"),
                Fetch("loss[1]", "loss", 1, 3.0, source="differentiated"),
            ]
        ],
    )
    assert "as it is" in scale_differentiated(legacy, unscaled)[0]
    wrong = _record(
        "migrated",
        [
            [
                Fetch("loss[0]", "loss", 0, 5.0, source="differentiated"),
                Fetch("loss[1]", "loss", 1, 3.0, source="differentiated"),
            ]
        ],
    )
    assert "matches no per-tower legacy fetch" in scale_differentiated(legacy, wrong)[0]
    assert wrong.steps[0].fetches[0].base == "loss"


def test_step_inputs_round_trip_and_pair_by_position_then_shape(tmp_path):
    x, y = np.ones((4, 3), np.float32), np.arange(4)
    save_step_inputs(tmp_path / "inputs.npz", [[("x", [x, x]), ("y", [y])], [], [("y", [y])]])
    steps = load_step_inputs(tmp_path / "inputs.npz")
    assert [[(n, len(p)) for n, p in s] for s in steps] == [[("x", 2), ("y", 1)], [], [("y", 1)]]
    legacy = [("x", [x]), ("y", [y])]
    assert _pair(legacy, [[x], [y]]) == [0, 1]
    assert _pair(legacy, [[y], [x]]) == [1, 0]  # by shape and dtype when the order differs
    assert _pair(legacy, [[np.ones((4, 5), np.float32)], [y]]) is None


def test_a_program_defining_the_older_entry_point_is_recognised_without_importing_it(tmp_path):
    """(its function is ignored: the program runs as written, with a note)"""
    script = tmp_path / "p.py"
    script.write_text(
        "import sys\nsys.exit(3)\ndef " + OLD_ENTRY_POINT + "(strategy, argv):\n  return {}\n"
    )
    assert defines_function(script, OLD_ENTRY_POINT)
    assert not defines_function(TOWERS / "train_tf2.py", OLD_ENTRY_POINT)
