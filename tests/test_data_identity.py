"""Nothing stored is reused without proof that it belongs: caches, checkpoints, the tuner."""

import os
import warnings

import numpy as np
import pytest
import tensorflow as tf

from tfaccel import data

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
    old = data.cache._read_record(path)["fingerprint"]
    with pytest.warns(data.CacheMismatchWarning) as caught:
        fresh = data.pipeline(labelled(1), batch_size=8, training=False, cache=path)
    new = data.cache._read_record(path)["fingerprint"]
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


def test_a_cache_without_a_fingerprint_file_is_rebuilt(tmp_path):
    path = str(tmp_path / "cache")
    labels_of(data.pipeline(labelled(0), batch_size=8, training=False, cache=path))
    os.remove(path + ".fingerprint.json")  # as an older tfaccel left it
    with pytest.warns(data.CacheMismatchWarning, match="no fingerprint file"):
        ds = data.pipeline(labelled(0), batch_size=8, training=False, cache=path)
    assert labels_of(ds) == [0]


def test_sharded_pipelines_record_each_cache(tmp_path, mirrored):
    path = str(tmp_path / "cache")
    context = tf.distribute.InputContext(2, 1, 2)
    fn = data.pipeline(labelled(0), batch_size=8, training=False, cache=path, strategy=mirrored)
    labels_of(fn(context))
    assert os.path.exists(path + "-pipeline1of2.fingerprint.json")
    fn = data.pipeline(labelled(1), batch_size=8, training=False, cache=path, strategy=mirrored)
    with pytest.warns(data.CacheMismatchWarning, match="pipeline1of2"):
        assert labels_of(fn(context)) == [1]
