"""The learning-rate finder against an exhaustive sweep of fixed rates, on four jobs.

For each job (the digits MLP, the CIFAR-shaped CNN, a regression MLP on house-price-like
data, the digits ResNet) this trains the job at `RATES` (six or more fixed Adam rates,
from the same seed) and finds the best rate: the one whose held-out score reaches the
target soonest (the target: within `TARGET_SLACK` of the best final score of the sweep;
accuracy for the classifiers, minus the mean squared error for the regression). Then it
runs `tfaccel.tuning.find_learning_rate` once at the job's batch and reads two rules from
the same curve: tfaccel's suggestion and the steepest-descent rule of the kind Lightning
uses (`lr_rule.steepest`); it trains the job at each and times it to the same target.
A second, sized reading tells the finder the job's size (`job_examples`: epochs × training
examples) and records its decision (`sized`: the ramp's steps and suggestion, or why it
did not pay) beside the full-ramp reading that the rate comparison uses.

Times: the clock starts at the end of each run's first step (its tracing, the same at
every rate, took 0.6–1.6 s on the digits MLP from run to run: more than the rest of that
job), and held-out scores are read `EVALS_PER_EPOCH` times an epoch with the clock
paused. One run's time to the target varied up to 3× with the seed (the digits ResNet), so
every rate (the sweep's, the finder's, the steepest rule's) is trained from each of
`SEEDS` (weights and shuffle order; seed 0 runs the whole job, the others stop at the
target) and counts by its median time; the best rate is the one with the least median. A
rate whose seed-0 run never reaches the target in the whole job counts as never (its
other seeds are not run).

Targets (issue 55, re-scoped from issue 41's measurements): on each job the finder told
the job's size (the `sized` reading, as `tune` runs it) either declines with its reason,
or its pick reaches the target in at most 1.5× the best fixed rate's time (median of the
five seeds); the finder's rule is no worse than the steepest-descent rule on any job and
better on at least one (both read from the same full ramp; a bootstrap 90 % interval of
their ratio); where it runs, the finder costs at most 5 % of the job (its seconds over
the best run's training seconds, its first step included). `verdicts` sums them up.

Each pick's ratio comes with a bootstrap 90 % interval over the seeds (`ratio_interval`;
`--intervals` adds them to stored results without training).

Writes `benchmarks/results/learning_rate.json` and `learning_rate.png` (each job's
finder curve with the two picks and the sweep's best rate; `--quick`: `.quick.` files).

Run: `python benchmarks/learning_rate.py [--quick] [--jobs digits_mlp cifar_cnn ...]`.
`--quick` checks the script (small data, one epoch, short ramps); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import tfaccel
from tfaccel import strict_json
from tfaccel.tuning.lr import rule as lr_rule
from tfaccel.tuning.lr import sizing as lr_sizing

sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "recipes"))

import batch_size_jobs  # noqa: E402  (the CIFAR-shaped data and CNN)
import digits  # noqa: E402  (recipes/digits.py: the digits data and ResNet)

RESULTS = pathlib.Path(__file__).parent / "results"
RATES = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2]
EVALS_PER_EPOCH = 4
SEEDS = (0, 1, 2, 3, 4)  # each rate's runs; their median time to the target counts
TARGET_SLACK = {"accuracy": 0.02, "neg_mse": 0.10}  # of the best final score


def digits_mlp():
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="digits_mlp",
    )


def house_like(n: int, seed: int, features: int = 40):
    """House-price-like regression: log price from a few strong and many weak features."""
    rng = np.random.default_rng(seed)
    w = np.random.default_rng(99).normal(size=features).astype("float32")
    w[8:] *= 0.1
    x = rng.normal(size=(n, features)).astype("float32")
    y = 12.0 + 0.3 * np.tanh(x @ w / 3) + 0.05 * (x[:, 0] * x[:, 1]) + 0.05 * rng.normal(size=n)
    return x, y.astype("float32")[:, None]


def house_mlp(features: int = 40):
    inputs = keras.Input((features,))
    x = keras.layers.Dense(128, activation="relu")(inputs)
    x = keras.layers.Dense(64, activation="relu")(x)
    out = keras.layers.Dense(1, bias_initializer=keras.initializers.Constant(12.0))(x)
    return keras.Model(inputs, out, name="house_mlp")


def jobs(quick: bool) -> dict:
    """The four jobs: data, held-out data, model, loss, batch, epochs, score."""
    (x, y), _, held = digits.load(0)
    sce = "sparse_categorical_crossentropy"
    n_cifar, cifar_epochs = (1_000, 1) if quick else (20_000, 5)
    n_house = 2_000 if quick else 20_000
    common = {"loss": sce, "score": "accuracy"}
    return {
        "digits_mlp": {
            **common,
            "data": (x, y),
            "held_out": held,
            "build": digits_mlp,
            "batch_size": 64,
            "epochs": 2 if quick else 15,
        },
        "cifar_cnn": {
            **common,
            "data": batch_size_jobs.cifar_like(n_cifar, seed=0),
            "held_out": batch_size_jobs.cifar_like(500 if quick else 2_000, seed=1),
            "build": batch_size_jobs.small_cnn,
            "batch_size": 32,
            "epochs": cifar_epochs,
        },
        "house_mlp": {
            "loss": "mse",
            "score": "neg_mse",
            "data": house_like(n_house, 0),
            "held_out": house_like(1_000, 1),
            "build": house_mlp,
            "batch_size": 32,
            "epochs": 2 if quick else 20,
        },
        "digits_resnet": {
            **common,
            "data": (x, y),
            "held_out": held,
            "build": digits.build_model,
            "batch_size": 64,
            "epochs": 1 if quick else 15,
        },
    }


class Curve(keras.callbacks.Callback):
    """Held-out score every `every` steps against training seconds.

    The clock starts at the end of the first step (its tracing is not the rate's) and
    pauses while scoring; `stop_at` ends the fit once the score reaches it.
    """

    def __init__(self, every: int, held_out, score: str, stop_at: float | None = None):
        super().__init__()
        self.every, (self.x, self.y), self.kind = every, held_out, score
        self.stop_at = stop_at
        self.points: list[tuple[float, float]] = []
        self.paused = self.step = 0
        self.first_step = 0.0

    def on_train_begin(self, logs=None):
        self.began = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.step == 1:
            float(logs["loss"])  # host sync: the first step (and its trace) has finished
            now = time.perf_counter()
            self.first_step, self.began = now - self.began, now
        if self.step % self.every:
            return
        float(logs["loss"])
        seconds = time.perf_counter() - self.began - self.paused
        paused = time.perf_counter()
        guess = self.model.predict(self.x, batch_size=1000, verbose=0)
        if self.kind == "accuracy":
            value = float(np.mean(np.argmax(guess, axis=-1) == self.y))
        else:
            value = -float(np.mean((guess - self.y) ** 2))
        value = value if math.isfinite(value) else None
        self.points.append((seconds, value))
        self.paused += time.perf_counter() - paused
        if self.stop_at is not None and value is not None and value >= self.stop_at:
            self.model.stop_training = True


def compiled(job: dict, rate: float, seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = job["build"]()
    model.compile(keras.optimizers.Adam(rate), job["loss"])
    return model


def batches(job: dict, repeat: bool = False, seed: int = 0) -> tf.data.Dataset:
    x, y = job["data"]
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(y), seed=seed)
    data = data.repeat() if repeat else data
    return data.batch(job["batch_size"], drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def train(job: dict, rate: float, seed: int = 0, stop_at: float | None = None) -> dict:
    """Trains the job at `rate` from `seed`; returns its held-out curve."""
    model = compiled(job, rate, seed)
    steps = len(job["data"][1]) // job["batch_size"]
    curve = Curve(max(1, steps // EVALS_PER_EPOCH), job["held_out"], job["score"], stop_at)
    model.fit(
        batches(job, seed=seed), epochs=job["epochs"], callbacks=[curve], shuffle=False, verbose=0
    )
    return {
        "learning_rate": rate,
        "curve": curve.points,
        "final": curve.points[-1][1],
        "first_step": curve.first_step,
        "seconds": curve.first_step + curve.points[-1][0],
    }


def seeded_times(job: dict, first: dict, target: float) -> list[float | None]:
    """Time to `target` from each of `SEEDS`: `first` is seed 0's run, the rest stop there.

    A rate whose seed-0 run never reaches the target is not run again: [None].
    """
    rate = first["learning_rate"]
    if time_to(first["curve"], target) is None:
        return [None]
    runs = [first] + [train(job, rate, seed, stop_at=target) for seed in SEEDS[1:]]
    return [time_to(run["curve"], target) for run in runs]


def median_time(times: list[float | None]) -> float | None:
    """The median of the times, a run that never reached the target counting as last."""
    return sorted(times, key=lambda t: math.inf if t is None else t)[len(times) // 2]


def _soonest(run: dict) -> tuple[float, float]:
    """A run's order by its median time to the target, then by seed 0's."""
    median, first = run["time_to_target"], run["times"][0]
    return (math.inf if median is None else median, math.inf if first is None else first)


def time_to(curve: list, target: float) -> float | None:
    """The first training second at which the curve reaches `target` (None: never)."""
    return next((t for t, value in curve if value is not None and value >= target), None)


def run_job(name: str, job: dict, quick: bool) -> dict:
    sweep = [train(job, rate) for rate in RATES]
    best_final = max(run["final"] for run in sweep if run["final"] is not None)
    target = best_final - TARGET_SLACK[job["score"]] * abs(best_final)
    for run in sweep:
        run["times"] = seeded_times(job, run, target)
        run["time_to_target"] = median_time(run["times"])
    best = min(sweep, key=_soonest)  # seed 0 breaks ties: a quick run's medians may be never
    best_times, best_time = best["times"], best["time_to_target"]
    model = compiled(job, 1e-3)
    report = tfaccel.tuning.find_learning_rate(
        model, batches(job, repeat=True), num_steps=30 if quick else 100, min_lr=1e-6, max_lr=1.0
    )
    sized = sized_reading(job, num_steps=30 if quick else 100)
    picks = {"finder": report.suggestion, "steepest": report.steepest_rate}
    out = {
        "target": target,
        "score": job["score"],
        "epochs": job["epochs"],
        "batch_size": job["batch_size"],
        "sweep": sweep,
        "seeds": list(SEEDS),
        "best_rate": best["learning_rate"],
        "best_times": best_times,
        "best_time": best_time,
        "range_test": report.to_dict(),
        "finder_cost": report.seconds / best["seconds"],
        "sized": {**sized, "cost": sized["seconds"] / best["seconds"]},
    }
    if sized["suggestion"] is not None and sized["suggestion"] != report.suggestion:
        picks["sized_pick"] = sized["suggestion"]  # the sized ramp read its own rate: train it
    for rule, rate in picks.items():
        run = train(job, rate) if rate is not None else None
        times = seeded_times(job, run, target) if run else None
        seconds = median_time(times) if times else None
        out[rule] = {
            "learning_rate": rate,
            "times": times,
            "time_to_target": seconds,
            "ratio": None if seconds is None or best_time is None else seconds / best_time,
            "curve": run["curve"] if run else None,
        }
    print(
        f"{name}: best {best['learning_rate']:.3g} in {_seconds(best_time)}; finder "
        f"{_text(out['finder'])}; steepest {_text(out['steepest'])}; finder cost "
        f"{out['finder_cost']:.1%} of the job; sized to the job: {_sized_text(sized)}"
    )
    return out


def sized_reading(job: dict, num_steps: int) -> dict:
    """The finder told the job's size (`job_examples`): its ramp, or why it did not run."""
    job_examples = job["epochs"] * len(job["data"][1])
    report = tfaccel.tuning.find_learning_rate(
        compiled(job, 1e-3),
        batches(job, repeat=True),
        num_steps=num_steps,
        min_lr=1e-6,
        max_lr=1.0,
        job_examples=job_examples,
    )
    return {
        "job_examples": job_examples,
        "job_steps": job_examples // job["batch_size"],
        "ran": report.stopped != "not run",
        "ramp_steps": report.ramp_steps,
        "steps": report.steps,
        "suggestion": report.suggestion,
        "reason": report.reason,
        "seconds": report.seconds,
    }


def _sized_text(sized: dict) -> str:
    if not sized["ran"]:
        return sized["reason"].split("; keep")[0]
    rate = sized["suggestion"]
    return f"a ramp of {sized['ramp_steps']} steps, " + (
        "no suggestion" if rate is None else f"suggested {rate:.3g}"
    )


def _seconds(median: float | None) -> str:
    return "never (median of the seeds)" if median is None else f"{median:.2f} s"


def _text(pick: dict) -> str:
    rate, ratio = pick["learning_rate"], pick["ratio"]
    if rate is None:
        return "no suggestion"
    return f"{rate:.3g} ({'never reached' if ratio is None else f'{ratio:.2f}x'})"


def ratio_interval(times: list | None, others: list | None, draws: int = 10_000) -> list | None:
    """A bootstrap 90 % interval of median(times) / median(others) (None: a run never got there).

    Five seeds a rate leave wide intervals: a ratio whose interval holds 1 does not tell
    the two rates apart.
    """
    if not times or not others or None in times or None in others:
        return None
    rng = np.random.default_rng(0)

    def medians(x: list) -> np.ndarray:  # of `draws` resamples of x, with replacement
        return np.median(rng.choice(np.asarray(x), (draws, len(x))), axis=1)

    return np.percentile(medians(times) / medians(others), [5, 95]).tolist()


def add_intervals(results: dict) -> None:
    """Each pick's 90 % interval against the best rate and, the finder's, against steepest."""
    for job in results["jobs"].values():
        for rule in ("finder", "steepest", "sized_pick"):
            if rule in job:
                job[rule]["interval"] = ratio_interval(job[rule]["times"], job["best_times"])
        job["finder"]["over_steepest"] = ratio_interval(
            job["finder"]["times"], job["steepest"]["times"]
        )


def _versus(finder: dict, steepest: dict, interval: list | None) -> str:
    """The finder's rule against the steepest rule on one job, from the seeds' times."""
    mine, theirs = finder["time_to_target"], steepest["time_to_target"]
    if finder["learning_rate"] is None and steepest["learning_rate"] is None:
        return "neither suggests"
    if finder["learning_rate"] is None:
        return f"ours suggests none (it declines); the steepest rule's ratio: {steepest['ratio']}"
    if mine is None and theirs is None:
        return "tied (neither reaches the target)"
    if theirs is None:
        return "better (the steepest rule's rate never reaches the target)"
    if mine is None:
        return "worse (ours never reaches the target)"
    if interval is not None and interval[1] < 1:
        return "better (interval below 1)"
    if interval is not None and interval[0] > 1:
        return "worse (interval above 1)"
    return "no worse (interval holds 1)"


def verdicts(results: dict) -> dict:
    """Issue 55's targets per job: the sized finder's decision (declined, or its pick's
    ratio to the best rate), the rules compared, the cost where it runs."""
    out = {}
    for name, job in results["jobs"].items():
        sized, finder = job["sized"], job["finder"]
        pick = job.get("sized_pick") or finder
        declined = sized["suggestion"] is None
        ratio = pick["ratio"] if not declined else None
        out[name] = {
            "decision": "declined: " + sized["reason"] if declined else "picked",
            "pick_ratio": ratio,
            "pick_within_1_5x": declined or (ratio is not None and ratio <= 1.5),
            "finder_over_steepest": finder.get("over_steepest"),
            "versus_steepest": _versus(finder, job["steepest"], finder.get("over_steepest")),
            "cost": sized["cost"],
            "cost_within_5pct": sized["cost"] <= 0.05,
        }
    return out


def plot(results: dict, path: pathlib.Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(results["jobs"])
    figure = Figure(figsize=(5 * len(names), 4))
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(names), squeeze=False)[0]
    for ax, name in zip(axes, names, strict=True):
        job = results["jobs"][name]
        finder = job["range_test"]
        curves = {
            k: [math.nan if v is None else v for v in finder[k]] for k in ("losses", "smoothed")
        }
        report = tfaccel.tuning.LearningRateReport(**{**finder, **curves})
        report.plot(ax=ax)
        ax.axvline(
            job["best_rate"], color="C2", ls="--", label=f"sweep's best {job['best_rate']:.3g}"
        )
        ax.set_title(name)
        ax.legend(fontsize="small")
    figure.savefig(path, dpi=90, bbox_inches="tight")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small data, 1-2 epochs: a check")
    parser.add_argument("--jobs", nargs="*", default=None, help="which jobs (default: all)")
    parser.add_argument(
        "--intervals", action="store_true", help="add the intervals to the stored results only"
    )
    args = parser.parse_args(argv)
    stem = "learning_rate.quick" if args.quick else "learning_rate"
    if args.intervals:  # from the stored per-seed times: nothing is trained
        results = json.loads((RESULTS / f"{stem}.json").read_text())
        add_intervals(results)
        results["verdicts"] = verdicts(results)
        (RESULTS / f"{stem}.json").write_text(strict_json.dumps(results, indent=2))
        return results
    tfaccel.devices.configure()
    table = jobs(args.quick)
    names = args.jobs or list(table)
    results = {
        "ran_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "quick": args.quick,
        "rates": RATES,
        "rule": {
            "below_minimum": lr_rule.BELOW_MINIMUM,
            "keep_slope": lr_rule.KEEP_SLOPE,
            "min_descent": lr_rule.MIN_DESCENT,
            "seen_rise": lr_rule.SEEN_RISE,
            "unseen_below": lr_rule.UNSEEN_BELOW,
            "ramp_share": lr_sizing.RAMP_SHARE,
            "min_ramp": lr_sizing.MIN_RAMP,
        },
        "machine": "a shared, loaded 2-core CPU (4 engineers at once): read the ratios",
        "load_average_1min_at_start": os.getloadavg()[0],
        "jobs": {name: run_job(name, table[name], args.quick) for name in names},
    }
    results["load_average_1min_at_end"] = os.getloadavg()[0]
    add_intervals(results)
    results["verdicts"] = verdicts(results)
    print(json.dumps(results["verdicts"], indent=1))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(strict_json.dumps(results, indent=2))
    plot(results, RESULTS / f"{stem}.png")
    return results


if __name__ == "__main__":
    main()
