"""Elastic resume: the global batches do not depend on how many replicas or input
pipelines (workers) read them, so a run saved on N resumes exactly on M."""

import pathlib
import re
import signal
import sys

import numpy as np
import pytest
import tensorflow as tf
from run_compare import assert_same_run

import tfaccel
from tfaccel.data.assembly.feed import Feed
from tfaccel.data.order import global_order
from tfaccel.errors import CheckpointMismatchError
from tfaccel.train.state import checkpoint

JOB = pathlib.Path(__file__).parent / "scripts" / "train_job.py"
N = 37  # not a multiple of the batch: a partial last batch each epoch


def _rows():
    x = np.arange(N, dtype="float32")[:, None] * np.ones((1, 3), "float32")
    return x, np.arange(N, dtype="int32")


def jitter(x, y, seed):
    return x + tf.random.stateless_normal([3], seed), y


def double(x, y):
    return x * 2.0, y


def _pipeline(mirrored, **kwargs):
    """The seeded, augmented pipeline over the 37 rows, for 2 replicas."""
    source = tfaccel.data.from_arrays(*_rows())
    settings = {"batch_size": 8, "training": True, "seed": 3, "augment": jitter}
    return tfaccel.data.pipeline(source, strategy=mirrored, **{**settings, **kwargs})


def global_plan(mirrored, **kwargs):
    return _pipeline(mirrored, **kwargs).build(tf.distribute.InputContext(2, 0, 2)).plan


