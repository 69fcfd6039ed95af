"""`pipeline(..., service=...)`: the stages before prefetch run on tf.data service workers.

The dataset built so far (source, shard, preprocess, cache, augment, shuffle, repeat,
batch, batch_map) is sent to the dispatcher with
`tf.data.experimental.service.distribute`; its batches come back over gRPC, and the
prefetch and the distribution to replicas stay in this process.

Modes:
    "dynamic" (default): `distributed_epoch` — the dispatcher hands the source's
        splits (files, or ranges of elements) to whichever worker asks: each example at
        most once an epoch (exactly once without faults), the order not reproducible,
        a killed worker's unfinished splits lost for that epoch.
    "static": `ShardingPolicy.FILE_OR_DATA` — each worker its fixed shard (by file, or
        by element), so what each worker reads is reproducible; the dispatcher needs
        the fixed list of workers (`local` gives it; `tfaccel data-service dispatcher
        --worker-addresses`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tfaccel.data.service.local import MODES, LocalService, ServiceError

RESUME_NOTE = (
    "resume: not exact through the tf.data service: the resumed epoch's input restarts "
    "on the workers and the steps already done are skipped by count, in the order the "
    "workers deliver (some examples of that epoch seen twice, others not at all)"
)


@dataclasses.dataclass(frozen=True)
class ServiceInfo:
    """Where a pipeline's preprocessing runs (`Built.service`, `DatasetFn.service`).

    Attributes:
        address: the dispatcher, "grpc://host:port".
        mode: "dynamic" (`distributed_epoch`) or "static" (`FILE_OR_DATA`).
        workers: the number of workers when known (a `local` service), else None.
        local: the `LocalService`, when the pipeline was given one.
    """

    address: str
    mode: str
    workers: int | None = None
    local: LocalService | None = dataclasses.field(default=None, compare=False, repr=False)

    def describe(self) -> str:
        """One line for the settings table."""
        workers = f", {self.workers} workers" if self.workers else ""
        policy = "distributed_epoch" if self.mode == "dynamic" else "static FILE_OR_DATA"
        return f"tf.data service at {self.address} ({self.mode}: {policy}{workers})"


def info_of(service: Any, mode: str | None) -> ServiceInfo | None:
    """`pipeline`'s `service` and `service_mode`, checked; None without a service.

    Raises:
        ValueError: a bad address or mode, or a mode without a service.
        ServiceError: no dispatcher at the address, or the local one has exited.
        TypeError: `service` is neither an address nor a `LocalService`.

    `service="auto"` is the service of `tfaccel launch --data-workers` (its address in
    the environment, `tfaccel.data.service.from_env`), or None when there is none.
    """
    if service == "auto":
        return _from_env(mode)
    if service is None:
        if mode is not None:
            raise ValueError("service_mode was given without service=.")
        return None
    mode = "dynamic" if mode is None else mode
    if mode not in MODES:
        raise ValueError(f"service_mode must be one of {MODES}, got {mode!r}.")
    if isinstance(service, LocalService):
        service.check()
        if mode == "static" and not service.static_sharding:
            raise ValueError(
                "service_mode='static' needs the dispatcher's fixed list of workers: start "
                "the service with tfaccel.data.service.local(n, static_sharding=True)."
            )
        return ServiceInfo(service.address, mode, service.workers, service)
    if not isinstance(service, str):
        raise TypeError(
            "service must be an address 'grpc://host:port' / 'host:port' or "
            f"tfaccel.data.service.local(n), got {type(service).__name__}."
        )
    address = service.removeprefix("grpc://")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"service={service!r} is not a tf.data service address; expected "
            "'grpc://host:port' (the dispatcher of `tfaccel data-service dispatcher --port P`)."
        )
    _check_listening(host, int(port), service)
    return ServiceInfo(f"grpc://{address}", mode)


def _from_env(mode: str | None) -> ServiceInfo | None:
    """`service="auto"`: the service `tfaccel launch --data-workers` started, else None."""
    import os

    from tfaccel.data.service.local import ENV_WORKERS, from_env

    address = from_env()
    if address is None:
        return None
    workers = os.environ.get(ENV_WORKERS, "")
    info = info_of(address, mode)
    assert info is not None  # an address gives a ServiceInfo or raises
    return dataclasses.replace(info, workers=int(workers) if workers.isdigit() else None)


def _check_listening(host: str, port: int, service: str, timeout_s: float = 5.0) -> None:
    """Raises `ServiceError` when nothing accepts connections at host:port (a dead or
    never-started dispatcher would otherwise make the first read wait for ever)."""
    import socket

    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as error:
        raise ServiceError(
            f"no tf.data service dispatcher answers at {service!r} ({error}); start one with "
            f"`tfaccel data-service dispatcher --port {port}` or check the address."
        ) from None


def _examples(s) -> int | None:
    """The examples an epoch holds (the stream before `batch`), when known and finite."""
    before = getattr(s, "before_batch", None)
    if before is None:
        return None
    count = int(before.cardinality())
    if count == -2 and s.split_rows:  # unknown: rows handed out in chunks (service_splits)
        repeat = s.config.repeat
        if repeat is True:
            return None
        count = s.split_rows * (repeat or 1)
    return count if count > 0 else None


def _loopback(address: str) -> bool:
    """Whether the dispatcher is on this machine's loopback (its workers too, for `local`)."""
    host = address.removeprefix("grpc://").rpartition(":")[0].strip("[]")
    return host in ("localhost", "127.0.0.1", "::1")


