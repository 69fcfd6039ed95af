"""The relay that takes a launched process's Python functions to the launcher's workers.

`tfaccel launch --data-workers K` runs the service's workers as children of the
launcher, so the functions of a training process's `numpy_function` / `py_function`
ops cannot be written to their stdin from there. The launcher makes a private directory
(mode 0700, removed at the end), names it in `TFACCEL_DATA_SERVICE_FUNCTIONS`, and a
daemon thread (`Relay`) watches it:

1. a training process writes one line of functions (`service.encode_functions`) to
   `NAME.request`, atomically (a temporary name, then a rename), and waits;
2. the relay hands the line to the `LocalService` (`send_functions`: every worker
   registers it, and a restarted worker gets it again), removes the request and
   writes `NAME.answer`, atomically: "ok N" or "failed <the worker's reason>";
3. the training process reads the answer, removes it, and goes on or raises
   `ServiceError` (also when no answer comes within `ANSWER_S`).

The relay trusts no file: it reads a request only when it is a regular file owned by
the relay's own user with mode 0600, and forwards it only when every chunk carries
the MAC of the service's secret (`sealed`; the launched processes get the secret in
`ENV_KEY`); the workers check the MAC again before unpickling. A refused request is
said on stderr, answered "failed refused: ...", removed, and never loaded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, TextIO

from tfaccel.data.service import sealed
from tfaccel.errors import ServiceError
from tfaccel.files.trusted import Untrusted, read_trusted

if TYPE_CHECKING:
    import tensorflow as tf

    from tfaccel.data.service.local import LocalService

ANSWER_S = 90.0
"""How long a training process waits for the relay's answer."""
SEND_S = 60.0
"""How long the relay waits for the workers to register one line."""

__all__ = ["ANSWER_S", "Relay", "relay_for", "request", "share_launched"]


def _write(path: str, text: str) -> None:
    """Writes `text` to `path` atomically (a private temporary name, then a rename)."""
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.fchmod(descriptor, 0o600)  # whatever the umask
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


class Relay(threading.Thread):
    """Answers the requests written to `directory` with `service.send_functions(line)`.

    Attributes:
        answered: how many requests it answered.
    """

    def __init__(
        self, service: LocalService, directory: str, poll_s: float = 0.05, err: TextIO | None = None
    ) -> None:
        super().__init__(name="tfaccel-data-service-relay", daemon=True)
        self.service = service
        self.directory = directory
        self.poll_s = poll_s
        self.err = err or sys.stderr
        self.answered = 0
        self.refused: list[str] = []
        """The names of the requests refused (said once each)."""
        self._stopping = threading.Event()

    def stop(self, wait_s: float = 2.0) -> None:
        """Ends the relay (a request in flight is left to its process's timeout)."""
        self._stopping.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(wait_s)

    def run(self) -> None:
        while not self._stopping.wait(self.poll_s):
            try:
                names = sorted(os.listdir(self.directory))
            except FileNotFoundError:
                return
            for name in names:
                stem = name.removesuffix(".request")
                if (
                    name.endswith(".request")
                    and not name.startswith(".")
                    and stem not in self.refused
                ):
                    try:
                        self._answer(name.removesuffix(".request"))
                    except OSError as error:  # the request's process times out and says so
                        if not self._stopping.is_set():
                            print(f"tfaccel data service relay: {error}", file=self.err)

    def _answer(self, name: str) -> None:
        path = os.path.join(self.directory, name)
        try:
            line = _read_trusted(f"{path}.request")
            sealed.open_line(line, getattr(self.service, "key", None))
        except FileNotFoundError:  # withdrawn: its process stopped waiting
            return
        except ServiceError as refused:  # said, removed, answered; never loaded
            self.refused.append(name)
            print(
                f"tfaccel data service relay: {name}.request {refused}", file=self.err, flush=True
            )
            _remove(f"{path}.request")
            _write(f"{path}.answer", "failed " + str(refused).replace("\n", " ") + "\n")
            return
        try:
            answer = f"ok {self.service.send_functions(line, SEND_S)}"
        except Exception as error:  # said to the training process, which raises it
            reason = str(error) if isinstance(error, ServiceError) else repr(error)
            answer = "failed " + reason.replace("\n", " ")
        _remove(f"{path}.request")
        _write(f"{path}.answer", answer + "\n")
        self.answered += 1


