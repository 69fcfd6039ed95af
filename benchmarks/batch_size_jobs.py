"""Tuned vs default batch on whole training jobs: accuracy, time to accuracy, probe cost.

Used by `batch_size.py`. Each job trains twice from the same seed for the same epochs:
at its default batch and learning rate, and at the batch tfaccel chooses, with the rate
scaled by the optimizer's rule (Adam: square root) and the methods the recommendation
comes with (a grown batch's one-cycle): `tuning.before_probing` when the data
alone decides (nothing probed), else `find_batch_size` from the default batch upwards
(noise scale on, bounded by the job's size) and `tuning.recommend`. Held-out accuracy is
measured `EVALS_PER_EPOCH` times an epoch with the clock paused, so the training seconds
exclude it. A job whose probe says it is too small to pay is left at its batch: its
tuned run is its default run, and the probe's seconds are its whole cost. A job kept at
its batch although a larger one ran faster (the time to accuracy decided) is also
trained at that throughput knee, to check that keeping it was right.
"""

from __future__ import annotations

import pathlib
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import tfaccel

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "recipes"))

import digits  # noqa: E402  (recipes/digits.py: the `make run` job's data and model)

SCE = "sparse_categorical_crossentropy"
EVALS_PER_EPOCH = 4


def digits_job(quick: bool) -> dict:
    """The `make run` job: recipes/digits.py's data, model, batch 64, Adam 2e-3, 15 epochs."""
    (x, y), _, (x_held, y_held) = digits.load(0)
    return {
        "name": "digits",
        "data": (x, y),
        "held_out": (x_held, y_held),
        "held_out_name": "the recipe's test split",
        "build": digits.build_model,
        "batch_size": 64,
        "learning_rate": 2e-3,
        "epochs": 3 if quick else 15,
        "model": "recipes/digits.py build_model (two residual blocks)",
    }


def cifar_like(n: int, seed: int, noise: float = 3.0):
    """Learnable CIFAR-shaped data: (n, 32, 32, 3) float32 images, 10 classes.

    Each class has a smooth random template; an image is its class's template shifted
    by up to ±6 pixels, plus another class's template at a random shift and weight in
    [0, 0.9], times a random contrast in [0.5, 1.5], plus Gaussian noise of `noise`.
    """
    templates = np.random.default_rng(1234).normal(size=(10, 8, 8, 3)).astype("float32")
    templates = tf.image.resize(templates, (32, 32), method="bicubic").numpy()
    templates /= templates.std(axis=(1, 2, 3), keepdims=True)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, n).astype("int32")
    other = (y + rng.integers(1, 10, n)) % 10
    shifts, distractor_shifts = rng.integers(-6, 7, (n, 2)), rng.integers(-16, 17, (n, 2))
    mix = rng.uniform(0.0, 0.9, (n, 1, 1)).astype("float32")
    contrast = rng.uniform(0.5, 1.5, (n, 1, 1, 1)).astype("float32")
    x = np.empty((n, 32, 32, 3), np.float32)
    for i in range(n):
        x[i] = np.roll(templates[y[i]], tuple(shifts[i]), axis=(0, 1))
        x[i] += mix[i] * np.roll(templates[other[i]], tuple(distractor_shifts[i]), axis=(0, 1))
    x *= contrast
    x += noise * rng.standard_normal(x.shape, dtype=np.float32)
    return x, y


def small_cnn():
    """A CNN small enough for 50,000 examples × 10 epochs on a 2-core CPU (not a ResNet)."""
    return keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="small_cnn",
    )


def cifar_job(quick: bool) -> dict:
    """A CIFAR-shaped job: 50,000 synthetic 32×32×3 examples × 10 epochs, batch 32, Adam 1e-3."""
    n, epochs = (2_000, 2) if quick else (50_000, 10)
    return {
        "name": "cifar_shaped",
        "data": cifar_like(n, seed=0),
        "held_out": cifar_like(500 if quick else 5_000, seed=1),
        "held_out_name": "5,000 more synthetic examples",
        "build": small_cnn,
        "batch_size": 32,
        "learning_rate": 1e-3,
        "epochs": epochs,
        "model": "small CNN (16/32/64 filters, stride-2 stem)",
    }


