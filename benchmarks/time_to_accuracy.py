"""Time to accuracy: plain Keras against each `tfaccel.methods` method and "fast".

The jobs here are the *choice* jobs: the only ones the stacks of `methods="fast"`,
thresholds such as `methods.LONG_EPOCH_STEPS`, the cycle's scales and the other defaults were
screened and chosen on, so their figures are in-sample. The *held-out* jobs, never used
to choose anything (published keras.io examples ported as written, each with its own
recipe), are in `heldout_jobs.py` and run by `time_to_accuracy_heldout.py` (`--jobs`,
`--seeds`, `--lengths`, `--paths`), which imports this script's timing; their figures are
the ones to quote as what a new user gets.

Four choice jobs on data scikit-learn ships (offline, real, not random labels):

- `digits_cnn`: the 8x8 digits as images, a small CNN (any image size, for resizing);
- `digits_resnet`: the same images, `tfaccel.models.resnet(18, stem="cifar", width=16)`;
- `digits_sequence`: each digit as a sequence of 8 rows of 8 pixels, a GRU;
- `breast_cancer_mlp`: the breast-cancer table (30 features), `tfaccel.models.mlp`.

Those jobs reach their targets in seconds, most of it the first epoch's traces (the
same for every contender), so their seconds understate a shorter path. A fifth job of
minutes, generated offline: `cifar_shaped_cnn`, `batch_size_jobs.py`'s CIFAR-shaped data
(20,000 synthetic 32x32x3 images of 10 class templates, shifted, mixed with a distractor
and noised; 5,000 held out) and its small CNN, run with the baseline, one-cycle, "fast"
(`model.fit` and the Trainer) and the expert recipe only (the run must fit two shared
cores). The ResNet of minutes: `cifar_shaped_resnet`, `tfaccel.models.resnet(18,
stem="cifar", width=8)` on 5,000 of those images (2,000 held out; baseline, freed_input,
"fast" both ways, expert). A sixth, the sequence job of minutes: `cifar_shaped_sequence`, the
same images read as 32 rows of 96 values by a GRU (baseline, freed_input, "fast" both ways,
expert); and a table of tens of seconds: `generated_table_mlp`, 40,000 rows of
scikit-learn's `make_classification` (20 features, 4 classes of 3 clusters each, 2 % of the
labels flipped; generated offline, the labels by construction) for an MLP (64, 64). The
attention job: `cifar_shaped_attention`, the same rows read by a small transformer encoder
(`row_transformer`), which screened the stack "fast" gives attention models
(`--out results/attention_stacks.json`).

Each job is split once (stratified, 30 % held out). The baseline is the script a user
writes: `model.compile(Adam())`, batch 32, a fixed number of epochs, validation each
epoch. Contenders: each method alone (where it applies) and `"fast"`, with the same
optimizer, batch and epochs, through `tfaccel.methods.for_fit` and `model.fit`. Since
2026-11-29 `for_fit`'s datasets free the iterators `model.fit` drops each epoch off its
thread (the plain script waits up to seconds for tf.data's autotuner at each epoch's
start); `freed_input` is `for_fit` with no method, that change alone (jobs run before
then carry the wait in every `model.fit` contender, as in the baseline).

Time to accuracy = wall seconds from the `fit` call (tracing included, the same for
all) to the end of the first epoch whose held-out accuracy is at or above the target
(evaluation counted the same way for every contender). The target of a job is the
accuracy the plain script ends at in every seed: the lowest of its final held-out
accuracies over the seeds, rounded down to 0.005. Per seed, a contender's time is divided by the
baseline's of the same seed (runs interleaved by seed); the table gives the median
ratio with a bootstrap 90 % interval over seeds, how many seeds reached the target, and
the median final accuracy. A run that never reaches the target counts as infinitely
slow (its ratio is "inf"). Every run's clock starts after a `gc.collect()`: without it,
a run paid for the previous run's garbage when Python collected it (0.1–0.3 s, measured
as a 1.4× bias on the sub-second breast-cancer table between two identical setups).

`--generous` adds the setting users often run: 3x the epochs declared, stopped at the
target (a callback setting `stop_training`), for the baseline and "fast" only.

Writes `benchmarks/results/time_to_accuracy.json` and `.png`.
Run: `python benchmarks/time_to_accuracy.py [--seeds 3] [--jobs ...] [--generous]`.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import pathlib
import time

import keras
import numpy as np
import tensorflow as tf
from sklearn import datasets, model_selection, preprocessing

import tfaccel
from tfaccel import methods

RESULTS = pathlib.Path(__file__).parent / "results"
BATCH = 32


# -- jobs ------------------------------------------------------------------------------------


def digits(split_seed=0):
    x, y = datasets.load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    return model_selection.train_test_split(
        x, y.astype("int32"), test_size=0.3, stratify=y, random_state=split_seed
    )


def breast_cancer(split_seed=0):
    x, y = datasets.load_breast_cancer(return_X_y=True)
    xt, xv, yt, yv = model_selection.train_test_split(
        x, y.astype("int32"), test_size=0.3, stratify=y, random_state=split_seed
    )
    scaler = preprocessing.StandardScaler().fit(xt)
    return [scaler.transform(a).astype("float32") for a in (xt, xv)] + [yt, yv]


def cnn():
    return keras.Sequential(
        [
            keras.Input((None, None, 1)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


def resnet():
    return tfaccel.models.resnet(
        18, input_shape=(None, None, 1), num_classes=10, stem="cifar", width=16
    )


def gru():
    return keras.Sequential(
        [keras.Input((8, 8)), keras.layers.GRU(32), keras.layers.Dense(10, activation="softmax")]
    )


def mlp():
    return tfaccel.models.mlp(input_shape=(30,), hidden=(32, 16), num_classes=2)


def cifar_shaped():
    import batch_size_jobs  # this folder's CIFAR-shaped data (imported only for this job)

    (xt, yt), (xv, yv) = batch_size_jobs.cifar_like(20_000, 0), batch_size_jobs.cifar_like(5_000, 1)
    return xt, xv, yt, yv


def cifar_shaped_few():
    """5,000 of the CIFAR-shaped training images and 2,000 held out (the ResNet's job)."""
    xt, xv, yt, yv = cifar_shaped()
    return xt[:5_000], xv[:2_000], yt[:5_000], yv[:2_000]


def cifar_resnet():
    return tfaccel.models.resnet(18, input_shape=(32, 32, 3), num_classes=10, stem="cifar", width=8)


def generated_table(split_seed=0):
    x, y = datasets.make_classification(
        n_samples=40_000,
        n_features=20,
        n_informative=12,
        n_redundant=4,
        n_classes=4,
        n_clusters_per_class=3,
        flip_y=0.02,
        random_state=0,
    )
    xt, xv, yt, yv = model_selection.train_test_split(
        x, y.astype("int32"), test_size=0.3, stratify=y, random_state=split_seed
    )
    scaler = preprocessing.StandardScaler().fit(xt)
    return [scaler.transform(a).astype("float32") for a in (xt, xv)] + [yt, yv]


def wide_mlp():
    return tfaccel.models.mlp(input_shape=(20,), hidden=(64, 64), num_classes=4)


def cifar_shaped_rows():
    xt, xv, yt, yv = cifar_shaped()
    return xt.reshape(-1, 32, 96), xv.reshape(-1, 32, 96), yt, yv


def wide_gru():
    return keras.Sequential(
        [keras.Input((32, 96)), keras.layers.GRU(64), keras.layers.Dense(10, activation="softmax")]
    )


def row_transformer():
    """A small transformer encoder over the 32 rows (96 values each): a projection with
    learned positions, one block (2 heads, key size 16, a 64-unit feed-forward),
    average pooling. The attention choice job's model; not the held-out text one's."""
    inputs = keras.Input((32, 96))
    x = keras.layers.Dense(32)(inputs)
    x = x + keras.layers.Embedding(32, 32)(keras.ops.arange(32))
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=16)(x, x)
    x = keras.layers.LayerNormalization(epsilon=1e-6)(x + attended)
    fed = keras.layers.Dense(32)(keras.layers.Dense(64, activation="relu")(x))
    x = keras.layers.LayerNormalization(epsilon=1e-6)(x + fed)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(x))