def _read_trusted(path: str) -> str:
    """The text of `path` when it is a regular file of this user with mode 0600.

    Raises:
        FileNotFoundError: it is gone.
        ServiceError: "refused: ..." (a link, another owner, another mode).
    """
    try:
        return read_trusted(path, mode=0o600, whose="the relay's")
    except Untrusted as refused:
        raise ServiceError(f"refused: {refused}; not loaded") from None


@contextlib.contextmanager
def relay_for(service: LocalService, err: TextIO | None = None) -> Iterator[str]:
    """A private directory relayed to `service`'s workers for the block; yields its path
    (removed, and the relay stopped, at the end). Refusals are said on `err`."""
    directory = tempfile.mkdtemp(prefix="tfaccel-functions-")  # mode 0700
    relay = Relay(service, directory, err=err)
    relay.start()
    try:
        yield directory
    finally:
        relay.stop()
        shutil.rmtree(directory, ignore_errors=True)


def request(
    directory: str,
    line: str,
    timeout_s: float = ANSWER_S,
    poll_s: float = 0.05,
    key: bytes | None = None,
) -> int:
    """Sends one line of functions (`encode_functions`), sealed with `key` (default: the
    secret in `sealed.ENV_KEY`), through the relay at `directory`; returns how many
    functions the workers registered.

    Raises:
        ServiceError: no secret, a worker could not load them (its reason), the relay
            refused them, or no answer came in `timeout_s`.
    """
    if not os.path.isdir(directory):
        raise ServiceError(
            f"the launcher's function relay {directory!r} is gone: did `tfaccel launch` end?"
        )
    key = key or sealed.key_from_env()
    if key is None:
        raise ServiceError(
            f"the launcher's function relay {directory!r} takes only sealed requests, and "
            f"{sealed.ENV_KEY} (the secret `tfaccel launch --data-workers` gives its "
            "processes) is unset: run this process under that launcher."
        )
    path = os.path.join(directory, f"{os.getpid()}-{uuid.uuid4().hex}")
    _write(f"{path}.request", sealed.seal(line, key))
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with open(f"{path}.answer") as handle:
                answer = handle.read().strip()
            break
        except FileNotFoundError:
            if time.monotonic() > deadline:
                _remove(f"{path}.request")
                raise ServiceError(
                    "the launcher's tf.data service workers did not take the pipeline's "
                    f"Python functions within {timeout_s:.0f} s (no answer from the relay in "
                    f"{directory}): is `tfaccel launch --data-workers` still running?"
                ) from None
            time.sleep(poll_s)
    _remove(f"{path}.answer")
    if not answer.startswith("ok"):
        raise ServiceError(
            "the pipeline's Python functions, sent to the workers of `tfaccel launch "
            f"--data-workers`: {answer.removeprefix('failed').strip()}"
        )
    return int(answer.split()[1])


def share_launched(dataset: tf.data.Dataset, address: str) -> int | None:
    """Sends `dataset`'s Python functions to the workers of the service at `address`
    through the launcher's relay, when `address` is the service `tfaccel launch
    --data-workers` started; returns how many (0: none to send), or None when there is
    no relay for `address` (a service started elsewhere).

    Raises:
        ServiceError: as `request`.
    """
    from tfaccel.data import service

    functions = service.python_functions(dataset)
    if not functions:
        return 0
    directory = os.environ.get(service.ENV_FUNCTIONS)
    launched = service.from_env() or ""
    if not directory or launched.removeprefix("grpc://") != address.removeprefix("grpc://"):
        return None
    return request(directory, service.encode_functions(functions))
