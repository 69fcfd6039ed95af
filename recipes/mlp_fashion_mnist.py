"""MLP 784-256-10 on Fashion-MNIST (tfaccel.models.mlp, SGD), trained with the tfaccel Trainer.

Data: TFDS `fashion_mnist` (`--data-dir` is TFDS's data directory); offline it falls
back to scikit-learn's digits resized to 28x28 (`--no-fallback` makes that an error).
Writes history.csv, TensorBoard logs, metrics.json and curves.png under `--out`.

    python recipes/mlp_fashion_mnist.py --epochs 10

Takes the core recipe flags (`--help`), e.g. `--tune-batch-size` to probe the batch size first,
or `--doctor` (`tfaccel doctor RECIPE.py`) to diagnose what limits training.
"""

from __future__ import annotations

import common  # recipes/common.py: the shared command line and outputs
import keras
import tensorflow as tf

import tfaccel

NAME = "mlp_fashion_mnist"
LOSS = "sparse_categorical_crossentropy"


def flatten(image, label):
    """uint8 28x28x1 → float32 784 in [0, 1]."""
    return tf.reshape(tf.cast(image, tf.float32) / 255.0, (-1,)), label


def build_model() -> keras.Model:
    return tfaccel.models.mlp(input_shape=(784,), hidden=(256,), num_classes=10)


def sgd(learning_rate: float, steps_per_epoch: int) -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(learning_rate)


def main(argv=None) -> dict:
    args = common.parser(
        __doc__, epochs=10, batch_size=256, learning_rate=0.1, doctor=True
    ).parse_args(argv)
    run = common.setup(args, NAME)
    data = common.load_tfds(run, "fashion_mnist", ("train", "test"), (28, 28, 1))
    summary, _ = common.train_classifier(
        run, data, build_model=build_model, optimizer=sgd, preprocess=flatten
    )
    return summary


if __name__ == "__main__":
    common.main_guard(main)