def small_cnn():
    import batch_size_jobs

    return batch_size_jobs.small_cnn()


def images(parts):
    xt, xv, yt, yv = parts
    return xt.reshape(-1, 8, 8, 1), xv.reshape(-1, 8, 8, 1), yt, yv


def rows(parts):
    xt, xv, yt, yv = parts
    return xt.reshape(-1, 8, 8), xv.reshape(-1, 8, 8), yt, yv


JOBS = {
    "digits_cnn": dict(kind="image", data=lambda: images(digits()), build=cnn, epochs=10),
    # ResNet-18's trace is most of its time here: fewer epochs, and only the methods
    # meant for it (the run must fit ~10 minutes on two shared cores).
    "digits_resnet": dict(
        kind="image",
        data=lambda: images(digits()),
        build=resnet,
        epochs=6,
        contenders=(
            "label_smoothing",
            "stochastic_depth",
            "one_cycle",
            "progressive_batch",
            "fast",
            "trainer_fast",
            "expert",
        ),
    ),
    "digits_sequence": dict(kind="sequence", data=lambda: rows(digits()), build=gru, epochs=20),
    "breast_cancer_mlp": dict(kind="tabular", data=breast_cancer, build=mlp, epochs=30),
    "cifar_shaped_cnn": dict(
        kind="image",
        data=cifar_shaped,
        build=small_cnn,
        epochs=10,
        contenders=("one_cycle", "fast", "trainer_fast", "expert"),
    ),
    # The ResNet on the CIFAR-shaped images: ~55 ms a step at batch 32 here whatever its
    # width (the step's fixed cost), so 5,000 images make a job of ~100 s, not hours.
    "cifar_shaped_resnet": dict(
        kind="image",
        data=cifar_shaped_few,
        build=cifar_resnet,
        epochs=10,
        contenders=("freed_input", "fast", "fast_bn_kept", "trainer_fast", "expert"),
    ),
    "cifar_shaped_sequence": dict(
        kind="sequence",
        data=cifar_shaped_rows,
        build=wide_gru,
        epochs=10,
        contenders=("freed_input", "fast", "trainer_fast", "expert"),
    ),
    # The attention choice job (added 2026-12-07): "fast" read attention models as
    # sequences and ran the stack chosen on GRUs; these contenders screen the attention
    # stack ("attention_*"), the held-out Transformer never read.
    "cifar_shaped_attention": dict(
        kind="sequence",
        data=cifar_shaped_rows,
        build=row_transformer,
        epochs=10,
        contenders=(
            "fast",
            "attention_peak_1x",
            "attention_plateau_1x",
            "attention_grown",
            "attention_short_warmup",
            "trainer_fast",
        ),
    ),
    "generated_table_mlp": dict(
        kind="tabular",
        data=generated_table,
        build=wide_mlp,
        epochs=20,
        contenders=("one_cycle", "fast", "trainer_fast", "expert"),
    ),
}

