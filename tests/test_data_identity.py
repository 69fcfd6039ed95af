"""Nothing stored is reused without proof that it belongs: caches, checkpoints, the tuner."""

import os
import sys
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel import data
from tfaccel.data import fingerprint
from tfaccel.data.assembly import cache as build_cache

N = 32
X = np.random.default_rng(3).normal(size=(N, 4)).astype("float32")


def labelled(label, n=N, width=4):
    x = X if width == 4 else np.ones((n, width), "float32")
    return data.from_arrays(x[:n], np.full(n, label, np.int64))


def labels_of(dataset):
    return sorted({int(v) for _, y in dataset for v in y.numpy()})


# -- the file cache -------------------------------------------------------------------


def test_a_cache_of_other_data_is_rebuilt_with_one_warning(tmp_path):
    path = str(tmp_path / "cache")
    labels_of(data.pipeline(labelled(0), batch_size=8, training=False, cache=path))
    old = build_cache._read_record(path)["fingerprint"]
    with pytest.warns(data.CacheMismatchWarning) as caught:
        fresh = data.pipeline(labelled(1), batch_size=8, training=False, cache=path)
    new = build_cache._read_record(path)["fingerprint"]
    assert len(caught) == 1 and old != new
    message = str(caught[0].message)
    for word in (path, old, new, "built from other data"):
        assert word in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert labels_of(fresh) == [1] and labels_of(fresh) == [1]  # written, then read
        again = data.pipeline(labelled(1), batch_size=8, training=False, cache=path)
        assert labels_of(again) == [1]


def test_cache_mismatch_error_raises_and_keeps_the_files(tmp_path):
    path = str(tmp_path / "cache")
    labels_of(data.pipeline(labelled(0), batch_size=8, training=False, cache=path))
    with pytest.raises(data.CacheMismatchError, match="cache_mismatch='rebuild'"):
        data.pipeline(labelled(1), batch_size=8, training=False, cache=path, cache_mismatch="error")
    assert os.path.exists(path + ".index")


def test_a_cache_of_another_shape_is_named_as_such(tmp_path):
    path = str(tmp_path / "cache")
    labels_of(data.pipeline(labelled(0), batch_size=8, training=False, cache=path))
    with pytest.warns(data.CacheMismatchWarning, match="another shape/dtype") as caught:
        ds = data.pipeline(labelled(0, width=5), batch_size=8, training=False, cache=path)
    assert "float32[5]" in str(caught[0].message)
    assert next(iter(ds))[0].shape == (8, 5)


def test_a_cache_without_a_fingerprint_file_is_refused_and_kept(tmp_path):
    path = str(tmp_path / "cache")
    labels_of(data.pipeline(labelled(0), batch_size=8, training=False, cache=path))
    os.remove(path + ".fingerprint.json")  # as an older tfaccel (or another program) left it
    with pytest.raises(data.CacheMismatchError, match="cannot prove it wrote"):
        data.pipeline(labelled(0), batch_size=8, training=False, cache=path)
    assert os.path.exists(path + ".index")


def test_sharded_pipelines_record_each_cache(tmp_path, mirrored):
    path = str(tmp_path / "cache")
    context = tf.distribute.InputContext(2, 1, 2)
    fn = data.pipeline(labelled(0), batch_size=8, training=False, cache=path, strategy=mirrored)
    labels_of(fn(context))
    assert os.path.exists(path + "-pipeline1of2.fingerprint.json")
    fn = data.pipeline(labelled(1), batch_size=8, training=False, cache=path, strategy=mirrored)
    with pytest.warns(data.CacheMismatchWarning, match="pipeline1of2"):
        assert labels_of(fn(context)) == [1]


# -- the checkpoint -------------------------------------------------------------------


def make_trainer(strategy=None):
    def build():
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])

    return tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=strategy or tf.distribute.get_strategy(),
        steps_per_loop=2,
    )


def batches(label):
    return tf.data.Dataset.from_tensor_slices((X, np.full(N, label, np.int64))).batch(8)


def test_a_resumed_run_on_changed_data_is_refused(tmp_path):
    make_trainer().fit(batches(0), epochs=1, verbose=0, checkpoint_dir=tmp_path)
    trainer = make_trainer()
    with pytest.raises(tfaccel.CheckpointMismatchError, match="training data changed") as caught:
        trainer.fit(batches(1), epochs=2, verbose=0, checkpoint_dir=tmp_path)
    old, new = (str(fingerprint.of_dataset(batches(label))) for label in (0, 1))
    assert old in str(caught.value) and new in str(caught.value) and old != new
    assert int(trainer.step.numpy()) == 0


