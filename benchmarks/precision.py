"""Precision: examples/s under float32, mixed_bfloat16 and "auto", and time to accuracy.

Part 1, throughput. For an MLP (1024-2048-2048-10, batch 512), a 3-conv CNN (48-96-192 on
32x32x3, batch 64), ResNet-18 at widths 16 and 64 (CIFAR stem, batch 64; width 64 at
batch 32 on 2 steps a fit) and the digits job's tiny ResNet (8x8, batch 64), in one process:
a Trainer per contender ("float32", "mixed_bfloat16" given by hand, and "auto", whose
first fit runs the probe), a warm-up fit each, then alternating rounds of fits of a fixed
number of steps on cached data; the best round counts. Reports examples/s, the ratios
auto ÷ best fixed policy and auto ÷ float32, what "auto" chose and the probe's cost.

Part 2, XLA re-measured: the MLP, the CNN and the digits job under float32 and
mixed_bfloat16, each with and without `jit_compile=True`, in the same alternating way.

Part 3, time to accuracy. On the digits job and a learnable CIFAR-shaped CNN job
(class-dependent patterns plus noise), "auto" and float32 each train the same epochs
from the same seed; reports held-out accuracy and wall time.

The hardware decides what "auto" may try (`tfaccel.precision.candidates`); the forced
`mixed_bfloat16` column tests that rule on this machine: where the CPU has no bf16
instructions, bfloat16 should not be faster.

Run: `python benchmarks/precision.py [--quick]`; writes `benchmarks/results/precision.json`
and `precision.png`.
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
from tfaccel import precision, strict_json

RESULTS = pathlib.Path(__file__).parent / "results" / "precision.json"
FIXED = ("float32", "mixed_bfloat16")
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "recipes"))


def mlp():
    return keras.Sequential(
        [
            keras.Input((1024,)),
            keras.layers.Dense(2048, activation="relu"),
            keras.layers.Dense(2048, activation="relu"),
            keras.layers.Dense(10, dtype="float32"),
        ]
    )


def cnn():
    layers = [keras.Input((32, 32, 3))]
    for filters in (48, 96, 192):
        layers += [
            keras.layers.Conv2D(filters, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
        ]
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10, dtype="float32")]
    return keras.Sequential(layers)


def resnet18(width):
    return lambda: tfaccel.models.resnet(
        18, input_shape=(32, 32, 3), num_classes=10, stem="cifar", width=width
    )


def digits_model():
    import digits  # recipes/digits.py

    return digits.build_model()


JOBS = {  # name: (builder, input shape, batch, steps per timed fit, from_logits)
    "mlp": (mlp, (1024,), 512, 20, True),
    "cnn": (cnn, (32, 32, 3), 64, 20, True),
    "resnet18_w16": (resnet18(16), (32, 32, 3), 64, 8, False),
    "resnet18_w64": (resnet18(64), (32, 32, 3), 32, 2, False),
    "digits": (digits_model, (8, 8, 1), 64, 40, False),
}


def make_trainer(build, policy, from_logits, steps, jit_compile=False):
    return tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits),
        steps_per_loop=steps,
        precision=policy,
        jit_compile=jit_compile,
    )


def alternate(trainers: dict, data, steps, batch, rounds) -> dict:
    """examples/s of each trainer: the best of `rounds` alternating fits of `steps`."""
    best = dict.fromkeys(trainers, float("inf"))
    for r in range(rounds):
        for p in list(trainers) if r % 2 == 0 else list(reversed(trainers)):
            start = time.perf_counter()
            trainers[p].fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
            best[p] = min(best[p], time.perf_counter() - start)
    return {p: batch * steps / s for p, s in best.items()}


def xla(name, rounds) -> dict:
    build, shape, batch, steps, logits = JOBS[name]
    data = synthetic(shape, batch)
    trainers = {
        f"{p}{' + XLA' if jit else ''}": make_trainer(build, p, logits, steps, jit)
        for p in FIXED
        for jit in (False, True)
    }
    for t in trainers.values():
        t.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)  # warm-up: tracing
    rates = alternate(trainers, data, steps, batch, rounds)
    out = {
        "examples_per_s": rates,
        **{f"xla_speedup_{p}": rates[f"{p} + XLA"] / rates[p] for p in FIXED},
    }
    print(name, "xla", json.dumps(out), flush=True)
    return out


def synthetic(shape, batch, examples=None):
    examples = examples or batch * 4
    rng = np.random.default_rng(0)
    x = rng.random((examples, *shape), dtype=np.float32)
    y = rng.integers(0, 10, examples).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).cache().repeat()


def throughput(name, rounds) -> dict:
    build, shape, batch, steps, logits = JOBS[name]
    data = synthetic(shape, batch)
    trainers = {p: make_trainer(build, p, logits, steps) for p in (*FIXED, "auto")}
    began = time.perf_counter()
    trainers["auto"].fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
    auto_first_fit_s = time.perf_counter() - began
    for p in FIXED:
        trainers[p].fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
    rates = alternate(trainers, data, steps, batch, rounds)
    fixed_best = max(FIXED, key=rates.get)
    choice = trainers["auto"].precision_choice
    out = {
        "examples_per_s": rates,
        "auto_chose": choice.policy,
        "auto_reason": choice.reason,
        "auto_probe_s": choice.cost_s,
        "auto_first_fit_s": auto_first_fit_s,
        "best_fixed": fixed_best,
        "auto_over_best_fixed": rates["auto"] / rates[fixed_best],
        "auto_over_float32": rates["auto"] / rates["float32"],
        "bfloat16_over_float32": rates["mixed_bfloat16"] / rates["float32"],
    }
    print(name, json.dumps({k: v for k, v in out.items() if k != "auto_reason"}), flush=True)
    return out


def learnable_cifar(examples, seed):
    """CIFAR-shaped images: the class sets a faint colour cast and the period of a stripe
    pattern, under strong per-pixel noise (the same classes for every seed)."""
    classes = np.random.default_rng(1234)
    colours = classes.random((10, 1, 1, 3), dtype=np.float32)
    periods = 2 + np.arange(10)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, examples).astype(np.int32)
    columns = np.arange(32)[None, None, :, None]
    stripes = np.sin(2 * np.pi * columns / periods[y][:, None, None, None])
    x = 0.2 * colours[y] + 0.2 * stripes + rng.random((examples, 32, 32, 3), dtype=np.float32)
    return x.astype(np.float32), y


def time_to_accuracy(job, epochs) -> dict:
    if job == "digits":
        import digits

        (x, y), _, (xt, yt) = digits.load(0)
        build, logits, batch = digits.build_model, False, 64
    else:
        x, y = learnable_cifar(4096, 0)
        xt, yt = learnable_cifar(1024, 1)
        build, logits, batch = cnn, True, 64
    out = {}
    for policy in ("float32", "auto"):
        keras.utils.set_random_seed(0)
        trainer = make_trainer(build, policy, logits, "auto")
        train = tfaccel.data.pipeline(
            tfaccel.data.from_arrays(x, y), batch_size=batch, training=True, seed=0
        )
        test = tfaccel.data.pipeline(
            tfaccel.data.from_arrays(xt, yt), batch_size=256, training=False
        )
        start = time.perf_counter()
        trainer.fit(train, epochs=epochs, verbose=0)
        seconds = time.perf_counter() - start
        accuracy = keras.metrics.SparseCategoricalAccuracy()
        for images, labels in test:
            accuracy.update_state(labels, trainer.model(images, training=False))
        out[policy] = {
            "policy": trainer.model.dtype_policy.name,
            "seconds": seconds,
            "held_out_accuracy": float(accuracy.result()),
        }
    out["auto_time_over_float32"] = out["auto"]["seconds"] / out["float32"]["seconds"]
    out["accuracy_difference"] = (
        out["auto"]["held_out_accuracy"] - out["float32"]["held_out_accuracy"]
    )
    print(job, json.dumps(out), flush=True)
    return out


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["throughput"])
    contenders = ("float32", "mixed_bfloat16", "auto")
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for i, c in enumerate(contenders):
        ratios = [
            results["throughput"][n]["examples_per_s"][c]
            / results["throughput"][n]["examples_per_s"]["float32"]
            for n in names
        ]
        ax.bar(np.arange(len(names)) + (i - 1) * 0.27, ratios, 0.27, label=c)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(np.arange(len(names)), names)
    ax.set_ylabel("examples/s ÷ float32")
    ax.set_title(f"Precision on this machine ({results['machine']['cpu']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round, fewer jobs")
    args = parser.parse_args()
    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line),
        "unknown CPU",
    )
    candidates, why = precision.candidates()
    results = {
        "machine": {"cpu": cpu, "candidates": candidates, "why": why},
        "throughput": {},
        "xla": {},
        "time_to_accuracy": {},
    }
    jobs = ["mlp", "digits"] if args.quick else list(JOBS)
    for name in jobs:
        results["throughput"][name] = throughput(name, rounds=1 if args.quick else 3)
    for name in ["digits"] if args.quick else ["mlp", "cnn", "digits"]:
        results["xla"][name] = xla(name, rounds=1 if args.quick else 3)
    for job, epochs in (("digits", 10), ("cnn", 3)):
        if not args.quick or job == "digits":
            results["time_to_accuracy"][job] = time_to_accuracy(job, epochs)
    rates = results["throughput"]
    results["targets"] = {
        "auto / best fixed >= 0.95 on every model": all(
            r["auto_over_best_fixed"] >= 0.95 for r in rates.values()
        ),
        "auto accuracy within 0.01 of float32": all(
            abs(r["accuracy_difference"]) <= 0.01 for r in results["time_to_accuracy"].values()
        ),
    }
    print(json.dumps(results["targets"]))
    if not args.quick:
        RESULTS.write_text(strict_json.dumps(results, indent=2) + "\n")
        plot(results, RESULTS.with_suffix(".png"))


if __name__ == "__main__":
    main()
