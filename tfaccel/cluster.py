"""Where a multi-worker cluster comes from: `TF_CONFIG` or a Slurm job step.

Kubernetes (Kubeflow TFJob), Vertex AI, Ray Train and `tfaccel launch` describe the
cluster in `TF_CONFIG`; Slurm describes it in `SLURM_*` variables, whose node list
`scontrol show hostnames` expands; only a job step (`SLURM_STEP_ID`, set by srun) is a
cluster, never a bare allocation. `detect` reads both (TF_CONFIG wins) and
`tfaccel.devices.strategy("auto")` builds a `MultiWorkerMirroredStrategy` from the result.
This module owns `TF_CONFIG`'s validation (`read_tf_config`) and `DeviceConfigError`;
`devices` imports them from here (never the other way round).

Example:
    >>> info = tfaccel.cluster.detect()          # doctest: +SKIP
    >>> info.source, info.task_index, info.workers
    ('Slurm', 1, 4)
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import warnings
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from tfaccel.errors import ClusterMismatchWarning, DeviceConfigError, SlurmAllocationWarning

__all__ = [
    "ClusterInfo",
    "ClusterMismatchWarning",
    "DeviceConfigError",
    "SlurmAllocationWarning",
    "detect",
    "read_slurm",
    "read_tf_config",
]

SOURCES = ("TF_CONFIG", "Slurm", "none")
"""Where a cluster can come from, in the order `detect` looks: `TF_CONFIG`, a Slurm step, none."""
PORT_BASE_VARIABLE = "TFACCEL_SLURM_PORT_BASE"
"""The environment variable that sets the first port of a Slurm job's workers."""
DEFAULT_PORT_BASE = 8888  # SlurmClusterResolver's default
"""The first port of a Slurm job's workers without `TFACCEL_SLURM_PORT_BASE` (+ the task's slot)."""
_WORKER_TYPES = ("chief", "worker")


def read_tf_config(environ: Mapping[str, str] | None = None) -> dict | None:
    """Parses and validates `TF_CONFIG`; returns None when it is unset or empty.

    Raises:
        DeviceConfigError: not JSON, no `task`, a cluster that is not a mapping of
            task type to a list of "host:port", or a task not in the cluster.
    """
    raw = (os.environ if environ is None else environ).get("TF_CONFIG", "")
    if not raw.strip():
        return None
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as error:
        raise DeviceConfigError(f"TF_CONFIG is not valid JSON ({error}): {raw[:200]!r}") from None
    if not isinstance(config, dict) or not isinstance(config.get("task"), dict):
        raise DeviceConfigError(
            'TF_CONFIG has no "task" entry; expected e.g. {"cluster": {"worker": '
            '["host0:port", "host1:port"]}, "task": {"type": "worker", "index": 0}}.'
        )
    cluster = config.get("cluster") or {}
    if not isinstance(cluster, dict):
        raise DeviceConfigError(
            f'TF_CONFIG "cluster" must be a mapping from task type to addresses, got a '
            f"{type(cluster).__name__}: {cluster!r}. Write e.g. "
            '{"cluster": {"worker": ["host0:port", "host1:port"]}, ...}.'
        )
    for kind, addresses in cluster.items():
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise DeviceConfigError(
                f'TF_CONFIG cluster["{kind}"] must be a list of "host:port" strings, got '
                f'{addresses!r}. Write e.g. "{kind}": ["host0:2222", "host1:2222"] '
                "(a list even for one address)."
            )
    task_type, index = config["task"].get("type"), config["task"].get("index")
    members = cluster.get(task_type)
    if not isinstance(members, list) or not members:
        raise DeviceConfigError(
            f"TF_CONFIG task type {task_type!r} is not in its cluster "
            f"(cluster has {sorted(cluster)}): this task is not one of the workers."
        )
    if not isinstance(index, int) or not 0 <= index < len(members):
        raise DeviceConfigError(
            f"TF_CONFIG task index {index!r} is out of range: cluster[{task_type!r}] "
            f"lists {len(members)} address(es) (indices 0..{len(members) - 1})."
        )
    return config


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """The cluster this process belongs to.

    Attributes:
        source: "TF_CONFIG", "Slurm" or "none".
        task_type: this task's type ("worker" / "chief"), None without a cluster.
        task_index: this task's index within its type, None without a cluster.
        workers: the number of worker tasks (chief included); 1 without a cluster.
        addresses: every worker's host:port, chief first.
    """

    source: str
    task_type: str | None = None
    task_index: int | None = None
    workers: int = 1
    addresses: tuple[str, ...] = ()
    resolver: tf.distribute.cluster_resolver.ClusterResolver | None = dataclasses.field(
        default=None, repr=False, compare=False
    )

    def as_dict(self) -> dict:
        """The report form (without the resolver)."""
        return {
            "source": self.source,
            "task_type": self.task_type,
            "task_index": self.task_index,
            "workers": self.workers,
            "addresses": list(self.addresses),
        }


