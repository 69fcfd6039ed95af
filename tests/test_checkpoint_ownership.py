"""Nothing stored is reused without proof that it belongs: who owns a checkpoint directory,
a state file without checkpoints, an empty checkpoint_dir, strict JSON."""

import hashlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import tfaccel
from tfaccel import strict_json
from tfaccel.train.state import checkpoint_files, lock

JOB = pathlib.Path(__file__).parent / "scripts" / "lock_job.py"
X = np.random.default_rng(1).normal(size=(64, 4)).astype("float32")
Y = (X[:, 0] + X[:, 1] > 0).astype("int32")


def make_trainer():
    def build():
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])

    return tfaccel.Trainer(
        build,
        optimizer=lambda: keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=tf.distribute.get_strategy(),
        steps_per_loop=2,
    )


def fit(directory, epochs=1, trainer=None, **kwargs):
    trainer = trainer or make_trainer()
    kwargs.setdefault("checkpoint_every", 4)
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8)  # 8 steps per epoch
    trainer.fit(data, epochs=epochs, verbose=0, checkpoint_dir=directory, keep=10, **kwargs)
    return trainer


def digests(directory):
    """Each file's digest; the lock's without its "refreshed" time, which the holder's
    heartbeat moves every `STALE_AFTER / 10` s (a second run on a busy host may outlast it)."""

    def content(p):
        if p.name != lock.NAME:
            return p.read_bytes()
        record = json.loads(p.read_text())
        record.pop("refreshed", None)
        return json.dumps(record, sort_keys=True).encode()

    return {
        p.name: hashlib.md5(content(p)).hexdigest()
        for p in sorted(pathlib.Path(directory).iterdir())
        if p.is_file()
    }


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def start_job(directory, *extra):
    cmd = [sys.executable, str(JOB), "--ckpt", str(directory), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def start_paused_job(directory):
    """A real run that holds `directory`, paused after its save at step 2."""
    job = start_job(directory, "--pause-at", "4")
    ready = directory.with_name(directory.name + ".ready")
    wait_for(lambda: ready.exists() or job.poll() is not None, 240, "the first run's step 4")
    assert job.poll() is None, job.communicate()[1][-3000:]
    return job


def write_lock(directory, **record):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / lock.NAME).write_text(json.dumps(record))


# -- two runs on one directory -----------------------------------------------------------


