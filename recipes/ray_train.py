"""The digits ResNet job on Ray Train: N workers, tfaccel's Trainer, tfaccel's checkpoints.

Ray's `TensorflowTrainer` starts N worker processes and gives each a `TF_CONFIG`, so
`tfaccel.devices.strategy("auto")` picks `MultiWorkerMirroredStrategy` and TensorFlow does
the communication. Each worker builds the `tfaccel.data` pipeline and the `tfaccel.Trainer`,
checkpoints with tfaccel to a directory every worker can reach, and reports each epoch's
metrics to Ray (`ray.train.report`). With `--max-failures 1`, a worker that dies is
restarted by Ray and the job resumes from the last tfaccel checkpoint.

Run (a local Ray cluster with 2 CPUs, or `--address auto` to join a running one):

    python recipes/ray_train.py --workers 2 --epochs 10 --checkpoint-dir /shared/ckpt
    python recipes/ray_train.py --smoke          # seconds of training, for CI

Needs the `cluster` extra: `pip install 'tfaccel[cluster]'` (Ray Train).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import sys
import tempfile

import keras

from tfaccel import strict_json

DIGITS_SHAPE = (8, 8, 1)


def load(seed: int, limit: int | None = None):
    """scikit-learn's bundled digits (works offline): ((x_train, y_train), (x_test, y_test))."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    y = digits.target.astype("int32")
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, random_state=seed, stratify=y
    )
    if limit:
        x_train, y_train, x_test, y_test = x_train[:limit], y_train[:limit], x_test, y_test
    return (x_train, y_train), (x_test, y_test)


def build_model(num_classes: int = 10):
    """A stem convolution, two tfaccel residual blocks, global pooling, a float32 head."""
    import tfaccel

    inputs = keras.Input(DIGITS_SHAPE)
    x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.BatchNormalization(momentum=0.9)(x)
    x = keras.layers.ReLU()(x)
    x = tfaccel.ResidualBlock(16)(x)
    x = tfaccel.ResidualBlock(32, strides=2)(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="digits_resnet")


def train_worker(config: dict) -> None:
    """The per-worker function Ray runs in every worker process."""
    import ray.train
    import tensorflow as tf

    import tfaccel

    tfaccel.devices.configure()
    if config["deterministic"]:
        tf.config.experimental.enable_op_determinism()
    strategy = tfaccel.devices.strategy("auto")  # MWMS from Ray's TF_CONFIG
    rank = ray.train.get_context().get_world_rank()
    callbacks: list[keras.callbacks.Callback] = [ReportToRay()]
    if config["crash_at_step"] and rank == config["crash_rank"]:
        marker = pathlib.Path(config["checkpoint_dir"]) / f".crashed-rank{rank}"
        callbacks.append(CrashOnce(config["crash_at_step"], marker))
    train(config, strategy, rank, callbacks)


def train(config: dict, strategy, rank: int = 0, callbacks=()) -> None:
    """One worker's training under `strategy` (Ray's workers: MWMS): fits, evaluates,
    saves model.keras and this worker's weights (and the chief's summary) to `out`.

    Without Ray (e.g. a `MirroredStrategy` in one process, 1 worker feeding as many
    replicas) it trains on the same global batches: the pipeline reads one global order.
    """
    import numpy as np

    import tfaccel

    keras.utils.set_random_seed(config["seed"])
    (x_train, y_train), (x_test, y_test) = load(config["seed"], config["limit"])
    data = tfaccel.data
    train_data = data.pipeline(
        data.from_arrays(x_train, y_train),
        batch_size=config["batch_size"],
        training=True,
        seed=config["seed"],
        strategy=strategy,
    )
    test = data.pipeline(
        data.from_arrays(x_test, y_test), batch_size=256, training=False, strategy=strategy
    )
    trainer = tfaccel.Trainer(
        build_model,
        optimizer=lambda: keras.optimizers.SGD(config["learning_rate"], momentum=0.9),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        strategy=strategy,
        accumulate_steps=config["accumulate_steps"],
        steps_per_loop=config["steps_per_loop"],
    )
    trainer.fit(
        train_data,
        epochs=config["epochs"],
        checkpoint_dir=config["checkpoint_dir"],
        checkpoint_every=config["checkpoint_every"],
        callbacks=list(callbacks),
        verbose=0,
    )
    results = trainer.evaluate(test)
    out = pathlib.Path(config["out"])
    out.mkdir(parents=True, exist_ok=True)
    trainer.save(out / "model.keras")  # every worker calls it; the chief (rank 0) writes it
    # BatchNormalization's moving statistics are per worker under MWMS (Keras creates them
    # with aggregation "none"); the trainable weights are the same on every worker.
    np.savez(
        out / f"weights.worker{rank}.npz",
        *[v.numpy() for v in trainer.model.trainable_variables],
    )
    np.savez(
        out / f"statistics.worker{rank}.npz",
        *[v.numpy() for v in trainer.model.non_trainable_variables],
    )
    if rank == 0:
        summary = {
            **{k: str(v) for k, v in trainer.settings.items()},
            "step": int(trainer.step.numpy()),
            "test_loss": results["loss"],
            "test_accuracy": results["accuracy"],
        }
        (out / "summary.json").write_text(strict_json.dumps(summary, indent=2))


