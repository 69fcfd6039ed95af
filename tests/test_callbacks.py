"""Tests for tfaccel.callbacks: model.fit on CPU, TensorBoard files, a custom loop."""

import csv
import glob
import os
import time
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from sleep_layer import Sleep
from tensorboard.backend.event_processing import event_accumulator

from tfaccel import callbacks as cb


def _model(lr=0.1, steps_per_execution=1, strategy=None):
    def build():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(
            optimizer=keras.optimizers.SGD(lr),
            loss="mse",
            steps_per_execution=steps_per_execution,
        )
        return model

    if strategy is None:
        return build()
    with strategy.scope():
        return build()


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


class _Spy(keras.callbacks.Callback):
    """Records batch calls, batch logs and the learning rate seen at each batch begin."""

    def __init__(self):
        super().__init__()
        self.ends, self.batch_logs, self.lrs = [], [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(self.model.optimizer.learning_rate.numpy()))

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(batch)
        self.batch_logs.append(dict(logs or {}))


# ---------------------------------------------------------------- model.fit


def test_fit_logs_and_history_contain_the_new_keys():
    x, y = _data(40)
    model = _model()
    callbacks = [
        cb.Throughput(warmup_steps=1, window=4, verbose=0),
        cb.DeviceMemory(),
        cb.HostGap(threshold=0.99),
        cb.LinearScalingWarmup(0.01, base_batch_size=4, batch_size=8, warmup_epochs=1),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DeviceMemory: "no GPU" on this machine
        history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=callbacks)
    h = history.history
    for key in (
        "examples_per_second",
        "steps_per_second",
        "mem_host_rss_mb",
        "mem_host_rss_peak_mb",
        "host_gap_fraction",
        "learning_rate",
        "loss",
    ):
        assert len(h[key]) == 2, key
    assert all(v > 0 for v in h["examples_per_second"] + h["steps_per_second"])
    # Window of 4 steps at batch 8: examples/s is 8 x steps/s.
    np.testing.assert_allclose(h["examples_per_second"][1], 8 * h["steps_per_second"][1], rtol=1e-6)
    assert all(v > 10 for v in h["mem_host_rss_mb"])  # a TF process holds > 10 MiB
    assert all(p >= c for p, c in zip(h["mem_host_rss_peak_mb"], h["mem_host_rss_mb"], strict=True))
    assert all(0.0 <= v < 1.0 for v in h["host_gap_fraction"])
    # 5 steps per epoch, warm-up 5 steps from 0.01 to 0.02: step 4 runs at 0.018.
    np.testing.assert_allclose(h["learning_rate"], [0.018, 0.02], rtol=1e-6)
    assert not any(k.startswith("mem_gpu") for k in h)


@pytest.mark.parametrize("batch_size, expected_examples", [(None, 50), (8, 56)])
def test_throughput_counts_steps_and_examples_with_steps_per_execution(
    batch_size, expected_examples
):
    x, y = _data(50)  # 7 batches of 8 (the last holds 2); executions of 3 steps: 3, 3, 1
    model = _model(steps_per_execution=3)
    throughput = cb.Throughput(batch_size=batch_size, warmup_steps=0, verbose=0)
    spy = _Spy()
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[throughput, spy])
    assert spy.ends == [2, 5, 8] * 2  # Keras reports the last step index of each execution
    summary = throughput.summary
    assert summary["total_steps"] == 14
    assert summary["total_examples"] == 2 * expected_examples
    assert summary["batch_size_source"] == ("loss tracker" if batch_size is None else "argument")
    assert summary["measured_steps"] == 14


def test_throughput_counts_global_examples_under_mirrored_strategy(mirrored):
    x, y = _data(40)
    model = _model(strategy=mirrored)
    throughput = cb.Throughput(warmup_steps=0, verbose=0)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[throughput])
    assert throughput.summary["total_steps"] == 3
    assert throughput.summary["total_examples"] == 40


