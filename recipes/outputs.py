"""What a recipe writes under `--out`: history.csv, TensorBoard logs, metrics.json, curves.png
and model.keras.

`callbacks(run)` gives fit its callbacks (throughput, then history.csv and TensorBoard on
the chief); `finish(run, history, ...)` prints the final metrics and writes the rest.
"""

from __future__ import annotations

import csv
import math
import pathlib
from typing import Any

import common  # recipes/common.py: the command line and the run
import keras

import tfaccel
from tfaccel import strict_json


def callbacks(run: common.Run, *extra: keras.callbacks.Callback) -> tuple[list, Any]:
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


def examples_per_second(throughput) -> float:
    """Median examples/s after warm-up, else the overall rate (NaN when unknown)."""
    stats = throughput.summary.get("examples_per_second") or {}
    for key in ("median", "overall"):
        value = stats.get(key)
        if value is not None and math.isfinite(value):
            return float(value)
    return float("nan")


def finish(
    run: common.Run,
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


def saved_model(run: common.Run, trainer: tfaccel.Trainer) -> dict:
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
