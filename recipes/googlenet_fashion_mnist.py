"""GoogLeNet (InceptionBlocks) on Fashion-MNIST resized to 96x96, trained with the tfaccel Trainer.

Images are scaled once and cached at 28x28; the resize to 96x96 runs per batch after
batching (`batch_map`), so the cache stays small. Prints and records examples/s.
Offline, scikit-learn's digits stand in (see `--no-fallback`).

    python recipes/googlenet_fashion_mnist.py --epochs 10

Takes the core recipe flags (`--help`), e.g. `--tune-batch-size` to probe the batch size first,
or `--doctor` (`tfaccel doctor RECIPE.py`) to diagnose what limits training.
"""

from __future__ import annotations

import common  # recipes/common.py: the shared command line and outputs
import keras
import tensorflow as tf

import tfaccel

NAME = "googlenet_fashion_mnist"
SIZE = 96


def scale(image, label):
    return tf.cast(image, tf.float32) / 255.0, label


def resize(images, labels):
    """Bilinear resize to 96x96 (a batch, or one image)."""
    return tf.image.resize(images, (SIZE, SIZE)), labels


def build_model() -> keras.Model:
    return tfaccel.models.googlenet(input_shape=(SIZE, SIZE, 1), num_classes=10)


def sgd(learning_rate: float, steps_per_epoch: int) -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(learning_rate, momentum=0.9)


def main(argv=None) -> dict:
    args = common.parser(
        __doc__, epochs=10, batch_size=128, learning_rate=0.05, doctor=True
    ).parse_args(argv)
    run = common.setup(args, NAME)
    data = common.load_tfds(run, "fashion_mnist", ("train", "test"), (28, 28, 1))
    summary, _ = common.train_classifier(
        run, data, build_model=build_model, optimizer=sgd, preprocess=scale, batch_map=resize
    )
    return summary


if __name__ == "__main__":
    common.main_guard(main)