def test_throughput_agrees_with_wall_time_around_fit(capsys):
    # Steps of a known 20 ms: what the callback leaves out (warm-up, epoch ends, fit's own
    # start) stays small beside them on a busy host too.
    x, y = _data(512)
    model = keras.Sequential([keras.Input((4,)), Sleep(0.02), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(x[:64], y[:64], batch_size=16, epochs=1, verbose=0)  # trace once
    throughput = cb.Throughput(warmup_steps=2, window=20)
    start = time.perf_counter()
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[throughput])
    wall = time.perf_counter() - start
    summary = throughput.summary
    assert summary["total_examples"] == 2 * 512
    assert 0 < summary["measured_seconds"] <= wall
    wall_rate = summary["total_examples"] / wall
    ratio = summary["examples_per_second"]["overall"] / wall_rate
    assert 0.5 < ratio < 10, ratio  # the callback leaves out warm-up and epoch ends only
    stats = summary["examples_per_second"]
    assert stats["p10"] <= stats["median"] <= stats["p90"]
    assert "Throughput:" in capsys.readouterr().out


def test_tensorboard_and_csv_logger_receive_the_scalars(tmp_path):
    x, y = _data(32)
    model = _model()
    csv_path = tmp_path / "log.csv"
    # Logging callbacks listed first on purpose: `ordered` must move ours ahead.
    callbacks = cb.ordered(
        [
            keras.callbacks.TensorBoard(str(tmp_path / "tb")),
            keras.callbacks.CSVLogger(str(csv_path)),
            cb.Throughput(warmup_steps=1, verbose=0),
        ]
    )
    assert isinstance(callbacks[0], cb.Throughput)
    history = model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=callbacks)

    events = event_accumulator.EventAccumulator(
        str(tmp_path / "tb" / "train"), size_guidance={event_accumulator.TENSORS: 0}
    )
    events.Reload()
    for tag, key in (
        ("epoch_examples_per_second", "examples_per_second"),
        ("epoch_steps_per_second", "steps_per_second"),
    ):
        assert tag in events.Tags()["tensors"]
        written = [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]
        assert [s for s, _ in written] == [0, 1]
        np.testing.assert_allclose([v for _, v in written], history.history[key], rtol=1e-5)

    with open(csv_path) as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2
    np.testing.assert_allclose(
        [float(r["examples_per_second"]) for r in rows], history.history["examples_per_second"]
    )


def test_ordered_moves_only_tfaccel_callbacks_first_and_keeps_order():
    tb, early = keras.callbacks.TerminateOnNaN(), keras.callbacks.EarlyStopping()
    gap, mem = cb.HostGap(), cb.DeviceMemory()
    assert cb.ordered([tb, gap, early, mem]) == [gap, mem, tb, early]
    assert cb.ordered(None) == []


def test_profile_steps_writes_one_trace_for_the_window(tmp_path):
    x, y = _data(32)
    model = _model()
    profile = cb.ProfileSteps(tmp_path, start_step=2, stop_step=4)
    spy = _Spy()
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[profile, spy])
    runs = glob.glob(str(tmp_path / "plugins" / "profile" / "*"))
    assert len(runs) == 1
    assert profile.trace_dir == runs[0]
    assert glob.glob(os.path.join(runs[0], "*.xplane.pb"))
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[profile])  # once only
    assert len(glob.glob(str(tmp_path / "plugins" / "profile" / "*"))) == 1


def _expected_lr(step, base=0.1, target=0.4, warmup=8):
    return base + (target - base) * step / warmup if step < warmup else target


@pytest.mark.parametrize(
    "steps_per_execution, initial_epoch", [(1, 0), (2, 0), (1, 1)], ids=["spe1", "spe2", "resume"]
)
def test_linear_scaling_warmup_matches_hand_computed_rates(steps_per_execution, initial_epoch):
    x, y = _data(16)  # batch 4: 4 steps per epoch; warm-up 2 epochs = 8 steps
    model = _model(lr=0.5, steps_per_execution=steps_per_execution)
    warmup = cb.LinearScalingWarmup(0.1, base_batch_size=4, batch_size=16, warmup_epochs=2)
    spy = _Spy()
    model.fit(
        x, y, batch_size=4, epochs=3, initial_epoch=initial_epoch, verbose=0,
        callbacks=[warmup, spy],
    )  # fmt: skip
    first = 4 * initial_epoch
    steps = list(range(first, 12, steps_per_execution))
    # Hand-computed: 0.1 + 0.3 * s / 8 before step 8, then 0.4.
    np.testing.assert_allclose(spy.lrs, [_expected_lr(s) for s in steps], rtol=1e-6)
    if steps_per_execution == 1 and initial_epoch == 0:
        np.testing.assert_allclose(spy.lrs[:5], [0.1, 0.1375, 0.175, 0.2125, 0.25], rtol=1e-6)
    assert warmup.target_lr == pytest.approx(0.4)
    assert float(model.optimizer.learning_rate) == pytest.approx(0.4)


