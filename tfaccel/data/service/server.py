"""The tf.data service's servers, one per process: what `tfaccel data-service` runs.

`serve_dispatcher` and `serve_worker` start a `tf.data.experimental.service`
`DispatchServer` / `WorkerServer`, print one line saying where it listens (the line
`tfaccel.data.service.local` waits for) and serve until killed or interrupted (Ctrl-C).
Only TensorFlow is imported, and only when a server starts.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from typing import Any, TextIO

from tfaccel.data.service import sealed
from tfaccel.errors import PortInUseError, ServiceError

NO_AUTHENTICATION = (
    "the tf.data service has no authentication or encryption: anyone who can reach "
    "this port can read the data and run pipelines here. Run it on a trusted network only."
)
READY = "tfaccel data-service ready:"
"""The start of the line a server prints once it listens."""
STOP_WAIT_S = 10.0  # what a stopping server may take before the process ends anyway
SIGNAL_POLL_S = 0.25  # the longest a signal delivered to another thread waits for its handler


def check_port_free(port: int) -> None:
    """Raises `PortInUseError` when `port` (non-zero) cannot be bound on this machine.

    TensorFlow's servers listen on every interface, so every interface is tried.
    """
    if not port:
        return
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET, "127.0.0.1")):
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # a listener still blocks; a killed server's TIME_WAIT connections do not
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as error:
                raise PortInUseError(
                    f"port {port} is in use on this machine ({error.strerror}); choose "
                    "another --port, or stop what listens there (e.g. `ss -ltnp | grep "
                    f":{port}`)."
                ) from None


def serve_dispatcher(
    port: int,
    work_dir: str | None = None,
    worker_addresses: list[str] | None = None,
    worker_timeout_ms: int | None = None,
) -> None:
    """Starts a dispatcher on `port` (0: a free one), prints where, serves for ever.

    Args:
        port: the port to listen on (every interface; TensorFlow has no bind address).
        work_dir: a directory for the dispatcher's journal: restarted with the same
            one, it recovers its jobs (fault-tolerant mode).
        worker_addresses: the fixed list of workers ("host:port"), needed by static
            sharding (`mode="static"`); None accepts any worker.
        worker_timeout_ms: how long a silent worker stays registered.

    Raises:
        PortInUseError: `port` is taken.
    """
    check_port_free(port)
    import tensorflow as tf

    service = tf.data.experimental.service
    settings: dict[str, Any] = {
        "port": port,
        "work_dir": work_dir,
        "fault_tolerant_mode": bool(work_dir),
    }
    if worker_addresses:
        settings["worker_addresses"] = list(worker_addresses)
    if worker_timeout_ms:
        settings["worker_timeout_ms"] = int(worker_timeout_ms)
    server = service.DispatchServer(service.DispatcherConfig(**settings))
    bound = server.target.rsplit(":", 1)[-1]
    print(f"{READY} dispatcher port {bound}", flush=True)
    _serve(server)


def serve_worker(
    dispatcher: str,
    port: int = 0,
    host: str | None = None,
    heartbeat_ms: int | None = None,
    accept_functions: bool = False,
) -> None:
    """Starts a worker of the dispatcher at `dispatcher` ("host:port"), serves for ever.

    Args:
        dispatcher: the dispatcher's address, "host:port" or "grpc://host:port".
        port: the worker's port (0: a free one).
        host: the name clients reach this worker by (default: this machine's name).
        heartbeat_ms: how often the worker reports to the dispatcher.
        accept_functions: read the Python functions of the pipelines' `numpy_function` /
            `py_function` ops from stdin (one base64 cloudpickle line each, acknowledged
            on stdout), as `tfaccel.data.service.local` sends them.

    Raises:
        PortInUseError: `port` is taken.
        ValueError: `dispatcher` is not "host:port".
    """
    check_port_free(port)
    address = dispatcher.removeprefix("grpc://")
    name, _, number = address.rpartition(":")
    if not name or not number.isdigit():
        raise ValueError(f"--dispatcher must be HOST:PORT, got {dispatcher!r}.")
    import tensorflow as tf

    service = tf.data.experimental.service
    settings = {
        "dispatcher_address": address,
        "worker_address": f"{host or socket.getfqdn()}:%port%",
        "port": port,
    }
    if heartbeat_ms:
        settings["heartbeat_interval_ms"] = int(heartbeat_ms)
    key = sealed.key_from_env(pop=True) if accept_functions else None
    if accept_functions:  # a restarted worker's functions are waiting: before any task
        _register_waiting_functions(key)
    server = service.WorkerServer(service.WorkerConfig(**settings))
    print(f"{READY} worker of {address}", flush=True)
    if accept_functions:
        _accept_functions(key)
    _serve(server)


def _serve(server) -> None:
    """Serves until a signal ends this process; Ctrl-C (`KeyboardInterrupt`) stops the
    server first. (TensorFlow's `join` holds the interpreter: Ctrl-C would go unheard.)

    The wait is in short sleeps: the kernel may deliver Ctrl-C's SIGINT to any of
    TensorFlow's threads, and Python runs its handler only when the main thread next
    runs Python code — after a sleep of an hour, an hour later (seen once, under load).
    """
    try:
        while True:
            time.sleep(SIGNAL_POLL_S)
    finally:  # bounded: a worker's stop can wait on its dispatcher
        stopper = threading.Thread(target=server._stop, daemon=True)
        stopper.start()
        stopper.join(STOP_WAIT_S)


_KEPT: list = []  # the registry holds weak references


def _accept_functions(key: bytes | None) -> None:
    """Registers the functions sent on stdin under their tokens, until stdin closes."""
    for line in sys.stdin:
        _register(line, key)


def _register_waiting_functions(key: bytes | None) -> None:
    """Registers a line of functions already waiting on stdin (a restarted worker's)."""
    import select

    if select.select([sys.stdin], [], [], 0)[0]:
        _register(sys.stdin.readline(), key)


def _register(line: str, key: bytes | None) -> None:
    """Registers one sealed line of functions (`sealed.seal`: MAC-checked base64
    cloudpickle chunks, space-separated: a restarted worker gets every chunk sent so far
    in one line); says "registered N" or "failed ...". A line with any chunk whose MAC
    is wrong is refused before anything is unpickled."""
    import base64

    import cloudpickle
    from tensorflow.python.ops import script_ops

    try:
        chunks = sealed.open_line(line, key)
    except ServiceError as error:
        print(f"tfaccel data-service worker: {error}", file=sys.stderr, flush=True)
        print(f"failed {error}".replace("\n", " "), flush=True)
        return
    try:
        functions = {}
        for chunk in chunks:
            functions.update(cloudpickle.loads(base64.b64decode(chunk)))
    except Exception as error:  # said to the client, which raises it
        print(f"failed {type(error).__name__}: {error}".replace("\n", " "), flush=True)
        return
    for token, function in functions.items():
        _KEPT.append(function)
        script_ops._py_funcs._funcs[token] = function
    print(f"registered {len(functions)}", flush=True)


def say_exposed(what: str, ports: list[int], err: TextIO | None = None) -> None:
    """Says on `err` (default stderr), each time servers start, that `what` listens on
    every interface at `ports`: TensorFlow's servers cannot be bound to loopback."""
    listed = ", ".join(str(port) for port in ports)
    print(
        f"tfaccel data service: {what} listen(s) on EVERY network interface of this machine "
        f"(ports {listed}), not only on loopback: TensorFlow's servers have no bind "
        f"address. {NO_AUTHENTICATION} On a host reachable from untrusted networks, "
        "firewall these ports.",
        file=err or sys.stderr,
        flush=True,
    )


def say_no_authentication(what: str) -> None:
    """Prints the no-authentication warning for a server listening on every interface."""
    print(
        f"tfaccel data-service {what}: listening on every interface of this machine; "
        + NO_AUTHENTICATION,
        file=sys.stderr,
        flush=True,
    )
