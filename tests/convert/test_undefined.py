"""The legacy program's own undefined names: the statements that read them are commented out
under TFM318, and what reads a name they bound under TFM314 (migrate/convert/undefined.py)."""

from __future__ import annotations

import textwrap

import libcst as cst

from tfmigrate.convert.emit import mark_leftovers
from tfmigrate.convert.todo import Todo
from tfmigrate.convert.undefined import undefined_out
from tfmigrate.names import NameResolver

SOURCE = textwrap.dedent(
    """\
    import os


    def model_fn(loss):
        train_op = optimization.create_optimizer(loss, 0.1)
        spec = dict(loss=loss, train_op=train_op)
        return spec


    def report(path):
        result = estimator.evaluate(steps=10)
        for key in sorted(result):
            print(key, os.path.join(path, key), len(__file__))
    """
)


def _marked(source: str) -> tuple[str, list[str]]:
    module = cst.parse_module(source)
    marked, todos = mark_leftovers(module, NameResolver.for_module(module).qualify)
    return marked.code, [t.kind.code for t in todos]


def test_statements_reading_undefined_names_are_commented_out_with_what_depends_on_them():
    code, codes = _marked(SOURCE)
    # optimization, estimator; then spec (train_op), the loop (result); then `return spec`
    assert codes == ["TFM318", "TFM318", "TFM314", "TFM314", "TFM314"], codes
    assert (
        "# TODO(tfmigrate): TFM318 `optimization` is defined nowhere in the program: the legacy "
        "code fails here with NameError too\n    # train_op = optimization.create_optimizer(loss, 0.1)"
    ) in code
    assert "# TODO(tfmigrate): TFM314 uses `train_op`, left under a TODO above" in code
    assert "#     print(key, os.path.join(path, key), len(__file__))" in code
    assert "\n    # return spec\n" in code
    compile(code, "model.py", "exec")
    assert "pass" in code.split("def report(path):")[1]  # the emptied block stays valid


def test_a_module_that_defines_names_dynamically_is_left_as_it_is():
    source = "from helpers import *\n\nstep = optimization.create_optimizer(1)\n"
    code, codes = _marked(source)
    assert code == source and codes == []
    assert _marked("globals().update(cfg)\nprint(batch_size)\n")[1] == []


def test_a_name_bound_by_a_statement_already_under_a_todo_is_a_cascade_not_undefined():
    # what an earlier pass left: the statement commented out under its TODO (a placeholder)
    source = textwrap.dedent(
        """\
        def build(df, image):
            # TODO(tfmigrate): TFM314 uses `image`, left under a TODO above
            # feeder = Feeder(df, [image], queue_size=100)
            __tfmigrate_todo__
            batch = feeder.dequeue()
            return batch
        """
    )
    todos: list[Todo] = []
    module = cst.parse_module(source)
    out = undefined_out(
        module,
        todos,
        lambda node, todo: cst.SimpleStatementLine([cst.Expr(cst.Name("__tfmigrate_todo__"))]),
        ignore=frozenset({"__tfmigrate_todo__"}),
    )
    assert [(t.kind.code, t.why) for t in todos] == [
        ("TFM314", "uses `feeder`, left under a TODO above"),
        ("TFM314", "uses `batch`, left under a TODO above"),
    ]
    assert "feeder.dequeue()" not in out.code
