"""steps_per_loop="auto": the host overhead per call is measured and n chosen from it."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel.choices import loop_size
from tfaccel.choices.loop_size import LoopSizer, choose


def overhead_share(overhead, step, n):
    return overhead / (overhead + n * step)


def test_the_smallest_n_whose_measured_overhead_is_under_the_aim():
    # The aim (0.5 %) leaves a margin under the 2 % promise for the estimate's error.
    assert loop_size.AIM == loop_size.OVERHEAD_TARGET / 4 == 0.005
    n = choose(0.002, 0.0005)
    assert overhead_share(0.002, 0.0005, n) < 0.005 <= overhead_share(0.002, 0.0005, n - 1)
    assert n == 797
    assert choose(0.0, 0.01) == 1  # no overhead: one step per call is as fast


def test_a_call_lasts_at_most_the_callback_interval():
    # 199 × 0.5 / 0.6 would ask for 166 steps: 100 s between batch callbacks.
    n = choose(0.5, 0.6)
    assert n == 2 and 0.5 + n * 0.6 <= loop_size.CALLBACK_INTERVAL_S


def drive(sizer, overhead, step, clip=None):
    """Runs calls of T(n) = overhead + n × step until the sizer has chosen."""
    asked = []
    while sizer.measuring:
        n = sizer.next() if clip is None else min(sizer.next(), clip)
        asked.append(n)
        sizer.record(n, n, overhead + n * step + (1.0 if len(asked) == 1 else 0.0))
    return asked


def test_two_probe_sizes_recover_overhead_and_step_time():
    sizer = LoopSizer("auto")
    asked = drive(sizer, overhead=0.004, step=0.001)
    assert asked == [1, 1] + [20, 1] * 4 + [20]  # warm-up, then 1 and a ~0.1 s probe alternate
    assert sizer.overhead_s == pytest.approx(0.004) and sizer.step_s == pytest.approx(0.001)
    assert sizer.chosen == 797
    text = sizer.describe(steps_per_epoch=1000)
    assert text.startswith(
        "797 (auto: host overhead 4.00 ms per call, step 1.00 ms: 0.50% of a call, "
        "aimed under 0.5% for a 2% promise"
    )
    assert "clipped to the epoch's 50" in sizer.describe(steps_per_epoch=50)


def test_probes_cut_by_the_epoch_still_measure():
    sizer = LoopSizer("auto")
    drive(sizer, overhead=0.004, step=0.001, clip=6)
    assert sizer.chosen == 797


def test_an_overhead_hidden_in_the_jitter_of_long_steps_is_sized_for_the_jitter():
    sizer = LoopSizer("auto")
    jitter = iter([0.0, 0.0, 0.006, 0.0, 0.012, 0.004] * 3)  # one-step calls: 0-12 ms late
    while sizer.measuring:
        n = sizer.next()
        sizer.record(n, n, n * 0.25 + (next(jitter) if n == 1 else 0.0))
    assert sizer.overhead_s == 0.0 and sizer.jitter_s == pytest.approx(0.004)
    assert sizer.chosen == choose(0.004, 0.25) == 4  # 4 ms < 0.5 % of 4 steps of 250 ms
    assert "sized for the timing jitter, 4.00 ms" in sizer.describe()
    sizer = LoopSizer("auto")
    jitter = iter([0.0, 0.0, 0.03, 0.0, 0.05, 0.02] * 3)
    while sizer.measuring:
        n = sizer.next()
        sizer.record(n, n, n * 0.25 + (next(jitter) if n == 1 else 0.0))
    # 199 × 20 / 250 would ask for 16 steps: the callback interval caps a call at 7 × 250 ms.
    assert sizer.chosen == choose(0.02, 0.25) == 7


def test_a_fixed_n_is_kept_and_shown_clipped_to_the_epoch():
    sizer = LoopSizer(8)
    assert not sizer.measuring and sizer.next() == 8
    assert not sizer.record(8, 8, 0.1)
    assert sizer.describe(5) == 5 and sizer.describe(None) == 8


RNG = np.random.default_rng(0)
X = RNG.random((160, 6)).astype("float32")
Y = (X.sum(axis=1) > 3).astype("int32")


def trainer(steps_per_loop):
    keras.utils.set_random_seed(0)
    return tfaccel.Trainer(
        lambda: keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)]
        ),
        optimizer=lambda: keras.optimizers.SGD(0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        strategy=tf.distribute.get_strategy(),
        steps_per_loop=steps_per_loop,
        jit_compile=False,  # "auto" alternates XLA's steps (other rounding) on 120-step epochs
    )


def test_the_numbers_are_identical_whatever_n(tmp_path):
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(4).repeat()
    runs = {}
    for n in (1, 7, "auto"):
        ours = trainer(n)
        history = ours.fit(
            data,
            epochs=3,
            steps_per_epoch=120,
            validation_data=tf.data.Dataset.from_tensor_slices((X, Y)).batch(32),
            checkpoint_dir=str(tmp_path / str(n)),
            checkpoint_every=50,
            verbose=0,
        )
        runs[n] = (ours.model.get_weights(), history.history, ours)
    for n in (7, "auto"):
        for got, want in zip(runs[n][0], runs[1][0], strict=True):
            np.testing.assert_array_equal(got, want)
        assert runs[n][1] == runs[1][1]
    auto = runs["auto"][2]
    assert "auto: host overhead" in auto.settings["steps_per_loop"]
    assert auto._loop_sizer.chosen >= 1


def test_bad_steps_per_loop_names_auto():
    with pytest.raises(ValueError, match="integer >= 1 or 'auto'"):
        trainer("fast")
