"""`tfaccel doctor train.py [args]`: a user's own script, diagnosed at its first `fit`.

The script runs unchanged in this process (`runpy`, with its own `sys.argv`) until it
calls `keras.Model.fit` or `tfaccel.Trainer.fit`: that call is intercepted, its model
(or Trainer) and training data go to `tfaccel.doctor.diagnose` for the budget, the
report is printed (and saved with `--out`), and the process exits — the script's code
after `fit` does not run and nothing is trained (the doctor restores the weights).

Run: `python -m tfaccel.doctor.script [--budget S] [--out DIR] SCRIPT.py [args]`
(what `tfaccel doctor SCRIPT.py` runs for a script without a `--doctor` option).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

NOT_REACHED = 3  # the script ended before any fit


class _Diagnosed(BaseException):
    """Raised through the script once its fit was diagnosed (not an `Exception`, so a
    script's `except Exception` does not swallow it)."""


class _Refused(BaseException):
    """Raised through the script when its fit cannot be diagnosed (the message says why)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tfaccel doctor")
    parser.add_argument("--budget", type=float, default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    script = os.path.abspath(args.script)
    _install(args.budget, args.out)
    sys.argv = [script, *args.script_args]
    sys.path.insert(0, os.path.dirname(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except _Diagnosed:
        return 0
    except _Refused as refused:
        print(f"tfaccel doctor: {refused}", file=sys.stderr)
        return 2
    except SystemExit as stop:
        print(
            f"tfaccel doctor: {args.script} exited (status {stop.code}) before calling "
            "model.fit or Trainer.fit: nothing to diagnose.",
            file=sys.stderr,
        )
        return NOT_REACHED
    print(
        f"tfaccel doctor: {args.script} ended without calling model.fit or Trainer.fit: "
        "nothing to diagnose (the doctor diagnoses the first fit a script calls).",
        file=sys.stderr,
    )
    return NOT_REACHED


def _install(budget_s: float | None, out: str | None) -> None:
    import keras

    from tfaccel.train.trainer import Trainer

    def model_fit(model, x=None, y=None, batch_size=None, *args, **kwargs):
        data = _training_data(x, y, batch_size or 32, "model.fit")
        _diagnose(model, data, budget_s, out, f"{type(model).__name__}.fit")

    def trainer_fit(trainer, x=None, y=None, *args, batch_size=None, **kwargs):
        data = x
        if y is not None or not _is_dataset_like(x):
            data = _training_data(x, y, batch_size or 32, "Trainer.fit")
        _diagnose(trainer, data, budget_s, out, "Trainer.fit")

    keras.Model.fit = model_fit
    Trainer.fit = trainer_fit


def _is_dataset_like(x) -> bool:
    import tensorflow as tf

    return isinstance(x, tf.data.Dataset) or callable(x)


def _training_data(x, y, batch_size: int, where: str):
    """The batched dataset `fit` would read: a dataset as it is; arrays sliced, shuffled
    and batched as `model.fit` batches them (prefetched)."""
    import tensorflow as tf

    if isinstance(x, tf.data.Dataset):
        return x
    if x is None or not hasattr(x, "__len__") and not isinstance(x, dict):
        raise _Refused(
            f"{where} was called with {type(x).__name__}; the doctor "
            "diagnoses a tf.data.Dataset (or tfaccel.data.pipeline) or NumPy arrays. Wrap a "
            "generator with tfaccel.data.from_generator(...) and batch it."
        )
    pairs = (x, y) if y is not None else x
    count = len(next(iter(x.values())) if isinstance(x, dict) else x)
    dataset = tf.data.Dataset.from_tensor_slices(pairs).shuffle(min(count, 10_000), seed=0)
    return dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def _diagnose(target, data, budget_s, out, where: str) -> None:
    from tfaccel import doctor

    print(f"tfaccel doctor: intercepted {where}; diagnosing (no training; weights restored after)")
    try:
        report = doctor.diagnose(target, data, budget_s=budget_s)
    except (TypeError, ValueError) as error:
        raise _Refused(f"cannot diagnose this {where}: {error}") from None
    print(report)
    if out:
        from tfaccel import strict_json

        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "doctor.json"), "w") as file:
            file.write(strict_json.dumps(report.to_dict(), indent=2, default=str))
        report.plot(os.path.join(out, "doctor.png"))
        print(f"tfaccel doctor: saved {out}/doctor.json and {out}/doctor.png")
    raise _Diagnosed


if __name__ == "__main__":
    sys.exit(main())
