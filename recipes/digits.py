"""Main job (`make run`): train a small convolutional network on handwritten digits.

Uses scikit-learn's bundled digits (1,797 8×8 images, works offline). Prints the
resolved settings, per-epoch progress and the final test accuracy; writes logs
under `runs/digits/`.
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


def load(seed: int):
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    y = digits.target.astype("int32")
    return train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)


def build_model(num_classes: int = 10) -> keras.Model:
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(128, activation="relu")(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logdir", default="runs/digits")
    args = parser.parse_args(argv)

    tfaccel.devices.configure(memory_growth=True)
    keras.utils.set_random_seed(args.seed)
    policy = tfaccel.precision.apply("auto")
    strategy = tfaccel.devices.strategy("auto")
    logdir = pathlib.Path(args.logdir) / time.strftime("%Y%m%d-%H%M%S")
    logdir.mkdir(parents=True, exist_ok=True)

    x_train, x_test, y_train, y_test = load(args.seed)
    settings = {
        "strategy": type(strategy).__name__,
        "replicas": strategy.num_replicas_in_sync,
        "global_batch": args.batch_size,
        "dtype_policy": policy.name,
        "train_examples": len(x_train),
        "test_examples": len(x_test),
    }
    print("Resolved settings:")
    for key, value in settings.items():
        print(f"  {key:<15} {value}")

    with strategy.scope():
        model = build_model()
        optimizer = tfaccel.precision.wrap_optimizer(keras.optimizers.Adam(1e-3))
        model.compile(optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(
        x_train,
        y_train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        validation_split=0.1,
        callbacks=[keras.callbacks.CSVLogger(str(logdir / "history.csv"))],
        verbose=2,
    )
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    summary = {**settings, "test_loss": float(loss), "test_accuracy": float(accuracy)}
    (logdir / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"Test accuracy: {accuracy:.4f}  (logs in {logdir})")
    return summary


if __name__ == "__main__":
    main()
