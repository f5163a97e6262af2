"""The light pass before libcst (tfmigrate.prefilter): its facts, and that it changes no result.

The differential tests run every fixture and a sample of TensorFlow's and tf_slim's own sources
with the pass on and off (``TFMIGRATE_LIGHT_PASS=0``): findings, errors, rewritten bytes and
manifests must be identical, in process and through the real command line.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import shutil
import textwrap
from pathlib import Path, PurePosixPath

import libcst as cst
import pytest

from tfmigrate import engine, prefilter
from tfmigrate.engine import Settings, process_source
from tfmigrate.names import NameResolver
from tfmigrate.processing import process_file
from tfmigrate.registry import all_rules, select_rules
from tfmigrate.rule import Rule

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
FIXTURE_SOURCES = sorted(p for p in FIXTURES.rglob("*") if p.suffix in (".py", ".ipynb"))


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _site_sample(count: int) -> list[Path]:
    """TF-era library sources that mention most trigger words: evenly spread, small files."""
    pool: list[Path] = []
    for package, sub in (("tf_slim", ""), ("tensorflow", "python")):
        root = _package_dir(package)
        if root is not None:
            pool += sorted(p for p in (root / sub).rglob("*.py") if p.stat().st_size < 30_000)
    if len(pool) <= count:
        return pool
    step = len(pool) / count
    return [pool[int(i * step)] for i in range(count)]


SITE_SAMPLE = _site_sample(30)


def _outcome(path: Path, settings: Settings) -> dict[str, object]:
    result = process_file(path, path.name, settings)
    return {
        "findings": [f.to_json() for f in result.findings],
        "error": result.error,
        "new": result.new,
        "manifest": result.manifest,
    }


# Whole tower programs (converted by TFM303, seconds each) are left to the CLI test below.
SMALL_FIXTURES = [
    p
    for p in FIXTURE_SOURCES
    if p.stat().st_size < 3_000 and not {"towers", "migrated"} & set(p.relative_to(FIXTURES).parts)
]


@pytest.mark.parametrize("fix", [False, True], ids=["scan", "rewrite"])
def test_same_results_with_and_without_light_pass(fix, monkeypatch):
    settings = Settings(rules=select_rules(), fix=fix, unsafe_fixes=fix)
    paths = SMALL_FIXTURES + SITE_SAMPLE
    differences = []
    skipped = 0
    for path in paths:
        monkeypatch.setenv("TFMIGRATE_LIGHT_PASS", "0")
        full = _outcome(path, settings)
        monkeypatch.setenv("TFMIGRATE_LIGHT_PASS", "1")
        light = _outcome(path, settings)
        if light != full:
            differences.append(path)
        facts = prefilter.code_facts(path.read_bytes()) if path.suffix == ".py" else None
        if facts is not None and not prefilter.possible_rules(facts, settings.rules):
            skipped += 1
    assert differences == []
    assert any(_outcome(path, settings)["findings"] for path in SMALL_FIXTURES)
    # The comparison means something only if the pass did rule files out.
    if SITE_SAMPLE:
        assert skipped >= len(SITE_SAMPLE) // 2


# What the rules' former word triggers (``grad``, ``keras``, ...) let through and the narrower
# ones may not: TensorFlow's own sources that spell those words.
_FORMER_WORDS = (
    *(b"grad", b"distribute", b"keras", b"compile", b"backend", b"reduce_mean"),
    *(b"ConfigProto", b"UPDATE_OPS", b"VariableV2", b"colocate_gradients", b"trainable"),
)


def _word_sample(count: int) -> list[Path]:
    pool = [p for p in _site_sample(400) if any(w in p.read_bytes() for w in _FORMER_WORDS)]
    step = max(1, len(pool) // count)
    return pool[::step][:count]


def _example_outcomes(settings: Settings) -> list[object]:
    outcomes = []
    for rule in all_rules():
        for code in (*rule.valid, *(example.code for example in rule.invalid)):
            source = textwrap.dedent(code)
            result = process_source(source, "example.py", settings)
            outcomes.append(([f.to_json() for f in result.findings], result.error))
    return outcomes


@pytest.mark.parametrize("fix", [False, True], ids=["scan", "rewrite"])
def test_triggers_leave_out_only_rules_that_cannot_report(fix, monkeypatch):
    """Every rule run on every file (no triggers) finds and rewrites exactly what the triggered
    run does: on each rule's own examples, the small fixtures and TF sources."""
    settings = Settings(rules=select_rules(), fix=fix, unsafe_fixes=fix)
    paths = [] if fix else SMALL_FIXTURES + _word_sample(24)  # rewrite: the examples
    triggered = [_outcome(path, settings) for path in paths], _example_outcomes(settings)
    for rule in all_rules():
        monkeypatch.setattr(rule, "triggers", None)
        monkeypatch.setattr(rule, "may_report", classmethod(lambda cls, path, facts: True))
    untriggered = [_outcome(path, settings) for path in paths], _example_outcomes(settings)
    assert [p for p, a, b in zip(paths, triggered[0], untriggered[0], strict=True) if a != b] == []
    assert triggered[1] == untriggered[1]
    assert sum(bool(findings) for findings, _ in triggered[1]) > 50


