"""bench/realworld.py: classification of corpus programs, on a tiny corpus written here."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"


def _load_bench():
    spec = importlib.util.spec_from_file_location(
        "realworld_bench", REPO / "bench" / "realworld.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building the class
    spec.loader.exec_module(module)
    return module


bench = _load_bench()

HEADER = "repo\tcommit\tlicense\tentry_script\tother_extracted_paths\tstyle_notes\tdata\n"

PY2_TOWERS = """\
import tensorflow as tf

def train():
    opt = tf.train.GradientDescentOptimizer(0.1)
    x = tf.placeholder(tf.float32, [None, 4])
    tower_grads = []
    for i in xrange(2):
        with tf.device('/gpu:%d' % i):
            loss = tf.reduce_mean(tf.layers.dense(x, 1))
            tower_grads.append(opt.compute_gradients(loss))
    print "built", len(tower_grads)
"""


def _corpus(root: Path) -> Path:
    corpus = root / "corpus"
    shutil.copytree(FIXTURES / "towers" / "cifar_average", corpus / "ours+towers")
    (corpus / "ours+py2").mkdir(parents=True)
    (corpus / "ours+py2" / "train.py").write_text(PY2_TOWERS, encoding="utf-8")
    (corpus / "INDEX.tsv").write_text(
        HEADER
        + "ours/towers\t0\tApache-2.0\ttrain.py\t\tTOWER. agg: average_gradients.\tnone\n"
        + "ours/py2\t0\tApache-2.0\ttrain.py\t\tTOWER. Python 2 only.\tnone\n",
        encoding="utf-8",
    )
    return corpus


def test_tiny_corpus_rows_through_the_cli(tmp_path: Path, capsys) -> None:
    corpus = _corpus(tmp_path)
    out_md, out_json = tmp_path / "table.md", tmp_path / "table.json"
    status = bench.main(
        ["--corpus", str(corpus), "--markdown", str(out_md), "--json", str(out_json)]
    )
    assert status == 0
    printed = capsys.readouterr().out
    assert "ours/towers:train.py" in printed and "ours/py2:train.py" in printed

    payload = json.loads(out_json.read_text(encoding="utf-8"))
    towers, py2 = payload["rows"]
    assert (towers["repo"], py2["repo"]) == ("ours/towers", "ours/py2")

    # The fixture converts through the whole-program converter.
    assert towers["whole_program"] and towers["converter"] == "TFM303"
    assert towers["outcome"].startswith("converted")
    assert towers["compiles"] is True and towers["undefined_names"] == 0
    assert towers["legacy_statements"] > 0 and towers["legacy_code_lines"] > 0
    assert towers["code_line_ratio"] == towers["converted_code_lines"] / towers["legacy_code_lines"]
    assert towers["trains"] == "not run: no fake-data recipe"
    assert towers["lines_added"] > 0 and towers["measured_files"] == ["train.py"]
    assert towers["counts_as_converted"] == (
        not towers["banned_outside_todo"] and towers["todo_share"] <= bench.MAX_TODO_SHARE
    )

    assert py2["outcome"] == "refused: Python 2"
    assert "Python 2 syntax at line" in py2["detail"]
    assert not py2["whole_program"] and py2["compiles"] is False
    assert py2["undefined_names"] is None  # ruff cannot parse it either
    assert (py2["lines_added"], py2["lines_removed"]) == (0, 0)
    assert not py2["counts_as_converted"]

    summary = payload["summary"]
    assert summary["programs"] == 2 and summary["python2"] == 1
    assert summary["whole_program_applied"] == 1 and summary["compile"] == 1
    assert summary["converted"] == int(towers["counts_as_converted"])
    assert summary["tower_horovod_python3"] == 1
    assert "| ours/py2:train.py | tower | refused: Python 2 |" in out_md.read_text(encoding="utf-8")

    # --only filters by folder/entry.
    rows = bench.measure_corpus(corpus, only="ours+py2")
    assert [r.repo for r in rows] == ["ours/py2"]


@pytest.mark.slow
def test_a_converted_program_trains_three_steps_under_verify_s_instrumentation(
    tmp_path: Path, monkeypatch
) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    import fake_data

    corpus = _corpus(tmp_path)
    key = ("ours/towers", "train.py")
    monkeypatch.setitem(fake_data.RECIPES, key, lambda tree: fake_data.Trial())
    (row,) = bench.measure_corpus(corpus, only="ours+towers")
    assert row.whole_program and row.trains == "yes (3 steps)", row.trains
    assert bench.summarize([row])["trains"] == 1
    # the same converted tree: a command line the program rejects is how it failed, not a
    # crash of the bench; a recipe that says why not is shown as such
    (program,) = [p for p in bench.read_index(corpus) if p.repo == "ours/towers"]
    out = tmp_path / "out"
    bench.run_rewrite(corpus / "ours+towers", out)
    monkeypatch.setitem(fake_data.RECIPES, key, lambda tree: fake_data.Trial(args=("--bogus",)))
    (tmp_path / "bogus").mkdir()
    assert bench.run_trial(program, out, tmp_path / "bogus") == "no: exited with status 2"
    monkeypatch.setitem(fake_data.RECIPES, key, "needs pretrained weights")
    assert bench.run_trial(program, out, tmp_path) == "not run: needs pretrained weights"


def test_missing_corpus_is_a_clear_error(tmp_path: Path, capsys) -> None:
    assert bench.main(["--corpus", str(tmp_path / "nowhere")]) == 2
    assert "no corpus at" in capsys.readouterr().err


CONVERTED = """\
import tensorflow as tf

