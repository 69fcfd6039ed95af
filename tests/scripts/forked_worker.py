"""`python forked_worker.py SOCKET SCRIPT ARGS...`: runs `python SCRIPT ARGS...` as a fork
of the worker zygote listening on SOCKET (`worker_zygote.py`), and stands for it: the job
has this process's stdin, stdout, stderr, environment, directory and CPUs; SIGTERM,
SIGINT and SIGHUP are passed on to it; this process ends as the job ended (killed by a
signal: by the same signal). Standard library only: it starts in a fraction of a second.
"""

import json
import os
import signal
import socket
import sys


def main() -> None:
    path, argv = sys.argv[1], sys.argv[2:]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
    request["cpus"] = sorted(os.sched_getaffinity(0))
    socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
    answers = conn.makefile("r")
    pid = int(answers.readline().removeprefix("pid "))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: os.kill(pid, signum))
    line = answers.readline()
    code = int(line) if line.strip() else 1  # no answer: the zygote ended
    if code < 0:
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
