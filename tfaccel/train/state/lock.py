"""Who owns this directory: the lock a training run holds on its checkpoint directory.

A run (its chief) owns `checkpoint_dir` while it trains: the file `<dir>/tfaccel.lock`
names its host (and pid namespace), pid, the process's start time, when the lock was
taken and when it was last refreshed (at every save, and by a heartbeat every
`STALE_AFTER / 10` seconds). A second run finds the file and stops with
`CheckpointLockedError`, unless the lock is stale: on the same host, its process is
gone (or the pid now belongs to a process started at another time); from another host
(or pid namespace) on a shared file system, its last refresh is older than
`STALE_AFTER` seconds. A stale lock is taken over with a warning, so a SIGKILLed run
never blocks the next one.

The lock is created atomically (a complete temporary file hard-linked to the lock's
name, which fails when that name exists; an exclusive create where there are no hard
links), so of two racing starts only one wins. Remote directories (`gs://...`) cannot
be locked this way and are not locked.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import threading
import time
import uuid
import warnings

import psutil

from tfaccel import strict_json
from tfaccel.errors import CheckpointLockedError

NAME = "tfaccel.lock"
# Seconds without a refresh after which another host's lock is stale (wall clocks).
STALE_AFTER = 300.0

logger = logging.getLogger("tfaccel")


class DirectoryLock:
    """The lock file of one run on `directory`: `acquire()`, `refresh()`, `release()`.

    Args:
        directory: an existing local directory.
        stale_after: seconds without a refresh after which another host's lock is stale.
    """

    def __init__(self, directory: str, stale_after: float = STALE_AFTER):
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, NAME)
        self.stale_after = float(stale_after)
        self.remote = "://" in self.directory
        self.token = uuid.uuid4().hex
        self.held = False
        self.lost: str | None = None  # why the lock is no longer ours
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    # -- taking the lock --------------------------------------------------------------

    def acquire(self) -> DirectoryLock:
        """Takes the lock, taking over a stale one with a warning.

        Raises:
            CheckpointLockedError: a live run holds it.
        """
        if self.remote:
            logger.info("%s is not a local path: it is not locked against other runs.", self.path)
            return self
        deadline = time.monotonic() + 10.0  # another start may be taking it meanwhile
        while True:
            if self._create():
                return self._hold()
            holder = self._read(self.path)
            if holder is None:
                continue  # released meanwhile
            why = self._stale(holder)
            if why is None:
                mine = (
                    holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname()
                )
                raise CheckpointLockedError(
                    f"{self.directory} is in use by another training run ({describe(holder)}"
                    f"{': this process, another fit still running' if mine else ''}). "
                    "Two runs on one checkpoint_dir would overwrite and delete each other's "
                    "checkpoints. Wait for it to end, stop it, or use another checkpoint_dir. "
                    f"If that run is gone, delete {self.path}."
                )
            if self._take_over(holder):
                warnings.warn(
                    f"Took over the lock of {self.directory} from a run that is gone ({why}; "
                    f"{describe(holder)}).",
                    stacklevel=3,
                )
                return self._hold()
            if time.monotonic() > deadline:
                raise CheckpointLockedError(f"Could not take {self.path}: it keeps changing.")
            time.sleep(0.02)

    def _hold(self) -> DirectoryLock:
        self.held = True
        self._start_heartbeat()
        return self

    def _record(self, since: float | None = None) -> dict:
        now = time.time()
        process = psutil.Process()
        return {
            "host": socket.gethostname(),
            "pid_namespace": _pid_namespace(),
            "pid": os.getpid(),
            "process_started": process.create_time(),
            "since": since or now,
            "refreshed": now,
            "token": self.token,
        }

    def _temporary(self, record: dict) -> str:
        """A complete temporary copy of `record`, or OSError naming the lock (none left)."""
        temporary = os.path.join(self.directory, f".{NAME}.{uuid.uuid4().hex}.tmp")
        try:
            with open(temporary, "w") as handle:
                handle.write(strict_json.dumps(record))
        except OSError as error:
            with contextlib.suppress(OSError):
                os.remove(temporary)
            code = errno.errorcode.get(error.errno or 0, error.errno)  # no name has 0
            raise OSError(
                error.errno,
                f"Cannot write the lock of {self.directory} ({os.strerror(error.errno or 0)}, "
                f"{code}); the lock file {self.path} is left as it was, no temporary file "
                "remains. Free space or fix the directory, then train again (the checkpoints "
                "saved so far are intact).",
            ) from error
        return temporary

    def _create(self) -> bool:
        temporary = self._temporary(self._record())
        try:
            return _place(temporary, self.path)
        finally:
            os.remove(temporary)

    @staticmethod
    def _read(path: str) -> dict | None:
        """The lock's record; {} when unreadable; None when there is no file."""
        try:
            with open(path) as handle:
                record = json.loads(handle.read())
            return record if isinstance(record, dict) else {}
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            try:
                return {"refreshed": os.path.getmtime(path)}
            except OSError:
                return None

    def _stale(self, holder: dict) -> str | None:
        """Why the lock `holder` is stale, or None when its run may still be alive."""
        here = holder.get("host") == socket.gethostname()
        here = here and holder.get("pid_namespace", _pid_namespace()) == _pid_namespace()
        if here and isinstance(holder.get("pid"), int):
            return _gone(holder["pid"], holder.get("process_started"))
        refreshed = holder.get("refreshed")
        if not isinstance(refreshed, (int, float)):
            return "the lock file is unreadable"
        age = time.time() - refreshed
        if age > self.stale_after:
            return f"no refresh for {age:.0f} s > {self.stale_after:.0f} s"
        return None

    def _take_over(self, holder: dict) -> bool:
        """Replaces the stale lock `holder` by this run's, unless another start was first.

        One start at a time (the one that creates `<lock>.takeover`) checks that the
        lock is still `holder` and replaces it atomically; the lock never disappears
        meanwhile, so no plain start can slip in.
        """
        guard = self.path + ".takeover"
        temporary = self._temporary(self._record())
        try:
            if not _place(temporary, guard):
                with contextlib.suppress(OSError):  # left by a start that died in between
                    if time.time() - os.path.getmtime(guard) > 30:
                        os.remove(guard)
                return False
            try:
                if self._read(self.path) != holder:
                    return False
                os.replace(temporary, self.path)
                return True
            finally:
                os.remove(guard)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temporary)

    # -- holding it -------------------------------------------------------------------

    def refresh(self) -> None:
        """Rewrites the lock with the current time (at every save).

        Raises:
            CheckpointLockedError: another run took the lock over (it judged this one stale).
        """
        if not self.held:
            return
        with self._mutex:
            if self.lost is None:
                current = self._read(self.path)
                if current is None and not os.path.isdir(self.directory):
                    return  # the directory was deleted: the next save recreates it
                if current is None and not os.path.lexists(self.path):
                    return  # the file was deleted: the next save takes it again (`retake`)
                if current is None or current.get("token") != self.token:
                    self.lost = (
                        f"now {describe(current)}" if current else "the lock file is unreadable"
                    )
                else:
                    temporary = self._temporary(self._record(since=current.get("since")))
                    os.replace(temporary, self.path)
        if self.lost is not None:
            raise CheckpointLockedError(
                f"This run no longer holds {self.path} ({self.lost}); another run may be "
                "writing to the directory, so this one does not save there."
            )

    def missing(self) -> bool:
        """Whether this run's lock file was deleted (its directory is still there)."""
        return (
            self.held
            and not self.remote
            and self.lost is None
            and os.path.isdir(self.directory)
            and not os.path.lexists(self.path)
        )

    def retake(self) -> None:
        """Takes the lock again where it was deleted while held (the file, or its directory
        made anew).

        Raises:
            CheckpointLockedError: another run created the lock there first.
        """
        if not self.held or self.remote:
            return
        with self._mutex:
            if self.lost is None and not self._create():
                self.lost = f"now {describe(self._read(self.path))}"
        self.refresh()

    def _start_heartbeat(self) -> None:
        def beat():
            while not self._stop.wait(self.stale_after / 10):
                try:
                    self.refresh()
                except CheckpointLockedError:
                    return  # the next save reports it
                except OSError:
                    continue  # e.g. a full disk: the next beat or save tries again

        self._stop.clear()
        self._heartbeat = threading.Thread(target=beat, name="tfaccel-lock", daemon=True)
        self._heartbeat.start()

    def release(self) -> None:
        """Stops the heartbeat and removes the lock file if it is still this run's."""
        if not self.held:
            return
        self.held = False
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        with self._mutex:
            current = self._read(self.path)
            if current is not None and current.get("token") == self.token:
                os.remove(self.path)