def _share_remote(s, address: str) -> None:
    """The Python functions of a pipeline for a service not made here: through the
    launcher's relay (`tfaccel launch --data-workers`), else said (workers elsewhere lack
    them, unless they run in this process)."""
    from tfaccel.data.service.relay import share_launched

    if share_launched(s.dataset, address) is None:
        note = (
            "service: the pipeline's numpy_function / py_function ops run Python of this "
            f"process; the workers at {address} do not have it (unless they run in this "
            "process), so their read fails with 'Could not find callback': use "
            "data.service.local(n) or `tfaccel launch --data-workers`, or TensorFlow ops"
        )
        s.plan.notes.append(note)
        import warnings

        warnings.warn(note.removeprefix("service: "), stacklevel=4)


def offload(s: Any) -> Any:
    """Sends the stream built so far to the service's workers (a `stages.Stream`)."""
    info = s.config.service
    if info is None:
        return s
    import tensorflow as tf

    if info.local is not None:
        info.local.check()
    if s.config.cache not in (None, "memory"):
        raise ValueError(
            f"cache={s.config.cache!r} with service=: every worker would write the same "
            "cache files. Use cache='memory' (each worker's own, for its job) or None, or "
            "cache the decoded data to files first and read those as the source."
        )
    if info.mode == "static" and s.config.shuffle_buffer is not None and s.config.seed is None:
        raise ValueError(
            "service_mode='static' shards by file, else each worker keeps every n-th batch "
            "of its own copy of the stream: the copies must shuffle alike. Pass seed=N "
            "(the reproducible order static sharding is for)."
        )
    service = tf.data.experimental.service
    policy = service.ShardingPolicy.DYNAMIC
    if info.mode == "static":
        policy = service.ShardingPolicy.FILE_OR_DATA
    if info.local is not None:  # its workers run this process's Python functions
        info.local.share_functions(s.dataset)
    else:
        _share_remote(s, info.address)
    inner = tf.data.Options()
    inner.deterministic = s.config.deterministic
    expected = _examples(s)
    compression = None if _loopback(info.address) else "AUTO"
    s.dataset = s.dataset.with_options(inner).apply(
        service.distribute(processing_mode=policy, service=info.address, compression=compression)
    )
    if info.mode == "dynamic" and expected:
        from tfaccel.data.service.count import counted

        s.dataset, _ = counted(s.dataset, expected, info.address)
    stages = ", ".join(step.name for step in s.plan.steps)
    s.plan.add(
        "service",
        on=f"{info.workers or 'the'} tf.data service worker(s) at {info.address}",
        runs_there=stages,
        here="prefetch, distribution to replicas",
        mode=info.mode,
        compression=compression or "none (loopback: compressing costs the cores it shares)",
    )
    if s.config.cache == "memory":
        s.plan.notes.append(
            "service: cache='memory' is each worker's, for one job: the service starts a new "
            "job each epoch, so the cache does not carry over epochs (cache=None saves memory)"
        )
    if info.mode == "dynamic":
        s.plan.notes.append(
            "service: distributed_epoch — each example at most once an epoch (exactly once "
            "without faults), order not reproducible; each worker batches its own splits, "
            "so an epoch may hold several partial batches (steps: unknown)"
        )
    else:
        s.plan.notes.append(
            "service: static sharding — each worker reads its fixed shard; the interleaving "
            "of the workers' batches is not reproducible"
        )
    if s.config.training:
        s.plan.notes[:] = [n for n in s.plan.notes if not n.startswith("resume:")]
        s.plan.notes.append(RESUME_NOTE)
    return s
