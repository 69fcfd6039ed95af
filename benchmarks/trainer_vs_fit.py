"""Trainer vs model.fit: examples/s on an overhead-bound MLP and a compute-bound ResNet.

In one process, alternating contenders round by round after a warm-up round, each
timed over whole `fit` calls of a fixed number of steps (the step count is read back
on the host, so the clock stops after the work). Reports medians and ratios, plus the
MLP's achieved FLOP/s as a fraction of this machine's matmul peak in the fastest
precision it offers (`precision.candidates`: float32 alone on a CPU without bf16/fp16 instructions).

A second part times the Trainer alone at fixed `steps_per_loop` n ∈ {1, 10, 100, 1000}
against `steps_per_loop="auto"` (measured on the warm-up call), in two phases. A screen
runs all five round by round and names the best fixed n (by median). Then the verdict:
"auto" and that n alone, in pairs whose order alternates, and the median of the paired
ratios (with a bootstrap 90 % interval) is examples/s with "auto" ÷ the best fixed n
(target ≥ 0.97). The contenders differ by a few percent while one call on this 2-core host
jitters by 5–30 %, so the verdict spends its calls on the one comparison that matters.
Each timed call runs a whole number of steps (MLP 1000, ResNet 24): a fixed n above it is
clipped to it, as `fit` clips n to the epoch.

Run: `python benchmarks/trainer_vs_fit.py [--quick] [--only steps_per_loop] [--loop-rounds N]
[--loop-pairs P]`;
writes `benchmarks/results/trainer_vs_fit.json` (`--only` replaces that part of it alone).
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import statistics
import time

import keras
import numpy as np
import tensorflow as tf

import tfaccel
from tfaccel import strict_json
from tfaccel.callbacks.peak import best_matmul_peak

RESULTS = pathlib.Path(__file__).parent / "results" / "trainer_vs_fit.json"


def mlp_workload():
    x = np.random.default_rng(0).random((8192, 784), dtype=np.float32)
    y = np.random.default_rng(1).integers(0, 10, 8192).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(256, drop_remainder=True)

    def build():
        return tfaccel.models.mlp(input_shape=(784,), hidden=(256,), num_classes=10)

    flops_per_example = 6 * (784 * 256 + 256 * 10)  # forward + backward ≈ 3 × forward
    return build, data.prefetch(tf.data.AUTOTUNE), 256, flops_per_example


def resnet_workload():
    x = np.random.default_rng(0).random((1024, 32, 32, 3), dtype=np.float32)
    y = np.random.default_rng(1).integers(0, 10, 1024).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(128, drop_remainder=True)

    def build():
        return tfaccel.models.resnet(
            18, input_shape=(32, 32, 3), num_classes=10, stem="cifar", width=8
        )

    return build, data.prefetch(tf.data.AUTOTUNE), 128, None


def contenders(build, steps_per_execution=(1, 8, 32)):
    """Returns {name: fit(steps) callable}, each over its own freshly built model."""
    runs = {}
    for spe in steps_per_execution:
        keras.utils.set_random_seed(0)
        model = build()
        model.compile(
            keras.optimizers.SGD(0.01),
            "sparse_categorical_crossentropy",
            steps_per_execution=spe,
            jit_compile=bool(tf.config.list_logical_devices("GPU")) and "auto",
        )
        runs[f"fit_spe{spe}"] = lambda d, s, m=model: m.fit(
            d, epochs=1, steps_per_epoch=s, verbose=0
        )
    keras.utils.set_random_seed(0)
    trainer = tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.SGD(0.01),
        loss="sparse_categorical_crossentropy",
    )
    runs["trainer"] = lambda d, s: trainer.fit(d, epochs=1, steps_per_epoch=s, verbose=0)
    return runs


def measure(runs: dict, data, steps: int, rounds: int, warm_up: bool = True) -> dict:
    """Seconds per timed call, per contender, round by round (after a warm-up call each).

    Each round runs the contenders in turn; odd rounds in the reverse order, so that no
    contender always follows the same one.
    """
    if warm_up:
        for run in runs.values():  # tracing and first-step costs
            run(data, steps)
    times = {name: [] for name in runs}
    for round_ in range(rounds):
        for name in list(runs)[:: -1 if round_ % 2 else 1]:
            gc.collect()  # a collection pause lands on whoever triggers it: take it out
            start = time.perf_counter()
            runs[name](data, steps)
            times[name].append(time.perf_counter() - start)
    return times


def summarise(times: dict, examples_per_call: int) -> dict:
    """Median examples/s, and ratios both of medians and paired within each round.

    Paired ratios compare contenders timed moments apart, so they resist this
    machine's drifting speed better than ratios of medians.
    """
    rates = {name: examples_per_call / statistics.median(t) for name, t in times.items()}
    fits = [name for name in times if name.startswith("fit_")]
    best = max(fits, key=rates.get)
    trainer = times["trainer"]
    paired_spe1 = [f / t for f, t in zip(times["fit_spe1"], trainer, strict=True)]
    paired_best = [min(times[name][i] for name in fits) / t for i, t in enumerate(trainer)]
    return {
        "examples_per_s": rates,
        "fit_best": best,
        "trainer_over_fit_spe1": rates["trainer"] / rates["fit_spe1"],
        "trainer_over_fit_best": rates["trainer"] / rates[best],
        "paired_trainer_over_fit_spe1": statistics.median(paired_spe1),
        "paired_trainer_over_fit_best": statistics.median(paired_best),
    }


FIXED_STEPS_PER_LOOP = (1, 10, 100, 1000)


def loop_size_contenders(build):
    """Returns ({name: fit(steps) callable}, the "auto" Trainer): Trainers differing in n."""
    runs, auto = {}, None
    for n in (*FIXED_STEPS_PER_LOOP, "auto"):
        keras.utils.set_random_seed(0)
        trainer = tfaccel.Trainer(
            build,
            optimizer=lambda: keras.optimizers.SGD(0.01),
            loss="sparse_categorical_crossentropy",
            steps_per_loop=n,
        )
        runs[f"n={n}"] = lambda d, s, t=trainer: t.fit(d, epochs=1, steps_per_epoch=s, verbose=0)
        auto = trainer
    return runs, auto


def bootstrap_median(values: list, level: float = 0.9, draws: int = 2000) -> list:
    """A percentile bootstrap interval of the median of `values` (seeded: reproducible)."""
    rng = np.random.default_rng(0)
    medians = np.median(rng.choice(values, size=(draws, len(values))), axis=1)
    tail = (1.0 - level) / 2
    return [float(np.quantile(medians, tail)), float(np.quantile(medians, 1.0 - tail))]


def summarise_loop_size(screen: dict, verdict: dict, examples_per_call: int, auto) -> dict:
    rates = {name: examples_per_call / statistics.median(t) for name, t in screen.items()}
    fixed = [f"n={n}" for n in FIXED_STEPS_PER_LOOP]
    best = max(fixed, key=rates.get)
    # Paired call by call against the best fixed n of the screen (chosen by median): a
    # per-round minimum over four fixed contenders would be biased towards them.
    paired = [b / t for b, t in zip(verdict[best], verdict["n=auto"], strict=True)]
    sizer = auto._loop_sizer
    return {
        "screen_examples_per_s": rates,
        "best_fixed": best,
        "screen_auto_over_best_fixed": rates["n=auto"] / rates[best],
        "paired_auto_over_best_fixed": statistics.median(paired),
        "paired_interval_90": bootstrap_median(paired),
        "pairs": len(paired),
        "auto_chose": sizer.chosen,
        "auto_overhead_ms": sizer.overhead_s * 1e3,
        "auto_step_ms": sizer.step_s * 1e3,
        "auto_setting": auto.settings["steps_per_loop"],
        "screen_seconds_per_call": screen,
        "verdict_seconds_per_call": verdict,
    }


def steps_per_loop_part(quick: bool, rounds: int | None = None, pairs: int | None = None):
    rounds = rounds or (2 if quick else 5)
    pairs = pairs or (3 if quick else 15)
    part = {}
    for name, workload, steps in (
        ("mlp", mlp_workload, 200 if quick else 1000),
        ("resnet", resnet_workload, 8 if quick else 24),
    ):
        build, data, batch, _ = workload()
        runs, auto = loop_size_contenders(build)
        screen = measure(runs, data, steps, rounds)
        seconds = {n: statistics.median(t) for n, t in screen.items() if n != "n=auto"}
        best = min(seconds, key=seconds.get)  # the fastest fixed n of the screen
        verdict = measure({k: runs[k] for k in (best, "n=auto")}, data, steps, pairs, False)
        part[name] = summarise_loop_size(screen, verdict, batch * steps, auto)
        part[name]["steps_per_call"] = steps
        print(name, strict_json.dumps(part[name], indent=2))
    part["targets"] = {
        f"{name}_auto_over_best_fixed >= 0.97": part[name]["paired_auto_over_best_fixed"] >= 0.97
        for name in ("mlp", "resnet")
    }
    return part


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    parser.add_argument("--only", choices=["steps_per_loop"], help="run this part alone")
    parser.add_argument("--loop-rounds", type=int, help="steps-per-loop screen rounds (5)")
    parser.add_argument("--loop-pairs", type=int, help="steps-per-loop verdict pairs (15)")
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else 15
    if args.only == "steps_per_loop":
        results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        results["steps_per_loop"] = steps_per_loop_part(
            args.quick, args.loop_rounds, args.loop_pairs
        )
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(strict_json.dumps(results, indent=2))
        return results

    peak, peak_policy = best_matmul_peak(tfaccel.precision.candidates()[0])
    results = {"device": tfaccel.devices.describe()["logical_devices"][0]["name"]}

    build, data, batch, flops = mlp_workload()
    steps = 32 if args.quick else 96
    mlp = summarise(measure(contenders(build), data, steps, rounds), batch * steps)
    mlp["trainer_flops"] = mlp["examples_per_s"]["trainer"] * flops
    mlp["fraction_of_matmul_peak"] = mlp["trainer_flops"] / peak
    results["mlp"] = mlp

    build, data, batch, _ = resnet_workload()
    steps = 4 if args.quick else 8
    results["resnet"] = summarise(measure(contenders(build), data, steps, rounds), batch * steps)
    results["matmul_peak_flops"] = peak
    results["matmul_peak_policy"] = peak_policy
    results["targets"] = {
        "mlp_trainer_over_fit_spe1 >= 1.4": results["mlp"]["paired_trainer_over_fit_spe1"] >= 1.4,
        "mlp_trainer_over_fit_best >= 1.0": results["mlp"]["paired_trainer_over_fit_best"] >= 1.0,
        "resnet_trainer_over_fit_best >= 1.0": results["resnet"]["paired_trainer_over_fit_best"]
        >= 1.0,
        "mlp_fraction_of_peak >= 0.85": results["mlp"]["fraction_of_matmul_peak"] >= 0.85,
    }
    results["steps_per_loop"] = steps_per_loop_part(args.quick, args.loop_rounds, args.loop_pairs)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(strict_json.dumps(results, indent=2))
    print(strict_json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
