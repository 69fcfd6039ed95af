"""What every recipe shares: the core command line, set-up, data with an offline fallback, outputs.

A recipe builds its parser with `parser(...)`, calls `setup(args, name)` before any
TensorFlow work (devices, strategy, dtype policy, seed, the output folder), loads its
data (`load_tfds` falls back to scikit-learn's digits when a TFDS dataset is neither
on disk nor downloadable), trains, and ends with `finish(...)`, which writes under
`--out`: `history.csv` and TensorBoard logs (through `callbacks(run)`),
`metrics.json`, `curves.png` and the trained model, `model.keras`.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfaccel
from tfaccel import strict_json

PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
STRATEGIES = ("auto", "default", "mirrored")
FALLBACK_NAME = "digits (offline fallback)"
SMOKE_TRAIN, SMOKE_TEST, SMOKE_BATCH = 32, 16, 16


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """`--help` keeps the description's line breaks and shows every option's default.

    An option whose default is None says "(default: none)" unless its help already
    explains its default in words; a switch says "(default: off)".
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or action.default is argparse.SUPPRESS:
            return text
        if "%(default)" in text or (action.default is None and "default" in text):
            return text
        if action.default is None:
            shown = "none"
        elif action.default is False and action.nargs == 0:
            shown = "off"
        else:
            shown = "%(default)s"
        return f"{text} (default: {shown})".lstrip()


class DatasetUnavailableError(RuntimeError):
    """A dataset the recipe needs is neither on disk nor downloadable (and no fallback)."""


def parser(
    description: str,
    *,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    fallback: bool = True,
    doctor: bool = False,
) -> argparse.ArgumentParser:
    """The command line every recipe shares; add recipe-specific flags to the result.

    Args:
        description: the recipe's docstring (shown by `--help`).
        epochs, batch_size, learning_rate: the recipe's defaults.
        fallback: whether the recipe has an offline fallback (`--no-fallback`).
        doctor: whether the recipe takes `--doctor` (it calls `doctor(...)` in place of
            training; `tfaccel doctor RECIPE.py` runs it so).
    """
    p = argparse.ArgumentParser(description=description, formatter_class=HelpFormatter)
    p.add_argument("--epochs", type=int, default=epochs, help="passes over the training data")
    p.add_argument(
        "--batch-size", type=int, default=batch_size, help="global batch, summed over replicas"
    )
    p.add_argument("--learning-rate", type=float, default=learning_rate, help="peak learning rate")
    p.add_argument(
        "--precision",
        default="auto",
        choices=PRECISIONS,
        help="dtype policy; auto: the fastest this hardware offers, timed on the model's step",
    )
    p.add_argument(
        "--strategy", default="auto", choices=STRATEGIES, help="tf.distribute strategy to use"
    )
    p.add_argument("--data-dir", default=None, help="where the data is (default: TFDS's data_dir)")
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        help="save checkpoints here; run again to resume (default: none, no checkpoints)",
    )
    p.add_argument("--out", default=None, help="outputs folder (default: runs/<recipe>/)")
    p.add_argument(
        "--tune-batch-size",
        action="store_true",
        help="probe batch sizes first, then train at the best one with a scaled learning rate",
    )
    if doctor:
        p.add_argument(
            "--doctor",
            action="store_true",
            help="diagnose what limits training (tfaccel.doctor.diagnose, a bounded number of "
            "steps) and print the report instead of training",
        )
        p.add_argument(
            "--doctor-budget",
            type=float,
            default=None,
            metavar="S",
            help="seconds the diagnosis aims to stay under, tracing excepted (default: 60 s "
            "or 5%% of an epoch, whichever is larger; 5 s with --smoke)",
        )
    p.add_argument("--smoke", action="store_true", help="a few steps on a few examples (for tests)")
    p.add_argument("--seed", type=int, default=0, help="random seed (weights, shuffling)")
    p.add_argument("--verbose", type=int, default=2, help="0 silent, 1 progress bar, 2 per epoch")
    if fallback:
        p.add_argument(
            "--no-fallback",
            action="store_true",
            help="fail instead of training on the bundled digits when the dataset is missing",
        )
    return p


