"""Ctrl-C, SIGTERM and SIGHUP to the launcher, passed on to its workers.

`Stops.installed()` holds the launcher's handlers from before the first worker starts to
the end of the supervision, so a Ctrl-C while the workers start is passed on like any
other (no `KeyboardInterrupt` traceback, no worker left unsignalled): Ctrl-C goes to the
workers as SIGINT; a second Ctrl-C, SIGTERM or SIGHUP sends them SIGTERM, then SIGKILL
`grace_s` later (`kill_due`). The handler only signals and records; the lines to say are
queued in `notes` for the loop to write (it must not take the relay's lock).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator


def signal_group(process: subprocess.Popen, sig: int) -> None:
    """Sends `sig` to the process group `process` leads (gone already: nothing)."""
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


class Stops:
    """The stops asked of the launcher, and what it passed on to `processes`."""

    def __init__(self, processes: list[subprocess.Popen], grace_s: float) -> None:
        self.processes, self.grace_s = processes, grace_s
        self.received: list[int] = []
        self.kill_at: list[float] = []  # when the workers get SIGKILL, once a stop was asked
        self.notes: list[str] = []
        self.sent: int | None = None  # the last signal passed on
        self._signalled: dict[int, int] = {}  # pid: the last signal it was sent

    def forward(self, signum: int, frame: object = None) -> None:
        """The signal handler: passes `signum` on (a second Ctrl-C as SIGTERM)."""
        self.received.append(signum)
        repeated = signum == signal.SIGINT and self.received.count(signal.SIGINT) > 1
        sent = signal.SIGTERM if repeated or signum == signal.SIGHUP else signum
        self.sent = sent
        for process in self.processes:
            self._send(process, sent)
        if sent == signal.SIGINT and self.received.count(signal.SIGINT) == 1:
            self.notes.append(
                "[launch] SIGINT passed on to the workers; Ctrl-C again stops them (SIGTERM, "
                f"then SIGKILL after {self.grace_s:g} s)\n"
            )
        if sent == signal.SIGTERM and not self.kill_at:
            self.kill_at.append(time.monotonic() + self.grace_s)
            self.notes.append(
                f"[launch] {signal.Signals(signum).name}: stopping the workers (SIGTERM; "
                f"SIGKILL in {self.grace_s:g} s)\n"
            )

    def catch_up(self, process: subprocess.Popen) -> None:
        """Sends a worker started after a stop was asked what the others were sent (a
        signal that lands between its start and its `Relay.follow` would miss it)."""
        if self.sent is not None and self._signalled.get(process.pid) != self.sent:
            self._send(process, self.sent)

    def _send(self, process: subprocess.Popen, sig: int) -> None:
        if process.poll() is None:
            self._signalled[process.pid] = sig
            signal_group(process, sig)

    def kill_due(self) -> None:
        """SIGKILLs the live workers once the grace after a SIGTERM is over."""
        if self.kill_at and time.monotonic() > self.kill_at[0]:
            for process in self.processes:
                if process.poll() is None:
                    signal_group(process, signal.SIGKILL)

    @contextlib.contextmanager
    def installed(self) -> Iterator[Stops]:
        """The handlers, in the main thread (elsewhere Python cannot set them)."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
            previous = {s: signal.signal(s, self.forward) for s in stops}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