CONTENDERS = {
    "label_smoothing": lambda: [methods.LabelSmoothing(0.1)],
    "mixup": lambda: [methods.MixUp(0.2)],
    "cutmix": lambda: [methods.CutMix(1.0)],
    "ema": lambda: [methods.EMA(0.9)],
    "one_cycle": lambda: [methods.OneCycle()],
    "warmup_cosine": lambda: [methods.WarmupCosine()],
    "layer_freezing": lambda: [methods.LayerFreezing(0.5, 0.5)],
    "stochastic_depth": lambda: [methods.StochasticDepth(0.1)],
    "progressive_resizing": lambda: [methods.ProgressiveResizing(0.5, 2, 0.5)],
    "progressive_batch": lambda: [methods.ProgressiveBatch()],
    "attention_peak_1x": lambda: [
        methods.ProgressiveBatch(growth=4, stages=3, ramp_epochs=2),
        methods.Plateau(scale=1.0),
        methods.LabelSmoothing(0.1),
    ],
    "attention_plateau_1x": lambda: [methods.Plateau(scale=1.0), methods.LabelSmoothing(0.1)],
    "attention_grown": lambda: [methods.ProgressiveBatch(growth=4, stages=3, ramp_epochs=2)],
    "attention_short_warmup": lambda: [
        methods.ProgressiveBatch(growth=4, stages=3, ramp_epochs=2),
        methods.Plateau(scale=3.0, warmup=0.25),
        methods.LabelSmoothing(0.1),
    ],
    "fast_bn_kept": lambda: [  # "fast"'s image stack, BatchNorm at the user's momentum
        methods.ProgressiveBatch(growth=8, stages=4, ramp_epochs=4, batch_norm="keep"),
        methods.Plateau(scale=10.0),
        methods.LabelSmoothing(0.1),
    ],
    "freed_input": lambda: [],  # for_fit with no method: only its datasets' freed iterators
    "fast": lambda: "fast",
    "trainer_fast": lambda: "fast",
    "expert": lambda: [],
}
# The best published recipe found for each job's kind, as the training settings it
# gives (the job's model kept): Keras' "Simple MNIST convnet" example (Adam, batch 128)
# for the two image jobs, Keras' "Bidirectional LSTM on IMDB" example (Adam, batch 32)
# is the baseline itself, so the sequence job takes the image recipe's batch as the
# nearest published change; scikit-learn's MLPClassifier defaults (Adam 1e-3, batch
# min(200, n)) for the tabular MLP.
EXPERT_BATCH = {
    "digits_cnn": 128,
    "digits_resnet": 128,
    "digits_sequence": 128,
    "breast_cancer_mlp": 200,
    "cifar_shaped_cnn": 128,
    "cifar_shaped_resnet": 128,
    "cifar_shaped_sequence": 128,
    "generated_table_mlp": 200,
    "cifar_shaped_attention": 128,
}
# Contenders trained by `tfaccel.Trainer` instead of `model.fit` (the same data, optimizer
# and methods): what a user of `Trainer(..., methods="fast")` gets, its faster steps included.
TRAINER = {"trainer_fast"}