def default_is(p: argparse.ArgumentParser, flag: str, text: str) -> None:
    """Says in `flag`'s help what its default means in this recipe (e.g. a computed path)."""
    (action,) = [a for a in p._actions if flag in a.option_strings]
    base = (action.help or "").split(" (default:")[0]
    action.help = f"{base} (default: {text})"


@dataclasses.dataclass
class Run:
    """One recipe run: its arguments and what `setup` resolved."""

    name: str
    args: argparse.Namespace
    strategy: tf.distribute.Strategy
    policy: keras.DTypePolicy
    out: pathlib.Path
    dataset: str = ""

    @property
    def replicas(self) -> int:
        return int(self.strategy.num_replicas_in_sync)

    @property
    def is_chief(self) -> bool:
        """Whether this task writes the run's outputs (always true outside multi-worker)."""
        config = tfaccel.devices.read_tf_config()
        if not config or "task" not in config:
            return True
        task = config["task"]
        return task.get("type") == "chief" or (
            task.get("type") == "worker"
            and task.get("index") == 0
            and "chief" not in config.get("cluster", {})
        )


def setup(args: argparse.Namespace, name: str) -> Run:
    """Devices, strategy, dtype policy, seed and output folder, in that order.

    Raises:
        ValueError: a non-positive --epochs / --batch-size / --learning-rate /
            --doctor-budget, a
            --batch-size that does not divide evenly over the replicas, or an --out
            that is a file.
    """
    if args.epochs < 0:
        raise ValueError(f"--epochs must be >= 0, got {args.epochs}.")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1 (the global batch), got {args.batch_size}.")
    if not args.learning_rate > 0:
        raise ValueError(f"--learning-rate must be > 0, got {args.learning_rate}.")
    budget = getattr(args, "doctor_budget", None)
    if budget is not None and not budget > 0:
        raise ValueError(f"--doctor-budget must be a number of seconds > 0, got {budget}.")
    if args.smoke:
        args.epochs = min(args.epochs, 1)
        args.batch_size = min(args.batch_size, SMOKE_BATCH)
    tfaccel.devices.configure()
    strategy = tfaccel.devices.strategy(args.strategy)
    replicas = int(strategy.num_replicas_in_sync)
    if args.batch_size % replicas:
        multiple = args.batch_size + replicas - args.batch_size % replicas
        raise ValueError(
            f"--batch-size {args.batch_size} is the global batch and must divide evenly over "
            f"the {replicas} replicas of the {type(strategy).__name__}; pass a multiple of "
            f"{replicas}, e.g. --batch-size {multiple}."
        )
    # "auto" is timed on the model's own step by the Trainer (`trainer_precision`).
    policy = tfaccel.precision.apply("float32" if args.precision == "auto" else args.precision)
    keras.utils.set_random_seed(args.seed)
    out = pathlib.Path(args.out or f"runs/{name}")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; pass a folder for the outputs.")
    out.mkdir(parents=True, exist_ok=True)
    shown = "auto (timed at the first fit)" if args.precision == "auto" else policy.name
    print(f"{name}: {replicas} replica(s), {shown} policy, outputs in {out}")
    return Run(name=name, args=args, strategy=strategy, policy=policy, out=out)


def trainer_precision(run: Run) -> str | None:
    """`Trainer(precision=...)`: "auto" times the model's own step; a given policy is
    global already (`setup`)."""
    return "auto" if run.args.precision == "auto" else None


# -- data ------------------------------------------------------------------------------------