class ReportToRay(keras.callbacks.Callback):
    """Reports each epoch's logs to Ray Train (every worker calls it; Ray keeps rank 0's)."""

    def on_epoch_end(self, epoch, logs=None):
        import ray.train

        metrics = {k: float(v) for k, v in (logs or {}).items()}
        ray.train.report({"epoch": epoch + 1, **metrics})


class CrashOnce(keras.callbacks.Callback):
    """Fault injection: SIGKILLs this worker once its global step reaches `step`."""

    def __init__(self, step: int, marker: pathlib.Path):
        super().__init__()
        self.step, self.marker = step, marker

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) >= self.step and not self.marker.exists():
            self.marker.write_text(str(self.step))
            os.kill(os.getpid(), signal.SIGKILL)


def parse(argv=None) -> argparse.Namespace:
    from common import HelpFormatter  # recipes/common.py: every option's default in --help

    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=10, help="passes over the data")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    parser.add_argument("--learning-rate", type=float, default=0.05, help="SGD's rate")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--workers", type=int, default=2, help="Ray Train workers")
    parser.add_argument("--cpus-per-worker", type=float, default=1, help="Ray CPUs each")
    parser.add_argument("--gpus-per-worker", type=float, default=0, help="Ray GPUs each")
    parser.add_argument("--accumulate-steps", type=int, default=1, help="see Trainer")
    parser.add_argument("--steps-per-loop", default="auto", help="see Trainer")
    parser.add_argument("--checkpoint-dir", help="shared by all workers (default: <out>/ckpt)")
    parser.add_argument("--checkpoint-every", default="epoch", help='"epoch" or N steps')
    parser.add_argument(
        "--out", default="runs/ray_train", help="weights, model.keras and summary.json"
    )
    parser.add_argument("--max-failures", type=int, default=1, help="restarts Ray may do")
    parser.add_argument("--address", help="join a running Ray cluster (e.g. auto)")
    parser.add_argument("--smoke", action="store_true", help="2 epochs on 256 examples")
    parser.add_argument("--deterministic", action="store_true", help="TF op determinism")
    parser.add_argument("--crash-at-step", type=int, help="fault injection: kill a worker once")
    parser.add_argument("--crash-rank", type=int, default=1, help="the worker to kill")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    return args


def job_config(args: argparse.Namespace) -> dict:
    """The configuration every worker's `train` gets, from `parse`'s arguments."""
    out = pathlib.Path(args.out).absolute()
    every = args.checkpoint_every
    return {
        "epochs": 2 if args.smoke else args.epochs,
        "limit": 256 if args.smoke else None,
        "batch_size": args.batch_size,
        "learning_rate": args.learning_rate,
        "seed": args.seed,
        "accumulate_steps": args.accumulate_steps,
        "steps_per_loop": int(args.steps_per_loop) if args.steps_per_loop != "auto" else "auto",
        "checkpoint_dir": str(pathlib.Path(args.checkpoint_dir or out / "ckpt").absolute()),
        "checkpoint_every": int(every) if every != "epoch" else every,
        "out": str(out),
        "deterministic": args.deterministic,
        "crash_at_step": args.crash_at_step,
        "crash_rank": args.crash_rank,
    }


def main(argv=None) -> dict:
    """Runs the job on Ray Train; returns the chief's summary (also in <out>/summary.json)."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    args = parse(argv)
    out = pathlib.Path(args.out).absolute()
    config = job_config(args)
    if __name__ != "__main__":  # imported (tests): ship this module's code to the workers
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    if not ray.is_initialized():
        if args.address:
            ray.init(address=args.address)
        else:
            cpus = max(int(args.workers * args.cpus_per_worker), os.cpu_count() or 1)
            ray.init(num_cpus=cpus, include_dashboard=False)
    storage = tempfile.mkdtemp(prefix="ray_train_") if not args.address else str(out / "ray")
    trainer = TensorflowTrainer(
        train_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(
            num_workers=args.workers,
            use_gpu=args.gpus_per_worker > 0,
            resources_per_worker={"CPU": args.cpus_per_worker, "GPU": args.gpus_per_worker},
        ),
        run_config=RunConfig(
            name="tfaccel_ray_train",
            storage_path=storage,
            failure_config=FailureConfig(max_failures=args.max_failures),
        ),
    )
    result = trainer.fit()
    if result.error:
        raise result.error
    summary = json.loads((out / "summary.json").read_text())
    print(f"Test accuracy: {summary['test_accuracy']:.4f}  (outputs in {out})")
    return summary


if __name__ == "__main__":
    main()
