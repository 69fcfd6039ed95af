"""The third audit's obscure cases (issue 69, item 9 and "worth fixing"): the doctor on a
script that trains in a child process or on a PyDataset, checkpoint files deleted under a
running job, the elastic launcher's latest checkpoint."""

import os
import shutil
import sys
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel.train.state import async_save
from tfaccel.train.state import checkpoint_files as files

SPAWNED = """
import multiprocessing, sys
import keras, numpy as np

def train(marker):
    x = np.ones((64, 4), "float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(x, x[:, :1], epochs=1, verbose=0)
    open(marker, "w").write(str(int(model.optimizer.iterations.numpy())))

if __name__ == "__main__":
    child = multiprocessing.get_context("spawn").Process(target=train, args=(sys.argv[1],))
    child.start()
    child.join()
"""

PY_DATASET = """
import sys
import keras, numpy as np

class Rows(keras.utils.PyDataset):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.x = np.random.default_rng(0).normal(size=(200, 4)).astype("float32")

    def __len__(self):
        return 7  # six batches of 32 and one of 8

    def __getitem__(self, i):
        x = self.x[i * 32 : (i + 1) * 32]
        return x, x.sum(axis=1, keepdims=True)

model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
model.fit(Rows(**eval(sys.argv[1])), epochs=1, verbose=0)
print("AFTER FIT")
"""


def doctor(jobs, tmp_path, code, *args):
    script = tmp_path / "train.py"
    script.write_text(code)
    command = [sys.executable, "-m", "tfaccel", "doctor", "--budget", "2", str(script), *args]
    return jobs.run(command, timeout=240)


def test_the_doctor_says_a_fit_in_a_spawned_child_is_not_measured(jobs, tmp_path):
    marker = tmp_path / "trained.txt"
    result = doctor(jobs, tmp_path, SPAWNED, str(marker))
    said = result.stderr
    assert result.returncode == 3, said[-3000:]
    assert marker.read_text() == "2"  # the child trained for real: the doctor says so
    assert "the script started a child process ('spawn')" in said
    assert (
        "ended without calling model.fit or Trainer.fit in this process, but it started 1 "
        "child process(es) with multiprocessing ('spawn')"
    ) in said
    assert "The doctor measures only the process it runs" in said
    assert "call tfaccel.doctor.diagnose(model, data) inside the child" in said
    assert "nothing to diagnose (the doctor diagnoses the first fit" not in said


def test_the_doctor_reads_a_py_dataset_as_model_fit_does(jobs, tmp_path):
    result = doctor(jobs, tmp_path, PY_DATASET, "{}")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert (
        "model.fit was called with a keras.utils.PyDataset (Rows); measured as model.fit "
        "reads it, 32 examples a batch (a smaller last batch is left out)"
    ) in result.stdout
    assert "Verdict: " in result.stdout and "AFTER FIT" not in result.stdout


def test_the_doctor_refuses_a_py_dataset_with_workers_and_says_what_to_do(jobs, tmp_path):
    result = doctor(jobs, tmp_path, PY_DATASET, "{'workers': 2}")
    assert result.returncode == 2, result.stdout + result.stderr[-3000:]
    assert (
        "model.fit was called with a keras.utils.PyDataset (Rows) read by Keras's worker "
        "pool (workers=2), which the doctor cannot drive"
    ) in result.stderr
    assert "Build it with workers=1 and use_multiprocessing=False" in result.stderr
    assert "Can't convert" not in result.stderr and "AFTER FIT" not in result.stdout


def test_the_elastic_launcher_reads_the_state_file_not_stray_file_names(tmp_path, monkeypatch):
    from tfaccel.launcher import elastic

    monkeypatch.setattr(elastic, "_POLL_S", 0.0)
    for name in ("ckpt-8.index", "ckpt-8.data-00000-of-00001"):
        (tmp_path / name).touch()
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-8"\n')
    watch = elastic.GrowWatch(str(tmp_path), 1, 2)
    assert watch.since == 8
    for name in ("ckpt-99999.index", "ckpt-99999.data-00000-of-00001"):
        (tmp_path / name).touch()  # a stray copy, never published in the state file
    assert elastic.last_step(str(tmp_path)) == 8 and not watch.due()
    (tmp_path / "ckpt-12.index").touch()
    (tmp_path / "checkpoint").write_text(f'model_checkpoint_path: "{tmp_path}/ckpt-12"\n')
    assert watch.due() and watch.step == 12
    (tmp_path / "ckpt-12.index").unlink()  # the state file names files that are gone
    assert elastic.last_step(str(tmp_path)) is None


def test_the_doctor_on_trainer_fit_with_a_py_dataset_names_what_the_trainer_takes(jobs, tmp_path):
    code = PY_DATASET.replace(
        "model.fit(Rows(**eval(sys.argv[1])), epochs=1, verbose=0)",
        "import tfaccel\ntfaccel.Trainer(lambda: model, loss='mse').fit(Rows(), epochs=1)",
    )
    result = doctor(jobs, tmp_path, code, "{}")
    assert result.returncode == 2, result.stdout + result.stderr[-3000:]
    assert (
        "Trainer.fit was called with a keras.utils.PyDataset (Rows), which the Trainer does "
        "not take: pass tf.data.Dataset.from_generator("
    ) in result.stderr
    assert "AFTER FIT" not in result.stdout


