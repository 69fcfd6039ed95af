"""`tfaccel launch`: local multi-worker jobs (subprocesses, bounded in time)."""

import json
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from tfaccel import launch

JOB = pathlib.Path(__file__).parent / "scripts" / "train_job.py"


def tfaccel_launch(*args, timeout=240):
    cmd = [sys.executable, "-m", "tfaccel", "launch", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def python(code):
    return [sys.executable, "-c", code]


def test_workers_zero_is_refused():
    result = tfaccel_launch("--workers", "0", "--", "true")
    assert result.returncode == 2
    assert "--workers must be >= 1" in result.stderr
    with pytest.raises(ValueError, match="--workers must be an integer >= 1"):
        launch.launch(["true"], 0)


def test_each_worker_gets_its_tf_config_and_prefixed_output():
    code = "import os; print(os.environ['TF_CONFIG'])"
    result = tfaccel_launch("--workers", "2", "--", *python(code))
    assert result.returncode == 0, result.stdout
    lines = [line for line in result.stdout.splitlines() if line.startswith("[worker")]
    configs = {int(line[8]): json.loads(line.split("] ", 1)[1]) for line in lines}
    assert configs[0]["task"] == {"type": "worker", "index": 0}
    assert configs[1]["task"] == {"type": "worker", "index": 1}
    workers = configs[0]["cluster"]["worker"]
    assert workers == configs[1]["cluster"]["worker"] and len(set(workers)) == 2
    assert all(w.startswith("127.0.0.1:") for w in workers)


def test_cpus_per_worker_pins_each_worker():
    code = "import os; print(sorted(os.sched_getaffinity(0)), os.environ['TF_NUM_INTRAOP_THREADS'])"
    result = tfaccel_launch("--workers", "2", "--cpus-per-worker", "1", "--", *python(code))
    assert result.returncode == 0
    assert result.stdout.count(" 1\n") == 2  # one core, one intra-op thread each


def test_one_worker_killed_stops_the_job_quickly():
    code = (
        "import json, os, time\n"
        "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
        "time.sleep(1)\n"
        "if index == 1: os.kill(os.getpid(), 9)\n"
        "time.sleep(120)\n"
    )
    start = time.monotonic()
    result = tfaccel_launch("--workers", "2", "--", *python(code), timeout=60)
    assert result.returncode != 0
    assert time.monotonic() - start < 30
    assert "worker 1 exited with status -9" in result.stdout


def test_timeout_bounds_the_run():
    result = tfaccel_launch(
        "--workers", "2", "--timeout", "2", "--", *python("import time; time.sleep(120)")
    )
    assert result.returncode == launch.TIMEOUT_STATUS
    assert "timed out" in result.stdout


def test_two_workers_train_with_the_trainer(tmp_path):
    out = tmp_path / "out"
    result = tfaccel_launch(
        "--workers",
        "2",
        "--timeout",
        "200",
        "--",
        sys.executable,
        str(JOB),
        "--ckpt",
        str(tmp_path / "ckpt"),
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stdout[-3000:]
    chief, other = (dict(np.load(f"{out}.worker{i}.npz")) for i in (0, 1))
    for key in chief:
        np.testing.assert_array_equal(chief[key], other[key])
    assert chief["last_loss"] < chief["first_loss"]
    assert chief["seen"] == 3 * 96  # each example once per epoch across the workers
    assert chief["id_sum"] == 3 * 96 * 95 / 2
    assert (tmp_path / "ckpt" / "checkpoint").exists()
    assert not list((tmp_path / "ckpt").glob(".worker*")), "non-chief temp dirs are removed"


def test_own_shard_input_on_two_cpu_workers_equals_the_distributed_iterator(tmp_path):
    # One CPU replica per worker: each worker iterates its own shard (no multi-device
    # iterator, see inputs.local_shard); the numbers equal the distributed iterator's.
    runs = {}
    for name, extra in (("own", []), ("distributed", ["--distributed-iterator"])):
        out = tmp_path / name
        result = tfaccel_launch(
            *("--workers", "2", "--timeout", "200", "--", sys.executable, str(JOB)),
            *("--augment", "--epochs", "2", "--ckpt", str(tmp_path / f"ckpt-{name}")),
            *("--out", str(out), *extra),
        )
        assert result.returncode == 0, result.stdout[-3000:]
        runs[name] = dict(np.load(f"{out}.worker0.npz"))
    own, distributed = runs["own"], runs["distributed"]
    assert own["local_shard"].all() and own["local_shard"].size >= 1
    assert not distributed["local_shard"].any()
    assert own["seen"] == distributed["seen"] == 2 * 96
    assert own["id_sum"] == distributed["id_sum"] == 2 * 96 * 95 / 2
    for key in own:
        if key.startswith("arr_"):
            np.testing.assert_allclose(own[key], distributed[key], rtol=1e-5, atol=1e-6)


def test_readme_model_fit_script_runs_on_two_workers(tmp_path):
    from test_readme import README, python_blocks

    (block,) = python_blocks(README.read_text(), sections=("Porting from `model.fit`",))
    script = tmp_path / "fit_script.py"
    script.write_text(block)
    result = tfaccel_launch("--workers", "2", "--timeout", "200", "--", sys.executable, str(script))
    assert result.returncode == 0, result.stdout[-3000:]
    finals = {
        line[:10]: float(line.rsplit(" ", 1)[1])
        for line in result.stdout.splitlines()
        if "validation accuracy:" in line
    }
    assert set(finals) == {"[worker 0]", "[worker 1]"}
    assert finals["[worker 0]"] == finals["[worker 1]"] > 0.6  # one model, trained together
    assert "CollectiveAllReduceStrategy" in result.stdout and "replicas                2" in (
        result.stdout
    )
    evaluated = re.findall(r"all digits: \{'accuracy': ([0-9.]+)", result.stdout)
    assert len(evaluated) == 2 and min(map(float, evaluated)) > 0.6  # the user's model, trained
