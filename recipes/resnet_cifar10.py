"""ResNet-18 (CIFAR stem) on CIFAR-10: pad-crop + flip, SGD momentum 0.9, warm-up + cosine LR.

Mixed precision "auto" (bfloat16 on Ampere+, float16 on Volta/Turing, float32 on CPU),
the tfaccel data pipeline and Trainer. Prints and records examples/s. Offline,
scikit-learn's digits resized to 32x32x3 stand in (see `--no-fallback`).

    python recipes/resnet_cifar10.py --epochs 30

Takes the core recipe flags (`--help`), e.g. `--tune-batch-size` to probe the batch size first,
or `--doctor` (`tfaccel doctor RECIPE.py`) to diagnose what limits training.
"""

from __future__ import annotations

import batch_tuning  # recipes/batch_tuning.py: --tune-batch-size
import common  # recipes/common.py: the shared command line and set-up
import keras
import outputs  # recipes/outputs.py: history.csv, metrics.json, curves.png, model.keras
import tensorflow as tf
import tfds_or_digits  # recipes/tfds_or_digits.py: TFDS, or the digits offline

import tfaccel

NAME = "resnet_cifar10"
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
WARMUP_EPOCHS = 2
LOSS = "sparse_categorical_crossentropy"


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


def sgd_warmup_cosine(learning_rate: float, epochs: int, steps_per_epoch: int):
    """SGD momentum 0.9 with linear warm-up then cosine decay over `epochs`."""
    total = max(1, epochs * steps_per_epoch)
    warmup = min(WARMUP_EPOCHS * steps_per_epoch, total // 2)
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=learning_rate / 10 if warmup else learning_rate,
        decay_steps=total - warmup,
        warmup_target=learning_rate if warmup else None,
        warmup_steps=warmup,
    )
    return keras.optimizers.SGD(schedule, momentum=0.9, weight_decay=5e-4)


def parser():
    p = common.parser(__doc__, epochs=30, batch_size=128, learning_rate=0.1, doctor=True)
    p.add_argument("--width", type=int, default=64, help="filters of the first stage")
    return p


def main(argv=None) -> dict:
    args = parser().parse_args(argv)
    run = common.setup(args, NAME)  # devices, strategy, dtype policy, seed, --out
    data = tfds_or_digits.load(run, "cifar10", ("train", "test"), (32, 32, 3))

    def model() -> keras.Model:  # the Trainer calls it in the strategy's scope
        return build_model(args.width)

    if args.tune_batch_size:  # sets args.batch_size and args.learning_rate
        examples = data["train"].map(normalize)
        batch_tuning.tune_batch_size(run, model, examples, loss=LOSS, optimizer="sgd")

    # Input pipelines: `normalize` runs once per example and is cached; `augment` runs
    # after the cache, so every epoch sees new crops and flips; then a shuffle seeded by
    # `seed`, batches of the global batch (each replica gets its share) and prefetch.
    # `explain` prints the plan: the order, the cache, what a resumed run reproduces.
    train = tfaccel.data.pipeline(
        data["train"],
        batch_size=args.batch_size,
        training=True,
        preprocess=normalize,
        augment=pad_crop_flip,
        seed=args.seed,
        strategy=run.strategy,
    )
    test = tfaccel.data.pipeline(
        data["test"],
        batch_size=args.batch_size,
        training=False,
        preprocess=normalize,
        strategy=run.strategy,
    )
    print(f"Data plan:\n{tfaccel.data.explain(train)}")

    # The learning-rate schedule counts optimizer steps: it needs the steps per epoch.
    steps_per_epoch = max(1, int(data["train"].cardinality()) // args.batch_size)
    trainer = tfaccel.Trainer(
        model,
        optimizer=lambda: sgd_warmup_cosine(args.learning_rate, args.epochs, steps_per_epoch),
        loss=LOSS,
        metrics=["accuracy"],
        strategy=run.strategy,
        precision=common.trainer_precision(run),  # "auto": timed on this model's step
    )
    if args.doctor:  # diagnose what limits training, instead of training
        return common.doctor(run, trainer, train)

    # Plain Keras callbacks: examples/s (tfaccel.callbacks.Throughput), history.csv, TensorBoard.
    callbacks, throughput = outputs.callbacks(run)
    history = trainer.fit(
        train,
        epochs=args.epochs,
        validation_data=test,
        callbacks=callbacks,
        checkpoint_dir=args.checkpoint_dir,  # resumes from its latest checkpoint
        verbose=args.verbose,
    ).history
    if history.get("val_loss"):  # the test set validated every epoch: its last result
        final = {"test_loss": history["val_loss"][-1], "test_accuracy": history["val_accuracy"][-1]}
    else:  # nothing left to train (a finished checkpoint): evaluate what was restored
        results = trainer.evaluate(test)
        final = {"test_loss": results["loss"], "test_accuracy": results["accuracy"]}
    return outputs.finish(
        run,
        history,
        metric="accuracy",
        final=final,
        examples_per_sec=outputs.examples_per_second(throughput),
        settings=trainer.settings,
        trainer=trainer,
    )


if __name__ == "__main__":
    common.main_guard(main)