def _place(temporary: str, path: str) -> bool:
    """Gives `path` the content of `temporary` unless `path` exists, atomically."""
    try:
        os.link(temporary, path)  # fails when the name exists; the file is complete
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links: exclusive create, then write
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "w") as handle, open(temporary) as source:
            handle.write(source.read())
    return True


def _pid_namespace() -> str | None:
    """This process's pid namespace (containers sharing a host name may differ), or None."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _gone(pid: int, started) -> str | None:
    """Why process `pid` (started at `started`) is gone on this host, or None."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return f"process {pid} has exited"
        if isinstance(started, (int, float)) and abs(process.create_time() - started) > 1.0:
            return f"pid {pid} now belongs to another process"
    except psutil.NoSuchProcess:
        return f"process {pid} is gone"
    except psutil.AccessDenied:
        return None
    return None


def describe(holder: dict | None) -> str:
    """'host h, pid p, since <time>, last refreshed <time> (n s ago)' for a lock record."""
    if not holder:
        return "no readable lock record"
    parts = []
    if "host" in holder:
        parts.append(f"host {holder['host']}, pid {holder.get('pid')}")

    def when(stamp):
        text = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
        return f"{text} ({time.time() - stamp:.0f} s ago)"

    if isinstance(holder.get("since"), (int, float)):
        parts.append(f"since {when(holder['since'])}")
    if isinstance(holder.get("refreshed"), (int, float)):
        parts.append(f"last refreshed {when(holder['refreshed'])}")
    return ", ".join(parts) or "no readable lock record"
