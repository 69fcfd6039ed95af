"""`tfaccel doctor train.py [args]`: a user's own script, diagnosed at its first `fit`.

The script runs unchanged in this process (`runpy`, with its own `sys.argv`) until it
calls `keras.Model.fit` or `tfaccel.Trainer.fit`: that call is intercepted, its model
(or Trainer) and training data go to `tfaccel.doctor.diagnose` for the budget, the
report is printed (and saved with `--out`), and the process exits — the script's code
after `fit` does not run and nothing is trained (the doctor restores the weights).

The process ends at that first `fit` with `os._exit`, so a script that catches
`BaseException` around `fit` cannot carry on. Only this process is diagnosed: a child it
starts with `multiprocessing` ('spawn', 'forkserver') runs the real `fit`, and the doctor
says so (when the child starts, and at the end). A `keras.utils.PyDataset` is read as
`model.fit` reads it (in this process, shuffled; its full batches). A recipe (a script
whose code calls `parser(..., doctor=True)`, found by parsing it: `declares_doctor`) runs
with `--doctor` under the same guard.

Run: `python -m tfaccel.doctor.script [--budget S] [--out DIR] SCRIPT.py [args]`.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import os
import pathlib
import runpy
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

NOT_REACHED = 3  # the script ended before any fit
REFUSED = 2  # its fit cannot be diagnosed
_CHILDREN: list[str] = []  # the start methods of the child processes the script started


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


def _end(status: int, message: str) -> NoReturn:
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
        ended = f"exited (status {stop.code}) before calling model.fit or Trainer.fit"
        print(f"tfaccel doctor: {args.script} {ended}{_not_here()}", file=sys.stderr)
        return NOT_REACHED
    if args.recipe:
        return 0
    ended = "ended without calling model.fit or Trainer.fit"
    print(f"tfaccel doctor: {args.script} {ended}{_not_here()}", file=sys.stderr)
    return NOT_REACHED


def _not_here() -> str:
    """Why nothing was diagnosed: no fit at all, or fits in child processes."""
    if not _CHILDREN:
        return ": nothing to diagnose (the doctor diagnoses the first fit a script calls)."
    methods = ", ".join(sorted({repr(m) for m in _CHILDREN}))
    return (
        f" in this process, but it started {len(_CHILDREN)} child process(es) with "
        f"multiprocessing ({methods}). {_CHILD_FIT} Nothing was diagnosed."
    )


_CHILD_FIT = (
    "The doctor measures only the process it runs: a fit in a spawned child is not "
    "intercepted and trains for real (a forked child is diagnosed there). Run the fit in "
    "the main process for the diagnosis, or call tfaccel.doctor.diagnose(model, data) "
    "inside the child."
)


def _watch_children() -> None:
    """Records each child process the script starts (`multiprocessing`); says it once."""
    import multiprocessing
    from multiprocessing.process import BaseProcess

    start = BaseProcess.start

    def watched(process: BaseProcess) -> None:
        started = start(process)  # the start method is set by now
        if os.getpid() != parent:  # a forked child's own children
            return started
        method = getattr(process, "_start_method", None)
        method = method or multiprocessing.get_start_method(allow_none=True) or "default"
        if not _CHILDREN:
            said = f"tfaccel doctor: the script started a child process ({method!r}). "
            print(said + _CHILD_FIT, file=sys.stderr, flush=True)
        _CHILDREN.append(method)
        return started

    parent = os.getpid()
    BaseProcess.start = watched  # type: ignore[method-assign, assignment]


def _install(budget_s: float | None, out: str | None, script: str) -> None:
    import keras

    from tfaccel.train.trainer import Trainer

    def model_fit(
        model: keras.Model,
        x: Any = None,
        y: Any = None,
        batch_size: int | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        where = f"{type(model).__name__}.fit"
        if isinstance(x, keras.utils.PyDataset):
            data = _py_dataset(x, kwargs.get("shuffle", True), script)
        else:
            data = _training_data(x, y, batch_size or 32, "model.fit", script)
        _diagnose(model, data, budget_s, out, where, script)

    def trainer_fit(
        trainer: Trainer,
        x: Any = None,
        y: Any = None,
        *args: Any,
        batch_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        data = x
        if y is not None or not _is_dataset_like(x):
            data = _training_data(x, y, batch_size or 32, "Trainer.fit", script)
        _diagnose(trainer, data, budget_s, out, "Trainer.fit", script)

    keras.Model.fit = model_fit
    Trainer.fit = trainer_fit  # type: ignore[method-assign, assignment]
    _watch_children()


def _is_dataset_like(x: Any) -> bool:
    import tensorflow as tf

    return isinstance(x, tf.data.Dataset) or callable(x)


def _training_data(x: Any, y: Any, batch_size: int, where: str, script: str) -> Any:
    """The batched dataset `fit` would read: a dataset as it is; arrays sliced, shuffled
    and batched as `model.fit` batches them (prefetched)."""
    import tensorflow as tf

    if isinstance(x, tf.data.Dataset):
        return x
    if _is_py_dataset(x):  # Trainer.fit refuses it too
        _end(
            REFUSED,
            f"tfaccel doctor: {where} was called with a keras.utils.PyDataset "
            f"({type(x).__name__}), which the Trainer does not take: pass "
            "tf.data.Dataset.from_generator(lambda: (data[i] for i in range(len(data))), "
            "output_signature=...) instead (or diagnose it through model.fit). Ended "
            f"{script} at this fit (its code after fit did not run).",
        )
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


def _is_py_dataset(x: Any) -> bool:
    import keras

    return isinstance(x, keras.utils.PyDataset)


def _py_dataset(data: Any, shuffle: bool, script: str) -> Any:
    """A `PyDataset` as `model.fit` reads it in this process (Keras's adapter without
    workers: a generator over its batches, shuffled by batch, prefetched), its full
    batches only (the doctor needs one static batch size)."""
    import random

    import tensorflow as tf

    workers, processes = data.workers, data.use_multiprocessing
    if workers > 1 or (workers > 0 and processes):
        how = f"workers={workers}" + (", use_multiprocessing=True" if processes else "")
        _end(
            REFUSED,
            f"tfaccel doctor: model.fit was called with a keras.utils.PyDataset "
            f"({type(data).__name__}) read by Keras's worker pool ({how}), which the doctor "
            "cannot drive (it reads the data several times over). Build it with workers=1 "
            "and use_multiprocessing=False for the diagnosis (the input is then measured "
            "as one worker reads it), or pass a tf.data.Dataset. Ended "
            f"{script} at this fit (its code after fit did not run).",
        )
    count = data.num_batches

    def batch(i: int) -> Any:
        item = data[i]
        return tuple(item) if isinstance(item, (list, tuple)) else item

    first = batch(0)
    size = len(tf.nest.flatten(first)[0])
    spec = _spec(first, batch(1) if count is None or count > 1 else first, size)

    def full_batches() -> Iterator[Any]:
        order = list(range(count)) if count is not None else None
        if order is not None and shuffle:
            random.shuffle(order)
        for i in order if order is not None else itertools.count():
            item = batch(i)
            if len(tf.nest.flatten(item)[0]) == size:
                yield item

    print(
        f"tfaccel doctor: model.fit was called with a keras.utils.PyDataset "
        f"({type(data).__name__}); measured as model.fit reads it, {size} examples a "
        "batch (a smaller last batch is left out)."
    )
    dataset = tf.data.Dataset.from_generator(full_batches, output_signature=spec)
    return dataset.prefetch(tf.data.AUTOTUNE)


def _spec(first: Any, second: Any, size: int) -> Any:
    """The element spec of a PyDataset's batches: `size` examples; a dimension that
    differs between its first two batches is None (as Keras's adapter does)."""
    import numpy as np
    import tensorflow as tf

    def leaf(a: Any, b: Any) -> Any:
        a, b = np.asarray(a), np.asarray(b)
        dims = [d if d == e else None for d, e in zip(a.shape[1:], b.shape[1:], strict=False)]
        return tf.TensorSpec([size, *dims], tf.as_dtype(a.dtype))

    return tf.nest.map_structure(leaf, first, second)


def _diagnose(
    target: Any, data: Any, budget_s: float | None, out: str | None, where: str, script: str
) -> NoReturn:
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
