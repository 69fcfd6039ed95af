"""TensorFlow's "Mixed precision" guide, ported: its dense model trained by `model.fit` under
the guide's policies against `tfaccel.Trainer(model, precision="auto")`.

The guide's setting, written again here: a model of two 4096-unit ReLU dense layers on
MNIST-shaped data (784 features in [0, 1], 10 classes), a float32 softmax at the end,
RMSprop, `validation_split=0.2`. The data is generated here (no download): each label
is the argmax of a fixed random projection of its image, so there is something to learn.
This machine has no GPU (the guide's hardware), so the run is scaled to a CPU: `N`
examples, batch `BATCH` (the guide: 60,000 and 8,192) and `EPOCHS` epochs.

Variants: `model.fit` under each policy the guide uses — "float32" (its baseline),
"mixed_float16" (its policy for GPUs) and "mixed_bfloat16" (its policy for TPUs) — set
with `keras.mixed_precision.set_global_policy` before the model is built, as the guide
does; and tfaccel: the same building function given to
`tfaccel.Trainer(build, precision="auto")`, which times the candidates at its first `fit`
and trains the fastest.

Each run is a fresh process; the variants alternate round by round (each leads in
turn). Timed: from the `fit` call to its end (the model built before, the Trainer made
before). Reports medians and each one's ratio to the guide's fastest variant's median
(>1: faster).

tfaccel's operation probe caches its rates per machine (`tfaccel.choices.operations`): the
run gives its processes a new, empty cache directory ($TFACCEL_CACHE_DIR), so the first
tfaccel round measures them ("cold") and the later ones read them ("warm"); both are
reported apart as well as together.

Run: `python benchmarks/guide_mixed_precision.py [--rounds N]` →
`results/guide_mixed_precision.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import tempfile
import time

import fresh_rounds

RESULTS = pathlib.Path(__file__).parent / "results" / "guide_mixed_precision.json"
N = 2048  # examples (the guide: 60,000)
BATCH = 512  # the guide: 8,192
EPOCHS = 3  # the guide: 5
UNITS = 4096
GUIDE = ("float32", "mixed_float16", "mixed_bfloat16")
TFACCEL = ("tfaccel",)


def mnist_shaped(seed: int = 0):
    """`N` images of 784 values in [0, 1] and labels 0-9 (a fixed projection's argmax)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.random((N, 784), dtype=np.float32)
    projection = rng.normal(size=(784, 10)).astype("float32")
    y = np.argmax((x - 0.5) @ projection, axis=1).astype("int32")
    return x, y


def build():
    """The guide's model: two 4096-unit dense layers, the softmax in float32."""
    import keras

    inputs = keras.Input((784,), name="digits")
    h = keras.layers.Dense(UNITS, activation="relu", name="dense_1")(inputs)
    h = keras.layers.Dense(UNITS, activation="relu", name="dense_2")(h)
    h = keras.layers.Dense(10, name="dense_logits")(h)
    outputs = keras.layers.Activation("softmax", dtype="float32", name="predictions")(h)
    return keras.Model(inputs, outputs)


def one(variant: str) -> dict:
    """One run in this (fresh) process."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    import tfaccel

    keras.utils.set_random_seed(0)
    x, y = mnist_shaped()
    began = time.perf_counter()
    fit_args = {"batch_size": BATCH, "epochs": EPOCHS, "validation_split": 0.2, "verbose": 0}
    if variant == "tfaccel":
        trainer = tfaccel.Trainer(
            build,
            optimizer=keras.optimizers.RMSprop(),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
            precision="auto",
        )
        fit = trainer.fit
    else:
        keras.mixed_precision.set_global_policy(variant)
        model = build()
        model.compile(
            loss="sparse_categorical_crossentropy",
            optimizer=keras.optimizers.RMSprop(),
            metrics=["accuracy"],
        )
        fit = model.fit
    built = time.perf_counter()
    history = fit(x, y, **fit_args)
    ended = time.perf_counter()
    result = {
        "setup_s": built - began,
        "fit_s": ended - built,
        "final_loss": float(history.history["loss"][-1]),
        "final_val_accuracy": float(history.history["val_accuracy"][-1]),
    }
    if variant == "tfaccel":
        result["policy"] = trainer.model.dtype_policy.name
        result["choice"] = trainer.precision_choice.describe() if trainer.precision_choice else ""
        result["startup"] = trainer.startup.to_dict()
        result["rates_from_cache"] = "read from the cache" in result["choice"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--one", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variants", default=",".join(GUIDE + TFACCEL))
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tfaccel-cache-") as cache:
        os.environ["TFACCEL_CACHE_DIR"] = cache  # the first tfaccel run's is cold
        runs = fresh_rounds.alternate(__file__, args.variants.split(","), args.rounds, 900)
    medians = {v: statistics.median(r["fit_s"] for r in rs) for v, rs in runs.items()}
    guide = {v: m for v, m in medians.items() if v in GUIDE}
    fastest = min(guide, key=guide.get)
    results = {
        "machine": "shared 2-core CPU (no GPU), loaded by other sessions (other engineers' "
        "jobs ran meanwhile): ratios only",
        "rounds": args.rounds,
        "setting": {"examples": N, "batch": BATCH, "epochs": EPOCHS, "units": UNITS},
        "timed": "from the fit call to its end, fresh processes, variants alternating",
        "fit_s_median": {v: round(m, 3) for v, m in medians.items()},
        "fit_s_runs": {v: [round(r["fit_s"], 3) for r in rs] for v, rs in runs.items()},
        "setup_s_median": {
            v: round(statistics.median(r["setup_s"] for r in rs), 3) for v, rs in runs.items()
        },
        "final_val_accuracy_median": {
            v: round(statistics.median(r["final_val_accuracy"] for r in rs), 4)
            for v, rs in runs.items()
        },
        "guide_fastest": fastest,
        "speed_vs_guide_fastest": {v: round(medians[fastest] / m, 2) for v, m in medians.items()},
        "tfaccel_policy": [r.get("policy") for r in runs.get("tfaccel", [])],
        "tfaccel_choice": runs["tfaccel"][-1].get("choice") if runs.get("tfaccel") else None,
        "tfaccel_startup_last": runs["tfaccel"][-1].get("startup") if runs.get("tfaccel") else None,
        **cold_and_warm(runs.get("tfaccel", []), medians[fastest]),
        "wall_s": round(time.perf_counter() - began),
    }
    print(json.dumps({k: results[k] for k in ("fit_s_median", "speed_vs_guide_fastest")}))
    pathlib.Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


def cold_and_warm(runs: list[dict], fastest_s: float) -> dict:
    """tfaccel's first round (the probe's rates measured: a cold cache) apart from the
    later ones (read from the cache): fit seconds and ratios to the guide's fastest."""
    if not runs:
        return {}
    cold, warm = runs[0]["fit_s"], [r["fit_s"] for r in runs[1:]]
    out = {
        "tfaccel_rates_from_cache": [r.get("rates_from_cache") for r in runs],
        "tfaccel_cold_fit_s": round(cold, 3),
        "tfaccel_cold_speed_vs_guide_fastest": round(fastest_s / cold, 2),
        "tfaccel_cold_precision_choice_s": runs[0]["startup"]["phases_s"].get(
            "precision and XLA choice"
        ),
    }
    if warm:
        out["tfaccel_warm_fit_s_median"] = round(statistics.median(warm), 3)
        out["tfaccel_warm_speed_vs_guide_fastest"] = round(fastest_s / statistics.median(warm), 2)
        out["tfaccel_warm_precision_choice_s"] = [
            r["startup"]["phases_s"].get("precision and XLA choice") for r in runs[1:]
        ]
    return out


if __name__ == "__main__":
    main()