def load_tfds(
    run: Run, name: str, splits: Sequence[str], image_shape: tuple[int, int, int]
) -> dict[str, tf.data.Dataset]:
    """Loads TFDS `splits` (smaller with --smoke), or the digits fallback when offline.

    Args:
        run: the run (uses --data-dir, --smoke, --seed, --no-fallback).
        name: the TFDS dataset, e.g. "fashion_mnist".
        splits: split names, e.g. ("train", "test").
        image_shape: the dataset's (height, width, channels), for the fallback.

    Returns:
        `{split: unbatched (uint8 image, int64 label) dataset}`; sets `run.dataset`.

    Raises:
        DatasetUnavailableError: the dataset cannot be loaded and --no-fallback is set.
    """
    args = run.args
    sizes = {s: SMOKE_TRAIN if s.startswith("train") else SMOKE_TEST for s in splits}
    try:
        data = {
            s: tfaccel.data.from_tfds(
                name, f"{s}[:{sizes[s]}]" if args.smoke else s, data_dir=args.data_dir
            )
            for s in splits
        }
    except Exception as error:  # TFDS raises many kinds: not found, network, checksum...
        where = args.data_dir or "TFDS's default data directory"
        reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        if getattr(args, "no_fallback", False):
            raise DatasetUnavailableError(
                f"TFDS dataset {name!r} is not in {where} and could not be downloaded "
                f"({reason}). Download it where there is network (tfds.load({name!r}, "
                f"data_dir=...)) and pass that folder as --data-dir, or drop --no-fallback to "
                "train on scikit-learn's bundled digits instead."
            ) from error
        print(
            f"TFDS dataset {name!r} is not in {where} and could not be downloaded ({reason}); "
            f"training on scikit-learn's digits resized to {image_shape} instead "
            "(offline fallback)."
        )
        run.dataset = FALLBACK_NAME
        return digits_fallback(splits, image_shape, seed=args.seed, smoke=args.smoke)
    run.dataset = name
    return data