@pytest.mark.slow  # every fixture, tower conversions included
def test_cli_rewrite_identical_with_and_without_light_pass(tmp_path, cli):
    tree = tmp_path / "tree"
    # the small fixtures and one tower program: the light pass decides per file, and each
    # further whole-program conversion would only repeat the tower fixture's case
    shutil.copytree(FIXTURES, tree / "fixtures", ignore=shutil.ignore_patterns("goldens", "towers"))
    shutil.copytree(FIXTURES / "towers" / "cifar_average", tree / "fixtures" / "towers" / "c")
    (tree / "site").mkdir()
    for index, source in enumerate(SITE_SAMPLE[:12]):
        shutil.copyfile(source, tree / "site" / f"{index}_{source.name}")
    outputs = {}
    for flag in ("1", "0"):
        env = {"TFMIGRATE_LIGHT_PASS": flag}
        out = tmp_path / f"out{flag}"
        # rewrite's JSON lists every finding, as scan would, plus those on the rewritten text
        rewrite = cli(
            "rewrite", "-j", "2", "--unsafe-fixes", "--format", "json", "--out", out, tree, env=env
        )
        assert rewrite.returncode == 2, rewrite  # broken fixtures
        written = {
            p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()
        }
        outputs[flag] = (json.loads(rewrite.stdout), rewrite.stderr, written)
    on, off = outputs["1"], outputs["0"]
    assert on[0] == off[0]
    assert on[1] == off[1]
    assert on[2].keys() == off[2].keys()
    assert [k for k in on[2] if on[2][k] != off[2][k]] == []
    assert len(on[0]["findings"]) > 100
    assert any(k.endswith(".py") and on[2][k] != (tree / k).read_bytes() for k in on[2])


# -- the facts --------------------------------------------------------------------------------
def _facts(code: str, inherited: dict[str, str] | None = None) -> prefilter.CodeFacts:
    facts = prefilter.code_facts(textwrap.dedent(code), inherited)
    assert facts is not None
    return facts


def test_comments_and_docstrings_are_not_code():
    facts = _facts(
        '''
        """Builds the model on each device (see tf.train.replica_device_setter)."""
        import tensorflow as tf
        # grads = average_gradients(tower_grads)
        def f():
            """ConfigProto"""
            return tf.constant("allow_soft_placement")
        '''
    )
    assert "allow_soft_placement" in facts.words  # a string constant is code
    assert "ConfigProto" not in facts.words
    assert "replica_device_setter" not in facts.words
    assert "average_gradients" not in facts.words
    assert "ConfigProto" in facts.strings  # quoted triggers still see every string


