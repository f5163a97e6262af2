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
                # name_scope(None): the legacy name alone (the variable scope's name scope,
                # still open here, would prefix it again: model/model/w)
                with tf.init_scope(), tf.compat.v1.name_scope(None), strategy.scope():
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


def train(flags):
    strategy = tf.distribute.MirroredStrategy()
    tf1_variables = TF1Variables(strategy)
    with strategy.scope(), tf1_variables.scope():
        x_all = np.ones([64, 4], np.float32)
        y_all = np.zeros([64, 2], np.float32)
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)

    def fed_batches():
        """What the legacy loop fed, one global batch per step."""
        for step in range(flags.steps):
            yield x_all[step * 16 % 64:][:16], y_all[step * 16 % 64:][:16]

    dataset = tf.data.Dataset.from_generator(
        fed_batches,
        output_signature=(
            tf.TensorSpec([16, 4], tf.float32),
            tf.TensorSpec([16, 2], tf.float32),
        ),
    )
    # Replica i receives the i-th slice of each global batch, as tower i did.
    batches = iter(strategy.experimental_distribute_dataset(dataset))

    def tower_fn(x, y):
        """One tower of the legacy loop, now one replica."""
        i = replica_index()
        with tf1_variables.scope(), tf.name_scope('tower_%d' % i), tf.GradientTape() as tape:
            with tf.compat.v1.variable_scope('model', reuse=i > 0):
                loss = tower_loss(x, y)
            # The towers AVERAGED their gradients; apply_gradients SUMS the replicas'.
            replica_loss = loss / strategy.num_replicas_in_sync
        variables_to_train = tf1_variables.trainable
        grads = list(zip(
            tape.gradient(replica_loss, variables_to_train), variables_to_train))
        return grads, {'loss': loss}

    def step_fn(x, y):
        grads, fetches = tower_fn(x, y)
        train_op = opt.apply_gradients(grads)
        return fetches

    @tf.function
    def train_step(batch):
        return strategy.run(step_fn, args=batch)

    for step in range(flags.steps):
        outputs = train_step(next(batches))
        loss_value = strategy.experimental_local_results(outputs['loss'])[-1].numpy()
        print(step, loss_value)


if __name__ == '__main__':
    parser = argparse.ArgumentParser()
    parser.add_argument('--num_gpus', type=int, default=2)
    parser.add_argument('--steps', type=int, default=10)
    train(parser.parse_args())
'''