def global_batches(pipelines, replicas, mirrored, drop, epochs=2, **kwargs):
    """The training stream as global batches, read by `pipelines` input pipelines."""
    fn = _pipeline(mirrored, preprocess=double, drop_remainder=drop, **kwargs)
    per = [
        list(fn.build(tf.distribute.InputContext(pipelines, w, replicas)).dataset.repeat(epochs))
        for w in range(pipelines)
    ]
    assert len({len(p) for p in per}) == 1, [len(p) for p in per]  # every step on every one
    feeds = replicas // pipelines
    steps = []
    for k in range(len(per[0]) // feeds):
        parts = [b for p in per for b in p[k * feeds : (k + 1) * feeds]]
        steps.append(tuple(np.concatenate([b[i].numpy() for b in parts]) for i in (0, 1)))
    return steps


@pytest.mark.parametrize("drop, budget_mb", [(False, None), (True, None), (False, 0.0003)])
def test_global_batches_are_the_same_on_one_or_two_pipelines(mirrored, drop, budget_mb):
    # budget_mb: a shuffle buffer smaller than the data (sized on the elements one
    # pipeline shuffles, its augment index included), so both permute alike.
    kwargs = {} if budget_mb is None else {"shuffle_budget_mb": budget_mb}
    one = global_batches(1, 2, mirrored, drop, **kwargs)
    two = global_batches(2, 2, mirrored, drop, **kwargs)
    two_by_two = global_batches(2, 4, mirrored, drop, **kwargs)
    if budget_mb:
        buffer = re.search(r"shuffle_buffer=(\d+)", str(global_plan(mirrored, **kwargs)))
        assert 1 < int(buffer.group(1)) < N
    assert len(one) == len(two) == len(two_by_two) == (8 if drop else 10)
    for (x1, y1), (x2, y2), (x4, y4) in zip(one, two, two_by_two, strict=True):
        np.testing.assert_array_equal(y1, y2)
        np.testing.assert_array_equal(y1, y4)
        np.testing.assert_allclose(x1, x2, atol=1e-6)  # the same augmentation seeds
        np.testing.assert_allclose(x1, x4, atol=1e-6)
    labels = np.concatenate([y for _, y in one[: len(one) // 2]])
    assert sorted(labels) == (list(range(N)) if not drop else sorted(labels))  # once an epoch
    assert len(set(labels)) == len(labels)
    assert not np.array_equal(one[0][1], one[len(one) // 2][1])  # reshuffled each epoch


def test_two_pipelines_read_by_index_and_say_so(mirrored):
    fn = tfaccel.data.pipeline(
        tfaccel.data.from_arrays(*_rows()), batch_size=8, training=True, seed=3, strategy=mirrored
    )
    built = fn.build(tf.distribute.InputContext(2, 1, 2))
    assert built.order == global_order.GLOBAL
    text = str(built.plan)
    assert "global index permutation" in text and "positions 4..7" in text
    assert built.steps == 5  # ceil(37 / 8): the last step's slice of pipeline 1 is padding


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        ({"seed": None}, "no seed"),
        ({"cache": "FILE"}, "file cache"),
        ({"shuffle_buffer": None}, "unshuffled"),
        ({"source": "generator"}, "cannot be read by index"),
    ],
)
def test_sources_that_cannot_be_read_by_index_are_sharded_and_say_why(
    mirrored, tmp_path, kwargs, reason
):
    source = tfaccel.data.from_arrays(*_rows())
    if kwargs.pop("source", None):
        source = tf.data.Dataset.from_generator(
            lambda: iter(zip(*_rows(), strict=True)),
            output_signature=(tf.TensorSpec([3], tf.float32), tf.TensorSpec([], tf.int32)),
        ).apply(tf.data.experimental.assert_cardinality(N))
    if kwargs.get("cache") == "FILE":
        kwargs["cache"] = str(tmp_path / "cache")
    fn = tfaccel.data.pipeline(
        source, batch_size=8, training=True, **{"seed": 3, **kwargs}, strategy=mirrored
    )
    built = fn.build(tf.distribute.InputContext(2, 0, 2))
    assert reason in built.order
    assert "global index permutation" not in str(built.plan)


def test_a_batched_dataset_is_sharded_by_tensorflow(mirrored):
    dataset = tf.data.Dataset.from_tensor_slices(_rows()).batch(8)
    assert "TensorFlow shards" in Feed(dataset, mirrored).order


def test_the_settings_table_says_whether_a_resume_may_change_the_worker_count(mirrored):
    import keras

    x, y = _rows()
    trainer = tfaccel.Trainer(
        lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dense(N)]),
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=mirrored,
    )
    train = tfaccel.data.pipeline(
        tfaccel.data.from_arrays(x, y), batch_size=8, training=True, seed=1, strategy=mirrored
    )
    trainer.fit(train, epochs=1, verbose=0)
    assert trainer.settings["input_order"].startswith("global (1 input pipeline(s))")
    trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=1, verbose=0)
    assert trainer.settings["input_order"].startswith("sharded (1 input pipeline(s); TensorFlow")
    assert "but only on 1 worker(s)" in trainer.settings["input_order"]


def _shape(pipelines, order):
    return {"global_batch": 8, "input_pipelines": pipelines, "input_order": order}


def test_a_changed_worker_count_is_refused_unless_the_order_is_global(tmp_path, mirrored):
    state = checkpoint.CheckpointState(str(tmp_path / "ckpt"), mirrored)
    try:
        state.run_shape.value = _shape(1, "global")
        assert state._compare(_shape(2, "global"), "auto") == {}
        state.run_shape.value = _shape(1, "the shuffle has no seed")
        with pytest.raises(CheckpointMismatchError, match=r"read by 2 input pipeline.*now 1") as e:
            state._compare(_shape(2, "global"), "auto")
        assert "the shuffle has no seed" in str(e.value) and "Resume on 2 worker" in str(e.value)
        with pytest.warns(UserWarning, match="some of its examples repeat"):
            assert state._compare(_shape(2, "global"), "force") == {"input_pipelines": (2, 1)}
        assert state._compare(_shape(1, "the shuffle has no seed"), "auto") == {}
    finally:
        state.close()


# -- kill -9 on N, resume on M (subprocesses) ---------------------------------------------------


def _job(jobs, tmp, name, *extra, expect=0):
    command = [sys.executable, str(JOB), "--ckpt", str(tmp / f"{name}-ckpt")]
    command += ["--out", str(tmp / name), "--augment", "--epochs", "2"]
    command += ["--history-log", str(tmp / f"{name}.jsonl"), *extra]
    result = jobs.run(command, timeout=240)
    assert result.returncode == expect, (result.stdout + result.stderr)[-3000:]
    return result


def test_two_replicas_killed_resume_on_one_then_on_two_exactly(tmp_path, jobs):
    killed = -signal.SIGKILL
    _job(jobs, tmp_path, "full", "--replicas", "2")
    k1, k2 = str(tmp_path / "k1"), str(tmp_path / "k2")
    _job(jobs, tmp_path, "run", "--replicas", "2", "--kill-at", "8", "--marker", k1, expect=killed)
    _job(jobs, tmp_path, "run", "--replicas", "1", "--kill-at", "20", "--marker", k2, expect=killed)
    _job(jobs, tmp_path, "run", "--replicas", "2")
    assert (tmp_path / "k1").exists() and (tmp_path / "k2").exists()
    assert_same_run(tmp_path, "run", "full")
