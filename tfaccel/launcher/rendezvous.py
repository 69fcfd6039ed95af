"""Meeting the other workers before TensorFlow's server is started.

`tf.distribute.MultiWorkerMirroredStrategy(...)` blocks inside TensorFlow (holding
Python's lock, so no signal handler runs and no timeout fires) until every worker has
joined: a stale `TF_CONFIG` would make a plain script wait there for ever. `wait`
meets the peers first, in Python: this worker listens on its own port while it
checks that every peer's port accepts a connection, and gives up with a clear error
after `timeout_s`. Ctrl-C and SIGTERM stop it as they stop any Python code.
"""

from __future__ import annotations

import socket
import time

from tfaccel.errors import PeersMissingError

_POLL_S = 0.25


def _accepts(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


def wait(own: str, peers: list[str], timeout_s: float | None, origin: str) -> None:
    """Listens on `own`'s port until every address in `peers` has accepted a connection.

    Args:
        own: this worker's "host:port".
        peers: the other workers' "host:port".
        timeout_s: give up after this many seconds (None: wait for ever).
        origin: where the cluster came from, for the error (e.g. "TF_CONFIG").

    Raises:
        PeersMissingError: a peer did not come within `timeout_s`.
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("", int(own.rpartition(":")[2])))
        listener.listen(64)
    except OSError:
        listener.close()
        return  # TensorFlow's own check reports a port in use
    seen: set[str] = set()
    start = time.monotonic()
    try:
        while True:
            seen.update(p for p in peers if p not in seen and _accepts(p))
            if len(seen) == len(peers):
                return
            waited = time.monotonic() - start
            if timeout_s is not None and waited > timeout_s:
                missing = [p for p in peers if p not in seen]
                raise PeersMissingError(
                    f"This process is a worker of a {len(peers) + 1}-worker cluster ({own}) "
                    f"because of {origin}, but worker(s) {missing} never came within "
                    f"{timeout_s:g} s. Start them, or unset {origin} to run alone (a "
                    "leftover TF_CONFIG, or a shell inside an allocation, makes a plain "
                    "script a worker)."
                )
            time.sleep(_POLL_S)
    finally:
        listener.close()
