"""Run a multi-worker job as N local processes on TensorFlow's own distributed runtime.

Each worker gets a `TF_CONFIG` naming every worker on free 127.0.0.1 ports (worker 0
is the chief), optionally its own CPU cores, and its output lines prefixed with
`[worker i]`. As soon as one worker fails, the others are terminated and the
launcher exits with that worker's status; `timeout_s` bounds the whole run (status
124). Once one worker has started its TensorFlow server (its port listens), every
other worker must start its own within `startup_timeout_s` (default 120 s), or the
launcher names the missing worker(s) and stops the job (status 124) instead of
leaving the others waiting for ever. This is the way to try a multi-worker script
on one machine before a cluster:

    tfaccel launch --workers 2 -- python recipes/digits.py

With `max_restarts=N` (`--max-restarts N`), a failed worker — a non-zero exit status
or a signal — stops all workers and starts them all again, N times at most; a script
whose Trainer has a `checkpoint_dir` resumes from its last checkpoint. A clean exit
(every worker 0), a usage error (`USAGE_STATUSES`: 2 as argparse and the recipes exit
on bad arguments, 126 a command that cannot run, 127 one not found), the launcher's
own timeouts (124) and Ctrl-C / SIGTERM to the launcher are never restarted.

Stopping: Ctrl-C is passed on to the workers; a second Ctrl-C, SIGTERM or SIGHUP
(the terminal or ssh closed) sends them SIGTERM, then SIGKILL after `GRACE_S`; from
before the first worker starts (`launcher.stops`).
Workers die with the launcher even when it is killed (Linux `PR_SET_PDEATHSIG`).

Network: TensorFlow's gRPC server binds every interface (`0.0.0.0:<port>`, hard-coded
in TensorFlow's grpc_server_lib, with no option to bind loopback) although `TF_CONFIG`
names 127.0.0.1; these servers are unauthenticated. The launcher says so, with the
ports, each time it starts the workers: on a host reachable from untrusted networks,
firewall the ports it prints. Each restart is announced on stderr; after the last one
the launcher exits with the last failure's status.

Elastic (`elastic=Elastic(min_workers=M)`, `--min-workers M`): when a worker still fails
after the last restart (its machine gone, on a cluster), the job re-forms with one
worker fewer — new ports and `TF_CONFIG`, the restart budget anew — and continues from
the last checkpoint, down to M workers; each change is announced on stderr ("worker 1 lost;
continuing on 1 worker(s) from step 340 ..."). A `tfaccel.data` pipeline over rows in
memory reads one global order (`tfaccel.data.order.global_order`), so the resumed run is
exact on the smaller job; other inputs are refused by the Trainer's resume (their
batches depend on the worker count), never silently replayed or skipped. With
`Elastic(max_workers=N, checkpoint_dir=...)` (`--max-workers N`) the job grows back the
same way (`launcher.elastic`).

Output: see `launcher.output` (gRPC lines of a normal shutdown hidden).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import TextIO

from tfaccel import strict_json
from tfaccel.launcher import elastic as elastic_jobs
from tfaccel.launcher.elastic import Elastic
from tfaccel.launcher.failures import Starts
from tfaccel.launcher.output import Relay
from tfaccel.launcher.processes import die_with_parent as _die_with_parent
from tfaccel.launcher.processes import free_ports
from tfaccel.launcher.stops import Stops, signal_group

TIMEOUT_STATUS = 124
NOT_FOUND_STATUS = 127
# Worker exit statuses that mean "the command line is wrong": restarting cannot help.
USAGE_STATUSES = (2, 126, NOT_FOUND_STATUS)
GRACE_S = 10.0
# Before a restart, survivors cannot finish a step or a save without the dead worker.
RESTART_GRACE_S = 3.0
STARTUP_TIMEOUT_S = 120.0
_PORT_POLL_S = 0.5


def tf_config(ports: list[int], index: int) -> str:
    """The `TF_CONFIG` of worker `index` in a local cluster on `ports`."""
    workers = [f"127.0.0.1:{port}" for port in ports]
    return strict_json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
    )


def worker_cores(index: int, cpus_per_worker: int | None) -> set[int] | None:
    """The CPU cores worker `index` is pinned to (wrapping round the available cores)."""
    if not cpus_per_worker:
        return None
    cores = sorted(os.sched_getaffinity(0))
    start = index * cpus_per_worker
    return {cores[(start + j) % len(cores)] for j in range(cpus_per_worker)}


def _terminate(processes: list[subprocess.Popen], grace_s: float = GRACE_S) -> None:
    """SIGTERM every live worker's process group, then SIGKILL after a grace period."""
    for process in processes:
        if process.poll() is None:
            signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(process, signal.SIGKILL)
            process.wait()


