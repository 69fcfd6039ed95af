"""Starts the processes of `tfaccel launch`'s workers as forks of this one, which imported
TensorFlow, Keras and tfaccel once and ran no TensorFlow op (as `fork_server.py` does for
the `jobs` fixture, but for processes that another program starts: `tests/forked.py`'s
`WorkerZygote`).

`python worker_zygote.py SOCKET` listens on the Unix socket SOCKET and prints "ready".
A worker is `python forked_worker.py SOCKET SCRIPT ARGS...` (or `-m MODULE`, `-c CODE`),
a process of a few standard-library imports that the launcher starts, signals and waits
for: it sends its argv, environment, directory, CPU affinity and its stdin, stdout and
stderr to this server, which forks the job with them and answers "pid N", then the job's
exit code. The worker forwards SIGTERM, SIGINT and SIGHUP to the job and ends as the job
ended (a signal: the same signal); the job kills itself (SIGKILL) when the worker is
gone (a SIGKILL to the worker, as the launcher sends to a stopped worker's group).
"""

import gc
import io
import json
import os
import runpy
import select
import signal
import socket
import sys
import tempfile
import threading
import types

import keras  # noqa: F401 - the imports every job would do, once
import numpy  # noqa: F401
import tensorflow  # noqa: F401

import tfaccel  # noqa: F401


def _stream(fd: int, mode: str, unbuffered: bool):
    """The text stream a fresh interpreter makes for `fd` (PYTHONUNBUFFERED honoured)."""
    if mode == "r":
        return io.TextIOWrapper(io.BufferedReader(io.FileIO(fd, "r", closefd=False)))
    raw = io.FileIO(fd, "w", closefd=False)
    errors = "backslashreplace" if fd == 2 else "strict"
    if unbuffered:
        return io.TextIOWrapper(raw, errors=errors, write_through=True)  # type: ignore[type-var]
    return io.TextIOWrapper(io.BufferedWriter(raw), errors=errors, line_buffering=fd == 2)


def _watch(conn: socket.socket) -> None:
    """Ends this job once its worker process is gone (the connection's end of file)."""
    while conn.recv(64):
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def _job(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked child: becomes `python ARGV...` with the worker's streams,
    environment, directory and CPUs; never returns (SystemExit or an exception ends it)."""
    for target, fd in zip((0, 1, 2), fds, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # found again from this job's TMPDIR
    os.chdir(request["cwd"])
    os.sched_setaffinity(0, request["cpus"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = _stream(0, "r", unbuffered)
    sys.stdout = _stream(1, "w", unbuffered)
    sys.stderr = _stream(2, "w", unbuffered)
    threading.Thread(target=_watch, args=(conn,), daemon=True).start()
    argv = list(request["argv"])
    if argv[0] == "-m":  # python -m MODULE ARGS...
        sys.argv, sys.path[0] = argv[1:], os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":  # python -c CODE ARGS...
        sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
        main = sys.modules["__main__"] = types.ModuleType("__main__")
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    else:  # python SCRIPT ARGS...
        sys.argv, sys.path[0] = argv, os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")
    sys.exit(0)


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while not data.endswith(b"\n"):
        chunk = conn.recv(1 << 20)
        assert chunk, "the worker left mid-request"
        data += chunk
    return json.loads(data), list(fds)


def _send(conn: socket.socket, line: str) -> None:
    try:
        conn.sendall(line.encode() + b"\n")
    except OSError:  # the worker is gone (killed): its job ends by itself (_watch)
        pass


def serve(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    gc.freeze()  # the imports' objects: never traversed by a job's collections
    print("ready", flush=True)
    running: dict[int, socket.socket] = {}
    while True:
        ready = select.select([listener, sys.stdin], [], [], 0.05)[0]
        if sys.stdin in ready and not sys.stdin.readline():
            break  # the tests' process closed our stdin (or ended)
        if listener in ready:
            conn, _ = listener.accept()
            request, fds = _receive(conn)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in running.values():
                    other.close()
                _job(conn, request, fds)
            for fd in fds:
                os.close(fd)
            _send(conn, f"pid {pid}")
            running[pid] = conn
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = running.pop(pid)
            _send(conn, str(os.waitstatus_to_exitcode(status)))
            conn.close()
    listener.close()
    os.unlink(path)


if __name__ == "__main__":
    serve(sys.argv[1])
