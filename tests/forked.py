"""Test jobs forked from one process that imported TensorFlow once (`scripts/fork_server.py`).

`jobs.run([sys.executable, SCRIPT, *args], timeout=240)` (or `-m MODULE`, `-c CODE`; `env=`,
`cwd=` as subprocess takes them) stands for `subprocess.run(..., capture_output=True,
text=True, timeout=240)`: the job is a process of its own, started as a fresh one (this
test's environment and directory; no TensorFlow op run before it), which a kill -9 ends as
it ends any process; it skips the ~5 s of CPU of the imports.
"""

import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import tempfile

SERVER = pathlib.Path(__file__).parent / "scripts" / "fork_server.py"


class ForkServer:
    def __init__(self):
        self.folder = tempfile.TemporaryDirectory(prefix="forked-jobs-")
        self.server = subprocess.Popen(
            [sys.executable, str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self.buffer, self.count = b"", 0

    def _line(self, deadline_s: float) -> str:
        """The server's next line, or "" after deadline_s (its own buffer: a line that
        came with the one before waits in no pipe for select)."""
        fd = self.server.stdout.fileno()
        while b"\n" not in self.buffer:
            ready, _, _ = select.select([fd], [], [], deadline_s)
            if not ready:
                return ""
            chunk = os.read(fd, 4096)
            assert chunk, f"the fork server ended (status {self.server.poll()})"
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode().strip()

    def run(self, argv, timeout=240, env=None, cwd=None, new_session=False):
        assert argv[0] == sys.executable, argv
        self.count += 1  # a job's own files: what a job left running writes goes elsewhere
        out, err = (os.path.join(self.folder.name, f"{self.count}.{n}") for n in ("out", "err"))
        env = dict(os.environ if env is None else env)
        request = {"argv": [str(a) for a in argv[1:]], "env": env}
        cwd = os.path.abspath(os.getcwd() if cwd is None else cwd)
        request.update(cwd=cwd, stdout=out, stderr=err, new_session=new_session)
        self.server.stdin.write(json.dumps(request).encode() + b"\n")
        self.server.stdin.flush()
        pid = int(self._line(300).removeprefix("pid "))  # after the imports, once
        status = self._line(timeout)
        if not status:  # as subprocess.run: kill it (its session: all it started), then raise
            (os.killpg if new_session else os.kill)(pid, signal.SIGKILL)
            self._line(60)
        stdout, stderr = (pathlib.Path(path).read_text() for path in (out, err))
        if not status:
            raise subprocess.TimeoutExpired(argv, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(argv, int(status), stdout, stderr)

    def close(self):
        self.server.stdin.close()
        self.server.wait(60)
        self.folder.cleanup()


ZYGOTE = pathlib.Path(__file__).parent / "scripts" / "worker_zygote.py"
WORKER = pathlib.Path(__file__).parent / "scripts" / "forked_worker.py"


class WorkerZygote:
    """Worker processes that another program starts (`tfaccel launch`'s), each a
    process of its own forked from one that imported TensorFlow once
    (`scripts/worker_zygote.py`): `command([sys.executable, SCRIPT, *args])` is the
    command line that runs as `python SCRIPT ARGS...` less the imports' CPU."""

    def __init__(self):
        self.folder = tempfile.TemporaryDirectory(prefix="worker-zygote-")
        self.socket = os.path.join(self.folder.name, "socket")
        self.server = subprocess.Popen(
            [sys.executable, str(ZYGOTE), self.socket],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        ready = self.server.stdout.readline()
        assert ready == b"ready\n", f"the worker zygote did not start ({ready!r})"

    def command(self, argv):
        assert argv[0] == sys.executable, argv
        return [sys.executable, str(WORKER), self.socket, *map(str, argv[1:])]

    def close(self):
        self.server.stdin.close()
        self.server.wait(60)
        self.folder.cleanup()
