"""The reading stage of the whole-program converter: the IR read from the shapes of real tower
programs (fixtures/shapes), from every tower fixture, and the refusals."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tfmigrate.convert import ir, read_project
from tfmigrate.convert import project as project_module
from tfmigrate.convert.__main__ import main

REPO = Path(__file__).resolve().parents[2]
SHAPES = REPO / "fixtures" / "shapes"
Kind = ir.CombineKind


def _program(path: Path, entry: str) -> ir.Program:
    readings = read_project(path)
    assert [r.entry.name for r in readings] == [entry], readings
    reading = readings[0]
    assert reading.refusal is None, reading.refusal
    assert reading.program is not None
    return reading.program


def test_class_trainer_graph_in_init_towers_in_a_method_session_in_train():
    program = _program(SHAPES / "class_trainer", "train.py")
    (core,) = program.cores
    assert core.towers is not None
    assert core.towers.where == ir.Where("trainer.py", 25)
    assert core.towers.function == "MultiGpuTrainer._build_towers"
    assert core.combination.kind is Kind.AVERAGED
    assert core.combination.spelling == "MultiGpuTrainer._average(): reduce_mean over a list"
    assert core.update.kind is ir.UpdateKind.APPLY_GRADIENTS
    assert core.update.optimizer == "tf.train.MomentumOptimizer(lr, 0.9)"
    assert core.update.optimizer_where == ir.Where("trainer.py", 14)
    assert [i.kind for i in program.inputs] == [ir.InputKind.FEED_DICT]
    assert program.session is not None and program.session.kind is ir.SessionKind.SESSION
    # The step is the run of train_op, in the other method.
    assert [s.where for s in program.session.steps] == [ir.Where("trainer.py", 50)]
    assert program.session.loop == ir.Loop(ir.Where("trainer.py", 47), "for _ in range(steps)")
    assert [s.kind for s in program.setup] == [ir.SetUpKind.INITIALIZER]
    assert program.devices is not None
    assert "gpu_options.allow_growth=True" in program.devices.settings


def test_tower_builder_in_a_library_module_taking_model_fn_and_input_fn():
    program = _program(SHAPES / "tower_builder", "train.py")
    (core,) = program.cores
    assert core.towers is not None
    assert core.towers.where == ir.Where("lib/parallel.py", 15)
    assert core.towers.function == "build_towers"
    assert core.towers.devices == "device"
    assert (
        core.loss is not None
        and core.loss.expression == "model_fn(features, labels) / len(devices)"
    )
    assert core.combination.kind is Kind.SUMMED
    assert core.combination.spelling == "sum_gradients(): add_n"
    # The builder returns the summed gradients; the script applies them.
    assert core.update.where == ir.Where("train.py", 30)
    assert core.update.optimizer == "tf.train.GradientDescentOptimizer(0.1)"
    assert [i.kind for i in program.inputs] == [ir.InputKind.INITIALIZABLE]


def test_python_sum_over_indexed_slices_and_a_hand_written_adam():
    program = _program(SHAPES / "python_sum_adam", "train.py")
    (core,) = program.cores
    assert core.towers is not None and core.towers.devices == "assign_to_gpu(i)"
    assert core.combination.kind is Kind.AVERAGED
    assert core.combination.spelling == "mean_of_tower_grads(): python-sum with IndexedSlices"
    assert core.combination.where == ir.Where("utils.py", 4)
    assert core.update.kind is ir.UpdateKind.HAND_WRITTEN
    assert core.update.optimizer == "adam_update()"
    assert core.update.optimizer_where == ir.Where("opt.py", 4)
    assert program.session is not None
    assert [s.where.line for s in program.session.steps] == [40]
    assert [i.kind for i in program.inputs] == [ir.InputKind.FEED_DICT]


def test_one_loss_summed_over_towers_and_minimize_with_colocate():
    program = _program(SHAPES / "colocated_sum", "train.py")
    (core,) = program.cores
    assert core.combination.kind is Kind.COLOCATED_LOSS
    assert core.combination.where == ir.Where("train.py", 28)
    assert core.loss is not None and core.loss.expression == "total_loss"
    assert core.update.kind is ir.UpdateKind.MINIMIZE
    assert core.update.optimizer == "tf.train.AdamOptimizer(1e-4)"
    assert core.towers is not None
    assert core.towers.devices == "tf.DeviceSpec(device_type='GPU', device_index=gpu_id)"
    assert [i.kind for i in program.inputs] == [ir.InputKind.QUEUE]
    assert program.session is not None and len(program.session.steps) == 1
    assert ir.SetUpKind.QUEUE_RUNNERS in {s.kind for s in program.setup}


def test_module_level_script_with_placeholders_per_gpu():
    program = _program(SHAPES / "per_gpu_placeholders", "train.py")
    (core,) = program.cores
    assert core.towers is not None and core.towers.function == "<module>"
    assert core.combination.spelling == "average_gradients(): expand_dims/concat/reduce_mean"
    assert core.update.optimizer == "tf.train.AdamOptimizer(LR)"
    assert [i.kind for i in program.inputs] == [ir.InputKind.PER_GPU_PLACEHOLDERS]
    assert program.inputs[0].where == ir.Where("train.py", 33)


def test_gan_with_two_tower_loops_and_two_optimizers():
    program = _program(SHAPES / "gan_two_loops", "train_gan.py")
    d_core, g_core = program.cores
    assert d_core.towers is not None and g_core.towers is not None
    assert (d_core.towers.where.line, g_core.towers.where.line) == (19, 27)
    # Each tower's loss is the expression its gradient call differentiates.
    assert d_core.loss is not None and d_core.loss.where == ir.Where("train_gan.py", 22)
    assert "discriminator(fake)" in d_core.loss.expression
    assert g_core.loss is not None and g_core.loss.where == ir.Where("train_gan.py", 29)
    assert "discriminator(generator(zs[i]))" in g_core.loss.expression
    for core in (d_core, g_core):
        assert core.combination.kind is Kind.AVERAGED
        assert core.combination.spelling == "average_tower_grads(): add_n / len"
    assert d_core.update.optimizer_where == ir.Where("train_gan.py", 15)
    assert g_core.update.optimizer_where == ir.Where("train_gan.py", 16)
    assert program.session is not None
    assert [s.fetches for s in program.session.steps] == ["d_train", "g_train"]


def test_horovod_distributed_optimizer_with_monitored_training_session():
    program = _program(SHAPES / "horovod_monitored", "train_hvd.py")
    (core,) = program.cores
    assert core.towers is None
    assert core.combination.kind is Kind.HOROVOD
    assert core.combination.spelling == "DistributedOptimizer"
    assert core.update.kind is ir.UpdateKind.MINIMIZE
    # Through the wrapper to the optimizer it wraps.
    assert core.update.optimizer == "tf.train.MomentumOptimizer(0.01 * hvd.size(), momentum=0.9)"
    assert program.session is not None and program.session.kind is ir.SessionKind.MONITORED
    assert [i.kind for i in program.inputs] == [ir.InputKind.FEED_DICT]
    assert program.devices is not None
    assert "gpu_options.visible_device_list=str(hvd.local_rank())" in program.devices.settings
    assert program.session.loop is not None
    assert program.session.loop.header == "while not sess.should_stop()"
    kinds = {s.kind for s in program.setup}
    assert {ir.SetUpKind.BROADCAST, ir.SetUpKind.HOOKS} <= kinds


# The tower fixtures and how their towers are combined.
FIXTURES = {
    "towers/bn_rmsprop": Kind.AVERAGED,
    "towers/cifar_average": Kind.AVERAGED,
    "towers/fed_learning_rate": Kind.AVERAGED,
    "towers/global_updates": Kind.AVERAGED,
    "towers/horovod_average": Kind.AVERAGED,
    "towers/layers_adam": Kind.AVERAGED,
    "towers/queue_saver": Kind.AVERAGED,
    "towers/shuffled_dequeue": Kind.AVERAGED,
    "towers/slim_clones": Kind.SUMMED,
    "towers/sum_ema_decay": Kind.SUMMED,
    "towers/tutorial_flags": Kind.AVERAGED,
    "towers/keras2_fit": Kind.MERGED_OUTPUTS,
    "cifar_towers": Kind.AVERAGED,
    "addn_towers": Kind.AVERAGED,
    "slim_towers": Kind.SUMMED,
    "horovod_tf1": Kind.HOROVOD,
}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_tower_fixture_has_its_core_found(name: str):
    readings = read_project(REPO / "fixtures" / name)
    assert len(readings) == 1 and readings[0].refusal is None, readings
    program = readings[0].program
    assert program is not None
    assert [c.combination.kind for c in program.cores] == [FIXTURES[name]]
    assert program.session is not None and program.inputs


def test_keras_multi_gpu_model_is_a_front_end_to_the_same_ir():
    program = _program(REPO / "fixtures" / "towers" / "keras2_fit", "train.py")
    (core,) = program.cores
    assert core.towers is not None
    assert (core.towers.where, core.towers.body) == (ir.Where("train.py", 56), "model")
    assert core.combination.kind is Kind.MERGED_OUTPUTS
    assert core.loss is not None and core.loss.expression == "'categorical_crossentropy'"
    assert core.update.kind is ir.UpdateKind.KERAS_COMPILE
    assert core.update.optimizer == "SGD(lr=args.lr, momentum=0.9)"
    assert program.session is not None and program.session.kind is ir.SessionKind.KERAS
    assert [i.kind for i in program.inputs] == [ir.InputKind.KERAS_FIT]


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def test_a_file_without_towers_is_no_program(tmp_path: Path):
    path = _write(
        tmp_path,
        "train.py",
        """
        import tensorflow as tf

        def main():
            with tf.device('/cpu:0'):
                x = tf.layers.dense(tf.zeros([1, 2]), 3)
            train_op = tf.train.AdamOptimizer().minimize(tf.reduce_sum(x))

        if __name__ == '__main__':
            main()
        """,
    )
    assert read_project(path) == []
    assert read_project(tmp_path) == []


def test_virtual_environments_and_hidden_folders_are_not_read(tmp_path: Path):
    (tmp_path / "train.py").write_text("import tensorflow as tf\n")
    for folder in (".venv/lib", "env/lib", ".tox/py", "node_modules/x", "src"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "m.py").write_text("x = 1\n")
    (tmp_path / "env" / "pyvenv.cfg").write_text("home = /usr\n")  # a venv of any name
    project = project_module.Project(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in project.python_files()] == [
        "src/m.py",
        "train.py",
    ]


def test_a_tower_loop_with_no_combination_is_refused_naming_its_line(tmp_path: Path):
    _write(
        tmp_path,
        "train.py",
        """
        import tensorflow as tf

        def main(num_gpus):
            outputs = []
            for i in range(num_gpus):
                with tf.device('/gpu:%d' % i):
                    outputs.append(tf.layers.dense(tf.zeros([4, 2]), 3))
            return tf.concat(outputs, 0)

        if __name__ == '__main__':
            main(2)
        """,
    )
    (reading,) = read_project(tmp_path)
    assert reading.program is None and reading.refusal is not None
    assert (reading.refusal.file, reading.refusal.line) == ("train.py", 6)
    assert "compute no gradients" in reading.refusal.reason


def test_collected_gradients_never_combined_are_refused(tmp_path: Path):
    _write(
        tmp_path,
        "train.py",
        """
        import tensorflow as tf

        def main(num_gpus, opt):
            tower_grads = []
            for i in range(num_gpus):
                with tf.device('/gpu:%d' % i):
                    loss = tf.reduce_sum(tf.layers.dense(tf.zeros([4, 2]), 3))
                    tower_grads.append(opt.compute_gradients(loss))
            return tower_grads

        if __name__ == '__main__':
            main(2, tf.train.AdamOptimizer())
        """,
    )
    (reading,) = read_project(tmp_path / "train.py")
    assert reading.refusal is not None and reading.refusal.line == 6
    assert "tower_grads" in reading.refusal.reason


def test_python2_entry_building_towers_is_refused_with_its_line(tmp_path: Path):
    _write(
        tmp_path,
        "train.py",
        """
        import tensorflow as tf
        for i in range(2):
            with tf.device('/gpu:%d' % i):
                pass
        print 'done'
        if __name__ == '__main__':
            pass
        """,
    )
    (reading,) = read_project(tmp_path)
    assert reading.refusal is not None and reading.refusal.line == 6
    assert "Python 2" in reading.refusal.reason


def test_each_file_is_parsed_once(monkeypatch: pytest.MonkeyPatch):
    parsed: list[bytes] = []
    real = project_module.tree.parse_module

    def counting(source):  # type: ignore[no-untyped-def]
        parsed.append(bytes(source))
        return real(source)

    monkeypatch.setattr(project_module.tree, "parse_module", counting)
    readings = read_project(SHAPES / "python_sum_adam")
    assert readings and readings[0].program is not None
    assert len(parsed) == len(set(parsed)) == 3


def test_cli_prints_the_summary_and_json(capsys: pytest.CaptureFixture[str]):
    assert main([str(SHAPES / "gan_two_loops")]) == 0
    text = capsys.readouterr().out
    assert "core 1 at train_gan.py:19" in text and "core 2 at train_gan.py:27" in text
    assert "combination: averaged gradients, average_tower_grads(): add_n / len" in text
    assert main([str(SHAPES / "horovod_monitored"), "--json"]) == 0
    (data,) = json.loads(capsys.readouterr().out)
    assert data["entry"] == "train_hvd.py" and data["refusal"] is None
    assert data["program"]["cores"][0]["combination"]["kind"] == "Horovod allreduce"
    assert data["program"]["session"]["kind"] == "MonitoredTrainingSession"


def test_cli_exit_status_is_one_for_a_refusal(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    _write(
        tmp_path,
        "train.py",
        """
        import tensorflow as tf
        if __name__ == '__main__':
            for i in range(2):
                with tf.device('/gpu:%d' % i):
                    y = tf.layers.dense(tf.zeros([1, 1]), 1)
        """,
    )
    assert main([str(tmp_path)]) == 1
    assert "refused at train.py:4" in capsys.readouterr().out


def test_statement_level_resolver_binds_what_name_resolver_binds():
    # The reader resolves `tf`, `tfv1`, `slim` aliases from simple statements only; the
    # bindings must be NameResolver's own, on every fixture file.
    from tfmigrate import tree
    from tfmigrate.names import NameResolver

    files = sorted((REPO / "fixtures").rglob("*.py"))
    assert len(files) > 20
    for path in files:
        try:
            module = tree.parse_module(path.read_bytes())
        except Exception:  # noqa: BLE001 - unparsable fixtures are someone else's subject
            continue
        expected = NameResolver.for_module(module)
        got = project_module._resolver(project_module.small_statements(module))
        assert got.bindings == expected.bindings, path
        assert got.imported_modules == expected.imported_modules, path


def test_tf_compat_v1_aliases_resolve(tmp_path: Path):
    _write(
        tmp_path,
        "train.py",
        """
        import tensorflow.compat.v1 as tfv1
        import tensorflow as tf

        def main(n):
            opt = tfv1.train.AdamOptimizer(0.1)
            grads = []
            for i in range(n):
                with tfv1.device('/gpu:%d' % i):
                    loss = tf.reduce_sum(tfv1.layers.dense(tf.zeros([2, 2]), 1))
                    grads.append(opt.compute_gradients(loss))
            averaged = []
            for gv in zip(*grads):
                averaged.append((tf.reduce_mean(tf.stack([g for g, _ in gv]), 0), gv[0][1]))
            step = opt.apply_gradients(averaged)
            with tfv1.Session() as sess:
                sess.run(step)

        if __name__ == '__main__':
            tfv1.app.run(main)
        """,
    )
    (reading,) = read_project(tmp_path)
    assert reading.program is not None, reading.refusal
    (core,) = reading.program.cores
    assert core.combination.spelling == "inline: reduce_mean over a list"
    assert core.update.optimizer == "tfv1.train.AdamOptimizer(0.1)"
    assert reading.program.session is not None
    assert [s.where.line for s in reading.program.session.steps] == [17]


def test_an_update_returned_and_collected_is_found_in_the_callers_step(tmp_path: Path):
    # The update is returned by a method, appended to a list, returned again, and run by the
    # script that called the builder.
    _write(
        tmp_path,
        "model.py",
        """
        import tensorflow as tf

        class Net(object):
            def __init__(self):
                self.opt = tf.train.MomentumOptimizer(0.1, 0.9)

            def _apply(self, cost):
                return self.opt.minimize(cost, colocate_gradients_with_ops=True)

            def build_train_ops(self, images):
                losses, train_ops = [], []
                for i in range(len(images)):
                    with tf.device('/gpu:%d' % i):
                        losses.append(tf.reduce_sum(tf.layers.dense(images[i], 1)))
                train_ops.append(self._apply(tf.add_n(losses) / len(images)))
                return train_ops, losses
        """,
    )
    _write(
        tmp_path,
        "run.py",
        """
        import tensorflow as tf
        from model import Net

        def main(_):
            ops, losses = Net().build_train_ops([tf.zeros([2, 3])] * 2)
            sess = tf.Session()
            step = 0
            while step < 10:
                sess.run([ops, losses])
                step += 1

        if __name__ == '__main__':
            tf.app.run()
        """,
    )
    (reading,) = read_project(tmp_path)
    assert reading.program is not None, reading.refusal
    (core,) = reading.program.cores
    assert core.combination.kind is Kind.COLOCATED_LOSS
    assert core.update.optimizer_where == ir.Where("model.py", 6)
    session = reading.program.session
    assert session is not None and [s.where for s in session.steps] == [ir.Where("run.py", 10)]
    assert session.loop is not None and session.loop.header == "while step < 10"


@pytest.mark.parametrize(
    ("combine", "kind", "spelling"),
    [
        ("summed.append((total / n, pairs[0][1]))", Kind.AVERAGED, "inline: python-sum / N"),
        ("summed.append((total, pairs[0][1]))", Kind.SUMMED, "inline: python-sum"),
    ],
)
def test_inline_python_sum_over_zip_of_the_towers(
    tmp_path: Path, combine: str, kind: ir.CombineKind, spelling: str
):
    _write(
        tmp_path,
        "train.py",
        f"""
        import tensorflow as tf

        def main(n, opt):
            tower_grads = []
            for i in range(n):
                with tf.device('/gpu:%d' % i):
                    loss = tf.reduce_sum(tf.layers.dense(tf.zeros([4, 2]), 3))
                    tower_grads.append(opt.compute_gradients(loss))
            summed = []
            for pairs in zip(*tower_grads):
                total = pairs[0][0]
                for grad, _ in pairs[1:]:
                    total = total + grad
                {combine}
            return opt.apply_gradients(summed)

        if __name__ == '__main__':
            main(2, tf.train.AdamOptimizer())
        """,
    )
    (reading,) = read_project(tmp_path)
    assert reading.program is not None, reading.refusal
    (core,) = reading.program.cores
    assert (core.combination.kind, core.combination.spelling) == (kind, spelling)
    assert core.combination.where == ir.Where("train.py", 11)
    assert core.update.where == ir.Where("train.py", 16)


def test_tower_function_of_a_helper_module_called_per_gpu_in_a_comprehension():
    program = _program(SHAPES / "tower_helper_module", "train.py")
    (core,) = program.cores
    assert core.towers is not None
    assert core.towers.where == ir.Where("train.py", 23)
    assert (core.towers.body, core.towers.count) == ("tower_gradients", "range(N_GPUS)")
    assert core.towers.devices == "assign_to_device('/gpu:%d' % gpu)"
    assert core.loss is not None and core.loss.where == ir.Where("helpers/towers.py", 20)
    assert core.combination.spelling == "mean_gradients(): reduce_mean over a list"
    assert core.combination.where == ir.Where("helpers/towers.py", 23)
    assert core.update.optimizer == "tf.train.RMSPropOptimizer(1e-3)"


def test_towers_inside_an_estimator_model_fn():
    program = _program(SHAPES / "estimator_towers", "train_estimator.py")
    (core,) = program.cores
    assert core.towers is not None and core.towers.function == "model_fn"
    assert core.combination.kind is Kind.AVERAGED
    assert core.update.optimizer == "tf.train.AdamOptimizer(1e-3)"
    session = program.session
    assert session is not None and session.kind is ir.SessionKind.ESTIMATOR
    # The step is the train_op the model_fn hands to the Estimator.
    assert [(s.where.line, s.fetches) for s in session.steps] == [(35, "train_op")]
    assert [i.kind for i in program.inputs] == [ir.InputKind.DATASET]


def test_iterator_kinds_and_a_supervisor(tmp_path: Path):
    _write(
        tmp_path,
        "train.py",
        """
        import tensorflow as tf

        def main(n):
            train = tf.data.Dataset.range(100).batch(8)
            valid = tf.data.Dataset.range(10).batch(8)
            handle = tf.placeholder(tf.string, shape=[])
            iterator = tf.data.Iterator.from_string_handle(handle, train.output_types)
            train_it = train.make_one_shot_iterator()
            switchable = tf.data.Iterator.from_structure(train.output_types)
            batch = tf.cast(iterator.get_next(), tf.float32)
            opt = tf.train.GradientDescentOptimizer(0.1)
            grads = []
            for i, part in enumerate(tf.split(batch, n)):
                with tf.device('/gpu:%d' % i):
                    loss = tf.reduce_sum(tf.layers.dense(part[:, None], 1))
                    grads.append(opt.compute_gradients(loss))
            train_op = opt.apply_gradients(
                [(tf.add_n([g for g, _ in gv]) / n, gv[0][1]) for gv in zip(*grads)])
            sv = tf.train.Supervisor(logdir='/tmp/sv')
            with sv.managed_session() as sess:
                train_handle = sess.run(train_it.string_handle())
                while not sv.should_stop():
                    sess.run(train_op, feed_dict={handle: train_handle})

        if __name__ == '__main__':
            main(2)
        """,
    )
    (reading,) = read_project(tmp_path)
    program = reading.program
    assert program is not None, reading.refusal
    assert program.cores[0].combination.spelling == "inline: add_n / len"
    kinds = [i.kind for i in program.inputs]
    assert kinds[:3] == [
        ir.InputKind.STRING_HANDLE,
        ir.InputKind.ONE_SHOT,
        ir.InputKind.REINITIALIZABLE,
    ]
    assert ir.InputKind.DATASET not in kinds
    assert program.session is not None and program.session.kind is ir.SessionKind.SUPERVISOR
    assert [s.where.line for s in program.session.steps] == [24]
    assert program.session.loop is not None
    assert program.session.loop.header == "while not sv.should_stop()"


def test_a_reader_chosen_by_a_flag_is_read_through_the_class_that_has_the_method(tmp_path: Path):
    _write(
        tmp_path,
        "readers.py",
        """
        import tensorflow as tf

        class QueueReader(object):
            def batch(self, n):
                return tf.train.shuffle_batch([tf.zeros([3])], n, 64, 16)

        class DatasetReader(object):
            def iterator(self, n):
                return tf.data.Dataset.range(64).batch(n).make_initializable_iterator()
        """,
    )
    _write(
        tmp_path,
        "train.py",
        """
        import tensorflow as tf
        import readers

        def main(use_queue, n):
            if use_queue:
                reader = readers.QueueReader()
            else:
                reader = readers.DatasetReader()
            batch = tf.cast(reader.iterator(8 * n).get_next(), tf.float32)
            opt = tf.train.AdamOptimizer()
            grads = []
            for i, part in enumerate(tf.split(batch, n)):
                with tf.device('/gpu:%d' % i):
                    loss = tf.reduce_sum(tf.layers.dense(part[:, None], 1))
                    grads.append(opt.compute_gradients(loss))
            averaged = [(tf.add_n([g for g, _ in gv]) / n, gv[0][1]) for gv in zip(*grads)]
            train_op = opt.apply_gradients(averaged)

        if __name__ == '__main__':
            main(False, 2)
        """,
    )
    (reading,) = read_project(tmp_path)
    assert reading.program is not None, reading.refusal
    inputs = [(i.kind, i.where) for i in reading.program.inputs]
    assert (ir.InputKind.INITIALIZABLE, ir.Where("readers.py", 10)) in inputs


def test_towers_no_main_block_reaches_are_read_from_the_module_nobody_imports(tmp_path: Path):
    # A script without a main block (run as `python run_experiment.py`) drives a model module;
    # the core is read from the script, the one module no other module imports.
    (tmp_path / "lib").mkdir()
    _write(tmp_path / "lib", "__init__.py", "")
    _write(
        tmp_path / "lib",
        "model.py",
        """
        import tensorflow as tf

        class Model(object):
            def __init__(self, n):
                opt = tf.train.AdamOptimizer()
                losses = []
                for i in range(n):
                    with tf.device('/gpu:%d' % i):
                        losses.append(tf.reduce_sum(tf.layers.dense(tf.zeros([2, 2]), 1)))
                self.train_op = opt.minimize(
                    tf.add_n(losses) / n, colocate_gradients_with_ops=True)
        """,
    )
    _write(
        tmp_path,
        "run_experiment.py",
        """
        import tensorflow as tf
        from lib.model import Model

        model = Model(2)
        with tf.Session() as sess:
            for _ in range(3):
                sess.run(model.train_op)
        """,
    )
    (reading,) = read_project(tmp_path)
    assert reading.entry.name == "run_experiment.py"
    assert reading.program is not None, reading.refusal
    assert reading.program.cores[0].towers is not None
    assert reading.program.cores[0].towers.where == ir.Where("lib/model.py", 8)
    session = reading.program.session
    assert session is not None and [s.where.line for s in session.steps] == [8]


def test_imports_through_sys_path_append_and_relative_imports(tmp_path: Path):
    # libs/ is under src/, which is no parent of the script: only sys.path finds it.
    (tmp_path / "tools").mkdir()
    (tmp_path / "src" / "libs").mkdir(parents=True)
    libs = tmp_path / "src" / "libs"
    _write(libs, "__init__.py", "")
    _write(
        libs,
        "grads.py",
        """
        import tensorflow.compat.v1 as tf

        def sum_gradients(tower_grads):
            return [(tf.add_n([g for g, _ in gv]), gv[0][1]) for gv in zip(*tower_grads)]
        """,
    )
    _write(
        libs,
        "net.py",
        """
        from .grads import sum_gradients  # re-exported for the scripts

        def build(x):
            return x
        """,
    )
    _write(
        tmp_path / "tools",
        "train.py",
        """
        import sys
        sys.path.append('../src')
        import tensorflow as tf
        from libs import net

        def train(n):
            opt = tf.train.MomentumOptimizer(0.1, 0.9)
            tower_grads = []
            for i in range(n):
                with tf.device('/gpu:%d' % i):
                    loss = tf.reduce_sum(net.build(tf.layers.dense(tf.zeros([2, 2]), 1))) / n
                    tower_grads.append(opt.compute_gradients(loss))
            train_op = opt.apply_gradients(net.sum_gradients(tower_grads))

        if __name__ == '__main__':
            train(2)
        """,
    )
    (reading,) = read_project(tmp_path)
    assert reading.program is not None, reading.refusal
    (core,) = reading.program.cores
    assert core.combination.kind is Kind.SUMMED
    assert core.combination.where == ir.Where("src/libs/grads.py", 4)
    assert core.update.optimizer_where == ir.Where("tools/train.py", 8)


def test_horovod_allreduce_inside_hand_written_updates_chosen_by_a_flag(tmp_path: Path):
    _write(
        tmp_path,
        "ops.py",
        """
        import horovod.tensorflow as hvd

        def allreduce_mean(x):
            return hvd.allreduce(x, average=False) / hvd.size()
        """,
    )
    _write(
        tmp_path,
        "optim.py",
        """
        import tensorflow as tf
        from ops import allreduce_mean

        def sgd(params, cost, lr):
            grads = [allreduce_mean(g) for g in tf.gradients(cost, params)]
            return tf.group(*[p.assign_sub(lr * g) for p, g in zip(params, grads)])

        def signed(params, cost, lr):
            grads = [allreduce_mean(g) for g in tf.gradients(cost, params)]
            return tf.group(*[p.assign_sub(lr * tf.sign(g)) for p, g in zip(params, grads)])
        """,
    )
    _write(
        tmp_path,
        "train.py",
        """
        import horovod.tensorflow as hvd
        import tensorflow as tf
        import optim

        def main(name='sgd'):
            hvd.init()
            w = tf.get_variable('w', [3])
            cost = tf.reduce_sum(tf.square(w - 1.0))
            update = {'sgd': optim.sgd, 'signed': optim.signed}[name]
            train_op = update([w], cost, 0.1)
            with tf.Session() as sess:
                sess.run(hvd.broadcast_global_variables(0))
                for _ in range(5):
                    sess.run(train_op)

        if __name__ == '__main__':
            main()
        """,
    )
    (reading,) = read_project(tmp_path)
    program = reading.program
    assert program is not None, reading.refusal
    (core,) = program.cores
    assert core.towers is None
    assert core.combination.kind is Kind.HOROVOD
    assert core.combination.spelling == "allreduce via allreduce_mean"
    assert core.update.kind is ir.UpdateKind.HAND_WRITTEN
    assert core.update.optimizer == "sgd() | signed()"
    assert program.session is not None
    assert [s.where for s in program.session.steps] == [ir.Where("train.py", 15)]
    assert ir.SetUpKind.BROADCAST in {s.kind for s in program.setup}


def test_python_dash_m_runs_the_reader():
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "tfmigrate.convert", str(SHAPES / "colocated_sum"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    (data,) = json.loads(proc.stdout)
    assert data["program"]["cores"][0]["update"]["kind"] == "minimize"
