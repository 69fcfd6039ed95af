"""jit_compile="auto" chosen online: the first loops alternate the plain and the XLA step,
every step trains the model, `readings.compare` decides and the rest of the run keeps the
winner. Loop times are planted (`online.loop_seconds`): no timing assert.

XLA and the plain step round differently, so an A/B run equals a run with the winner from
the start within 1e-5 (not bit for bit)."""

from __future__ import annotations

import itertools
import signal
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_xla_auto import X, Y, build, seed

import tfaccel
from tfaccel.choices import online, readings

STEPS = 100  # a first epoch of 100 steps: long enough for the A/B (timing.too_short_for_xla)
TOLERANCE = 1e-5  # XLA's rounding differs from the plain step's


def data():
    return tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(256, seed=3).batch(32).repeat()


def trainer(**kwargs):
    """5 steps a loop: a first epoch of 20 loops, enough for the A/B's 14 at most."""
    return tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_loop=5,
        **kwargs,
    )


def plant(monkeypatch, plain, xla):
    """Each loop of a candidate reads the next of its planted seconds a step."""
    planted = {online.PLAIN: itertools.cycle(plain), online.XLA: itertools.cycle(xla)}
    monkeypatch.setattr(online, "loop_seconds", lambda c, s, steps: next(planted[c]) * steps)


SEPARATED = ([10.0], [5.0])  # XLA twice as fast, every loop
OVERLAPPING = ([10.0, 11.0, 9.0], [10.5, 9.0, 10.6])  # no 95 % interval separates them


def fit(t, epochs=1):
    history = t.fit(data(), epochs=epochs, steps_per_epoch=STEPS, verbose=0).history
    return history, t.model.get_weights()


def state():
    return np.random.random(), float(tf.random.get_global_generator().normal([]))


def close(a_weights, b_weights):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(a_weights, b_weights, strict=True))


def test_the_schedule_warms_each_candidate_up_then_interleaves_rounds(monkeypatch):
    plant(monkeypatch, *SEPARATED)
    ab = online.Alternation()
    order = []
    while not ab.decided:
        candidate = ab.next()
        order.append(candidate)
        ab.record(candidate, examples=320.0, seconds=123.0, steps=10)
    p, x = online.PLAIN, online.XLA
    # The plain warm-up and first reading (what XLA's compilation would cost), XLA's
    # warm-up (not read), then rounds in compare's order: p x, x p, p x.
    assert order == [p, p, x, x, x, p, p, x]
    assert ab.readings == {p: [3.2] * 3, x: [6.4] * 3}  # 320 examples / (planted s x 10)
    assert ab.jit_compile is True and ab.loops == 8
    choice = ab.choice()
    assert choice.jit_compile is True and choice.online
    assert choice.figures == pytest.approx({"plain": 3.2, "XLA": 6.4})
    assert choice.reason.startswith("chosen online over the first 8 loop(s)")
    assert "XLA fastest: 2.00x plain step" in choice.reason


def test_overlapping_readings_keep_the_plain_step_saying_no_measurable_difference(monkeypatch):
    plant(monkeypatch, *OVERLAPPING)
    ab = online.Alternation()
    while not ab.decided:
        ab.record(ab.next(), examples=320.0, seconds=1.0, steps=10)
    assert ab.jit_compile is False
    assert len(ab.readings[online.PLAIN]) == online.timing.MAX_ROUNDS  # all rounds read
    assert readings.NO_DIFFERENCE in ab.choice().reason
    assert ab.choice().describe().startswith("False (chosen online over the first 14 loop(s)")


def test_a_dropped_xla_step_keeps_the_plain_step_with_the_reason():
    ab = online.Alternation()
    ab.record(ab.next(), 320.0, 1.0, 10)
    ab.drop("XLA cannot compile the model's step (unsupported op(s): EagerPyFunc)")
    assert ab.decided and ab.jit_compile is False
    assert ab.choice().describe() == (
        "False (chosen online after 1 loop(s): XLA cannot compile the model's step "
        "(unsupported op(s): EagerPyFunc))"
    )


