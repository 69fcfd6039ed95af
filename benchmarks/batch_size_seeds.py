"""Fixed batches on the CIFAR-shaped CNN job from several seeds: what a batch choice can win.

`batch_size_jobs.py` judges the batch tuner by one run each of the default and the tuned
batch, timed to the default's final held-out accuracy; on this job the readings near the
end move by ±0.005 between evaluations, more than the runs differ
(`batch_size_growing.py`). This trains the job (`batch_size_jobs.py`'s CNN, 50,000
examples × 10 epochs, Adam) at batches 32 (the default), 64 and 128 (the rate scaled by
the square root of the batch, as the tuner scales it) from `--seeds` seeds each, runs
interleaved by seed, and reads:

- the target: the median over batch 32's runs of its last epoch's mean held-out accuracy
  (four readings), a steadier "default's accuracy" than one reading;
- each run's training seconds to that target (held-out accuracy 4× an epoch, clock paused);
- each batch's median time over batch 32's median, with every run's time beside it.

`--tuned` adds the batch tuner's choice: `tuning.find_batch_size` probes the job once
(from batch 32, the noise scale on, bounded by the job's size; its seconds reported as
its cost, a share of batch 32's training) and `tuning.recommend` answers; each seed
trains at that batch and rate with the recommendation's methods (`tuned`: a grown batch's
one-cycle), or at the batch and rate alone (`tuned_batch`); `cycle` is the control, batch
32 with the same one-cycle (3x Adam's rate). `--default-runs FILE` reuses batch 32's runs
of an earlier file of the same session (the target's). `train_tuned` also grows a batch in stages
(`methods.ProgressiveBatch`, given `grow_to` and `rate_power`): the growth experiments
of `results/batch_size_seeds.growth.json`. Held-out accuracy is read every quarter of
an epoch's examples (a grown batch makes fewer steps).

Writes `benchmarks/results/batch_size_seeds.json` after every run (a stopped run keeps
what finished; `--only` writes `batch_size_seeds.<contenders>.json`, keeping the full run's).
Run: `python benchmarks/batch_size_seeds.py [--seeds 3] [--tuned] [--only 32 tuned] [--quick]`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import tfaccel
from tfaccel import methods, strict_json

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import batch_size_growing  # noqa: E402  (train: one model through phases, its curve)
import batch_size_jobs  # noqa: E402  (the CIFAR-shaped job)

RESULTS = pathlib.Path(__file__).parent / "results"
BATCHES = (32, 64, 128)


class ExampleCurve(batch_size_growing.Curve):
    """Held-out accuracy every `every` examples (not steps), for a batch that grows."""

    def __init__(self, held_out, every: int, batch: int, growth):
        super().__init__(held_out)
        self.every_examples, self.batch, self.growth, self.examples = every, batch, growth, 0

    def on_train_batch_end(self, batch, logs=None):
        before = self.examples // self.every_examples
        self.examples += self.batch * (self.growth.seen[-1] if self.growth else 1)
        if self.examples // self.every_examples > before:
            self.read(logs)


def probe(job: dict) -> dict:
    """The batch tuner on the job, once: its recommendation and its seconds."""
    x, y = job["data"]
    keras.utils.set_random_seed(0)
    began = time.perf_counter()
    report = tfaccel.tuning.find_batch_size(
        job["build"],
        (x, y),
        loss="sparse_categorical_crossentropy",
        optimizer=keras.optimizers.Adam(job["learning_rate"]),
        start=job["batch_size"],
        job_examples=job["epochs"] * len(y),
    )
    choice = tfaccel.tuning.recommend(
        report, batch_size=job["batch_size"], learning_rate=job["learning_rate"], optimizer="adam"
    )
    peaks = [m.peak for m in choice.methods if isinstance(m, methods.OneCycle)]
    seconds = time.perf_counter() - began
    tfaccel.tuning.release_memory()
    print(report.table(), "\n", choice.reason, flush=True)
    return {
        "batch_size": choice.batch_size,
        "learning_rate": choice.learning_rate,
        "grow_to": None,  # the tuner's batch, not grown
        "peak": peaks[0] if peaks else None,  # its one-cycle's peak rate
        "reason": choice.reason,
        "probe_seconds": seconds,
        "limits": report.to_dict()["limits"],
    }


def train_tuned(job: dict, choice: dict, seed: int) -> dict:
    """One seed at the tuner's choice: grown to `grow_to` in stages, or at its batch."""
    x, y = job["data"]
    keras.utils.set_random_seed(seed)
    model = job["build"]()
    batch, epochs = choice["batch_size"], job["epochs"]
    data = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(len(y), seed=1000 * seed)
        .batch(batch, drop_remainder=True)
    )
    power = choice.get("rate_power", 0.5)
    grown = (
        [methods.ProgressiveBatch(final=choice["grow_to"], rate_power=power)]
        if choice["grow_to"]
        else []
    )
    peak = choice.get("peak")  # one-cycle sized to the batch's steps, peaking there
    plan = methods.for_fit(
        grown + ([methods.OneCycle(peak=peak)] if peak else []),
        model,
        data,
        epochs=epochs,
        loss="sparse_categorical_crossentropy",
        optimizer=keras.optimizers.Adam(choice["learning_rate"]),
        kind="image",
    )
    model.compile(plan.optimizer, plan.loss)
    growth = grown[0].callback if grown else None
    every = len(y) // batch_size_growing.EVALS_PER_EPOCH
    curve = ExampleCurve(job["held_out"], every, batch, growth)
    dataset = plan.dataset.prefetch(tf.data.AUTOTUNE)
    model.fit(dataset, epochs=epochs, callbacks=[*plan.callbacks, curve], shuffle=False, verbose=0)
    return {
        "choice": {k: choice.get(k) for k in ("batch_size", "learning_rate", "grow_to", "peak")},
        "stages": list(grown[0].factors) if grown else [1],
        "curve": curve.points,
        "final_accuracy": curve.points[-1][1],
    }


