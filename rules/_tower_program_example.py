"""The example TFM303 documents and tests: a small tower program and its exact conversion.

Not a rule module. The converted text is what the rule writes today; regenerate it with the rule
when the output changes on purpose (tests/test_rule_examples.py compares it exactly).
"""

LEGACY = """\
import argparse

import numpy as np
import tensorflow as tf


def tower_loss(x, y):
    w = tf.get_variable('w', [4, 2])
    return tf.reduce_mean(tf.square(tf.matmul(x, w) - y), name='loss')


def average_gradients(tower_grads):
    averaged = []
    for grad_and_vars in zip(*tower_grads):
        grad = tf.reduce_mean(tf.stack([g for g, _ in grad_and_vars]), 0)
        averaged.append((grad, grad_and_vars[0][1]))
    return averaged


def train(flags):
    x_all = np.ones([64, 4], np.float32)
    y_all = np.zeros([64, 2], np.float32)
    x = tf.placeholder(tf.float32, [16, 4])
    y = tf.placeholder(tf.float32, [16, 2])
    x_splits = tf.split(x, flags.num_gpus)
    y_splits = tf.split(y, flags.num_gpus)
    opt = tf.train.GradientDescentOptimizer(0.1)
    tower_grads = []
    for i in range(flags.num_gpus):
        with tf.device('/gpu:%d' % i), tf.name_scope('tower_%d' % i):
            with tf.variable_scope('model', reuse=i > 0):
                loss = tower_loss(x_splits[i], y_splits[i])
            tower_grads.append(opt.compute_gradients(loss))
    grads = average_gradients(tower_grads)
    train_op = opt.apply_gradients(grads)
    sess = tf.Session()
    sess.run(tf.global_variables_initializer())
    for step in range(flags.steps):
        feed = {x: x_all[step * 16 % 64:][:16], y: y_all[step * 16 % 64:][:16]}
        _, loss_value = sess.run([train_op, loss], feed_dict=feed)
        print(step, loss_value)


if __name__ == '__main__':
    parser = argparse.ArgumentParser()
    parser.add_argument('--num_gpus', type=int, default=2)
    parser.add_argument('--steps', type=int, default=10)
    train(parser.parse_args())
"""