def test_xla_is_not_compiled_when_the_plain_steps_tracing_projects_too_much():
    ab = online.Alternation(epoch_steps=100)
    ab.record(ab.next(), examples=160.0, seconds=0.5, steps=5)  # traced: 0.5 s
    assert ab.next() == online.PLAIN and not ab.decided
    assert ab.record(ab.next(), examples=160.0, seconds=0.005, steps=5)  # 1 ms a step
    assert ab.decided and ab.jit_compile is False and online.XLA not in ab.warmed
    # 0.499 s of tracing > 10 % of 100 steps of 1 ms
    assert ab.choice().describe() == (
        "False (chosen online after 2 loop(s): declined: the plain step's tracing (0.5 s) "
        "projects an XLA compilation over 10% of the first epoch (100 steps of 1 ms); from "
        "4,990 steps an epoch up it is tried)"
    )
    longer = online.Alternation(epoch_steps=5_000)
    longer.record(longer.next(), 160.0, 0.5, 5)
    longer.record(longer.next(), 160.0, 0.005, 5)
    assert not longer.decided and longer.next() == online.XLA


@pytest.mark.parametrize(
    "planted, winner", [(SEPARATED, True), (OVERLAPPING, False)], ids=["xla", "plain"]
)
def test_the_ab_trains_what_the_winner_from_the_start_trains(monkeypatch, planted, winner):
    plant(monkeypatch, *planted)
    seed(4)
    auto = trainer()
    assert auto.jit_choice is None
    auto_history, auto_weights = fit(auto, epochs=2)
    auto_state = state()
    assert auto.runner.alternation.decided and auto.runner.jit_compile is winner
    assert auto.jit_compile is winner and auto.jit_choice.value is winner  # the Trainer's own
    row = auto.settings["jit_compile"]
    assert row.startswith(f"{winner} (chosen online over the first ")
    if winner:
        assert "XLA fastest: 2.00x plain step" in row and "XLA 6.4 examples/s" in row
    else:
        assert readings.NO_DIFFERENCE in row and "kept the simpler plain step" in row
    seed(4)
    forced = trainer(jit_compile=winner)
    forced_history, forced_weights = fit(forced, epochs=2)
    # The same examples in the same order, the same optimizer steps: equal within rounding.
    assert int(auto.optimizer.iterations.numpy()) == int(forced.optimizer.iterations.numpy())
    assert int(auto.runner.position.step) == 2 * STEPS
    np.testing.assert_allclose(auto_history["loss"], forced_history["loss"], atol=TOLERANCE)
    assert close(auto_weights, forced_weights) < TOLERANCE
    assert auto_state == state()  # nothing was probed: the random states moved alike


@pytest.mark.parametrize("given", [True, False])
def test_an_explicit_jit_compile_is_never_overridden(monkeypatch, given):
    plant(monkeypatch, *((SEPARATED[1], SEPARATED[0]) if given else SEPARATED))  # the other wins
    t = trainer(jit_compile=given)
    fit(t)
    assert t.runner.alternation is None and t.runner.jit_compile is given
    assert t.settings["jit_compile"] is given


