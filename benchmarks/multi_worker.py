"""Multi-worker scaling: one worker on one core vs two workers on one core each.

Each configuration runs through `tfaccel.launcher.launch` (TensorFlow's own distributed runtime,
`MultiWorkerMirroredStrategy` for two workers), trains a model with the Trainer at the
same per-worker batch, and reports global examples/s measured by the chief after a
warm-up. Models: the MLP 512-1024-1024-10 (128 examples per worker per step) and a
small ResNet (32 per worker). Contenders, alternating round by round:

- `one`: one worker, default strategy (the baseline);
- `one_mwms`: one worker under `MultiWorkerMirroredStrategy` (the strategy's own cost);
- `two_k1`, `two_k4`: two workers, `accumulate_steps` 1 and 4 (4 = a quarter of the
  all-reduces; the per-worker batch per *batch* is the same, so examples/s compare);
- `*_distributed_iterator`: the same through TensorFlow's distributed (multi-device)
  iterator, which the Trainer used before it fed a one-CPU-replica worker its own shard
  (`tfaccel.data.assembly.feed.local_shard`).

Ratios: two ÷ one (ideal 2.0, physical limit here ≈ 1.95) and one_mwms ÷ one
(ideal 1.0). Medians over rounds.

Each timed `fit` call runs `--steps` batches (200: long enough that the call's own
set-up — distributed iterator, end-of-epoch reads — stays small).

Run: `python benchmarks/multi_worker.py [--quick] [--models mlp,resnet]`; writes
`benchmarks/results/multi_worker.json` (not with `--quick`; the models run replace their
entries). `--quick` (MLP only, one
round, 16 batches; checks that everything runs) takes 1-3 minutes on 2 cores, dominated
by process start-up; the full run (2 models x 4 contenders x 3 rounds) about 15-20.
"""

from __future__ import annotations

import argparse
import io
import json
import pathlib
import statistics
import sys
import time

from tfaccel import strict_json

RESULTS = pathlib.Path(__file__).parent / "results" / "multi_worker.json"
MODELS = {
    "mlp": {"per_worker_batch": 128, "description": "MLP 512-1024-1024-10"},
    "resnet": {"per_worker_batch": 32, "description": "resnet18 cifar stem width 16, 32x32x3"},
}
CONTENDERS = {  # name: (workers, strategy kind, accumulate_steps, distributed iterator)
    "one": (1, "auto", 1, False),
    "one_mwms": (1, "multi_worker", 1, False),
    "one_mwms_distributed_iterator": (1, "multi_worker", 1, True),
    "two_k1": (2, "auto", 1, False),
    "two_k1_distributed_iterator": (2, "auto", 1, True),
    "two_k4": (2, "auto", 4, False),
}


def _model_and_data(model: str, global_batch: int):
    import numpy as np
    import tensorflow as tf

    import tfaccel

    rng = np.random.default_rng(0)
    if model == "mlp":
        x = rng.random((2048, 512), dtype=np.float32)
        y = rng.integers(0, 10, 2048).astype("int32")

        def build():
            return tfaccel.models.mlp(input_shape=(512,), hidden=(1024, 1024), num_classes=10)

    else:
        x = rng.random((512, 32, 32, 3), dtype=np.float32)
        y = rng.integers(0, 10, 512).astype("int32")

        def build():
            return tfaccel.models.resnet(
                18, input_shape=(32, 32, 3), num_classes=10, stem="cifar", width=16
            )

    def data(context: tf.distribute.InputContext) -> tf.data.Dataset:
        # Each worker its own shard, in per-replica batches (as tfaccel.data.pipeline does).
        shard = tf.data.Dataset.from_tensor_slices((x, y))
        shard = shard.shard(context.num_input_pipelines, context.input_pipeline_id)
        batch = context.get_per_replica_batch_size(global_batch)
        return shard.cache().repeat().batch(batch, drop_remainder=True).prefetch(2)

    return build, data


