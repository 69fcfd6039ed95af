"""Minibatch SGD: the same MLP on Fashion-MNIST at several batch sizes, learning rate scaled.

For every batch size b in `--batch-sizes` (default 16, 64, 256, 1024) the MLP 784-256-10
trains with SGD at `--learning-rate` × b / `--batch-size` (`--lr-scaling linear`; `sqrt`
uses the square root of the ratio, `none` keeps the rate). `loss_curves.png` shows the
training loss of each step loop against wall-clock seconds (tracing included) and
against examples seen, one line per batch size: small batches make progress per
example, large ones per second. Offline, scikit-learn's digits stand in. With
`--checkpoint-dir`, each batch size keeps its own checkpoints (`<dir>/batch_<b>`).

    python recipes/minibatch_sgd.py --epochs 2

Takes the core recipe flags (`--help`), e.g. `--tune-batch-size` to probe the batch size first.
"""

from __future__ import annotations

import csv
import time

import batch_tuning  # recipes/batch_tuning.py: --tune-batch-size
import common  # recipes/common.py: the shared command line and set-up
import keras
import mlp_fashion_mnist as mlp
import numpy as np
import outputs  # recipes/outputs.py: history.csv, metrics.json, curves.png, model.keras
import tfds_or_digits  # recipes/tfds_or_digits.py: TFDS, or the digits offline

import tfaccel

NAME = "minibatch_sgd"
POINTS_PER_EPOCH = 25


class LossRecorder(keras.callbacks.Callback):
    """After each step loop: seconds since training began, examples seen, that loop's loss."""

    def __init__(self, loss_tracker: keras.metrics.Mean, batch_size: int):
        super().__init__()
        self.tracker, self.batch_size = loss_tracker, batch_size
        self.points: list[tuple[float, int, float]] = []

    def on_train_begin(self, logs=None):
        self.start, self.examples, self.last = time.perf_counter(), 0, (0.0, 0.0)

    def on_epoch_begin(self, epoch, logs=None):
        self.last = (0.0, 0.0)  # the Trainer resets its loss mean each epoch

    def on_train_batch_end(self, batch, logs=None):
        total, count = float(self.tracker.total.numpy()), float(self.tracker.count.numpy())
        steps = int((logs or {}).get("steps", 1))
        if count > self.last[1]:
            loss = (total - self.last[0]) / (count - self.last[1])
            self.examples += steps * self.batch_size
            self.points.append((time.perf_counter() - self.start, self.examples, loss))
        self.last = (total, count)


def scaled_rate(base_rate: float, batch: int, base_batch: int, rule: str) -> float:
    ratio = batch / base_batch
    return base_rate * {"linear": ratio, "sqrt": ratio**0.5, "none": 1.0}[rule]


