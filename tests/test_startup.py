"""The start-up report of `Trainer.fit`, the label contract read once per data, and the
traces' budget (counted, never timed)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel.data import fingerprint
from tfaccel.train.setup import checked

RNG = np.random.default_rng(0)
X = RNG.normal(size=(80, 6)).astype("float32")
Y = RNG.integers(0, 3, size=80).astype("int32")
PHASES = [
    "arguments and array inputs",
    "feed build",
    "input checks",  # the input is checked before the automatic choices measure on it
    "label contract",
    "precision and XLA choice",
    "variables and step loops",
    "fingerprint",  # with checkpoints only
    "fit loop set-up and settings table",
    "checkpoint restore and input iterator",
    "trace: train loop",
    "first step loop",
]


def trainer(strategy=None):
    def build():
        keras.utils.set_random_seed(1)
        return keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])

    return tfaccel.Trainer(
        build,
        optimizer="sgd",
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        strategy=strategy or tf.distribute.get_strategy(),
    )


def test_the_report_lists_every_phase_and_they_sum_to_the_total(tmp_path, capsys):
    job = trainer()
    history = job.fit(X, Y, epochs=2, validation_split=0.2, verbose=2, checkpoint_dir=tmp_path)
    report = job.startup
    assert history.startup is report
    assert list(report.phases) == PHASES
    assert report.done and report.total > 0
    assert sum(report.phases.values()) == pytest.approx(report.total, rel=0.05)
    assert all(seconds >= 0 for seconds in report.phases.values())
    as_dict = report.to_dict()
    assert set(as_dict) == {"total_s", "phases_s", "traces"}
    assert list(as_dict["phases_s"]) == list(report.phases)
    assert "to the first step loop" in report.summary()
    out = capsys.readouterr().out
    assert "tfaccel.Trainer start-up" in out and "trace: train loop" in out  # verbose=2
    assert "trace: train loop" in str(report) and "total" in str(report)


def test_a_second_fit_on_the_same_data_reads_no_label_contract_or_fingerprint(monkeypatch):
    reads = {"labels": 0, "fingerprint": 0}
    check, of_dataset = checked.check_labels, fingerprint.of_dataset

    def count_labels(*args):
        reads["labels"] += 1
        return check(*args)

    def count_fingerprint(*args):
        reads["fingerprint"] += 1
        return of_dataset(*args)

    monkeypatch.setattr(checked, "check_labels", count_labels)
    monkeypatch.setattr(fingerprint, "of_dataset", count_fingerprint)
    job = trainer()
    job.fit(X, Y, epochs=1, validation_split=0.2, verbose=0)
    assert reads == {"labels": 2, "fingerprint": 0}  # training and validation labels
    job.fit(X, Y, epochs=1, validation_split=0.2, verbose=0)
    assert reads == {"labels": 2, "fingerprint": 0}  # the same arrays: nothing read again
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)
    job.fit(data, epochs=1, verbose=0)
    job.fit(data, epochs=1, verbose=0)
    assert reads["labels"] == 3  # the same dataset object: read once
    job.fit(X, (Y + 1) % 3, epochs=1, verbose=0)
    assert reads["labels"] == 4  # other labels: read again


def test_a_failed_label_check_is_not_remembered():
    job = trainer()
    job.fit(X, Y, epochs=1, verbose=0)
    bad = Y.astype("float32") + 0.5
    for _ in range(2):
        with pytest.raises(ValueError, match="fractions"):
            job.fit(X, bad, epochs=1, verbose=0)


@pytest.mark.parametrize("distributed", [False, True], ids=["default", "mirrored"])
def test_traces_stay_within_the_budget(distributed, mirrored):
    """One trace per loop function (the loop size is a tensor: sizes cost no trace), the
    validation loop traced once, the logs read without a trace on one worker (as many
    traces as `model.fit`'s train and test functions), and a second fit traces nothing."""
    job = trainer(mirrored if distributed else None)
    job.fit(X, Y, epochs=3, validation_split=0.2, verbose=0)  # "auto" tries several sizes
    assert job.startup.traces == {"train loop": 1, "test loop": 1}
    job.fit(X, Y, epochs=2, validation_split=0.2, verbose=0)
    assert job.startup.traces == {}
    assert job.runner.loops.train_loop.experimental_get_tracing_count() == 1
    assert job.runner.loops.test_loop.experimental_get_tracing_count() == 1


def test_accumulating_loops_keep_the_budget():
    """The AutoGraph-converted loop of `accumulate_steps` traces once, too."""
    job = tfaccel.Trainer(
        lambda: keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")]),
        optimizer="sgd",
        loss="sparse_categorical_crossentropy",
        accumulate_steps=2,
    )
    job.fit(X, Y, epochs=2, batch_size=8, verbose=0)
    assert job.startup.traces == {"train loop": 1}
    assert int(job.step.numpy()) == 10  # 10 batches an epoch, 2 a step, 2 epochs


def test_tfaccel_input_functions_are_not_converted_by_autograph(monkeypatch, mirrored):
    """The partial-batch split (several replicas) and the shards' interleave hold no
    tensor-dependent control flow: traced as written, AutoGraph converts none of them
    (its conversion was most of the first fit's input build on two replicas)."""
    from tensorflow.python.autograph.impl import api

    converted = []
    convert = api._convert_actual

    def counting(entity, program_ctx):
        converted.append(getattr(entity, "__module__", "") or "")
        return convert(entity, program_ctx)

    monkeypatch.setattr(api, "_convert_actual", counting)

    def shard(index, count):
        for i in range(int(index), 80, int(count)):
            yield X[i], Y[i]

    spec = (tf.TensorSpec((6,), tf.float32), tf.TensorSpec((), tf.int32))
    source = tfaccel.data.from_generator(shard, spec, shards=2, count=80)
    fn = tfaccel.data.pipeline(source, batch_size=24, training=True, strategy=mirrored)
    dataset = fn(tf.distribute.InputContext(1, 0, 2))
    assert sum(1 for _ in dataset) == 8  # 4 global batches (the last partial), 2 pieces each
    assert not [module for module in converted if module.startswith("tfaccel")]