def test_qualified_names_follow_imports_and_aliases():
    facts = _facts(
        """
        import tensorflow.compat.v1 as tf
        import tf_slim
        from tensorflow.python.ops import variables as vs
        slim = tf.contrib.slim
        from keras import optimizers as opt
        with tf.device(d):
            slim.conv2d(x)
        vs.Variable(0)
        opt.SGD(lr=0.1)
        """
    )
    assert facts.has_name("tensorflow.device")
    assert facts.matches("tensorflow.device")
    assert facts.has_name("tensorflow.contrib.slim.conv2d")
    assert facts.has_name("tensorflow.contrib.slim")  # tf_slim, canonical spelling
    assert facts.has_name("keras.optimizers")
    assert not facts.has_name("tensorflow.Variable")  # TF's own module, not tf.Variable
    assert not facts.has_name("tensorflow.dev")  # a prefix only at a dot
    assert facts.matches("lr") and facts.matches("SGD")


def test_quoted_trigger_is_an_exact_string_constant():
    facts = _facts("PS_OPS = ['Variable', 'VariableV2']\nname = 'MyVariableThing'\n")
    assert facts.matches("'VariableV2'")
    assert not facts.matches("'VarHandleOp'")
    assert not _facts("x = 'MyVariableThing'\n").matches("'Variable'")
    assert prefilter.raw_needle("'VariableV2'") == "VariableV2"
    assert prefilter.raw_needle("tensorflow.train.replica_device_setter") == (
        "replica_device_setter"
    )
    assert prefilter.raw_needle("grad") == "grad"


def test_unparsable_source_has_no_facts():
    assert prefilter.code_facts("print 'hello'\n") is None
    assert prefilter.code_facts("def f(:\n") is None
    assert prefilter.code_facts(b"x = 1\x00\n") is None


def test_inherited_bindings_count_as_imports():
    facts = _facts("with tf.device('/gpu:0'):\n    pass\n", {"tf": "tensorflow"})
    assert facts.uses_any(prefilter.TF_ROOTS)
    assert facts.has_name("tensorflow.device")
    assert not _facts("with tf.device('/gpu:0'):\n    pass\n").uses_any(prefilter.TF_ROOTS)


def _example_sources() -> list[str]:
    sources = []
    for rule in all_rules():
        sources += list(rule.valid)
        sources += [example.code for example in rule.invalid]
    for path in FIXTURE_SOURCES + SITE_SAMPLE:
        if path.suffix == ".py":
            sources.append(path.read_bytes())
    return sources


def test_bindings_equal_the_name_resolver():
    """The engine hands the light pass's bindings to the rules: they must be NameResolver's."""
    compared = 0
    for source in _example_sources():
        facts = prefilter.code_facts(source)
        if facts is None:
            continue
        try:
            module = cst.parse_module(source)
        except cst.ParserSyntaxError:
            continue
        resolver = NameResolver.for_module(module)
        assert facts.bindings == resolver.bindings, source[:200]
        assert facts.imported_modules == resolver.imported_modules, source[:200]
        compared += 1
    assert compared > 100


def test_order_of_bindings_matches_source_order():
    source = """
    import numpy as tf
    try:
        import tensorflow as tf
    except ImportError:
        pass
    finally:
        layers = tf.layers
    layers = tf.keras.layers
    from tensorflow import keras as layers2
    """
    source = textwrap.dedent(source)
    facts = _facts(source)
    assert facts.bindings == NameResolver.for_module(cst.parse_module(source)).bindings
    assert facts.bindings["layers"] == "tensorflow.layers"


# -- the engine skips libcst ------------------------------------------------------------------
class _DeviceRule(Rule):
    code = "TFM999"
    name = "test-device"
    summary = "test"
    triggers = ("tensorflow.device",)

    def visit_Call(self, node: cst.Call) -> None:
        if self.call_name(node) == "tensorflow.device":
            self.report(node, "device")


