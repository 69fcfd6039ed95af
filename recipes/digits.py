"""Main job (`make run`): train a small ResNet on handwritten digits with tfaccel.

Uses scikit-learn's bundled digits (1,797 8×8 images, works offline), a model built
from `tfaccel.ResidualBlock` layers, `tfaccel.data.pipeline`, the `tfaccel.Trainer`
with checkpoints, and the throughput / memory callbacks. Prints the resolved
settings, per-epoch progress, throughput, memory and the final test accuracy;
writes logs, metrics.json, curves.png and checkpoints under `runs/digits/<time>/`.

Takes the core flags every recipe shares (`--help`; `--tune-batch-size` probes the batch
size first, `--doctor` diagnoses what limits training instead of training:
`tfaccel doctor recipes/digits.py`); run again with the same `--out` to resume from its checkpoint
(`<out>/checkpoints` unless `--checkpoint-dir` says).
Multi-worker on one machine: `tfaccel launch --workers 2 -- python recipes/digits.py`.
"""

from __future__ import annotations

import pathlib
import time

import batch_tuning  # recipes/batch_tuning.py: --tune-batch-size
import common  # recipes/common.py: the shared command line and set-up
import keras
import outputs  # recipes/outputs.py: history.csv, metrics.json, curves.png, model.keras
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import tfaccel
from tfaccel import callbacks, strict_json


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
    p = common.parser(
        __doc__,
        epochs=15,
        batch_size=64,
        learning_rate=2e-3,
        fallback=False,
        doctor=True,
        methods=True,
    )
    p.add_argument("--logdir", default=None, help="old name of --out")
    common.default_is(p, "--data-dir", "unused, the digits ship with scikit-learn")
    common.default_is(p, "--out", "runs/digits/<time>/")
    common.default_is(p, "--logdir", "runs/digits/<time>/")
    common.default_is(p, "--checkpoint-dir", "<out>/checkpoints")
    args = p.parse_args(argv)
    args.out = args.out or args.logdir or f"runs/digits/{time.strftime('%Y%m%d-%H%M%S')}"
    args.checkpoint_dir = args.checkpoint_dir or str(pathlib.Path(args.out) / "checkpoints")

    # Devices and the strategy come first: nothing may run on TensorFlow before them.
    run = common.setup(args, "digits")
    run.dataset = "scikit-learn digits"
    logdir, strategy = run.out, run.strategy

    (x_train, y_train), (x_val, y_val), (x_test, y_test) = load(args.seed)
    if args.smoke:
        x_train, y_train = x_train[: common.SMOKE_TRAIN], y_train[: common.SMOKE_TRAIN]
    data = tfaccel.data
    if args.tune_batch_size:
        batch_tuning.tune_batch_size(
            run,
            build_model,
            data.from_arrays(x_train, y_train),
            loss="sparse_categorical_crossentropy",
            optimizer="adam",
        )
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
    print(f"Input pipeline ({run.policy.name} policy):\n{data.explain(train)}")

    trainer = tfaccel.Trainer(
        build_model,
        optimizer=lambda: keras.optimizers.Adam(args.learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        strategy=strategy,
        precision=common.trainer_precision(run),
        methods=args.methods,  # --one-cycle's, or the tuners' for a grown batch
    )
    if args.doctor:  # diagnose instead of training (tfaccel doctor recipes/digits.py)
        return common.doctor(run, trainer, train)
    chosen, throughput = outputs.callbacks(run, callbacks.DeviceMemory())
    history = trainer.fit(
        train,
        epochs=args.epochs,
        validation_data=val,
        callbacks=chosen,
        checkpoint_dir=args.checkpoint_dir,
        verbose=args.verbose,
    ).history
    results = trainer.evaluate(test)
    summary = {
        **{k: str(v) for k, v in trainer.settings.items()},
        "train_examples": len(x_train),
        "test_examples": len(x_test),
        "test_loss": results["loss"],
        "test_accuracy": results["accuracy"],
        "throughput": throughput.summary,
    }
    (logdir / "summary.json").write_text(strict_json.dumps(summary, indent=2, default=str))
    outputs.finish(
        run,
        history,
        metric="accuracy",
        final={"test_loss": results["loss"], "test_accuracy": results["accuracy"]},
        examples_per_sec=outputs.examples_per_second(throughput),
        settings=trainer.settings,
        trainer=trainer,
    )
    print(f"Test accuracy: {results['accuracy']:.4f}  (logs in {logdir})")
    return summary


if __name__ == "__main__":
    common.main_guard(main)
