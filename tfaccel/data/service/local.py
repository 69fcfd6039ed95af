"""Preprocessing on tf.data service workers: `local(n)` starts them on this machine.

`local(n)` is a context manager: a dispatcher and `n` worker processes (each
`python -m tfaccel data-service ...`, in its own process group, killed with this
process even on SIGKILL, `PR_SET_PDEATHSIG`), addressed by loopback, stopped on exit,
on an exception and on Ctrl-C. On a cluster, start the same servers with
`tfaccel data-service dispatcher --port P` and `tfaccel data-service worker
--dispatcher HOST:P`, and pass `service="grpc://HOST:P"` to `data.pipeline`.

TensorFlow's servers listen on every interface (they have no bind address), and the
service has no authentication: `local` says so on stderr each time it starts servers;
use it on a trusted machine or network.

Example:
    >>> with data.service.local(2) as service:                       # doctest: +SKIP
    ...     ds = data.pipeline(source, batch_size=64, training=True,
    ...                        preprocess=decode, service=service)
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

from tfaccel.data.service import sealed, server
from tfaccel.data.service.watch import Watch
from tfaccel.errors import PortInUseError, ServiceError

if TYPE_CHECKING:
    import tensorflow as tf

MODES = ("dynamic", "static")
"""`service_mode` values: "dynamic" (`distributed_epoch`, the default) or "static"."""

ENV = "TFACCEL_DATA_SERVICE"
"""The environment variable naming the service `tfaccel launch --data-workers` started."""
ENV_WORKERS = "TFACCEL_DATA_SERVICE_WORKERS"
ENV_FUNCTIONS = "TFACCEL_DATA_SERVICE_FUNCTIONS"
"""The launcher's private directory through which launched processes send their Python
functions to its workers (`tfaccel.data.service.relay`)."""

__all__ = [
    "ENV",
    "ENV_FUNCTIONS",
    "ENV_WORKERS",
    "MODES",
    "LocalService",
    "PortInUseError",
    "ServiceError",
    "from_env",
    "local",
]


def from_env() -> str | None:
    """The service address `tfaccel launch --data-workers K` gave this process, or None.

    `data.pipeline(..., service="auto")` reads it: a script launched with
    `--data-workers` offloads its preprocessing, the same script run alone keeps it here.
    """
    return os.environ.get(ENV) or None


@dataclasses.dataclass
class LocalService:
    """A dispatcher and worker processes on this machine (made by `local`).

    Attributes:
        address: the dispatcher's address, "grpc://localhost:PORT".
        workers: the number of workers started.
        worker_addresses: each worker's "localhost:PORT".
        processes: the dispatcher's process, then the workers'.
        static_sharding: whether the dispatcher has the fixed list of workers.
    """

    address: str
    workers: int
    worker_addresses: list[str]
    processes: list[subprocess.Popen]
    static_sharding: bool = False
    watch: Any = dataclasses.field(default=None, repr=False)
    functions_lines: list[str] = dataclasses.field(default_factory=list, repr=False)
    """Every line of functions sent to the workers, in order (`revive` replays them)."""
    lock: Any = dataclasses.field(default_factory=threading.RLock, repr=False)
    key: bytes = dataclasses.field(default_factory=sealed.new_key, repr=False)
    """The service's secret: every line of functions its workers load is sealed with it."""

    def __enter__(self) -> LocalService:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def dispatcher(self) -> subprocess.Popen:
        """The dispatcher's process."""
        return self.processes[0]

    @property
    def worker_processes(self) -> list[subprocess.Popen]:
        """The workers' processes."""
        return self.processes[1:]

    def alive(self) -> bool:
        """Whether the dispatcher still runs."""
        return self.dispatcher.poll() is None

    def check(self) -> None:
        """Raises `ServiceError` when the dispatcher has exited."""
        if not self.alive():
            raise ServiceError(
                f"the tf.data service dispatcher at {self.address} has exited (status "
                f"{self.dispatcher.returncode}); its jobs are gone. Start a new service."
            )

    def share_functions(self, dataset: tf.data.Dataset, timeout_s: float = 60.0) -> int:
        """Sends the Python functions of `dataset`'s `numpy_function` / `py_function` ops
        to every worker (under the tokens the graph names them by); returns how many.

        Raises:
            ServiceError: a function cannot be pickled, or a worker did not take it.
        """
        functions = python_functions(dataset)
        if not functions:
            return 0
        self.send_functions(sealed.seal(encode_functions(functions), self.key), timeout_s)
        return len(functions)

    def send_functions(self, line: str, timeout_s: float = 60.0) -> int:
        """Sends one sealed line of functions (`sealed.seal(encode_functions(...), key)`)
        to every running worker and keeps it for `revive`; returns how many functions the
        workers registered.

        Raises:
            ServiceError: a chunk's MAC is wrong (checked here first), a worker did not
                take them (its reason), or did not answer.
        """
        sealed.open_line(line, self.key)
        line = line.strip() + "\n"
        with self.lock:
            if line not in self.functions_lines:
                self.functions_lines.append(line)
            deadline = time.monotonic() + timeout_s
            running = [(i, p) for i, p in enumerate(self.worker_processes) if p.poll() is None]
            for _, process in running:
                assert process.stdin is not None  # _start pipes it
                process.stdin.write(line)
                process.stdin.flush()
            count = 0
            for index, process in running:
                said = _ready_line(process, deadline, f"worker {index}", ("registered", "failed"))
                if said.startswith("failed"):
                    raise ServiceError(
                        f"worker {index} could not load the pipeline's Python functions: "
                        f"{said.removeprefix('failed ')}"
                    )
                count = int(said.split()[1])
            return count

    def revive(self, index: int, timeout_s: float = 120.0) -> subprocess.Popen:
        """Starts worker `index` again at its address (after it died), with the pipeline's
        Python functions (every line sent so far, in order) registered before it serves;
        the dispatcher hands it the dead worker's task, which goes on with the epoch's
        next splits.

        Call it from a thread that outlives the worker (the watch does): a child dies with
        the thread that started it (`PR_SET_PDEATHSIG`).

        Raises:
            ServiceError: the worker did not start in time.
        """
        port = int(self.worker_addresses[index].rsplit(":", 1)[1])
        with self.lock:
            old = self.processes[index + 1]
            command = _worker_command(self.address.removeprefix("grpc://"), port)
            process = _start(command, self.key)
            if self.functions_lines:  # one line, read before it serves: every chunk
                assert process.stdin is not None  # _start pipes it
                process.stdin.write(" ".join(x.strip() for x in self.functions_lines) + "\n")
                process.stdin.flush()
            self.processes[index + 1] = process
            _stop([old], 0.1)
            deadline = time.monotonic() + timeout_s
            what = f"worker {index} (restarted)"
            answers = (server.READY, "registered", "failed")
            ready, answered = False, not self.functions_lines
            while not (ready and answered):  # both lines, in either order
                if _ready_line(process, deadline, what, answers).startswith(server.READY):
                    ready = True
                else:
                    answered = True
        return process

    def close(self, grace_s: float = 5.0) -> None:
        """Stops the watch, then every process (SIGTERM to its group, SIGKILL after
        `grace_s`)."""
        if self.watch is not None:
            self.watch.stop()
        _stop(self.processes, grace_s)

    def __repr__(self) -> str:
        return f"LocalService({self.address!r}, workers={self.workers})"


