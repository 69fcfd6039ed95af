"""What every recipe shares: the core command line and the run's set-up.

A recipe builds its parser with `parser(...)` and calls `setup(args, name)` before any
TensorFlow work (devices, strategy, dtype policy, seed, the output folder). Then it
does, in its own file, what the recipes are there to show: its input pipeline
(`tfaccel.data.pipeline`), its `tfaccel.Trainer`, `fit` and `evaluate`. `--doctor`
diagnoses the Trainer instead of training (`doctor(...)`); `main_guard(main)` turns a bad
input into one line and exit status 2.

Beside this file: `tfds_or_digits.py` (a TFDS dataset, or scikit-learn's digits
offline), `batch_tuning.py` (`--tune-batch-size`, `--tune`) and `outputs.py` (history.csv,
TensorBoard logs, metrics.json, curves.png, model.keras).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

import tfaccel
from tfaccel import strict_json

PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
STRATEGIES = ("auto", "default", "mirrored")
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
    methods: bool = False,
) -> argparse.ArgumentParser:
    """The command line every recipe shares; add recipe-specific flags to the result.

    Args:
        description: the recipe's docstring (shown by `--help`).
        epochs, batch_size, learning_rate: the recipe's defaults.
        fallback: whether the recipe has an offline fallback (`--no-fallback`).
        doctor: whether the recipe takes `--doctor` (it calls `doctor(...)` in place of
            training; `tfaccel doctor RECIPE.py` runs it so).
        methods: whether the recipe trains with `args.methods` (`--one-cycle`, and the
            tuners' one-cycle for a grown batch).
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
    p.add_argument(
        "--tune",
        action="store_true",
        help="tune the batch (as --tune-batch-size), then the learning rate at it with a range "
        "test (tfaccel.tuning.tune); print the arguments to pass and train with them",
    )
    if methods:
        p.add_argument(
            "--one-cycle",
            type=float,
            default=None,
            metavar="PEAK",
            help="train with one-cycle peaking at this rate (tfaccel.methods.OneCycle, sized "
            "to the job's steps), as --tune prints it for a grown batch (default: none)",
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
            --doctor-budget or --one-cycle, a
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
    if budget is not None and not 0 < budget < float("inf"):
        raise ValueError(f"--doctor-budget must be a number of seconds > 0, finite, got {budget}.")
    if getattr(args, "tune", False):  # the batch step is --tune-batch-size's, then the rate
        args.tune_batch_size = True
    cycle = getattr(args, "one_cycle", None)
    if cycle is not None and not 0 < cycle < float("inf"):
        raise ValueError(f"--one-cycle must be a peak learning rate > 0, got {cycle}.")
    # For Trainer(methods=): --one-cycle's, replaced by the tuners' when they grow the batch.
    args.methods = None if cycle is None else [tfaccel.methods.OneCycle(peak=cycle)]
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
