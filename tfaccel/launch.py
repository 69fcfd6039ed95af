"""Run a multi-worker job as N local processes on TensorFlow's own distributed runtime.

Each worker gets a `TF_CONFIG` naming every worker on free 127.0.0.1 ports (worker 0
is the chief), optionally its own CPU cores, and its output lines prefixed with
`[worker i]`. As soon as one worker fails, the others are terminated and the
launcher exits with that worker's status; `timeout_s` bounds the whole run (status
124). This is the way to try a multi-worker script on one machine before a cluster:

    tfaccel launch --workers 2 -- python recipes/digits.py
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

TIMEOUT_STATUS = 124
GRACE_S = 10.0


def free_ports(count: int) -> list[int]:
    """Returns `count` distinct free TCP ports on 127.0.0.1."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def tf_config(ports: list[int], index: int) -> str:
    """The `TF_CONFIG` of worker `index` in a local cluster on `ports`."""
    workers = [f"127.0.0.1:{port}" for port in ports]
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def worker_cores(index: int, cpus_per_worker: int | None) -> set[int] | None:
    """The CPU cores worker `index` is pinned to (wrapping round the available cores)."""
    if not cpus_per_worker:
        return None
    cores = sorted(os.sched_getaffinity(0))
    start = index * cpus_per_worker
    return {cores[(start + j) % len(cores)] for j in range(cpus_per_worker)}


def _stream(process: subprocess.Popen, index: int, out, lock: threading.Lock) -> None:
    for line in iter(process.stdout.readline, b""):
        with lock:
            out.write(f"[worker {index}] {line.decode(errors='replace')}")
            out.flush()


def _terminate(processes: list[subprocess.Popen]) -> None:
    """SIGTERM every live worker's process group, then SIGKILL after a grace period."""
    for process in processes:
        if process.poll() is None:
            _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def launch(
    command: list[str],
    workers: int,
    *,
    cpus_per_worker: int | None = None,
    timeout_s: float | None = None,
    out=None,
) -> int:
    """Runs `command` as `workers` local processes; returns the job's exit status.

    Args:
        command: the program and its arguments, e.g. `["python", "train.py"]`.
        workers: how many worker processes (>= 1).
        cpus_per_worker: pin each worker to this many cores (and size TensorFlow's
            thread pools to match).
        timeout_s: terminate everything after this many seconds (status 124).
        out: where prefixed output goes (default stdout).

    Raises:
        ValueError: `workers` < 1, `cpus_per_worker` < 1, or an empty command.
    """
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"--workers must be an integer >= 1, got {workers!r}.")
    if cpus_per_worker is not None and cpus_per_worker < 1:
        raise ValueError(f"--cpus-per-worker must be >= 1, got {cpus_per_worker!r}.")
    if not command:
        raise ValueError("No command to launch: put it after `--`, e.g. -- python train.py")
    out = out or sys.stdout
    ports = free_ports(workers)
    lock = threading.Lock()
    processes, readers = [], []
    for index in range(workers):
        env = dict(os.environ, TF_CONFIG=tf_config(ports, index), PYTHONUNBUFFERED="1")
        cores = worker_cores(index, cpus_per_worker)
        if cores:
            threads = str(len(cores))
            env.update(TF_NUM_INTRAOP_THREADS=threads, OMP_NUM_THREADS=threads)
        process = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=(lambda c=cores: os.sched_setaffinity(0, c)) if cores else None,
        )
        processes.append(process)
        reader = threading.Thread(target=_stream, args=(process, index, out, lock), daemon=True)
        reader.start()
        readers.append(reader)
    return _supervise(processes, readers, timeout_s, out)


def _supervise(processes, readers, timeout_s, out) -> int:
    received = []

    def forward(signum, frame):
        received.append(signum)
        for process in processes:
            if process.poll() is None:
                _signal_group(process, signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while True:
            statuses = [p.poll() for p in processes]
            failed = [(i, s) for i, s in enumerate(statuses) if s not in (None, 0)]
            if failed:
                index, status = failed[0]
                out.write(f"[launch] worker {index} exited with status {status}; stopping all\n")
                _terminate(processes)
                return status if status > 0 else 128 - status
            if all(s == 0 for s in statuses):
                return 0
            if deadline is not None and time.monotonic() > deadline:
                out.write(f"[launch] timed out after {timeout_s:g} s; stopping all workers\n")
                _terminate(processes)
                return TIMEOUT_STATUS
            time.sleep(0.1)
    finally:
        for reader in readers:
            reader.join(timeout=5)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
