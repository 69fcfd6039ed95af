"""`tfaccel doctor train.py [args]`: a user's own script, diagnosed at its first `fit`.

The script runs unchanged in this process (`runpy`, with its own `sys.argv`) until it
calls `keras.Model.fit` or `tfaccel.Trainer.fit`: that call is intercepted, its model
(or Trainer) and training data go to `tfaccel.doctor.diagnose` for the budget, the
report is printed (and saved with `--out`), and the process exits — the script's code
after `fit` does not run and nothing is trained (the doctor restores the weights).

The process ends at that first `fit` with `os._exit`, so a script that catches
`BaseException` around `fit` cannot carry on. A recipe (a script whose code calls
`parser(..., doctor=True)`, found by parsing it: `declares_doctor`) runs with `--doctor`
under the same guard.

Run: `python -m tfaccel.doctor.script [--budget S] [--out DIR] SCRIPT.py [args]`.
"""

from __future__ import annotations

import argparse
import ast
import os
import pathlib
import runpy
import sys

NOT_REACHED = 3  # the script ended before any fit
REFUSED = 2  # its fit cannot be diagnosed


def declares_doctor(path: str | os.PathLike) -> bool:
    """Whether the script is a recipe taking `--doctor`: its code (not a comment or a
    string) calls `parser(..., doctor=True)` (`recipes/common.py`)."""
    try:
        tree = ast.parse(pathlib.Path(path).read_text(errors="replace"))
    except (SyntaxError, ValueError, OSError):
        return False
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name == "parser" and any(
            k.arg == "doctor" and isinstance(k.value, ast.Constant) and k.value.value is True
            for k in node.keywords
        ):
            return True
    return False


def _end(status: int, message: str) -> None:
    """Ends the process at the intercepted `fit`, whatever the script would catch."""
    print(message, file=sys.stderr if status else sys.stdout)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tfaccel doctor")
    parser.add_argument("--budget", type=float, default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    script = os.path.abspath(args.script)
    args.recipe = declares_doctor(script)
    _install(args.budget, args.out, args.script)
    sys.argv = [script, *args.script_args]
    if args.recipe:  # its own --doctor path, still stopped at a fit
        budget = [] if args.budget is None else ["--doctor-budget", str(args.budget)]
        out = [] if args.out is None else ["--out", args.out]
        sys.argv = [script, "--doctor", *budget, *out, *args.script_args]
    sys.path.insert(0, os.path.dirname(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if args.recipe:
            return stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
        print(
            f"tfaccel doctor: {args.script} exited (status {stop.code}) before calling "
            "model.fit or Trainer.fit: nothing to diagnose.",
            file=sys.stderr,
        )
        return NOT_REACHED
    if args.recipe:
        return 0
    print(
        f"tfaccel doctor: {args.script} ended without calling model.fit or Trainer.fit: "
        "nothing to diagnose (the doctor diagnoses the first fit a script calls).",
        file=sys.stderr,
    )
    return NOT_REACHED


def _install(budget_s: float | None, out: str | None, script: str) -> None:
    import keras

    from tfaccel.train.trainer import Trainer

    def model_fit(model, x=None, y=None, batch_size=None, *args, **kwargs):
        where = f"{type(model).__name__}.fit"
        data = _training_data(x, y, batch_size or 32, "model.fit", script)
        _diagnose(model, data, budget_s, out, where, script)

    def trainer_fit(trainer, x=None, y=None, *args, batch_size=None, **kwargs):
        data = x
        if y is not None or not _is_dataset_like(x):
            data = _training_data(x, y, batch_size or 32, "Trainer.fit", script)
        _diagnose(trainer, data, budget_s, out, "Trainer.fit", script)

    keras.Model.fit = model_fit
    Trainer.fit = trainer_fit


def _is_dataset_like(x) -> bool:
    import tensorflow as tf

    return isinstance(x, tf.data.Dataset) or callable(x)


def _training_data(x, y, batch_size: int, where: str, script: str):
    """The batched dataset `fit` would read: a dataset as it is; arrays sliced, shuffled
    and batched as `model.fit` batches them (prefetched)."""
    import tensorflow as tf

    if isinstance(x, tf.data.Dataset):
        return x
    if x is None or not hasattr(x, "__len__") and not isinstance(x, dict):
        _end(
            REFUSED,
            f"tfaccel doctor: {where} was called with {type(x).__name__}; the doctor "
            "diagnoses a tf.data.Dataset (or tfaccel.data.pipeline) or NumPy arrays. Wrap a "
            "generator with tfaccel.data.from_generator(...) and batch it. Ended "
            f"{script} at this fit (its code after fit did not run).",
        )
    pairs = (x, y) if y is not None else x
    count = len(next(iter(x.values())) if isinstance(x, dict) else x)
    dataset = tf.data.Dataset.from_tensor_slices(pairs).shuffle(min(count, 10_000), seed=0)
    return dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def _diagnose(target, data, budget_s, out, where: str, script: str) -> None:
    from tfaccel import doctor

    print(f"tfaccel doctor: intercepted {where}; diagnosing (no training; weights restored after)")
    try:
        report = doctor.diagnose(target, data, budget_s=budget_s)
    except (TypeError, ValueError) as error:
        _end(
            REFUSED,
            f"tfaccel doctor: cannot diagnose this {where}: {error}. Ended {script} at this "
            "fit (its code after fit did not run).",
        )
    print(report)
    if out:
        from tfaccel import strict_json

        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "doctor.json"), "w") as file:
            file.write(strict_json.dumps(report.to_dict(), indent=2, default=str))
        report.plot(os.path.join(out, "doctor.png"))
        print(f"tfaccel doctor: saved {out}/doctor.json and {out}/doctor.png")
    _end(
        0,
        f"tfaccel doctor: ended {script} at its first fit ({where}): nothing was trained and "
        "its code after fit did not run, whatever it catches.",
    )


if __name__ == "__main__":
    sys.exit(main())