def worker(model: str, kind: str, accumulate: int, steps: int, distributed: bool) -> None:
    """One worker's job: warm up, then time `steps` batches; the chief prints."""
    import keras

    import tfaccel
    from tfaccel.data.assembly import feed

    if distributed:  # the multi-device iterator, as before `feed.local_shard`
        feed.local_shard = lambda strategy, fn: None

    strategy = tfaccel.devices.strategy(kind)
    config = tfaccel.devices.read_tf_config()
    workers = len(config["cluster"]["worker"]) if config else 1
    global_batch = MODELS[model]["per_worker_batch"] * workers
    build, data = _model_and_data(model, global_batch)
    trainer = tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.SGD(0.01),
        loss="sparse_categorical_crossentropy",
        strategy=strategy,
        accumulate_steps=accumulate,
    )
    trainer.fit(data, epochs=1, steps_per_epoch=2 * accumulate, verbose=0)  # warm-up: tracing
    batches = steps - steps % accumulate
    start = time.perf_counter()
    trainer.fit(data, epochs=1, steps_per_epoch=batches, verbose=0)
    elapsed = time.perf_counter() - start
    if config is None or config["task"]["index"] == 0:  # the chief reports
        rate = global_batch * batches / elapsed
        print("RESULT " + strict_json.dumps({"workers": workers, "examples_per_s": rate}))


class _Capture(io.StringIO):
    def flush(self):
        pass


def run_config(model: str, contender: str, steps: int) -> float:
    from tfaccel.launcher.launch import launch

    workers, kind, accumulate, distributed = CONTENDERS[contender]
    out = _Capture()
    command = [sys.executable, __file__, "--worker", "--model", model, "--kind", kind]
    command += ["--accumulate", str(accumulate), "--steps", str(steps)]
    command += ["--distributed-iterator"] if distributed else []
    status = launch(command, workers, cpus_per_worker=1, timeout_s=600, out=out)
    text = out.getvalue()
    if status != 0:
        raise RuntimeError(f"{model}/{contender} failed ({status}):\n{text[-3000:]}")
    line = next(line for line in text.splitlines() if "RESULT " in line)
    return json.loads(line.split("RESULT ", 1)[1])["examples_per_s"]


def summarize(model: str, rates: dict, steps: int) -> dict:
    medians = {name: statistics.median(values) for name, values in rates.items()}
    one = medians["one"]
    paired = {  # per-round ratios: contenders timed minutes apart, not hours
        name: statistics.median(v / o for v, o in zip(values, rates["one"], strict=True))
        for name, values in rates.items()
        if name != "one"
    }
    return {
        "model": MODELS[model]["description"],
        "per_worker_batch": MODELS[model]["per_worker_batch"],
        "cpus_per_worker": 1,
        "steps": steps,
        "rounds_examples_per_s": rates,
        "median_examples_per_s": medians,
        "ratio_two_over_one_k1": medians["two_k1"] / one,
        "ratio_two_over_one_k4": medians["two_k4"] / one,
        "ratio_one_mwms_over_default": medians["one_mwms"] / one,
        "ratio_one_mwms_distributed_iterator_over_default": (
            medians["one_mwms_distributed_iterator"] / one
        ),
        "ratio_two_over_one_k1_distributed_iterator": medians["two_k1_distributed_iterator"] / one,
        "paired_ratios_over_one": paired,
        "target_two_over_one_k4 >= 1.6": medians["two_k4"] / one >= 1.6,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="mlp", help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--accumulate", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--distributed-iterator", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=200, help="timed batches per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="mlp,resnet")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.model, args.kind, args.accumulate, args.steps, args.distributed_iterator)
        return {}
    models = ["mlp"] if args.quick else args.models.split(",")
    steps, rounds = (16, 1) if args.quick else (args.steps, args.rounds)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() and not args.quick else {}
    for model in models:  # a run of some models replaces their entries, keeps the others
        rates = {name: [] for name in CONTENDERS}
        for _ in range(rounds):
            for name in CONTENDERS:
                rates[name].append(run_config(model, name, steps))
        results[model] = summarize(model, rates, steps)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    if not args.quick:
        RESULTS.write_text(strict_json.dumps(results, indent=2))
    print(strict_json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