def test_a_second_run_on_a_held_directory_fails_and_the_first_is_untouched(tmp_path):
    directory = tmp_path / "ckpt"
    first = start_paused_job(directory)
    try:
        before = digests(directory)
        assert "ckpt-2.index" in before and lock.NAME in before
        holder = json.loads((directory / lock.NAME).read_text())
        assert holder["pid"] == first.pid and holder["host"] == socket.gethostname()
        second = subprocess.run(
            [sys.executable, str(JOB), "--ckpt", str(directory)],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert second.returncode != 0
        assert "CheckpointLockedError" in second.stderr
        assert f"pid {first.pid}" in second.stderr and socket.gethostname() in second.stderr
        assert "since" in second.stderr and "last refreshed" in second.stderr
        assert digests(directory) == before, "the refused run changed the directory"
    finally:
        directory.with_name("ckpt.go").write_text("go")
        out, err = first.communicate(timeout=240)
    assert first.returncode == 0, err[-3000:]
    assert "done at step 8" in out
    assert not (directory / lock.NAME).exists()
    assert checkpoint_files.numbers(str(directory)) == [8, 6, 4]  # keep=3
    for number in (8, 6, 4):
        assert checkpoint_files.unreadable(checkpoint_files.prefix(str(directory), number)) is None
    assert tf.train.latest_checkpoint(str(directory)).endswith("ckpt-8")


def test_a_sigkilled_holder_does_not_block_the_next_run(tmp_path):
    directory = tmp_path / "ckpt"
    job = start_paused_job(directory)
    job.send_signal(signal.SIGKILL)  # not reaped yet: a zombie holds the pid for now
    wait_for(lambda: lock._gone(job.pid, None) is not None, 30, "the killed process")
    assert (directory / lock.NAME).exists()
    with pytest.warns(UserWarning, match=rf"Took over the lock .*process {job.pid}"):
        trainer = fit(directory)
    job.communicate(timeout=60)
    assert job.returncode == -signal.SIGKILL
    assert int(trainer.step.numpy()) == 8  # resumed from the killed run's ckpt-2
    assert not (directory / lock.NAME).exists()


def test_a_lock_whose_pid_belongs_to_another_process_now_is_stale(tmp_path):
    directory = tmp_path / "ckpt"
    # Our own pid, but "started" an hour before this process: a reused pid.
    started = lock.psutil.Process().create_time() - 3600
    write_lock(directory, host=socket.gethostname(), pid=os.getpid(), process_started=started)
    with pytest.warns(UserWarning, match="now belongs to another process"):
        fit(directory)


def test_another_hosts_lock_is_refused_while_fresh_and_taken_over_when_stale(tmp_path):
    directory = tmp_path / "ckpt"
    now = time.time()
    fresh = {"host": "elsewhere.example", "pid": 4242, "since": now - 60, "refreshed": now - 5}
    write_lock(directory, **fresh)
    with pytest.raises(tfaccel.CheckpointLockedError, match="host elsewhere.example, pid 4242"):
        fit(directory)
    assert json.loads((directory / lock.NAME).read_text()) == fresh  # left alone
    assert not checkpoint_files.numbers(str(directory))
    stale = dict(fresh, refreshed=now - lock.STALE_AFTER - 60)
    write_lock(directory, **stale)
    with pytest.warns(UserWarning, match="Took over .*no refresh for .*elsewhere.example"):
        fit(directory)
    assert not (directory / lock.NAME).exists()
    assert checkpoint_files.numbers(str(directory)) == [8, 4]


class Probe(keras.callbacks.Callback):
    """Records the lock file at each loop; raises at step `fail_at`."""

    def __init__(self, path, fail_at=None):
        super().__init__()
        self.path, self.fail_at, self.records = path, fail_at, []

    def on_train_batch_end(self, batch, logs=None):
        self.records.append(json.loads(self.path.read_text()))
        if int(self.model.optimizer.iterations.numpy()) == self.fail_at:
            raise RuntimeError("a callback failed")


def test_the_lock_is_held_refreshed_and_released_when_fit_returns_or_raises(tmp_path):
    directory = tmp_path / "ckpt"
    probe = Probe(directory / lock.NAME)
    fit(directory, callbacks=[probe])
    assert not (directory / lock.NAME).exists()
    first, last = probe.records[0], probe.records[-1]
    assert first["pid"] == os.getpid() and first["token"] == last["token"]
    assert last["since"] == first["since"] and last["refreshed"] > first["refreshed"]

    probe = Probe(directory / lock.NAME, fail_at=10)  # resumed at step 8
    with pytest.raises(RuntimeError, match="a callback failed"):
        fit(directory, epochs=2, callbacks=[probe])
    assert probe.records and not (directory / lock.NAME).exists()
    fit(directory, epochs=2)  # the same process may take the directory again


def no_hard_links(source, target):
    raise PermissionError(1, "Operation not permitted")  # as on some network file systems


@pytest.mark.parametrize("links", [True, False], ids=["hard links", "exclusive create"])
def test_racing_starts_cannot_both_win(tmp_path, monkeypatch, links):
    if not links:
        monkeypatch.setattr(lock.os, "link", no_hard_links)

    def race(count):
        results = []

        def take():
            try:
                results.append(lock.DirectoryLock(str(tmp_path)).acquire())
            except lock.CheckpointLockedError as error:
                results.append(error)

        threads = [threading.Thread(target=take) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        winners = [r for r in results if isinstance(r, lock.DirectoryLock)]
        assert len(winners) == 1, results
        return winners[0]

    race(8).release()
    write_lock(tmp_path, host=socket.gethostname(), pid=2**22 + 7, process_started=0.0)
    with pytest.warns(UserWarning, match="Took over"):
        winner = race(8)  # a stale lock: one takes it over, the others see the winner
    winner.release()
    assert os.listdir(tmp_path) == []  # no temporary or set-aside file left


def test_a_run_whose_lock_was_taken_over_does_not_save(tmp_path):
    held = lock.DirectoryLock(str(tmp_path)).acquire()
    write_lock(tmp_path, host="elsewhere.example", pid=1, refreshed=time.time(), token="x")
    with pytest.raises(tfaccel.CheckpointLockedError, match="no longer holds"):
        held.refresh()
    held.release()
    assert (tmp_path / lock.NAME).exists()  # the new holder's lock stays


def test_the_lock_is_neither_a_checkpoint_nor_a_temporary(tmp_path):
    held = lock.DirectoryLock(str(tmp_path)).acquire()
    assert checkpoint_files.numbers(str(tmp_path)) == []
    assert checkpoint_files.remove_temporaries(str(tmp_path)) == []
    assert (tmp_path / lock.NAME).exists()
    held.release()


# -- a state file without checkpoints; resume="never" --------------------------------------


def test_a_state_file_without_checkpoints_is_an_error_and_never_starts_fresh(tmp_path):
    directory = tmp_path / "ckpt"
    fit(directory, epochs=2)  # ckpt-4 ... ckpt-16
    for path in directory.glob("ckpt-*"):
        path.unlink()
    before = digests(directory)
    with pytest.raises(
        tfaccel.CheckpointCorruptError, match="names ckpt-16, .*no checkpoint files"
    ):
        fit(directory, epochs=2)
    assert digests(directory) == before
    with pytest.warns(UserWarning, match="resume='never'.*ckpt-16"):
        trainer = fit(directory, resume="never")
    assert int(trainer.step.numpy()) == 8
    assert tf.train.latest_checkpoint(str(directory)).endswith("ckpt-8")


def test_resume_never_starts_from_step_0_and_replaces_the_old_checkpoints(tmp_path):
    directory = tmp_path / "ckpt"
    fit(directory, epochs=2)  # ckpt-4, 8, 12, 16
    fresh = fit(None)
    with pytest.warns(UserWarning, match=r"\(ckpt-16, ckpt-12, ckpt-8, ckpt-4\) are deleted"):
        trainer = fit(directory, resume="never", checkpoint_every=2)
    for got, want in zip(trainer.model.get_weights(), fresh.model.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert checkpoint_files.numbers(str(directory)) == [8, 6, 4, 2]
    assert int(fit(directory).step.numpy()) == 8  # "auto" now resumes the new run: done


# -- checkpoint_dir="" ---------------------------------------------------------------------


def test_an_empty_checkpoint_dir_is_an_error_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt-3_temp").mkdir()  # what temp-file cleanup would remove here
    with pytest.raises(ValueError, match="checkpoint_dir is an empty string"):
        fit("")
    assert os.listdir(tmp_path) == ["ckpt-3_temp"]


# -- strict JSON ---------------------------------------------------------------------------


def no_constants(token):
    raise AssertionError(f"not JSON: {token}")


def test_strict_json_writes_null_for_non_finite_values():
    value = {"nan": float("nan"), "inf": [np.float32("inf"), -np.inf], "x": np.float64(0.5)}
    text = strict_json.dumps(value)
    assert json.loads(text, parse_constant=no_constants) == {
        "nan": None,
        "inf": [None, None],
        "x": 0.5,
    }


def test_recipe_metrics_json_is_strict_after_zero_epochs(tmp_path, monkeypatch):
    sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "recipes"))
    import mlp_fashion_mnist

    def offline(*args, **kwargs):
        raise ConnectionError("no network here")

    monkeypatch.setattr(tfds, "load", offline)
    mlp_fashion_mnist.main(["--smoke", "--epochs", "0", "--out", str(tmp_path), "--verbose", "0"])
    metrics = json.loads((tmp_path / "metrics.json").read_text(), parse_constant=no_constants)
    assert metrics["examples_per_second"] is None and metrics["epochs"] == 0
