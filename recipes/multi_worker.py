"""The ResNet-18 CIFAR-10 job as a multi-worker program (MultiWorkerMirroredStrategy).

The same script runs as one process, as N local workers, or as one task of a cluster
job whose `TF_CONFIG` names this task:

    python recipes/multi_worker.py --epochs 30                      # one process
    tfaccel launch --workers 2 -- python recipes/multi_worker.py    # two local workers
    TF_CONFIG='{"cluster": {...}, "task": {...}}' python recipes/multi_worker.py

With a multi-worker `TF_CONFIG`, `--strategy auto` picks MultiWorkerMirroredStrategy:
every worker reads its own shard of the data, gradients are all-reduced, so all
workers hold the same weights. Only the chief (worker 0) writes history.csv,
TensorBoard logs, metrics.json, curves.png and checkpoints; `--export-weights` makes
every worker save its final weights as `weights.worker<i>.npz` to compare them.

Takes the core recipe flags (`--help`), e.g. `--tune-batch-size` to probe the batch size first,
or `--doctor` to diagnose what limits training instead (`tfaccel doctor RECIPE.py` in one
process; `tfaccel launch --workers 2 -- python recipes/multi_worker.py --doctor` on two).
"""

from __future__ import annotations

import pathlib

import batch_tuning  # recipes/batch_tuning.py: --tune-batch-size
import common  # recipes/common.py: the shared command line and set-up
import keras
import numpy as np
import outputs  # recipes/outputs.py: history.csv, metrics.json, curves.png, model.keras
import resnet_cifar10  # the model, preprocessing, augmentation and optimizer of the job
import tfds_or_digits  # recipes/tfds_or_digits.py: TFDS, or the digits offline

import tfaccel

NAME = "multi_worker"
LOSS = "sparse_categorical_crossentropy"


def task_index() -> int:
    """This worker's index in TF_CONFIG (0 when there is none)."""
    config = tfaccel.devices.read_tf_config() or {}
    return int(config.get("task", {}).get("index", 0))


def main(argv=None) -> dict:
    p = resnet_cifar10.parser()
    p.description = __doc__
    p.add_argument(
        "--export-weights",
        action="store_true",
        help="every worker saves its final weights as weights.worker<i>.npz under --out",
    )
    args = p.parse_args(argv)
    # With a multi-worker TF_CONFIG, setup's tfaccel.devices.strategy("auto") is a
    # MultiWorkerMirroredStrategy: every worker runs this same program.
    run = common.setup(args, NAME)
    config = tfaccel.devices.read_tf_config()
    workers = len((config or {}).get("cluster", {}).get("worker", [])) or 1
    data = tfds_or_digits.load(run, "cifar10", ("train", "test"), (32, 32, 3))

    def model() -> keras.Model:  # the Trainer calls it in the strategy's scope
        return resnet_cifar10.build_model(args.width)

    if args.tune_batch_size:  # every worker probes alike and gets the same batch size
        examples = data["train"].map(resnet_cifar10.normalize)
        batch_tuning.tune_batch_size(run, model, examples, loss=LOSS, optimizer="sgd")

    # Given a multi-worker strategy, the pipeline is a dataset function: each worker
    # reads its own shard of the examples and batches its share of the global batch.
    train = tfaccel.data.pipeline(
        data["train"],
        batch_size=args.batch_size,  # global: summed over all workers' replicas
        training=True,
        preprocess=resnet_cifar10.normalize,
        augment=resnet_cifar10.pad_crop_flip,
        seed=args.seed,
        strategy=run.strategy,
    )
    test = tfaccel.data.pipeline(
        data["test"],
        batch_size=args.batch_size,
        training=False,
        preprocess=resnet_cifar10.normalize,
        strategy=run.strategy,
    )
    print(f"Data plan:\n{tfaccel.data.explain(train)}")

    steps_per_epoch = max(1, int(data["train"].cardinality()) // args.batch_size)
    trainer = tfaccel.Trainer(
        model,
        optimizer=lambda: resnet_cifar10.sgd_warmup_cosine(
            args.learning_rate, args.epochs, steps_per_epoch
        ),
        loss=LOSS,
        metrics=["accuracy"],
        strategy=run.strategy,  # gradients are all-reduced over every worker's replicas
        precision=common.trainer_precision(run),
    )
    if args.doctor:  # diagnose (communication included) instead of training
        return common.doctor(run, trainer, train)

    # Every worker trains and checkpoints (the Trainer has the chief write); the callbacks
    # write history.csv and TensorBoard logs on the chief only.
    callbacks, throughput = outputs.callbacks(run)
    history = trainer.fit(
        train,
        epochs=args.epochs,
        validation_data=test,
        callbacks=callbacks,
        checkpoint_dir=args.checkpoint_dir,
        verbose=args.verbose,
    ).history
    if history.get("val_loss"):  # the test set validated every epoch: its last result
        final = {"test_loss": history["val_loss"][-1], "test_accuracy": history["val_accuracy"][-1]}
    else:  # nothing left to train (a finished checkpoint): evaluate what was restored
        results = trainer.evaluate(test)
        final = {"test_loss": results["loss"], "test_accuracy": results["accuracy"]}
    summary = outputs.finish(  # metrics.json and curves.png on the chief only
        run,
        history,
        metric="accuracy",
        final=final,
        examples_per_sec=outputs.examples_per_second(throughput),
        settings=trainer.settings,
        extra={"workers": workers, "task_index": task_index()},
        trainer=trainer,
    )
    if args.export_weights:
        path = pathlib.Path(args.out or f"runs/{NAME}") / f"weights.worker{task_index()}.npz"
        np.savez(path, *trainer.model.get_weights())
        print(f"Saved this worker's final weights to {path}")
    return summary


if __name__ == "__main__":
    common.main_guard(main)
