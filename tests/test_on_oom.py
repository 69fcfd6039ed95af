"""on_oom="accumulate": a batch that runs out of memory is retried as micro-batches.

The out-of-memory is real: a layer allocates terabytes on the host (numpy raises
MemoryError, which TensorFlow raises as `ResourceExhaustedError`) whenever a replica's
batch exceeds a threshold — as `tests/test_tuning.py` does for the batch-size search.
"""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf
from oom_layer import OOMAbove

import tfaccel
from tfaccel.train.state.checkpoint import RunShape
from tfaccel.train.step.out_of_memory import split_until_fits

RNG = np.random.default_rng(0)
X = RNG.random((96, 6)).astype("float32")
Y = (X.sum(axis=1) > 3).astype("int32")


def build(threshold):
    keras.utils.set_random_seed(0)
    l2 = keras.regularizers.L2(0.01)
    return keras.Sequential(
        [
            keras.Input((6,)),
            OOMAbove(threshold),
            keras.layers.Dense(16, activation="relu", kernel_regularizer=l2),
            keras.layers.Dense(2, kernel_regularizer=l2),
        ]
    )


def train(strategy, threshold, tmp_path=None, on_oom="accumulate", batch=32):
    trainer = tfaccel.Trainer(
        lambda: build(threshold),
        optimizer=lambda: keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        strategy=strategy,
        steps_per_loop=2,
        on_oom=on_oom,
    )
    history = trainer.fit(
        tf.data.Dataset.from_tensor_slices((X, Y)).batch(batch, drop_remainder=True),
        epochs=2,
        verbose=0,
        checkpoint_dir=None if tmp_path is None else str(tmp_path),
    )
    return trainer, history.history


@pytest.mark.parametrize("replicas", [1, 2])
def test_split_batches_train_to_the_weights_of_the_unsplit_run(replicas, mirrored, caplog):
    strategy = mirrored if replicas == 2 else tf.distribute.get_strategy()
    reference, expected = train(strategy, threshold=10**9)
    with caplog.at_level(logging.WARNING, logger="tfaccel"):
        split, history = train(strategy, threshold=5)  # a replica's batch of 32 / replicas
    k = 8 // replicas  # 32 / 8 = 4 examples per replica per micro-batch (<= 5)
    assert split.runner.micro_batches == k
    for got, want in zip(split.model.get_weights(), reference.model.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(history["loss"], expected["loss"], rtol=1e-5)
    assert history["accuracy"] == expected["accuracy"]
    assert int(split.step.numpy()) == 6  # nothing skipped or repeated
    notes = [r.message for r in caplog.records if "out of memory" in r.message]
    assert notes == [f"out of memory at batch 32: {k} micro-batches of {32 // k} from step 0"]
    assert split.settings["on_oom"].startswith(f"accumulate: out of memory at batch 32: {k}")


def test_the_split_is_kept_in_the_checkpoints_run_shape(tmp_path):
    trainer, _ = train(tf.distribute.get_strategy(), threshold=10, tmp_path=tmp_path)
    assert trainer.runner.micro_batches == 4
    saved = RunShape.saved(tf.train.latest_checkpoint(str(tmp_path)))
    assert saved["micro_batches"] == 4


def test_without_on_oom_the_error_is_raised():
    with pytest.raises(tf.errors.ResourceExhaustedError):
        train(tf.distribute.get_strategy(), threshold=5, on_oom="raise")


def test_a_batch_that_fits_nowhere_is_named():
    with pytest.raises(RuntimeError, match="runs out of memory even as micro-batches of one"):
        train(tf.distribute.get_strategy(), threshold=0)


def test_bad_on_oom_value():
    with pytest.raises(ValueError, match="on_oom must be one of.*'accumulate' retries"):
        train(tf.distribute.get_strategy(), threshold=10, on_oom="split")


def test_split_until_fits_doubles_and_gives_up_below_one_example_per_replica():
    tried = []

    def attempt(k):
        tried.append(k)
        if 64 // k > 10:
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating")

    assert split_until_fits(attempt, 64) == 8 and tried == [2, 4, 8]
    assert split_until_fits(lambda k: False, 8, replicas=2) is None  # 2, 4: then < 1 each
    with pytest.raises(ValueError):  # any other error is not "smaller"
        split_until_fits(lambda k: int("x"), 8)
