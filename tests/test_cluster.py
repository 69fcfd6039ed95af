"""Cluster detection: TF_CONFIG, Slurm (fake variables, a fake scontrol on PATH), none."""

import json
import os
import pathlib
import socket
import stat
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tfaccel import cli, cluster, devices
from tfaccel.devices import DeviceConfigError

JOB = pathlib.Path(__file__).parent / "scripts" / "slurm_job.py"
ROOT = pathlib.Path(__file__).parents[1]


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """Puts a fake `scontrol` on PATH; returns a function setting what it prints."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "scontrol"

    def fake(hosts=(), status=0, error=""):
        lines = "".join(f"echo {h}\n" for h in hosts)
        script.write_text(f"#!/bin/sh\n{lines}echo '{error}' >&2\nexit {status}\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        return script

    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return fake


def slurm_env(**overrides):
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "4",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_PROCID": "3",
        "SLURM_STEP_NODELIST": "node[07-08]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    }
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def test_slurm_step_gives_the_cluster_spec_and_task(scontrol):
    scontrol(["node07", "node08"])
    info = cluster.detect(slurm_env())
    assert (info.source, info.task_type, info.task_index, info.workers) == (
        "Slurm",
        "worker",
        3,
        4,
    )
    assert info.addresses == ("node07:8888", "node07:8889", "node08:8888", "node08:8889")
    assert isinstance(info.resolver, tf.distribute.cluster_resolver.SlurmClusterResolver)
    spec = info.resolver.cluster_spec().as_dict()
    assert spec == {"worker": list(info.addresses)}
    assert info.resolver.num_accelerators() == {}  # this CPU task has no GPU


def test_single_task_or_no_slurm_is_no_cluster(scontrol):
    scontrol(["node07"])
    assert cluster.detect(slurm_env(SLURM_NTASKS="1", SLURM_STEP_NUM_TASKS="1")).source == "none"
    assert cluster.detect({}).source == "none"


def test_tf_config_cluster():
    config = {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}
    info = cluster.detect({"TF_CONFIG": json.dumps(config)})
    assert (info.source, info.task_index, info.workers, info.addresses) == (
        "TF_CONFIG",
        1,
        2,
        ("a:1", "b:2"),
    )


def test_procid_out_of_range(scontrol):
    scontrol(["node07", "node08"])
    with pytest.raises(DeviceConfigError, match=r"SLURM_PROCID='4'.*4 tasks.*0\.\.3"):
        cluster.detect(slurm_env(SLURM_PROCID="4"))


def test_node_list_scontrol_cannot_expand(scontrol):
    scontrol(status=1, error="scontrol: error: Invalid hostlist: node[07-")
    with pytest.raises(DeviceConfigError) as caught:
        cluster.detect(slurm_env(SLURM_STEP_NODELIST="node[07-"))
    message = str(caught.value)
    assert "scontrol show hostnames node[07-" in message
    assert "status 1" in message and "Invalid hostlist" in message


def test_tasks_per_node_that_do_not_add_up(scontrol):
    scontrol(["node07", "node08"])
    with pytest.raises(DeviceConfigError, match="do not add up"):
        cluster.detect(slurm_env(SLURM_STEP_TASKS_PER_NODE="3(x2)"))


def test_tf_config_wins_over_a_disagreeing_slurm_step(scontrol):
    scontrol(["node07", "node08"])
    config = {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}
    env = slurm_env(TF_CONFIG=json.dumps(config))
    with pytest.warns(cluster.ClusterMismatchWarning, match="TF_CONFIG describes 2.*4 tasks"):
        info = cluster.detect(env)
    assert info.source == "TF_CONFIG" and info.workers == 2


def test_multi_worker_without_a_cluster_names_both_sources(monkeypatch):
    for name in (
        "TF_CONFIG",
        "SLURM_JOB_ID",
        "SLURM_STEP_ID",
        "SLURM_NTASKS",
        "SLURM_STEP_NUM_TASKS",
    ):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(DeviceConfigError, match="TF_CONFIG is unset.*Slurm"):
        devices.strategy("multi_worker")


def test_report_shows_the_slurm_cluster(scontrol, monkeypatch, capsys):
    scontrol(["node07", "node08"])
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for name, value in slurm_env(SLURM_PROCID="1").items():
        monkeypatch.setenv(name, value)
    report = devices.describe()
    assert report["cluster"]["source"] == "Slurm"
    assert report["cluster"]["task_index"] == 1 and report["cluster"]["workers"] == 4
    assert cli.main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "Cluster" in out and "Slurm: worker 1 of 4 workers (node07:8888" in out


def _two_free_ports() -> int:
    """A base port p with p and p + 1 free (SlurmClusterResolver's layout on one host)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", base))
                b.bind(("127.0.0.1", base + 1))
            return base
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


def test_two_task_slurm_job_trains_identical_weights(tmp_path, scontrol, worker_zygote):
    """Two processes given the variables srun sets for `srun -N1 -n2` on this host."""
    scontrol(["localhost"])
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TF_CONFIG"))}
    env.update(
        slurm_env(
            SLURM_NTASKS="2",
            SLURM_STEP_NUM_TASKS="2",
            SLURM_STEP_NODELIST="localhost",
            SLURM_STEP_TASKS_PER_NODE="2",
        )
    )
    env["TFACCEL_SLURM_PORT_BASE"] = str(_two_free_ports())
    env["PYTHONPATH"] = str(ROOT)
    tasks = []
    for rank in range(2):
        env_rank = {**env, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)}
        command = [sys.executable, str(JOB), "--ckpt", str(ckpt), "--out", str(out)]
        command = worker_zygote.command(command)  # forked from one that imported TF (conftest)
        tasks.append(
            subprocess.Popen(
                command, env=env_rank, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
        )
    outputs = []
    for task in tasks:
        try:
            outputs.append(task.communicate(timeout=240)[0].decode(errors="replace"))
        finally:
            if task.poll() is None:
                task.kill()
    assert all(t.returncode == 0 for t in tasks), "\n".join(o[-2000:] for o in outputs)
    first, second = (dict(np.load(f"{out}.task{i}.npz")) for i in (0, 1))
    assert bool(first["multi_worker"])
    assert int(first["replicas"]) == 2 and str(first["source"]) == "Slurm"
    for key in first:
        np.testing.assert_array_equal(first[key], second[key])
    assert first["seen"] == 2 * 96  # the two tasks shared each epoch's examples
    assert (ckpt / "checkpoint").exists()


def test_report_says_why_the_slurm_variables_are_invalid(scontrol, monkeypatch, capsys):
    scontrol(["node07", "node08"])
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for name, value in slurm_env(SLURM_PROCID="9").items():
        monkeypatch.setenv(name, value)
    assert devices.describe()["cluster"]["source"] == "invalid"
    assert cli.main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "Cluster" in out and "invalid: Inconsistent Slurm variables" in out