def _worker_setup(launcher: int, cores: set[int] | None):
    """The child's set-up before `exec`: die with the launcher, then pin the cores."""

    def setup():
        _die_with_parent()
        if os.getppid() != launcher:  # the launcher died before the signal was armed
            os._exit(128 + signal.SIGKILL)
        if cores:
            os.sched_setaffinity(0, cores)

    return setup


def _listening_ports() -> set[int] | None:
    """TCP ports in the LISTEN state on this machine, from /proc (None where absent)."""
    found, read_any = set(), False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                lines = handle.readlines()[1:]
        except OSError:
            continue
        read_any = True
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":  # 0A: LISTEN
                found.add(int(fields[1].rsplit(":", 1)[1], 16))
    return found if read_any else None


def _is_listening(port: int, listening: set[int] | None) -> bool:
    if listening is not None:
        return port in listening
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def check_arguments(
    command: list[str],
    workers: int,
    cpus_per_worker: int | None,
    timeout_s: float | None,
    startup_timeout_s: float | None,
    max_restarts: int = 0,
    min_workers: int | None = None,
    max_workers: int | None = None,
    checkpoint_dir: str | None = None,
) -> None:
    """Raises ValueError / FileNotFoundError for arguments `launch` cannot run."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"--workers must be an integer >= 1, got {workers!r}.")
    if min_workers is not None and (
        isinstance(min_workers, bool)
        or not isinstance(min_workers, int)
        or not 1 <= min_workers <= workers
    ):
        raise ValueError(
            f"--min-workers must be an integer from 1 to --workers ({workers}): the fewest "
            f"workers the job may continue on, got {min_workers!r}."
        )
    if max_workers is not None and (
        isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < workers
    ):
        raise ValueError(
            f"--max-workers must be an integer >= --workers ({workers}): the most workers "
            f"the job grows back to, got {max_workers!r}."
        )
    if max_workers is not None and not checkpoint_dir:
        raise ValueError(
            "--max-workers needs --checkpoint-dir (the job's checkpoint_dir): the job grows "
            "back once it has saved a checkpoint on fewer workers."
        )
    if cpus_per_worker is not None and (
        isinstance(cpus_per_worker, bool)
        or not isinstance(cpus_per_worker, int)
        or cpus_per_worker < 1
    ):
        raise ValueError(
            f"--cpus-per-worker must be an integer >= 1 (cores per worker), got "
            f"{cpus_per_worker!r}; leave it out to let every worker use every core."
        )
    for flag, value in (("--timeout", timeout_s), ("--startup-timeout", startup_timeout_s)):
        if value is not None and (isinstance(value, bool) or not value > 0):
            raise ValueError(
                f"{flag} must be a number of seconds > 0, got {value!r}; leave it out for "
                "the default."
            )
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(
            f"--max-restarts must be an integer >= 0 (how many times to restart all workers "
            f"after a failure), got {max_restarts!r}."
        )
    if not command:
        raise ValueError("No command to launch: put it after `--`, e.g. -- python train.py")
    program = command[0]
    found = (
        os.path.isfile(program) and os.access(program, os.X_OK)
        if os.sep in program
        else shutil.which(program) is not None
    )
    if not found:
        where = "is not an executable file" if os.sep in program else "was not found on PATH"
        raise FileNotFoundError(
            f"Cannot launch {program!r}: it {where}. Check the spelling, or give the full "
            f"path (e.g. -- {sys.executable} train.py)."
        )


def launch(
    command: list[str],
    workers: int,
    *,
    cpus_per_worker: int | None = None,
    timeout_s: float | None = None,
    startup_timeout_s: float | None = STARTUP_TIMEOUT_S,
    max_restarts: int = 0,
    elastic: Elastic | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Runs `command` as `workers` local processes; returns the job's exit status.

    Args:
        command: the program and its arguments, e.g. `["python", "train.py"]`.
        workers: how many worker processes (>= 1).
        cpus_per_worker: pin each worker to this many cores (and size TensorFlow's
            thread pools to match).
        timeout_s: stop everything after this many seconds, restarts included (status 124).
        startup_timeout_s: once one worker's TensorFlow server listens, how long
            the others may take to start theirs before the job is stopped
            (status 124, naming the missing workers); None waits for ever.
        max_restarts: after a worker fails, restart all workers up to this many
            times (see the module docstring for what counts as a failure).
        elastic: how the job changes size (`launcher.elastic.Elastic`: `min_workers` to
            shrink to after the last restart, with a new `TF_CONFIG` and the restart
            budget anew; `max_workers` to grow back to once it saved a checkpoint on
            fewer, with its `checkpoint_dir`); None: a fixed size.
        out: where prefixed output goes (default stdout).
        err: where restarts are announced (default stderr).

    Raises:
        ValueError: `workers` < 1, `cpus_per_worker` < 1, a timeout <= 0,
            `max_restarts` < 0, or an empty command.
        FileNotFoundError: the command's program does not exist.
    """
    elastic = elastic or Elastic()
    min_workers, max_workers = elastic.min_workers, elastic.max_workers
    checkpoint_dir = elastic.checkpoint_dir
    check_arguments(
        command,
        workers,
        cpus_per_worker,
        timeout_s,
        startup_timeout_s,
        max_restarts,
        min_workers,
        max_workers,
        checkpoint_dir,
    )
    out, err = out or sys.stdout, err or sys.stderr
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    restarts = grows = 0
    starts = Starts()  # a worker failing at once on every start: a script error
    while True:
        grow = None
        if max_workers is not None and checkpoint_dir and grows < elastic_jobs.MAX_GROWS:
            grow = elastic_jobs.GrowWatch(checkpoint_dir, workers, max_workers)
        timeout = (deadline, timeout_s)
        result = starts.timed(
            _run_once, command, workers, cpus_per_worker, timeout, startup_timeout_s, out, err, grow
        )
        if result.grown and max_workers is not None:
            workers, restarts, grows = max_workers, starts.reset(), grows + 1
            err.write(
                f"[launch] capacity back: re-forming the job on {workers} worker(s) from "
                f"{_resume_point(checkpoint_dir)}\n"
            )
            err.flush()
            continue
        if result.status == 0 or not result.restartable:
            return result.status
        if restarts == max_restarts and min_workers is not None and workers > min_workers:
            if starts.script_error(result, err):
                return result.status
            workers, restarts = workers - 1, starts.reset()
            err.write(
                f"[launch] {result.what} after {max_restarts} restart(s): worker "
                f"{result.worker} lost; continuing on {workers} worker(s) from "
                f"{_resume_point(checkpoint_dir)}\n"
            )
            err.flush()
            continue
        if restarts == max_restarts:
            if max_restarts:
                err.write(
                    f"[launch] {result.what}; giving up after {max_restarts} restart(s), "
                    f"exit status {result.status}\n"
                )
                err.flush()
            return result.status
        restarts += 1
        err.write(
            f"[launch] {result.what}; restarting all workers ({restarts} of {max_restarts})\n"
        )
        err.flush()