class _SlurmResolver(tf.distribute.cluster_resolver.SlurmClusterResolver):
    """`SlurmClusterResolver` from already-parsed Slurm values, on CPU or GPU nodes.

    TensorFlow's resolver reads its rank from `os.environ` and needs at least one GPU
    per task to lay out ports; this one takes the parsed rank and reports the GPUs
    this task really sees (Slurm's `--gpus-per-task` sets CUDA_VISIBLE_DEVICES).
    """

    def __init__(self, *, rank: int, ntasks: int, tasks_per_node: dict, port_base: int):
        self._parsed_rank = rank
        self._visible_gpus = len(tf.config.list_physical_devices("GPU"))
        slots = max(tasks_per_node.values())
        super().__init__(
            jobs={"worker": ntasks},
            port_base=port_base,
            gpus_per_node=slots,  # one placeholder slot per task; no GPU is assigned
            gpus_per_task=1,
            tasks_per_node=tasks_per_node,
            auto_set_gpu=False,
        )

    def _resolve_own_rank(self) -> int:
        return self._parsed_rank

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: Any = None
    ) -> dict[str, int]:
        del task_type, task_id, config_proto
        return {"GPU": self._visible_gpus} if self._visible_gpus else {}


def _int_variable(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise DeviceConfigError(
            f"{name}={raw!r} is not an integer. Slurm sets it to a number; unset it or fix "
            "the job script that overrides it."
        ) from None


def _slurm_tasks(env: Mapping[str, str]) -> int | None:
    for name in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
        value = _int_variable(env, name)
        if value is not None:
            return value
    return None


def expand_tasks_per_node(text: str) -> list[int]:
    """Expands Slurm's tasks-per-node syntax: `"2(x3),1"` → `[2, 2, 2, 1]`.

    Raises:
        DeviceConfigError: text in another format.
    """
    counts = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise DeviceConfigError(
                f"Cannot read the Slurm tasks-per-node value {text!r}: expected counts such "
                "as '2(x3),1' (2 tasks on each of 3 nodes, then 1)."
            )
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def expand_nodelist(nodelist: str) -> list[str]:
    """Expands a Slurm node list with `scontrol show hostnames` (one host per line).

    Raises:
        DeviceConfigError: scontrol is missing, fails, or prints no host; the message
            shows the command and its output.
    """
    command = ["scontrol", "show", "hostnames", nodelist]
    shown = " ".join(command)
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise DeviceConfigError(
            f"This is a Slurm job step, but `{shown}` cannot run: scontrol is not on PATH "
            f"(PATH={os.environ.get('PATH', '')!r}). Run the job with srun on a node with the "
            "Slurm client tools, or set TF_CONFIG instead."
        ) from None
    except subprocess.TimeoutExpired:
        raise DeviceConfigError(f"`{shown}` did not answer within 60 s.") from None
    hosts = result.stdout.split()
    if result.returncode != 0 or not hosts:
        output = (result.stdout + result.stderr).strip() or "(no output)"
        raise DeviceConfigError(
            f"Cannot expand the Slurm node list {nodelist!r}: `{shown}` exited with status "
            f"{result.returncode} and printed: {output[:500]}. Check SLURM_STEP_NODELIST / "
            "SLURM_JOB_NODELIST (set by srun/sbatch), or set TF_CONFIG instead."
        )
    return hosts


def read_slurm(environ: Mapping[str, str] | None = None) -> dict | None:
    """Reads a multi-task Slurm job step; None outside Slurm, with a single task, or in an
    allocation without a job step (`SLURM_STEP_ID` unset: a shell of `salloc`, a batch
    script; with a `SlurmAllocationWarning`).

    Returns:
        `{"rank", "ntasks", "hosts", "tasks_per_node", "port_base"}`.

    Raises:
        DeviceConfigError: inconsistent Slurm variables, or a node list scontrol cannot
            expand.
    """
    env = os.environ if environ is None else environ
    if not env.get("SLURM_JOB_ID"):
        return None
    ntasks = _slurm_tasks(env)
    if ntasks is None or ntasks <= 1:
        return None
    if not (env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")):
        warnings.warn(
            f"This process runs inside a Slurm allocation (SLURM_JOB_ID={env['SLURM_JOB_ID']}, "
            f"{ntasks} tasks) but not in a job step (no SLURM_STEP_ID: not started by srun), "
            "so it runs alone, not as a worker of a cluster. Start the tasks with srun to "
            "train on the whole allocation.",
            SlurmAllocationWarning,
            stacklevel=3,
        )
        return None
    rank = _int_variable(env, "SLURM_PROCID")
    if rank is None or not 0 <= rank < ntasks:
        raise DeviceConfigError(
            f"Inconsistent Slurm variables: SLURM_PROCID={env.get('SLURM_PROCID')!r} but the "
            f"step has {ntasks} tasks (SLURM_STEP_NUM_TASKS / SLURM_NTASKS), so the rank must "
            f"be 0..{ntasks - 1}. Start each task with srun, which sets both consistently."
        )
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise DeviceConfigError(
            "This is a Slurm job step with several tasks, but neither SLURM_STEP_NODELIST nor "
            "SLURM_JOB_NODELIST is set, so the workers' hosts are unknown. Start the tasks "
            "with srun."
        )
    hosts = expand_nodelist(nodelist)
    per_node_text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if per_node_text:
        per_node = expand_tasks_per_node(per_node_text)
    elif ntasks % len(hosts) == 0:
        per_node = [ntasks // len(hosts)] * len(hosts)
    else:
        per_node = []
    if len(per_node) != len(hosts) or sum(per_node) != ntasks:
        raise DeviceConfigError(
            f"Inconsistent Slurm variables: {ntasks} tasks, hosts {hosts} (from {nodelist!r}) "
            f"and tasks per node {per_node_text!r} do not add up. Each host needs a task count "
            "and the counts must sum to the number of tasks; start the tasks with srun."
        )
    port_base = _int_variable(env, PORT_BASE_VARIABLE) or DEFAULT_PORT_BASE
    return {
        "rank": rank,
        "ntasks": ntasks,
        "hosts": hosts,
        "tasks_per_node": dict(zip(hosts, per_node, strict=True)),
        "port_base": port_base,
    }


def slurm_resolver(slurm: dict) -> tf.distribute.cluster_resolver.SlurmClusterResolver:
    """A `SlurmClusterResolver` for the job step `read_slurm` returned."""
    return _SlurmResolver(
        rank=slurm["rank"],
        ntasks=slurm["ntasks"],
        tasks_per_node=slurm["tasks_per_node"],
        port_base=slurm["port_base"],
    )


def _tf_config_workers(config: dict | None) -> list[str]:
    cluster = (config or {}).get("cluster", {})
    return [address for t in _WORKER_TYPES for address in cluster.get(t, [])]


def detect(environ: Mapping[str, str] | None = None) -> ClusterInfo:
    """Finds this process's cluster: a multi-worker TF_CONFIG, else a Slurm step, else none.

    When both describe a cluster with different worker counts, TF_CONFIG wins and a
    `ClusterMismatchWarning` names both.

    Raises:
        DeviceConfigError: a malformed TF_CONFIG, inconsistent Slurm variables, or a
            node list that scontrol cannot expand.
    """
    env = os.environ if environ is None else environ
    config = read_tf_config(env)
    addresses = _tf_config_workers(config)
    if len(addresses) > 1:
        ntasks = _slurm_tasks(env) if env.get("SLURM_JOB_ID") else None
        if ntasks is not None and ntasks > 1 and ntasks != len(addresses):
            warnings.warn(
                f"TF_CONFIG describes {len(addresses)} workers but the Slurm job step has "
                f"{ntasks} tasks (SLURM_STEP_NUM_TASKS / SLURM_NTASKS); using TF_CONFIG. "
                "Unset TF_CONFIG to use the Slurm allocation, or make the two agree.",
                ClusterMismatchWarning,
                stacklevel=2,
            )
        assert config is not None  # its cluster named the workers
        task = config["task"]
        return ClusterInfo(
            source="TF_CONFIG",
            task_type=task["type"],
            task_index=task["index"],
            workers=len(addresses),
            addresses=tuple(addresses),
            resolver=tf.distribute.cluster_resolver.TFConfigClusterResolver(),
        )
    slurm = read_slurm(env)
    if slurm is not None:
        resolver = slurm_resolver(slurm)
        spec = resolver.cluster_spec().as_dict()
        return ClusterInfo(
            source="Slurm",
            task_type=resolver.task_type,
            task_index=resolver.task_id,
            workers=slurm["ntasks"],
            addresses=tuple(spec["worker"]),
            resolver=resolver,
        )
    return ClusterInfo(source="none")


def obeyed(info: ClusterInfo) -> str:
    """One line naming the cluster joined and the environment variables that said so."""
    if info.source == "TF_CONFIG":
        variables = "TF_CONFIG"
    else:
        variables = (
            "SLURM_JOB_ID, SLURM_STEP_ID, SLURM_PROCID, SLURM_STEP_NUM_TASKS / SLURM_NTASKS, "
            "SLURM_STEP_NODELIST"
        )
    return (
        f"tfaccel: joining a {info.workers}-worker cluster as {info.task_type} "
        f"{info.task_index} ({', '.join(info.addresses)}) from {variables}; unset "
        f"{'TF_CONFIG' if info.source == 'TF_CONFIG' else 'them (or run outside srun)'} "
        "to run alone."
    )


def source_of(strategy: tf.distribute.Strategy) -> str:
    """Where `strategy`'s cluster came from: "TF_CONFIG", "Slurm" or "none"."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if isinstance(resolver, tf.distribute.cluster_resolver.SlurmClusterResolver):
        return "Slurm"
    if resolver is not None and resolver.cluster_spec().as_dict():
        return "TF_CONFIG"
    return "none"
