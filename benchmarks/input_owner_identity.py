"""Digests of the weights after the README quickstart (seeded) and after a two-replica
`fit` with arrays, sample weights and `validation_split` (issue 38: bit-identical before
and after the input's one owner). Run it on two source trees, compare the DIGEST lines:

    PYTHONPATH=/tmp/before python benchmarks/input_owner_identity.py /tmp/out-before
    PYTHONPATH=. python benchmarks/input_owner_identity.py /tmp/out-after
"""

import hashlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from tfaccel import devices  # noqa: E402

devices.configure(virtual_cpus=2)

import keras  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import tfaccel  # noqa: E402
from tfaccel import data  # noqa: E402


def quickstart(x, y):
    """The README's quickstart as written, with a seed."""
    keras.utils.set_random_seed(0)
    strategy = devices.strategy("auto")
    train = data.pipeline(
        data.from_arrays(x[:1500], y[:1500]),
        batch_size=64,
        training=True,
        seed=0,
        strategy=strategy,
    )
    val = data.pipeline(
        data.from_arrays(x[1500:], y[1500:]), batch_size=256, training=False, strategy=strategy
    )
    trainer = tfaccel.Trainer(
        lambda: tfaccel.models.resnet(
            18, input_shape=(8, 8, 1), num_classes=10, stem="cifar", width=16
        ),
        optimizer=lambda: keras.optimizers.Adam(2e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        strategy=strategy,
        precision="auto",
    )
    history = trainer.fit(
        train, epochs=5, validation_data=val, checkpoint_dir="runs/quickstart", verbose=0
    )
    return trainer.model.get_weights(), history


def two_replicas(x, y):
    """Arrays with sample weights and validation_split on two replicas."""
    keras.utils.set_random_seed(1)
    mirrored = devices.strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
    trainer = tfaccel.Trainer(
        lambda: keras.Sequential(
            [keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)]
        ),
        optimizer=lambda: keras.optimizers.SGD(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        strategy=mirrored,
    )
    weights = np.linspace(0.5, 1.5, len(x)).astype("float32")
    history = trainer.fit(
        x.reshape(len(x), -1),
        y,
        sample_weight=weights,
        validation_split=0.2,
        batch_size=64,
        epochs=3,
        verbose=0,
    )
    return trainer.model.get_weights(), history


def main() -> None:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    os.chdir(out)
    digits = load_digits()
    x = (digits.images[..., None] / 16.0).astype("float32")
    y = digits.target.astype("int32")
    for name, run in (("quickstart", quickstart), ("two_replicas", two_replicas)):
        weights, history = run(x, y)
        print(name, "history", {k: [float(v) for v in vs] for k, vs in history.history.items()})
        digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in weights))
        print("DIGEST", name, digest.hexdigest()[:16])


if __name__ == "__main__":
    main()
