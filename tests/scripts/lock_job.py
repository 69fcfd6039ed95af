"""A tiny training run on a checkpoint directory, for the directory-ownership tests.

With `--pause-at N` it writes `<ckpt>.ready` once step N is done (after a save at
step N - 2) and waits, at most `--wait` seconds, until the file `<ckpt>.go` exists.
"""

import argparse
import pathlib
import threading
import time

import keras
import numpy as np
import tensorflow as tf

import tfaccel


class Pause(keras.callbacks.Callback):
    def __init__(self, step, ready, go, wait):
        super().__init__()
        self.step, self.ready, self.go, self.wait = step, ready, go, wait

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) != self.step:
            return
        for thread in threading.enumerate():  # the save in flight ends before "ready"
            if thread.name.startswith("tfaccel-save"):
                thread.join()
        self.ready.write_text("ready")
        deadline = time.monotonic() + self.wait
        while not self.go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--pause-at", type=int)
    parser.add_argument("--wait", type=float, default=300.0)
    args = parser.parse_args()
    # The data of tests/test_checkpoint_ownership.py, so that a run there can resume this one.
    x = np.random.default_rng(1).normal(size=(64, 4)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32")

    def build():
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])

    trainer = tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=tf.distribute.get_strategy(),
        steps_per_loop=2,
    )
    callbacks = []
    if args.pause_at:
        ckpt = pathlib.Path(args.ckpt)
        ready, go = ckpt.with_name(ckpt.name + ".ready"), ckpt.with_name(ckpt.name + ".go")
        callbacks.append(Pause(args.pause_at, ready, go, args.wait))
    trainer.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8),
        epochs=1,
        checkpoint_dir=args.ckpt,
        checkpoint_every=2,
        callbacks=callbacks,
        verbose=0,
    )
    print(f"done at step {int(trainer.step.numpy())}")


if __name__ == "__main__":
    main()