def last_epoch_mean(run: dict) -> float:
    return float(np.mean([v for _, v in run["curve"][-batch_size_growing.EVALS_PER_EPOCH :]]))


def summarize(runs: dict) -> dict:
    """The target from batch 32's runs; each batch's times to it and median ratio."""
    if not runs.get(32):
        return {}
    target = float(np.median([last_epoch_mean(r) for r in runs[32]]))
    out = {"target": target, "batches": {}}
    for batch, done in runs.items():
        if not done:
            continue
        times = [next((t for t, v in r["curve"] if v >= target), None) for r in done]
        ordered = sorted(times, key=lambda t: np.inf if t is None else t)
        out["batches"][batch] = {"times": times, "median": ordered[len(ordered) // 2]}
    base = out["batches"][32]["median"]  # batch 32's median: the denominator
    for row in out["batches"].values():
        row["ratio"] = None if row["median"] is None or base is None else row["median"] / base
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a small job: a check only")
    parser.add_argument("--tuned", action="store_true", help="add the batch tuner's choice")
    parser.add_argument(
        "--only", nargs="*", default=None, help="contenders: 32 64 128 tuned tuned_batch cycle"
    )
    parser.add_argument(
        "--default-runs", default=None, help="a results file whose batch-32 runs to reuse"
    )
    args = parser.parse_args(argv)
    job = batch_size_jobs.cifar_job(args.quick)
    epochs, rate = job["epochs"], job["learning_rate"]
    stem = "batch_size_seeds.quick" if args.quick else "batch_size_seeds"
    contenders: list = list(BATCHES) + (["tuned"] if args.tuned else [])
    if args.only:
        contenders = [int(c) if c.isdigit() else c for c in args.only]
        if 32 not in contenders and not args.default_runs:
            contenders = [32, *contenders]  # the target's runs
        stem += "." + "_".join(str(c) for c in contenders)
    runs: dict = {c: [] for c in contenders}
    if args.default_runs:  # batch 32's runs from an earlier file of the same session
        runs = {32: json.loads(pathlib.Path(args.default_runs).read_text())["runs"]["32"], **runs}
    out = {"ran_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "quick": args.quick}
    if any(str(c).startswith("tuned") for c in contenders):
        out["tuner"] = probe(job)
    for seed in range(args.seeds):
        for batch in contenders:
            if batch == "tuned":  # the recommendation: batch, rate and methods
                run = train_tuned(job, out["tuner"], seed)
            elif batch == "tuned_batch":  # its batch and rate alone
                run = train_tuned(job, {**out["tuner"], "peak": None}, seed)
            elif batch == "cycle":  # the control: batch 32 with the same one-cycle
                default = {"batch_size": 32, "learning_rate": rate, "grow_to": None}
                run = train_tuned(job, {**default, "peak": 3 * rate}, seed)
            else:
                phases = [(epochs, batch, rate * (batch / 32) ** 0.5)]
                run = batch_size_growing.train(job, phases, seed=seed)
            runs[batch].append({"seed": seed, **run})
            print(f"seed {seed} batch {batch}: final {run['final_accuracy']:.4f}", flush=True)
            out.update(runs=runs, summary=summarize(runs))
            RESULTS.mkdir(exist_ok=True)
            (RESULTS / f"{stem}.json").write_text(strict_json.dumps(out, indent=2))
    if "tuner" in out and runs[32]:  # the probe's cost: a share of the default's training
        default_seconds = float(np.median([r["curve"][-1][0] for r in runs[32]]))
        out["tuner"]["probe_over_default_training"] = (
            out["tuner"]["probe_seconds"] / default_seconds
        )
        (RESULTS / f"{stem}.json").write_text(strict_json.dumps(out, indent=2))
    print(out["summary"])
    return out


if __name__ == "__main__":
    main()