# -- one run ---------------------------------------------------------------------------------


class Curve(keras.callbacks.Callback):
    """Seconds since `start` and held-out accuracy at each epoch's end; stops at `stop_at`."""

    def __init__(self, start: float, stop_at: float | None = None):
        super().__init__()
        self.start, self.stop_at, self.points = start, stop_at, []

    def on_epoch_end(self, epoch, logs=None):
        accuracy = float(logs["val_accuracy"])
        self.points.append((time.perf_counter() - self.start, accuracy))
        if self.stop_at is not None and accuracy >= self.stop_at:
            self.model.stop_training = True


def run(job: dict, parts, contender: str | None, seed: int, epochs: int, stop_at=None) -> dict:
    """Trains one model; returns its curve, or why the contender does not apply."""
    xt, xv, yt, yv = parts
    keras.utils.set_random_seed(seed)
    model = job["build"]()
    batch = EXPERT_BATCH[job["name"]] if contender == "expert" else BATCH
    train = tf.data.Dataset.from_tensor_slices((xt, yt)).shuffle(len(xt), seed=seed).batch(batch)
    val = tf.data.Dataset.from_tensor_slices((xv, yv)).batch(256)
    optimizer, loss, callbacks = keras.optimizers.Adam(), "sparse_categorical_crossentropy", []
    applied = []
    if contender not in (None, "expert"):
        try:
            plan = methods.for_fit(
                CONTENDERS[contender](),
                model,
                train,
                epochs=epochs,
                loss=loss,
                optimizer=optimizer,
                batch_size=batch,  # given: for_fit reads no batch (the shuffle's order kept)
                kind=job["kind"],
                seed=seed,
            )
        except (ValueError, TypeError) as error:
            return {"skipped": str(error)}
        train, val, optimizer, loss = (
            plan.dataset,
            plan.evaluation_data(val),
            plan.optimizer,
            plan.loss,
        )
        callbacks, applied = plan.callbacks, [m.name for m in plan.methods]
    if contender in TRAINER:
        return run_trainer(model, contender, parts, seed, epochs, stop_at)
    model.compile(optimizer=optimizer, loss=loss, metrics=["accuracy"])
    gc.collect()  # the previous run's garbage, collected outside every run's clock
    start = time.perf_counter()
    curve = Curve(start, stop_at)
    model.fit(train, epochs=epochs, validation_data=val, callbacks=[*callbacks, curve], verbose=0)
    return {"curve": curve.points, "methods": applied}


