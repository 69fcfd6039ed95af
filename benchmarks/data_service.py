"""Preprocessing on tf.data service workers (issue 39): end-to-end training examples/s and
final accuracy, a local pipeline hand-tuned vs `data.service.local(k)` for k = 1, 2, 3.

Jobs (a small MLP, `tfaccel.Trainer` on one replica, no cache: the preprocessing runs
every epoch, as an augmentation would):
    python: a `tf.numpy_function` doing real per-example Python work (a pure-Python loop
        over the example's values, as a tokenizer or an image library's Python layer
        does): one GIL in the training process, however many parallel calls.
    tfops: the same amount of work as TensorFlow ops (no GIL): the service may not pay
        on one machine (the same cores).

"local" is the pipeline hand-tuned: a parallel map (AUTOTUNE), non-deterministic order,
prefetch(AUTOTUNE). Every configuration runs in a fresh process (the service's start is
not timed; the first epoch is a warm-up, not timed).

    python benchmarks/data_service.py                 # the full run -> results/data_service.json
    python benchmarks/data_service.py --smoke         # a short check, writes nothing
    python benchmarks/data_service.py --plot          # results/data_service.png from the JSON
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results" / "data_service.json"
PLOT = RESULTS.with_suffix(".png")

CHILD = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras, numpy as np, tensorflow as tf
import tfaccel
from tfaccel import data

job, workers, examples, epochs, work = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:6])
FEATURES, CLASSES = 32, 4
rng = np.random.default_rng(0)
x = rng.normal(size=(examples, FEATURES)).astype("float32")
w = rng.normal(size=(FEATURES, CLASSES)).astype("float32")
y = np.argmax(x @ w, axis=1).astype("int64")
x_test = rng.normal(size=(2000, FEATURES)).astype("float32")
y_test = np.argmax(x_test @ w, axis=1).astype("int64")


def python_work(features):
    # Real per-example Python work: `work` passes of a pure-Python loop; the result is
    # the features scaled by a factor that the loop computes as exactly 1.0.
    values = features.tolist()
    total = 0.0
    for _ in range(work):
        for v in values:
            total += v * v
    scale = 1.0 if total >= 0 else 0.0
    return (features * scale).astype(np.float32)


def python_preprocess(features, label):
    out = tf.numpy_function(python_work, [features], tf.float32)
    out.set_shape([FEATURES])
    return out, label


def tf_preprocess(features, label):
    total = tf.constant(0.0)
    for _ in range(work // 4):
        total += tf.reduce_sum(tf.sin(features) * tf.cos(features))
    return features * tf.where(tf.math.is_finite(total), 1.0, 0.0), label


preprocess = python_preprocess if job == "python" else tf_preprocess
if workers < 0:  # the doctor on the local pipeline: its sized offload, as JSON
    train = data.pipeline(
        data.from_arrays(x, y), batch_size=128, training=True, cache=None,
        deterministic=False, preprocess=preprocess,
    )
    trainer = tfaccel.Trainer(
        lambda: keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(64, "relu"),
                                  keras.layers.Dense(CLASSES)]),
        optimizer=lambda: keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    from tfaccel.doctor import service_fix
    report = tfaccel.doctor.diagnose(trainer, train, budget_s=20 if epochs > 1 else 5)
    m = report.measured
    fixes = [{"action": f.action, "gain": f.gain, "why": f.why} for f in
             service_fix.service_fixes(m)]
    worker, consumer = service_fix.rates(m)
    print(json.dumps({"job": job, "verdict": report.verdict, "fixes": fixes,
                      "local_workers": service_fix.local_workers(m),
                      "cluster_workers": service_fix.workers_needed(m),
                      "worker_rate": worker, "trainer_rate": consumer,
                      "input_cores": m.input_cores, "trainer_cores": m.trainer_cores}))
    sys.exit(0)
service = data.service.local(workers) if workers else None
try:
    train = data.pipeline(
        data.from_arrays(x, y), batch_size=128, training=True, cache=None,
        deterministic=False, preprocess=preprocess, service=service,
    )
    trainer = tfaccel.Trainer(
        lambda: keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(64, "relu"),
                                  keras.layers.Dense(CLASSES)]),
        optimizer=lambda: keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    trainer.fit(train, epochs=1, verbose=0)  # warm-up: tracing, the workers' first job
    start = time.perf_counter()
    for _ in range(epochs):
        trainer.fit(train, epochs=1, verbose=0)
    seconds = time.perf_counter() - start
    test = data.pipeline(data.from_arrays(x_test, y_test), batch_size=500, training=False)
    result = trainer.evaluate(test)
finally:
    if service is not None:
        service.close()
print(json.dumps({"job": job, "workers": workers, "examples_per_s": examples * epochs / seconds,
                  "seconds": seconds, "accuracy": float(result["accuracy"])}))
"""