def _resume_point(checkpoint_dir: str | None) -> str:
    """ "step N" of the latest checkpoint in `checkpoint_dir` (`elastic_jobs.last_step`)."""
    step = elastic_jobs.last_step(checkpoint_dir)
    if step is not None:
        return f"step {step} (the last checkpoint in {checkpoint_dir})"
    return "its last checkpoint"


class _Result:
    """How one start of the workers ended (`worker`: the index of the one that failed)."""

    def __init__(
        self, status: int, what: str = "", restartable: bool = False, worker: int | None = None
    ) -> None:
        self.status, self.what, self.restartable, self.worker = status, what, restartable, worker
        self.grown = False


def _run_once(
    command, workers, cpus_per_worker, timeout, startup_timeout_s, out, err, grow=None
) -> _Result:
    """Starts the workers once and supervises them; `timeout` is (deadline, seconds)."""
    ports = free_ports(workers)
    if workers > 1:  # each start: new servers, new ports
        err.write(
            "[launch] note: the workers' TensorFlow servers will listen on EVERY network "
            f"interface (ports {', '.join(map(str, ports))}), not only on 127.0.0.1: "
            "TensorFlow has no bind address. They are unauthenticated; on a host reachable "
            "from untrusted networks, firewall these ports.\n"
        )
        err.flush()
    relay = Relay(out)
    with Stops(relay.processes, GRACE_S).installed() as stops:
        for index in range(workers):
            if stops.received:  # a stop asked while the workers start: start no more
                break
            env = dict(os.environ, TF_CONFIG=tf_config(ports, index), PYTHONUNBUFFERED="1")
            cores = worker_cores(index, cpus_per_worker)
            if cores:
                threads = str(len(cores))
                env.update(TF_NUM_INTRAOP_THREADS=threads, OMP_NUM_THREADS=threads)
            process = subprocess.Popen(
                command,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_worker_setup(os.getpid(), cores),
            )
            relay.follow(process, index)
            stops.catch_up(process)
        if not relay.processes:  # stopped before the first worker started
            return _Result(128 + stops.received[0], "stopped before a worker started")
        startup = _StartupWatch(ports, startup_timeout_s) if workers > 1 else None
        result = _Result(TIMEOUT_STATUS)
        try:
            result = _supervise(relay, timeout, stops, startup, grow)
        finally:
            relay.finish(succeeded=result.status == 0)
        return result


