"""How far one range test's suggestion moves with the seed, beside what a rate's error costs.

`benchmarks/learning_rate.py` reads each job's finder from one ramp (weights and data
order from seed 0). This runs the same ramp (100 steps, 1e-6 to 1) six times a job: four
data orders from the same weights, two more initialisations, and records each suggestion
and the rate at the smoothed loss minimum. Beside it, from the stored sweep
(`results/learning_rate.json`), what a rate off by a factor of about 3 costs: each swept
rate's median time to the target over the best rate's.

The CIFAR-shaped CNN learns too little in 100 steps for any suggestion (`learning_rate.py`
declines it), so it is also read with a ramp of 781 steps (5 % of a 500,000-example job at
batch 32, the size of `batch_size_jobs.py`'s CNN job) and its suggestion trained from three
seeds on the benchmark's job: final held-out accuracy against the sweep's target (no
timing in this script: its figures do not depend on how busy the host is).

Writes `benchmarks/results/learning_rate_spread.json`.
Run: `python benchmarks/learning_rate_spread.py [--quick]` (`--quick`: a check only).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

import tfaccel
from tfaccel import strict_json

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import learning_rate as lr_bench  # noqa: E402  (the four jobs, their sweep)

RESULTS = pathlib.Path(__file__).parent / "results"
SEEDS = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (2, 0)]  # (weights, data order)
LONG_RAMP = 781  # 5 % of 500,000 examples at batch 32


def ramp(job: dict, steps: int, weights: int, order: int) -> dict:
    report = tfaccel.tuning.find_learning_rate(
        lr_bench.compiled(job, 1e-3, weights),
        lr_bench.batches(job, repeat=True, seed=order),
        num_steps=steps,
        min_lr=1e-6,
        max_lr=1.0,
    )
    return {
        "weights_seed": weights,
        "data_seed": order,
        "suggestion": report.suggestion,
        "minimum_rate": report.minimum_rate,
        "reason": report.reason,
    }


def spread(ramps: list[dict]) -> dict:
    rates = [r["suggestion"] for r in ramps if r["suggestion"] is not None]
    return {
        "suggested": len(rates),
        "low": min(rates, default=None),
        "high": max(rates, default=None),
        "high_over_low": max(rates) / min(rates) if rates else None,
        "geometric_median": float(np.exp(np.median(np.log(rates)))) if rates else None,
    }


def cost_of_error(stored: dict) -> dict:
    """Each swept rate's median time to the target ÷ the best rate's (None: never)."""
    best = stored["best_time"]
    return {
        f"{run['learning_rate']:g}": (
            None if run["time_to_target"] is None else run["time_to_target"] / best
        )
        for run in stored["sweep"]
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small data, short ramps: a check")
    args = parser.parse_args(argv)
    tfaccel.devices.configure()
    table = lr_bench.jobs(args.quick)
    steps, long_ramp = (30, 60) if args.quick else (100, LONG_RAMP)
    stored = json.loads((RESULTS / "learning_rate.json").read_text())["jobs"]
    out = {"ran_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "quick": args.quick}
    jobs = {}
    for name, job in table.items():
        ramps = [ramp(job, steps, w, d) for w, d in SEEDS]
        jobs[name] = {
            "ramp_steps": steps,
            "ramps": ramps,
            "spread": spread(ramps),
            "best_rate": stored[name]["best_rate"],
            "time_over_best": cost_of_error(stored[name]),
        }
        print(name, jobs[name]["spread"], flush=True)
    cnn = table["cifar_cnn"]
    ramps = [ramp(cnn, long_ramp, w, d) for w, d in SEEDS[:3]]
    picked = spread(ramps)["geometric_median"]
    finals = []
    if picked is not None:
        finals = [lr_bench.train(cnn, picked, seed)["final"] for seed in (0, 1, 2)]
    jobs["cifar_cnn"]["long_ramp"] = {
        "ramp_steps": long_ramp,
        "ramps": ramps,
        "spread": spread(ramps),
        "trained_at": picked,
        "finals": finals,
        "target": stored["cifar_cnn"]["target"],
        "reached_target": [f >= stored["cifar_cnn"]["target"] for f in finals],
    }
    print("cifar_cnn, long ramp:", jobs["cifar_cnn"]["long_ramp"], flush=True)
    out["jobs"] = jobs
    stem = "learning_rate_spread.quick" if args.quick else "learning_rate_spread"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(strict_json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