def plot_progress(points: dict[int, list], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_examples) = plt.subplots(1, 2, figsize=(11, 4))
    for batch, rows in points.items():
        seconds, examples, loss = zip(*rows, strict=True) if rows else ((), (), ())
        by_time.plot(seconds, loss, marker=".", label=f"batch {batch}")
        by_examples.plot(examples, loss, marker=".", label=f"batch {batch}")
    by_time.set_xlabel("wall-clock seconds")
    by_examples.set_xlabel("examples seen")
    for ax in (by_time, by_examples):
        ax.set_ylabel("training loss")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Minibatch SGD: the same MLP at several batch sizes")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> dict:
    p = common.parser(__doc__, epochs=2, batch_size=256, learning_rate=0.1)
    p.add_argument(
        "--batch-sizes",
        type=lambda s: [int(v) for v in s.split(",")],
        default=[16, 64, 256, 1024],
        help="comma-separated global batch sizes to compare",
    )
    p.add_argument(
        "--lr-scaling",
        choices=("linear", "sqrt", "none"),
        default="linear",
        help="how the rate follows the batch, relative to --batch-size / --learning-rate",
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.batch_sizes = [8, common.SMOKE_BATCH]
    run = common.setup(args, NAME)
    bad = [b for b in args.batch_sizes if b < 1 or b % run.replicas]
    if bad:
        raise ValueError(
            f"--batch-sizes {bad} must be positive multiples of the {run.replicas} replicas."
        )
    data = tfds_or_digits.load(run, "fashion_mnist", ("train", "test"), (28, 28, 1))
    if args.tune_batch_size:  # adds the probe's best batch to the comparison
        batch_tuning.tune_batch_size(
            run, mlp.build_model, data["train"].map(mlp.flatten), loss=mlp.LOSS, optimizer="sgd"
        )
        args.batch_sizes = sorted({*args.batch_sizes, args.batch_size})

    histories, points, results, trainers = {}, {}, {}, {}
    train_size = int(data["train"].cardinality())
    for batch in args.batch_sizes:
        rate = scaled_rate(args.learning_rate, batch, args.batch_size, args.lr_scaling)
        print(f"--- batch {batch}, learning rate {rate:.4g} ---")
        train, test = (
            tfaccel.data.pipeline(
                data[split],
                batch_size=batch,
                training=split == "train",
                preprocess=mlp.flatten,
                seed=args.seed,
                strategy=run.strategy,
            )
            for split in ("train", "test")
        )
        if batch == args.batch_sizes[0]:
            print(f"Data plan:\n{tfaccel.data.explain(train)}")
        keras.utils.set_random_seed(args.seed)  # the same initial weights for every batch
        trainer = tfaccel.Trainer(
            mlp.build_model,
            optimizer=lambda rate=rate: keras.optimizers.SGD(rate),
            loss=mlp.LOSS,
            metrics=["accuracy"],
            strategy=run.strategy,
            steps_per_loop=max(1, train_size // batch // POINTS_PER_EPOCH),
        )
        recorder = LossRecorder(trainer.loss_tracker, batch)
        throughput = tfaccel.callbacks.Throughput(warmup_steps=0 if args.smoke else 5, verbose=0)
        tensorboard = keras.callbacks.TensorBoard(
            log_dir=str(run.out / "logs" / f"batch_{batch}"), write_graph=False
        )
        sync = tfaccel.callbacks.SyncMovingStatistics()
        callbacks = [throughput, recorder, sync] + ([tensorboard] if run.is_chief else [])
        history = trainer.fit(
            train,
            epochs=args.epochs,
            validation_data=test,
            callbacks=tfaccel.callbacks.ordered(callbacks),
            checkpoint_dir=(
                f"{args.checkpoint_dir}/batch_{batch}" if args.checkpoint_dir else None
            ),
            verbose=args.verbose,
        ).history
        histories[f"batch {batch}"], points[batch] = history, recorder.points
        trainers[batch] = trainer
        results[batch] = {
            "learning_rate": rate,
            "test_loss": history["val_loss"][-1],
            "test_accuracy": history["val_accuracy"][-1],
            "examples_per_second": outputs.examples_per_second(throughput),
            "seconds": recorder.points[-1][0] if recorder.points else float("nan"),
        }
        print(
            f"batch {batch}: test accuracy {results[batch]['test_accuracy']:.4f}, "
            f"{results[batch]['examples_per_second']:.0f} examples/s"
        )

    if run.is_chief:
        keys = ["batch_size", "epoch", *histories[f"batch {args.batch_sizes[0]}"]]
        with open(run.out / "history.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(keys)
            for batch in args.batch_sizes:
                history = histories[f"batch {batch}"]
                for epoch in range(len(history["loss"])):
                    writer.writerow([batch, epoch] + [history[k][epoch] for k in keys[2:]])
        plot_progress(points, run.out / "loss_curves.png")
    best = max(results, key=lambda b: results[b]["test_accuracy"])
    return outputs.finish(
        run,
        histories,
        metric="accuracy",
        final={
            "best_test_accuracy": results[best]["test_accuracy"],
            "best_batch_size": best,
        },
        examples_per_sec=float(np.nanmax([r["examples_per_second"] for r in results.values()])),
        extra={"lr_scaling": args.lr_scaling, "by_batch_size": results},
        trainer=trainers[best],  # model.keras: the best batch size's model
    )


if __name__ == "__main__":
    common.main_guard(main)