strategy = tf.distribute.MirroredStrategy()
# TODO(tfmigrate): TFM310 a queue runner has no TF2 form; commented out
# coord = tf.train.Coordinator()
# threads = tf.train.start_queue_runners(coord=coord)
summary_op = tf.compat.v1.get_collection("summaries")  # TODO(tfmigrate): TFM311 summaries kept
# TODO(tfmigrate): TFM312 restore a TF1 checkpoint by hand
if restore:
    saver = tf.compat.v1.train.Saver()
    sess = tf.compat.v1.Session()
# An ordinary comment about placeholder and Session.
x = "tf.placeholder in a string"
# saver.restore(sess, path)  # TODO(tfmigrate): TFM314 restore the TF1 checkpoint by hand
y = tf.compat.v1.placeholder(tf.float32)
"""


def test_todo_scan_covers_trailing_standalone_and_commented_out_code() -> None:
    scan = bench.scan_todos(CONVERTED)
    assert scan.codes == ["TFM310", "TFM311", "TFM312", "TFM314"]
    # 2 commented-out statements + the trailing one + the `if` block (if, 2 assignments) + the
    # commented-out restore that carries its own marker.
    assert scan.statements == 2 + 1 + 3 + 1
    assert scan.commented_code_lines == 2 + 1
    # Names under a TODO are not counted; the placeholder on the last line is.
    assert bench.banned_names(CONVERTED, scan.covered_lines) == ["placeholder"]


def test_wrapped_todo_prose_is_not_counted_as_code() -> None:
    text = textwrap.dedent(
        """\
        # TODO(tfmigrate): TFM313 the hand-written update
        #   is kept as it was
        #   needs
        update = custom_adam(grads)
        """
    )
    scan = bench.scan_todos(text)
    assert scan.statements == 0 and scan.commented_code_lines == 0


def _run(tmp_path: Path, legacy: str, written: str | None, summary: dict | None) -> object:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir(parents=True)
    (src / "train.py").write_text(legacy, encoding="utf-8")
    if written is not None:
        out.mkdir()
        (out / "train.py").write_text(written, encoding="utf-8")
    return bench.FolderRun(src, out, 1, summary, "Traceback ...\nValueError: boom\n", 0.1)


PROGRAM = bench.Program("o/n", "train.py", ("lib.py", "LICENSE"), "TOWER. x", "none")
LEGACY = "import tensorflow as tf\nsess = tf.Session()\nx = 1\ny = 2\nz = 3\n"


def test_classify_converted_with_todos(tmp_path: Path) -> None:
    written = (
        "import tensorflow as tf\n"
        "# TODO(tfmigrate): TFM320 no TF2 form\n"
        "# sess = tf.Session()\n"
        "x = 1\ny = 2\nz = 3\n"
    )
    summary = {
        "files": [{"path": "train.py", "changed": True, "applied": ["TFM303"], "error": None}],
        "findings": [
            {
                "path": "train.py",
                "line": 2,
                "code": "TFM303",
                "message": "converted",
                "applied": True,
            }
        ],
    }
    row = bench.classify(PROGRAM, _run(tmp_path, LEGACY, written, summary))
    assert row.whole_program and row.outcome == "converted with 1 TODO"
    assert row.todo_codes == ["TFM320"] and row.todo_statements == 1
    assert row.legacy_statements == 5 and row.todo_share == pytest.approx(0.2)
    assert row.converted_code_lines == row.legacy_code_lines == 5  # the commented line counts
    assert row.banned_outside_todo == [] and row.compiles and row.undefined_names == 0
    assert row.counts_as_converted


def test_a_converted_program_with_a_new_undefined_name_does_not_count(tmp_path: Path) -> None:
    written = "import tensorflow as tf\nwith strategy.scope():\n    x = 1\ny = 2\nz = 3\n"
    summary = {
        "files": [],
        "findings": [
            {
                "path": "train.py",
                "line": 2,
                "code": "TFM303",
                "message": "converted",
                "applied": True,
            }
        ],
    }
    row = bench.classify(PROGRAM, _run(tmp_path, LEGACY, written, summary))
    assert row.outcome == "converted" and row.compiles
    assert (row.undefined_names, row.legacy_undefined_names) == (1, 0)
    assert not row.counts_as_converted


def test_classify_refusal_names_the_line_and_reason(tmp_path: Path) -> None:
    message = "Horovod: the script is not converted (line 4): the main block is not `main()`"
    summary = {
        "files": [{"path": "./train.py", "changed": False, "applied": [], "error": None}],
        "findings": [
            {"path": "lib.py", "line": 9, "code": "TFM303", "message": "not converted: x"},
            {"path": "train.py", "line": 1, "code": "TFM401", "message": message},
            {
                "path": "other.py",
                "line": 1,
                "code": "TFM303",
                "message": "converted",
                "applied": True,
            },
        ],
    }
    row = bench.classify(PROGRAM, _run(tmp_path, LEGACY, LEGACY, summary))
    assert row.outcome == "refused" and not row.whole_program  # other.py is not this program's
    assert (row.converter, row.refusal_path, row.refusal_line) == ("TFM401", "train.py", 4)
    assert row.detail == "the main block is not `main()`"
    assert row.banned_outside_todo == ["Session"] and not row.counts_as_converted


def test_classify_tool_failure_is_a_row(tmp_path: Path) -> None:
    row = bench.classify(PROGRAM, _run(tmp_path, LEGACY, None, None))
    assert row.outcome == "error" and row.detail.endswith("ValueError: boom")
    summary = {
        "files": [{"path": "train.py", "error": "internal error: a rule crashed on train.py"}],
        "findings": [],
    }
    row = bench.classify(PROGRAM, _run(tmp_path / "b", LEGACY, None, summary))
    assert row.outcome == "error" and row.detail.startswith("internal error")
    assert row.compiles is True  # measured on the file as it stands
    # Exit 2 with no file to blame: the run failed as a whole.
    failed = _run(tmp_path / "c", LEGACY, None, {"files": [], "findings": []})
    failed.returncode = 2
    row = bench.classify(PROGRAM, failed)
    assert row.outcome == "error" and row.detail == "tfmigrate rewrite exited 2: ValueError: boom"


def test_the_real_corpus_index_reads_as_documented() -> None:
    if not (bench.DEFAULT_CORPUS / "INDEX.tsv").is_file():
        pytest.skip("the real-world corpus is not next to the repository")
    programs = bench.read_index(bench.DEFAULT_CORPUS)
    assert len(programs) == 29
    kinds = [p.kind for p in programs]
    # 5 Keras-era programs; the other 24 are tower and Horovod-TF1 ones (one of them Python 2).
    assert kinds.count("keras") == 5 and kinds.count("tower") + kinds.count("horovod") == 24
    for program in programs:
        assert (bench.DEFAULT_CORPUS / program.folder / program.entry).is_file(), program


def test_refusals_group_by_reason_without_program_names() -> None:
    def refused(detail: str) -> object:
        return bench.Row("o/n", "t.py", "tower", outcome="refused", detail=detail)

    rows = [
        refused("the towers are built in the method `A.build`; the program is left as it was"),
        refused("the towers are built in the method `B.__init__`; the program is left as it was"),
        refused("more than one tower loop"),
        bench.Row("o/n", "t.py", "tower", outcome="converted", detail="converted `x`"),
    ]
    assert bench.refusal_reasons(rows) == [
        (2, "the towers are built in the method `…`"),
        (1, "more than one tower loop"),
    ]


def test_the_trains_cell_quotes_the_line_that_names_the_exception() -> None:
    spec = importlib.util.spec_from_file_location("trial_boot", REPO / "bench" / "trial_boot.py")
    boot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(boot)
    # a message whose repr spans lines: its first line, not the closing brace
    spanning = "TypeError: Variable is unhashable. (Variable: MirroredVariable:{\n  0: <v>\n})\n"
    assert (
        boot._quoted(spanning) == "TypeError: Variable is unhashable. (Variable: MirroredVariable:{"
    )
    # autograph's wrapper: the user's own exception, quoted last in the message
    wrapped = 'TypeError: in user code:\n\n    File "t.py", line 3\n    TypeError: bad operand\n'
    assert boot._quoted(wrapped) == "TypeError: bad operand"
