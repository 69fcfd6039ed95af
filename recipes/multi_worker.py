"""The ResNet-18 CIFAR-10 job as a multi-worker program (MultiWorkerMirroredStrategy).

The same script runs as one process, as N local workers, or as one task of a cluster
job whose `TF_CONFIG` names this task:

    python recipes/multi_worker.py --epochs 30                      # one process
    tfaccel launch --workers 2 -- python recipes/multi_worker.py    # two local workers
    TF_CONFIG='{"cluster": {...}, "task": {...}}' python recipes/multi_worker.py

With a multi-worker `TF_CONFIG`, `--strategy auto` picks MultiWorkerMirroredStrategy:
every worker reads its own shard of the data, gradients are all-reduced, so all
workers hold the same weights. Only the chief (worker 0) writes history.csv,
TensorBoard logs, metrics.json, curves.png and checkpoints; `--export-weights` makes
every worker save its final weights as `weights.worker<i>.npz` to compare them.

Takes the core recipe flags (`--help`), e.g. `--tune-batch-size` to probe the batch size first,
or `--doctor` to diagnose what limits training instead (`tfaccel doctor RECIPE.py` in one
process; `tfaccel launch --workers 2 -- python recipes/multi_worker.py --doctor` on two).
"""

from __future__ import annotations

import pathlib

import common  # recipes/common.py: the shared command line and outputs
import numpy as np
import resnet_cifar10

import tfaccel

NAME = "multi_worker"


def task_index() -> int:
    """This worker's index in TF_CONFIG (0 when there is none)."""
    config = tfaccel.devices.read_tf_config() or {}
    return int(config.get("task", {}).get("index", 0))


def main(argv=None) -> dict:
    p = resnet_cifar10.parser()
    p.description = __doc__
    p.add_argument(
        "--export-weights",
        action="store_true",
        help="every worker saves its final weights as weights.worker<i>.npz under --out",
    )
    args = p.parse_args(argv)
    config = tfaccel.devices.read_tf_config()
    workers = len((config or {}).get("cluster", {}).get("worker", [])) or 1
    summary, trainer = resnet_cifar10.train(
        args, NAME, extra={"workers": workers, "task_index": task_index()}
    )
    if args.export_weights:
        path = pathlib.Path(args.out or f"runs/{NAME}") / f"weights.worker{task_index()}.npz"
        np.savez(path, *trainer.model.get_weights())
        print(f"Saved this worker's final weights to {path}")
    return summary


if __name__ == "__main__":
    common.main_guard(main)
