"""TFM401's conversion example: a small Horovod TF1 script and the program `rewrite
--unsafe-fixes` writes for it (kept apart from the rule for length; not a rule module)."""

LEGACY = """
import argparse

import horovod.tensorflow as hvd
import tensorflow as tf


def model(x):
    return tf.layers.dense(x, 1, name='out')


def train(flags):
    hvd.init()
    x, y = make_data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shard(hvd.size(), hvd.rank())
    dataset = dataset.repeat().batch(16)
    features, labels = dataset.make_one_shot_iterator().get_next()
    loss = tf.losses.mean_squared_error(labels, model(features))
    global_step = tf.train.get_or_create_global_step()
    opt = hvd.DistributedOptimizer(tf.train.GradientDescentOptimizer(0.1 * hvd.size()))
    train_op = opt.minimize(loss, global_step=global_step)
    hooks = [hvd.BroadcastGlobalVariablesHook(0), tf.train.StopAtStepHook(last_step=100)]
    with tf.train.MonitoredTrainingSession(hooks=hooks) as sess:
        while not sess.should_stop():
            _, loss_value = sess.run([train_op, loss])


if __name__ == '__main__':
    parser = argparse.ArgumentParser()
    train(parser.parse_args())
"""

CONVERTED = '''
import argparse

import tensorflow as tf
# tf.compat.v1.layers need Keras 2: tf_keras carries them.
from tf_keras.src.legacy_tf_layers import core as tf1_core_layers


def model(x):
    return tf1_core_layers.dense(x, 1, name='out')


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


def first_replica(strategy, value):
    """This worker's first replica's value (the process of rank first_rank(strategy))."""
    return strategy.experimental_local_results(value)[0].numpy()


def train(flags):
    # Gone with Horovod (see the manifest's notes):
    # `hvd.init()` goes: the cluster comes from TF_CONFIG
    # `hvd.BroadcastGlobalVariablesHook` goes: every worker starts from the same initial values
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x, y = make_data()
    tf1_variables = TF1Variables(strategy)

    def rank_input(rank):
        """The dataset Horovod process `rank` read."""
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shard(strategy.num_replicas_in_sync, rank)
        dataset = dataset.repeat().batch(16)
        return dataset

    def worker_input(context):
        """One dataset per replica of this worker, in replica order: replica r reads rank r's."""
        local = context.num_replicas_in_sync // context.num_input_pipelines
        ranks = [rank_input(context.input_pipeline_id * local + j) for j in range(local)]
        if local == 1:
            return ranks[0]
        # distribute_datasets_from_function hands the elements to the replicas in turn
        return tf.data.Dataset.choose_from_datasets(ranks, tf.data.Dataset.range(local).repeat())

    batches = iter(strategy.distribute_datasets_from_function(worker_input))
    with strategy.scope(), tf1_variables.scope():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1 * strategy.num_replicas_in_sync)

    def model_fn(features, labels):
        """What each Horovod process built: now one replica."""
        with tf1_variables.scope():
            loss = tf.compat.v1.losses.mean_squared_error(labels, model(features))
        return loss

    def step_fn(features, labels):
        loss = model_fn(features, labels)
        fetches = {'loss': loss}  # read before the update, as the legacy fetches were
        # hvd.DistributedOptimizer AVERAGED the processes' gradients; apply_gradients SUMS the
        # replicas': each replica's loss is divided by all replicas of all workers.
        train_op = opt.minimize(loss / strategy.num_replicas_in_sync, global_step=global_step, var_list=tf1_variables.trainable)
        return fetches

    @tf.function
    def train_step(batch):
        return strategy.run(step_fn, args=batch)

    while int(global_step.numpy()) < 100:  # StopAtStepHook(last_step=...)
        outputs = train_step(next(batches))
        loss_value = first_replica(strategy, outputs['loss'])


if __name__ == '__main__':
    parser = argparse.ArgumentParser()
    train(parser.parse_args())
'''
