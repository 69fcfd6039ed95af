"""The outer loop alone: `FitLoop` driven by a tiny fake runner, no TensorFlow step at all.

The fake implements `RunnerInterface` with plain Python (it pulls integers from a
`tf.data` iterator and counts them); its counters are `tf.Variable`s only so that a
real checkpoint can hold them.
"""

import contextlib

import keras
import pytest
import tensorflow as tf

from tfaccel.choices.loop_size import LoopSizer
from tfaccel.data.assembly.feed import Feed
from tfaccel.train.loop.faults import PreemptionWatcher
from tfaccel.train.loop.fit_loop import FitLoop, Schedule
from tfaccel.train.state.policies import Checkpointing, FaultPolicy
from tfaccel.train.step.runner_interface import LoopResult, Position


class FakeModel:
    """What callbacks and FitLoop touch of a model: `stop_training` and `history`."""

    stop_training = False


class FakeRunner:
    """Trains by reading integers: the 'loss' is the mean of the integers of the epoch."""

    def __init__(self, votes_at=()):
        self.strategy = tf.distribute.get_strategy()
        self.model = FakeModel()
        self.batches_per_step = 1
        self.step = tf.Variable(0, dtype=tf.int64)
        self.epoch = tf.Variable(0, dtype=tf.int64)
        self.epoch_step = tf.Variable(0, dtype=tf.int64)
        self.total = tf.Variable(0.0)  # the "weights": a running sum of everything seen
        self.seen, self.calls, self.epoch_values = [], [], []
        self.votes_at = set(votes_at)  # global steps after which another worker votes stop

    def build(self, sample):
        pass

    def train(self, iterator, num_steps, *, stop_flag=False):
        self.calls.append(num_steps)
        ran = 0
        for _ in range(num_steps):
            try:
                value = int(next(iterator).numpy())
            except StopIteration:
                break
            self.seen.append(value)
            self.epoch_values.append(value)
            self.total.assign_add(value)
            self.step.assign_add(1)
            ran += 1
        if not ran:
            return LoopResult(0, {})
        vote = stop_flag or int(self.step.numpy()) in self.votes_at
        return LoopResult(ran, self.epoch_logs(), 1.0, float(ran), 0.001, vote)

    def evaluate(self, iterator, num_steps):
        return {"loss": float(sum(int(x.numpy()) for x in iterator))}

    def epoch_logs(self):
        values = self.epoch_values or [0]
        return {"loss": sum(values) / len(values)}

    def reset_metrics(self):
        self.epoch_values = []

    @property
    def position(self):
        return Position(*(int(v.numpy()) for v in (self.step, self.epoch, self.epoch_step)))

    def set_position(self, *, epoch=None, epoch_step=None):
        if epoch is not None:
            self.epoch.assign(epoch)
        if epoch_step is not None:
            self.epoch_step.assign(epoch_step)

    def checkpoint_items(self):
        return {
            "step": self.step,
            "epoch": self.epoch,
            "epoch_step": self.epoch_step,
            "total": self.total,
        }

    def run_shape(self):
        return {"optimizer": "Fake", "accumulate_steps": 1, "hyperparameters": {}}

    @contextlib.contextmanager
    def restoring(self):
        yield

    def restart_optimizer(self):
        pass


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.events = []

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(("epoch_end", epoch, logs["loss"]))

    def on_train_batch_end(self, batch, logs=None):
        self.events.append(("loop", batch, logs["steps"]))


DATA = tf.data.Dataset.range(10)  # one epoch = 10 "steps" of one integer each


def fit(runner, *, steps_per_loop=4, epochs=2, **kwargs):
    recorder = Recorder()
    options = dict(
        steps_per_epoch=None,
        validation_data=None,
        validation_steps=None,
        checkpoint_dir=None,
        checkpoint_every="epoch",
        keep=3,
        resume="auto",
        divergence_loops=3,
        restore_on_divergence=False,
        exit_on_preemption=False,
    )
    options.update(kwargs)
    validation = options["validation_data"]
    schedule = Schedule(
        epochs,
        steps_per_epoch=options["steps_per_epoch"],
        validation=None if validation is None else Feed(validation, runner.strategy),
        validation_steps=options["validation_steps"],
        sizer=LoopSizer(steps_per_loop),
        verbose=0,
    )
    checkpointing = Checkpointing(
        options["checkpoint_dir"], options["checkpoint_every"], options["keep"], options["resume"]
    )
    faults = FaultPolicy(
        options["divergence_loops"],
        options["restore_on_divergence"],
        options["exit_on_preemption"],
    )
    train = Feed(DATA, runner.strategy)
    loop = FitLoop(runner, train, schedule, [recorder], checkpointing, faults)
    try:
        loop.run()
    finally:
        loop.close()
    return loop, recorder


