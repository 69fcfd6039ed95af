"""A resumed run draws what the uninterrupted run drew: the model's random states (Keras'
`SeedGenerator`: Dropout) are in the Trainer's checkpoints."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_fault_tolerance import StopAt, X, Y

import tfaccel
from tfaccel.train.state import random_states


def trainer(strategy):
    def build():
        keras.utils.set_random_seed(0)
        return keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(16),
                keras.layers.Dropout(0.5),
                keras.layers.Dense(2),
            ]
        )

    return tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=strategy,
        steps_per_loop=1,
    )


def pipeline(strategy):
    source = tfaccel.data.from_arrays(X, Y)
    return tfaccel.data.pipeline(source, batch_size=8, training=True, seed=3, strategy=strategy)


def interrupted_then_resumed(strategy, directory):
    first = trainer(strategy)
    first.fit(pipeline(strategy), epochs=2, verbose=0, checkpoint_dir=directory,
              callbacks=[StopAt(11)])  # fmt: skip
    resumed = trainer(strategy)
    resumed.fit(pipeline(strategy), epochs=2, verbose=0, checkpoint_dir=directory)
    return resumed


@pytest.mark.parametrize("distributed", [False, True], ids=["one", "mirrored"])
def test_dropout_resumed_mid_epoch_equals_the_uninterrupted_run(tmp_path, mirrored, distributed):
    strategy = mirrored if distributed else tf.distribute.get_strategy()
    reference = trainer(strategy)
    reference.fit(pipeline(strategy), epochs=2, verbose=0)
    resumed = interrupted_then_resumed(strategy, tmp_path)
    assert int(resumed.step.numpy()) == 16
    for got, want in zip(resumed.model.get_weights(), reference.model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_checkpoint_without_random_states_resumes_and_says_the_draws_differ(
    tmp_path, monkeypatch
):
    strategy = tf.distribute.get_strategy()
    first = trainer(strategy)
    with monkeypatch.context() as patched:  # as an earlier tfaccel saved it
        patched.setattr(random_states, "of", lambda model: [])
        first.fit(pipeline(strategy), epochs=2, verbose=0, checkpoint_dir=tmp_path,
                  callbacks=[StopAt(11)])  # fmt: skip
    resumed = trainer(strategy)
    with pytest.warns(UserWarning, match=r"no random state for .*seed_generator_state"):
        resumed.fit(pipeline(strategy), epochs=2, verbose=0, checkpoint_dir=tmp_path)
    assert int(resumed.step.numpy()) == 16


def test_a_model_without_random_layers_saves_no_random_states():
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    assert random_states.of(plain) == [] and random_states.of(None) == []
    dropout = keras.Sequential([keras.Input((4,)), keras.layers.Dropout(0.1)])
    assert [v.name for v in random_states.of(dropout)] == ["seed_generator_state"]
