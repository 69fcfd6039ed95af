"""The outer loop's parts alone (`tfaccel.train.loop`): divergence, preemption's vote, the
validation's logs and what the loop says, each without a fit or a TensorFlow step."""

import logging
import math

import pytest
import tensorflow as tf

from tfaccel.errors import TrainingDivergedError
from tfaccel.train.loop.divergence import Divergence
from tfaccel.train.loop.notes import Notes
from tfaccel.train.loop.preemption import Preemption
from tfaccel.train.loop.validation import Validation
from tfaccel.train.step.runner_interface import LoopResult


def loop(loss: float, nonfinite: str | None = None, vote: bool | None = None) -> LoopResult:
    return LoopResult(4, {"loss": loss}, loop_loss=loss, nonfinite=nonfinite, stop_vote=vote)


def test_divergence_counts_consecutive_nonfinite_loops_and_restores_before_raising():
    restored = []
    divergence = Divergence(3, restore=lambda: restored.append(True))
    divergence.check(loop(math.nan), 4)
    divergence.check(loop(1.0), 8)  # a finite loop starts the count again
    assert divergence.healthy
    divergence.check(loop(math.inf), 12)
    divergence.check(loop(math.nan), 16)
    assert not divergence.healthy and not restored  # no save while unhealthy; not yet raised
    with pytest.raises(TrainingDivergedError) as raised:
        divergence.check(loop(math.nan), 20)
    assert raised.value.step == 20 and restored == [True]


def test_a_nonfinite_weight_ends_the_run_at_once_even_without_a_restore():
    divergence = Divergence(3)
    with pytest.raises(TrainingDivergedError, match="dense/kernel"):
        divergence.check(loop(1.0, nonfinite="dense/kernel"), 7)


def test_one_worker_asks_its_own_flag_and_a_cluster_uses_the_vote(monkeypatch):
    with Preemption(tf.distribute.get_strategy(), exit_process=False) as preemption:
        assert not preemption.signalled
        assert not preemption.should_stop(loop(1.0, vote=True))  # one worker: its own flag
        preemption.watcher.signal_received = 15
        assert preemption.signalled and preemption.should_stop(loop(1.0, vote=False))
        monkeypatch.setattr(type(preemption.watcher), "multi_worker", property(lambda s: True))
        assert preemption.should_stop(loop(1.0, vote=True))
        assert not preemption.should_stop(loop(1.0, vote=False))  # the cluster's vote wins


def test_without_validation_data_the_logs_are_empty_and_no_hook_fires():
    class Hooks:
        def __getattr__(self, name):
            raise AssertionError(f"{name} called")

    assert Validation(None).logs(runner=None, callbacks=Hooks()) == {}


def test_notes_print_at_verbose_and_log_otherwise(capsys, caplog):
    loud = Notes(verbose=1)
    loud.loop_size("8 (measured)")
    assert capsys.readouterr().out == "steps_per_loop: 8 (measured)\n"
    assert loud.table == {"steps_per_loop": "8 (measured)"}
    quiet = Notes(verbose=0)
    with caplog.at_level(logging.INFO, logger="tfaccel"):
        quiet.out_of_memory("split into 2 micro-batches")
    assert capsys.readouterr().out == ""
    assert quiet.table == {"on_oom": "accumulate: split into 2 micro-batches"}
    assert any(r.levelno == logging.WARNING for r in caplog.records)  # always a warning
