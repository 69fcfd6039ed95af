"""Reading a file that another user could have planted: the one check of who made it.

`read_trusted(path)` opens `path` without following a link and without blocking (a FIFO
opens at once), then judges the open file itself (`fstat`, so a swap after the check
cannot pass): a regular file, owned by this process's user (or one of `owners`), with a
mode that nobody else can write (or exactly `mode`). Anything else raises `Untrusted`,
whose message says why. The data service's relay and the precision-rate cache read
their files through it.
"""

from __future__ import annotations

import os
import stat

from tfaccel.errors import Untrusted

__all__ = ["Untrusted", "read_trusted"]

OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def read_trusted(
    path: str | os.PathLike,
    *,
    mode: int | None = None,
    owners: tuple[int, ...] = (),
    whose: str = "this process's",
) -> str:
    """The text of `path` when it is a file this user can trust.

    Args:
        path: the file.
        mode: the exact permission bits required (e.g. 0o600); None: any mode that
            neither the group nor others can write.
        owners: uids trusted besides this process's effective uid (e.g. 0, root).
        whose: names this process's uid in the owner message ("the relay's").

    Raises:
        FileNotFoundError: there is no file at `path`.
        Untrusted: a link, not a regular file (a FIFO, a directory, a device), another
            owner, or another mode; the message says which.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        descriptor = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise Untrusted(f"cannot open it safely ({error.strerror})") from None
    try:
        _judge(os.fstat(descriptor), mode, owners, whose)
    except BaseException:
        os.close(descriptor)
        raise
    with os.fdopen(descriptor) as handle:
        return handle.read()


def _judge(facts: os.stat_result, mode: int | None, owners: tuple[int, ...], whose: str) -> None:
    bits = stat.S_IMODE(facts.st_mode)
    if not stat.S_ISREG(facts.st_mode):
        raise Untrusted(f"not a regular file ({_kind(facts.st_mode)})")
    me = os.geteuid()
    if facts.st_uid != me and facts.st_uid not in owners:
        also = "".join(f" or {uid}" for uid in owners if uid != me)
        raise Untrusted(f"owned by uid {facts.st_uid}, not {whose} uid {me}{also}")
    if mode is not None and bits != mode:
        raise Untrusted(f"mode {bits:04o}, not {mode:04o}")
    if mode is None and bits & OTHERS_WRITE:
        raise Untrusted(f"mode {bits:04o}: writable by its group or others")


def _kind(st_mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(st_mode):
            return name
    return "not a plain file"
