"""Child processes and ports: what the launcher and `data.service.local` both need."""

from __future__ import annotations

import signal
import socket
import sys

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


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


def die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (`PR_SET_PDEATHSIG`)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
