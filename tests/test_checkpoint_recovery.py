"""Damaged checkpoint directories, changed run settings, and what a checkpoint holds."""

import hashlib
import os
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel

X = np.random.default_rng(1).normal(size=(64, 4)).astype("float32")
Y = (X[:, 0] + X[:, 1] > 0).astype("int32")
STEPS = 8  # per epoch, batch 8


def make_trainer(optimizer="sgd", accumulate_steps=1):
    def build():
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(6), keras.layers.Dense(2)])

    optimizers = {"sgd": lambda: keras.optimizers.SGD(0.1), "adam": lambda: keras.optimizers.Adam()}
    return tfaccel.Trainer(
        build,
        optimizer=optimizers[optimizer],
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        strategy=tf.distribute.get_strategy(),
        steps_per_loop=2,
        accumulate_steps=accumulate_steps,
    )


def data(batch=8):
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(batch)


def fit(directory, epochs, **kwargs):
    trainer = make_trainer(kwargs.pop("optimizer", "sgd"), kwargs.pop("accumulate_steps", 1))
    kwargs.setdefault("checkpoint_every", 4)
    history = trainer.fit(
        kwargs.pop("data", None) or data(),
        epochs=epochs,
        verbose=0,
        checkpoint_dir=directory,
        keep=10,
        **kwargs,
    )
    return trainer, history.history


def digest(directory, number):
    found = sorted(pathlib.Path(directory).glob(f"ckpt-{number}.*"))
    assert found, f"no files of ckpt-{number}"
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in found}


@pytest.fixture(scope="module")
def reference():
    trainer, history = fit(None, epochs=2)
    return trainer.model.get_weights(), history


