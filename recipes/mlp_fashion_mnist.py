"""MLP 784-256-10 on Fashion-MNIST (tfaccel.models.mlp, SGD), trained with the tfaccel Trainer.

Data: TFDS `fashion_mnist` (`--data-dir` is TFDS's data directory); offline it falls
back to scikit-learn's digits resized to 28x28 (`--no-fallback` makes that an error).
Writes history.csv, TensorBoard logs, metrics.json and curves.png under `--out`.

    python recipes/mlp_fashion_mnist.py --epochs 10

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

NAME = "mlp_fashion_mnist"
LOSS = "sparse_categorical_crossentropy"


def flatten(image, label):
    """uint8 28x28x1 → float32 784 in [0, 1]."""
    return tf.reshape(tf.cast(image, tf.float32) / 255.0, (-1,)), label


def build_model() -> keras.Model:
    return tfaccel.models.mlp(input_shape=(784,), hidden=(256,), num_classes=10)


def main(argv=None) -> dict:
    args = common.parser(
        __doc__, epochs=10, batch_size=256, learning_rate=0.1, doctor=True
    ).parse_args(argv)
    run = common.setup(args, NAME)  # devices, strategy, dtype policy, seed, --out
    data = tfds_or_digits.load(run, "fashion_mnist", ("train", "test"), (28, 28, 1))
    if args.tune_batch_size:  # sets args.batch_size and args.learning_rate
        batch_tuning.tune_batch_size(
            run, build_model, data["train"].map(flatten), loss=LOSS, optimizer="sgd"
        )

    # Input pipelines: `flatten` runs once per example and is cached; the training
    # pipeline then shuffles every epoch, batches to the global batch and prefetches.
    # Given the strategy, each replica (and each worker) gets its share of a batch.
    train = tfaccel.data.pipeline(
        data["train"],
        batch_size=args.batch_size,
        training=True,
        preprocess=flatten,
        seed=args.seed,
        strategy=run.strategy,
    )
    test = tfaccel.data.pipeline(
        data["test"],
        batch_size=args.batch_size,
        training=False,
        preprocess=flatten,
        strategy=run.strategy,
    )
    print(f"Data plan:\n{tfaccel.data.explain(train)}")

    # The Trainer builds the model and the optimizer in the strategy's scope.
    trainer = tfaccel.Trainer(
        build_model,
        optimizer=lambda: keras.optimizers.SGD(args.learning_rate),
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
