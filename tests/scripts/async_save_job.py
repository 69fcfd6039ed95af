"""Kill trials for asynchronous checkpoints (`tests/test_async_checkpoint.py`).

`kill ROOT TRIALS SEED`: imports TensorFlow once, runs no op, then per trial forks a
child that saves `ROOT/trial-<i>` after every step (a background write is nearly
always in flight: 32 MB of variables, one save a step) and SIGKILLs it a random delay
after its first checkpoint is complete. Prints one JSON line: the delays.

The saved state is a function of the step n: `step` = n, every variable filled with n,
the `tf.data` iterator over `range` at element n, so any checkpoint can be checked
exactly without a reference run (`expected_state`).

`term ROOT`: `Trainer.fit` saving every step with slow writes (0.3 s each), SIGTERM
to itself at step 6 while a write is in flight: exits as the preemption contract says.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time

import tensorflow as tf

VARIABLES, SIDE = 8, 1024  # 8 x 4 MB


def saved_objects() -> dict:
    """The objects a trial saves (fresh, at step 0)."""
    return {
        "step": tf.Variable(0, dtype=tf.int64),
        "big": [tf.Variable(tf.zeros([SIDE, SIDE])) for _ in range(VARIABLES)],
        "iterator": iter(tf.data.Dataset.range(1 << 40)),
    }


def _child(directory: str, ready: int) -> None:
    from tfaccel.train.state.checkpoint import CheckpointState  # imported by the parent

    objects = saved_objects()
    state = CheckpointState(directory, tf.distribute.get_strategy(), keep=2, **objects)
    assert state.asynchronous
    for n in range(1, 1 << 30):
        objects["step"].assign(n)
        for variable in objects["big"]:
            variable.assign(tf.fill([SIDE, SIDE], float(n)))
        next(objects["iterator"])  # element n - 1 consumed: the next one is n
        state.save(n)
        if n == 1:
            state.wait()
            os.write(ready, b"1")


def kill_trials(root: str, trials: int, seed: int) -> list[float]:
    import tfaccel.train.state.checkpoint  # noqa: F401 - once, before any fork

    rng = random.Random(seed)
    delays = []
    for trial in range(trials):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(read)
            try:
                _child(os.path.join(root, f"trial-{trial}"), write)
            finally:
                os._exit(1)
        os.close(write)
        os.read(read, 1)  # the first checkpoint is complete
        os.close(read)
        delay = rng.uniform(0.0, 0.8)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        delays.append(round(delay, 3))
    return delays


def term_during_save(root: str) -> None:
    import keras
    import numpy as np

    import tfaccel
    from tfaccel.train.state import async_save

    write = async_save.write

    def slow_write(held, prefix):
        time.sleep(0.3)
        return write(held, prefix)

    async_save.write = slow_write

    class Term(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == 6:
                os.kill(os.getpid(), signal.SIGTERM)

    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    trainer = tfaccel.Trainer(
        lambda: keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)]),
        optimizer=lambda: keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=tf.distribute.get_strategy(),
        steps_per_loop=1,
    )
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    trainer.fit(data, epochs=3, checkpoint_dir=root, checkpoint_every=1, callbacks=[Term()])
    print("fit returned", flush=True)  # not reached: preemption exits


if __name__ == "__main__":
    if sys.argv[1] == "kill":
        print(json.dumps(kill_trials(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
    else:
        term_during_save(sys.argv[2])