CONVERTED = '''\
import argparse

import numpy as np
import tensorflow as tf


def tower_loss(x, y):
    w = tf.compat.v1.get_variable('w', [4, 2])
    return tf.reduce_mean(tf.square(tf.matmul(x, w) - y), name='loss')


class TF1Variables:
    """Owns the variables that TF1 model code creates with tf.compat.v1.get_variable.

    Used as a custom getter: the first request of a name creates the variable -- eagerly, under
    the strategy (so it is mirrored on every replica), with its legacy name; every later request,
    from any replica, gets that same variable back.
    """

    def __init__(self, strategy):
        self.strategy = strategy
        self.variables = {}  # legacy name -> variable, in creation order
        self.trainable = []

    def getter(self, getter, name, *args, **kwargs):
        variable = self.variables.get(name)
        if variable is None:
            def create(strategy):
                with tf.init_scope(), strategy.scope():
                    return getter(name, *args, **kwargs)

            context = tf.distribute.get_replica_context()
            if context is not None and tf.distribute.has_strategy():
                # Inside strategy.run every replica asks; merge_call creates it once.
                variable = context.merge_call(create)
            else:
                variable = create(self.strategy)
            if name in self.variables:  # another replica's request created it
                return self.variables[name]
            self.variables[name] = variable
            if variable.trainable:
                self.trainable.append(variable)
        return variable

    def scope(self):
        return tf.compat.v1.variable_scope("", custom_getter=self.getter)


def replica_index():
    """This replica's number as a Python int: the legacy tower index."""
    context = tf.distribute.get_replica_context()
    return int(tf.get_static_value(context.replica_id_in_sync_group))


def keep_large_tensors_on_the_heap():
    """Undo the malloc setting tf.data makes once per process (glibc only; nothing else changes).

    The first tf.data generator op (every distributed dataset has some) sets glibc's mmap
    threshold to 128 KB: every larger tensor is then mmap-ed, zero-filled page by page and unmapped
    at every step, which costs more the larger the batch. Make tf.data apply it now, then give
    glibc back its usual ceiling.
    """
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return
    empty = tf.data.Dataset.from_generator(lambda: iter(()), output_signature=tf.TensorSpec([], tf.int8))
    for _ in empty:
        pass
    libc.mallopt(-3, 32 * 2**20)  # M_MMAP_THRESHOLD: the highest value glibc itself would pick
    libc.mallopt(-1, 64 * 2**20)  # M_TRIM_THRESHOLD: twice that, as glibc pairs them


# Training steps per tf.function call in main() (StepsInOneCall): the call's fixed cost is paid
# once for so many steps; a few more batches are held in memory, on the host.
STEPS_PER_CALL = 20


class StepsInOneCall:
    """Training steps run several to a call: one tf.function call takes up to `count` batches from
    the distributed iterator and runs `one_step` on each, in a loop inside the call.

    Calling a tf.function and taking a batch from a distributed iterator cost a fixed time each,
    whatever the model, more than a small model's whole step: paid once per call here, not once
    per step. `self(iterator, count)` returns every step's values in step order (fewer steps than
    `count` when the batches end): {key: [replica 0's, replica 1's, ...]}, as numpy (the value's
    strategy.experimental_local_results: one part for a value not per replica).
    """

    def __init__(self, strategy, one_step):
        self.strategy = strategy
        self.one_step = one_step
        self.layout = []  # (key, number of parts) of each value of a step
        self.call = tf.function(self.run)

    def __call__(self, iterator, count):
        try:
            done, stacks = self.call(iterator, tf.constant(count))
        except tf.errors.OutOfRangeError:  # no batch left for the first step
            return []
        stacks = [stack.numpy() for stack in stacks]
        steps = []
        for index in range(int(done)):
            values = iter([stack[index] for stack in stacks])
            steps.append({key: [next(values) for _ in range(n)] for key, n in self.layout})
        return steps

    def run(self, iterator, count):
        """Traced: the steps, each step's values written to growing TensorArrays."""
        graph = tf.compat.v1.get_default_graph()
        collected = {key: graph.get_collection(key) for key in graph.get_all_collection_keys()}

        def step_values(batch):
            # TF1 code collects in the graph as it is traced (regularization losses, the train
            # op, ...): every step traced into this one graph starts from what was there before
            # the steps, as in a graph of its own.
            inner = tf.compat.v1.get_default_graph()
            for key in inner.get_all_collection_keys():
                inner.get_collection_ref(key)[:] = collected.get(key, [])
            values = []
            self.layout.clear()
            for key, value in self.one_step(batch).items():
                parts = self.strategy.experimental_local_results(value)
                values.extend(parts)
                self.layout.append((key, len(parts)))
            return values

        first = next(iterator)  # raises OutOfRangeError before any step when there is none
        arrays = [
            tf.TensorArray(value.dtype, size=0, dynamic_size=True).write(0, value)
            for value in step_values(first)
        ]
        done = tf.constant(1)
        for index in tf.range(1, count):
            optional = iterator.get_next_as_optional()
            if not optional.has_value():  # the batches ended: the steps so far are returned
                break
            arrays = [a.write(index, v) for a, v in zip(arrays, step_values(optional.get_value()))]
            done = index + 1
        return done, [a.stack() for a in arrays]


def each_step(train_steps, batches, total, per_call=STEPS_PER_CALL):
    """The values of `total` training steps, one step at a time, run `per_call` steps to a call."""
    while total > 0:
        steps = train_steps(batches, min(per_call, total))
        if not steps:
            return
        total -= len(steps)
        yield from steps


class ReplicaSlices:
    """The global batches of `dataset`, each cut into one slice per replica as the strategy's
    distributed datasets cut a batch: replica i takes the i-th slice of ceil(rows / replicas)
    rows (what tf.split gave tower i: it only accepted rows that divide evenly).

    Iterated as a distributed dataset is, also inside a tf.function (next(), and
    get_next_as_optional()), but from one plain tf.data iterator: a distributed dataset keeps
    an iterator per device in step, which costs more per batch than a small model's whole step.
    """

    def __init__(self, strategy, dataset):
        self.strategy = strategy
        self.dataset = dataset

    def __iter__(self):
        return ReplicaSliceIterator(self.strategy, iter(self.dataset))


class ReplicaSliceIterator:
    """The iterator of ReplicaSlices: each global batch as per-replica values."""

    def __init__(self, strategy, iterator):
        self.strategy = strategy
        self.iterator = iterator

    def __iter__(self):
        return self

    def __next__(self):
        return self.slices(next(self.iterator))

    def get_next_as_optional(self):
        return SlicedOptional(self, self.iterator.get_next_as_optional())

    def slices(self, batch):
        replicas = self.strategy.num_replicas_in_sync

        def rows(tensor, i):
            size = (tf.shape(tensor)[0] + replicas - 1) // replicas
            return tensor[i * size:(i + 1) * size]

        with tf.device("/cpu:0"):  # cut on the host: each replica's device gets its rows only
            parts = [tf.nest.map_structure(lambda t, i=i: rows(t, i), batch) for i in range(replicas)]
        return self.strategy.experimental_distribute_values_from_function(
            lambda context: parts[context.replica_id_in_sync_group])


class SlicedOptional:
    """The next batch of a ReplicaSliceIterator, if there is one (as tf.experimental.Optional)."""

    def __init__(self, iterator, optional):
        self.iterator = iterator
        self.optional = optional

    def has_value(self):
        return self.optional.has_value()

    def get_value(self):
        return self.iterator.slices(self.optional.get_value())


def build_program(strategy, flags):
    """The training program under `strategy` (its variables, one step, the batches)."""
    keep_large_tensors_on_the_heap()
    tf1_variables = TF1Variables(strategy)
    with strategy.scope(), tf1_variables.scope():
        x_all = np.ones([64, 4], np.float32)
        y_all = np.zeros([64, 2], np.float32)
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)

    def fed_batches():
        """What the legacy loop fed, one global batch per step."""
        for step in range(flags.steps):
            yield x_all[step * 16 % 64:][:16], y_all[step * 16 % 64:][:16]

    def fed_chunks(size=STEPS_PER_CALL):
        """fed_batches(), `size` consecutive batches of equal shapes stacked together."""
        chunk, shapes = [], None
        for batch in fed_batches():
            if chunk and (len(chunk) == size or [np.shape(a) for a in batch] != shapes):
                yield tuple(np.stack(arrays) for arrays in zip(*chunk))
                chunk = []
            chunk.append(batch)
            shapes = [np.shape(a) for a in batch]
        if chunk:
            yield tuple(np.stack(arrays) for arrays in zip(*chunk))

    dataset = tf.data.Dataset.from_generator(
        fed_chunks,
        output_signature=(
            tf.TensorSpec([None, 16, 4], tf.float32),
            tf.TensorSpec([None, 16, 2], tf.float32),
        ),
    ).unbatch()
    # Replica i receives the i-th slice of each global batch, as tower i did.
    batches = ReplicaSlices(strategy, dataset)

    def tower_fn(x, y):
        """One tower of the legacy loop, now one replica."""
        i = replica_index()
        with tf1_variables.scope(), tf.name_scope('tower_%d' % i):
            with tf.compat.v1.variable_scope('model', reuse=i > 0):
                loss = tower_loss(x, y)
            # The towers AVERAGED their gradients; apply_gradients SUMS the replicas'.
            grads = opt.compute_gradients(
                loss / strategy.num_replicas_in_sync, var_list=tf1_variables.trainable)
        return grads, {'loss': loss}

    @tf.function
    def build(*batch):
        strategy.run(tower_fn, args=batch)

    # Trace once, without training: creates the variables under their legacy names.
    build.get_concrete_function(*[
        tf.TensorSpec([None, *spec.shape[1:]], spec.dtype) for spec in dataset.element_spec])

    def step_fn(x, y):
        grads, fetches = tower_fn(x, y)
        train_op = opt.apply_gradients(grads)
        return fetches

    def one_step(batch):
        return strategy.run(step_fn, args=batch)

    train_step = tf.function(one_step)

    return {
        "variables": dict(tf1_variables.variables),
        "train_step": train_step,
        # Several steps to a tf.function call: what main() runs (verify runs one_step so).
        "train_steps": StepsInOneCall(strategy, one_step),
        "one_step": one_step,
        "batches": batches,
        # What `tfmigrate convert-checkpoint` writes and main() restores (--restore_from).
        "checkpoint": tf.train.Checkpoint(variables=dict(tf1_variables.variables), optimizer=opt),
    }


def make_parser():
    parser = argparse.ArgumentParser()
    parser.add_argument('--num_gpus', type=int, default=2)
    parser.add_argument('--steps', type=int, default=10)
    parser.add_argument(
        "--restore_from", help="start from a checkpoint folder (tfmigrate convert-checkpoint)")
    return parser


def tfmigrate_program(strategy, argv):
    """tfmigrate's verify protocol: the program under `strategy`, flags parsed from `argv`."""
    flags, _ = make_parser().parse_known_args(argv)
    return build_program(strategy, flags)


def train(flags):
    strategy = tf.distribute.MirroredStrategy()
    program = build_program(strategy, flags)
    if flags.restore_from:
        with strategy.scope():  # optimizer slots restored now are created mirrored
            program["checkpoint"].restore(
                tf.train.latest_checkpoint(flags.restore_from)).assert_existing_objects_matched()
    # The loop's steps run STEPS_PER_CALL to a tf.function call; each step's values
    # come back on the host, and the loop logs them as before, step by step.
    step_outputs = each_step(
        program["train_steps"], iter(program["batches"]), len(range(flags.steps)))
    for step in range(flags.steps):
        outputs = next(step_outputs)
        loss_value = outputs['loss'][-1]
        print(step, loss_value)


if __name__ == "__main__":
    train(make_parser().parse_args())
'''