def run_trainer(model, contender, parts, seed, epochs, stop_at=None) -> dict:
    """The same job through `tfaccel.Trainer(..., methods=...)`: its curve and methods."""
    xt, xv, yt, yv = parts
    train = tf.data.Dataset.from_tensor_slices((xt, yt)).shuffle(len(xt), seed=seed).batch(BATCH)
    val = tf.data.Dataset.from_tensor_slices((xv, yv)).batch(256)
    trainer = tfaccel.Trainer(
        model,
        optimizer=keras.optimizers.Adam(),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        methods=CONTENDERS[contender](),
    )
    gc.collect()
    start = time.perf_counter()
    curve = Curve(start, stop_at)
    trainer.fit(train, epochs=epochs, validation_data=val, callbacks=[curve], verbose=0)
    applied = [m.name for m in trainer.methods.plan.methods] if trainer.methods.plan else []
    return {"curve": curve.points, "methods": applied}


def time_to(curve, target: float) -> float:
    return next((t for t, accuracy in curve if accuracy >= target - 1e-9), math.inf)


def epochs_to(curve, target: float) -> float:
    """Passes over the data to the target: the path alone, free of the machine's noise."""
    return next(
        (i + 1 for i, (_, accuracy) in enumerate(curve) if accuracy >= target - 1e-9), math.inf
    )


def bootstrap(values, rng, draws=2000):
    """Median and its bootstrap 90 % interval (infinite values allowed)."""
    values = np.asarray(values, float)
    medians = np.sort(np.median(rng.choice(values, (draws, len(values))), axis=1))
    low, high = medians[int(0.05 * draws)], medians[int(0.95 * draws) - 1]
    return float(np.median(values)), float(low), float(high)


# -- the table -------------------------------------------------------------------------------


def summarize(runs: dict, seeds: list[int], rng) -> dict:
    """Per job: the target, and per contender the ratio to the baseline per seed."""
    table = {}
    for job, by_contender in runs.items():
        finals = [by_contender["baseline"][s]["curve"][-1][1] for s in seeds]
        target = math.floor(min(finals) * 200 + 1e-6) / 200
        base = {s: time_to(by_contender["baseline"][s]["curve"], target) for s in seeds}
        base_epochs = {s: epochs_to(by_contender["baseline"][s]["curve"], target) for s in seeds}
        rows_ = {}
        for name, by_seed in by_contender.items():
            if any("skipped" in by_seed.get(s, {"skipped": "not run"}) for s in seeds):
                rows_[name] = {"skipped": by_seed[seeds[0]].get("skipped", "")}
                continue
            times = [time_to(by_seed[s]["curve"], target) for s in seeds]
            ratios = [t / base[s] for t, s in zip(times, seeds, strict=True)]
            median, low, high = bootstrap(ratios, rng)
            epochs = [epochs_to(by_seed[s]["curve"], target) for s in seeds]
            epoch_ratios = [e / base_epochs[s] for e, s in zip(epochs, seeds, strict=True)]
            first = [by_seed[s]["curve"][0][0] for s in seeds]
            rows_[name] = {
                "ratio_median": median,
                "ratio_low": low,
                "ratio_high": high,
                "ratios": ratios,
                "seconds": times,
                "reached": sum(math.isfinite(t) for t in times),
                "epochs": epochs,
                "epochs_ratio_median": float(np.median(epoch_ratios)),
                "first_epoch_seconds_median": float(np.median(first)),
                "final_accuracy_median": float(
                    np.median([by_seed[s]["curve"][-1][1] for s in seeds])
                ),
                "methods": by_seed[seeds[0]].get("methods", []),
            }
        table[job] = {"target": target, "contenders": rows_}
    return table