def assert_same(trainer, history, reference, epochs=(1,)):
    weights, full = reference
    for got, want in zip(trainer.model.get_weights(), weights, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(history[key], [full[key][e] for e in epochs], atol=1e-6)


def damage_delete(directory):
    for path in pathlib.Path(directory).glob("ckpt-8.*"):
        path.unlink()


def damage_state_garbage(directory):
    (pathlib.Path(directory) / "checkpoint").write_bytes(b"\x00garbage{{ not a proto")


def damage_state_empty(directory):
    (pathlib.Path(directory) / "checkpoint").write_bytes(b"")


def damage_truncate_index(directory):
    os.truncate(pathlib.Path(directory) / "ckpt-8.index", 20)


def damage_truncate_data(directory):
    (data_file,) = pathlib.Path(directory).glob("ckpt-8.data-*")
    os.truncate(data_file, 20)


def damage_flip_byte(directory):
    """One byte flipped mid-file: it lands in the input iterator's state, saved last."""
    (data_file,) = pathlib.Path(directory).glob("ckpt-8.data-*")
    raw = bytearray(data_file.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data_file.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "damage, falls_back",
    [
        (damage_delete, True),
        (damage_truncate_index, True),
        (damage_truncate_data, True),
        (damage_flip_byte, True),
        (damage_state_garbage, False),
        (damage_state_empty, False),
    ],
    ids=[
        "delete-latest",
        "truncated-index",
        "truncated-data",
        "flipped-byte",
        "garbage-state",
        "empty-state",
    ],
)
def test_damaged_directory_resumes_from_the_newest_readable_checkpoint(
    tmp_path, reference, damage, falls_back
):
    fit(tmp_path, epochs=1)  # ckpt-4 and ckpt-8 (the end of epoch 0)
    before = digest(tmp_path, 4)
    damage(tmp_path)
    with pytest.warns(UserWarning) as caught:
        trainer, history = fit(tmp_path, epochs=2)
    text = " ".join(str(w.message) for w in caught)
    assert digest(tmp_path, 4) == before  # the older checkpoint was never overwritten
    assert int(trainer.step.numpy()) == 2 * STEPS
    if falls_back:  # resumed from ckpt-4, mid-epoch 0: History holds epochs 0 and 1
        assert "resumed from ckpt-4" in text
        assert_same(trainer, history, reference, epochs=(0, 1))
    else:  # the state file is only an index: ckpt-8 (epoch 0 done) is found from the files
        assert "rewrote it from the checkpoint files" in text
        assert_same(trainer, history, reference, epochs=(1,))
    if damage in (damage_truncate_index, damage_truncate_data, damage_flip_byte):
        assert "ckpt-8 could not be read" in text and "moved its files to" in text
        moved = sorted(p.name for p in (tmp_path / "corrupt").iterdir())
        assert moved[0] == "ckpt-8.data-00000-of-00001" and moved[1] == "ckpt-8.index"
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith(f"ckpt-{2 * STEPS}")


def test_no_readable_checkpoint_is_an_error_and_nothing_is_touched(tmp_path):
    fit(tmp_path, epochs=1)
    for path in tmp_path.glob("ckpt-*.index"):
        os.truncate(path, 20)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    trainer = make_trainer()
    with pytest.raises(tfaccel.CheckpointCorruptError) as caught:
        trainer.fit(data(), epochs=2, verbose=0, checkpoint_dir=tmp_path)
    message = str(caught.value)
    assert "none can be read" in message and "ckpt-8.index" in message and "ckpt-4.index" in message
    assert "too short" in message and "Nothing was changed or deleted" in message
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert int(trainer.step.numpy()) == 0


def test_leftovers_of_interrupted_saves_are_removed_at_the_next_start(tmp_path):
    fit(tmp_path, epochs=1)
    before = digest(tmp_path, 8)
    stray = tmp_path / "ckpt-12_temp"
    stray.mkdir()
    (stray / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"half")
    state = tmp_path / ("checkpoint.tmp" + "0123abcd" * 4)  # our uuid-named state file
    state.write_text("model_checkpoint")
    trainer, _ = fit(tmp_path, epochs=1)  # finished: nothing to train
    assert not stray.exists() and not state.exists()
    assert digest(tmp_path, 8) == before
    assert int(trainer.step.numpy()) == STEPS


def test_a_checkpoint_holds_the_metrics_and_the_run_shape(tmp_path):
    fit(tmp_path, epochs=1, checkpoint_every=3)  # ckpt-3: mid-epoch
    names = [name for name, _ in tf.train.list_variables(str(tmp_path / "ckpt-3"))]
    assert any(n.startswith("metrics/loss/") for n in names)
    assert any(n.startswith("metrics/accuracy/") for n in names)
    reader = tf.train.load_checkpoint(str(tmp_path / "ckpt-3"))
    count = [n for n in names if n.startswith("metrics/loss/1")]
    assert reader.get_tensor(count[0]) == 3 * 8  # the loss tracker saw 3 batches of 8
    shape = reader.get_tensor("run_shape/.ATTRIBUTES/json").decode()
    for piece in (
        '"global_batch": 8',
        '"steps_per_epoch": 8',
        '"optimizer": "SGD"',
        '"accumulate_steps": 1',
    ):
        assert piece in shape


CHANGES = {
    "batch-size": (
        lambda: {"data": data(batch=16)},
        ["global batch: saved 8, now 16", "steps per epoch: saved 8, now 4"],
        4,
    ),
    "steps-per-epoch": (
        lambda: {"data": data().repeat(), "steps_per_epoch": 4},
        ["steps per epoch: saved 8, now 4"],
        4,
    ),
    "optimizer": (lambda: {"optimizer": "adam"}, ["optimizer type: saved 'SGD', now 'Adam'"], 8),
    "accumulation": (
        lambda: {"accumulate_steps": 2},
        ["gradient accumulation (accumulate_steps): saved 1, now 2", "steps per epoch: saved 8"],
        4,
    ),
}


@pytest.mark.parametrize("name", list(CHANGES))
def test_changed_run_shape_is_refused_unless_forced(tmp_path, name):
    make_change, words, per_epoch = CHANGES[name]
    fit(tmp_path, epochs=1, checkpoint_every=3)  # ckpt-3 mid-epoch, ckpt-6, ckpt-8
    change = make_change()
    trainer = make_trainer(change.get("optimizer", "sgd"), change.get("accumulate_steps", 1))
    kwargs = {k: v for k, v in change.items() if k not in ("optimizer", "data", "accumulate_steps")}
    with pytest.raises(tfaccel.CheckpointMismatchError) as caught:
        trainer.fit(
            change.get("data") or data(), epochs=3, verbose=0, checkpoint_dir=tmp_path, **kwargs
        )
    for word in [*words, "resume='force'"]:
        assert word in str(caught.value)
    assert int(trainer.step.numpy()) == 0
    with pytest.warns(UserWarning, match="resume='force'"):
        forced, history = fit(tmp_path, epochs=3, resume="force", **change)
    assert int(forced.step.numpy()) == 8 + 2 * per_epoch  # epoch 0 done, then 2 more
    assert len(history["loss"]) == 2 and all(np.isfinite(history["loss"]))


def test_bad_resume_value(tmp_path):
    with pytest.raises(ValueError, match="resume must be one of"):
        make_trainer().fit(data(), verbose=0, checkpoint_dir=tmp_path, resume="yes")


class Steps(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1


def test_a_file_as_checkpoint_dir_fails_before_the_first_step(tmp_path):
    path = tmp_path / "ckpt"
    path.write_text("I am a file")
    trainer, steps = make_trainer(), Steps()
    with pytest.raises(NotADirectoryError, match="is a file, not a directory"):
        trainer.fit(data(), verbose=0, checkpoint_dir=path, callbacks=[steps])
    assert steps.batches == 0 and int(trainer.step.numpy()) == 0
    with pytest.raises(NotADirectoryError, match="part of its path is a file"):
        trainer.fit(data(), verbose=0, checkpoint_dir=path / "sub", callbacks=[steps])
    assert steps.batches == 0


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_read_only_checkpoint_dir_fails_before_the_first_step(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(PermissionError, match="not writable"):
            make_trainer().fit(data(), verbose=0, checkpoint_dir=tmp_path)
    finally:
        tmp_path.chmod(0o700)


def test_resume_says_where_it_resumed(tmp_path, caplog):
    fit(tmp_path, epochs=1)
    with caplog.at_level("INFO", logger="tfaccel"):
        fit(tmp_path, epochs=2)  # verbose=0: the line goes to the "tfaccel" logger
        fit(tmp_path, epochs=2)
    resumed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Resumed")]
    assert resumed == [
        f"Resumed from ckpt-8 in {tmp_path}: step 8, epoch 2/2, step 0 of it.",
        f"Resumed from ckpt-16 in {tmp_path}: step 16, all 2 epochs done; raise epochs to "
        "train on.",
    ]
