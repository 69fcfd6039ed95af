"""Meeting the other workers before TensorFlow's server is started.

`tf.distribute.MultiWorkerMirroredStrategy(...)` blocks inside TensorFlow (holding
Python's lock, so no signal handler runs and no timeout fires) until every worker has
joined, and TensorFlow's own SIGTERM handler swallows SIGTERM there: a stale
`TF_CONFIG` would make a plain script wait there for ever. `wait` meets the peers
first, in Python: this worker listens on its own port (a thread answers there) while
it greets every peer's port, and a peer counts as met only once a greeting naming
the same cluster has gone both ways (one in either direction is enough for both: a
worker leaves only when every peer has met it, so no one needs its port after). A
port that accepts but does not answer (a leftover server, another program) is not a
peer; the wait gives up with a clear error after `timeout_s`. SIGTERM and Ctrl-C
during the wait end the process with a message (status 143; `KeyboardInterrupt`).
"""

from __future__ import annotations

import contextlib
import hashlib
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator

from tfaccel.errors import PeersMissingError

_POLL_S = 0.25


_HELLO = "tfaccel-rendezvous 1"
_TALK_S = 2.0  # how long one greeting may take


def _greeting(own: str, cluster: str) -> bytes:
    return f"{_HELLO} {cluster} {own}\n".encode()


def _heard(connection: socket.socket, cluster: str) -> str | None:
    """The address a peer's greeting names, when it names `cluster`; else None."""
    data = b""
    while not data.endswith(b"\n") and len(data) < 512:
        part = connection.recv(512)
        if not part:
            break
        data += part
    words = data.decode(errors="replace").split()
    if len(words) == 4 and " ".join(words[:2]) == _HELLO and words[2] == cluster:
        return words[3]
    return None


class _Meeting:
    """Who has been met; a thread answers greetings on this worker's port."""

    def __init__(self, own: str, peers: list[str], listener: socket.socket):
        self.own, self.peers, self.listener = own, peers, listener
        names = ",".join(sorted([own, *peers]))
        self.cluster = hashlib.sha256(names.encode()).hexdigest()[:16]
        self.met: set[str] = set()
        self.silent: set[str] = set()  # ports that accept but do not greet
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._answer, daemon=True)

    def _answer(self) -> None:
        while not self.done.is_set():
            try:
                connection, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            with connection:
                connection.settimeout(_TALK_S)
                try:
                    peer = _heard(connection, self.cluster)
                    if peer in self.peers:
                        connection.sendall(_greeting(self.own, self.cluster))
                        with self.lock:
                            self.met.add(peer)
                except OSError:
                    pass

    def greet(self, address: str) -> None:
        """Greets the peer at `address`; records it met when it greets back."""
        host, _, port = address.rpartition(":")
        try:
            link = socket.create_connection((host.strip("[]"), int(port)), timeout=1.0)
        except (OSError, ValueError):
            return  # nobody there yet
        with link:
            try:
                link.settimeout(_TALK_S)
                link.sendall(_greeting(self.own, self.cluster))
                answered = _heard(link, self.cluster) == address
            except OSError:
                answered = False
        with self.lock:
            (self.met if answered else self.silent).add(address)

    def missing(self) -> list[str]:
        with self.lock:
            return [p for p in self.peers if p not in self.met]


class _Stopped(Exception):
    pass


def _stop(signum, frame):
    raise _Stopped(signum)


def wait(own: str, peers: list[str], timeout_s: float | None, origin: str) -> None:
    """Listens on `own`'s port until every peer in `peers` has been met (a greeting
    naming this cluster, both ways).

    Args:
        own: this worker's "host:port".
        peers: the other workers' "host:port".
        timeout_s: give up after this many seconds (None: wait for ever).
        origin: where the cluster came from, for the error (e.g. "TF_CONFIG").

    Raises:
        PeersMissingError: a peer did not come within `timeout_s`.
        SystemExit: SIGTERM during the wait (status 143, said on stderr).
        KeyboardInterrupt: Ctrl-C during the wait (said on stderr).
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("", int(own.rpartition(":")[2])))
        listener.listen(64)
        listener.settimeout(0.1)
    except OSError:
        listener.close()
        return  # TensorFlow's own check reports a port in use
    meeting = _Meeting(own, peers, listener)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
    meeting.thread.start()
    try:
        _meet(meeting, timeout_s, origin)
    except _Stopped as stopped:
        name = signal.Signals(stopped.args[0]).name
        print(
            f"tfaccel: {name} while worker {own} waited for its peers {meeting.missing()} "
            f"(from {origin}); stopped.",
            file=sys.stderr,
            flush=True,
        )
        if stopped.args[0] == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise SystemExit(128 + stopped.args[0]) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        meeting.done.set()
        meeting.thread.join(2.0)
        listener.close()


def _meet(meeting: _Meeting, timeout_s: float | None, origin: str) -> None:
    start = time.monotonic()
    while True:
        for peer in meeting.missing():
            meeting.greet(peer)
        missing = meeting.missing()
        if not missing:
            return
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            silent = [p for p in missing if p in meeting.silent]
            note = (
                f" ({silent} accept connections but do not answer as workers of this "
                "cluster: a leftover server or another program?)"
                if silent
                else ""
            )
            raise PeersMissingError(
                f"This process is a worker of a {len(meeting.peers) + 1}-worker cluster "
                f"({meeting.own}) because of {origin}, but worker(s) {missing} never came "
                f"within {timeout_s:g} s{note}. Start them, or unset {origin} to run alone "
                "(a leftover TF_CONFIG, or a shell inside an allocation, makes a plain "
                "script a worker)."
            )
        time.sleep(_POLL_S)


_GUARD = """
import os, select, signal, sys, time
parent, timeout, wake = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + timeout if timeout > 0 else None
while True:
    left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
    ready = select.select([sys.stdin, wake], [], [], left)[0]
    if sys.stdin in ready:
        sys.exit(0)  # the set-up finished (or the process ended)
    if wake in ready:
        if signal.SIGINT not in os.read(wake, 64):
            continue
        why = "Ctrl-C (SIGINT) during TensorFlow's cluster set-up"
    else:
        why = (f"TensorFlow's cluster set-up did not finish within {timeout:g} s of "
               "meeting the peers (a peer lost since?)")
    print(f"tfaccel: {why}; stopping this worker (SIGKILL: TensorFlow holds the "
          "interpreter there).", file=sys.stderr, flush=True)
    os.kill(parent, signal.SIGKILL)
    sys.exit(1)
"""


@contextlib.contextmanager
def guarded(timeout_s: float | None) -> Iterator[None]:
    """Bounds TensorFlow's cluster set-up, which holds the interpreter (no Python signal
    handler runs, TensorFlow's own handler swallows SIGTERM): a watchdog process kills
    this one, saying why, after `timeout_s` (None: no bound) or on Ctrl-C (the byte
    Python's signal handler writes to the wake-up pipe)."""
    import os
    import subprocess

    main = threading.current_thread() is threading.main_thread()
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write) if main else -1
    watchdog = subprocess.Popen(
        [sys.executable, "-c", _GUARD, str(os.getpid()), str(timeout_s or 0), str(read)],
        stdin=subprocess.PIPE,
        pass_fds=(read,),
    )
    assert watchdog.stdin is not None  # stdin=PIPE
    try:
        yield
    finally:
        if main:
            signal.set_wakeup_fd(previous)
        watchdog.stdin.close()
        watchdog.wait()
        os.close(read)
        os.close(write)
