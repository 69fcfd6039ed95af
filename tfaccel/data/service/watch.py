"""The watch over `local`'s servers: a dead one said at once, a stalled read ended in bounded time.

TensorFlow 2.21's tf.data service client does not give up a killed worker's task (it
retries that worker for ever) nor a dead dispatcher (it retries every second), so a
read of the job blocks inside TensorFlow, where Python cannot interrupt it. The watch
(a daemon thread of the training process) polls the servers every `poll_s`:

1. a server that exits is said on stderr at once (which one, its status or signal);
2. a dead worker is restarted at its address (`LocalService.revive`, at most
   `MAX_RESTARTS` times each): the dispatcher hands it the dead worker's task, the client
   reconnects, and the epoch ends short of the splits the dead worker had in hand;
3. while a server stays down (the dispatcher, or a worker that could not be restarted),
   the surviving workers' CPU time is the job's pulse: when they stay idle (under
   `IDLE_FRACTION` of a core) for `stall_timeout_s`, the read is stuck; the watch says
   so, interrupts the main thread (`KeyboardInterrupt` where it runs Python), and, if
   the service is still open `GRACE_S` later, stops the servers and ends the process
   with status `STALL_STATUS` (75, EX_TEMPFAIL: `tfaccel launch --max-restarts` restarts
   it, and a Trainer with a `checkpoint_dir` resumes).
"""

from __future__ import annotations

import _thread
import os
import sys
import threading
import time

STALL_STATUS = 75
MAX_RESTARTS = 3
GRACE_S = 5.0
IDLE_FRACTION = 0.05
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

__all__ = ["MAX_RESTARTS", "STALL_STATUS", "Watch", "cpu_seconds"]


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` (None when it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _how(status: int) -> str:
    return f"killed by signal {-status}" if status < 0 else f"exit status {status}"


class Watch(threading.Thread):
    """Watches a `LocalService`'s processes (started by `local`; stopped by its `close`).

    Attributes:
        deaths: (name, status) of each server that exited while watched.
        stalled: whether the watch ended a stalled read.
    """

    def __init__(self, service, stall_timeout_s: float | None, poll_s: float = 0.5, err=None):
        super().__init__(name="tfaccel-data-service-watch", daemon=True)
        self.service = service
        self.stall_timeout_s = stall_timeout_s
        self.poll_s = poll_s
        self.err = err or sys.stderr
        self.deaths: list[tuple[str, int]] = []
        self.restarts: list[int] = []  # the index (in `processes`) of each restart
        self.stalled = False
        self._stopping = threading.Event()
        self._said: set[int] = set()

    def stop(self) -> None:
        """Ends the watch (before the servers are stopped on purpose)."""
        self._stopping.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(5.0)

    def _say(self, text: str) -> None:
        try:
            print(f"tfaccel data service: {text}", file=self.err, flush=True)
        except (OSError, ValueError):
            pass

    def _server_name(self, index: int) -> str:
        if index == 0:
            return f"the dispatcher ({self.service.address})"
        return f"worker {index - 1} ({self.service.worker_addresses[index - 1]})"

    def _note_deaths(self) -> bool:
        """Says each newly exited server and restarts a dead worker (`MAX_RESTARTS` times
        each); True while a server is down (the stall clock runs)."""
        for index, process in enumerate(list(self.service.processes)):
            status = process.poll()
            if status is None or process.pid in self._said:
                continue
            self._said.add(process.pid)
            self.deaths.append((self._server_name(index), status))
            alive = sum(p.poll() is None for p in self.service.worker_processes)
            self._say(
                f"{self._server_name(index)} died ({_how(status)}); {alive} worker(s) left. "
                "Its unfinished splits of this epoch are lost (the epoch ends short)."
            )
            if index and self.restarts.count(index) < MAX_RESTARTS:
                self._restart(index)
        return any(p.poll() is not None for p in self.service.processes)

    def _restart(self, index: int) -> None:
        self.restarts.append(index)
        try:
            self.service.revive(index - 1)
        except Exception as error:  # said; the stall clock then decides
            self._say(f"{self._server_name(index)} could not be restarted: {error}")
            return
        self._say(
            f"{self._server_name(index)} restarted at the same address: the job goes on "
            "(TensorFlow's client waits for that worker's task, so without it the read "
            "would block)."
        )

    def run(self) -> None:
        window: list[tuple[float, float]] = []  # (time, survivors' CPU seconds)
        idle_since = None
        while not self._stopping.wait(self.poll_s):
            if not self._note_deaths() or self.stall_timeout_s is None:
                window, idle_since = [], None
                continue
            now = time.monotonic()
            cpu = sum(
                cpu_seconds(p.pid) or 0.0 for p in self.service.worker_processes if p.poll() is None
            )
            window = [(t, c) for t, c in window if now - t <= 5.0] + [(now, cpu)]
            span = now - window[0][0]
            if span < 1.0:
                continue
            if (cpu - window[0][1]) / span >= IDLE_FRACTION:
                idle_since = None
                continue
            idle_since = idle_since or window[0][0]
            if now - idle_since >= self.stall_timeout_s:
                self._end()
                return

    def _end(self) -> None:
        """Says the stall, interrupts the main thread, then ends the process if need be."""
        self.stalled = True
        dead = ", ".join(f"{name} ({_how(status)})" for name, status in self.deaths)
        self._say(
            f"the job is stalled: {dead} died and the workers left have been idle for "
            f"{self.stall_timeout_s:g} s (TensorFlow 2.21's client waits for ever on a lost "
            f"worker or dispatcher). Stopping: KeyboardInterrupt now, exit status "
            f"{STALL_STATUS} in {GRACE_S:g} s if it does not end. Restart the run (tfaccel "
            "launch --max-restarts N restarts it; a Trainer with checkpoint_dir resumes)."
        )
        _thread.interrupt_main()
        if self._stopping.wait(GRACE_S):
            return
        self.service.close(grace_s=1.0)
        os._exit(STALL_STATUS)
