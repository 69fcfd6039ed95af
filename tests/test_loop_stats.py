"""LoopStats: every metric's result and the stop vote from one all-reduce (several
workers), or read eagerly on one worker (no trace before the first step)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfaccel.train.step import loop_stats
from tfaccel.train.step.loop_stats import LoopStats


@pytest.mark.parametrize("packed", [False, True], ids=["eager", "packed"])
@pytest.mark.parametrize("distributed", [False, True], ids=["default", "mirrored"])
def test_results_equal_the_metrics_own(distributed, packed, mirrored):
    strategy = mirrored if distributed else tf.distribute.get_strategy()
    with strategy.scope():
        mean = keras.metrics.Mean(name="loss")
        accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")

    def update(values, labels, predictions):
        mean.update_state(values)
        accuracy.update_state(labels, predictions)

    rng = np.random.default_rng(0)
    values = rng.normal(size=8).astype("float32")
    labels = rng.integers(0, 3, 8).astype("int32")
    predictions = rng.random((8, 3)).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((values, labels, predictions)).batch(8)
    for batch in strategy.experimental_distribute_dataset(ds):
        strategy.run(tf.function(update), args=batch)
    stats = LoopStats(strategy, [mean, accuracy])
    stats.one_worker = not packed  # the packed read is the one several workers make
    results, values_by_id, vote = stats.read(1)
    assert results["loss"] == pytest.approx(float(mean.result()), rel=1e-6)
    assert results["loss"] == pytest.approx(float(values.mean()), rel=1e-5)
    assert results["accuracy"] == pytest.approx(float(accuracy.result()), rel=1e-6)
    assert float(values_by_id[id(mean.count)]) == 8.0
    assert vote == 1  # one worker voted, however many replicas it has
    assert stats.read(0)[2] == 0
    assert stats.traces == ({"loop logs": 1} if packed else {})


@pytest.mark.parametrize("distributed", [False, True], ids=["default", "mirrored"])
def test_one_worker_traces_no_read_in_a_short_job(distributed, mirrored, monkeypatch):
    """One replica never traces the read; several trace it once, after EAGER_LOOPS reads."""
    monkeypatch.setattr(loop_stats, "EAGER_LOOPS", 3)
    strategy = mirrored if distributed else tf.distribute.get_strategy()
    with strategy.scope():
        mean = keras.metrics.Mean(name="loss")
    strategy.run(tf.function(lambda: mean.update_state(2.0)))
    stats = LoopStats(strategy, [mean])
    for _ in range(6):
        results, _, vote = stats.read(0)
        assert results["loss"] == pytest.approx(2.0) and vote == 0
    assert stats.eager_reads == (3 if distributed else 6)
    assert stats.traces == ({"loop logs": 1} if distributed else {})
