"""Ray Train: recipes/ray_train.py on a local Ray cluster (2 CPUs), with a kill and recovery
checked against the same job trained without Ray."""

import json
import os
import pathlib
import sys

import numpy as np
import pytest
from tensorflow.python.framework import config as tf_config

ray = pytest.importorskip("ray", reason="Ray Train is in the cluster extra")

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "recipes"))

import ray_train  # noqa: E402

ROOT = pathlib.Path(__file__).parents[1]


# Ray Train's controller polls its workers every 2 s (start, end, a dead worker): a quarter
# second here. Its preemption watcher (a node being drained) is one more actor process to
# start per run, and this test preempts nothing.
QUICK_RAY = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray cluster whose workers import this tree's tfaccel."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", *QUICK_RAY)}
    path = saved["PYTHONPATH"]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), path) if p)
    os.environ.update(QUICK_RAY)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key)
        else:
            os.environ[key] = value


def weights(out, rank, kind="weights"):
    data = np.load(pathlib.Path(out) / f"{kind}.worker{rank}.npz")
    return [data[k] for k in sorted(data.files, key=lambda k: int(k.split("_")[1]))]


ARGS = ["--smoke", "--workers", "2", "--deterministic", "--steps-per-loop", "2"]
ARGS += ["--checkpoint-every", "2"]


@pytest.fixture
def uninterrupted(tmp_path, mirrored):
    """The recipe's own training (`ray_train.train`) of the same job without Ray: one
    process, a 2-replica MirroredStrategy, op determinism as the workers have it. The
    pipeline reads one global order, so each replica gets the batch a Ray worker gets."""
    out = tmp_path / "uninterrupted"
    config = ray_train.job_config(ray_train.parse([*ARGS, "--out", str(out)]))
    was = tf_config.is_op_determinism_enabled()
    tf_config.enable_op_determinism()
    try:
        ray_train.train(config, mirrored)
    finally:
        if not was:
            tf_config.disable_op_determinism()
    assert json.loads((out / "summary.json").read_text())["step"] == 8
    return out


def test_a_killed_ray_worker_recovers_to_an_uninterrupted_runs_weights(
    tmp_path, local_ray, uninterrupted
):
    # Worker 1 kills itself after step 6 (loops of 2 steps); Ray restarts the group, which
    # resumes from the last tfaccel checkpoint (step 4 or 6) and ends as if never killed.
    out = tmp_path / "killed"
    args = [*ARGS, "--out", str(out), "--crash-at-step", "5", "--max-failures", "1"]
    summary = ray_train.main(args)
    assert summary["strategy"] == "CollectiveAllReduceStrategy"  # MWMS, from Ray's TF_CONFIG
    assert summary["cluster"] == "TF_CONFIG" and summary["replicas"] == "2"
    assert int(summary["step"]) == 2 * 4  # 2 epochs of 256 examples in batches of 64
    assert (out / "model.keras").is_file()  # saved by every worker, written by the chief
    assert (out / "ckpt" / ".crashed-rank1").read_text() == "5"
    recovered = weights(out, 0)
    for a, b in zip(recovered, weights(out, 1), strict=True):
        np.testing.assert_array_equal(a, b)
    # BN moving statistics are per replica: the chief's against the first replica's.
    for kind in ("weights", "statistics"):
        for a, b in zip(weights(uninterrupted, 0, kind), weights(out, 0, kind), strict=True):
            np.testing.assert_allclose(a, b, atol=1e-6)
