"""Faults of `tfaccel.data.service.local`: a worker SIGKILLed mid-epoch is restarted and
the epoch ends (short of its lost splits); a dead dispatcher's stalled read is ended in
bounded time with a clear message; no process is left. Each run is a separate process,
guarded by a timeout."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tfaccel.data.service_watch import STALL_STATUS

GUARD_S = 240

_JOB = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import numpy as np
    import tensorflow as tf
    from tfaccel import data
    from tfaccel.data import service

    def work(x):
        time.sleep(0.004)
        return x

    def decode(x, y):
        return tf.numpy_function(work, [x], tf.float32), y

    ids = np.arange(4000)
    source = data.from_arrays(ids.astype("float32").reshape(-1, 1), ids)
    victim = int(sys.argv[1])  # 0: the dispatcher, 1: worker 0
    with service.local(2, stall_timeout_s=4.0) as running:
        print(json.dumps([p.pid for p in running.processes]), flush=True)
        train = data.pipeline(source, batch_size=10, training=True, preprocess=decode,
                              service=running)
        seen = []
        for step, (_, y) in enumerate(train):
            seen += y.numpy().tolist()
            if step == 5:
                os.kill(running.processes[victim].pid, signal.SIGKILL)
                print("killed", flush=True)
        print("epoch ended", len(seen), len(set(seen)), flush=True)
    """
)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("victim", [1, 0], ids=["worker", "dispatcher"])
def test_a_killed_server_ends_the_stalled_read_in_bounded_time(victim):
    job = subprocess.Popen(
        [sys.executable, "-c", _JOB, str(victim)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = job.communicate(timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        out, err = job.communicate()
        pytest.fail(f"the job hung past {GUARD_S} s:\n{out}\n{err[-3000:]}")
    pids = json.loads(out.splitlines()[0])
    assert "killed" in out, err[-3000:]
    said = [line for line in err.splitlines() if line.startswith("tfaccel data service:")]
    name = "the dispatcher" if victim == 0 else "worker 0"
    assert any(f"{name} (" in line and "died (killed by signal 9)" in line for line in said)
    if victim:  # restarted at its address: the epoch ends, short of its lost splits
        assert any("restarted at the same address" in line for line in said), err[-3000:]
        assert job.returncode == 0, err[-3000:]
        ended = [line for line in out.splitlines() if line.startswith("epoch ended")]
        seen, unique = map(int, ended[0].split()[2:4])
        assert seen == unique and 60 <= seen <= 4000
        if seen < 4000:  # the short epoch is counted and said at its end
            lost = f"delivered {seen:,} of 4,000 examples from grpc://localhost:"
            assert any(lost in line and f"{4000 - seen:,} lost" in line for line in said)
    else:  # TensorFlow 2.21: the read waits for the dispatcher for ever
        assert job.returncode in (STALL_STATUS, 1), (job.returncode, err[-3000:])
        assert any("the job is stalled" in line for line in said), err[-3000:]
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in pids)