def local(
    workers: int = 2,
    *,
    start_timeout_s: float = 120.0,
    worker_timeout_ms: int = 4000,
    port: int = 0,
    static_sharding: bool = False,
    stall_timeout_s: float | None = 60.0,
) -> LocalService:
    """Starts a dispatcher and `workers` worker processes on this machine.

    Use it as a context manager; the processes end with the block (or `close()`), with
    this process (even when it is killed), on an exception and on Ctrl-C. Each call
    says on stderr that the servers listen on every interface, unauthenticated.

    Args:
        workers: worker processes (>= 1): each runs the pipeline's preprocessing with
            its own Python interpreter (its own GIL).
        start_timeout_s: how long the servers may take to start.
        worker_timeout_ms: how long the dispatcher waits on a silent worker before
            handing its work to the others.
        port: the dispatcher's port (0: a free one).
        static_sharding: give the dispatcher the fixed list of workers, which
            `service_mode="static"` needs; a killed worker then stalls the job until it
            is back (dynamic sharding goes on without it).
        stall_timeout_s: after a server dies, how long the workers left may stay idle
            before the stalled read is ended (`KeyboardInterrupt`, then exit status 75:
            see `tfaccel.data.service.watch`); None waits for ever.

    Raises:
        ValueError: `workers` is not a positive int.
        PortInUseError: `port` is taken.
        ServiceError: a server did not start in time, or exited while starting.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}.")
    server.check_port_free(port)
    from tfaccel.launcher.processes import free_ports

    ports = free_ports(workers + 1)
    port = port or ports[0]
    address = f"localhost:{port}"
    addresses = [f"localhost:{p}" for p in ports[1:]]
    deadline = time.monotonic() + start_timeout_s
    processes: list[subprocess.Popen] = []
    key = sealed.new_key()  # in memory; only the workers' environment gets it
    try:  # all at once: a worker waits for its dispatcher
        command = ["dispatcher", "--port", str(port)]
        if static_sharding:
            command += ["--worker-addresses", ",".join(addresses)]
        processes.append(_start(command + ["--worker-timeout-ms", str(worker_timeout_ms)]))
        for worker_port in ports[1:]:
            processes.append(_start(_worker_command(address, worker_port), key))
        _ready_line(processes[0], deadline, "the dispatcher")
        for index, process in enumerate(processes[1:]):
            _ready_line(process, deadline, f"worker {index}")
    except BaseException:
        _stop(processes, 1.0)
        raise
    service = LocalService(
        f"grpc://{address}", workers, addresses, processes, static_sharding, key=key
    )
    what = f"the dispatcher and {workers} worker(s) of {service.address}"
    server.say_exposed(what, [port, *ports[1:]])
    service.watch = Watch(service, stall_timeout_s)
    service.watch.start()
    return service


def _worker_command(dispatcher: str, port: int) -> list[str]:
    return [
        *("worker", "--dispatcher", dispatcher, "--port", str(port), "--host", "localhost"),
        *("--heartbeat-ms", "500", "--accept-functions"),
    ]


def _start(arguments: list[str], key: bytes | None = None) -> subprocess.Popen:
    """One server process in its own group, killed when this process dies (a worker
    gets the service's secret `key` in its environment)."""
    from tfaccel.launcher.processes import die_with_parent

    parent = os.getpid()

    def setup():
        die_with_parent()
        if os.getppid() != parent:
            os._exit(128 + signal.SIGKILL)

    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    environment.pop(sealed.ENV_KEY, None)
    if key is not None:
        environment[sealed.ENV_KEY] = key.hex()
    log = tempfile.TemporaryFile(mode="w+")  # read on failure; a pipe could fill
    process = subprocess.Popen(
        [sys.executable, "-m", "tfaccel", "data-service", *arguments, "--quiet"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        start_new_session=True,
        preexec_fn=setup,
        env=environment,
    )
    _LOGS[process.pid] = log
    return process


_LOGS: dict = {}  # a server's pid -> its stderr file


def encode_functions(functions: dict) -> str:
    """`functions` (by token) as the one base64 cloudpickle line a worker registers.

    Raises:
        ServiceError: a function cannot be pickled.
    """
    import base64

    import cloudpickle

    from tfaccel.data.service.shippable import failing, message, unshippable

    names = unshippable(functions.values())
    if names:
        raise ServiceError(message(names))
    try:
        payload = _dumps(cloudpickle, functions)
        cloudpickle.loads(payload)  # the round trip a worker makes, tried here first
    except Exception as error:
        bad = failing(functions, lambda one: cloudpickle.loads(_dumps(cloudpickle, one)))
        raise ServiceError(
            f"the pipeline's Python functions cannot be sent to the workers: {bad or error}"
        ) from error
    return base64.b64encode(payload).decode() + "\n"


def _dumps(cloudpickle, functions: dict) -> bytes:
    """`functions` pickled; those of modules a fresh interpreter may not import (scripts,
    test files: not under the Python installation) by value."""
    installed = (sys.prefix, sys.base_prefix)
    modules = set()
    for function in functions.values():
        for part in (function, getattr(function, "_func", None)):
            module = sys.modules.get(getattr(part, "__module__", None) or "")
            path = getattr(module, "__file__", None) or ""
            if module is not None and path and not path.startswith(installed):
                if module.__name__ != "__main__" and not module.__name__.startswith("tfaccel"):
                    modules.add(module)
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(functions)
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)


def python_functions(dataset: tf.data.Dataset) -> dict[str, Any]:
    """The Python functions of `dataset`'s `numpy_function` / `py_function` ops, by token."""
    from tensorflow.python.ops import script_ops

    graph = dataset._as_serialized_graph()
    from tensorflow.core.framework import graph_pb2

    definition = graph_pb2.GraphDef.FromString(graph.numpy())
    nodes = list(definition.node)
    for function in definition.library.function:
        nodes.extend(function.node_def)
    tokens = {
        node.attr["token"].s.decode()
        for node in nodes
        if node.op in ("PyFunc", "PyFuncStateless", "EagerPyFunc")
    }
    found = {token: script_ops._py_funcs.get(token) for token in tokens}
    return {token: function for token, function in found.items() if function is not None}


def _ready_line(
    process: subprocess.Popen, deadline: float, what: str, ready: str | tuple = server.READY
) -> str:
    """The server's ready line; raises `ServiceError` (with its stderr) if it exits or is late."""
    assert process.stdout is not None  # _start pipes it
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ServiceError(f"{what} of the local tf.data service did not start in time.")
        readable, _, _ = select.select([process.stdout], [], [], min(left, 0.5))
        if readable:
            line = process.stdout.readline()
            if line.startswith(ready):
                return line.strip()
            if line:
                continue
        if process.poll() is not None:
            log = _LOGS.get(process.pid)
            error = []
            if log is not None:
                log.seek(0)
                error = log.read().strip().splitlines()
            tail = "\n".join(error[-5:])
            if "port" in tail and "in use" in tail:
                raise PortInUseError(tail)
            raise ServiceError(
                f"{what} of the local tf.data service exited while starting "
                f"(status {process.returncode}):\n{tail}"
            )


def _stop(processes: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM to each process group, SIGKILL to what is left after `grace_s`; reaped."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for process in processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for process in processes:
            try:
                process.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                pass
        if all(process.poll() is not None for process in processes):
            break
    for process in processes:
        for stream in (process.stdin, process.stdout, _LOGS.pop(process.pid, None)):
            if stream is not None:
                stream.close()
