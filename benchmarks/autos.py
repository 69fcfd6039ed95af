"""The "auto" pair (precision, XLA) against the best fixed pair, per model.

For an MLP (784-2048-2048-10), a 3-conv CNN (32x32x3), ResNet-18 at width 16 and a 1-D
convolutional sequence model (256 steps x 16 channels), in one process:

1. what `Trainer(precision="auto", jit_compile="auto")` chooses at its first fit for a
   job of `JOB_STEPS` steps (20 epochs) (`tfaccel.choices.resolve_fit`, the function the
   Trainer calls), its measured rates and the probe's cost as a share of
   that job (at the chosen pair's measured rate);
2. each fixed pair of this hardware's candidate policies x (no XLA, XLA) trained by a
   Trainer: a warm-up fit each (tracing, compiling), then alternating rounds of fits of a
   fixed number of steps on cached data; the best round counts.

"auto" trains exactly the pair it chose, so auto ÷ best fixed is the chosen pair's
examples/s over the fastest pair's. These CPUs are shared and noisy: read the ratios,
not the absolute figures.

Run: `python benchmarks/autos.py [--quick] [--models mlp,cnn]`; writes
`benchmarks/results/autos.json`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import keras
import numpy as np
import tensorflow as tf

import tfaccel
from tfaccel import precision, strict_json
from tfaccel.choices import resolution
from tfaccel.choices.loop_size import LoopSizer
from tfaccel.data.assembly.feed import Feed

RESULTS = pathlib.Path(__file__).parent / "results" / "autos.json"
JOB_STEPS = 20_000  # the job "auto" decides for: its probe must stay within 5 % of it


def mlp():
    return keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(2048, activation="relu"),
            keras.layers.Dense(2048, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def cnn():
    layers = [keras.Input((32, 32, 3))]
    for filters in (32, 64, 128):
        layers += [
            keras.layers.Conv2D(filters, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
        ]
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]
    return keras.Sequential(layers)


def resnet():
    return tfaccel.models.resnet(
        18,
        input_shape=(32, 32, 3),
        num_classes=10,
        stem="cifar",
        width=16,
        classifier_activation=None,
    )


def conv1d():
    return keras.Sequential(
        [
            keras.Input((256, 16)),
            keras.layers.Conv1D(64, 5, padding="same", activation="relu"),
            keras.layers.Conv1D(64, 5, padding="same", activation="relu"),
            keras.layers.MaxPooling1D(4),
            keras.layers.Conv1D(128, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(10),
        ]
    )


MODELS = {  # name: (builder, input shape, global batch, steps per timed fit)
    "mlp": (mlp, (784,), 128, 20),
    "cnn": (cnn, (32, 32, 3), 64, 10),
    "resnet18_w16": (resnet, (32, 32, 3), 64, 4),
    "conv1d": (conv1d, (256, 16), 64, 10),
}
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def data(shape, batch):
    rng = np.random.default_rng(0)
    x = rng.random((batch * 4, *shape), dtype=np.float32)
    y = rng.integers(0, 10, batch * 4).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).cache()


def trainer(build, policy, jit, steps):
    return tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.Adam(1e-3),
        loss=LOSS,
        steps_per_loop=steps,
        precision=policy,
        jit_compile=jit,
    )


def choice(build, dataset, policies) -> dict:
    """What "auto" picks for a job of JOB_STEPS steps, what it measured, what it cost."""
    t = trainer(build, None, False, 1)  # the model and loss as the Trainer resolves them
    feed = Feed(dataset.repeat(), t.strategy, what="training")
    began = time.perf_counter()
    step = resolution.Step(t.model, t.loss, t.strategy, build)
    asked = resolution.Asked(precision=len(policies) > 1, jit_compile=True)
    job = resolution.Job(feed, JOB_STEPS // 20, 20)  # 20 epochs: 5 % of one for the rounds
    made = resolution.resolve_fit(step, asked, job, LoopSizer(1))
    chosen, xla = made.precision, made.jit_compile
    return {
        "policy": chosen.policy if chosen is not None else policies[0],
        "policy_reason": chosen.describe() if chosen is not None else "",
        "jit_compile": xla.jit_compile,
        "xla_reason": xla.describe(),
        "probe_s": time.perf_counter() - began,
    }


def fixed(build, dataset, policies, steps, batch, rounds) -> dict:
    """examples/s of each fixed pair: the best of `rounds` alternating fits of `steps`."""
    pairs = [(p, jit) for p in policies for jit in (False, True)]
    trainers = {pair: trainer(build, pair[0], pair[1], steps) for pair in pairs}
    repeated = dataset.repeat()
    for t in trainers.values():
        t.fit(repeated, epochs=1, steps_per_epoch=steps, verbose=0)  # warm-up: trace, compile
    best = dict.fromkeys(pairs, float("inf"))
    for r in range(rounds):
        for pair in pairs if r % 2 == 0 else list(reversed(pairs)):
            start = time.perf_counter()
            trainers[pair].fit(repeated, epochs=1, steps_per_epoch=steps, verbose=0)
            best[pair] = min(best[pair], time.perf_counter() - start)
    return {pair: batch * steps / s for pair, s in best.items()}


def run(name, rounds) -> dict:
    build, shape, batch, steps = MODELS[name]
    dataset = data(shape, batch)
    policies = precision.candidates()[0]
    auto = choice(build, dataset, policies)
    rates = fixed(build, dataset, policies, steps, batch, rounds)
    best = max(rates, key=rates.get)
    chosen = (auto["policy"], auto["jit_compile"])
    job_s = JOB_STEPS * batch / rates[chosen]
    out = {
        **auto,
        "examples_per_s": {f"{p}{' + XLA' if j else ''}": r for (p, j), r in rates.items()},
        "best_fixed": f"{best[0]}{' + XLA' if best[1] else ''}",
        "auto_over_best_fixed": rates[chosen] / rates[best],
        "probe_share_of_job": auto["probe_s"] / job_s,
        "job_steps": JOB_STEPS,
    }
    print(name, json.dumps(out), flush=True)
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds instead of 3")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names")
    args = parser.parse_args(argv)
    results = {
        "machine": "a shared 2-core CPU (5 engineers at once): ratios only",
        "candidates": precision.candidates()[0],
        "models": {},
    }
    for name in args.models.split(","):
        results["models"][name] = run(name, 2 if args.quick else 3)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(strict_json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
