"""ResNet-18 (CIFAR stem) on CIFAR-10: pad-crop + flip, SGD momentum 0.9, warm-up + cosine LR.

Mixed precision "auto" (bfloat16 on Ampere+, float16 on Volta/Turing, float32 on CPU),
the tfaccel data pipeline and Trainer. Prints and records examples/s. Offline,
scikit-learn's digits resized to 32x32x3 stand in (see `--no-fallback`).

    python recipes/resnet_cifar10.py --epochs 30

Takes the core recipe flags (`--help`), e.g. `--tune-batch-size` to probe the batch size first,
or `--doctor` (`tfaccel doctor RECIPE.py`) to diagnose what limits training.
"""

from __future__ import annotations

import common  # recipes/common.py: the shared command line and outputs
import keras
import tensorflow as tf

import tfaccel

NAME = "resnet_cifar10"
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
WARMUP_EPOCHS = 2


def normalize(image, label):
    """uint8 → float32 standardised with the CIFAR-10 channel statistics."""
    return (tf.cast(image, tf.float32) / 255.0 - MEAN) / STD, label


def pad_crop_flip(image, label):
    """Pad 4 pixels, crop a random 32x32 window, flip left-right half of the time."""
    padded = tf.pad(image, [[4, 4], [4, 4], [0, 0]], mode="REFLECT")
    image = tf.image.random_crop(padded, (32, 32, 3))
    return tf.image.random_flip_left_right(image), label


def build_model(width: int = 64) -> keras.Model:
    return tfaccel.models.resnet(
        18, input_shape=(32, 32, 3), num_classes=10, stem="cifar", width=width
    )


def optimizer_for(epochs: int):
    """SGD momentum 0.9 with linear warm-up then cosine decay over `epochs`."""

    def make(learning_rate: float, steps_per_epoch: int) -> keras.optimizers.Optimizer:
        total = max(1, epochs * steps_per_epoch)
        warmup = min(WARMUP_EPOCHS * steps_per_epoch, total // 2)
        schedule = keras.optimizers.schedules.CosineDecay(
            initial_learning_rate=learning_rate / 10 if warmup else learning_rate,
            decay_steps=total - warmup,
            warmup_target=learning_rate if warmup else None,
            warmup_steps=warmup,
        )
        return keras.optimizers.SGD(schedule, momentum=0.9, weight_decay=5e-4)

    return make


def parser():
    p = common.parser(__doc__, epochs=30, batch_size=128, learning_rate=0.1, doctor=True)
    p.add_argument("--width", type=int, default=64, help="filters of the first stage")
    return p


def train(args, name: str = NAME, extra: dict | None = None):
    """Runs the job for parsed `args`; returns (metrics.json's content, the Trainer)."""
    run = common.setup(args, name)
    data = common.load_tfds(run, "cifar10", ("train", "test"), (32, 32, 3))
    return common.train_classifier(
        run,
        data,
        build_model=lambda: build_model(args.width),
        optimizer=optimizer_for(args.epochs),
        preprocess=normalize,
        augment=pad_crop_flip,
        extra=extra,
    )


def main(argv=None) -> dict:
    return train(parser().parse_args(argv))[0]


if __name__ == "__main__":
    common.main_guard(main)
