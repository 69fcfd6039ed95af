"""`--tune-batch-size`: probe the batch size before training, then train at the best one.

`tune_batch_size(run, build_model, examples, loss=..., optimizer=...)` runs
`tfaccel.tuning.find_batch_size` (or decides from the data alone, `tuning.before_probing`),
prints the table, saves `batch_size.png` under `--out`, and sets the run's batch size and
learning rate (scaled by the optimizer's rule) to the recommendation. With `--tune` it
runs `tfaccel.tuning.tune` instead: the same batch step, then a learning-rate range test
at that batch (its curve saved as `learning_rate.png`), and trains with both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import common  # recipes/common.py: the command line and the run
import keras
import tensorflow as tf

import tfaccel


def tune_batch_size(
    run: common.Run,
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
    if getattr(args, "tune", False):
        tune_batch_and_rate(run, build_model, unbatched, loss=loss, optimizer=optimizer)
        return
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
    job_examples = (
        args.epochs * examples if examples > 0 and args.epochs > 0 and not args.smoke else None
    )
    if job_examples:
        print(
            f"--tune-batch-size: probing for at most {tuning.batch.budget.PROBE_SHARE:.0%} of a "
            f"job of {job_examples:,} examples ({args.epochs} epochs x {examples:,}), once the "
            "first batch is timed (half for the candidates, half for the gradient noise scale); "
            "batches keep at least 20 steps an epoch"
        )
    report = tuning.find_batch_size(
        tuning.TuningJob(
            build_model,
            unbatched,
            loss=loss,
            optimizer=optimizer,
            strategy=run.strategy,
            job_examples=job_examples,
        ),
        search=tuning.BatchSearch(
            # Only a batch above yours can be chosen: the candidates start at it.
            start=max(8 if args.smoke else args.batch_size, run.replicas),
            limit=16 if args.smoke else None,
            steps=1 if args.smoke else 5,
        ),
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
    """Prints the choice and sets `args.batch_size`, `args.learning_rate` and
    `args.methods` to it (all as given when the batch is kept)."""
    if choice.kept:
        print(
            f"--tune-batch-size: {choice.reason}; training at batch {args.batch_size} and "
            f"learning rate {args.learning_rate:.4g}, as given"
        )
        return
    cycle = "".join(f", {m.name} peaking at {m.peak:.4g}" for m in choice.methods)
    print(
        f"--tune-batch-size: training with batch {choice.batch_size} (was {args.batch_size}) "
        f"and learning rate {choice.learning_rate:.4g} (was {args.learning_rate:.4g}, "
        f"{choice.rule} rule for {optimizer}){cycle}: {choice.reason}"
    )
    args.batch_size, args.learning_rate = choice.batch_size, choice.learning_rate
    _replace_methods(args, choice.methods, "--tune-batch-size")


def _replace_methods(args, methods, flag: str) -> None:
    """The tuner's methods replace the ones given (--one-cycle's peak was for the rate
    replaced), saying so."""
    if args.methods and list(methods) != args.methods:
        given = getattr(args, "one_cycle", None)
        given = f"--one-cycle {given:g}" if given else "the methods given"
        what = ", ".join(m.name for m in methods) or "none"
        print(f"{flag}: {given} was for the rate replaced; methods: {what}")
    args.methods = list(methods) or None


def tune_batch_and_rate(run: common.Run, build_model, unbatched, *, loss, optimizer) -> None:
    """--tune: `tfaccel.tuning.tune` (the batch, then the rate at it); trains with both."""
    args = run.args
    job = tfaccel.tuning.TuningJob(
        build_model, unbatched, loss=loss, optimizer=optimizer, strategy=run.strategy
    )
    tuned = tfaccel.tuning.tune(
        job,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        epochs=None if args.smoke else args.epochs,
        lr_steps=tfaccel.tuning.lr.rule.MIN_POINTS if args.smoke else 100,
        verbose=0,
    )
    keras.utils.set_random_seed(args.seed)  # training starts from the seed, as untuned
    if tuned.batch_report is not None:
        print(tuned.batch_report.table())
        tuned.batch_report.plot(str(run.out / "batch_size.png"))
    if tuned.rate_report is not None:
        tuned.rate_report.plot(run.out / "learning_rate.png")
    print(f"--tune: {tuned}".replace("\n", "\n--tune: "))
    if (tuned.batch_size, tuned.learning_rate) != (args.batch_size, args.learning_rate):
        args.batch_size, args.learning_rate = tuned.batch_size, tuned.learning_rate
        _replace_methods(args, tuned.methods, "--tune")
