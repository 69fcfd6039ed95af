"""TensorFlow's "Better performance with the tf.data API" guide, ported: its variants with
`model.fit` against `tfaccel.data.from_generator(shards=...)` + `pipeline` + `Trainer.fit`.

The guide's setting, written again here: an artificial source whose reads wait (a sleep
to open each file, one per element read), a mapped function that waits per call (a
`tf.py_function` sleep, as the guide's), and a trivial model, so that the input pipeline
is what is measured. Its variants, each trained with `model.fit` for `EPOCHS` epochs:

- `naive`: the files read one after another, the map per element, then batch;
- `prefetch`: naive, then `prefetch(AUTOTUNE)`;
- `interleave`: the files read at once (`interleave(num_parallel_calls=AUTOTUNE)`);
- `parallel_map`: interleave, and the map with `num_parallel_calls=AUTOTUNE`;
- `cache`: parallel map, then `cache()` (later epochs read nothing);
- `vectorized`: interleave, batch first, then the map once per batch (parallel),
  `cache()` and `prefetch` (the guide's best practices together).

tfaccel: the same generator function as `from_generator(fn, shards=FILES, count=N)` and
`pipeline(source, batch_size=BATCH, training=True, preprocess=map)` (per element,
cached by default; shuffled, as a training pipeline is) or `batch_map=map` (per batch,
`tfaccel_batch_map`), trained by `tfaccel.Trainer.fit`.

Each run is a fresh process; the variants alternate round by round (each leads in turn).
Timed: from the `fit` call to its end (the pipeline and the model are built before).
Reports medians and each one's ratio to the guide's fastest variant's median (>1: faster).

Run: `python benchmarks/guide_tf_data.py [--rounds N]` → `results/guide_tf_data.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import time

import fresh_rounds

RESULTS = pathlib.Path(__file__).parent / "results" / "guide_tf_data.json"
FILES = 4  # the artificial source's files
PER_FILE = 64  # elements in each
OPEN_S = 0.03  # the wait to open a file
READ_S = 0.002  # the wait to read one element
MAP_S = 0.002  # the mapped function's wait per call (an element, or a batch vectorized)
BATCH = 32
EPOCHS = 3
FEATURES = 8
GUIDE = ("naive", "prefetch", "interleave", "parallel_map", "cache", "vectorized")
TFACCEL = ("tfaccel", "tfaccel_batch_map")


def read_file(index, count=1):
    """The elements of the files `index`, `index + count`, ... (a generator: waits as I/O)."""
    import numpy as np

    for f in range(int(index), FILES, int(count)):
        time.sleep(OPEN_S)
        rng = np.random.default_rng(f)
        x = rng.normal(size=(PER_FILE, FEATURES)).astype("float32")
        y = (x[:, 0] > 0).astype("int32") + 2 * (x[:, 1] > 0).astype("int32")
        for i in range(PER_FILE):
            time.sleep(READ_S)
            yield x[i], y[i]


def _signature():
    import tensorflow as tf

    return (tf.TensorSpec((FEATURES,), tf.float32), tf.TensorSpec((), tf.int32))


def mapped(x, y):
    """The guide's mapped function: a wait per call (Python, as `tf.py_function`), then math."""
    import tensorflow as tf

    def wait(v):
        time.sleep(MAP_S)
        return v

    x = tf.py_function(wait, [x], tf.float32)
    x.set_shape([None, FEATURES] if y.shape.rank == 1 else [FEATURES])
    return x * 2.0 - 1.0, y


def guide_dataset(variant: str):
    import tensorflow as tf

    autotune = tf.data.AUTOTUNE

    def one_file(index):
        return tf.data.Dataset.from_generator(
            read_file, output_signature=_signature(), args=(index, FILES)
        )

    if variant in ("naive", "prefetch"):
        data = tf.data.Dataset.from_generator(read_file, output_signature=_signature(), args=(0, 1))
    else:
        data = tf.data.Dataset.range(FILES).interleave(
            one_file, cycle_length=FILES, num_parallel_calls=autotune
        )
    if variant == "vectorized":
        data = data.batch(BATCH).map(mapped, num_parallel_calls=autotune).cache()
        return data.prefetch(autotune)
    parallel = autotune if variant in ("parallel_map", "cache") else None
    data = data.map(mapped, num_parallel_calls=parallel)
    if variant == "cache":
        data = data.cache()
    data = data.batch(BATCH)
    return data if variant == "naive" else data.prefetch(autotune)


def build_model():
    import keras

    inputs = keras.Input((FEATURES,))
    return keras.Model(inputs, keras.layers.Dense(4, activation="softmax")(inputs))


def one(variant: str) -> dict:
    """One run in this (fresh) process."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    import tfaccel

    keras.utils.set_random_seed(0)
    began = time.perf_counter()
    model = build_model()
    if variant.startswith("tfaccel"):
        source = tfaccel.data.from_generator(
            read_file, _signature(), shards=FILES, count=FILES * PER_FILE
        )
        stage = {"batch_map": mapped} if variant == "tfaccel_batch_map" else {"preprocess": mapped}
        data = tfaccel.data.pipeline(source, batch_size=BATCH, training=True, **stage)
        trainer = tfaccel.Trainer(model, optimizer="adam", loss="sparse_categorical_crossentropy")
        fit = trainer.fit
    else:
        data = guide_dataset(variant)
        model.compile("adam", "sparse_categorical_crossentropy")
        fit = model.fit
    built = time.perf_counter()
    history = fit(data, epochs=EPOCHS, verbose=0)
    ended = time.perf_counter()
    del tf
    return {
        "setup_s": built - began,
        "fit_s": ended - built,
        "final_loss": float(history.history["loss"][-1]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--one", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variants", default=",".join(GUIDE + TFACCEL))
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    began = time.perf_counter()
    runs = fresh_rounds.alternate(__file__, args.variants.split(","), args.rounds, 600)
    medians = {v: statistics.median(r["fit_s"] for r in rs) for v, rs in runs.items()}
    guide = {v: m for v, m in medians.items() if v in GUIDE}
    fastest = min(guide, key=guide.get)
    results = {
        "machine": "shared 2-core CPU, loaded by other sessions (other engineers' jobs ran "
        "meanwhile): ratios only",
        "rounds": args.rounds,
        "setting": {
            "files": FILES,
            "per_file": PER_FILE,
            "open_s": OPEN_S,
            "read_s": READ_S,
            "map_s": MAP_S,
            "batch": BATCH,
            "epochs": EPOCHS,
        },
        "timed": "from the fit call to its end, fresh processes, variants alternating",
        "fit_s_median": {v: round(m, 3) for v, m in medians.items()},
        "fit_s_runs": {v: [round(r["fit_s"], 3) for r in rs] for v, rs in runs.items()},
        "setup_s_median": {
            v: round(statistics.median(r["setup_s"] for r in rs), 3) for v, rs in runs.items()
        },
        "final_loss_median": {
            v: round(statistics.median(r["final_loss"] for r in rs), 4) for v, rs in runs.items()
        },
        "guide_fastest": fastest,
        "speed_vs_guide_fastest": {
            v: round(medians[fastest] / m, 2) for v, m in medians.items()
        },  # > 1: faster than the guide's fastest variant
        "wall_s": round(time.perf_counter() - began),
    }
    print(json.dumps({k: results[k] for k in ("fit_s_median", "speed_vs_guide_fastest")}))
    pathlib.Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
