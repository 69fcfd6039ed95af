"""Iterator reaper: resident memory and deletion backlog over repeated `fit` calls.

A notebook calls `fit` 50 times on one Trainer; a keras-tuner-like search builds 20
Trainers and fits each once. Each `fit` makes tf.data iterators (training and
validation) whose deletion the reaper runs in the background. Reports the process's
resident memory (RSS) before, after and at its highest, against the data held (the
arrays), plus the reaper's counts: the most iterators pending at once and the longest
single deletion.

Run: `python benchmarks/iterator_memory.py`; writes `benchmarks/results/iterator_memory.json`.
"""

from __future__ import annotations

import gc
import json
import pathlib
import time

import keras
import numpy as np
import tensorflow as tf

import tfaccel
from tfaccel.data import iterators

RESULTS = pathlib.Path(__file__).parent / "results" / "iterator_memory.json"


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def make_trainer() -> tfaccel.Trainer:
    return tfaccel.Trainer(
        lambda: keras.Sequential(
            [
                keras.Input((256,)),
                keras.layers.Dense(128, activation="relu"),
                keras.layers.Dense(10),
            ]
        ),
        optimizer=lambda: keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def run(name: str, calls: int, new_trainer_each: bool) -> dict:
    rng = np.random.default_rng(0)
    x = rng.random((20_000, 256), dtype=np.float32)  # 19.5 MiB
    y = rng.integers(0, 10, 20_000).astype(np.int32)
    data_mb = (x.nbytes + y.nbytes) / 2**20
    train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(20_000).batch(128).prefetch(-1)
    val = tf.data.Dataset.from_tensor_slices((x[:2048], y[:2048])).batch(256).prefetch(-1)
    trainer = make_trainer()
    trainer.fit(train, epochs=1, steps_per_epoch=10, verbose=0)  # warm: traces, buffers
    gc.collect()
    before, start, highest = rss_mb(), iterators.stats(), 0.0
    t0 = time.monotonic()
    for _ in range(calls):
        if new_trainer_each:
            trainer = make_trainer()
        trainer.fit(train, epochs=2, steps_per_epoch=20, validation_data=val, verbose=0)
        highest = max(highest, rss_mb())
    seconds = time.monotonic() - t0
    end = iterators.stats()
    drained = iterators.wait_for(lambda: iterators.pending() <= 1, timeout_s=130)
    gc.collect()
    after = rss_mb()
    return {
        "job": name,
        "fit_calls": calls,
        "seconds": round(seconds, 1),
        "data_mb": round(data_mb, 1),
        "rss_before_mb": round(before, 1),
        "rss_highest_mb": round(highest, 1),
        "rss_after_mb": round(after, 1),
        "growth_highest_mb": round(highest - before, 1),
        "growth_after_mb": round(after - before, 1),
        "iterators_adopted": end["adopted"] - start["adopted"],
        "most_pending_at_once": end["most_pending"],
        "longest_deletion_s": round(end["longest_free_s"], 3),
        "drained": drained,
    }


def main() -> None:
    results = [run("one Trainer, 50 fits", 50, False), run("20 Trainers, one fit each", 20, True)]
    for r in results:
        print(json.dumps(r))
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