def test_loops_are_clipped_to_the_epoch_and_callbacks_see_each_loop():
    runner = FakeRunner()
    loop, recorder = fit(runner, steps_per_loop=4, epochs=2)
    assert runner.calls == [4, 4, 2, 4, 4, 2]  # no loop crosses an epoch's end
    assert runner.seen == list(range(10)) * 2
    assert runner.position == Position(20, 2, 0)
    loops = [e for e in recorder.events if e[0] == "loop"]
    assert loops[:3] == [("loop", 3, 4), ("loop", 7, 4), ("loop", 9, 2)]
    assert ("epoch_end", 1, 4.5) in recorder.events  # each epoch's metrics start from zero


def test_saves_land_on_checkpoint_boundaries_and_the_epoch_end_save_belongs_to_the_epoch(
    tmp_path,
):
    runner = FakeRunner()
    fit(runner, steps_per_loop=7, epochs=1, checkpoint_dir=str(tmp_path), checkpoint_every=5)
    assert runner.calls == [5, 5]  # cut at step 5, a save boundary (7 would cross it)
    reader = tf.train.load_checkpoint(str(tmp_path / "ckpt-10"))
    epoch = reader.get_tensor("epoch/.ATTRIBUTES/VARIABLE_VALUE")
    epoch_step = reader.get_tensor("epoch_step/.ATTRIBUTES/VARIABLE_VALUE")
    assert (int(epoch), int(epoch_step)) == (1, 0)  # written after the epoch was finished
    assert (
        int(
            tf.train.load_checkpoint(str(tmp_path / "ckpt-5")).get_tensor(
                "epoch_step/.ATTRIBUTES/VARIABLE_VALUE"
            )
        )
        == 5
    )


def test_resume_continues_at_the_saved_position_with_the_next_element(tmp_path, monkeypatch):
    monkeypatch.setattr(PreemptionWatcher, "multi_worker", property(lambda self: True))
    first = FakeRunner(votes_at={6})  # another worker votes to stop after step 6
    loop, _ = fit(first, steps_per_loop=3, epochs=2, checkpoint_dir=str(tmp_path))
    assert loop.preempted and first.position == Position(6, 0, 6)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-6")

    monkeypatch.undo()
    again = FakeRunner()
    loop, recorder = fit(again, steps_per_loop=3, epochs=2, checkpoint_dir=str(tmp_path))
    assert not loop.preempted
    assert again.seen == list(range(6, 10)) + list(range(10))  # nothing skipped or repeated
    assert float(again.total.numpy()) == 2 * sum(range(10))  # restored, then added to
    assert again.position == Position(20, 2, 0)
    assert recorder.events[0] == ("loop", 8, 3)  # batch indices continue within the epoch


def test_the_stop_vote_of_another_worker_stops_every_worker_at_the_same_step(tmp_path, monkeypatch):
    monkeypatch.setattr(PreemptionWatcher, "multi_worker", property(lambda self: True))
    runner = FakeRunner(votes_at={4})
    with pytest.raises(SystemExit) as stopped:
        fit(runner, steps_per_loop=2, checkpoint_dir=str(tmp_path), exit_on_preemption=True)
    assert stopped.value.code == 0
    assert runner.position.step == 4 and runner.calls == [2, 2]
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-4")


def test_a_vote_on_the_last_loop_of_an_epoch_stops_after_the_epoch_is_finished(monkeypatch):
    monkeypatch.setattr(PreemptionWatcher, "multi_worker", property(lambda self: True))
    runner = FakeRunner(votes_at={10})
    loop, recorder = fit(runner, steps_per_loop=5, epochs=3)
    assert loop.preempted
    assert runner.position == Position(10, 1, 0)  # epoch 0 complete, not an empty epoch 1
    assert [e for e in recorder.events if e[0] == "epoch_end"] == [("epoch_end", 0, 4.5)]


def test_without_a_vote_a_single_worker_trains_to_the_end(monkeypatch):
    runner = FakeRunner(votes_at={4})  # one worker: a vote it did not cast is ignored
    loop, _ = fit(runner, steps_per_loop=2, epochs=1)
    assert not loop.preempted and runner.position.step == 10
