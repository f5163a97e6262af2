"""The staged conversion of towers that only compute losses, combined after the loop into one
loss differentiated once (``colocate_gradients_with_ops``): each spelling of the combination
becomes the replica's share of it, and ``minimize`` or ``compute_gradients`` becomes the tape's
gradients and ``apply_gradients``. Variants of fixtures/towers/colocated_loss, rewritten."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from conftest import run_cli

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "fixtures" / "towers" / "colocated_loss" / "train.py"
COMBINE = "    total_loss = tf.reduce_mean(tower_losses)\n"
MINIMIZE = (
    "    train_op = opt.minimize(total_loss, global_step=global_step,\n"
    "                            colocate_gradients_with_ops=True)\n"
)


def _code_names(tree: ast.AST) -> set[str]:
    """Names, attributes and keywords of the code (not its docstrings)."""
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    return names | {k.arg for k in ast.walk(tree) if isinstance(k, ast.keyword) and k.arg}


def _rewrite(tmp_path: Path, **replace: str) -> tuple[str, dict]:
    """The fixture with ``replace``'s texts swapped in, rewritten: the new source and the
    TFM303 finding."""
    source = FIXTURE.read_text()
    for old, new in replace.values():
        assert old in source, old
        source = source.replace(old, new)
    folder = tmp_path / "program"
    folder.mkdir()
    (folder / "train.py").write_text(source)
    result = run_cli("rewrite", "--out", tmp_path / "out", "--format", "json", folder)
    (finding,) = [f for f in json.loads(result.stdout)["findings"] if f["code"] == "TFM303"]
    out = tmp_path / "out" / "train.py"
    return (out.read_text() if out.exists() else ""), finding


@pytest.mark.parametrize(
    ("combination", "replica_loss"),
    [
        ("tf.reduce_mean(tower_losses)",
         "replica_loss = tf.reduce_mean(tower_losses) / strategy.num_replicas_in_sync"),
        ("tf.add_n(tower_losses) / len(tower_losses)",
         "replica_loss = (tf.add_n(tower_losses) / len(tower_losses)) / strategy.num_replicas_in_sync"),
        # divided by a constant, the sum is each replica's part of it as is
        ("tf.add_n(tower_losses) / args.num_gpus",
         "replica_loss = tf.add_n(tower_losses) / args.num_gpus"),
        ("sum(tower_losses)", "replica_loss = sum(tower_losses)"),
        ("tf.reduce_sum(tf.stack(tower_losses)) * 0.5",
         "replica_loss = tf.reduce_sum(tf.stack(tower_losses)) * 0.5"),
    ],
)  # fmt: skip
def test_each_combination_becomes_the_replicas_share(tmp_path, combination, replica_loss):
    source, finding = _rewrite(tmp_path, combine=(COMBINE, f"    total_loss = {combination}\n"))
    assert finding["applied"], finding["message"]
    assert replica_loss in source
    # the fetched total is the sum of the replicas' shares, the update the tape's gradients
    assert 'total_loss = strategy.reduce("SUM", outputs, axis=None)' in source
    assert "grads = tape.gradient(replica_loss, variables)" in source
    assert "opt.apply_gradients(zip(grads, variables), global_step=global_step)" in source
    code = ast.parse(source)
    assert not {"minimize", "colocate_gradients_with_ops"} & _code_names(code)


def test_minimize_keeps_its_var_list_and_positional_global_step(tmp_path):
    source, finding = _rewrite(
        tmp_path,
        minimize=(
            MINIMIZE,
            "    train_op = opt.minimize(total_loss, global_step, tf.trainable_variables(),\n"
            "                            colocate_gradients_with_ops=True, name='train')\n",
        ),
    )
    assert finding["applied"], finding["message"]
    assert "variables = tf1_variables.trainable_variables" in source
    assert (
        "opt.apply_gradients(zip(grads, variables), global_step=global_step, name='train')"
        in source
    )


def test_compute_gradients_of_the_one_loss_then_apply_gradients(tmp_path):
    source, finding = _rewrite(
        tmp_path,
        minimize=(
            MINIMIZE,
            "    grads = opt.compute_gradients(total_loss, colocate_gradients_with_ops=True)\n"
            "    train_op = opt.apply_gradients(grads, global_step=global_step)\n",
        ),
    )
    assert finding["applied"], finding["message"]
    assert "grads = list(zip(tape.gradient(replica_loss, variables), variables))" in source
    assert "opt.apply_gradients(grads, global_step=global_step)" in source
    assert "compute_gradients" not in _code_names(ast.parse(source))


def test_a_combination_that_is_not_linear_in_the_towers_losses_is_refused(tmp_path):
    source, finding = _rewrite(
        tmp_path, combine=(COMBINE, "    total_loss = tf.sqrt(tf.reduce_mean(tower_losses))\n")
    )
    assert not finding["applied"]
    assert (
        "`tf.sqrt(tf.reduce_mean(tower_losses))` is not a mean or sum over a list"
        in (finding["message"])
    )