def run_one(job: str, workers: int, examples: int, epochs: int, work: int, timeout: float):
    """One configuration in a fresh process; its JSON line."""
    command = [sys.executable, "-c", CHILD, job, str(workers), str(examples), str(epochs)]
    result = subprocess.run(
        [*command, str(work)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    if result.returncode:
        raise RuntimeError(f"{job} with {workers} workers failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def plot(results: dict, path: pathlib.Path) -> None:
    """Examples/s ÷ the hand-tuned local pipeline's, per job and worker count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for job, label in (("python", "Python-bound (numpy_function)"), ("tfops", "TF ops")):
        rows = sorted((r for r in results["rows"] if r["job"] == job), key=lambda r: r["workers"])
        workers = [r["workers"] for r in rows]
        ax.plot(workers, [r["speedup_vs_local"] for r in rows], "o-", label=label)
    doctor = results.get("doctor") or {}
    if doctor.get("predicted_gain"):
        ax.plot(
            [doctor["local_workers"]],
            [doctor["predicted_gain"]],
            "kx",
            markersize=10,
            label=f"the doctor's prediction for local({doctor['local_workers']})",
        )
    ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(4), ["local\n(hand-tuned)", "local(1)", "local(2)", "local(3)"])
    ax.set_ylabel("training examples/s ÷ local")
    cpus = results["settings"].get("cpus")
    ax.set_title(f"tf.data service workers on the trainer's machine ({cpus} cores)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    """Runs the configurations, prints the table; the full run writes the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a short run; writes nothing")
    parser.add_argument("--examples", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--work", type=int, default=200, help="passes of per-example work")
    parser.add_argument("--workers", default="0,1,2,3", help="service sizes (0: local)")
    parser.add_argument("--plot", action="store_true", help="only plot the JSON results")
    args = parser.parse_args(argv)
    if args.plot:
        plot(json.loads(RESULTS.read_text()), PLOT)
        print(f"wrote {PLOT}")
        return 0
    if args.smoke:
        args.examples, args.epochs, args.work, args.workers = 1000, 1, 4, "0,2"
    sizes = [int(k) for k in args.workers.split(",")]
    doctor = run_one("python", -1, args.examples, args.epochs, args.work, 1200)
    local_fix = next((f for f in doctor["fixes"] if "service.local(" in f["action"]), None)
    print(
        f"doctor: {doctor['verdict']}-bound; "
        + "; ".join(f"{f['action']} (predicted {f['gain']:.2f}x)" for f in doctor["fixes"]),
        flush=True,
    )
    if local_fix and doctor["local_workers"] not in sizes:
        sizes.append(doctor["local_workers"])
    rows = []
    for job in ("python", "tfops"):
        for workers in sizes if job == "python" else [k for k in sizes if k in (0, 2)]:
            row = run_one(job, workers, args.examples, args.epochs, args.work, 1200)
            rows.append(row)
            where = f"service.local({workers})" if workers else "local, hand-tuned"
            print(
                f"{job:<7} {where:<20} {row['examples_per_s']:>9.0f} examples/s  "
                f"accuracy {row['accuracy']:.3f}",
                flush=True,
            )
    for job in ("python", "tfops"):
        base = next(r for r in rows if r["job"] == job and r["workers"] == 0)
        for row in rows:
            if row["job"] == job:
                row["speedup_vs_local"] = row["examples_per_s"] / base["examples_per_s"]
    if local_fix:
        k = doctor["local_workers"]
        row = next(r for r in rows if r["job"] == "python" and r["workers"] == k)
        doctor["predicted_gain"] = local_fix["gain"]
        doctor["measured_gain"] = row["speedup_vs_local"]
        doctor["error"] = row["speedup_vs_local"] / local_fix["gain"] - 1
        print(
            f"doctor's local({k}): predicted {local_fix['gain']:.2f}x, measured "
            f"{row['speedup_vs_local']:.2f}x ({doctor['error']:+.0%})"
        )
    if not args.smoke:
        RESULTS.parent.mkdir(exist_ok=True)
        settings = {k: getattr(args, k) for k in ("examples", "epochs", "work")}
        settings["cpus"] = os.cpu_count()
        results = {"settings": settings, "rows": rows, "doctor": doctor}
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
        plot(results, PLOT)
        print(f"wrote {RESULTS} and {PLOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