class _StartupWatch:
    """Notices workers whose TensorFlow server never starts while a peer waits."""

    def __init__(self, ports: list[int], timeout_s: float | None):
        self.ports = ports
        self.timeout_s = timeout_s
        self.started: set[int] = set()
        self.first_at: float | None = None
        self.next_poll = 0.0

    def missing(self, processes: list[subprocess.Popen]) -> list[int]:
        """Workers still running without a server `timeout_s` after the first one's."""
        now = time.monotonic()
        if self.timeout_s is None or len(self.started) == len(self.ports):
            return []
        if now >= self.next_poll:
            self.next_poll = now + _PORT_POLL_S
            listening = _listening_ports()
            for index, port in enumerate(self.ports):
                if index not in self.started and _is_listening(port, listening):
                    self.started.add(index)
            if self.started and self.first_at is None:
                self.first_at = now
        if self.first_at is None or now - self.first_at <= self.timeout_s:
            return []
        return [
            i
            for i, process in enumerate(processes)
            if i not in self.started and process.poll() is None
        ]


def _stop_to_grow(relay: Relay, processes, grow) -> _Result:
    """Stops the workers (SIGTERM: the Trainer saves and exits) for the job to grow."""
    relay.write(
        f"[launch] the job saved step {grow.step} on {len(processes)} worker(s): stopping "
        "it (SIGTERM) to re-form it on more\n"
    )
    _terminate(processes)
    result = _Result(0)
    result.grown = True
    return result


def _supervise(relay: Relay, timeout: tuple, stops: Stops, startup=None, grow=None) -> _Result:
    processes, received = relay.processes, stops.received
    deadline, timeout_s = timeout
    while True:
        while stops.notes:
            relay.write(stops.notes.pop(0))
        stops.kill_due()
        statuses = [p.poll() for p in processes]
        failed = [(i, s) for i, s in enumerate(statuses) if s not in (None, 0)]
        if failed:
            index, status = failed[0]
            relay.write(f"[launch] worker {index} exited with status {status}; stopping all\n")
            restartable = not received and status not in USAGE_STATUSES
            _terminate(processes, RESTART_GRACE_S if restartable else GRACE_S)
            if status < 0:
                what = f"worker {index} died (signal {-status})"
            else:
                what = f"worker {index} failed (exit status {status})"
            code = status if status > 0 else 128 - status
            return _Result(code, what, restartable, worker=index)
        if all(s == 0 for s in statuses):
            return _Result(0)
        if grow is not None and not received and grow.due():
            return _stop_to_grow(relay, processes, grow)
        if deadline is not None and time.monotonic() > deadline:
            relay.write(f"[launch] timed out after {timeout_s:g} s; stopping all workers\n")
            _terminate(processes)
            return _Result(TIMEOUT_STATUS)
        missing = startup.missing(processes) if startup is not None else []
        if missing:
            names = ", ".join(f"worker {i} (127.0.0.1:{startup.ports[i]})" for i in missing)
            ready = ", ".join(str(i) for i in sorted(startup.started))
            relay.write(
                f"[launch] {names} did not start its TensorFlow server within "
                f"{startup.timeout_s:g} s of worker(s) {ready}, which wait for it; "
                "stopping all workers. Check that every worker reaches "
                "tfaccel.devices.strategy(...) (raise --startup-timeout if its "
                "set-up is slow).\n"
            )
            _terminate(processes)
            return _Result(TIMEOUT_STATUS)
        time.sleep(0.1)