def cifar_mlp():
    """An MLP on the flattened images: its steps are short, so a larger batch runs faster."""
    return keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Flatten(),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="cifar_mlp",
    )


def cifar_mlp_job(quick: bool) -> dict:
    """The CIFAR-shaped data with an MLP: 50,000 examples × 10 epochs, batch 32, Adam 1e-3.

    On this CPU the small CNN's examples/s barely grows with the batch (3.9k at 32, 4.8k
    at 512); the MLP's does (7.9k at 32, 17k at 128, 28k at 512): the CPU's stand-in for a
    GPU that a small batch leaves idle.
    """
    job = cifar_job(quick)
    job.update(name="cifar_shaped_mlp", build=cifar_mlp, model="MLP (3,072-256-10)")
    return job


class _Curve(keras.callbacks.Callback):
    """Held-out accuracy every `every` steps against training seconds (evaluation excluded)."""

    def __init__(self, every: int, held_out, batch: int = 1000):
        super().__init__()
        self.every, self.batch = every, batch
        self.x, self.y = held_out
        self.points: list[tuple[float, float]] = []
        self.paused = 0.0
        self.step = 0

    def on_train_begin(self, logs=None):
        self.began = time.perf_counter()
        predict = self.model.__call__

        @tf.function(reduce_retracing=True)
        def correct(x, y):
            guess = tf.argmax(predict(x, training=False), axis=-1, output_type=tf.int32)
            return tf.reduce_sum(tf.cast(guess == y, tf.int32))

        self.correct = correct

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.step % self.every:
            return
        float(logs["loss"])  # host sync: the step has finished
        seconds = time.perf_counter() - self.began - self.paused
        paused = time.perf_counter()
        right = sum(
            int(self.correct(self.x[i : i + self.batch], self.y[i : i + self.batch]))
            for i in range(0, len(self.y), self.batch)
        )
        self.points.append((seconds, right / len(self.y)))
        self.paused += time.perf_counter() - paused


