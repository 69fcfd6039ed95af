"""The step probe does not time a candidate that cannot win: one whose warmed step is
`timing.SLOWER` times the reference's (a CPU's `mixed_float16` ran ~1,000x float32's) is
read at its warm-up only (`"slow"`, with the reason), its rate its warmed step's."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfaccel.choices import timing, xla
from tfaccel.choices.passes import GradientLoops
from tfaccel.data.assembly.feed import Feed
from tfaccel.train.step.losses import PerExampleLoss

F32, BF16 = ("float32", False), ("mixed_bfloat16", False)
BATCH = 16
OUT_OF_RANGE = "indices[3] = 2000 is not in [0, 2000)"  # a float id 1999 rounded by bfloat16


def probe(monkeypatch, slower: float, fails: bool = False, xla: bool = False) -> tuple[dict, dict]:
    """`time_steps` on float32 and bf16 with a fake clock: float32 10 ms a step, bf16
    `slower` times that; the passes run for real. Returns the result and each policy's
    timed calls after the warm-up."""
    real, calls = GradientLoops.seconds, {F32[0]: 0, BF16[0]: 0}

    def seconds(self, reduce, iterator, steps, n):
        real(self, reduce, iterator, steps, n)
        name = self.model.dtype_policy.name
        if fails and name == BF16[0]:
            raise tf.errors.InvalidArgumentError(None, None, OUT_OF_RANGE)
        if n == 1:  # the warm-up's calls are 2 at once; the timed rounds' one each
            calls[name] += 1
        return [0.01 * (slower if name == BF16[0] else 1.0) * steps] * n

    monkeypatch.setattr(GradientLoops, "seconds", seconds)
    x = np.random.default_rng(0).random((64, 6), dtype=np.float32)
    data = tf.data.Dataset.from_tensor_slices((x, (x.sum(1) > 3).astype("int32"))).batch(BATCH)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    loss = PerExampleLoss(keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    strategy = tf.distribute.get_strategy()
    feed = Feed.of(data, strategy)
    with_xla = fails or xla
    candidates = [F32, BF16, (F32[0], True), (BF16[0], True)] if with_xla else [F32, BF16]
    measured = timing.time_steps(model, loss, strategy, feed, candidates, epoch_steps=200)
    return measured, calls


def test_a_candidate_far_slower_at_its_warm_up_is_not_timed(monkeypatch):
    measured, calls = probe(monkeypatch, slower=100.0)
    assert calls[BF16[0]] == 0 and calls[F32[0]] >= timing.ROUNDS
    assert measured["slow"][BF16] == "its warmed step took 100.0x float32's"
    assert BF16 not in measured["dropped"]  # measured (slow), not unmeasured
    assert measured["rates"][BF16] == pytest.approx(BATCH / 1.0)  # 1 s a step
    assert measured["rates"][F32] == pytest.approx(BATCH / 0.01)
    assert measured["rounds"] == calls[F32[0]]


def test_a_candidate_within_the_bound_is_timed_in_rounds(monkeypatch):
    measured, calls = probe(monkeypatch, slower=2.0)
    assert BF16 not in measured["dropped"] and BF16 not in measured["slow"]
    assert calls[BF16[0]] == calls[F32[0]] >= timing.ROUNDS


def test_a_policy_whose_step_fails_is_dropped_with_the_error(monkeypatch):
    """e.g. float token ids rounded past an embedding's range under a 16-bit policy: the
    probe goes on without it (its XLA step too); it reads 0 examples/s."""
    measured, calls = probe(monkeypatch, slower=1.0, fails=True)
    why = "the step fails under mixed_bfloat16 (indices[3] = 2000 is not in [0, 2000))"
    assert measured["dropped"][BF16] == why
    assert measured["dropped"][(BF16[0], True)] == "the step fails under mixed_bfloat16"
    assert measured["rates"][BF16] == 0.0 and calls[BF16[0]] == 0
    assert (F32[0], True) in measured["rates"] and calls[F32[0]] >= 2 * timing.ROUNDS


def test_a_far_slower_policy_s_xla_step_is_not_timed_either(monkeypatch):
    measured, calls = probe(monkeypatch, slower=100.0, xla=True)
    assert calls[BF16[0]] == 0
    assert measured["slow"][(BF16[0], True)] == "its warmed step took 100.0x float32's"
    assert measured["rates"][(BF16[0], True)] == pytest.approx(BATCH / 1.0)
    assert (F32[0], True) not in measured["slow"]


def test_a_far_slower_xla_is_measured_slower_by_the_doctor_s_speedup(monkeypatch):
    """`xla.speedup` (the doctor's deep=True) reads a slow XLA step as its ratio, < 1,
    not as unmeasured."""
    real = GradientLoops.seconds

    def seconds(self, reduce, iterator, steps, n):
        real(self, reduce, iterator, steps, n)
        return [(1.0 if self._replica_fn is not None else 0.01) * steps] * n

    monkeypatch.setattr(GradientLoops, "seconds", seconds)
    x = np.random.default_rng(0).random((64, 6), dtype=np.float32)
    data = tf.data.Dataset.from_tensor_slices((x, (x.sum(1) > 3).astype("int32"))).batch(BATCH)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
    loss = PerExampleLoss(keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    strategy = tf.distribute.get_strategy()
    gain, _ = xla.speedup(model, loss, strategy, Feed.of(data, strategy), "float32")
    assert gain == pytest.approx(0.01)
