"""Faults of `tfaccel.data.service.local`: a worker SIGKILLed mid-epoch is restarted and
the epoch ends (short of its lost splits); a dead dispatcher's stalled read is ended in
bounded time with a clear message; no process is left. Each run is a separate process,
guarded by a timeout."""

import json
import subprocess
import sys
import textwrap
import time

import pytest

from tfaccel.data.service.watch import STALL_STATUS

GUARD_S = 240

# Both jobs print the processes behind each server: a pid and the forked server behind it
# (the processes that hold its stdout).
_HOLDERS = textwrap.dedent(
    """
    import os

    def holders(pid):
        pipe = os.readlink(f"/proc/{pid}/fd/1")
        found = []
        for other in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.readlink(f"/proc/{other}/fd/1") == pipe:
                    found.append(int(other))
            except OSError:
                pass
        return found
    """
)

_JOB = textwrap.dedent(
    """
    import importlib, json, os, shlex, signal, sys, tempfile, time
    import numpy as np
    import tensorflow as tf
    from tfaccel import data
    from tfaccel.data import service
    from tfaccel.data.service import watch

    def work(x):
        time.sleep(0.004)
        return x

    def decode(x, y):
        return tf.numpy_function(work, [x], tf.float32), y

    ids = np.arange(4000)
    source = data.from_arrays(ids.astype("float32").reshape(-1, 1), ids)
    victim = int(sys.argv[1])  # 0: the dispatcher, 1: worker 0
    # With a worker the victim, the dispatcher and worker 1 (never killed) are forked from
    # the tests' worker zygote (its stand-in: argv[2:4]), not started as fresh Pythons that
    # import TensorFlow; the victim and its restart are real. (With the dispatcher the
    # victim, the workers stay real: the watch reads their CPU to find the stall.)
    python = os.path.join(tempfile.mkdtemp(), "python")
    with open(python, "w") as script:
        script.write(f"#!/bin/sh\\nexec {shlex.join([sys.executable, *sys.argv[2:4]])} \\"$@\\"\\n")
    os.chmod(python, 0o755)
    local_module, started = importlib.import_module("tfaccel.data.service.local"), []

    real_start, real = local_module._start, sys.executable

    def start(arguments, key=None):  # the dispatcher, worker 0, worker 1, then restarts
        sys.executable = python if victim and len(started) in (0, 2) else real
        try:
            started.append(real_start(arguments, key))
        finally:
            sys.executable = real
        return started[-1]

    local_module._start = start

    # The read blocks inside TensorFlow, where the KeyboardInterrupt cannot land: the
    # watch's grace after it (5 s) only delays the exit here.
    watch.GRACE_S = 1.0
    with service.local(2, stall_timeout_s=2.0) as running:
        print(json.dumps([held for p in running.processes for held in holders(p.pid)]),
              flush=True)
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


def _run_guarded(jobs, code: str, *args: str):
    """Runs `code` in a Python process of its own, in a new session (forked from one that
    imported TensorFlow: conftest.py); fails the test if it outlives GUARD_S, its
    session killed."""
    try:
        job = jobs.run([sys.executable, "-c", code, *args], timeout=GUARD_S, new_session=True)
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the job hung past {GUARD_S} s:\n{hung.output}\n{hung.stderr[-3000:]}")
    return job, job.stdout, job.stderr


@pytest.mark.parametrize("victim", [1, 0], ids=["worker", "dispatcher"])
def test_a_killed_server_ends_the_stalled_read_in_bounded_time(victim, jobs, worker_zygote):
    stand_in = worker_zygote.command([sys.executable])[1:]  # forked_worker.py SOCKET
    job, out, err = _run_guarded(jobs, _HOLDERS + _JOB, str(victim), *stand_in)
    assert out, err[-3000:]
    pids = json.loads(out.splitlines()[0])
    assert len(pids) == (5 if victim else 3), pids  # a forked server: its stand-in and fork
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


_WORK_DIR_JOB = textwrap.dedent(
    """
    import json, os, signal, sys, tempfile, threading, time
    import numpy as np
    import tensorflow as tf
    from tfaccel import data
    from tfaccel.launcher.processes import die_with_parent, free_ports

    def spawn(*arguments, forked=False):  # `tfaccel data-service ...`
        # forked: from the tests' worker zygote (argv[1:3], its stand-in): no imports
        python = [sys.executable, *(sys.argv[1:3] if forked else [])]
        return subprocess.Popen(
            [*python, "-m", "tfaccel", "data-service", *arguments, "--quiet"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            start_new_session=True, preexec_fn=die_with_parent)  # even if the job is killed

    def ready(process):  # its ready line awaited
        assert process.stdout.readline().startswith("tfaccel data-service ready:")
        return process

    def start(*arguments):
        return ready(spawn(*arguments))

    import subprocess
    work_dir = tempfile.mkdtemp()
    port, *workers = free_ports(3)
    dispatcher = ["dispatcher", "--port", str(port), "--work-dir", work_dir]
    # all at once, as data.service.local starts them (a worker waits for its dispatcher):
    # the dispatcher imports TensorFlow, the workers (never killed) are forked; then the
    # three are awaited
    servers = [spawn(*dispatcher)] + [
        spawn("worker", "--dispatcher", f"localhost:{port}", "--port", str(worker), "--host",
              "localhost", forked=True) for worker in workers]
    servers = [ready(process) for process in servers]

    print(json.dumps([held for p in servers for held in holders(p.pid)]), flush=True)
    restart = threading.Event()

    def restarter():  # a thread that outlives what it starts
        restart.wait()
        servers.append(start(*dispatcher))
        print("restarted", flush=True)
        time.sleep(3600)

    threading.Thread(target=restarter, daemon=True).start()
    ids = np.arange(3000)
    # some work an element (the kill, at step 5, lands mid-epoch whatever its size: a
    # tenth of the earlier 200,000 draws saved ~11 s of CPU)
    work = lambda x, y: (x + 0.0 * tf.reduce_sum(tf.sin(tf.random.uniform([20000]))), y)
    train = data.pipeline(data.from_arrays(ids.astype("float32").reshape(-1, 1), ids),
                          batch_size=10, training=True, preprocess=work, cache=None,
                          service=f"grpc://localhost:{port}")
    try:
        for epoch in range(2):
            seen = []
            for step, (_, y) in enumerate(train):
                seen += y.numpy().tolist()
                if epoch == 0 and step == 5:
                    os.killpg(servers[0].pid, signal.SIGKILL)
                    servers[0].wait()
                    print("killed", flush=True)
                    restart.set()
            print("epoch", epoch, len(seen), len(set(seen)), flush=True)
    finally:
        for server in servers:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
    """
)


def test_a_dispatcher_restarted_with_its_work_dir_lets_the_job_go_on(jobs, worker_zygote):
    stand_in = worker_zygote.command([sys.executable])[1:]  # forked_worker.py SOCKET
    job, out, err = _run_guarded(jobs, _HOLDERS + _WORK_DIR_JOB, *stand_in)
    assert job.returncode == 0, err[-3000:]
    lines = out.splitlines()
    assert "killed" in lines and "restarted" in lines
    # the journal kept the job: both epochs whole, the one of the restart included
    assert [line for line in lines if line.startswith("epoch")] == [
        "epoch 0 3000 3000",
        "epoch 1 3000 3000",
    ]
    pids = json.loads(lines[0])
    assert len(pids) == 5  # the dispatcher, and each worker's stand-in and fork
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in pids)
