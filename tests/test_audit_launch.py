"""The launcher's workers stop with it: killed, hung up, or asked twice."""

import os
import signal
import subprocess
import sys
import time

WORKER = (
    "import os, signal, time\n"
    "for name in {ignored}: signal.signal(getattr(signal, name), signal.SIG_IGN)\n"
    "print('pid', os.getpid(), flush=True)\n"
    "time.sleep(300)\n"
)


def start(ignored=()):
    code = WORKER.format(ignored=list(ignored))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfaccel", "launch", "--workers", "2", "--", sys.executable, "-c"]
        + [code],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    pids, lines = [], []
    while len(pids) < 2:
        line = launcher.stdout.readline()
        assert line, "".join(lines)
        lines.append(line)
        if "] pid " in line:
            pids.append(int(line.rsplit(" ", 1)[1]))
    return launcher, pids


def gone(pid, within_s=60.0):
    """Whether `pid` is gone (or a zombie) within `within_s` (a bound, not a timing assert)."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.2)
    return False


def test_workers_die_with_a_killed_launcher():
    launcher, pids = start()
    try:
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=60)
        assert all(gone(pid) for pid in pids)
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_two_ctrl_c_escalate_to_sigterm_then_sigkill():
    launcher, pids = start(ignored=("SIGINT", "SIGTERM"))
    try:
        os.kill(launcher.pid, signal.SIGINT)
        lines = [launcher.stdout.readline()]
        while "Ctrl-C again" not in lines[-1]:
            lines.append(launcher.stdout.readline())
            assert lines[-1], "".join(lines)
        os.kill(launcher.pid, signal.SIGINT)
        output, _ = launcher.communicate(timeout=120)
        assert launcher.returncode != 0
        assert "SIGINT: stopping the workers (SIGTERM; SIGKILL in" in output
        assert all(gone(pid) for pid in pids)
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_slurm_allocation_without_a_job_step_is_no_cluster():
    import pytest

    from tfaccel import cluster

    env = {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "node1"}
    with pytest.warns(cluster.SlurmAllocationWarning, match="no SLURM_STEP_ID.*srun"):
        assert cluster.detect(env).source == "none"


def test_joining_a_cluster_names_the_variables_obeyed():
    from tfaccel import cluster

    config = (
        '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, '
        '"task": {"type": "worker", "index": 1}}'
    )
    line = cluster.obeyed(cluster.detect({"TF_CONFIG": config}))
    assert "2-worker cluster as worker 1" in line and "from TF_CONFIG" in line
    assert "unset TF_CONFIG to run alone" in line


def _stale_tf_config():
    import json

    from tfaccel.launcher import launch

    return json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in launch.free_ports(2)]},
            "task": {"type": "worker", "index": 0},
        }
    )


def test_peers_that_never_come_are_named_within_the_startup_timeout(monkeypatch):
    import pytest

    from tfaccel import devices

    monkeypatch.setenv("TF_CONFIG", _stale_tf_config())
    with pytest.raises(devices.DeviceConfigError, match=r"never came within 0.5 s.*TF_CONFIG"):
        devices.strategy("auto", startup_timeout_s=0.5)


WAITER = (
    "from tfaccel import devices\n"
    "devices.strategy('auto', startup_timeout_s=None)\n"
    "print('joined', flush=True)\n"
)


def test_sigterm_stops_a_worker_waiting_for_its_peers():
    env = dict(os.environ, TF_CONFIG=_stale_tf_config())
    waiter = subprocess.Popen(
        [sys.executable, "-c", WAITER],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        lines = [waiter.stderr.readline()]
        while "joining a 2-worker cluster" not in lines[-1]:
            lines.append(waiter.stderr.readline())
            assert lines[-1], "".join(lines)
        assert "from TF_CONFIG" in lines[-1]
        time.sleep(0.5)  # inside the wait now
        waiter.send_signal(signal.SIGTERM)
        assert waiter.wait(timeout=60) == 128 + signal.SIGTERM
        assert "joined" not in waiter.stdout.read()
        assert "tfaccel: SIGTERM while worker 127.0.0.1:" in waiter.stderr.read()
    finally:
        if waiter.poll() is None:
            waiter.kill()


CTRL_C_WHILE_STARTING = (
    "import os, signal, subprocess, sys\n"
    "from tfaccel.launcher import launch\n"
    "real = subprocess.Popen\n"
    "def popen(*args, **kwargs):  # Ctrl-C lands right after the first worker starts\n"
    "    process = real(*args, **kwargs)\n"
    "    print('started', process.pid, flush=True)\n"
    "    os.kill(os.getpid(), signal.SIGINT)\n"
    "    return process\n"
    "launch.subprocess.Popen = popen\n"
    "status = launch.launch([sys.executable, '-c', 'import time; time.sleep(120)'], 2)\n"
    "print('status', status, flush=True)\n"
)


def test_ctrl_c_while_the_workers_start_is_passed_on_not_a_traceback():
    """The handlers are in place before the first worker starts: the started worker gets
    the SIGINT, no other worker starts, and the launcher ends with its status."""
    result = subprocess.run(
        [sys.executable, "-c", CTRL_C_WHILE_STARTING],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    started = [line for line in result.stdout.splitlines() if line.startswith("started")]
    assert len(started) == 1, result.stdout
    assert "SIGINT passed on to the workers" in result.stdout + result.stderr
    status = int(result.stdout.rsplit("status ", 1)[1])  # the worker's: 130, or 1 when the
    assert status != 0, result.stdout  # SIGINT lands before Python's own handler is set
    assert gone(int(started[0].split()[1]))