def test_linear_scaling_warmup_leaves_the_rate_alone_after_warmup():
    class Halve(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                self.model.optimizer.learning_rate = 0.2

    x, y = _data(8)
    model = _model()
    warmup = cb.LinearScalingWarmup(0.1, base_batch_size=4, batch_size=16, warmup_epochs=1)
    spy = _Spy()
    model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[warmup, Halve(), spy])
    np.testing.assert_allclose(spy.lrs, [0.1, 0.25, 0.4, 0.4, 0.2, 0.2], rtol=1e-6)


def test_linear_scaling_warmup_rejects_a_schedule_optimizer():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.9)
    model.compile(optimizer=keras.optimizers.SGD(schedule), loss="mse")
    x, y = _data(8)
    warmup = cb.LinearScalingWarmup(0.1, base_batch_size=4, batch_size=8)
    with pytest.raises(TypeError, match="LearningRateSchedule.*float learning_rate"):
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[warmup])


def test_linear_scaling_warmup_needs_steps_per_epoch():
    x, y = _data(8)
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y)).batch(4).repeat(2).filter(lambda a, b: True)
    )
    warmup = cb.LinearScalingWarmup(0.1, base_batch_size=4, batch_size=8)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        _model().fit(dataset, epochs=1, verbose=0, callbacks=[warmup])
    uncompiled = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    warmup.set_model(uncompiled)
    with pytest.raises(RuntimeError, match="compile"):
        warmup.on_train_begin()


def test_device_memory_on_cpu_reports_host_only_and_warns_once(monkeypatch):
    monkeypatch.setattr(cb.DeviceMemory, "_warned_no_gpu", False)
    x, y = _data(16)
    model = _model()
    memory = cb.DeviceMemory(every=2)
    spy = _Spy()
    with pytest.warns(UserWarning, match="no GPU") as caught:
        model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[memory, spy])
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[memory, spy])
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[cb.DeviceMemory()])
    no_gpu = [w for w in caught if "no GPU" in str(w.message)]
    assert len(no_gpu) == 1  # once per process, whatever the number of instances
    assert no_gpu[0].filename == __file__  # points at the user's fit call
    sampled = [i for i, logs in enumerate(spy.batch_logs) if "mem_host_rss_mb" in logs]
    assert sampled == [1, 3, 5, 7, 9, 11]  # every 2nd call of each epoch
    assert not any(k.startswith("mem_gpu") for logs in spy.batch_logs for k in logs)


def test_device_memory_reads_and_resets_each_gpu(monkeypatch):
    """GPU path with TensorFlow's memory API faked (no GPU on the test machine)."""

    class Device:
        def __init__(self, name):
            self.name = name

    resets, current = [], {"GPU:0": 3 * 2**20, "GPU:1": 5 * 2**20}
    real_list = tf.config.list_logical_devices
    monkeypatch.setattr(
        tf.config,
        "list_logical_devices",
        lambda kind=None: (
            [Device("/device:GPU:0"), Device("/device:GPU:1")] if kind == "GPU" else real_list(kind)
        ),
    )
    monkeypatch.setattr(tf.config.experimental, "reset_memory_stats", resets.append)
    monkeypatch.setattr(
        tf.config.experimental,
        "get_memory_info",
        lambda d: {"current": current[d], "peak": 2 * current[d]},
    )
    memory = cb.DeviceMemory(devices=[1])
    memory.on_train_begin()
    for epoch in range(2):
        memory.on_epoch_begin(epoch)
        memory.on_train_batch_begin(0)
        memory.on_train_batch_end(0, {})
        logs = {}
        memory.on_epoch_end(epoch, logs)
    assert resets == ["GPU:1", "GPU:1"]
    assert logs["mem_gpu1_mb"] == 5.0 and logs["mem_gpu1_peak_mb"] == 10.0
    assert "mem_gpu0_mb" not in logs
    with pytest.raises(ValueError, match=r"\['GPU:4'\]"):
        cb.DeviceMemory(devices=["gpu:4"]).on_train_begin()


