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

Writes `benchmarks/results/batch_size_seeds.json` after every run (a stopped run keeps
what finished). Run: `python benchmarks/batch_size_seeds.py [--seeds 3] [--quick]`.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

from tfaccel import strict_json

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import batch_size_growing  # noqa: E402  (train: one model through phases, its curve)
import batch_size_jobs  # noqa: E402  (the CIFAR-shaped job)

RESULTS = pathlib.Path(__file__).parent / "results"
BATCHES = (32, 64, 128)


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
    args = parser.parse_args(argv)
    job = batch_size_jobs.cifar_job(args.quick)
    epochs, rate = job["epochs"], job["learning_rate"]
    stem = "batch_size_seeds.quick" if args.quick else "batch_size_seeds"
    runs: dict[int, list] = {batch: [] for batch in BATCHES}
    out = {"ran_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "quick": args.quick}
    for seed in range(args.seeds):
        for batch in BATCHES:
            phases = [(epochs, batch, rate * (batch / 32) ** 0.5)]
            run = batch_size_growing.train(job, phases, seed=seed)
            runs[batch].append({"seed": seed, **run})
            print(f"seed {seed} batch {batch}: final {run['final_accuracy']:.4f}", flush=True)
            out.update(runs=runs, summary=summarize(runs))
            RESULTS.mkdir(exist_ok=True)
            (RESULTS / f"{stem}.json").write_text(strict_json.dumps(out, indent=2))
    print(out["summary"])
    return out


if __name__ == "__main__":
    main()