def digits_fallback(
    splits: Sequence[str], image_shape: tuple[int, int, int], *, seed: int, smoke: bool = False
) -> dict[str, tf.data.Dataset]:
    """scikit-learn's 1,797 digits as uint8 images of `image_shape`, split 80 / 20.

    Splits whose names start with "train" get the 80 %, the others the 20 %.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images[..., None] * (255.0 / 16.0)).astype("float32")
    height, width, channels = image_shape
    images = tf.image.resize(images, (height, width)).numpy()
    images = np.repeat(images, channels, axis=-1) if channels != 1 else images
    images = np.clip(np.round(images), 0, 255).astype("uint8")
    labels = digits.target.astype("int64")
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=0.2, random_state=seed, stratify=labels
    )
    result = {}
    for split in splits:
        x, y = (x_train, y_train) if split.startswith("train") else (x_test, y_test)
        if smoke:
            n = SMOKE_TRAIN if split.startswith("train") else SMOKE_TEST
            x, y = x[:n], y[:n]
        result[split] = tfaccel.data.from_arrays(x, y)
    return result


# -- training --------------------------------------------------------------------------------


def callbacks(run: Run, *extra: keras.callbacks.Callback) -> tuple[list, Any]:
    """Throughput, BN statistics sync, `extra`, then history.csv and TensorBoard (chief only).

    With several replicas, `SyncMovingStatistics` keeps BatchNormalization's moving
    statistics equal on all of them (Keras 3 lets them drift apart), so every worker
    evaluates, and ends, with the same weights.

    Returns:
        `(callbacks, throughput)`: the ordered list for fit and the Throughput callback.
    """
    throughput = tfaccel.callbacks.Throughput(
        warmup_steps=0 if run.args.smoke else 5, window=50, verbose=run.args.verbose
    )
    chosen = [throughput, tfaccel.callbacks.SyncMovingStatistics(), *extra]
    if run.is_chief:
        chosen += [
            # A resumed run (same --checkpoint-dir) adds its epochs to the same file.
            keras.callbacks.CSVLogger(
                str(run.out / "history.csv"),
                append=bool(run.args.checkpoint_dir) and (run.out / "history.csv").exists(),
            ),
            keras.callbacks.TensorBoard(
                log_dir=str(run.out / "logs"), write_graph=False, update_freq="epoch"
            ),
        ]
    return tfaccel.callbacks.ordered(chosen), throughput


def tune_batch_size(
    run: Run,
    build_model: Callable[[], keras.Model],
    unbatched: tf.data.Dataset,
    *,
    loss: Any,
    optimizer: str,
) -> None:
    """--tune-batch-size: probe, print the table, save the plot, scale the learning rate.

    Sets `run.args.batch_size` to the probe's best batch (a multiple of the replicas)
    and scales `run.args.learning_rate` with it by the optimizer's rule (`tuning.rule_for`).

    Raises:
        RuntimeError: this tfaccel has no `tfaccel.tuning` (batch-size tuning).
    """
    tuning = getattr(tfaccel, "tuning", None)
    if tuning is None:
        raise RuntimeError(
            "--tune-batch-size needs tfaccel.tuning.find_batch_size, which this tfaccel does "
            "not have; upgrade tfaccel or drop --tune-batch-size."
        )
    args = run.args
    examples = int(unbatched.cardinality())
    if examples > 0 and not args.smoke:  # the data alone may decide: then nothing is probed
        choice = tuning.before_probing(
            batch_size=args.batch_size,
            learning_rate=args.learning_rate,
            optimizer=optimizer,
            examples=examples,
            replicas=run.replicas,
        )
        if choice is not None:
            _apply_choice(args, choice, optimizer)
            return
    # The job's size bounds the probe (smoke runs are bounded by `limit` instead).
    job = args.epochs * examples if examples > 0 and args.epochs > 0 and not args.smoke else None
    if job:
        print(
            f"--tune-batch-size: probing for at most {tuning.budget.PROBE_SHARE:.0%} of a job of "
            f"{job:,} examples ({args.epochs} epochs x {examples:,}), once the first batch "
            "is timed (half for the candidates, half for the gradient noise scale); batches "
            "keep at least 20 steps an epoch"
        )
    report = tuning.find_batch_size(
        build_model,
        unbatched,
        loss=loss,
        optimizer=optimizer,
        strategy=run.strategy,
        # Only a batch above yours can be chosen: the candidates start at it.
        start=max(8 if args.smoke else args.batch_size, run.replicas),
        limit=16 if args.smoke else None,
        steps=1 if args.smoke else 5,
        job_examples=job,
    )
    # The probe's models drew from the random generators: training starts from the seed
    # as it would without tuning (the same batch then trains the same weights).
    keras.utils.set_random_seed(args.seed)
    print(report.table())
    report.plot(str(run.out / "batch_size.png"))
    choice = tuning.recommend(
        report,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        optimizer=optimizer,
        replicas=run.replicas,
    )
    _apply_choice(args, choice, optimizer)


def _apply_choice(args, choice, optimizer: str) -> None:
    """Prints the choice and sets `args.batch_size` and `args.learning_rate` to it."""
    if choice.kept:
        print(
            f"--tune-batch-size: {choice.reason}; training at batch {args.batch_size} and "
            f"learning rate {args.learning_rate:.4g}, as given"
        )
        return
    print(
        f"--tune-batch-size: training with batch {choice.batch_size} (was {args.batch_size}) "
        f"and learning rate {choice.learning_rate:.4g} (was {args.learning_rate:.4g}, "
        f"{choice.rule} rule for {optimizer}): {choice.reason}"
    )
    args.batch_size, args.learning_rate = choice.batch_size, choice.learning_rate


def doctor(run: Run, trainer: tfaccel.Trainer, train) -> dict:
    """--doctor: diagnose the job instead of training it; print the report, save its files.

    Runs `tfaccel.doctor.diagnose(trainer, train)` (bounded by `--doctor-budget`; the
    weights and optimizer state are restored after), prints the report and writes
    `doctor.json` and `doctor.png` under `--out` (chief only).

    Returns:
        The report as a dict (`Report.to_dict()`).
    """
    args = run.args
    budget = args.doctor_budget  # checked by setup
    if budget is None and args.smoke:
        budget = 5.0
    print(f"--doctor: diagnosing {run.name} (no training; the weights are restored after)")
    report = tfaccel.doctor.diagnose(trainer, train, budget_s=budget, rounds=1 if args.smoke else 3)
    print(report)
    result = report.to_dict()
    if run.is_chief:
        report.plot(str(run.out / "doctor.png"))
        (run.out / "doctor.json").write_text(strict_json.dumps(result, indent=2, default=str))
        print(f"--doctor: report in {run.out / 'doctor.json'}, plot in {run.out / 'doctor.png'}")
    return result


def train_classifier(
    run: Run,
    data: dict[str, tf.data.Dataset],
    *,
    build_model: Callable[[], keras.Model],
    optimizer: Callable[[float, int], keras.optimizers.Optimizer],
    preprocess: Callable,
    augment: Callable | None = None,
    batch_map: Callable | None = None,
    extra: dict | None = None,
) -> tuple[dict, tfaccel.Trainer]:
    """The image-classification job: pipelines, optional batch tuning, Trainer, outputs.

    Trains on `data["train"]`, validates on `data["test"]` each epoch (as the Dive
    into Deep Learning chapters do) and reports the last validation as the test result.

    Args:
        run: the run from `setup`.
        data: unbatched `(image, label)` datasets for "train" and "test".
        build_model: builds the Keras model (called in the strategy scope).
        optimizer: `fn(learning_rate, steps_per_epoch) -> optimizer`.
        preprocess: per-example deterministic work (cached).
        augment: per-example random work for training.
        batch_map: per-batch work after batching (e.g. resizing, not cached).
        extra: more to record in metrics.json.

    Returns:
        `(summary, trainer)`: what metrics.json holds and the trained Trainer; with
        `--doctor` (a parser built with `doctor=True`), the doctor's report as a dict and
        the untrained Trainer.
    """
    args = run.args
    if args.tune_batch_size:
        sample = data["train"].map(preprocess)
        tune_batch_size(
            run,
            build_model,
            sample.map(batch_map) if batch_map else sample,
            loss="sparse_categorical_crossentropy",
            optimizer="sgd",
        )
    steps_per_epoch = max(1, int(data["train"].cardinality()) // args.batch_size)
    train = tfaccel.data.pipeline(
        data["train"],
        batch_size=args.batch_size,
        training=True,
        preprocess=preprocess,
        augment=augment,
        batch_map=batch_map,
        seed=args.seed,
        strategy=run.strategy,
    )
    test = tfaccel.data.pipeline(
        data["test"],
        batch_size=args.batch_size,
        training=False,
        preprocess=preprocess,
        batch_map=batch_map,
        strategy=run.strategy,
    )
    print(f"Data plan:\n{tfaccel.data.explain(train)}")
    trainer = tfaccel.Trainer(
        build_model,
        optimizer=lambda: optimizer(args.learning_rate, steps_per_epoch),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        strategy=run.strategy,
        precision=trainer_precision(run),
    )
    if getattr(args, "doctor", False):
        return doctor(run, trainer, train), trainer
    chosen, throughput = callbacks(run)
    history = trainer.fit(
        train,
        epochs=args.epochs,
        validation_data=test,
        callbacks=chosen,
        checkpoint_dir=args.checkpoint_dir,
        verbose=args.verbose,
    ).history
    if history.get("val_loss"):
        final = {"test_loss": history["val_loss"][-1], "test_accuracy": history["val_accuracy"][-1]}
    else:  # nothing left to train (a finished checkpoint): evaluate what was restored
        results = trainer.evaluate(test)
        final = {"test_loss": results["loss"], "test_accuracy": results["accuracy"]}
    summary = finish(
        run,
        history,
        metric="accuracy",
        final=final,
        examples_per_sec=examples_per_second(throughput),
        settings=trainer.settings,
        extra=extra,
        trainer=trainer,
    )
    return summary, trainer


# -- outputs ---------------------------------------------------------------------------------


def examples_per_second(throughput) -> float:
    """Median examples/s after warm-up, else the overall rate (NaN when unknown)."""
    stats = throughput.summary.get("examples_per_second") or {}
    for key in ("median", "overall"):
        value = stats.get(key)
        if value is not None and math.isfinite(value):
            return float(value)
    return float("nan")


def finish(
    run: Run,
    history: dict[str, list[float]] | dict[str, dict[str, list[float]]],
    *,
    metric: str,
    final: dict[str, float],
    examples_per_sec: float,
    settings: dict | None = None,
    extra: dict | None = None,
    trainer: tfaccel.Trainer | None = None,
) -> dict:
    """Prints the final metrics; writes metrics.json, curves.png and model.keras (chief only).

    Args:
        run: the run.
        history: `History.history`, or `{label: History.history}` for several runs
            (one line each in curves.png).
        metric: the main metric's name in the history (e.g. "accuracy").
        final: the final metrics (e.g. test loss and accuracy).
        examples_per_sec: training throughput.
        settings: the Trainer's resolved settings.
        extra: anything else to record.
        trainer: the trained Trainer, whose model is saved as `model.keras` (every
            worker calls `trainer.save`; only the chief writes the file).

    Returns:
        What metrics.json holds.
    """
    summary = {
        "recipe": run.name,
        "dataset": run.dataset,
        "final": {k: float(v) for k, v in final.items()},
        "examples_per_second": float(examples_per_sec),
        "epochs": run.args.epochs,
        "settings": {
            **{
                k: (v if isinstance(v, (int, float, bool)) else str(v))
                for k, v in (settings or {}).items()
            },
            "batch_size": run.args.batch_size,
            "learning_rate": run.args.learning_rate,
            "precision": trainer.model.dtype_policy.name if trainer else run.policy.name,
            "seed": run.args.seed,
            "smoke": run.args.smoke,
        },
        **(extra or {}),
    }
    if trainer is not None:
        summary["model"] = saved_model(run, trainer)
    print("Final: " + ", ".join(f"{k} {v:.4f}" for k, v in summary["final"].items()))
    print(f"Training throughput: {examples_per_sec:.1f} examples/s  (outputs in {run.out})")
    if run.is_chief:
        (run.out / "metrics.json").write_text(strict_json.dumps(summary, indent=2, default=str))
        several = bool(history) and isinstance(next(iter(history.values())), dict)
        plot_curves(
            history if several else read_history(run.out / "history.csv") or history,
            metric,
            run.out / "curves.png",
            title=f"{run.name} on {run.dataset}",
        )
    return summary


def saved_model(run: Run, trainer: tfaccel.Trainer) -> dict:
    """Saves the trained model as `<out>/model.keras`; returns what metrics.json says of it.

    The model takes its inputs as the recipe's preprocessing leaves them (its input
    shape and dtype are recorded); `keras.saving.load_model` after `import tfaccel`
    loads it.
    """
    path = trainer.save(run.out / "model.keras")  # every worker; the chief writes it
    if run.is_chief:
        print(f"Saved the trained model to {path}")
    inputs = [
        {"shape": list(tensor.shape), "dtype": str(tensor.dtype)}
        for tensor in getattr(trainer.model, "inputs", None) or []
    ]
    return {"file": "model.keras", "inputs": inputs}


def read_history(path: pathlib.Path) -> dict[str, list[float]] | None:
    """history.csv as `{column: values}` (every epoch, resumed runs included), or None."""
    if not path.exists():
        return None
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows or "loss" not in rows[0]:
        return None
    return {key: [_number(row[key]) for row in rows] for key in rows[0]}


def _number(text: str | None) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):  # CSVLogger writes "NA" for a value an epoch lacks
        return float("nan")


def plot_curves(history, metric: str, path: pathlib.Path, *, title: str = "") -> None:
    """Loss and `metric` per epoch, train (solid) and validation (dashed), in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = history if history and isinstance(next(iter(history.values())), dict) else {"": history}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key in zip(axes, ("loss", metric), strict=True):
        for label, logs in runs.items():
            for prefix, style in (("", "-"), ("val_", "--")):
                values = logs.get(prefix + key)
                if values:
                    epochs = range(1, len(values) + 1)
                    name = f"{label} {'validation' if prefix else 'train'}".strip()
                    ax.plot(epochs, values, style, marker="o", label=name)
        ax.set_xlabel("epoch")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main_guard(main: Callable[[list[str] | None], Any]) -> None:
    """Runs `main()` from the command line; a known bad input prints one line, exit 2."""
    try:
        main(None)
    except (
        ValueError,
        FileNotFoundError,
        NotADirectoryError,
        PermissionError,
        DatasetUnavailableError,
    ) as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
