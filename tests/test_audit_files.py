"""Files that are not ours: shared cache paths, a user's checkpoint, temporary files."""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf

from tfaccel import data

N = 32


def labelled(label):
    x = np.random.default_rng(3).normal(size=(N, 4)).astype("float32")
    return data.from_arrays(x, np.full(N, label, np.int64))


def labels_of(dataset):
    return sorted({int(v) for _, y in dataset for v in y.numpy()})


def test_two_pipelines_of_other_data_never_share_a_cache_path(tmp_path):
    path = str(tmp_path / "cache")
    train = data.pipeline(labelled(0), batch_size=8, training=False, cache=path)
    with pytest.warns(data.CacheMismatchWarning, match="caches to") as caught:
        validation = data.pipeline(labelled(1), batch_size=8, training=False, cache=path)
    # Only the mismatch's warning: another (a ResourceWarning the garbage collector raised
    # for some earlier test's file, while this block ran) may be caught before it.
    mismatch = [str(w.message) for w in caught if w.category is data.CacheMismatchWarning]
    assert mismatch and all(path in message for message in mismatch)
    for _ in range(2):  # written, then read: each its own data
        assert labels_of(train) == [0] and labels_of(validation) == [1]
    with pytest.raises(data.CacheMismatchError, match="its own cache path"):
        data.pipeline(labelled(1), batch_size=8, training=False, cache=path, cache_mismatch="error")


def test_a_users_checkpoint_at_the_cache_path_is_never_deleted(tmp_path):
    prefix = str(tmp_path / "best_model")
    tf.train.Checkpoint(v=tf.Variable([1.0, 2.0])).write(prefix)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(data.CacheMismatchError, match="cannot prove it wrote"):
        data.pipeline(labelled(0), batch_size=8, training=False, cache=prefix)
    assert set(before) <= set(os.listdir(tmp_path))
    restored = tf.train.Checkpoint(v=tf.Variable([0.0, 0.0]))
    restored.read(prefix).assert_consumed()
    assert restored.v.numpy().tolist() == [1.0, 2.0]
    (tmp_path / "notes.owner").write_text("my notes\n")
    with pytest.raises(data.CacheMismatchError, match="never overwrites"):
        data.pipeline(labelled(0), batch_size=8, training=False, cache=str(tmp_path / "notes"))
    assert (tmp_path / "notes.owner").read_text() == "my notes\n"


FILLER = """
import sys
import numpy as np
from tfaccel import data
x = np.random.default_rng(3).normal(size=(32, 4)).astype("float32")
ds = data.pipeline(data.from_arrays(x, np.zeros(32, np.int64)), batch_size=8,
                   training=False, cache=sys.argv[1])
iterator = iter(ds)
next(iterator)  # filling the cache now
print("filling", flush=True)
sys.stdin.read()  # until the test lets go
"""


def test_a_cache_filled_by_another_process_is_read_around(tmp_path):
    path = str(tmp_path / "cache")
    filler = subprocess.Popen(
        [sys.executable, "-c", FILLER, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert filler.stdout.readline().strip() == "filling"
        with pytest.warns(data.CacheBusyWarning, match="being filled by pid"):
            ds = data.pipeline(labelled(0), batch_size=8, training=False, cache=path)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert sum(int(y.shape[0]) for _, y in ds) == N
            assert sum(int(y.shape[0]) for _, y in ds) == N
    finally:
        filler.stdin.close()
        filler.wait(timeout=120)
    assert filler.returncode == 0


# -- saving ---------------------------------------------------------------------------


def small_model():
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    return model


def test_save_never_writes_through_a_planted_link(tmp_path):
    from tfaccel.train.state import saving

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for name in (f".model.{os.getpid()}.partial.keras", ".model.partial.keras"):
        os.symlink(victim, tmp_path / name)
    saving.save(small_model(), tmp_path / "model.keras", tf.distribute.get_strategy())
    assert victim.read_text() == "precious\n"
    assert (tmp_path / "model.keras").is_file() and not (tmp_path / "model.keras").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.is_symlink()) == [
        "model.keras",
        "victim.txt",
    ]


def test_save_onto_a_full_disk_says_so_and_keeps_the_old_file(tmp_path, monkeypatch):
    import errno

    import keras

    from tfaccel.train.state import saving

    path = tmp_path / "model.keras"
    saving.save(small_model(), path, tf.distribute.get_strategy())
    old = path.read_bytes()

    def full(self, filepath, *args, **kwargs):
        with open(filepath, "wb") as handle:
            handle.write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(keras.Model, "save", full)
    with pytest.raises(OSError) as caught:
        saving.save(small_model(), path, tf.distribute.get_strategy())
    message = str(caught.value)
    assert caught.value.errno == errno.ENOSPC
    for words in (str(path), "No space left on device", "ENOSPC", "old file", "intact"):
        assert words in message
    assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.keras"]


def test_save_and_export_below_a_regular_file_name_the_path(tmp_path):
    from tfaccel.train.state import saving

    (tmp_path / "notes.txt").write_text("a file, not a folder\n")
    model, strategy = small_model(), tf.distribute.get_strategy()
    with pytest.raises(OSError, match="cannot write .*notes.txt/model.keras.*Not a directory"):
        saving.save(model, tmp_path / "notes.txt" / "model.keras", strategy)
    with pytest.raises(OSError, match="cannot write .*notes.txt/exported.*Not a directory"):
        saving.export(model, tmp_path / "notes.txt" / "exported", strategy)


def test_save_into_a_read_only_directory_says_so(tmp_path, monkeypatch):
    import errno
    import tempfile

    from tfaccel.train.state import saving

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(tempfile, "mkdtemp", refused)  # root may write anywhere
    with pytest.raises(PermissionError, match="Permission denied .EACCES.*nothing was written"):
        saving.save(small_model(), tmp_path / "model.keras", tf.distribute.get_strategy())


def test_a_dangling_link_as_checkpoint_dir_is_named(tmp_path):
    from tfaccel.train.state import checkpoint_files

    link = tmp_path / "checkpoints"
    os.symlink(tmp_path / "gone", link)
    with pytest.raises(FileNotFoundError, match="symbolic link to .*gone.*dangling"):
        checkpoint_files.check_directory(str(link), writable=True)


def test_a_cache_name_too_long_for_the_file_system_is_refused_up_front(tmp_path):
    path = str(tmp_path / ("c" * 250))
    with pytest.raises(ValueError, match="too long for this file system.*File name too long"):
        data.pipeline(labelled(0), batch_size=8, training=False, cache=path)
    assert os.listdir(tmp_path) == []


def test_cleaning_a_checkpoint_dir_spares_files_named_like_temporaries(tmp_path):
    from tfaccel.train.state import checkpoint_files

    mine = ["notes.tempstate1", "checkpoint.tmpbeef", "model.data.tempstate42"]
    ours = ["ckpt-3.index.tempstate123", "checkpoint.tmp" + "0" * 32]
    for name in mine + ours:
        (tmp_path / name).write_text("x")
    (tmp_path / "ckpt-3_temp").mkdir()
    removed = checkpoint_files.remove_temporaries(str(tmp_path))
    assert removed == sorted([*ours, "ckpt-3_temp"])
    assert sorted(os.listdir(tmp_path)) == sorted(mine)
