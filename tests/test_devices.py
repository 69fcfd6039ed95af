import json
import sys
import textwrap

import pytest
import tensorflow as tf

from tfaccel import DeviceConfigError, devices


def run_fresh(jobs, code: str) -> str:
    """Runs `code` in a new Python process (TensorFlow not yet initialised), forked from
    one that imported TensorFlow and ran no op (conftest's jobs)."""
    result = jobs.run([sys.executable, "-c", textwrap.dedent(code)], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_list_gpus_on_cpu_machine_is_empty():
    assert devices.list_gpus() == []


def test_memory_growth_with_cap_is_rejected():
    with pytest.raises(ValueError, match="exclude each other"):
        devices.configure(memory_growth=True, memory_limit_mb=1024)


@pytest.mark.parametrize("name", ["memory_limit_mb", "virtual_cpus", "virtual_gpus"])
def test_non_positive_sizes_are_rejected(name):
    with pytest.raises(ValueError, match=name):
        devices.configure(**{name: 0})


def test_visible_index_that_does_not_exist():
    with pytest.raises(DeviceConfigError, match=r"GPU index\(es\) \[3\].*0 GPU"):
        devices.configure(visible=[3])


def test_configure_twice_with_same_settings_is_a_noop():
    tf.constant(1.0)  # TensorFlow is initialised now
    first = devices.configure(virtual_cpus=2)
    assert devices.configure(virtual_cpus=2) == first
    assert len(tf.config.list_logical_devices("CPU")) == 2


def test_configure_with_different_settings_after_init_says_why():
    tf.constant(1.0)
    with pytest.raises(DeviceConfigError, match="before any TensorFlow op runs") as info:
        devices.configure(virtual_cpus=3)
    assert "virtual_cpus" in str(info.value)


def test_configure_in_fresh_process_splits_cpu(jobs):
    out = run_fresh(
        jobs,
        """
        import tensorflow as tf
        from tfaccel import devices
        devices.configure(virtual_cpus=3)
        devices.configure(virtual_cpus=3)
        print(len(tf.config.list_logical_devices("CPU")))
        """,
    )
    assert out == "3"


def test_describe_reports_versions_devices_and_reasons():
    report = devices.describe()
    assert report["tensorflow"] == tf.__version__
    assert {"name": "/device:CPU:1", "type": "CPU"} in report["logical_devices"]
    assert report["gpus"] == []
    assert report["no_gpu_reasons"], "a machine without GPU must say why"
    json.dumps(report, default=str)


def test_describe_names_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    reasons = devices.describe()["no_gpu_reasons"]
    assert any("CUDA_VISIBLE_DEVICES" in r for r in reasons)


@pytest.mark.parametrize(
    "raw, match",
    [
        ("{not json", "not valid JSON"),
        ('{"cluster": {"worker": ["a:1"]}}', 'no "task"'),
        (
            '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 2}}',
            "index 2 is out of range",
        ),
        (
            '{"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}',
            "not one of the workers",
        ),
    ],
)
def test_bad_tf_config(monkeypatch, raw, match):
    monkeypatch.setenv("TF_CONFIG", raw)
    with pytest.raises(DeviceConfigError, match=match):
        devices.strategy("auto")


def test_valid_tf_config_is_parsed(monkeypatch):
    config = {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    assert devices.read_tf_config() == config


def test_unknown_strategy_kind():
    with pytest.raises(ValueError, match="Unknown strategy kind 'tpu'"):
        devices.strategy("tpu")


def test_mirrored_on_missing_devices():
    with pytest.raises(DeviceConfigError, match=r"\['/gpu:7'\] do not exist"):
        devices.strategy("mirrored", devices=["/cpu:0", "/gpu:7"])


def test_auto_strategy_without_gpus_is_default(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert devices.strategy("auto") is tf.distribute.get_strategy()


def test_auto_with_two_devices_is_mirrored(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    strategy = devices.strategy("auto", devices=["/cpu:0", "/cpu:1"])
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert strategy.num_replicas_in_sync == 2
    assert isinstance(strategy.extended._cross_device_ops, tf.distribute.ReductionToOneDevice)


def test_mirrored_reduces_across_replicas(mirrored):
    result = mirrored.run(lambda: tf.distribute.get_replica_context().replica_id_in_sync_group)
    total = mirrored.reduce("SUM", result, axis=None)
    assert int(total) == 1


def test_one_device_strategy():
    strategy = devices.strategy("one_device", devices=["/cpu:1"])
    assert isinstance(strategy, tf.distribute.OneDeviceStrategy)
    assert strategy.extended.worker_devices[0].endswith("CPU:1")
