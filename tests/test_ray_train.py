"""Ray Train: recipes/ray_train.py on a local Ray cluster (2 CPUs), with a kill and recovery."""

import os
import pathlib
import sys

import numpy as np
import pytest

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


def run(tmp_path, name, *extra):
    out = tmp_path / name
    args = ["--smoke", "--workers", "2", "--deterministic", "--out", str(out)]
    args += ["--steps-per-loop", "2", "--checkpoint-every", "2", *extra]
    return ray_train.main(args), out


def test_two_ray_workers_train_then_a_killed_worker_recovers(tmp_path, local_ray):
    summary, out = run(tmp_path, "plain")
    assert summary["strategy"] == "CollectiveAllReduceStrategy"  # MWMS, from Ray's TF_CONFIG
    assert summary["cluster"] == "TF_CONFIG" and summary["replicas"] == "2"
    assert int(summary["step"]) == 2 * 4  # 2 epochs of 256 examples in batches of 64
    plain = weights(out, 0)
    assert (out / "model.keras").is_file()  # saved by every worker, written by the chief
    for a, b in zip(plain, weights(out, 1), strict=True):
        np.testing.assert_array_equal(a, b)

    statistics = weights(out, 0, "statistics")  # BN moving statistics: the chief's own

    # Worker 1 kills itself after step 6 (loops of 2 steps); Ray restarts the group, which
    # resumes from the last tfaccel checkpoint (step 4 or 6) and ends as if never killed.
    summary, out = run(tmp_path, "killed", "--crash-at-step", "5", "--max-failures", "1")
    assert (out / "ckpt" / ".crashed-rank1").read_text() == "5"
    assert int(summary["step"]) == 8
    for a, b in zip(plain, weights(out, 0), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    for a, b in zip(statistics, weights(out, 0, "statistics"), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    for a, b in zip(plain, weights(out, 1), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