def train(job: dict, batch: int, learning_rate: float, with_methods=()) -> dict:
    """Trains the job at `batch` (with the recommendation's `methods`, e.g. its one-cycle,
    through `tfaccel.methods.for_fit`); returns its accuracy curve and seconds."""
    x, y = job["data"]
    keras.utils.set_random_seed(0)
    model = job["build"]()
    steps = len(y) // batch
    data = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(len(y), seed=0)
        .batch(batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    optimizer, loss, callbacks = keras.optimizers.Adam(learning_rate), SCE, []
    if with_methods:
        plan = tfaccel.methods.for_fit(
            list(with_methods), model, data, epochs=job["epochs"], loss=loss, optimizer=optimizer
        )
        data, optimizer, loss, callbacks = plan.dataset, plan.optimizer, plan.loss, plan.callbacks
    model.compile(optimizer, loss)
    curve = _Curve(max(1, steps // EVALS_PER_EPOCH), job["held_out"])
    model.fit(data, epochs=job["epochs"], callbacks=[*callbacks, curve], shuffle=False, verbose=0)
    return {
        "batch_size": batch,
        "learning_rate": learning_rate,
        "methods": [method.name for method in with_methods],
        "curve": curve.points,
        "train_seconds": curve.points[-1][0],
        "final_accuracy": curve.points[-1][1],
    }


def time_to(curve: list, accuracy: float) -> float | None:
    """The first training second at which the curve reaches `accuracy` (None: never)."""
    return next((seconds for seconds, value in curve if value >= accuracy), None)


def run_job(job: dict) -> dict:
    """Probe, train both ways, compare; returns the job's results."""
    x, y = job["data"]
    examples, epochs = len(y), job["epochs"]
    keras.utils.set_random_seed(0)
    began = time.perf_counter()
    users = {"batch_size": job["batch_size"], "learning_rate": job["learning_rate"]}
    choice = tfaccel.tuning.before_probing(**users, optimizer="adam", examples=examples)
    report = None
    if choice is None:  # room above the job's batch: probe from it upwards
        report = tfaccel.tuning.find_batch_size(
            job["build"],
            (x, y),
            loss=SCE,
            optimizer=keras.optimizers.Adam(job["learning_rate"]),
            start=job["batch_size"],
            job_examples=epochs * examples,
        )
        print(report.table())
        choice = tfaccel.tuning.recommend(report, **users, optimizer="adam")
    probe_seconds = time.perf_counter() - began
    print(f"{job['name']}: {'left at its batch: ' if choice.kept else ''}{choice.reason}")
    tfaccel.tuning.release_memory()
    default = train(job, job["batch_size"], job["learning_rate"])
    tuned = (
        default
        if choice.kept
        else train(job, choice.batch_size, choice.learning_rate, choice.methods)
    )
    tuned_kind = "no probe: the data decides" if report is None else "probed"
    target = default["final_accuracy"]
    default_time, tuned_time = time_to(default["curve"], target), time_to(tuned["curve"], target)
    knee_run = None
    knee = None if report is None else report.limits.get("throughput knee")
    if choice.kept and knee and knee > job["batch_size"]:
        # Kept against the knee's examples/s: was that right? Train at the knee too.
        rate = tfaccel.tuning.scaled_learning_rate(
            knee,
            base_batch_size=job["batch_size"],
            base_learning_rate=job["learning_rate"],
            lr_scaling=choice.rule,  # the tuned run's rule (Adam: square root)
        )
        knee_run = train(job, knee, rate)
        knee_time = time_to(knee_run["curve"], target)
        knee_run["time_to_default_accuracy_ratio"] = (
            None if knee_time is None else knee_time / default_time
        )
    result = {
        "model": job["model"],
        "examples": examples,
        "epochs": epochs,
        "held_out": f"{job['held_out_name']} ({len(job['held_out'][1])} examples)",
        "left_at_its_batch": choice.kept,
        "reason": choice.reason,
        "tuned_by": tuned_kind,
        "limits": None if report is None else report.to_dict()["limits"],
        "decided_by": "data" if report is None else report.decided_by,
        "noise_scale_note": None if report is None else report.noise_scale_note,
        "probe_seconds": probe_seconds,
        "default": default,
        "tuned": tuned,
        "knee_alone": knee_run,
        "accuracy_tuned_minus_default": tuned["final_accuracy"] - target,
        "time_to_default_accuracy_ratio": (
            None if tuned_time is None else tuned_time / default_time
        ),
        "probe_over_tuned_training": probe_seconds / tuned["train_seconds"],
        "report": None if report is None else report.to_dict(),
    }
    result["targets"] = {
        "tuned accuracy >= default - 0.01": result["accuracy_tuned_minus_default"] >= -0.01,
        "probe <= 10 % of the tuned training": result["probe_over_tuned_training"] <= 0.10,
    }
    if knee_run is not None:
        ratio = knee_run["time_to_default_accuracy_ratio"]
        result["targets"]["kept its batch: the knee's reaches the accuracy no sooner"] = (
            ratio is None or ratio >= 1.0
        )
    return result


def plot(jobs: dict, path: pathlib.Path) -> None:
    """Held-out accuracy against training seconds, default and tuned, one panel per job."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5 * len(jobs), 4), dpi=100)
    FigureCanvasAgg(figure)
    for index, (name, job) in enumerate(jobs.items(), start=1):
        axes = figure.add_subplot(1, len(jobs), index)
        for key, style in (("default", "o-"), ("tuned", "s--"), ("knee_alone", "^:")):
            run = job.get(key)
            if run is None:
                continue
            seconds, accuracy = zip(*run["curve"], strict=True)
            label = f"{key}: batch {run['batch_size']}, lr {run['learning_rate']:.2g}"
            label += "".join(f" + {name}" for name in run.get("methods", []))
            if key == "tuned" and job["left_at_its_batch"]:
                label = "tuned: left at its batch"
            if key == "knee_alone":
                label = f"throughput knee alone: batch {run['batch_size']} (not chosen)"
            axes.plot(seconds, accuracy, style, markersize=3, label=label)
        axes.axhline(job["default"]["final_accuracy"], color="grey", linestyle=":", linewidth=1)
        ratio = job["time_to_default_accuracy_ratio"]
        shown = "never" if ratio is None else f"{ratio:.2f}"
        axes.set_title(f"{name}: time to default's accuracy, tuned/default {shown}", fontsize=9)
        axes.set_xlabel("training seconds (evaluation excluded)")
        axes.set_ylabel("held-out accuracy")
        axes.legend(fontsize="small", loc="lower right")
    figure.tight_layout()
    figure.savefig(path, format="png")
