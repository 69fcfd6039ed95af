"""Runs test jobs (`python SCRIPT ARGS...`, `-m MODULE ...`, `-c CODE ...`) in processes
forked from this one, which has imported TensorFlow, Keras and tfaccel once and run no
TensorFlow op: each job starts as in a fresh process, less the ~5 s of CPU of those
imports (`tests/forked.py`).

One JSON request a line on stdin: {"argv": [SCRIPT, ARGS...], "env": {...}, "cwd": ...,
"stdout": PATH, "stderr": PATH, "new_session": BOOL}. Two lines back for each: "pid N"
when the job has started, then its exit code (negative: the signal that ended it), as
`subprocess` gives.
"""

import gc
import json
import os
import runpy
import sys
import types

import keras  # noqa: F401 - the imports every job would do, once
import numpy  # noqa: F401
import tensorflow  # noqa: F401

import tfaccel  # noqa: F401


def _job(request: dict) -> None:
    """In the forked child: becomes `python ARGV...`, then ends this process as
    the interpreter ends it (atexit handlers, threads joined, a traceback and status 1
    for an exception, SystemExit's status)."""
    if request.get("new_session"):
        os.setsid()  # as Popen's start_new_session
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the process's stdin, as a fresh one has
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
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


def serve() -> None:
    gc.freeze()  # the imports' objects: never traversed by a job's collections (copy on write)
    while line := sys.stdin.readline():
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _job(request)  # never returns: SystemExit or an exception ends the child
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)


if __name__ == "__main__":
    serve()
