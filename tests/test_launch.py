"""`tfaccel launch`: local multi-worker jobs (subprocesses, bounded in time)."""

import json
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from run_compare import assert_same_run

from tfaccel.launcher import launch

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


def job_command(zygote, tmp, name, *extra):
    """The training job, 2 epochs on a seeded `tfaccel.data` pipeline (exact resume); each
    worker a process forked from one that imported TensorFlow (conftest's worker_zygote)."""
    ckpt, out = str(tmp / f"{name}-ckpt"), str(tmp / name)
    job = [sys.executable, str(JOB), "--ckpt", ckpt, "--out", out]
    history = ["--history-log", str(tmp / f"{name}.jsonl")]
    return zygote.command([*job, "--augment", "--epochs", "2", *history, *extra])


def worker_results(tmp, name):
    return [dict(np.load(f"{tmp / name}.worker{i}.npz")) for i in (0, 1)]


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory, worker_zygote):
    """An uninterrupted two-worker run of the training job: (launch result, its folder)."""
    tmp = tmp_path_factory.mktemp("two_workers")
    result = tfaccel_launch(
        "--workers", "2", "--timeout", "200", "--", *job_command(worker_zygote, tmp, "out")
    )
    return result, tmp


def test_two_workers_train_with_the_trainer(two_workers):
    result, tmp = two_workers
    assert result.returncode == 0, result.stdout[-3000:]
    chief, other = worker_results(tmp, "out")
    for key in chief:
        np.testing.assert_array_equal(chief[key], other[key])
    assert chief["last_loss"] < chief["first_loss"]
    assert chief["seen"] == 2 * 96  # each example once per epoch across the workers
    assert chief["id_sum"] == 2 * 96 * 95 / 2
    assert (tmp / "out-ckpt" / "checkpoint").exists()
    assert not list((tmp / "out-ckpt").glob(".worker*")), "non-chief temp dirs are removed"
    # A normal shutdown's gRPC chatter (a peer's heartbeat to the exited chief) is hidden.
    assert "Connection refused" not in result.stdout and "GRPC" not in result.stdout


def test_own_shard_input_on_two_cpu_workers_equals_the_distributed_iterator(
    tmp_path, two_workers, worker_zygote
):
    # One CPU replica per worker: each worker iterates its own shard (no multi-device
    # iterator, see feed.local_shard); the numbers equal the distributed iterator's.
    command = job_command(worker_zygote, tmp_path, "out", "--distributed-iterator")
    result = tfaccel_launch("--workers", "2", "--timeout", "200", "--", *command)
    assert result.returncode == 0, result.stdout[-3000:]
    distributed, _ = worker_results(tmp_path, "out")
    own, _ = worker_results(two_workers[1], "out")
    assert own["local_shard"].all() and own["local_shard"].size >= 1
    assert not distributed["local_shard"].any()
    assert own["seen"] == distributed["seen"] == 2 * 96
    assert own["id_sum"] == distributed["id_sum"] == 2 * 96 * 95 / 2
    for key in (k for k in own if k.startswith("arr_")):
        np.testing.assert_allclose(own[key], distributed[key], rtol=1e-5, atol=1e-6)


# -- restarts ----------------------------------------------------------------------------------


