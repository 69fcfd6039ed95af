"""LoopStats: every metric's result and the stop vote from one all-reduce."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfaccel.train.step.loop_stats import LoopStats


@pytest.mark.parametrize("distributed", [False, True], ids=["default", "mirrored"])
def test_results_equal_the_metrics_own(distributed, mirrored):
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
    results, values_by_id, vote = stats.read(1)
    assert results["loss"] == pytest.approx(float(mean.result()), rel=1e-6)
    assert results["loss"] == pytest.approx(float(values.mean()), rel=1e-5)
    assert results["accuracy"] == pytest.approx(float(accuracy.result()), rel=1e-6)
    assert float(values_by_id[id(mean.count)]) == 8.0
    assert vote == 1  # one worker voted, however many replicas it has
    assert stats.read(0)[2] == 0