def plot(table: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(table), figsize=(4.5 * len(table), 4.5), sharey=True)
    for ax, (job, entry) in zip(np.atleast_1d(axes), table.items(), strict=True):
        names = [n for n, r in entry["contenders"].items() if "skipped" not in r]
        medians = [min(entry["contenders"][n]["ratio_median"], 3.0) for n in names]
        low = [min(entry["contenders"][n]["ratio_low"], 3.0) for n in names]
        high = [min(entry["contenders"][n]["ratio_high"], 3.0) for n in names]
        errors = [np.subtract(medians, low), np.subtract(high, medians)]
        colors = [
            "tab:gray" if n == "baseline" else "tab:red" if n == "fast" else "tab:blue"
            for n in names
        ]
        ax.barh(names, medians, xerr=errors, color=colors)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"{job}\n(target {entry['target']:.3f})")
        ax.set_xlabel("time to target / baseline's (capped at 3)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _int_seeds(mapping: dict) -> dict:
    """JSON keys back to int seeds (`runs[job][contender][seed]`)."""
    return {int(k) if k.isdigit() else k: v for k, v in mapping.items()}


def show(table: dict, seeds: list) -> None:
    """Prints the table: per job, each contender's ratios, reach, epochs and accuracy."""
    for name, entry in table.items():
        print(f"\n{name} (target {entry['target']:.3f})")
        for contender, row in entry["contenders"].items():
            if "skipped" in row:
                print(f"  {contender:<22} n/a: {row['skipped'][:70]}")
                continue
            print(
                f"  {contender:<22} {row['ratio_median']:.2f}x [{row['ratio_low']:.2f}, "
                f"{row['ratio_high']:.2f}]  reached {row['reached']}/{len(seeds)}  "
                f"epochs {row['epochs_ratio_median']:.2f}x  "
                f"final {row['final_accuracy_median']:.3f}"
            )
        if "generous_epochs" in entry:
            g = entry["generous_epochs"]
            for contender in ("fast", "trainer_fast"):
                print(
                    f"  {contender}, {g['declared_epochs']} epochs declared, stopped at "
                    f"target: {g[f'{contender}_ratio_median']:.2f}x "
                    f"[{g[f'{contender}_ratio_low']:.2f}, {g[f'{contender}_ratio_high']:.2f}]"
                )


def markdown(table: dict, seeds: list) -> str:
    """The docs' table: a row per contender, a column per job (ratio, interval, reached,
    epochs ratio, final accuracy)."""

    def cell(row) -> str:
        if row is None:
            return "not run"
        if "skipped" in row:
            return "n/a"

        def x(value):
            return "∞" if not math.isfinite(value) else f"{value:.2f}"

        return (
            f"{x(row['ratio_median'])}× [{x(row['ratio_low'])}, {x(row['ratio_high'])}] "
            f"({row['reached']}/{len(seeds)}; epochs {x(row['epochs_ratio_median'])}×; "
            f"{row['final_accuracy_median']:.3f})"
        )

    jobs = list(table)
    names = list(dict.fromkeys(n for job in jobs for n in table[job]["contenders"]))
    head = " | ".join(f"{job} (target {table[job]['target']:.3f})" for job in jobs)
    lines = [f"| contender | {head} |", "| --- |" + " --- |" * len(jobs)]
    for name in names:
        cells = " | ".join(cell(table[job]["contenders"].get(name)) for job in jobs)
        lines.append(f"| {name} | {cells} |")
    generous = []
    for job in jobs:
        g = table[job].get("generous_epochs")
        if g:
            generous.append(
                f"{job} ({g['declared_epochs']} epochs): fast "
                f"{g['fast_ratio_median']:.2f}× [{g['fast_ratio_low']:.2f}, "
                f"{g['fast_ratio_high']:.2f}], Trainer fast "
                f"{g['trainer_fast_ratio_median']:.2f}× [{g['trainer_fast_ratio_low']:.2f}, "
                f"{g['trainer_fast_ratio_high']:.2f}]"
            )
    return "\n".join(lines) + "\n\nGenerous epochs, stopped at the target: " + "; ".join(generous)


def summarize_only(out: pathlib.Path) -> None:
    """Rebuilds the table of `out` from its stored runs (the generous setting kept)."""
    old = json.loads(out.read_text())
    runs = json.loads(json.dumps(old["runs"]), object_hook=_int_seeds)
    table = summarize(runs, old["meta"]["seeds"], np.random.default_rng(0))
    for name, entry in old["jobs"].items():
        if "generous_epochs" in entry:
            table[name]["generous_epochs"] = entry["generous_epochs"]
    out.write_text(json.dumps({"meta": old["meta"], "jobs": table, "runs": runs}, indent=1))
    plot(table, out.with_suffix(".png"))
    show(table, old["meta"]["seeds"])
    print(markdown(table, old["meta"]["seeds"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", nargs="*", default=list(JOBS))
    parser.add_argument("--contenders", nargs="*", default=list(CONTENDERS))
    parser.add_argument("--generous", action="store_true")
    parser.add_argument("--out", default=str(RESULTS / "time_to_accuracy.json"))
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep --out's runs; run only --contenders (no baseline) and replace theirs",
    )
    parser.add_argument(
        "--summarize", action="store_true", help="only rebuild --out's table from its runs"
    )
    args = parser.parse_args()
    if args.summarize:
        return summarize_only(pathlib.Path(args.out))
    seeds = list(range(args.seeds))
    out = pathlib.Path(args.out)
    old = json.loads(out.read_text()) if args.merge else {}
    runs: dict = json.loads(json.dumps(old.get("runs", {})), object_hook=_int_seeds)
    began = time.perf_counter()
    for name in args.jobs:
        job = dict(JOBS[name], name=name)
        runs.setdefault(name, {})
        parts = job["data"]()
        for seed in seeds:  # interleaved by seed: the machine's drift touches all alike
            chosen = [c for c in args.contenders if c in job.get("contenders", CONTENDERS)]
            baseline = [] if args.merge and seed in runs[name].get("baseline", {}) else [None]
            for contender in baseline + chosen:  # a merge runs a new job's baseline too
                key = contender or "baseline"
                result = run(job, parts, contender, seed, job["epochs"])
                runs[name].setdefault(key, {})[seed] = result
                shown = result.get("skipped", "")[:60] or f"{result['curve'][-1][1]:.3f}"
                print(f"{name} seed {seed} {key}: {shown}", flush=True)
    table = summarize(runs, seeds, np.random.default_rng(0))
    for name, entry in old.get("jobs", {}).items():  # a merge keeps the generous setting
        if "generous_epochs" in entry and name in table:
            table[name].setdefault("generous_epochs", entry["generous_epochs"])
    if args.generous:
        for name in args.jobs:
            job, parts, target = (
                dict(JOBS[name], name=name),
                JOBS[name]["data"](),
                table[name]["target"],
            )
            generous = {}
            for seed in seeds:
                for contender in (None, "fast", "trainer_fast"):
                    result = run(job, parts, contender, seed, 3 * job["epochs"], stop_at=target)
                    generous.setdefault(contender or "baseline", []).append(
                        time_to(result["curve"], target)
                    )
            entry = {"declared_epochs": 3 * job["epochs"], "seconds": generous}
            for contender in ("fast", "trainer_fast"):
                ratios = [
                    f / b for f, b in zip(generous[contender], generous["baseline"], strict=True)
                ]
                median, low, high = bootstrap(ratios, np.random.default_rng(0))
                entry[f"{contender}_ratio_median"] = median
                entry[f"{contender}_ratio_low"] = low
                entry[f"{contender}_ratio_high"] = high
            table[name]["generous_epochs"] = entry
    out.parent.mkdir(exist_ok=True)
    meta = {
        "seeds": seeds,
        "batch": BATCH,
        "epochs": {n: JOBS[n]["epochs"] for n in runs},
        "wall_seconds": time.perf_counter() - began + old.get("meta", {}).get("wall_seconds", 0),
        "host": "2 shared CPU cores",
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
    }
    out.write_text(json.dumps({"meta": meta, "jobs": table, "runs": runs}, indent=1, default=str))
    plot(table, out.with_suffix(".png"))
    show(table, seeds)


if __name__ == "__main__":
    main()
