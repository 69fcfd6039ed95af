"""One task of a two-task "Slurm" job: train_job's model and data under strategy("auto").

Saves the weights, the strategy, the replica count and the cluster this task found.
"""

import argparse
import pathlib
import sys

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import train_job  # noqa: E402

import tfaccel  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    tf.config.experimental.enable_op_determinism()
    strategy = tfaccel.devices.strategy("auto")
    info = tfaccel.cluster.detect()
    trainer = tfaccel.Trainer(
        train_job.build,
        optimizer=lambda: keras.optimizers.SGD(0.05),
        loss="sparse_categorical_crossentropy",
        strategy=strategy,
        steps_per_loop=4,
    )
    trainer.fit(train_job.dataset(), epochs=2, checkpoint_dir=args.ckpt, verbose=0)
    counter = trainer.model.get_layer("counter")
    np.savez(
        f"{args.out}.task{info.task_index}.npz",
        *trainer.model.get_weights(),
        seen=counter.seen.numpy(),  # a global total (train_job.Counter)
        multi_worker=isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
        replicas=strategy.num_replicas_in_sync,
        source=trainer.settings["cluster"],
    )


if __name__ == "__main__":
    main()