# -- checkpoint files deleted under a running Trainer job -----------------------------------

X = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
Y = X.sum(axis=1, keepdims=True)


def linear():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])


def train(directory, callback, epochs=2):
    trainer = tfaccel.Trainer(linear, loss="mse", steps_per_loop=1)
    trainer.fit(
        X, Y, batch_size=8, epochs=epochs, shuffle=False, checkpoint_dir=str(directory),
        checkpoint_every=4, callbacks=[callback], verbose=0,
    )  # fmt: skip
    return trainer


def join_the_writer():
    for thread in threading.enumerate():
        if thread.name.startswith("tfaccel-save"):
            thread.join()


class AtStep(keras.callbacks.Callback):
    """Runs `act()` once, at the end of optimizer step `step`."""

    def __init__(self, step, act):
        super().__init__()
        self.step, self.act, self.done = step, act, False

    def on_train_batch_end(self, batch, logs=None):
        if not self.done and int(self.model.optimizer.iterations.numpy()) >= self.step:
            self.done = True
            self.act()


def test_checkpoint_files_deleted_under_a_running_job_are_said_and_saved_afresh(tmp_path):
    directory = tmp_path / "ckpt"

    def delete_every_file():  # rm ckpt/*: the checkpoints, the state file, the lock file
        join_the_writer()
        for path in directory.iterdir():
            path.unlink() if path.is_file() else shutil.rmtree(path)

    with pytest.warns(UserWarning) as said:
        trainer = train(directory, AtStep(6, delete_every_file))
    assert int(trainer.step.numpy()) == 16  # all of training ran
    assert (
        f"Files of checkpoint_dir {str(directory)!r} were deleted while this run trained "
        "(ckpt-4, the last checkpoint this run saved; the lock file tfaccel.lock). Training "
        "goes on: took the lock again and saving checkpoint 8 there now."
    ) in [str(w.message) for w in said]
    assert tf.train.latest_checkpoint(str(directory)).endswith("ckpt-16")
    assert files.numbers(str(directory)) == [16, 12, 8]
    assert files.unreadable(str(directory / "ckpt-8")) is None
    assert not (directory / "tfaccel.lock").exists()  # released at the end


def test_checkpoint_files_deleted_while_being_saved_are_written_again(tmp_path, monkeypatch):
    directory, write = tmp_path / "ckpt", async_save.write
    written, deleted = [], threading.Event()

    def write_then_wait(held, prefix):  # the files written, not yet published
        path = write(held, prefix)
        written.append(os.path.basename(prefix))
        deleted.wait(60)
        return path

    def delete_the_files_in_flight():
        deadline = time.monotonic() + 60
        while not written and time.monotonic() < deadline:
            time.sleep(0.01)
        for path in directory.glob("ckpt-4.*"):
            path.unlink()
        deleted.set()

    monkeypatch.setattr(async_save, "write", write_then_wait)
    with pytest.warns(UserWarning) as said:
        trainer = train(directory, AtStep(5, delete_the_files_in_flight), epochs=1)
    assert int(trainer.step.numpy()) == 8 and written == ["ckpt-4", "ckpt-4", "ckpt-8"]
    assert (
        f"Checkpoint 4's files in checkpoint_dir {str(directory)!r} were deleted while it was "
        "being saved (its files were gone right after they were written); wrote it again."
    ) in [str(w.message) for w in said]
    assert files.numbers(str(directory)) == [8, 4]
    assert all(files.unreadable(str(directory / f"ckpt-{n}")) is None for n in (4, 8))


def test_a_save_whose_files_keep_vanishing_is_given_up_and_training_goes_on(tmp_path, monkeypatch):
    directory, write = tmp_path / "ckpt", async_save.write

    def vanishing(held, prefix):  # TensorFlow's error for a file deleted under it
        if prefix.endswith("ckpt-4"):
            tf.io.gfile.remove(prefix + "_temp/part-00000-of-00001.data-00000-of-00001")
        return write(held, prefix)

    monkeypatch.setattr(async_save, "write", vanishing)
    with pytest.warns(UserWarning) as said:
        trainer = train(directory, keras.callbacks.Callback(), epochs=1)
    assert int(trainer.step.numpy()) == 8
    message = [str(w.message) for w in said if "Checkpoint 4's files" in str(w.message)]
    assert len(message) == 1 and message[0].startswith(
        f"Checkpoint 4's files in checkpoint_dir {str(directory)!r} were deleted while it was "
        "written (3 time(s), last: NotFoundError: "
    )
    assert "Training goes on without this checkpoint; the next save tries again." in message[0]
    assert files.numbers(str(directory)) == [8]


def test_a_lock_file_gone_beside_another_runs_checkpoint_stops_the_saves(tmp_path):
    directory = tmp_path / "ckpt"

    def lock_gone_and_a_foreign_checkpoint():
        join_the_writer()
        (directory / "tfaccel.lock").unlink()
        for path in directory.glob("ckpt-4.*"):
            shutil.copy(path, directory / path.name.replace("ckpt-4", "ckpt-40"))

    with pytest.raises(tfaccel.errors.CheckpointLockedError) as raised:
        train(directory, AtStep(6, lock_gone_and_a_foreign_checkpoint))
    assert "is gone and " in str(raised.value)
    assert "holds checkpoint(s) this run did not write (ckpt-40)" in str(raised.value)