def test_host_gap_present_in_fit_logs():
    x, y = _data(16)
    gap = cb.HostGap()
    history = _model().fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[gap])
    assert history.history["host_gap_fraction"] == gap.fractions
    assert all(0 <= f < 1 for f in gap.fractions)


# ---------------------------------------------------------------- a custom loop


def _custom_loop(model, callbacks, batches, steps_per_call=1, epochs=1, delay=0.0, step_delay=0.0):
    """A minimal trainer: host-side input, several steps per call, the standard hooks;
    `delay` s of input on the host before each batch, `step_delay` s more in each step."""
    for callback in callbacks:
        callback.set_model(model)
        callback.set_params({"epochs": epochs, "steps": len(batches)})
    for callback in callbacks:
        callback.on_train_begin()
    for epoch in range(epochs):
        for callback in callbacks:
            callback.on_epoch_begin(epoch)
        for first in range(0, len(batches), steps_per_call):
            chunk = []
            for x, y in batches[first : first + steps_per_call]:
                time.sleep(delay)  # "slow input", fetched on the host between calls
                chunk.append((x, y))
            for callback in callbacks:
                callback.on_train_batch_begin(first)
            for x, y in chunk:
                loss = model.train_on_batch(x, y)
                time.sleep(step_delay)  # a step of a known length
            logs = {"loss": loss, "steps": len(chunk)}
            for callback in callbacks:
                callback.on_train_batch_end(first, logs)
        epoch_logs = {"loss": loss}
        for callback in callbacks:
            callback.on_epoch_end(epoch, epoch_logs)
    for callback in callbacks:
        callback.on_train_end()
    return epoch_logs


def test_callbacks_work_in_a_custom_loop_with_several_steps_per_call(tmp_path):
    x, y = _data(40)
    batches = [(x[i : i + 4], y[i : i + 4]) for i in range(0, 40, 4)]  # 10 steps
    model = _model()
    throughput = cb.Throughput(batch_size=4, warmup_steps=0, verbose=0)
    warmup = cb.LinearScalingWarmup(0.1, base_batch_size=4, batch_size=16, warmup_epochs=0.8)
    profile = cb.ProfileSteps(tmp_path, start_step=3, stop_step=5)
    spy = _Spy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logs = _custom_loop(
            model,
            [throughput, warmup, profile, cb.DeviceMemory(), cb.HostGap(), spy],
            batches,
            steps_per_call=3,  # calls of 3, 3, 3, 1 steps
            epochs=2,
        )
    assert throughput.summary["total_steps"] == 20
    assert throughput.summary["total_examples"] == 80
    assert {
        "examples_per_second",
        "steps_per_second",
        "mem_host_rss_mb",
        "host_gap_fraction",
    } <= set(logs)
    # Warm-up of 8 steps; the rate is set at the first step of each call.
    starts = [0, 3, 6, 9, 10, 13, 16, 19]
    np.testing.assert_allclose(spy.lrs, [_expected_lr(s) for s in starts], rtol=1e-6)
    assert logs["learning_rate"] == pytest.approx(0.4)
    assert profile.trace_dir and glob.glob(os.path.join(profile.trace_dir, "*.xplane.pb"))


def test_host_gap_tells_slow_host_input_from_fast():
    x, y = _data(24)
    batches = [(x[i : i + 4], y[i : i + 4]) for i in range(0, 24, 4)]
    model = _model()
    _custom_loop(model, [], batches[:1])  # trace train_on_batch once
    fast, slow = cb.HostGap(threshold=0.5), cb.HostGap(threshold=0.5)
    # Known lengths, whatever the host: 100 ms steps with no input between them, then
    # 100 ms of input before each ~1 ms step.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _custom_loop(model, [fast], batches, step_delay=0.1)
    assert not [w for w in caught if "HostGap" in str(w.message)]
    with pytest.warns(UserWarning, match="HostGap: .* between steps"):
        _custom_loop(model, [slow], batches, delay=0.1)
    assert fast.fractions[0] < 0.5 < slow.fractions[0]


