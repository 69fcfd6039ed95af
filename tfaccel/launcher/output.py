"""The launcher's output relay: each worker's lines, prefixed, without shutdown noise.

When worker 0 (which hosts TensorFlow's coordination service) exits before its peers,
they log its disappearance on their way out through gRPC: "Failed to send RPC to
coordination service ... Connection refused", "Additional GRPC error information ...".
On a job that succeeds these lines say nothing; they only look like a failure. So once a
worker has exited, lines of that kind are held back: dropped if every worker ends with
status 0, printed (as they came, prefixed) at the end otherwise. Before any worker
exits, every line passes at once.
"""

from __future__ import annotations

import re
import subprocess
import threading
from typing import TextIO

# What TensorFlow's runtime logs when a peer's gRPC server is gone (one message spans
# several lines: the log line, then the gRPC error's details).
SHUTDOWN_NOISE = re.compile(
    r"coordination service|CoordinationService|coordination_service"
    r"|GRPC error|grpc_message|grpc_status|failed to connect to all addresses"
    r"|Connection refused|Connection reset by peer|Socket closed"
    r"|BaseCollectiveExecutor::StartAbort"
)


class Relay:
    """Copies worker output to `out` with `[worker i]` prefixes (see the module docstring)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.lock = threading.Lock()
        self.held: list[str] = []
        self.processes: list[subprocess.Popen] = []
        self.readers: list[threading.Thread] = []

    def follow(self, process: subprocess.Popen, index: int) -> None:
        """Starts relaying `process`'s stdout (with its stderr) as worker `index`."""
        self.processes.append(process)
        reader = threading.Thread(target=self._copy, args=(process, index), daemon=True)
        reader.start()
        self.readers.append(reader)

    def _copy(self, process: subprocess.Popen, index: int) -> None:
        assert process.stdout is not None  # the launcher starts it with stdout=PIPE
        for raw in iter(process.stdout.readline, b""):
            line = f"[worker {index}] {raw.decode(errors='replace')}"
            with self.lock:
                if self._shutting_down() and SHUTDOWN_NOISE.search(line):
                    self.held.append(line)
                    continue
                self.out.write(line)
                self.out.flush()

    def _shutting_down(self) -> bool:
        return any(p.poll() is not None for p in self.processes)

    def write(self, text: str) -> None:
        """A line of the launcher's own, between workers' lines."""
        with self.lock:
            self.out.write(text)
            self.out.flush()

    def finish(self, succeeded: bool) -> int:
        """Waits for the readers; prints the held lines unless the job succeeded.

        Returns the number of lines dropped.
        """
        for reader in self.readers:
            reader.join(timeout=5)
        with self.lock:
            held, self.held = self.held, []
            if succeeded:
                return len(held)
            for line in held:
                self.out.write(line)
            self.out.flush()
        return 0