def test_the_table_says_online_before_the_first_loop(monkeypatch):
    plant(monkeypatch, *SEPARATED)
    seen = {}

    class Row(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen["row"] = t.settings["jit_compile"]

    t = trainer()
    t.fit(data(), epochs=1, steps_per_epoch=STEPS, callbacks=[Row()], verbose=0)
    assert seen["row"].startswith(
        "online (the first loops of training alternate the plain and the XLA step (every "
        "step trains the model): the faster by a 95 % interval is kept, else the plain step)"
    )
    assert t.settings["jit_compile"].startswith("True (chosen online")


def test_two_replicas_alternate_and_keep_the_plain_step_xla_cannot_place(monkeypatch, mirrored):
    # XLA cannot reach a variable on the other logical CPU: its first loop (held batches)
    # fails, those batches train the plain step, and the run equals jit_compile=False's.
    plant(monkeypatch, *SEPARATED)
    seed(6)
    auto = trainer(strategy=mirrored)
    auto_history, auto_weights = fit(auto)
    assert auto.runner.jit_compile is False and auto.runner.alternation.dropped
    row = auto.settings["jit_compile"]
    assert row.startswith("False (chosen online after 3 loop(s): XLA cannot compile the model")
    seed(6)
    forced = trainer(strategy=mirrored, jit_compile=False)
    forced_history, forced_weights = fit(forced)
    assert int(auto.optimizer.iterations.numpy()) == int(forced.optimizer.iterations.numpy())
    np.testing.assert_allclose(auto_history["loss"], forced_history["loss"], atol=TOLERANCE)
    assert close(auto_weights, forced_weights) < TOLERANCE


JOB = """
import os, signal, sys
sys.path.insert(0, sys.argv[4])
import itertools
import numpy as np, keras, tensorflow as tf
import tfaccel
from tfaccel.choices import online

planted = {online.PLAIN: itertools.cycle([10.0]), online.XLA: itertools.cycle([5.0])}
online.loop_seconds = lambda c, s, steps: next(planted[c]) * steps  # XLA wins, every run
rng = np.random.default_rng(0)
x = rng.random((256, 12), dtype=np.float32)
y = (x.sum(axis=1) > 6).astype(np.int32)
data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256, seed=3).batch(32).repeat()
directory, kill_at, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def build():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(2)])


class Kill(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        print("started at step", trainer.runner.position.step, flush=True)

    def on_train_batch_end(self, batch, logs=None):
        if kill_at and trainer.runner.position.step >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


trainer = tfaccel.Trainer(
    build, optimizer=keras.optimizers.SGD(0.1),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_loop=5,
)
trainer.fit(data, epochs=1, steps_per_epoch=100, callbacks=[Kill()],
            checkpoint_dir=directory or None, checkpoint_every=5, verbose=0)
print("row:", trainer.settings["jit_compile"], flush=True)
np.save(out, np.concatenate([w.ravel() for w in trainer.model.get_weights()]))
"""


def test_kill_9_mid_ab_resumes_to_the_uninterrupted_weights(tmp_path, jobs):
    """Killed at step 25 (loop 5 of the A/B's 8), resumed: the checkpoint holds no A/B
    state, so the A/B starts again at the resumed step (XLA wins again: planted) and the
    weights equal the uninterrupted run's within XLA's rounding."""
    script = tmp_path / "job.py"
    script.write_text(JOB)
    here = str(__import__("pathlib").Path(__file__).parent)

    def job(directory, kill_at, out):
        args = [sys.executable, str(script), directory, str(kill_at), str(tmp_path / out), here]
        return jobs.run(args, timeout=300)

    whole = job("", 0, "whole.npy")
    assert whole.returncode == 0, whole.stderr[-2000:]
    assert "row: True (chosen online over the first 8 loop(s)" in whole.stdout
    killed = job(str(tmp_path / "ckpt"), 25, "never.npy")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = job(str(tmp_path / "ckpt"), 0, "resumed.npy")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    started = int(resumed.stdout.split("started at step")[1].split()[0])
    assert 0 < started <= 25  # mid-A/B
    assert "row: True (chosen online over the first 8 loop(s)" in resumed.stdout
    want, got = np.load(tmp_path / "whole.npy"), np.load(tmp_path / "resumed.npy")
    assert float(np.max(np.abs(want - got))) < TOLERANCE


def test_which_rule_applies_follows_the_first_epoch_and_the_loop_size():
    fits = online.timing.online_fits
    assert fits(100, 5) and fits(100, None) and fits(140, 10)  # 14 loops of 10
    assert not fits(99, 1)  # too short even for a probe: not measured
    assert not fits(100, 50)  # 2 loops: the probe before step 1 (the earlier rule)
    assert not fits(None, 1)  # unknown length