def test_no_libcst_when_no_rule_can_fire(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("libcst was reached")

    monkeypatch.setattr(engine.cst, "parse_module", refuse)
    settings = Settings(rules=(_DeviceRule,))
    # The trigger word only in a comment, a docstring and another module's `device`.
    source = (
        '"""Runs under tf.device."""\nimport tensorflow as tf\n'
        "from tensorflow.python.framework import ops\n"
        "# with tf.device('/gpu:0'):\nwith ops.device('/cpu:0'):\n    pass\n"
    )
    result = process_source(source, "a.py", settings)
    assert result.error is None and result.findings == []
    assert result.bindings["tf"] == "tensorflow"
    # No TF import at all, though TF words are everywhere.
    assert process_source("device = 'tensorflow'\n", "b.py", settings).findings == []


def test_rule_that_can_fire_still_runs():
    settings = Settings(rules=(_DeviceRule,))
    source = "import tensorflow as tf\nwith tf.device('/gpu:0'):\n    pass\n"
    result = process_source(source, "a.py", settings)
    assert [f.code for f in result.findings] == ["TFM999"]


def test_name_prefix_trigger_reads_names_as_imported():
    facts = _facts(
        """
        from tensorflow.python.keras import backend
        import tensorflow as tf
        import tensorflow.compat.v1 as tf1
        import keras_tuner
        tf.distributed.run()
        tf1.distribute.get_strategy()
        backend.sum(x)
        """
    )
    assert facts.matches("tensorflow.distribute*")  # a text prefix: `distributed` too
    distributed = _facts("import tensorflow as tf\ntf.distributed.run()\n")
    assert not distributed.matches("tensorflow.distribute")  # a qualified name stops at dots
    assert facts.matches("tensorflow.compat.v1.distribute*")
    assert facts.has_name("tensorflow.distribute.get_strategy")  # canonical: compat.v1 is TF
    assert facts.has_name("tensorflow.keras.backend.sum")  # canonical: python.keras is keras
    assert not facts.matches("tensorflow.keras*")  # but not as imported
    assert facts.matches("tensorflow.python.keras*")
    assert facts.matches("keras*")  # keras_tuner
    assert not _facts("import tensorflow as tf\n").matches("keras*")
    assert prefilter.raw_needle("tensorflow.distribute*") == "distribute"
    assert prefilter.raw_needle("keras*") == "keras"


def test_rebound_from_import_still_counts():
    facts = _facts("from tensorflow import keras\nfrom mylib import keras\n")
    assert facts.bindings["keras"] == "mylib.keras"
    assert facts.matches("tensorflow.keras*")


def test_tuple_and_pattern_triggers():
    grad = re.compile("grad", re.I)
    facts = _facts("import tensorflow as tf\nGrads = tf.GradientTape()\n")
    assert facts.matches(grad) and not facts.matches("grad")
    assert not facts.matches(("tensorflow.GradientTape", "missing"))
    assert facts.matches(("tensorflow.GradientTape", grad))
    raw = b"Grads = tf.GradientTape()"
    assert prefilter.raw_matches(("GradientTape", grad), raw)
    assert not prefilter.raw_matches(("GradientTape", re.compile(r"\bloss_fn\b")), raw)


def test_keyword_given_a_literal():
    facts = _facts(
        """
        import tensorflow as tf
        net = bn(x, trainable = False)
        params = {'decay': 0.9, 'center': True}
        """
    )
    assert facts.matches("trainable=False") and facts.matches("center=True")
    assert not facts.matches("trainable=True")
    assert not _facts("bn(x, trainable=0)\nbn(x, trainable=flag)\n").matches("trainable=False")
    assert prefilter.raw_needle("trainable=False") == "trainable"
    assert prefilter.raw_matches("trainable=False", b"bn(x, trainable = False)")


def test_facts_qualify_and_parent_ast_nodes():
    source = "import tensorflow.compat.v1 as tf\nslim = tf.contrib.slim\nslim.conv2d(x)\nf(y)\n"
    facts = _facts(source)
    calls = [n for n in facts.nodes if isinstance(n, ast.Call)]
    module = cst.parse_module(source)
    resolver = NameResolver.for_module(module)
    module_calls = [line.body[0].value for line in module.body[2:]]  # type: ignore[attr-defined]
    assert [facts.qualify(c.func) for c in calls] == [
        resolver.qualify(c.func) for c in module_calls
    ]
    assert facts.qualify(calls[0].func) == "tensorflow.contrib.slim.conv2d"
    assert isinstance(facts.parent(calls[0]), ast.Expr)
    facts.release()  # the engine drops the tree before libcst parses
    assert facts.nodes == [] and facts.parent(calls[0]) is None


# (rule code, source it cannot report in though its former trigger words are there, source
# it reports in): TensorFlow's own spellings of the words, ruled out before libcst.
_RULED_OUT = (
    (
        "TFM105",
        "from tensorflow.core.protobuf import config_pb2\n"
        "config = config_pb2.ConfigProto(allow_soft_placement=True)\n"
        "config.gpu_options.allow_growth = True\n",
        "import tensorflow as tf\nsess = tf.Session(config=tf.ConfigProto(allow_soft_placement=True))\n",
    ),
    (
        "TFM103",
        "from tensorflow.python.framework import ops\nupdates = ops.get_collection(ops.GraphKeys.UPDATE_OPS)\n"
        "update_ops = ['tower_0']\n",
        "from tensorflow.python.framework import ops\n"
        "updates = ops.get_collection(ops.GraphKeys.UPDATE_OPS, 'tower_0')\n",
    ),
    (
        "TFM111",
        "import tensorflow as tf\nPS_OPS = set(['VariableV2'])\n"
        "def place(op):\n    if op.type in PS_OPS:\n        return '/cpu:0'\n"
        "op = _apply_op_helper('VarHandleOp', name=name)\n",
        "import tensorflow as tf\n"
        "def place(op):\n    if op.type in ['VariableV2']:\n        return '/cpu:0'\n",
    ),
    (
        "TFM110",
        "import tensorflow as tf\ndef gradients(ys, xs, colocate_gradients_with_ops=False):\n"
        "    return ys\ngrads = gradients(tower_loss, v, colocate_gradients_with_ops=True)\n",
        "import tensorflow as tf\nloss = tf.add_n(tower_losses)\n"
        "grads = opt.compute_gradients(loss, colocate_gradients_with_ops=True)\n",
    ),
    (
        "TFM102",
        "import tensorflow as tf\nfor g in grads:\n    total += g\nn = tf.add_n(tower_losses)\n",
        "import tensorflow as tf\nfor g in tower_grads:\n    total += g\n",
    ),
    (
        "TFM113",
        "from tensorflow.python.keras import backend\nx = backend.floatx()\n",
        "from keras import backend as K\ny = K.sum(x)\n",
    ),
    (
        "TFM104",
        "import tensorflow as tf\nnet = tf.layers.batch_normalization(x, trainable=trainable)\n",
        "import tensorflow as tf\nnet = tf.layers.batch_normalization(x, trainable=False)\n",
    ),
)


@pytest.mark.parametrize(
    ("code", "ruled_out", "reported"), _RULED_OUT, ids=[c for c, *_ in _RULED_OUT]
)
def test_rule_ruled_out_only_where_it_cannot_report(code, ruled_out, reported, monkeypatch):
    rule = next(r for r in all_rules() if r.code == code)
    path = PurePosixPath("example.py")

    def possible(source: str) -> bool:
        return bool(prefilter.possible_rules(_facts(source), (rule,), path))

    def findings(source: str) -> list[str]:
        result = process_source(source, "example.py", Settings(rules=(rule,)))
        return [f.code for f in result.findings]

    assert not possible(ruled_out) and possible(reported)
    monkeypatch.setattr(rule, "triggers", None)
    monkeypatch.setattr(rule, "may_report", classmethod(lambda cls, path, facts: True))
    assert findings(ruled_out) == [] and findings(reported) == [code]


def test_loop_sum_fact():
    summed = """
        import tensorflow as tf
        for i, (g, _) in enumerate(tower):
            total[i] += g
        """
    assert _facts(summed).matches(prefilter.LOOP_SUM)
    assert _facts(summed.replace("+= g", "+= self.g")).matches(prefilter.LOOP_SUM)
    counter = """
        import tensorflow as tf
        for g in grads:
            steps += 1
        total += g
        """
    assert not _facts(counter).matches(prefilter.LOOP_SUM)
    assert not _facts("import tensorflow as tf\nwhile x:\n    t += x\n").matches("+=")


def test_notebook_cell_is_not_ruled_out_by_its_bytes():
    """A cell may call a name an earlier cell bound without spelling any trigger's last part."""
    settings = Settings(rules=(_DeviceRule,))
    result = process_source(
        "with dev('/gpu:0'):\n    pass\n", "c.py", settings, {"dev": "tensorflow.device"}
    )
    assert [f.code for f in result.findings] == ["TFM999"]


# -- what the engine computes per file ------------------------------------------------------
def test_positions_equal_libcst_metadata_wrapper():
    from libcst.metadata import MetadataWrapper, PositionProvider

    from tfmigrate.rule import positions

    compared = 0
    for path in [p for p in FIXTURE_SOURCES if p.suffix == ".py"] + SITE_SAMPLE[:6]:
        try:
            module = cst.parse_module(path.read_bytes())
        except cst.ParserSyntaxError:
            continue
        expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        assert dict(positions(module)) == dict(expected), path
        compared += 1
    assert compared > 20


_MODEL = """\
import tensorflow as tf

def net(x):
    return tf.layers.dense(x, 10, name='fc')
"""
_PROGRAM = """\
import tensorflow as tf
import model

def train():
    for i in range(2):
        with tf.device('/gpu:%d' % i):
            model.net(x)
"""


def test_model_module_reaches_libcst_for_tfm303_only_next_to_an_importing_program(tmp_path):
    """TFM303 reports on a model module only when a neighbouring tower program imports it: the
    light pass asks the neighbours before the module is parsed by libcst."""
    from tfmigrate.rules.tower_program import TowerProgramToMirroredStrategy as TFM303

    model = tmp_path / "model.py"
    model.write_text(_MODEL)
    facts = prefilter.code_facts(_MODEL)
    assert facts is not None and facts.matches("tensorflow.layers")

    def possible() -> tuple[type, ...]:
        return prefilter.possible_rules(facts, (TFM303,), PurePosixPath(model))

    assert possible() == ()  # alone
    (tmp_path / "notes.py").write_text("import model  # device placement is done elsewhere\n")
    assert possible() == ()  # an importer that cannot be a tower program
    (tmp_path / "train.py").write_text(_PROGRAM)
    assert possible() == (TFM303,)
    # Without the path (no neighbours to ask) the triggers alone decide, as before.
    assert prefilter.possible_rules(facts, (TFM303,)) == (TFM303,)


def test_tower_conversion_reuses_tfm102s_analysis(monkeypatch):
    """TFM303 reads the gradient aggregation from TFM102's visit of the same tree when both
    run; alone it makes its own, with the same result."""
    from tfmigrate.rules import tower_program
    from tfmigrate.rules.manual_gradient_aggregation import ManualGradientAggregation as TFM102
    from tfmigrate.rules.tower_program import TowerProgramToMirroredStrategy as TFM303

    source = (FIXTURES / "towers" / "cifar_average" / "train.py").read_text()
    own_visits = []
    batched = tower_program.tree.visit_batched

    def counting(module, visitors):  # type: ignore[no-untyped-def]
        visitors = list(visitors)
        own_visits.extend(v for v in visitors if isinstance(v, TFM102))
        return batched(module, visitors)

    monkeypatch.setattr(tower_program.tree, "visit_batched", counting)
    both = process_source(source, "train.py", Settings(rules=(TFM102, TFM303)))
    reused = len(own_visits)
    alone = process_source(source, "train.py", Settings(rules=(TFM303,)))
    assert reused == 1  # the engine's one batched visit, TFM102 in it
    assert len(own_visits) == 2  # alone: TFM303's own visit
    converted = [f.message for f in both.findings if f.code == "TFM303"]
    assert converted and converted == [f.message for f in alone.findings]
