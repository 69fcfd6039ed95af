"""`tfaccel launch --data-workers K`: a local tf.data service for the launched job.

The launcher starts `tfaccel.data.service.local(K)` (a dispatcher and K worker
processes, loopback) before the job, puts its address in every worker's environment
(`TFACCEL_DATA_SERVICE=grpc://localhost:PORT`, `TFACCEL_DATA_SERVICE_WORKERS=K`), and
stops it when the job ends, on Ctrl-C and when the launcher dies. In the script,
`data.pipeline(..., service="auto")` uses that service when the variable is set and
runs the pipeline in the process otherwise, so one script serves both; the service's
watch ends a job stalled by a dead server (see `tfaccel.data.service.watch`).

The Python functions of a launched process's `numpy_function` / `py_function` ops reach
these workers through a relay (`tfaccel.data.service.relay`): a private directory named
in `TFACCEL_DATA_SERVICE_FUNCTIONS`, watched by a thread of the launcher that hands each
request to the workers and answers it. Starting the service imports TensorFlow in the
launcher (a few seconds).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from tfaccel.data.service.local import LocalService

__all__ = ["service_for_job"]


@contextlib.contextmanager
def service_for_job(workers: int, err: TextIO | None = None) -> Iterator[LocalService]:
    """Runs a local tf.data service of `workers` workers for the block; yields it.

    Its address is in `os.environ` (so in every process started in the block) under
    `tfaccel.data.service.ENV`, its worker count under `ENV_WORKERS`, the directory of its
    function relay under `ENV_FUNCTIONS`, the secret its requests are sealed with under
    `sealed.ENV_KEY` (the launcher's children only: they inherit it).

    Raises:
        ValueError: `workers` is not a positive int.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"--data-workers must be an integer >= 1, got {workers!r}.")
    from tfaccel.data import service
    from tfaccel.data.service.relay import relay_for
    from tfaccel.data.service.sealed import ENV_KEY

    err = err or sys.stderr
    names = (service.ENV, service.ENV_WORKERS, service.ENV_FUNCTIONS, ENV_KEY)
    before = {name: os.environ.get(name) for name in names}
    with service.local(workers) as running, relay_for(running) as relay:
        values = (running.address, str(workers), relay, running.key.hex())
        os.environ.update(zip(names, values, strict=True))
        err.write(
            f"[launch] tf.data service: a dispatcher and {workers} worker process(es) at "
            f"{running.address}, in every worker's {names[0]}; data.pipeline(..., "
            "service='auto') uses it\n"
        )
        err.flush()
        try:
            yield running
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
