"""GoogLeNet (InceptionBlocks) on Fashion-MNIST resized to 96x96, trained with the tfaccel Trainer.

Images are scaled once and cached at 28x28; the resize to 96x96 runs per batch after
batching (`batch_map`), so the cache stays small. Prints and records examples/s.
Offline, scikit-learn's digits stand in (see `--no-fallback`).

    python recipes/googlenet_fashion_mnist.py --epochs 10

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

NAME = "googlenet_fashion_mnist"
SIZE = 96
LOSS = "sparse_categorical_crossentropy"


def scale(image, label):
    return tf.cast(image, tf.float32) / 255.0, label


def resize(images, labels):
    """Bilinear resize to 96x96 (a batch, or one image)."""
    return tf.image.resize(images, (SIZE, SIZE)), labels


def build_model() -> keras.Model:
    return tfaccel.models.googlenet(input_shape=(SIZE, SIZE, 1), num_classes=10)


def main(argv=None) -> dict:
    args = common.parser(
        __doc__, epochs=10, batch_size=128, learning_rate=0.05, doctor=True
    ).parse_args(argv)
    run = common.setup(args, NAME)  # devices, strategy, dtype policy, seed, --out
    data = tfds_or_digits.load(run, "fashion_mnist", ("train", "test"), (28, 28, 1))
    if args.tune_batch_size:  # sets args.batch_size and args.learning_rate
        examples = data["train"].map(scale).map(resize)
        batch_tuning.tune_batch_size(run, build_model, examples, loss=LOSS, optimizer="sgd")

    # Input pipelines: `scale` runs once per example and is cached at 28x28; the training
    # pipeline then shuffles every epoch and batches; `batch_map` resizes each batch to
    # 96x96 after batching (one op a batch, and a cache 12 times smaller); prefetch.
    train = tfaccel.data.pipeline(
        data["train"],
        batch_size=args.batch_size,
        training=True,
        preprocess=scale,
        batch_map=resize,
        seed=args.seed,
        strategy=run.strategy,
    )
    test = tfaccel.data.pipeline(
        data["test"],
        batch_size=args.batch_size,
        training=False,
        preprocess=scale,
        batch_map=resize,
        strategy=run.strategy,
    )
    print(f"Data plan:\n{tfaccel.data.explain(train)}")

    # The Trainer builds the model and the optimizer in the strategy's scope.
    trainer = tfaccel.Trainer(
        build_model,
        optimizer=lambda: keras.optimizers.SGD(args.learning_rate, momentum=0.9),
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
