"""Find accelerators, configure their memory, and choose a `tf.distribute.Strategy`.

Configuration must happen before TensorFlow initialises its devices (before the
first op runs); `configure` checks that and says so instead of failing deep
inside TensorFlow.

Example:
    >>> from tfaccel import devices
    >>> devices.configure(memory_growth=True)        # doctest: +SKIP
    >>> strategy = devices.strategy("auto")          # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
import socket
import sys
from typing import Any

import tensorflow as tf

from tfaccel import cluster, shared_strategy
from tfaccel.cluster import read_tf_config
from tfaccel.errors import DeviceConfigError
from tfaccel.launcher import rendezvous

__all__ = [
    "GPU",
    "DeviceConfig",
    "DeviceConfigError",
    "configure",
    "describe",
    "list_gpus",
    "strategy",
]

STRATEGY_KINDS = ("auto", "default", "one_device", "mirrored", "multi_worker")
"""The kinds `strategy(kind)` accepts."""
COLLECTIVE_TIMEOUT_S = 300.0
"""Seconds a multi-worker collective waits for a peer before it fails (instead of hanging)."""
STARTUP_TIMEOUT_S = 300.0  # multi-worker: how long the peers may take to come
"""Seconds a multi-worker start waits for every peer to arrive before naming the missing ones."""


@dataclasses.dataclass(frozen=True)
class GPU:
    """One physical GPU as TensorFlow sees it."""

    index: int
    name: str
    compute_capability: tuple[int, int] | None
    memory_mb: int | None
    physical: Any = dataclasses.field(repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class DeviceConfig:
    """The settings `configure` applied."""

    memory_growth: bool
    memory_limit_mb: int | None
    visible: tuple[int, ...] | None
    virtual_cpus: int | None
    virtual_gpus: int | None


_applied: DeviceConfig | None = None
_served_ports: set[str] = set()  # this process's own multi-worker server ports


def list_gpus() -> list[GPU]:
    """Returns the physical GPUs with their name, compute capability and memory."""
    gpus = []
    for index, device in enumerate(tf.config.list_physical_devices("GPU")):
        try:
            details = tf.config.experimental.get_device_details(device)
        except (ValueError, RuntimeError):
            details = {}
        capability = details.get("compute_capability")
        memory = details.get("memory_limit") or details.get("device_memory_size")
        gpus.append(
            GPU(
                index=index,
                name=details.get("device_name", device.name),
                compute_capability=tuple(capability) if capability else None,
                memory_mb=int(memory) // (1024 * 1024) if memory else None,
                physical=device,
            )
        )
    return gpus


def configure(
    *,
    memory_growth: bool | None = None,
    memory_limit_mb: int | None = None,
    visible: list[int] | tuple[int, ...] | None = None,
    virtual_cpus: int | None = None,
    virtual_gpus: int | None = None,
) -> DeviceConfig:
    """Applies visible GPUs, memory growth or a memory cap, and virtual device splits.

    Call it before any TensorFlow op runs. Calling it again with the same settings
    is a no-op.

    Args:
        memory_growth: let each GPU's memory grow on demand. Defaults to True
            unless `memory_limit_mb` is given (the two exclude each other).
        memory_limit_mb: hard cap in MiB, the same on every visible GPU.
        visible: indices of the GPUs TensorFlow may use (`[]` hides them all).
        virtual_cpus: split the CPU into this many logical devices.
        virtual_gpus: split each visible GPU into this many logical GPUs, each
            with `memory_limit_mb` (or an equal share of the GPU's memory).

    Returns:
        The applied `DeviceConfig`.

    Raises:
        TypeError: `memory_growth` not a bool, or `visible` not a list of ints.
        ValueError: contradictory or non-positive arguments.
        DeviceConfigError: a visible index that does not exist, or different
            settings after TensorFlow has initialised its devices.
    """
    global _applied
    if memory_growth is not None and not isinstance(memory_growth, bool):
        raise TypeError(
            f"memory_growth must be True, False or None, got {memory_growth!r} "
            f"({type(memory_growth).__name__}). Pass memory_growth=False to keep the "
            "default allocator, True to grow on demand, or leave it out."
        )
    visible = _check_visible(visible)
    if memory_growth and memory_limit_mb is not None:
        raise ValueError(
            "memory_growth=True and memory_limit_mb exclude each other: a GPU either "
            "grows on demand or has a fixed cap. Pass only one of them."
        )
    for name, value in (
        ("memory_limit_mb", memory_limit_mb),
        ("virtual_cpus", virtual_cpus),
        ("virtual_gpus", virtual_gpus),
    ):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    growth = memory_limit_mb is None if memory_growth is None else memory_growth
    wanted = DeviceConfig(
        memory_growth=growth,
        memory_limit_mb=memory_limit_mb,
        visible=None if visible is None else tuple(visible),
        virtual_cpus=virtual_cpus,
        virtual_gpus=virtual_gpus,
    )
    if wanted == _applied:
        return _applied

    gpus = list_gpus()
    if wanted.visible is not None:
        missing = [i for i in wanted.visible if not 0 <= i < len(gpus)]
        if missing:
            raise DeviceConfigError(
                f"visible={list(wanted.visible)} names GPU index(es) {missing}, but this "
                f"machine has {len(gpus)} GPU(s) (indices 0..{len(gpus) - 1}). "
                "Run `tfaccel devices` to see them."
            )
    try:
        _apply(wanted, gpus)
    except RuntimeError as error:
        raise DeviceConfigError(
            "Device configuration must happen before any TensorFlow op runs, but "
            f"TensorFlow has already initialised its devices. Current settings: "
            f"{_current_settings()}; requested: {wanted}. Call tfaccel.devices.configure "
            f"first thing in your program. (TensorFlow said: {error})"
        ) from error
    _applied = wanted
    return wanted


def _check_visible(visible) -> list[int] | None:
    if visible is None:
        return None
    if not isinstance(visible, (list, tuple, range)):
        hint = f" For one GPU write visible=[{visible}]." if str(visible).isdigit() else ""
        raise TypeError(
            f"visible must be a list of GPU indices such as [0] or [0, 1], got {visible!r} "
            f"({type(visible).__name__}).{hint}"
        )
    bad = [i for i in visible if isinstance(i, bool) or not isinstance(i, numbers.Integral)]
    if bad:
        raise TypeError(
            f"visible must hold integer GPU indices, got {list(visible)!r} (not integers: "
            f"{bad!r}). Write e.g. visible=[0, 1]; `tfaccel devices` lists the indices."
        )
    return [int(i) for i in visible]


def _apply(config: DeviceConfig, gpus: list[GPU]) -> None:
    if config.visible is not None:
        chosen = [gpus[i].physical for i in config.visible]
        if tf.config.get_visible_devices("GPU") != chosen:
            tf.config.set_visible_devices(chosen, "GPU")
        gpus = [gpus[i] for i in config.visible]
    if config.virtual_cpus is not None:
        cpu = tf.config.list_physical_devices("CPU")[0]
        current = tf.config.get_logical_device_configuration(cpu)
        if current is None or len(current) != config.virtual_cpus:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * config.virtual_cpus
            )
    for gpu in gpus:
        if config.virtual_gpus or config.memory_limit_mb:
            parts = config.virtual_gpus or 1
            limit = config.memory_limit_mb
            if limit is None:
                if gpu.memory_mb is None:
                    raise ValueError(
                        f"virtual_gpus={parts} needs memory_limit_mb: the memory of "
                        f"{gpu.name} is unknown."
                    )
                limit = gpu.memory_mb // parts
            tf.config.set_logical_device_configuration(
                gpu.physical,
                [tf.config.LogicalDeviceConfiguration(memory_limit=limit)] * parts,
            )
        elif tf.config.experimental.get_memory_growth(gpu.physical) != config.memory_growth:
            tf.config.experimental.set_memory_growth(gpu.physical, config.memory_growth)


def _current_settings() -> dict:
    cpu = tf.config.list_physical_devices("CPU")[0]
    cpu_split = tf.config.get_logical_device_configuration(cpu)
    return {
        "visible_gpus": [d.name for d in tf.config.get_visible_devices("GPU")],
        "virtual_cpus": len(cpu_split) if cpu_split else None,
        "memory_growth": {
            d.name: tf.config.experimental.get_memory_growth(d)
            for d in tf.config.get_visible_devices("GPU")
        },
    }


def describe() -> dict:
    """Returns a report of the TensorFlow build, the devices, why no GPU is seen, and the cluster.

    Lists logical devices, which initialises TensorFlow's runtime.
    """
    build = tf.sysconfig.get_build_info()
    import keras

    gpus = list_gpus()
    visible = tf.config.get_visible_devices("GPU")
    report = {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "python": sys.version.split()[0],
        "built_with_cuda": tf.test.is_built_with_cuda(),
        "cuda_version": build.get("cuda_version"),
        "cudnn_version": build.get("cudnn_version"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "physical_devices": [
            {"name": d.name, "type": d.device_type} for d in tf.config.list_physical_devices()
        ],
        "logical_devices": [
            {"name": d.name, "type": d.device_type} for d in tf.config.list_logical_devices()
        ],
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "compute_capability": g.compute_capability,
                "memory_mb": g.memory_mb,
            }
            for g in gpus
        ],
        "no_gpu_reasons": [],
        "cluster": _cluster_report(),
    }
    if not visible:
        report["no_gpu_reasons"] = _no_gpu_reasons(report, bool(gpus))
    return report


def _cluster_report() -> dict:
    """Where the cluster comes from (TF_CONFIG / Slurm / none), this task, the workers."""
    try:
        return cluster.detect().as_dict()
    except DeviceConfigError as error:
        return {"source": "invalid", "error": str(error)}


def _no_gpu_reasons(report: dict, has_physical: bool) -> list[str]:
    reasons = []
    if has_physical:
        reasons.append("GPUs exist but were hidden: configure(visible=[]) or set_visible_devices.")
        return reasons
    if not report["built_with_cuda"]:
        reasons.append(
            "This TensorFlow build has no CUDA support (CPU-only wheel or macOS); on "
            "Linux install `pip install 'tfaccel[and-cuda]'`."
        )
    cvd = report["cuda_visible_devices"]
    if cvd is not None and cvd.strip() in ("", "-1"):
        reasons.append(f"CUDA_VISIBLE_DEVICES={cvd!r} hides every GPU.")
    if report["built_with_cuda"] and not os.path.exists("/proc/driver/nvidia/version"):
        reasons.append("No NVIDIA driver is loaded (/proc/driver/nvidia/version is missing).")
    if not reasons:
        reasons.append(
            "CUDA build and driver look present; check that the CUDA/cuDNN libraries "
            f"match the build (CUDA {report['cuda_version']}, cuDNN {report['cudnn_version']})."
        )
    return reasons


def strategy(
    kind: str = "auto",
    *,
    devices: list[str] | None = None,
    cross_device_ops: Any = "auto",
    collective_timeout_s: float | None = COLLECTIVE_TIMEOUT_S,
    startup_timeout_s: float | None = STARTUP_TIMEOUT_S,
) -> tf.distribute.Strategy:
    """Chooses a `tf.distribute.Strategy`.

    `auto`: a multi-worker `TF_CONFIG` → `MultiWorkerMirroredStrategy`; else a Slurm
    job step with more than one task → `MultiWorkerMirroredStrategy` with a
    `SlurmClusterResolver` (see `tfaccel.cluster`); else several GPUs (or several
    named `devices`) → `MirroredStrategy`; else the default strategy.

    One strategy per request in a process: a second call for the same kind and devices
    (and the same `cross_device_ops`, or, multi-worker, the same cluster and timeout)
    returns the strategy the first call made, so a hand-written loop and a Trainer
    share it. Two strategies with collective all-reduce over the same devices break
    each other's steps ("Shape mismatch in the collective instance"); ask for other
    devices, or pass another `cross_device_ops` object, to get a new one.

    Args:
        kind: one of auto, default, one_device, mirrored, multi_worker.
        devices: device names for one_device / mirrored (e.g. `["/cpu:0", "/cpu:1"]`).
        cross_device_ops: a `tf.distribute.CrossDeviceOps`, or "auto": NCCL on Linux
            with several GPUs, hierarchical copy on other multi-GPU hosts, reduction
            to one device for CPUs.
        collective_timeout_s: multi-worker collectives fail after this many seconds
            instead of hanging when a peer dies (None: wait for ever).
        startup_timeout_s: multi-worker: how long to wait for every peer to come before
            `DeviceConfigError` (None: wait for ever); Ctrl-C / SIGTERM stop the wait.

    Raises:
        ValueError: unknown kind.
        TypeError: `devices` is not a list of names (e.g. one string).
        DeviceConfigError: devices that do not exist, a malformed TF_CONFIG, inconsistent
            Slurm variables, `multi_worker` with neither TF_CONFIG nor Slurm, or
            (multi_worker) this task's port already in use on this machine, or peers
            that never came within `startup_timeout_s`.
    """

    if kind not in STRATEGY_KINDS:
        raise ValueError(f"Unknown strategy kind {kind!r}; expected one of {STRATEGY_KINDS}.")
    if devices is not None and not isinstance(devices, (list, tuple)):
        example = f"[{devices!r}]" if isinstance(devices, str) else "['/gpu:0', '/gpu:1']"
        raise TypeError(
            f"devices must be a list of device names, got {devices!r} "
            f"({type(devices).__name__}). Write devices={example}."
        )
    tf_config = read_tf_config()
    info = cluster.detect() if kind in ("auto", "multi_worker") else cluster.ClusterInfo("none")
    if kind == "auto":
        if info.workers > 1:
            kind = "multi_worker"
        elif devices is not None:
            kind = "mirrored" if len(devices) > 1 else "one_device"
        elif len(tf.config.list_logical_devices("GPU")) > 1:
            kind = "mirrored"
        else:
            kind = "default"
    if kind == "default":
        return tf.distribute.get_strategy()
    if kind == "multi_worker":
        key: tuple = ("multi_worker", info.source, info.task_type, info.task_index, info.addresses)
        key += (json.dumps(tf_config, sort_keys=True), collective_timeout_s)
        made = shared_strategy.cached(key)
        if made is not None:
            return made
        if info.source == "none" and tf_config is None:
            raise DeviceConfigError(
                'strategy("multi_worker") found no cluster: TF_CONFIG is unset and this is '
                "not a Slurm job step with several tasks (SLURM_STEP_ID, SLURM_NTASKS > 1). "
                "Start the script with `tfaccel launch`, srun, Kubernetes/Ray (which set "
                'TF_CONFIG), or use strategy("auto") on one machine.'
            )
        if info.source != "Slurm":
            _check_own_port(tf_config)
        if info.source != "none":
            print(cluster.obeyed(info), file=sys.stderr, flush=True)
            own = _own_address(info, tf_config)
            if own is not None and own not in _served_ports:
                peers = [a for a in info.addresses if a != own]
                origin = "TF_CONFIG" if info.source == "TF_CONFIG" else "the Slurm job step"
                try:
                    rendezvous.wait(own, peers, startup_timeout_s, origin)
                except rendezvous.PeersMissingError as error:
                    raise DeviceConfigError(str(error)) from None
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=collective_timeout_s
        )
        with rendezvous.guarded(startup_timeout_s):  # TensorFlow's set-up, bounded
            made = tf.distribute.MultiWorkerMirroredStrategy(
                cluster_resolver=info.resolver, communication_options=options
            )
        if tf_config and info.source != "Slurm":
            task = tf_config["task"]
            _served_ports.add(tf_config["cluster"][task["type"]][task["index"]])
        return shared_strategy.keep(key, made)
    names = _check_devices(devices) if devices is not None else _default_devices()
    if kind == "one_device":
        key = ("one_device", names[0])
    else:  # the same cross-device ops: "auto", None (TensorFlow's choice) or the same object
        ops_key = cross_device_ops if cross_device_ops in ("auto", None) else id(cross_device_ops)
        key = ("mirrored", tuple(names), ops_key)
    made = shared_strategy.cached(key)
    if made is not None:
        return made
    if kind == "one_device":
        return shared_strategy.keep(key, tf.distribute.OneDeviceStrategy(names[0]))
    ops = _cross_device_ops(names) if cross_device_ops == "auto" else cross_device_ops
    made = tf.distribute.MirroredStrategy(devices=names, cross_device_ops=ops)
    return shared_strategy.keep(key, made)


def _own_address(info: cluster.ClusterInfo, tf_config: dict | None) -> str | None:
    """This worker's "host:port" in the cluster `info` describes."""
    if tf_config and info.source == "TF_CONFIG":
        task = tf_config["task"]
        return tf_config["cluster"][task["type"]][task["index"]]
    if info.task_index is not None and info.task_index < len(info.addresses):
        return info.addresses[info.task_index]
    return None


def _check_own_port(tf_config: dict | None) -> None:
    """Raises DeviceConfigError when this task's port is already taken on this machine."""
    if not tf_config:
        return
    task = tf_config["task"]
    address = tf_config["cluster"][task["type"]][task["index"]]
    port = address.rpartition(":")[2]
    if address in _served_ports:  # this process already serves it (a second strategy)
        return
    if not port.isdigit():
        raise DeviceConfigError(
            f"TF_CONFIG gives task {task['type']}:{task['index']} the address {address!r}, "
            'which has no port; write "host:port", e.g. "localhost:2222".'
        )
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind(("", int(port)))
    except OSError as error:
        raise DeviceConfigError(
            f"Port {port} of task {task['type']}:{task['index']} ({address}) is already in use "
            f"on this machine ({error.strerror}), so this worker cannot start its TensorFlow "
            "server. Stop the process holding it (e.g. a previous run: `ss -ltnp | grep "
            f"{port}`) or give this task a free port in TF_CONFIG."
        ) from None
    finally:
        probe.close()


def _default_devices() -> list[str]:
    gpus = tf.config.list_logical_devices("GPU")
    return [d.name for d in gpus] or [tf.config.list_logical_devices("CPU")[0].name]


def _check_devices(devices: list[str]) -> list[str]:
    if not devices:
        raise DeviceConfigError("devices=[] names no device; pass e.g. ['/gpu:0', '/gpu:1'].")
    available = {_canonical(d.name): d.name for d in tf.config.list_logical_devices()}
    missing = [d for d in devices if _canonical(d) not in available]
    if missing:
        raise DeviceConfigError(
            f"Device(s) {missing} do not exist. Logical devices here: "
            f"{sorted(available.values())}. "
            "Use tfaccel.devices.configure(virtual_cpus=N / virtual_gpus=N) to split a device."
        )
    return [available[_canonical(d)] for d in devices]


def _canonical(name: str) -> str:
    spec = tf.DeviceSpec.from_string(name)
    return f"{(spec.device_type or '').upper()}:{spec.device_index or 0}"


def _cross_device_ops(names: list[str]) -> tf.distribute.CrossDeviceOps | None:
    gpus = [n for n in names if "GPU" in n.upper()]
    if len(gpus) < 2:
        return tf.distribute.ReductionToOneDevice()
    if sys.platform.startswith("linux"):
        return tf.distribute.NcclAllReduce()
    return tf.distribute.HierarchicalCopyAllReduce()