def test_max_restarts_resumes_a_killed_worker_to_the_uninterrupted_weights(
    tmp_path, two_workers, worker_zygote
):
    # Worker 1 SIGKILLs itself at step 14 (a marker file makes it once); the launcher
    # restarts both, and the Trainer resumes from the checkpoint of step 12.
    command = job_command(worker_zygote, tmp_path, "out", "--kill-at", "14", "--kill-worker", "1")
    result = tfaccel_launch(
        "--workers", "2", "--max-restarts", "2", "--timeout", "200", "--", *command
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "worker 1 died (signal 9); restarting all workers (1 of 2)" in result.stderr
    assert "(2 of 2)" not in result.stderr
    assert (tmp_path / "out.killed").read_text() == "14"
    reference, _ = worker_results(two_workers[1], "out")
    for resumed in worker_results(tmp_path, "out"):
        for key in (k for k in reference if k.startswith("arr_")):
            np.testing.assert_allclose(resumed[key], reference[key], atol=1e-6)
        assert resumed["step"] == 24 and resumed["seen"] == 2 * 96
        assert resumed["id_sum"] == 2 * 96 * 95 / 2  # no batch repeated or skipped


ONCE = (
    "import json, os, sys\n"
    "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
    "marker = sys.argv[1]\n"
    "if index == 1 and not os.path.exists(marker):\n"
    "    open(marker, 'w').close()\n"
    "    os.kill(os.getpid(), 9)\n"
    "print('done', index)\n"
)


def test_a_worker_killed_once_is_restarted_and_the_job_succeeds(tmp_path):
    result = tfaccel_launch(
        "--workers", "2", "--max-restarts", "3", "--", *python(ONCE), str(tmp_path / "marker")
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "worker 1 died (signal 9); restarting all workers (1 of 3)" in result.stderr
    assert "(2 of 3)" not in result.stderr
    assert result.stdout.count("[worker 1] done 1") == 1  # in the second start


def test_restarts_give_up_with_the_last_failure_status(tmp_path):
    result = tfaccel_launch("--workers", "2", "--max-restarts", "2", "--", *python("exit(3)"))
    assert result.returncode == 3
    for line in ("(1 of 2)", "(2 of 2)", "giving up after 2 restart(s), exit status 3"):
        assert line in result.stderr, result.stderr
    assert "worker 0 failed (exit status 3)" in result.stderr or "worker 1 failed" in result.stderr


@pytest.mark.parametrize("code, status", [("exit(2)", 2), ("pass", 0)], ids=["usage", "clean"])
def test_no_restart_after_a_usage_error_or_a_clean_exit(code, status):
    result = tfaccel_launch("--workers", "2", "--max-restarts", "3", "--", *python(code))
    assert result.returncode == status
    assert "restarting" not in result.stderr and "giving up" not in result.stderr


def test_max_restarts_must_be_a_count():
    result = tfaccel_launch("--workers", "2", "--max-restarts", "-1", "--", "true")
    assert result.returncode == 2
    assert "--max-restarts must be an integer >= 0" in result.stderr


# -- output ------------------------------------------------------------------------------------

NOISE = (
    "E0000 base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort UNAVAILABLE: "
    "Failed to send RPC to coordination service.\n"
    "Additional GRPC error information from remote target /job:worker/replica:0/task:0\n"
    ':UNKNOWN:Error received from peer {grpc_message:"Connection refused", grpc_status:14}'
)


def noisy_worker(exit_status: int) -> list[str]:
    """Worker 0 exits after a second; worker 1 then logs gRPC shutdown noise and exits."""
    code = (
        "import json, os, sys, time\n"
        "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
        "if index == 0:\n"
        "    time.sleep(1.0)\n"
        "if index == 1:\n"
        "    print('Connection refused is fine while both run', flush=True)\n"
        "    time.sleep(2.5)\n"
        f"    print({NOISE!r}, file=sys.stderr, flush=True)\n"
        f"    sys.exit({exit_status})\n"
    )
    return python(code)


def test_shutdown_grpc_noise_is_hidden_when_the_job_succeeds():
    result = tfaccel_launch("--workers", "2", "--", *noisy_worker(0))
    assert result.returncode == 0
    assert "[worker 1] Connection refused is fine while both run" in result.stdout
    assert "StartAbort" not in result.stdout and "grpc_message" not in result.stdout
    assert "GRPC" not in result.stdout


def test_shutdown_grpc_noise_is_shown_when_the_job_fails():
    result = tfaccel_launch("--workers", "2", "--", *noisy_worker(1))
    assert result.returncode == 1
    for part in ("[worker 1] E0000", "[worker 1] Additional GRPC", "grpc_message"):
        assert part in result.stdout, result.stdout


def test_docs_model_fit_script_runs_on_two_workers(tmp_path, worker_zygote):
    from test_docs import DOCS, page_blocks

    (block,) = page_blocks(DOCS / "how-to" / "port-model-fit.md")
    script = tmp_path / "fit_script.py"
    script.write_text(block)
    command = worker_zygote.command([sys.executable, str(script)])
    result = tfaccel_launch("--workers", "2", "--timeout", "200", "--", *command)
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


# -- elastic: a run saved on N workers resumes on M (data.order.global_order) ---------------------


def test_two_workers_killed_resume_on_one_then_on_two_exactly(tmp_path, two_workers, worker_zygote):
    first, second = str(tmp_path / "k1"), str(tmp_path / "k2")
    command = job_command(worker_zygote, tmp_path, "out", "--kill-at", "8", "--kill-worker", "1")
    killed = tfaccel_launch("--workers", "2", "--timeout", "200", "--", *command, "--marker", first)
    assert killed.returncode != 0 and pathlib.Path(first).exists()
    command = job_command(worker_zygote, tmp_path, "out", "--kill-at", "20", "--marker", second)
    killed = tfaccel_launch("--workers", "1", "--timeout", "200", "--", *command)
    assert killed.returncode != 0 and pathlib.Path(second).exists()
    finished = tfaccel_launch(
        "--workers", "2", "--timeout", "200", "--", *job_command(worker_zygote, tmp_path, "out")
    )
    assert finished.returncode == 0, finished.stdout[-3000:]
    assert_same_run(tmp_path, "out", "out", suffix=".worker0.npz", reference_tmp=two_workers[1])


def test_min_workers_continues_without_a_lost_worker_exactly(tmp_path, two_workers, worker_zygote):
    # Worker 1 dies at step 14 with no restarts left: the job re-forms on one worker from
    # the checkpoint of step 12 and ends with the uninterrupted two-worker run's numbers.
    ckpt = str(tmp_path / "out-ckpt")
    command = job_command(worker_zygote, tmp_path, "out", "--kill-at", "14", "--kill-worker", "1")
    result = tfaccel_launch(
        "--workers",
        "2",
        "--min-workers",
        "1",
        "--checkpoint-dir",
        ckpt,
        "--timeout",
        "200",
        "--",
        *command,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert (
        "worker 1 died (signal 9) after 0 restart(s): worker 1 lost; continuing on 1 worker(s) "
        f"from step 12 (the last checkpoint in {ckpt})" in result.stderr
    )
    assert_same_run(tmp_path, "out", "out", suffix=".worker0.npz", reference_tmp=two_workers[1])


def test_max_workers_grows_a_shrunken_job_back_exactly(tmp_path, two_workers, worker_zygote):
    # Worker 1 dies at step 14 (once): the job goes on one worker from step 12; once that
    # one saves a newer checkpoint, the launcher stops it (SIGTERM: the Trainer saves) and
    # re-forms the job on two workers, which ends with the uninterrupted run's numbers. Alone,
    # the worker sleeps 0.5 s a call (6 calls of 2 steps): the launcher polls every 0.5 s.
    ckpt = str(tmp_path / "out-ckpt")
    kill = ["--kill-at", "14", "--kill-worker", "1", "--alone-sleep", "0.5"]
    command = job_command(worker_zygote, tmp_path, "out", *kill)
    elastic = ["--min-workers", "1", "--max-workers", "2", "--checkpoint-dir", ckpt]
    result = tfaccel_launch("--workers", "2", *elastic, "--timeout", "300", "--", *command)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "worker 1 lost; continuing on 1 worker(s) from step 12" in result.stderr
    assert "[launch] capacity back: re-forming the job on 2 worker(s) from step" in result.stderr
    assert_same_run(tmp_path, "out", "out", suffix=".worker0.npz", reference_tmp=two_workers[1])


def test_min_workers_must_be_between_one_and_workers():
    result = tfaccel_launch("--workers", "2", "--min-workers", "3", "--", "true")
    assert result.returncode == 2
    assert "--min-workers must be an integer from 1 to --workers (2)" in result.stderr