def test_forced_resume_trains_on_the_new_data(tmp_path):
    make_trainer().fit(batches(0), epochs=1, verbose=0, checkpoint_dir=tmp_path)
    forced = make_trainer()
    with pytest.warns(UserWarning, match="training data changed"):
        forced.fit(batches(1), epochs=2, verbose=0, checkpoint_dir=tmp_path, resume="force")
    assert int(forced.step.numpy()) == 8
    reference = make_trainer()  # the saved state (epoch 1 on A), then one epoch on B
    reference.fit(batches(0), epochs=1, verbose=0)
    reference.fit(batches(1), epochs=1, verbose=0)
    replayed = make_trainer()  # what the bug did: epoch 2 on A
    replayed.fit(batches(0), epochs=2, verbose=0)
    for got, want in zip(forced.model.get_weights(), reference.model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    assert not all(
        np.array_equal(a, b)
        for a, b in zip(forced.model.get_weights(), replayed.model.get_weights(), strict=True)
    )


@pytest.mark.parametrize("replicas", [1, 2])
def test_unchanged_data_still_resumes_bit_identically(tmp_path, replicas, mirrored):
    strategy = mirrored if replicas == 2 else None

    def pipeline():
        source = data.from_arrays(X, (X[:, 0] > 0).astype(np.int64))
        return data.pipeline(source, batch_size=8, training=True, seed=1, strategy=strategy)

    whole = make_trainer(strategy)
    whole.fit(pipeline(), epochs=3, verbose=0)
    make_trainer(strategy).fit(
        pipeline(), epochs=1, verbose=0, checkpoint_dir=tmp_path, checkpoint_every=3
    )
    resumed = make_trainer(strategy)
    resumed.fit(pipeline(), epochs=3, verbose=0, checkpoint_dir=tmp_path)
    assert int(resumed.step.numpy()) == 12
    for got, want in zip(resumed.model.get_weights(), whole.model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


PROBE = """
import numpy as np, tensorflow as tf
from tfaccel import data
from tfaccel.data import fingerprint
x = np.random.default_rng(3).normal(size=(32, 4)).astype("float32")
y = np.zeros(32, np.int64)
plain = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(8).batch(8)
piped = data.pipeline(data.from_arrays(x, y), batch_size=8, training=True)
print(fingerprint.of_dataset(plain), fingerprint.of_dataset(piped))
"""


def test_the_fingerprint_is_the_same_in_another_process(jobs):
    y = np.zeros(N, np.int64)
    plain = tf.data.Dataset.from_tensor_slices((X, y)).shuffle(8).batch(8)
    piped = data.pipeline(data.from_arrays(X, y), batch_size=8, training=True)
    here = f"{fingerprint.of_dataset(plain)} {fingerprint.of_dataset(piped)}"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    probe = jobs.run([sys.executable, "-c", PROBE], env=env)  # forked: conftest.py
    assert probe.returncode == 0, probe.stderr[-2000:]
    there = probe.stdout.split()
    assert there == here.split() and "unchecked" not in here


def test_a_file_source_changes_with_a_files_size_or_mtime(tmp_path):
    path = tmp_path / "table.csv"
    path.write_text("a,label\n1,0\n2,1\n")
    first = str(fingerprint.of_dataset(data.from_csv(str(path), label="label")))
    assert str(fingerprint.of_dataset(data.from_csv(str(path), label="label"))) == first
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    touched = str(fingerprint.of_dataset(data.from_csv(str(path), label="label")))
    path.write_text("a,label\n1,0\n2,1\n3,1\n")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    grown = str(fingerprint.of_dataset(data.from_csv(str(path), label="label")))
    assert len({first, touched, grown}) == 3


# -- the batch-size search ------------------------------------------------------------


def tiny_model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])


@pytest.mark.parametrize("length", ["known", "unknown"])
def test_find_batch_size_never_proposes_more_than_the_examples(length):
    x, y = X[:10], np.zeros(10, np.int64)
    source = tf.data.Dataset.from_tensor_slices((x, y))
    if length == "unknown":
        source = source.filter(lambda a, b: True)
    report = tfaccel.tuning.find_batch_size(
        tiny_model,
        source,
        loss="sparse_categorical_crossentropy",
        start=4,
        steps=1,
        min_steps_per_epoch=1,  # the data alone caps (the steps cap: tests/test_tuning.py)
    )
    assert report.max_batch_size <= 10 and report.best_batch_size <= 10
    assert all(row.batch_size <= 10 for row in report.rows if row.fits)
    assert report.capped_by == "data" and report.examples == 10
    assert "search capped by the data: it holds 10 examples" in str(report)
    assert [(r.batch_size, r.reason) for r in report.rows] == [(4, "ok"), (8, "ok"), (16, "data")]
    small = tfaccel.tuning.find_batch_size(
        tiny_model,
        (x[:5], y[:5]),
        loss="sparse_categorical_crossentropy",
        steps=1,
        min_steps_per_epoch=1,
    )
    assert small.max_batch_size == 5 and small.capped_by == "data"
