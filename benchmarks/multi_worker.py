"""Multi-worker scaling: one worker on one core vs two workers on one core each.

Each configuration runs through `tfaccel.launch` (TensorFlow's own distributed runtime,
`MultiWorkerMirroredStrategy` for two workers), trains a small ResNet from
`tfaccel.models` with the Trainer at the same per-worker batch, and reports global
examples/s measured by the chief after a warm-up. Configurations alternate, and the
median over rounds is kept. Ideal ratio: 2.0.

Run: `python benchmarks/multi_worker.py [--quick]`; writes
`benchmarks/results/multi_worker.json`.
"""

from __future__ import annotations

import argparse
import io
import json
import pathlib
import statistics
import sys
import time

RESULTS = pathlib.Path(__file__).parent / "results" / "multi_worker.json"
PER_WORKER_BATCH = 32


def worker(steps: int) -> None:
    """One worker's job: warm up, then time `steps` training steps; the chief prints."""
    import keras
    import numpy as np
    import tensorflow as tf

    import tfaccel

    strategy = tfaccel.devices.strategy("auto")
    config = tfaccel.devices.read_tf_config()
    workers = len(config["cluster"]["worker"]) if config else 1
    global_batch = PER_WORKER_BATCH * workers
    x = np.random.default_rng(0).random((512, 32, 32, 3), dtype=np.float32)
    y = np.random.default_rng(1).integers(0, 10, 512).astype("int32")
    data = (
        tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch, drop_remainder=True)
    )
    trainer = tfaccel.Trainer(
        lambda: tfaccel.models.resnet(
            18, input_shape=(32, 32, 3), num_classes=10, stem="cifar", width=16
        ),
        optimizer=lambda: keras.optimizers.SGD(0.01),
        loss="sparse_categorical_crossentropy",
        strategy=strategy,
    )
    trainer.fit(data, epochs=1, steps_per_epoch=3, verbose=0)  # warm-up: tracing
    start = time.perf_counter()
    trainer.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
    elapsed = time.perf_counter() - start
    if config is None or config["task"]["index"] == 0:  # the chief reports
        print(
            "RESULT "
            + json.dumps({"workers": workers, "examples_per_s": global_batch * steps / elapsed})
        )


class _Capture(io.StringIO):
    def flush(self):
        pass


def run_config(workers: int, steps: int) -> float:
    from tfaccel.launch import launch

    out = _Capture()
    command = [sys.executable, __file__, "--worker", "--steps", str(steps)]
    status = launch(command, workers, cpus_per_worker=1, timeout_s=600, out=out)
    text = out.getvalue()
    if status != 0:
        raise RuntimeError(f"{workers}-worker run failed ({status}):\n{text[-3000:]}")
    line = next(line for line in text.splitlines() if "RESULT " in line)
    return json.loads(line.split("RESULT ", 1)[1])["examples_per_s"]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.steps)
        return {}
    steps, rounds = (8, 1) if args.quick else (args.steps, args.rounds)
    rates = {1: [], 2: []}
    for _ in range(rounds):
        for workers in (1, 2):
            rates[workers].append(run_config(workers, steps))
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    results = {
        "model": "resnet18 cifar stem width 16, 32x32x3",
        "per_worker_batch": PER_WORKER_BATCH,
        "cpus_per_worker": 1,
        "steps": steps,
        "rounds": rates,
        "one_worker_examples_per_s": one,
        "two_workers_examples_per_s": two,
        "ratio": two / one,
        "target_ratio >= 1.8": two / one >= 1.8,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
