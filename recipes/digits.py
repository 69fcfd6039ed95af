"""Main job (`make run`): train a small ResNet on handwritten digits with tfaccel.

Uses scikit-learn's bundled digits (1,797 8×8 images, works offline), a model built
from `tfaccel.ResidualBlock` layers, `tfaccel.data.pipeline`, the `tfaccel.Trainer`
with checkpoints, and the throughput / memory callbacks. Prints the resolved
settings, per-epoch progress, throughput, memory and the final test accuracy;
writes logs and checkpoints under `runs/digits/`.

Run again with the same `--logdir` to resume from its checkpoint. Multi-worker on
one machine: `tfaccel launch --workers 2 -- python recipes/digits.py`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import keras
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import tfaccel
from tfaccel import callbacks


def load(seed: int):
    """Returns (train, validation, test) splits of (images, labels)."""
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    y = digits.target.astype("int32")
    x_rest, x_test, y_rest, y_test = train_test_split(
        x, y, test_size=0.25, random_state=seed, stratify=y
    )
    x_train, x_val, y_train, y_val = train_test_split(
        x_rest, y_rest, test_size=0.1, random_state=seed, stratify=y_rest
    )
    return (x_train, y_train), (x_val, y_val), (x_test, y_test)


def build_model(num_classes: int = 10) -> keras.Model:
    """A stem convolution, two residual blocks, global pooling, a float32 head."""
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(32, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.BatchNormalization(momentum=0.9)(x)
    x = keras.layers.ReLU()(x)
    x = tfaccel.ResidualBlock(32)(x)
    x = tfaccel.ResidualBlock(64, strides=2)(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.2)(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="digits_resnet")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logdir", default=None, help="default: runs/digits/<time>")
    parser.add_argument("--verbose", type=int, default=2)
    args = parser.parse_args(argv)

    # Devices and the strategy come first: nothing may run on TensorFlow before them.
    tfaccel.devices.configure()
    strategy = tfaccel.devices.strategy("auto")
    policy = tfaccel.precision.apply("auto")
    keras.utils.set_random_seed(args.seed)
    logdir = pathlib.Path(args.logdir or f"runs/digits/{time.strftime('%Y%m%d-%H%M%S')}")
    logdir.mkdir(parents=True, exist_ok=True)

    (x_train, y_train), (x_val, y_val), (x_test, y_test) = load(args.seed)
    data = tfaccel.data
    train = data.pipeline(
        data.from_arrays(x_train, y_train),
        batch_size=args.batch_size,
        training=True,
        seed=args.seed,
        strategy=strategy,
    )
    val = data.pipeline(
        data.from_arrays(x_val, y_val), batch_size=256, training=False, strategy=strategy
    )
    test = data.pipeline(
        data.from_arrays(x_test, y_test), batch_size=256, training=False, strategy=strategy
    )
    print(f"Input pipeline ({policy.name} policy):\n{data.explain(train)}")

    trainer = tfaccel.Trainer(
        build_model,
        optimizer=lambda: keras.optimizers.Adam(2e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        strategy=strategy,
    )
    throughput = callbacks.Throughput(warmup_steps=5, window=50)
    memory = callbacks.DeviceMemory()
    trainer.fit(
        train,
        epochs=args.epochs,
        validation_data=val,
        callbacks=callbacks.ordered(
            [throughput, memory, keras.callbacks.CSVLogger(str(logdir / "history.csv"))]
        ),
        checkpoint_dir=logdir / "checkpoints",
        verbose=args.verbose,
    )
    results = trainer.evaluate(test)
    summary = {
        **{k: str(v) for k, v in trainer.settings.items()},
        "train_examples": len(x_train),
        "test_examples": len(x_test),
        "test_loss": results["loss"],
        "test_accuracy": results["accuracy"],
        "throughput": throughput.summary,
    }
    (logdir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"Test accuracy: {results['accuracy']:.4f}  (logs in {logdir})")
    return summary


if __name__ == "__main__":
    main()
