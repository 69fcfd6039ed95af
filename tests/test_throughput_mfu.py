"""Throughput's MFU: FLOPs counted from the graph, the measured peak, the logs (issue 41)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfaccel import callbacks as cb
from tfaccel.callbacks import _mfu

X = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
Y = (X.sum(axis=1) > 0).astype("int32")


def _dense(bias=False):
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, use_bias=bias),
            keras.layers.Dense(4, use_bias=bias),
        ]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_flops_of_a_dense_model_are_counted_from_the_graph():
    forward = 2 * 8 * 16 + 2 * 16 * 4  # 2·in·out per example and layer
    assert _mfu.flops_per_example(_dense()) == 3 * forward


def test_mfu_is_logged_each_epoch_and_summarised():
    throughput = cb.Throughput(warmup_steps=1, mfu=True, verbose=0)
    history = _dense(bias=True).fit(
        X, Y, batch_size=16, epochs=2, callbacks=[throughput], verbose=0
    )
    values = history.history["mfu"]
    assert len(values) == 2 and all(0 < v <= 1 for v in values)
    assert 0 < throughput.summary["mfu"] <= 1
    assert throughput.summary["peak_flops"] > 0 and throughput.summary["peak_dtype"] == "float32"


def test_given_flops_and_peak_give_the_product():
    throughput = cb.Throughput(warmup_steps=1, verbose=0, flops_per_example=1e3, peak_flops=1e12)
    history = _dense().fit(X, Y, batch_size=16, epochs=1, callbacks=[throughput], verbose=0)
    eps = history.history["examples_per_second"][0]
    assert history.history["mfu"][0] == pytest.approx(1e3 * eps / 1e12)


def test_mfu_is_off_on_a_cpu_by_default():
    throughput = cb.Throughput(warmup_steps=1, verbose=0)
    history = _dense().fit(X, Y, batch_size=16, epochs=1, callbacks=[throughput], verbose=0)
    if not tf.config.list_logical_devices("GPU"):
        assert "mfu" not in history.history


def test_mfu_goes_to_the_default_summary_writer(tmp_path):
    throughput = cb.Throughput(warmup_steps=1, verbose=0, flops_per_example=1e3, peak_flops=1e12)
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        _dense().fit(X, Y, batch_size=16, epochs=1, callbacks=[throughput], verbose=0)
    writer.flush()
    tags = set()
    for path in tmp_path.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            tags.update(v.tag for v in event.summary.value)
    assert "mfu" in tags


def test_uncountable_flops_warn_and_skip_mfu():
    class Free(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    model = Free()
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    throughput = cb.Throughput(warmup_steps=1, verbose=0, mfu=True)
    with pytest.warns(UserWarning, match="flops_per_example"):
        history = model.fit(X, Y, batch_size=16, epochs=1, callbacks=[throughput], verbose=0)
    assert "mfu" not in history.history


@pytest.mark.parametrize("kwargs", [{"mfu": "yes"}, {"peak_flops": 0}, {"flops_per_example": -1.0}])
def test_bad_mfu_arguments_are_refused(kwargs):
    with pytest.raises(ValueError, match="mfu|peak_flops|flops_per_example"):
        cb.Throughput(**kwargs)
