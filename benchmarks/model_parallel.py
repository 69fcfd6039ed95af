"""PipelineModel vs the unsplit model: examples/s of `model.fit`.

On this CPU, split into two logical devices, the pipeline cannot beat the unsplit
model (both devices share the same cores); the target is that it costs little:
pipeline (4 micro-batches) / unsplit >= 0.9 in examples/s, paired round by round.
On a machine with two or more GPUs the same script adds the GPU comparison:
unsplit on /gpu:0, the model split over /gpu:0 and /gpu:1 with one micro-batch
(naive model parallelism: one GPU busy at a time) and pipelined with
4 micro-batches. Contenders alternate round by round in one process, after a
warm-up round; each timed call is a whole `fit` of a fixed number of steps.

Run: `python benchmarks/model_parallel.py [--quick]` (--quick: a small model, about
1.5 minutes on a loaded 2-core CPU, most of it tracing; the full run: a 4x larger
model and batch, about 5-10 minutes on a quiet 2-core CPU); writes
`benchmarks/results/model_parallel.json`.
"""

from __future__ import annotations

import argparse
import gc
import pathlib
import statistics
import time

from tfaccel import devices

if not devices.list_gpus():
    devices.configure(virtual_cpus=2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfaccel  # noqa: E402
from tfaccel import strict_json  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results" / "model_parallel.json"


def workload(size: int, width: int, batch: int, depth: int = 18):
    x = np.random.default_rng(0).random((batch * 8, size, size, 3), dtype=np.float32)
    y = np.random.default_rng(1).integers(0, 10, batch * 8).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)

    def build():
        keras.utils.set_random_seed(0)
        return tfaccel.models.resnet(
            depth, input_shape=(size, size, 3), num_classes=10, stem="cifar", width=width
        )

    return build, data.prefetch(tf.data.AUTOTUNE)


def contenders(build, device_pairs: dict, unsplit_device: str) -> dict:
    """{name: fit(data, steps)}: the unsplit model and one PipelineModel per entry."""
    models = {}
    with tf.device(unsplit_device):
        models["unsplit"] = build()
    for name, (pair, micro_batches) in device_pairs.items():
        stages = tfaccel.parallel.split(build(), num_stages=len(pair))
        models[name] = tfaccel.parallel.PipelineModel(
            stages, devices=pair, micro_batches=micro_batches
        )
    runs = {}
    for name, model in models.items():
        model.compile(
            keras.optimizers.SGD(0.01),
            "sparse_categorical_crossentropy",
            steps_per_execution=8,
            jit_compile=False,
        )
        runs[name] = lambda d, s, m=model: m.fit(d, epochs=1, steps_per_epoch=s, verbose=0)
    print(models[list(device_pairs)[-1]].plan())
    return runs


def measure(runs: dict, data, steps: int, rounds: int) -> dict:
    for run in runs.values():  # warm-up: tracing and first steps
        run(data, steps)
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            gc.collect()
            start = time.perf_counter()
            run(data, steps)  # fit returns after the last step's loss reached the host
            times[name].append(time.perf_counter() - start)
    return times


def summarise(times: dict, examples: int) -> dict:
    rates = {name: examples / statistics.median(t) for name, t in times.items()}
    base = times["unsplit"]
    return {
        "examples_per_s": rates,
        "over_unsplit": {n: rates[n] / rates["unsplit"] for n in times if n != "unsplit"},
        "paired_over_unsplit": {
            n: statistics.median(b / t for b, t in zip(base, times[n], strict=True))
            for n in times
            if n != "unsplit"
        },
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small model, few rounds")
    args = parser.parse_args(argv)
    rounds = 2 if args.quick else 6
    steps = 4 if args.quick else 8
    results = {}

    cpus = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
    if len(cpus) == 2:
        # Micro-batches of 64 keep each op's fixed cost small next to its work.
        batch = 64 if args.quick else 256
        size, width = (16, 8) if args.quick else (32, 16)
        build, data = workload(size=size, width=width, batch=batch)
        pairs = {"pipeline_m4": (cpus, 4)}
        if not args.quick:
            pairs = {"pipeline_m2": (cpus, 2), **pairs}
        cpu = summarise(
            measure(contenders(build, pairs, cpus[0]), data, steps, rounds), batch * steps
        )
        cpu["target pipeline_m4/unsplit >= 0.9"] = cpu["paired_over_unsplit"]["pipeline_m4"] >= 0.9
        results["cpu_two_logical_devices"] = cpu

    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    if len(gpus) >= 2:
        batch = 64 if args.quick else 256
        build, data = workload(size=32, width=16 if args.quick else 64, batch=batch, depth=50)
        pairs = {"naive_m1": (gpus[:2], 1), "pipeline_m4": (gpus[:2], 4)}
        gpu = summarise(
            measure(contenders(build, pairs, gpus[0]), data, steps, rounds), batch * steps
        )
        results["gpu_two_devices"] = gpu
    else:
        results["gpu_two_devices"] = (
            f"skipped: {len(gpus)} GPU(s) here. On a machine with two GPUs the same command "
            "compares the unsplit model on /gpu:0 with the model split over /gpu:0 and /gpu:1, "
            "naive (1 micro-batch) and pipelined (4 micro-batches)."
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(strict_json.dumps(results, indent=2, default=str))
    print(strict_json.dumps(results, indent=2, default=str))
    return results


if __name__ == "__main__":
    main()