@pytest.mark.parametrize(
    "params, logs, examples, source",
    [
        ({"batch_size": 6}, {}, 6 * 5, "params"),
        ({}, {"size": 3}, 3 * 5, "logs['size']"),
        ({}, {}, None, None),
    ],
)
def test_throughput_infers_the_batch_size_outside_fit(params, logs, examples, source):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])  # no loss tracker
    throughput = cb.Throughput(warmup_steps=0, verbose=0)
    throughput.set_model(model)
    throughput.set_params(params)
    throughput.on_train_begin()
    throughput.on_epoch_begin(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in (1, 4):  # two calls: 2 then 3 steps, told by the batch index
            throughput.on_train_batch_begin(batch)
            throughput.on_train_batch_end(batch, dict(logs))
    epoch_logs = {}
    throughput.on_epoch_end(0, epoch_logs)
    throughput.on_train_end()
    assert throughput.summary["total_steps"] == 5
    assert throughput.summary["total_examples"] == examples
    assert throughput.summary["batch_size_source"] == source
    assert ("examples_per_second" in epoch_logs) == (examples is not None)
    assert epoch_logs["steps_per_second"] > 0
    assert sum("batch_size=" in str(w.message) for w in caught) == (examples is None)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"batch_size": -8}, {"batch_size": 2.5}])
def test_throughput_rejects_bad_batch_size(kwargs):
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        cb.Throughput(**kwargs)


@pytest.mark.parametrize("window", [0, -1])
def test_throughput_rejects_bad_window(window):
    with pytest.raises(ValueError, match="window must be a positive integer"):
        cb.Throughput(window=window)


def test_throughput_rejects_negative_warmup():
    with pytest.raises(ValueError, match="warmup_steps must be an integer >= 0"):
        cb.Throughput(warmup_steps=-1)


def test_explicit_steps_in_logs_must_be_positive():
    throughput = cb.Throughput(batch_size=4)
    throughput.set_model(_model())
    throughput.on_train_begin()
    throughput.on_train_batch_begin(0)
    with pytest.raises(ValueError, match=r"logs\['steps'\] must be a positive integer"):
        throughput.on_train_batch_end(0, {"steps": 0})


@pytest.mark.parametrize("every", [0, -2])
def test_device_memory_rejects_bad_every(every):
    with pytest.raises(ValueError, match="every must be a positive integer"):
        cb.DeviceMemory(every=every)


@pytest.mark.parametrize("devices", ["GPU:0", ["CPU:0"], [True]])
def test_device_memory_rejects_bad_devices(devices):
    with pytest.raises(ValueError, match="devices|not a GPU"):
        cb.DeviceMemory(devices=devices)


@pytest.mark.parametrize("start, stop", [(5, 5), (5, 3)])
def test_profile_steps_rejects_empty_window(tmp_path, start, stop):
    with pytest.raises(ValueError, match="stop_step .* must be greater than start_step"):
        cb.ProfileSteps(tmp_path, start_step=start, stop_step=stop)


def test_profile_steps_rejects_negative_start_and_empty_logdir(tmp_path):
    with pytest.raises(ValueError, match="start_step must be an integer >= 0"):
        cb.ProfileSteps(tmp_path, start_step=-1, stop_step=3)
    with pytest.raises(ValueError, match="logdir must be a non-empty path"):
        cb.ProfileSteps("", start_step=0, stop_step=3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"base_batch_size": 0}, "base_batch_size must be a positive integer"),
        ({"batch_size": -32}, "batch_size must be a positive integer"),
        ({"base_lr": 0.0}, "base_lr must be a positive number"),
        ({"warmup_epochs": -1}, "warmup_epochs must be a number >= 0"),
        ({"steps_per_epoch": 0}, "steps_per_epoch must be a positive integer"),
    ],
)
def test_linear_scaling_warmup_rejects_bad_numbers(kwargs, message):
    arguments = {"base_lr": 0.1, "base_batch_size": 32, "batch_size": 256, **kwargs}
    with pytest.raises(ValueError, match=message):
        cb.LinearScalingWarmup(**arguments)


@pytest.mark.parametrize("threshold", [0, 1, 1.5, -0.1])
def test_host_gap_rejects_bad_threshold(threshold):
    with pytest.raises(ValueError, match=r"threshold must be in \(0, 1\)"):
        cb.HostGap(threshold=threshold)
