"""A small deterministic training job for the fault-tolerance tests.

Counts every example it trains on (ids and count live in the model, so they are
checkpointed with it). Can kill or SIGTERM itself at a chosen step, once.
"""

import argparse
import json
import os
import pathlib
import signal
import threading
import time

import keras
import numpy as np
import tensorflow as tf

import tfaccel

EXAMPLES, FEATURES = 96, 6


@keras.saving.register_keras_serializable(package="tfaccel_tests")
class Counter(keras.layers.Layer):
    """Records how many examples (and the sum of their ids) passed in training."""

    def build(self, input_shape):
        # Global totals on any number of replicas: each replica adds its count times the
        # replicas, and "mean" across them makes the sum (so a resume on M keeps counting).
        self.seen = self.add_weight(
            shape=(), initializer="zeros", trainable=False, name="seen", aggregation="mean"
        )
        self.id_sum = self.add_weight(
            shape=(), initializer="zeros", trainable=False, name="ids", aggregation="mean"
        )

    def call(self, x, training=None):
        if training:
            context = tf.distribute.get_replica_context()
            replicas = 1.0 if context is None else float(context.num_replicas_in_sync)
            self.seen.assign_add(tf.cast(tf.shape(x)[0], "float32") * replicas)
            self.id_sum.assign_add(tf.reduce_sum(x[:, 0]) * replicas)
        return x[:, 1:]


def build():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES + 1,))
    hidden = keras.layers.Dense(16, activation="relu")(Counter(name="counter")(inputs))
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(hidden))


def arrays(nan_from=None):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype("float32")
    if nan_from is not None:
        x[nan_from:] = np.nan
    ids = np.arange(EXAMPLES, dtype="float32")[:, None]
    y = rng.integers(0, 3, EXAMPLES).astype("int32")
    return np.concatenate([ids, x], axis=1), y


def dataset(nan_from=None):
    ds = tf.data.Dataset.from_tensor_slices(arrays(nan_from))
    return ds.shuffle(EXAMPLES, seed=1).batch(8)  # 12 steps per epoch, new order each epoch


def jitter(x, y, seed):
    """Stateless noise on the features (column 0, the example id, stays exact)."""
    noise = tf.random.stateless_normal([FEATURES], seed, stddev=0.3)
    return tf.concat([x[:1], x[1:] + noise], axis=0), y


def augmented_dataset(strategy):
    source = tfaccel.data.from_arrays(*arrays())
    return tfaccel.data.pipeline(
        source, batch_size=8, training=True, seed=1, augment=jitter, strategy=strategy
    )


class SelfSignal(keras.callbacks.Callback):
    """Sends a signal to this process when training reaches `step`, once (a marker file)."""

    def __init__(self, step, sig, marker):
        super().__init__()
        self.step, self.sig, self.marker = step, sig, pathlib.Path(marker)
        self.seen = 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen = batch + 1
        trainer_step = int(self.model.optimizer.iterations.numpy())
        if trainer_step >= self.step and not self.marker.exists():
            self.marker.write_text(str(trainer_step))
            if self.sig == signal.SIGKILL:  # after the checkpoint being written, as if
                for thread in threading.enumerate():  # saves were synchronous (kills
                    if thread.name.startswith("tfaccel-save"):  # mid-write: see
                        thread.join()  # tests/test_async_checkpoint.py)
            os.kill(os.getpid(), self.sig)


class SlowWhenAlone(keras.callbacks.Callback):
    """Sleeps `seconds` after each step call while the job runs on one worker of a cluster:
    a shrunken job then outlasts the launcher's polls for its newer checkpoint on any host
    (its 12 steps would otherwise end before the first poll on a fast one)."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


class HistoryLog(keras.callbacks.Callback):
    """Appends each finished epoch's logs to a JSON-lines file (kept across kills)."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def on_epoch_end(self, epoch, logs=None):
        with open(self.path, "a") as f:
            f.write(json.dumps({"epoch": epoch, **{k: float(v) for k, v in logs.items()}}) + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--kill-at", type=int)
    parser.add_argument("--kill-worker", type=int, help="multi-worker: only this task kills")
    parser.add_argument("--term-at", type=int)
    parser.add_argument("--int-at", type=int, help="Ctrl-C (SIGINT) at this step")
    parser.add_argument("--no-ckpt", action="store_true", help="fit without checkpoint_dir")
    parser.add_argument("--one-device", action="store_true", help="OneDeviceStrategy")
    parser.add_argument("--augment", action="store_true")
    parser.add_argument("--distributed-iterator", action="store_true")
    parser.add_argument("--replicas", type=int, help="a MirroredStrategy over N logical CPUs")
    parser.add_argument("--marker", help="the kill's once-marker (default: OUT.killed)")
    parser.add_argument("--history-log", help="append each epoch's logs here (JSON lines)")
    parser.add_argument("--alone-sleep", type=float, help="seconds a step call on one worker")
    args = parser.parse_args()
    if args.replicas:
        tfaccel.devices.configure(virtual_cpus=args.replicas)

    from tfaccel.data.assembly import feed

    own_shard, local = feed.local_shard, []

    def local_shard(strategy, fn):  # records which input path the training took
        dataset = None if args.distributed_iterator else own_shard(strategy, fn)
        local.append(dataset is not None)
        return dataset

    feed.local_shard = local_shard

    tf.config.experimental.enable_op_determinism()
    strategy = tfaccel.devices.strategy("auto")
    if args.replicas:
        cpus = [f"/cpu:{i}" for i in range(args.replicas)]
        strategy = tfaccel.devices.strategy("mirrored", devices=cpus)
    if args.one_device:
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    callbacks = []
    config = tfaccel.devices.read_tf_config()
    index = None if config is None else config["task"]["index"]
    if args.kill_at and args.kill_worker in (None, index):
        marker = args.marker or args.out + ".killed"
        callbacks.append(SelfSignal(args.kill_at, signal.SIGKILL, marker))
    if args.history_log:
        callbacks.append(HistoryLog(args.history_log))
    if args.alone_sleep and config is not None and len(config["cluster"]["worker"]) == 1:
        callbacks.append(SlowWhenAlone(args.alone_sleep))
    if args.term_at:
        callbacks.append(SelfSignal(args.term_at, signal.SIGTERM, args.out + ".termed"))
    if args.int_at:
        callbacks.append(SelfSignal(args.int_at, signal.SIGINT, args.out + ".interrupted"))
    trainer = tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.SGD(0.05, momentum=0.9),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        strategy=strategy,
        steps_per_loop=2,
    )
    history = trainer.fit(
        augmented_dataset(strategy) if args.augment else dataset(),
        epochs=args.epochs,
        checkpoint_dir=None if args.no_ckpt else args.ckpt,
        checkpoint_every=4,
        callbacks=callbacks,
        verbose=0,
    )
    counter = trainer.model.get_layer("counter")
    out = args.out if config is None else f"{args.out}.worker{index}.npz"
    np.savez(
        out,
        *trainer.model.get_weights(),
        seen=counter.seen.numpy(),
        id_sum=counter.id_sum.numpy(),
        step=int(trainer.step.numpy()),
        local_shard=np.array(local, dtype=bool),
        first_loss=history.history["loss"][0] if history.history.get("loss") else np.nan,
        last_loss=history.history["loss"][-1] if history.history.get("loss") else np.nan,
        loss_history=np.array(history.history.get("loss", []), dtype="float64"),
        accuracy_history=np.array(history.history.get("accuracy", []), dtype="float64"),
    )


if __name__ == "__main__":
    main()
